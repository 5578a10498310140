//! The Linux plan as an OCI runtime-spec bundle: `config.json` plus a
//! `rootfs/` that is only an empty directory the runtime binds the view
//! onto (no image). Each plan step maps to an OCI field:
//! binds → `mounts` (`ro,nosuid,nodev`), stand-ins → read-only tmpfs or a
//! `/dev/null` bind, /proc read-only/masked entries → `readonlyPaths` /
//! `maskedPaths`, the seccomp floor and ABI guard → `linux.seccomp`.
//! Landlock has no OCI field yet: said in an annotation and the README.

use std::path::{Path, PathBuf};

use moat_linux::plan::{MountOp, Plan, SeccompSpec};
use moat_linux::probe::Kind;
use moat_policy::{NetworkMode, Policy};
use serde_json::{json, Value};

use crate::{ExportError, ANNOTATION_HASH, ANNOTATION_LANDLOCK, ANNOTATION_POLICY, LANDLOCK_NOTE};

/// The OCI runtime-spec version the config is written for.
pub const OCI_VERSION: &str = "1.0.2";
/// Where moat's own files (e.g. a shim table) are written inside the bundle.
const FILES_DIR: &str = "moat-files";
/// EPERM and ENOSYS, as the filter returns them.
const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

/// A resource limit to carry into `process.rlimits` (`RLIMIT_NOFILE`, soft, hard).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rlimit {
    pub name: &'static str,
    pub soft: u64,
    pub hard: u64,
}

/// What the config needs besides the plan.
pub struct OciInput<'a> {
    pub policy: &'a Policy,
    pub plan: &'a Plan,
    pub command: &'a [String],
    /// The limits the command would inherit from `moat exec` (the caller's).
    pub rlimits: &'a [Rlimit],
}

/// A file moat writes into the bundle and binds read-only at `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleFile {
    pub bundle_path: PathBuf,
    pub target: PathBuf,
    pub contents: String,
}

/// A symlink created in the bundle's rootfs (OCI mounts cannot make one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootfsLink {
    pub path: PathBuf,
    pub points_to: PathBuf,
}

/// The whole bundle, as data.
pub struct Bundle {
    pub config: Value,
    pub files: Vec<BundleFile>,
    pub links: Vec<RootfsLink>,
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The seccomp spec in OCI JSON form. The ABI guard becomes: only the native
/// architecture listed (libseccomp applies its bad-arch action, kill, to a
/// foreign or x32 ABI), clone3 → ENOSYS, and clone/unshare with any
/// CLONE_NEW* bit → EPERM, one masked-equality rule per bit.
pub fn seccomp(spec: &SeccompSpec) -> Value {
    let mut rules: Vec<Value> = Vec::new();
    let floor: Vec<&str> = spec.floor.iter().map(|(n, _)| *n).collect();
    rules.push(json!({"names": floor, "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM}));
    rules.push(json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS}));
    let flags = moat_linux::process::NEW_NAMESPACE_FLAGS;
    for bit in (0..32).map(|b| 1u32 << b).filter(|b| flags & b != 0) {
        for (name, index) in [("clone", 0), ("unshare", 0)] {
            rules.push(json!({
                "names": [name],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                "args": [{"index": index, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}]
            }));
        }
    }
    for (_, cmd) in &spec.denied_ioctls {
        rules.push(json!({
            "names": ["ioctl"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": EPERM,
            "args": [{"index": 1, "value": cmd, "op": "SCMP_CMP_EQ"}]
        }));
    }
    if let Some(families) = &spec.socket_families {
        // "None of the allowed families" cannot be one rule: libseccomp
        // compares each argument once per rule (a second NE on the same
        // argument is not ANDed). So: one EQ rule per family below the
        // highest allowed one that is not allowed, and GT the highest
        // (which also catches negative values, compared as unsigned).
        let mut allowed: Vec<i64> = families.iter().map(|f| i64::from(*f)).collect();
        allowed.sort_unstable();
        let max = allowed.last().copied().unwrap_or(-1);
        for f in (0..max).filter(|f| !allowed.contains(f)) {
            rules.push(json!({
                "names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM,
                "args": [{"index": 0, "value": f, "op": "SCMP_CMP_EQ"}]
            }));
        }
        rules.push(json!({
            "names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM,
            "args": [{"index": 0, "value": max.max(0), "op": if max < 0 { "SCMP_CMP_GE" } else { "SCMP_CMP_GT" }}]
        }));
    }
    for f in &spec.denied_families {
        rules.push(json!({
            "names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM,
            "args": [{"index": 0, "value": f, "op": "SCMP_CMP_EQ"}]
        }));
    }
    if spec.deny_listen {
        rules.push(json!({"names": ["listen", "accept", "accept4"], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM}));
    }
    if spec.deny_setid {
        // A mode with either set-id bit: one masked equality per combination.
        let bits = moat_linux::confine::SETID_BITS;
        for (name, _, index) in moat_linux::confine::SETID_MODE_SYSCALLS {
            for value in [libc::S_ISUID, libc::S_ISGID, bits] {
                rules.push(json!({
                    "names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM,
                    "args": [{"index": index, "value": bits, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}]
                }));
            }
        }
    }
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": [native_arch()],
        "syscalls": rules,
    })
}

/// libseccomp's name of the architecture moat was built for.
pub fn native_arch() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "SCMP_ARCH_AARCH64"
    } else {
        "SCMP_ARCH_X86_64"
    }
}

fn mount(dest: &Path, typ: &str, source: &str, options: &[&str]) -> Value {
    json!({"destination": s(dest), "type": typ, "source": source, "options": options})
}

/// Builds the bundle (config and the files it refers to). Pure.
pub fn bundle(input: &OciInput) -> Result<Bundle, ExportError> {
    let plan = input.plan;
    if !plan.sandboxed {
        return Err(ExportError::Unsandboxed);
    }
    if plan.network == NetworkMode::Proxy {
        return Err(ExportError::OciProxy);
    }
    let mut mounts = Vec::new();
    let mut masked = Vec::new();
    let mut readonly = Vec::new();
    let mut files = Vec::new();
    let mut links = Vec::new();
    for op in &plan.mounts {
        match op {
            MountOp::Tmpfs { target, mode, .. } if target == Path::new("/dev") => {
                // The runtime builds /dev itself (tmpfs with the default
                // devices: exactly moat's DEV_NODES plus ptmx, fd, std*).
                let mode = format!("mode={mode:o}");
                mounts.push(mount(
                    target,
                    "tmpfs",
                    "tmpfs",
                    &["nosuid", "strictatime", &mode, "size=65536k"],
                ));
            }
            MountOp::Tmpfs { target, mode, size } => {
                let mode = format!("mode={mode:o}");
                // --tmp-size caps the private tmpfs here as it does in a run.
                let size = size.map(|b| format!("size={b}"));
                let mut o = vec!["nosuid", "nodev", mode.as_str()];
                o.extend(size.as_deref());
                mounts.push(mount(target, "tmpfs", "tmpfs", &o));
            }
            MountOp::Bind { device: true, .. } => {} // the runtime's default devices (see /dev above)
            MountOp::Bind {
                source,
                target,
                recursive,
                readonly: ro,
                ..
            } => {
                let mut o = vec![if *recursive { "rbind" } else { "bind" }];
                if *ro {
                    o.push("ro");
                }
                o.extend(["nosuid", "nodev"]);
                mounts.push(mount(target, "bind", &s(source), &o));
            }
            MountOp::Symlink { target, points_to } => {
                // /dev's links are the runtime's own; others live in rootfs.
                if !target.starts_with("/dev") {
                    links.push(RootfsLink {
                        path: target.clone(),
                        points_to: points_to.clone(),
                    });
                }
            }
            MountOp::Proc { target } => mounts.push(mount(
                target,
                "proc",
                "proc",
                &["nosuid", "nodev", "noexec"],
            )),
            MountOp::Devpts { target } => mounts.push(mount(
                target,
                "devpts",
                "devpts",
                &[
                    "nosuid",
                    "noexec",
                    "newinstance",
                    "ptmxmode=0666",
                    "mode=0620",
                ],
            )),
            MountOp::ReadOnlyAgain { target } => readonly.push(s(target)),
            MountOp::StandIn { target, .. } if target.starts_with("/proc") => {
                masked.push(s(target))
            }
            // A redacted git config is exported as an empty stand-in (the
            // bundle carries no moat-made file contents over host paths).
            MountOp::StandIn { target, .. } | MountOp::Redacted { target, .. } => {
                let kind = match op {
                    MountOp::StandIn { kind, .. } => *kind,
                    _ => Kind::File,
                };
                if kind == Kind::Dir {
                    mounts.push(mount(
                        target,
                        "tmpfs",
                        "tmpfs",
                        &["ro", "nosuid", "nodev", "noexec", "size=0", "mode=555"],
                    ));
                } else {
                    mounts.push(mount(
                        target,
                        "bind",
                        "/dev/null",
                        &["bind", "ro", "nosuid", "nodev", "noexec"],
                    ));
                }
            }
            MountOp::File { target, contents } => {
                let name = format!("{FILES_DIR}/{}", files.len());
                mounts.push(mount(
                    target,
                    "bind",
                    &name,
                    &["bind", "ro", "nosuid", "nodev"],
                ));
                files.push(BundleFile {
                    bundle_path: name.into(),
                    target: target.clone(),
                    contents: contents.clone(),
                });
            }
        }
    }
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "mount"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "cgroup"}),
        json!({"type": "user"}),
    ];
    if plan.new_netns {
        namespaces.push(json!({"type": "network"}));
    }
    let env: Vec<String> = plan.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let rlimits: Vec<Value> = input
        .rlimits
        .iter()
        .map(|r| json!({"type": r.name, "soft": r.soft, "hard": r.hard}))
        .collect();
    let policy = input.policy;
    let config = json!({
        "ociVersion": OCI_VERSION,
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "moat",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": input.command,
            "env": env,
            "cwd": s(&plan.cwd),
            "noNewPrivileges": true,
            "capabilities": {"bounding": [], "effective": [], "permitted": [], "inheritable": [], "ambient": []},
            "rlimits": rlimits,
        },
        "mounts": mounts,
        "linux": {
            // One id, as with moat exec: only the caller's uid and gid exist
            // in the namespace; everything else shows as the overflow id.
            // The command is the namespace's uid 0 (with no capabilities):
            // rootless runc needs the container's root mapped.
            "uidMappings": [{"containerID": 0, "hostID": plan.uid, "size": 1}],
            "gidMappings": [{"containerID": 0, "hostID": plan.gid, "size": 1}],
            "namespaces": namespaces,
            "maskedPaths": masked,
            "readonlyPaths": readonly,
            "seccomp": seccomp(&plan.seccomp),
        },
        "annotations": {
            ANNOTATION_HASH: policy.hash(),
            ANNOTATION_POLICY: policy.canonical_json(),
            ANNOTATION_LANDLOCK: LANDLOCK_NOTE,
            "dev.moat.level": policy.level.to_string(),
            "dev.moat.network": plan.network.to_string(),
        },
    });
    Ok(Bundle {
        config,
        files,
        links,
    })
}

/// `dir` made absolute and canonical as far as it exists (the rest joined
/// as written), so a symlinked parent cannot hide where it lies.
pub fn resolve_dir(dir: &Path) -> std::io::Result<PathBuf> {
    let abs = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()?.join(dir)
    };
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = existing.canonicalize() {
            let mut out = c;
            for r in rest.iter().rev() {
                out.push(r);
            }
            return Ok(out);
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return Ok(abs),
        }
    }
}

/// Refuses a bundle the confined command could rewrite: one inside a
/// writable part of the view (the workspace at a writable level, a `--rw`
/// path). `dir` must come from [`resolve_dir`].
pub fn check_bundle_dir(plan: &Plan, dir: &Path) -> Result<(), ExportError> {
    let writable = plan
        .view
        .host_mode(dir)
        .is_some_and(|x| x.mode == moat_linux::view::Mode::Write && x.host.is_some());
    if writable && plan.view.level.is_sandboxed() {
        return Err(ExportError::BundleWritable(dir.to_path_buf()));
    }
    Ok(())
}

fn write_err(path: &Path) -> impl FnOnce(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates `dir` (0700) when missing; an existing one must be a directory
/// of the caller's that group and others cannot write, so nobody else can
/// plant or later swap what moat writes there.
pub(crate) fn own_bundle_dir(dir: &Path) -> Result<(), ExportError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(write_err(parent))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(write_err(dir)(e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(write_err(dir))?;
    if !meta.is_dir() {
        return Err(ExportError::BundleDirUnsafe(
            dir.to_path_buf(),
            "is not a directory",
        ));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(ExportError::BundleDirUnsafe(
            dir.to_path_buf(),
            "belongs to another user",
        ));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(ExportError::BundleDirUnsafe(
            dir.to_path_buf(),
            "is writable by group or others",
        ));
    }
    Ok(())
}

/// A new file at `at` (never an existing one, never through a symlink).
fn write_new(at: &Path, contents: &[u8]) -> Result<(), ExportError> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(at)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                ExportError::Exists(at.parent().unwrap_or(at).to_path_buf())
            } else {
                write_err(at)(e)
            }
        })?;
    f.write_all(contents).map_err(write_err(at))
}

/// Writes `bundle` into `dir` (created if missing; must be the caller's,
/// closed to others, and not hold a config.json yet): config.json, an
/// empty rootfs/ with the view's top-level symlinks, and moat's own files,
/// each created new (a planted link is never written through).
pub fn write_bundle(dir: &Path, bundle: &Bundle) -> Result<(), ExportError> {
    own_bundle_dir(dir)?;
    let config_path = dir.join("config.json");
    if config_path.symlink_metadata().is_ok() {
        return Err(ExportError::Exists(dir.to_path_buf()));
    }
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs).map_err(write_err(&rootfs))?;
    for l in &bundle.links {
        let rel = l.path.strip_prefix("/").unwrap_or(&l.path);
        let at = rootfs.join(rel);
        if let Some(parent) = at.parent() {
            std::fs::create_dir_all(parent).map_err(write_err(parent))?;
        }
        if at.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(&l.points_to, &at).map_err(write_err(&at))?;
        }
    }
    for f in &bundle.files {
        let at = dir.join(&f.bundle_path);
        if let Some(parent) = at.parent() {
            std::fs::create_dir_all(parent).map_err(write_err(parent))?;
        }
        write_new(&at, f.contents.as_bytes())?;
    }
    let text = serde_json::to_string_pretty(&bundle.config).unwrap_or_default();
    write_new(&config_path, (text + "\n").as_bytes())
}
