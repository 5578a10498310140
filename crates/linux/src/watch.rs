//! An init's watch over the mounts that narrow a host path (a stand-in over
//! a secret, a read-only bind inside a writable one), in a one-shot run and
//! in a template execution (armed ahead of its request, read once it has
//! it): the host unlinking or
//! renaming over such a path detaches the mount in every namespace, so the
//! init watches each one's directory (inotify, SIGIO) for the whole run and
//! stops the run when one is no longer in place.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::plan::Plan;
use crate::sys;

/// What changes a directory's entries or the directory itself. Overflow
/// (`IN_Q_OVERFLOW`) and a removed watch (`IN_IGNORED`) come unasked.
const MASK: u32 = libc::IN_CREATE
    | libc::IN_MOVED_TO
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF;

/// Events after which every mount under the watch is looked at again.
const LOOK_AT_ALL: u32 = libc::IN_Q_OVERFLOW
    | libc::IN_IGNORED
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_UNMOUNT;

/// One narrowing mount as laid: its directory (relative to the view's
/// root), its name there, its watch and its mount id.
struct Target {
    path: PathBuf,
    dir: PathBuf,
    name: OsString,
    wd: i32,
    id: u64,
}

/// Why the watch could not be armed.
pub(crate) enum ArmFailure {
    /// A target was no longer covered when the watch looked (the host
    /// replaced it since the view was built): the run stops as it would
    /// for a change seen later.
    Replaced(PathBuf),
    /// The watch itself failed: what the user is told.
    Failed(String),
}

/// The armed watch: an inotify instance raising SIGIO in the init.
pub(crate) struct Watch {
    inotify: OwnedFd,
    root: OwnedFd,
    targets: Vec<Target>,
}

impl Watch {
    /// Arms the watch over every narrowing mount of `plan`
    /// ([`crate::mounts::narrowing_targets`]) in the view the init is in,
    /// then reads each one's mount id: a mount the host detached between
    /// the view and the watch is caught here. Runs once the command has
    /// started (off the launch path; a template's init arms it before its
    /// command exists, [`Watch::arm_paths`]), so each directory is opened
    /// from the view's root through no symlink and watched, and its target
    /// looked at, through that one fd: a directory the command renamed or
    /// swapped meanwhile is either the one watched or found without its
    /// mount.
    /// None: the plan has no such mount.
    pub(crate) fn arm(plan: &Plan) -> Result<Option<Watch>, ArmFailure> {
        Self::arm_paths(crate::mounts::narrowing_targets(&plan.mounts))
    }

    /// [`Watch::arm`] over the targets `paths` (absolute, in the view):
    /// a template's init arms it ahead of its request with the targets its
    /// template worked out once.
    pub(crate) fn arm_paths(paths: Vec<&Path>) -> Result<Option<Watch>, ArmFailure> {
        if paths.is_empty() {
            return Ok(None);
        }
        let inotify = sys::inotify_async().map_err(|e| {
            ArmFailure::Failed(format!(
                "moat cannot watch the protected host paths (inotify): {e}; raise fs.inotify.max_user_instances; the command had started and was stopped: run it again"
            ))
        })?;
        let root = sys::open_dir_nofollow(Path::new("/"))
            .map_err(|e| {
                ArmFailure::Failed(format!(
                    "moat cannot open the sandbox's root to watch the protected host paths: {e}; the command had started and was stopped: run it again"
                ))
            })?;
        let mut targets: Vec<Target> = Vec::with_capacity(paths.len());
        // Each directory is opened once (its path relative to the view's
        // root, the fd, its watch): every target in it is watched and
        // looked at through that one fd.
        let mut dirs: Vec<(PathBuf, OwnedFd, i32)> = Vec::new();
        for path in paths {
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                continue;
            };
            let mut t = Target {
                dir: parent.strip_prefix("/").unwrap_or(parent).to_path_buf(),
                name: name.to_os_string(),
                path: path.to_path_buf(),
                wd: -1,
                id: 0,
            };
            // The init laid this mount, so it could reach the directory
            // when it built the view. Refused now (EACCES), the directory
            // was made unsearchable since, and the command may have done
            // that: a directory the user owns whose group the run does not
            // map is beyond the init's capabilities, and its owner (the
            // command) can chmod it and back. Never skipped: the run stops.
            let unreachable = |e: std::io::Error| {
                ArmFailure::Failed(format!(
                    "moat cannot watch {} for the host replacing it: {e} on the way to it (it was reachable when the sandbox was built, so something changed a directory's mode while the command started); the command had started and was stopped: run it again",
                    path.display()
                ))
            };
            let at = match dirs.iter().position(|(d, _, _)| *d == t.dir) {
                Some(at) => at,
                None => {
                    let dir = match open_dir(&root, &t) {
                        Ok(d) => d,
                        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                            return Err(unreachable(e))
                        }
                        Err(_) => return Err(ArmFailure::Replaced(t.path)),
                    };
                    // Watched through this very fd, and every target in it
                    // looked at through it too: one open, so no directory
                    // swapped between two opens is ever looked at unwatched.
                    let wd = sys::inotify_watch_dir(&inotify, &dir, MASK).map_err(|e| {
                        ArmFailure::Failed(format!(
                            "watch {} for the host replacing {} (inotify): {e}; moat cannot keep {} covered for the run without it: raise fs.inotify.max_user_watches (or max_user_instances); the command had started and was stopped",
                            parent.display(),
                            path.display(),
                            path.display(),
                        ))
                    })?;
                    dirs.push((t.dir.clone(), dir, wd));
                    dirs.len() - 1
                }
            };
            let (_, dir, wd) = &dirs[at];
            t.wd = *wd;
            t.id = match sys::mount_root_id_at(dir.as_raw_fd(), Path::new(&t.name)) {
                Ok(Some(id)) => id,
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => return Err(unreachable(e)),
                _ => return Err(ArmFailure::Replaced(t.path)),
            };
            targets.push(t);
        }
        // Each target is a mount of its own. Two found as one mount means
        // the command swapped directories while the watch was armed, so
        // that a directory holding one may be unwatched: stop.
        let mut ids: Vec<u64> = targets.iter().map(|t| t.id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(ArmFailure::Failed(
                "the sandbox's directories holding protected paths were renamed while moat armed its watch over them; moat stopped the run: run it again".to_string(),
            ));
        }
        Ok(Some(Watch {
            inotify,
            root,
            targets,
        }))
    }

    /// The inotify instance's fd. Closing it costs the kernel an SRCU grace
    /// period (tens of ms when loaded) before `close` returns: the init
    /// closes it last, after the pipes the supervisor waits on
    /// (`init::close_all_but_watch`).
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.inotify.as_raw_fd()
    }

    /// Every fd the watch holds (the inotify instance, the view's root).
    pub(crate) fn fds(&self) -> [std::os::fd::RawFd; 2] {
        [self.inotify.as_raw_fd(), self.root.as_raw_fd()]
    }

    /// Reads every queued event and looks again at the mounts they may
    /// concern: the first one no longer in place, if any.
    pub(crate) fn changed(&self) -> Option<&Path> {
        let mut all = false;
        let mut marked = vec![false; self.targets.len()];
        let mut buf = [0u8; 8192];
        loop {
            let n = match sys::read_nonblocking(&self.inotify, &mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(_) => {
                    all = true;
                    break;
                }
            };
            let mut at = 0;
            const HEAD: usize = std::mem::size_of::<libc::inotify_event>();
            while at + HEAD <= n {
                let word = |i: usize| {
                    let b = &buf[at + i..at + i + 4];
                    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
                };
                let (wd, mask, len) = (word(0) as i32, word(4), word(12) as usize);
                let end = (at + HEAD + len).min(n);
                let raw = &buf[at + HEAD..end];
                let name = OsStr::from_bytes(raw.split(|&c| c == 0).next().unwrap_or(raw));
                if mask & LOOK_AT_ALL != 0 {
                    all = true;
                }
                for (t, m) in self.targets.iter().zip(marked.iter_mut()) {
                    if t.wd == wd && t.name == name {
                        *m = true;
                    }
                }
                at = end;
            }
        }
        self.targets
            .iter()
            .zip(&marked)
            .find(|(t, m)| (all || **m) && look(&self.root, t) != Some(t.id))
            .map(|(t, _)| t.path.as_path())
    }
}

/// The id of the mount whose root is `t` in the view, reached from the
/// view's root through no symlink (the command may have shaped the
/// directories on the way); None when it is no mount's root (or cannot
/// be reached: never taken for in place).
fn look(root: &OwnedFd, t: &Target) -> Option<u64> {
    look_at(root, t).ok().flatten()
}

fn look_at(root: &OwnedFd, t: &Target) -> std::io::Result<Option<u64>> {
    let dir = open_dir(root, t)?;
    sys::mount_root_id_at(dir.as_raw_fd(), Path::new(&t.name))
}

/// `t`'s directory, from the view's root through no symlink.
fn open_dir(root: &OwnedFd, t: &Target) -> std::io::Result<OwnedFd> {
    if t.dir.as_os_str().is_empty() {
        sys::open_dir_beneath(root.as_raw_fd(), Path::new("."))
    } else {
        sys::open_dir_beneath(root.as_raw_fd(), &t.dir)
    }
}

/// What the user is told when the host replaced the protected `path`.
pub(crate) fn replaced(path: &Path) -> String {
    format!(
        "the host replaced {} while the command ran (a delete or rename over it, as an editor's save, `git config` or `aws configure` does): that detached the protection moat laid over it, so moat stopped the run and killed every process of it; run the command again (the new file is protected from the start), and do not replace protected files on the host while a run is live",
        path.display()
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::os::unix::fs::PermissionsExt;

    use super::{ArmFailure, Watch};

    /// In a forked child in a user namespace that maps only uid 0 and gid
    /// 0 (the shape of a root run's): arms the watch over `target`, 0 when
    /// the arm failed with "moat cannot watch", 1 when it armed, 2 on
    /// another answer, 3 when the namespace could not be made.
    fn arm_in_a_root_run_namespace(target: &std::path::Path) -> i32 {
        // SAFETY: the child only makes syscalls and exits by _exit.
        match unsafe { libc::fork() } {
            0 => {
                let code = (|| {
                    // SAFETY: the child has one thread.
                    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
                        return 3;
                    }
                    let ok = std::fs::write("/proc/self/setgroups", "deny").is_ok()
                        && std::fs::write("/proc/self/uid_map", "0 0 1").is_ok()
                        && std::fs::write("/proc/self/gid_map", "0 0 1").is_ok();
                    if !ok {
                        return 3;
                    }
                    match Watch::arm_paths(vec![target]) {
                        Err(ArmFailure::Failed(m)) if m.contains("moat cannot watch") => 0,
                        Ok(Some(_)) => 1,
                        _ => 2,
                    }
                })();
                // SAFETY: leaves the forked child without running the harness.
                unsafe { libc::_exit(code) }
            }
            pid if pid > 0 => {
                let mut status = 0;
                // SAFETY: waits for the child forked above.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                libc::WEXITSTATUS(status)
            }
            _ => panic!("fork failed"),
        }
    }

    #[test]
    fn a_directory_the_init_cannot_search_fails_the_arm_never_skips_the_target() {
        // The workspace is the run's user's (uid 0 here), with a group the
        // run does not map: the init's capabilities do not apply to it, and
        // its owner, the command, can make it unsearchable (mode 0600) while
        // the watch is armed. The arm must fail (the run stops), never pass
        // over the target as if nothing in the run could reach it.
        let dir = std::env::temp_dir().join(format!("moat-watch-{}", std::process::id()));
        let ws = dir.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join(".env"), "SECRET").unwrap();
        let target = ws.join(".env");
        if std::os::unix::fs::chown(&ws, Some(0), Some(65534)).is_err() {
            // Unprivileged, the namespace maps the caller's own ids and the
            // workspace cannot be given an unmapped group: the conformance
            // case `host_replace::a_workspace_made_unsearchable_…` covers
            // the run as a whole.
            let _ = std::fs::remove_dir_all(&dir);
            println!("SKIP: needs root to give the workspace an unmapped group");
            return;
        }
        std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o755)).unwrap();
        let reachable = arm_in_a_root_run_namespace(&target);
        std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o600)).unwrap();
        let unsearchable = arm_in_a_root_run_namespace(&target);
        std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o755)).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_ne!(reachable, 3, "no user namespace for the case");
        // Reachable: the target is no mount here, which the arm takes for
        // replaced (2): the namespace and the path work.
        assert_eq!(reachable, 2, "the reachable target was not looked at");
        assert_eq!(
            unsearchable, 0,
            "the arm passed over a target it could not reach (1) or answered otherwise (2)"
        );
    }
}
