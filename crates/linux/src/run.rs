//! The supervisor: stays in the host namespaces, launches the init, relays
//! signals, enforces the timeout, captures output, and turns what happened
//! into a [`RunOutcome`]. It is the only moat process that could widen
//! anything, and it runs no untrusted code.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use serde::Serialize;

use crate::confine::{self, Enforcement};
use crate::control::{Control, Request};
use crate::init::{self, InitArgs, INIT_SIGNALS};
use crate::init_msg::{self, InitMessage};
use crate::limits::{Applied, Enforcer, LimitFacts, ResourceUsage, TerminationReason};
use crate::plan::{NamespaceSet, Plan};
use crate::sys::{self, Forked};

/// Grace between SIGTERM and SIGKILL when a run is stopped.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// Where the command's stdout and stderr go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputMode {
    /// Straight through to moat's own stdout/stderr (a terminal stays a
    /// terminal). When stderr is not a terminal it is relayed through a pipe
    /// so moat can read refusals back from it; the bytes are unchanged.
    #[default]
    Passthrough,
    /// Both streams captured, up to `limit` bytes each.
    Capture { limit: usize },
    /// Every chunk handed to the observer as it arrives; nothing buffered.
    Stream,
}

/// Which output stream a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Hooks a caller can use to follow a run while it happens.
pub trait RunObserver {
    /// The command is about to exec; `pid` is its host pid when known.
    fn started(&mut self, _pid: Option<i32>) {}
    /// A chunk of output (only in [`OutputMode::Stream`]).
    fn output(&mut self, _stream: Stream, _offset: u64, _data: &[u8]) {}
    /// Whether the consumer of [`RunObserver::output`] is behind (its
    /// reader stopped reading). While it is, the supervisor stops reading
    /// the command's output (the command blocks as on a full pipe) and
    /// keeps enforcing the timeout and stop requests: `output` must never
    /// block on the reader.
    fn output_backlog(&self) -> bool {
        false
    }
    /// The proxy endpoints created inside the sandbox's network namespace
    /// (only when the plan has a proxy); the observer serves them.
    fn proxy_listeners(&mut self, _http: std::net::TcpListener, _socks: std::net::TcpListener) {}
    /// A nested `moat exec` connected to the sandbox's broker socket. An
    /// observer that does not serve nested runs drops it (the caller sees
    /// the connection close and fails closed).
    fn broker_connection(&mut self, _conn: std::os::unix::net::UnixStream) {}
}

/// An observer that ignores everything.
pub struct NoObserver;
impl RunObserver for NoObserver {}

/// How to run the command.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub argv: Vec<OsString>,
    pub output: OutputMode,
    pub timeout: Option<Duration>,
    /// Names this run in quarantined paths (the execution id).
    pub tag: String,
    /// The stdio fds come from an outer run's sandbox (a nested run): a
    /// terminal among them is that sandbox's own pty, not the host's, and
    /// passes through as it is (its foreground is the outer command's); and
    /// what moat says goes back into that sandbox, so no message may be
    /// based on looking at the host.
    pub stdio_from_outer_sandbox: bool,
    /// The device and inode of the directory the command must start in
    /// (the workspace as checked: the directory `moat exec` itself started
    /// in, which `moat serve` enters by fd): the init opens the view's cwd
    /// without symlinks, compares, and enters that fd, so a rename between
    /// the policy's resolution and the view fails the run instead of
    /// starting the command in whatever has the name now.
    pub cwd_identity: Option<(u64, u64)>,
}

/// How much of stderr is kept for reading refusals back.
const STDERR_TAIL: usize = 256 * 1024;

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Finished,
    FailedToStart,
    TimedOut,
}

/// The enforcement layers that were in place when the command started.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Layers {
    pub namespaces: Enforcement,
    pub landlock: Enforcement,
    pub seccomp: Enforcement,
}

/// Everything a caller needs to report a run.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub status: RunStatus,
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration: Duration,
    pub layers: Layers,
    /// Why moat refused or failed (exit 125), or why exec failed (126/127).
    pub error: Option<String>,
    /// What the sweep neutralised after the run (write-protected paths the
    /// command created, keys it put in a new git config…).
    pub swept: Vec<crate::sweep::Swept>,
    /// Paths the sweep could not neutralise: still live on the host.
    pub sweep_failed: Vec<crate::sweep::SweepFailure>,
    /// The last bytes of stderr that moat saw (empty when stderr went to a
    /// terminal directly), for reading refusals back.
    pub stderr_tail: Vec<u8>,
    /// Which limit ended the run, or how else it ended (None: it never started).
    pub termination_reason: Option<TerminationReason>,
    /// What the run used.
    pub usage: ResourceUsage,
    /// Each resource limit and the mechanism that enforced it.
    pub limits: Vec<Applied>,
    /// The backend that ran it: `namespaces`, `landlock`, or `none`
    /// (danger-full-access).
    pub backend: &'static str,
    /// What the backend could not give (the Landlock backend's list).
    pub not_given: Vec<&'static str>,
    /// How the sandbox was launched: `oneshot` (built for this run by
    /// [`run`]) or `template` (forked from a pre-built one).
    pub launch: &'static str,
}

/// Limits reached while the run was under way.
#[derive(Clone, Copy, Debug, Default)]
struct Reached {
    output: bool,
    memory: bool,
    pids: bool,
}

/// What is left of the output budget (`--output-limit`).
#[derive(Clone, Copy, Debug, Default)]
struct Budget {
    left: Option<u64>,
    exceeded: bool,
}

impl RunOutcome {
    /// A run that moat refused before anything started (exit 125).
    pub fn refused(error: String) -> RunOutcome {
        RunOutcome {
            status: RunStatus::FailedToStart,
            exit_code: 125,
            signal: None,
            timed_out: false,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration: Duration::ZERO,
            layers: Layers {
                namespaces: Enforcement::None,
                landlock: Enforcement::None,
                seccomp: Enforcement::None,
            },
            error: Some(error),
            swept: Vec::new(),
            sweep_failed: Vec::new(),
            stderr_tail: Vec::new(),
            termination_reason: None,
            usage: ResourceUsage::default(),
            limits: Vec::new(),
            backend: "none",
            not_given: Vec::new(),
            launch: "oneshot",
        }
    }
}

pub(crate) struct Capture {
    fd: OwnedFd,
    stream: Stream,
    /// Captured bytes (Capture mode only).
    buf: Vec<u8>,
    limit: usize,
    truncated: bool,
    offset: u64,
    /// Relay every chunk to this fd of ours (Passthrough of a non-tty stderr).
    relay: Option<i32>,
    /// Keep a tail for reading refusals back (stderr).
    tail: bool,
    open: bool,
    /// The thread that writes the relayed bytes (started on the first).
    writer: Option<RelayWriter>,
    /// A relayed chunk the writer had no room for yet: while one waits,
    /// the command's pipe is not read.
    pending: Option<Vec<u8>>,
}

/// Chunks a relay may queue for its writer before the supervisor stops
/// reading the command's pipe (each up to 64 KiB).
const RELAY_QUEUE: usize = 16;

/// Writes relayed output to one of moat's own descriptors on a thread of
/// its own, so a reader that stops reading blocks that thread, never the
/// supervisor (which must still enforce the timeout and stop requests).
/// moat's stdout/stderr are shared open files: making them non-blocking
/// would change them for every other process holding them, so the write
/// stays blocking, off the supervisor's thread.
struct RelayWriter {
    tx: std::sync::mpsc::SyncSender<Vec<u8>>,
    /// Bytes written so far: tells a slow reader from a stalled one.
    written: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Disconnected once the thread has written everything and ended.
    done: std::sync::mpsc::Receiver<()>,
}

impl RelayWriter {
    fn start(fd: i32) -> RelayWriter {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(RELAY_QUEUE);
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let count = written.clone();
        std::thread::spawn(move || {
            let _done = done_tx;
            for chunk in rx {
                sys::write_all_fd(fd, &chunk);
                count.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
        });
        RelayWriter { tx, written, done }
    }

    /// Queue a chunk; hands it back when the queue is full.
    fn offer(&self, chunk: Vec<u8>) -> Option<Vec<u8>> {
        match self.tx.try_send(chunk) {
            Ok(()) => None,
            Err(std::sync::mpsc::TrySendError::Full(c)) => Some(c),
            // The thread is gone (cannot happen while tx lives): drop it.
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => None,
        }
    }

    /// Let the thread write what is queued (and `rest`). A run that ended
    /// normally waits for its reader however slow, as any filter would; a
    /// run that was stopped (timeout, stop request, limit) gives up once
    /// the reader made no progress for [`KILL_GRACE`], so moat exits.
    fn finish(self, rest: Option<Vec<u8>>, bounded: bool) {
        let RelayWriter { tx, written, done } = self;
        let mut rest = rest;
        let mut last = (
            written.load(std::sync::atomic::Ordering::Relaxed),
            Instant::now(),
        );
        let tick = Duration::from_millis(20);
        loop {
            if let Some(chunk) = rest.take() {
                if let Err(std::sync::mpsc::TrySendError::Full(c)) = tx.try_send(chunk) {
                    rest = Some(c);
                }
            }
            if rest.is_none() {
                break;
            }
            if bounded && !progressed(&written, &mut last) {
                return;
            }
            std::thread::sleep(tick);
        }
        drop(tx);
        loop {
            match done.recv_timeout(tick) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if bounded && !progressed(&written, &mut last) {
                        return;
                    }
                }
                _ => return,
            }
        }
    }
}

/// Whether the writer wrote anything in the last [`KILL_GRACE`].
fn progressed(written: &std::sync::atomic::AtomicU64, last: &mut (u64, Instant)) -> bool {
    let now = written.load(std::sync::atomic::Ordering::Relaxed);
    if now != last.0 {
        *last = (now, Instant::now());
    }
    last.1.elapsed() < KILL_GRACE
}

impl Capture {
    /// Hand a waiting chunk to the writer again; then whether the pipe may
    /// be read now (not while a chunk waits, nor while the observer that
    /// takes this stream is behind: `paused`).
    fn readable(&mut self, paused: bool) -> bool {
        if let (Some(chunk), Some(w)) = (self.pending.take(), &self.writer) {
            self.pending = w.offer(chunk);
        }
        let streamed = self.relay.is_none() && self.limit == 0;
        self.open && self.pending.is_none() && !(paused && streamed)
    }

    /// After the run: wait until the writer takes the waiting chunk
    /// (bounded as in [`RelayWriter::finish`]); whether it did.
    fn wait_room(&mut self, bounded: bool) -> bool {
        let Some(w) = &self.writer else {
            self.pending = None;
            return true;
        };
        let mut last = (
            w.written.load(std::sync::atomic::Ordering::Relaxed),
            Instant::now(),
        );
        while let Some(chunk) = self.pending.take() {
            self.pending = w.offer(chunk);
            if self.pending.is_some() {
                if bounded && !progressed(&w.written, &mut last) {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        true
    }

    fn read_some(
        &mut self,
        observer: &mut dyn RunObserver,
        tail: &mut Vec<u8>,
        budget: &mut Budget,
    ) {
        if self.pending.is_some() {
            return;
        }
        let mut chunk = [0u8; 65536];
        match nix::unistd::read(&self.fd, &mut chunk) {
            Ok(0) => self.open = false,
            Ok(read) => {
                // Past the output limit nothing more is passed on.
                let n = match &mut budget.left {
                    Some(left) => {
                        let n = read.min(usize::try_from(*left).unwrap_or(usize::MAX));
                        *left -= n as u64;
                        if n < read {
                            budget.exceeded = true;
                        }
                        n
                    }
                    None => read,
                };
                if n == 0 {
                    return;
                }
                let data = &chunk[..n];
                if let Some(fd) = self.relay {
                    let writer = self.writer.get_or_insert_with(|| RelayWriter::start(fd));
                    self.pending = writer.offer(data.to_vec());
                }
                if self.limit > 0 {
                    let room = self.limit.saturating_sub(self.buf.len());
                    if n > room {
                        self.truncated = true;
                    }
                    self.buf.extend_from_slice(&data[..n.min(room)]);
                } else if self.relay.is_none() {
                    observer.output(self.stream, self.offset, data);
                }
                if self.tail {
                    tail.extend_from_slice(data);
                    if tail.len() > 2 * STDERR_TAIL {
                        tail.drain(..tail.len() - STDERR_TAIL);
                    }
                }
                self.offset += n as u64;
            }
            Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(_) => self.open = false,
        }
    }
}

/// One pipe per wanted stream: the read ends become captures, the write
/// ends the command's stdout/stderr.
pub(crate) fn capture_pipes(
    wanted: &[(Stream, usize, Option<i32>)],
    captures: &mut Vec<Capture>,
    stdout_end: &mut Option<OwnedFd>,
    stderr_end: &mut Option<OwnedFd>,
) -> Result<(), String> {
    for (stream, limit, relay) in wanted.iter().copied() {
        let (r, w) = pipe().map_err(|e| format!("create a pipe: {e}"))?;
        captures.push(Capture {
            fd: r,
            stream,
            buf: Vec::new(),
            limit,
            truncated: false,
            offset: 0,
            relay,
            tail: stream == Stream::Stderr,
            open: true,
            writer: None,
            pending: None,
        });
        match stream {
            Stream::Stdout => *stdout_end = Some(w),
            Stream::Stderr => *stderr_end = Some(w),
        }
    }
    Ok(())
}

pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| io::Error::from_raw_os_error(e as i32))
}

/// The channel the init and the command's process report on (read end,
/// write end): a unix stream socket whose read end has `SO_PASSCRED`, so
/// every read carries its writer's pid as the kernel fixed it at the write,
/// in moat's pid namespace. The command's process reports `Confined` just
/// before its exec; its host pid is known from that report even when the
/// command has exited and been reaped before the supervisor reads it (a
/// look at the init's children at that moment finds none: `/bin/true`
/// under load).
pub(crate) fn report_channel() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{setsockopt, socketpair, sockopt, AddressFamily, SockFlag, SockType};
    let errno = |e: nix::errno::Errno| io::Error::from_raw_os_error(e as i32);
    let (r, w) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(errno)?;
    setsockopt(&r, sockopt::PassCred, &true).map_err(errno)?;
    // The supervisor only reads, the init and the command only write.
    nix::sys::socket::shutdown(r.as_raw_fd(), nix::sys::socket::Shutdown::Write).map_err(errno)?;
    nix::sys::socket::shutdown(w.as_raw_fd(), nix::sys::socket::Shutdown::Read).map_err(errno)?;
    Ok((r, w))
}

pub(crate) fn clone_error(e: io::Error, plan: &Plan) -> String {
    let code = e.raw_os_error().unwrap_or(0);
    if !plan.sandboxed {
        return format!("cannot start the command's reaper: {e}");
    }
    let limit = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").unwrap_or_default();
    let userns_sysctl =
        std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone").unwrap_or_default();
    let apparmor =
        std::fs::read_to_string("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
            .unwrap_or_default();
    let fix = if limit.trim() == "0" {
        "user.max_user_namespaces is 0; raise it: sysctl -w user.max_user_namespaces=15000"
            .to_string()
    } else if userns_sysctl.trim() == "0" {
        "unprivileged user namespaces are disabled; enable them: sysctl -w kernel.unprivileged_userns_clone=1".to_string()
    } else if apparmor.trim() == "1" {
        "AppArmor restricts unprivileged user namespaces; allow moat with an AppArmor profile granting `userns,` or set kernel.apparmor_restrict_unprivileged_userns=0".to_string()
    } else if code == libc::EPERM && crate::probe::under_seccomp() {
        "moat is itself running under a seccomp filter that forbids new namespaces (inside another sandbox, e.g. moat in moat, or a container's default profile); run it outside, or relax that filter".to_string()
    } else if code == libc::EPERM {
        "the kernel refused (EPERM); inside a container, run it with --security-opt seccomp=unconfined --security-opt apparmor=unconfined or --privileged".to_string()
    } else {
        "check that the kernel has user, mount, pid, ipc, uts and net namespaces enabled"
            .to_string()
    };
    format!(
        "cannot create the sandbox namespaces (user, mount, pid, ipc, uts{}): {e}. Fix: {fix}. Or run without namespaces: --backend landlock (Landlock and seccomp only; no private /tmp, HOME or pid namespace, no network; see README)",
        if plan.new_netns { ", net" } else { "" }
    )
}

/// Runs the command under `plan`, stopped by this process's own signals
/// (one run per process: `moat exec`). Errors here are moat's own failures
/// before the command could start; they map to exit 125.
pub fn run(plan: &Plan, opts: &RunOptions, observer: &mut dyn RunObserver) -> RunOutcome {
    run_with(plan, opts, observer, Control::ProcessSignals)
}

/// [`run`], with the stop, hang-up and resize requests taken from `control`
/// (a service passes each execution its own channel).
pub fn run_with(
    plan: &Plan,
    opts: &RunOptions,
    observer: &mut dyn RunObserver,
    control: Control<'_>,
) -> RunOutcome {
    run_early(plan, opts, observer, control, None)
}

/// [`run_with`], handed the init `moat exec` cloned before it probed the
/// host ([`EarlyInit`]): the plan goes to that init instead of a clone
/// when the plan fits it; otherwise it is killed and the launch is the
/// serial one.
pub fn run_early(
    plan: &Plan,
    opts: &RunOptions,
    observer: &mut dyn RunObserver,
    control: Control<'_>,
    early: Option<EarlyInit>,
) -> RunOutcome {
    let start = Instant::now();
    // The Landlock backend: a per-run scratch directory (TMPDIR and HOME)
    // and the rules made from the view on the host's paths.
    let landlock_plan;
    let mut scratch = None;
    let plan = if plan.landlock_only() {
        let own_tty = own_terminal(plan, opts, plan.limits.output.is_some()).is_some();
        match crate::backend::prepare(plan, &opts.tag, own_tty) {
            Ok((p, dir)) => {
                scratch = Some(dir);
                landlock_plan = p;
                &landlock_plan
            }
            Err(e) => {
                let mut out = RunOutcome::refused(e);
                out.backend = "landlock";
                return out;
            }
        }
    } else {
        plan
    };
    let mut out = RunOutcome::refused(String::new());
    out.error = None;
    if plan.namespaces() {
        out.backend = "namespaces";
    } else if plan.landlock_only() {
        out.backend = "landlock";
        out.not_given = crate::backend::NOT_GIVEN.to_vec();
    }
    if !plan.namespaces() {
        // Without a pid namespace the command could kill its reaper (same
        // uid, no confinement): moat itself adopts whatever is orphaned
        // then, and kills it below.
        let _ = nix::sys::prctl::set_child_subreaper(true);
    }
    let enforcer = if plan.limits.is_unset() {
        Ok(Enforcer::default())
    } else {
        crate::limits::prepare(
            &plan.limits,
            // Private tmpfs and a user namespace of its own: namespaces only.
            plan.namespaces(),
            &LimitFacts::probe(),
            &opts.tag,
        )
    };
    match &enforcer {
        Ok(e) => {
            out.limits = e.applied.clone();
            if let Err(e) = launch(plan, opts, &mut out, start, observer, e, control, early) {
                out.status = RunStatus::FailedToStart;
                out.exit_code = 125;
                out.error = Some(e);
            }
        }
        Err(e) => out.error = Some(e.clone()),
    }
    if !plan.namespaces() {
        crate::tree::kill_descendants_until_gone();
    }
    out.duration = start.elapsed();
    out.usage.duration_ms = out.duration.as_millis() as u64;
    if let Some(dir) = &scratch {
        if let Err(e) = std::fs::remove_dir_all(dir) {
            out.error.get_or_insert(format!(
                "remove the run's scratch directory {}: {e}",
                dir.display()
            ));
        }
    }
    if let Some(cg) = enforcer.as_ref().ok().and_then(|e| e.cgroup.as_ref()) {
        if let Err(e) = cg.remove() {
            // The run happened; the leftover is moat's failure to report.
            out.error.get_or_insert(e);
        }
    }
    crate::timing::mark("supervise until the init is gone");
    // Every process of the command is gone (the pid namespace died with
    // its init), so nothing races the sweep.
    let report = crate::sweep::sweep(&plan.sweep, &opts.tag);
    crate::timing::mark("sweep");
    out.swept = report.swept;
    out.sweep_failed = report.failed;
    out
}

pub(crate) fn cstrings(items: impl IntoIterator<Item = Vec<u8>>) -> Result<Vec<CString>, String> {
    items
        .into_iter()
        .map(|b| {
            CString::new(b)
                .map_err(|_| "an argument or environment value contains a NUL byte".to_string())
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn launch(
    plan: &Plan,
    opts: &RunOptions,
    out: &mut RunOutcome,
    start: Instant,
    observer: &mut dyn RunObserver,
    enforcer: &Enforcer,
    control: Control<'_>,
    early: Option<EarlyInit>,
) -> Result<(), String> {
    // The early init takes this plan only when it was built for exactly
    // it; anything else kills it here (its Drop) and clones serially.
    let early = early.filter(|e| e.fits(plan, enforcer));
    if opts.argv.is_empty() {
        return Err("no command given; put it after --".into());
    }
    let argv = cstrings(opts.argv.iter().map(|a| a.as_bytes().to_vec()))?;
    let envp = cstrings(
        plan.env
            .iter()
            .map(|(k, v)| format!("{k}={v}").into_bytes()),
    )?;
    let seccomp = if plan.sandboxed {
        Some(
            confine::seccomp_filter(&plan.seccomp)
                .map_err(|e| format!("build the seccomp filter: {e}"))?,
        )
    } else {
        None
    };
    let (report_r, report_w) =
        report_channel().map_err(|e| format!("create the init's report channel: {e}"))?;
    let mut captures = Vec::new();
    let (mut stdout_end, mut stderr_end) = (None, None);
    let stderr_is_tty = nix::unistd::isatty(std::io::stderr()).unwrap_or(false);
    // An interactive run: the command gets a terminal of its own inside the
    // sandbox. Every host terminal among moat's stdio is replaced (see
    // pty::Attach): none enters the sandbox, foreground or not.
    let pty = own_terminal(plan, opts, enforcer.output.is_some());
    let wanted: &[(Stream, usize, Option<i32>)] = match opts.output {
        // An output limit needs every byte to pass through moat to be counted.
        OutputMode::Passthrough if enforcer.output.is_some() => {
            &[(Stream::Stdout, 0, Some(1)), (Stream::Stderr, 0, Some(2))]
        }
        OutputMode::Passthrough if stderr_is_tty => &[],
        OutputMode::Passthrough => &[(Stream::Stderr, 0, Some(2))],
        OutputMode::Capture { limit } => {
            &[(Stream::Stdout, limit, None), (Stream::Stderr, limit, None)]
        }
        OutputMode::Stream => &[(Stream::Stdout, 0, None), (Stream::Stderr, 0, None)],
    };
    capture_pipes(wanted, &mut captures, &mut stdout_end, &mut stderr_end)?;
    // The init hands sockets it creates inside the sandbox (the proxy's
    // listeners, the broker's) and the command's pty master back over this
    // pair.
    let (handoff_rx, handoff_tx) = if plan.namespaces() || pty.is_some() {
        let (a, b) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| format!("create a socket pair: {e}"))?;
        (Some(a), Some(b))
    } else {
        (None, None)
    };
    // Block the signals we read through a signalfd (and the init waits for)
    // before the clone, so none arrives in a window without a handler.
    let old_mask = sys::set_sigmask(libc::SIG_BLOCK, INIT_SIGNALS)
        .map_err(|e| format!("block signals: {e}"))?;
    let ns_flags = NamespaceSet::of_plan(plan).map_or(0, |s| s.clone_flags());
    crate::timing::mark("seccomp filter, pipes, signal mask");
    // The plan goes to the early init before its word that its half
    // (namespaces, id maps, staged root) went through: it waits in the
    // socket while the init finishes, which then reads it without a sleep
    // and a wake-up on either side. The init writes that word before it
    // reads anything, so a word other than "done" means it never read the
    // plan: it is killed (its `Drop`) and the serial clone below gives
    // today's error; a send that failed then is that init's end, not the
    // run's.
    let early = match early {
        Some(mut e) => {
            let sent = e.send_plan(
                plan,
                &argv,
                &envp,
                seccomp.as_ref(),
                &enforcer.rlimits,
                pty,
                opts.cwd_identity,
                [
                    Some(report_w.as_fd()),
                    stdout_end.as_ref().map(|f| f.as_fd()),
                    stderr_end.as_ref().map(|f| f.as_fd()),
                    handoff_tx.as_ref().map(|s| s.as_fd()),
                ],
            );
            if e.ready() {
                if let Err(err) = sent {
                    sys::restore_sigmask(&old_mask);
                    return Err(err);
                }
                crate::timing::mark("the plan sent to the early init");
                Some(e.handed())
            } else {
                None
            }
        }
        None => None,
    };
    // The init is cloned inside the run's cgroup (the supervisor steps in
    // for the clone and back out right after), so nothing it starts escapes.
    if let Some(cg) = &enforcer.cgroup {
        if let Err(e) = cg.enter() {
            sys::restore_sigmask(&old_mask);
            let _ = cg.leave();
            return Err(e);
        }
    }
    let child = if let Some(pid) = early {
        pid
    } else {
        if let Err(e) = check_single_threaded() {
            sys::restore_sigmask(&old_mask);
            if let Some(cg) = &enforcer.cgroup {
                let _ = cg.leave();
            }
            return Err(e);
        }
        // SAFETY: every caller runs this from a single-threaded process, so the
        // init may run ordinary code: `moat exec`'s supervisor (the proxy's
        // threads start after the clone, when the init hands its listeners
        // over), the service's per-execution supervisor processes, and
        // `capabilities::report`, which runs each level in a forked child for
        // the sake of `moat serve`/`moat mcp`. A caller with threads must do
        // the same (see `sys::clone_process`).
        let cloned = unsafe { sys::clone_process(ns_flags) };
        if let (Some(cg), Ok(Forked::Parent(_))) = (&enforcer.cgroup, &cloned) {
            if let Err(e) = cg.leave() {
                // The supervisor would stay in the run's limits: better to stop.
                eprintln!("moat: {e}");
            }
        }
        match cloned {
            Ok(Forked::Child) => init::main(InitArgs {
                plan,
                report_fd: report_w.as_raw_fd(),
                stdout_fd: stdout_end.as_ref().map(|f| f.as_raw_fd()),
                stderr_fd: stderr_end.as_ref().map(|f| f.as_raw_fd()),
                handoff_fd: handoff_tx.as_ref().map(|s| s.as_raw_fd()),
                argv,
                envp,
                seccomp,
                rlimits: &enforcer.rlimits,
                pty,
                cwd_identity: opts.cwd_identity,
                early: None,
            }),
            Ok(Forked::Parent(pid)) => {
                crate::timing::mark("clone the init (new namespaces)");
                Pid::from_raw(pid)
            }
            Err(e) => {
                sys::restore_sigmask(&old_mask);
                if let Some(cg) = &enforcer.cgroup {
                    let _ = cg.leave();
                }
                return Err(clone_error(e, plan));
            }
        }
    };
    drop(report_w);
    drop(stdout_end);
    drop(stderr_end);
    drop(handoff_tx);
    if plan.namespaces() {
        out.layers.namespaces = Enforcement::Full;
    }
    let result = supervise(
        InitHandle::Child(child),
        plan,
        opts,
        out,
        captures,
        report_r,
        handoff_rx,
        start,
        observer,
        enforcer,
        control,
    );
    sys::restore_sigmask(&old_mask);
    result
}

/// Which of moat's stdio fds the command gets the sandbox's own pty on:
/// every host terminal among them in a sandboxed run (only stdin when
/// moat captures the output), see `pty::Attach`.
fn own_terminal(
    plan: &Plan,
    opts: &RunOptions,
    output_limited: bool,
) -> Option<crate::pty::Attach> {
    // Both sandboxed backends: a pty needs no namespaces (the Landlock
    // backend's is on the host's devpts).
    if !(plan.namespaces() || plan.landlock_only()) || opts.stdio_from_outer_sandbox {
        return None;
    }
    let tty = crate::pty::Attach::of_stdio()?;
    let attach = if opts.output == OutputMode::Passthrough && !output_limited {
        tty
    } else {
        // Output is captured (--json, --events) or counted (an output
        // limit: every byte must pass through moat's pipes); a terminal on
        // stdin is still replaced.
        crate::pty::Attach {
            stdin: tty.stdin,
            stdout: false,
            stderr: false,
        }
    };
    (attach.stdin || attach.stdout || attach.stderr).then_some(attach)
}

/// The init the supervisor watches: its own child (the one-shot path), or
/// an execution forked by a sandbox template, known by the pidfd the
/// template made with it (never by a pid that could be reused).
pub(crate) enum InitHandle {
    Child(Pid),
    Forked { pid: Pid, pidfd: OwnedFd },
}

impl InitHandle {
    fn pid(&self) -> Pid {
        match self {
            InitHandle::Child(p) | InitHandle::Forked { pid: p, .. } => *p,
        }
    }

    fn signal(&self, sig: libc::c_int) {
        match self {
            InitHandle::Child(p) => {
                let _ = sys::kill(p.as_raw(), sig);
            }
            InitHandle::Forked { pidfd, .. } => {
                let _ = sys::pidfd_send_signal(pidfd.as_fd(), sig);
            }
        }
    }

    /// How the init ended. A forked execution is its template's child (the
    /// template reaps it): it reported its status on the pipe, or it was
    /// killed — only moat's own escalation can, it is pid 1 of its
    /// namespace — which is SIGKILL.
    fn wait(&self, done: bool) -> Result<WaitStatus, String> {
        match self {
            InitHandle::Child(p) if done => {
                Ok(waitpid(*p, Some(nix::sys::wait::WaitPidFlag::WNOHANG))
                    .unwrap_or(WaitStatus::StillAlive))
            }
            InitHandle::Child(p) => {
                waitpid(*p, None).map_err(|e| format!("wait for the sandbox: {e}"))
            }
            InitHandle::Forked { .. } if done => Ok(WaitStatus::StillAlive),
            InitHandle::Forked { pid, .. } => {
                Ok(WaitStatus::Signaled(*pid, Signal::SIGKILL, false))
            }
        }
    }
}

/// The handoff messages still queued once the run ended (non-blocking: the
/// init is gone, nothing more comes). A pty master among them, when no
/// relay was started, is relayed output-only: the command is done, so
/// there is nothing to type to it, and the host terminal stays as it is.
/// Late proxy listeners and broker sockets serve nothing any more.
fn take_late_handoffs(
    handoff: &std::os::unix::net::UnixStream,
    mut relay: Option<crate::pty::Relay>,
    plan_pty: Option<crate::pty::Attach>,
) -> Option<crate::pty::Relay> {
    if handoff.set_nonblocking(true).is_err() {
        return relay;
    }
    while let Some(m) = crate::netns::receive(handoff) {
        if let (crate::netns::Handoff::Pty(master), None, Some(attach)) = (m, &relay, plan_pty) {
            relay = Some(crate::pty::Relay::output_only(master, attach));
        }
    }
    relay
}

/// Watches one run to its end (the one-shot supervisor's loop, also a
/// template execution's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn supervise(
    init: InitHandle,
    plan: &Plan,
    opts: &RunOptions,
    out: &mut RunOutcome,
    mut captures: Vec<Capture>,
    report_r: OwnedFd,
    handoff: Option<std::os::unix::net::UnixStream>,
    start: Instant,
    observer: &mut dyn RunObserver,
    enforcer: &Enforcer,
    control: Control<'_>,
) -> Result<(), String> {
    let child = init.pid();
    let mut handoff = handoff;
    let mut budget = Budget {
        left: enforcer.output,
        exceeded: false,
    };
    let mut reached = Reached::default();
    // Limits the kernel enforces without telling anyone are watched on a tick.
    let watch = enforcer.cgroup.is_some() || enforcer.nproc_limit.is_some();
    let tick = Duration::from_millis(50);
    let mut broker: Option<std::os::unix::net::UnixListener> = None;
    // The command's own terminal, once the init has opened it.
    let mut relay: Option<crate::pty::Relay> = None;
    let plan_pty = own_terminal(plan, opts, enforcer.output.is_some());
    let own_signals = matches!(control, Control::ProcessSignals);
    if plan_pty.is_some() && own_signals {
        // Resizes of the host terminal arrive through the signalfd.
        let _ = sys::set_sigmask(libc::SIG_BLOCK, &[libc::SIGWINCH]);
    }
    // The init's exit, as an event of this run alone (no SIGCHLD, which
    // would name every child of the process).
    let own_pidfd;
    let pidfd = match &init {
        InitHandle::Forked { pidfd, .. } => pidfd,
        InitHandle::Child(p) => {
            own_pidfd = sys::pidfd_open(p.as_raw()).map_err(|e| format!("pidfd_open: {e}"))?;
            &own_pidfd
        }
    };
    // This process's own signals only when it runs this one command;
    // otherwise the caller's channel.
    let sigfd = if own_signals {
        let mut mask = SigSet::empty();
        for s in [
            Signal::SIGTERM,
            Signal::SIGHUP,
            Signal::SIGINT,
            Signal::SIGQUIT,
            Signal::SIGWINCH,
        ] {
            mask.add(s);
        }
        Some(
            SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
                .map_err(|e| format!("signalfd: {e}"))?,
        )
    } else {
        None
    };
    let mut channel = match control {
        Control::Channel(c) => Some(c),
        Control::ProcessSignals => None,
    };
    let stdin_is_tty = nix::unistd::isatty(std::io::stdin()).unwrap_or(false);
    let mut tail = Vec::new();
    let mut started_seen = false;
    let mut report = Report::new(child);
    let mut report_open = true;
    let mut deadline = opts.timeout.map(|t| start + t);
    // Escalation after a timeout or a stop request: SIGTERM sent, then
    // SIGUSR1 (init kills all), then SIGKILL of the init itself.
    let mut stage = 0u8;
    let mut exited = false;
    while !exited {
        let timeout = match deadline {
            Some(d) => {
                let mut left = d.saturating_duration_since(Instant::now());
                if watch {
                    left = left.min(tick);
                }
                PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                    .unwrap_or(PollTimeout::MAX)
            }
            None if watch => {
                PollTimeout::try_from(tick.as_millis() as i32).unwrap_or(PollTimeout::MAX)
            }
            None => PollTimeout::NONE,
        };
        // A stream whose reader is behind is not read (the command blocks as
        // on a full pipe); look again soon, the rest of the loop stays live.
        let paused = observer.output_backlog();
        let polled: Vec<bool> = captures.iter_mut().map(|c| c.readable(paused)).collect();
        let throttled = captures.iter().zip(&polled).any(|(c, p)| c.open && !p);
        let timeout = match timeout {
            _ if !throttled => timeout,
            PollTimeout::NONE => PollTimeout::from(10u16),
            t => t.min(PollTimeout::from(10u16)),
        };
        // Input waits for moat to reach the terminal's foreground: look again soon.
        let timeout = match relay.as_mut().map(|r| r.take_input_if_foreground()) {
            Some(true) if timeout == PollTimeout::NONE => PollTimeout::from(250u16),
            Some(true) => timeout.min(PollTimeout::from(250u16)),
            _ => timeout,
        };
        // Index 1: the run's requests, from the signalfd or the caller's
        // channel (the init's pidfd again once the channel is closed, so
        // the indices stay fixed).
        let requests = match (&sigfd, channel) {
            (Some(s), _) => s.as_fd(),
            (None, Some(c)) => c.as_fd(),
            (None, None) => pidfd.as_fd(),
        };
        let mut fds = vec![
            PollFd::new(pidfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(requests, PollFlags::POLLIN),
        ];
        if report_open {
            fds.push(PollFd::new(report_r.as_fd(), PollFlags::POLLIN));
        }
        let handoff_index = fds.len();
        if let Some(h) = &handoff {
            fds.push(PollFd::new(h.as_fd(), PollFlags::POLLIN));
        }
        let broker_index = fds.len();
        if let Some(b) = &broker {
            fds.push(PollFd::new(b.as_fd(), PollFlags::POLLIN));
        }
        let cap_index = fds.len();
        for (c, _) in captures.iter().zip(&polled).filter(|(_, p)| **p) {
            fds.push(PollFd::new(c.fd.as_fd(), PollFlags::POLLIN));
        }
        let relay_index = fds.len();
        let relay_set = relay.as_ref().map(|r| r.poll_set()).unwrap_or_default();
        let relay_has_master = relay_set.first().is_some_and(|(fd, _)| fd.as_raw_fd() != 0);
        for (fd, flags) in &relay_set {
            fds.push(PollFd::new(*fd, *flags));
        }
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(format!("poll: {e}")),
        }
        let ready = |i: usize| {
            fds.get(i)
                .and_then(|f| f.revents())
                .map(|r| !r.is_empty())
                .unwrap_or(false)
        };
        let pid_ready = ready(0);
        let sig_ready = ready(1);
        let report_ready = report_open && ready(2);
        let handoff_ready = handoff.is_some() && ready(handoff_index);
        let broker_ready = broker.is_some() && ready(broker_index);
        let cap_ready: Vec<bool> = (0..polled.iter().filter(|p| **p).count())
            .map(|i| ready(cap_index + i))
            .collect();
        let (master_ready, stdin_ready) = match (relay_has_master, relay_set.len()) {
            (true, 2) => (ready(relay_index), ready(relay_index + 1)),
            (true, _) => (ready(relay_index), false),
            (false, 1) => (false, ready(relay_index)),
            _ => (false, false),
        };
        drop(fds);
        drop(relay_set);
        if let Some(r) = relay.as_mut() {
            budget.exceeded |= r.pump(master_ready, stdin_ready, &mut budget.left);
        }
        if handoff_ready {
            match handoff.as_ref().and_then(crate::netns::receive) {
                Some(crate::netns::Handoff::Proxy(http, socks)) => {
                    observer.proxy_listeners(http, socks)
                }
                Some(crate::netns::Handoff::Broker(l)) => {
                    let _ = l.set_nonblocking(true);
                    broker = Some(l);
                }
                Some(crate::netns::Handoff::Pty(master)) => {
                    if let Some(attach) = plan_pty {
                        relay = Some(crate::pty::Relay::start(master, attach));
                    }
                }
                None => handoff = None,
            }
        }
        if broker_ready {
            if let Some(Ok((conn, _))) = broker.as_ref().map(|b| b.accept()) {
                let _ = conn.set_nonblocking(false);
                observer.broker_connection(conn);
            }
        }
        if report_ready {
            report_open = report.read(&report_r);
            if !started_seen
                && init_msg::decode_all(&report.buf, false)
                    .is_ok_and(|m| m.iter().any(|m| matches!(m, InitMessage::Confined { .. })))
            {
                started_seen = true;
                crate::timing::mark("supervisor: the command is confined, about to exec");
                observer.started(report.command_pid);
                crate::timing::mark("supervisor: execution.started recorded");
            }
        }
        let polled_captures = captures
            .iter_mut()
            .zip(&polled)
            .filter(|(_, p)| **p)
            .map(|(c, _)| c);
        for (k, c) in polled_captures.enumerate() {
            if cap_ready.get(k).copied().unwrap_or(false) {
                c.read_some(observer, &mut tail, &mut budget);
            }
        }
        reached.output |= budget.exceeded;
        if let Some(cg) = &enforcer.cgroup {
            reached.memory |= cg.oom_killed();
            reached.pids |= cg.pids_reached();
        }
        if let Some(max) = enforcer.nproc_limit {
            // The init and everything below it count against RLIMIT_NPROC.
            let count = crate::tree::descendants_of(child.as_raw()).len() as u64 + 1;
            reached.pids |= count >= max;
        }
        // A limit reached ends the run: everything in it is killed at once
        // (a fork bomb would outlive a polite SIGTERM), then the init.
        if (reached.output || reached.memory || reached.pids) && stage < 2 && !out.timed_out {
            init.signal(libc::SIGUSR1);
            stage = 2;
            deadline = Some(Instant::now() + Duration::from_secs(1));
        }
        let mut requested = Vec::new();
        if sig_ready {
            if let Some(c) = channel {
                match c.drain() {
                    Some(r) => requested = r,
                    // Every sender is gone: nobody can ask anything more.
                    None => channel = None,
                }
            }
        }
        for req in requested {
            match req {
                Request::Stop if stage == 0 => {
                    init.signal(libc::SIGTERM);
                    stage = 1;
                    deadline = Some(Instant::now() + KILL_GRACE);
                }
                Request::Stop => {}
                Request::Hangup => {
                    init.signal(libc::SIGHUP);
                }
                Request::Resize => {
                    if let Some(r) = &relay {
                        r.copy_window_size();
                    }
                }
            }
        }
        if let (true, Some(sigfd)) = (sig_ready, &sigfd) {
            while let Ok(Some(info)) = sigfd.read_signal() {
                let sig = info.ssi_signo as i32;
                match sig {
                    // A terminal already delivered ^C/^\ to the command's group.
                    libc::SIGINT | libc::SIGQUIT if stdin_is_tty => {}
                    // From a harness: stop the run (SIGTERM the tree, then escalate).
                    libc::SIGTERM | libc::SIGINT | libc::SIGQUIT if stage == 0 => {
                        init.signal(libc::SIGTERM);
                        stage = 1;
                        deadline = Some(Instant::now() + KILL_GRACE);
                    }
                    libc::SIGHUP => {
                        init.signal(libc::SIGHUP);
                    }
                    libc::SIGWINCH => {
                        if let Some(r) = &relay {
                            r.copy_window_size();
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(d) = deadline {
            if Instant::now() >= d {
                match stage {
                    0 => {
                        out.timed_out = true;
                        init.signal(libc::SIGTERM);
                        deadline = Some(Instant::now() + KILL_GRACE);
                    }
                    1 => {
                        init.signal(libc::SIGUSR1);
                        deadline = Some(Instant::now() + Duration::from_secs(1));
                    }
                    _ => {
                        init.signal(libc::SIGKILL);
                        deadline = None;
                    }
                }
                stage = stage.saturating_add(1);
            }
        }
        // The init reports the final status once every process of the run
        // is dead and reaped, then closes its fds and tears its namespaces
        // down: nothing of the run writes to the pipes after it, so neither
        // the end of the report pipe (a second wake-up) nor the teardown is
        // waited for; what the command wrote last is in the capture pipes,
        // drained below (until they are empty, as before).
        if pid_ready || has_final_status(&report.buf) {
            exited = true;
        }
    }
    let init_status = init.wait(has_final_status(&report.buf))?;
    // The loop takes one handoff message a turn: a command that ended in
    // the turn the broker's socket was taken leaves its pty master queued
    // behind it. Take what is still queued, so its output is shown below.
    if let Some(h) = handoff.take() {
        relay = take_late_handoffs(&h, relay, plan_pty);
    }
    // What the command wrote last, then the host terminal's own settings back.
    if let Some(mut r) = relay.take() {
        budget.exceeded |= r.drain_master(&mut budget.left);
    }
    // Everything that could hold the pipes is gone now; drain what is left.
    set_nonblocking(&report_r);
    if report_open {
        report.drain(&report_r);
    }
    // A stopped run (timeout, stop request, limit) does not wait on a
    // reader that stopped reading: its last output is best effort.
    let bounded = out.timed_out || stage > 0;
    for c in captures.iter_mut() {
        set_nonblocking(&c.fd);
        let mut spins = 0;
        while c.open && spins < 100_000 {
            if c.pending.is_some() && !c.wait_room(bounded) {
                break;
            }
            let before = c.offset;
            c.read_some(observer, &mut tail, &mut budget);
            if budget.exceeded && c.offset == before {
                // Everything past the limit is dropped; stop draining.
                break;
            }
            if c.offset == before && c.open {
                // EAGAIN: a writer outside our tree still holds the pipe.
                break;
            }
            spins += 1;
        }
        if let Some(w) = c.writer.take() {
            w.finish(c.pending.take(), bounded);
        }
    }
    if tail.len() > STDERR_TAIL {
        tail.drain(..tail.len() - STDERR_TAIL);
    }
    out.stderr_tail = tail;
    for c in captures {
        match c.stream {
            Stream::Stdout => {
                out.stdout = c.buf;
                out.stdout_truncated = c.truncated;
            }
            Stream::Stderr => {
                out.stderr = c.buf;
                out.stderr_truncated = c.truncated;
            }
        }
    }
    reached.output |= budget.exceeded;
    if let Some(cg) = &enforcer.cgroup {
        reached.memory |= cg.oom_killed();
        reached.pids |= cg.pids_reached();
        if out.usage.max_rss_bytes.is_none() {
            out.usage.max_rss_bytes = cg.memory_peak();
        }
        // The init must be gone before its cgroup can be removed.
        if matches!(init_status, WaitStatus::StillAlive) {
            let _ = waitpid(child, None);
        }
    }
    let program = opts.argv.first().cloned().unwrap_or_default();
    let r = interpret(&report.buf, init_status, plan, opts, &program, out);
    out.termination_reason = termination_reason(out, reached, &enforcer.rlimits);
    r
}

/// Which limit ended the run, or how else it ended: the reason the init
/// stopped it for when it did (`interpret`), kept. SIGXCPU and SIGXFSZ
/// name a limit only when that limit was set (and, for CPU time, the run
/// used that much): the command can send either signal to itself, and the
/// result must not blame a limit that did nothing.
fn termination_reason(
    out: &RunOutcome,
    reached: Reached,
    rlimits: &[(nix::sys::resource::Resource, u64, u64)],
) -> Option<TerminationReason> {
    use nix::sys::resource::Resource;
    let soft = |r: Resource| rlimits.iter().find(|(x, _, _)| *x == r).map(|(_, s, _)| *s);
    // RLIMIT_CPU is in whole seconds per process; the usage sums every
    // process of the run. The kernel fires SIGXCPU on the scheduler's exact
    // runtime, while the rusage read back is tick-sampled and, on a loaded
    // host, was seen 15-20% short of the limit that had fired: half the
    // limit tells a run that spun against it from a self-sent SIGXCPU
    // (which used next to nothing) without blaming load.
    let cpu_reached = soft(Resource::RLIMIT_CPU).is_some_and(|secs| {
        out.usage
            .cpu_ms
            .is_none_or(|used| used.saturating_mul(2) >= secs.saturating_mul(1000))
    });
    if let Some(stop) = out.termination_reason.filter(|r| r.stopped_by_moat()) {
        return Some(stop);
    }
    if out.status == RunStatus::FailedToStart {
        return None;
    }
    Some(if out.timed_out {
        TerminationReason::Timeout
    } else if reached.output {
        TerminationReason::Output
    } else if reached.memory {
        TerminationReason::Memory
    } else if reached.pids {
        TerminationReason::Pids
    } else {
        match out.signal {
            Some(libc::SIGXCPU) if cpu_reached => TerminationReason::Cpu,
            Some(libc::SIGXFSZ) if soft(Resource::RLIMIT_FSIZE).is_some() => {
                TerminationReason::FileSize
            }
            Some(_) => TerminationReason::Signal,
            None => TerminationReason::Exit,
        }
    })
}

fn set_nonblocking(fd: &OwnedFd) {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    if let Ok(flags) = fcntl(fd, FcntlArg::F_GETFL) {
        let _ = fcntl(
            fd,
            FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
        );
    }
}

/// Whether the init has reported the command's exit (a malformed report
/// is not one: the run then ends when the init does, and fails).
fn has_final_status(report: &[u8]) -> bool {
    init_msg::decode_all(report, false)
        .is_ok_and(|m| m.iter().any(|m| matches!(m, InitMessage::Exited { .. })))
}

/// What the init and the command's process reported so far.
struct Report {
    /// The frames, in the order they came.
    buf: Vec<u8>,
    /// The init's pid: every other writer is the command's process.
    init: Pid,
    /// The command's host pid, from the first read it wrote.
    command_pid: Option<i32>,
}

impl Report {
    fn new(init: Pid) -> Report {
        Report {
            buf: Vec::new(),
            init,
            command_pid: None,
        }
    }

    /// Reads what is available from the report channel ([`report_channel`]);
    /// false at its end. A read ends where the writer changes, so a short
    /// read is not the end of what is queued: [`Report::drain`] reads on.
    fn read(&mut self, fd: &OwnedFd) -> bool {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        let mut chunk = [0u8; 4096];
        loop {
            let mut space = nix::cmsg_space!(libc::ucred);
            let mut iov = [std::io::IoSliceMut::new(&mut chunk)];
            let (n, writer) = match recvmsg::<()>(
                fd.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(m) => (
                    m.bytes,
                    m.cmsgs().ok().and_then(|mut c| {
                        c.find_map(|c| match c {
                            ControlMessageOwned::ScmCredentials(u) => Some(u.pid()),
                            _ => None,
                        })
                    }),
                ),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => return true,
                Err(_) => return false,
            };
            if n == 0 {
                return false;
            }
            if let Some(pid) = writer.filter(|&p| p > 0 && p != self.init.as_raw()) {
                self.command_pid.get_or_insert(pid);
            }
            self.buf.extend_from_slice(&chunk[..n]);
            if n < chunk.len() {
                return true;
            }
        }
    }

    /// Reads everything still queued (the channel is non-blocking by then);
    /// false at its end.
    fn drain(&mut self, fd: &OwnedFd) -> bool {
        loop {
            let before = self.buf.len();
            if !self.read(fd) {
                return false;
            }
            if self.buf.len() == before {
                return true;
            }
        }
    }
}

/// Why `program` was not found in the view: named, with where it is on
/// the host and the flag that would show it. Without `look_on_host` (a
/// nested run, whose messages go back into the outer sandbox) the host is
/// not consulted: the answer would tell the command what exists outside
/// its view.
fn not_in_view(plan: &Plan, program: &std::ffi::OsStr, look_on_host: bool) -> String {
    let shown = program.to_string_lossy();
    // Where the host would find it: the path as given, or the first match
    // on the command's PATH (as the host sees those directories).
    let host_path = if !look_on_host {
        None
    } else if shown.contains('/') {
        Some(crate::explain::absolute(&plan.cwd, &shown))
    } else {
        plan.env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
            .split(':')
            .filter(|d| d.starts_with('/'))
            .map(|d| std::path::Path::new(d).join(&*shown))
            .find(|p| p.is_file())
    };
    let why = host_path.as_ref().and_then(|p| {
        let text = p.to_string_lossy();
        crate::explain::explain(plan, &text, "ENOENT", |q| q.symlink_metadata().is_ok())
            .map(|r| (p, r))
    });
    match why {
        Some((p, _)) if p.starts_with("/tmp") => format!(
            "{shown}: not found in the sandbox's view: it is {} on the host, and the sandbox's /tmp is its own (empty, private); add --ro {} to show it, or move it into the workspace",
            p.display(),
            // Never /tmp itself (moat refuses it: other programs' sockets).
            p.parent()
                .filter(|d| !moat_policy::is_shared_temp_dir(d))
                .unwrap_or(p)
                .display()
        ),
        Some((p, crate::explain::DenyReason::OutsideView)) => format!(
            "{shown}: not found in the sandbox's view: it is {} on the host (outside_view: not in the view at --policy {}; add {} to show it)",
            p.display(),
            plan.level,
            grants_to_show(plan, p)
        ),
        Some((p, r)) => format!(
            "{shown}: not found in the sandbox's view: it is {} on the host ({}: {})",
            p.display(),
            r.code(),
            r.phrase(plan.level)
        ),
        None => format!(
            "{shown}: command not found in the sandbox's view; at --policy {} only the paths the policy shows exist",
            plan.level
        ),
    }
}

/// The `--ro` flags that would show the program at `p` (a host path
/// outside the view), concrete rather than "--ro PATH": its directory or
/// npm package ([`crate::explain::program_dir`]: programs load what lies
/// beside them), and when `p` is a symlink
/// (`bin/claude -> ../lib/node_modules/…/claude.exe`, what npm and most
/// installers make) the directory holding both the link and its target, or
/// the target's directory when the link itself is already in the view:
/// `--ro` of the link alone resolves to the target file and leaves the
/// link's own path missing.
fn grants_to_show(plan: &Plan, p: &std::path::Path) -> String {
    use std::path::{Path, PathBuf};
    let dir = |x: &Path| x.parent().unwrap_or(x).to_path_buf();
    let target = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let hidden = |x: &Path| {
        crate::explain::explain(plan, &x.to_string_lossy(), "ENOENT", |q| {
            q.symlink_metadata().is_ok()
        })
        .is_some()
    };
    let flag = |x: &Path| format!("--ro {}", x.display());
    let (link_dir, target_dir) = (dir(p), crate::explain::program_dir(&target));
    if target == p || !hidden(&link_dir) {
        return flag(&target_dir);
    }
    let common: PathBuf = link_dir
        .components()
        .zip(target_dir.components())
        .take_while(|(a, b)| a == b)
        .map(|(a, _)| a)
        .collect();
    if common.parent().is_some() {
        flag(&common)
    } else {
        format!("{} {}", flag(&link_dir), flag(&target_dir))
    }
}

/// Turns the init's report messages and exit status into the outcome.
fn interpret(
    report: &[u8],
    init_status: WaitStatus,
    plan: &Plan,
    opts: &RunOptions,
    program: &std::ffi::OsStr,
    out: &mut RunOutcome,
) -> Result<(), String> {
    // The pipe is closed (or its writers are dead) by now: a partial frame
    // is as much a failure as garbage.
    let messages = init_msg::decode_all(report, true).map_err(|e| {
        format!("the sandbox's init sent a malformed report ({e}); this is a bug in moat, please report it")
    })?;
    let mut final_status: Option<(i32, i32)> = None;
    for msg in messages {
        match msg {
            InitMessage::SetupFailed {
                stage,
                errno,
                detail,
            } => return Err(init_msg::setup_failure_text(stage, errno, detail)),
            InitMessage::Confined { landlock, seccomp } => {
                out.layers.landlock = landlock;
                out.layers.seccomp = seccomp;
            }
            InitMessage::ExecFailed { errno } => {
                out.status = RunStatus::FailedToStart;
                out.exit_code = if errno == libc::ENOENT { 127 } else { 126 };
                let what = if errno == libc::ENOENT {
                    "command not found"
                } else {
                    "command not executable"
                };
                out.error = Some(format!("{what}: {}", io::Error::from_raw_os_error(errno)));
                if !plan.sandboxed || errno != libc::ENOENT {
                    return Ok(());
                }
                out.error = Some(not_in_view(plan, program, !opts.stdio_from_outer_sandbox));
                return Ok(());
            }
            InitMessage::Exited {
                code,
                signal,
                max_rss_kb,
                cpu_ms,
            } => {
                // What every process of the run used, reaped by the init.
                out.usage.max_rss_bytes = Some(max_rss_kb.max(0) as u64 * 1024);
                out.usage.cpu_ms = Some(cpu_ms.max(0) as u64);
                final_status = Some((code, signal));
            }
            InitMessage::HostReplaced { path } => {
                // The init stopped the run: moat's failure, not the command's.
                out.status = RunStatus::Finished;
                out.exit_code = 125;
                out.error = Some(crate::watch::replaced(std::path::Path::new(path)));
                out.termination_reason = Some(TerminationReason::HostReplaced);
                return Ok(());
            }
            InitMessage::WatchFailed { detail } => {
                // The command had started: a stopped run (exit 125), not
                // one that failed to start, which a caller may retry.
                out.status = RunStatus::Finished;
                out.exit_code = 125;
                out.error = Some(detail.to_string());
                out.termination_reason = Some(TerminationReason::WatchFailed);
                return Ok(());
            }
        }
    }
    match final_status {
        Some((code, signal)) => {
            out.exit_code = code;
            out.signal = (signal != 0).then_some(signal);
            out.status = RunStatus::Finished;
        }
        None => {
            // The init died without reporting: it was killed by the timeout
            // escalation or from outside.
            out.status = RunStatus::Finished;
            match init_status {
                WaitStatus::Signaled(_, s, _) => {
                    out.exit_code = 128 + s as i32;
                    out.signal = Some(s as i32);
                }
                WaitStatus::Exited(_, c) => out.exit_code = c,
                _ => {}
            }
            if out.layers.landlock == Enforcement::None && plan.sandboxed && !out.timed_out {
                return Err("the sandbox exited before the command started".into());
            }
        }
    }
    if out.timed_out {
        out.status = RunStatus::TimedOut;
        out.exit_code = 124;
    }
    Ok(())
}

/// The clone's caller must be single-threaded (see `sys::clone_process`);
/// debug builds (the test suites') check it before either clone (the
/// serial one in [`launch`], the early one in [`EarlyInit::start`]): a
/// thread inside the allocator at the clone leaves the init waiting
/// forever on its lock, once in many runs.
fn check_single_threaded() -> Result<(), String> {
    if !cfg!(debug_assertions) {
        return Ok(());
    }
    if let Some(n) = sys::thread_count().filter(|&n| n > 1) {
        return Err(format!(
            "internal error: moat's supervisor had {n} threads at the sandbox's clone (it must have one)"
        ));
    }
    Ok(())
}

/// The sandbox's init, cloned by `moat exec` right after it resolved the
/// policy, so its namespaces and id maps are built while moat probes the
/// host (ARCHITECTURE.md, "Launch performance", third pass). The clone
/// makes only the user and pid namespaces (what a clone makes costs the
/// caller's time); the init makes the rest itself (`init::early_main`)
/// and waits for the plan on a socket. [`launch`] sends it the plan
/// instead of cloning. Dropped without that (a refusal, a plan it does
/// not fit), it is killed and reaped: nothing of the run is left.
pub struct EarlyInit {
    pid: Pid,
    pidfd: OwnedFd,
    /// The supervisor's end of the plan socket.
    sock: std::os::unix::net::UnixStream,
    set: NamespaceSet,
    uid: u32,
    gid: u32,
    /// The plan was sent: the supervisor watches and reaps it now.
    handed: bool,
}

impl EarlyInit {
    /// Clones the early init for `set`. Moves it to another cpu of this
    /// process's mask only when nothing else is runnable (`/proc/loadavg`):
    /// a new child mostly waits on its parent's cpu, and moved onto a busy
    /// one it waits at every step. The init takes this process's mask back
    /// before it starts the command.
    pub fn start(set: NamespaceSet) -> Result<EarlyInit, String> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| format!("create a socket pair: {e}"))?;
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        let mask = nix::sched::sched_getaffinity(Pid::from_raw(0))
            .map_err(|e| format!("read the cpu mask: {e}"))?;
        let idle = sys::runnable_tasks() == Some(1);
        check_single_threaded()?;
        // The init waits for these signals (sigwait): blocked from before
        // the clone so none is lost; this process unblocks them right after.
        let old_mask = sys::set_sigmask(libc::SIG_BLOCK, INIT_SIGNALS)
            .map_err(|e| format!("block signals: {e}"))?;
        // SAFETY: the caller is single-threaded (`moat exec` before it
        // starts any thread; checked above in debug builds), so the child
        // may run ordinary code, see `sys::clone_process`.
        let cloned = unsafe { sys::clone_with_pidfd(libc::CLONE_NEWUSER | libc::CLONE_NEWPID) };
        match cloned {
            Ok((Forked::Child, _)) => {
                drop(ours);
                init::early_main(theirs.into(), set, uid, gid, &mask)
            }
            Ok((Forked::Parent(pid), pidfd)) => {
                sys::restore_sigmask(&old_mask);
                drop(theirs);
                let pid = Pid::from_raw(pid);
                let Some(pidfd) = pidfd else {
                    let _ = sys::kill(pid.as_raw(), libc::SIGKILL);
                    let _ = waitpid(pid, None);
                    return Err("clone gave no pidfd".into());
                };
                if idle {
                    move_to_another_cpu(pid, &mask);
                }
                // The step's name is the serial clone's: the init and its
                // namespaces start here (the rest are the init's own work).
                crate::timing::mark("clone the init (new namespaces)");
                Ok(EarlyInit {
                    pid,
                    pidfd,
                    sock: ours,
                    set,
                    uid,
                    gid,
                    handed: false,
                })
            }
            Err(e) => {
                sys::restore_sigmask(&old_mask);
                Err(format!("clone: {e}"))
            }
        }
    }

    /// Whether `plan` is what this init was built for: the same
    /// namespaces and ids, and limits it can carry (a cgroup needs the
    /// serial clone, which the supervisor makes inside it).
    fn fits(&self, plan: &Plan, enforcer: &Enforcer) -> bool {
        NamespaceSet::of_plan(plan) == Some(self.set)
            && (plan.uid, plan.gid) == (self.uid, self.gid)
            && enforcer.cgroup.is_none()
            && enforcer
                .rlimits
                .iter()
                .all(|(r, _, _)| init_msg::rlimit_code(*r).is_some())
    }

    /// Waits for the init's word that its half (namespaces, id maps,
    /// hostname, staged root) went through. The init writes it before it
    /// reads the plan: false means it never read one.
    fn ready(&self) -> bool {
        let mut b = [1u8];
        loop {
            match nix::unistd::read(&self.sock, &mut b) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => return matches!(r, Ok(1)) && b[0] == 0,
            }
        }
    }

    /// The plan is the init's (sent, and the init ready): the supervisor
    /// watches and reaps it now, by this pid.
    fn handed(mut self) -> Pid {
        self.handed = true;
        self.pid
    }

    /// Sends the plan and the run's fds (they wait in the socket until the
    /// init has done its half).
    #[allow(clippy::too_many_arguments)]
    fn send_plan(
        &mut self,
        plan: &Plan,
        argv: &[CString],
        envp: &[CString],
        seccomp: Option<&seccompiler::BpfProgram>,
        rlimits: &[(nix::sys::resource::Resource, u64, u64)],
        pty: Option<crate::pty::Attach>,
        cwd_identity: Option<(u64, u64)>,
        fds: [Option<std::os::fd::BorrowedFd<'_>>; 4],
    ) -> Result<(), String> {
        let msg = init_msg::PlanMessage {
            plan,
            argv: argv.iter().map(|a| a.as_bytes().to_vec()).collect(),
            envp: envp.iter().map(|a| a.as_bytes().to_vec()).collect(),
            seccomp: seccomp.map(init_msg::program_bytes),
            rlimits: rlimits
                .iter()
                .filter_map(|(r, s, h)| init_msg::rlimit_code(*r).map(|c| (c, *s, *h)))
                .collect(),
            pty: pty.map(|a| (a.stdin, a.stdout, a.stderr)),
            cwd_identity,
            stdout: fds[1].is_some(),
            stderr: fds[2].is_some(),
            handoff: fds[3].is_some(),
        };
        let body = serde_json::to_vec(&msg).map_err(|e| format!("encode the plan: {e}"))?;
        crate::timing::mark("the plan encoded");
        let raw: Vec<i32> = fds.iter().flatten().map(|f| f.as_raw_fd()).collect();
        crate::template::send_frame(self.sock.as_fd(), &body, &raw)
            .map_err(|e| format!("hand the plan to the sandbox's init: {e}"))
    }
}

impl Drop for EarlyInit {
    fn drop(&mut self) {
        if !self.handed {
            let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
            let _ = waitpid(self.pid, None);
        }
    }
}

/// Pins `pid` to one cpu of `mask` other than the one this process runs on.
fn move_to_another_cpu(pid: Pid, mask: &nix::sched::CpuSet) {
    let Some(here) = sys::current_cpu() else {
        return;
    };
    let other =
        (0..nix::sched::CpuSet::count()).find(|&c| c != here && mask.is_set(c).unwrap_or(false));
    if let Some(c) = other {
        let mut one = nix::sched::CpuSet::new();
        if one.set(c).is_ok() {
            let _ = nix::sched::sched_setaffinity(pid, &one);
        }
    }
}

#[cfg(test)]
mod report_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::io::Write;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;

    use nix::unistd::Pid;

    use super::{report_channel, set_nonblocking, Report};

    /// Runs `sh -c script` with `w` as its fd 3 and reaps it: its pid.
    fn write_and_reap(w: &OwnedFd, script: &str) -> u32 {
        let fd = w.as_raw_fd();
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", script]);
        // SAFETY: dup2 is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn sh");
        let pid = child.id();
        assert!(child.wait().expect("wait").success());
        pid
    }

    #[test]
    fn the_command_pid_is_known_after_the_command_is_reaped() {
        // The supervisor may read the command's `Confined` report only after
        // the command has exited and been reaped (`/bin/true` under load):
        // its pid must still come with that report.
        let (r, w) = report_channel().unwrap();
        let init = Pid::this();
        // The "init" (this process) writes first: never taken for the command.
        std::os::unix::net::UnixStream::from(w.try_clone().unwrap())
            .write_all(b"I")
            .unwrap();
        let command = write_and_reap(&w, "printf C >&3");
        drop(w);
        set_nonblocking(&r);
        let mut report = Report::new(init);
        assert!(!report.drain(&r), "the channel ended");
        assert_eq!(report.buf, b"IC");
        assert_eq!(report.command_pid, i32::try_from(command).ok());
    }
}

#[cfg(test)]
mod interpret_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use moat_policy::{Level, Policy, PolicyRequest};
    use nix::sys::wait::WaitStatus;
    use nix::unistd::Pid;

    use super::{interpret, termination_reason, Reached, RunOptions, RunOutcome, RunStatus};
    use crate::confine::Enforcement;
    use crate::init_msg::{InitMessage, MAX_FRAME};
    use crate::limits::TerminationReason;

    /// The outcome the supervisor makes of the init's report `msgs` (the
    /// command confined and started first) and a clean exit of the init.
    fn outcome_of(msgs: &[InitMessage<'_>]) -> (Result<(), String>, RunOutcome) {
        let policy = Policy::resolve(PolicyRequest {
            level: Some(Level::WorkspaceWrite),
            workspace: "/home/u/proj".into(),
            home: "/home/u".into(),
            ..Default::default()
        })
        .expect("policy");
        let facts = crate::probe::HostFacts {
            landlock_abi: 6,
            ..Default::default()
        };
        let plan = crate::plan::build(&policy, &facts).expect("plan");
        let mut report = Vec::new();
        let confined = InitMessage::Confined {
            landlock: Enforcement::Full,
            seccomp: Enforcement::Full,
        };
        for m in std::iter::once(&confined).chain(msgs) {
            let mut f = [0u8; MAX_FRAME];
            let n = m.encode(&mut f);
            report.extend_from_slice(&f[..n]);
        }
        let mut out = RunOutcome::refused(String::new());
        out.error = None;
        let r = interpret(
            &report,
            WaitStatus::Exited(Pid::from_raw(2), 0),
            &plan,
            &RunOptions::default(),
            std::ffi::OsStr::new("true"),
            &mut out,
        );
        (r, out)
    }

    #[test]
    fn a_watch_that_failed_to_arm_is_a_stopped_run_never_a_failed_start() {
        // The init arms the watch once the command has started: the
        // command may have had side effects, so a caller must not be told
        // it never started (and retry it).
        let detail = "moat cannot watch /home/u/proj: no inotify instance left (fs.inotify.max_user_instances)";
        let (r, out) = outcome_of(&[InitMessage::WatchFailed { detail }]);
        assert_eq!(r, Ok(()), "a failed arm reported as a failed setup");
        assert_eq!(out.status, RunStatus::Finished, "not a failed start");
        assert_eq!(out.exit_code, 125);
        assert_eq!(out.error.as_deref(), Some(detail));
        assert_eq!(out.termination_reason, Some(TerminationReason::WatchFailed));
        // Kept when the supervisor works out how the run ended: not an
        // `exit` with code 125.
        assert_eq!(
            termination_reason(&out, Reached::default(), &[]),
            Some(TerminationReason::WatchFailed),
            "the stop's reason overwritten"
        );
    }

    #[test]
    fn a_host_replaced_report_stops_the_run_naming_the_path() {
        let (r, out) = outcome_of(&[InitMessage::HostReplaced {
            path: "/home/u/proj/.env",
        }]);
        assert_eq!(r, Ok(()));
        assert_eq!(out.status, RunStatus::Finished);
        assert_eq!(out.exit_code, 125);
        assert!(out.error.as_deref().unwrap().contains("/home/u/proj/.env"));
        assert_eq!(
            out.termination_reason,
            Some(TerminationReason::HostReplaced)
        );
        assert_eq!(
            termination_reason(&out, Reached::default(), &[]),
            Some(TerminationReason::HostReplaced)
        );
    }

    #[test]
    fn a_setup_failure_is_still_a_failed_start() {
        let (r, _) = outcome_of(&[InitMessage::SetupFailed {
            stage: crate::init_msg::SetupStage::Sandbox,
            errno: 0,
            detail: "mount the view",
        }]);
        assert!(r.is_err());
    }
}
