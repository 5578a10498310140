//! A timeout must fire while whoever reads moat's output has stopped
//! reading: the supervisor never blocks on writing the command's output.
//!
//! moat's stdout is a pipe the test keeps open and never reads while moat
//! runs; the command floods it (`yes`). moat must end the run by its
//! timeout (exit 124) on its own, and the command must be gone.
//!
//! The `--events` and `--output-limit` cases are contracts (named so): the
//! no-op stand-in passes them, since it has a timeout and no relay to block
//! on; the stderr-relay case also fails there.

use moat_conformance::*;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Generous: only a hang guard, never a timing assertion.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Run `cmd` (its stdout an unread pipe) to its exit; the pipe is read
/// only after moat has exited. Returns the exit code and what the pipe held.
fn run_with_stalled_stdout(mut cmd: Command, marker: &str) -> (Option<i32>, String) {
    let (read_end, write_end) = std::io::pipe().expect("pipe");
    cmd.stdout(Stdio::from(OwnedFd::from(write_end)))
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn moat");
    // Drop our copy of the write end (the Command holds it until spawned).
    drop(cmd);
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait moat") {
            break st;
        }
        if start.elapsed() > HANG_GUARD {
            let _ = child.kill();
            let _ = child.wait();
            kill_marker(marker);
            panic!("HUNG: moat did not end its timed-out run while its stdout reader stalled");
        }
        thread::sleep(Duration::from_millis(20));
    };
    // moat is gone; the command must be too (checked before reading, which
    // would block if an escaped command still held the pipe empty).
    let gone = wait_gone(marker, Duration::from_secs(10));
    if !gone.is_empty() {
        kill_marker(marker);
        panic!("the command outlived moat's timeout: pids {gone:?}");
    }
    let mut buf = vec![0u8; 65536];
    let mut r = read_end;
    let n = r.read(&mut buf).unwrap_or(0);
    (
        status.code(),
        String::from_utf8_lossy(&buf[..n]).into_owned(),
    )
}

fn flood(marker: &str) -> String {
    format!("echo STALL_START; exec -a {marker} yes STALL_LINE")
}

#[test]
fn timeout_fires_while_events_reader_stalls_contract() {
    let fx = Fixture::new();
    let marker = unique("stall-events");
    let _g = MarkerGuard(marker.clone());
    let cmd = fx.sh(
        "read-only",
        &["--timeout", "2s", "--events"],
        &flood(&marker),
    );
    let (code, head) = run_with_stalled_stdout(cmd, &marker);
    assert!(head.contains("STALL_START"), "the command ran: {head:.300}");
    assert_eq!(code, Some(124), "timed-out run exits 124");
}

#[test]
fn timeout_fires_while_output_limit_relay_stalls_contract() {
    let fx = Fixture::new();
    let marker = unique("stall-limit");
    let _g = MarkerGuard(marker.clone());
    let cmd = fx.sh(
        "read-only",
        &["--timeout", "2s", "--output-limit", "1G"],
        &flood(&marker),
    );
    let (code, head) = run_with_stalled_stdout(cmd, &marker);
    assert!(head.contains("STALL_START"), "the command ran: {head:.300}");
    assert_eq!(code, Some(124), "timed-out run exits 124");
}

#[test]
fn timeout_fires_while_stderr_relay_stalls() {
    // Plain passthrough relays a non-terminal stderr through moat (to read
    // refusals back); a stalled stderr reader must not suspend the timeout.
    let fx = Fixture::new();
    let marker = unique("stall-stderr");
    let _g = MarkerGuard(marker.clone());
    let mut cmd = fx.sh(
        "read-only",
        &["--timeout", "2s"],
        &format!("echo STALL_START >&2; exec -a {marker} yes STALL_LINE >&2"),
    );
    let (read_end, write_end) = std::io::pipe().expect("pipe");
    cmd.stdout(Stdio::null())
        .stderr(Stdio::from(OwnedFd::from(write_end)));
    let mut child = cmd.spawn().expect("spawn moat");
    drop(cmd);
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait moat") {
            break st;
        }
        if start.elapsed() > HANG_GUARD {
            let _ = child.kill();
            let _ = child.wait();
            kill_marker(&marker);
            panic!("HUNG: moat did not end its timed-out run while its stderr reader stalled");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let gone = wait_gone(&marker, Duration::from_secs(10));
    if !gone.is_empty() {
        kill_marker(&marker);
        panic!("the command outlived moat's timeout: pids {gone:?}");
    }
    let mut buf = vec![0u8; 65536];
    let mut r = read_end;
    let n = r.read(&mut buf).unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.contains("STALL_START"), "the command ran: {head:.300}");
    assert_eq!(status.code(), Some(124), "timed-out run exits 124");
}
