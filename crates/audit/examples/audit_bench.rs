//! Audit benchmarks. `audit_bench verify PATH`: verify a log and print lines/s.
//! `audit_bench append PATH N`: time N appends of one run's three events to PATH
//! and print the median and p90 per append. `audit_bench denials N`: time
//! `parse_denials` N times on each hostile 1 MiB stderr shape and print the
//! slowest shape's median (a quadratic scan would show up here, not in a test).

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use moat_audit::{event, parse_denials, AuditLog, RunContext, MAX_DENIALS};
use serde_json::{json, Map, Value};

fn fields(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn verify(path: &Path) -> Result<(), String> {
    let start = Instant::now();
    let report = moat_audit::verify(path).map_err(|e| e.to_string())?;
    let secs = start.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    println!(
        "verify: {} lines ({:.1} MB), {} executions in {:.1} ms = {:.0} lines/s",
        report.lines,
        bytes as f64 / 1e6,
        report.executions,
        secs * 1e3,
        report.lines as f64 / secs
    );
    Ok(())
}

fn append(path: &Path, n: usize) -> Result<(), String> {
    let log = AuditLog::open(path).map_err(|e| e.to_string())?;
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let ctx = RunContext {
            execution_id: format!("exec_{i:032x}"),
            session_id: "sess_bench".into(),
            policy_hash: "sha256:5d1e0f8c2b7a4e39a1c0d6f2e8b3a7c94f0e1d2c3b4a59687766554433221100"
                .into(),
            policy_epoch: "1".into(),
            moat_version: "0.1.0".into(),
        };
        let events = [
            event(
                &ctx,
                "policy.resolved",
                fields(
                    json!({"policy_id": "workspace-write", "sandbox_level": "workspace-write", "network": {"mode": "disabled", "routes": []}}),
                ),
            ),
            event(
                &ctx,
                "execution.started",
                fields(json!({"argv": ["cargo", "test"], "cwd": "/home/dev/app", "pid": 4242})),
            ),
            event(
                &ctx,
                "execution.finished",
                fields(
                    json!({"exit_code": 0, "signal": null, "status": "finished", "duration_ms": 12, "timed_out": false}),
                ),
            ),
        ];
        let start = Instant::now();
        log.append(&events).map_err(|e| e.to_string())?;
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| times[((times.len() - 1) as f64 * p) as usize];
    println!(
        "append (3 events, one locked write): median {:.1} us, p90 {:.1} us, max {:.1} us over {n}",
        pct(0.5),
        pct(0.9),
        pct(1.0)
    );
    Ok(())
}

/// Stderr shapes a command could print to make the denial scan slow, each
/// 1 MiB: the old test's quoted-word run on one line (the shape that once
/// made a backtracking scan quadratic), one line of a matching phrase
/// repeated, many denial lines, and one long line with no match.
fn hostile_inputs() -> Vec<(&'static str, String)> {
    const MIB: usize = 1 << 20;
    let fill = |unit: &str, tail: &str| {
        let mut s = unit.repeat((MIB - tail.len()) / unit.len());
        s.push_str(tail);
        s
    };
    vec![
        ("quoted words, one line", fill(" 'x", " Permission denied")),
        ("phrase repeated, one line", fill("Permission denied ", "")),
        ("denial lines", fill("cat: /f: Permission denied\n", "")),
        ("no match, one line", fill("abcdefgh", "")),
    ]
}

fn denials(n: usize) -> Result<(), String> {
    let mut worst = (0.0f64, "");
    for (shape, text) in hostile_inputs() {
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            let found = parse_denials(std::hint::black_box(&text));
            times.push(start.elapsed().as_secs_f64() * 1e3);
            if found.len() > MAX_DENIALS {
                return Err(format!("{shape}: {} denials > {MAX_DENIALS}", found.len()));
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        eprintln!(
            "parse_denials, {shape} ({} bytes): median {median:.2} ms, max {:.2} ms over {n}",
            text.len(),
            times[times.len() - 1]
        );
        if median > worst.0 {
            worst = (median, shape);
        }
    }
    println!(
        "denials: slowest shape median {:.3} ms ({})",
        worst.0, worst.1
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let result = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("verify"), Some(p)) => verify(Path::new(p)),
        (Some("append"), Some(p)) => match args.get(3).map_or(Ok(1000), |n| n.parse()) {
            Ok(n) if n > 0 => append(Path::new(p), n),
            _ => Err("N must be a positive number".into()),
        },
        (Some("denials"), n) => match n.map_or(Ok(20), |n| n.parse()) {
            Ok(n) if n > 0 => denials(n),
            _ => Err("N must be a positive number".into()),
        },
        _ => Err(
            "usage: audit_bench verify PATH | audit_bench append PATH [N] | audit_bench denials [N]"
                .into(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}
