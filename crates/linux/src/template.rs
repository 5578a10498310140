//! A pre-built sandbox for `serve`/`mcp`: per plan, a template process that
//! has already done what every execution of that plan shares (its user,
//! ipc, uts and — for `network disabled` — network namespace, the view's
//! shared mounts, the compiled seccomp filter), and forks each execution
//! from it. Each execution gets its own mount, pid, ipc and uts namespace,
//! fresh copies of every writable or per-process filesystem of the view
//! (/tmp, HOME, /dev, /dev/shm, /proc …), and its own Landlock domain — all
//! of it, and the command's confinement, done ahead of the request, so only
//! a check of what the host could have changed since, the cwd and the exec
//! remain on an execution's path; the service supervises it through a pidfd exactly as the one-shot supervisor
//! does ([`crate::run::supervise`]), so the outcome is the one-shot
//! outcome. See ARCHITECTURE.md, "Sandbox templates".
//!
//! Staleness: a template serves a plan only when the plan the caller just
//! computed for this execution (the same probe and view the one-shot path
//! computes) has the same [`key`]: a `.env` or `~/.aws` that appeared since
//! changes the view's stand-ins, so the key, so a new template is built.

use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use serde::{Deserialize, Serialize};

use crate::confine::Enforcement;
use crate::control::Control;
use crate::init::{self, INIT_SIGNALS};
use crate::init_msg::SetupStage;
use crate::limits::Enforcer;
use crate::plan::{LandlockSpec, MountOp, Plan, SeccompSpec};
use crate::run::{self, InitHandle, OutputMode, RunObserver, RunOptions, RunOutcome, Stream};
use crate::sys::{self, Forked};
use crate::syscall::Kernel;

/// The hidden subcommand that starts a template process (`moat __template`).
pub const SUBCOMMAND: &str = "__template";
/// Set to [`LAUNCHED_FROM_TEMPLATE`] in every template execution's
/// environment: a `moat exec` inside one (which has no nested-run broker)
/// then says why it cannot run and what to do instead.
pub const LAUNCH_ENV: &str = "MOAT_LAUNCH";
/// [`LAUNCH_ENV`]'s value in a template execution.
pub const LAUNCHED_FROM_TEMPLATE: &str = "template";
/// The control socket's descriptor number in the template process.
const CTL_FD: RawFd = 3;
/// A control message larger than this is refused (a broken peer).
const MAX_FRAME: usize = 16 << 20;
/// Templates kept per service; the least recently used is retired beyond.
const MAX_TEMPLATES: usize = 8;
/// Inits forked ahead per template, each waiting for an execution. The
/// ones taken are replaced when their executions end, not when they start:
/// an init's setup (≈ 0.6 ms of CPU: its namespaces, view and
/// confinement) then runs beside the service's and the client's work
/// between two executions, not beside the command (on 2 cores it delayed
/// the command's exec and the service's wake), and the next request still
/// finds one laid, asked for an execution earlier.
const WARM_STOCK: usize = 2;
/// Inits found stale (a mount laid ahead detached by the host since) that
/// one execution replaces before it gives up.
const MAX_STALE: usize = 3;

/// Why a run cannot use a template (it takes the one-shot path), or None.
/// Each reason is a guarantee or feature the template path does not give
/// per execution.
pub fn ineligible(plan: &Plan, opts: &RunOptions) -> Option<&'static str> {
    if !plan.namespaces() {
        return Some("not the namespaces backend");
    }
    if plan.proxy.is_some() {
        return Some("proxy network mode (its listeners are made per run)");
    }
    if !plan.limits.is_unset() {
        return Some("resource limits (a cgroup and rlimits per run)");
    }
    if opts.output == OutputMode::Passthrough {
        return Some("passthrough output (a terminal of its own)");
    }
    if opts.stdio_from_outer_sandbox {
        return Some("a nested run");
    }
    if plan.new_netns && !plan.landlock.scoped {
        // Executions share the template's network namespace: only a
        // Landlock domain per execution (ABI >= 6) keeps one's abstract
        // unix sockets from the next.
        return Some("Landlock below ABI 6 (no abstract-socket scoping)");
    }
    None
}

/// Why this kernel cannot serve any template, or None: executions of a
/// template share its network namespace, and only a Landlock domain per
/// execution with abstract-socket scoping (ABI >= 6) keeps them apart.
pub fn kernel_ineligible() -> Option<&'static str> {
    (sys::landlock_abi() < 6).then_some("Landlock below ABI 6 (no abstract-socket scoping)")
}

/// What a template is built from; two plans with the same key lay out the
/// same sandbox (the env and argv are per execution).
#[derive(Serialize, PartialEq)]
struct KeyView<'a> {
    mounts: &'a [MountOp],
    landlock: &'a LandlockSpec,
    seccomp: &'a SeccompSpec,
    landlock_abi: i32,
    uid: u32,
    gid: u32,
    cwd: &'a Path,
    new_netns: bool,
    sandboxed: bool,
    backend: moat_policy::Backend,
}

impl KeyView<'_> {
    fn of(plan: &Plan) -> KeyView<'_> {
        KeyView {
            mounts: &plan.mounts,
            landlock: &plan.landlock,
            seccomp: &plan.seccomp,
            landlock_abi: plan.landlock_abi,
            uid: plan.uid,
            gid: plan.gid,
            cwd: &plan.cwd,
            new_netns: plan.new_netns,
            sandboxed: plan.sandboxed,
            backend: plan.backend,
        }
    }
}

/// The last plan's [`KeyView`] serialized (without its sources): a
/// service keys every execution, mostly of one plan, and serializing the
/// mounts and Landlock rules costs more than comparing them.
static LAST_KEY_VIEW: Mutex<Option<(Plan, String)>> = Mutex::new(None);

/// `plan`'s [`KeyView`] serialized: the last one again when its fields are
/// equal (a pure function of them, so nothing to validate beyond that).
/// Err when it does not serialize: never an empty key another plan could
/// share.
fn key_view_json(plan: &Plan) -> Result<String, String> {
    if let Ok(last) = LAST_KEY_VIEW.lock() {
        if let Some((p, json)) = last.as_ref() {
            if KeyView::of(p) == KeyView::of(plan) {
                return Ok(json.clone());
            }
        }
    }
    let json = serde_json::to_string(&KeyView::of(plan))
        .map_err(|e| format!("the plan's template key does not serialize: {e}"))?;
    if let Ok(mut last) = LAST_KEY_VIEW.lock() {
        *last = Some((plan.clone(), json.clone()));
    }
    Ok(json)
}

/// The template key of `plan`: its view's mounts, Landlock and seccomp
/// specs, identity and cwd, serialized, and each bind source's (device,
/// inode) now, looked up on every call: a host directory replaced under
/// the same path (the workspace moved away and made again) is a new
/// template, not the old tree served at that path. Err when the view does
/// not serialize (no template serves the plan).
pub fn key(plan: &Plan) -> Result<String, String> {
    let sources: Vec<(u64, u64)> = plan
        .mounts
        .iter()
        .filter_map(|op| match op {
            MountOp::Bind { source, .. } => Some(
                std::fs::symlink_metadata(source)
                    .map(|m| (m.dev(), m.ino()))
                    .unwrap_or((0, 0)),
            ),
            _ => None,
        })
        .collect();
    let view = key_view_json(plan)?;
    let sources = serde_json::to_string(&sources)
        .map_err(|e| format!("the plan's template key does not serialize: {e}"))?;
    // The view's object with the sources as its last field.
    match view.strip_suffix('}') {
        Some(open) => Ok(format!("{open},\"sources\":{sources}}}")),
        None => Err("the plan's template key is not an object".into()),
    }
}

/// Why a template did not start an execution (nothing of it ran).
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template process was gone before it received the execution:
    /// another template may run it.
    #[error("the sandbox template is gone ({0})")]
    Gone(String),
    /// Anything else (a plan not the template's, a pipe that could not be
    /// made, the template's own refusal).
    #[error("{0}")]
    Refused(String),
}

impl From<String> for TemplateError {
    fn from(e: String) -> TemplateError {
        TemplateError::Refused(e)
    }
}

/// The first message to a template process.
#[derive(Serialize, Deserialize)]
struct Spec {
    plan: Plan,
    /// The compiled seccomp filter as (code, jt, jf, k).
    seccomp: Vec<(u16, u8, u8, u32)>,
}

/// A request to a template, or (`Exec`) to an execution's init.
#[derive(Serialize, Deserialize)]
enum Request {
    /// Fork the next execution's init and pass it over (`Reply::Warm`).
    Warm,
    /// To an execution's command, confined and waiting: run this (fds:
    /// stdin, stdout, stderr, report). `cwd`: the (device, inode) of the
    /// directory the caller checked as the working directory; the command
    /// starts there only if the view's cwd is that directory.
    Exec {
        #[serde(with = "c_strings")]
        argv: Vec<Vec<u8>>,
        #[serde(with = "c_strings")]
        env: Vec<Vec<u8>>,
        cwd: Option<(u64, u64)>,
        /// The execution's last try ([`MAX_STALE`] inits were stale): an
        /// init whose view failed reports its error instead of `Stale`.
        #[serde(default)]
        last: bool,
    },
    /// Take no more executions; exit when the running ones are done.
    Retire,
}

/// A list of C strings (no NUL inside: argv, env) as one JSON string, the
/// hex of each followed by a NUL. As `Vec<Vec<u8>>`, serde writes every byte
/// as a JSON number: the command parsed ≈ 1,000 of them per request (the
/// environment), on its way to exec.
mod c_strings {
    use serde::{Deserialize, Deserializer, Serializer};

    const HEX: &[u8; 16] = b"0123456789abcdef";

    pub(super) fn serialize<S: Serializer>(list: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
        let mut hex = String::with_capacity(list.iter().map(|c| 2 * (c.len() + 1)).sum());
        for c in list {
            if c.contains(&0) {
                return Err(serde::ser::Error::custom("a C string holds a NUL"));
            }
            for &b in c.iter().chain(&[0]) {
                hex.push(HEX[usize::from(b >> 4)] as char);
                hex.push(HEX[usize::from(b & 15)] as char);
            }
        }
        s.serialize_str(&hex)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        let hex = String::deserialize(d)?;
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(serde::de::Error::custom("not lowercase hex")),
        };
        let hex = hex.as_bytes();
        if hex.len() % 2 != 0 {
            return Err(serde::de::Error::custom("odd hex length"));
        }
        let mut list = Vec::new();
        let mut cur = Vec::new();
        for pair in hex.chunks_exact(2) {
            match (nibble(pair[0])? << 4) | nibble(pair[1])? {
                0 => list.push(std::mem::take(&mut cur)),
                b => cur.push(b),
            }
        }
        if !cur.is_empty() {
            return Err(serde::de::Error::custom("a C string without its NUL"));
        }
        Ok(list)
    }
}

/// A template's answers.
#[derive(Serialize, Deserialize)]
enum Reply {
    Ready,
    /// An execution's init, waiting for its command, with its pidfd and
    /// its end of the init's socket attached.
    Warm {
        pid: i32,
    },
    Failed {
        error: String,
    },
    /// From an execution's command, for its request: a mount laid ahead
    /// of the request was detached since (the host replaced the file or
    /// directory it sits on). Nothing of the request was used: run it on
    /// another init.
    Stale,
}

/// A running template process and its control socket.
pub struct Template {
    key: String,
    ctl: Mutex<Ctl>,
    process: Mutex<Option<std::process::Child>>,
}

/// The service's side of a template's control socket.
struct Ctl {
    sock: UnixStream,
    /// `Warm` requests sent whose answers are not yet read: the next
    /// executions' inits, being forked and laid (or waiting) while nothing
    /// waits for them ([`WARM_STOCK`]).
    warm_pending: usize,
}

/// An execution's init, forked and waiting for its command: the service
/// hands it the request itself, so a warm execution costs no round trip
/// through the template.
struct WarmInit {
    pid: i32,
    pidfd: OwnedFd,
    sock: UnixStream,
}

impl Template {
    /// Starts a template for `plan` from moat's binary `moat`.
    pub fn start(plan: &Plan, moat: &Path) -> Result<Template, String> {
        let program = crate::confine::seccomp_filter(&plan.seccomp)
            .map_err(|e| format!("build the seccomp filter: {e}"))?;
        let spec = Spec {
            plan: plan.clone(),
            seccomp: program.iter().map(|f| (f.code, f.jt, f.jf, f.k)).collect(),
        };
        let body = serde_json::to_vec(&spec).map_err(|e| format!("encode the template: {e}"))?;
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| format!("create a socket pair: {e}"))?;
        let mut cmd = std::process::Command::new(moat);
        cmd.arg(SUBCOMMAND).env_clear();
        if crate::timing::enabled() {
            cmd.env("MOAT_TRACE_TIMING", "1");
        }
        cmd.current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(if crate::timing::enabled() {
                // The trace of the template, its inits and their commands.
                std::process::Stdio::inherit()
            } else {
                std::process::Stdio::null()
            });
        sys::pass_fd_as(&mut cmd, OwnedFd::from(theirs), CTL_FD);
        crate::limits::start_with_starting_open_files(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| format!("start a sandbox template ({}): {e}", moat.display()))?;
        let t = Template {
            key: key(plan)?,
            ctl: Mutex::new(Ctl {
                sock: ours,
                warm_pending: 0,
            }),
            process: Mutex::new(Some(child)),
        };
        {
            let mut ctl = t.lock_ctl();
            let sock = ctl.sock.as_fd();
            send_frame(sock, &body, &[]).map_err(|e| format!("send the template: {e}"))?;
            match recv_frame::<Reply>(sock) {
                Ok((Reply::Ready, _)) => {}
                Ok((Reply::Failed { error }, _)) => return Err(error),
                Ok(_) => return Err("the sandbox template answered out of turn".into()),
                Err(e) => return Err(format!("the sandbox template did not start: {e}")),
            }
            // The first executions' inits, forked while nothing waits.
            for _ in 0..WARM_STOCK {
                ctl.ask_warm()
                    .map_err(|e| format!("the sandbox template is gone: {e}"))?;
            }
        }
        Ok(t)
    }

    /// The template process has not exited.
    fn alive(&self) -> bool {
        let mut p = self.process.lock().unwrap_or_else(|p| p.into_inner());
        matches!(p.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    fn lock_ctl(&self) -> std::sync::MutexGuard<'_, Ctl> {
        self.ctl.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next execution's init (the oldest one forked ahead when there
    /// is one; one that died waiting is replaced). The one taken is
    /// replaced when its execution ends ([`Template::refill`]), or now when
    /// it was the last one asked for (executions running at once, stale
    /// inits).
    fn take_warm(&self) -> Result<WarmInit, TemplateError> {
        let mut ctl = self.lock_ctl();
        for _ in 0..2 {
            if ctl.warm_pending == 0 {
                ctl.ask_warm()
                    .map_err(|e| TemplateError::Gone(e.to_string()))?;
            }
            ctl.warm_pending -= 1;
            let init = match recv_frame::<Reply>(ctl.sock.as_fd()) {
                Ok((Reply::Warm { pid }, fds)) if fds.len() == 2 => {
                    let mut fds = fds.into_iter();
                    match (fds.next(), fds.next()) {
                        (Some(pidfd), Some(sock)) => WarmInit {
                            pid,
                            pidfd,
                            sock: UnixStream::from(sock),
                        },
                        _ => return Err(TemplateError::Refused("descriptors missing".into())),
                    }
                }
                Ok((Reply::Failed { error }, _)) => return Err(TemplateError::Refused(error)),
                Ok(_) => {
                    return Err(TemplateError::Refused(
                        "the sandbox template answered out of turn".into(),
                    ))
                }
                // Nothing of this execution was sent yet: another template
                // may run it.
                Err(e) => return Err(TemplateError::Gone(e.to_string())),
            };
            if ctl.warm_pending == 0 {
                // A template gone by now is found at the next execution.
                let _ = ctl.ask_warm();
            }
            if !exited(init.pidfd.as_fd()) {
                return Ok(init);
            }
        }
        Err(TemplateError::Refused(
            "the execution's init died before it was used".into(),
        ))
    }

    /// Runs one execution of `plan` (whose [`key`] must be this template's)
    /// forked from the template: the same contract as [`run::run`]. `stdin`
    /// is the command's stdin (None: /dev/null), taken once the execution
    /// has it (left for another template on [`TemplateError::Gone`]);
    /// `control` carries its stop
    /// (cancel) requests, as for [`run::run_with`]. Err: the
    /// template could not start it (nothing ran; the caller may take the
    /// one-shot path).
    pub fn run(
        &self,
        plan: &Plan,
        opts: &RunOptions,
        observer: &mut dyn RunObserver,
        stdin: &mut Option<OwnedFd>,
        cwd: Option<(u64, u64)>,
        control: Control<'_>,
    ) -> Result<RunOutcome, TemplateError> {
        let k = key(plan).map_err(TemplateError::Refused)?;
        self.run_keyed(plan, &k, opts, observer, stdin, cwd, control)
    }

    /// [`Template::run`] with `plan`'s [`key`] computed by the caller, once
    /// per execution for [`Templates::get_keyed`] and this check (it
    /// serializes the view and stats every bind source).
    #[allow(clippy::too_many_arguments)]
    pub fn run_keyed(
        &self,
        plan: &Plan,
        plan_key: &str,
        opts: &RunOptions,
        observer: &mut dyn RunObserver,
        stdin: &mut Option<OwnedFd>,
        cwd: Option<(u64, u64)>,
        control: Control<'_>,
    ) -> Result<RunOutcome, TemplateError> {
        if plan_key != self.key {
            // Never a stale view: the plan computed for this execution
            // must be the one the template was built from.
            return Err(TemplateError::Refused(
                "the plan is not this template's".into(),
            ));
        }
        if let Some(why) = ineligible(plan, opts) {
            return Err(TemplateError::Refused(format!(
                "not eligible for a template: {why}"
            )));
        }
        let start = Instant::now();
        let mut out = RunOutcome::refused(String::new());
        out.error = None;
        out.backend = "namespaces";
        out.launch = "template";
        let refused = |e: String| {
            let mut o = RunOutcome::refused(e);
            o.launch = "template";
            o
        };
        if opts.argv.is_empty() {
            return Ok(refused("no command given; put it after --".into()));
        }
        let argv = run::cstrings(opts.argv.iter().map(|a| a.as_bytes().to_vec()));
        let env = run::cstrings(
            plan.env
                .iter()
                .filter(|(k, _)| k != LAUNCH_ENV)
                .map(|(k, v)| format!("{k}={v}").into_bytes())
                .chain([format!("{LAUNCH_ENV}={LAUNCHED_FROM_TEMPLATE}").into_bytes()]),
        );
        let (argv, env) = match (argv, env) {
            (Ok(a), Ok(e)) => (a, e),
            (Err(e), _) | (_, Err(e)) => return Ok(refused(e)),
        };
        let dev_null;
        let stdin_fd = match stdin.as_ref() {
            Some(fd) => fd.as_raw_fd(),
            None => {
                dev_null = std::fs::File::open("/dev/null")
                    .map(OwnedFd::from)
                    .map_err(|e| format!("open /dev/null: {e}"))?;
                dev_null.as_raw_fd()
            }
        };
        let wanted: &[(Stream, usize, Option<i32>)] = match opts.output {
            OutputMode::Capture { limit } => {
                &[(Stream::Stdout, limit, None), (Stream::Stderr, limit, None)]
            }
            _ => &[(Stream::Stdout, 0, None), (Stream::Stderr, 0, None)],
        };
        let mut captures = Vec::new();
        let (mut stdout_w, mut stderr_w) = (None, None);
        run::capture_pipes(wanted, &mut captures, &mut stdout_w, &mut stderr_w)?;
        let (stdout_w, stderr_w) = match (stdout_w, stderr_w) {
            (Some(o), Some(e)) => (o, e),
            _ => return Err(TemplateError::Refused("output pipes missing".into())),
        };
        let (report_r, report_w) = run::report_channel()
            .map_err(|e| format!("create the execution's report channel: {e}"))?;
        let (argv, env): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (
            argv.iter().map(|c| c.as_bytes().to_vec()).collect(),
            env.iter().map(|c| c.as_bytes().to_vec()).collect(),
        );
        let encode = |last: bool| {
            serde_json::to_vec(&Request::Exec {
                argv: argv.clone(),
                env: env.clone(),
                cwd,
                last,
            })
            .map_err(|e| format!("encode the execution: {e}"))
        };
        let mut request = encode(false)?;
        crate::timing::mark("template: key checked, argv, env, pipes");
        let mut attempts = 0;
        let init =
            loop {
                if attempts == MAX_STALE {
                    request = encode(true)?;
                }
                let init = self.take_warm()?;
                crate::timing::mark("template: warm init taken");
                // Straight to the execution's command, confined and waiting:
                // neither the template nor the init is on this path.
                let sent = send_frame(
                    init.sock.as_fd(),
                    &request,
                    &[
                        stdin_fd,
                        stdout_w.as_raw_fd(),
                        stderr_w.as_raw_fd(),
                        report_w.as_raw_fd(),
                    ],
                );
                if let Err(e) = sent {
                    stdin.take();
                    return Err(TemplateError::Refused(format!(
                        "hand the execution to its init: {e}"
                    )));
                }
                // The command answers `Stale` (and exits, having used none of
                // the descriptors) or closes its socket as it starts.
                match recv_frame::<Reply>(init.sock.as_fd()) {
                    Ok((Reply::Stale, _)) if attempts < MAX_STALE => {
                        attempts += 1;
                        crate::timing::mark("template: stale init discarded");
                    }
                    Ok((Reply::Stale, _)) => return Err(TemplateError::Refused(
                        "the view's inputs kept changing while the execution started; nothing ran"
                            .into(),
                    )),
                    _ => break init,
                }
            };
        // From here the execution may have its stdin: never run twice.
        stdin.take();
        crate::timing::mark("template: handed to the command");
        let (pid, pidfd) = (init.pid, init.pidfd);
        // Only the execution holds the write ends now.
        drop((stdout_w, stderr_w, report_w));
        out.layers.namespaces = Enforcement::Full;
        let init = InitHandle::Forked {
            pid: nix::unistd::Pid::from_raw(pid),
            pidfd,
        };
        if let Err(e) = run::supervise(
            init,
            plan,
            opts,
            &mut out,
            captures,
            report_r,
            None,
            start,
            observer,
            &Enforcer::default(),
            control,
        ) {
            out.status = run::RunStatus::FailedToStart;
            out.exit_code = 125;
            out.error = Some(e);
        }
        crate::timing::mark("template: the execution ended");
        self.refill();
        out.duration = start.elapsed();
        out.usage.duration_ms = out.duration.as_millis() as u64;
        // Every process of the execution is gone (its pid namespace died
        // with its init), so nothing races the sweep.
        let report = crate::sweep::sweep(&plan.sweep, &opts.tag);
        out.swept = report.swept;
        out.sweep_failed = report.failed;
        crate::timing::mark("template: sweep");
        Ok(out)
    }

    /// Asks for inits until [`WARM_STOCK`] are on their way or waiting
    /// (a template gone by now is found at the next execution).
    fn refill(&self) {
        let mut ctl = self.lock_ctl();
        while ctl.warm_pending < WARM_STOCK && ctl.ask_warm().is_ok() {}
    }

    /// Asks the template to exit once its running executions are done.
    fn retire(&self) {
        let request = serde_json::to_vec(&Request::Retire).unwrap_or_default();
        let ctl = self.lock_ctl();
        let _ = send_frame(ctl.sock.as_fd(), &request, &[]);
        let _ = ctl.sock.shutdown(std::net::Shutdown::Write);
    }
}

impl Ctl {
    /// Asks the template for the next execution's init (answered later).
    fn ask_warm(&mut self) -> std::io::Result<()> {
        let request = serde_json::to_vec(&Request::Warm).unwrap_or_default();
        send_frame(self.sock.as_fd(), &request, &[])?;
        self.warm_pending += 1;
        Ok(())
    }
}

impl Drop for Template {
    fn drop(&mut self) {
        self.retire();
        let child = self
            .process
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut child) = child {
            // Reaped off the caller's path: it exits when its last
            // execution does.
            let _ = std::thread::Builder::new()
                .name("moat-template-reaper".into())
                .spawn(move || child.wait());
        }
    }
}

/// The templates of one service, by key.
pub struct Templates {
    moat: PathBuf,
    map: Mutex<Vec<(String, Arc<Template>)>>,
}

impl Templates {
    /// Templates started from moat's binary `moat`.
    pub fn new(moat: PathBuf) -> Templates {
        Templates {
            moat,
            map: Mutex::new(Vec::new()),
        }
    }

    /// The template for `plan`, started when there is none for its key. A
    /// template of the same cwd with another key is stale (the view's
    /// inputs changed since it was built): it is retired.
    pub fn get(&self, plan: &Plan) -> Result<Arc<Template>, String> {
        self.get_keyed(plan, &key(plan)?)
    }

    /// [`Templates::get`] with `plan`'s [`key`] `k` computed by the caller.
    pub fn get_keyed(&self, plan: &Plan, k: &str) -> Result<Arc<Template>, String> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = map.iter().position(|(x, _)| *x == k) {
            let entry = map.remove(i);
            // A template whose process died (killed, out of memory) is
            // replaced, not asked.
            if entry.1.alive() {
                let t = entry.1.clone();
                map.push(entry);
                return Ok(t);
            }
        }
        let t = Arc::new(Template::start(plan, &self.moat)?);
        map.retain(|(_, old)| !same_place(old, plan));
        map.push((k.to_string(), t.clone()));
        while map.len() > MAX_TEMPLATES {
            map.remove(0);
        }
        Ok(t)
    }

    /// Forgets `t` (it failed to start an execution: its process may be
    /// gone); the next execution of its plan gets a new template.
    pub fn discard(&self, t: &Arc<Template>) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|(_, x)| !Arc::ptr_eq(x, t));
    }

    /// How many templates are alive (for status reports and tests).
    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// No template is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn same_place(t: &Template, plan: &Plan) -> bool {
    let cwd = serde_json::to_string(&plan.cwd).unwrap_or_default();
    t.key.contains(&format!("\"cwd\":{cwd}"))
}

// ---------------------------------------------------------------------------
// Framing: a u32 length and a JSON body; descriptors ride on the first byte.

pub(crate) fn send_frame(sock: BorrowedFd<'_>, body: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let len = (body.len() as u32).to_le_bytes();
    let cmsg = [ControlMessage::ScmRights(fds)];
    let iov = [IoSlice::new(&len), IoSlice::new(body)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None)
        .map_err(std::io::Error::from)?;
    let total = len.len() + body.len();
    if sent < total {
        // The rest carries no descriptors.
        let mut rest = Vec::with_capacity(total - sent);
        rest.extend_from_slice(&len);
        rest.extend_from_slice(body);
        let mut stream = std::fs::File::from(sock.try_clone_to_owned()?);
        stream.write_all(&rest[sent..])?;
    }
    Ok(())
}

pub(crate) fn recv_frame<T: serde::de::DeserializeOwned>(
    sock: BorrowedFd<'_>,
) -> std::io::Result<(T, Vec<OwnedFd>)> {
    let (body, fds) = recv_frame_bytes(sock)?;
    let value = serde_json::from_slice(&body).map_err(std::io::Error::other)?;
    Ok((value, fds))
}

/// One frame's body, not decoded, and its descriptors.
pub(crate) fn recv_frame_bytes(sock: BorrowedFd<'_>) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut len = [0u8; 4];
    let (got, fds) = sys::recv_with_fds::<4>(sock, &mut len)?;
    if got == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    read_exact_from(sock, &mut len[got..])?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(std::io::Error::other("control message too large"));
    }
    let mut body = vec![0u8; n];
    read_exact_from(sock, &mut body)?;
    Ok((body, fds))
}

/// Fills `buf` from `sock` (no duplicate of the fd, as a `File` would need).
fn read_exact_from(sock: BorrowedFd<'_>, mut buf: &mut [u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match nix::unistd::read(sock, buf) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The template process.

/// `moat __template`: becomes a sandbox template on the control socket at
/// fd 3. Must be called while the process is single-threaded (first thing
/// in main). Never returns.
pub fn template_main() -> ! {
    crate::timing::init();
    // Started with the user's soft limit (see `Template::start`): that one
    // is the commands', the raised one this process's.
    crate::limits::raise_open_files();
    let Ok(ctl) = crate::process::take_inherited_fd(CTL_FD) else {
        eprintln!("moat: `moat {SUBCOMMAND}` is internal: `moat serve` and `moat mcp` start it with its control socket");
        sys::exit_now(125)
    };
    let ctl = UnixStream::from(ctl);
    let spec = match recv_frame::<Spec>(ctl.as_fd()) {
        Ok((s, _)) => s,
        Err(_) => sys::exit_now(125),
    };
    let program: seccompiler::BpfProgram = spec
        .seccomp
        .iter()
        .map(|&(code, jt, jf, k)| seccompiler::sock_filter { code, jt, jf, k })
        .collect();
    let plan = spec.plan;
    // What every execution's init and command would otherwise work out
    // again from the plan (the narrowing mounts compare every op with every
    // earlier one): computed once, before the first fork.
    let per_exec = crate::mounts::per_execution(&plan.mounts);
    let shared = Shared {
        late: crate::mounts::deferred(&plan.mounts, &per_exec),
        narrowing: crate::mounts::narrowing_targets(&plan.mounts)
            .into_iter()
            .map(Path::to_path_buf)
            .collect(),
        last_cap: sys::last_cap(),
        per_exec,
        program,
    };
    let scratch = match become_template(&plan, &shared.per_exec) {
        Ok(s) => s,
        Err(error) => {
            let body = serde_json::to_vec(&Reply::Failed { error }).unwrap_or_default();
            let _ = send_frame(ctl.as_fd(), &body, &[]);
            sys::exit_now(125);
        }
    };
    let ready = serde_json::to_vec(&Reply::Ready).unwrap_or_default();
    if send_frame(ctl.as_fd(), &ready, &[]).is_err() {
        sys::exit_now(125);
    }
    serve(&ctl, &plan, &shared, &scratch)
}

/// What the template works out from its plan once, for every execution.
struct Shared {
    /// The ops each execution lays itself ([`crate::mounts::per_execution`]).
    per_exec: Vec<bool>,
    /// Of those, the ones whose mount ids the command checks at its
    /// request ([`crate::mounts::deferred`]).
    late: Vec<bool>,
    /// The targets the init watches for the host replacing them
    /// ([`crate::mounts::narrowing_targets`]).
    narrowing: Vec<PathBuf>,
    /// The highest capability number (`/proc/sys/kernel/cap_last_cap`).
    last_cap: libc::c_ulong,
    /// The compiled seccomp filter.
    program: seccompiler::BpfProgram,
}

/// The namespaces and the shared part of the view, once.
fn become_template(plan: &Plan, per_exec: &[bool]) -> Result<OwnedFd, String> {
    // Executions are reaped by the kernel: the template only forks.
    sys::ignore_signal(libc::SIGCHLD);
    let mut flags = nix::sched::CloneFlags::CLONE_NEWUSER
        | nix::sched::CloneFlags::CLONE_NEWNS
        | nix::sched::CloneFlags::CLONE_NEWIPC
        | nix::sched::CloneFlags::CLONE_NEWUTS
        | nix::sched::CloneFlags::CLONE_NEWCGROUP;
    if plan.new_netns {
        flags |= nix::sched::CloneFlags::CLONE_NEWNET;
    }
    // The same refusal, with the same fix, as a one-shot run's clone.
    nix::sched::unshare(flags).map_err(|e| crate::run::clone_error(e.into(), plan))?;
    crate::mounts::set_identity(&Kernel, plan)?;
    // Every execution's pid 1 is a fork of this process: its command line
    // (moat's host path) is wiped as the one-shot init's is.
    // SAFETY: the template process is single-threaded and reads its
    // arguments no more (main dispatched on them before calling here).
    unsafe { sys::wipe_argv_block() }
        .map_err(|e| format!("clear the template's command line: {e}"))?;
    crate::mounts::build_template_root(&Kernel, &plan.mounts, per_exec)
        .map_err(|e| format!("build the sandbox view: {e}"))
}

/// Forks an execution's init per `Warm` request until the service goes
/// away (then every execution is killed) or retires the template (then it
/// waits for them). The service asks for the next init as soon as it takes
/// one ("warm"): its namespaces and its whole view are laid, and its
/// command forked and confined, while nothing waits ([`init_main`]); the
/// service hands the request and its descriptors to that command over its
/// own socket, without a round trip through this process. Each init serves
/// one execution; one never used exits when the service closes its socket.
fn serve(ctl: &UnixStream, plan: &Plan, shared: &Shared, scratch: &OwnedFd) -> ! {
    let mut running: Vec<OwnedFd> = Vec::new();
    loop {
        running.retain(|p| !exited(p.as_fd()));
        let request = match recv_frame::<Request>(ctl.as_fd()) {
            Ok((r, _)) => r,
            Err(_) => {
                // The service is gone: nothing it started may outlive it.
                for p in &running {
                    let _ = sys::pidfd_send_signal(p.as_fd(), libc::SIGKILL);
                }
                sys::exit_now(0);
            }
        };
        match request {
            Request::Warm => {}
            Request::Exec { .. } => {
                let body = serde_json::to_vec(&Reply::Failed {
                    error: "a template forks inits; the command goes to an init".into(),
                })
                .unwrap_or_default();
                let _ = send_frame(ctl.as_fd(), &body, &[]);
                continue;
            }
            Request::Retire => {
                for p in &running {
                    let mut fds = [nix::poll::PollFd::new(
                        p.as_fd(),
                        nix::poll::PollFlags::POLLIN,
                    )];
                    while nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE).is_err() {}
                }
                sys::exit_now(0);
            }
        }
        let (body, init) = match spawn_init(plan, shared, scratch) {
            Ok(init) => (Reply::Warm { pid: init.pid }, Some(init)),
            Err(error) => (Reply::Failed { error }, None),
        };
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let attached: Vec<RawFd> = init
            .iter()
            .flat_map(|i| [i.pidfd.as_raw_fd(), i.sock.as_raw_fd()])
            .collect();
        let _ = send_frame(ctl.as_fd(), &body, &attached);
        // The service holds the init's socket now; this process keeps its
        // pidfd, to kill it should the service go away.
        running.extend(init.map(|i| i.pidfd));
    }
}

fn exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut fds = [nix::poll::PollFd::new(pidfd, nix::poll::PollFlags::POLLIN)];
    matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
}

/// An execution's init, forked and waiting for its command (the template's
/// side: its socket goes to the service).
struct Init {
    pid: i32,
    pidfd: OwnedFd,
    sock: UnixStream,
}

/// Forks an execution's init: pid 1 of its own pid namespace, in its own
/// copy of the template's mounts (and ipc and uts namespaces).
fn spawn_init(plan: &Plan, shared: &Shared, scratch: &OwnedFd) -> Result<Init, String> {
    let (ours, theirs) = UnixStream::pair().map_err(|e| format!("create a socket pair: {e}"))?;
    let flags = libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    // SAFETY: the template process is single-threaded (see
    // `template_main`), so the child may run ordinary Rust.
    match unsafe { sys::clone_with_pidfd(flags) } {
        Ok((Forked::Child, _)) => init_main(plan, shared, scratch, &theirs),
        Ok((Forked::Parent(pid), Some(pidfd))) => Ok(Init {
            pid,
            pidfd,
            sock: ours,
        }),
        Ok((Forked::Parent(_), None)) => Err("clone gave no pidfd".into()),
        Err(e) => Err(format!("fork an execution: {e}")),
    }
}

/// The execution's init, ahead of its request: lays its whole view
/// (fresh filesystems and the mounts that narrow host binds), detaches the
/// host's root, and forks the command, which confines itself (capabilities,
/// Landlock, seccomp) and waits for the request ([`command_main`]). The
/// init then waits for the report pipe from the command and reaps the tree
/// as the one-shot init does. Never returns.
fn init_main(plan: &Plan, shared: &Shared, scratch: &OwnedFd, sock: &UnixStream) -> ! {
    // The template ignores SIGCHLD (the kernel reaps executions); this init
    // reaps its own tree. The command resets every signal itself.
    sys::default_signal(libc::SIGCHLD);
    if sys::set_sigmask(libc::SIG_BLOCK, INIT_SIGNALS).is_err()
        || nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).is_err()
    {
        sys::exit_now(125);
    }
    // Keep stdio (the template's /dev/null), the socket and the scratch
    // tmpfs: everything else the template holds (its control socket, other
    // executions' pidfds) closes.
    let (a, b) = {
        let (x, y) = (sock.as_raw_fd() as u32, scratch.as_raw_fd() as u32);
        (x.min(y), x.max(y))
    };
    // SAFETY: the owners of these fds are never dropped in this process,
    // which execs or exits; `sock` and `scratch` are not among them.
    let closed = unsafe { sys::close_range(3, a - 1) }
        .and_then(|()| unsafe { sys::close_range(a + 1, b - 1) })
        .and_then(|()| unsafe { sys::close_range(b + 1, u32::MAX) });
    if closed.is_err() {
        sys::exit_now(125);
    }
    // The whole view, ahead. The mounts that narrow a host path
    // (`mounts::deferred`) may be detached by the host (an unlink or
    // rename over their dentry) while this execution waits: their mount
    // ids are kept, and the command compares them once the request came
    // (after the caller checked its plan against the host as it is then).
    let (per_exec, late) = (&shared.per_exec, &shared.late);
    let view =
        crate::mounts::prepare_execution_root(&Kernel, &plan.mounts, per_exec, late, scratch)
            .and_then(|()| {
                crate::mounts::finish_execution_root(&Kernel, &plan.mounts, late, scratch)
            })
            .map_err(|e| format!("build the sandbox view: {e}"))
            .and_then(|()| late_mount_ids(plan, late));
    // SAFETY: the scratch tmpfs's owner lives in the template's memory and
    // is never used or dropped in this process; every stand-in is laid.
    let _ = unsafe { sys::close_range(scratch.as_raw_fd() as u32, scratch.as_raw_fd() as u32) };
    crate::timing::mark("init: the view laid ahead");
    let marks = match view {
        Ok(marks) => marks,
        // Reported once the execution's report pipe arrives.
        Err(e) => {
            let Some(report_fd) = take_request(sock) else {
                sys::exit_now(0)
            };
            init::fail(report_fd, SetupStage::Sandbox, 0, &e)
        }
    };
    // The command sends the report pipe here once it has its request. Fd 3
    // is held (a copy of stdin, /dev/null) so that this pair lies above the
    // request's descriptors, which go to 0-3.
    // SAFETY: fd 3 is free (closed above) and owned by no Rust object.
    if unsafe { sys::dup2(0, 3) }.is_err() {
        sys::exit_now(125);
    }
    // The watch over the mounts that narrow host paths, armed ahead too
    // (as the one-shot init arms it, [`init::arm_watch`], but before the
    // command exists, so nothing it does can race the arming): from here
    // the host replacing one of them queues an event, which the init reads
    // once the execution has its request (the command's own check at the
    // request covers the mounts for the wait, this watch from then on).
    // Off an execution's path: the init no longer runs beside the
    // command's exec. Some(None): nothing to watch. None: it could not be
    // armed now (a target already replaced, an inotify limit); it is armed
    // once the command has its request, as before, with that run's
    // outcome on failure.
    let ahead: Option<Option<crate::watch::Watch>> = if plan.sandboxed && !plan.landlock_only() {
        crate::watch::Watch::arm_paths(shared.narrowing.iter().map(PathBuf::as_path).collect()).ok()
    } else {
        Some(None)
    };
    crate::timing::mark("init: the watch armed ahead");
    let Ok((to_init, from_command)) = UnixStream::pair() else {
        sys::exit_now(125)
    };
    // SAFETY: the init has one thread (a clone's child of a single-threaded
    // process); glibc's fork makes malloc usable in the child.
    let command = match unsafe { sys::fork_glibc() } {
        Ok(0) => {
            drop(to_init);
            command_main(plan, shared, sock, &from_command, &marks)
        }
        Ok(pid) => nix::unistd::Pid::from_raw(pid),
        Err(_) => sys::exit_now(125),
    };
    // Only the command holds the request's socket: the service sees its end
    // when the command starts (or dies).
    // SAFETY: `sock`'s owner is never used or dropped in this process again.
    let _ = unsafe { sys::close_range(sock.as_raw_fd() as u32, sock.as_raw_fd() as u32) };
    drop(from_command);
    let report = loop {
        let mut byte = [0u8; 1];
        match sys::recv_with_fds::<1>(to_init.as_fd(), &mut byte) {
            Ok((1, fds)) if fds.len() == 1 && byte[0] == b'R' => break fds.into_iter().next(),
            // The command could not look at a mount laid ahead itself (a
            // directory on the way it may not search): the init, which
            // still holds its capabilities, answers for it.
            Ok((1, fds)) if fds.is_empty() && byte[0] == CHECK_ASK => {
                let answer = if stale(&marks) {
                    CHECK_STALE
                } else {
                    CHECK_FRESH
                };
                if (&to_init).write_all(&[answer]).is_err() {
                    break None;
                }
            }
            _ => break None,
        }
    };
    let Some(report) = report else {
        // The command left without its request (the service closed this
        // init's socket unused, or the view was stale).
        sys::exit_now(0)
    };
    let report_fd: RawFd = 3;
    // SAFETY: fd 3 of this process (the /dev/null copy) is owned by no Rust
    // object; `report` was received above it.
    if unsafe { sys::dup2(report.as_raw_fd(), report_fd) }.is_err() {
        sys::exit_now(125);
    }
    // Every fd above the report pipe but the watch's closes.
    let mut keep: Vec<RawFd> = ahead.iter().flatten().flat_map(|w| w.fds()).collect();
    keep.sort_unstable();
    let mut from = 4u32;
    for fd in keep.into_iter().map(|fd| fd as u32).filter(|&fd| fd >= 4) {
        if fd > from {
            // SAFETY: the owners of the fds in this range (`to_init`,
            // `report`) are never used again; the init leaves by `_exit`.
            let _ = unsafe { sys::close_range(from, fd - 1) };
        }
        from = fd + 1;
    }
    // SAFETY: as above.
    let _ = unsafe { sys::close_range(from, u32::MAX) };
    // The command has its request and execs: from here the host replacing
    // a narrowing mount stops the execution, as a one-shot run (the
    // command's own check at the request covered the wait before).
    let watch = match ahead {
        Some(watch) => watch,
        None => init::arm_watch(report_fd, plan),
    };
    init::supervise_tree(report_fd, command, true, watch.as_ref())
}

/// The mount at each target of a late op that is a mount, as laid: its id,
/// or None when the target is no mount's root already (the host replaced
/// the file between the mount and this look: the execution is stale).
type LateMounts = Vec<(PathBuf, Option<u64>)>;

fn late_mount_ids(plan: &Plan, late: &[bool]) -> Result<LateMounts, String> {
    let mut out: LateMounts = Vec::new();
    for (op, late) in plan.mounts.iter().zip(late) {
        if !*late || matches!(op, MountOp::File { .. } | MountOp::Symlink { .. }) {
            continue;
        }
        let target = op.target();
        if out.iter().any(|(t, _)| t == target) {
            continue;
        }
        let id = sys::mount_root_id(target)
            .map_err(|e| format!("read the mount id of {}: {e}", target.display()))?;
        out.push((target.to_path_buf(), id));
    }
    Ok(out)
}

/// Whether a mount laid ahead is gone or was never seen in place (or
/// cannot be looked at: never taken for in place).
fn stale(marks: &LateMounts) -> bool {
    look(marks) != Freshness::Fresh
}

/// What a look at the mounts laid ahead found.
#[derive(PartialEq)]
enum Freshness {
    /// Each is still the root at its target.
    Fresh,
    /// One is gone (or was never seen in place).
    Stale,
    /// None found gone, but one could not be looked at: a directory on its
    /// way is one this process may not search (the confined command,
    /// without capabilities, under a mode-000 `~/.cargo`).
    Unknown,
}

fn look(marks: &LateMounts) -> Freshness {
    let mut unknown = false;
    for (target, id) in marks {
        match (id, sys::mount_root_id(target)) {
            (None, _) => return Freshness::Stale,
            (Some(id), Ok(now)) if now == Some(*id) => {}
            (_, Ok(_)) => return Freshness::Stale,
            (_, Err(_)) => unknown = true,
        }
    }
    if unknown {
        Freshness::Unknown
    } else {
        Freshness::Fresh
    }
}

/// The command's question to its init on their socket pair (a look it
/// could not make itself, see [`Freshness::Unknown`]) and the init's
/// answers.
const CHECK_ASK: u8 = b'C';
const CHECK_FRESH: u8 = b'F';
const CHECK_STALE: u8 = b'S';

/// The command's check at request time: its own look, and when that
/// cannot decide, its init's (same mount namespace, capabilities kept).
fn stale_at_request(marks: &LateMounts, to_init: &UnixStream) -> bool {
    match look(marks) {
        Freshness::Fresh => false,
        Freshness::Stale => true,
        Freshness::Unknown => {
            let mut answer = [0u8; 1];
            let asked = (&*to_init)
                .write_all(&[CHECK_ASK])
                .and_then(|()| (&*to_init).read_exact(&mut answer));
            !(asked.is_ok() && answer[0] == CHECK_FRESH)
        }
    }
}

/// For an init whose view could not be laid ahead: the request's
/// descriptors on `sock` (stdin, stdout, stderr, report are duplicated to
/// 0-3), to report the failure on; returns the report fd (3). None when the
/// socket closed unused, or when the request is not its execution's last
/// try: then the init answers `Stale` having used nothing of it, and the
/// caller hands it to a fresh init. A view laid while the host renamed a
/// path one of its mounts goes on fails so (the mount finds its dentry
/// gone), and the next init, laid after the rename, succeeds; a view that
/// cannot be laid at all fails every try, the last with its error.
fn take_request(sock: &UnixStream) -> Option<RawFd> {
    let (last, fds) = match recv_frame::<Request>(sock.as_fd()) {
        Ok((Request::Exec { last, .. }, fds)) if fds.len() == 4 => (last, fds),
        _ => return None,
    };
    if !last {
        let body = serde_json::to_vec(&Reply::Stale).unwrap_or_default();
        let _ = send_frame(sock.as_fd(), &body, &[]);
        return None;
    }
    install_fds(&fds);
    Some(3)
}

/// Puts a request's descriptors at 0-3. Exits on failure.
fn install_fds(fds: &[OwnedFd]) {
    for (i, fd) in fds.iter().enumerate() {
        // SAFETY: fds 0-3 of this child are owned by no Rust object that is
        // ever dropped (it execs or exits); a received fd numbered below
        // `i` was duplicated to its own place already (see the loop order).
        if unsafe { sys::dup2(fd.as_raw_fd(), i as RawFd) }.is_err() {
            sys::exit_now(125);
        }
    }
}

/// The execution's command, forked by its init ahead of the request:
/// confines itself (capabilities, Landlock, seccomp), then waits for the
/// request. Once it has it: checks that every mount laid ahead that the host
/// could detach is still in place (else answers `Stale` and leaves, nothing
/// used), takes its descriptors, hands the report pipe to the init, enters
/// the checked cwd and execs. Never returns.
fn command_main(
    plan: &Plan,
    shared: &Shared,
    sock: &UnixStream,
    to_init: &UnixStream,
    marks: &LateMounts,
) -> ! {
    sys::reset_signals();
    // The template raised its own open-file limit (it holds a pidfd per
    // running execution); the command gets the user's back. A failure is
    // reported once the report pipe arrives.
    let restored = crate::limits::restore_open_files();
    let confined = init::confine_command(plan, shared.last_cap, Some(&shared.program));
    crate::timing::mark("command: confined ahead");
    let (argv, env, cwd, fds) = match recv_frame::<Request>(sock.as_fd()) {
        Ok((Request::Exec { argv, env, cwd, .. }, fds)) if fds.len() == 4 => (argv, env, cwd, fds),
        // The service closed this execution's socket unused (its template
        // retired or went away).
        _ => sys::exit_now(0),
    };
    crate::timing::mark("command: request taken");
    if stale_at_request(marks, to_init) {
        let body = serde_json::to_vec(&Reply::Stale).unwrap_or_default();
        let _ = send_frame(sock.as_fd(), &body, &[]);
        sys::exit_now(0);
    }
    crate::timing::mark("command: mounts laid ahead still in place");
    install_fds(&fds);
    let report_fd: RawFd = 3;
    if crate::netns::send_fds(to_init.as_raw_fd(), b'R', &[report_fd]).is_err() {
        sys::exit_now(125);
    }
    // Closes the request's socket (the service's signal that the command
    // started), the init's socket and the received originals.
    // SAFETY: their owners are never used or dropped again: this process
    // execs or exits.
    if unsafe { sys::close_range(4, u32::MAX) }.is_err() {
        init::fail(report_fd, SetupStage::Sandbox, 0, "close inherited fds");
    }
    restored.unwrap_or_else(|e| init::fail(report_fd, SetupStage::Sandbox, 0, &e));
    let layers =
        confined.unwrap_or_else(|e| init::fail(report_fd, SetupStage::Confine, 0, &e.to_string()));
    init::enter_cwd(plan, cwd)
        .unwrap_or_else(|(errno, e)| init::fail(report_fd, SetupStage::Sandbox, errno, &e));
    let (argv, envp) = match (run::cstrings(argv), run::cstrings(env)) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(e), _) | (_, Err(e)) => init::fail(report_fd, SetupStage::Sandbox, 0, &e),
    };
    let _ = sys::cloexec_from(3);
    crate::init_msg::send(
        report_fd,
        &crate::init_msg::InitMessage::Confined {
            landlock: layers[0],
            seccomp: layers[1],
        },
    );
    init::exec_search(report_fd, &argv, &envp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_request_keeps_every_c_string_byte_for_byte() {
        let argv = vec![
            b"/bin/sh".to_vec(),
            Vec::new(),
            vec![0xff, b'\n', 0x80, b'"'],
        ];
        let env = vec![b"A=1".to_vec(), b"EMPTY=".to_vec()];
        let body = serde_json::to_vec(&Request::Exec {
            argv: argv.clone(),
            env: env.clone(),
            cwd: Some((1, 2)),
            last: false,
        })
        .unwrap();
        match serde_json::from_slice(&body).unwrap() {
            Request::Exec {
                argv: a,
                env: e,
                cwd,
                last,
            } => {
                assert_eq!((a, e, cwd, last), (argv, env, Some((1, 2)), false));
            }
            _ => panic!("not an Exec"),
        }
        let none = serde_json::to_vec(&Request::Exec {
            argv: Vec::new(),
            env: Vec::new(),
            cwd: None,
            last: true,
        })
        .unwrap();
        assert!(matches!(
            serde_json::from_slice(&none).unwrap(),
            Request::Exec { argv, env, cwd: None, last: true } if argv.is_empty() && env.is_empty()
        ));
    }

    #[test]
    fn an_exec_request_with_a_nul_inside_a_string_is_refused() {
        let bad = Request::Exec {
            argv: vec![b"a\0b".to_vec()],
            env: Vec::new(),
            cwd: None,
            last: false,
        };
        assert!(serde_json::to_vec(&bad).is_err());
        for body in [
            r#"{"Exec":{"argv":"61","env":"","cwd":null}}"#,
            r#"{"Exec":{"argv":"6","env":"","cwd":null}}"#,
            r#"{"Exec":{"argv":"6G00","env":"","cwd":null}}"#,
        ] {
            assert!(serde_json::from_str::<Request>(body).is_err(), "{body}");
        }
    }
}
