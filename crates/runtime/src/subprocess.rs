//! The service's launcher: each execution is its own `moat exec --events`
//! child, a supervisor process per execution with its own signal handling,
//! process tree and limits, which the service follows by reading its typed
//! events back. The child is held by a pidfd taken while it is still
//! unreaped, so a signal can only ever reach that process, never a later
//! one that reused its pid.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::event::{Envelope, Event};

/// moat's stderr kept per execution, for the reason of a failure to start.
const KEEP_STDERR: usize = 64 * 1024;

/// Longest event line read from a supervisor (output chunks are far smaller).
const MAX_EVENT_LINE: u64 = 16 << 20;

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
        stdin: Vec<u8>,
    ) -> std::io::Result<Supervisor> {
        let mut cmd = Command::new(moat);
        moat_linux::sys::start_in(&mut cmd, dir);
        moat_linux::sys::die_with_parent(&mut cmd, libc::SIGTERM);
        let mut child = cmd
            .args(args)
            .stdin(if stdin.is_empty() {
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
        if let Some(mut input) = child.stdin.take() {
            std::thread::spawn(move || {
                let _ = input.write_all(&stdin);
            });
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
        })
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
        self.signaller.kill();
        self.child.wait().ok()
    }

    /// Waits for the supervisor to exit.
    pub fn wait(mut self) -> Option<ExitStatus> {
        self.child.wait().ok()
    }
}
