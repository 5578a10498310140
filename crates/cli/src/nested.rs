//! Nested runs: `moat exec` called inside a moat sandbox cannot create
//! namespaces (the seccomp floor forbids it), so it asks the outer
//! supervisor through the broker socket that only a moat view contains.
//! The supervisor resolves the inner policy against the real host, refuses
//! it unless it fits inside the outer one, and runs it as a new sandbox
//! from the host side with the caller's stdin/stdout/stderr.

use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use clap::Parser;
use moat_linux::netns::BROKER_SOCKET;
use moat_policy::Policy;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde_json::{json, Value};

use crate::{Cli, Command, EXIT_MOAT_FAILED};

/// Carries the outer run's bounds to the moat process that runs a nested
/// request; that process refuses a policy outside them.
pub const BOUNDS_ENV: &str = "MOAT_NESTED_BOUNDS";

/// Directories that exist only inside a sandbox (the host's are different).
const SANDBOX_PRIVATE: &[&str] = &["/tmp", "/moat", "/proc", "/dev", "/run", "/sys"];

/// True inside a moat sandbox: the broker socket exists in the view and
/// this process already runs under a seccomp filter. Neither can be faked
/// from inside (the view's root is read-only and mounts are forbidden), and
/// a fake outside would only stop a command from running.
pub fn inside_sandbox() -> bool {
    use std::os::unix::fs::FileTypeExt;
    let sock = std::fs::symlink_metadata(BROKER_SOCKET)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false);
    sock && moat_linux::probe::under_seccomp()
}

/// The inner side: send the request and our stdio, wait for the exit code.
pub fn request(args: Vec<OsString>) -> ExitCode {
    match send_request(args) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("moat: nested run: {e}");
            ExitCode::from(EXIT_MOAT_FAILED)
        }
    }
}

fn send_request(args: Vec<OsString>) -> Result<i32, String> {
    let stream = UnixStream::connect(BROKER_SOCKET)
        .map_err(|e| format!("cannot reach the outer moat at {BROKER_SOCKET}: {e}"))?;
    let cwd =
        std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    let req = json!({
        "args": args.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>(),
        "cwd": cwd,
        "env": std::env::vars_os().map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned())).collect::<Vec<_>>(),
    });
    let body = req.to_string().into_bytes();
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    let fds: [RawFd; 3] = [0, 1, 2];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let sent = sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(&frame)],
        &cmsg,
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| format!("send the request: {e}"))?;
    (&stream)
        .write_all(&frame[sent..])
        .map_err(|e| format!("send the request: {e}"))?;
    let mut reply = String::new();
    (&stream)
        .read_to_string(&mut reply)
        .map_err(|e| format!("read the reply: {e}"))?;
    let v: Value = serde_json::from_str(reply.trim())
        .map_err(|_| "the outer moat closed the request without an answer".to_string())?;
    if let Some(err) = v.get("error").and_then(Value::as_str) {
        eprintln!("moat: {err}");
    }
    Ok(v.get("exit_code")
        .and_then(Value::as_i64)
        .unwrap_or(EXIT_MOAT_FAILED as i64) as i32)
}

/// The outer side: serves nested requests (one thread each, started only
/// when one arrives) until the run ends.
pub struct Broker {
    outer: Outer,
    stop: Arc<AtomicBool>,
    children: Arc<Mutex<Vec<u32>>>,
    handlers: Vec<std::thread::JoinHandle<()>>,
    /// Our side of every connection, so shutdown can end a request that
    /// never completes (a command may even send us its own end).
    conns: Vec<UnixStream>,
}

impl Broker {
    pub fn new(outer: Outer) -> Broker {
        Broker {
            outer,
            stop: Arc::default(),
            children: Arc::default(),
            handlers: Vec::new(),
            conns: Vec::new(),
        }
    }

    /// Serves one nested request on its own thread.
    pub fn serve(&mut self, conn: UnixStream) {
        if let Ok(c) = conn.try_clone() {
            self.conns.push(c);
        }
        let (o, c, s) = (self.outer.clone(), self.children.clone(), self.stop.clone());
        self.handlers
            .push(std::thread::spawn(move || handle(conn, &o, &c, &s)));
    }

    /// Refuses new requests and stops every nested run still going (they
    /// end with the outer run, whose boundary they live under).
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::SeqCst);
        let pids: Vec<u32> = self.children.lock().map(|v| v.clone()).unwrap_or_default();
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        // A request still being read ends now: its read sees end of file.
        for c in &self.conns {
            let _ = c.shutdown(std::net::Shutdown::Read);
        }
        for h in self.handlers {
            let _ = h.join();
        }
    }
}

/// What a nested run inherits from the outer one.
#[derive(Clone)]
pub struct Outer {
    pub policy: Policy,
    pub session_id: String,
    pub execution_id: String,
    /// The outer run's audit log: nested runs are always recorded there.
    pub audit_log: Option<PathBuf>,
}

fn reply(conn: &UnixStream, v: Value) {
    let _ = (&*conn).write_all(v.to_string().as_bytes());
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

fn handle(conn: UnixStream, outer: &Outer, children: &Mutex<Vec<u32>>, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    let (req, fds) = match receive(&conn) {
        Ok(r) => r,
        Err(e) => {
            return reply(
                &conn,
                json!({"exit_code": EXIT_MOAT_FAILED, "error": format!("nested run: {e}")}),
            )
        }
    };
    match run_nested(&req, fds, outer, children, stop) {
        Ok(code) => reply(&conn, json!({"exit_code": code})),
        Err(e) => reply(&conn, json!({"exit_code": EXIT_MOAT_FAILED, "error": e})),
    }
}

fn receive(conn: &UnixStream) -> Result<(Value, Vec<OwnedFd>), String> {
    let mut head = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; 3]);
    let mut fds = Vec::new();
    let got = {
        let mut iov = [IoSliceMut::new(&mut head)];
        let msg = recvmsg::<()>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| format!("read the request: {e}"))?;
        for c in msg.cmsgs().map_err(|e| e.to_string())? {
            if let ControlMessageOwned::ScmRights(r) = c {
                fds.extend(r.into_iter().map(moat_linux::sys::own_fd));
            }
        }
        msg.bytes
    };
    let mut reader = conn;
    if got < 4 {
        reader
            .read_exact(&mut head[got..])
            .map_err(|e| format!("read the request: {e}"))?;
    }
    let len = u32::from_be_bytes(head) as usize;
    if len > 4 << 20 {
        return Err("request too large".into());
    }
    let mut body = vec![0u8; len];
    reader
        .read_exact(&mut body)
        .map_err(|e| format!("read the request: {e}"))?;
    if fds.len() != 3 {
        return Err("the request did not carry stdin, stdout and stderr".into());
    }
    let v = serde_json::from_slice(&body).map_err(|e| format!("bad request: {e}"))?;
    Ok((v, fds))
}

static IN_FLIGHT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One of the MAX_NESTED places, given back when dropped.
struct Slot;

impl Slot {
    fn take() -> Option<Slot> {
        let prev = IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        if prev >= MAX_NESTED {
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Nested runs one outer run may have at once: each is a host process and
/// a sandbox, so a command must not be able to start them without bound.
const MAX_NESTED: usize = 8;

fn run_nested(
    req: &Value,
    fds: Vec<OwnedFd>,
    outer: &Outer,
    children: &Mutex<Vec<u32>>,
    stop: &AtomicBool,
) -> Result<i32, String> {
    // Counted from the moment a request is taken, not when its process
    // starts, so a burst cannot slip past the limit.
    let _slot = match Slot::take() {
        Some(s) => s,
        None => {
            return Err(format!(
                "nested run refused: {MAX_NESTED} nested runs are already going"
            ))
        }
    };
    let args: Vec<String> = req["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let cwd = PathBuf::from(req["cwd"].as_str().unwrap_or("/"));
    // A directory the outer view shows at its host path (the workspace or
    // a grant, e.g. a workspace under /tmp) is not private to the sandbox.
    let shown_at_host_path = cwd.starts_with(&outer.policy.workspace)
        || outer.policy.paths.iter().any(|g| cwd.starts_with(&g.path));
    if let Some(p) = SANDBOX_PRIVATE
        .iter()
        .find(|p| cwd.starts_with(p) && !shown_at_host_path)
    {
        return Err(format!(
            "nested run refused: {} is inside {p}, which is private to the outer sandbox; run it from a directory of the workspace",
            cwd.display()
        ));
    }
    let cli = Cli::try_parse_from(std::iter::once("moat".to_string()).chain(args.iter().cloned()))
        .map_err(|e| {
            format!(
                "nested run: {}",
                e.to_string().lines().next().unwrap_or("bad arguments")
            )
        })?;
    let Command::Exec(exec_args) = cli.command else {
        return Err("nested run: only `moat exec` is brokered".into());
    };
    if exec_args.report.no_audit || exec_args.report.audit_log.is_some() {
        return Err("nested run refused: --no-audit/--audit-log; nested runs are recorded in the outer run's audit log".into());
    }
    let home = outer.policy.home.clone();
    let (inner, _) =
        crate::resolve_policy_in(&exec_args.policy, &cwd, &home).map_err(|e| format!("{e:#}"))?;
    inner
        .within(&outer.policy.bounds())
        .map_err(|e| e.to_string())?;
    if stop.load(Ordering::SeqCst) {
        return Err("nested run refused: the outer run is ending".into());
    }
    let env: Vec<(String, String)> = req["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|kv| {
                    Some((
                        kv.get(0)?.as_str()?.to_string(),
                        kv.get(1)?.as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let exe = std::env::current_exe().map_err(|e| format!("cannot find moat's own binary: {e}"))?;
    let mut fds = fds.into_iter();
    let (Some(i), Some(o), Some(e)) = (fds.next(), fds.next(), fds.next()) else {
        return Err("missing stdio".into());
    };
    let mut cmd = std::process::Command::new(exe);
    let mut args = args;
    // After "exec": the outer run's log (or none, if the outer has none).
    let at = args
        .iter()
        .position(|a| a == "exec")
        .map(|i| i + 1)
        .unwrap_or(0);
    let mut injected: Vec<String> = match &outer.audit_log {
        Some(p) => vec!["--audit-log".into(), p.to_string_lossy().into_owned()],
        None => vec!["--no-audit".into()],
    };
    // The request's environment comes from inside the sandbox: it must not
    // shape the host-side moat process (LD_PRELOAD, XDG_*, locale paths…).
    // Only the safe base reaches that process; values the inner run passes
    // through with --pass-env travel as --env arguments, which only the
    // inner command's environment receives.
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    for name in &exec_args.policy.pass_env {
        if let Some(v) = get(name) {
            injected.push("--env".into());
            injected.push(format!("{name}={v}"));
        }
    }
    for (k, a) in injected.into_iter().enumerate() {
        args.insert(at + k, a);
    }
    let safe = |k: &str| moat_policy::SAFE_BASE_ENV.contains(&k) || k.starts_with("LC_");
    cmd.args(&args)
        .current_dir(&cwd)
        .env_clear()
        .envs(
            env.iter()
                .filter(|(k, _)| safe(k) && !moat_policy::is_secret_env_name(k))
                .cloned(),
        )
        .env("HOME", &home)
        .env("MOAT_SESSION_ID", &outer.session_id)
        .env("MOAT_PARENT_EXECUTION_ID", &outer.execution_id)
        .env("MOAT_BROKER_PID", std::process::id().to_string())
        // The launched moat checks again after its own resolution: a path
        // swapped between this check and that one cannot widen the run.
        .env(
            BOUNDS_ENV,
            serde_json::to_string(&outer.policy.bounds()).unwrap_or_default(),
        )
        .stdin(std::process::Stdio::from(i))
        .stdout(std::process::Stdio::from(o))
        .stderr(std::process::Stdio::from(e));
    for k in ["XDG_STATE_HOME", "XDG_CONFIG_HOME"] {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("start the nested run: {e}"))?;
    if let Ok(mut v) = children.lock() {
        v.push(child.id());
    }
    let status = child
        .wait()
        .map_err(|e| format!("wait for the nested run: {e}"))?;
    if let Ok(mut v) = children.lock() {
        v.retain(|p| *p != child.id());
    }
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}
