//! Nested runs: `moat exec` called inside a moat sandbox cannot create
//! namespaces (the seccomp floor forbids it), so it asks the outer
//! supervisor through the broker socket that only a moat view contains.
//! The supervisor resolves the inner policy against the real host, refuses
//! it unless it fits inside the outer one, and runs it as a new sandbox
//! from the host side with the caller's stdin/stdout/stderr.

use std::ffi::OsString;
use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use clap::Parser;
use moat_linux::netns::BROKER_SOCKET;
use moat_linux::view::View;
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use serde_json::{json, Value};

use crate::{Cli, Command, EXIT_MOAT_FAILED};

/// Names the fd (a pipe from the broker) on which the moat process that
/// runs a nested request reads the outer run's view and the values the
/// request passes through with --pass-env. Neither appears on a command
/// line nor in an environment a sandbox could read back.
pub const NESTED_FD_ENV: &str = "MOAT_NESTED_FD";

/// Connections the broker serves at once; more are refused at once, so idle
/// connections cannot each hold a host thread.
const MAX_CONNECTIONS: usize = 16;
/// How long a connection may take to send its request.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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
/// when one arrives, at most [`MAX_CONNECTIONS`] at once) until the run ends.
pub struct Broker {
    outer: Outer,
    stop: Arc<AtomicBool>,
    children: Arc<Mutex<Vec<u32>>>,
    active: Arc<std::sync::atomic::AtomicUsize>,
    handlers: Vec<std::thread::JoinHandle<()>>,
    /// Our side of every connection being served, so shutdown can end a
    /// request that never completes (a command may even send us its own end).
    conns: Vec<(UnixStream, usize)>,
    next_id: usize,
    done: Arc<Mutex<Vec<usize>>>,
}

impl Broker {
    pub fn new(outer: Outer) -> Broker {
        Broker {
            outer,
            stop: Arc::default(),
            children: Arc::default(),
            active: Arc::default(),
            handlers: Vec::new(),
            conns: Vec::new(),
            next_id: 0,
            done: Arc::default(),
        }
    }

    /// Serves one nested request on its own thread, or refuses it at once
    /// when [`MAX_CONNECTIONS`] are already being served.
    pub fn serve(&mut self, conn: UnixStream) {
        // Forget what finished: its thread and our copy of its socket.
        if let Ok(mut done) = self.done.lock() {
            self.conns.retain(|(_, id)| !done.contains(id));
            done.clear();
        }
        let (finished, running): (Vec<_>, Vec<_>) =
            self.handlers.drain(..).partition(|h| h.is_finished());
        for h in finished {
            let _ = h.join();
        }
        self.handlers = running;
        if self.active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            self.active.fetch_sub(1, Ordering::SeqCst);
            let _ = conn.set_nonblocking(true);
            reply(
                &conn,
                json!({"exit_code": EXIT_MOAT_FAILED, "error": format!("nested run refused: {MAX_CONNECTIONS} requests are already open")}),
            );
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        if let Ok(c) = conn.try_clone() {
            self.conns.push((c, id));
        }
        let (o, c, s) = (self.outer.clone(), self.children.clone(), self.stop.clone());
        let (active, done) = (self.active.clone(), self.done.clone());
        self.handlers.push(std::thread::spawn(move || {
            handle(conn, &o, &c, &s);
            if let Ok(mut d) = done.lock() {
                d.push(id);
            }
            active.fetch_sub(1, Ordering::SeqCst);
        }));
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
        for (c, _) in &self.conns {
            let _ = c.shutdown(std::net::Shutdown::Read);
        }
        for h in self.handlers {
            let _ = h.join();
        }
    }
}

pub use moat_runtime::nested::{inherit_policy, Handoff, Outer};

impl moat_runtime::NestedBroker for Broker {
    fn serve(&mut self, conn: UnixStream) {
        Broker::serve(self, conn)
    }
    fn shutdown(self: Box<Self>) {
        Broker::shutdown(*self)
    }
}

fn reply(conn: &UnixStream, v: Value) {
    let _ = (&*conn).write_all(v.to_string().as_bytes());
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

fn handle(conn: UnixStream, outer: &Outer, children: &Mutex<Vec<u32>>, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(REQUEST_TIMEOUT));
    // The caller's own net class (a profiled tool's shim stacks seccomp
    // filters a process cannot remove): read before anything else, while
    // the caller waits for our answer.
    let caller_class = match caller_net_class(&conn) {
        Ok(c) => c,
        Err(e) => {
            return reply(
                &conn,
                json!({"exit_code": EXIT_MOAT_FAILED, "error": format!("nested run refused: {e}")}),
            )
        }
    };
    let (req, fds) = match receive(&conn) {
        Ok(r) => r,
        Err(e) => {
            return reply(
                &conn,
                json!({"exit_code": EXIT_MOAT_FAILED, "error": format!("nested run: {e}")}),
            )
        }
    };
    let _ = conn.set_read_timeout(None);
    match run_nested(&req, fds, outer, caller_class, children, stop) {
        Ok(code) => reply(&conn, json!({"exit_code": code})),
        Err(e) => reply(&conn, json!({"exit_code": EXIT_MOAT_FAILED, "error": e})),
    }
}

fn receive(conn: &UnixStream) -> Result<(Value, Vec<OwnedFd>), String> {
    let mut head = [0u8; 4];
    let (got, fds) = moat_linux::fd::recv_with_fds::<3>(conn.as_fd(), &mut head)
        .map_err(|e| format!("read the request: {e}"))?;
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

/// The net class of the process at the other end of `conn`, from the
/// seccomp filters stacked on it. With a pidfd (Linux >= 6.5) the answer is
/// checked to still be about the caller (its pid cannot have been reused).
fn caller_net_class(conn: &UnixStream) -> Result<Option<moat_policy::NetClass>, String> {
    use std::os::fd::AsFd;
    let filters_of = |pid: i32| -> Result<u32, String> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|e| format!("cannot read the caller's status: {e}"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp_filters:"))
            .and_then(|v| v.trim().parse::<u32>().ok())
            .ok_or_else(|| {
                "cannot read the caller's seccomp filters (needs Linux >= 5.9)".to_string()
            })
    };
    let filters = match moat_linux::fd::peer_pidfd(conn.as_fd()) {
        Ok(pidfd) => {
            let pid_of = || -> Option<i32> {
                let info =
                    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))
                        .ok()?;
                info.lines()
                    .find_map(|l| l.strip_prefix("Pid:"))
                    .and_then(|v| v.trim().parse().ok())
            };
            let pid = pid_of().filter(|p| *p > 0).ok_or("the caller is gone")?;
            let filters = filters_of(pid)?;
            if pid_of() != Some(pid) {
                return Err("the caller is gone".into());
            }
            filters
        }
        Err(_) => {
            let cred =
                nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::PeerCredentials)
                    .map_err(|e| format!("cannot identify the caller: {e}"))?;
            filters_of(cred.pid())?
        }
    };
    Ok(moat_linux::confine::net_class_of_filters(filters))
}

/// Serialises spawning a nested run: the handoff pipe's read end is
/// inheritable only while this is held, so no other child gets it.
static SPAWN: Mutex<()> = Mutex::new(());

fn run_nested(
    req: &Value,
    fds: Vec<OwnedFd>,
    outer: &Outer,
    caller_class: Option<moat_policy::NetClass>,
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
    let Some(outer_view) = &outer.view else {
        return Err("nested run refused: the outer run has no view to check it against".into());
    };
    // The caller's directory must be host content at its own path in the
    // outer view: the sandbox's own /tmp, HOME, /run… do not exist on the
    // host. The request names it, so it is followed through the outer view
    // (a symlink in the workspace must not lead the host process elsewhere).
    let Some(cwd) = resolve_in_view(outer_view, &cwd) else {
        return Err(format!(
            "nested run refused: {} is private to the outer sandbox (not a host directory of its view); run it from a directory of the workspace",
            cwd.display()
        ));
    };
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
    // Refused before anything resolves the flags: the host side would read
    // the credentials file (any file this user can read) and answer
    // differently for a missing, unreadable or malformed one.
    if exec_args.policy.upstream_proxy.is_some()
        || exec_args.policy.upstream_proxy_auth_file.is_some()
    {
        return Err("nested run refused: --upstream-proxy/--upstream-proxy-auth-file; a nested run inherits the outer run's upstream proxy and cannot choose one".into());
    }
    let mut outer_view = outer_view.clone();
    outer_view.net_class = match (outer_view.net_class, caller_class) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let home = outer.policy.home.clone();
    // Paths are resolved by this (host) process, so each one given is first
    // followed through the outer view alone: a path the outer run does not
    // show is refused with one answer whether or not it exists on the host,
    // and a symlink is followed only where the outer run could read it.
    check_paths_in_view(&exec_args.policy, &cwd, &home, &outer_view)?;
    // A first check here (the launched moat checks the whole view again,
    // after its own resolution, closing any race with this one).
    let (mut inner, _) =
        crate::resolve_policy_in(&exec_args.policy, &cwd, &home).map_err(|e| format!("{e:#}"))?;
    moat_linux::view::inherit_policy(&outer_view, &mut inner, None).map_err(|e| e.to_string())?;
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
    let injected: Vec<String> = match &outer.audit_log {
        Some(p) => vec!["--audit-log".into(), p.to_string_lossy().into_owned()],
        None => vec!["--no-audit".into()],
    };
    // The request's environment comes from inside the sandbox: it must not
    // shape the host-side moat process (LD_PRELOAD, XDG_*, locale paths…).
    // Only the safe base reaches that process; values the inner run passes
    // through with --pass-env travel in the handoff pipe, which only the
    // inner command's environment receives.
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let handoff = Handoff {
        outer: outer_view,
        pass_env: exec_args
            .policy
            .pass_env
            .iter()
            .filter_map(|n| Some((n.clone(), get(n)?)))
            .collect(),
        upstream_url: outer.policy.network.upstream_url.clone(),
        limits: outer.policy.limits.clone(),
    };
    let handoff = serde_json::to_vec(&json!({
        "outer": serde_json::to_value(&handoff.outer).map_err(|e| format!("nested run: {e}"))?,
        "pass_env": handoff.pass_env,
        "upstream_url": handoff.upstream_url,
        "limits": handoff.limits,
    }))
    .map_err(|e| format!("nested run: {e}"))?;
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
        .stdin(std::process::Stdio::from(i))
        .stdout(std::process::Stdio::from(o))
        .stderr(std::process::Stdio::from(e));
    for k in ["XDG_STATE_HOME", "XDG_CONFIG_HOME"] {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("nested run: handoff pipe: {e}"))?;
    cmd.env(NESTED_FD_ENV, read_end.as_raw_fd().to_string());
    let mut child = {
        let _spawning = SPAWN
            .lock()
            .map_err(|_| "nested run: spawn lock poisoned")?;
        set_inheritable(&read_end, true)?;
        let child = cmd.spawn();
        set_inheritable(&read_end, false)?;
        child.map_err(|e| format!("start the nested run: {e}"))?
    };
    drop(read_end);
    // The launched moat reads all of it before anything else; if it dies
    // first, the write fails and so does the run.
    let mut w = std::fs::File::from(write_end);
    let written = w.write_all(&handoff);
    drop(w);
    if let Err(e) = written {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("nested run: hand the outer view over: {e}"));
    }
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

/// Refuses (with an answer that depends only on what the outer view
/// shows) every `--ro`/`--rw`/`--cwd` path that does not lead to host
/// content the outer run shows.
fn check_paths_in_view(
    flags: &moat_config::PolicyFlags,
    cwd: &Path,
    home: &Path,
    view: &moat_linux::view::View,
) -> Result<(), String> {
    let given = flags
        .ro
        .iter()
        .map(|p| ("--ro", p))
        .chain(flags.rw.iter().map(|p| ("--rw", p)))
        .chain(flags.cwd.iter().map(|p| ("--cwd", p)));
    for (flag, p) in given {
        let abs = match p.strip_prefix("~") {
            Ok(rest) => home.join(rest),
            Err(_) => cwd.join(p),
        };
        if resolve_in_view(view, &abs).is_none() {
            return Err(format!(
                "nested run refused: {flag} {}: not a path the outer run shows (a nested run can only be given what its outer run sees)",
                p.display()
            ));
        }
    }
    Ok(())
}

/// `path` with its symlinks followed, looking on the host only at paths
/// the view shows at their own place; None when it leads anywhere else.
fn resolve_in_view(view: &moat_linux::view::View, path: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let mut todo: std::collections::VecDeque<std::ffi::OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut cur = PathBuf::from("/");
    let mut hops = 0;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&name);
        if view.shows_host_at_own_path(&next) {
            if let Ok(target) = std::fs::read_link(&next) {
                hops += 1;
                if hops > 40 {
                    return None;
                }
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(n) => todo.push_front(n.to_os_string()),
                        Component::ParentDir => todo.push_front("..".into()),
                        _ => {}
                    }
                }
                continue;
            }
        }
        cur = next;
    }
    view.shows_host_at_own_path(&cur).then_some(cur)
}

fn set_inheritable(fd: &OwnedFd, inheritable: bool) -> Result<(), String> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let flags = if inheritable {
        FdFlag::empty()
    } else {
        FdFlag::FD_CLOEXEC
    };
    fcntl(fd, FcntlArg::F_SETFD(flags))
        .map(|_| ())
        .map_err(|e| format!("nested run: handoff pipe: {e}"))
}

/// Whether this process was launched by a broker for a nested run.
pub fn is_nested_launch() -> bool {
    std::env::var_os(NESTED_FD_ENV).is_some()
}

/// In the moat process that runs a nested request: reads the handoff the
/// broker left on [`NESTED_FD_ENV`]. None when this is not a nested run.
pub fn read_handoff() -> Option<Result<Handoff, String>> {
    let n = std::env::var(NESTED_FD_ENV).ok()?;
    let res = (|| -> Result<Handoff, String> {
        let fd: RawFd = n
            .parse()
            .map_err(|_| format!("bad {NESTED_FD_ENV} {n:?}"))?;
        let fd = moat_linux::process::take_inherited_fd(fd)
            .map_err(|e| format!("the broker's handoff fd {fd}: {e}"))?;
        let mut body = Vec::new();
        std::fs::File::from(fd)
            .take(64 << 20)
            .read_to_end(&mut body)
            .map_err(|e| format!("read the broker's handoff: {e}"))?;
        let v: Value =
            serde_json::from_slice(&body).map_err(|e| format!("unreadable handoff: {e}"))?;
        let outer: View = serde_json::from_value(v["outer"].clone())
            .map_err(|e| format!("unreadable outer view: {e}"))?;
        let pass_env: Vec<(String, String)> = serde_json::from_value(v["pass_env"].clone())
            .map_err(|e| format!("unreadable handoff: {e}"))?;
        let upstream_url = v["upstream_url"].as_str().map(String::from);
        let limits: moat_policy::Limits = serde_json::from_value(v["limits"].clone())
            .map_err(|e| format!("unreadable outer limits: {e}"))?;
        Ok(Handoff {
            outer,
            pass_env,
            upstream_url,
            limits,
        })
    })();
    Some(res.map_err(|e| format!("nested run refused: {e}")))
}
