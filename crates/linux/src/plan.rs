//! Turns (Policy, HostFacts) into a Plan: the run's [`View`] (what the
//! sandbox sees, computed once in `view`) translated to the ordered list of
//! mounts and the Landlock rules, plus the seccomp spec (its floor as data)
//! and the command's environment. Pure: no I/O, so golden tests can assert
//! exactly what a level builds.

use std::path::{Path, PathBuf};

use moat_policy::{is_secret_env_name, Level, NetworkMode, Policy, SAFE_BASE_ENV};
use serde::{Deserialize, Serialize};

use crate::probe::{HostFacts, Kind, RootEntry, PROC_MASKED, PROC_READ_ONLY};
use crate::view::{Mode, View, Why, BUILT_BY_MOAT, SYSTEM_RUNTIME};
pub use crate::view::{SANDBOX_HOME, SANDBOX_MOAT_BIN};

/// Everything moat builds into the view (the sandbox HOME, its binary, the
/// shims and their table, the broker socket) lives under this directory.
pub const SANDBOX_MOAT_DIR: &str = "/moat";
/// Default PATH when the caller has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Device nodes bound from the host into the sandbox's /dev.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// One step of building the sandbox's root. Paths are inside the new root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MountOp {
    /// A fresh tmpfs (mode in octal), e.g. /tmp, HOME, /dev; `size` in
    /// bytes caps it (`--tmp-size`).
    Tmpfs {
        target: PathBuf,
        mode: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        size: Option<u64>,
    },
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
    /// A read-only file of moat's (a redacted copy) covering a host file,
    /// bound from the detached scratch tmpfs like a stand-in.
    Redacted { target: PathBuf, contents: String },
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
            | MountOp::Redacted { target, .. }
            | MountOp::File { target, .. } => target,
        }
    }
}

/// Landlock filesystem rules matching the view.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The paths are host paths other processes may change meanwhile (the
    /// Landlock backend): each is opened without following any symlink, and
    /// one that vanished or became a symlink gets no rule (fail closed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_paths: bool,
}

/// The seccomp filter of one run, as data: the floor every sandboxed command
/// gets, and what the network mode and a tool's net class add.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SeccompSpec {
    /// Syscalls refused outright (EPERM), by name and number.
    pub floor: Vec<(&'static str, i64)>,
    /// ioctl requests refused (EPERM), by name and number.
    pub denied_ioctls: Vec<(&'static str, u64)>,
    /// When set, socket() is refused for every address family not listed.
    pub socket_families: Option<Vec<i32>>,
    /// socket() is refused for these families (a tool's net class).
    pub denied_families: Vec<i32>,
    /// listen/accept refused (net-connect); Landlock refuses TCP binds.
    pub deny_listen: bool,
    /// Modes with set-uid/set-gid bits refused
    /// ([`crate::confine::SETID_MODE_SYSCALLS`]): every sandboxed run.
    pub deny_setid: bool,
}

/// Proxy networking: where moat's own binary appears in the view (ssh's
/// ProxyCommand runs it to reach the SOCKS endpoint).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyPlan {
    pub moat_bin: PathBuf,
}

/// Where in-sandbox tool shims live (first on PATH when a run has shims).
pub const SANDBOX_SHIMS: &str = "/moat/shims";
/// What each in-sandbox shim runs and with which net class (JSON).
pub const SANDBOX_SHIM_TABLE: &str = "/moat/shims.json";

/// The namespaces a run's init gets: decided by the policy alone, so
/// `moat exec` can build them before the host is probed (`run::EarlyInit`).
/// The one source of the clone flags and of `Plan::new_netns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceSet {
    /// A network namespace of its own (every managed network mode).
    pub new_netns: bool,
    /// The start of the view, which the early init lays before its plan.
    pub view_start: ViewStart,
}

/// The start of a namespaces plan's mounts: the fresh filesystems only the
/// policy decides (`/tmp`, `/run` when the host is shown, `/dev` with its
/// device nodes, devpts and shm, `/proc`), laid before any host path.
/// The one source of those ops ([`build`] puts them first), so the early
/// init can lay them while moat probes (`mounts::stage_root`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewStart {
    /// Not workspace-contained: the host's top level is shown, `/run` is
    /// moat's tmpfs.
    whole_host: bool,
    /// `--limit tmp_size` for `/tmp`, `/dev/shm` and HOME.
    tmp_size: Option<u64>,
    /// HOME is moat's tmpfs (not the run's private host directory).
    tmpfs_home: bool,
}

impl ViewStart {
    fn for_policy(policy: &Policy) -> ViewStart {
        ViewStart {
            whole_host: policy.level != Level::WorkspaceContained,
            tmp_size: policy.limits.tmp_size,
            tmpfs_home: policy.private_home.is_none(),
        }
    }

    fn of_plan(plan: &Plan) -> ViewStart {
        ViewStart {
            whole_host: plan.level != Level::WorkspaceContained,
            tmp_size: plan.limits.tmp_size,
            tmpfs_home: plan.mounts.iter().any(
                |op| matches!(op, MountOp::Tmpfs { target, .. } if target == Path::new(SANDBOX_HOME)),
            ),
        }
    }

    /// The ops, in plan order. None covers a host path, and none is a
    /// stand-in (the scratch tmpfs is not sealed yet when they are laid).
    pub fn ops(&self) -> Vec<MountOp> {
        let mut ops = vec![MountOp::Tmpfs {
            target: "/tmp".into(),
            mode: 0o1777,
            size: self.tmp_size,
        }];
        if self.whole_host {
            // An empty /run hides every host socket under it; at
            // workspace-contained /run is simply absent.
            ops.push(MountOp::Tmpfs {
                target: "/run".into(),
                mode: 0o755,
                size: None,
            });
        }
        ops.push(MountOp::Tmpfs {
            target: "/dev".into(),
            mode: 0o755,
            size: None,
        });
        for n in DEV_NODES {
            let p = Path::new("/dev").join(n);
            ops.push(MountOp::Bind {
                source: p.clone(),
                target: p,
                kind: Kind::File,
                recursive: false,
                readonly: false,
                device: true,
            });
        }
        ops.push(MountOp::Devpts {
            target: "/dev/pts".into(),
        });
        ops.push(MountOp::Symlink {
            target: "/dev/ptmx".into(),
            points_to: "pts/ptmx".into(),
        });
        ops.push(MountOp::Tmpfs {
            target: "/dev/shm".into(),
            mode: 0o1777,
            size: self.tmp_size,
        });
        for (name, to) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ] {
            ops.push(MountOp::Symlink {
                target: Path::new("/dev").join(name),
                points_to: to.into(),
            });
        }
        ops.push(MountOp::Proc {
            target: "/proc".into(),
        });
        ops
    }

    /// [`ViewStart::ops`], then the host's top-level entries (`root`, the
    /// probe's listing of `/`: at workspace-contained only the system
    /// runtime; a symlink as the same symlink, anything else bound
    /// read-only), `/sys` when the whole host is shown, and, when HOME is
    /// moat's tmpfs, that tmpfs and `/proc`'s read-only parts (`proc`: the
    /// probe's `/proc` entries): every op a namespaces plan begins with
    /// that only the policy and those listings decide. The one source of those ops: [`build`] starts every
    /// namespaces plan with them, and the early init lays them from its own
    /// listing before the plan comes (`init::early_main`), which the plan
    /// must then begin with exactly (`mounts::build_staged_root`).
    pub fn staged_ops(&self, root: &[RootEntry], proc: &[String]) -> Vec<MountOp> {
        let mut ops = self.ops();
        for e in root {
            if BUILT_BY_MOAT.contains(&e.name.as_str()) {
                continue;
            }
            if !self.whole_host && !SYSTEM_RUNTIME.contains(&e.name.as_str()) {
                continue;
            }
            let target = Path::new("/").join(&e.name);
            match (&e.kind, &e.link) {
                (Kind::Symlink, Some(link)) => ops.push(MountOp::Symlink {
                    target,
                    points_to: link.clone(),
                }),
                (Kind::Symlink, None) => {}
                (kind, _) => ops.push(host_bind(&target, *kind, true, true)),
            }
        }
        if self.whole_host {
            ops.push(MountOp::Bind {
                source: "/sys".into(),
                target: "/sys".into(),
                kind: Kind::Dir,
                recursive: true,
                readonly: true,
                device: false,
            });
        }
        if self.tmpfs_home {
            ops.push(MountOp::Tmpfs {
                target: SANDBOX_HOME.into(),
                mode: 0o700,
                size: self.tmp_size,
            });
            ops.extend(proc_read_only_ops(proc));
        }
        ops
    }
}

impl NamespaceSet {
    /// The set for `policy`; None outside the namespaces backend (an
    /// unsandboxed level, Landlock, and `auto`, which the host decides).
    pub fn for_policy(policy: &Policy) -> Option<NamespaceSet> {
        (policy.level.is_sandboxed() && policy.backend == moat_policy::Backend::Namespaces).then(
            || NamespaceSet {
                new_netns: Self::wants_netns(policy),
                view_start: ViewStart::for_policy(policy),
            },
        )
    }

    /// A sandboxed run gets its own network namespace unless its network
    /// is unmanaged.
    fn wants_netns(policy: &Policy) -> bool {
        policy.level.is_sandboxed() && policy.network.mode != NetworkMode::Unmanaged
    }

    /// Every namespace but the user and pid ones, which the init's clone
    /// makes: the mount, ipc, uts and (as the set says) network ones.
    pub fn unshare_flags(&self) -> libc::c_int {
        let mut f = libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
        if self.new_netns {
            f |= libc::CLONE_NEWNET;
        }
        f
    }

    /// The flags of the serial path's one clone (the cgroup namespace
    /// included: the supervisor stands in the run's cgroup for it).
    pub fn clone_flags(&self) -> libc::c_int {
        libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWCGROUP | self.unshare_flags()
    }

    /// The set of a plan already built (its backend resolved).
    pub fn of_plan(plan: &Plan) -> Option<NamespaceSet> {
        plan.namespaces().then_some(NamespaceSet {
            new_netns: plan.new_netns,
            view_start: ViewStart::of_plan(plan),
        })
    }
}

/// Everything needed to launch one run, decided before anything runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub level: Level,
    pub network: NetworkMode,
    pub sandboxed: bool,
    pub new_netns: bool,
    pub uid: u32,
    pub gid: u32,
    pub mounts: Vec<MountOp>,
    pub landlock: LandlockSpec,
    /// Not sent (an init or a template receives the compiled filter).
    #[serde(skip)]
    pub seccomp: SeccompSpec,
    pub proxy: Option<ProxyPlan>,
    /// Offer the nested-run socket inside the view.
    pub broker: bool,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// What the post-run sweep checks under each writable root
    /// (write-protected paths that did not exist before the run, new
    /// `.moat*` names, git dirs' executable parts). Not sent: the
    /// supervisor sweeps.
    #[serde(skip)]
    pub sweep: Vec<crate::sweep::SweepRoot>,
    /// What the sandbox sees; the mounts and Landlock rules translate it.
    pub view: View,
    pub landlock_abi: i32,
    /// Resource limits; the mechanism for each is chosen when the run starts.
    #[serde(default, skip_serializing_if = "moat_policy::Limits::is_unset")]
    pub limits: moat_policy::Limits,
    /// The backend that runs it (`auto` resolved): namespaces or landlock.
    pub backend: moat_policy::Backend,
}

impl Plan {
    /// The run gets its own namespaces (the namespaces backend of a sandboxed level).
    pub fn namespaces(&self) -> bool {
        self.sandboxed && self.backend == moat_policy::Backend::Namespaces
    }

    /// How many of `mounts` are its [`ViewStart`] (0 outside the namespaces
    /// backend): the part the policy alone decides.
    pub fn view_start_len(&self) -> usize {
        match NamespaceSet::of_plan(self) {
            Some(set) => {
                let start = set.view_start.ops();
                if self.mounts.starts_with(&start) {
                    start.len()
                } else {
                    0
                }
            }
            None => 0,
        }
    }

    /// How many of `mounts` an init lays before it seals its scratch tmpfs
    /// ([`ViewStart::staged_ops`]): the view's start and the run of ops
    /// right after it that lay an entry directly under `/` (the host's
    /// top level, `/sys`), HOME's tmpfs and `/proc`'s read-only parts (a
    /// private HOME's bind, never staged, ends the run). The early init
    /// lays these before its plan comes, from its own listing of `/`; the
    /// serial init stages the same count, so both make the same calls in
    /// the same order.
    pub fn staged_len(&self) -> usize {
        let start = self.view_start_len();
        if start == 0 {
            return 0;
        }
        let top_level = self.mounts[start..]
            .iter()
            .take_while(|op| match op {
                MountOp::Bind { target, .. } | MountOp::Symlink { target, .. } => {
                    target.parent() == Some(Path::new("/"))
                }
                MountOp::Tmpfs { target, .. } => target == Path::new(SANDBOX_HOME),
                MountOp::ReadOnlyAgain { target } => target.parent() == Some(Path::new("/proc")),
                _ => false,
            })
            .count();
        start + top_level
    }

    /// The run is confined by the Landlock backend alone.
    pub fn landlock_only(&self) -> bool {
        self.sandboxed && self.backend == moat_policy::Backend::Landlock
    }
}

/// Why a plan cannot be built on this host.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("Landlock is not available on this kernel (needed at --policy {0}); boot Linux >= 5.13 with Landlock in the lsm= list (e.g. lsm=landlock,lockdown,yama,integrity,apparmor), or use --policy danger-full-access to run unconfined")]
    NoLandlock(Level),
    #[error("moat is running inside another sandbox whose seccomp filter hides Landlock and forbids new namespaces (moat in moat, or a container's default profile); run moat outside it")]
    Nested,
    #[error("nested runs are not available in an execution forked from a sandbox template (moat serve/mcp's default launch): it has no nested-run broker, and its seccomp filter forbids new namespaces. Fix: start the service with --launch oneshot to run moat inside its executions")]
    NestedInTemplate,
    #[error("--network unmanaged needs Landlock ABI 6 (Linux >= 6.12) to keep host abstract unix sockets out of reach, and this kernel has ABI {0}; use --network disabled")]
    NoAbstractScoping(i32),
    #[error("the net-connect class needs Landlock ABI 4 (Linux >= 6.7) to refuse TCP binds, and this kernel has ABI {0}; use net-denied or net-listen")]
    NoTcpBindControl(i32),
    #[error("cannot find moat's own binary (needed inside the sandbox for ssh through the proxy)")]
    NoMoatBinary,
    #[error("the Landlock backend cannot give --network {0}: it gives no network at all (proxy needs a network namespace: Landlock's TCP rules match ports, not hosts, and seccomp cannot see connect()'s address; unmanaged would reach host unix sockets, such as a container engine's, that only a mount namespace hides); use --network disabled, or the namespaces backend on a host with user namespaces")]
    LandlockNetwork(NetworkMode),
    #[error("the Landlock backend needs Landlock ABI 6 (Linux >= 6.12) to keep signals and abstract unix sockets inside the run (it has no pid namespace), and this kernel has ABI {0}; use the namespaces backend on a host with user namespaces")]
    LandlockTooOld(i32),
    #[error("{0} does not exist on the host; --ro/--rw paths must exist")]
    MissingGrant(PathBuf),
    #[error("{0}")]
    WorkspaceIncomplete(String),
    #[error("{0} is write-protected (the host runs it later); no grant makes it writable. Drop the --rw (or the project file's rw entry) for it, or use --ro")]
    GrantOnWriteProtected(PathBuf),
    #[error("moat's own directory {0} is missing and could not be created, and the command could create it (it lies in a writable part of the view); create it (mkdir -p {0}) or point XDG_CONFIG_HOME/XDG_STATE_HOME outside the writable paths")]
    MoatDirUnprotected(PathBuf),
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
            .filter(|g| g.access == moat_policy::Access::ReadWrite)
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
    let view = crate::view::compute(policy, host);
    let mut plan = Plan {
        level: policy.level,
        network: policy.network.mode,
        sandboxed,
        new_netns: NamespaceSet::wants_netns(policy),
        uid: host.uid,
        gid: host.gid,
        mounts: Vec::new(),
        landlock: LandlockSpec::default(),
        seccomp: SeccompSpec {
            floor: crate::confine::SECCOMP_FLOOR.to_vec(),
            denied_ioctls: crate::confine::DENIED_IOCTLS.to_vec(),
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
            deny_setid: true,
        },
        proxy: None,
        broker: sandboxed,
        env: command_env(policy, host),
        cwd: policy.workspace.clone(),
        sweep: Vec::new(),
        view: View {
            entries: Vec::new(),
            ..view.clone()
        },
        landlock_abi: host.landlock_abi,
        limits: policy.limits.clone(),
        backend: match policy.backend {
            moat_policy::Backend::Auto if host.userns => moat_policy::Backend::Namespaces,
            moat_policy::Backend::Auto => moat_policy::Backend::Landlock,
            b => b,
        },
    };
    if !sandboxed {
        plan.view = view;
        return Ok(plan);
    }
    if host.landlock_abi < 1 && host.under_seccomp {
        // The template marks its executions (the mark only picks this
        // message; the refusal is the same).
        let in_template = host.env.iter().any(|(k, v)| {
            k == crate::template::LAUNCH_ENV && v == crate::template::LAUNCHED_FROM_TEMPLATE
        });
        return Err(if in_template {
            PlanError::NestedInTemplate
        } else {
            PlanError::Nested
        });
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
    if plan.landlock_only() {
        // No namespaces: no mounts; the Landlock rules are made from the
        // view on the host's paths when the run starts (they need listings).
        if policy.network.mode != NetworkMode::Disabled {
            return Err(PlanError::LandlockNetwork(policy.network.mode));
        }
        if host.landlock_abi < 6 {
            return Err(PlanError::LandlockTooOld(host.landlock_abi));
        }
        plan.new_netns = false;
        plan.broker = false;
        // Not even AF_UNIX: pathname sockets on the host (a container
        // engine's, the session bus) would be reachable. socketpair() stays.
        plan.seccomp.socket_families = Some(Vec::new());
        plan.sweep = sweep_roots(host, &view);
        plan.view = view;
        return Ok(plan);
    }

    let whole_host = policy.level != Level::WorkspaceContained;
    // 1. The skeleton: first what the policy alone decides (the early init
    // lays it before the plan exists), then the host's top-level entries
    // and the rest of what moat builds itself.
    let mut base = ViewStart::for_policy(policy).staged_ops(&host.root_entries, &host.proc_entries);
    // HOME is a tmpfs (staged above), or the run's private host directory
    // when the tool replaces a state file by rename (its synced copy lives
    // there); `/proc`'s read-only parts follow it.
    if let Some(dir) = &policy.private_home {
        base.push(MountOp::Bind {
            source: dir.clone(),
            target: SANDBOX_HOME.into(),
            kind: Kind::Dir,
            recursive: false,
            readonly: false,
            device: false,
        });
        base.extend(proc_read_only_ops(&host.proc_entries));
    }
    // `/proc`'s masked files: stand-ins, so never staged (they come from
    // the scratch tmpfs, sealed only once the plan's redacted copies are in).
    for n in &host.proc_entries {
        if PROC_MASKED.contains(&n.as_str()) {
            base.push(MountOp::StandIn {
                target: Path::new("/proc").join(n),
                kind: Kind::File,
            });
        }
    }
    // moat's own binary, read-only at /moat/bin/moat: ssh's ProxyCommand in
    // proxy mode, and nested `moat exec` calls (which reach the outer
    // supervisor through the broker socket) at every level.
    if host.moat_exe.is_some() {
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
            size: None,
        });
    }

    // 2. The view's host paths, stand-ins and read-only binds, as mounts.
    // The skeleton above already lays down the system and what moat builds.
    for d in &host.moat_missing {
        if view.host_mode(d).is_some_and(|x| x.mode == Mode::Write) {
            return Err(PlanError::MoatDirUnprotected(d.clone()));
        }
    }
    let mut all_ops: Vec<MountOp> = base.clone();
    for x in &view.entries {
        if matches!(x.why, Why::System | Why::Sandbox) {
            continue;
        }
        let Some(source) = &x.host else { continue };
        all_ops.push(match x.mode {
            // A git config with credentials: its redacted copy.
            Mode::Hidden => match host.redacted_files.get(source) {
                Some(contents) => MountOp::Redacted {
                    target: x.path.clone(),
                    contents: contents.clone(),
                },
                None => MountOp::StandIn {
                    target: x.path.clone(),
                    kind: x.kind,
                },
            },
            Mode::Built => continue,
            Mode::Read | Mode::Write | Mode::WriteProtected => MountOp::Bind {
                source: source.clone(),
                target: x.path.clone(),
                kind: x.kind,
                recursive: x.kind == Kind::Dir,
                readonly: x.mode != Mode::Write,
                device: false,
            },
        });
    }
    // The user's own tool configuration (~/.npmrc, pip.conf, git identity),
    // redacted by the caller, where the tools look under the sandbox HOME;
    // a grant the view already shows there wins.
    if policy.level.is_sandboxed() {
        for (rel, contents) in &host.home_config_copies {
            let target = Path::new(SANDBOX_HOME).join(rel);
            let shown = all_ops[base.len()..]
                .iter()
                .any(|op| target.starts_with(op.target()));
            if !shown {
                all_ops.push(MountOp::File {
                    target,
                    contents: contents.clone(),
                });
            }
        }
    }
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
    // The sweep checks the writable roots the probe recorded (the workspace
    // at the writable levels, writable grants at any level, homes inside
    // them), as far as this view shows them writable.
    plan.sweep = sweep_roots(host, &view);

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
        // Every moat-built path is readable at every level: a shimmed tool
        // reads /moat/shims.json, and /moat/bin holds moat itself.
        ll.read
            .extend(["/proc".into(), "/tmp".into(), SANDBOX_MOAT_DIR.into()]);
    }
    ll.write
        .extend(["/tmp".into(), SANDBOX_HOME.into(), "/dev/shm".into()]);
    for w in view.writable() {
        if !ll.write.iter().any(|x| x == w) {
            ll.write.push(w.to_path_buf());
        }
    }
    ll.devices.push("/dev".into());
    ll.read.sort();
    ll.read.dedup();
    plan.landlock = ll;
    plan.view = view;
    Ok(plan)
}

/// The writable roots the probe recorded (the workspace at the writable
/// levels, writable grants at any level, homes inside them), as far as this
/// view shows them writable: the sweep checks them after the run.
fn sweep_roots(host: &HostFacts, view: &View) -> Vec<crate::sweep::SweepRoot> {
    host.sweep
        .iter()
        .filter(|s| {
            view.host_mode(&s.root)
                .is_some_and(|x| x.mode == Mode::Write)
        })
        .cloned()
        .collect()
}

/// A protected mount inside a writable bind stays put only if nothing above
/// it can be renamed: `mv ~/.config ~/.c2` would carry a `.config/gh`
/// stand-in away and leave the real directory unprotected on the host for
/// the next run. Every directory strictly between a writable bind and a
/// protected mount is therefore bound over itself (read-write), which makes
/// it a mount point: rename and rmdir of a mount point fail with EBUSY.
fn pins_for(ops: &[MountOp]) -> Vec<MountOp> {
    // (target, host source) of every writable directory bind.
    let writable: Vec<(&Path, &Path)> = ops
        .iter()
        .filter_map(|op| match op {
            MountOp::Bind {
                source,
                target,
                readonly: false,
                device: false,
                kind: Kind::Dir,
                ..
            } => Some((target.as_path(), source.as_path())),
            _ => None,
        })
        // A private HOME directory is thrown away after the run: nothing in
        // it protects a later run, and its parts need not exist on the host.
        .filter(|(t, _)| *t != Path::new(SANDBOX_HOME))
        .collect();
    let mut pins: Vec<(PathBuf, PathBuf)> = Vec::new();
    for op in ops {
        let protected = matches!(
            op,
            MountOp::StandIn { .. }
                | MountOp::Redacted { .. }
                | MountOp::Bind { readonly: true, .. }
        );
        if !protected {
            continue;
        }
        let t = op.target();
        // The deepest writable bind strictly containing the target.
        let Some((w, source)) = writable
            .iter()
            .filter(|(w, _)| t != *w && t.starts_with(w))
            .max_by_key(|(w, _)| w.components().count())
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
            if !already && !pins.iter().any(|(p, _)| p == dir) {
                // A pin under a mirrored grant binds the host directory the
                // mirror shows there.
                let host = match dir.strip_prefix(w) {
                    Ok(rel) => source.join(rel),
                    Err(_) => dir.to_path_buf(),
                };
                pins.push((dir.to_path_buf(), host));
            }
            a = dir.parent();
        }
    }
    pins.into_iter()
        .map(|(target, source)| MountOp::Bind {
            source,
            target,
            kind: Kind::Dir,
            recursive: true,
            readonly: false,
            device: false,
        })
        .collect()
}

/// `/proc`'s read-only parts among `proc` (the probe's `/proc` entries),
/// each bound over itself read-only, in `proc`'s order.
fn proc_read_only_ops(proc: &[String]) -> impl Iterator<Item = MountOp> + '_ {
    proc.iter()
        .filter(|n| PROC_READ_ONLY.contains(&n.as_str()))
        .map(|n| MountOp::ReadOnlyAgain {
            target: Path::new("/proc").join(n),
        })
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
    // The user's tool configuration (PIP_INDEX_URL, NPM_CONFIG_REGISTRY,
    // GIT_AUTHOR_NAME…), never a credential in it.
    for (k, v) in &host.env {
        if let Some(v) = moat_policy::tool_config_env(k, v) {
            env.insert(k.clone(), v);
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
