//! moat's policy model: what a sandboxed run may see and do, as inert data.
//!
//! A [`PolicyRequest`] is what the caller asked for, with host paths already
//! made absolute and canonical by the caller (this crate does no I/O).
//! [`Policy::resolve`] validates it — conflicting mounts, protected paths,
//! impossible combinations — and yields a [`Policy`] with one canonical JSON
//! form and a `sha256:` hash of that form, which is what `explain-policy`,
//! the `--json` result and the audit log all quote.
//!
//! # Security notes
//! - Deny wins: a `--ro`/`--rw` path strictly inside a protected path is an
//!   error unless the protected path itself is opted in.
//! - Two requests for the same target with different modes are an error that
//!   names both; moat never picks one silently.
#![forbid(unsafe_code)]

mod duration;
mod env;
pub mod gitconfig;
mod limits;
mod nested;
pub mod pathser;
mod protected;
mod toolchains;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use duration::{parse_duration, DurationError, MAX_DURATION_MS};
pub use env::{
    is_secret_env_name, strip_url_credentials, strip_url_userinfo, tool_config_env, SAFE_BASE_ENV,
    TOOL_CONFIG_ENV_PREFIXES,
};
pub use limits::{parse_count, parse_size, CountError, Limits, LimitsMode, SizeError};
pub use nested::{covers, Widening};
pub use protected::{
    is_inert_hook_name, is_protected_workspace_name, is_vcs_dir_name, is_write_protected_name,
    vcs_parts, PROTECTED_HOME_PATHS, WRITE_PROTECTED_GIT_PATHS, WRITE_PROTECTED_GIT_WORKTREE_PATHS,
    WRITE_PROTECTED_HOME_PATHS, WRITE_PROTECTED_VCS_PATHS, WRITE_PROTECTED_WORKSPACE_NAMES,
};
pub use toolchains::{toolchain_containing, toolchain_entries, HomeToolchain, HOME_TOOLCHAINS};

/// Version of the policy semantics; bumps whenever a level's meaning changes.
pub const POLICY_VERSION: &str = "1";

/// How much of the host a sandboxed command may see and change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    /// Whole host readable; writes only to private scratch.
    ReadOnly,
    /// Whole host readable; the workspace and `--rw` paths writable.
    WorkspaceWrite,
    /// Only the workspace, the system runtime and `--ro`/`--rw` paths exist.
    WorkspaceContained,
    /// No confinement; timeouts, cleanup and results still apply.
    DangerFullAccess,
}

impl Level {
    pub const ALL: [Level; 4] = [
        Level::ReadOnly,
        Level::WorkspaceWrite,
        Level::WorkspaceContained,
        Level::DangerFullAccess,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::ReadOnly => "read-only",
            Level::WorkspaceWrite => "workspace-write",
            Level::WorkspaceContained => "workspace-contained",
            Level::DangerFullAccess => "danger-full-access",
        }
    }

    pub fn parse(s: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.as_str() == s)
    }

    /// True for every level that builds a sandbox.
    pub fn is_sandboxed(self) -> bool {
        self != Level::DangerFullAccess
    }

    /// Whether the workspace is writable at this level.
    pub fn workspace_writable(self) -> bool {
        matches!(
            self,
            Level::WorkspaceWrite | Level::WorkspaceContained | Level::DangerFullAccess
        )
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which confinement backend runs a sandboxed level.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// User, mount, pid, ipc, uts and net namespaces, then Landlock and
    /// seccomp (the default; refuses when namespaces are unavailable).
    #[default]
    Namespaces,
    /// Landlock, seccomp and no_new_privs only: for hosts without user
    /// namespaces. Less than the namespaces backend (no private /tmp, HOME or
    /// pid namespace); what it cannot give is listed and refused.
    Landlock,
    /// Namespaces where available, else Landlock.
    Auto,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Namespaces => "namespaces",
            Backend::Landlock => "landlock",
            Backend::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Option<Backend> {
        [Backend::Namespaces, Backend::Landlock, Backend::Auto]
            .into_iter()
            .find(|b| b.as_str() == s)
    }

    fn is_default(&self) -> bool {
        *self == Backend::Namespaces
    }
}

/// How the command reaches the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkMode {
    /// Own network namespace, and no socket family but AF_UNIX.
    Disabled,
    /// The host's network, unfiltered.
    Unmanaged,
    /// Egress only through moat's managed proxy.
    Proxy,
}

impl NetworkMode {
    pub const ALL: [NetworkMode; 3] = [
        NetworkMode::Unmanaged,
        NetworkMode::Disabled,
        NetworkMode::Proxy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::Disabled => "disabled",
            NetworkMode::Unmanaged => "unmanaged",
            NetworkMode::Proxy => "proxy",
        }
    }

    pub fn parse(s: &str) -> Option<NetworkMode> {
        NetworkMode::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

impl fmt::Display for NetworkMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tool's own network class, enforced on its processes on top of the
/// session's network mode: it narrows, never widens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetClass {
    /// No inet sockets at all.
    NetDenied,
    /// Outgoing connections only: no TCP bind, no listen/accept.
    NetConnect,
    /// Connecting and listening.
    NetListen,
    /// Adds nothing to the session's mode.
    Unconfined,
}

impl NetClass {
    pub const ALL: [NetClass; 4] = [
        NetClass::NetDenied,
        NetClass::NetConnect,
        NetClass::NetListen,
        NetClass::Unconfined,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NetClass::NetDenied => "net-denied",
            NetClass::NetConnect => "net-connect",
            NetClass::NetListen => "net-listen",
            NetClass::Unconfined => "unconfined",
        }
    }

    pub fn parse(s: &str) -> Option<NetClass> {
        NetClass::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// A tool that keeps its own net class inside a session: its name on PATH
/// inside the sandbox is a moat shim that applies the class and execs
/// `program`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShimSpec {
    pub name: String,
    pub program: String,
    pub net_class: Option<NetClass>,
    /// Per-subcommand classes (`git fetch` connects, `git status` does not).
    pub subcommands: BTreeMap<String, NetClass>,
}

impl ShimSpec {
    /// The class for a call whose first argument is `argv1`.
    pub fn class_for(&self, argv1: Option<&str>) -> Option<NetClass> {
        argv1
            .and_then(|a| self.subcommands.get(a).copied())
            .or(self.net_class)
    }
}

/// Read-only or read-write access to a host path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

impl Access {
    fn flag(self) -> &'static str {
        match self {
            Access::ReadOnly => "--ro",
            Access::ReadWrite => "--rw",
        }
    }
}

/// What the caller asked for. Paths must already be absolute and canonical
/// (symlinks resolved); the CLI does that, since it is I/O.
#[derive(Clone, Debug, Default)]
pub struct PolicyRequest {
    pub level: Option<Level>,
    pub network: Option<NetworkMode>,
    pub workspace: PathBuf,
    /// The invoking user's home, canonical; protected paths hang off it.
    pub home: PathBuf,
    pub ro: Vec<PathBuf>,
    pub rw: Vec<PathBuf>,
    /// `--env K=V`, in command-line order; a later K replaces an earlier one.
    pub env: Vec<(String, String)>,
    pub pass_env: Vec<String>,
    pub timeout_ms: Option<u64>,
    /// Resource limits (`--memory`, `--pids`, …).
    pub limits: Limits,
    /// `--backend`.
    pub backend: Backend,
    /// `--allow-domain` / `--deny-domain` (presets allowed), proxy mode only.
    pub allow_domains: Vec<String>,
    pub deny_domains: Vec<String>,
    /// `--upstream-proxy URL`, proxy mode only.
    pub upstream_proxy: Option<String>,
    /// The tool's network class (from its profile), if any.
    pub net_class: Option<NetClass>,
    /// The profile this run is for (`moat run TOOL`, a shim).
    pub tool: Option<String>,
    /// Tools whose profiles keep their own net class inside the sandbox:
    /// they appear on PATH as moat shims (`/moat/shims/NAME`).
    pub shims: Vec<ShimSpec>,
}

/// An extra host path in the view, with its access.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PathGrant {
    #[serde(with = "pathser")]
    pub path: PathBuf,
    pub access: Access,
}

/// The network part of a policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NetworkPolicy {
    pub mode: NetworkMode,
    /// Allow/deny lists (proxy mode); empty otherwise.
    #[serde(flatten)]
    pub rules: net::NetRules,
    /// The upstream proxy without credentials, e.g. `http://proxy.corp:3128`.
    pub upstream: Option<String>,
    /// The upstream URL as given, credentials included; never serialized.
    #[serde(skip)]
    pub upstream_url: Option<String>,
}

/// A validated policy: the single source of truth for one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub policy_version: &'static str,
    pub level: Level,
    pub network: NetworkPolicy,
    #[serde(with = "pathser")]
    pub workspace: PathBuf,
    #[serde(with = "pathser")]
    pub home: PathBuf,
    /// Extra host paths, sorted by path.
    pub paths: Vec<PathGrant>,
    /// Variables set for the command. Values are not part of the canonical
    /// form (they may be secrets); their names are.
    #[serde(skip)]
    pub env: BTreeMap<String, String>,
    pub env_names: Vec<String>,
    pub pass_env: Vec<String>,
    pub timeout_ms: Option<u64>,
    /// Resource limits; absent from the canonical form when none is set.
    #[serde(skip_serializing_if = "Limits::is_unset")]
    pub limits: Limits,
    /// The backend asked for; absent from the canonical form when it is the default.
    #[serde(skip_serializing_if = "Backend::is_default")]
    pub backend: Backend,
    /// The tool's network class, narrowing the network mode.
    pub net_class: Option<NetClass>,
    /// The profile this run is for.
    pub tool: Option<String>,
    /// Tools shimmed inside the sandbox (sorted by name).
    pub shims: Vec<ShimSpec>,
    /// Home-relative paths shown as empty read-only stand-ins.
    pub protected_home_paths: Vec<&'static str>,
    /// Protected paths the caller opted in with `--ro`/`--rw`.
    #[serde(with = "pathser::vec")]
    pub protected_opt_in: Vec<PathBuf>,
    /// Workspace names that stay read-only at writable levels.
    pub write_protected: Vec<&'static str>,
    /// Home-relative paths that stay read-only when a home lies in a writable workspace.
    pub write_protected_home: Vec<&'static str>,
    /// Home-relative files the tool replaces by rename (`~/.claude.json`):
    /// the run gets a private copy in its own HOME, merged back afterwards.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub synced_home_files: Vec<PathBuf>,
    /// The host directory that backs the sandbox HOME when files are synced
    /// (a fresh per-run directory; otherwise HOME is a tmpfs). Not part of
    /// the hash: it differs on every run.
    #[serde(skip)]
    pub private_home: Option<PathBuf>,
}

/// Why a request cannot become a policy. Each message says what to change.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("a network class other than unconfined needs a sandboxed --policy (danger-full-access confines nothing)")]
    NetClassNeedsSandbox,
    #[error("{0} only applies with --network proxy")]
    NeedsProxyMode(&'static str),
    #[error(transparent)]
    Pattern(#[from] net::PatternError),
    #[error("invalid --upstream-proxy {0:?}: use http://[user:pass@]host:port")]
    BadUpstream(String),
    #[error("danger-full-access runs on the host network and cannot give --network {0}; pick a sandboxed --policy to confine the network")]
    DangerNetwork(NetworkMode),
    #[error("the workspace must be an absolute path, got {0}")]
    RelativePath(PathBuf),
    #[error("refusing {0} as the workspace: it would expose the whole host or a kernel filesystem; pass --cwd DIR with a project directory")]
    WorkspaceTooBroad(PathBuf),
    #[error("refusing {what} {path}: every program on the host shares it, and the unix sockets there (tmux, X11, ssh-agent) would be connectable from the sandbox; use a directory inside it (--cwd/--ro/--rw {path}/NAME)")]
    SharedTempDir { what: &'static str, path: PathBuf },
    #[error("{first} {path} and {second} {path} claim the same path with different access; drop one of them")]
    Conflict {
        path: PathBuf,
        first: &'static str,
        second: &'static str,
    },
    #[error("{flag} {path} conflicts with the workspace, which is {workspace_access} at --policy {level}; {hint}")]
    WorkspaceConflict {
        flag: &'static str,
        path: PathBuf,
        workspace_access: &'static str,
        level: Level,
        hint: &'static str,
    },
    #[error("{flag} {path} lies inside the protected path {protected}, which stays an empty read-only stand-in; opt the whole path in with --ro {protected} (or --rw) if this tool really needs it")]
    InsideProtected {
        flag: &'static str,
        path: PathBuf,
        protected: PathBuf,
    },
    #[error("the workspace {workspace} lies inside the protected path {protected}, which every sandboxed level hides; pick another --cwd, or opt the path in with --ro {protected} (or --rw) if this run really needs it")]
    WorkspaceProtected {
        workspace: PathBuf,
        protected: PathBuf,
    },
    #[error(
        "invalid environment variable name {0:?}: names are non-empty and contain no '=' or NUL"
    )]
    BadEnvName(String),
    #[error("invalid value for {0}: it contains a NUL byte")]
    BadEnvValue(String),
}

impl Policy {
    /// Validates a request into a policy. Pure: no I/O.
    pub fn resolve(req: PolicyRequest) -> Result<Policy, PolicyError> {
        let level = req.level.unwrap_or(Level::ReadOnly);
        let network = match (level, req.network) {
            (Level::DangerFullAccess, None | Some(NetworkMode::Unmanaged)) => {
                NetworkMode::Unmanaged
            }
            (Level::DangerFullAccess, Some(m)) => return Err(PolicyError::DangerNetwork(m)),
            (_, None) => NetworkMode::Disabled,
            (_, Some(m)) => m,
        };

        for p in [&req.workspace, &req.home]
            .into_iter()
            .chain(&req.ro)
            .chain(&req.rw)
        {
            if !p.is_absolute() {
                return Err(PolicyError::RelativePath(p.clone()));
            }
        }
        if level.is_sandboxed() && workspace_too_broad(&req.workspace) {
            return Err(PolicyError::WorkspaceTooBroad(req.workspace));
        }
        if level.is_sandboxed() {
            let given = std::iter::once(("the workspace", &req.workspace))
                .chain(req.ro.iter().map(|p| ("--ro", p)))
                .chain(req.rw.iter().map(|p| ("--rw", p)));
            for (what, p) in given {
                if is_shared_temp_dir(p) {
                    return Err(PolicyError::SharedTempDir {
                        what,
                        path: p.clone(),
                    });
                }
            }
        }

        let network_policy = network_policy(network, &req)?;
        if req.net_class.is_some_and(|c| c != NetClass::Unconfined) && !level.is_sandboxed() {
            return Err(PolicyError::NetClassNeedsSandbox);
        }
        let paths = merge_grants(&req, level)?;
        let protected_opt_in = check_protected(&paths, &req.home)?;
        if level.is_sandboxed() {
            check_workspace_not_protected(&req.workspace, &req.home, &protected_opt_in)?;
        }

        let mut env = BTreeMap::new();
        for (k, v) in req.env {
            check_env_name(&k)?;
            if v.contains('\0') {
                return Err(PolicyError::BadEnvValue(k));
            }
            env.insert(k, v);
        }
        let mut pass_env = req.pass_env;
        for k in &pass_env {
            check_env_name(k)?;
        }
        pass_env.sort();
        pass_env.dedup();

        Ok(Policy {
            policy_version: POLICY_VERSION,
            level,
            network: network_policy,
            workspace: req.workspace,
            home: req.home,
            paths,
            env_names: env.keys().cloned().collect(),
            env,
            pass_env,
            timeout_ms: req.timeout_ms,
            limits: req.limits,
            backend: req.backend,
            net_class: req.net_class,
            tool: req.tool,
            shims: {
                let mut s = req.shims;
                s.retain(|n| {
                    let plain = |x: &str| !x.is_empty() && !x.contains('/') && x != "moat";
                    plain(&n.name) && plain(&n.program)
                });
                s.sort();
                s.dedup_by(|a, b| a.name == b.name);
                s
            },
            protected_home_paths: PROTECTED_HOME_PATHS.to_vec(),
            synced_home_files: Vec::new(),
            private_home: None,
            protected_opt_in,
            write_protected: if level == Level::WorkspaceWrite || level == Level::WorkspaceContained
            {
                WRITE_PROTECTED_WORKSPACE_NAMES.to_vec()
            } else {
                Vec::new()
            },
            write_protected_home: if level == Level::WorkspaceWrite
                || level == Level::WorkspaceContained
            {
                WRITE_PROTECTED_HOME_PATHS.to_vec()
            } else {
                Vec::new()
            },
        })
    }

    /// The canonical JSON form: compact, keys sorted, paths absolute.
    pub fn canonical_json(&self) -> String {
        // serde_json's default map is a BTreeMap, so going through Value sorts
        // every object's keys; the struct itself is already path-sorted.
        let value = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        value.to_string()
    }

    /// `sha256:` of [`Policy::canonical_json`].
    pub fn hash(&self) -> String {
        sha256_tag(self.canonical_json().as_bytes())
    }

    /// [`Policy::hash`] and [`Policy::canonical_value`] from one
    /// serialisation (the launch path needs both).
    pub fn digest(&self) -> (String, serde_json::Value) {
        let value = self.canonical_value();
        (sha256_tag(value.to_string().as_bytes()), value)
    }

    /// The canonical policy as a JSON value (for embedding in results).
    pub fn canonical_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// Absolute protected paths under the policy's home, opted-in ones excluded.
    pub fn protected_paths(&self) -> Vec<PathBuf> {
        self.protected_home_paths
            .iter()
            .map(|rel| self.home.join(rel))
            .filter(|p| !self.protected_opt_in.contains(p))
            .collect()
    }
}

/// `sha256:<hex>` of `bytes`.
fn sha256_tag(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in Sha256::digest(bytes) {
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn network_policy(mode: NetworkMode, req: &PolicyRequest) -> Result<NetworkPolicy, PolicyError> {
    if mode != NetworkMode::Proxy {
        if !req.allow_domains.is_empty() {
            return Err(PolicyError::NeedsProxyMode("--allow-domain"));
        }
        if !req.deny_domains.is_empty() {
            return Err(PolicyError::NeedsProxyMode("--deny-domain"));
        }
        if req.upstream_proxy.is_some() {
            return Err(PolicyError::NeedsProxyMode("--upstream-proxy"));
        }
    }
    let rules = net::NetRules::from_args(&req.allow_domains, &req.deny_domains)?;
    let upstream = match &req.upstream_proxy {
        Some(u) => {
            Some(upstream_display(u).ok_or_else(|| PolicyError::BadUpstream(redact_userinfo(u)))?)
        }
        None => None,
    };
    Ok(NetworkPolicy {
        mode,
        rules,
        upstream,
        upstream_url: req.upstream_proxy.clone(),
    })
}

/// `http://[user:pass@]host:port[/]` → `http://host:port` (lowercased host).
fn upstream_display(url: &str) -> Option<String> {
    let rest = url.strip_prefix("http://")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let hostport = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
    if hostport.is_empty() || hostport.contains('/') {
        return None;
    }
    let (host, port) = hostport.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    if host.is_empty() {
        return None;
    }
    Some(format!("http://{}:{port}", host.to_ascii_lowercase()))
}

fn redact_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://***@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

fn check_env_name(k: &str) -> Result<(), PolicyError> {
    if k.is_empty() || k.contains('=') || k.contains('\0') {
        return Err(PolicyError::BadEnvName(k.to_string()));
    }
    Ok(())
}

/// Directories every program on the host shares for scratch files and
/// sockets (tmux, X11, ssh-agent): a connect() to a socket file needs no
/// write access to its mount, so showing one of these whole would hand the
/// command those services.
pub const SHARED_TEMP_DIRS: &[&str] = &["/tmp", "/var/tmp", "/dev/shm"];

/// Whether `p` is one of [`SHARED_TEMP_DIRS`] itself (not a directory in it).
pub fn is_shared_temp_dir(p: &Path) -> bool {
    SHARED_TEMP_DIRS.iter().any(|d| p == Path::new(d))
}

fn workspace_too_broad(ws: &Path) -> bool {
    ws == Path::new("/") || ["/proc", "/sys", "/dev"].iter().any(|k| ws.starts_with(k))
}

/// Merges `--ro`/`--rw` into one sorted list, refusing same-path conflicts
/// and conflicts with the workspace's own access at this level.
fn merge_grants(req: &PolicyRequest, level: Level) -> Result<Vec<PathGrant>, PolicyError> {
    let mut by_path: BTreeMap<PathBuf, Access> = BTreeMap::new();
    let requested = req
        .ro
        .iter()
        .map(|p| (p, Access::ReadOnly))
        .chain(req.rw.iter().map(|p| (p, Access::ReadWrite)));
    for (path, access) in requested {
        if let Some(prev) = by_path.get(path) {
            if *prev != access {
                return Err(PolicyError::Conflict {
                    path: path.clone(),
                    first: prev.flag(),
                    second: access.flag(),
                });
            }
            continue;
        }
        if level.is_sandboxed() && *path == req.workspace {
            let ws_access = if level.workspace_writable() {
                Access::ReadWrite
            } else {
                Access::ReadOnly
            };
            if access != ws_access {
                return Err(PolicyError::WorkspaceConflict {
                    flag: access.flag(),
                    path: path.clone(),
                    workspace_access: if ws_access == Access::ReadWrite {
                        "writable"
                    } else {
                        "read-only"
                    },
                    level,
                    hint: if ws_access == Access::ReadOnly {
                        "use --policy workspace-write to write the workspace"
                    } else {
                        "use --policy read-only for a read-only workspace"
                    },
                });
            }
            continue; // same as the workspace mount: nothing to add
        }
        by_path.insert(path.clone(), access);
    }
    Ok(by_path
        .into_iter()
        .map(|(path, access)| PathGrant { path, access })
        .collect())
}

/// Refuses a workspace that is, or lies inside, a protected path not opted in.
fn check_workspace_not_protected(
    ws: &Path,
    home: &Path,
    opted: &[PathBuf],
) -> Result<(), PolicyError> {
    // `ws` is under `home/rel` exactly when it is under `home` and the rest
    // starts with `rel` (component-wise): one comparison with the home,
    // not a joined path per protected name (≈ 200 on every launch).
    let Ok(rest) = ws.strip_prefix(home) else {
        return Ok(());
    };
    for rel in PROTECTED_HOME_PATHS {
        if !rest.starts_with(rel) {
            continue;
        }
        let p = home.join(rel);
        if !opted.contains(&p) {
            return Err(PolicyError::WorkspaceProtected {
                workspace: ws.to_path_buf(),
                protected: p,
            });
        }
    }
    Ok(())
}

/// Returns the protected paths that are opted in (named exactly), and refuses
/// grants strictly inside a protected path that is not.
fn check_protected(paths: &[PathGrant], home: &Path) -> Result<Vec<PathBuf>, PolicyError> {
    if paths.is_empty() {
        return Ok(Vec::new());
    }
    let protected: Vec<PathBuf> = PROTECTED_HOME_PATHS
        .iter()
        .map(|rel| home.join(rel))
        .collect();
    let opted: Vec<PathBuf> = protected
        .iter()
        .filter(|p| paths.iter().any(|g| &g.path == *p))
        .cloned()
        .collect();
    for g in paths {
        for p in &protected {
            if g.path != *p && g.path.starts_with(p) && !opted.contains(p) {
                return Err(PolicyError::InsideProtected {
                    flag: g.access.flag(),
                    path: g.path.clone(),
                    protected: p.clone(),
                });
            }
        }
    }
    Ok(opted)
}

pub mod net;
#[cfg(test)]
mod tests;
