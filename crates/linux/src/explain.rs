//! Attributes a refusal the command reported (a path and an errno read back
//! from its stderr) to the part of the plan that caused it, so the agent is
//! told why instead of seeing a bare EACCES. Pure: uses only the plan.

use std::path::{Component, Path, PathBuf};

use moat_policy::Level;
use serde::Serialize;

use crate::plan::Plan;
use crate::probe::Kind;
use crate::view::{Mode, Why};

/// Why moat refused an access, as a stable code plus a short phrase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyReason {
    /// The path is a protected path, shown as an empty read-only stand-in.
    Protected,
    /// A write-protected file that runs code later (hooks, rc files, …).
    WriteProtected,
    /// A write outside the writable part of the view.
    OutsideWritable,
    /// The path exists on the host but is not part of the view.
    OutsideView,
    /// moat's own audit log, trust store or configuration.
    MoatState,
    /// Inside a path granted read-only (--ro, a profile or project grant).
    ReadOnlyGrant,
    /// A path moat built into the view (/moat/bin, /moat/shims…): no flag grants it.
    MoatBuilt,
    /// The workspace's git config holding credentials: a redacted copy in
    /// a mount namespace, refused on the Landlock backend (no copy there).
    GitCredentials,
    /// A new (or removed) entry directly in a writable directory that the
    /// Landlock backend keeps list-only, because a protected or
    /// write-protected entry lies beneath it.
    ListOnlyDir,
    /// A mode change with the set-uid or set-gid bit, on a file of the
    /// caller's in a writable area: the seccomp floor refuses those bits
    /// ([`crate::confine::SETID_BITS`]).
    SetidMode,
}

impl DenyReason {
    pub fn code(self) -> &'static str {
        match self {
            DenyReason::Protected => "protected",
            DenyReason::WriteProtected => "write_protected",
            DenyReason::OutsideWritable => "outside_writable",
            DenyReason::OutsideView => "outside_view",
            DenyReason::MoatState => "moat_state",
            DenyReason::ReadOnlyGrant => "read_only_grant",
            DenyReason::MoatBuilt => "moat_built",
            DenyReason::GitCredentials => "git_credentials",
            DenyReason::ListOnlyDir => "list_only_dir",
            DenyReason::SetidMode => "setid_mode",
        }
    }

    /// A phrase for the one-line stderr summary.
    pub fn phrase(self, level: Level) -> String {
        match self {
            DenyReason::Protected => {
                "protected path, an empty read-only stand-in; opt in with --ro/--rw PATH".into()
            }
            DenyReason::WriteProtected => "write-protected: it runs code later".into(),
            DenyReason::OutsideWritable => match level {
                Level::ReadOnly => {
                    "read-only policy; use --policy workspace-write or --rw PATH".into()
                }
                _ => "outside the workspace; add --rw PATH to grant it".into(),
            },
            DenyReason::OutsideView => {
                format!("not in the view at --policy {level}; add --ro PATH to show it")
            }
            DenyReason::MoatState => {
                "moat's own audit log and configuration are read-only to sandboxed commands".into()
            }
            DenyReason::ReadOnlyGrant => "granted read-only; grant it with --rw to write".into(),
            DenyReason::MoatBuilt => {
                "built by moat for this run (its binary, shims and their table); read-only, no flag changes it".into()
            }
            DenyReason::GitCredentials => {
                "a git config holding credentials (a token in a URL, an extraheader, a credential helper); moat shows a redacted copy where it can mount one, the Landlock backend cannot, so it is refused; opt in with --ro PATH to show the raw file".into()
            }
            DenyReason::SetidMode => {
                "a set-uid/set-gid mode: moat refuses those bits in every sandboxed run, so nothing the command leaves runs as you for someone else; no flag grants them (drop the s bit: chmod u+s/g+s, cp -a or tar -p of a set-id file, git init --shared)".into()
            }
            DenyReason::ListOnlyDir => {
                "its directory holds a protected or write-protected entry, so --backend landlock keeps it list-only (no entries created or removed directly in it); use an existing subdirectory, or --backend namespaces where user namespaces are available".into()
            }
        }
    }
}

/// Lexically absolute and normalized (`..` folded), relative to `cwd`.
/// The directory a program at `canon` (a canonical path) needs shown to
/// start: its npm package root (`…/node_modules/[@scope/]name`, its
/// dependencies included) when it lies in one, else its own directory.
/// `moat run`'s install tree and the hint for a program outside the view
/// both ask this.
pub fn program_dir(canon: &Path) -> PathBuf {
    let comps: Vec<_> = canon.components().collect();
    if let Some(i) = comps.iter().rposition(|c| c.as_os_str() == "node_modules") {
        let scoped = comps
            .get(i + 1)
            .is_some_and(|c| c.as_os_str().to_string_lossy().starts_with('@'));
        let end = (i + if scoped { 3 } else { 2 }).min(comps.len());
        return comps[..end].iter().collect();
    }
    canon.parent().unwrap_or(canon).to_path_buf()
}

pub fn absolute(cwd: &Path, p: &str) -> PathBuf {
    let raw = if p.starts_with('/') {
        PathBuf::from(p)
    } else {
        cwd.join(p)
    };
    let mut out = PathBuf::from("/");
    for c in raw.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// Whether the area around the write-protected entry at `p` is writable:
/// the mode of the nearest enclosing entry that is not write-protected.
/// On the Landlock backend the writable workspace is split into per-entry
/// rules around it, so the plan's write rules hold no prefix of `p`.
fn region_writable(plan: &Plan, p: &Path) -> bool {
    let mut cur = p.parent();
    while let Some(c) = cur {
        match plan.view.mode_at(c) {
            Some(y) if y.mode == Mode::WriteProtected => cur = y.path.parent(),
            Some(y) => return y.mode == Mode::Write,
            None => return plan.landlock.write.iter().any(|w| c.starts_with(w)),
        }
    }
    false
}

/// Explains a refusal of `path` with `errno` ("EROFS", "EACCES", "EPERM",
/// "ENOENT"), or None when moat's policy did not cause it. Asks the run's
/// view, the one description of what the sandbox sees.
pub fn explain(
    plan: &Plan,
    path: &str,
    errno: &str,
    host_exists: impl Fn(&Path) -> bool,
) -> Option<DenyReason> {
    if !plan.sandboxed {
        return None;
    }
    let abs = absolute(&plan.cwd, path);
    let view = &plan.view;
    let entry = view.mode_at(&abs);
    if let Some(x) = entry {
        if matches!(x.why, Why::MoatState | Why::MoatConfig) && errno != "ENOENT" {
            return Some(DenyReason::MoatState);
        }
        // The stand-in itself, or something "inside" an empty directory.
        if x.mode == Mode::Hidden && (x.path == abs || x.kind == Kind::Dir) {
            // A git dir's config file (a `HEAD` beside it) hidden as a secret:
            // only a git config with credentials is (the Landlock backend
            // has no mounts to show its redacted copy).
            let git_config = x.path == abs
                && x.why == Why::Secret
                && abs.file_name().is_some_and(|n| {
                    crate::gitconfigs::CONFIG_NAMES
                        .iter()
                        .any(|c| n == std::ffi::OsStr::new(c))
                })
                && abs.parent().is_some_and(|d| host_exists(&d.join("HEAD")));
            if git_config {
                return Some(DenyReason::GitCredentials);
            }
            return Some(DenyReason::Protected);
        }
    }
    let home = Path::new(crate::plan::SANDBOX_HOME);
    if abs.starts_with(crate::plan::SANDBOX_MOAT_DIR) && !abs.starts_with(home) {
        return (errno != "ENOENT").then_some(DenyReason::MoatBuilt);
    }
    match errno {
        "EROFS" | "EACCES" | "EPERM" => {
            // The view decides first: a read-only host path inside a
            // writable tmpfs (a workspace under /tmp at read-only) is not
            // writable although Landlock's /tmp rule covers it.
            let writable = match entry {
                Some(x) if matches!(x.mode, Mode::Read | Mode::Hidden) => false,
                Some(x) if x.mode == Mode::Write => true,
                _ => plan.landlock.write.iter().any(|w| abs.starts_with(w)),
            };
            match entry {
                Some(x) if x.mode == Mode::Read && x.why == Why::Grant => {
                    Some(DenyReason::ReadOnlyGrant)
                }
                Some(x)
                    if x.mode == Mode::WriteProtected
                        && (writable || region_writable(plan, &x.path)) =>
                {
                    Some(DenyReason::WriteProtected)
                }
                _ if !writable && errno != "EPERM" => Some(DenyReason::OutsideWritable),
                // A writable path refused on the Landlock backend: its
                // directory is split into per-entry rules (list-only).
                _ if errno == "EACCES"
                    && plan.landlock_only()
                    && abs
                        .parent()
                        .is_some_and(|d| crate::backend::list_only(view, d)) =>
                {
                    Some(DenyReason::ListOnlyDir)
                }
                _ => None,
            }
        }
        "ENOENT" => {
            if !view.shows_host(&abs) && host_exists(&abs) {
                Some(DenyReason::OutsideView)
            } else {
                None
            }
        }
        _ => None,
    }
}
