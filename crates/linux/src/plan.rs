//! Turns (Policy, HostFacts) into a Plan: the ordered list of mounts, the
//! Landlock rules, the seccomp spec and the command's environment. Pure: no
//! I/O, so golden tests can assert exactly what a level builds.

use std::path::{Path, PathBuf};

use moat_policy::{is_secret_env_name, Access, Level, NetworkMode, Policy, SAFE_BASE_ENV};
use serde::Serialize;

use crate::probe::{HostFacts, Kind, PROC_MASKED, PROC_READ_ONLY};

/// Where the ephemeral HOME lives inside every sandboxed level.
pub const SANDBOX_HOME: &str = "/moat/home";
/// Default PATH when the caller has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Host top-level directories visible at workspace-contained: the system runtime.
const SYSTEM_RUNTIME: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc",
];
/// Host top-level entries never bound from the host: the sandbox builds its own.
const BUILT_BY_MOAT: &[&str] = &["proc", "dev", "sys", "tmp", "run", "moat"];
/// Device nodes bound from the host into the sandbox's /dev.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// One step of building the sandbox's root. Paths are inside the new root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MountOp {
    /// A fresh tmpfs (mode in octal), e.g. /tmp, HOME, /dev.
    Tmpfs { target: PathBuf, mode: u32 },
    /// A host path bound at the same or another path.
    Bind {
        source: PathBuf,
        target: PathBuf,
        kind: Kind,
        recursive: bool,
        readonly: bool,
        device: bool,
    },
    /// A symlink in the new root, e.g. /bin -> usr/bin.
    Symlink { target: PathBuf, points_to: PathBuf },
    /// A fresh procfs of the sandbox's own pid namespace.
    Proc { target: PathBuf },
    /// A private devpts instance.
    Devpts { target: PathBuf },
    /// An already-mounted path of the new root, bound over itself read-only.
    ReadOnlyAgain { target: PathBuf },
    /// An empty, read-only directory or file covering a secret.
    StandIn { target: PathBuf, kind: Kind },
    /// A small file of moat's own in the new root (read-only once sealed).
    File { target: PathBuf, contents: String },
}

impl MountOp {
    pub fn target(&self) -> &Path {
        match self {
            MountOp::Tmpfs { target, .. }
            | MountOp::Bind { target, .. }
            | MountOp::Symlink { target, .. }
            | MountOp::Proc { target }
            | MountOp::Devpts { target }
            | MountOp::ReadOnlyAgain { target }
            | MountOp::StandIn { target, .. }
            | MountOp::File { target, .. } => target,
        }
    }
}

/// Landlock filesystem rules matching the view.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LandlockSpec {
    /// Read files, list directories and execute beneath these.
    pub read: Vec<PathBuf>,
    /// Only list these directories (the new root of a contained view).
    pub list_only: Vec<PathBuf>,
    /// Full write access beneath these.
    pub write: Vec<PathBuf>,
    /// Device nodes: read, write, truncate and ioctl beneath these.
    pub devices: Vec<PathBuf>,
    /// Scope abstract unix sockets and signals to the sandbox (ABI >= 6).
    pub scoped: bool,
    /// Refuse every TCP bind (ABI >= 4; a net-connect tool).
    pub deny_tcp_bind: bool,
}

/// The seccomp floor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SeccompSpec {
    /// When set, socket() is refused for every address family not listed.
    pub socket_families: Option<Vec<i32>>,
    /// socket() is refused for these families (a tool's net class).
    pub denied_families: Vec<i32>,
    /// listen/accept refused (net-connect); Landlock refuses TCP binds.
    pub deny_listen: bool,
}

/// Proxy networking: where moat's own binary appears in the view (ssh's
/// ProxyCommand runs it to reach the SOCKS endpoint).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProxyPlan {
    pub moat_bin: PathBuf,
}

/// moat's own binary inside the view.
pub const SANDBOX_MOAT_BIN: &str = "/moat/bin/moat";
/// Where in-sandbox tool shims live (first on PATH when a run has shims).
pub const SANDBOX_SHIMS: &str = "/moat/shims";
/// What each in-sandbox shim runs and with which net class (JSON).
pub const SANDBOX_SHIM_TABLE: &str = "/moat/shims.json";

/// Everything needed to launch one run, decided before anything runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub level: Level,
    pub network: NetworkMode,
    pub sandboxed: bool,
    pub new_netns: bool,
    pub uid: u32,
    pub gid: u32,
    pub mounts: Vec<MountOp>,
    pub landlock: LandlockSpec,
    pub seccomp: SeccompSpec,
    pub proxy: Option<ProxyPlan>,
    /// Offer the nested-run socket inside the view.
    pub broker: bool,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// What the post-run sweep checks under each writable root
    /// (write-protected paths that did not exist before the run, new
    /// `.moat*` names, git dirs' executable parts).
    pub sweep: Vec<crate::sweep::SweepRoot>,
    /// moat's own state/config directories made read-only in this view.
    pub moat_dirs: Vec<PathBuf>,
    /// Paths granted read-only (for explaining refusals).
    pub ro_grants: Vec<PathBuf>,
    pub landlock_abi: i32,
}

/// Why a plan cannot be built on this host.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("Landlock is not available on this kernel (needed at --policy {0}); boot Linux >= 5.13 with Landlock in the lsm= list (e.g. lsm=landlock,lockdown,yama,integrity,apparmor), or use --policy danger-full-access to run unconfined")]
    NoLandlock(Level),
    #[error("moat is running inside another sandbox whose seccomp filter hides Landlock and forbids new namespaces (moat in moat, or a container's default profile); run moat outside it")]
    Nested,
    #[error("--network unmanaged needs Landlock ABI 6 (Linux >= 6.12) to keep host abstract unix sockets out of reach, and this kernel has ABI {0}; use --network disabled")]
    NoAbstractScoping(i32),
    #[error("the net-connect class needs Landlock ABI 4 (Linux >= 6.7) to refuse TCP binds, and this kernel has ABI {0}; use net-denied or net-listen")]
    NoTcpBindControl(i32),
    #[error("cannot find moat's own binary (needed inside the sandbox for ssh through the proxy)")]
    NoMoatBinary,
    #[error("{0} does not exist on the host; --ro/--rw paths must exist")]
    MissingGrant(PathBuf),
    #[error("{0}")]
    WorkspaceIncomplete(String),
    #[error("{0} is write-protected (the host runs it later); no grant makes it writable. Drop the --rw (or the project file's rw entry) for it, or use --ro")]
    GrantOnWriteProtected(PathBuf),
}

/// Builds the plan. Pure.
pub fn build(policy: &Policy, host: &HostFacts) -> Result<Plan, PlanError> {
    for g in &policy.paths {
        if !host.grant_kinds.contains_key(&g.path) {
            return Err(PlanError::MissingGrant(g.path.clone()));
        }
    }
    let sandboxed = policy.level.is_sandboxed();
    if sandboxed {
        if let Some(e) = &host.incomplete {
            return Err(PlanError::WorkspaceIncomplete(e.clone()));
        }
        // A grant never reaches a write-protected path (a protected home
        // path the caller opted in, like a profile's `~/.claude`, excepted).
        for g in policy
            .paths
            .iter()
            .filter(|g| g.access == Access::ReadWrite)
        {
            let opted = policy
                .protected_opt_in
                .iter()
                .any(|o| g.path.starts_with(o));
            // (A git dir itself is bound read-write; only its parts are not.)
            let reaches = |(w, k): (&PathBuf, &Kind)| {
                let git_dir =
                    w.file_name() == Some(std::ffi::OsStr::new(".git")) && *k == Kind::Dir;
                !git_dir && g.path.starts_with(w)
            };
            if !opted && host.workspace_write_protected.iter().any(reaches) {
                return Err(PlanError::GrantOnWriteProtected(g.path.clone()));
            }
        }
    }
    let mut plan = Plan {
        level: policy.level,
        network: policy.network.mode,
        sandboxed,
        new_netns: sandboxed && policy.network.mode != NetworkMode::Unmanaged,
        uid: host.uid,
        gid: host.gid,
        mounts: Vec::new(),
        landlock: LandlockSpec::default(),
        seccomp: SeccompSpec {
            socket_families: match policy.network.mode {
                NetworkMode::Disabled => Some(vec![libc::AF_UNIX]),
                // Inside the proxy's network namespace only loopback exists;
                // inet sockets reach the proxy endpoints and nothing else.
                NetworkMode::Proxy => Some(vec![libc::AF_UNIX, libc::AF_INET, libc::AF_INET6]),
                NetworkMode::Unmanaged => None,
            },
            denied_families: match policy.net_class {
                Some(moat_policy::NetClass::NetDenied) => {
                    vec![libc::AF_INET, libc::AF_INET6, libc::AF_PACKET]
                }
                _ => Vec::new(),
            },
            deny_listen: policy.net_class == Some(moat_policy::NetClass::NetConnect),
        },
        proxy: None,
        broker: sandboxed,
        env: command_env(policy, host),
        cwd: policy.workspace.clone(),
        sweep: Vec::new(),
        moat_dirs: Vec::new(),
        ro_grants: policy
            .paths
            .iter()
            .filter(|g| g.access == Access::ReadOnly)
            .map(|g| g.path.clone())
            .collect(),
        landlock_abi: host.landlock_abi,
    };
    if !sandboxed {
        return Ok(plan);
    }
    if host.landlock_abi < 1 && host.under_seccomp {
        return Err(PlanError::Nested);
    }
    if host.landlock_abi < 1 {
        return Err(PlanError::NoLandlock(policy.level));
    }
    if policy.network.mode == NetworkMode::Unmanaged && host.landlock_abi < 6 {
        return Err(PlanError::NoAbstractScoping(host.landlock_abi));
    }
    if policy.net_class == Some(moat_policy::NetClass::NetConnect) && host.landlock_abi < 4 {
        return Err(PlanError::NoTcpBindControl(host.landlock_abi));
    }

    let whole_host = policy.level != Level::WorkspaceContained;
    let mut base = Vec::new();
    let mut layered = Vec::new();

    // 1. The skeleton: host top-level entries, and what moat builds itself.
    for e in &host.root_entries {
        if BUILT_BY_MOAT.contains(&e.name.as_str()) {
            continue;
        }
        if !whole_host && !SYSTEM_RUNTIME.contains(&e.name.as_str()) {
            continue;
        }
        let target = Path::new("/").join(&e.name);
        match (&e.kind, &e.link) {
            (Kind::Symlink, Some(link)) => base.push(MountOp::Symlink {
                target,
                points_to: link.clone(),
            }),
            (Kind::Symlink, None) => {}
            (kind, _) => base.push(host_bind(&target, *kind, true, true)),
        }
    }
    if whole_host {
        base.push(MountOp::Bind {
            source: "/sys".into(),
            target: "/sys".into(),
            kind: Kind::Dir,
            recursive: true,
            readonly: true,
            device: false,
        });
    }
    base.push(MountOp::Tmpfs {
        target: "/tmp".into(),
        mode: 0o1777,
    });
    if whole_host {
        // An empty /run hides every host socket under it; at
        // workspace-contained /run is simply absent.
        base.push(MountOp::Tmpfs {
            target: "/run".into(),
            mode: 0o755,
        });
    }
    base.push(MountOp::Tmpfs {
        target: SANDBOX_HOME.into(),
        mode: 0o700,
    });
    base.push(MountOp::Tmpfs {
        target: "/dev".into(),
        mode: 0o755,
    });
    for n in DEV_NODES {
        let p = Path::new("/dev").join(n);
        base.push(MountOp::Bind {
            source: p.clone(),
            target: p,
            kind: Kind::File,
            recursive: false,
            readonly: false,
            device: true,
        });
    }
    base.push(MountOp::Devpts {
        target: "/dev/pts".into(),
    });
    base.push(MountOp::Symlink {
        target: "/dev/ptmx".into(),
        points_to: "pts/ptmx".into(),
    });
    base.push(MountOp::Tmpfs {
        target: "/dev/shm".into(),
        mode: 0o1777,
    });
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        base.push(MountOp::Symlink {
            target: Path::new("/dev").join(name),
            points_to: to.into(),
        });
    }
    base.push(MountOp::Proc {
        target: "/proc".into(),
    });
    for n in &host.proc_entries {
        let target = Path::new("/proc").join(n);
        if PROC_READ_ONLY.contains(&n.as_str()) {
            base.push(MountOp::ReadOnlyAgain { target });
        } else if PROC_MASKED.contains(&n.as_str()) {
            base.push(MountOp::StandIn {
                target,
                kind: Kind::File,
            });
        }
    }
    // moat's own binary, read-only at /moat/bin/moat: ssh's ProxyCommand in
    // proxy mode, and nested `moat exec` calls (which reach the outer
    // supervisor through the broker socket) at every level.
    if let Some(exe) = &host.moat_exe {
        layered.push(MountOp::Bind {
            source: exe.clone(),
            target: SANDBOX_MOAT_BIN.into(),
            kind: Kind::File,
            recursive: false,
            readonly: true,
            device: false,
        });
        let mut env: std::collections::BTreeMap<String, String> = plan.env.drain(..).collect();
        let path = env.entry("PATH".into()).or_default();
        if !path.split(':').any(|d| d == "/moat/bin") {
            path.push_str(if path.is_empty() {
                "/moat/bin"
            } else {
                ":/moat/bin"
            });
        }
        // Profiled tools keep their own net class inside the session: their
        // names resolve first to moat shims, which add the tool's filter and
        // exec the real program.
        if !policy.shims.is_empty() {
            for s in &policy.shims {
                base.push(MountOp::Symlink {
                    target: Path::new(SANDBOX_SHIMS).join(&s.name),
                    points_to: SANDBOX_MOAT_BIN.into(),
                });
            }
            base.push(MountOp::File {
                target: SANDBOX_SHIM_TABLE.into(),
                contents: serde_json::to_string(&policy.shims).unwrap_or_default(),
            });
            *path = format!("{SANDBOX_SHIMS}:{path}");
        }
        plan.env = env.into_iter().collect();
    }
    if sandboxed && policy.network.mode == NetworkMode::Proxy {
        if host.moat_exe.is_none() {
            return Err(PlanError::NoMoatBinary);
        }
        plan.proxy = Some(ProxyPlan {
            moat_bin: SANDBOX_MOAT_BIN.into(),
        });
        let mut env: std::collections::BTreeMap<String, String> = plan.env.drain(..).collect();
        // An explicit --env wins (e.g. NO_PROXY for a server inside the
        // sandbox); a passed-through host proxy variable does not. Either
        // way the namespace has no route out but the proxy endpoints.
        for (k, v) in crate::netns::proxy_env(SANDBOX_MOAT_BIN) {
            if !policy.env.contains_key(&k) {
                env.insert(k, v);
            }
        }
        plan.env = env.into_iter().collect();
    }
    if whole_host && host.var_run_is_dir {
        base.push(MountOp::Tmpfs {
            target: "/var/run".into(),
            mode: 0o755,
        });
    }
    if policy.network.mode == NetworkMode::Unmanaged {
        // DNS on the host network: keep resolv.conf working when it points into /run.
        if let Some(t) = &host.resolv_conf_in_run {
            layered.push(host_bind(t, Kind::File, false, true));
        }
    }

    // 2. The workspace and extra paths, at their host paths.
    let ws_rw = policy.level.workspace_writable();
    layered.push(host_bind(&policy.workspace, Kind::Dir, true, !ws_rw));
    for g in &policy.paths {
        let kind = host.grant_kinds.get(&g.path).copied().unwrap_or(Kind::Dir);
        layered.push(host_bind(&g.path, kind, true, g.access == Access::ReadOnly));
        // Tools look under $HOME, which is the sandbox's own: a grant under
        // the real home (`--rw ~/.cache/pip`, a profile's `~/.claude`) also
        // appears at the same place under the sandbox HOME.
        if let Some(mirror) = in_sandbox_home(policy, &g.path) {
            let mut op = host_bind(&g.path, kind, true, g.access == Access::ReadOnly);
            if let MountOp::Bind { target, .. } = &mut op {
                *target = mirror;
            }
            layered.push(op);
        }
    }

    // 3. Write-protected workspace entries: read-only binds over themselves.
    // `.git` itself is bound read-write: that makes it a mount point, which
    // cannot be renamed or removed, so its protected children stay put.
    for (p, kind) in &host.workspace_write_protected {
        // A protected home path the caller opted in (a profile's
        // `~/.claude` when the workspace is HOME) is theirs to write.
        if policy.protected_opt_in.iter().any(|o| p.starts_with(o)) {
            continue;
        }
        let git_dir = *p == policy.workspace.join(".git") && *kind == Kind::Dir;
        layered.push(host_bind(p, *kind, true, !git_dir));
    }
    // moat's configuration: read-only wherever a writable bind would
    // otherwise let the command change it (a profile could widen later runs).
    let writable_binds: Vec<PathBuf> = layered
        .iter()
        .filter_map(|op| match op {
            MountOp::Bind {
                target,
                readonly: false,
                ..
            } => Some(target.clone()),
            _ => None,
        })
        .collect();
    for d in &host.moat_readonly {
        if writable_binds.iter().any(|w| d.starts_with(w)) {
            layered.push(host_bind(d, Kind::Dir, true, true));
            plan.moat_dirs.push(d.clone());
        }
    }
    // The sweep checks the writable roots: the workspace at the writable
    // levels, writable grants at any level (and homes inside them).
    let writable = |r: &Path| {
        (ws_rw && r.starts_with(&policy.workspace))
            || policy
                .paths
                .iter()
                .any(|g| g.access == Access::ReadWrite && r.starts_with(&g.path))
    };
    plan.sweep = host
        .sweep
        .iter()
        .filter(|s| writable(&s.root))
        .cloned()
        .collect();

    // 4. Stand-ins for secrets wherever the view would show them.
    let opted_in = |c: &Path| {
        policy.paths.iter().any(|g| g.path == c)
            || policy
                .protected_opt_in
                .iter()
                .any(|o| host.home_protected.get(o).map(|t| t == c).unwrap_or(false) || o == c)
    };
    let mut all_ops: Vec<MountOp> = base.iter().chain(layered.iter()).cloned().collect();
    let mut stand_ins = Vec::new();
    // moat's own state (audit log, trust store) is outside every view: no
    // grant opts it in, so a command can neither read, lock nor change it.
    for (p, kind) in &host.moat_hidden {
        if visible(p, &all_ops) {
            stand_ins.push(MountOp::StandIn {
                target: p.clone(),
                kind: *kind,
            });
        }
        plan.moat_dirs.push(p.clone());
    }
    let secrets = host
        .secrets
        .iter()
        .chain(&host.workspace_protected)
        .chain(&host.sockets);
    for (p, kind) in secrets {
        if opted_in(p) || !visible(p, &all_ops) {
            continue;
        }
        let kind = if *kind == Kind::Dir {
            Kind::Dir
        } else {
            Kind::File
        };
        stand_ins.push(MountOp::StandIn {
            target: p.clone(),
            kind,
        });
    }
    // Directly visible sockets dirs (e.g. XDG_RUNTIME_DIR outside /run) are
    // covered above; drop duplicates that a parent stand-in already hides.
    stand_ins.sort_by(|a, b| a.target().cmp(b.target()));
    stand_ins.dedup_by(|b, a| {
        b.target().starts_with(a.target())
            && matches!(
                a,
                MountOp::StandIn {
                    kind: Kind::Dir,
                    ..
                }
            )
    });
    all_ops.extend(stand_ins);
    let pins = pins_for(&all_ops);
    all_ops.extend(pins);

    // Parents before children: a stable sort by depth keeps each path's ops
    // in the order above while guaranteeing every mount lands on its final
    // parent. The skeleton stays first (depth 1 and /dev, /proc internals).
    let skeleton_len = base.len();
    let mut rest: Vec<MountOp> = all_ops.split_off(skeleton_len);
    rest.sort_by_key(|op| op.target().components().count());
    all_ops.extend(rest);
    plan.mounts = all_ops;

    // Landlock: rules matching the view.
    let mut ll = LandlockSpec {
        scoped: host.landlock_abi >= 6,
        deny_tcp_bind: policy.net_class == Some(moat_policy::NetClass::NetConnect),
        ..Default::default()
    };
    if whole_host {
        ll.read.push("/".into());
    } else {
        ll.list_only.push("/".into());
        for op in &plan.mounts {
            if let MountOp::Bind {
                target,
                device: false,
                ..
            } = op
            {
                ll.read.push(target.clone());
            }
        }
        ll.read
            .extend(["/proc".into(), "/tmp".into(), SANDBOX_HOME.into()]);
    }
    ll.write
        .extend(["/tmp".into(), SANDBOX_HOME.into(), "/dev/shm".into()]);
    if ws_rw {
        ll.write.push(policy.workspace.clone());
    }
    ll.write.extend(
        policy
            .paths
            .iter()
            .filter(|g| g.access == Access::ReadWrite)
            .map(|g| g.path.clone()),
    );
    ll.write.extend(
        policy
            .paths
            .iter()
            .filter(|g| g.access == Access::ReadWrite)
            .filter_map(|g| in_sandbox_home(policy, &g.path)),
    );
    ll.devices.push("/dev".into());
    ll.read.sort();
    ll.read.dedup();
    plan.landlock = ll;
    Ok(plan)
}

/// A protected mount inside a writable bind stays put only if nothing above
/// it can be renamed: `mv ~/.config ~/.c2` would carry a `.config/gh`
/// stand-in away and leave the real directory unprotected on the host for
/// the next run. Every directory strictly between a writable bind and a
/// protected mount is therefore bound over itself (read-write), which makes
/// it a mount point: rename and rmdir of a mount point fail with EBUSY.
fn pins_for(ops: &[MountOp]) -> Vec<MountOp> {
    let writable: Vec<&Path> = ops
        .iter()
        .filter_map(|op| match op {
            MountOp::Bind {
                target,
                readonly: false,
                device: false,
                kind: Kind::Dir,
                ..
            } => Some(target.as_path()),
            _ => None,
        })
        .collect();
    let mut pins: Vec<PathBuf> = Vec::new();
    for op in ops {
        let protected = matches!(
            op,
            MountOp::StandIn { .. } | MountOp::Bind { readonly: true, .. }
        );
        if !protected {
            continue;
        }
        let t = op.target();
        // The deepest writable bind strictly containing the target.
        let Some(w) = writable
            .iter()
            .filter(|w| t != **w && t.starts_with(w))
            .max_by_key(|w| w.components().count())
        else {
            continue;
        };
        let mut a = t.parent();
        while let Some(dir) = a {
            if dir == *w || !dir.starts_with(w) {
                break;
            }
            let already = ops
                .iter()
                .any(|o| o.target() == dir && matches!(o, MountOp::Bind { .. }));
            if !already && !pins.iter().any(|p| p == dir) {
                pins.push(dir.to_path_buf());
            }
            a = dir.parent();
        }
    }
    pins.into_iter()
        .map(|p| host_bind(&p, Kind::Dir, true, false))
        .collect()
}

/// Where a grant under the real home also appears under the sandbox HOME.
fn in_sandbox_home(policy: &Policy, path: &Path) -> Option<PathBuf> {
    let rel = path.strip_prefix(&policy.home).ok()?;
    (!rel.as_os_str().is_empty() && policy.home != Path::new("/"))
        .then(|| Path::new(SANDBOX_HOME).join(rel))
}

fn host_bind(path: &Path, kind: Kind, recursive: bool, readonly: bool) -> MountOp {
    MountOp::Bind {
        source: path.to_path_buf(),
        target: path.to_path_buf(),
        kind,
        recursive: recursive && kind == Kind::Dir,
        readonly,
        device: false,
    }
}

/// Whether `path` shows host content in the view built by `ops`: the deepest
/// op covering it is a host bind (not a tmpfs, stand-in or moat's own mount).
pub fn visible(path: &Path, ops: &[MountOp]) -> bool {
    let mut best: Option<(usize, &MountOp)> = None;
    for op in ops {
        let t = op.target();
        if path.starts_with(t) {
            let depth = t.components().count();
            if best.map(|(d, _)| depth >= d).unwrap_or(true) {
                best = Some((depth, op));
            }
        }
    }
    matches!(best, Some((_, MountOp::Bind { device: false, .. })))
}

/// The command's environment: a safe base, then `--pass-env`, then `--env`.
fn command_env(policy: &Policy, host: &HostFacts) -> Vec<(String, String)> {
    let host_get = |k: &str| {
        host.env
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    let mut env: std::collections::BTreeMap<String, String> = Default::default();
    for (k, v) in &host.env {
        let base = SAFE_BASE_ENV.contains(&k.as_str()) || k.starts_with("LC_");
        if base && !is_secret_env_name(k) {
            env.insert(k.clone(), v.clone());
        }
    }
    env.entry("PATH".into())
        .or_insert_with(|| DEFAULT_PATH.into());
    if policy.level.is_sandboxed() {
        env.insert("HOME".into(), SANDBOX_HOME.into());
        env.insert("TMPDIR".into(), "/tmp".into());
    } else {
        env.insert("HOME".into(), policy.home.to_string_lossy().into_owned());
        if let Some(t) = host_get("TMPDIR") {
            env.insert("TMPDIR".into(), t);
        }
    }
    for k in &policy.pass_env {
        if let Some(v) = host_get(k) {
            env.insert(k.clone(), v);
        }
    }
    for (k, v) in &policy.env {
        env.insert(k.clone(), v.clone());
    }
    env.into_iter().collect()
}

#[cfg(test)]
mod tests;
