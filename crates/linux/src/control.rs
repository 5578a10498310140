//! Where a run's stop, hang-up and resize requests come from. `moat exec`
//! runs one command per process and takes them from its own signals
//! ([`Control::ProcessSignals`]: a signalfd for SIGTERM, SIGINT, SIGQUIT,
//! SIGHUP and SIGWINCH). A process that runs several executions at once (a
//! service) cannot: a process-wide signal names no execution, and one
//! signalfd would take it from all of them. It gives each run a
//! [`ControlReceiver`] instead and keeps the [`ControlSender`]: a pipe the
//! supervisor polls beside its other event sources.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// What the owner of a run asks of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Stop the run: SIGTERM to its tree, SIGKILL after the grace period
    /// (what SIGTERM to `moat exec` does).
    Stop,
    /// Pass SIGHUP to the command.
    Hangup,
    /// The terminal was resized: copy its size to the command's pty.
    Resize,
}

impl Request {
    fn byte(self) -> u8 {
        match self {
            Request::Stop => b'S',
            Request::Hangup => b'H',
            Request::Resize => b'W',
        }
    }
    pub(crate) fn from_byte(b: u8) -> Option<Request> {
        [Request::Stop, Request::Hangup, Request::Resize]
            .into_iter()
            .find(|r| r.byte() == b)
    }
}

/// Where a run takes its requests from.
#[derive(Clone, Copy)]
pub enum Control<'a> {
    /// This process's own signals (one run per process: `moat exec`).
    ProcessSignals,
    /// The caller's channel; the process's signals are left alone.
    Channel(&'a ControlReceiver),
}

/// The owner's end: send requests to one run (clone it with
/// [`ControlSender::try_clone`] to hand to another thread).
pub struct ControlSender {
    fd: OwnedFd,
}

/// The run's end, passed to [`crate::run::run_with`].
pub struct ControlReceiver {
    fd: OwnedFd,
}

/// A new channel for one run.
pub fn channel() -> io::Result<(ControlSender, ControlReceiver)> {
    use nix::fcntl::OFlag;
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
        .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    Ok((ControlSender { fd: w }, ControlReceiver { fd: r }))
}

impl ControlSender {
    /// Sends `req`; the run acts on it at its next wake-up. Fails when the
    /// run is over (its end closed) or when a burst of requests it has not
    /// read yet fills the pipe.
    pub fn send(&self, req: Request) -> io::Result<()> {
        loop {
            match nix::unistd::write(&self.fd, &[req.byte()]) {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io::Error::from_raw_os_error(e as i32)),
            }
        }
    }
    /// Another sender to the same run.
    pub fn try_clone(&self) -> io::Result<ControlSender> {
        Ok(ControlSender {
            fd: self.fd.try_clone()?,
        })
    }
}

impl ControlReceiver {
    /// Every request waiting; `None` once every sender is gone.
    pub(crate) fn drain(&self) -> Option<Vec<Request>> {
        let mut buf = [0u8; 64];
        let mut out = Vec::new();
        loop {
            match nix::unistd::read(&self.fd, &mut buf) {
                Ok(0) if out.is_empty() => return None,
                Ok(0) => return Some(out),
                Ok(n) => out.extend(buf[..n].iter().filter_map(|b| Request::from_byte(*b))),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return Some(out),
            }
        }
    }
}

impl AsFd for ControlReceiver {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
