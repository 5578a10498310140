//! The process between the supervisor and the command. In a sandbox it is
//! pid 1 of the new pid namespace: it builds the view, forks the command,
//! reaps orphans, and when the command exits it kills everything left, so
//! the namespace dies with it. Under danger-full-access it is a subreaper
//! that does the same for the command's process tree on the host.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::confine::{self, Enforcement};
use crate::init_msg::{self, InitMessage, SetupStage};
use crate::mounts;
use crate::plan::Plan;
use crate::sys;
use crate::syscall::Kernel;

/// Signals the init waits for; blocked from before the clone so none is lost.
pub const INIT_SIGNALS: &[libc::c_int] = &[
    libc::SIGCHLD,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGUSR1,
    // The watch over the mounts that narrow host paths (`watch::Watch`).
    libc::SIGIO,
];

/// What the init needs, all prepared before the clone (no lookups after it).
pub struct InitArgs<'a> {
    pub plan: &'a Plan,
    pub report_fd: RawFd,
    /// Pipes for stdout/stderr when the output is captured.
    pub stdout_fd: Option<RawFd>,
    pub stderr_fd: Option<RawFd>,
    /// Socket to hand sockets made inside the sandbox to the supervisor.
    pub handoff_fd: Option<RawFd>,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub seccomp: Option<seccompiler::BpfProgram>,
    /// Resource limits set in the command before exec (lowered only).
    pub rlimits: &'a [(nix::sys::resource::Resource, u64, u64)],
    /// Give the command a pty of its own (stdin and stdout are a terminal);
    /// `Some(true)`: stderr too.
    pub pty: Option<crate::pty::Attach>,
    /// The device and inode the view's cwd must have ([`RunOptions`]'s
    /// `cwd_identity`).
    pub cwd_identity: Option<(u64, u64)>,
    /// Cloned early (`init::early_main`): the environment is wiped, the id
    /// maps and hostname are written and the root is staged already (this
    /// holds it: `mounts::stage_root`).
    pub early: Option<mounts::Staged<std::os::fd::OwnedFd>>,
}

/// Reports a failed step before exec, then leaves with moat's own exit code.
pub(crate) fn fail(fd: RawFd, stage: SetupStage, errno: i32, detail: &str) -> ! {
    init_msg::send(
        fd,
        &InitMessage::SetupFailed {
            stage,
            errno,
            detail,
        },
    );
    sys::exit_now(125);
}

/// A setup step that failed in the init: the message for the user and the
/// errno behind it (0 when the step had none to give).
struct SetupFailure {
    errno: i32,
    detail: String,
}

impl From<String> for SetupFailure {
    fn from(detail: String) -> SetupFailure {
        SetupFailure { errno: 0, detail }
    }
}

/// Entry point of the cloned child. Never returns.
pub fn main(mut args: InitArgs<'_>) -> ! {
    let fd = args.report_fd;
    let early = args.early.take();
    match setup(&args, early) {
        Ok(slave) => command_and_reap(&args, slave),
        Err(f) => fail(fd, SetupStage::Sandbox, f.errno, &f.detail),
    }
}

/// Entry point of the early init (`run::EarlyInit::start`), cloned with
/// new user and pid namespaces only. Makes the rest of its namespaces
/// (`set`), writes its id maps (`uid`, `gid`: read before the clone) and
/// hostname, stages the root (`mounts::stage_root`: the part only the
/// policy and the host's `/` decide, `ViewStart::staged_ops`), says so on `sock` (0: done, else
/// it leaves), and waits for the plan there; at the end of the socket (moat refused the run, or
/// is gone) it leaves. With the plan, it takes back `mask` (moat's cpus),
/// makes its cgroup namespace and runs [`main`]. Never returns.
pub(crate) fn early_main(
    sock: std::os::fd::OwnedFd,
    set: crate::plan::NamespaceSet,
    uid: u32,
    gid: u32,
    mask: &nix::sched::CpuSet,
) -> ! {
    use std::os::fd::{AsFd, AsRawFd};
    let first_half = (|| -> Result<mounts::Staged<std::os::fd::OwnedFd>, String> {
        // The namespaces die if the supervisor dies (and so does everything in them).
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| format!("set parent-death signal: {e}"))?;
        close_all_but(&[sock.as_raw_fd()]).map_err(|e| format!("close inherited fds: {e}"))?;
        // SAFETY: this process has one thread, and nothing in it reads its
        // environment or arguments (the command's come with the plan).
        unsafe { sys::wipe_environ_and_argv_blocks() }
            .map_err(|e| format!("clear the init's environment and command line: {e}"))?;
        sys::unshare(set.unshare_flags()).map_err(|e| format!("unshare: {e}"))?;
        mounts::set_identity_ids(&Kernel, uid, gid)?;
        crate::timing::mark("early init: namespaces, id maps, hostname");
        // In this process's own mount namespace: nothing of it reaches the
        // host. (A failure here is the serial clone's to report again.)
        // The host's top level and `/proc` are listed here, in this
        // namespace's copy of the host's mounts (the binds come from that
        // copy either way), and laid too: the plan must begin with exactly these ops, or the init
        // refuses it (`mounts::build_staged_root`), so a `/` that changed
        // between this listing and moat's probe fails the run closed.
        let start = set
            .view_start
            .staged_ops(&crate::probe::list_root(), &crate::probe::list_proc());
        mounts::stage_root(&Kernel, &start).map_err(|e| format!("stage the sandbox's root: {e}"))
    })();
    crate::timing::mark("early init: root staged");
    let word = [u8::from(first_half.is_err())];
    let staged = match first_half {
        Ok(s) if nix::unistd::write(&sock, &word) == Ok(1) => s,
        _ => sys::exit_now(125),
    };
    let Some((msg, fds)) = init_msg::recv_plan(sock.as_fd()) else {
        sys::exit_now(125);
    };
    drop(sock);
    let expected = 1 + usize::from(msg.stdout) + usize::from(msg.stderr) + usize::from(msg.handoff);
    if fds.len() != expected {
        sys::exit_now(125);
    }
    // In the message's order: the report pipe, then each fd its flag names.
    let mut fds = fds.into_iter();
    let mut next = |on: bool| if on { fds.next() } else { None };
    let Some(report) = next(true) else {
        sys::exit_now(125);
    };
    let report_fd = report.as_raw_fd();
    let (stdout, stderr, handoff) = (next(msg.stdout), next(msg.stderr), next(msg.handoff));
    if let Err(e) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), mask) {
        fail(
            report_fd,
            SetupStage::Sandbox,
            e as i32,
            "restore moat's cpu mask",
        );
    }
    // After the plan: the supervisor placed this process in the run's
    // cgroup first when it has one, so that is the namespace's root.
    if let Err(e) = sys::unshare(libc::CLONE_NEWCGROUP) {
        fail(
            report_fd,
            SetupStage::Sandbox,
            e.raw_os_error().unwrap_or(0),
            &format!("unshare the cgroup namespace: {e}"),
        );
    }
    let mut rlimits = Vec::new();
    for (code, soft, hard) in &msg.rlimits {
        match init_msg::rlimit_of(*code) {
            Some(r) => rlimits.push((r, *soft, *hard)),
            None => fail(
                report_fd,
                SetupStage::Sandbox,
                0,
                "an unknown resource limit in the plan",
            ),
        }
    }
    let seccomp = match msg.seccomp.as_deref().map(init_msg::program_of) {
        None => None,
        Some(Some(p)) => Some(p),
        Some(None) => fail(
            report_fd,
            SetupStage::Sandbox,
            0,
            "a malformed seccomp program in the plan",
        ),
    };
    // Fail closed: a sandboxed plan never runs without its filter.
    if msg.plan.sandboxed && seccomp.is_none() {
        fail(
            report_fd,
            SetupStage::Sandbox,
            0,
            "the plan came without its seccomp program",
        );
    }
    let cstrings = |v: &[Vec<u8>]| -> Option<Vec<CString>> {
        v.iter().map(|b| CString::new(b.clone()).ok()).collect()
    };
    let (Some(argv), Some(envp)) = (cstrings(&msg.argv), cstrings(&msg.envp)) else {
        fail(
            report_fd,
            SetupStage::Sandbox,
            0,
            "an argument or environment value contains a NUL byte",
        );
    };
    crate::timing::mark("early init: the plan received");
    // The fds' owners are never dropped: `main` leaves by exec or `_exit`.
    let fd_of = |f: &Option<std::os::fd::OwnedFd>| f.as_ref().map(|f| f.as_raw_fd());
    let args = InitArgs {
        plan: &msg.plan,
        report_fd,
        stdout_fd: fd_of(&stdout),
        stderr_fd: fd_of(&stderr),
        handoff_fd: fd_of(&handoff),
        argv,
        envp,
        seccomp,
        rlimits: &rlimits,
        pty: msg.pty.map(|(stdin, stdout, stderr)| crate::pty::Attach {
            stdin,
            stdout,
            stderr,
        }),
        cwd_identity: msg.cwd_identity,
        early: Some(staged),
    };
    std::mem::forget((report, stdout, stderr, handoff));
    main(args)
}

/// The init's second half, once the view is in place and the cwd entered:
/// starts the command, confined, and reaps the tree until the command is
/// done. Never returns. (A sandbox template's execution forks and confines
/// its command ahead of the request instead, see `template.rs`, and ends
/// in [`supervise_tree`] too.)
fn command_and_reap(args: &InitArgs<'_>, slave: Option<std::os::fd::OwnedFd>) -> ! {
    use std::os::fd::AsRawFd;
    let fd = args.report_fd;
    let sandboxed = args.plan.namespaces();
    let prepared = match CommandPrep::new(args, slave.as_ref().map(|s| s.as_raw_fd())) {
        Ok(p) => p,
        Err((stage, detail)) => fail(fd, stage, 0, &detail),
    };
    crate::timing::mark("init: the command's confinement and exec prepared");
    let stack = match sys::ChildStack::new(COMMAND_STACK) {
        Ok(s) => s,
        Err(e) => fail(
            fd,
            SetupStage::Fork,
            e.raw_os_error().unwrap_or(0),
            &format!("map a stack for the command's process: {e}"),
        ),
    };
    // SAFETY: the init is single-threaded (the child of a fork-like clone);
    // `command` only makes syscalls on its own stack,
    // reads `prepared` and ends in execve or _exit (see `command`).
    let main_pid = match unsafe { sys::spawn_shared_vm(&stack, command, &prepared) } {
        // The child has exec'd or exited by now: its stack is free again.
        Ok(pid) => Pid::from_raw(pid),
        Err(e) => fail(
            fd,
            SetupStage::Fork,
            e.raw_os_error().unwrap_or(0),
            &format!("start the command's process: {e}"),
        ),
    };
    drop(stack);
    drop(prepared);
    // Only the command holds the slave: its last close is the end of the
    // session for the supervisor's relay.
    drop(slave);
    // Off the launch path, while the command execs: the watch over the
    // mounts that narrow host paths.
    let watch = if sandboxed && !args.plan.landlock_only() {
        arm_watch(fd, args.plan)
    } else {
        None
    };
    supervise_tree(fd, main_pid, sandboxed, watch.as_ref())
}

/// Arms the watch over the mounts of `plan` that narrow host paths
/// ([`crate::watch::Watch::arm`] says why arming it once the command has
/// started is safe), in an init of its own pid namespace whose command has
/// started: the one-shot init, and a template execution's once the
/// execution has its request when its init could not arm it ahead
/// (`template::init_main`). Failing, the run stops: every process
/// killed and reaped, [`InitMessage::WatchFailed`] (or
/// [`InitMessage::HostReplaced`]) reported on `fd`: the command has
/// started, so this is a stopped run, never a failed setup.
pub(crate) fn arm_watch(fd: RawFd, plan: &Plan) -> Option<crate::watch::Watch> {
    use crate::watch::ArmFailure;
    let watch = match crate::watch::Watch::arm(plan) {
        Ok(w) => w,
        Err(failure) => {
            let _ = sys::kill(-1, libc::SIGKILL);
            while waitpid(None::<Pid>, None).is_ok() {}
            match failure {
                ArmFailure::Replaced(path) => host_replaced(fd, &path, None),
                ArmFailure::Failed(detail) => {
                    stopped(fd, &InitMessage::WatchFailed { detail: &detail }, None)
                }
            }
        }
    };
    crate::timing::mark("init: the watch over narrowing mounts");
    watch
}

/// The command's process's stack: what `command` needs (the report frame
/// is the largest item, 4 KiB) with a wide margin.
const COMMAND_STACK: usize = 256 * 1024;

/// Everything the command's process needs, prepared by the init: that
/// process shares the init's memory until exec, so it allocates nothing
/// and only reads this.
struct CommandPrep<'a> {
    report_fd: RawFd,
    rlimits: &'a [(nix::sys::resource::Resource, u64, u64)],
    /// The pty's slave and which stdio fds it becomes.
    terminal: Option<(RawFd, crate::pty::Attach)>,
    /// Sandboxed: capabilities dropped up to this one, then Landlock and
    /// seccomp (None: danger-full-access, nothing to confine).
    confine: Option<Confinement<'a>>,
    /// The paths execve tries, in PATH order, and the NULL-terminated
    /// argument and environment arrays (pointers into `args`).
    candidates: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

struct Confinement<'a> {
    last_cap: libc::c_ulong,
    landlock: landlock::RulesetCreated,
    seccomp: Option<&'a seccompiler::BpfProgram>,
}

impl<'a> CommandPrep<'a> {
    fn new(args: &'a InitArgs<'_>, slave: Option<RawFd>) -> Result<Self, (SetupStage, String)> {
        let terminal = slave.map(|s| {
            let attach = args.pty.unwrap_or(crate::pty::Attach {
                stdin: true,
                stdout: true,
                stderr: false,
            });
            (s, attach)
        });
        let confine = if args.plan.sandboxed {
            // The rules name the files behind the command's own stdio: the
            // slave where it will be attached, the init's fd otherwise.
            let mut stdio = [0, 1, 2];
            if let Some((s, a)) = terminal {
                for (on, slot) in [(a.stdin, 0), (a.stdout, 1), (a.stderr, 2)] {
                    if on {
                        stdio[slot] = s;
                    }
                }
            }
            let landlock =
                confine::landlock_ruleset(&args.plan.landlock, args.plan.landlock_abi, stdio)
                    .map_err(|e| (SetupStage::Confine, e.to_string()))?;
            Some(Confinement {
                last_cap: sys::last_cap(),
                landlock,
                seccomp: args.seccomp.as_ref(),
            })
        } else {
            None
        };
        let candidates = exec_candidates(&args.argv, &args.envp);
        let mut argv: Vec<*const libc::c_char> = args.argv.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> = args.envp.iter().map(|a| a.as_ptr()).collect();
        envp.push(std::ptr::null());
        Ok(CommandPrep {
            report_fd: args.report_fd,
            rlimits: args.rlimits,
            terminal,
            confine,
            candidates,
            argv,
            envp,
        })
    }
}

/// Namespace, mount and identity setup; runs with the host still reachable.
/// Returns the slave of the command's pty, when it gets one.
/// `early`: the root the early init staged (None: staged here).
fn setup(
    args: &InitArgs<'_>,
    early: Option<mounts::Staged<std::os::fd::OwnedFd>>,
) -> Result<Option<std::os::fd::OwnedFd>, SetupFailure> {
    use std::os::fd::AsRawFd;
    let plan = args.plan;
    let fd = args.report_fd;
    if early.is_some() && !plan.namespaces() {
        // The early init takes only a plan with its namespace set
        // (`EarlyInit::fits`); never run a command in a half-built root.
        return Err(
            "internal error: a staged sandbox root for a plan without namespaces"
                .to_string()
                .into(),
        );
    }
    if plan.namespaces() {
        // The namespace dies if the supervisor dies (and so does everything in it).
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| format!("set parent-death signal: {e}"))?;
    } else {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGUSR1)
            .map_err(|e| format!("set parent-death signal: {e}"))?;
        nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("become subreaper: {e}"))?;
    }
    if let Some(o) = args.stdout_fd {
        // SAFETY: fd 1 of the init is owned by no Rust object; the init and
        // the command use it only as stdout.
        unsafe { sys::dup2(o, 1) }.map_err(|e| format!("redirect stdout: {e}"))?;
    }
    if let Some(e) = args.stderr_fd {
        // SAFETY: as for fd 1.
        unsafe { sys::dup2(e, 2) }.map_err(|e| format!("redirect stderr: {e}"))?;
    }
    // Inherited descriptors are a way around every path rule: close them all,
    // keeping only stdio and the report pipe (close-on-exec), and the
    // staged scratch tmpfs (moat's own, detached; closed once the view is
    // built).
    let scratch_fd = early.as_ref().map(|s| s.scratch().as_raw_fd());
    close_all_but(
        &[Some(fd), args.handoff_fd, scratch_fd]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>(),
    )
    .map_err(|e| format!("close inherited fds: {e}"))?;
    if !plan.namespaces() {
        let mut slave = None;
        if plan.landlock_only() {
            // No private devpts without namespaces: the command's terminal
            // is a fresh pty on the host's, relayed like the namespaces one.
            slave = open_terminal(args)?;
            enter_cwd(plan, args.cwd_identity)
                .map_err(|(errno, detail)| SetupFailure { errno, detail })?;
        }
        return Ok(slave);
    }
    if early.is_none() {
        // SAFETY: the init has one thread, and nothing in it reads its
        // environment or arguments (the command's are prepared before the clone).
        unsafe { sys::wipe_environ_and_argv_blocks() }
            .map_err(|e| format!("clear the init's environment and command line: {e}"))?;
        mounts::set_identity(&Kernel, plan)?;
    }
    if let (Some(hfd), Some(_)) = (args.handoff_fd, &plan.proxy) {
        // First, so the supervisor can start serving while the view is built.
        crate::netns::create_and_send_listeners(hfd)?;
    }
    crate::timing::mark("init: fds, id maps, hostname");
    let built = match early {
        Some(staged) => mounts::build_staged_root(&Kernel, staged, &plan.mounts, plan.broker),
        None => mounts::build_root(&Kernel, &plan.mounts, plan.staged_len(), plan.broker),
    };
    let broker = built.map_err(|e| SetupFailure {
        errno: e.source.raw_os_error().unwrap_or(0),
        detail: format!("build the sandbox view: {e}"),
    })?;
    crate::timing::mark("init: mounts (the view)");
    if let (Some(hfd), Some(listener)) = (args.handoff_fd, broker) {
        crate::netns::send_fds(hfd, b'B', &[listener.as_raw_fd()])
            .map_err(|e| format!("hand the broker socket to moat: {e}"))?;
    }
    // The pty pair lives in the view's own devpts; the supervisor gets the master.
    let slave = open_terminal(args)?;
    enter_cwd(plan, args.cwd_identity).map_err(|(errno, detail)| SetupFailure { errno, detail })?;
    Ok(slave)
}

/// Opens the command's pty (in the devpts this process sees) when it gets
/// one, hands the master to the supervisor over the handoff socket and
/// closes that socket (the last thing sent over it). Returns the slave.
fn open_terminal(args: &InitArgs<'_>) -> Result<Option<std::os::fd::OwnedFd>, String> {
    use std::os::fd::AsRawFd;
    let mut slave = None;
    if let (Some(hfd), Some(_)) = (args.handoff_fd, args.pty) {
        let (master, s) = crate::pty::open_pair()
            .map_err(|e| format!("open a terminal for the command (/dev/ptmx): {e}"))?;
        // The size first, so the command never sees 0x0 (the supervisor's
        // copy may come after the command has started).
        crate::pty::copy_window_size_to(master.as_raw_fd());
        crate::netns::send_fds(hfd, b'T', &[master.as_raw_fd()])
            .map_err(|e| format!("hand the terminal to moat: {e}"))?;
        slave = Some(s);
    }
    if let Some(hfd) = args.handoff_fd {
        let _ = nix::unistd::close(hfd);
    }
    Ok(slave)
}

/// Closes every fd >= 3 except `keep`. The fds inherited from the
/// supervisor have owners in the init's copy of its memory, but the init
/// never drops them: it leaves by `_exit` or exec.
fn close_all_but(keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<u32> = keep.iter().map(|f| *f as u32).collect();
    keep.sort_unstable();
    let mut first = 3u32;
    for k in keep {
        if k >= first {
            // SAFETY: see above; the owners are never dropped or used.
            unsafe { sys::close_range(first, k.saturating_sub(1)) }?;
            first = k + 1;
        }
    }
    // SAFETY: as above.
    unsafe { sys::close_range(first, u32::MAX) }
}

/// The command's own process: confine, then exec. Never returns.
///
/// It shares the init's memory until exec (see `sys::spawn_shared_vm`):
/// only syscalls, on its own stack, reading `p`. Failures are reported
/// as a step and an errno (the supervisor renders the errno), formatted
/// nowhere here.
fn command(p: &CommandPrep<'_>) -> ! {
    crate::timing::mark("command: started from the init");
    let fd = p.report_fd;
    sys::reset_signals();
    for (resource, soft, hard) in p.rlimits {
        if let Err(e) = crate::limits::lower_rlimit(*resource, *soft, *hard) {
            fail_step(
                fd,
                SetupStage::Limits,
                crate::limits::rlimit_step(*resource),
                e as i32,
            );
        }
    }
    if let Some((slave, attach)) = p.terminal {
        if let Err(e) = crate::pty::attach_slave(slave, attach) {
            fail_step(
                fd,
                SetupStage::Terminal,
                "attach the command's terminal",
                e.raw_os_error().unwrap_or(0),
            );
        }
    }
    let mut layers = [Enforcement::None; 2];
    if let Some(c) = &p.confine {
        let r = (|| -> Result<(), confine::StepFailed> {
            confine::drop_privileges(c.last_cap)?;
            crate::timing::mark("command: drop capabilities");
            layers[0] = confine::enter_landlock(&c.landlock)?;
            crate::timing::mark("command: Landlock");
            if let Some(prog) = c.seccomp {
                layers[1] = confine::enter_seccomp(prog)?;
            }
            Ok(())
        })();
        if let Err(f) = r {
            fail_step(fd, SetupStage::Confine, f.step, f.errno);
        }
    }
    crate::timing::mark("command: seccomp");
    let _ = sys::cloexec_from(3);
    init_msg::send(
        fd,
        &InitMessage::Confined {
            landlock: layers[0],
            seccomp: layers[1],
        },
    );
    exec_first(fd, &p.candidates, &p.argv, &p.envp)
}

/// The command's confinement in a process of its own that may allocate (a
/// template's execution does this ahead of its request, see
/// `template.rs`): capabilities dropped, its Landlock domain, the seccomp
/// filter. Returns what each layer gave. (The one-shot command's process
/// does the same steps from what its init prepared, see `command`.)
pub(crate) fn confine_command(
    plan: &Plan,
    last_cap: libc::c_ulong,
    seccomp: Option<&seccompiler::BpfProgram>,
) -> Result<[Enforcement; 2], confine::ConfineError> {
    let mut layers = [Enforcement::None; 2];
    if plan.sandboxed {
        confine::drop_privileges(last_cap).map_err(confine::ConfineError::from)?;
        crate::timing::mark("command: drop capabilities");
        layers[0] = confine::apply_landlock(&plan.landlock, plan.landlock_abi)?;
        crate::timing::mark("command: Landlock");
        if let Some(p) = seccomp {
            layers[1] = confine::apply_seccomp(p)?;
        }
    }
    crate::timing::mark("command: seccomp");
    Ok(layers)
}

/// execvpe, resolved inside the view with the command's own PATH; failures
/// are reported on `fd`. For a process that may allocate (a template's
/// execution); the one-shot command's process execs from what its init
/// prepared (`command`).
pub(crate) fn exec_search(fd: RawFd, args_argv: &[CString], args_envp: &[CString]) -> ! {
    let mut argv: Vec<*const libc::c_char> = args_argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = args_envp.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    let candidates = exec_candidates(args_argv, args_envp);
    exec_first(fd, &candidates, &argv, &envp)
}

/// Tries each candidate with execve; when none execs, reports the errno
/// that decides the exit code (ENOENT: 127, else 126) and leaves.
/// Allocates nothing.
fn exec_first(
    fd: RawFd,
    candidates: &[CString],
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> ! {
    let mut saw_eacces = false;
    let mut last = libc::ENOENT;
    for c in candidates {
        // SAFETY: argv and envp are NULL-terminated arrays of pointers to C
        // strings the caller keeps alive across the call (the init's
        // `args.argv`/`args.envp` while it waits for this exec).
        let e = unsafe { sys::execve(c, argv, envp) }
            .raw_os_error()
            .unwrap_or(libc::ENOENT);
        match e {
            libc::EACCES => saw_eacces = true,
            libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG => {}
            other => {
                last = other;
                break;
            }
        }
    }
    let errno = if last != libc::ENOENT {
        last
    } else if saw_eacces {
        libc::EACCES
    } else {
        libc::ENOENT
    };
    init_msg::send(fd, &InitMessage::ExecFailed { errno });
    sys::exit_now(if errno == libc::ENOENT { 127 } else { 126 });
}

/// Reports a failed step of the command's process (no allocation: the
/// supervisor adds the errno's text) and leaves with moat's exit code.
fn fail_step(fd: RawFd, stage: SetupStage, step: &'static str, errno: i32) -> ! {
    fail(fd, stage, errno, step)
}

/// The paths execve tries for the command, as execvpe would: the name
/// itself when it has a slash, else each entry of the command's own PATH
/// (resolved inside the view). None without a command (ENOENT, 127).
fn exec_candidates(argv: &[CString], envp: &[CString]) -> Vec<CString> {
    let Some(prog) = argv.first() else {
        return Vec::new();
    };
    let prog_bytes = prog.as_bytes();
    let mut candidates: Vec<CString> = Vec::new();
    if prog_bytes.contains(&b'/') {
        candidates.push(prog.clone());
    } else {
        let path = envp
            .iter()
            .find_map(|e| e.as_bytes().strip_prefix(b"PATH="))
            .unwrap_or(b"/usr/local/bin:/usr/bin:/bin");
        for dir in path.split(|b| *b == b':') {
            let dir = if dir.is_empty() { &b"."[..] } else { dir };
            let mut full = dir.to_vec();
            full.push(b'/');
            full.extend_from_slice(prog_bytes);
            if let Ok(c) = CString::new(full) {
                candidates.push(c);
            }
        }
    }
    candidates
}

/// Waits for the command, relays signals, and tears the tree down. With
/// `watch`, a narrowing mount the host detached (see [`crate::watch`])
/// stops the run: every process killed, [`InitMessage::HostReplaced`]
/// reported in place of the exit. Never returns.
pub(crate) fn supervise_tree(
    fd: RawFd,
    main_pid: Pid,
    pid_namespace: bool,
    watch: Option<&crate::watch::Watch>,
) -> ! {
    let kill_all = |sig: libc::c_int| {
        if pid_namespace {
            // As pid 1, kill(-1) reaches every other process of the namespace.
            let _ = sys::kill(-1, sig);
        } else {
            crate::tree::signal_descendants(sig);
        }
    };
    let mut main_status: Option<(i32, i32)> = None;
    loop {
        let Ok((sig, _)) = sys::sigwait(INIT_SIGNALS) else {
            continue;
        };
        match sig {
            libc::SIGCHLD => loop {
                match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(pid, code)) if pid == main_pid => {
                        main_status = Some((code, 0))
                    }
                    Ok(WaitStatus::Signaled(pid, s, _)) if pid == main_pid => {
                        main_status = Some((128 + s as i32, s as i32))
                    }
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => {}
                }
            },
            libc::SIGTERM => kill_all(libc::SIGTERM),
            libc::SIGUSR1 => kill_all(libc::SIGKILL),
            // The watch's queue is read on every wake, below.
            libc::SIGIO => {}
            // ^C and ^\ come from the terminal, which already delivered them
            // to the command's process group; relaying would double them.
            libc::SIGINT | libc::SIGQUIT => {}
            other => {
                let _ = sys::kill(main_pid.as_raw(), other);
            }
        }
        // On every wake, not only SIGIO's: sigwait takes the lowest
        // pending signal first, so a SIGCHLD (the command's exit) or a
        // signal the command sent pid 1 can come before a pending SIGIO;
        // a replacement queued by then is still reported, never `Exited`.
        if let Some(path) = watch.and_then(|w| w.changed()) {
            kill_all(libc::SIGKILL);
            while waitpid(None::<Pid>, None).is_ok() {}
            host_replaced(fd, path, watch)
        }
        if let Some((code, signal)) = main_status {
            // The command is done: nothing it started may outlive it.
            if pid_namespace {
                kill_all(libc::SIGKILL);
            } else {
                crate::tree::kill_descendants_until_gone();
            }
            while waitpid(None::<Pid>, None).is_ok() {}
            // Every process of the run has been reaped by now: the children
            // usage covers them all (largest RSS, summed CPU time).
            let (rss_kb, cpu_ms) = children_usage();
            init_msg::send(
                fd,
                &InitMessage::Exited {
                    code,
                    signal,
                    max_rss_kb: rss_kb,
                    cpu_ms,
                },
            );
            // Every fd closed now rather than by the exit, which first
            // tears down this process's copy of moat's address space: the
            // supervisor is done at `Exited` already, but a capture pipe's
            // end and the drain after a stop come that much sooner.
            close_all_but_watch(watch);
            sys::exit_now(0);
        }
    }
}

/// Reports that the host replaced `path` (every process of the run killed
/// and reaped by now) in place of the exit, and leaves.
fn host_replaced(fd: RawFd, path: &std::path::Path, watch: Option<&crate::watch::Watch>) -> ! {
    let path = path.to_string_lossy();
    stopped(fd, &InitMessage::HostReplaced { path: &path }, watch)
}

/// Reports `msg`, why moat stopped the run (every process of the run killed
/// and reaped by now), in place of the exit, and leaves.
fn stopped(fd: RawFd, msg: &InitMessage<'_>, watch: Option<&crate::watch::Watch>) -> ! {
    init_msg::send(fd, msg);
    close_all_but_watch(watch);
    sys::exit_now(0);
}

/// Closes every fd of the init but the watch's inotify instance, which
/// the exit closes after: its release waits out an SRCU grace period, and
/// the supervisor, done at `Exited` (or, after a stop, at the end of the
/// report pipe), does not wait for the init's exit. The init leaves by `_exit` right
/// after this.
fn close_all_but_watch(watch: Option<&crate::watch::Watch>) {
    // SAFETY: the init leaves right after by `_exit`; none of the fds'
    // owners in its memory is used or dropped again.
    unsafe {
        match watch.map(|w| w.raw_fd() as u32) {
            Some(keep) => {
                let _ = sys::close_range(0, keep.saturating_sub(1));
                let _ = sys::close_range(keep + 1, u32::MAX);
            }
            None => {
                let _ = sys::close_range(0, u32::MAX);
            }
        }
    }
}

/// (largest RSS in KiB, user + system CPU ms) of every reaped descendant.
fn children_usage() -> (i64, i64) {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN) {
        Ok(u) => {
            let ms = |t: nix::sys::time::TimeVal| t.tv_sec() * 1000 + t.tv_usec() / 1000;
            (u.max_rss(), ms(u.user_time()) + ms(u.system_time()))
        }
        Err(_) => (0, 0),
    }
}

/// Enters the view's cwd, opened without following any symlink, when it is
/// the directory the caller checked (`checked`: its device and inode; a
/// template's request, or the directory `moat exec` started in when that
/// is its workspace): a rename between the check and now (by another
/// execution, in a directory it may write) cannot lead the command
/// elsewhere, as the fd compared is the one entered. Err: (errno, message).
pub(crate) fn enter_cwd(plan: &Plan, checked: Option<(u64, u64)>) -> Result<(), (i32, String)> {
    let fail = |e: std::io::Error| {
        (
            e.raw_os_error().unwrap_or(0),
            format!("enter the workspace {}: {e}", plan.cwd.display()),
        )
    };
    let dir = sys::open_dir_nofollow(&plan.cwd).map_err(fail)?;
    if let Some((dev, ino)) = checked {
        let st =
            nix::sys::stat::fstat(std::os::fd::AsFd::as_fd(&dir)).map_err(|e| fail(e.into()))?;
        if (st.st_dev, st.st_ino) != (dev, ino) {
            return Err((
                0,
                format!(
                    "the working directory {} was moved while the request was checked; nothing ran",
                    plan.cwd.display()
                ),
            ));
        }
    }
    nix::unistd::fchdir(std::os::fd::AsFd::as_fd(&dir)).map_err(|e| fail(e.into()))
}
