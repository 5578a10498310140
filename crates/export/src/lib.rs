//! moat's exporters: one policy (and its View / Linux Plan) translated to
//! other enforcement targets, each carrying the same `explain-policy` hash.
//! - [`oci`]: an OCI runtime-spec bundle (runc, crun) equivalent to the Linux plan.
//! - [`k8s`]: Kubernetes manifests (a Pod or an agent-sandbox SandboxTemplate).
//! - [`seatbelt`]: a macOS Seatbelt (SBPL) profile, behind the [`backend::Backend`] seam.
//!
//! Pure translations: they read a Policy, a View and a Plan and return
//! data; only [`oci::write_bundle`] touches the filesystem (the bundle dir).

pub mod backend;
pub mod k8s;
pub mod oci;
pub mod sbpl_check;
pub mod seatbelt;

/// Annotation carrying the policy's `sha256:` hash (same as `explain-policy`).
pub const ANNOTATION_HASH: &str = "dev.moat.policy-hash";
/// Annotation carrying the canonical policy JSON.
pub const ANNOTATION_POLICY: &str = "dev.moat.policy";
/// Annotation stating what the target cannot enforce that moat's Linux backend does.
pub const ANNOTATION_LANDLOCK: &str = "dev.moat.landlock";
/// Text of [`ANNOTATION_LANDLOCK`].
pub const LANDLOCK_NOTE: &str = "not-enforced: the OCI runtime spec has no Landlock field yet \
(opencontainers/runtime-spec PR #1241); the bundle relies on its mount view, seccomp and \
no_new_privs. moat exec adds Landlock on top.";

/// The Landlock ABI the Linux plan is built for when exporting: the
/// targets enforce without Landlock, so the exporting kernel's own ABI must
/// not make the plan refuse (its Landlock part is never exported).
pub const ASSUMED_LANDLOCK_ABI: i32 = 6;

/// Why an export cannot be produced.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("--policy danger-full-access has no sandbox to export; choose read-only, workspace-write or workspace-contained")]
    Unsandboxed,
    #[error("the OCI export supports --network disabled or unmanaged: the filtering proxy needs moat's supervisor on the host (use `moat exec --network proxy`, or `moat export k8s`, which runs the proxy as a sidecar)")]
    OciProxy,
    #[error("cannot write the bundle at {path}: {source}; choose another --bundle DIR")]
    Write {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("the bundle directory {0} already has a config.json; remove it or choose another --bundle DIR")]
    Exists(std::path::PathBuf),
    #[error("the bundle directory {0} lies in a writable part of the view: the confined command could rewrite the config.json that confines it the next time; choose --bundle outside the workspace and the --rw paths")]
    BundleWritable(std::path::PathBuf),
    #[error("the bundle directory {0} {1}: whoever can write it can swap the config.json a runtime runs later; choose a directory of yours closed to others (chmod go-w), or a new path")]
    BundleDirUnsafe(std::path::PathBuf, &'static str),
}

#[cfg(test)]
mod tests;
