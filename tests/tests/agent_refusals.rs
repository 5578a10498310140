//! moat for a normal agent day, refusals and terminals (issue 10 items 7
//! and 8): network refusals are explained where the agent looks (stderr,
//! the 403 body, `--json` denials), and an interactive command gets a
//! terminal of its own inside the sandbox.
//!
//! Side effects asserted: the local server saw no connection, the secret
//! bytes never arrived, the window size the host set is the one the
//! command sees.

use moat_conformance::*;

const CURL: &str = "/usr/bin/curl";

// ------------------------------------------------- item 7: network refusals

#[test]
fn proxy_refusal_is_explained_in_the_body_on_stderr_and_in_denials() {
    let fx = Fixture::new();
    let secret = unique("SERVEDSECRET");
    let server = HttpServer::fixed(&secret);
    let p = server.port;
    let other = format!("127.0.0.1:{}", p.wrapping_add(1).max(1));
    let target = format!("http://127.0.0.1:{p}/");
    let hp = format!("127.0.0.1:{p}");
    let script = format!(
        "{CURL} -sS -m 20 {target}; echo; \
         {CURL} -sS -m 20 -o /dev/null -x '' --socks5-hostname 127.0.0.1:1080 {target}; \
         echo PROBE_DONE"
    );
    let base = [
        "exec",
        "--policy",
        "workspace-write",
        "--network",
        "proxy",
        "--allow-domain",
        other.as_str(),
    ];
    // Plain: the 403 body names the reason and the flag; so does stderr.
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--", BASH, "-c", &script]);
    let out = run(fx.moat(&args));
    out.expect_stdout_has("PROBE_DONE");
    out.expect_absent(&secret, "the refused server's body");
    out.expect_stdout_has(&format!(
        "moat: blocked {hp} (not_allowed); no allow entry matches; add --allow-domain {hp}"
    ));
    let line = format!("moat: blocked {hp} (not_allowed)");
    let stderr_lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with(&line))
        .collect();
    // One line for the host, port and reason, though two clients asked.
    assert_eq!(stderr_lines.len(), 1, "{}", out.dump());
    assert!(
        stderr_lines[0].contains(&format!("--allow-domain {hp}")),
        "{}",
        out.dump()
    );
    assert_eq!(server.settled_connections(), 0, "the server was reached");

    // --json: an entry in denials, with the reason and the flag.
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--json", "--", BASH, "-c", &script]);
    let out = run(fx.moat(&args));
    let v = out.json();
    let denials = v["denials"].as_array().cloned().unwrap_or_default();
    let d = denials
        .iter()
        .find(|d| d["operation"] == "connect" && d["port"] == p)
        .unwrap_or_else(|| panic!("no network denial\n{}", out.dump()));
    assert_eq!(d["host"], "127.0.0.1");
    assert_eq!(d["reason"], "not_allowed");
    assert!(
        d["detail"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("--allow-domain {hp}")),
        "{d}"
    );

    // --quiet: nothing on moat's stderr.
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--quiet", "--", BASH, "-c", &script]);
    let out = run(fx.moat(&args));
    out.expect_stdout_has("PROBE_DONE");
    assert!(
        !out.stderr.contains("moat: blocked"),
        "--quiet printed\n{}",
        out.dump()
    );
    assert_eq!(server.settled_connections(), 0, "the server was reached");
}

#[test]
fn disabled_network_says_which_flags_give_it() {
    let fx = Fixture::new();
    let script = format!(
        "{CURL} -sS -m 20 -o /dev/null https://example.com/; \
         {PY} -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), timeout=5)'; \
         echo PROBE_DONE"
    );
    for level in SANDBOXED {
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("PROBE_DONE");
        assert!(
            out.stderr.contains("Could not resolve host"),
            "the lookup did not fail\n{}",
            out.dump()
        );
        assert!(
            out.stderr.contains(
                "moat: network is disabled; use --network proxy --allow-domain example.com"
            ),
            "{level}\n{}",
            out.dump()
        );
        let out = run(fx.sh(level, &["--json"], &script));
        let v = out.json();
        let ok = v["denials"].as_array().is_some_and(|a| {
            a.iter()
                .any(|d| d["reason"] == "network_disabled" && d["host"] == "example.com")
        });
        assert!(ok, "{level}: no network_disabled denial\n{}", out.dump());
        // The line is on stderr with --json too (the JSON is on stdout).
        assert!(
            out.stderr.contains("moat: network is disabled"),
            "{level}\n{}",
            out.dump()
        );
    }
}

// ------------------------------------------------- item 8: a terminal of its own

/// Sets the window size of the host pty (as a terminal emulator does).
fn set_window(fd: i32, rows: u16, cols: u16) {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from a struct we own.
    let r = unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws as *const libc::winsize) };
    assert_eq!(r, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
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

/// `moat ARGS` with the pty's slave as its controlling terminal, stdin,
/// stdout and stderr.
fn spawn_on_pty(fx: &Fixture, pty: &Pty, args: &[&str]) -> std::process::Child {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut c = fx.moat(args);
    pty.attach(&mut c);
    // SAFETY: dup of an fd the Pty owns; the OwnedFd takes the new one.
    let dup = || unsafe { OwnedFd::from_raw_fd(libc::dup(pty.slave)) };
    c.stdout(dup()).stderr(dup());
    c.spawn().expect("spawn moat")
}

/// Reads the master until `needle` appears (hang guard: SAFETY_TIMEOUT).
fn read_until(pty: &Pty, seen: &mut String, needle: &str, child: &mut std::process::Child) {
    let start = std::time::Instant::now();
    while !seen.contains(needle) {
        let (out, _) = pty.pending();
        seen.push_str(&String::from_utf8_lossy(&out));
        if seen.contains(needle) {
            break;
        }
        if start.elapsed() > SAFETY_TIMEOUT {
            let _ = child.kill();
            panic!("no {needle:?} from the command:\n{seen}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn interactive_command_gets_a_terminal_of_its_own() {
    let fx = Fixture::new();
    for level in SANDBOXED {
        let pty = Pty::open();
        set_window(pty.master, 41, 123);
        let before = lflag(pty.slave);
        let mut child = spawn_on_pty(
            &fx,
            &pty,
            &[
                "exec",
                "--policy",
                level,
                "--",
                BASH,
                "-c",
                "echo \"TTY=$(tty)\"; echo \"SIZE=$(stty size)\"; \
                 echo \"DEV=$(stat -L -c %d /proc/self/fd/0)\"; \
                 /usr/bin/python3 -c 'import fcntl,termios,errno\ntry:\n fcntl.ioctl(0, termios.TIOCSTI, b\"x\"); print(\"STI=done\")\nexcept OSError as e: print(\"STI=\"+errno.errorcode[e.errno])'; \
                 echo PTY_DONE",
            ],
        );
        let mut seen = String::new();
        read_until(&pty, &mut seen, "PTY_DONE", &mut child);
        let status = child.wait().expect("wait");
        let (rest, _) = pty.pending();
        seen.push_str(&String::from_utf8_lossy(&rest));
        assert_eq!(status.code(), Some(0), "{level}: {seen}");
        let line = |k: &str| {
            seen.lines()
                .find_map(|l| l.trim().strip_prefix(k).map(str::to_owned))
                .unwrap_or_else(|| panic!("{level}: no {k}\n{seen}"))
        };
        // A terminal in the sandbox's own devpts (not "not a tty").
        assert!(line("TTY=").starts_with("/dev/pts/"), "{level}: {seen}");
        assert_eq!(line("SIZE="), "41 123", "{level}: {seen}");
        // Typing into its own terminal stays refused (the seccomp floor).
        assert_eq!(line("STI="), "EPERM", "{level}: {seen}");
        // The host terminal itself is not what the command holds: its
        // stdin is on another devpts instance.
        let host_dev = std::fs::metadata(format!("/proc/self/fd/{}", pty.slave))
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
            .expect("stat the host pty");
        assert_ne!(line("DEV="), host_dev.to_string(), "{level}: {seen}");
        // The host terminal's modes are back as they were.
        assert_eq!(lflag(pty.slave), before, "{level}: terminal not restored");
    }
}

#[test]
fn terminal_resizes_reach_the_command_contract() {
    let fx = Fixture::new();
    let pty = Pty::open();
    set_window(pty.master, 20, 70);
    let before = lflag(pty.slave);
    let mut child = spawn_on_pty(
        &fx,
        &pty,
        &[
            "exec",
            "--policy",
            "workspace-write",
            "--timeout",
            "60s",
            "--",
            BASH,
            "-c",
            "trap 'echo \"NEWSIZE=$(stty size)\"; exit 0' WINCH; echo \"START=$(stty size)\"; \
             echo READY; while :; do sleep 0.05; done",
        ],
    );
    let mut seen = String::new();
    read_until(&pty, &mut seen, "READY", &mut child);
    assert!(seen.contains("START=20 70"), "{seen}");
    // The terminal emulator resizes: the kernel signals moat's group.
    set_window(pty.master, 50, 160);
    read_until(&pty, &mut seen, "NEWSIZE=", &mut child);
    let status = child.wait().expect("wait");
    let (rest, _) = pty.pending();
    seen.push_str(&String::from_utf8_lossy(&rest));
    assert!(seen.contains("NEWSIZE=50 160"), "{seen}");
    assert_eq!(status.code(), Some(0), "{seen}");
    assert_eq!(lflag(pty.slave), before, "terminal not restored");
}
