//! A terminal of the command's own. When any of moat's stdin, stdout and
//! stderr is a terminal, the init opens a pty pair in the sandbox's private
//! devpts (on the Landlock backend, which has none, in the host's); the
//! command gets the slave as its controlling terminal (so `tty`
//! names a /dev/pts path and job control works) on each of those fds, and
//! the supervisor relays between the host terminal (in raw mode while moat
//! is in the foreground) and the master, copying the window size at the
//! start and on every SIGWINCH. The host terminal itself never enters
//! the sandbox, and its settings are restored on every exit of the
//! supervisor that runs code (a SIGKILL of moat cannot be caught).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use nix::fcntl::OFlag;
use nix::sys::termios::{self, SetArg, Termios};

use crate::sys;

/// Opens a pty pair (master, slave) in the devpts of the current mount
/// namespace: `/dev/ptmx` and `/dev/pts/N` (the sandbox's own, or the
/// host's on the Landlock backend).
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
    Ok((OwnedFd::from(master), slave))
}

/// Copies the window size of this process's terminal (stdout, else stdin)
/// to the pty whose master is `master`.
pub fn copy_window_size_to(master: RawFd) {
    if let Ok(ws) = sys::get_winsize(1)
        .or_else(|_| sys::get_winsize(2))
        .or_else(|_| sys::get_winsize(0))
    {
        let _ = sys::set_winsize(master, &ws);
    }
}

/// Which of moat's stdin, stdout and stderr are a terminal: each of those
/// becomes the sandbox's own pty for the command, so no host terminal fd
/// ever enters the sandbox (a terminal fd is open for reading too, and a
/// process outside the terminal's session reads it unstopped by job
/// control: with the host's, the command could read what the user types
/// for other programs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attach {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

impl Attach {
    /// The terminals among this process's stdio, or None when there is none.
    pub fn of_stdio() -> Option<Attach> {
        let tty =
            |fd| sys::borrow_stdio(fd).is_some_and(|f| nix::unistd::isatty(f).unwrap_or(false));
        let a = Attach {
            stdin: tty(0),
            stdout: tty(1),
            stderr: tty(2),
        };
        (a.stdin || a.stdout || a.stderr).then_some(a)
    }

    /// The host fd the command's terminal output is copied to: stdout when
    /// it is a terminal, else stderr, else stdin (a terminal opened for
    /// reading and writing, where echo and /dev/tty prompts belong).
    fn output_fd(&self) -> RawFd {
        if self.stdout {
            1
        } else if self.stderr {
            2
        } else {
            0
        }
    }
}

/// In the command's process, before exec: a new session whose controlling
/// terminal is `slave`, on each stdio fd `attach` names.
pub(crate) fn attach_slave(slave: RawFd, attach: Attach) -> io::Result<()> {
    nix::unistd::setsid().map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    sys::set_controlling_tty(slave)?;
    for (on, t) in [(attach.stdin, 0), (attach.stdout, 1), (attach.stderr, 2)] {
        if on {
            // SAFETY: called in the command's process just before exec, where
            // stdio numbers have no Rust owner.
            unsafe { sys::dup2(slave, t) }?;
        }
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

/// Whether this process is in its terminal's foreground process group.
fn in_foreground() -> bool {
    sys::borrow_stdio(0)
        .is_some_and(|f| nix::unistd::tcgetpgrp(f).ok() == Some(nix::unistd::getpgrp()))
}

/// The supervisor's side: relays host stdin → master and master → the host
/// terminal.
pub struct Relay {
    master: OwnedFd,
    to_master: Vec<u8>,
    /// Host stdin is a terminal whose input goes to the command.
    stdin_open: bool,
    master_open: bool,
    out_fd: RawFd,
    raw: Option<RawMode>,
    /// Removes control strings that act on the host (clipboard, files).
    filter: crate::termfilter::TermFilter,
}

impl Relay {
    /// Starts relaying and copies the window size. Host input is relayed
    /// (and the host terminal put in raw mode) only while moat is in the
    /// terminal's foreground: a backgrounded moat must neither change the
    /// user's terminal under their shell nor take what they type there.
    pub fn start(master: OwnedFd, attach: Attach) -> Relay {
        set_nonblocking(&master);
        let mut relay = Relay {
            master,
            to_master: Vec::new(),
            stdin_open: attach.stdin,
            master_open: true,
            out_fd: attach.output_fd(),
            raw: None,
            filter: crate::termfilter::TermFilter::new(),
        };
        relay.take_input_if_foreground();
        relay.copy_window_size();
        relay
    }

    /// Relays only what the command wrote (a master taken after the
    /// command ended): no input, no raw mode, no window size.
    pub fn output_only(master: OwnedFd, attach: Attach) -> Relay {
        set_nonblocking(&master);
        Relay {
            master,
            to_master: Vec::new(),
            stdin_open: false,
            master_open: true,
            out_fd: attach.output_fd(),
            raw: None,
            filter: crate::termfilter::TermFilter::new(),
        }
    }

    /// Enters raw mode once moat is in the foreground. True while input
    /// is still waiting for that (the caller polls with a short timeout).
    pub fn take_input_if_foreground(&mut self) -> bool {
        if !self.stdin_open || self.raw.is_some() || !self.master_open {
            return false;
        }
        if in_foreground() {
            self.raw = RawMode::enter(0);
            // A terminal whose modes cannot be read or set is not relayed
            // from: cooked input would be echoed twice.
            if self.raw.is_none() {
                self.stdin_open = false;
            }
            return false;
        }
        true
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
        if self.stdin_open
            && self.raw.is_some()
            && self.master_open
            && self.to_master.len() < MAX_PENDING
        {
            if let Some(stdin) = sys::borrow_stdio(0) {
                out.push((stdin, F::POLLIN));
            }
        }
        out
    }

    /// Moves what is ready. `master_ready`/`stdin_ready` come from poll.
    /// `left` is the run's output budget (`--output-limit`), shared with
    /// stdout and stderr; true when output past it was dropped.
    pub fn pump(&mut self, master_ready: bool, stdin_ready: bool, left: &mut Option<u64>) -> bool {
        let mut buf = [0u8; 16384];
        if let (true, true, Some(stdin)) = (stdin_ready, self.raw.is_some(), sys::borrow_stdio(0)) {
            match nix::unistd::read(stdin, &mut buf) {
                Ok(0) => self.stdin_open = false,
                Ok(n) => self.to_master.extend_from_slice(&buf[..n]),
                Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => {}
                Err(_) => self.stdin_open = false,
            }
        }
        let mut exceeded = false;
        if master_ready {
            exceeded = self.drain_master(left);
            self.flush_to_master();
        }
        exceeded
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
    /// What the command writes to its terminal (`/dev/tty`) counts against
    /// the output budget `left` like stdout: past it nothing is shown, and
    /// the result is true.
    pub fn drain_master(&mut self, left: &mut Option<u64>) -> bool {
        let mut buf = [0u8; 16384];
        let mut shown = Vec::with_capacity(buf.len());
        let mut exceeded = false;
        while self.master_open {
            match nix::unistd::read(&self.master, &mut buf) {
                Ok(0) => self.master_open = false,
                Ok(read) => {
                    let n = match left.as_mut() {
                        Some(l) => {
                            let n = read.min(usize::try_from(*l).unwrap_or(usize::MAX));
                            *l -= n as u64;
                            exceeded |= n < read;
                            n
                        }
                        None => read,
                    };
                    shown.clear();
                    self.filter.push(&buf[..n], &mut shown);
                    sys::write_all_fd(self.out_fd, &shown);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => self.master_open = false,
            }
        }
        exceeded
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
