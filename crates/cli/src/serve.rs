//! `moat serve`: RunSeal's stable execution protocol (RFC-0006, service
//! mode RFC-0013), JSON-RPC 2.0 with one message per line, on stdio or on a
//! unix socket for the same user. See docs/protocol.md.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use clap::Args;
use serde_json::{json, Value};

use crate::service::{EventSink, ProtocolRequest, RpcError, ServerArgs, Service};
use moat_runtime::subprocess::StdinSource;

/// The protocol this server speaks (RunSeal's name for it).
pub(crate) const RUNSEAL_PROTOCOL: &str = "runseal.protocol/v1";
/// The largest request line read; a longer one is refused and skipped.
pub(crate) const MAX_REQUEST: usize = 10 << 20;

#[derive(Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) server: ServerArgs,
    /// Serve on stdin/stdout (the service ends when stdin closes)
    #[arg(long, required_unless_present = "socket", conflicts_with = "socket")]
    pub(crate) stdio: bool,
    /// Serve on a unix socket at PATH; its directory must be the user's and closed to others (0700)
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
}

/// Bytes of an execution's event lines held for one write at most: past
/// this they are written without waiting for the service's flush.
const HELD_BYTES: usize = 64 << 10;

/// A line-oriented output shared by the reply and the event threads.
pub(crate) type Out = Arc<Mutex<Box<dyn Write + Send>>>;

pub(crate) fn send(out: &Out, v: &Value) {
    send_all(out, std::slice::from_ref(v));
}

/// Writes `msgs` in order, one line each, with one write.
pub(crate) fn send_all(out: &Out, msgs: &[Value]) {
    let mut lines = String::new();
    for v in msgs {
        lines.push_str(&v.to_string());
        lines.push('\n');
    }
    send_text(out, &lines);
}

/// Writes `lines` (whole lines) with one write.
fn send_text(out: &Out, lines: &str) {
    if let Ok(mut w) = out.lock() {
        let _ = w.write_all(lines.as_bytes());
        let _ = w.flush();
    }
    moat_linux::timing::mark("service: a message written");
}

/// Appends the `event` notification of `ev` as a line: the bytes of
/// `{"jsonrpc": "2.0", "method": "event", "params": ev}` serialized (keys
/// in that order, as serde_json sorts them), without copying `ev` into it.
fn push_event_line(lines: &mut String, ev: &Value) {
    lines.push_str(r#"{"jsonrpc":"2.0","method":"event","params":"#);
    // Written into the line, not through a string of its own.
    let _ = std::fmt::Write::write_fmt(lines, format_args!("{ev}"));
    lines.push_str("}\n");
}

pub(crate) fn reply(out: &Out, id: &Value, r: Result<Value, RpcError>) {
    match r {
        Ok(result) => send(out, &json!({"jsonrpc": "2.0", "id": id, "result": result})),
        Err(e) => send(
            out,
            &json!({"jsonrpc": "2.0", "id": id, "error": e.to_value()}),
        ),
    }
}

/// One line from the client: a message, or a line over [`MAX_REQUEST`]
/// (read to its end and dropped).
pub(crate) enum Line {
    Message(Vec<u8>),
    TooLong,
}

/// Reads one line without holding more than `max` bytes of it.
pub(crate) fn read_line(r: &mut impl BufRead, max: usize) -> std::io::Result<Option<Line>> {
    let mut buf = Vec::new();
    let mut too_long = false;
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            return Ok(if buf.is_empty() && !too_long {
                None
            } else if too_long {
                Some(Line::TooLong)
            } else {
                Some(Line::Message(buf))
            });
        }
        let (take, end) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > max {
                too_long = true;
                buf = Vec::new();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        r.consume(if end { take + 1 } else { take });
        if end {
            return Ok(Some(if too_long {
                Line::TooLong
            } else {
                Line::Message(buf)
            }));
        }
    }
}

/// A parsed JSON-RPC request, or the error to answer (with `id: null`
/// when the envelope itself is bad).
pub(crate) enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification,
    Bad(RpcError),
}

pub(crate) fn parse_message(line: &[u8]) -> Incoming {
    let v: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return Incoming::Bad(RpcError::new(
                -32700,
                "INVALID_REQUEST",
                format!("parse error: {e}"),
            ))
        }
    };
    let invalid = |m: &str| Incoming::Bad(RpcError::new(-32600, "INVALID_REQUEST", m));
    let Some(o) = v.as_object() else {
        return invalid("a request is a JSON object (batches are not supported)");
    };
    if o.get("jsonrpc") != Some(&json!("2.0")) {
        return invalid("jsonrpc must be \"2.0\"");
    }
    let Some(method) = o.get("method").and_then(Value::as_str) else {
        return invalid("method must be a string");
    };
    match o.get("id") {
        None => Incoming::Notification,
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => {
            let params = o.get("params").cloned().unwrap_or(json!({}));
            if !params.is_object() && !params.is_null() {
                return invalid("params must be an object");
            }
            Incoming::Request {
                id: id.clone(),
                method: method.to_string(),
                params: if params.is_null() { json!({}) } else { params },
            }
        }
        Some(_) => invalid("id must be a string, a number or null"),
    }
}

pub(crate) fn serve(args: ServeArgs) -> ExitCode {
    // Several descriptors per running execution, many executions at once:
    // the commands still get the soft limit the user started moat with.
    moat_linux::limits::raise_open_files();
    let service = match Service::new(&args.server) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("moat serve: {e:#}");
            return ExitCode::from(crate::EXIT_MOAT_FAILED);
        }
    };
    match &args.socket {
        None => {
            let out: Out = Arc::new(Mutex::new(Box::new(std::io::stdout())));
            session(&service, std::io::stdin().lock(), out, 0, "stdio");
            ExitCode::SUCCESS
        }
        Some(path) => match listen(&service, path) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("moat serve: {e}");
                ExitCode::from(crate::EXIT_MOAT_FAILED)
            }
        },
    }
}

static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// Socket clients served at once; past this a new connection is closed at
/// once (see docs/protocol.md).
pub(crate) const MAX_CLIENTS: usize = 32;

/// One connected client in the listener's count, given back when its
/// session ends.
struct ClientCount(Arc<AtomicUsize>);

impl Drop for ClientCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves on a unix socket in a directory only this user can enter; each
/// connection is checked with SO_PEERCRED before anything is read from it.
fn listen(service: &Arc<Service>, path: &std::path::Path) -> Result<(), String> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let me = nix::unistd::geteuid().as_raw();
    let meta = std::fs::metadata(&dir).map_err(|e| {
        format!(
            "the socket's directory {} cannot be read: {e}",
            dir.display()
        )
    })?;
    if meta.uid() != me || meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "the socket's directory {} must belong to you and be closed to others: chmod 700 {}",
            dir.display(),
            dir.display()
        ));
    }
    let listener = bind_in_place(path)?;
    let clients = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                // Out of fds or memory: wait for some to come back rather
                // than spin on the error.
                eprintln!("moat serve: cannot accept a client: {e}");
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
        };
        if clients.load(Ordering::SeqCst) >= MAX_CLIENTS {
            // Each client holds fds and a thread: past the limit, a new
            // one is closed at once so those already served keep the fds
            // their executions need.
            eprintln!("moat serve: a client was refused: {MAX_CLIENTS} clients are connected");
            drop(conn);
            continue;
        }
        let peer = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials);
        match peer {
            Ok(c) if c.uid() == me => {
                if let Err(why) = same_namespaces(c.pid()) {
                    eprintln!("moat serve: a client was refused: {why}");
                    drop(conn);
                    continue;
                }
            }
            _ => {
                // Another user (or an unknown one): closed before a byte is read.
                drop(conn);
                continue;
            }
        }
        let service = service.clone();
        clients.fetch_add(1, Ordering::SeqCst);
        let counted = ClientCount(clients.clone());
        let spawned = std::thread::Builder::new().spawn(move || {
            let _counted = counted;
            let Ok(writer) = conn.try_clone() else { return };
            let out: Out = Arc::new(Mutex::new(Box::new(writer)));
            let owner = NEXT_OWNER.fetch_add(1, Ordering::Relaxed);
            session(&service, BufReader::new(conn), out, owner, "socket");
        });
        if let Err(e) = spawned {
            // The closure (and the connection, and its count) is dropped.
            eprintln!("moat serve: cannot serve a client: {e}");
        }
    }
    Ok(())
}

/// Binds and listens on a private name in the socket's directory, then
/// renames it to `path`, refusing to replace anything there: a client that
/// sees the socket exist can connect at once (bind creates the file before
/// listen would otherwise be called), and a stale socket is never taken
/// over silently.
fn bind_in_place(path: &std::path::Path) -> Result<std::os::unix::net::UnixListener, String> {
    let stale = || {
        format!(
            "cannot listen on {}: something is there already (remove a stale socket first)",
            path.display()
        )
    };
    if path.symlink_metadata().is_ok() {
        return Err(stale());
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let private = path.with_file_name(format!(".{name}.{}.binding", std::process::id()));
    let _ = std::fs::remove_file(&private);
    let listener = std::os::unix::net::UnixListener::bind(&private)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    let moved = nix::fcntl::renameat2(
        nix::fcntl::AT_FDCWD,
        &private,
        nix::fcntl::AT_FDCWD,
        path,
        nix::fcntl::RenameFlags::RENAME_NOREPLACE,
    );
    if let Err(e) = moved {
        let _ = std::fs::remove_file(&private);
        return Err(if e == nix::errno::Errno::EEXIST {
            stale()
        } else {
            format!("cannot listen on {}: {e}", path.display())
        });
    }
    Ok(listener)
}

/// The namespaces a sandboxed process never shares with the host: a
/// command inside a moat sandbox has the user's uid (SO_PEERCRED cannot
/// tell it apart) and can reach a socket file anywhere the view shows the
/// host fs, so it would get executions under this server's wider ceiling.
const PEER_NAMESPACES: &[&str] = &["user", "mnt"];

/// Ok when the peer `pid` (as this server sees it) lives in this server's
/// user and mount namespaces; a peer in another one (a sandbox, a
/// container) or one whose namespaces cannot be read is refused.
fn same_namespaces(pid: i32) -> Result<(), String> {
    if pid <= 0 {
        return Err("its process is not visible from here (another pid namespace)".into());
    }
    for ns in PEER_NAMESPACES {
        let mine = std::fs::read_link(format!("/proc/self/ns/{ns}"))
            .map_err(|e| format!("cannot read this server's {ns} namespace: {e}"))?;
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
            .map_err(|e| format!("cannot read process {pid}'s {ns} namespace: {e}"))?;
        if mine != theirs {
            return Err(format!(
                "process {pid} is in another {ns} namespace (inside a sandbox or a container); serve it from there instead"
            ));
        }
    }
    Ok(())
}

/// One client: reads requests until its input ends, then stops what it started.
fn session(service: &Arc<Service>, mut input: impl BufRead, out: Out, owner: u64, transport: &str) {
    while let Ok(Some(line)) = read_line(&mut input, MAX_REQUEST) {
        let msg = match line {
            Line::TooLong => {
                let mut e = RpcError::new(
                    -32600,
                    "INVALID_REQUEST",
                    format!("request larger than {MAX_REQUEST} bytes"),
                );
                e.data["reason"] = json!("request_too_large");
                reply(&out, &Value::Null, Err(e));
                continue;
            }
            Line::Message(m) => m,
        };
        moat_linux::timing::mark("service: a request line read");
        if msg.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let (id, method, params) = match parse_message(&msg) {
            Incoming::Request { id, method, params } => (id, method, params),
            Incoming::Notification => continue,
            Incoming::Bad(e) => {
                reply(&out, &Value::Null, Err(e));
                continue;
            }
        };
        if method == "execute" {
            let req = match execution_request(&params) {
                Ok(r) => r,
                Err(e) => {
                    reply(&out, &id, Err(e));
                    continue;
                }
            };
            let (service, out2, id2) = (service.clone(), out.clone(), id.clone());
            // A reused thread (`crate::pool`) follows the execution.
            let spawned = crate::pool::run(move || {
                // The answer goes out with the execution's first event
                // (`policy.resolved`, which `execute` forwards right after
                // it): one write, one wake of the client, instead of two.
                let answer: Arc<Mutex<Option<Value>>> = Arc::default();
                // The lines given and not yet written: the service says
                // when to write them (`flush`), so that events close
                // together go out in one write (see `Service::follow`).
                let pending: Arc<Mutex<String>> = Arc::default();
                let (held, events_out, queue) = (answer.clone(), out2.clone(), pending.clone());
                let sink: EventSink = Arc::new(move |ev: Value| {
                    let Ok(mut lines) = queue.lock() else { return };
                    if let Some(answer) = held.lock().ok().and_then(|mut a| a.take()) {
                        lines.push_str(&answer.to_string());
                        lines.push('\n');
                    }
                    push_event_line(&mut lines, &ev);
                    // Large output goes out without waiting for the flush.
                    if lines.len() >= HELD_BYTES {
                        send_text(&events_out, &lines);
                        lines.clear();
                    }
                });
                let (flushed, flush_out) = (pending.clone(), out2.clone());
                let flush: crate::service::Flush = Arc::new(move || {
                    if let Ok(mut lines) = flushed.lock() {
                        if !lines.is_empty() {
                            send_text(&flush_out, &lines);
                            lines.clear();
                        }
                    }
                });
                service.execute(
                    req,
                    owner,
                    |r| match r {
                        Ok(execution) => {
                            let msg = json!({"jsonrpc": "2.0", "id": id2, "result": execution});
                            match answer.lock() {
                                Ok(mut a) => *a = Some(msg),
                                Err(_) => send(&out2, &msg),
                            }
                        }
                        Err(e) => reply(&out2, &id2, Err(e)),
                    },
                    Some(sink),
                    Some(flush),
                );
                // Never lost: an answer no event took goes out alone.
                if let Some(msg) = answer.lock().ok().and_then(|mut a| a.take()) {
                    send(&out2, &msg);
                }
            });
            if let Err(e) = spawned {
                // Out of threads: refused, nothing started; the session goes on.
                reply(
                    &out,
                    &id,
                    Err(RpcError::internal(format!(
                        "cannot start a thread for the execution: {e}"
                    ))),
                );
            }
            continue;
        }
        let r = call(service, &method, &params, transport, owner);
        reply(&out, &id, r);
    }
    service.stop_owned(owner);
}

fn exec_id(params: &Value) -> Result<&str, RpcError> {
    params["execution_id"]
        .as_str()
        .ok_or_else(|| RpcError::invalid_params("INVALID_REQUEST", "execution_id must be a string"))
}

/// `types` filtering: exact names, or `prefix.*`.
fn type_filter(params: &Value) -> impl Fn(&Value) -> bool {
    let types: Option<Vec<String>> = params["types"].as_array().map(|a| {
        a.iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    });
    move |ev: &Value| {
        let Some(types) = &types else { return true };
        let t = ev["type"].as_str().unwrap_or_default();
        types.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => t.starts_with(prefix),
            None => t == p,
        })
    }
}

fn call(
    service: &Service,
    method: &str,
    params: &Value,
    transport: &str,
    owner: u64,
) -> Result<Value, RpcError> {
    // Every method that names an execution answers only for the client
    // that started it (`owner`); see docs/protocol.md.
    match method {
        "getVersion" => Ok(json!({
            "moat_version": env!("CARGO_PKG_VERSION"),
            "runseal_version": env!("CARGO_PKG_VERSION"),
            "protocol_version": RUNSEAL_PROTOCOL,
            "moat_protocol_version": crate::PROTOCOL_VERSION,
            "policy_versions": [moat_policy::POLICY_VERSION],
            "implementation": "moat",
        })),
        "getCapabilities" => Ok(capabilities()),
        "explainPolicy" => service.explain(params),
        "getExecution" => service.with(exec_id(params)?, owner, |r| r.result().to_value()),
        "cancelExecution" => service.cancel(exec_id(params)?, owner),
        "writeExecutionInput" => {
            let id = exec_id(params)?;
            input_stream(params)?;
            let data = params["data"].as_str().ok_or_else(|| {
                RpcError::invalid_params("INVALID_REQUEST", "data must be a base64 string")
            })?;
            if params["encoding"].as_str().is_some_and(|e| e != "base64") {
                return Err(RpcError::invalid_params(
                    "INVALID_REQUEST",
                    "encoding must be base64",
                ));
            }
            let data = data.strip_prefix("base64:").unwrap_or(data);
            // The encoded length bounds the work before decoding.
            if data.len() > moat_runtime::subprocess::MAX_INPUT_CHUNK.div_ceil(3) * 4 + 4 {
                let mut e = RpcError::invalid_params(
                    "INVALID_REQUEST",
                    format!(
                        "a chunk is at most {} bytes: split it",
                        moat_runtime::subprocess::MAX_INPUT_CHUNK
                    ),
                );
                e.data["reason"] = json!("input_chunk_too_large");
                return Err(e);
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|_| RpcError::invalid_params("INVALID_REQUEST", "data must be base64"))?;
            service.write_input(id, owner, bytes)
        }
        "closeExecutionInput" => {
            let id = exec_id(params)?;
            input_stream(params)?;
            service.close_input(id, owner)
        }
        "listExecutions" => {
            let executions = service.all(owner, |r| r.summary());
            Ok(json!({"count": executions.len(), "executions": executions}))
        }
        "subscribeEvents" => {
            // Every client receives the events of the executions it started;
            // subscribing names an execution it may follow (see docs/protocol.md).
            let id = exec_id(params)?;
            let status = service.with(id, owner, |r| r.view.status.clone())?;
            Ok(
                json!({"execution_id": id, "subscribed": true, "status": status, "types": params["types"]}),
            )
        }
        "getAuditEvents" => {
            let keep = type_filter(params);
            let id = exec_id(params)?;
            let events: Vec<Value> =
                service.with(id, owner, |r| r.kept_events().filter(|e| keep(e)).collect())?;
            Ok(json!({"execution_id": id, "count": events.len(), "events": events}))
        }
        "tailAudit" => {
            let keep = type_filter(params);
            let events: Vec<Value> = service
                .all(owner, |r| {
                    r.kept_events().filter(|e| keep(e)).collect::<Vec<_>>()
                })
                .into_iter()
                .flatten()
                .collect();
            Ok(json!({"count": events.len(), "events": events}))
        }
        "getServiceStatus" => {
            let active = service
                .all(owner, |r| !r.done)
                .into_iter()
                .filter(|a| *a)
                .count();
            Ok(json!({
                "status": "running",
                "mode": "service",
                "transport": transport,
                "stateful": true,
                "local_only": true,
                "remote_listener": false,
                "active_executions": active,
                "policy_hash": service.ceiling_policy().hash(),
                "policy_id": service.ceiling_policy().level.as_str(),
                "roots": service.roots(),
            }))
        }
        "disposeSession" => {
            let sid = params["session_id"].as_str().ok_or_else(|| {
                RpcError::invalid_params("INVALID_REQUEST", "session_id must be a string")
            })?;
            Ok(service.dispose_session(sid, owner))
        }
        other => Err(RpcError::new(
            -32601,
            "METHOD_NOT_FOUND",
            format!("unknown method {other:?}"),
        )),
    }
}

/// What this host can guarantee, probed now, under RunSeal's keys too.
pub(crate) fn capabilities() -> Value {
    let mut report = moat_linux::capabilities::report(std::env::vars().collect());
    if let Some(o) = report.as_object_mut() {
        o.insert("backend".into(), json!(moat_runtime::result::BACKEND));
        o.insert("platform".into(), json!("linux"));
        o.insert("protocol_version".into(), json!(RUNSEAL_PROTOCOL));
    }
    report
}

/// The input stream a write or close names: only `stdin` (the default).
fn input_stream(params: &Value) -> Result<(), RpcError> {
    match params.get("stream") {
        None | Some(Value::Null) => Ok(()),
        Some(v) if v == "stdin" => Ok(()),
        Some(_) => {
            let mut e = RpcError::invalid_params(
                "INVALID_REQUEST",
                "stream must be \"stdin\": moat has no control stream",
            );
            e.data["reason"] = json!("input_stream_unsupported");
            Err(e)
        }
    }
}

/// The `execute` params (RunSeal's ExecutionRequest) as a request.
fn execution_request(p: &Value) -> Result<ProtocolRequest, RpcError> {
    let bad = |m: &str| RpcError::invalid_params("INVALID_REQUEST", m);
    let command: Vec<String> = match &p["command"] {
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("command must be an array of strings"))?,
        _ => return Err(bad("command must be an argv array of strings")),
    };
    let env = env_map(&p["env"])?;
    let stdin = match &p["stdin"] {
        Value::Null => StdinSource::Empty,
        Value::Object(o) => match o.get("mode").and_then(Value::as_str) {
            Some("empty") | None => StdinSource::Empty,
            Some("bytes") => {
                let data = o.get("data").and_then(Value::as_str).unwrap_or_default();
                let data = data.strip_prefix("base64:").unwrap_or(data);
                StdinSource::Bytes(
                    base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .map_err(|_| bad("stdin.data must be base64"))?,
                )
            }
            Some("stream") => StdinSource::Stream,
            Some(m) => {
                // `inherit` would hand the command the service's own stdin
                // (on --stdio: the protocol channel itself).
                let mut e = bad(&format!(
                    "stdin mode {m:?} is not supported: use empty, bytes or stream"
                ));
                e.data["reason"] = json!("stdin_mode_unsupported");
                return Err(e);
            }
        },
        _ => return Err(bad(
            "stdin must be an object {\"mode\": \"empty\"|\"bytes\"|\"stream\", \"data\": base64}",
        )),
    };
    let metadata = match p.get("metadata") {
        None | Some(Value::Null) => None,
        Some(m) => Some(moat_runtime::metadata::sanitize(m).map_err(|e| {
            let mut err = bad(&e.to_string());
            err.data["reason"] = json!(e.code());
            err
        })?),
    };
    Ok(ProtocolRequest {
        command,
        cwd: p["cwd"].as_str().map(str::to_string),
        policy: p.get("policy").cloned(),
        env,
        stdin,
        timeout_ms: crate::service::timeout_ms(p.get("timeout_ms"))?,
        // The output is in the event stream; the result only counts it.
        keep_output: false,
        metadata,
    })
}

pub(crate) fn env_map(v: &Value) -> Result<BTreeMap<String, String>, RpcError> {
    match v {
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|s| (k.clone(), s.to_string()))
                    .ok_or_else(|| {
                        RpcError::invalid_params("INVALID_REQUEST", "env values must be strings")
                    })
            })
            .collect(),
        _ => Err(RpcError::invalid_params(
            "INVALID_REQUEST",
            "env must be an object of strings",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<Option<Vec<u8>>> {
        let mut r = std::io::BufReader::with_capacity(4, input);
        let mut out = Vec::new();
        while let Some(l) = read_line(&mut r, max).unwrap() {
            out.push(match l {
                Line::Message(m) => Some(m),
                Line::TooLong => None,
            });
        }
        out
    }

    #[test]
    fn an_oversize_line_is_dropped_whole_and_the_next_one_read() {
        let got = lines(b"short\n0123456789abcdef\nnext\nlast-too-long", 8);
        let want = vec![Some(b"short".to_vec()), None, Some(b"next".to_vec()), None];
        assert_eq!(got, want);
    }

    /// The event line written without copying the event is the bytes the
    /// envelope serialized as a value would be.
    #[test]
    fn an_event_line_is_the_serialized_envelope() {
        let ev = json!({"type": "policy.resolved", "execution_id": "exec_1", "policy": {"b": [1, "x\"y"], "a": null}});
        let mut line = String::new();
        push_event_line(&mut line, &ev);
        let want = json!({"jsonrpc": "2.0", "method": "event", "params": ev}).to_string() + "\n";
        assert_eq!(line, want);
    }

    #[test]
    fn envelopes_are_checked_as_rfc_0006_says() {
        let code = |s: &str| match parse_message(s.as_bytes()) {
            Incoming::Bad(e) => Some(e.code),
            Incoming::Notification => Some(0),
            Incoming::Request { .. } => None,
        };
        assert_eq!(code("{"), Some(-32700));
        assert_eq!(code("[]"), Some(-32600));
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":1,"method":"x"}"#),
            Some(-32600)
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":[1],"method":"x"}"#),
            Some(-32600)
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#),
            Some(-32600)
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","method":"x"}"#), Some(0));
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":null,"method":"x"}"#), None);
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":"a","method":"x"}"#), None);
    }
}
