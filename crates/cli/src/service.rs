//! The execution service shared by `moat serve` and `moat mcp`: checks a
//! request against the server's ceiling and roots, runs each execution —
//! forked from a pre-built sandbox template of its plan, supervised in
//! this process, or, when the policy is not template-eligible, as its own
//! `moat exec --events` child (its own supervisor, its own process tree) —
//! and keeps what the protocol reports about it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use clap::Args;
use moat_config::PolicyFlags;
use moat_policy::Policy;
use moat_runtime::subprocess::{Input, InputError, Signaller, StdinSource, Supervisor};
use moat_runtime::{
    AuditTarget, Ceiling, Envelope, Event, Execution, ExecutionResult, ExecutionSummary, PolicyRef,
    Refusal, RefusalCode, RequestPolicy, ServiceView,
};
use serde_json::{json, Value};

/// Output kept per stream for `moat mcp` results (the serve protocol streams it).
pub(crate) const KEEP_OUTPUT: usize = crate::CAPTURE_LIMIT;
/// Executions a server remembers: past this, the oldest finished ones are
/// forgotten (a long-lived service must not grow with every run).
pub(crate) const MAX_RECORDS: usize = 1000;
/// Events kept per execution for getAuditEvents/tailAudit, and denials
/// kept for its result: a command can cause network decisions and denials
/// without end (a loop of refused connections), and kept without a bound
/// they would grow the service until it is killed, with every client's
/// executions. Past these, they are still streamed, not kept.
pub(crate) const MAX_KEPT_EVENTS: usize = 1000;
pub(crate) const MAX_KEPT_DENIALS: usize = 256;
/// Bytes of events (as compact JSON) kept per execution: 1000 network
/// decisions of long host names, or a request's 16 KiB of metadata, make
/// one execution's events large; past this, they are streamed, not kept.
pub(crate) const MAX_KEPT_EVENT_BYTES: usize = 128 << 10;
/// Bytes of events the service keeps across all its remembered
/// executions: past this, the oldest finished ones are forgotten as past
/// [`MAX_RECORDS`] (1000 executions of 8 KiB each fit: the count is the
/// rule for ordinary runs; this bounds the large ones).
pub(crate) const MAX_KEPT_BYTES: usize = 8 << 20;
/// Events of an in-process execution that may wait for the client: past
/// this the run stops reading the command's output (its output chunks are
/// at most 64 KiB each) and the command waits, as on a full pipe.
const IN_PROCESS_EVENTS: usize = 64;
/// Executions one client may have running at once: past this, `execute`
/// is refused (`EXECUTION_LIMIT_EXCEEDED`) until one ends, so one client
/// (a model asking for thousands of runs) cannot exhaust the host's
/// processes and memory and stop the service serving the others.
pub(crate) const MAX_RUNNING_PER_CLIENT: usize = 16;

/// The flags every server takes: the ceiling policy, the roots a request's
/// `cwd` must lie in, and where the executions are recorded.
#[derive(Args, Clone)]
pub(crate) struct ServerArgs {
    #[command(flatten)]
    pub(crate) policy: PolicyFlags,
    /// A directory a request's cwd may lie in (repeatable; default: the workspace, --cwd)
    #[arg(long = "root", value_name = "DIR")]
    pub(crate) roots: Vec<PathBuf>,
    /// Audit log the executions append to (default: moat's default log)
    #[arg(long, value_name = "PATH")]
    pub(crate) audit_log: Option<PathBuf>,
    /// Do not record the executions in the audit log
    #[arg(long, conflicts_with = "audit_log")]
    pub(crate) no_audit: bool,
    /// How executions are launched: `template` (forked from a pre-built sandbox per policy, when the policy allows) or `oneshot` (a `moat exec` child each)
    #[arg(long, value_name = "HOW", default_value = "template", value_parser = ["template", "oneshot"])]
    pub(crate) launch: String,
}

/// A protocol error: a JSON-RPC code, a message, and moat's stable
/// `error.data.code`.
#[derive(Debug)]
pub(crate) struct RpcError {
    pub(crate) code: i64,
    pub(crate) message: String,
    pub(crate) data: Value,
}

impl RpcError {
    pub(crate) fn new(code: i64, stable: &str, message: impl Into<String>) -> RpcError {
        let message = message.into();
        RpcError {
            code,
            data: json!({"code": stable, "reason": message}),
            message,
        }
    }
    pub(crate) fn invalid_params(stable: &str, message: impl Into<String>) -> RpcError {
        RpcError::new(-32602, stable, message)
    }
    pub(crate) fn domain(stable: &str, message: impl Into<String>) -> RpcError {
        RpcError::new(-32000, stable, message)
    }
    pub(crate) fn internal(message: impl Into<String>) -> RpcError {
        RpcError::new(-32603, "INTERNAL_ERROR", message)
    }
    pub(crate) fn to_value(&self) -> Value {
        json!({"code": self.code, "message": self.message, "data": self.data})
    }
}

/// A request the ceiling refused, as the protocol answers it: a widening
/// or a cwd outside the roots is a domain error, a malformed request or
/// policy invalid params.
impl From<Refusal> for RpcError {
    fn from(r: Refusal) -> RpcError {
        let stable = r.code.as_str();
        let mut e = match r.code {
            RefusalCode::PolicyDenied | RefusalCode::BackendCapabilityMissing => {
                RpcError::domain(stable, r.message)
            }
            RefusalCode::InvalidRequest | RefusalCode::PolicyInvalid => {
                RpcError::invalid_params(stable, r.message)
            }
        };
        if let Some(reason) = r.reason {
            e.data["reason"] = json!(reason);
        }
        if let Some(detail) = r.detail {
            e.data["detail"] = json!(detail);
        }
        e
    }
}

/// Where an execution's events go while it runs (the runtime's sink).
pub(crate) use moat_runtime::EventSink;

/// What a request asked for, checked against the ceiling.
pub(crate) struct ProtocolRequest {
    pub(crate) command: Vec<String>,
    pub(crate) cwd: Option<String>,
    pub(crate) policy: Option<Value>,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) stdin: StdinSource,
    pub(crate) timeout_ms: Option<u64>,
    /// The request's metadata, checked and redacted: recorded by the child.
    pub(crate) metadata: Option<serde_json::Map<String, Value>>,
    /// Keep the output (up to [`KEEP_OUTPUT`] per stream) for the result;
    /// otherwise it is only streamed and counted.
    pub(crate) keep_output: bool,
}

/// One execution as the service knows it.
pub(crate) struct Record {
    /// What the protocol reports about it, read from its events.
    pub(crate) view: ServiceView,
    pub(crate) owner: u64,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) keep_output: bool,
    /// Events kept for getAuditEvents/tailAudit: all but output chunks,
    /// as compact JSON text (a parsed `Value` of the same event took about
    /// three times the memory: a service remembering 1000 executions kept
    /// ≈ 20 MB of them for `/bin/true`).
    pub(crate) events: Vec<Box<str>>,
    /// Bytes in `events`.
    pub(crate) kept_bytes: usize,
    /// Stops this execution (by pidfd or its control channel: never a
    /// reused pid); None once it is over (a remembered execution holds
    /// no fd).
    pub(crate) supervisor: Option<Stopper>,
    /// The streamed stdin, when the request asked for one.
    pub(crate) input: Option<Input>,
    pub(crate) done: bool,
}

/// Stops one execution and nothing else.
#[derive(Clone)]
pub(crate) enum Stopper {
    /// A `moat exec` child supervisor, by pidfd.
    Child(Signaller),
    /// An execution supervised in this process, by its control channel
    /// (the one-shot escalation: SIGTERM, kill all, SIGKILL). None once it
    /// is over: a long-lived service keeps records, not descriptors.
    InProcess(Arc<Mutex<Option<moat_linux::control::ControlSender>>>),
}

impl Stopper {
    fn terminate(&self) {
        match self {
            Stopper::Child(s) => s.terminate(),
            Stopper::InProcess(c) => {
                if let Ok(c) = c.lock() {
                    if let Some(c) = c.as_ref() {
                        let _ = c.send(moat_linux::control::Request::Stop);
                    }
                }
            }
        }
    }

    fn kill(&self) {
        match self {
            Stopper::Child(s) => s.kill(),
            // Its supervisor's own escalation ends in SIGKILL.
            Stopper::InProcess(_) => self.terminate(),
        }
    }
}

/// Where an execution's events come from.
pub(crate) enum Source {
    Child(Supervisor),
    /// `prepare` and the run on a thread of this process, their events on
    /// a channel (the events `moat exec --events` writes).
    InProcess {
        events: std::sync::mpsc::Receiver<Value>,
        /// Events sent and not yet taken from `events`.
        queued: Arc<std::sync::atomic::AtomicUsize>,
        thread: Option<crate::pool::Finished>,
        control: Arc<Mutex<Option<moat_linux::control::ControlSender>>>,
    },
}

impl Source {
    fn next_event(&mut self) -> Option<(Value, Envelope, Event)> {
        match self {
            Source::Child(s) => s.next_event(),
            Source::InProcess { events, queued, .. } => {
                let v = events.recv().ok()?;
                queued.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                let (env, ev) = Event::read(&v);
                Some((v, env, ev))
            }
        }
    }

    /// The next event if one comes within `wait` (None: the events
    /// ended); only for a source whose events may be held
    /// ([`Source::holds_events`]).
    fn next_event_within(
        &mut self,
        wait: Duration,
    ) -> Result<Option<(Value, Envelope, Event)>, NothingYet> {
        match self {
            Source::Child(s) => Ok(s.next_event()),
            Source::InProcess { events, queued, .. } => match events.recv_timeout(wait) {
                Ok(v) => {
                    queued.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                    let (env, ev) = Event::read(&v);
                    Ok(Some((v, env, ev)))
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(NothingYet),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Ok(None),
            },
        }
    }

    /// Whether its events may be held for [`HOLD_EVENTS`] to go out together
    /// (an in-process run's come on a channel that can be waited on with a
    /// timeout; a child's stream is read as it comes).
    fn holds_events(&self) -> bool {
        matches!(self, Source::InProcess { .. })
    }

    fn stderr_text(&self) -> String {
        match self {
            Source::Child(s) => s.stderr_text(),
            Source::InProcess { .. } => String::new(),
        }
    }

    fn abort(&mut self) -> Option<std::process::ExitStatus> {
        match self {
            Source::Child(s) => s.abort(),
            Source::InProcess {
                control,
                thread,
                events,
                ..
            } => {
                Stopper::InProcess(control.clone()).terminate();
                while events.recv().is_ok() {}
                if let Some(t) = thread.take() {
                    t.join();
                }
                None
            }
        }
    }

    fn wait(self) -> Option<std::process::ExitStatus> {
        match self {
            Source::Child(s) => s.wait(),
            Source::InProcess {
                thread,
                events,
                control,
                ..
            } => {
                drop(events);
                if let Some(t) = thread {
                    t.join();
                }
                if let Ok(mut c) = control.lock() {
                    c.take();
                }
                None
            }
        }
    }

    fn stopper(&self) -> Stopper {
        match self {
            Source::Child(s) => Stopper::Child(s.signaller()),
            Source::InProcess { control, .. } => Stopper::InProcess(control.clone()),
        }
    }

    fn input(&self) -> Option<Input> {
        match self {
            Source::Child(s) => s.input(),
            Source::InProcess { .. } => None,
        }
    }

    fn launch(&self) -> &'static str {
        match self {
            Source::Child(_) => "oneshot",
            Source::InProcess { .. } => "template",
        }
    }
}

/// An execution's first event (`policy.resolved`) as it came and read
/// (read once: it carries the whole canonical policy).
type FirstEvent = (Value, Envelope, Event);

/// A timed wait for an execution's next event that found none.
struct NothingYet;

/// How long an in-process execution's events (all but its last) may wait
/// for the ones after them, to reach the client in one write (see
/// [`Service::follow`]): about twice what a short command takes from its
/// policy resolved to its end here, and too short for anyone to notice.
const HOLD_EVENTS: Duration = Duration::from_millis(3);

/// Writes what the sink was given and not yet written (see [`Service::follow`]).
pub(crate) type Flush = Arc<dyn Fn() + Send + Sync>;

impl Record {
    /// Keeps `ev` for getAuditEvents/tailAudit, up to [`MAX_KEPT_EVENTS`]
    /// and [`MAX_KEPT_EVENT_BYTES`]; the first and the last event (`last`)
    /// always.
    fn keep_event(&mut self, ev: &Value, last: bool) {
        let text = ev.to_string();
        let room = self.events.len() < MAX_KEPT_EVENTS
            && self.kept_bytes + text.len() <= MAX_KEPT_EVENT_BYTES;
        if last || room || self.events.is_empty() {
            self.kept_bytes += text.len();
            self.events.push(text.into_boxed_str());
        }
    }

    /// The kept events, parsed back.
    pub(crate) fn kept_events(&self) -> impl Iterator<Item = Value> + '_ {
        self.events
            .iter()
            .filter_map(|e| serde_json::from_str(e).ok())
    }

    /// The `Execution` object `execute` answers with.
    pub(crate) fn execution(&self) -> Value {
        Execution::of(&self.view).to_value()
    }

    /// The `ExecutionResult` (while running: the fields known so far).
    pub(crate) fn result(&self) -> ExecutionResult {
        ExecutionResult::service(&self.view)
    }

    /// The public summary `listExecutions` returns.
    pub(crate) fn summary(&self) -> ExecutionSummary {
        ExecutionSummary::of(&self.view)
    }
}

/// The server: its ceiling (with its roots), and the executions it started.
pub(crate) struct Service {
    ceiling: Ceiling,
    audit_log: Option<PathBuf>,
    no_audit: bool,
    moat: PathBuf,
    here: PathBuf,
    /// The sandbox templates, by plan (None: `--launch oneshot`).
    templates: Option<Arc<moat_linux::template::Templates>>,
    records: Mutex<Vec<Record>>,
    changed: Condvar,
    /// Executions each client has started and not yet seen end (see
    /// [`MAX_RUNNING_PER_CLIENT`]), counted from before `start`.
    running: Mutex<BTreeMap<u64, usize>>,
}

impl Service {
    /// Resolves the ceiling once; a server whose own policy does not resolve
    /// does not start.
    pub(crate) fn new(args: &ServerArgs) -> anyhow::Result<Service> {
        let here = std::env::current_dir()
            .map_err(|e| anyhow::anyhow!("cannot read the current directory: {e}"))?;
        let ceiling = Ceiling::new(
            &args.policy,
            &args.roots,
            &here,
            &moat_runtime::resolve::home_from_env(),
        )?;
        let moat = std::env::current_exe()
            .map_err(|e| anyhow::anyhow!("cannot find moat's own executable: {e}"))?;
        if args.launch == "template" {
            // Executions probed in this process reuse the secrets probe's
            // answer while the directories it read are unchanged.
            moat_linux::probe::cache_secrets_probe();
            // They also reuse an equal policy's hash and canonical form,
            // and the audit log kept open (with its chain's head).
            moat_runtime::keep_across_executions();
        }
        Ok(Service {
            ceiling,
            audit_log: args.audit_log.clone(),
            no_audit: args.no_audit,
            templates: (args.launch == "template")
                .then(|| Arc::new(moat_linux::template::Templates::new(moat.clone()))),
            moat,
            here,
            records: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            running: Mutex::new(BTreeMap::new()),
        })
    }

    pub(crate) fn roots(&self) -> &[PathBuf] {
        self.ceiling.roots()
    }

    /// The server's own resolved policy (the ceiling).
    pub(crate) fn ceiling_policy(&self) -> &Policy {
        self.ceiling.policy()
    }

    /// The flags of one execution: the server's, narrowed by the request
    /// (the runtime's ceiling rule). Anything wider than the ceiling is
    /// refused, never clamped.
    pub(crate) fn narrowed_flags(
        &self,
        policy: Option<&Value>,
        cwd: Option<&str>,
        timeout_ms: Option<u64>,
        env: &BTreeMap<String, String>,
    ) -> Result<PolicyFlags, RpcError> {
        let request = RequestPolicy {
            policy: PolicyRef::parse(policy)?,
            cwd: cwd.map(str::to_string),
            timeout_ms,
            env: env.clone(),
        };
        Ok(self.ceiling.narrow(&request)?)
    }

    /// `moat exec` arguments for `flags` (the child resolves them exactly as
    /// `moat exec` on a command line would).
    fn child_args(
        &self,
        flags: &PolicyFlags,
        command: &[String],
        metadata: Option<&serde_json::Map<String, Value>>,
    ) -> Vec<OsString> {
        let audit = if self.no_audit {
            AuditTarget::Off
        } else {
            AuditTarget::Log(self.audit_log.clone())
        };
        moat_runtime::subprocess::exec_args(flags, command, metadata, &audit)
    }

    /// Starts an execution and returns its `Execution` object once its
    /// policy is resolved and on record; then follows it on this thread
    /// (call from a thread of its own). `reply` gets the answer before any
    /// event reaches `sink`.
    pub(crate) fn execute(
        self: &Arc<Self>,
        req: ProtocolRequest,
        owner: u64,
        reply: impl FnOnce(Result<Value, RpcError>),
        sink: Option<EventSink>,
        flush: Option<Flush>,
    ) {
        let Some(_slot) = self.take_slot(owner) else {
            let mut e = RpcError::domain(
                "EXECUTION_LIMIT_EXCEEDED",
                format!(
                    "this client already has {MAX_RUNNING_PER_CLIENT} executions running; wait for one to end or cancel one"
                ),
            );
            e.data["reason"] = json!("too_many_running_executions");
            e.data["limit"] = json!(MAX_RUNNING_PER_CLIENT);
            reply(Err(e));
            return;
        };
        match self.start(req, owner) {
            Err(e) => reply(Err(e)),
            Ok((execution, sup, first)) => {
                reply(Ok(execution));
                self.follow(sup, first, sink, flush);
            }
        }
    }

    /// One of `owner`'s [`MAX_RUNNING_PER_CLIENT`] slots, given back when
    /// the guard drops (the execution followed to its end, or refused).
    fn take_slot(&self, owner: u64) -> Option<Slot<'_>> {
        let mut running = self.running.lock().ok()?;
        let n = running.entry(owner).or_insert(0);
        if *n >= MAX_RUNNING_PER_CLIENT {
            return None;
        }
        *n += 1;
        Some(Slot {
            running: &self.running,
            owner,
        })
    }

    /// The resolved policy of a request that runs forked from a sandbox
    /// template, or None: the one-shot path (`--launch oneshot`, a policy
    /// that is not eligible, or one that does not resolve — the child
    /// reports that refusal as `moat exec` does). Resolved as the child
    /// would: in the checked directory `dir` — as the kernel named the
    /// directory the checked fd opened (read once, by the check), never the
    /// checked path walked again (a component swapped for a symlink since
    /// would lead elsewhere) — against the service's HOME.
    fn template_policy(
        &self,
        flags: &PolicyFlags,
        dir: &std::path::Path,
    ) -> Option<(Policy, Option<Duration>)> {
        self.templates.as_ref()?;
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"));
        let (policy, timeout) = crate::resolve_policy_in(flags, dir, &home).ok()?;
        moat_runtime::template::policy_eligible(&policy).ok()?;
        Some((policy, timeout))
    }

    /// Prepares and runs one execution on a thread of this process, forked
    /// from its plan's template: the flow and events of `moat exec
    /// --events` (prepare → run → denials → record), without the exec.
    fn start_in_process(
        &self,
        policy: Policy,
        timeout: Option<Duration>,
        req: &ProtocolRequest,
        dir: &std::os::fd::OwnedFd,
    ) -> std::io::Result<Source> {
        let Some(templates) = self.templates.clone() else {
            return Err(std::io::Error::other("no templates"));
        };
        // Paced: when the client reads slower than the command writes, the
        // run stops reading the command's output (which waits as a `moat
        // exec` child's does on its full pipe) instead of the service
        // buffering the output without end. The sink itself never blocks:
        // the run's timeout and cancel must fire while the client stalls.
        let (tx, events) = std::sync::mpsc::channel::<Value>();
        let tx = Mutex::new(tx);
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = queued.clone();
        let sink: moat_runtime::EventSink = Arc::new(move |v: Value| {
            if let Ok(t) = tx.lock() {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _ = t.send(v);
            }
        });
        let behind = queued.clone();
        let output_backlog: moat_runtime::OutputBacklog =
            Arc::new(move || behind.load(std::sync::atomic::Ordering::Relaxed) > IN_PROCESS_EVENTS);
        let (control, receiver) = moat_linux::control::channel()?;
        let stdin = match &req.stdin {
            StdinSource::Bytes(b) => b.clone(),
            _ => Vec::new(),
        };
        // The command starts in this directory only (checked in the view
        // by device and inode, then entered by that fd).
        let st = nix::sys::stat::fstat(dir).map_err(std::io::Error::from)?;
        let cwd = Some((st.st_dev, st.st_ino));
        let mut launcher =
            moat_runtime::template::TemplateLauncher::new(templates, stdin, cwd, receiver)?;
        let request = moat_runtime::ExecutionRequest {
            argv: req.command.iter().map(OsString::from).collect(),
            policy,
            timeout,
            env: std::env::vars_os()
                .map(|(k, v)| {
                    (
                        k.to_string_lossy().into_owned(),
                        v.to_string_lossy().into_owned(),
                    )
                })
                .collect(),
            output: moat_linux::OutputMode::Stream,
            output_backlog: Some(output_backlog),
            audit: if self.no_audit {
                moat_runtime::AuditTarget::Off
            } else {
                moat_runtime::AuditTarget::Log(self.audit_log.clone())
            },
            execution_id: moat_runtime::execution_id(),
            session_id: moat_audit::session_id_from_env(),
            nested: None,
            live_refusals: false,
            parent_execution_id: std::env::var("MOAT_PARENT_EXECUTION_ID").ok(),
            metadata: req.metadata.clone(),
            // Checked by the template launcher itself (`cwd` above).
            cwd_identity: None,
        };
        // On a reused thread (`crate::pool`): starting one per execution
        // cost a stack mapped and faulted in.
        let thread = crate::pool::run(move || {
            let id = request.execution_id.clone();
            let session = request.session_id.clone();
            match moat_runtime::prepare(request, sink.clone()) {
                Ok(p) => drop(p.run(&mut launcher)),
                // As `moat exec --events` reports a refusal.
                Err(r) => sink(
                    Event::Failed {
                        reason: Some(r.message),
                        exit_code: Some(i32::from(crate::EXIT_MOAT_FAILED)),
                    }
                    .stamp_bare(&id, &session, Some(r.policy.hash())),
                ),
            }
        })?;
        Ok(Source::InProcess {
            events,
            queued,
            thread: Some(thread),
            control: Arc::new(Mutex::new(Some(control))),
        })
    }

    #[allow(clippy::type_complexity)]
    fn start(
        self: &Arc<Self>,
        req: ProtocolRequest,
        owner: u64,
    ) -> Result<(Value, Source, FirstEvent), RpcError> {
        if req.command.is_empty() {
            return Err(RpcError::invalid_params(
                "INVALID_REQUEST",
                "command must be a non-empty argv array",
            ));
        }
        let mut flags = self.narrowed_flags(
            req.policy.as_ref(),
            req.cwd.as_deref(),
            req.timeout_ms,
            &req.env,
        )?;
        // The child starts in the directory checked against the roots, by
        // fd, and takes it as its workspace from getcwd: passed as a path,
        // a component swapped for a symlink after the check (by another
        // execution, in a directory it may write) would lead it elsewhere.
        let dir = flags.cwd.take().unwrap_or_else(|| self.here.clone());
        let dir_fd = moat_linux::fd::open_path_nofollow(libc::AT_FDCWD, &dir).map_err(|e| {
            RpcError::domain(
                "POLICY_DENIED",
                format!(
                    "cwd {} changed while it was checked ({e}); nothing ran",
                    dir.display()
                ),
            )
        })?;
        // The directory opened must still be the one checked, by name: a
        // rename (not a symlink) in between would give the run the name
        // the directory has now, which the root's view may protect.
        let opened = {
            use std::os::fd::AsRawFd;
            std::fs::read_link(format!("/proc/self/fd/{}", dir_fd.as_raw_fd()))
        };
        let Some(opened) = opened.ok().filter(|o| *o == dir) else {
            return Err(RpcError::domain(
                "POLICY_DENIED",
                format!(
                    "cwd {} was moved while it was checked; nothing ran",
                    dir.display()
                ),
            ));
        };
        let template = match &req.stdin {
            // Streamed input goes through the child's stdin pipe.
            StdinSource::Stream => None,
            _ => self.template_policy(&flags, &opened),
        };
        moat_linux::timing::mark("service: cwd checked, policy resolved");
        let mut sup = match template {
            Some((policy, timeout)) => self
                .start_in_process(policy, timeout, &req, &dir_fd)
                .map_err(|e| RpcError::internal(format!("cannot start the execution: {e}")))?,
            None => Source::Child(
                Supervisor::spawn(
                    &self.moat,
                    self.child_args(&flags, &req.command, req.metadata.as_ref()),
                    dir_fd,
                    req.stdin,
                )
                .map_err(|e| RpcError::internal(format!("cannot start moat: {e}")))?,
            ),
        };
        let (first, envelope, typed) = match sup.next_event() {
            Some((wire, envelope, typed @ Event::PolicyResolved { .. })) => (wire, envelope, typed),
            other => {
                // Not a run that started: make sure its supervisor is gone.
                let status = sup.abort();
                let text = sup.stderr_text();
                let reason = match other {
                    Some((
                        _,
                        _,
                        Event::Failed {
                            reason: Some(r), ..
                        },
                    )) => r,
                    _ => format!("moat exited ({status:?}) before running anything: {text}"),
                };
                return Err(refusal(&reason));
            }
        };
        let record = Record {
            view: ServiceView {
                execution_id: envelope.execution_id.clone(),
                session_id: envelope.session_id.clone(),
                status: "running".to_string(),
                policy_id: str_of(&first, "policy_id"),
                policy_hash: envelope.policy_hash.clone().unwrap_or_default(),
                policy_epoch: envelope.policy_epoch.clone().unwrap_or_default(),
                started_at: envelope.time.clone(),
                launch: Some(sup.launch().to_string()),
                ..ServiceView::default()
            },
            owner,
            stdout: Vec::new(),
            stderr: Vec::new(),
            keep_output: req.keep_output,
            events: Vec::new(),
            kept_bytes: 0,
            supervisor: Some(sup.stopper()),
            input: sup.input(),
            done: false,
        };
        let execution = record.execution();
        if let Ok(mut r) = self.records.lock() {
            r.push(record);
            forget_past_bounds(&mut r);
        }
        Ok((execution, sup, (first, envelope, typed)))
    }

    /// Reads the execution's events to its end, updating the record and
    /// forwarding each event to `sink`; `flush` (when the sink holds what
    /// it is given) writes what it holds. The last event (finished or
    /// failed) is written at once; an in-process execution's events before
    /// it (the first with the answer to `execute`) wait up to
    /// [`HOLD_EVENTS`] for the next one, so that a short command's answer,
    /// `policy.resolved` (≈ 6 KB of JSON for the client to parse),
    /// `execution.started` and `execution.finished` reach the client in one
    /// write: one wake of the client instead of three, none of them while
    /// the command starts and runs on the machine's other core. Nothing
    /// waits longer than that for the client: the record is updated at
    /// once (`getExecution` answers from it), and a run's timeout and
    /// cancel never wait on the sink.
    fn follow(
        &self,
        mut sup: Source,
        first: FirstEvent,
        sink: Option<EventSink>,
        flush: Option<Flush>,
    ) {
        let (first, envelope, typed) = first;
        let id = str_of(&first, "execution_id");
        let write = || {
            if let Some(f) = &flush {
                f()
            }
        };
        let hold = sup.holds_events() && flush.is_some();
        let mut finished = self.apply_event(&id, first, envelope, typed, sink.as_ref());
        let mut held_since = None;
        if hold && !finished {
            held_since = Some(std::time::Instant::now());
        } else {
            write();
        }
        while !finished {
            let next = match held_since {
                None => sup.next_event(),
                Some(t) => match sup.next_event_within(HOLD_EVENTS.saturating_sub(t.elapsed())) {
                    Ok(next) => next,
                    Err(NothingYet) => {
                        write();
                        held_since = None;
                        continue;
                    }
                },
            };
            let Some((ev, envelope, typed)) = next else {
                break;
            };
            finished = self.apply_event(&id, ev, envelope, typed, sink.as_ref());
            if finished || !hold {
                write();
                held_since = None;
            } else if held_since.is_none() {
                held_since = Some(std::time::Instant::now());
            }
        }
        // Anything after the last event (there should be none) goes too.
        while let Some((ev, envelope, typed)) = sup.next_event() {
            self.apply_event(&id, ev, envelope, typed, sink.as_ref());
        }
        write();
        let status = sup.wait();
        self.end(&id, finished, status.and_then(|s| s.code()));
    }

    /// Folds one of an execution's events into its record and forwards it
    /// to `sink`; true when it is its last event (finished or failed). The
    /// events may come from any launcher.
    fn apply_event(
        &self,
        id: &str,
        ev: Value,
        envelope: Envelope,
        typed: Event,
        sink: Option<&EventSink>,
    ) -> bool {
        let mut finished = false;
        {
            // An output chunk is forwarded with its encoding and offset;
            // every event as it came, not copied (`policy.resolved`
            // carries the whole canonical policy).
            let mut chunk_offset = None;
            self.update(id, |r| match typed {
                Event::Stdout(chunk) | Event::Stderr(chunk) => {
                    let bytes = chunk.bytes();
                    let (count, keep) = if ev["type"] == "execution.stdout" {
                        (&mut r.view.stdout_bytes, &mut r.stdout)
                    } else {
                        (&mut r.view.stderr_bytes, &mut r.stderr)
                    };
                    *count += bytes.len() as u64;
                    let room = if r.keep_output {
                        KEEP_OUTPUT.saturating_sub(keep.len())
                    } else {
                        0
                    };
                    if r.keep_output && bytes.len() > room {
                        r.view.output_truncated = true;
                    }
                    keep.extend_from_slice(&bytes[..bytes.len().min(room)]);
                    chunk_offset = Some(chunk.offset);
                }
                Event::Denied(d) => {
                    if r.view.denials.len() < MAX_KEPT_DENIALS {
                        r.view.denials.push(d);
                    }
                    r.keep_event(&ev, false);
                }
                Event::Finished(f) => {
                    finished = true;
                    r.view.exit_code = Some(f.exit_code);
                    r.view.signal = f.signal;
                    r.view.resource_usage = Some(f.resource_usage);
                    r.view.duration_ms = Some(f.duration_ms);
                    r.view.finished_at = Some(envelope.time);
                    // The init stopped the run for moat's own reason (exit
                    // 125): the host replaced a protected path, or the
                    // watch over narrowing mounts could not be armed.
                    let stopped = f
                        .termination_reason
                        .as_deref()
                        .and_then(moat_linux::limits::TerminationReason::stopped_by_moat_named);
                    r.view.termination_reason = Some(
                        if f.timed_out {
                            "timeout"
                        } else if let Some(reason) = stopped {
                            reason.as_str()
                        } else if r.view.cancel_requested {
                            "canceled"
                        } else if r.view.signal.is_some() {
                            "signal"
                        } else {
                            "exit"
                        }
                        .to_string(),
                    );
                    r.view.status =
                        if f.timed_out || stopped.is_some() || r.view.cancel_requested {
                            "failed"
                        } else {
                            "finished"
                        }
                        .to_string();
                    r.keep_event(&ev, true);
                }
                Event::Failed { exit_code, reason } => {
                    finished = true;
                    r.view.exit_code = exit_code;
                    r.view.reason = reason;
                    r.view.finished_at = Some(envelope.time);
                    r.view.termination_reason = Some("failed_to_start".to_string());
                    r.view.status = "failed".to_string();
                    r.keep_event(&ev, true);
                }
                _ => r.keep_event(&ev, false),
            });
            if let Some(s) = sink {
                match chunk_offset {
                    Some(offset) => {
                        let mut forwarded = ev;
                        forwarded["encoding"] = json!("base64");
                        forwarded["stream_offset"] = json!(offset);
                        s(forwarded);
                    }
                    None => s(ev),
                }
            }
        }
        finished
    }

    /// Marks the execution over; without its last event, its supervisor
    /// was lost (`exit_code`: how that process ended, if it did).
    fn end(&self, id: &str, finished: bool, exit_code: Option<i32>) {
        self.update(id, |r| {
            if !finished {
                // moat itself went away without its last event (killed).
                r.view.status = "failed".to_string();
                r.view.termination_reason = Some(
                    if r.view.cancel_requested {
                        "canceled"
                    } else {
                        "supervisor_lost"
                    }
                    .to_string(),
                );
                r.view.exit_code = exit_code;
                r.view.finished_at = Some(moat_audit::now_rfc3339());
            }
            r.done = true;
            // Its fds go with it: a service remembering 1000 executions
            // must not hold 1000 pidfds and pipes.
            r.supervisor = None;
            r.input = None;
        });
        if let Ok(mut r) = self.records.lock() {
            forget_past_bounds(&mut r);
        }
        self.changed.notify_all();
    }

    fn update(&self, id: &str, f: impl FnOnce(&mut Record)) {
        if let Ok(mut recs) = self.records.lock() {
            if let Some(r) = recs.iter_mut().find(|r| r.view.execution_id == id) {
                f(r);
            }
        }
    }

    /// Runs `f` on the record of `id` if `owner` started it, or answers
    /// EXECUTION_NOT_FOUND — the same answer for another client's execution
    /// as for one that never existed, so ids cannot be probed.
    pub(crate) fn with<T>(
        &self,
        id: &str,
        owner: u64,
        f: impl FnOnce(&mut Record) -> T,
    ) -> Result<T, RpcError> {
        let mut recs = self
            .records
            .lock()
            .map_err(|_| RpcError::internal("execution table poisoned"))?;
        match recs
            .iter_mut()
            .find(|r| r.view.execution_id == id && r.owner == owner)
        {
            Some(r) => Ok(f(r)),
            None => Err(not_found(id)),
        }
    }

    /// Removes `owner`'s finished execution `id` and returns it: a caller
    /// that answers with the result once (`moat mcp`, whose tool call
    /// returns the output) leaves nothing behind for no one to ask about.
    pub(crate) fn take_finished(&self, id: &str, owner: u64) -> Result<Record, RpcError> {
        let mut recs = self
            .records
            .lock()
            .map_err(|_| RpcError::internal("execution table poisoned"))?;
        match recs
            .iter()
            .position(|r| r.view.execution_id == id && r.owner == owner && r.done)
        {
            Some(i) => Ok(recs.remove(i)),
            None => Err(not_found(id)),
        }
    }

    /// Runs `f` on every record `owner` started, in the order they were started.
    pub(crate) fn all<T>(&self, owner: u64, mut f: impl FnMut(&Record) -> T) -> Vec<T> {
        self.records
            .lock()
            .map(|r| r.iter().filter(|r| r.owner == owner).map(&mut f).collect())
            .unwrap_or_default()
    }

    /// Queues streamed stdin for `owner`'s execution `id`.
    pub(crate) fn write_input(
        &self,
        id: &str,
        owner: u64,
        data: Vec<u8>,
    ) -> Result<Value, RpcError> {
        let input = self.with(id, owner, |r| r.input.clone())?;
        let Some(input) = input else {
            return Err(input_error(id, InputError::Closed));
        };
        let n = input.write(data).map_err(|e| input_error(id, e))?;
        Ok(json!({"execution_id": id, "stream": "stdin", "accepted_bytes": n}))
    }

    /// Ends streamed stdin for `owner`'s execution `id` (idempotent).
    pub(crate) fn close_input(&self, id: &str, owner: u64) -> Result<Value, RpcError> {
        if let Some(input) = self.with(id, owner, |r| r.input.clone())? {
            input.close();
        }
        Ok(json!({"execution_id": id, "stream": "stdin", "closed": true}))
    }

    /// Blocks until the execution is over.
    pub(crate) fn wait(&self, id: &str) {
        let Ok(mut recs) = self.records.lock() else {
            return;
        };
        loop {
            match recs.iter().find(|r| r.view.execution_id == id) {
                Some(r) if !r.done => {}
                _ => return,
            }
            recs = match self.changed.wait(recs) {
                Ok(g) => g,
                Err(_) => return,
            };
        }
    }

    /// Asks the execution's supervisor to stop its whole process tree
    /// (moat's supervisor kills the sandbox's tree on SIGTERM).
    pub(crate) fn cancel(&self, id: &str, owner: u64) -> Result<Value, RpcError> {
        let pid = self.with(id, owner, |r| {
            // Its last event is out: nothing left to cancel.
            if r.done || r.view.finished_at.is_some() {
                None
            } else {
                r.view.cancel_requested = true;
                r.view.status = "canceling".to_string();
                r.supervisor.clone()
            }
        })?;
        let Some(supervisor) = pid else {
            return Err(not_found(id));
        };
        supervisor.terminate();
        Ok(json!({"execution_id": id, "status": "canceling"}))
    }

    /// Stops everything `owner` started (a closed connection, a closed
    /// stdin) and waits for the supervisors to report the trees gone.
    pub(crate) fn stop_owned(&self, owner: u64) {
        let pids: Vec<(String, Stopper)> = self
            .records
            .lock()
            .map(|r| {
                r.iter()
                    .filter(|r| r.owner == owner && !r.done)
                    .filter_map(|r| Some((r.view.execution_id.clone(), r.supervisor.clone()?)))
                    .collect()
            })
            .unwrap_or_default();
        for (id, pid) in &pids {
            self.update(id, |r| r.view.cancel_requested = true);
            pid.terminate();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        for (id, pid) in &pids {
            while std::time::Instant::now() < deadline {
                let done = self.with(id, owner, |r| r.done).unwrap_or(true);
                if done {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // A supervisor that did not stop in time: its init dies with it
            // (the sandbox's parent-death signal), taking the tree.
            if !self.with(id, owner, |r| r.done).unwrap_or(true) {
                pid.kill();
            }
        }
        // No one can ask about them any more (a client that comes back is
        // a new client): what is over is forgotten now.
        if let Ok(mut recs) = self.records.lock() {
            recs.retain(|r| r.owner != owner || !r.done);
        }
    }

    /// Releases a session's retained output and stops what is still running.
    pub(crate) fn dispose_session(&self, session_id: &str, owner: u64) -> Value {
        let running: Vec<String> = self
            .records
            .lock()
            .map(|mut recs| {
                let mut running = Vec::new();
                for r in recs
                    .iter_mut()
                    .filter(|r| r.view.session_id == session_id && r.owner == owner)
                {
                    r.stdout = Vec::new();
                    r.stderr = Vec::new();
                    if !r.done {
                        running.push(r.view.execution_id.clone());
                    }
                }
                running
            })
            .unwrap_or_default();
        let known = self
            .all(owner, |r| r.view.session_id == session_id)
            .contains(&true);
        for id in &running {
            let _ = self.cancel(id, owner);
        }
        json!({"session_id": session_id, "disposed": known, "canceled": running})
    }

    /// The policy an execution with these parameters would run under, with
    /// the view it gives on this host.
    pub(crate) fn explain(&self, params: &Value) -> Result<Value, RpcError> {
        let flags = self.narrowed_flags(
            params.get("policy"),
            params["cwd"].as_str(),
            timeout_ms(params.get("timeout_ms"))?,
            &BTreeMap::new(),
        )?;
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"));
        let (policy, _) = crate::resolve_policy_in(&flags, &self.here, &home)
            .map_err(|e| RpcError::domain("POLICY_INVALID", format!("{e:#}")))?;
        let env = std::env::vars_os()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect();
        let view = moat_linux::view::compute(&policy, &moat_linux::HostFacts::probe(&policy, env));
        Ok(json!({
            "policy_id": policy.level.as_str(),
            "policy_hash": policy.hash(),
            "policy": policy.canonical_value(),
            "ceiling_hash": self.ceiling_policy().hash(),
            "roots": self.ceiling.roots(),
            "view": view,
        }))
    }
}

/// Forgets finished executions while the service remembers more than
/// [`MAX_RECORDS`] of them, or keeps more than [`MAX_KEPT_BYTES`] of
/// their events: a long-lived service must not grow with every run.
fn forget_past_bounds(records: &mut Vec<Record>) {
    loop {
        let i = if records.len() > MAX_RECORDS {
            oldest_to_forget(records, |_| 1)
        } else if records.iter().map(|r| r.kept_bytes).sum::<usize>() > MAX_KEPT_BYTES {
            oldest_to_forget(records, |r| r.kept_bytes)
        } else {
            return;
        };
        match i {
            Some(i) => drop(records.remove(i)),
            None => return,
        }
    }
}

/// The record to forget when the service remembers too much: the oldest
/// finished one of the client that holds the most (by `weight`: records,
/// or bytes of events), so one client's flood of executions forgets its
/// own results, not another client's.
fn oldest_to_forget(records: &[Record], weight: impl Fn(&Record) -> usize) -> Option<usize> {
    let mut held: BTreeMap<u64, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| r.done) {
        *held.entry(r.owner).or_insert(0) += weight(r);
    }
    let (owner, _) = held.into_iter().max_by_key(|(_, n)| *n)?;
    records.iter().position(|r| r.done && r.owner == owner)
}

/// A running execution's place in its client's count.
struct Slot<'a> {
    running: &'a Mutex<BTreeMap<u64, usize>>,
    owner: u64,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Ok(mut running) = self.running.lock() {
            if let Some(n) = running.get_mut(&self.owner) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    running.remove(&self.owner);
                }
            }
        }
    }
}

/// A request's `timeout_ms`: absent or null, none; else a whole number of
/// milliseconds moat takes. Anything else is refused, never dropped (a
/// dropped timeout would let the command run on without one).
pub(crate) fn timeout_ms(v: Option<&Value>) -> Result<Option<u64>, RpcError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(t) => match t.as_u64() {
            Some(ms) if (1..=moat_policy::MAX_DURATION_MS).contains(&ms) => Ok(Some(ms)),
            _ => Err(RpcError::invalid_params(
                "INVALID_REQUEST",
                format!(
                    "timeout_ms must be a whole number of milliseconds from 1 to {}",
                    moat_policy::MAX_DURATION_MS
                ),
            )),
        },
    }
}

fn str_of(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_default().to_string()
}

fn not_found(id: &str) -> RpcError {
    let mut e = RpcError::domain(
        "EXECUTION_NOT_FOUND",
        format!("no running or known execution {id:?}"),
    );
    e.data["execution_id"] = json!(id);
    e
}

/// A refused input write: closed, too large a chunk, or the queue full.
fn input_error(id: &str, e: InputError) -> RpcError {
    let mut err = match e {
        InputError::Closed => RpcError::domain("EXECUTION_INPUT_CLOSED", e.to_string()),
        InputError::ChunkTooLarge(_) => {
            let mut err = RpcError::invalid_params("INVALID_REQUEST", e.to_string());
            err.data["reason"] = json!("input_chunk_too_large");
            err
        }
        InputError::Backpressure => RpcError::domain("INPUT_BACKPRESSURE", e.to_string()),
    };
    err.data["execution_id"] = json!(id);
    err
}

/// A refusal before anything ran, classified by the runtime: what the host
/// lacks, or what the policy refuses.
fn refusal(reason: &str) -> RpcError {
    RpcError::domain(
        RefusalCode::of_refused_run(reason).as_str(),
        reason.to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal keeps the JSON-RPC error moat has always sent: a widening
    /// is a domain error with its stable reason and detail, a bad policy
    /// invalid params.
    #[test]
    fn a_ceiling_refusal_keeps_its_wire_form() {
        let wider = Refusal {
            code: RefusalCode::PolicyDenied,
            message: "level x is wider: a request may narrow the server's policy, never widen it"
                .into(),
            reason: Some("wider_than_server_policy"),
            detail: Some("level x is wider".into()),
        };
        let e = RpcError::from(wider).to_value();
        assert_eq!(e["code"], -32000);
        assert_eq!(e["data"]["code"], "POLICY_DENIED");
        assert_eq!(e["data"]["reason"], "wider_than_server_policy");
        assert_eq!(e["data"]["detail"], "level x is wider");
        let bad = PolicyRef::parse(Some(&json!("nope"))).unwrap_err();
        let e = RpcError::from(bad).to_value();
        assert_eq!(e["code"], -32602);
        assert_eq!(e["data"]["code"], "POLICY_INVALID");
        assert_eq!(e["data"]["reason"], e["message"]);
    }
}
