//! `moat exec`: resolve the policy, plan, run, and report — as plain text,
//! one `--json` object, or a live `--events` stream — and record every run
//! in the audit log.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use moat_linux::OutputMode;
use moat_policy::Policy;
use moat_runtime::{
    AuditTarget, Completed, Denial, Event, EventSink, ExecutionRequest, ExecutionResult, InProcess,
};
use serde_json::Value;

use crate::{resolve_policy, ExecArgs, CAPTURE_LIMIT, EXIT_MOAT_FAILED, EXIT_SWEEP_FAILED};

/// The sink of a run: with `--events`, stdout, one whole line per write
/// (the proxy's threads write to it too); otherwise nothing.
fn stdout_sink(events: bool) -> EventSink {
    if !events {
        return moat_runtime::no_sink();
    }
    let out = Mutex::new(std::io::stdout());
    Arc::new(move |ev: Value| {
        if let Ok(mut out) = out.lock() {
            let mut line = ev.to_string();
            line.push('\n');
            let _ = out.write_all(line.as_bytes());
            let _ = out.flush();
        }
    })
}

/// Bytes of events queued for stdout past which the run stops reading the
/// command's output until the reader catches up.
const EVENTS_BACKLOG: usize = 1 << 20;

/// `--events` on stdout, written by a thread of its own once the command
/// runs: from then on the run's sink never blocks on a reader that stopped
/// reading (the timeout and stop requests must still fire); the run is told
/// when the queue is long. Before the command starts, events are written
/// on the calling thread: the supervisor clones the sandbox's init as a
/// copy of this process, which must then be single-threaded
/// (`sys::clone_process`) — a writer thread inside `free` at that moment
/// left the init waiting forever on the allocator's lock (one launch in
/// about fifteen of 80 concurrent `serve --launch oneshot` executions).
struct QueuedStdout {
    /// None until the command's start: events are written synchronously.
    tx: Mutex<Option<std::sync::mpsc::Sender<Vec<u8>>>>,
    queued: Arc<AtomicUsize>,
    written: Arc<AtomicU64>,
}

impl QueuedStdout {
    fn start() -> Arc<QueuedStdout> {
        Arc::new(QueuedStdout {
            tx: Mutex::new(None),
            queued: Arc::new(AtomicUsize::new(0)),
            written: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The writer thread, or None when one cannot be started (then the
    /// events stay synchronous rather than being lost).
    fn spawn_writer(&self) -> Option<std::sync::mpsc::Sender<Vec<u8>>> {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let (q, w) = (self.queued.clone(), self.written.clone());
        std::thread::Builder::new()
            .name("moat-events".into())
            .spawn(move || {
                let mut out = std::io::stdout();
                for line in rx {
                    let _ = out.write_all(&line);
                    let _ = out.flush();
                    q.fetch_sub(line.len(), Ordering::Relaxed);
                    w.fetch_add(line.len() as u64, Ordering::Relaxed);
                }
            })
            .ok()
            .map(|_| tx)
    }

    fn send(&self, ev: &Value) {
        let mut line = ev.to_string().into_bytes();
        line.push(b'\n');
        let Ok(mut tx) = self.tx.lock() else { return };
        if tx.is_none() && ev["type"] == moat_runtime::Event::STARTED_KIND {
            *tx = self.spawn_writer();
        }
        match tx.as_ref() {
            Some(tx) => {
                self.queued.fetch_add(line.len(), Ordering::Relaxed);
                let _ = tx.send(line);
            }
            None => {
                let mut out = std::io::stdout();
                let _ = out.write_all(&line);
                let _ = out.flush();
                self.written.fetch_add(line.len() as u64, Ordering::Relaxed);
            }
        }
    }

    fn behind(&self) -> bool {
        self.queued.load(Ordering::Relaxed) > EVENTS_BACKLOG
    }

    /// Wait until every event is written. A stopped run (timeout, stop,
    /// limit) gives up once the reader made no progress for the kill
    /// grace: its last events are best effort, and moat exits.
    fn flush(&self, bounded: bool) {
        let mut last = (
            self.written.load(Ordering::Relaxed),
            std::time::Instant::now(),
        );
        while self.queued.load(Ordering::Relaxed) > 0 {
            let now = self.written.load(Ordering::Relaxed);
            if now != last.0 {
                last = (now, std::time::Instant::now());
            }
            if bounded && last.1.elapsed() >= moat_linux::run::KILL_GRACE {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// A stopped run does not wait forever to say so on a stderr nobody reads
/// (the relay gave up on that reader already): when stderr takes nothing
/// for the kill grace, the report goes to /dev/null and moat exits with
/// the run's code.
fn abandon_stalled_stderr() {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let stderr = std::io::stderr();
    let grace = moat_linux::run::KILL_GRACE.as_millis().min(60_000) as u16;
    let mut fds = [PollFd::new(stderr.as_fd(), PollFlags::POLLOUT)];
    if matches!(poll(&mut fds, PollTimeout::from(grace)), Ok(n) if n > 0) {
        return;
    }
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stderr(&null);
    }
}

/// `code`, once every queued event is on stdout.
fn flushed(queued: &Option<Arc<QueuedStdout>>, code: ExitCode) -> ExitCode {
    if let Some(q) = queued {
        q.flush(false);
    }
    code
}

/// How one run reports and records itself, independent of how its policy
/// was resolved (flags for `moat exec`, a profile for `moat run`).
pub struct Reporting {
    pub json: bool,
    pub events: bool,
    pub audit_log: Option<std::path::PathBuf>,
    pub no_audit: bool,
    pub quiet: bool,
    /// Request metadata to record (a JSON object, checked and redacted).
    pub metadata: Option<String>,
}

impl From<&crate::ReportArgs> for Reporting {
    fn from(a: &crate::ReportArgs) -> Reporting {
        Reporting {
            json: a.json,
            events: a.events,
            audit_log: a.audit_log.clone(),
            no_audit: a.no_audit,
            quiet: a.quiet,
            metadata: a.metadata.clone(),
        }
    }
}

impl Reporting {
    fn mode(&self) -> Mode {
        if self.events {
            Mode::Events
        } else if self.json {
            Mode::Json
        } else {
            Mode::Plain
        }
    }
}

pub fn exec(args: ExecArgs) -> ExitCode {
    let reporting = Reporting::from(&args.report);
    // The directory this process runs in, by what it is rather than by
    // name (taken before the policy reads its name with getcwd): without
    // --cwd it is the workspace, and the command starts only in the view's
    // cwd when that is still this directory. `moat serve` starts its
    // one-shot executions in the directory it checked, by fd, so a rename
    // between its check and the view fails the run closed.
    let cwd_identity = (args.policy.cwd.is_none() && !crate::nested::is_nested_launch())
        .then(|| nix::sys::stat::stat("."))
        .and_then(Result::ok)
        .map(|st| (st.st_dev, st.st_ino));
    let resolved = resolve_policy(&args.policy).map_err(|e| format!("{e:#}"));
    moat_linux::timing::mark("resolve the policy (config, project file)");
    // The sandbox's init is cloned now, so its namespaces are built while
    // moat probes the host (a plain run of the namespaces backend without
    // limits; anything else, or a failed clone, launches serially).
    let early = match &resolved {
        Ok((policy, _)) if !crate::nested::is_nested_launch() && policy.limits.is_unset() => {
            moat_linux::plan::NamespaceSet::for_policy(policy)
                .and_then(|set| moat_linux::EarlyInit::start(set).ok())
        }
        _ => None,
    };
    run_resolved_early(resolved, &reporting, &args.command, cwd_identity, early)
}

/// A refusal before any policy exists (e.g. `moat run` could not resolve one).
pub fn refuse_early(reporting: &Reporting, msg: &str) -> ExitCode {
    refuse(
        reporting.mode(),
        &moat_runtime::execution_id(),
        &moat_audit::session_id_from_env(),
        None,
        msg,
        &stdout_sink(reporting.events),
    )
}

/// Runs `command` under a resolved policy, reporting and auditing it.
pub fn run_resolved(
    resolved: Result<(Policy, Option<std::time::Duration>), String>,
    reporting: &Reporting,
    command: &[std::ffi::OsString],
    cwd_identity: Option<(u64, u64)>,
) -> ExitCode {
    run_resolved_early(resolved, reporting, command, cwd_identity, None)
}

/// [`run_resolved`] with the init `moat exec` cloned early, if any: every
/// return before the launch drops it (killed and reaped).
fn run_resolved_early(
    resolved: Result<(Policy, Option<std::time::Duration>), String>,
    reporting: &Reporting,
    command: &[std::ffi::OsString],
    cwd_identity: Option<(u64, u64)>,
    early: Option<moat_linux::EarlyInit>,
) -> ExitCode {
    let id = moat_runtime::execution_id();
    let session_id = moat_audit::session_id_from_env();
    // A nested run's messages go back into the outer sandbox. The broker
    // already resolved this request (every path through the outer view
    // alone), so a resolution refusal here means a path changed since (a
    // swapped symlink): one answer, naming nothing this host process saw
    // outside that view. (The view check below names only grants that
    // resolved inside the outer view.)
    let nested = crate::nested::is_nested_launch();
    const CHANGED: &str = "nested run refused: a path given changed while the request was checked; it no longer resolves inside the outer run's view";
    let resolved = resolved.map_err(|e| if nested { CHANGED.to_string() } else { e });
    let env: Vec<(String, String)> = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let mode = reporting.mode();
    let queued = reporting.events.then(QueuedStdout::start);
    let sink: EventSink = match &queued {
        Some(q) => {
            let q = q.clone();
            Arc::new(move |ev: Value| q.send(&ev))
        }
        None => moat_runtime::no_sink(),
    };
    let (policy, timeout) = match resolved {
        Ok(p) => p,
        Err(e) => return flushed(&queued, refuse(mode, &id, &session_id, None, &e, &sink)),
    };
    // A nested run: the broker checked the request, and this process checks
    // the view it actually builds against the outer run's view.
    let (mut policy, timeout) = (policy, timeout);
    let handoff = match crate::nested::read_handoff() {
        None => None,
        Some(Err(e)) => {
            return flushed(
                &queued,
                refuse(mode, &id, &session_id, Some(&policy), &e, &sink),
            )
        }
        Some(Ok(h)) => {
            // A nested run dies with the outer supervisor that launched it,
            // even if that one is SIGKILLed (its init then takes the sandbox).
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            let parent_ok = std::env::var("MOAT_BROKER_PID")
                .ok()
                .and_then(|p| p.parse::<u32>().ok())
                == Some(std::os::unix::process::parent_id());
            if !parent_ok {
                return refuse(
                    mode,
                    &id,
                    &session_id,
                    Some(&policy),
                    "nested run refused: the outer moat is gone",
                    &sink,
                );
            }
            if crate::nested::inherit_policy(&h, &mut policy).is_err() {
                return flushed(
                    &queued,
                    refuse(mode, &id, &session_id, Some(&policy), CHANGED, &sink),
                );
            }
            Some(h)
        }
    };
    let metadata = match reporting.metadata.as_deref().map(|m| {
        serde_json::from_str::<Value>(m)
            .map_err(|e| format!("--metadata is not JSON: {e}"))
            .and_then(|v| moat_runtime::metadata::sanitize(&v).map_err(|e| e.to_string()))
    }) {
        None => None,
        Some(Ok(m)) => Some(m),
        Some(Err(e)) => {
            return flushed(
                &queued,
                refuse(mode, &id, &session_id, Some(&policy), &e, &sink),
            )
        }
    };
    let request = ExecutionRequest {
        argv: command.to_vec(),
        policy,
        timeout,
        env,
        output: match mode {
            Mode::Json => OutputMode::Capture {
                limit: CAPTURE_LIMIT,
            },
            Mode::Events => OutputMode::Stream,
            Mode::Plain => OutputMode::Passthrough,
        },
        audit: if reporting.no_audit {
            AuditTarget::Off
        } else {
            AuditTarget::Log(reporting.audit_log.clone())
        },
        execution_id: id.clone(),
        session_id: session_id.clone(),
        nested: handoff,
        live_refusals: !reporting.quiet,
        parent_execution_id: std::env::var("MOAT_PARENT_EXECUTION_ID").ok(),
        metadata,
        output_backlog: queued
            .clone()
            .map(|q| Arc::new(move || q.behind()) as moat_runtime::OutputBacklog),
        cwd_identity,
    };
    let prepared = match moat_runtime::prepare(request, sink.clone()) {
        Ok(p) => p,
        Err(r) => {
            return flushed(
                &queued,
                refuse(mode, &id, &session_id, Some(&r.policy), &r.message, &sink),
            )
        }
    };
    let done = prepared
        .with_broker(Box::new(|outer| {
            Box::new(crate::nested::Broker::new(outer)) as Box<dyn moat_runtime::NestedBroker>
        }))
        .run(&mut InProcess { early });
    moat_linux::timing::mark("run, denials, audit finish record");
    let stopped = done.outcome.timed_out || done.outcome.termination_reason.is_some();
    if let Some(q) = &queued {
        q.flush(stopped);
    }
    if stopped && mode == Mode::Plain {
        abandon_stalled_stderr();
    }
    let code = report(mode, reporting, &done);
    moat_linux::timing::mark("report");
    code
}

/// Says how a run ended, the way `mode` asks, and its exit code.
fn report(mode: Mode, reporting: &Reporting, done: &Completed) -> ExitCode {
    let outcome = &done.outcome;
    // A path the sweep could not neutralise is still live on the host: it
    // was recorded, is said in red whatever --quiet says, and the run exits
    // EXIT_SWEEP_FAILED so no caller mistakes it for a clean run.
    if mode != Mode::Events {
        for f in &outcome.sweep_failed {
            use std::io::IsTerminal;
            let (red, reset) = if std::io::stderr().is_terminal() {
                ("\x1b[31m", "\x1b[0m")
            } else {
                ("", "")
            };
            eprintln!(
                "{red}moat: NOT NEUTRALISED: {} ({}); the host may run it. Remove it by hand before using this directory outside moat.{reset}",
                f.path.display(),
                f.error
            );
        }
    }
    match mode {
        Mode::Plain => report_plain(outcome, &done.denials, reporting.quiet),
        Mode::Json => {
            print_json(&ExecutionResult::from(done).to_value());
            if !reporting.quiet {
                for line in network_lines(&done.denials) {
                    eprintln!("{}", printable(&line));
                }
            }
        }
        Mode::Events => {}
    }
    if let Some(e) = &done.audit_error {
        eprintln!("moat: {e}");
    }
    if !outcome.sweep_failed.is_empty() {
        return ExitCode::from(EXIT_SWEEP_FAILED);
    }
    ExitCode::from(outcome.exit_code.clamp(0, 255) as u8)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Json,
    Events,
}

pub fn print_json(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, v);
    let _ = writeln!(out);
}

/// The after-run lines for network refusals the proxy did not see (it
/// printed its own as they happened): one for the disabled network, naming
/// every host the command tried, and one for sockets a net class refused.
fn network_lines(denied: &[Denial]) -> Vec<String> {
    let mut out = Vec::new();
    let disabled: Vec<&Denial> = denied
        .iter()
        .filter(|d| d.reason == "network_disabled")
        .collect();
    if !disabled.is_empty() {
        let hosts: Vec<&str> = disabled.iter().filter_map(|x| x.host.as_deref()).collect();
        let host = (!hosts.is_empty()).then(|| hosts.join(" --allow-domain "));
        out.push(format!(
            "moat: {}",
            moat_runtime::denials::disabled_hint(host.as_deref())
        ));
    }
    if let Some(d) = denied.iter().find(|d| d.reason == "net_class") {
        out.push(format!("moat: {}", d.detail));
    }
    out
}

/// `text` with every control character shown as an escape (`\u{1b}`):
/// moat's own lines name paths and programs the command chose, and they go
/// to the user's terminal unfiltered (a file named `x\e]52;…\a` would
/// otherwise set the host clipboard through a refusal line).
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn report_plain(o: &moat_linux::RunOutcome, denied: &[Denial], quiet: bool) {
    if let Some(e) = &o.error {
        eprintln!("moat: {}", printable(e));
    }
    if o.timed_out {
        eprintln!(
            "moat: timed out after {} ms; the process tree was stopped",
            o.duration.as_millis()
        );
    }
    if quiet {
        return;
    }
    for line in network_lines(denied) {
        eprintln!("{}", printable(&line));
    }
    for d in denied {
        if d.operation == "connect" {
            continue;
        }
        let (op, path, detail) = (d.operation(), d.path.as_deref().unwrap_or("?"), &d.detail);
        eprintln!(
            "{}",
            printable(&format!("moat: denied {op} {path} ({detail})"))
        );
    }
}

fn refuse(
    mode: Mode,
    id: &str,
    session_id: &str,
    policy: Option<&Policy>,
    msg: &str,
    sink: &EventSink,
) -> ExitCode {
    match mode {
        Mode::Json => print_json(&ExecutionResult::refused(id, policy, msg).to_value()),
        Mode::Events => sink(
            Event::Failed {
                reason: Some(msg.to_string()),
                exit_code: Some(i32::from(EXIT_MOAT_FAILED)),
            }
            .stamp_bare(id, session_id, policy.map(|p| p.hash())),
        ),
        Mode::Plain => eprintln!("moat: {msg}"),
    }
    if mode != Mode::Plain {
        // Harnesses read the JSON; a human may be watching stderr too.
        eprintln!("moat: {msg}");
    }
    ExitCode::from(EXIT_MOAT_FAILED)
}

/// `moat proxy-connect HOST PORT`: ssh's ProxyCommand inside a proxy sandbox.
pub fn proxy_connect(host: &str, port: u16) -> ExitCode {
    let addr = match moat_linux::netns::SOCKS_PROXY_ADDR.parse() {
        Ok(a) => a,
        Err(_) => return ExitCode::from(EXIT_MOAT_FAILED),
    };
    match moat_proxy::socks_stdio(addr, host, port) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            // SOCKS5 carries only a reply code; the reason is in the run's
            // stderr line and --json denials.
            eprintln!(
                "moat proxy-connect: {host}:{port}: refused by moat's network policy; add --allow-domain {host}:{port} to allow it (unless a --deny-domain entry matches)"
            );
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("moat proxy-connect: {host}:{port}: {e}");
            ExitCode::from(1)
        }
    }
}
