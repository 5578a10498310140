//! The Landlock backend with a host terminal: the command gets a pty of its
//! own (opened on the host's devpts, since there is no private one without
//! namespaces) and moat relays between it and the host terminal through the
//! same terminal filter as the namespaces backend. So the command holds no
//! fd of the user's terminal (it could read what the user types for other
//! programs) and what it writes cannot act on the host through the terminal
//! (OSC 52 clipboard writes, iTerm2 file transfers, tmux passthrough).
//! `--backend landlock` is chosen explicitly (as root and as an
//! unprivileged user alike, user namespaces need not be missing for it).

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::time::Instant;

use moat_conformance::*;

/// Control strings that act on the host through a terminal, each with a
/// payload that must never reach it: OSC 52 (set the clipboard), iTerm2's
/// OSC 1337 file transfer, and OSC 52 wrapped in tmux passthrough.
const HOSTILE: &str = "\\033]52;c;Q0xJUEJPQVJE\\007\
                       \\033]1337;File=name=eA==;inline=0:RklMRUJPRFk=\\007\
                       \\033Ptmux;\\033\\033]52;c;VE1VWENMSVA=\\007\\033\\\\";
const PAYLOADS: [&str; 5] = [
    "Q0xJUEJPQVJE",
    "RklMRUJPRFk=",
    "VE1VWENMSVA=",
    "]52;",
    "]1337;",
];

/// The host path of the terminal `fd` (what `readlink /proc/self/fd/N` says).
fn fd_path(fd: i32) -> String {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .expect("readlink the host pty")
        .to_string_lossy()
        .into_owned()
}

/// The local modes of the host terminal (what raw mode changes).
fn lflag(fd: i32) -> libc::tcflag_t {
    // SAFETY: tcgetattr into a zeroed termios we own.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(fd, &mut t), 0);
        t.c_lflag
    }
}

/// What reached the host terminal so far (the master side only:
/// `Pty::pending` also drains the slave's input queue, which would take
/// what the test types before moat reads it).
fn master_out(pty: &Pty) -> Vec<u8> {
    let mut out = Vec::new();
    // SAFETY: fcntl and non-blocking reads on the master fd the Pty owns,
    // into a local buffer.
    unsafe {
        let fl = libc::fcntl(pty.master, libc::F_GETFL);
        libc::fcntl(pty.master, libc::F_SETFL, fl | libc::O_NONBLOCK);
        let mut b = [0u8; 4096];
        loop {
            let n = libc::read(pty.master, b.as_mut_ptr().cast(), b.len());
            if n <= 0 {
                break;
            }
            out.extend_from_slice(&b[..n as usize]);
        }
    }
    out
}

/// The pty's slave opened anew: a file description of moat's own, so an
/// O_NONBLOCK set on the test's slave fd (`Pty::pending` sets one) cannot
/// make moat's writes to its terminal fail with EAGAIN.
fn fresh_slave(pty: &Pty) -> OwnedFd {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(fd_path(pty.slave))
        .expect("open the pty's slave")
        .into()
}

/// `cmd` in a new session whose controlling terminal is the pty, with the
/// slave on stdin, stdout and stderr (an interactive shell's command).
fn attach_fresh(cmd: &mut std::process::Command, pty: &Pty) {
    let slave = fresh_slave(pty);
    let s = slave.as_raw_fd();
    cmd.stdin(fresh_slave(pty))
        .stdout(fresh_slave(pty))
        .stderr(fresh_slave(pty));
    // SAFETY: setsid/ioctl are async-signal-safe; `s` stays open (moved
    // into the closure) until the child has exec'd.
    unsafe {
        cmd.pre_exec(move || {
            let _keep = &slave;
            libc::setsid();
            if libc::ioctl(s, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Runs `moat ARGS` on the pty (controlling terminal, stdin, stdout and
/// stderr, as in an interactive shell) and returns its exit code and
/// everything that reached the host terminal (the master side).
fn run_on_pty(fx: &Fixture, pty: &Pty, args: &[&str], done: &str) -> (Option<i32>, String) {
    let mut c = fx.moat(args);
    attach_fresh(&mut c, pty);
    let mut child = c.spawn().expect("spawn moat");
    let start = Instant::now();
    let mut seen = String::new();
    let status = loop {
        seen.push_str(&String::from_utf8_lossy(&master_out(pty)));
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > SAFETY_TIMEOUT {
            let _ = child.kill();
            panic!("moat did not finish:\n{seen}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // The pty's line discipline passes what moat wrote last on
    // asynchronously: read until it arrives (hang guard only).
    let exited = Instant::now();
    while !seen.contains(done) && exited.elapsed() < std::time::Duration::from_secs(10) {
        seen.push_str(&String::from_utf8_lossy(&master_out(pty)));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(seen.contains(done), "no {done:?} from the command:\n{seen}");
    (status.code(), seen)
}

fn line(seen: &str, key: &str) -> String {
    seen.lines()
        .find_map(|l| l.trim().strip_prefix(key).map(str::to_owned))
        .unwrap_or_else(|| panic!("no {key}\n{seen}"))
}

#[test]
fn landlock_command_does_not_hold_the_host_terminal() {
    let fx = Fixture::new();
    for level in SANDBOXED {
        let pty = Pty::open();
        let host = fd_path(pty.slave);
        let before = lflag(pty.slave);
        let script =
            "echo \"FD0=$(readlink /proc/$$/fd/0)\"; echo \"FD1=$(readlink /proc/$$/fd/1)\"; \
                      echo \"FD2=$(readlink /proc/$$/fd/2)\"; echo \"TTY=$(tty)\"; echo TTY_DONE";
        let (code, seen) = run_on_pty(
            &fx,
            &pty,
            &[
                "exec",
                "--backend",
                "landlock",
                "--policy",
                level,
                "--",
                BASH,
                "-c",
                script,
            ],
            "TTY_DONE",
        );
        assert_eq!(code, Some(0), "{level}: {seen}");
        for key in ["FD0=", "FD1=", "FD2=", "TTY="] {
            let got = line(&seen, key);
            // A terminal still (a pts), but not the user's.
            assert!(got.starts_with("/dev/pts/"), "{level} {key}{got}\n{seen}");
            assert_ne!(
                got, host,
                "LEAK: {level}: the command holds the host terminal as {key}\n{seen}"
            );
        }
        assert_eq!(lflag(pty.slave), before, "{level}: terminal not restored");
    }
}

#[test]
fn landlock_terminal_output_cannot_act_on_the_host() {
    let fx = Fixture::new();
    for level in SANDBOXED {
        let pty = Pty::open();
        let script = format!("printf 'VISIBLE_START\\033]0;a title\\007{HOSTILE}VISIBLE_END\\n'");
        let (code, seen) = run_on_pty(
            &fx,
            &pty,
            &[
                "exec",
                "--backend",
                "landlock",
                "--policy",
                level,
                "--",
                BASH,
                "-c",
                &script,
            ],
            "VISIBLE_END",
        );
        assert_eq!(code, Some(0), "{level}: {seen:?}");
        assert!(seen.contains("VISIBLE_START"), "{level}: {seen:?}");
        assert!(
            seen.contains("\x1b]0;a title"),
            "{level}: the title was dropped: {seen:?}"
        );
        for bad in PAYLOADS {
            assert!(
                !seen.contains(bad),
                "LEAK: {level}: {bad} reached the host terminal: {seen:?}"
            );
        }
    }
}

/// With stdin not a terminal and only stdout on one (`moat … < file` in an
/// interactive shell), what the command writes is filtered all the same.
#[test]
fn landlock_output_to_a_host_terminal_is_filtered_without_one_on_stdin() {
    let fx = Fixture::new();
    let pty = Pty::open();
    let script = format!("printf 'VISIBLE_START{HOSTILE}VISIBLE_END\\n'");
    let mut c = fx.sh("workspace-write", &["--backend", "landlock"], &script);
    c.stdout(fresh_slave(&pty)).stderr(fresh_slave(&pty));
    let status = c.status().expect("run moat");
    let shown = String::from_utf8_lossy(&master_out(&pty)).into_owned();
    assert!(status.success(), "{status:?}\n{shown:?}");
    assert!(
        shown.contains("VISIBLE_START") && shown.contains("VISIBLE_END"),
        "the output did not arrive: {shown:?}"
    );
    for bad in PAYLOADS {
        assert!(
            !shown.contains(bad),
            "LEAK: {bad} reached the host terminal: {shown:?}"
        );
    }
}

/// What the command writes to its terminal on stdin counts against
/// `--output-limit` (it used to be refused on this backend, since the host
/// terminal on stdin was open for writing, uncounted).
#[test]
fn landlock_output_limit_counts_what_is_written_to_the_terminal() {
    let fx = Fixture::new();
    let pty = Pty::open();
    let (code, seen) = run_on_pty(
        &fx,
        &pty,
        &[
            "exec",
            "--backend",
            "landlock",
            "--policy",
            "workspace-write",
            "--output-limit",
            "64K",
            "--json",
            "--timeout",
            "60s",
            "--",
            BASH,
            "-c",
            "exec 3>&0; echo STARTED >&3; yes FLOOD | head -c 1048576 >&3",
        ],
        "termination_reason",
    );
    assert!(
        seen.contains("\"termination_reason\": \"output\""),
        "{seen}"
    );
    assert_ne!(code, Some(125), "{seen}");
    // Far less than the hang guard would let `yes` write: it was stopped.
    let floods = seen.matches("FLOOD").count();
    assert!(floods < 64 * 1024 / 6 + 10, "{floods} lines arrived");
}

/// Programs that prompt (ssh, sudo, git's credential helpers) open
/// `/dev/tty`: with a pty of its own that is the command's pty, and what is
/// written there reaches the user through the relay, filtered.
#[test]
fn landlock_dev_tty_is_the_commands_own_filtered_terminal() {
    let fx = Fixture::new();
    let pty = Pty::open();
    let script = format!("printf 'PROMPT{HOSTILE}\\n' > /dev/tty && echo TTY_WRITE_OK");
    let (code, seen) = run_on_pty(
        &fx,
        &pty,
        &[
            "exec",
            "--backend",
            "landlock",
            "--policy",
            "workspace-write",
            "--",
            BASH,
            "-c",
            &script,
        ],
        "TTY_WRITE_OK",
    );
    assert_eq!(code, Some(0), "{seen:?}");
    assert!(seen.contains("PROMPT"), "{seen:?}");
    for bad in PAYLOADS {
        assert!(!seen.contains(bad), "LEAK: {bad} via /dev/tty: {seen:?}");
    }
}

/// moat started from an interactive shell with none of its stdio on the
/// terminal (`moat … </dev/null >log 2>&1`) still has that terminal as its
/// controlling terminal; the command gets no pty then, and `/dev/tty`
/// (which would name the user's terminal) stays refused.
#[test]
fn landlock_host_controlling_terminal_is_not_reachable_through_dev_tty() {
    let fx = Fixture::new();
    let pty = Pty::open();
    let s = pty.slave;
    let mut c = fx.sh(
        "workspace-write",
        &["--backend", "landlock"],
        "echo PROBE-RAN; echo HOSTTTY_SECRET_WRITE > /dev/tty && echo OPENED; \
         trap '' TTIN; read -t 1 line < /dev/tty && echo \"READ=$line\"; true",
    );
    // SAFETY: setsid/ioctl are async-signal-safe; `s` is open in the child.
    unsafe {
        c.pre_exec(move || {
            libc::setsid();
            if libc::ioctl(s, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Typed by the user for other programs: must not be read by the command.
    // SAFETY: writing a local buffer to the master we own.
    let typed = b"TYPED_BY_USER\n";
    unsafe { libc::write(pty.master, typed.as_ptr().cast(), typed.len()) };
    let out = run(c);
    out.expect_code(0).expect_stdout_has("PROBE-RAN");
    out.expect_absent("OPENED", "a write to /dev/tty");
    out.expect_absent("TYPED_BY_USER", "the user's typing");
    // Refused by Landlock (not absent: moat's session has that terminal).
    assert!(
        out.stderr.contains("/dev/tty: Permission denied"),
        "{}",
        out.dump()
    );
    let shown = String::from_utf8_lossy(&master_out(&pty)).into_owned();
    assert!(
        !shown.contains("HOSTTTY_SECRET_WRITE"),
        "LEAK: the command wrote to the host terminal: {shown:?}"
    );
}

/// ^C typed at the user's terminal reaches the command through its own pty
/// (the host terminal is raw; the pty's line discipline signals the
/// command's foreground group), and the run ends as interrupted.
#[test]
fn landlock_ctrl_c_reaches_the_command_through_its_terminal_contract() {
    let fx = Fixture::new();
    let pty = Pty::open();
    let mut c = fx.moat([
        "exec",
        "--backend",
        "landlock",
        "--policy",
        "workspace-write",
        "--timeout",
        "60s",
        "--",
        BASH,
        "-c",
        "trap 'echo GOT_INT; exit 7' INT; echo READY; while :; do sleep 0.05; done",
    ]);
    attach_fresh(&mut c, &pty);
    let mut child = c.spawn().expect("spawn moat");
    let start = Instant::now();
    let mut seen = String::new();
    while !seen.contains("READY") {
        seen.push_str(&String::from_utf8_lossy(&master_out(&pty)));
        if start.elapsed() > SAFETY_TIMEOUT {
            let _ = child.kill();
            panic!("no READY:\n{seen}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The user types ^C.
    // SAFETY: writing one byte from a local buffer to the master we own.
    let n = unsafe { libc::write(pty.master, [3u8].as_ptr().cast(), 1) };
    assert_eq!(n, 1);
    let status = loop {
        seen.push_str(&String::from_utf8_lossy(&master_out(&pty)));
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > SAFETY_TIMEOUT {
            let _ = child.kill();
            panic!("^C did not end the run:\n{seen}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    seen.push_str(&String::from_utf8_lossy(&master_out(&pty)));
    assert_eq!(status.code(), Some(7), "{seen}");
    assert!(seen.contains("GOT_INT"), "{seen}");
}
