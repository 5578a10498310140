//! A terminal of the command's own. When moat's stdin and stdout are a
//! terminal, the init opens a pty pair in the sandbox's private devpts; the
//! command gets the slave as its controlling terminal (so `tty` names a
//! /dev/pts path and job control works), and the supervisor relays between
//! the host terminal (in raw mode) and the master, copying the window size
//! at the start and on every SIGWINCH. The host terminal itself never enters
//! the sandbox, and its settings are restored on every exit of the
//! supervisor that runs code (a SIGKILL of moat cannot be caught).

use std::io;
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd, RawFd};

use nix::fcntl::OFlag;
use nix::sys::termios::{self, SetArg, Termios};

use crate::sys;

/// Opens a pty pair (master, slave) in the devpts of the current mount
/// namespace: `/dev/ptmx` and `/dev/pts/N`.
pub fn open_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let to_io = |e: nix::errno::Errno| io::Error::from_raw_os_error(e as i32);
    let master = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)
        .map_err(to_io)?;
    nix::pty::grantpt(&master).map_err(to_io)?;
    nix::pty::unlockpt(&master).map_err(to_io)?;
    let name = nix::pty::ptsname_r(&master).map_err(to_io)?;
    let slave = nix::fcntl::open(
        name.as_str(),
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(to_io)?;
    Ok((sys::own_fd(master.into_raw_fd()), slave))
}

/// Copies the window size of this process's terminal (stdout, else stdin)
/// to the pty whose master is `master`.
pub fn copy_window_size_to(master: RawFd) {
    if let Ok(ws) = sys::get_winsize(1).or_else(|_| sys::get_winsize(0)) {
        let _ = sys::set_winsize(master, &ws);
    }
}

/// In the command's process, before exec: a new session whose controlling
/// terminal is `slave`, on stdin, stdout and (with `stderr`) stderr.
pub fn attach_slave(slave: RawFd, stderr: bool) -> io::Result<()> {
    nix::unistd::setsid().map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    sys::set_controlling_tty(slave)?;
    let targets: &[RawFd] = if stderr { &[0, 1, 2] } else { &[0, 1] };
    for t in targets {
        sys::dup2(slave, *t)?;
    }
    Ok(())
}

/// The host terminal in raw mode for as long as this lives.
struct RawMode {
    fd: RawFd,
    saved: Termios,
}

impl RawMode {
    fn enter(fd: RawFd) -> Option<RawMode> {
        let borrowed = sys::borrow_stdio(fd)?;
        let saved = termios::tcgetattr(borrowed).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(borrowed, SetArg::TCSADRAIN, &raw).ok()?;
        Some(RawMode { fd, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(fd) = sys::borrow_stdio(self.fd) {
            let _ = termios::tcsetattr(fd, SetArg::TCSADRAIN, &self.saved);
        }
    }
}

/// Most bytes held for the master before moat stops reading the host terminal.
const MAX_PENDING: usize = 64 * 1024;

/// The supervisor's side: relays host stdin → master and master → host stdout.
pub struct Relay {
    master: OwnedFd,
    to_master: Vec<u8>,
    stdin_open: bool,
    master_open: bool,
    _raw: Option<RawMode>,
}

impl Relay {
    /// Starts relaying: the host terminal goes raw and the window size is copied.
    pub fn start(master: OwnedFd) -> Relay {
        set_nonblocking(&master);
        let raw = RawMode::enter(0);
        let relay = Relay {
            master,
            to_master: Vec::new(),
            stdin_open: true,
            master_open: true,
            _raw: raw,
        };
        relay.copy_window_size();
        relay
    }

    /// Copies the host terminal's window size to the pty (SIGWINCH).
    pub fn copy_window_size(&self) {
        copy_window_size_to(self.master.as_raw_fd());
    }

    /// The fds to poll and for what: (fd, want POLLIN, want POLLOUT).
    pub fn poll_set(&self) -> Vec<(std::os::fd::BorrowedFd<'_>, nix::poll::PollFlags)> {
        use nix::poll::PollFlags as F;
        let mut out = Vec::new();
        if self.master_open {
            let mut f = F::POLLIN;
            if !self.to_master.is_empty() {
                f |= F::POLLOUT;
            }
            out.push((self.master.as_fd(), f));
        }
        if self.stdin_open && self.master_open && self.to_master.len() < MAX_PENDING {
            if let Some(stdin) = sys::borrow_stdio(0) {
                out.push((stdin, F::POLLIN));
            }
        }
        out
    }

    /// Moves what is ready. `master_ready`/`stdin_ready` come from poll.
    pub fn pump(&mut self, master_ready: bool, stdin_ready: bool) {
        let mut buf = [0u8; 16384];
        if let (true, Some(stdin)) = (stdin_ready, sys::borrow_stdio(0)) {
            match nix::unistd::read(stdin, &mut buf) {
                Ok(0) => self.stdin_open = false,
                Ok(n) => self.to_master.extend_from_slice(&buf[..n]),
                Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => {}
                Err(_) => self.stdin_open = false,
            }
        }
        if master_ready {
            self.drain_master();
            self.flush_to_master();
        }
    }

    fn flush_to_master(&mut self) {
        while !self.to_master.is_empty() && self.master_open {
            match nix::unistd::write(&self.master, &self.to_master) {
                Ok(n) => {
                    self.to_master.drain(..n);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => {
                    self.to_master.clear();
                    break;
                }
            }
        }
    }

    /// Copies everything the command wrote so far to the host stdout. EIO
    /// means every slave is closed: the command and its children are done.
    pub fn drain_master(&mut self) {
        let mut buf = [0u8; 16384];
        while self.master_open {
            match nix::unistd::read(&self.master, &mut buf) {
                Ok(0) => self.master_open = false,
                Ok(n) => sys::write_all_fd(1, &buf[..n]),
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => self.master_open = false,
            }
        }
    }
}

fn set_nonblocking(fd: &OwnedFd) {
    use nix::fcntl::{fcntl, FcntlArg};
    if let Ok(flags) = fcntl(fd, FcntlArg::F_GETFL) {
        let _ = fcntl(
            fd,
            FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
        );
    }
}
