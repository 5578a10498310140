//! After a run at a writable level: write-protected paths that did not exist
//! before (e.g. `.git/hooks` in a workspace without `.git`) cannot be covered
//! by a mount, so whatever the command created there is neutralised: moved
//! aside under a name no tool loads (or deleted), verified gone, reported.
//!
//! Every step works from a directory fd opened from the root (workspace or
//! home) with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_XDEV)`: a symlink or a mount the command planted on the way is
//! never followed, so nothing outside the root can be touched. Directories
//! the command made unwritable or unsearchable (`chmod a-w .git`) get the
//! bits the sweep needs back for the duration of the sweep. A path that
//! cannot be neutralised is a [`SweepFailure`], never a success.
//!
//! A git dir the command created (`git init`) is kept: only what a later
//! host `git` would execute goes (hooks other than `*.sample`, `commondir`,
//! config keys outside [`moat_policy::gitconfig`]'s allow-list).

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use moat_policy::{
    gitconfig, is_inert_hook_name, is_vcs_dir_name, vcs_parts, WRITE_PROTECTED_GIT_PATHS,
    WRITE_PROTECTED_GIT_WORKTREE_PATHS,
};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, RenameFlags};
use nix::sys::stat::FileStat;
use nix::unistd::UnlinkatFlags;
use serde::Serialize;

use crate::probe::Kind;
use crate::sys;

/// New entries named `<prefix>*` in a root are swept after the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PrefixGuard {
    pub prefix: String,
    /// Names with the prefix present before the run.
    pub existing: Vec<String>,
}

/// What to check under one root (the workspace, a home inside it, a
/// writable grant) after the run. Paths are relative to `root`; all of them
/// were recorded before the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SweepRoot {
    /// Canonical absolute path.
    pub root: PathBuf,
    /// First missing component of each write-protected path that did not
    /// exist before the run (every component before it was a real directory).
    pub missing: Vec<PathBuf>,
    pub prefixes: Vec<PrefixGuard>,
    /// Git dirs (existing or not) whose executable parts are checked.
    pub gitdirs: Vec<PathBuf>,
    /// Git dirs and executable parts that existed before the run (left as
    /// they are: they were read-only binds during it).
    pub git_existing: BTreeSet<PathBuf>,
    /// Executable parts that were symlinks before the run, with their
    /// targets: still "existing" only while they point at the same place.
    pub git_links: std::collections::BTreeMap<PathBuf, PathBuf>,
    /// Walk the whole root after the run for git dirs the command created
    /// below it (`git clone`, `git init sub`): set for the workspace, whose
    /// git dirs were all recorded by the complete walk before the run.
    pub find_new_gitdirs: bool,
    /// Other VCSs' admin dirs (`.hg`, `.jj`: [`moat_policy::is_vcs_dir_name`])
    /// whose config parts are checked: the root's own, existing or not, and
    /// every one the walk found below it. New ones are found by the walk
    /// after the run (`find_new_gitdirs`).
    pub vcs_dirs: Vec<PathBuf>,
    /// Their parts, and non-directories on the way to them (a secondary jj
    /// workspace's `.jj/repo` file), that existed before the run: left alone.
    pub vcs_existing: BTreeSet<PathBuf>,
    /// Symlinks on the way to a write-protected path inside the root (a
    /// `.vscode -> shared/vscode`, a `.git/config -> ../project.gitconfig`,
    /// a dangling `.git/hooks -> ../hooks`), with their targets as written
    /// and their identities ([`LinkId`]): the place they lead is
    /// protected, so one the command retargeted, replaced or made again
    /// (a concurrent run's command may have retargeted the one pinned, and
    /// that run's sweep moved it aside) is moved aside after the run.
    pub pinned_links: std::collections::BTreeMap<PathBuf, (PathBuf, Option<LinkId>)>,
    /// Protected host paths, existing or not (canonical where they exist):
    /// a symlink the command created below the root that leads to one, into
    /// one, to a directory holding one, or into or through `/proc` is removed after the
    /// run (a host tool following it later would read the secret).
    #[serde(skip)]
    pub secrets: Vec<PathBuf>,
    /// The symlinks below the root before the run (absolute path, target
    /// as written, [`LinkId`]), found by the same walk: the same link still
    /// pointing where it pointed is the user's and stays (one made again
    /// with the same target is not: a concurrent run's command may have
    /// made the first). `None`: no link is checked (the
    /// root had no complete walk).
    #[serde(skip)]
    pub links_before:
        Option<std::sync::Arc<std::collections::BTreeMap<PathBuf, (PathBuf, LinkId)>>>,
}

/// A symlink's identity: inode number, ctime seconds and nanoseconds (an
/// inode number alone is reused at once on ext4; a link made again gets a
/// new ctime).
pub type LinkId = (u64, i64, i64);

/// Something the sweep neutralised.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Swept {
    pub path: PathBuf,
    /// Where it was moved (None: deleted, or rewritten in place).
    pub moved_to: Option<PathBuf>,
    pub detail: String,
}

/// A path the sweep could not neutralise: still live on the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SweepFailure {
    pub path: PathBuf,
    pub error: String,
}

/// Everything the sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub swept: Vec<Swept>,
    pub failed: Vec<SweepFailure>,
}

/// Largest config file the sweep rewrites (git's own are a few hundred bytes).
const MAX_CONFIG: u64 = 1 << 20;
/// Deepest `.git/modules/…` nesting followed.
const MAX_GIT_DEPTH: usize = 32;

/// Tells, from one directory's listing, whether git would take that
/// directory itself for a git dir (git's `is_git_directory`): a `HEAD`
/// that is not a directory, and `objects` and `refs`, or a `commondir`
/// that supplies them. Git looks for one at every directory it starts in
/// or walks up through when no `.git` is there, so a bare repository the
/// command leaves anywhere (`git init --bare sub`, or `HEAD objects refs
/// config` written into the workspace root) has its `config` read, and
/// its `core.fsmonitor` run, by the next `git status` on the host in that
/// directory (a shell prompt's, an IDE's). Such a directory is a git dir
/// here exactly like a `.git`: one source for the probe's walk and the
/// sweep's. `kind` answers for a name in the listing.
pub fn looks_like_git_dir(kind: impl Fn(&str) -> Option<Kind>) -> bool {
    let head = matches!(kind("HEAD"), Some(Kind::File | Kind::Symlink));
    let present = |n: &str| kind(n).is_some();
    head && ((present("objects") && present("refs")) || present("commondir"))
}

/// The names [`looks_like_git_dir`] asks about: a walk keeps only these of
/// each listing.
pub const GIT_DIR_MARKERS: &[&str] = &["HEAD", "objects", "refs", "commondir"];

/// Runs the sweep for every root; the command's processes are all gone.
pub fn sweep(roots: &[SweepRoot], tag: &str) -> SweepReport {
    let mut s = Sweeper {
        tag: tag.to_string(),
        report: SweepReport::default(),
        restore: Vec::new(),
        current_root: None,
        euid: nix::unistd::geteuid().as_raw(),
    };
    for r in roots {
        match open_root(&r.root) {
            Ok(fd) => s.sweep_root(r, &fd),
            Err(e) => s.fail(&r.root, format!("cannot open the root: {e}")),
        }
    }
    // Put back the modes the command left (only the bits the sweep needed
    // were added; a directory it deleted is simply gone).
    for (fd, mode) in s.restore.drain(..).rev() {
        let _ = chmod_fd(&fd, mode);
    }
    s.report
}

/// Whether the entry `name` in `parent` (at `rel`) was there before the
/// run: a recorded file or directory (read-only during it), or a recorded
/// symlink that still points where it pointed.
fn existed(r: &SweepRoot, parent: &OwnedFd, name: &OsStr, rel: &Path) -> bool {
    if r.git_existing.contains(rel) {
        return true;
    }
    match r.git_links.get(rel) {
        Some(target) => nix::fcntl::readlinkat(parent, name)
            .map(|t| Path::new(&t) == target)
            .unwrap_or(false),
        None => false,
    }
}

/// An O_PATH fd for a root (a canonical path moat chose): no symlink on the
/// way, and a directory.
fn open_root(root: &Path) -> io::Result<OwnedFd> {
    let fd = sys::open_path_nofollow(libc::AT_FDCWD, root)?;
    let st = nix::sys::stat::fstat(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
    }
    Ok(fd)
}

/// Lists `dir` (an O_PATH fd) through its /proc magic link: the exact
/// directory opened, no path lookup.
fn list_fd(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))? {
        out.push(e?.file_name());
    }
    Ok(out)
}

fn chmod_fd(fd: &OwnedFd, mode: u32) -> io::Result<()> {
    std::fs::set_permissions(
        format!("/proc/self/fd/{}", fd.as_raw_fd()),
        std::fs::Permissions::from_mode(mode),
    )
}

fn kind_of(st: &FileStat) -> Kind {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        _ => Kind::File,
    }
}

/// lstat relative to a directory fd; `None` when nothing is there.
pub(crate) fn lstat_at(dir: &OwnedFd, name: &OsStr) -> io::Result<Option<FileStat>> {
    match nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// An O_PATH fd for directory `name` in `dir`, refusing symlinks and mounts.
pub(crate) fn open_dir(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    sys::openat_beneath(
        dir.as_raw_fd(),
        Path::new(name),
        libc::O_PATH | libc::O_DIRECTORY,
    )
}

/// Reads a small regular file: O_NONBLOCK so a FIFO the command planted
/// cannot hang the sweep, and anything but a regular file is refused.
fn read_small(dir: &OwnedFd, name: &OsStr, limit: u64) -> io::Result<Vec<u8>> {
    let fd = sys::openat_beneath(
        dir.as_raw_fd(),
        Path::new(name),
        libc::O_RDONLY | libc::O_NONBLOCK,
    )?;
    let mut f = std::fs::File::from(fd);
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if meta.len() > limit {
        return Err(io::Error::other("too large"));
    }
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(buf)
}

/// Whether a path a symlink reaches (`reached`, resolved on the host) is a
/// secret, inside one, a directory holding one, or inside `/proc`.
pub(crate) fn leads_to_secret(reached: &Path, secrets: &[PathBuf]) -> bool {
    reached.starts_with("/proc")
        || secrets
            .iter()
            .any(|s| s.starts_with(reached) || reached.starts_with(s))
}

/// Whether a chain of links ([`crate::probe::follow_links`]'s) passes a
/// link inside `/proc`, whose targets depend on the process following it.
pub(crate) fn through_proc(links: &[(PathBuf, PathBuf)]) -> bool {
    links.iter().any(|(at, _)| at.starts_with("/proc"))
}

struct Sweeper {
    tag: String,
    report: SweepReport,
    /// Directories whose mode the sweep changed, with the mode to put back.
    restore: Vec<(OwnedFd, u32)>,
    /// The root being swept, by path and fd.
    current_root: Option<(PathBuf, OwnedFd)>,
    euid: u32,
}

impl Sweeper {
    fn fail(&mut self, path: &Path, error: String) {
        self.report.failed.push(SweepFailure {
            path: path.to_path_buf(),
            error,
        });
    }

    /// Adds the `need` owner bits to `fd`'s directory when the command
    /// removed them (same uid: the supervisor may). Root needs none.
    fn grant_access(&mut self, fd: &OwnedFd, need: u32) {
        if self.euid == 0 {
            return;
        }
        let Ok(st) = nix::sys::stat::fstat(fd) else {
            return;
        };
        let mode = st.st_mode & 0o7777;
        if mode & need == need || st.st_uid != self.euid {
            return;
        }
        if chmod_fd(fd, mode | need).is_ok() {
            if let Ok(dup) = fd.try_clone() {
                self.restore.push((dup, mode));
            }
        }
    }

    fn sweep_root(&mut self, r: &SweepRoot, root: &OwnedFd) {
        self.current_root = root.try_clone().ok().map(|fd| (r.root.clone(), fd));
        self.check_pinned_links(r, root);
        for rel in &r.gitdirs {
            self.sanitize_gitdir(r, root, rel, false, 0);
        }
        let mut vcs: BTreeSet<PathBuf> = r.vcs_dirs.iter().cloned().collect();
        if r.find_new_gitdirs {
            let (gitdirs, vcs_dirs) = self.new_gitdirs(r, root);
            for rel in gitdirs {
                self.sanitize_gitdir(r, root, &rel, false, 0);
            }
            vcs.extend(vcs_dirs);
        }
        for rel in &vcs {
            self.sanitize_vcs_dir(r, root, rel);
        }
        // A name directly in the root (most of them: `.bashrc`, `.vscode`…)
        // is looked up from the root's own fd, not a duplicate per name;
        // the root's search bit is granted once (the sweep only ever adds
        // bits until the end).
        let mut root_searchable = false;
        for rel in &r.missing {
            let mut comps = rel.iter();
            if let (Some(name), None) = (comps.next(), comps.next()) {
                if !root_searchable {
                    self.grant_access(root, 0o100);
                    root_searchable = true;
                }
                self.neutralise_if_there(
                    root,
                    &r.root.join(rel),
                    name,
                    "created by the command at a write-protected path",
                );
                continue;
            }
            if let Some((parent, name)) = self.open_parent(r, root, rel) {
                self.neutralise_if_present(
                    &parent,
                    &r.root.join(rel),
                    &name,
                    "created by the command at a write-protected path",
                );
            }
        }
        if r.prefixes.is_empty() {
            return;
        }
        self.grant_access(root, 0o500);
        let names = match list_fd(root) {
            Ok(n) => n,
            Err(e) => {
                self.fail(&r.root, format!("cannot list it to find new entries: {e}"));
                return;
            }
        };
        for name in names {
            let s = name.to_string_lossy().into_owned();
            let new = r
                .prefixes
                .iter()
                .any(|g| s.starts_with(&g.prefix) && !g.existing.contains(&s));
            if new && !s.contains(".moat-quarantine-") {
                self.neutralise_if_present(
                    root,
                    &r.root.join(&name),
                    &name,
                    "created by the command at a write-protected path",
                );
            }
        }
    }

    /// Every `.git` below the root that was not there before the run, by
    /// the same rules as the walk before it (no symlink or mount followed,
    /// `node_modules` and git dirs' insides skipped; readdir's d_type only).
    /// Also returns every other VCS admin dir (`.hg`, `.jj`) found, and
    /// removes the symlinks the command left that lead to a secret
    /// ([`Self::drop_secret_link`]).
    fn new_gitdirs(&mut self, r: &SweepRoot, root: &OwnedFd) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let mut found = Vec::new();
        let mut vcs = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let dir = if rel.as_os_str().is_empty() {
                root.try_clone()
            } else {
                open_rel(root, &rel)
            };
            let dir = match dir {
                Ok(fd) => fd,
                // Not ours and not searchable: the command could not have
                // created anything inside either. Another filesystem mounted
                // on the host inside the workspace is not followed (README
                // Limitations); the command cannot add host mounts.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EXDEV)) => {
                    continue
                }
                Err(e) => {
                    self.fail(
                        &r.root.join(&rel),
                        format!("cannot open it to look for new git dirs: {e}"),
                    );
                    continue;
                }
            };
            self.grant_access(&dir, 0o500);
            let rd = match std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) {
                Ok(rd) => rd,
                // Not the caller's (its own was made readable above): the
                // walk before the run listed it, and the command (same uid)
                // cannot change its mode.
                Err(e)
                    if e.raw_os_error() == Some(libc::EACCES)
                        && nix::sys::stat::fstat(&dir).is_ok_and(|st| st.st_uid != self.euid) =>
                {
                    continue
                }
                Err(e) => {
                    self.fail(
                        &r.root.join(&rel),
                        format!("cannot list it to look for new git dirs: {e}"),
                    );
                    continue;
                }
            };
            let mut markers: Vec<(&str, Kind)> = Vec::new();
            for e in rd {
                // An entry that cannot be listed or typed is neither
                // checked nor walked: a failure, never a silent skip.
                let e = match e.and_then(|e| e.file_type().map(|_| e)) {
                    Ok(e) => e,
                    Err(err) if err.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(err) => {
                        self.fail(
                            &r.root.join(&rel),
                            format!("cannot list it to look for new git dirs and links to secrets: {err}"),
                        );
                        break;
                    }
                };
                let name = e.file_name();
                let child = rel.join(&name);
                if let Some(m) = GIT_DIR_MARKERS.iter().find(|m| name == **m) {
                    if let Ok(t) = e.file_type() {
                        markers.push((m, crate::probe::dirent_kind(&t)));
                    }
                }
                let is_link = e.file_type().map(|t| t.is_symlink()).unwrap_or(false);
                if is_link && r.links_before.is_some() {
                    self.drop_secret_link(r, &dir, &child, &name);
                }
                if is_vcs_dir_name(&name.to_string_lossy()) {
                    vcs.push(child.clone());
                }
                if name == ".git" {
                    let known = r.git_existing.contains(&child) || r.git_links.contains_key(&child);
                    if !rel.as_os_str().is_empty() && !known {
                        found.push(child);
                    }
                } else if !crate::probe::WALK_SKIP.iter().any(|s| name == *s)
                    && e.file_type().map(|t| t.is_dir()).unwrap_or(false)
                {
                    stack.push(child);
                }
            }
            // The directory itself as a git dir (a bare repository), the
            // root included; still walked below, like any directory.
            let is_git_dir =
                looks_like_git_dir(|n| markers.iter().find(|(m, _)| *m == n).map(|(_, k)| *k));
            if is_git_dir && !r.git_existing.contains(&rel) {
                found.push(rel);
            }
        }
        (found, vcs)
    }

    /// Removes the symlink `name` (in `dir`, at `rel`) when the command
    /// made or changed it during the run (it was not there before, the
    /// same link ([`LinkId`]) with the same target) and it leads to a
    /// protected path, into one, to a directory holding one (`~`, `/`), or
    /// into or through `/proc` (a host tool's own environment, cwd and
    /// fds): a host tool or
    /// agent following it after the run would read the secret. The link
    /// itself is unlinked from its directory fd, never followed: its target
    /// is only looked at (lstat and readlink on the host's paths).
    fn drop_secret_link(&mut self, r: &SweepRoot, dir: &OwnedFd, rel: &Path, name: &OsStr) {
        let Some(before) = &r.links_before else {
            return;
        };
        let abs = r.root.join(rel);
        let target = match nix::fcntl::readlinkat(dir, name) {
            Ok(t) => t,
            // Gone, or no longer a symlink: nothing left to follow.
            Err(Errno::ENOENT | Errno::EINVAL) => return,
            // A directory that is not the caller's and refuses it the
            // search: the command (same uid) could not have made an entry
            // in it either (the sweep makes its own searchable first).
            Err(Errno::EACCES)
                if nix::sys::stat::fstat(dir).is_ok_and(|st| st.st_uid != self.euid) =>
            {
                return
            }
            Err(e) => {
                self.fail(
                    &abs,
                    format!("cannot read where this symlink leads, to check it does not lead to a secret: {e}"),
                );
                return;
            }
        };
        let id = nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()
            .map(|st| (st.st_ino, st.st_ctime, st.st_ctime_nsec));
        if before
            .get(&abs)
            .is_some_and(|(t, i)| *t == Path::new(&target) && Some(*i) == id)
        {
            return;
        }
        let joined = abs.parent().unwrap_or(&r.root).join(&target);
        // One that cannot be resolved (a loop, an absurdly long chain) is
        // removed too: nothing shows it harmless, and no one needs it.
        // A chain through a link inside `/proc` (`/proc/self/cwd`,
        // `/dev/fd/N`) goes where each process's own cwd, root or fds are:
        // where it led moat says nothing of where it leads a host tool
        // (its cwd's `../../.ssh/id_rsa`), so it is removed too.
        let why = match crate::probe::follow_links(&joined) {
            Some((reached, links))
                if !leads_to_secret(&reached, &r.secrets) && !through_proc(&links) =>
            {
                return
            }
            Some((reached, links)) if !leads_to_secret(&reached, &r.secrets) => format!(
                "passes through {} (a link in /proc: each process reaches its own cwd, root or fds through it)",
                links
                    .iter()
                    .map(|(at, _)| at)
                    .find(|at| at.starts_with("/proc"))
                    .unwrap_or(&reached)
                    .display()
            ),
            Some((reached, _)) => format!(
                "leads to {} (a protected or write-protected path, a directory holding one, or /proc)",
                reached.display()
            ),
            None => "cannot be resolved (a loop, or a chain too long)".to_string(),
        };
        self.grant_access(dir, 0o300);
        let err = nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).err();
        match lstat_at(dir, name) {
            Ok(None) => self.report.swept.push(Swept {
                path: abs,
                moved_to: None,
                detail: format!(
                    "a symlink the command left, to {}, {why}: removed, so no host tool follows it",
                    Path::new(&target).display()
                ),
            }),
            Ok(Some(_)) => self.fail(
                &abs,
                format!(
                    "a symlink that {why} is still present after deleting it ({})",
                    err.map(|e| e.to_string())
                        .unwrap_or_else(|| "no error reported".into())
                ),
            ),
            Err(e) => self.fail(&abs, format!("cannot verify it is gone: {e}")),
        }
    }

    /// Moves aside each recorded symlink on the way to a write-protected
    /// path that no longer points where it pointed before the run, is no
    /// longer the same link, or no longer a symlink: the place it led was
    /// protected, a new target was not.
    fn check_pinned_links(&mut self, r: &SweepRoot, root: &OwnedFd) {
        for (rel, (target, id)) in &r.pinned_links {
            let Some((parent, name)) = self.open_parent(r, root, rel) else {
                continue;
            };
            self.grant_access(&parent, 0o100);
            let abs = r.root.join(rel);
            match lstat_at(&parent, &name) {
                Ok(None) => {}
                Ok(Some(st)) => {
                    let same = kind_of(&st) == Kind::Symlink
                        && *id == Some((st.st_ino, st.st_ctime, st.st_ctime_nsec))
                        && nix::fcntl::readlinkat(&parent, name.as_os_str())
                            .is_ok_and(|t| Path::new(&t) == target);
                    if !same {
                        self.neutralise(
                            &parent,
                            &abs,
                            &name,
                            "a symlink on the way to a write-protected path, retargeted or replaced by the command",
                        );
                    }
                }
                Err(e) => self.fail(&abs, format!("cannot stat it: {e}")),
            }
        }
    }

    /// The config parts of the VCS admin dir at `rel` (`.hg/hgrc`,
    /// `.jj/repo/config.toml`…) that did not exist before the run are moved
    /// aside; the repository itself is kept. An admin dir the command made
    /// a symlink or file (sending the tool elsewhere) is moved aside whole,
    /// and so is a non-directory it put on the way to a part.
    fn sanitize_vcs_dir(&mut self, r: &SweepRoot, root: &OwnedFd, rel: &Path) {
        let Some(dname) = rel.file_name().and_then(|n| n.to_str()) else {
            return;
        };
        let Some((parent, name)) = self.open_parent(r, root, rel) else {
            return;
        };
        self.grant_access(&parent, 0o100);
        let abs = r.root.join(rel);
        match lstat_at(&parent, &name) {
            Ok(None) => return,
            Ok(Some(st)) if kind_of(&st) == Kind::Dir => {}
            Ok(Some(_)) => {
                if !r.pinned_links.contains_key(rel) && !r.vcs_existing.contains(rel) {
                    self.neutralise(
                        &parent,
                        &abs,
                        &name,
                        "a VCS admin dir redirect (symlink or file) created by the command",
                    );
                }
                return;
            }
            Err(e) => return self.fail(&abs, format!("cannot stat it: {e}")),
        }
        let dir = match open_dir(&parent, &name) {
            Ok(fd) => fd,
            Err(e) => return self.fail(&abs, format!("cannot open it: {e}")),
        };
        for part in vcs_parts(dname) {
            let comps: Vec<&OsStr> = Path::new(part).iter().collect();
            let Ok(mut cur) = dir.try_clone() else {
                continue;
            };
            let mut prel = rel.to_path_buf();
            for (i, c) in comps.iter().enumerate() {
                prel.push(c);
                let pabs = r.root.join(&prel);
                self.grant_access(&cur, 0o100);
                let st = match lstat_at(&cur, c) {
                    Ok(None) => break,
                    Ok(Some(st)) => st,
                    Err(e) => {
                        self.fail(&pabs, format!("cannot stat it: {e}"));
                        break;
                    }
                };
                // There before the run (read-only during it), or a pinned
                // symlink (checked on its own).
                if r.vcs_existing.contains(&prel) || r.pinned_links.contains_key(&prel) {
                    break;
                }
                let last = i + 1 == comps.len();
                if !last && kind_of(&st) == Kind::Dir {
                    match open_dir(&cur, c) {
                        Ok(fd) => cur = fd,
                        Err(e) => {
                            self.fail(&pabs, format!("cannot open it: {e}"));
                            break;
                        }
                    }
                    continue;
                }
                let why = if last {
                    "VCS config created by the command (the host's hg or jj would run what it names)"
                } else {
                    "replaced a directory on the way to a write-protected path"
                };
                self.neutralise(&cur, &pabs, c, why);
                break;
            }
        }
    }

    /// Opens the parent of `rel` component by component. An intermediate
    /// component that is no longer a directory (the command swapped a
    /// directory for a symlink to reach outside) is itself neutralised.
    /// `None`: nothing left to do below (missing, or already handled).
    fn open_parent(
        &mut self,
        r: &SweepRoot,
        root: &OwnedFd,
        rel: &Path,
    ) -> Option<(OwnedFd, OsString)> {
        let comps: Vec<&OsStr> = rel.iter().collect();
        let (last, dirs) = comps.split_last()?;
        let mut cur = match root.try_clone() {
            Ok(fd) => fd,
            Err(e) => {
                self.fail(&r.root.join(rel), format!("cannot duplicate an fd: {e}"));
                return None;
            }
        };
        let mut at = r.root.clone();
        for c in dirs {
            self.grant_access(&cur, 0o100);
            let here = at.join(c);
            match lstat_at(&cur, c) {
                Ok(None) => return None,
                Ok(Some(st)) if kind_of(&st) == Kind::Dir => match open_dir(&cur, c) {
                    Ok(fd) => cur = fd,
                    Err(e) => {
                        self.fail(&here, format!("cannot open it: {e}"));
                        return None;
                    }
                },
                Ok(Some(_)) => {
                    self.neutralise(
                        &cur,
                        &here,
                        c,
                        "replaced a directory on the way to a write-protected path",
                    );
                    return None;
                }
                Err(e) => {
                    self.fail(&here, format!("cannot stat it: {e}"));
                    return None;
                }
            }
            at = here;
        }
        Some((cur, last.to_os_string()))
    }

    fn neutralise_if_present(&mut self, parent: &OwnedFd, path: &Path, name: &OsStr, why: &str) {
        self.grant_access(parent, 0o100);
        self.neutralise_if_there(parent, path, name, why);
    }

    /// [`Self::neutralise_if_present`] once `parent` is searchable.
    fn neutralise_if_there(&mut self, parent: &OwnedFd, path: &Path, name: &OsStr, why: &str) {
        match lstat_at(parent, name) {
            Ok(None) => {}
            Ok(Some(_)) => self.neutralise(parent, path, name, why),
            Err(e) => self.fail(path, format!("cannot stat it: {e}")),
        }
    }

    /// Moves `name` aside to `<name>.moat-quarantine-<tag>` in the same
    /// directory (deletes it if that fails), then checks with lstat that
    /// nothing is left at `name`.
    fn neutralise(&mut self, parent: &OwnedFd, path: &Path, name: &OsStr, why: &str) {
        self.grant_access(parent, 0o300);
        let mut q = name.to_os_string();
        q.push(format!(".moat-quarantine-{}", self.tag));
        let moved = nix::fcntl::renameat2(
            parent,
            name,
            parent,
            q.as_os_str(),
            RenameFlags::RENAME_NOREPLACE,
        );
        let (moved_to, err) = match moved {
            Ok(()) => (path.parent().map(|p| p.join(&q)), None),
            Err(e) => (
                None,
                self.remove_tree(parent, name)
                    .err()
                    .map(|d| format!("rename: {e}; delete: {d}")),
            ),
        };
        match lstat_at(parent, name) {
            Ok(None) => self.report.swept.push(Swept {
                path: path.to_path_buf(),
                moved_to,
                detail: why.to_string(),
            }),
            Ok(Some(_)) => self.fail(
                path,
                format!(
                    "still present after moving and deleting it ({})",
                    err.unwrap_or_else(|| "no error reported".into())
                ),
            ),
            Err(e) => self.fail(path, format!("cannot verify it is gone: {e}")),
        }
    }

    fn remove_tree(&mut self, parent: &OwnedFd, name: &OsStr) -> io::Result<()> {
        let Some(st) = lstat_at(parent, name)? else {
            return Ok(());
        };
        if kind_of(&st) == Kind::Dir {
            let dir = open_dir(parent, name)?;
            self.grant_access(&dir, 0o700);
            for child in list_fd(&dir)? {
                self.remove_tree(&dir, &child)?;
            }
            nix::unistd::unlinkat(parent, name, UnlinkatFlags::RemoveDir)?;
        } else {
            nix::unistd::unlinkat(parent, name, UnlinkatFlags::NoRemoveDir)?;
        }
        Ok(())
    }

    /// Keeps the git dir at `rel` and neutralises every executable part of
    /// it (and of its linked worktrees and submodules) that did not exist
    /// before the run.
    fn sanitize_gitdir(
        &mut self,
        r: &SweepRoot,
        root: &OwnedFd,
        rel: &Path,
        in_modules: bool,
        depth: usize,
    ) {
        let abs = r.root.join(rel);
        if depth > MAX_GIT_DEPTH {
            self.fail(&abs, "git dirs nested too deeply to check".into());
            return;
        }
        if rel.as_os_str().is_empty() {
            // The root itself is a (bare) git dir: kept, its parts checked.
            match root.try_clone() {
                Ok(gd) => self.sanitize_gitdir_parts(r, root, &gd, rel, in_modules, depth),
                Err(e) => self.fail(&abs, format!("cannot duplicate an fd: {e}")),
            }
            return;
        }
        let Some((parent, name)) = self.open_parent(r, root, rel) else {
            return;
        };
        self.grant_access(&parent, 0o100);
        let kind = match lstat_at(&parent, &name) {
            Ok(None) => return,
            Ok(Some(st)) => kind_of(&st),
            Err(e) => return self.fail(&abs, format!("cannot stat it: {e}")),
        };
        let was_there = existed(r, &parent, &name, rel);
        if kind != Kind::Dir {
            // A gitfile or symlink sends git to a git dir of the command's
            // choosing, anywhere; a gitfile `git worktree add` or `git
            // submodule add` wrote (pointing into the root's own
            // `.git/worktrees` or `.git/modules`, which are checked too) stays.
            let kept = was_there
                || (kind == Kind::File && self.gitfile_is_ours(r, root, &parent, &name, rel));
            if !kept {
                self.neutralise(
                    &parent,
                    &abs,
                    &name,
                    "a git dir redirect (gitfile or symlink) created by the command",
                );
            }
            return;
        }
        let gd = match open_dir(&parent, &name) {
            Ok(fd) => fd,
            Err(e) => return self.fail(&abs, format!("cannot open it: {e}")),
        };
        self.sanitize_gitdir_parts(r, root, &gd, rel, in_modules, depth);
    }

    /// Neutralises the executable parts of the git dir `gd` (at `rel`)
    /// that did not exist before the run, and of its linked worktrees and
    /// submodules.
    fn sanitize_gitdir_parts(
        &mut self,
        r: &SweepRoot,
        root: &OwnedFd,
        gd: &OwnedFd,
        rel: &Path,
        in_modules: bool,
        depth: usize,
    ) {
        self.grant_access(gd, 0o100);
        for part in WRITE_PROTECTED_GIT_PATHS {
            let prel = rel.join(part);
            if existed(r, gd, OsStr::new(part), &prel) {
                continue;
            }
            self.sanitize_part(gd, &r.root.join(&prel), OsStr::new(part), in_modules);
        }
        self.sanitize_worktrees(r, gd, rel);
        let mrel = rel.join("modules");
        if let Ok(Some(st)) = lstat_at(gd, OsStr::new("modules")) {
            if kind_of(&st) == Kind::Dir {
                self.walk_modules(r, root, &mrel, depth + 1);
            } else if !existed(r, gd, OsStr::new("modules"), &mrel) {
                self.neutralise(
                    gd,
                    &r.root.join(&mrel),
                    OsStr::new("modules"),
                    "not a directory where git keeps submodules",
                );
            }
        }
    }

    /// Whether the gitfile `name` (in `parent`, at `rel`) points to a git
    /// dir inside the root's own `.git/worktrees/` or `.git/modules/`,
    /// resolved by the kernel without symlinks and beneath the root.
    fn gitfile_is_ours(
        &mut self,
        r: &SweepRoot,
        root: &OwnedFd,
        parent: &OwnedFd,
        name: &OsStr,
        rel: &Path,
    ) -> bool {
        let Ok(bytes) = read_small(parent, name, 4096) else {
            return false;
        };
        let text = String::from_utf8_lossy(&bytes);
        let Some(target) = text.trim_end_matches(['\n', '\r']).strip_prefix("gitdir: ") else {
            return false;
        };
        let target = Path::new(target);
        let rel_target = if target.is_absolute() {
            match target.strip_prefix(&r.root) {
                Ok(t) => t.to_path_buf(),
                Err(_) => return false,
            }
        } else {
            rel.parent().unwrap_or(Path::new("")).join(target)
        };
        let Ok(fd) = open_rel(root, &rel_target) else {
            return false;
        };
        let Ok(real) = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
            return false;
        };
        let own = r.root.join(".git");
        real.starts_with(own.join("worktrees")) || real.starts_with(own.join("modules"))
    }

    /// Whether every `core.worktree` in the config `text` (of the file at
    /// `config_abs`) names an existing directory strictly beneath the
    /// current root, resolved as git resolves it (relative to the git dir)
    /// and opened beneath the root with no symlink on the way.
    fn module_worktrees_inside(&self, config_abs: &Path, text: &str) -> bool {
        let Ok(entries) = gitconfig::parse(text) else {
            return false;
        };
        let Some((root_path, root_fd)) = &self.current_root else {
            return false;
        };
        let Ok(git_dir) = config_abs
            .parent()
            .unwrap_or(config_abs)
            .strip_prefix(root_path)
        else {
            return false;
        };
        entries
            .iter()
            .filter(|e| e.section == "core" && e.subsection.is_none() && e.key == "worktree")
            .all(|e| {
                let Some(v) = e.value.as_deref() else {
                    return false;
                };
                // Resolved by the kernel, `..` included, from the root's
                // fd: no symlink, nothing outside it.
                let rel = if v.starts_with('/') {
                    match Path::new(v).strip_prefix(root_path) {
                        Ok(r) => r.to_path_buf(),
                        Err(_) => return false,
                    }
                } else {
                    git_dir.join(v)
                };
                let Ok(fd) = open_rel(root_fd, &rel) else {
                    return false;
                };
                std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                    .is_ok_and(|real| real.starts_with(root_path) && real != *root_path)
            })
    }

    fn sanitize_part(&mut self, gd: &OwnedFd, abs: &Path, part: &OsStr, in_modules: bool) {
        let st = match lstat_at(gd, part) {
            Ok(None) => return,
            Ok(Some(st)) => st,
            Err(e) => return self.fail(abs, format!("cannot stat it: {e}")),
        };
        let kind = kind_of(&st);
        match part.to_str().unwrap_or("") {
            "hooks" if kind == Kind::Dir => {
                let hooks = match open_dir(gd, part) {
                    Ok(fd) => fd,
                    Err(e) => return self.fail(abs, format!("cannot open it: {e}")),
                };
                self.grant_access(&hooks, 0o700);
                let names = match list_fd(&hooks) {
                    Ok(n) => n,
                    Err(e) => return self.fail(abs, format!("cannot list it: {e}")),
                };
                for n in names {
                    let s = n.to_string_lossy();
                    if !is_inert_hook_name(&s) && !s.contains(".moat-quarantine-") {
                        self.neutralise(
                            &hooks,
                            &abs.join(&n),
                            &n,
                            "a git hook created by the command (the host's git would run it)",
                        );
                    }
                }
            }
            "config" | "config.worktree" if kind == Kind::File => {
                self.sanitize_config(gd, abs, part, in_modules)
            }
            "commondir" => self.neutralise(
                gd,
                abs,
                part,
                "redirects git to another repository's config and hooks",
            ),
            _ => self.neutralise(gd, abs, part, "not what git expects at this path"),
        }
    }

    fn sanitize_worktrees(&mut self, r: &SweepRoot, gd: &OwnedFd, rel: &Path) {
        let wrel = rel.join("worktrees");
        let wabs = r.root.join(&wrel);
        let w = OsStr::new("worktrees");
        match lstat_at(gd, w) {
            Ok(Some(st)) if kind_of(&st) == Kind::Dir => {}
            Ok(Some(_)) if !existed(r, gd, w, &wrel) => {
                return self.neutralise(gd, &wabs, w, "not a directory where git keeps worktrees")
            }
            _ => return,
        }
        let wfd = match open_dir(gd, w) {
            Ok(fd) => fd,
            Err(e) => return self.fail(&wabs, format!("cannot open it: {e}")),
        };
        self.grant_access(&wfd, 0o500);
        let names = match list_fd(&wfd) {
            Ok(n) => n,
            Err(e) => return self.fail(&wabs, format!("cannot list it: {e}")),
        };
        for n in names {
            let trel = wrel.join(&n);
            let tabs = r.root.join(&trel);
            match lstat_at(&wfd, &n) {
                Ok(Some(st)) if kind_of(&st) == Kind::Dir => {}
                Ok(Some(_)) if !existed(r, &wfd, &n, &trel) => {
                    self.neutralise(
                        &wfd,
                        &tabs,
                        &n,
                        "a worktree admin entry that is not a directory",
                    );
                    continue;
                }
                _ => continue,
            }
            let tfd = match open_dir(&wfd, &n) {
                Ok(fd) => fd,
                Err(e) => {
                    self.fail(&tabs, format!("cannot open it: {e}"));
                    continue;
                }
            };
            self.grant_access(&tfd, 0o100);
            for part in WRITE_PROTECTED_GIT_WORKTREE_PATHS {
                let prel = trel.join(part);
                if existed(r, &tfd, OsStr::new(part), &prel) || *part == "gitdir" {
                    // `gitdir` only points back at the worktree's `.git`
                    // file (read by `git worktree list/prune`).
                    continue;
                }
                let pabs = r.root.join(&prel);
                let p = OsStr::new(part);
                match lstat_at(&tfd, p) {
                    Ok(None) => {}
                    Ok(Some(st)) if *part == "commondir" && kind_of(&st) == Kind::File => {
                        // `git worktree add` writes `../..`; anything else
                        // sends git elsewhere.
                        let ok = read_small(&tfd, p, 4096)
                            .map(|b| matches!(b.trim_ascii(), b"../.." | b"../../"))
                            .unwrap_or(false);
                        if !ok {
                            self.neutralise(
                                &tfd,
                                &pabs,
                                p,
                                "redirects the worktree to another repository",
                            );
                        }
                    }
                    Ok(Some(st)) if kind_of(&st) == Kind::File => {
                        self.sanitize_config(&tfd, &pabs, p, false)
                    }
                    Ok(Some(_)) => {
                        self.neutralise(&tfd, &pabs, p, "not what git expects at this path")
                    }
                    Err(e) => self.fail(&pabs, format!("cannot stat it: {e}")),
                }
            }
        }
    }

    /// Submodule git dirs live at `.git/modules/<name>`, where a name may
    /// contain slashes: a directory holding `HEAD` or `config` is a git
    /// dir, any other directory is walked further.
    fn walk_modules(&mut self, r: &SweepRoot, root: &OwnedFd, rel: &Path, depth: usize) {
        let abs = r.root.join(rel);
        if depth > MAX_GIT_DEPTH {
            return self.fail(&abs, "submodule dirs nested too deeply to check".into());
        }
        let Some((parent, name)) = self.open_parent(r, root, rel) else {
            return;
        };
        let dir = match open_dir(&parent, &name) {
            Ok(fd) => fd,
            Err(e) => return self.fail(&abs, format!("cannot open it: {e}")),
        };
        self.grant_access(&dir, 0o500);
        let names = match list_fd(&dir) {
            Ok(n) => n,
            Err(e) => return self.fail(&abs, format!("cannot list it: {e}")),
        };
        for n in names {
            let erel = rel.join(&n);
            match lstat_at(&dir, &n) {
                Ok(Some(st)) if kind_of(&st) == Kind::Dir => {
                    let is_gitdir = open_dir(&dir, &n)
                        .map(|e| {
                            ["HEAD", "config"]
                                .iter()
                                .any(|f| matches!(lstat_at(&e, OsStr::new(f)), Ok(Some(_))))
                        })
                        .unwrap_or(true);
                    if is_gitdir {
                        self.sanitize_gitdir(r, root, &erel, true, depth + 1);
                    } else {
                        self.walk_modules(r, root, &erel, depth + 1);
                    }
                }
                Ok(Some(_))
                    if !existed(r, &dir, &n, &erel)
                        && !n.as_bytes().windows(17).any(|w| w == b".moat-quarantine-") =>
                {
                    self.neutralise(
                        &dir,
                        &r.root.join(&erel),
                        &n,
                        "a submodule git dir redirect created by the command",
                    )
                }
                _ => {}
            }
        }
    }

    /// Rewrites a config file the command created with only the inert keys
    /// (the original is moved aside); one that is not git config is moved
    /// aside whole.
    fn sanitize_config(&mut self, dir: &OwnedFd, abs: &Path, name: &OsStr, in_modules: bool) {
        let text = match read_small(dir, name, MAX_CONFIG) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(_) => {
                return self.neutralise(dir, abs, name, "a git config file moat cannot read back");
            }
        };
        // A submodule's `core.worktree` is kept only when it names a real
        // directory beneath the root (where `git submodule add` put the
        // checkout): pointing elsewhere (`/home/u`), the host's next
        // checkout in that submodule writes its files there.
        let in_modules = in_modules && self.module_worktrees_inside(abs, &text);
        let (clean, dropped) = match gitconfig::sanitize(&text, in_modules) {
            Ok(x) => x,
            Err(e) => {
                return self.neutralise(
                    dir,
                    abs,
                    name,
                    &format!("a git config file git would not read as written ({e})"),
                );
            }
        };
        if dropped.is_empty() {
            return;
        }
        self.grant_access(dir, 0o300);
        let mut tmp = name.to_os_string();
        tmp.push(format!(".moat-sanitized-{}", self.tag));
        let mut q = name.to_os_string();
        q.push(format!(".moat-quarantine-{}", self.tag));
        let written = sys::create_excl_at(dir.as_raw_fd(), Path::new(&tmp), 0o644)
            .and_then(|fd| std::fs::File::from(fd).write_all(clean.as_bytes()))
            .and_then(|()| {
                nix::fcntl::renameat2(dir, name, dir, q.as_os_str(), RenameFlags::RENAME_NOREPLACE)
                    .map_err(io::Error::from)
            })
            .and_then(|()| {
                nix::fcntl::renameat(dir, tmp.as_os_str(), dir, name).map_err(io::Error::from)
            });
        if let Err(e) = written {
            let _ = nix::unistd::unlinkat(dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
            // Could not rewrite it: then it must not stay at all.
            return self.neutralise(
                dir,
                abs,
                name,
                &format!("a git config with keys that run programs (rewriting it failed: {e})"),
            );
        }
        // Verify: what is there now holds no key outside the allow-list.
        let verified = read_small(dir, name, MAX_CONFIG)
            .ok()
            .and_then(|b| gitconfig::sanitize(&String::from_utf8_lossy(&b), in_modules).ok())
            .map(|(_, d)| d.is_empty())
            .unwrap_or(false);
        if !verified {
            return self.neutralise(
                dir,
                abs,
                name,
                "a git config that still held keys that run programs after rewriting",
            );
        }
        let moved_to = abs.parent().map(|p| p.join(&q));
        for key in dropped {
            self.report.swept.push(Swept {
                path: abs.to_path_buf(),
                moved_to: moved_to.clone(),
                detail: format!("git config key `{key}` removed (it can run a program or redirect git on the host)"),
            });
        }
    }
}

/// Prevention rather than sweeping: an existing git dir without `hooks`
/// gets the empty `hooks` directory `git init` would have made, so it is a
/// read-only mount during the run and no hook can be live on the host even
/// for a moment. (Nothing similar exists for `commondir`: an empty one makes
/// git fail.) Returns whether it created one.
pub fn ensure_hooks_dir(root: &Path, rel: &Path) -> io::Result<bool> {
    let root_fd = open_root(root)?;
    // An empty `rel`: the root itself is a (bare) git dir.
    let gd = if rel.as_os_str().is_empty() {
        root_fd
    } else {
        match open_rel(&root_fd, rel) {
            Ok(fd) => fd,
            // Missing, a gitfile or a symlink: nothing to prepare.
            Err(_) => return Ok(false),
        }
    };
    if lstat_at(&gd, OsStr::new("hooks"))?.is_some() {
        return Ok(false);
    }
    nix::sys::stat::mkdirat(
        &gd,
        "hooks",
        nix::sys::stat::Mode::from_bits_truncate(0o755),
    )?;
    Ok(true)
}

/// The executable parts of the git dir at `rel` (and of its worktrees and
/// submodules) that exist now, with their kinds: before the run these are
/// made read-only and remembered, so the sweep leaves them alone. Fixed
/// names are looked up with lstat; only `worktrees/` and `modules/` are
/// listed. An unreadable one is an error (the run must not start blind).
/// Each entry: (path relative to `root`, kind, whether it is an executable
/// part to keep read-only rather than a git dir or a directory on the way).
pub fn git_parts(root: &Path, rel: &Path) -> io::Result<Vec<GitPart>> {
    let root_fd = open_root(root)?;
    let mut out = Vec::new();
    collect_gitdir(&root_fd, rel, &mut out, 0)?;
    Ok(out)
}

fn open_rel(root: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    sys::openat_beneath(root.as_raw_fd(), rel, libc::O_PATH | libc::O_DIRECTORY)
}

/// One entry found by [`git_parts`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GitPart {
    pub rel: PathBuf,
    pub kind: Kind,
    /// An executable part (hooks, config, commondir…), not a directory
    /// git writes to (a git dir, `worktrees/NAME`, `modules/…`).
    pub protected: bool,
}

fn part(rel: PathBuf, st: &FileStat, protected: bool) -> GitPart {
    GitPart {
        rel,
        kind: kind_of(st),
        protected,
    }
}

fn collect_gitdir(
    root: &OwnedFd,
    rel: &Path,
    out: &mut Vec<GitPart>,
    depth: usize,
) -> io::Result<()> {
    if depth > MAX_GIT_DEPTH {
        return Err(io::Error::other(format!(
            "{}: git dirs nested too deeply",
            rel.display()
        )));
    }
    let gd = if rel.as_os_str().is_empty() {
        // The root itself is a (bare) git dir.
        out.push(part(PathBuf::new(), &nix::sys::stat::fstat(root)?, false));
        root.try_clone()?
    } else {
        let parent = match rel.parent() {
            Some(p) if !p.as_os_str().is_empty() => open_rel(root, p)?,
            _ => root.try_clone()?,
        };
        let Some(name) = rel.file_name() else {
            return Ok(());
        };
        let Some(st) = lstat_at(&parent, name)? else {
            return Ok(());
        };
        out.push(part(rel.to_path_buf(), &st, false));
        if kind_of(&st) != Kind::Dir {
            return Ok(());
        }
        open_dir(&parent, name)?
    };
    for p in WRITE_PROTECTED_GIT_PATHS {
        if let Some(st) = lstat_at(&gd, OsStr::new(p))? {
            out.push(part(rel.join(p), &st, true));
        }
    }
    if let Some(st) = lstat_at(&gd, OsStr::new("worktrees"))? {
        out.push(part(rel.join("worktrees"), &st, false));
        if kind_of(&st) == Kind::Dir {
            let w = open_dir(&gd, OsStr::new("worktrees"))?;
            for n in list_fd(&w)? {
                let Some(st) = lstat_at(&w, &n)? else {
                    continue;
                };
                let trel = rel.join("worktrees").join(&n);
                out.push(part(trel.clone(), &st, false));
                if kind_of(&st) == Kind::Dir {
                    let t = open_dir(&w, &n)?;
                    for p in WRITE_PROTECTED_GIT_WORKTREE_PATHS {
                        if let Some(st) = lstat_at(&t, OsStr::new(p))? {
                            out.push(part(trel.join(p), &st, true));
                        }
                    }
                }
            }
        }
    }
    if let Some(st) = lstat_at(&gd, OsStr::new("modules"))? {
        out.push(part(rel.join("modules"), &st, false));
        if kind_of(&st) == Kind::Dir {
            collect_modules(root, &rel.join("modules"), out, depth + 1)?;
        }
    }
    Ok(())
}

fn collect_modules(
    root: &OwnedFd,
    rel: &Path,
    out: &mut Vec<GitPart>,
    depth: usize,
) -> io::Result<()> {
    if depth > MAX_GIT_DEPTH {
        return Err(io::Error::other(format!(
            "{}: submodules nested too deeply",
            rel.display()
        )));
    }
    let dir = open_rel(root, rel)?;
    for n in list_fd(&dir)? {
        let Some(st) = lstat_at(&dir, &n)? else {
            continue;
        };
        let erel = rel.join(&n);
        if kind_of(&st) != Kind::Dir {
            out.push(part(erel, &st, false));
            continue;
        }
        let e = open_dir(&dir, &n)?;
        let is_gitdir = lstat_at(&e, OsStr::new("HEAD"))?.is_some()
            || lstat_at(&e, OsStr::new("config"))?.is_some();
        if is_gitdir {
            collect_gitdir(root, &erel, out, depth + 1)?;
        } else {
            out.push(part(erel.clone(), &st, false));
            collect_modules(root, &erel, out, depth + 1)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("moat-sweep-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.canonicalize().unwrap()
    }

    #[test]
    fn what_cannot_be_removed_is_a_failure_never_a_success() {
        // procfs entries can be neither renamed nor unlinked: the sweep must
        // say so rather than report them done.
        let proc = PathBuf::from(format!("/proc/{}", std::process::id()));
        let root = SweepRoot {
            root: proc.clone(),
            missing: vec![PathBuf::from("status")],
            ..Default::default()
        };
        let r = sweep(&[root], "t");
        assert!(r.swept.is_empty(), "{r:?}");
        assert_eq!(r.failed.len(), 1, "{r:?}");
        assert_eq!(r.failed[0].path, proc.join("status"), "{r:?}");
        assert!(r.failed[0].error.contains("still present"), "{r:?}");
    }

    #[test]
    fn a_symlink_on_the_way_is_neutralised_not_followed() {
        let ws = tmp("ws");
        let outside = tmp("outside");
        std::fs::create_dir_all(outside.join("git")).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join(".config")).unwrap();
        let root = SweepRoot {
            root: ws.clone(),
            missing: vec![PathBuf::from(".config/git")],
            ..Default::default()
        };
        let r = sweep(&[root], "t");
        assert!(r.failed.is_empty(), "{r:?}");
        assert!(outside.join("git").is_dir(), "followed the symlink");
        assert!(std::fs::symlink_metadata(ws.join(".config")).is_err());
        assert!(ws
            .join(".config.moat-quarantine-t")
            .symlink_metadata()
            .is_ok());
        let _ = std::fs::remove_dir_all(&ws);
        let _ = std::fs::remove_dir_all(&outside);
    }

    #[test]
    fn a_user_git_dir_that_existed_is_left_alone() {
        let ws = tmp("existing");
        std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        std::fs::write(ws.join(".git/hooks/pre-commit"), "USER HOOK").unwrap();
        std::fs::write(ws.join(".git/config"), "[core]\n\tpager = less\n").unwrap();
        let mut root = SweepRoot {
            root: ws.clone(),
            gitdirs: vec![PathBuf::from(".git")],
            ..Default::default()
        };
        for p in git_parts(&ws, Path::new(".git")).unwrap() {
            root.git_existing.insert(p.rel);
        }
        let r = sweep(&[root], "t");
        assert_eq!(r, SweepReport::default());
        assert!(ws.join(".git/hooks/pre-commit").exists());
        assert_eq!(
            std::fs::read_to_string(ws.join(".git/config")).unwrap(),
            "[core]\n\tpager = less\n"
        );
        let _ = std::fs::remove_dir_all(&ws);
    }

    #[test]
    fn a_users_symlinked_hooks_dir_counts_only_while_unchanged() {
        let ws = tmp("links");
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        std::fs::create_dir_all(ws.join("shared-hooks")).unwrap();
        std::os::unix::fs::symlink("../shared-hooks", ws.join(".git/hooks")).unwrap();
        let mut root = SweepRoot {
            root: ws.clone(),
            gitdirs: vec![PathBuf::from(".git")],
            ..Default::default()
        };
        for p in git_parts(&ws, Path::new(".git")).unwrap() {
            if p.kind == Kind::Symlink {
                let t = std::fs::read_link(ws.join(&p.rel)).unwrap();
                root.git_links.insert(p.rel, t);
            } else {
                root.git_existing.insert(p.rel);
            }
        }
        // Unchanged: left alone.
        assert_eq!(
            sweep(std::slice::from_ref(&root), "a"),
            SweepReport::default()
        );
        // Replaced by a real directory holding a hook: the hook goes.
        std::fs::remove_file(ws.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        std::fs::write(ws.join(".git/hooks/pre-commit"), "evil").unwrap();
        let r = sweep(&[root], "b");
        assert!(r.failed.is_empty(), "{r:?}");
        assert!(!ws.join(".git/hooks/pre-commit").exists(), "{r:?}");
        let _ = std::fs::remove_dir_all(&ws);
    }
}
