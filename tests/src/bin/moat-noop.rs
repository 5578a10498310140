//! `moat-noop`: a stand-in for `moat` that confines nothing. It parses
//! `moat exec [flags] -- PROGRAM ARGS...` and runs PROGRAM directly, honouring
//! moat's exit-code contract (the command's code, 128+N for signal N, 124 on
//! `--timeout` after killing the whole process group, 126 not executable,
//! 127 not found), `--cwd` and `--env`. Every other subcommand prints an
//! error and exits 2 (a usage error, never moat's refusal code 125).
//!
//! CI runs the conformance suite against it (`scripts/test-all`, phase
//! "no-op"): every security case must fail here; only cases named
//! `*_positive_control` or `*_contract` may pass.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// Flags of `moat exec` that take a value (the rest are switches).
const VALUE_FLAGS: [&str; 12] = [
    "--policy",
    "--network",
    "--cwd",
    "--ro",
    "--rw",
    "--env",
    "--pass-env",
    "--timeout",
    "--allow-domain",
    "--deny-domain",
    "--upstream-proxy",
    "--audit-log",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("exec") => exec(&args[1..]),
        Some(other) => {
            eprintln!("moat-noop: subcommand {other:?} is not implemented by the no-op stand-in");
            ExitCode::from(2)
        }
        None => {
            eprintln!("moat-noop: usage: moat-noop exec [flags] -- PROGRAM ARGS...");
            ExitCode::from(2)
        }
    }
}

/// Parse a moat duration: 500ms, 2s, 1m, or plain seconds.
fn parse_duration(s: &str) -> Option<Duration> {
    if let Some(n) = s.strip_suffix("ms") {
        return n.parse().ok().map(Duration::from_millis);
    }
    if let Some(n) = s.strip_suffix('s') {
        return n.parse().ok().map(Duration::from_secs_f64);
    }
    if let Some(n) = s.strip_suffix('m') {
        return n
            .parse::<f64>()
            .ok()
            .map(|m| Duration::from_secs_f64(m * 60.0));
    }
    s.parse().ok().map(Duration::from_secs_f64)
}

fn exec(args: &[String]) -> ExitCode {
    let mut cwd = None;
    let mut envs = Vec::new();
    let mut timeout = None;
    let mut i = 0;
    while i < args.len() && args[i] != "--" {
        let a = &args[i];
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let value = if VALUE_FLAGS.contains(&flag.as_str()) {
            match inline {
                Some(v) => Some(v),
                None => {
                    i += 1;
                    args.get(i).cloned()
                }
            }
        } else {
            None
        };
        match (flag.as_str(), value) {
            ("--cwd", Some(v)) => cwd = Some(v),
            ("--env", Some(v)) => {
                if let Some((k, val)) = v.split_once('=') {
                    envs.push((k.to_string(), val.to_string()));
                }
            }
            ("--timeout", Some(v)) => match parse_duration(&v) {
                Some(d) => timeout = Some(d),
                None => {
                    eprintln!("moat-noop: bad --timeout {v:?}");
                    return ExitCode::from(125);
                }
            },
            _ => {}
        }
        i += 1;
    }
    let Some(program) = args.get(i + 1) else {
        eprintln!("moat-noop: no PROGRAM after --");
        return ExitCode::from(2);
    };
    let mut cmd = Command::new(program);
    cmd.args(&args[i + 2..]).envs(envs).process_group(0);
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("moat-noop: command not found: {program}: {e}");
            return ExitCode::from(127);
        }
        Err(e) => {
            eprintln!("moat-noop: command not executable: {program}: {e}");
            return ExitCode::from(126);
        }
    };
    let pgid = child.id() as i32;
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => {
                eprintln!("moat-noop: wait: {e}");
                return ExitCode::from(125);
            }
        }
        if timeout.is_some_and(|t| start.elapsed() >= t) {
            kill_group(pgid);
            let _ = child.wait();
            eprintln!("moat-noop: timed out; process group {pgid} killed");
            return ExitCode::from(124);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(s)) => ExitCode::from((128 + s) as u8),
        _ => ExitCode::from(125),
    }
}

fn kill_group(pgid: i32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status();
}
