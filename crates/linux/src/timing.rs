//! An opt-in launch timing trace: with `MOAT_TRACE_TIMING=1` in moat's
//! environment, each [`mark`] prints one line to stderr —
//! `moat-timing: PID STEP +DELTA_US (TOTAL_US)` — the time since the previous
//! mark of the same process line (a forked child carries its parent's last
//! mark over) and since the first mark. Off, a mark is one relaxed atomic
//! load. Nothing here allocates, so marks are safe in a child forked from a
//! threaded process (the init, the command before exec).
//!
//! The variable is read once, by [`init`] at the top of `main`; marks before
//! it (none) or without it print nothing.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);
/// CLOCK_MONOTONIC nanoseconds of the first mark and of the last one.
static FIRST_NS: AtomicU64 = AtomicU64::new(0);
static LAST_NS: AtomicU64 = AtomicU64::new(0);

/// Reads `MOAT_TRACE_TIMING` once and, when it is set to `1`, takes the
/// first mark (`start`).
pub fn init() {
    if std::env::var_os("MOAT_TRACE_TIMING").is_some_and(|v| v == "1") {
        let now = now_ns();
        FIRST_NS.store(now, Ordering::Relaxed);
        LAST_NS.store(now, Ordering::Relaxed);
        ON.store(true, Ordering::Relaxed);
        mark("start");
    }
}

/// Whether the trace is on.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Records that `step` just finished (see the module docs).
#[inline]
pub fn mark(step: &str) {
    if ON.load(Ordering::Relaxed) {
        emit(step);
    }
}

#[cold]
fn emit(step: &str) {
    let now = now_ns();
    let last = LAST_NS.swap(now, Ordering::Relaxed);
    let first = FIRST_NS.load(Ordering::Relaxed);
    let mut buf = [0u8; 160];
    let mut cur = std::io::Cursor::new(&mut buf[..]);
    let _ = writeln!(
        cur,
        "moat-timing: {} {step} +{} ({})",
        std::process::id(),
        now.saturating_sub(last) / 1000,
        now.saturating_sub(first) / 1000
    );
    let len = cur.position() as usize;
    // One write(2), no lock (a child forked while another thread held
    // std's stderr lock would wait forever): lines of the supervisor, the
    // init and the command do not interleave mid-line.
    let _ = nix::unistd::write(std::io::stderr(), &buf[..len]);
}

/// Monotonic nanoseconds since a fixed point shared by forked children
/// (std's `Instant` is CLOCK_MONOTONIC on Linux).
fn now_ns() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    base.elapsed().as_nanos() as u64
}
