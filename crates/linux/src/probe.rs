//! Reads the host facts a plan depends on (what exists where, which kernel
//! features are present). This is the only I/O before planning; the plan
//! itself is a pure function of (Policy, HostFacts).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use moat_policy::{
    is_protected_workspace_name, is_write_protected_name, Level, Policy, PROTECTED_HOME_PATHS,
    WRITE_PROTECTED_GIT_PATHS,
};
use serde::Serialize;

use crate::sys;

/// What kind of filesystem object a path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

impl Kind {
    fn of(meta: &fs::Metadata) -> Kind {
        dirent_kind(&meta.file_type())
    }
}

/// One entry of the host's `/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootEntry {
    pub name: String,
    pub kind: Kind,
    /// Where a symlink points (as written).
    pub link: Option<PathBuf>,
}

/// New entries named `<prefix>*` in `dir` are swept after the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PrefixGuard {
    pub dir: PathBuf,
    pub prefix: String,
    pub existing: Vec<String>,
}

/// Everything the planner needs to know about this host.
#[derive(Clone, Debug, Default)]
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
    /// Workspace entries that matter: protected and write-protected names,
    /// found by a bounded walk, as paths with their kind.
    pub workspace_protected: BTreeMap<PathBuf, Kind>,
    pub workspace_write_protected: BTreeMap<PathBuf, Kind>,
    /// Write-protected paths that do not exist yet: the first missing
    /// component of each, to be swept after the run.
    pub workspace_missing: Vec<PathBuf>,
    /// Directories where any new entry starting with a prefix (`.moat`) is
    /// write-protected: (directory, prefix, names present before the run).
    pub prefix_guards: Vec<PrefixGuard>,
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
    /// moat's config/state directories that do not exist and could not be
    /// created (the plan refuses if the command could create them).
    pub moat_missing: Vec<PathBuf>,
    /// moat's own binary (canonical), probed in proxy mode.
    pub moat_exe: Option<PathBuf>,
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
];

/// /proc entries made read-only or masked in the sandbox.
pub const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];
pub const PROC_MASKED: &[&str] = &["kcore", "keys", "timer_list", "sched_debug", "kallsyms"];

/// Directory names never walked when looking for `.env` files.
const WALK_SKIP: &[&str] = &[
    "node_modules",
    ".git",
    "target",
    "vendor",
    ".venv",
    "venv",
    "__pycache__",
    "dist",
    "build",
];
const WALK_MAX_DEPTH: usize = 3;
const WALK_MAX_DIRS: usize = 2000;

/// lstat(2) in one syscall (std's statx path costs two for a missing file).
fn lstat_kind(p: &Path) -> Option<Kind> {
    let st = nix::sys::stat::lstat(p).ok()?;
    Some(match st.st_mode & libc::S_IFMT {
        libc::S_IFLNK => Kind::Symlink,
        libc::S_IFDIR => Kind::Dir,
        _ => Kind::File,
    })
}

fn dirent_kind(ft: &fs::FileType) -> Kind {
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
/// deduplicated.
pub fn host_homes(uid: u32, policy_home: &Path, shown: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut homes = vec![policy_home.to_path_buf()];
    for (owner, home) in passwd_homes() {
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
    match lstat_kind(p)? {
        Kind::Symlink => {
            let c = fs::canonicalize(p).ok()?;
            let k = lstat_kind(&c)?;
            Some((c, k))
        }
        // Parents are canonical already (home, /etc) unless one of them is a
        // symlink, which realpath then resolves.
        k => match fs::canonicalize(p.parent()?) {
            Ok(parent) if parent == p.parent()? => Some((p.to_path_buf(), k)),
            _ => Some((fs::canonicalize(p).ok()?, k)),
        },
    }
}

impl HostFacts {
    /// Hides the audit log `file` from the command wherever the view would
    /// show it (a custom `--audit-log` may live anywhere).
    pub fn add_hidden_file(&mut self, file: &Path) {
        if let Ok(c) = fs::canonicalize(file) {
            if !self.moat_hidden.keys().any(|h| c.starts_with(h)) {
                self.moat_hidden.insert(c, Kind::File);
            }
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
        f.probe_root();
        f.probe_secrets(policy);
        f.probe_sockets();
        f.probe_workspace(policy);
        f.probe_write_protected_in_grants(policy);
        f.probe_moat_dirs();
        if let Ok(target) = fs::canonicalize("/etc/resolv.conf") {
            if target.starts_with("/run")
                && lstat_kind(Path::new("/etc/resolv.conf")) == Some(Kind::Symlink)
            {
                f.resolv_conf_in_run = Some(target);
            }
        }
        f.proc_entries = PROC_READ_ONLY
            .iter()
            .chain(PROC_MASKED)
            .filter(|n| Path::new("/proc").join(n).exists())
            .map(|n| n.to_string())
            .collect();
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

    fn probe_root(&mut self) {
        if let Ok(rd) = fs::read_dir("/") {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Ok(meta) = e.path().symlink_metadata() else {
                    continue;
                };
                let kind = Kind::of(&meta);
                let link = if kind == Kind::Symlink {
                    fs::read_link(e.path()).ok()
                } else {
                    None
                };
                self.root_entries.push(RootEntry { name, kind, link });
            }
        }
        self.root_entries.sort_by(|a, b| a.name.cmp(&b.name));
        self.var_run_is_dir = lstat_kind(Path::new("/var/run")) == Some(Kind::Dir);
    }

    fn probe_secrets(&mut self, policy: &Policy) {
        // Every home on the host, whoever runs moat: as root they are all
        // readable, and an unprivileged caller may still read a home (and a
        // secret in it) that another user left group/world-readable.
        let shown = |p: &Path| may_be_visible(policy, p);
        let homes = host_homes(self.uid, &policy.home, shown);
        for home in &homes {
            // Most homes (service accounts) hold none of these: one lstat of
            // a missing first component (`.config`) rules out every path
            // under it, keeping the launch path short.
            let mut missing: Vec<&str> = Vec::new();
            for rel in PROTECTED_HOME_PATHS {
                if let Some((first, _)) = rel.split_once('/') {
                    if missing.contains(&first) {
                        continue;
                    }
                    if lstat_kind(&home.join(first)).is_none() {
                        missing.push(first);
                        continue;
                    }
                }
                let p = home.join(rel);
                if let Some((c, k)) = resolve(&p) {
                    if home == &policy.home {
                        self.home_protected.insert(p, c.clone());
                    }
                    self.secrets.insert(c, k);
                }
            }
        }
        for s in ETC_SECRETS {
            if let Some((c, k)) = resolve(Path::new(s)) {
                self.secrets.insert(c, k);
            }
        }
        // SSH host private keys: every /etc/ssh/ssh_host_*_key.
        if let Ok(rd) = fs::read_dir("/etc/ssh") {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("ssh_host_") && n.ends_with("_key") {
                    if let Some((c, k)) = resolve(&e.path()) {
                        self.secrets.insert(c, k);
                    }
                }
            }
        }
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
                let p = home.join(rel);
                if p == g.path || !p.starts_with(&g.path) {
                    continue;
                }
                match lstat_kind(&p) {
                    Some(k) if write_protected => {
                        self.workspace_write_protected.insert(p, k);
                    }
                    // An existing protected path is a secret: a stand-in.
                    Some(_) => {}
                    None => {
                        let mut cur = g.path.clone();
                        if let Ok(below) = p.strip_prefix(&g.path) {
                            for c in below.components() {
                                cur.push(c);
                                if lstat_kind(&cur).is_none() {
                                    break;
                                }
                            }
                        }
                        if !self.workspace_missing.contains(&cur) {
                            self.workspace_missing.push(cur);
                        }
                    }
                }
            }
        }
    }

    /// Records the write-protected entries under `root` (and the missing
    /// ones, by their first missing component); returns the root's names.
    fn write_protected_at(
        &mut self,
        policy: &Policy,
        root: &Path,
        is_home: bool,
    ) -> BTreeMap<String, Kind> {
        let mut present: BTreeMap<String, Kind> = BTreeMap::new();
        if let Ok(rd) = fs::read_dir(root) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if is_write_protected_name(&n) || n == ".git" {
                    if let Ok(ft) = e.file_type() {
                        present.insert(n, dirent_kind(&ft));
                    }
                }
            }
        }
        let mut names: Vec<String> = policy
            .write_protected
            .iter()
            .filter(|n| !n.contains('*'))
            .map(|n| n.to_string())
            .collect();
        names.extend(
            present
                .keys()
                .filter(|n| *n != ".git" && !names.contains(n))
                .cloned()
                .collect::<Vec<_>>(),
        );
        for pattern in policy
            .write_protected
            .iter()
            .filter_map(|n| n.strip_suffix('*'))
        {
            self.prefix_guards.push(PrefixGuard {
                dir: root.to_path_buf(),
                prefix: pattern.to_string(),
                existing: present
                    .keys()
                    .filter(|n| n.starts_with(pattern))
                    .cloned()
                    .collect(),
            });
        }
        for n in names {
            let p = root.join(&n);
            match present.get(&n) {
                Some(k) => {
                    self.workspace_write_protected.insert(p, *k);
                }
                None => self.workspace_missing.push(p),
            }
        }
        if is_home {
            // Missing protected paths (~/.ssh, ~/.aws…) are swept too: a
            // command must not plant ~/.ssh/authorized_keys or credentials
            // the host's tools would then use. Existing ones are stand-ins.
            let missing_protected = PROTECTED_HOME_PATHS
                .iter()
                .filter(|rel| lstat_kind(&root.join(rel)).is_none());
            for rel in policy.write_protected_home.iter().chain(missing_protected) {
                let p = root.join(rel);
                match lstat_kind(&p) {
                    Some(k) => {
                        self.workspace_write_protected.insert(p, k);
                    }
                    None => {
                        // Sweep the first missing component: creating it is
                        // the first step towards the protected path.
                        let mut cur = root.to_path_buf();
                        for c in Path::new(rel).components() {
                            cur.push(c);
                            if lstat_kind(&cur).is_none() {
                                break;
                            }
                        }
                        if !self.workspace_missing.contains(&cur) {
                            self.workspace_missing.push(cur);
                        }
                    }
                }
            }
        }
        present
    }

    fn probe_workspace(&mut self, policy: &Policy) {
        let ws = &policy.workspace;
        // `.env`, `.env.*`, `.envrc` anywhere in a bounded walk of the workspace.
        let mut stack = vec![(ws.clone(), 0usize)];
        let mut seen = 0usize;
        while let Some((dir, depth)) = stack.pop() {
            seen += 1;
            if seen > WALK_MAX_DIRS {
                break;
            }
            let Ok(rd) = fs::read_dir(&dir) else { continue };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Ok(ft) = e.file_type() else { continue };
                let path = e.path();
                if is_protected_workspace_name(&name) {
                    // Hide the resolved target: a `.env` symlink pointing out
                    // of the workspace is covered wherever it points.
                    if let Some((c, k)) = resolve(&path) {
                        self.workspace_protected.insert(c, k);
                    }
                } else if ft.is_dir()
                    && depth < WALK_MAX_DEPTH
                    && !WALK_SKIP.contains(&name.as_str())
                {
                    stack.push((path, depth + 1));
                }
            }
        }
        if !matches!(
            policy.level,
            Level::WorkspaceWrite | Level::WorkspaceContained
        ) {
            return;
        }
        // Write-protected names apply at the workspace root and at every
        // home directory inside the workspace (a workspace of /home must not
        // let the command write /home/u/.bashrc).
        let mut roots: Vec<(PathBuf, bool)> = vec![(ws.clone(), *ws == policy.home)];
        for h in host_homes(self.uid, &policy.home, |h| h.starts_with(ws)) {
            if h != *ws && !roots.iter().any(|(r, _)| *r == h) {
                roots.push((h, true));
            }
        }
        let mut git_kind = None;
        for (root, is_home) in &roots {
            let present = self.write_protected_at(policy, root, *is_home);
            if root == ws {
                git_kind = present.get(".git").copied();
            }
        }
        // .git: the directory itself (so it cannot be renamed away), its
        // hooks and config, and those of submodules.
        let git = ws.join(".git");
        match git_kind {
            Some(Kind::Dir) => {
                self.workspace_write_protected
                    .insert(git.clone(), Kind::Dir);
                let mut gitdirs = vec![git.clone()];
                if let Ok(rd) = fs::read_dir(git.join("modules")) {
                    gitdirs.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
                }
                for gd in gitdirs {
                    for rel in WRITE_PROTECTED_GIT_PATHS {
                        let p = gd.join(rel);
                        match lstat_kind(&p) {
                            Some(k) => {
                                self.workspace_write_protected.insert(p, k);
                            }
                            None => self.workspace_missing.push(p),
                        }
                    }
                }
            }
            Some(k) => {
                // A gitfile (worktree/submodule) or symlink: keep it as it is.
                self.workspace_write_protected.insert(git, k);
            }
            None => self.workspace_missing.push(git),
        }
    }
}
