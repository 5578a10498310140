//! Writes a realistic audit log for benchmarks: `audit_gen PATH LINES` appends
//! runs of three events (policy.resolved, execution.started,
//! execution.finished) through `AuditLog::append`, 3000 events per append.

use std::path::PathBuf;
use std::process::ExitCode;

use moat_audit::{event, AuditLog, RunContext};
use serde_json::{json, Map, Value};

fn fields(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The three events of run number `n`.
fn run_events(n: u64) -> Vec<Value> {
    let ctx = RunContext {
        execution_id: format!("exec_{n:032x}"),
        session_id: format!("sess_{:032x}", n / 10),
        policy_hash: "sha256:5d1e0f8c2b7a4e39a1c0d6f2e8b3a7c94f0e1d2c3b4a59687766554433221100"
            .into(),
        policy_epoch: "1".into(),
        moat_version: "0.1.0".into(),
    };
    let policy = json!({
        "policy_version": "1", "level": "workspace-write", "network": {"mode": "disabled", "routes": []},
        "workspace": "/home/dev/projects/app", "home": "/home/dev",
        "paths": [{"path": "/home/dev/.cache/pip", "access": "rw"}, {"path": "/opt/sdk", "access": "ro"}],
        "env_names": ["CI", "RUST_LOG"], "pass_env": [], "timeout_ms": 600000,
    });
    vec![
        event(
            &ctx,
            "policy.resolved",
            fields(json!({
                "policy_id": "workspace-write", "sandbox_level": "workspace-write",
                "network": {"mode": "disabled", "routes": []}, "policy": policy,
            })),
        ),
        event(
            &ctx,
            "execution.started",
            fields(json!({
                "argv": ["cargo", "test", "--workspace", "--", "--nocapture"], "cwd": "/home/dev/projects/app", "pid": 4242 + n,
            })),
        ),
        event(
            &ctx,
            "execution.finished",
            fields(json!({
                "exit_code": 0, "signal": null, "status": "finished", "duration_ms": 1234, "timed_out": false,
            })),
        ),
    ]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(Ok(lines))) = (args.get(1), args.get(2).map(|n| n.parse::<u64>())) else {
        eprintln!("usage: audit_gen PATH LINES");
        return ExitCode::from(2);
    };
    let log = match AuditLog::open(&PathBuf::from(path)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let mut batch = Vec::with_capacity(3000);
    for i in 0..lines {
        let run = i / 3;
        let ev = run_events(run).swap_remove((i % 3) as usize);
        batch.push(ev);
        if batch.len() == 3000 || i + 1 == lines {
            if let Err(e) = log.append(&batch) {
                eprintln!("{e}");
                return ExitCode::from(1);
            }
            batch.clear();
        }
    }
    ExitCode::SUCCESS
}
