//! One moat execution as a library object: an [`ExecutionRequest`] is
//! [`prepare`]d (audit log opened, host probed, plan built, the start put
//! on record) into a [`Prepared`], which runs through a [`Launcher`] and
//! ends in a [`Completed`] run whose typed [`ExecutionResult`] is what
//! `moat exec --json`, the service's `getExecution` and the MCP result
//! report. Events are typed ([`Event`]) for writing and reading alike.
//!
//! The CLI (`moat exec`, `moat run`, a nested run) calls [`prepare`] and
//! [`Prepared::run`] in its own process with [`InProcess`]; the service
//! (`moat serve`, `moat mcp`) runs each execution as a [`subprocess`]
//! supervisor and reads its events back with [`Event::read`].

pub mod ceiling;
pub mod denials;
pub mod event;
pub mod metadata;
pub mod nested;
pub mod resolve;
pub mod result;
pub mod subprocess;
pub mod template;

use std::ffi::OsString;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moat_audit::{AuditLog, RunContext};
use moat_linux::timing::mark;
use moat_linux::{
    HostFacts, OutputMode, Plan, RunObserver, RunOptions, RunOutcome, RunStatus, Stream,
};
use moat_policy::{NetworkMode, Policy};
use serde_json::{json, Value};

pub use ceiling::{Ceiling, PolicyRef, Refusal, RefusalCode, RequestPolicy};
pub use event::{Chunk, Denial, Envelope, Event, Finished, Layers};
pub use nested::{BrokerFactory, Handoff, NestedBroker, Outer};
pub use resolve::{resolve_policy, resolve_policy_in, ResolveError};
pub use result::{Execution, ExecutionResult, ExecutionSummary, ServiceView};

/// Where a run's events go while it is live (stdout for `--events`, the
/// service's subscribers), shared with the proxy's threads: one whole
/// wire event per call, given to the sink (a service keeps it without a
/// copy: `policy.resolved` carries the whole canonical policy).
pub type EventSink = Arc<dyn Fn(Value) + Send + Sync>;

/// A sink that drops every event (plain and `--json` runs).
pub fn no_sink() -> EventSink {
    Arc::new(|_: Value| {})
}

/// Where a run is recorded.
#[derive(Clone, Debug)]
pub enum AuditTarget {
    /// Not recorded (`--no-audit`).
    Off,
    /// This log; `None`: moat's default log for the environment.
    Log(Option<std::path::PathBuf>),
}

/// What to run and how: the command, its resolved policy (its workspace
/// is the cwd), moat's own environment (the host facts are probed from
/// it), the output mode, and where it is recorded.
pub struct ExecutionRequest {
    pub argv: Vec<OsString>,
    pub policy: Policy,
    pub timeout: Option<Duration>,
    /// moat's environment, which the sandbox's environment is built from.
    pub env: Vec<(String, String)>,
    pub output: OutputMode,
    pub audit: AuditTarget,
    pub execution_id: String,
    pub session_id: String,
    /// A nested run: what the broker handed over (the outer view).
    pub nested: Option<Handoff>,
    /// Print each network refusal on stderr as it happens.
    pub live_refusals: bool,
    /// The id of the outer execution, for `execution.started`.
    pub parent_execution_id: Option<String>,
    /// The caller's metadata, already checked and redacted
    /// ([`metadata::sanitize`]): recorded in `policy.resolved`.
    pub metadata: Option<serde_json::Map<String, Value>>,
    /// Whether the sink's reader is behind (see
    /// `RunObserver::output_backlog`); None: never.
    pub output_backlog: Option<OutputBacklog>,
    /// The device and inode the workspace's cwd must have in the view
    /// (see `RunOptions::cwd_identity`); None: not checked.
    pub cwd_identity: Option<(u64, u64)>,
}

/// Tells the supervisor that the sink's reader is behind, so it stops
/// reading the command's output (never blocking on that reader).
pub type OutputBacklog = Arc<dyn Fn() -> bool + Send + Sync>;

/// A run refused before anything ran (exit 125), with the policy it would
/// have run under.
#[derive(Debug)]
pub struct Refused {
    pub message: String,
    pub policy: Box<Policy>,
}

/// A fresh `exec_<32 hex>` id.
pub fn execution_id() -> String {
    let mut bytes = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("exec_{hex}")
}

/// The `policy.resolved` event of `policy`, with the request's metadata.
pub fn policy_resolved(policy: &Policy, metadata: Option<serde_json::Map<String, Value>>) -> Event {
    policy_resolved_with(policy, policy.canonical_value(), metadata)
}

/// [`policy_resolved`] with `policy`'s canonical value computed already.
fn policy_resolved_with(
    policy: &Policy,
    canonical: Value,
    metadata: Option<serde_json::Map<String, Value>>,
) -> Event {
    Event::PolicyResolved {
        policy_id: policy.level.as_str().to_string(),
        sandbox_level: policy.level.as_str().to_string(),
        network: json!({
            "mode": policy.network.mode.as_str(),
            "routes": policy.network.rules.allow.iter().map(|p| p.as_str().to_string()).collect::<Vec<_>>(),
        }),
        policy: canonical,
        metadata,
    }
}

/// Whether [`prepare`] keeps what a later execution can reuse (see
/// [`keep_across_executions`]).
static KEEP_ACROSS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The last policy prepared, with its hash and canonical value.
type Digest = (Policy, String, Value);
static LAST_DIGEST: Mutex<Option<Digest>> = Mutex::new(None);

/// Makes [`prepare`] keep, for the executions after this one (a service
/// runs many, mostly of one policy): the last policy's hash and canonical
/// value, reused for an equal policy (serializing it canonically, twice —
/// the hash and the `policy.resolved` event — costs ≈ 60 µs, comparing it
/// a few), and the audit log open, with its chain's head (see
/// `AuditLog::append`). A one-shot run prepares once and keeps nothing.
pub fn keep_across_executions() {
    KEEP_ACROSS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The audit log [`prepare`] opened last, kept open when
/// [`keep_across_executions`] was called.
static KEPT_LOG: Mutex<Option<Arc<AuditLog>>> = Mutex::new(None);

/// The audit log at `path`: in a service, the one kept open since an
/// earlier run while its path still names that file (its appends then
/// continue the chain from memory, see `AuditLog::append`); else opened,
/// with every check of [`AuditLog::open`].
fn open_audit_log(path: &std::path::Path) -> Result<Arc<AuditLog>, moat_audit::AuditError> {
    let keep = KEEP_ACROSS.load(std::sync::atomic::Ordering::Relaxed);
    if keep {
        if let Ok(kept) = KEPT_LOG.lock() {
            if let Some(log) = kept.as_ref() {
                if log.path() == path && log.still_at_its_path() {
                    return Ok(log.clone());
                }
            }
        }
    }
    let log = Arc::new(AuditLog::open(path)?);
    if keep {
        if let Ok(mut kept) = KEPT_LOG.lock() {
            *kept = Some(log.clone());
        }
    }
    Ok(log)
}

/// `policy`'s hash and canonical value (kept for the next equal policy when
/// [`keep_across_executions`] was called).
fn policy_digest(policy: &Policy) -> (String, Value) {
    if !KEEP_ACROSS.load(std::sync::atomic::Ordering::Relaxed) {
        return policy.digest();
    }
    if let Ok(last) = LAST_DIGEST.lock() {
        if let Some((p, hash, canonical)) = last.as_ref() {
            if p == policy {
                return (hash.clone(), canonical.clone());
            }
        }
    }
    let (hash, canonical) = policy.digest();
    if let Ok(mut last) = LAST_DIGEST.lock() {
        *last = Some((policy.clone(), hash.clone(), canonical.clone()));
    }
    (hash, canonical)
}

/// The last plan built without error, with the policy and host facts it
/// was built from.
type LastPlan = (Policy, HostFacts, Plan);
static LAST_PLAN: Mutex<Option<LastPlan>> = Mutex::new(None);

/// `moat_linux::build_plan(policy, facts)`; when [`keep_across_executions`]
/// was called, the last plan again for an equal policy and equal host
/// facts. Sound because building a plan is a pure function of those two
/// (`moat_linux::plan::build` reads nothing else): the facts are probed
/// afresh for every execution, so a host that changed gives other facts
/// and a plan built anew. Comparing them costs a few µs; building the
/// plan (the view, the mounts, Landlock's rules) ≈ 70.
fn build_plan_kept(policy: &Policy, facts: &HostFacts) -> Result<Plan, moat_linux::PlanError> {
    if !KEEP_ACROSS.load(std::sync::atomic::Ordering::Relaxed) {
        return moat_linux::build_plan(policy, facts);
    }
    if let Ok(last) = LAST_PLAN.lock() {
        if let Some((p, f, plan)) = last.as_ref() {
            if p == policy && f == facts {
                return Ok(plan.clone());
            }
        }
    }
    let plan = moat_linux::build_plan(policy, facts)?;
    if let Ok(mut last) = LAST_PLAN.lock() {
        *last = Some((policy.clone(), facts.clone(), plan.clone()));
    }
    Ok(plan)
}

/// Follows one run: streams events, appends to the audit log, serves the
/// proxy and the nested-run broker.
struct Session {
    ctx: RunContext,
    audit: Option<Arc<AuditLog>>,
    sink: EventSink,
    output_backlog: Option<OutputBacklog>,
    argv: Vec<String>,
    cwd: String,
    parent_execution_id: Option<String>,
    proxy_config: Option<moat_proxy::ProxyConfig>,
    proxy: Option<moat_proxy::ProxyHandle>,
    proxy_error: Option<String>,
    audit_error: Option<String>,
    /// Proxy decisions folded per target for the log and `--json`, in
    /// bounded memory.
    decisions: Arc<Mutex<moat_audit::DecisionAggregator>>,
    /// What a nested run inherits.
    outer: Outer,
    /// Print each network refusal on stderr as it happens (not with --quiet).
    live_refusals: bool,
    broker_factory: Option<BrokerFactory>,
    broker: Option<Box<dyn NestedBroker>>,
}

impl Session {
    fn new(
        ctx: RunContext,
        audit: Option<Arc<AuditLog>>,
        sink: EventSink,
        req: &ExecutionRequest,
    ) -> Session {
        let outer = Outer {
            policy: req.policy.clone(),
            view: None,
            session_id: ctx.session_id.clone(),
            execution_id: ctx.execution_id.clone(),
            audit_log: audit.as_ref().map(|l| l.path().to_path_buf()),
        };
        Session {
            ctx,
            audit,
            sink,
            output_backlog: req.output_backlog.clone(),
            argv: moat_audit::redact_argv(
                &req.argv
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect::<Vec<_>>(),
            ),
            cwd: req.policy.workspace.to_string_lossy().into_owned(),
            parent_execution_id: req.parent_execution_id.clone(),
            proxy_config: None,
            proxy: None,
            proxy_error: None,
            audit_error: None,
            decisions: Arc::default(),
            outer,
            live_refusals: req.live_refusals,
            broker_factory: None,
            broker: None,
        }
    }

    fn stamp(&self, ev: &Event) -> Value {
        ev.stamp(&self.ctx)
    }

    /// Appends `events` to the log, then gives them to the sink.
    fn record(&mut self, events: Vec<Value>) {
        if let Some(log) = &self.audit {
            if let Err(e) = log.append(&events) {
                self.audit_error.get_or_insert_with(|| {
                    format!(
                        "cannot append to the audit log {}: {e}",
                        log.path().display()
                    )
                });
            }
        }
        for ev in events {
            (self.sink)(ev);
        }
    }

    /// Records `events` and fails when they are not on record: what comes
    /// before the launch must be, or the run does not happen.
    /// The sink gets them either way (before the run's failure, when
    /// they are not on record).
    fn record_required(&mut self, events: Vec<Value>) -> Result<(), String> {
        let appended = match &self.audit {
            Some(log) => log.append(&events).map_err(|e| {
                format!(
                    "cannot record the run in the audit log, so it does not happen: {e}; \
                     fix the log, pass --audit-log PATH, or --no-audit"
                )
            }),
            None => Ok(()),
        };
        for ev in events {
            (self.sink)(ev);
        }
        appended
    }
}

impl RunObserver for Session {
    fn started(&mut self, pid: Option<i32>) {
        let ev = self.stamp(&Event::Started {
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            pid,
            parent_execution_id: self.parent_execution_id.clone(),
        });
        self.record(vec![ev]);
    }

    fn output(&mut self, stream: Stream, offset: u64, data: &[u8]) {
        let chunk = Chunk::new(offset, data);
        let ev = match stream {
            Stream::Stdout => Event::Stdout(chunk),
            Stream::Stderr => Event::Stderr(chunk),
        };
        (self.sink)(self.stamp(&ev));
    }

    fn output_backlog(&self) -> bool {
        self.output_backlog.as_ref().is_some_and(|behind| behind())
    }

    fn broker_connection(&mut self, conn: std::os::unix::net::UnixStream) {
        if self.broker.is_none() {
            if let Some(make) = self.broker_factory.take() {
                self.broker = Some(make(self.outer.clone()));
            }
        }
        // Without a broker the connection drops: the caller fails closed.
        if let Some(b) = self.broker.as_mut() {
            b.serve(conn);
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
            if let Some(reason) = rec.reason.and_then(denials::net_reason) {
                let fresh = said
                    .lock()
                    .map(|mut s| s.insert((rec.host.clone(), rec.port, reason.as_str())))
                    .unwrap_or(false);
                if live && fresh && !rec.host.is_empty() {
                    eprintln!("{}", moat_proxy::refusal_line(&rec.host, rec.port, reason));
                }
            }
            let record = serde_json::to_value(&rec).unwrap_or(Value::Null);
            let fields = match &record {
                Value::Object(m) => m.clone(),
                _ => serde_json::Map::new(),
            };
            sink(Event::NetworkDecision(fields).stamp(&ctx));
            if let Ok(mut agg) = decisions.lock() {
                agg.add(record, &moat_audit::now_rfc3339());
            }
        });
        match moat_proxy::start(http, socks, config, on_decision) {
            Ok(h) => self.proxy = Some(h),
            Err(e) => self.proxy_error = Some(format!("cannot start the network proxy: {e}")),
        }
    }
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
            path_prefix: c.path_prefix,
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

/// A run ready to launch: its policy, plan and view fixed, its start on
/// record in the audit log.
pub struct Prepared {
    policy: Policy,
    plan: Plan,
    opts: RunOptions,
    session: Session,
    nested: Option<Handoff>,
}

/// The system's git config (git reads it unless told not to; a distro's
/// git has its prefix at `/usr`, so it is this file).
const SYSTEM_GIT_CONFIG: &str = "/etc/gitconfig";

/// Every git config the command's git may read at a host path, other than
/// HOME's own (those are copied, redacted, under the sandbox HOME, and
/// hidden at their host paths by the protected list):
/// - the workspace's own (`.git/config`, a linked worktree's common dir's,
///   submodules', nested checkouts' the probe's walk found);
/// - each directory grant's (`--ro`/`--rw DIR` of another checkout);
/// - the system's (`/etc/gitconfig`) and `$XDG_CONFIG_HOME/git/config`
///   when `XDG_CONFIG_HOME` is not `~/.config` (its `credentials` beside
///   it is hidden, as `~/.config/git/credentials` is).
///
/// One with credentials in it (a token in a remote URL, a persisted
/// `extraheader`, a credential helper: `moat_config::redact_git_config`
/// decides) is hidden like a protected file and shown as its redacted copy
/// (on the Landlock backend, which cannot mount one, reading it is
/// refused); a grant naming the file exactly shows it raw. The files any
/// of the user's or host's git configs include (`~/.gitconfig.local`,
/// `~user/…`, an include's include) are hidden whole: the copies drop the
/// includes, and a token kept out of the main config lives there.
/// `explain-policy` shows the same view.
/// The files are read through `reads` (one launch's, shared with the other
/// redaction steps).
pub fn redact_host_git_configs(
    policy: &Policy,
    facts: &mut HostFacts,
    reads: &moat_config::ConfigReads,
) {
    let xdg = facts
        .env
        .iter()
        .find(|(k, _)| k == "XDG_CONFIG_HOME")
        .map(|(_, v)| std::path::PathBuf::from(v))
        .filter(|p| p.is_absolute() && *p != policy.home.join(".config"));
    let mut host_configs = vec![std::path::PathBuf::from(SYSTEM_GIT_CONFIG)];
    if let Some(x) = &xdg {
        host_configs.push(x.join("git/config"));
        if let Ok(c) = std::fs::canonicalize(x.join("git/credentials")) {
            facts.secrets.insert(c, moat_linux::probe::Kind::File);
        }
    }
    for p in moat_config::git_include_targets_in(reads, &policy.home, &host_configs) {
        if let (Ok(c), Ok(m)) = (std::fs::canonicalize(&p), std::fs::metadata(&p)) {
            if m.is_file() {
                facts.secrets.insert(c, moat_linux::probe::Kind::File);
            }
        }
    }
    let nested = facts.workspace_nested_git.clone();
    let mut files = moat_linux::gitconfigs::workspace_git_configs(&policy.workspace, &nested);
    for g in &policy.paths {
        if g.path.is_dir() {
            files.extend(moat_linux::gitconfigs::workspace_git_configs(&g.path, &[]));
        }
    }
    files.extend(
        host_configs
            .iter()
            .filter_map(|p| moat_linux::gitconfigs::host_git_config(p)),
    );
    for f in files {
        // Too large to read: it may hold a credential, so it is not shown.
        let view = if f.too_large {
            Some(moat_config::workspace_git_config_too_large())
        } else {
            moat_config::workspace_git_config_view(&f.text)
        };
        if let Some(contents) = view {
            facts
                .secrets
                .insert(f.path.clone(), moat_linux::probe::Kind::File);
            facts.redacted_files.insert(f.path, contents);
        }
    }
}

/// Tool configs a tool reads at their host paths (the workspace's project
/// `.npmrc`, `.yarnrc.yml`, `.cargo/config.toml`, `uv.toml`; HOME's cargo
/// and uv configs; the system's pip, npm and uv configs:
/// `moat_config::WORKSPACE_TOOL_CONFIGS`, `HOME_TOOL_CONFIGS`,
/// `SYSTEM_TOOL_CONFIGS`), each read
/// without following a symlink (`gitconfigs::configs_beneath`): one whose
/// redaction removes something (a registry token, a URL's userinfo, npm's
/// per-registry login) is hidden like a protected file and shown as its
/// redacted copy, as a git config is; a grant naming the file exactly
/// shows it raw. The files the tool configs name as a client key (npm's
/// `keyfile`/`certfile`, pip's `client-cert`) are hidden whole; the
/// configs naming them are read through `reads`.
pub fn redact_tool_configs(
    policy: &Policy,
    facts: &mut HostFacts,
    reads: &moat_config::ConfigReads,
) {
    let root = std::path::PathBuf::from("/");
    // Each directory opened once for all its names.
    let places = [
        (&policy.workspace, moat_config::WORKSPACE_TOOL_CONFIGS),
        (&policy.home, moat_config::HOME_TOOL_CONFIGS),
        (&root, moat_config::SYSTEM_TOOL_CONFIGS),
    ];
    let found = places
        .iter()
        .flat_map(|(dir, rels)| moat_linux::gitconfigs::configs_beneath(dir, rels));
    for (rel, f) in found {
        let view = if f.too_large {
            Some(moat_config::workspace_git_config_too_large())
        } else {
            moat_config::tool_config_view(rel, &f.text)
        };
        if let Some(contents) = view {
            facts
                .secrets
                .insert(f.path.clone(), moat_linux::probe::Kind::File);
            facts.redacted_files.insert(f.path, contents);
        }
    }
    for p in moat_config::tool_config_key_files_in(reads, &policy.home, &policy.workspace) {
        if let (Ok(c), Ok(m)) = (std::fs::canonicalize(&p), std::fs::metadata(&p)) {
            if m.is_file() {
                facts.secrets.insert(c, moat_linux::probe::Kind::File);
            }
        }
    }
}

/// Opens the audit log, probes the host, builds the plan, and puts the
/// start of the run on record (a run that cannot be recorded does not
/// happen). Events go to `sink` as they are recorded.
pub fn prepare(req: ExecutionRequest, sink: EventSink) -> Result<Prepared, Refused> {
    let policy = req.policy.clone();
    let refused = |message: String| Refused {
        message,
        policy: Box::new(policy.clone()),
    };
    // Hashed once: serialising the policy canonically costs on every launch.
    let (policy_hash, canonical) = policy_digest(&policy);
    let ctx = RunContext {
        execution_id: req.execution_id.clone(),
        session_id: req.session_id.clone(),
        policy_hash: policy_hash.clone(),
        policy_epoch: policy_hash,
        moat_version: env!("CARGO_PKG_VERSION").to_string(),
    };
    // The log is opened before anything runs: a run that cannot be recorded
    // does not happen (unless the caller said --no-audit).
    let audit = match &req.audit {
        AuditTarget::Off => None,
        AuditTarget::Log(path) => {
            let Some(path) = path
                .clone()
                .or_else(|| moat_audit::default_log_path(&req.env))
            else {
                return Err(refused("no audit log location: set HOME or XDG_STATE_HOME, pass --audit-log PATH, or --no-audit".to_string()));
            };
            match open_audit_log(&path) {
                Ok(l) => Some(l),
                Err(e) => {
                    return Err(refused(format!(
                        "cannot open the audit log {}: {e}; pass --audit-log PATH or --no-audit",
                        path.display()
                    )))
                }
            }
        }
    };
    mark("open the audit log");
    let resolved = policy_resolved_with(&policy, canonical, req.metadata.clone()).stamp(&ctx);
    mark("the start event (canonical policy)");
    let mut facts = HostFacts::probe(&policy, req.env.clone());
    mark("probe the host");
    if policy.level.is_sandboxed() {
        // The user's tool configuration, credentials removed, where the
        // tools look under the sandbox HOME. The three steps read the
        // same files (`~/.gitconfig`, `~/.npmrc`): each is read once.
        let reads = moat_config::ConfigReads::default();
        facts.home_config_copies = moat_config::redacted_user_configs_in(&reads, &policy.home)
            .into_iter()
            .map(|r| (r.rel, r.contents))
            .collect();
        redact_host_git_configs(&policy, &mut facts, &reads);
        redact_tool_configs(&policy, &mut facts, &reads);
    }
    mark("redacted copies of the user's tool config");
    if let Some(log) = &audit {
        // Resolved already by the open: no second walk of its path.
        facts.add_hidden_canonical_file(log.resolved_path());
    }
    if let Some(h) = &req.nested {
        nested::apply_handoff(h, &mut facts);
    }
    let plan = build_plan_kept(&policy, &facts);
    mark("plan");
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            let failed = Event::Failed {
                reason: Some(e.to_string()),
                exit_code: None,
            }
            .stamp(&ctx);
            let mut s = Session::new(ctx, audit, sink, &req);
            s.record(vec![resolved, failed]);
            return Err(refused(e.to_string()));
        }
    };
    if let Some(h) = &req.nested {
        if let Err(e) = moat_linux::view::check_nested(&h.outer, &policy, &plan.view) {
            return Err(refused(e.to_string()));
        }
    }
    let mut session = Session::new(ctx, audit, sink, &req);
    session.outer.view = Some(plan.view.clone());
    if policy.network.mode == NetworkMode::Proxy {
        let mut config = moat_proxy::ProxyConfig::new(policy.network.rules.clone());
        config.credentials = registry_credentials(&policy);
        if let Some(u) = &policy.network.upstream_url {
            match moat_proxy::parse_upstream(u) {
                Ok(up) => config.upstream = Some(up),
                Err(e) => return Err(refused(e.to_string())),
            }
        }
        session.proxy_config = Some(config);
    }
    mark("session: what a nested run inherits");
    // The start of the run is on record (appended and read back) before
    // anything runs: a run that cannot be recorded does not happen.
    session.record_required(vec![resolved]).map_err(refused)?;
    mark("audit: start record appended and verified");
    let opts = RunOptions {
        argv: req.argv,
        output: req.output,
        timeout: req.timeout,
        tag: req.execution_id,
        stdio_from_outer_sandbox: req.nested.is_some(),
        cwd_identity: req.cwd_identity,
    };
    Ok(Prepared {
        policy,
        plan,
        opts,
        session,
        nested: req.nested,
    })
}

/// The run step: what turns a plan into a process tree and its outcome.
/// [`InProcess`] is today's supervisor in this process (one execution per
/// process: the CLI). A pre-built template (`moat_linux::template`, whose
/// entry returns the same [`RunOutcome`]) plugs in here as another
/// implementation.
pub trait Launcher {
    fn launch(
        &mut self,
        plan: &Plan,
        opts: &RunOptions,
        observer: &mut dyn RunObserver,
    ) -> RunOutcome;
}

/// Runs the plan with [`moat_linux::run`], supervised by this process;
/// with the init `moat exec` cloned before it probed the host, when there
/// is one (`moat_linux::EarlyInit`: killed and reaped when it is not used,
/// on every path that drops this launcher).
#[derive(Default)]
pub struct InProcess {
    pub early: Option<moat_linux::EarlyInit>,
}

impl Launcher for InProcess {
    fn launch(
        &mut self,
        plan: &Plan,
        opts: &RunOptions,
        observer: &mut dyn RunObserver,
    ) -> RunOutcome {
        moat_linux::run_early(
            plan,
            opts,
            observer,
            moat_linux::control::Control::ProcessSignals,
            self.early.take(),
        )
    }
}

/// A run that ran (or failed to start after its start was recorded): its
/// outcome, refusals and network decisions, all on record.
pub struct Completed {
    pub execution_id: String,
    pub policy: Policy,
    pub outcome: RunOutcome,
    pub denials: Vec<Denial>,
    /// The proxy's decisions, folded per target.
    pub requests: Vec<Value>,
    /// Appending the end of the run to the audit log failed.
    pub audit_error: Option<String>,
}

impl Prepared {
    /// The plan this run goes under.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Serves nested `moat exec` requests from inside the sandbox with the
    /// broker `make` builds on the first one (none: they are refused).
    pub fn with_broker(mut self, make: BrokerFactory) -> Prepared {
        self.session.broker_factory = Some(make);
        self
    }

    /// Launches the command, waits for it, reads its refusals, and records
    /// and streams the end of the run.
    pub fn run(self, launcher: &mut dyn Launcher) -> Completed {
        let Prepared {
            policy,
            plan,
            opts,
            mut session,
            nested,
        } = self;
        let mut outcome = launcher.launch(&plan, &opts, &mut session);
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
        let mut denied = denials::denials(&plan, &outcome, nested.as_ref().map(|h| &h.outer));
        denied.extend(denials::network_denials(&policy, &requests, &outcome));
        let mut tail_events: Vec<Value> = denied
            .iter()
            .map(|d| session.stamp(&Event::Denied(d.clone())))
            .collect();
        // A path the sweep could not neutralise is still live on the host:
        // it is recorded, and the caller says so whatever --quiet says.
        for f in &outcome.sweep_failed {
            tail_events.push(session.stamp(&Event::SweepFailed {
                path: f.path.clone(),
                error: f.error.clone(),
            }));
        }
        // Live subscribers saw each decision as it happened; the log gets them now.
        let decision_events: Vec<Value> = requests
            .iter()
            .map(|r| {
                let fields = r.as_object().cloned().unwrap_or_default();
                session.stamp(&Event::NetworkDecision(fields))
            })
            .collect();
        let finished = session.stamp(&finished_event(&outcome));
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
        tail_events.push(finished);
        for ev in tail_events {
            (session.sink)(ev);
        }
        mark("denials, finish record, the last events sent");
        Completed {
            execution_id: session.ctx.execution_id.clone(),
            policy,
            outcome,
            denials: denied,
            requests,
            audit_error: session.audit_error.take(),
        }
    }
}

/// `finished`/`failed_to_start`/`timed_out`.
pub fn status_str(s: RunStatus) -> &'static str {
    match s {
        RunStatus::Finished => "finished",
        RunStatus::FailedToStart => "failed_to_start",
        RunStatus::TimedOut => "timed_out",
    }
}

/// The last event of a run: `execution.failed` when it never started,
/// else `execution.finished`.
fn finished_event(o: &RunOutcome) -> Event {
    if o.status == RunStatus::FailedToStart {
        return Event::Failed {
            reason: o.error.clone(),
            exit_code: Some(o.exit_code),
        };
    }
    Event::Finished(Finished {
        exit_code: o.exit_code,
        signal: o.signal,
        status: status_str(o.status).to_string(),
        duration_ms: o.duration.as_millis() as u64,
        timed_out: o.timed_out,
        termination_reason: o.termination_reason.map(|r| r.as_str().to_string()),
        backend: o.backend.to_string(),
        launch: o.launch.to_string(),
        layers: Layers::from(&o.layers),
        resource_usage: serde_json::to_value(o.usage).unwrap_or(Value::Null),
        limits: serde_json::to_value(&o.limits).unwrap_or(Value::Null),
    })
}
