//! `moat exec`: resolve the policy, plan, run, and report — as plain text,
//! one `--json` object, or a live `--events` stream — and record every run
//! in the audit log.

use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use base64::Engine;
use moat_audit::{AuditLog, RunContext};
use moat_linux::explain::{explain, DenyReason};
use moat_linux::timing::mark;
use moat_linux::{
    HostFacts, OutputMode, Plan, RunObserver, RunOptions, RunOutcome, RunStatus, Stream,
};
use moat_policy::{NetworkMode, Policy};
use serde_json::{json, Map, Value};

use crate::{resolve_policy, ExecArgs, CAPTURE_LIMIT, EXIT_MOAT_FAILED, EXIT_SWEEP_FAILED};

/// Where events go while the run is live: stdout (with `--events`), shared
/// with the proxy's threads, one whole line per write.
type EventSink = Arc<Mutex<Option<std::io::Stdout>>>;

fn emit(sink: &EventSink, ev: &Value) {
    if let Ok(mut guard) = sink.lock() {
        if let Some(out) = guard.as_mut() {
            let mut line = ev.to_string();
            line.push('\n');
            let _ = out.write_all(line.as_bytes());
            let _ = out.flush();
        }
    }
}

fn fields(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Follows one run: streams events, appends to the audit log, serves the proxy.
struct Session {
    ctx: RunContext,
    audit: Option<AuditLog>,
    sink: EventSink,
    argv: Vec<String>,
    cwd: String,
    proxy_config: Option<moat_proxy::ProxyConfig>,
    proxy: Option<moat_proxy::ProxyHandle>,
    proxy_error: Option<String>,
    audit_error: Option<String>,
    /// Proxy decisions folded per target for the log and `--json`, in
    /// bounded memory.
    decisions: Arc<Mutex<moat_audit::DecisionAggregator>>,
    /// What a nested run inherits (absent under danger-full-access).
    outer: Option<crate::nested::Outer>,
    /// Print each network refusal on stderr as it happens (not with --quiet).
    live_refusals: bool,
    broker: Option<crate::nested::Broker>,
}

impl Session {
    fn event(&self, kind: &str, f: Value) -> Value {
        moat_audit::event(&self.ctx, kind, fields(f))
    }

    fn record(&mut self, events: &[Value]) {
        for ev in events {
            emit(&self.sink, ev);
        }
        if let Some(log) = &self.audit {
            if let Err(e) = log.append(events) {
                self.audit_error.get_or_insert_with(|| {
                    format!(
                        "cannot append to the audit log {}: {e}",
                        log.path().display()
                    )
                });
            }
        }
    }

    /// Records `events` and fails when they are not on record: what comes
    /// before the launch must be, or the run does not happen.
    fn record_required(&mut self, events: &[Value]) -> Result<(), String> {
        for ev in events {
            emit(&self.sink, ev);
        }
        match &self.audit {
            Some(log) => log.append(events).map_err(|e| {
                format!(
                    "cannot record the run in the audit log, so it does not happen: {e}; \
                     fix the log, pass --audit-log PATH, or --no-audit"
                )
            }),
            None => Ok(()),
        }
    }
}

impl RunObserver for Session {
    fn started(&mut self, pid: Option<i32>) {
        let mut f = json!({"argv": self.argv, "cwd": self.cwd, "pid": pid});
        if let Ok(parent) = std::env::var("MOAT_PARENT_EXECUTION_ID") {
            f["parent_execution_id"] = json!(parent);
        }
        let ev = self.event("execution.started", f);
        self.record(&[ev]);
    }

    fn output(&mut self, stream: Stream, offset: u64, data: &[u8]) {
        let kind = match stream {
            Stream::Stdout => "execution.stdout",
            Stream::Stderr => "execution.stderr",
        };
        let b64 = base64::engine::general_purpose::STANDARD.encode(data);
        let ev = self.event(
            kind,
            json!({"offset": offset, "length": data.len(), "data": b64}),
        );
        emit(&self.sink, &ev);
    }

    fn broker_connection(&mut self, conn: std::os::unix::net::UnixStream) {
        if let Some(outer) = &self.outer {
            self.broker
                .get_or_insert_with(|| crate::nested::Broker::new(outer.clone()))
                .serve(conn);
        }
    }

    fn proxy_listeners(&mut self, http: std::net::TcpListener, socks: std::net::TcpListener) {
        let Some(config) = self.proxy_config.take() else {
            return;
        };
        // Each tunnel costs two descriptors here. The sandbox was forked
        // already, so raising our own soft limit does not reach the command.
        if let Ok((_, hard)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            let _ = nix::sys::resource::setrlimit(
                nix::sys::resource::Resource::RLIMIT_NOFILE,
                hard,
                hard,
            );
        }
        let sink = self.sink.clone();
        let ctx = self.ctx.clone();
        let live = self.live_refusals;
        let said: Mutex<std::collections::HashSet<(String, u16, &'static str)>> = Mutex::default();
        let decisions = self.decisions.clone();
        let on_decision: moat_proxy::OnDecision = Box::new(move |rec| {
            // The agent reads its stderr while it retries: say it now, once
            // per host, port and reason.
            if let Some(reason) = rec.reason.and_then(net_reason) {
                let fresh = said
                    .lock()
                    .map(|mut s| s.insert((rec.host.clone(), rec.port, reason.as_str())))
                    .unwrap_or(false);
                if live && fresh && !rec.host.is_empty() {
                    eprintln!("{}", moat_proxy::refusal_line(&rec.host, rec.port, reason));
                }
            }
            let ev = moat_audit::event(
                &ctx,
                "network.decision",
                fields(serde_json::to_value(&rec).unwrap_or(Value::Null)),
            );
            emit(&sink, &ev);
            if let Ok(mut agg) = decisions.lock() {
                agg.add(
                    serde_json::to_value(&rec).unwrap_or(Value::Null),
                    &moat_audit::now_rfc3339(),
                );
            }
        });
        match moat_proxy::start(http, socks, config, on_decision) {
            Ok(h) => self.proxy = Some(h),
            Err(e) => self.proxy_error = Some(format!("cannot start the network proxy: {e}")),
        }
    }
}

fn execution_id() -> String {
    let mut bytes = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("exec_{hex}")
}

fn policy_resolved(ctx: &RunContext, policy: &Policy) -> Value {
    moat_audit::event(
        ctx,
        "policy.resolved",
        fields(json!({
            "policy_id": policy.level.as_str(),
            "policy_hash": ctx.policy_hash,
            "sandbox_level": policy.level.as_str(),
            "network": {
                "mode": policy.network.mode.as_str(),
                "routes": policy.network.rules.allow.iter().map(|p| p.as_str().to_string()).collect::<Vec<_>>(),
            },
            "policy": policy.canonical_value(),
        })),
    )
}

/// The user's credentials for plain-HTTP registries (from their own pip and
/// npm configuration), as headers the proxy adds for that host only; the
/// copies inside the sandbox have them removed.
fn registry_credentials(policy: &Policy) -> Vec<moat_proxy::HostCredential> {
    use base64::Engine;
    let env: Vec<(String, String)> = std::env::vars().collect();
    moat_config::http_registry_credentials(&policy.home, &env)
        .into_iter()
        .map(|c| moat_proxy::HostCredential {
            host: c.host,
            port: c.port,
            authorization: match c.kind {
                moat_config::CredentialKind::Basic { user, password } => format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
                ),
                moat_config::CredentialKind::BasicEncoded(v) => format!("Basic {v}"),
                moat_config::CredentialKind::Bearer(t) => format!("Bearer {t}"),
            },
        })
        .collect()
}

/// A proxy record's reason code as the policy's type.
fn net_reason(code: &str) -> Option<moat_policy::net::Reason> {
    moat_policy::net::Reason::ALL
        .into_iter()
        .find(|r| r.as_str() == code)
}

/// The flag that gives a command the network, for a refusal in `disabled` mode.
fn disabled_hint(host: Option<&str>) -> String {
    format!(
        "network is disabled; use --network proxy --allow-domain {}",
        host.unwrap_or("HOST")
    )
}

/// Network refusals of one run: the proxy's denials (one per host, port
/// and reason), and, from the command's stderr, lookups and sockets that
/// failed because the network is disabled or the net class refused them.
fn network_denials(policy: &Policy, requests: &[Value], o: &RunOutcome) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for r in requests.iter().filter(|r| r["decision"] == "deny") {
        let Some(reason) = r["reason"].as_str().and_then(net_reason) else {
            continue;
        };
        let host = r["host"].as_str().unwrap_or("");
        let port = r["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(0);
        let entry = json!({
            "operation": "connect",
            "host": host,
            "port": port,
            "reason": reason.as_str(),
            "detail": moat_proxy::refusal_hint(host, port, reason),
        });
        if !out.iter().any(|d| {
            d["host"] == entry["host"]
                && d["port"] == entry["port"]
                && d["reason"] == entry["reason"]
        }) {
            out.push(entry);
        }
    }
    if !policy.level.is_sandboxed() {
        return out;
    }
    let text = String::from_utf8_lossy(if o.stderr.is_empty() {
        &o.stderr_tail
    } else {
        &o.stderr
    });
    let class = policy
        .net_class
        .filter(|c| *c != moat_policy::NetClass::Unconfined);
    for f in moat_audit::parse_network_failures(&text) {
        let (reason, detail) = match policy.network.mode {
            NetworkMode::Disabled => ("network_disabled", disabled_hint(f.host.as_deref())),
            NetworkMode::Proxy if f.kind == "socket_refused" => (
                "net_class",
                format!(
                    "a socket was refused (EPERM) by a network class: this run's is {}, and profiled tools inside keep their own (`moat profile show TOOL`)",
                    class.map(|c| c.as_str()).unwrap_or("unconfined")
                ),
            ),
            _ => continue,
        };
        out.push(json!({
            "operation": "connect",
            "host": f.host,
            "reason": reason,
            "detail": detail,
            "line": f.line,
        }));
    }
    out
}

/// The refusals of one run: swept write-protected paths, and what the
/// command's stderr says was refused, attributed to the plan.
/// The refusals of a run, explained. `outer` is a nested run's outer view:
/// then only what that view shows is looked up on the host, since the
/// explanations go back into the outer sandbox and must not tell it what
/// exists outside its view.
fn denials(plan: &Plan, o: &RunOutcome, outer: Option<&moat_linux::view::View>) -> Vec<Value> {
    let host_exists =
        |p: &std::path::Path| outer.is_none_or(|v| v.shows_host(p)) && p.symlink_metadata().is_ok();
    let mut out = Vec::new();
    for s in &o.swept {
        let fate = match &s.moved_to {
            Some(to) => format!("moved to {}", to.display()),
            None => "deleted".to_string(),
        };
        out.push(json!({
            "operation": "create",
            "path": s.path,
            "reason": DenyReason::WriteProtected.code(),
            "detail": format!("{}; {fate}", s.detail),
        }));
    }
    let text = String::from_utf8_lossy(if o.stderr.is_empty() {
        &o.stderr_tail
    } else {
        &o.stderr
    });
    for d in moat_audit::parse_denials(&text) {
        let Some(path) = d.path.as_deref() else {
            continue;
        };
        if let Some(reason) = explain(plan, path, d.errno, host_exists) {
            out.push(json!({
                "operation": d.op,
                "path": moat_linux::explain::absolute(&plan.cwd, path),
                "errno": d.errno,
                "reason": reason.code(),
                "detail": reason.phrase(plan.level),
            }));
        }
    }
    // Paths outside the view read as missing: at workspace-contained most
    // of the host, at every level the host's /tmp (the sandbox has its own).
    if plan.sandboxed {
        for line in text
            .lines()
            .filter(|l| l.contains("No such file or directory"))
            .take(64)
        {
            let Some(path) = quoted_or_prefixed_path(line) else {
                continue;
            };
            if let Some(reason) = explain(plan, &path, "ENOENT", host_exists) {
                let abs = moat_linux::explain::absolute(&plan.cwd, &path);
                if out.iter().any(|d| d["path"] == json!(abs)) {
                    continue;
                }
                let detail = if abs.starts_with("/tmp") {
                    format!(
                        "the sandbox's /tmp is its own, the host's is not shown; add --ro {} to show it",
                        abs.display()
                    )
                } else {
                    reason.phrase(plan.level)
                };
                out.push(json!({
                    "operation": "access",
                    "path": abs,
                    "errno": "ENOENT",
                    "reason": reason.code(),
                    "detail": detail,
                }));
            }
        }
    }
    out
}

/// `cat: /a/b: No such file…` or `ls: cannot access '/a/b': No such…`.
fn quoted_or_prefixed_path(line: &str) -> Option<String> {
    if let Some(start) = line.find(['\'', '"', '‘']) {
        let rest = &line[start + line[start..].chars().next()?.len_utf8()..];
        if let Some(end) = rest.find(['\'', '"', '’']) {
            return Some(rest[..end].to_string());
        }
    }
    let mut parts = line.split(": ");
    let _prog = parts.next()?;
    let candidate = parts.next()?;
    (candidate.contains('/') || candidate.starts_with('.')).then(|| candidate.to_string())
}

/// How one run reports and records itself, independent of how its policy
/// was resolved (flags for `moat exec`, a profile for `moat run`).
pub struct Reporting {
    pub json: bool,
    pub events: bool,
    pub audit_log: Option<std::path::PathBuf>,
    pub no_audit: bool,
    pub quiet: bool,
}

impl From<&crate::ReportArgs> for Reporting {
    fn from(a: &crate::ReportArgs) -> Reporting {
        Reporting {
            json: a.json,
            events: a.events,
            audit_log: a.audit_log.clone(),
            no_audit: a.no_audit,
            quiet: a.quiet,
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
    let resolved = resolve_policy(&args.policy).map_err(|e| format!("{e:#}"));
    moat_linux::timing::mark("resolve the policy (config, project file)");
    run_resolved(resolved, &reporting, &args.command)
}

/// A refusal before any policy exists (e.g. `moat run` could not resolve one).
pub fn refuse_early(reporting: &Reporting, msg: &str) -> ExitCode {
    let sink: EventSink = Arc::new(Mutex::new(if reporting.events {
        Some(std::io::stdout())
    } else {
        None
    }));
    refuse(
        reporting.mode(),
        &execution_id(),
        &moat_audit::session_id_from_env(),
        None,
        msg,
        &sink,
    )
}

/// Runs `command` under a resolved policy, reporting and auditing it.
pub fn run_resolved(
    resolved: Result<(Policy, Option<std::time::Duration>), String>,
    reporting: &Reporting,
    command: &[std::ffi::OsString],
) -> ExitCode {
    let id = execution_id();
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
    let sink: EventSink = Arc::new(Mutex::new(if reporting.events {
        Some(std::io::stdout())
    } else {
        None
    }));
    let (policy, timeout) = match resolved {
        Ok(p) => p,
        Err(e) => return refuse(mode, &id, &session_id, None, &e, &sink),
    };
    // A nested run: the broker checked the request, and this process checks
    // the view it actually builds against the outer run's view.
    let (mut policy, timeout) = (policy, timeout);
    let handoff = match crate::nested::read_handoff() {
        None => None,
        Some(Err(e)) => return refuse(mode, &id, &session_id, Some(&policy), &e, &sink),
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
                return refuse(mode, &id, &session_id, Some(&policy), CHANGED, &sink);
            }
            Some(h)
        }
    };
    // Hashed once: serialising the policy canonically costs on every launch.
    let policy_hash = policy.hash();
    let ctx = RunContext {
        execution_id: id.clone(),
        session_id: session_id.clone(),
        policy_hash: policy_hash.clone(),
        policy_epoch: policy_hash,
        moat_version: env!("CARGO_PKG_VERSION").to_string(),
    };
    // The log is opened before anything runs: a run that cannot be recorded
    // does not happen (unless the caller said --no-audit).
    let audit = if reporting.no_audit {
        None
    } else {
        let path = match reporting.audit_log.clone().or_else(|| moat_audit::default_log_path(&env)) {
            Some(p) => p,
            None => {
                return refuse(mode, &id, &session_id, Some(&policy), "no audit log location: set HOME or XDG_STATE_HOME, pass --audit-log PATH, or --no-audit", &sink)
            }
        };
        match AuditLog::open(&path) {
            Ok(l) => Some(l),
            Err(e) => {
                let msg = format!(
                    "cannot open the audit log {}: {e}; pass --audit-log PATH or --no-audit",
                    path.display()
                );
                return refuse(mode, &id, &session_id, Some(&policy), &msg, &sink);
            }
        }
    };
    mark("open the audit log");
    let resolved = policy_resolved(&ctx, &policy);
    let mut facts = HostFacts::probe(&policy, env);
    mark("probe the host");
    if policy.level.is_sandboxed() {
        // The user's tool configuration, credentials removed, where the
        // tools look under the sandbox HOME.
        facts.home_config_copies = moat_config::redacted_user_configs(&policy.home)
            .into_iter()
            .map(|r| (r.rel, r.contents))
            .collect();
    }
    mark("redacted copies of the user's tool config");
    if let Some(log) = &audit {
        facts.add_hidden_file(log.path());
    }
    if let Some(h) = &handoff {
        crate::nested::apply_handoff(h, &mut facts);
    }
    let plan = match moat_linux::build_plan(&policy, &facts) {
        Ok(p) => p,
        Err(e) => {
            let failed = moat_audit::event(
                &ctx,
                "execution.failed",
                fields(json!({"reason": e.to_string()})),
            );
            let mut s = Session::new(ctx, audit, sink.clone(), command, &policy);
            s.record(&[resolved, failed]);
            return refuse(mode, &id, &session_id, Some(&policy), &e.to_string(), &sink);
        }
    };
    mark("plan");
    if let Some(h) = &handoff {
        if let Err(e) = moat_linux::view::check_nested(&h.outer, &policy, &plan.view) {
            return refuse(mode, &id, &session_id, Some(&policy), &e.to_string(), &sink);
        }
    }
    let mut session = Session::new(ctx, audit, sink.clone(), command, &policy);
    session.live_refusals = !reporting.quiet;
    if let Some(o) = &mut session.outer {
        o.view = Some(plan.view.clone());
    }
    if policy.network.mode == NetworkMode::Proxy {
        let mut config = moat_proxy::ProxyConfig::new(policy.network.rules.clone());
        config.credentials = registry_credentials(&policy);
        if let Some(u) = &policy.network.upstream_url {
            match moat_proxy::parse_upstream(u) {
                Ok(up) => config.upstream = Some(up),
                Err(e) => {
                    return refuse(mode, &id, &session_id, Some(&policy), &e.to_string(), &sink)
                }
            }
        }
        session.proxy_config = Some(config);
    }
    // The start of the run is on record (appended and read back) before
    // anything runs: a run that cannot be recorded does not happen.
    if let Err(e) = session.record_required(&[resolved]) {
        return refuse(mode, &id, &session_id, Some(&policy), &e, &sink);
    }
    mark("audit: start record appended and verified");
    let opts = RunOptions {
        argv: command.to_vec(),
        output: match mode {
            Mode::Json => OutputMode::Capture {
                limit: CAPTURE_LIMIT,
            },
            Mode::Events => OutputMode::Stream,
            Mode::Plain => OutputMode::Passthrough,
        },
        timeout,
        tag: id.clone(),
        stdio_from_outer_sandbox: handoff.is_some(),
    };
    let mut outcome = moat_linux::run(&plan, &opts, &mut session);
    mark("run returned");
    // Stops the proxy; its own per-request list is not used (the folded
    // decisions below saw every request, in bounded memory).
    drop(session.proxy.take().map(|h| h.shutdown()));
    let requests = session
        .decisions
        .lock()
        .map(|agg| agg.records())
        .unwrap_or_default();
    if let Some(b) = session.broker.take() {
        b.shutdown();
    }
    if let Some(e) = session.proxy_error.take() {
        outcome.error.get_or_insert(e);
    }
    let mut denied = denials(&plan, &outcome, handoff.as_ref().map(|h| &h.outer));
    denied.extend(network_denials(&policy, &requests, &outcome));
    let mut tail_events: Vec<Value> = denied
        .iter()
        .map(|d| session.event("sandbox.denied", d.clone()))
        .collect();
    // A path the sweep could not neutralise is still live on the host: it
    // is recorded, said in red whatever --quiet says, and the run exits
    // EXIT_SWEEP_FAILED so no caller mistakes it for a clean run.
    for f in &outcome.sweep_failed {
        tail_events.push(session.event(
            "sandbox.sweep_failed",
            json!({"path": f.path, "error": f.error}),
        ));
        if mode != Mode::Events {
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
    // Live subscribers saw each decision as it happened; the log gets them now.
    let decision_events: Vec<Value> = requests
        .iter()
        .map(|r| session.event("network.decision", r.clone()))
        .collect();
    let finished = if outcome.status == RunStatus::FailedToStart {
        session.event(
            "execution.failed",
            json!({"reason": outcome.error, "exit_code": outcome.exit_code}),
        )
    } else {
        session.event(
            "execution.finished",
            json!({
                "exit_code": outcome.exit_code,
                "signal": outcome.signal,
                "status": status_str(outcome.status),
                "duration_ms": outcome.duration.as_millis() as u64,
                "timed_out": outcome.timed_out,
                "termination_reason": outcome.termination_reason.map(|r| r.as_str()),
                "backend": outcome.backend,
                "layers": {
                    "namespaces": outcome.layers.namespaces.as_str(),
                    "landlock": outcome.layers.landlock.as_str(),
                    "seccomp": outcome.layers.seccomp.as_str(),
                },
                "resource_usage": outcome.usage,
                "limits": outcome.limits,
            }),
        )
    };
    if let Some(log) = &session.audit {
        let mut batch = tail_events.clone();
        batch.extend(decision_events);
        batch.push(finished.clone());
        if let Err(e) = log.append(&batch) {
            session.audit_error.get_or_insert(format!(
                "cannot append to the audit log {}: {e}",
                log.path().display()
            ));
        }
    }
    mark("denials and audit finish record");
    tail_events.push(finished);
    for ev in &tail_events {
        emit(&sink, ev);
    }
    match mode {
        Mode::Plain => report_plain(&outcome, &denied, reporting.quiet),
        Mode::Json => {
            print_json(&result_json(&id, &policy, &outcome, &denied, &requests));
            if !reporting.quiet {
                for line in network_lines(&denied) {
                    eprintln!("{}", printable(&line));
                }
            }
        }
        Mode::Events => {}
    }
    if let Some(e) = &session.audit_error {
        eprintln!("moat: {e}");
    }
    mark("report");
    if !outcome.sweep_failed.is_empty() {
        return ExitCode::from(EXIT_SWEEP_FAILED);
    }
    ExitCode::from(outcome.exit_code.clamp(0, 255) as u8)
}

impl Session {
    fn new(
        ctx: RunContext,
        audit: Option<AuditLog>,
        sink: EventSink,
        command: &[std::ffi::OsString],
        policy: &Policy,
    ) -> Session {
        let outer = crate::nested::Outer {
            policy: policy.clone(),
            view: None,
            session_id: ctx.session_id.clone(),
            execution_id: ctx.execution_id.clone(),
            audit_log: audit.as_ref().map(|l| l.path().to_path_buf()),
        };
        Session {
            ctx,
            audit,
            sink,
            argv: moat_audit::redact_argv(
                &command
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect::<Vec<_>>(),
            ),
            cwd: policy.workspace.to_string_lossy().into_owned(),
            proxy_config: None,
            proxy: None,
            proxy_error: None,
            audit_error: None,
            decisions: Arc::default(),
            outer: Some(outer),
            broker: None,
            live_refusals: false,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Json,
    Events,
}

fn status_str(s: RunStatus) -> &'static str {
    match s {
        RunStatus::Finished => "finished",
        RunStatus::FailedToStart => "failed_to_start",
        RunStatus::TimedOut => "timed_out",
    }
}

pub fn print_json(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, v);
    let _ = writeln!(out);
}

/// The after-run lines for network refusals the proxy did not see (it
/// printed its own as they happened): one for the disabled network, naming
/// every host the command tried, and one for sockets a net class refused.
fn network_lines(denied: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    let disabled: Vec<&Value> = denied
        .iter()
        .filter(|d| d["reason"] == "network_disabled")
        .collect();
    if !disabled.is_empty() {
        let hosts: Vec<&str> = disabled.iter().filter_map(|x| x["host"].as_str()).collect();
        let host = (!hosts.is_empty()).then(|| hosts.join(" --allow-domain "));
        out.push(format!("moat: {}", disabled_hint(host.as_deref())));
    }
    if let Some(d) = denied.iter().find(|d| d["reason"] == "net_class") {
        out.push(format!("moat: {}", d["detail"].as_str().unwrap_or("")));
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

fn report_plain(o: &RunOutcome, denied: &[Value], quiet: bool) {
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
        if d["operation"] == "connect" {
            continue;
        }
        let op = d["operation"].as_str().unwrap_or("access");
        let path = d["path"].as_str().unwrap_or("?");
        let detail = d["detail"].as_str().unwrap_or("");
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
        Mode::Json => print_json(&json!({
            "execution_id": id,
            "exit_code": EXIT_MOAT_FAILED,
            "signal": null,
            "timed_out": false,
            "status": "failed_to_start",
            "error": msg,
            "stdout": "",
            "stderr": "",
            "stdout_truncated": false,
            "stderr_truncated": false,
            "duration_ms": 0,
            "sandbox": {"enforced": false, "level": policy.map(|p| p.level.as_str())},
            "network": {"mode": policy.map(|p| p.network.mode.as_str())},
            "policy_hash": policy.map(|p| p.hash()),
        })),
        Mode::Events => emit(
            sink,
            &json!({
                "type": "execution.failed",
                "time": moat_audit::now_rfc3339(),
                "execution_id": id,
                "session_id": session_id,
                "policy_hash": policy.map(|p| p.hash()),
                "reason": msg,
                "exit_code": EXIT_MOAT_FAILED,
            }),
        ),
        Mode::Plain => eprintln!("moat: {msg}"),
    }
    if mode != Mode::Plain {
        // Harnesses read the JSON; a human may be watching stderr too.
        eprintln!("moat: {msg}");
    }
    ExitCode::from(EXIT_MOAT_FAILED)
}

fn result_json(
    id: &str,
    policy: &Policy,
    o: &RunOutcome,
    denied: &[Value],
    requests: &[Value],
) -> Value {
    let enforced = policy.level.is_sandboxed() && o.status != RunStatus::FailedToStart;
    let mut network = json!({"mode": policy.network.mode.as_str()});
    if policy.network.mode == NetworkMode::Proxy {
        network["requests"] = Value::Array(requests.to_vec());
    }
    let mut v = json!({
        "execution_id": id,
        "exit_code": o.exit_code,
        "signal": o.signal,
        "timed_out": o.timed_out,
        "status": status_str(o.status),
        "stdout": String::from_utf8_lossy(&o.stdout),
        "stderr": String::from_utf8_lossy(&o.stderr),
        "stdout_truncated": o.stdout_truncated,
        "stderr_truncated": o.stderr_truncated,
        "duration_ms": o.duration.as_millis() as u64,
        "termination_reason": o.termination_reason.map(|r| r.as_str()),
        "resource_usage": o.usage,
        "limits": o.limits,
        "sandbox": {
            "enforced": enforced,
            "level": policy.level.as_str(),
            "backend": o.backend,
            "not_given": o.not_given,
            "layers": {
                "namespaces": o.layers.namespaces.as_str(),
                "landlock": o.layers.landlock.as_str(),
                "seccomp": o.layers.seccomp.as_str(),
            },
        },
        "network": network,
        "policy_hash": policy.hash(),
        "denials": denied,
    });
    if let Some(e) = &o.error {
        v["error"] = json!(e);
    }
    if !o.swept.is_empty() {
        v["swept"] = json!(o
            .swept
            .iter()
            .map(|s| json!({"path": s.path, "moved_to": s.moved_to, "detail": s.detail}))
            .collect::<Vec<_>>());
    }
    if !o.sweep_failed.is_empty() {
        v["sweep_failed"] = json!(o
            .sweep_failed
            .iter()
            .map(|f| json!({"path": f.path, "error": f.error}))
            .collect::<Vec<_>>());
        v["exit_code"] = json!(EXIT_SWEEP_FAILED);
    }
    v
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
