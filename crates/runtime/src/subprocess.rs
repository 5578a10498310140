//! The service's launcher: each execution is its own `moat exec --events`
//! child, a supervisor process per execution with its own signal handling,
//! process tree and limits, which the service follows by reading its typed
//! events back. The child is held by a pidfd taken while it is still
//! unreaped, so a signal can only ever reach that process, never a later
//! one that reused its pid.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};

use serde_json::Value;

use moat_config::PolicyFlags;

use crate::event::{Envelope, Event};
use crate::AuditTarget;

/// moat's stderr kept per execution, for the reason of a failure to start.
const KEEP_STDERR: usize = 64 * 1024;

/// Longest event line read from a supervisor (output chunks are far smaller).
const MAX_EVENT_LINE: u64 = 16 << 20;

/// Largest chunk of streamed input one write may carry (RFC-0021's default).
pub const MAX_INPUT_CHUNK: usize = 64 * 1024;
/// Streamed input accepted but not yet written to the command (RFC-0021's
/// default): past it a write is refused whole, and may be retried.
pub const MAX_INPUT_PENDING: usize = 256 * 1024;

/// The arguments of a `moat exec --events` supervisor child for `command`
/// under `flags` (the child resolves them exactly as `moat exec` on a
/// command line would), with the request's checked `metadata` and where
/// the run is recorded.
pub fn exec_args(
    flags: &PolicyFlags,
    command: &[String],
    metadata: Option<&serde_json::Map<String, Value>>,
    audit: &AuditTarget,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["exec".into(), "--events".into(), "--quiet".into()];
    if let Some(m) = metadata {
        a.push("--metadata".into());
        a.push(Value::Object(m.clone()).to_string().into());
    }
    match audit {
        AuditTarget::Off => a.push("--no-audit".into()),
        AuditTarget::Log(Some(p)) => {
            a.push("--audit-log".into());
            a.push(p.into());
        }
        AuditTarget::Log(None) => {}
    }
    a.extend(policy_flags_argv(flags));
    a.push("--".into());
    a.extend(command.iter().map(OsString::from));
    a
}

/// `flags` as `moat exec` arguments.
pub fn policy_flags_argv(f: &PolicyFlags) -> Vec<OsString> {
    // Exhaustive on purpose: a flag added to the table must be passed on
    // here, or a server would run its executions without it.
    let PolicyFlags {
        policy,
        network,
        cwd,
        ro,
        rw,
        env,
        pass_env,
        timeout,
        allow_domain,
        deny_domain,
        upstream_proxy,
        upstream_proxy_auth_file,
        backend,
        limits,
    } = f;
    // The limits group too, field by field, for the same reason.
    let moat_config::LimitFlags {
        memory,
        pids,
        cpu_time,
        file_size,
        open_files,
        tmp_size,
        output_limit,
        limits_mode,
    } = limits;
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |k: &str, v: OsString| {
        a.push(k.into());
        a.push(v);
    };
    if let Some(l) = policy {
        push("--policy", l.as_str().into());
    }
    if let Some(n) = network {
        push("--network", n.as_str().into());
    }
    if let Some(c) = cwd {
        push("--cwd", c.into());
    }
    for p in ro {
        push("--ro", p.into());
    }
    for p in rw {
        push("--rw", p.into());
    }
    for (k, v) in env {
        push("--env", format!("{k}={v}").into());
    }
    for n in pass_env {
        push("--pass-env", n.into());
    }
    if let Some(t) = timeout {
        push("--timeout", format!("{t}ms").into());
    }
    for d in allow_domain {
        push("--allow-domain", d.into());
    }
    for d in deny_domain {
        push("--deny-domain", d.into());
    }
    if let Some(u) = upstream_proxy {
        push("--upstream-proxy", u.into());
    }
    if let Some(p) = upstream_proxy_auth_file {
        push("--upstream-proxy-auth-file", p.into());
    }
    if let Some(b) = backend {
        push("--backend", b.as_str().into());
    }
    for (flag, value) in [
        ("--memory", memory),
        ("--file-size", file_size),
        ("--tmp-size", tmp_size),
        ("--output-limit", output_limit),
    ] {
        if let Some(bytes) = value {
            push(flag, bytes.to_string().into());
        }
    }
    for (flag, value) in [("--pids", pids), ("--open-files", open_files)] {
        if let Some(n) = value {
            push(flag, n.to_string().into());
        }
    }
    if let Some(ms) = cpu_time {
        push("--cpu-time", format!("{ms}ms").into());
    }
    if let Some(m) = limits_mode {
        let mode = match m {
            moat_policy::LimitsMode::Strict => "strict",
            moat_policy::LimitsMode::BestEffort => "best-effort",
        };
        push("--limits", mode.into());
    }
    a
}

/// Where the supervisor's (and so the command's) stdin comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StdinSource {
    /// Nothing: end of file at once.
    Empty,
    /// These bytes, then end of file.
    Bytes(Vec<u8>),
    /// Written while it runs ([`Input::write`]) until [`Input::close`].
    Stream,
}

/// Why streamed input was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InputError {
    #[error("the execution's input is closed (closeExecutionInput was called, or it ended)")]
    Closed,
    #[error("a chunk of {0} bytes is larger than {MAX_INPUT_CHUNK}: split it")]
    ChunkTooLarge(usize),
    #[error("{MAX_INPUT_PENDING} bytes of input are still waiting for the command to read them: retry once it has")]
    Backpressure,
}

#[derive(Default)]
struct InputState {
    queue: VecDeque<Vec<u8>>,
    /// Bytes accepted and not yet written (in flight included).
    pending: usize,
    closed: bool,
}

/// The write side of a streamed stdin: an ordered, bounded queue that one
/// thread drains into the supervisor's stdin pipe.
#[derive(Clone)]
pub struct Input(Arc<(Mutex<InputState>, Condvar)>);

impl Input {
    fn start(mut pipe: ChildStdin) -> Input {
        let input = Input(Arc::default());
        let shared = input.0.clone();
        std::thread::spawn(move || {
            let (lock, cv) = &*shared;
            loop {
                let chunk = {
                    let Ok(mut st) = lock.lock() else { return };
                    loop {
                        if let Some(c) = st.queue.pop_front() {
                            break c;
                        }
                        if st.closed {
                            // End of file for the command: the pipe drops.
                            return;
                        }
                        st = match cv.wait(st) {
                            Ok(g) => g,
                            Err(_) => return,
                        };
                    }
                };
                let ok = pipe.write_all(&chunk).is_ok();
                let Ok(mut st) = lock.lock() else { return };
                st.pending = st.pending.saturating_sub(chunk.len());
                if !ok {
                    // The command stopped reading (it exited): nothing
                    // more can be delivered.
                    st.closed = true;
                    st.queue.clear();
                    st.pending = 0;
                    return;
                }
            }
        });
        input
    }

    /// Queues `data` whole, or refuses it whole.
    pub fn write(&self, data: Vec<u8>) -> Result<usize, InputError> {
        if data.len() > MAX_INPUT_CHUNK {
            return Err(InputError::ChunkTooLarge(data.len()));
        }
        let (lock, cv) = &*self.0;
        let mut st = lock.lock().map_err(|_| InputError::Closed)?;
        if st.closed {
            return Err(InputError::Closed);
        }
        if st.pending + data.len() > MAX_INPUT_PENDING {
            return Err(InputError::Backpressure);
        }
        let n = data.len();
        st.pending += n;
        st.queue.push_back(data);
        cv.notify_all();
        Ok(n)
    }

    /// End of file after what was accepted; later writes are refused.
    /// Closing twice is closing once.
    pub fn close(&self) {
        let (lock, cv) = &*self.0;
        if let Ok(mut st) = lock.lock() {
            st.closed = true;
        }
        cv.notify_all();
    }
}

/// A handle that signals one supervisor and nothing else.
#[derive(Clone, Debug)]
pub struct Signaller(Arc<OwnedFd>);

impl Signaller {
    /// Asks the supervisor to stop its whole tree (it kills the sandbox on
    /// SIGTERM). A supervisor already gone is not an error.
    pub fn terminate(&self) {
        let _ = rustix::process::pidfd_send_signal(&*self.0, rustix::process::Signal::TERM);
    }

    /// Kills the supervisor (its sandbox's init dies with it).
    pub fn kill(&self) {
        let _ = rustix::process::pidfd_send_signal(&*self.0, rustix::process::Signal::KILL);
    }
}

/// One running `moat exec --events` child.
pub struct Supervisor {
    child: Child,
    signaller: Signaller,
    events: BufReader<ChildStdout>,
    stderr: Arc<Mutex<Vec<u8>>>,
    input: Option<Input>,
}

impl Supervisor {
    /// Starts `moat args…` in the directory `dir` (an fd: the path was
    /// checked, and a component swapped since cannot redirect it), with
    /// `stdin` as its input. It gets SIGTERM when this thread's process
    /// dies, so a killed service still stops its executions.
    pub fn spawn(
        moat: &Path,
        args: Vec<OsString>,
        dir: OwnedFd,
        stdin: StdinSource,
    ) -> std::io::Result<Supervisor> {
        let mut cmd = Command::new(moat);
        moat_linux::process::start_in(&mut cmd, dir);
        moat_linux::process::die_with_parent(&mut cmd, libc::SIGTERM);
        // As if the user had started it: the service's raised open-file
        // limit is not the command's.
        moat_linux::limits::start_with_starting_open_files(&mut cmd);
        let mut child = cmd
            .args(args)
            .stdin(if stdin == StdinSource::Empty {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        // The child is ours and unreaped: its pid cannot be reused yet.
        let pid = rustix::process::Pid::from_raw(child.id() as i32);
        let pidfd = match pid
            .map(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()))
        {
            Some(Ok(fd)) => fd,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                let e = match other {
                    Some(Err(e)) => std::io::Error::from(e),
                    _ => std::io::Error::other("the supervisor has no pid"),
                };
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("pidfd_open of the supervisor: {e} (moat needs Linux 5.3 or later)"),
                ));
            }
        };
        let mut input = None;
        if let Some(mut pipe) = child.stdin.take() {
            match stdin {
                StdinSource::Bytes(data) => {
                    std::thread::spawn(move || {
                        let _ = pipe.write_all(&data);
                    });
                }
                StdinSource::Stream => input = Some(Input::start(pipe)),
                StdinSource::Empty => {}
            }
        }
        let stderr = Arc::new(Mutex::new(Vec::new()));
        if let Some(mut err) = child.stderr.take() {
            let buf = stderr.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n) = err.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut b) = buf.lock() {
                        let room = KEEP_STDERR.saturating_sub(b.len());
                        b.extend_from_slice(&chunk[..n.min(room)]);
                    }
                }
            });
        }
        let Some(out) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other("moat's event stream is missing"));
        };
        Ok(Supervisor {
            child,
            signaller: Signaller(Arc::new(pidfd)),
            events: BufReader::new(out),
            stderr,
            input,
        })
    }

    /// The streamed stdin (with [`StdinSource::Stream`]).
    pub fn input(&self) -> Option<Input> {
        self.input.clone()
    }

    /// A handle to signal this supervisor from elsewhere.
    pub fn signaller(&self) -> Signaller {
        self.signaller.clone()
    }

    /// The next event: its wire form, envelope and type. None at the end
    /// of the stream; a line that is not JSON is skipped.
    pub fn next_event(&mut self) -> Option<(Value, Envelope, Event)> {
        let mut line = String::new();
        loop {
            line.clear();
            match (&mut self.events).take(MAX_EVENT_LINE).read_line(&mut line) {
                Ok(0) | Err(_) => return None,
                Ok(_) => {
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        let (env, ev) = Event::read(&v);
                        return Some((v, env, ev));
                    }
                }
            }
        }
    }

    /// What moat said on stderr (for a failure before the first event).
    pub fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .map(|b| String::from_utf8_lossy(&b).trim().to_string())
            .unwrap_or_default()
    }

    /// Kills the supervisor and reaps it (a run that never started).
    pub fn abort(&mut self) -> Option<ExitStatus> {
        if let Some(i) = &self.input {
            i.close();
        }
        self.signaller.kill();
        self.child.wait().ok()
    }

    /// Waits for the supervisor to exit.
    pub fn wait(mut self) -> Option<ExitStatus> {
        if let Some(i) = &self.input {
            i.close();
        }
        self.child.wait().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moat_policy::{Level, NetworkMode};

    #[test]
    fn every_policy_flag_reaches_the_child() {
        let f = PolicyFlags {
            policy: Some(Level::ReadOnly),
            network: Some(NetworkMode::Proxy),
            cwd: Some("/w".into()),
            ro: vec!["/r".into()],
            rw: vec!["/x".into()],
            env: vec![("A".into(), "b=c".into())],
            pass_env: vec!["TOKEN".into()],
            timeout: Some(1500),
            allow_domain: vec!["example.com".into()],
            deny_domain: vec!["evil.example".into()],
            upstream_proxy: Some("http://p:3128".into()),
            upstream_proxy_auth_file: Some("/auth".into()),
            backend: Some(moat_policy::Backend::Landlock),
            limits: moat_config::LimitFlags {
                memory: Some(1 << 30),
                pids: Some(64),
                cpu_time: Some(600_000),
                file_size: Some(1 << 20),
                open_files: Some(256),
                tmp_size: Some(16 << 20),
                output_limit: Some(4096),
                limits_mode: Some(moat_policy::LimitsMode::BestEffort),
            },
        };
        let argv: Vec<String> = policy_flags_argv(&f)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            argv.join(" "),
            "--policy read-only --network proxy --cwd /w --ro /r --rw /x --env A=b=c \
             --pass-env TOKEN --timeout 1500ms --allow-domain example.com --deny-domain evil.example \
             --upstream-proxy http://p:3128 --upstream-proxy-auth-file /auth --backend landlock \
             --memory 1073741824 --file-size 1048576 --tmp-size 16777216 --output-limit 4096 \
             --pids 64 --open-files 256 --cpu-time 600000ms --limits best-effort"
        );
    }

    fn root() -> OwnedFd {
        moat_linux::fd::open_path_nofollow(libc::AT_FDCWD, Path::new("/")).unwrap()
    }

    fn sh(script: &str, stdin: StdinSource) -> Supervisor {
        Supervisor::spawn(
            Path::new("/bin/sh"),
            vec!["-c".into(), script.into()],
            root(),
            stdin,
        )
        .unwrap()
    }

    #[test]
    fn events_are_read_typed_and_a_reaped_supervisor_is_never_signalled() {
        let mut sup = sh(
            r#"echo not-json; echo '{"type":"policy.resolved","execution_id":"exec_1","time":"t","policy_id":"read-only"}'; exec sleep 100"#,
            StdinSource::Empty,
        );
        let (_, env, ev) = sup.next_event().unwrap();
        assert_eq!(env.execution_id, "exec_1");
        assert!(matches!(ev, Event::PolicyResolved { .. }));
        let signaller = sup.signaller();
        signaller.terminate();
        let status = sup.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        // The pid may be anyone's now; the pidfd still names the dead
        // process, so this reaches nothing.
        let gone = rustix::process::pidfd_send_signal(&*signaller.0, rustix::process::Signal::TERM);
        assert_eq!(gone, Err(rustix::io::Errno::SRCH));
    }

    #[test]
    fn streamed_input_arrives_in_order_and_ends_with_close() {
        let mut sup = sh("exec cat", StdinSource::Stream);
        let input = sup.input().unwrap();
        let line =
            |n: u32| format!("{{\"type\":\"execution.stdout\",\"offset\":{n},\"data\":\"\"}}\n");
        assert_eq!(input.write(line(1).into_bytes()), Ok(line(1).len()));
        assert_eq!(input.write(line(2).into_bytes()), Ok(line(2).len()));
        assert_eq!(
            input.write(vec![b'x'; MAX_INPUT_CHUNK + 1]),
            Err(InputError::ChunkTooLarge(MAX_INPUT_CHUNK + 1))
        );
        input.close();
        input.close();
        assert_eq!(input.write(b"late\n".to_vec()), Err(InputError::Closed));
        let offsets: Vec<u64> = std::iter::from_fn(|| sup.next_event())
            .map(|(_, _, ev)| match ev {
                Event::Stdout(c) => c.offset,
                _ => u64::MAX,
            })
            .collect();
        assert_eq!(offsets, [1, 2]);
        assert!(sup.wait().unwrap().success());
    }

    #[test]
    fn input_the_command_does_not_read_is_bounded() {
        let sup = sh("exec sleep 100", StdinSource::Stream);
        let input = sup.input().unwrap();
        let mut accepted = 0;
        let mut refused = 0;
        // The pipe holds at most one chunk's worth (64 KiB by default);
        // everything else waits in the queue, which stops at its bound.
        for _ in 0..8 {
            match input.write(vec![b'x'; MAX_INPUT_CHUNK]) {
                Ok(n) => accepted += n,
                Err(InputError::Backpressure) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(refused > 0, "accepted {accepted} bytes, none refused");
        assert!(accepted <= MAX_INPUT_PENDING + MAX_INPUT_CHUNK);
        sup.signaller().kill();
        let _ = sup.wait();
    }
}
