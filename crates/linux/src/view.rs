//! The View: what one run's sandbox sees, computed once from (Policy,
//! HostFacts) and asked by every later decision. Each path the sandbox shows
//! has one entry with its mode (read, write, hidden behind a stand-in,
//! write-protected, built by moat); the network rules and the tool's net
//! class travel with it. The Linux plan is its translation to mounts and
//! Landlock; a nested run is checked against the outer run's View; denial
//! explanations and `explain-policy` read it. Pure: no I/O.

use std::path::{Path, PathBuf};

use moat_policy::net::DomainPattern;
use moat_policy::{Access, Level, NetClass, NetworkMode, Policy, Widening};
use serde::{Deserialize, Serialize};

use crate::probe::{HostFacts, Kind};

/// Where the ephemeral HOME lives inside every sandboxed level.
pub const SANDBOX_HOME: &str = "/moat/home";
/// moat's own binary inside the view.
pub const SANDBOX_MOAT_BIN: &str = "/moat/bin/moat";

/// Host top-level directories visible at workspace-contained: the system runtime.
pub const SYSTEM_RUNTIME: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc",
];
/// Host top-level entries never bound from the host: the sandbox builds its own.
pub const BUILT_BY_MOAT: &[&str] = &["proc", "dev", "sys", "tmp", "run", "moat"];

/// How the sandbox sees a path (and everything beneath it, down to the next entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Host content, read-only.
    Read,
    /// Host content, writable.
    Write,
    /// An empty read-only stand-in over a secret.
    Hidden,
    /// Host content kept read-only inside a writable part (runs code later).
    WriteProtected,
    /// moat's own (a private tmpfs, /proc, /dev…) or the kernel's (/sys,
    /// read-only at the whole-host levels): no host files a grant could reach.
    Built,
}

impl Mode {
    /// 0: nothing of the host, 1: read, 2: write.
    fn reach(self) -> u8 {
        match self {
            Mode::Hidden | Mode::Built => 0,
            Mode::Read | Mode::WriteProtected => 1,
            Mode::Write => 2,
        }
    }

    fn shows_host(self) -> bool {
        self.reach() > 0
    }
}

/// Why an entry is in the view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// The host's system (the whole host, or the runtime at workspace-contained).
    System,
    /// Built by the sandbox itself.
    Sandbox,
    /// moat's own binary at /moat/bin/moat.
    MoatBinary,
    /// DNS configuration living under /run (unmanaged network).
    Dns,
    Workspace,
    /// `--ro`/`--rw`, a profile's or a project's grant.
    Grant,
    /// A protected path (credentials, `.env` files, /etc secrets).
    Secret,
    /// A host socket (agent, session bus, container engine).
    Socket,
    /// moat's audit log and trust store.
    MoatState,
    /// moat's configuration.
    MoatConfig,
    /// A file the host runs later (hooks, rc files, agent configs).
    RunsCode,
    /// The workspace's `.git`, pinned in place so its protected children stay.
    GitDir,
    /// A toolchain install under the real home (rustup, pyenv…), mirrored
    /// read-only under the sandbox HOME where tools look for it.
    Toolchain,
}

/// One path of the view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Where the sandbox sees it.
    #[serde(with = "moat_policy::pathser")]
    pub path: PathBuf,
    /// The host path shown there (None for what moat builds).
    #[serde(with = "opt_path")]
    pub host: Option<PathBuf>,
    pub mode: Mode,
    pub kind: Kind,
    pub why: Why,
    /// Shown somewhere other than its host path (under the sandbox HOME, or
    /// moat's binary); the same host path also has an entry of its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub relocated: bool,
}

/// An optional path, lossless like every path moat serializes (the View
/// travels to a nested run's moat and into `explain-policy`).
mod opt_path {
    use std::path::PathBuf;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct P(#[serde(with = "moat_policy::pathser")] PathBuf);

    pub fn serialize<S: Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
        p.as_ref().map(|x| P(x.clone())).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
        Ok(Option::<P>::deserialize(d)?.map(|p| p.0))
    }
}

/// The network part of the view.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetView {
    pub mode: Option<NetworkMode>,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    /// The upstream proxy without credentials.
    pub upstream: Option<String>,
}

/// Everything the sandbox of one run sees.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    pub level: Level,
    #[serde(with = "moat_policy::pathser")]
    pub workspace: PathBuf,
    #[serde(with = "moat_policy::pathser")]
    pub home: PathBuf,
    /// In the order the plan lays them down; the deepest entry covering a
    /// path decides its mode (the later one when two are equally deep).
    pub entries: Vec<Entry>,
    /// Host paths that must not exist after the run (write-protected paths
    /// that did not exist before it).
    #[serde(with = "moat_policy::pathser::vec")]
    pub swept: Vec<PathBuf>,
    pub network: NetView,
    pub net_class: Option<NetClass>,
}

/// Whether paths under `home` can be mirrored under the sandbox HOME.
fn home_is_mirrored(home: &Path) -> bool {
    home != Path::new("/")
}

/// Where a grant under the real home also appears under the sandbox HOME
/// (tools look under $HOME, which is the sandbox's own).
pub fn in_sandbox_home(home: &Path, path: &Path) -> Option<PathBuf> {
    let rel = path.strip_prefix(home).ok()?;
    (!rel.as_os_str().is_empty() && home != Path::new("/"))
        .then(|| Path::new(SANDBOX_HOME).join(rel))
}

fn entry(path: impl Into<PathBuf>, host: Option<&Path>, mode: Mode, kind: Kind, why: Why) -> Entry {
    Entry {
        path: path.into(),
        host: host.map(Path::to_path_buf),
        mode,
        kind,
        why,
        relocated: false,
    }
}

fn built(path: &str) -> Entry {
    entry(path, None, Mode::Built, Kind::Dir, Why::Sandbox)
}

/// Computes the view of `policy` on this host. Pure.
pub fn compute(policy: &Policy, host: &HostFacts) -> View {
    let mut v = View {
        level: policy.level,
        workspace: policy.workspace.clone(),
        home: policy.home.clone(),
        entries: Vec::new(),
        swept: Vec::new(),
        network: NetView {
            mode: Some(policy.network.mode),
            allow: policy
                .network
                .rules
                .allow
                .iter()
                .map(|p| p.as_str().to_string())
                .collect(),
            deny: policy
                .network
                .rules
                .deny
                .iter()
                .map(|p| p.as_str().to_string())
                .collect(),
            upstream: policy.network.upstream.clone(),
        },
        net_class: policy.net_class,
    };
    if !policy.level.is_sandboxed() {
        let root = Path::new("/");
        v.entries
            .push(entry("/", Some(root), Mode::Write, Kind::Dir, Why::System));
        return v;
    }
    let whole_host = policy.level != Level::WorkspaceContained;
    let e = &mut v.entries;

    // 1. The skeleton: the host's system, and what moat builds itself.
    if whole_host {
        e.push(entry(
            "/",
            Some(Path::new("/")),
            Mode::Read,
            Kind::Dir,
            Why::System,
        ));
    } else {
        e.push(built("/"));
        for r in &host.root_entries {
            if SYSTEM_RUNTIME.contains(&r.name.as_str()) && r.kind != Kind::Symlink {
                let p = Path::new("/").join(&r.name);
                e.push(entry(p.clone(), Some(&p), Mode::Read, r.kind, Why::System));
            }
        }
    }
    for d in BUILT_BY_MOAT {
        if whole_host || !matches!(*d, "run" | "sys") {
            e.push(built(&format!("/{d}")));
        }
    }
    if whole_host && host.var_run_is_dir {
        e.push(built("/var/run"));
    }
    e.push(built(SANDBOX_HOME));
    if let Some(exe) = &host.moat_exe {
        let mut b = entry(
            SANDBOX_MOAT_BIN,
            Some(exe),
            Mode::Read,
            Kind::File,
            Why::MoatBinary,
        );
        b.relocated = true;
        e.push(b);
    }
    if policy.network.mode == NetworkMode::Unmanaged {
        // DNS on the host network: keep resolv.conf working when it points into /run.
        if let Some(t) = &host.resolv_conf_in_run {
            e.push(entry(t.clone(), Some(t), Mode::Read, Kind::File, Why::Dns));
        }
    }

    // 2. The workspace and the grants, at their host paths…
    let ws_mode = if policy.level.workspace_writable() {
        Mode::Write
    } else {
        Mode::Read
    };
    let ws = &policy.workspace;
    e.push(entry(
        ws.clone(),
        Some(ws),
        ws_mode,
        Kind::Dir,
        Why::Workspace,
    ));
    for g in &policy.paths {
        let kind = host.grant_kinds.get(&g.path).copied().unwrap_or(Kind::Dir);
        let mode = match g.access {
            Access::ReadOnly => Mode::Read,
            Access::ReadWrite => Mode::Write,
        };
        e.push(entry(g.path.clone(), Some(&g.path), mode, kind, Why::Grant));
    }
    // …and a grant under the real home also under the sandbox HOME, with
    // whatever the view shows beneath it (the workspace, other grants).
    let identity: Vec<Entry> = e
        .iter()
        .filter(|x| matches!(x.why, Why::Workspace | Why::Grant))
        .cloned()
        .collect();
    for g in &policy.paths {
        let Some(mirror) = in_sandbox_home(&policy.home, &g.path) else {
            continue;
        };
        for x in identity.iter().filter(|x| x.path.starts_with(&g.path)) {
            let Ok(rel) = x.path.strip_prefix(&g.path) else {
                continue;
            };
            let mut m = x.clone();
            m.path = if rel.as_os_str().is_empty() {
                mirror.clone()
            } else {
                mirror.join(rel)
            };
            m.relocated = true;
            e.push(m);
        }
    }

    // Toolchains under the real home (rustup, pyenv, nvm…) find their
    // installs through $HOME: where the host is readable anyway, each also
    // appears read-only under the sandbox HOME (moat_policy::HOME_TOOLCHAINS),
    // unless a grant's mirror already shows that place. One resolving onto
    // or over a secret or moat's state is left out.
    if whole_host && home_is_mirrored(&policy.home) {
        let overlaps = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
        for (rel, canonical, kind) in &host.home_toolchains {
            let target = Path::new(SANDBOX_HOME).join(rel);
            let shown = v
                .entries
                .iter()
                .any(|x| x.relocated && x.why != Why::MoatBinary && target.starts_with(&x.path));
            let near_secret = host
                .secrets
                .keys()
                .chain(host.moat_hidden.keys())
                .any(|s| overlaps(canonical, s));
            if shown || near_secret {
                continue;
            }
            let mut x = entry(target, Some(canonical), Mode::Read, *kind, Why::Toolchain);
            x.relocated = true;
            v.entries.push(x);
        }
    }

    // 3. Write-protected entries: read-only wherever the view shows them.
    // `.git` itself stays writable but pinned (a mount point cannot be
    // renamed), so its protected children stay put.
    let explicit = |p: &Path| policy.paths.iter().any(|g| g.path == p);
    for (p, kind) in &host.workspace_write_protected {
        // No grant makes a write-protected path writable (the plan refuses
        // one on or under it); a protected home path the caller opted in
        // (a profile's `~/.claude` when the workspace is HOME) is theirs.
        // Only the opted-in path itself: a host-executed file inside it
        // (`~/.claude/settings.json` hooks) stays read-only.
        if policy.protected_opt_in.iter().any(|o| o == p) {
            continue;
        }
        // A git dir in a writable part (the workspace's, a `--rw` grant's)
        // stays writable, pinned. (Only there: a nested read-only run
        // inherits the outer `.git` entry, and there it stays read-only.)
        let git_dir = p.file_name() == Some(std::ffi::OsStr::new(".git"))
            && *kind == Kind::Dir
            && v.host_mode(p).is_some_and(|x| x.mode == Mode::Write);
        let (mode, why) = if git_dir {
            (Mode::Write, Why::GitDir)
        } else {
            (Mode::WriteProtected, Why::RunsCode)
        };
        for t in targets_of(&v.entries, p) {
            let relocated = t != *p;
            let mut x = entry(t, Some(p), mode, *kind, why);
            x.relocated = relocated;
            v.entries.push(x);
        }
    }
    // moat's configuration: read-only wherever a writable part shows it,
    // whatever is granted (a profile written from inside would widen later runs).
    for d in &host.moat_readonly {
        for t in targets_of(&v.entries, d) {
            if v.mode_at(&t).map(|x| x.mode) == Some(Mode::Write) {
                let relocated = t != *d;
                let mut x = entry(t, Some(d), Mode::WriteProtected, Kind::Dir, Why::MoatConfig);
                x.relocated = relocated;
                v.entries.push(x);
            }
        }
    }
    // Missing write-protected paths the command could create: beneath a
    // writable part of the view (the workspace, a `--rw` grant).
    v.swept = host
        .workspace_missing
        .iter()
        .filter(|p| !explicit(p))
        .filter(|p| v.host_mode(p).is_some_and(|x| x.mode == Mode::Write))
        .cloned()
        .collect();

    // 4. Stand-ins for secrets wherever the view shows them, at every place
    // the host path appears (its own path and under the sandbox HOME).
    let opted_in = |c: &Path| {
        explicit(c)
            || policy
                .protected_opt_in
                .iter()
                .any(|o| host.home_protected.get(o).map(|t| t == c).unwrap_or(false) || o == c)
    };
    let mut hidden: Vec<Entry> = Vec::new();
    // moat's own state (audit log, trust store) is outside every view: no
    // grant opts it in, so a command can neither read, lock nor change it.
    let moat_state = host
        .moat_hidden
        .iter()
        .map(|(p, k)| (p, *k, Why::MoatState, false));
    let secrets = host
        .secrets
        .iter()
        .chain(&host.workspace_protected)
        .map(|(p, k)| (p, *k, Why::Secret, true));
    let sockets = host.sockets.iter().map(|(p, k)| (p, *k, Why::Socket, true));
    for (p, kind, why, may_opt_in) in moat_state.chain(secrets).chain(sockets) {
        if may_opt_in && opted_in(p) {
            continue;
        }
        let kind = if kind == Kind::Dir {
            Kind::Dir
        } else {
            Kind::File
        };
        for t in targets_of(&v.entries, p) {
            let relocated = t != *p;
            let mut x = entry(t, Some(p), Mode::Hidden, kind, why);
            x.relocated = relocated;
            hidden.push(x);
        }
    }
    // A stand-in inside a hidden directory adds nothing.
    hidden.sort_by(|a, b| a.path.cmp(&b.path));
    hidden.dedup_by(|b, a| b.path.starts_with(&a.path) && a.kind == Kind::Dir);
    v.entries.extend(hidden);
    v
}

/// The deepest entry covering `path` (the later one when equally deep).
fn deepest<'a>(entries: impl Iterator<Item = &'a Entry>, path: &Path) -> Option<&'a Entry> {
    let mut best: Option<(usize, &Entry)> = None;
    for x in entries {
        if path.starts_with(&x.path) {
            let depth = x.path.components().count();
            if best.map(|(d, _)| depth >= d).unwrap_or(true) {
                best = Some((depth, x));
            }
        }
    }
    best.map(|(_, x)| x)
}

/// Every path of the view where host path `p` shows: its own path, and the
/// places a relocated entry (a grant mirrored under the sandbox HOME) shows it.
fn targets_of(entries: &[Entry], p: &Path) -> Vec<PathBuf> {
    let mut candidates = vec![p.to_path_buf()];
    for x in entries.iter().filter(|x| x.relocated) {
        if let Some(rel) = x.host.as_ref().and_then(|h| p.strip_prefix(h).ok()) {
            candidates.push(if rel.as_os_str().is_empty() {
                x.path.clone()
            } else {
                x.path.join(rel)
            });
        }
    }
    candidates.sort();
    candidates.dedup();
    candidates
        .into_iter()
        .filter(|t| {
            let Some(x) = deepest(entries.iter(), t) else {
                return false;
            };
            let shows = x.mode.shows_host();
            let back = match (&x.host, t.strip_prefix(&x.path)) {
                (Some(h), Ok(rel)) if rel.as_os_str().is_empty() => h.clone(),
                (Some(h), Ok(rel)) => h.join(rel),
                _ => return false,
            };
            shows && back == p
        })
        .collect()
}

impl View {
    /// The entry that decides what the sandbox sees at `path`.
    pub fn mode_at(&self, path: &Path) -> Option<&Entry> {
        deepest(self.entries.iter(), path)
    }

    /// The entry deciding host path `path` at its own place in the view.
    pub fn host_mode(&self, path: &Path) -> Option<&Entry> {
        deepest(self.entries.iter().filter(|x| !x.relocated), path)
    }

    /// Whether host path `path` shows host content at its own place.
    pub fn shows_host_at_own_path(&self, path: &Path) -> bool {
        self.host_mode(path).is_some_and(|x| x.mode.shows_host())
    }

    /// Whether `path` shows host content.
    pub fn shows_host(&self, path: &Path) -> bool {
        self.mode_at(path).is_some_and(|x| x.mode.shows_host())
    }

    /// Paths the command can write (besides what moat builds for it).
    pub fn writable(&self) -> impl Iterator<Item = &Path> {
        self.entries
            .iter()
            .filter(|x| x.mode == Mode::Write && x.why != Why::System)
            .map(|x| x.path.as_path())
    }

    /// Host paths this view hides or keeps read-only (not relocated copies).
    fn guarded(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|x| {
            !x.relocated
                && (matches!(x.mode, Mode::Hidden | Mode::WriteProtected)
                    || matches!(x.why, Why::GitDir))
        })
    }
}

fn widening(grant: impl Into<String>, why: impl Into<String>) -> Widening {
    Widening {
        grant: grant.into(),
        why: why.into(),
    }
}

fn network_rank(m: NetworkMode) -> u8 {
    match m {
        NetworkMode::Disabled => 0,
        NetworkMode::Proxy => 1,
        NetworkMode::Unmanaged => 2,
    }
}

/// The stricter of two net classes; a class always narrows the session.
fn stricter(a: Option<NetClass>, b: Option<NetClass>) -> Option<NetClass> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) | (None, x) => x,
    }
}

/// Policy-level part of a nested run: what it inherits from the outer view
/// (deny list, upstream proxy, net class) and what it may never choose.
/// `caller_class` is the net class the requesting process runs under.
pub fn inherit_policy(
    outer: &View,
    inner: &mut Policy,
    caller_class: Option<NetClass>,
) -> Result<(), Widening> {
    if outer.level == Level::DangerFullAccess {
        return Ok(());
    }
    if inner.level == Level::DangerFullAccess {
        return Err(widening(
            "--policy danger-full-access",
            format!("the outer run is {}", outer.level),
        ));
    }
    if inner.network.upstream_url.is_some() {
        return Err(widening(
            "--upstream-proxy",
            "a nested run inherits the outer run's upstream proxy and cannot choose one",
        ));
    }
    let om = outer.network.mode.unwrap_or(NetworkMode::Disabled);
    let im = inner.network.mode;
    if network_rank(im) > network_rank(om) {
        return Err(widening(
            format!("--network {im}"),
            format!("the outer run has --network {om}"),
        ));
    }
    if im == NetworkMode::Proxy {
        let outer_allow: Vec<DomainPattern> = outer
            .network
            .allow
            .iter()
            .filter_map(|a| DomainPattern::parse(a).ok())
            .collect();
        for p in &inner.network.rules.allow {
            if !outer_allow.iter().any(|o| moat_policy::covers(o, p)) {
                return Err(widening(
                    format!("--allow-domain {}", p.as_str()),
                    "the outer allow list does not include it",
                ));
            }
        }
        let mut deny = inner.network.rules.deny.clone();
        for d in &outer.network.deny {
            match DomainPattern::parse(d) {
                Ok(p) => deny.push(p),
                Err(_) => {
                    return Err(widening(
                        format!("the outer --deny-domain {d}"),
                        "it cannot be carried into the nested run",
                    ))
                }
            }
        }
        inner.network.rules =
            moat_policy::net::NetRules::new(inner.network.rules.allow.clone(), deny);
        inner.network.upstream = outer.network.upstream.clone();
    }
    inner.net_class = stricter(stricter(inner.net_class, outer.net_class), caller_class);
    Ok(())
}

/// Adds what the outer view hides or protects to the facts of a nested run,
/// so the inner plan re-applies the outer's stand-ins and read-only binds
/// (the host-side process that launches it does not share the outer's
/// environment, and so would not find e.g. `$SSH_AUTH_SOCK` by itself).
pub fn inherit_facts(outer: &View, facts: &mut HostFacts) {
    for x in outer.guarded() {
        let Some(h) = &x.host else { continue };
        match x.mode {
            Mode::Hidden if x.why == Why::MoatState => {
                facts.moat_hidden.entry(h.clone()).or_insert(x.kind);
            }
            Mode::Hidden => {
                facts.secrets.entry(h.clone()).or_insert(x.kind);
            }
            Mode::WriteProtected if x.why == Why::MoatConfig => {
                if !facts.moat_readonly.contains(h) {
                    facts.moat_readonly.push(h.clone());
                }
            }
            _ => {
                facts
                    .workspace_write_protected
                    .entry(h.clone())
                    .or_insert(x.kind);
            }
        }
    }
    for s in &outer.swept {
        if s.symlink_metadata().is_err() && !facts.workspace_missing.contains(s) {
            facts.workspace_missing.push(s.clone());
        }
    }
}

/// Checks that `inner` (a nested run's view, built with [`inherit_policy`]
/// and [`inherit_facts`]) shows nothing `outer` does not: at every path
/// either view decides, the inner reach is at most the outer's, and no
/// explicit grant equals, contains or lies under what the outer hides or
/// keeps read-only.
pub fn check_nested(outer: &View, inner_policy: &Policy, inner: &View) -> Result<(), Widening> {
    if outer.level == Level::DangerFullAccess {
        return Ok(());
    }
    let whole_host = |l: Level| matches!(l, Level::ReadOnly | Level::WorkspaceWrite);
    if whole_host(inner.level) && !whole_host(outer.level) {
        return Err(widening(
            format!("--policy {}", inner.level),
            format!(
                "it reads the whole host and the outer run is {}",
                outer.level
            ),
        ));
    }
    let grant_name = |p: &Path| -> String {
        let g = inner_policy
            .paths
            .iter()
            .filter(|g| p.starts_with(&g.path))
            .max_by_key(|g| g.path.components().count());
        match g {
            Some(g) => format!(
                "{} {}",
                if g.access == Access::ReadWrite {
                    "--rw"
                } else {
                    "--ro"
                },
                g.path.display()
            ),
            None if p.starts_with(&inner_policy.workspace) => format!(
                "the workspace {} at --policy {}",
                inner_policy.workspace.display(),
                inner_policy.level
            ),
            None => format!("--policy {}", inner_policy.level),
        }
    };
    for g in &inner_policy.paths {
        for x in outer.guarded() {
            let Some(h) = &x.host else { continue };
            if x.why == Why::GitDir {
                // `.git` itself is writable (pinned); what it protects has
                // entries of its own.
                continue;
            }
            if h == &g.path || h.starts_with(&g.path) || g.path.starts_with(h) {
                let what = match x.mode {
                    Mode::Hidden => "hides",
                    _ => "keeps read-only",
                };
                return Err(widening(
                    grant_name(&g.path),
                    format!("the outer run {what} {}", h.display()),
                ));
            }
        }
    }
    if let Some((p, o)) = reaches_further(outer, inner) {
        let why = if o == 0 {
            format!("the outer run cannot read {}", p.display())
        } else {
            format!("the outer run cannot write {}", p.display())
        };
        return Err(widening(grant_name(&p), why));
    }
    Ok(())
}

/// The first host path where `inner` reaches further than `outer` (shows
/// what `outer` hides, or writes what `outer` only reads), with `outer`'s
/// reach there (0: nothing, 1: read); None when `inner` is within `outer`
/// at every path either view decides.
pub fn reaches_further(outer: &View, inner: &View) -> Option<(PathBuf, u8)> {
    let mut points: Vec<&Path> = outer
        .entries
        .iter()
        .chain(&inner.entries)
        .filter(|x| !x.relocated)
        .map(|x| x.path.as_path())
        .collect();
    points.sort();
    points.dedup();
    for p in points {
        let i = inner.host_mode(p).map(|x| x.mode.reach()).unwrap_or(0);
        let o = outer.host_mode(p).map(|x| x.mode.reach()).unwrap_or(0);
        if i > o {
            return Some((p.to_path_buf(), o));
        }
    }
    None
}

#[cfg(test)]
mod tests;
