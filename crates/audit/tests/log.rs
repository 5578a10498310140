//! The audit log on real files: chain verification against edits,
//! deletions, reordering and truncation; 50 concurrent appending processes;
//! secrets absent from the file's bytes; the time format.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use moat_audit::{
    event, lines_from, read_events, redact_arg, redact_argv, tail_lines, verify, AuditError,
    AuditLog, RunContext, VerifyError, GENESIS,
};
use serde_json::{json, Map, Value};

fn ctx(id: &str) -> RunContext {
    RunContext {
        execution_id: id.into(),
        session_id: "sess_test".into(),
        policy_hash: "sha256:abc".into(),
        policy_epoch: "1".into(),
        moat_version: "0.1.0".into(),
    }
}

fn fields(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

/// A run's three events.
fn run_events(id: &str, argv: &[&str]) -> Vec<Value> {
    let c = ctx(id);
    vec![
        event(
            &c,
            "policy.resolved",
            fields(json!({"sandbox_level": "workspace-write", "network": {"mode": "disabled"}})),
        ),
        event(
            &c,
            "execution.started",
            fields(json!({"argv": argv, "cwd": "/w", "pid": 42})),
        ),
        event(
            &c,
            "execution.finished",
            fields(
                json!({"exit_code": 0, "signal": null, "status": "finished", "duration_ms": 3, "timed_out": false}),
            ),
        ),
    ]
}

/// A log with 3 batches (9 lines), verified intact.
fn three_batches(dir: &Path) -> PathBuf {
    let path = dir.join("state/moat/audit.jsonl");
    let log = AuditLog::open(&path).unwrap();
    for i in 0..3 {
        log.append(&run_events(&format!("exec_{i}"), &["echo", "hello"]))
            .unwrap();
    }
    assert_eq!(
        verify(&path).unwrap(),
        moat_audit::VerifyReport {
            lines: 9,
            executions: 3
        }
    );
    path
}

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut s = lines.join("\n");
    s.push('\n');
    std::fs::write(path, s).unwrap();
}

fn broken(path: &Path) -> (u64, String) {
    match verify(path) {
        Err(VerifyError::Broken { line, reason }) => (line, reason),
        other => panic!("expected a broken chain, got {other:?}"),
    }
}

#[test]
fn chain_fields_and_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = three_batches(dir.path());
    let events = read_events(&path).unwrap();
    assert_eq!(events.len(), 9);
    assert_eq!(events[0]["prev"], GENESIS);
    for (i, ev) in events.iter().enumerate() {
        assert_eq!(ev["seq"], i as u64 + 1);
        for key in [
            "type",
            "time",
            "execution_id",
            "session_id",
            "policy_hash",
            "policy_epoch",
            "moat_version",
        ] {
            assert!(ev.get(key).is_some(), "{key} missing in {ev}");
        }
    }
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    // Reopening continues the chain.
    AuditLog::open(&path)
        .unwrap()
        .append(&run_events("exec_again", &["true"]))
        .unwrap();
    assert_eq!(verify(&path).unwrap().lines, 12);
    assert!(AuditLog::open(&path).unwrap().append(&[]).is_ok());
    assert!(matches!(
        AuditLog::open(&path).unwrap().append(&[json!(1)]),
        Err(AuditError::NotAnObject)
    ));
    assert_eq!(verify(&path).unwrap().lines, 12);
}

/// An edit inside line 2 that keeps it valid JSON is reported at line 3,
/// whose `prev` no longer matches.
#[test]
fn edited_byte_is_reported_at_the_next_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_batches(dir.path());
    let mut lines = lines_of(&path);
    assert!(lines[1].contains("hello"));
    lines[1] = lines[1].replacen("hello", "hellO", 1);
    write_lines(&path, &lines);
    let (line, reason) = broken(&path);
    assert_eq!(line, 3, "{reason}");
    assert!(reason.contains("line 2 was edited"), "{reason}");
}

/// An edit that breaks the JSON, or changes seq, is reported at the line itself.
#[test]
fn edit_breaking_json_or_seq_is_reported_at_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_batches(dir.path());
    let orig = lines_of(&path);
    let mut lines = orig.clone();
    lines[1].insert(0, 'x');
    write_lines(&path, &lines);
    assert_eq!(broken(&path).0, 2);

    let mut lines = orig.clone();
    lines[1] = lines[1].replacen("\"seq\":2", "\"seq\":7", 1);
    write_lines(&path, &lines);
    assert_eq!(broken(&path).0, 2);

    let mut lines = orig;
    lines[0] =
        lines[0]
            .replacen("echo", "ECHO", 1)
            .replacen("workspace-write", "danger-full-access", 1);
    write_lines(&path, &lines);
    assert_eq!(broken(&path).0, 2);
}

#[test]
fn deleted_line_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_batches(dir.path());
    let mut lines = lines_of(&path);
    lines.remove(4);
    write_lines(&path, &lines);
    let (line, reason) = broken(&path);
    assert_eq!(line, 5, "{reason}");
    assert!(reason.contains("missing"), "{reason}");

    // Removing the first line: the new first line has seq 2.
    let path = three_batches(&dir.path().join("b"));
    let mut lines = lines_of(&path);
    lines.remove(0);
    write_lines(&path, &lines);
    assert_eq!(broken(&path).0, 1);
}

#[test]
fn swapped_lines_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_batches(dir.path());
    let mut lines = lines_of(&path);
    lines.swap(3, 6);
    write_lines(&path, &lines);
    let (line, reason) = broken(&path);
    assert_eq!(line, 4, "{reason}");
}

#[test]
fn truncated_last_line_is_detected_and_not_extended() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_batches(dir.path());
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 20]).unwrap();
    let (line, reason) = broken(&path);
    assert_eq!(line, 9, "{reason}");
    assert!(reason.contains("truncated"), "{reason}");

    // An append refuses to extend a log whose last line is incomplete.
    let err = AuditLog::open(&path)
        .unwrap()
        .append(&run_events("exec_x", &["true"]))
        .unwrap_err();
    assert!(matches!(err, AuditError::Corrupt { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), &bytes[..bytes.len() - 20]);

    // Only the final newline cut: still reported.
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    assert_eq!(broken(&path).0, 9);
}

/// A log kept open continues its chain from memory only while the file is
/// as its own last append left it: another appender (another process or
/// open file, here a second `AuditLog`) in between, or an edit that keeps
/// the file's length, makes the next append read the tail again, so the
/// chain still verifies (with the head kept regardless, the third and
/// last appends would chain onto a line that is no longer last).
#[test]
fn a_kept_log_rereads_the_tail_after_anyone_else_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.jsonl");
    let kept = AuditLog::open(&path).unwrap();
    kept.append(&run_events("exec_a", &["true"])[..1]).unwrap();
    AuditLog::open(&path)
        .unwrap()
        .append(&run_events("exec_b", &["true"]))
        .unwrap();
    kept.append(&run_events("exec_a", &["true"])[1..]).unwrap();
    assert_eq!(
        verify(&path).unwrap(),
        moat_audit::VerifyReport {
            lines: 6,
            executions: 2
        }
    );
    // The same length, other bytes: the last line's event renamed in place
    // (its mtime and ctime move on). The next append chains onto the line
    // as it is now (the chain then breaks at the edited line, as for any
    // edit, never at the appended one).
    std::thread::sleep(Duration::from_millis(20));
    let mut lines = lines_of(&path);
    let last = lines.pop().unwrap();
    let edited = last.replacen("execution.finished", "execution.finishes", 1);
    assert_eq!(edited.len(), last.len());
    lines.push(edited);
    let bytes = lines.join("\n") + "\n";
    {
        use std::io::{Seek, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.write_all(bytes.as_bytes()).unwrap();
    }
    kept.append(&run_events("exec_c", &["true"])[..1]).unwrap();
    let all = lines_of(&path);
    let appended: Value = serde_json::from_str(&all[6]).unwrap();
    use sha2::Digest;
    assert_eq!(
        appended["prev"].as_str().unwrap(),
        format!("sha256:{:x}", sha2::Sha256::digest(all[5].as_bytes()))
    );
}

#[test]
fn long_last_line_is_found_from_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.jsonl");
    let log = AuditLog::open(&path).unwrap();
    let big = "x".repeat(100_000);
    log.append(&run_events("exec_big", &["echo", &big])[..2])
        .unwrap();
    log.append(&run_events("exec_big", &["echo", &big])[1..2])
        .unwrap();
    log.append(&run_events("exec_small", &["true"])).unwrap();
    assert_eq!(
        verify(&path).unwrap(),
        moat_audit::VerifyReport {
            lines: 6,
            executions: 2
        }
    );
}

#[test]
fn tail_and_follow_reading() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_batches(dir.path());
    let (last, end) = tail_lines(&path, 4).unwrap();
    assert_eq!(last.len(), 4);
    assert!(last[3].contains("\"seq\":9"));
    assert_eq!(end, std::fs::metadata(&path).unwrap().len());
    assert_eq!(tail_lines(&path, 100).unwrap().0.len(), 9);
    assert_eq!(tail_lines(&path, 0).unwrap().0.len(), 0);

    let (none, same) = lines_from(&path, end).unwrap();
    assert!(none.is_empty() && same == end);
    AuditLog::open(&path)
        .unwrap()
        .append(&run_events("exec_new", &["true"]))
        .unwrap();
    let (new, after) = lines_from(&path, end).unwrap();
    assert_eq!(new.len(), 3);
    assert!(new[0].contains("\"seq\":10"));
    // A partial line being written is not returned yet.
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"{\"partial")
        .unwrap();
    assert!(lines_from(&path, after).unwrap().0.is_empty());
    assert_eq!(lines_from(&path, after).unwrap().1, after);
}

const CHILD_LOG: &str = "MOAT_AUDIT_TEST_CHILD_LOG";
const CHILD_ID: &str = "MOAT_AUDIT_TEST_CHILD_ID";
const CHILD_GO: &str = "MOAT_AUDIT_TEST_CHILD_GO";
const PROCS: usize = 50;
const PER_PROC: usize = 4;

/// Not a test of its own: the body of each appending child process of
/// `fifty_processes_append_concurrently`, which runs it with `--ignored`
/// (ignored, so a normal run neither runs nor counts it as a pass).
#[test]
#[ignore = "child body of fifty_processes_append_concurrently, run by it"]
fn concurrent_child() {
    let (Ok(log), Ok(id), Ok(go)) = (
        std::env::var(CHILD_LOG),
        std::env::var(CHILD_ID),
        std::env::var(CHILD_GO),
    ) else {
        return;
    };
    let log = AuditLog::open(Path::new(&log)).unwrap();
    // Tell the parent this child is ready, then start together on its go file.
    std::fs::write(format!("{go}.ready.{id}"), b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !Path::new(&go).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = ctx(&format!("exec_child{id}"));
    for i in 0..PER_PROC {
        let ev = event(&c, "test.event", fields(json!({"child": id, "i": i})));
        log.append(&[ev]).unwrap();
    }
}

#[test]
fn fifty_processes_append_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let go = dir.path().join("go");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCS)
        .map(|k| {
            Command::new(&exe)
                .args([
                    "concurrent_child",
                    "--exact",
                    "--ignored",
                    "--test-threads=1",
                    "-q",
                ])
                .env(CHILD_LOG, &path)
                .env(CHILD_ID, k.to_string())
                .env(CHILD_GO, &go)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    // Release the children once every one is ready (an event, not a sleep;
    // the deadline is only a hang guard).
    let deadline = Instant::now() + Duration::from_secs(120);
    while (0..PROCS).any(|k| !dir.path().join(format!("go.ready.{k}")).exists()) {
        assert!(Instant::now() < deadline, "children never became ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(&go, b"").unwrap();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let report = verify(&path).unwrap();
    assert_eq!(
        report,
        moat_audit::VerifyReport {
            lines: (PROCS * PER_PROC) as u64,
            executions: PROCS as u64
        }
    );
    let events = read_events(&path).unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=(PROCS * PER_PROC) as u64).collect::<Vec<_>>());
    let mut pairs: Vec<(String, u64)> = events
        .iter()
        .map(|e| {
            (
                e["child"].as_str().unwrap().to_owned(),
                e["i"].as_u64().unwrap(),
            )
        })
        .collect();
    pairs.sort();
    pairs.dedup();
    assert_eq!(pairs.len(), PROCS * PER_PROC);
}

#[test]
fn threads_sharing_one_log_do_not_interleave() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path).unwrap();
    std::thread::scope(|s| {
        for t in 0..8 {
            let log = &log;
            s.spawn(move || {
                for i in 0..25 {
                    log.append(&run_events(&format!("exec_t{t}_{i}"), &["true"]))
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(
        verify(&path).unwrap(),
        moat_audit::VerifyReport {
            lines: 600,
            executions: 200
        }
    );
}

#[test]
fn secrets_never_reach_the_log_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let secrets = [
        "hunter2userinfo",
        "tok_query_123",
        "bearer_header_456",
        "env_value_789",
        "flag_pw_000",
        "next_pw_111",
    ];
    let argv: Vec<String> = [
        "curl",
        "https://me:hunter2userinfo@api.example.com/v1/items?access_token=tok_query_123&page=2",
        "-H",
        "Authorization: Bearer bearer_header_456",
        "SECRET_TOKEN=env_value_789",
        "--password=flag_pw_000",
        "--password",
        "next_pw_111",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = ctx("exec_secret");
    let red = redact_argv(&argv);
    let url = redact_arg("https://example.com/cb?code=tok_query_123");
    let log = AuditLog::open(&path).unwrap();
    log.append(&[event(
        &c,
        "execution.started",
        fields(json!({"argv": red, "cwd": "/w", "url": url})),
    )])
    .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    for s in secrets {
        assert!(!text.contains(s), "{s} leaked: {text}");
    }
    // What is left stays useful.
    for kept in [
        "api.example.com/v1/items",
        "page=2",
        "Authorization: ***",
        "SECRET_TOKEN=***",
        "--password=***",
        "me",
    ] {
        assert!(text.contains(kept), "{kept} missing: {text}");
    }
}

/// `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`, checked position by position.
fn matches_time_format(s: &str) -> bool {
    const TEMPLATE: &str = "dddd-dd-ddTdd:dd:dd.ddddddZ";
    s.len() == TEMPLATE.len()
        && s.bytes().zip(TEMPLATE.bytes()).all(|(c, t)| {
            if t == b'd' {
                c.is_ascii_digit()
            } else {
                c == t
            }
        })
}

#[test]
fn time_format() {
    assert!(matches_time_format("2026-11-30T08:21:26.967279Z"));
    assert!(!matches_time_format("2026-11-30T08:21:26.96727Z"));
    assert!(!matches_time_format("2026-11-30 08:21:26.967279Z"));
    let t = moat_audit::now_rfc3339();
    assert!(matches_time_format(&t), "{t}");
    let ev = event(&ctx("e"), "x", Map::new());
    assert!(matches_time_format(ev["time"].as_str().unwrap()));
}
