//! Reads the host facts a plan depends on (what exists where, which kernel
//! features are present). This is the only I/O before planning; the plan
//! itself is a pure function of (Policy, HostFacts). Its one write: the
//! empty `hooks` directory an existing git dir lacks (see
//! `sweep::ensure_hooks_dir`), so a read-only mount can cover it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use moat_policy::{Access, Level, Policy, PROTECTED_HOME_PATHS, WRITE_PROTECTED_WORKSPACE_NAMES};
use serde::Serialize;

use crate::sweep::{PrefixGuard, SweepRoot};
use crate::sys;
use crate::timing::mark;

mod dents;
mod secrets_cache;
pub use secrets_cache::enable as cache_secrets_probe;

/// Whether `path` is refused this process for `mode` (EACCES), by the
/// kernel's own permission checks on its effective ids.
fn refused(path: &Path, mode: nix::unistd::AccessFlags) -> bool {
    matches!(
        nix::unistd::faccessat(
            nix::fcntl::AT_FDCWD,
            path,
            mode,
            nix::fcntl::AtFlags::AT_EACCESS
        ),
        Err(nix::errno::Errno::EACCES)
    )
}

/// Whether `path` belongs to someone else than this process's effective
/// uid (its owner could chmod it back), or cannot even be looked at.
fn not_own(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match fs::symlink_metadata(path) {
        Ok(m) => m.uid() != nix::unistd::geteuid().as_raw(),
        Err(e) => e.kind() == std::io::ErrorKind::PermissionDenied,
    }
}

/// Whether `path` cannot be looked at because a directory on the way that
/// is the caller's own refuses the search (mode 000): the caller, or a
/// command where the view has that directory writable, can chmod it back.
fn behind_own_directory(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match fs::symlink_metadata(path) {
        // The deepest ancestor that can be looked at (followed, as the
        // path's resolution does) is the directory refusing the search.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => path
            .ancestors()
            .skip(1)
            .find_map(|a| fs::metadata(a).ok())
            .is_some_and(|m| m.uid() == nix::unistd::geteuid().as_raw()),
        _ => false,
    }
}

/// Whether the kernel itself keeps the secret at `path` from this
/// (unprivileged) process: reading it is refused (a directory: both
/// listing and entering it), and it is not the caller's own nor behind a
/// directory of the caller's that refuses the search (a symlink: neither
/// is where it leads). The sandbox
/// has no more rights over host files than its caller, so it needs no
/// stand-in for it (`/etc/shadow` 0640 root:shadow, another user's 0600
/// `.netrc`).
pub fn kernel_keeps_from_user(path: &Path, kind: Kind) -> bool {
    use nix::unistd::AccessFlags as A;
    let kept = match kind {
        Kind::Dir => refused(path, A::R_OK) && refused(path, A::X_OK),
        _ => refused(path, A::R_OK),
    };
    if !(kept && not_own(path) && !behind_own_directory(path)) {
        return false;
    }
    // A symlink (another user's) is read where it leads: the caller can
    // chmod back a file or directory of its own there, whoever owns the
    // link. One that cannot be resolved keeps its stand-in.
    if lstat_kind(path) != Some(Kind::Symlink) {
        return true;
    }
    match follow_links(path) {
        Some((end, _)) => not_own(&end) && !behind_own_directory(&end),
        None => false,
    }
}

/// Whether the kernel itself refuses this process every use of `path`
/// (read, write and execute/search all EACCES) and it is not the caller's
/// own: a refusal of it is the host's permissions, not moat's, and is not
/// explained as moat's.
pub fn kernel_refuses_user(path: &Path) -> bool {
    use nix::unistd::AccessFlags as A;
    refused(path, A::R_OK) && refused(path, A::W_OK) && refused(path, A::X_OK) && not_own(path)
}

/// What kind of filesystem object a path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

/// One entry of the host's `/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootEntry {
    pub name: String,
    pub kind: Kind,
    /// Where a symlink points (as written).
    pub link: Option<PathBuf>,
}

/// Everything the planner needs to know about this host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostFacts {
    pub uid: u32,
    pub gid: u32,
    pub landlock_abi: i32,
    pub root_entries: Vec<RootEntry>,
    /// `/var/run` is a real directory rather than a symlink to /run.
    pub var_run_is_dir: bool,
    /// Existing secret paths (canonical) with their kind: protected home
    /// paths of every home on the host, and /etc secrets.
    pub secrets: BTreeMap<PathBuf, Kind>,
    /// Protected home paths of the invoking user, by their un-resolved path,
    /// mapped to the canonical existing target (for opt-in matching).
    pub home_protected: BTreeMap<PathBuf, PathBuf>,
    /// Host unix socket locations to hide: $SSH_AUTH_SOCK, $XDG_RUNTIME_DIR.
    pub sockets: BTreeMap<PathBuf, Kind>,
    /// Workspace entries that matter: protected names found by a complete
    /// walk, and write-protected paths (looked up by name), with their kind.
    pub workspace_protected: BTreeMap<PathBuf, Kind>,
    pub workspace_write_protected: BTreeMap<PathBuf, Kind>,
    /// The `.git` entries below the workspace root the walk found
    /// (vendored checkouts), bare git dirs, and at workspace-contained the
    /// same for each directory grant (with the grant's own `.git`): their
    /// configs are redacted like the root's.
    pub workspace_nested_git: Vec<PathBuf>,
    /// Every symlink the complete walks saw (workspace, walked grants),
    /// with its target as written and its identity (inode and ctime: an
    /// inode number is reused at once on ext4): the sweep removes only
    /// new links that lead to a secret (one made again with the same
    /// target is new: a concurrent run's command may have made the first).
    pub workspace_links: BTreeMap<PathBuf, (PathBuf, crate::sweep::LinkId)>,
    /// What the post-run sweep checks, per writable root, with the state
    /// before the run (missing write-protected paths, `.moat*` names
    /// present, git dirs and their executable parts).
    pub sweep: Vec<SweepRoot>,
    /// The same as absolute paths: what the sweep watches that did not
    /// exist before the run (the view's `swept`; the sweep itself works
    /// from `sweep`, relative to each root's directory fd).
    pub workspace_missing: Vec<PathBuf>,
    /// Why the workspace could not be probed completely (a directory that
    /// cannot be listed): the run must not happen (exit 125).
    pub incomplete: Option<String>,
    /// `/etc/resolv.conf`'s canonical target when it lives under /run.
    pub resolv_conf_in_run: Option<PathBuf>,
    /// /proc entries (host view) that exist, for read-only remounts/masks.
    pub proc_entries: Vec<String>,
    /// Kinds of the policy's extra paths.
    pub grant_kinds: BTreeMap<PathBuf, Kind>,
    /// Host environment, as given to moat.
    pub env: Vec<(String, String)>,
    /// moat's own state (audit log, trust store): hidden behind empty
    /// stand-ins wherever the view would show them, at every level.
    pub moat_hidden: BTreeMap<PathBuf, Kind>,
    /// moat's configuration (profiles, config): read-only wherever a
    /// writable part of the view contains it.
    pub moat_readonly: Vec<PathBuf>,
    /// The user's tool configuration files, redacted (relative to HOME,
    /// contents): copied under the sandbox HOME. Filled in by the caller.
    pub home_config_copies: Vec<(PathBuf, String)>,
    /// Host files shown as moat's redacted copy instead of an empty
    /// stand-in (the workspace's git configs with credentials in them), by
    /// host path; each is also in `secrets`. Filled in by the caller.
    pub redacted_files: BTreeMap<PathBuf, String>,
    /// moat's config/state directories that do not exist and could not be
    /// created (the plan refuses if the command could create them).
    pub moat_missing: Vec<PathBuf>,
    /// moat's own binary (canonical), probed in proxy mode.
    pub moat_exe: Option<PathBuf>,
    /// Toolchain installs under the invoking user's home (rustup, pyenv…),
    /// probed at the levels that read the whole host: (home-relative entry,
    /// canonical host path, kind). The plan mirrors them under the sandbox HOME.
    pub home_toolchains: Vec<(PathBuf, PathBuf, Kind)>,
    /// moat itself already runs under a seccomp filter (probed only when
    /// Landlock looks absent, to explain why: a nested sandbox).
    pub under_seccomp: bool,
    /// User namespaces can be created here (probed only when the policy's
    /// backend is not `namespaces`).
    pub userns: bool,
}

/// /etc files no sandboxed command needs and that hold secrets.
const ETC_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/security/opasswd",
    "/etc/ssl/private",
    "/etc/krb5.keytab",
    // Root-only keys a server or a dev box running its agent as root has
    // (an unprivileged caller's kernel already refuses them): VPN and
    // Wi-Fi keys, TLS private keys, cluster-admin kubeconfigs (every
    // kubeconfig in /etc/kubernetes holds a client key), runner tokens.
    "/etc/wireguard",
    "/etc/NetworkManager/system-connections",
    "/etc/ipsec.secrets",
    "/etc/letsencrypt",
    "/etc/kubernetes",
    "/etc/rancher",
    "/etc/gitlab-runner",
    "/etc/nix/netrc",
];

/// /proc entries made read-only or masked in the sandbox.
pub const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];
pub const PROC_MASKED: &[&str] = &["kcore", "keys", "timer_list", "sched_debug", "kallsyms"];

/// Directory names never walked when looking for `.env` files: a git dir
/// (git's own objects and refs, never a user's `.env`) and `node_modules`
/// (installed packages: a `.env` there is a package's, not the user's, and
/// a command cannot move a hidden `.env` into one: the directory holding it
/// is pinned during the run). Build outputs (`dist`, `build`, `target`) are
/// walked: build tools copy `.env` files into them.
pub const WALK_SKIP: &[&str] = &[".git", "node_modules"];

/// lstat(2) in one syscall (std's statx path costs two for a missing file).
fn lstat_kind(p: &Path) -> Option<Kind> {
    let st = nix::sys::stat::lstat(p).ok()?;
    Some(match st.st_mode & libc::S_IFMT {
        libc::S_IFLNK => Kind::Symlink,
        libc::S_IFDIR => Kind::Dir,
        _ => Kind::File,
    })
}

/// The entries of `/`, sorted by name (an entry that cannot be read is
/// left out). The probe's listing, and the early init's own, taken in its
/// copy of the host's mounts before its plan comes (`init::early_main`):
/// one function, so both list alike.
pub(crate) fn list_root() -> Vec<RootEntry> {
    let mut entries = Vec::new();
    if let Ok(rd) = fs::read_dir("/") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // readdir's d_type: no lstat per entry (std falls back to
            // one where the filesystem gives no type).
            let Ok(ft) = e.file_type() else {
                continue;
            };
            let kind = dirent_kind(&ft);
            let link = if kind == Kind::Symlink {
                fs::read_link(e.path()).ok()
            } else {
                None
            };
            entries.push(RootEntry { name, kind, link });
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

/// Which of `/proc`'s read-only and masked entries exist, read-only ones
/// first. The probe's, and the early init's before its plan comes (as
/// [`list_root`]).
pub(crate) fn list_proc() -> Vec<String> {
    PROC_READ_ONLY
        .iter()
        .chain(PROC_MASKED)
        .filter(|n| Path::new("/proc").join(n).exists())
        .map(|n| n.to_string())
        .collect()
}

pub(crate) fn dirent_kind(ft: &fs::FileType) -> Kind {
    if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_dir() {
        Kind::Dir
    } else {
        Kind::File
    }
}

/// Every home directory named in /etc/passwd, with the uid it belongs to
/// (no NSS: moat links statically; accounts only a directory service
/// knows are found through /home).
fn passwd_homes() -> Vec<(u32, PathBuf)> {
    let Ok(text) = fs::read_to_string("/etc/passwd") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let uid = f.get(2)?.parse::<u32>().ok()?;
            let home = Path::new(f.get(5)?);
            (f.len() >= 7 && home.is_absolute()).then(|| (uid, home.to_path_buf()))
        })
        .collect()
}

/// The homes on this host whose protected paths moat hides or
/// write-protects, among those `shown` accepts (at `workspace-contained`
/// only what may be visible, so the launch path stays short): the policy's
/// HOME, the caller's passwd home (canonical: $HOME can be set to anything
/// by whoever launched moat), every passwd entry's home that is a real
/// directory (`/root`, `/var/lib/postgresql`, service accounts…), and
/// every directory in /home (accounts from a directory service). Sorted,
/// deduplicated. `passwd` is [`passwd_homes`], read once per probe.
fn host_homes(
    passwd: &[(u32, PathBuf)],
    uid: u32,
    policy_home: &Path,
    shown: impl Fn(&Path) -> bool,
) -> Vec<PathBuf> {
    let mut homes = vec![policy_home.to_path_buf()];
    for (owner, home) in passwd {
        let (owner, home) = (*owner, home.clone());
        if !shown(&home) {
            continue;
        }
        if owner == uid {
            if let Ok(c) = fs::canonicalize(&home) {
                homes.push(c);
            }
        }
        if lstat_kind(&home) == Some(Kind::Dir) {
            homes.push(home);
        }
    }
    if shown(Path::new("/home")) {
        if let Ok(rd) = fs::read_dir("/home") {
            homes.extend(
                rd.flatten()
                    .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                    .map(|e| e.path()),
            );
        }
    }
    homes.retain(|h| shown(h));
    homes.sort();
    homes.dedup();
    homes
}

/// Whether this process already runs under a seccomp filter.
pub fn under_seccomp() -> bool {
    fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Seccomp:") && l.trim_end().ends_with('2'))
        })
        .unwrap_or(false)
}

/// Whether host path `p` (or something beneath it) can appear in the view of
/// `policy`: everything at the whole-host levels; at workspace-contained only
/// the system runtime, the workspace and the extra paths. Probing only these
/// keeps the launch path short.
fn may_be_visible(policy: &Policy, p: &Path) -> bool {
    if policy.level != Level::WorkspaceContained {
        return true;
    }
    let roots = [Path::new("/etc"), Path::new("/usr")];
    let overlaps = |r: &Path| p.starts_with(r) || r.starts_with(p);
    roots.iter().any(|r| overlaps(r))
        || overlaps(&policy.workspace)
        || policy.paths.iter().any(|g| overlaps(&g.path))
}

/// Canonical path and kind of an existing path (following symlinks).
/// One lstat first: most candidates do not exist, and realpath is costly.
fn resolve(p: &Path) -> Option<(PathBuf, Kind)> {
    Resolver::default().resolve(p)
}

/// [`resolve`] for many paths, most sharing a few parents (a home, `/etc`,
/// `/etc/ssh`): whether a parent is canonical is asked once per parent
/// (realpath is a `readlink` per component) within one probe.
#[derive(Default)]
struct Resolver {
    /// Parent → whether it is its own canonical path.
    parents: Vec<(PathBuf, bool)>,
}

impl Resolver {
    fn resolve(&mut self, p: &Path) -> Option<(PathBuf, Kind)> {
        match lstat_kind(p)? {
            Kind::Symlink => {
                let c = fs::canonicalize(p).ok()?;
                let k = lstat_kind(&c)?;
                Some((c, k))
            }
            // Parents are canonical already (home, /etc) unless one of them is a
            // symlink, which realpath then resolves.
            k => {
                let parent = p.parent()?;
                let canonical = match self.parents.iter().find(|(d, _)| d == parent) {
                    Some((_, c)) => *c,
                    None => {
                        let c = fs::canonicalize(parent).is_ok_and(|c| c == parent);
                        self.parents.push((parent.to_path_buf(), c));
                        c
                    }
                };
                if canonical {
                    Some((p.to_path_buf(), k))
                } else {
                    Some((fs::canonicalize(p).ok()?, k))
                }
            }
        }
    }
}

/// The identity of the symlink at `p` ([`crate::sweep::LinkId`]), None
/// when it cannot be looked at (the sweep then takes it for replaced).
fn link_id(p: &Path) -> Option<crate::sweep::LinkId> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::symlink_metadata(p).ok()?;
    Some((m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Why [`follow_links`] gave no answer, for a refusal.
const UNRESOLVABLE: &str =
    "its chain of symlinks cannot be resolved (a loop, more than 40 links, or more than 4096 components)";

/// Where opening `p` (absolute) leads on the host, resolved the way the
/// kernel resolves it: every symlink on the way followed — a dangling one
/// to the path it would create —, `..` taken after each link's target.
/// Returns the path reached (no symlink in the part of it that exists) and
/// each symlink passed, at its own resolved location, with its target as
/// written. `None`: not absolute, a loop (more than 40 links, the
/// kernel's limit), or more than 4096 components looked at in all (links
/// whose targets are thousands of components long would make each one
/// cost thousands of lstats). Only lstat and readlink: nothing is opened.
pub(crate) fn follow_links(p: &Path) -> Option<(PathBuf, Vec<(PathBuf, PathBuf)>)> {
    follow_links_seen(p, &mut LinkSteps::new())
}

/// What [`follow_links_seen`] found at each path it looked at (`None`
/// missing, `Some(None)` there and not a symlink, `Some(Some(t))` a
/// symlink to `t`), and optionally one directory's listing, which answers
/// for the names in it without an lstat each (a symlink is still looked
/// at, for its target).
#[derive(Default)]
pub(crate) struct LinkSteps {
    seen: std::collections::HashMap<PathBuf, Option<Option<PathBuf>>>,
    /// A directory (as a symlink-free path) and each entry: is it a symlink.
    listed: Option<(PathBuf, std::collections::HashMap<std::ffi::OsString, bool>)>,
}

impl LinkSteps {
    pub(crate) fn new() -> LinkSteps {
        LinkSteps::default()
    }

    /// With `dir`'s listing (one `getdents` pass instead of an lstat per
    /// name looked up in it; d_type, or an lstat where the filesystem
    /// gives none). A directory that cannot be listed is looked at name by
    /// name, as without.
    pub(crate) fn listing(dir: &Path) -> LinkSteps {
        let listed = fs::read_dir(dir).ok().and_then(|rd| {
            rd.map(|e| {
                let e = e.ok()?;
                Some((e.file_name(), e.file_type().ok()?.is_symlink()))
            })
            .collect::<Option<std::collections::HashMap<_, _>>>()
        });
        LinkSteps {
            seen: Default::default(),
            listed: listed.map(|l| (dir.to_path_buf(), l)),
        }
    }
}

/// [`follow_links`], each path looked at once for all the calls sharing
/// `seen` (one walk of a list of names under the same HOME lstats `HOME`
/// once, not once per name: ≈ 120 lstats per service execution). The
/// answers are those of one look at each path, as a single call's are:
/// share `seen` only within one probe.
pub(crate) fn follow_links_seen(
    p: &Path,
    seen: &mut LinkSteps,
) -> Option<(PathBuf, Vec<(PathBuf, PathBuf)>)> {
    use std::collections::VecDeque;
    use std::ffi::OsString;
    use std::path::Component;
    fn comps(p: &Path) -> VecDeque<OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_os_string()),
                Component::ParentDir => Some(OsString::from("..")),
                _ => None,
            })
            .collect()
    }
    if !p.is_absolute() {
        return None;
    }
    let mut todo = comps(p);
    let mut done = PathBuf::from("/");
    let mut links = Vec::new();
    let mut missing = false;
    let mut steps = 0usize;
    while let Some(c) = todo.pop_front() {
        steps += 1;
        if steps > 4096 {
            return None;
        }
        if c == ".." {
            done.pop();
            continue;
        }
        let here = done.join(&c);
        if missing {
            done = here;
            continue;
        }
        let in_listing = match &seen.listed {
            Some((dir, names)) if *dir == done => Some(names.get(&c).copied()),
            _ => None,
        };
        let step = match (seen.seen.get(&here), in_listing) {
            (Some(step), _) => step.clone(),
            // Not in the directory's listing: missing.
            (None, Some(None)) => None,
            // Listed, not a symlink.
            (None, Some(Some(false))) => Some(None),
            _ => {
                let step = match fs::symlink_metadata(&here) {
                    Ok(m) if m.file_type().is_symlink() => Some(Some(fs::read_link(&here).ok()?)),
                    Ok(_) => Some(None),
                    Err(_) => None,
                };
                seen.seen.insert(here.clone(), step.clone());
                step
            }
        };
        match step {
            Some(Some(t)) => {
                if links.len() >= 40 {
                    return None;
                }
                if t.is_absolute() {
                    done = PathBuf::from("/");
                }
                let mut front = comps(&t);
                front.extend(todo.drain(..));
                todo = front;
                links.push((here, t));
            }
            Some(None) => done = here,
            None => {
                missing = true;
                done = here;
            }
        }
    }
    Some((done, links))
}

/// The files an hgrc's `[hooks]` and `[extensions]` make Mercurial run,
/// as written (relative ones are relative to the repository's root):
/// an extension's path (`ext = ./ext.py`, a package directory), a Python
/// hook's file (`python:hooks/check.py:fn`), a shell hook's program when
/// it is a path (`./hooks/x.sh`), each with `true` (protected even when
/// missing: creating it is planting the program); and the other words of
/// a shell hook that look like paths (`sh hooks/x.sh`), with `false`
/// (protected only when they exist: one may be an output file).
/// Continuation lines, `!`-disabled extensions, module names
/// (`python:mod.fn`, `ext =`) and `$VAR`s are not followed.
pub(crate) fn hg_named_programs(text: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut section = String::new();
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let l = line.trim_end();
        if let Some(rest) = l.strip_prefix('[') {
            if let Some(end) = rest.find(']') {
                section = rest[..end].trim().to_string();
            }
            continue;
        }
        if l.starts_with(['#', ';', '%']) {
            continue;
        }
        let Some((_, value)) = l.split_once('=') else {
            continue;
        };
        let value = value.trim();
        if value.is_empty() || value.contains('$') {
            continue;
        }
        match section.as_str() {
            "extensions" if !value.starts_with('!') => out.push((value.to_string(), true)),
            "hooks" => {
                if let Some(p) = value.strip_prefix("python:") {
                    // `python:PATH:FUNC`; `python:module.func` has one part.
                    if let Some((path, _)) = p.rsplit_once(':') {
                        out.push((path.to_string(), true));
                    }
                    continue;
                }
                for (i, w) in value.split_whitespace().enumerate() {
                    let w = w.trim_matches(['\'', '"']);
                    let script = [".sh", ".py", ".pl", ".rb", ".js"]
                        .iter()
                        .any(|x| w.ends_with(x));
                    if (w.contains('/') || (i > 0 && script)) && !w.starts_with('-') {
                        out.push((w.to_string(), i == 0));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// `p` with `.` and `..` taken lexically (Python's `os.path.normpath`,
/// which Mercurial applies to an `%include` path).
fn normalize_lexically(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// A small config file's text (at most 1 MiB, a regular file: opened
/// non-blocking, so a FIFO left in its place cannot hang the probe).
fn read_config_file(p: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.len() > 1 << 20 {
        return None;
    }
    let mut text = String::new();
    f.take(1 << 20).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Records `p` (missing, beneath `root`, no symlink in it) for the sweep by
/// its first missing component, only when every component before it is a
/// real directory (the sweep never follows a symlink).
fn sweep_first_missing(root: &Path, p: &Path, sr: &mut SweepRoot) {
    let Ok(rel) = p.strip_prefix(root) else {
        return;
    };
    let mut cur = PathBuf::new();
    for c in rel.components() {
        cur.push(c);
        match lstat_kind(&root.join(&cur)) {
            None => break,
            Some(Kind::Dir) => {}
            Some(_) => return,
        }
    }
    if !cur.as_os_str().is_empty() && !sr.missing.contains(&cur) {
        sr.missing.push(cur);
    }
}

/// The paths `dir/rel` (for each `rel` of `rels`, `/`-separated) that may
/// exist, found level by level: one listing of a directory answers for all
/// its names (the protected list holds ≈ 200 names, most homes a few of
/// them), a directory that cannot be listed is asked name by name with an
/// lstat. Never leaves out a path that exists; the caller resolves each one.
#[cfg(test)]
fn existing_names(dir: &Path, rels: &[&str]) -> Vec<PathBuf> {
    NameTree::of(rels).existing_in(dir)
}

/// Relative paths grouped by first component, in order of first
/// appearance: built once per probe and asked of every home (the
/// protected list's ≈ 200 names grouped per home cost ≈ 25 µs each). The
/// level below a name is grouped only where that name exists.
struct NameTree<'a> {
    /// Each first component: whether a path ends there, and the rests.
    groups: Vec<(&'a str, bool, Vec<&'a str>)>,
    /// The groups' names, sorted, with their index in `groups`.
    sorted: Vec<(&'a [u8], usize)>,
}

impl<'a> NameTree<'a> {
    fn of(rels: &[&'a str]) -> NameTree<'a> {
        let mut groups: Vec<(&'a str, bool, Vec<&'a str>)> = Vec::with_capacity(rels.len());
        let mut sorted: Vec<(&'a [u8], usize)> = Vec::with_capacity(rels.len());
        for rel in rels {
            let (first, rest) = rel.split_once('/').unwrap_or((rel, ""));
            let i = match sorted.binary_search_by(|(n, _)| (*n).cmp(first.as_bytes())) {
                Ok(at) => sorted[at].1,
                Err(at) => {
                    sorted.insert(at, (first.as_bytes(), groups.len()));
                    groups.push((first, false, Vec::new()));
                    groups.len() - 1
                }
            };
            if rest.is_empty() {
                groups[i].1 = true;
            } else {
                groups[i].2.push(rest);
            }
        }
        NameTree { groups, sorted }
    }

    /// The paths `dir/rel` of the tree that may exist. Never leaves out a
    /// path that exists; the caller resolves each one.
    fn existing_in(&self, dir: &Path) -> Vec<PathBuf> {
        // A listing is used only when every entry was read; a lookup of one
        // or two names is cheaper as lstats.
        let listed = if self.groups.len() > 2 {
            let mut seen = vec![false; self.groups.len()];
            dents::for_each_name(dir, |name| {
                if let Ok(at) = self.sorted.binary_search_by(|(n, _)| (*n).cmp(name)) {
                    seen[self.sorted[at].1] = true;
                }
            })
            .then_some(seen)
        } else {
            None
        };
        let mut out = Vec::new();
        for (i, (first, whole, deeper)) in self.groups.iter().enumerate() {
            let there = match &listed {
                Some(seen) => seen[i],
                None => lstat_kind(&dir.join(first)).is_some(),
            };
            if !there {
                continue;
            }
            let path = dir.join(first);
            if *whole {
                out.push(path.clone());
            }
            if !deeper.is_empty() {
                out.extend(NameTree::of(deeper).existing_in(&path));
            }
        }
        out
    }
}

/// The directories [`HostFacts::probe_secrets`] read names from (each
/// home's listing and the existing directories beneath it that the
/// protected list names, /etc's and /etc/ssh's, /home, each passwd home's
/// parent), and whether none of them is reached through a symlink (a
/// symlink's target directories are not among them: then nothing is
/// cached).
fn secrets_consulted(
    passwd: &[(u32, PathBuf)],
    uid: u32,
    homes: &[PathBuf],
    shown: impl Fn(&Path) -> bool,
) -> (Vec<PathBuf>, bool) {
    let mut cacheable = true;
    let mut dirs = vec![PathBuf::from("/home"), PathBuf::from("/etc/ssh")];
    dirs.extend(
        ETC_SECRETS
            .iter()
            .filter_map(|s| Path::new(s).parent())
            .map(Path::to_path_buf),
    );
    for (owner, home) in passwd.iter().filter(|(_, h)| shown(h)) {
        dirs.extend(home.parent().map(Path::to_path_buf));
        if *owner == uid {
            cacheable &= fs::canonicalize(home).map_or(true, |c| &c == home);
        }
    }
    let mut prefixes: Vec<&str> = PROTECTED_HOME_PATHS
        .iter()
        .flat_map(|rel| rel.match_indices('/').map(move |(i, _)| &rel[..i]))
        .collect();
    prefixes.sort_unstable();
    prefixes.dedup();
    for home in homes {
        dirs.push(home.clone());
        for prefix in &prefixes {
            // A prefix below a missing one is missing too: its parent's
            // signature covers its creation.
            let d = home.join(prefix);
            match lstat_kind(&d) {
                Some(Kind::Dir) => dirs.push(d),
                Some(Kind::Symlink) => cacheable = false,
                _ => {}
            }
        }
    }
    (dirs, cacheable)
}

impl HostFacts {
    /// Hides the audit log `file` from the command wherever the view would
    /// show it (a custom `--audit-log` may live anywhere).
    /// `file` is canonical (`AuditLog::resolved_path`: the log's open
    /// resolved it; walking it again cost a `readlink` per component).
    pub fn add_hidden_canonical_file(&mut self, file: &Path) {
        if !self.moat_hidden.keys().any(|h| file.starts_with(h)) {
            self.moat_hidden.insert(file.to_path_buf(), Kind::File);
        }
    }

    /// Probes the host for `policy`. `env` is moat's own environment.
    pub fn probe(policy: &Policy, env: Vec<(String, String)>) -> HostFacts {
        let mut f = HostFacts {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            env,
            ..Default::default()
        };
        for g in &policy.paths {
            if let Some(k) = lstat_kind(&g.path) {
                f.grant_kinds.insert(g.path.clone(), k);
            }
        }
        if !policy.level.is_sandboxed() {
            return f;
        }
        f.landlock_abi = sys::landlock_abi();
        f.moat_exe = std::env::current_exe()
            .ok()
            .and_then(|p| fs::canonicalize(p).ok());
        if f.landlock_abi < 1 {
            f.under_seccomp = under_seccomp();
        }
        f.userns = policy.backend == moat_policy::Backend::Namespaces
            || crate::backend::userns_available();
        mark("probe: kernel features, moat's path");
        f.probe_root();
        mark("probe: /");
        // Read once for both uses below (secrets of every home, homes
        // inside a writable root).
        let passwd = passwd_homes();
        f.probe_secrets(policy, &passwd);
        mark("probe: secrets (homes, /etc)");
        f.probe_sockets();
        // moat's own dirs are created first: the workspace probe then
        // records them as existing, so the sweep never takes them for
        // something the command created.
        f.probe_moat_dirs();
        mark("probe: sockets, moat's dirs");
        f.probe_workspace(policy, &passwd);
        f.probe_write_protected_in_grants(policy);
        mark("probe: workspace walk, grants");
        // What a symlink the command leaves must not lead to (the sweep
        // removes it): every protected path, the invoking user's missing
        // ones too (`~/.ssh` made later), moat's state and host sockets;
        // and the invoking user's write-protected files (`~/.bashrc`,
        // `~/.local/bin`): a host tool writing "a project file" through
        // the link would change them.
        // Only when a root will be walked after the run (the links are
        // looked at there).
        let mut secrets: Vec<PathBuf> = Vec::new();
        if f.sweep.iter().any(|r| r.find_new_gitdirs) {
            secrets.extend(
                f.secrets
                    .keys()
                    .chain(f.home_protected.keys())
                    .chain(f.moat_hidden.keys())
                    .chain(f.sockets.keys())
                    .cloned()
                    .chain(ETC_SECRETS.iter().map(PathBuf::from)),
            );
            if policy.home != Path::new("/") {
                secrets.extend(PROTECTED_HOME_PATHS.iter().map(|r| policy.home.join(r)));
                // A write-protected file that is itself a link (dotfiles:
                // `~/.bashrc -> dotfiles/bashrc`) is written where it leads.
                let write_protected = moat_policy::WRITE_PROTECTED_HOME_PATHS.iter().chain(
                    WRITE_PROTECTED_WORKSPACE_NAMES
                        .iter()
                        .filter(|n| !n.ends_with('*')),
                );
                for r in write_protected {
                    let p = policy.home.join(r);
                    if lstat_kind(&p) == Some(Kind::Symlink) {
                        if let Some((end, _)) = follow_links(&p) {
                            secrets.push(end);
                        }
                    }
                    secrets.push(p);
                }
            }
        }
        let links = std::sync::Arc::new(std::mem::take(&mut f.workspace_links));
        for sr in &mut f.sweep {
            sr.secrets.clone_from(&secrets);
            if sr.find_new_gitdirs {
                sr.links_before = Some(links.clone());
            }
        }
        f.workspace_missing = f
            .sweep
            .iter()
            .flat_map(|r| {
                let new_gitdirs = r
                    .gitdirs
                    .iter()
                    .filter(|g| !r.git_existing.contains(*g) && !r.git_links.contains_key(*g));
                r.missing
                    .iter()
                    .chain(new_gitdirs)
                    .map(|m| r.root.join(m))
                    .collect::<Vec<_>>()
            })
            .collect();
        if policy.level != Level::WorkspaceContained && policy.home != Path::new("/") {
            for rel in moat_policy::toolchain_entries() {
                if let Some((c, k)) = resolve(&policy.home.join(rel)) {
                    if matches!(k, Kind::Dir | Kind::File) {
                        f.home_toolchains.push((rel.into(), c, k));
                    }
                }
            }
        }
        if let Ok(target) = fs::canonicalize("/etc/resolv.conf") {
            if target.starts_with("/run")
                && lstat_kind(Path::new("/etc/resolv.conf")) == Some(Kind::Symlink)
            {
                f.resolv_conf_in_run = Some(target);
            }
        }
        f.proc_entries = list_proc();
        f
    }

    /// moat's config and state directories (XDG or under HOME), if present.
    fn probe_moat_dirs(&mut self) {
        let get = |k: &str| {
            self.env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| PathBuf::from(v))
                .filter(|p| p.is_absolute())
        };
        let home = get("HOME");
        let config = get("XDG_CONFIG_HOME").or_else(|| home.as_ref().map(|h| h.join(".config")));
        let state = get("XDG_STATE_HOME").or_else(|| home.as_ref().map(|h| h.join(".local/state")));
        // Both always exist before a run (created if missing, 0700): a
        // directory that does not exist cannot be bound read-only or hidden,
        // and a command that could create it could plant a config or trust
        // store the next run would obey.
        let ensure = |d: PathBuf| -> Result<PathBuf, PathBuf> {
            use std::os::unix::fs::DirBuilderExt;
            let _ = fs::DirBuilder::new().recursive(true).mode(0o700).create(&d);
            fs::canonicalize(&d).map_err(|_| d)
        };
        match config.map(|d| ensure(d.join("moat"))) {
            Some(Ok(c)) => self.moat_readonly.push(c),
            Some(Err(d)) => self.moat_missing.push(d),
            None => {}
        }
        match state.map(|d| ensure(d.join("moat"))) {
            Some(Ok(s)) => {
                self.moat_hidden.insert(s, Kind::Dir);
            }
            Some(Err(d)) => self.moat_missing.push(d),
            None => {}
        }
    }

    /// Lists `/` ([`list_root`]).
    fn probe_root(&mut self) {
        self.root_entries = list_root();
        self.var_run_is_dir = lstat_kind(Path::new("/var/run")) == Some(Kind::Dir);
    }

    fn probe_secrets(&mut self, policy: &Policy, passwd: &[(u32, PathBuf)]) {
        let caching = secrets_cache::enabled();
        let inputs = caching.then(|| secrets_cache::Inputs {
            policy: policy.clone(),
            uid: self.uid,
            passwd: passwd.to_vec(),
        });
        if let Some(answer) = inputs.as_ref().and_then(secrets_cache::lookup) {
            self.take_secrets(answer);
            return;
        }
        let started = std::time::SystemTime::now();
        let mut answer = secrets_cache::Answer::default();
        // A secret found through a symlink (its canonical path another).
        let mut via_symlink = false;
        let mut resolver = Resolver::default();
        // Every home on the host, whoever runs moat: as root they are all
        // readable, and an unprivileged caller may still read a home (and a
        // secret in it) that another user left group/world-readable.
        let shown = |p: &Path| may_be_visible(policy, p);
        let homes = host_homes(passwd, self.uid, &policy.home, shown);
        let protected = NameTree::of(PROTECTED_HOME_PATHS);
        for home in &homes {
            for p in protected.existing_in(home) {
                if let Some((c, k)) = resolver.resolve(&p) {
                    via_symlink |= c != p;
                    if home == &policy.home {
                        answer.home_protected.push((p.clone(), c.clone()));
                    }
                    answer.secrets.push((c, k));
                }
            }
        }
        for s in ETC_SECRETS {
            if let Some((c, k)) = resolver.resolve(Path::new(s)) {
                via_symlink |= c != Path::new(s);
                answer.secrets.push((c, k));
            }
        }
        // SSH host private keys: every /etc/ssh/ssh_host_*_key.
        if let Ok(rd) = fs::read_dir("/etc/ssh") {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("ssh_host_") && n.ends_with("_key") {
                    if let Some((c, k)) = resolver.resolve(&e.path()) {
                        via_symlink |= c != e.path();
                        answer.secrets.push((c, k));
                    }
                }
            }
        }
        if let Some(inputs) = inputs {
            let (consulted, cacheable) = secrets_consulted(passwd, self.uid, &homes, shown);
            let cacheable = cacheable && !via_symlink;
            secrets_cache::store(inputs, consulted, cacheable, &answer, started);
        }
        self.take_secrets(answer);
    }

    /// Takes the secrets found (or cached). For an unprivileged caller,
    /// one the kernel already keeps from it gets no stand-in (so nothing
    /// watches it either: a host `passwd` replacing /etc/shadow is no
    /// concern of the run). Asked on every run, after the cache:
    /// permissions change. Root keeps every stand-in (nothing refuses it).
    fn take_secrets(&mut self, answer: secrets_cache::Answer) {
        self.home_protected.extend(answer.home_protected);
        let root = nix::unistd::geteuid().is_root();
        self.secrets.extend(
            answer
                .secrets
                .into_iter()
                .filter(|(p, k)| root || !kernel_keeps_from_user(p, *k)),
        );
    }

    fn probe_sockets(&mut self) {
        let get = |k: &str| {
            self.env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| PathBuf::from(v))
        };
        let wanted: Vec<PathBuf> = [
            "SSH_AUTH_SOCK",
            "XDG_RUNTIME_DIR",
            "GPG_AGENT_INFO",
            "DBUS_SESSION_BUS_ADDRESS",
        ]
        .iter()
        .filter_map(|k| get(k))
        .map(|p| {
            // GPG_AGENT_INFO is path:pid:1, DBUS is unix:path=...
            let s = p.to_string_lossy().into_owned();
            let s = s.strip_prefix("unix:path=").unwrap_or(&s).to_string();
            PathBuf::from(s.split([':', ',']).next().unwrap_or("").to_string())
        })
        .filter(|p| p.is_absolute())
        .collect();
        for p in wanted {
            if let Some((c, k)) = resolve(&p) {
                self.sockets.insert(c, k);
            }
        }
        for p in [
            "/var/run/docker.sock",
            "/run/docker.sock",
            "/var/run/podman/podman.sock",
        ] {
            if let Some((c, k)) = resolve(Path::new(p)) {
                self.sockets.insert(c, k);
            }
        }
    }

    /// Write-protected and protected home paths strictly beneath a writable
    /// grant (`--rw ~/.config` must not let the command plant
    /// `~/.config/autostart/…` or `~/.config/gh/hosts.yml` for the host to
    /// use later): existing ones are read-only, missing ones swept (by their
    /// first missing component beneath the grant). A grant of the path
    /// itself, or inside it, opts it in.
    fn probe_write_protected_in_grants(&mut self, policy: &Policy) {
        use moat_policy::Access;
        let home = &policy.home;
        let mut seen = LinkSteps::new();
        for g in policy
            .paths
            .iter()
            .filter(|g| g.access == Access::ReadWrite)
        {
            // The full list at every level: a `--rw` grant is a writable
            // part even when the workspace is not.
            let rels = moat_policy::WRITE_PROTECTED_HOME_PATHS
                .iter()
                .map(|r| (*r, true))
                .chain(PROTECTED_HOME_PATHS.iter().map(|r| (*r, false)));
            for (rel, write_protected) in rels {
                // Through a symlinked component (`~/.local` -> `dotfiles/local`,
                // a dangling `~/.config/nvim -> dotfiles/nvim`) the command
                // writes where the link leads: protect that place, by a
                // path with no symlink in it (binds and the sweep never
                // follow one), and pin the links on the way in the grant.
                let Some((p, links)) = follow_links_seen(&home.join(rel), &mut seen) else {
                    self.cannot_protect(&home.join(rel), UNRESOLVABLE);
                    continue;
                };
                if p == g.path || !p.starts_with(&g.path) {
                    continue;
                }
                let i = self.sweep_root_index(&g.path);
                for (l, t) in links {
                    if let Ok(lrel) = l.strip_prefix(&g.path) {
                        if !lrel.as_os_str().is_empty() {
                            let id = link_id(&l);
                            self.sweep[i]
                                .pinned_links
                                .insert(lrel.to_path_buf(), (t, id));
                        }
                    }
                }
                match lstat_kind(&p) {
                    Some(k) if write_protected => {
                        self.workspace_write_protected.insert(p, k);
                    }
                    // An existing protected path is a secret: a stand-in.
                    Some(_) => {}
                    // The first missing component, swept from the grant's
                    // root.
                    None => sweep_first_missing(&g.path, &p, &mut self.sweep[i]),
                }
            }
        }
    }

    /// The index of `root`'s record in `self.sweep`, made when missing.
    fn sweep_root_index(&mut self, root: &Path) -> usize {
        match self.sweep.iter().position(|r| r.root == root) {
            Some(i) => i,
            None => {
                self.sweep.push(SweepRoot {
                    root: root.to_path_buf(),
                    ..Default::default()
                });
                self.sweep.len() - 1
            }
        }
    }

    /// Records the write-protected paths under `root`, a place the command
    /// may write (the workspace, a writable grant, a home inside one):
    /// existing ones become read-only binds; missing ones, new `.moat*`
    /// names and the executable parts of git dirs are checked by the sweep
    /// after the run. Fixed names are looked up with lstat, never by
    /// listing; only the `.moat*` prefix needs the root listed.
    /// `listing`, when given, is `root`'s entries, listed just before by
    /// the workspace walk: the names are looked up in it instead.
    fn write_protected_at(
        &mut self,
        root: &Path,
        is_home: bool,
        nested_git: Option<&[PathBuf]>,
        nested_vcs: &[PathBuf],
        listing: Option<&RootListing>,
    ) -> Result<(), String> {
        let mut sr = SweepRoot {
            root: root.to_path_buf(),
            ..Default::default()
        };
        let listed;
        let listing = match listing {
            Some(l) => l,
            None => {
                listed = list_dir(root)?;
                &listed
            }
        };
        for n in WRITE_PROTECTED_WORKSPACE_NAMES {
            if let Some(prefix) = n.strip_suffix('*') {
                let mut existing = Vec::new();
                for (name, kind) in listing {
                    let name = name.to_string_lossy().into_owned();
                    if name.starts_with(prefix) {
                        self.workspace_write_protected
                            .insert(root.join(&name), *kind);
                        existing.push(name);
                    }
                }
                sr.prefixes.push(PrefixGuard {
                    prefix: prefix.to_string(),
                    existing,
                });
                continue;
            }
            let kind = if n.contains('/') {
                lstat_kind(&root.join(n))
            } else {
                listing.get(std::ffi::OsStr::new(n)).copied()
            };
            match kind {
                Some(k) => {
                    self.workspace_write_protected.insert(root.join(n), k);
                    // A link (`.vscode -> shared/vscode`, a dangling
                    // `.envrc -> envs/dev`): the place the host's tool
                    // opens through it is protected, and the link pinned.
                    if k == Kind::Symlink {
                        self.protect_reached(root, &root.join(n), &mut sr, false);
                    }
                }
                None => sr.missing.push(PathBuf::from(n)),
            }
        }
        if is_home {
            // Missing protected paths (~/.ssh, ~/.aws…) are swept too: a
            // command must not plant ~/.ssh/authorized_keys or credentials
            // the host's tools would then use. Existing ones are stand-ins.
            let missing_protected = PROTECTED_HOME_PATHS
                .iter()
                .filter(|rel| lstat_kind(&root.join(rel)).is_none());
            for rel in moat_policy::WRITE_PROTECTED_HOME_PATHS
                .iter()
                .chain(missing_protected)
            {
                // Through a symlinked component (`~/.local` ->
                // `dotfiles/local`, a dangling `~/.vimrc -> dotfiles/vimrc`)
                // the command writes where the link leads: protect that
                // place, by a path with no symlink in it (binds and the
                // sweep never follow one), and pin the links on the way.
                // Missing: the first missing component is swept (creating
                // it is the first step towards the protected path).
                self.protect_reached(root, &root.join(rel), &mut sr, true);
            }
        }
        // The walk saw every git dir below this root before the run: new
        // ones can be told apart after it.
        sr.find_new_gitdirs = nested_git.is_some();
        let nested_git = nested_git.unwrap_or(&[]);
        let mut gitdirs = vec![PathBuf::from(".git")];
        gitdirs.extend(
            nested_git
                .iter()
                .filter_map(|g| g.strip_prefix(root).ok())
                .map(Path::to_path_buf),
        );
        // A root that is itself a git dir (`--rw ~/remote.git`, a bare
        // repository the host pushes to): its hooks and config too. The
        // workspace's walk found it already when it is the workspace.
        let root_is_git_dir =
            crate::sweep::looks_like_git_dir(|n| listing.get(std::ffi::OsStr::new(n)).copied());
        if root_is_git_dir && !gitdirs.iter().any(|g| g.as_os_str().is_empty()) {
            gitdirs.push(PathBuf::new());
        }
        for rel in gitdirs {
            // Best effort: without it the sweep still removes new hooks.
            let _ = crate::sweep::ensure_hooks_dir(root, &rel);
            let parts = crate::sweep::git_parts(root, &rel).map_err(|e| {
                format!(
                    "cannot read the git dir {}: {e}; moat must know its hooks and config before the run. Fix its permissions (chmod -R u+rwX '{}'), then run again",
                    root.join(&rel).display(),
                    root.join(&rel).display()
                )
            })?;
            for gp in &parts {
                if gp.kind == Kind::Symlink {
                    if let Ok(t) = fs::read_link(root.join(&gp.rel)) {
                        sr.git_links.insert(gp.rel.clone(), t);
                    }
                    // A `.git/config -> ../project.gitconfig`, a dangling
                    // `.git/hooks -> ../hooks`: git opens where it leads.
                    if gp.protected {
                        self.protect_reached(root, &root.join(&gp.rel), &mut sr, false);
                    }
                } else {
                    sr.git_existing.insert(gp.rel.clone());
                }
                if gp.protected && gp.rel.file_name() == Some(std::ffi::OsStr::new("hooks")) {
                    self.protect_hook_links(root, &root.join(&gp.rel), &mut sr);
                }
                // `.git` itself: a dir is bound read-write over itself (a
                // mount point cannot be renamed away with its protected
                // children); a gitfile or symlink stays as it is.
                let keep = gp.protected && gp.kind != Kind::Symlink || gp.rel == Path::new(".git");
                if keep {
                    self.workspace_write_protected
                        .insert(root.join(&gp.rel), gp.kind);
                }
            }
            self.protect_config_named_paths(root, &rel, &mut sr)?;
            sr.gitdirs.push(rel);
        }
        // Other VCSs' config (`.hg/hgrc`, `.jj/repo/config.toml`): in the
        // root's own admin dirs and in every one the walk found below it.
        let mut vcs_dirs: Vec<PathBuf> = Vec::new();
        let own = moat_policy::WRITE_PROTECTED_VCS_PATHS
            .iter()
            .filter_map(|p| p.split('/').next())
            .map(PathBuf::from);
        let found = nested_vcs
            .iter()
            .filter_map(|d| d.strip_prefix(root).ok())
            .map(Path::to_path_buf);
        for d in own.chain(found) {
            if !vcs_dirs.contains(&d) {
                vcs_dirs.push(d);
            }
        }
        for d in &vcs_dirs {
            self.protect_vcs_dir(root, d, &mut sr);
        }
        sr.vcs_dirs = vcs_dirs;
        self.sweep.push(sr);
        Ok(())
    }

    /// Write-protects what the host's tool reaches when it opens `p` (a
    /// path in `root` it loads code or config from): the end of the link
    /// chain ([`follow_links`]), read-only when it exists, swept when it is
    /// missing beneath `root`; and every symlink on the way inside `root`
    /// pinned (the sweep moves one the command retargeted or replaced
    /// aside). An end that is `root` itself or above it is left alone
    /// (only a read-only root could protect it), and so is one outside
    /// `root` unless `outside` (a home path's: read-only wherever the view
    /// shows it; a link elsewhere may lead to a secret, which has its
    /// stand-in).
    ///
    /// A chain that cannot be resolved (a loop, or past [`follow_links`]'s
    /// limits) or that passes a link inside `/proc` (`/proc/self/cwd`:
    /// where it leads moat says nothing of where it leads the host's tool)
    /// cannot be protected: the run is refused ([`Self::cannot_protect`]).
    /// The command could otherwise make it resolve (shorten a link of a
    /// loop inside `root`) or write where it leads the host's tool.
    fn protect_reached(&mut self, root: &Path, p: &Path, sr: &mut SweepRoot, outside: bool) {
        let Some((end, links)) = follow_links(p) else {
            self.cannot_protect(p, UNRESOLVABLE);
            return;
        };
        if let Some((at, _)) = links.iter().find(|(at, _)| at.starts_with("/proc")) {
            self.cannot_protect(
                p,
                &format!(
                    "its chain of symlinks passes through {} (a link in /proc leads each process to its own cwd, root or fds: where it leads the host's tool is not where it leads moat)",
                    at.display()
                ),
            );
            return;
        }
        for (l, t) in links {
            if let Ok(rel) = l.strip_prefix(root) {
                if !rel.as_os_str().is_empty() {
                    sr.pinned_links.insert(rel.to_path_buf(), (t, link_id(&l)));
                }
            }
        }
        if root.starts_with(&end) || !(outside || end.starts_with(root)) {
            return;
        }
        match lstat_kind(&end) {
            Some(k) => {
                self.workspace_write_protected.insert(end, k);
            }
            None => sweep_first_missing(root, &end, sr),
        }
    }

    /// Refuses the run (exit 125, [`HostFacts::incomplete`]): the
    /// write-protected path `p` leads somewhere moat cannot tell.
    fn cannot_protect(&mut self, p: &Path, why: &str) {
        if self.incomplete.is_none() {
            self.incomplete = Some(format!(
                "{} is write-protected (the host runs or loads it later) and {why}: moat cannot keep what it leads to read-only. Replace it with a link straight to its target (no loop, nothing in /proc), or remove it",
                p.display()
            ));
        }
    }

    /// The hooks a hooks directory (`.git/hooks`, a `core.hooksPath`)
    /// holds as symlinks, as hook managers install them (`pre-commit ->
    /// ../../scripts/pre-commit`): the host's git runs the file the link
    /// leads to, so that file is write-protected like the hook itself
    /// (read-only, swept when missing, the links on the way pinned). The
    /// directory is read-only during the run, so the set of links is the
    /// one seen here. Samples are skipped (git never runs them).
    fn protect_hook_links(&mut self, root: &Path, hooks: &Path, sr: &mut SweepRoot) {
        // Unresolvable: `protect_reached` on the hooks path itself has
        // refused the run already.
        let Some((dir, _)) = follow_links(hooks) else {
            return;
        };
        let Ok(rd) = fs::read_dir(&dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            if moat_policy::is_inert_hook_name(&name.to_string_lossy()) {
                continue;
            }
            if e.file_type().is_ok_and(|t| t.is_symlink()) {
                self.protect_reached(root, &dir.join(&name), sr, false);
            }
        }
    }

    /// The config parts ([`moat_policy::vcs_parts`]) of the VCS admin dir
    /// at `rel`: existing ones read-only (through any symlink, pinned),
    /// missing ones swept — only inside an admin dir that exists: a new one
    /// (`hg init`, `jj git init`) is kept, its parts are checked by the
    /// sweep. Mercurial's `%include`d files are protected like the `hgrc`
    /// that names them.
    fn protect_vcs_dir(&mut self, root: &Path, rel: &Path, sr: &mut SweepRoot) {
        let Some(name) = rel.file_name().and_then(|n| n.to_str()) else {
            return;
        };
        let dir = root.join(rel);
        match lstat_kind(&dir) {
            None => return,
            Some(Kind::File) => {
                sr.vcs_existing.insert(rel.to_path_buf());
                return;
            }
            Some(_) => {}
        }
        for part in moat_policy::vcs_parts(name) {
            let prel = rel.join(part);
            // A file on the way (a secondary jj workspace's `.jj/repo`
            // naming the repository jj reads its config from) is the
            // user's: kept, and read-only, so the command cannot point it
            // at a repository of its own.
            let mut cur = rel.to_path_buf();
            for c in Path::new(part).components() {
                cur.push(c);
                match lstat_kind(&root.join(&cur)) {
                    Some(Kind::Dir) => {}
                    Some(Kind::File) => {
                        sr.vcs_existing.insert(cur.clone());
                        self.workspace_write_protected
                            .insert(root.join(&cur), Kind::File);
                        break;
                    }
                    _ => break,
                }
            }
            let p = root.join(&prel);
            if matches!(lstat_kind(&p), Some(Kind::File | Kind::Dir)) {
                sr.vcs_existing.insert(prel.clone());
            }
            self.protect_reached(root, &p, sr, false);
            if name == ".hg" && matches!(part, "hgrc" | "hgrc-not-shared") {
                let repo = dir.parent().unwrap_or(root).to_path_buf();
                self.protect_hg_includes(root, &repo, &p, sr, 0);
            }
        }
    }

    /// Mercurial reads the files an `hgrc` names with `%include PATH`
    /// (relative to the including file's directory, `~` expanded) exactly
    /// like the `hgrc` itself, hooks included: each one is write-protected
    /// like it, and the files it includes in turn. So are the programs its
    /// `[hooks]` and `[extensions]` name in the repository `repo`
    /// ([`hg_named_programs`], relative to the repository's root, where hg
    /// runs hooks).
    fn protect_hg_includes(
        &mut self,
        root: &Path,
        repo: &Path,
        rc: &Path,
        sr: &mut SweepRoot,
        depth: usize,
    ) {
        if depth > 8 {
            return;
        }
        let Some(text) = read_config_file(rc) else {
            return;
        };
        let home = self
            .env
            .iter()
            .find(|(k, _)| k == "HOME")
            .map(|(_, v)| PathBuf::from(v));
        let expand = |path: &str, base: &Path| -> PathBuf {
            let expanded = match (path.strip_prefix("~/"), &home) {
                (Some(r), Some(h)) => h.join(r),
                _ => PathBuf::from(path),
            };
            normalize_lexically(&base.join(expanded))
        };
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("%include") else {
                continue;
            };
            if !rest.starts_with([' ', '\t']) {
                continue;
            }
            let inc = expand(rest.trim(), rc.parent().unwrap_or(root));
            self.protect_reached(root, &inc, sr, false);
            self.protect_hg_includes(root, repo, &inc, sr, depth + 1);
        }
        for (path, may_be_missing) in hg_named_programs(&text) {
            let p = expand(&path, repo);
            // A word of a shell hook that names nothing yet may be any
            // argument (an output file): only the program itself is
            // swept when missing.
            if may_be_missing || matches!(lstat_kind(&p), Some(Kind::File | Kind::Symlink)) {
                self.protect_reached(root, &p, sr, false);
            }
        }
    }

    /// What the git dir at `rel`'s config names inside `root` — its
    /// `core.hooksPath` (husky's `.husky/_`, a `.githooks` directory) and
    /// the files it includes (`[include] path = ../project.gitconfig`) —
    /// runs on the host later exactly like `.git/hooks` and `.git/config`,
    /// so it is write-protected like them: read-only when it exists, swept
    /// after the run when the command creates it. A hooks path that is
    /// `root` itself (or above it) cannot be protected without making the
    /// whole root read-only: the run is refused.
    fn protect_config_named_paths(
        &mut self,
        root: &Path,
        rel: &Path,
        sr: &mut SweepRoot,
    ) -> Result<(), String> {
        let git_dir = root.join(rel);
        if lstat_kind(&git_dir) != Some(Kind::Dir) {
            return Ok(());
        }
        let worktree = if rel.file_name() == Some(std::ffi::OsStr::new(".git")) {
            git_dir.parent().unwrap_or(root).to_path_buf()
        } else {
            git_dir.clone()
        };
        let named = crate::gitconfigs::named_paths(&git_dir, &worktree);
        let all = named
            .hooks
            .iter()
            .map(|p| (p, "core.hooksPath"))
            .chain(named.includes.iter().map(|p| (p, "include.path")));
        for (p, key) in all {
            // Where git opens it, through any symlink (a dangling one too).
            let Some((end, _)) = follow_links(p) else {
                self.cannot_protect(p, UNRESOLVABLE);
                continue;
            };
            if !end.starts_with(root) {
                continue;
            }
            if end == root {
                return Err(format!(
                    "the git config in {} sets {key} to {}, the root of a directory the command may write: moat cannot keep what git runs from there read-only without making all of it read-only. Point {key} at a subdirectory (git config {key} .githooks), or run at --policy read-only",
                    git_dir.display(),
                    end.display()
                ));
            }
            // Read-only when it exists, its first missing component swept
            // when not, and the links on the way pinned (one the command
            // retargets is moved aside after the run).
            self.protect_reached(root, p, sr, false);
            if key == "core.hooksPath" {
                self.protect_hook_links(root, p, sr);
            }
        }
        Ok(())
    }

    /// Every `.env`, `.env.*`, `.envrc` in the workspace, and every git dir
    /// below its root. Complete or an error: no depth or count budget (a
    /// command could exhaust one to unhide a `.env`), and a directory that
    /// cannot be listed stops the run unless the command could not enter
    /// it either. Uses only readdir's d_type: no stat per entry.
    /// Also returns the workspace root's own entries with their kind (from
    /// the same listing), so the write-protected names there are looked up
    /// without a second listing or an lstat each.
    /// And every other VCS admin dir (`.hg`, `.jj`) at any depth, the
    /// root's included.
    #[allow(clippy::type_complexity)]
    fn walk_workspace(
        &mut self,
        ws: &Path,
    ) -> Result<(Vec<PathBuf>, Vec<PathBuf>, Option<RootListing>), String> {
        use std::os::unix::ffi::OsStrExt;
        let mut nested_git = Vec::new();
        let mut nested_vcs = Vec::new();
        let mut root_listing = None;
        let mut stack = vec![ws.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if unenterable(&dir) => {
                    // Not ours and not searchable by us: the command (same
                    // uid, no capabilities) cannot open anything inside it
                    // nor change its mode.
                    let _ = e;
                    continue;
                }
                Err(e) => return Err(unlistable(&dir, &e)),
            };
            let mut listing = (dir == *ws).then(RootListing::new);
            let mut markers: Vec<(&str, Kind)> = Vec::new();
            for e in rd {
                let e = e.map_err(|e| unlistable(&dir, &e))?;
                let name = e.file_name();
                let nb = name.as_bytes();
                if let Some(m) = crate::sweep::GIT_DIR_MARKERS
                    .iter()
                    .find(|m| m.as_bytes() == nb)
                {
                    if let Ok(ft) = e.file_type() {
                        markers.push((m, dirent_kind(&ft)));
                    }
                }
                if let Some(l) = listing.as_mut() {
                    // d_type, or an lstat where the filesystem gives none.
                    if let Ok(ft) = e.file_type() {
                        l.insert(name.clone(), dirent_kind(&ft));
                    }
                }
                if nb == b".env" || nb == b".envrc" || nb.starts_with(b".env.") {
                    // Hide the resolved target: a `.env` symlink pointing out
                    // of the workspace is covered wherever it points.
                    match resolve(&e.path()) {
                        Some((c, k)) => {
                            self.workspace_protected.insert(c, k);
                        }
                        // Listed but not searchable (`chmod a-x`): the
                        // command could add the bit back and read it.
                        None if lstat_kind(&e.path()).is_none() && !unenterable(&dir) => {
                            return Err(unlistable(
                                &dir,
                                &std::io::Error::from_raw_os_error(libc::EACCES),
                            ));
                        }
                        // A dangling symlink: nothing to hide yet.
                        None => {}
                    }
                    continue;
                }
                let Ok(ft) = e.file_type() else { continue };
                if ft.is_symlink() {
                    if let (Ok(t), Ok(m)) = (fs::read_link(e.path()), e.metadata()) {
                        use std::os::unix::fs::MetadataExt;
                        let id = (m.ino(), m.ctime(), m.ctime_nsec());
                        self.workspace_links.insert(e.path(), (t, id));
                    }
                }
                if moat_policy::is_vcs_dir_name(&name.to_string_lossy()) {
                    nested_vcs.push(e.path());
                }
                if nb == b".git" {
                    if dir != ws {
                        nested_git.push(e.path());
                    }
                } else if ft.is_dir() && !WALK_SKIP.iter().any(|s| s.as_bytes() == nb) {
                    stack.push(e.path());
                }
            }
            // A directory git takes for a git dir itself (a bare
            // repository, the workspace root included): its hooks and
            // config are protected like a `.git`'s. Still walked below.
            if crate::sweep::looks_like_git_dir(|n| {
                markers.iter().find(|(m, _)| *m == n).map(|(_, k)| *k)
            }) {
                nested_git.push(dir.clone());
            }
            if listing.is_some() {
                root_listing = listing;
            }
        }
        Ok((nested_git, nested_vcs, root_listing))
    }

    fn probe_workspace(&mut self, policy: &Policy, passwd: &[(u32, PathBuf)]) {
        if let Err(e) = self.probe_workspace_complete(policy, passwd) {
            self.incomplete = Some(e);
        }
    }

    fn probe_workspace_complete(
        &mut self,
        policy: &Policy,
        passwd: &[(u32, PathBuf)],
    ) -> Result<(), String> {
        let ws = &policy.workspace;
        let (nested_git, nested_vcs, ws_listing) = self.walk_workspace(ws)?;
        self.workspace_nested_git.clone_from(&nested_git);
        // Directory grants outside the workspace get the workspace's
        // complete walk: `.env` files hidden, git configs redacted, and git
        // dirs below the grant's root recorded, so their hooks and config
        // are read-only and new ones are found after the run. At
        // workspace-contained every such grant (it is the only way the
        // command sees another project: `--ro ~/other`); at every level
        // each writable one (`--rw ~/projects` must not leave every
        // repository's `.git/hooks` below it writable, nor keep a `git
        // init sub` with a hook the command planted). Read-only grants at
        // the levels that read the whole host show nothing new to read.
        #[allow(clippy::type_complexity)]
        let mut grant_walks: BTreeMap<
            PathBuf,
            (Vec<PathBuf>, Vec<PathBuf>, Option<RootListing>),
        > = BTreeMap::new();
        for g in &policy.paths {
            let walked = policy.level == Level::WorkspaceContained || g.access == Access::ReadWrite;
            if !walked
                || g.path.starts_with(ws)
                || grant_walks.contains_key(&g.path)
                || lstat_kind(&g.path) != Some(Kind::Dir)
            {
                continue;
            }
            let (nested, vcs, listing) = self.walk_workspace(&g.path)?;
            self.workspace_nested_git.extend(nested.iter().cloned());
            // The grant's own checkout, read like the workspace's.
            self.workspace_nested_git.push(g.path.join(".git"));
            grant_walks.insert(g.path.clone(), (nested, vcs, listing));
        }
        // Roots the command may write: the workspace at the writable
        // levels, and every writable grant at any level (a grant, from the
        // command line or a project file, never reaches a write-protected
        // path: a project's `rw = ["."]` used from a subdirectory grants
        // the project root, whose `.git/hooks` stays read-only).
        let mut roots: Vec<PathBuf> = Vec::new();
        if matches!(
            policy.level,
            Level::WorkspaceWrite | Level::WorkspaceContained
        ) {
            roots.push(ws.clone());
        }
        for g in &policy.paths {
            if g.access == Access::ReadWrite
                && lstat_kind(&g.path) == Some(Kind::Dir)
                && !roots.contains(&g.path)
            {
                roots.push(g.path.clone());
            }
        }
        // Home directories inside a writable root get the home lists too
        // (a workspace of /home must not let the command write
        // /home/u/.bashrc). Homes come from the passwd database and /home.
        let homes = host_homes(passwd, self.uid, &policy.home, |h| {
            roots.iter().any(|r| h.starts_with(r))
        });
        let mut all: Vec<(PathBuf, bool)> = roots
            .iter()
            .map(|r| (r.clone(), homes.contains(r)))
            .collect();
        for h in homes {
            if !all.iter().any(|(r, _)| *r == h) {
                all.push((h, true));
            }
        }
        let ws_is_root = roots.contains(ws);
        for (root, is_home) in &all {
            // Which walk saw every git dir below this root before the run
            // (then the sweep looks for new ones after it): the
            // workspace's, a grant's own, or — for a root inside the
            // workspace that is not itself swept — the workspace's. A root
            // inside a swept workspace is covered by the workspace's sweep.
            let (nested, vcs, listing) = if root == ws {
                (
                    Some(nested_git.as_slice()),
                    nested_vcs.as_slice(),
                    ws_listing.as_ref(),
                )
            } else if let Some((n, v, l)) = grant_walks.get(root) {
                (Some(n.as_slice()), v.as_slice(), l.as_ref())
            } else if root.starts_with(ws) && !ws_is_root {
                (Some(nested_git.as_slice()), nested_vcs.as_slice(), None)
            } else {
                (None, &[][..], None)
            };
            self.write_protected_at(root, *is_home, nested, vcs, listing)?;
        }
        if !all.iter().any(|(r, _)| policy.home.starts_with(r)) {
            self.protect_home_links_into_roots(&policy.home);
            self.protect_home_config_includes(&policy.home);
        }
        Ok(())
    }

    /// The invoking user's global git and hg config may pull in a file that
    /// lies in a writable root (`[include] path = ~/dotfiles/git.local`,
    /// `%include ~/dotfiles/hgrc.local`, `core.hooksPath =
    /// ~/dotfiles/hooks`): what is written there runs in every repository
    /// on the host. Each such file (includes followed, 8 deep) is
    /// write-protected in its root like a path of the home itself.
    fn protect_home_config_includes(&mut self, home: &Path) {
        if home == Path::new("/") {
            return;
        }
        let expand = |v: &str, base: &Path| -> Option<PathBuf> {
            if let Some(r) = v.strip_prefix("~/") {
                Some(home.join(r))
            } else if v.starts_with('~') || v.contains('$') {
                None
            } else {
                Some(normalize_lexically(&base.join(v)))
            }
        };
        let mut named: Vec<PathBuf> = Vec::new();
        // git: includes relative to the including file; a relative global
        // hooksPath names a directory in every repository (not followed).
        let mut queue: Vec<(PathBuf, usize)> = [".gitconfig", ".config/git/config"]
            .iter()
            .map(|r| (home.join(r), 0))
            .collect();
        while let Some((file, depth)) = queue.pop() {
            let Some(text) = read_config_file(&file) else {
                continue;
            };
            let Ok(entries) = moat_policy::gitconfig::parse(&text) else {
                continue;
            };
            let base = file.parent().unwrap_or(home);
            for e in entries {
                let Some(v) = e.value.as_deref().filter(|v| !v.is_empty()) else {
                    continue;
                };
                let include = e.key == "path"
                    && ((e.section == "include" && e.subsection.is_none())
                        || e.section == "includeif");
                let hooks = e.section == "core" && e.subsection.is_none() && e.key == "hookspath";
                if include {
                    if let Some(p) = expand(v, base) {
                        if depth < 8 && !named.contains(&p) {
                            queue.push((p.clone(), depth + 1));
                        }
                        named.push(p);
                    }
                } else if hooks && (v.starts_with('/') || v.starts_with("~/")) {
                    if let Some(p) = expand(v, base) {
                        // Its hooks that are symlinks: git runs where
                        // they lead (a shared hooks directory linking
                        // into a dotfiles repository).
                        if let Some((dir, _)) = follow_links(&p) {
                            for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
                                let n = e.file_name();
                                if !moat_policy::is_inert_hook_name(&n.to_string_lossy())
                                    && e.file_type().is_ok_and(|t| t.is_symlink())
                                {
                                    named.push(dir.join(n));
                                }
                            }
                        }
                        named.push(p);
                    }
                }
            }
        }
        // hg: `%include PATH`, relative to the including file.
        let mut queue: Vec<(PathBuf, usize)> = [".hgrc", ".config/hg/hgrc"]
            .iter()
            .map(|r| (home.join(r), 0))
            .collect();
        while let Some((file, depth)) = queue.pop() {
            let Some(text) = read_config_file(&file) else {
                continue;
            };
            let base = file.parent().unwrap_or(home);
            for line in text.lines() {
                let Some(rest) = line.strip_prefix("%include") else {
                    continue;
                };
                if !rest.starts_with([' ', '\t']) {
                    continue;
                }
                if let Some(p) = expand(rest.trim(), base) {
                    if depth < 8 && !named.contains(&p) {
                        queue.push((p.clone(), depth + 1));
                    }
                    named.push(p);
                }
            }
            // Its hooks' and extensions' files named by an absolute or
            // `~` path (a relative one names a file in every repository,
            // like a relative global hooksPath: not followed).
            for (path, may_be_missing) in hg_named_programs(&text) {
                if !(path.starts_with('/') || path.starts_with("~/")) {
                    continue;
                }
                if let Some(p) = expand(&path, base) {
                    if may_be_missing || matches!(lstat_kind(&p), Some(Kind::File | Kind::Symlink))
                    {
                        named.push(p);
                    }
                }
            }
        }
        for p in named {
            let Some((end, _)) = follow_links(&p) else {
                self.cannot_protect(&p, UNRESOLVABLE);
                continue;
            };
            let Some(i) = self
                .sweep
                .iter()
                .position(|r| end.starts_with(&r.root) && end != r.root)
            else {
                continue;
            };
            let mut sr = std::mem::take(&mut self.sweep[i]);
            let root = sr.root.clone();
            self.protect_reached(&root, &p, &mut sr, false);
            self.sweep[i] = sr;
        }
    }

    /// The invoking user's home lies outside every writable root, so its
    /// startup files are read-only to the command — unless one is a
    /// symlink into a root (dotfiles kept in a repository: `~/.bashrc ->
    /// ~/dotfiles/bashrc`, the workspace `~/dotfiles`). The host's next
    /// shell opens what the link leads to, so that place is write-protected
    /// in its root like a path of the home itself (read-only, or swept when
    /// missing), and the links on the way inside the root are pinned.
    fn protect_home_links_into_roots(&mut self, home: &Path) {
        if home == Path::new("/") {
            return;
        }
        let rels = WRITE_PROTECTED_WORKSPACE_NAMES
            .iter()
            .filter(|n| !n.ends_with('*'))
            .chain(moat_policy::WRITE_PROTECTED_HOME_PATHS.iter());
        let mut seen = LinkSteps::listing(home);
        for rel in rels {
            let p = home.join(rel);
            let Some((end, links)) = follow_links_seen(&p, &mut seen) else {
                self.cannot_protect(&p, UNRESOLVABLE);
                continue;
            };
            if links.is_empty() {
                continue;
            }
            let Some(i) = self
                .sweep
                .iter()
                .position(|r| end.starts_with(&r.root) && end != r.root)
            else {
                continue;
            };
            let mut sr = std::mem::take(&mut self.sweep[i]);
            let root = sr.root.clone();
            self.protect_reached(&root, &p, &mut sr, false);
            self.sweep[i] = sr;
        }
    }
}

/// A directory's entries (names as listed) with their kind.
type RootListing = BTreeMap<std::ffi::OsString, Kind>;

/// Lists `dir` (every entry, with d_type's kind).
fn list_dir(dir: &Path) -> Result<RootListing, String> {
    let mut out = RootListing::new();
    for e in fs::read_dir(dir).map_err(|e| unlistable(dir, &e))? {
        let e = e.map_err(|e| unlistable(dir, &e))?;
        if let Ok(ft) = e.file_type() {
            out.insert(e.file_name(), dirent_kind(&ft));
        }
    }
    Ok(out)
}

/// The error for a workspace directory moat cannot list.
fn unlistable(dir: &Path, e: &std::io::Error) -> String {
    format!(
        "cannot list {} ({e}): moat must see every .env and write-protected file in the workspace (and in the directories granted to it) before the run, and a directory it cannot list could hide one. Fix: chmod u+rx '{}' (or remove it), then run again",
        dir.display(),
        dir.display()
    )
}

/// True when `dir` is neither ours nor searchable by us (and we are not
/// root): nothing inside can be opened by the command, which runs with our
/// uid and no capabilities over files it does not own.
fn unenterable(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let uid = nix::unistd::geteuid().as_raw();
    let Ok(meta) = fs::symlink_metadata(dir) else {
        return false;
    };
    uid != 0
        && meta.uid() != uid
        && nix::unistd::access(dir, nix::unistd::AccessFlags::X_OK).is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A secret under a directory the caller owns but cannot search (mode
    /// 000) is not one the kernel keeps from it: its owner can chmod the
    /// directory back (the command too, where the view has it writable),
    /// so it keeps its stand-in. One under another user's unsearchable
    /// directory is kept (`/etc/shadow`'s case, one level down). Runs as
    /// an unprivileged uid (a forked child of a root run drops to 65534).
    #[test]
    fn a_secret_under_the_callers_own_unsearchable_directory_keeps_its_stand_in() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("moat-probe-keeps-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(base.join("own/gh")).unwrap();
        fs::write(base.join("own/gh/hosts.yml"), "t").unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
        let root = nix::unistd::geteuid().is_root();
        let user = if root {
            65534
        } else {
            nix::unistd::geteuid().as_raw()
        };
        if root {
            for p in ["own", "own/gh", "own/gh/hosts.yml"] {
                std::os::unix::fs::chown(base.join(p), Some(user), Some(user)).unwrap();
            }
            // Another user's unsearchable directory, for the other half.
            fs::create_dir_all(base.join("theirs")).unwrap();
            fs::write(base.join("theirs/key"), "t").unwrap();
            fs::set_permissions(base.join("theirs"), fs::Permissions::from_mode(0o700)).unwrap();
            // Root's links (another user's) into the caller's own: under
            // its mode-000 directory, and to its own mode-000 file.
            std::os::unix::fs::symlink("own/gh/hosts.yml", base.join("link")).unwrap();
            fs::write(base.join("ownfile"), "t").unwrap();
            std::os::unix::fs::chown(base.join("ownfile"), Some(user), Some(user)).unwrap();
            fs::set_permissions(base.join("ownfile"), fs::Permissions::from_mode(0o000)).unwrap();
            std::os::unix::fs::symlink("ownfile", base.join("link2")).unwrap();
        }
        fs::set_permissions(base.join("own"), fs::Permissions::from_mode(0o000)).unwrap();
        let check = || -> i32 {
            let mut code = 0;
            if kernel_keeps_from_user(&base.join("own/gh/hosts.yml"), Kind::File) {
                code |= 1;
            }
            if kernel_keeps_from_user(&base.join("own/gh"), Kind::Dir) {
                code |= 2;
            }
            if root && !kernel_keeps_from_user(&base.join("theirs/key"), Kind::File) {
                code |= 4;
            }
            if root && kernel_keeps_from_user(&base.join("link"), Kind::File) {
                code |= 16;
            }
            if root && kernel_keeps_from_user(&base.join("link2"), Kind::File) {
                code |= 32;
            }
            code
        };
        let code = if root {
            // SAFETY: the child only checks paths and leaves by _exit.
            match unsafe { libc::fork() } {
                0 => {
                    // SAFETY: the forked child drops to an unprivileged uid.
                    let dropped = unsafe {
                        libc::setresgid(user, user, user) == 0
                            && libc::setresuid(user, user, user) == 0
                    };
                    let code = if dropped { check() } else { 8 };
                    // SAFETY: leaves the child without running the harness.
                    unsafe { libc::_exit(code) }
                }
                pid => {
                    let mut status = 0;
                    // SAFETY: waits for the child forked above.
                    unsafe { libc::waitpid(pid, &mut status, 0) };
                    libc::WEXITSTATUS(status)
                }
            }
        } else {
            check()
        };
        fs::set_permissions(base.join("own"), fs::Permissions::from_mode(0o755)).unwrap();
        let _ = fs::remove_dir_all(&base);
        assert_eq!(
            code, 0,
            "1: a file under the caller's own mode-000 directory taken as kept; 2: the same for a directory; 4: another user's key not kept; 8: could not drop to uid {user}; 16: another user's link into the caller's mode-000 directory taken as kept; 32: the same to the caller's own mode-000 file"
        );
    }

    /// Every protected path that exists is among the names the level-by-level
    /// lookup returns: through a symlinked parent, a nested path, a path
    /// that is both a name and a parent, and an unreadable directory.
    #[test]
    fn existing_names_never_leaves_out_a_path_that_exists() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let home = std::env::temp_dir().join(format!("moat-probe-names-{}", std::process::id()));
        let _ = fs::remove_dir_all(&home);
        let elsewhere = home.with_extension("elsewhere");
        let _ = fs::remove_dir_all(&elsewhere);
        fs::create_dir_all(elsewhere.join("gh")).unwrap();
        fs::write(elsewhere.join("gh/hosts.yml"), "t").unwrap();
        fs::create_dir_all(home.join(".ssh")).unwrap();
        fs::create_dir_all(home.join(".cargo")).unwrap();
        fs::write(home.join(".cargo/credentials.toml"), "t").unwrap();
        fs::write(home.join(".netrc"), "t").unwrap();
        symlink(&elsewhere, home.join(".config")).unwrap();
        fs::create_dir_all(home.join(".aws")).unwrap();
        fs::set_permissions(home.join(".aws"), fs::Permissions::from_mode(0o311)).unwrap();
        let rels: Vec<&str> = moat_policy::PROTECTED_HOME_PATHS
            .iter()
            .copied()
            .chain(["only/one", "a/b/c"])
            .collect();
        fs::create_dir_all(home.join("a/b")).unwrap();
        fs::write(home.join("a/b/c"), "t").unwrap();
        let found = existing_names(&home, &rels);
        let mut expected = 0;
        for rel in &rels {
            let p = home.join(rel);
            if p.symlink_metadata().is_ok() {
                expected += 1;
                assert!(found.contains(&p), "{rel} exists but was not found");
            }
        }
        assert!(
            expected >= 6,
            "the fixture plants what it says ({expected})"
        );
        fs::set_permissions(home.join(".aws"), fs::Permissions::from_mode(0o755)).unwrap();
        let _ = fs::remove_dir_all(&home);
        let _ = fs::remove_dir_all(&elsewhere);
    }

    /// `follow_links` resolves the way the kernel does: a chain of links
    /// (relative, absolute, `..` after a link), a dangling one to the path
    /// it would create, every link passed reported where it is; a loop is
    /// `None`.
    #[test]
    fn hg_named_programs_reads_hooks_and_extensions() {
        let rc = "[hooks]\n\
                  precommit = ./hooks/check.sh --fast\n\
                  pretxncommit.py = python:hooks/x.py:run\n\
                  incoming = python:hgext.mod.fn\n\
                  changegroup = python3 scripts/notify.py out/log\n\
                  # commented = ./no.sh\n\
                  \n\
                  [extensions]\n\
                  rebase =\n\
                  mine = ./ext/mine.py\n\
                  off = !./off.py\n\
                  env = $HOME/x.py\n\
                  [ui]\n\
                  editor = ./not-a-hook.sh\n";
        let got = hg_named_programs(rc);
        let want: Vec<(String, bool)> = [
            ("./hooks/check.sh", true),
            ("hooks/x.py", true),
            ("scripts/notify.py", false),
            ("out/log", false),
            ("./ext/mine.py", true),
        ]
        .iter()
        .map(|(p, m)| (p.to_string(), *m))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn follow_links_follows_chains_and_dangling_links() {
        use std::os::unix::fs::symlink;
        let d = std::env::temp_dir().join(format!("moat-follow-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("real/sub")).unwrap();
        symlink("real", d.join("a")).unwrap();
        symlink(d.join("a/sub"), d.join("b")).unwrap();
        symlink("../a/sub/x", d.join("real/up")).unwrap();
        symlink("missing/y", d.join("dang")).unwrap();
        symlink("loop2", d.join("loop1")).unwrap();
        symlink("loop1", d.join("loop2")).unwrap();
        let (end, links) = follow_links(&d.join("b/f")).unwrap();
        let (end_up, _) = follow_links(&d.join("a/up")).unwrap();
        let (end_dang, _) = follow_links(&d.join("dang")).unwrap();
        let looped = follow_links(&d.join("loop1/z"));
        // One look at each path for a list gives each name's own answer.
        // So does one with a directory's listing, for names in it and not.
        let rels = [
            "b/f", "a/up", "dang", "loop1/z", "b/g", "dang/z", "real/sub", "none/x",
        ];
        for mut seen in [
            LinkSteps::new(),
            LinkSteps::listing(&d),
            LinkSteps::listing(&d.join("real")),
        ] {
            for rel in rels
                .iter()
                .chain(["real/up", "real/gone", "real/sub/x"].iter())
            {
                let alone = follow_links(&d.join(rel));
                assert_eq!(follow_links_seen(&d.join(rel), &mut seen), alone, "{rel}");
            }
        }
        let _ = fs::remove_dir_all(&d);
        assert_eq!(end, d.join("real/sub/f"));
        assert_eq!(
            links.iter().map(|(l, _)| l.clone()).collect::<Vec<_>>(),
            vec![d.join("b"), d.join("a")]
        );
        assert_eq!(end_up, d.join("real/sub/x"));
        assert_eq!(end_dang, d.join("missing/y"));
        assert_eq!(looped, None);
    }

    /// What a link may not lead to: a secret, inside one, a directory
    /// holding one, or `/proc`; a sibling of a secret is fine.
    #[test]
    fn leads_to_secret_covers_the_secret_its_ancestors_and_proc() {
        let secrets = [PathBuf::from("/home/u/.ssh")];
        let yes = [
            "/home/u/.ssh",
            "/home/u/.ssh/id_rsa",
            "/home/u",
            "/",
            "/proc/1/environ",
        ];
        let no = ["/home/u/.sshx", "/home/u/proj", "/usr/share"];
        for p in yes {
            assert!(crate::sweep::leads_to_secret(Path::new(p), &secrets), "{p}");
        }
        for p in no {
            assert!(
                !crate::sweep::leads_to_secret(Path::new(p), &secrets),
                "{p}"
            );
        }
    }

    /// A chain through `/proc/self/cwd` or `/dev/fd` ends somewhere that is
    /// not under `/proc` (this process's cwd, its stdout's file), yet it is
    /// caller-relative: `through_proc` says so; a plain chain is not.
    #[test]
    fn a_chain_through_procs_magic_links_is_told_apart() {
        for p in [
            "/proc/self/cwd/x",
            "/dev/fd/0",
            "/proc/thread-self/root/etc",
        ] {
            let (end, links) = follow_links(Path::new(p)).unwrap();
            if p.contains("cwd") {
                assert!(!end.starts_with("/proc"), "{p} -> {}", end.display());
            }
            assert!(crate::sweep::through_proc(&links), "{p}: {links:?}");
        }
        let (_, links) = follow_links(Path::new("/usr/share")).unwrap();
        assert!(!crate::sweep::through_proc(&links));
    }
}
