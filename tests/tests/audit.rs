//! Audit family (issue 4): the hash-chained audit log, `moat audit
//! verify/show/tail`, the live `--events` stream, redaction, concurrency,
//! the log's protection from the sandboxed command, and denial reports.
//! Assertions are on the log's bytes (parsed and raw), re-verified here
//! independently of moat's own verifier.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;
use sha2::{Digest, Sha256};

use moat_conformance::*;

const GENESIS: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
const ENVELOPE: [&str; 9] = [
    "type",
    "time",
    "execution_id",
    "session_id",
    "policy_hash",
    "policy_epoch",
    "moat_version",
    "seq",
    "prev",
];
const RUN_TYPES: [&str; 3] = ["policy.resolved", "execution.started", "execution.finished"];

fn raw_lines(log: &Path) -> Vec<String> {
    let text =
        std::fs::read_to_string(log).unwrap_or_else(|e| panic!("read {}: {e}", log.display()));
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "log does not end with a newline"
    );
    text.lines().map(String::from).collect()
}

fn events(log: &Path) -> Vec<Value> {
    raw_lines(log)
        .iter()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("line {} not JSON: {e}: {l}", i + 1))
        })
        .collect()
}

fn sha(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    let mut h = String::from("sha256:");
    for b in d {
        h.push_str(&format!("{b:02x}"));
    }
    h
}

/// Independent chain check: seq = line number, prev = sha256 of the previous
/// line's bytes (genesis for the first).
fn check_chain(log: &Path) {
    let lines = raw_lines(log);
    let mut prev = GENESIS.to_string();
    for (i, l) in lines.iter().enumerate() {
        let v: Value = serde_json::from_str(l).expect("json");
        assert_eq!(
            v["seq"],
            (i + 1) as u64,
            "seq of line {} is {}",
            i + 1,
            v["seq"]
        );
        assert_eq!(
            v["prev"].as_str(),
            Some(prev.as_str()),
            "prev of line {} does not chain",
            i + 1
        );
        prev = sha(l);
    }
}

fn is_rfc3339_utc_micros(t: &str) -> bool {
    let b = t.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| r.clone().all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    b.len() == 27
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..26)
        && b[26] == b'Z'
}

fn exec_args(log: &Path, extra: &[&str], argv: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "exec".into(),
        "--audit-log".into(),
        log.to_string_lossy().into_owned(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push("--".into());
    a.extend(argv.iter().map(|s| s.to_string()));
    a
}

fn verify(fx: &Fixture, log: &Path) -> Out {
    run(fx.moat([
        "audit".as_ref(),
        "verify".as_ref(),
        "--log".as_ref(),
        log.as_os_str(),
    ]))
}

fn default_log(home: &Path) -> PathBuf {
    home.join(".local/state/moat/audit.jsonl")
}

// --------------------------------------------- 1. one run: types, envelope

#[test]
fn run_appends_expected_events_and_policy_hash_agrees_everywhere() {
    let fx = Fixture::new();
    let log = fx.root.join("audit.jsonl");
    let flags = [
        "--policy",
        "workspace-write",
        "--network",
        "proxy",
        "--allow-domain",
        "127.0.0.1:9",
        "--env",
        "FOO=bar",
    ];
    let ex = run(fx.moat([&["explain-policy"][..], &flags[..]].concat()));
    ex.expect_code(0);
    let hash = ex.json()["policy_hash"]
        .as_str()
        .expect("explain-policy policy_hash")
        .to_string();
    assert!(hash.starts_with("sha256:") && hash.len() == 71, "{hash}");
    let ver = run(fx.moat(["version", "--json"])).json()["version"]
        .as_str()
        .expect("version")
        .to_string();

    // Plain run.
    let out = run(fx.moat(exec_args(&log, &flags, &["/bin/true"])));
    out.expect_code(0);
    let ev = events(&log);
    let types: Vec<&str> = ev
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(types, RUN_TYPES, "event types of one run");
    let id = ev[0]["execution_id"]
        .as_str()
        .expect("execution_id")
        .to_string();
    assert!(id.starts_with("exec_"), "{id}");
    for (i, e) in ev.iter().enumerate() {
        for k in ENVELOPE {
            assert!(
                e.get(k).is_some_and(|v| !v.is_null()),
                "line {} lacks {k}: {e}",
                i + 1
            );
        }
        assert!(
            is_rfc3339_utc_micros(e["time"].as_str().unwrap_or("")),
            "time format: {}",
            e["time"]
        );
        assert_eq!(e["execution_id"], id.as_str());
        assert_eq!(e["session_id"], ev[0]["session_id"]);
        assert_eq!(
            e["policy_hash"],
            hash.as_str(),
            "log policy_hash vs explain-policy"
        );
        assert_eq!(e["moat_version"], ver.as_str());
    }
    check_chain(&log);
    let (pr, st, fin) = (&ev[0], &ev[1], &ev[2]);
    assert_eq!(pr["sandbox_level"], "workspace-write", "{pr}");
    assert_eq!(pr["network"]["mode"], "proxy", "{pr}");
    assert!(
        pr.get("policy").is_some_and(Value::is_object),
        "policy.resolved lacks the canonical policy: {pr}"
    );
    assert!(pr.get("policy_id").is_some(), "{pr}");
    assert_eq!(st["argv"], serde_json::json!(["/bin/true"]));
    assert_eq!(st["cwd"], fx.ws.to_string_lossy().as_ref());
    assert!(st["pid"].as_u64().is_some_and(|p| p > 0), "{st}");
    assert_eq!(fin["exit_code"], 0);
    assert!(fin["signal"].is_null());
    assert_eq!(fin["status"], "finished");
    assert_eq!(fin["timed_out"], false);
    assert!(fin["duration_ms"].is_u64(), "{fin}");

    // --json: same hash, and its execution is in the log.
    let out = run(fx.moat(exec_args(
        &log,
        &[&flags[..], &["--json"][..]].concat(),
        &["/bin/true"],
    )));
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["policy_hash"], hash.as_str(), "--json policy_hash");
    let jid = j["execution_id"].as_str().expect("id").to_string();

    // --events: same hash on every event, no chain fields.
    let out = run(fx.moat(exec_args(
        &log,
        &[&flags[..], &["--events"][..]].concat(),
        &["/bin/true"],
    )));
    out.expect_code(0);
    let evs: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("event json"))
        .collect();
    assert!(!evs.is_empty());
    for e in &evs {
        assert_eq!(e["policy_hash"], hash.as_str(), "--events policy_hash: {e}");
        assert!(
            e.get("seq").is_none() && e.get("prev").is_none(),
            "chain fields in --events: {e}"
        );
    }
    let etypes: Vec<&str> = evs
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(etypes, RUN_TYPES, "--events of a silent run");
    let eid = evs[0]["execution_id"].as_str().expect("id").to_string();

    // Log: 9 lines, chain intact, moat agrees.
    let all = events(&log);
    assert_eq!(all.len(), 9);
    check_chain(&log);
    let v = verify(&fx, &log);
    v.expect_code(0);
    assert!(v.stdout.starts_with("ok: 9 lines"), "{}", v.dump());
    for xid in [&jid, &eid] {
        let mine: Vec<&Value> = all
            .iter()
            .filter(|e| e["execution_id"] == xid.as_str())
            .collect();
        assert_eq!(mine.len(), 3, "execution {xid} not logged");
        // The --events stream carries the same events as the log (minus chain fields).
        if xid == &eid {
            for (a, b) in mine.iter().zip(&evs) {
                let mut a = (*a).clone();
                a.as_object_mut().map(|o| {
                    o.remove("seq");
                    o.remove("prev")
                });
                assert_eq!(&a, b, "log event and --events event differ");
            }
        }
    }

    // audit show / tail.
    let show = run(fx.moat([
        "audit".as_ref(),
        "show".as_ref(),
        jid.as_ref(),
        "--log".as_ref(),
        log.as_os_str(),
    ]));
    show.expect_code(0);
    let arr = show.json();
    let arr = arr.as_array().expect("show prints a JSON array");
    assert_eq!(arr.len(), 3);
    assert!(arr.iter().all(|e| e["execution_id"] == jid.as_str()));
    let tail = run(fx.moat([
        "audit".as_ref(),
        "tail".as_ref(),
        "-n".as_ref(),
        "2".as_ref(),
        "--json".as_ref(),
        "--log".as_ref(),
        log.as_os_str(),
    ]));
    tail.expect_code(0);
    let lines = raw_lines(&log);
    let tl: Vec<&str> = tail.stdout.lines().collect();
    assert_eq!(
        tl,
        &lines[7..].iter().map(String::as_str).collect::<Vec<_>>()[..],
        "audit tail -n 2 --json"
    );
}

#[test]
fn log_location_session_id_no_audit_and_failed_runs() {
    let fx = Fixture::new();
    let def = default_log(&fx.home);

    // Default location: ~/.local/state/moat/audit.jsonl of HOME.
    run(fx.moat(["exec", "--", "/bin/true"])).expect_code(0);
    assert_eq!(events(&def).len(), 3, "default log");

    // XDG_STATE_HOME wins over HOME.
    let xdg = fx.root.join("xdgstate");
    std::fs::create_dir(&xdg).expect("mkdir");
    let mut c = fx.moat(["exec", "--", "/bin/true"]);
    c.env("XDG_STATE_HOME", &xdg);
    run(c).expect_code(0);
    assert_eq!(
        events(&xdg.join("moat/audit.jsonl")).len(),
        3,
        "XDG_STATE_HOME log"
    );
    assert_eq!(
        events(&def).len(),
        3,
        "default log grew although XDG_STATE_HOME was set"
    );

    // --no-audit: nothing anywhere (the command still runs).
    let marker = fx.w("noaudit-ran");
    let out = run(fx.moat([
        "exec".as_ref(),
        "--policy".as_ref(),
        "workspace-write".as_ref(),
        "--no-audit".as_ref(),
        "--".as_ref(),
        "/usr/bin/touch".as_ref(),
        marker.as_os_str(),
    ]));
    out.expect_code(0);
    assert!(exists(&marker));
    assert_eq!(events(&def).len(), 3, "--no-audit still wrote to the log");

    // MOAT_SESSION_ID groups runs; without it each invocation gets its own.
    let sid = unique("sess");
    for _ in 0..2 {
        let mut c = fx.moat(["exec", "--", "/bin/true"]);
        c.env("MOAT_SESSION_ID", &sid);
        run(c).expect_code(0);
    }
    run(fx.moat(["exec", "--", "/bin/true"])).expect_code(0);
    let ev = events(&def);
    assert_eq!(ev.len(), 12);
    for e in &ev[3..9] {
        assert_eq!(
            e["session_id"],
            sid.as_str(),
            "MOAT_SESSION_ID not used: {e}"
        );
    }
    assert_ne!(ev[9]["session_id"], sid.as_str());
    assert_ne!(
        ev[9]["session_id"], ev[0]["session_id"],
        "generated session ids repeat"
    );

    // A run that cannot start ends with execution.failed and a reason.
    let out = run(fx.moat(["exec", "--", "/nonexistent/moat-no-such-program"]));
    out.expect_code(127);
    let ev = events(&def);
    let last = ev.last().expect("events");
    assert_eq!(last["type"], "execution.failed", "{last}");
    assert!(
        last["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{last}"
    );
    assert_eq!(ev[ev.len() - 3]["type"], "policy.resolved");
    check_chain(&def);
    verify(&fx, &def).expect_code(0);
}

// ------------------------------------------------------------ 2. tampering

fn broken_line(out: &Out) -> Option<u64> {
    let all = out.all();
    let i = all.find("broken at line ")?;
    let rest = &all[i + "broken at line ".len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[test]
fn verify_detects_edit_delete_swap() {
    let fx = Fixture::new();
    let log = fx.root.join("audit.jsonl");
    for i in 0..3 {
        run(fx.moat(exec_args(
            &log,
            &[],
            &["/bin/sh", "-c", &format!("exit {i}")],
        )))
        .expect_code(i);
    }
    let lines = raw_lines(&log);
    assert_eq!(lines.len(), 9);
    // Positive control: the untouched log verifies.
    verify(&fx, &log).expect_code(0);
    let orig = std::fs::read(&log).expect("read");

    let write_copy = |name: &str, ls: &[String]| -> PathBuf {
        let p = fx.root.join(name);
        let mut s = ls.join("\n");
        s.push('\n');
        std::fs::write(&p, s).expect("write copy");
        p
    };
    let cases: Vec<(&str, PathBuf, &[u64])> = {
        // Edit one byte of line 5 (a digit in its pid), keeping valid JSON.
        let mut edited = lines.clone();
        let l = &edited[4];
        let at = l.find("\"pid\":").expect("pid in execution.started") + 6;
        let mut b = l.clone().into_bytes();
        b[at] = if b[at] == b'1' { b'2' } else { b'1' };
        edited[4] = String::from_utf8(b).expect("utf8");
        let mut deleted = lines.clone();
        deleted.remove(4);
        let mut swapped = lines.clone();
        swapped.swap(3, 4);
        // A line whose own prev field was edited.
        let mut reprev = lines.clone();
        let at = reprev[6].find("\"prev\":\"sha256:").expect("prev") + "\"prev\":\"sha256:".len();
        let mut b = reprev[6].clone().into_bytes();
        b[at] = if b[at] == b'a' { b'b' } else { b'a' };
        reprev[6] = String::from_utf8(b).expect("utf8");
        let mut cut = lines.clone();
        let half = cut[8].len() / 2;
        cut[8].truncate(half);
        vec![
            (
                "edited",
                write_copy("edited.jsonl", &edited),
                &[5u64, 6][..],
            ),
            ("deleted", write_copy("deleted.jsonl", &deleted), &[5][..]),
            ("swapped", write_copy("swapped.jsonl", &swapped), &[4][..]),
            ("prev-edited", write_copy("reprev.jsonl", &reprev), &[7][..]),
            ("cut", write_copy("cut.jsonl", &cut), &[9][..]),
        ]
    };
    for (what, copy, lines_ok) in cases {
        let out = verify(&fx, &copy);
        out.expect_code(1);
        let n = broken_line(&out)
            .unwrap_or_else(|| panic!("{what}: no 'broken at line N'\n{}", out.dump()));
        assert!(
            lines_ok.contains(&n),
            "{what}: reported line {n}, expected one of {lines_ok:?}\n{}",
            out.dump()
        );
    }
    // The original is untouched by verifying copies.
    assert_eq!(std::fs::read(&log).expect("read"), orig);
}

// ----------------------------------------------------------- 3. concurrency

#[test]
fn fifty_concurrent_runs_keep_one_valid_chain() {
    let fx = Fixture::new();
    let log = fx.root.join("audit.jsonl");
    let n = 50;
    let kids: Vec<Running> = (0..n)
        .map(|_| spawn(fx.moat(exec_args(&log, &[], &["/bin/true"]))))
        .collect();
    for k in kids {
        k.wait().expect_code(0);
    }
    let ev = events(&log);
    assert_eq!(ev.len(), n * RUN_TYPES.len(), "lines lost or duplicated");
    check_chain(&log);
    let v = verify(&fx, &log);
    v.expect_code(0);
    assert!(
        v.stdout.starts_with(&format!("ok: {} lines", n * 3)),
        "{}",
        v.dump()
    );
    let ids: HashSet<&str> = ev
        .iter()
        .filter_map(|e| e["execution_id"].as_str())
        .collect();
    assert_eq!(ids.len(), n, "distinct execution ids");
    for id in ids {
        let t: Vec<&str> = ev
            .iter()
            .filter(|e| e["execution_id"] == id)
            .map(|e| e["type"].as_str().unwrap_or("?"))
            .collect();
        assert_eq!(t, RUN_TYPES, "events of {id} out of order or missing");
    }
}

// --------------------------------------------------------------- 4. secrets

#[test]
fn secrets_never_reach_the_log() {
    let fx = Fixture::new();
    let log = fx.root.join("audit.jsonl");
    let s: Vec<String> = (1..=8).map(|i| unique(&format!("sekret{i}"))).collect();
    let env1 = format!("API_TOKEN={}", s[0]);
    let url = format!(
        "https://user:{}@example.invalid/p?access_token={}&x=1",
        s[3], s[4]
    );
    let auth = format!("Authorization: Bearer {}", s[2]);
    let cookie = format!("Cookie: session={}", s[5]);
    let bare_userinfo = format!("http://{}@example.invalid/", s[6]);
    let argv = [
        "/bin/true",
        &url,
        "-H",
        &auth,
        "-H",
        &cookie,
        &bare_userinfo,
    ];
    let extra = ["--env", &env1, "--pass-env", "SECRET_TOKEN"];
    let mut c = fx.moat(exec_args(&log, &extra, &argv));
    c.env("SECRET_TOKEN", &s[1]);
    run(c).expect_code(0);
    // Also through --events (the same events, on stdout).
    let mut c = fx.moat(exec_args(
        &log,
        &[&extra[..], &["--events"][..]].concat(),
        &argv,
    ));
    c.env("SECRET_TOKEN", &s[1]);
    let ev_out = run(c);
    ev_out.expect_code(0);

    let bytes = std::fs::read(&log).expect("log");
    let text = String::from_utf8_lossy(&bytes);
    // Positive controls: the run was logged with its argv and env names.
    assert!(
        text.contains("example.invalid"),
        "argv not logged at all (test would be vacuous)"
    );
    assert!(text.contains("Authorization"), "header name not logged");
    assert!(
        text.contains("API_TOKEN"),
        "env name not in the logged policy"
    );
    for (i, sec) in s.iter().enumerate().take(7) {
        assert!(
            !text.contains(sec.as_str()),
            "LEAK: secret #{} ({sec}) in the audit log:\n{text}",
            i + 1
        );
        ev_out.expect_absent(sec, &format!("secret #{} in --events", i + 1));
    }
}

/// Tokens carried in a URL's path, in the shapes services give them
/// (Telegram's bot token, Slack's and Discord's webhook URLs, npm's token
/// endpoint, a Gemfury repository URL, a `/token/VALUE` API path), in
/// argv, inside a shell command line, and in an `--env` value: absent from
/// the audit log and from `--events`, while the rest of each URL is kept.
#[test]
fn url_path_tokens_never_reach_the_log() {
    let fx = Fixture::new();
    let log = fx.root.join("audit.jsonl");
    // Mixed case with digits, as generated keys are.
    let s: Vec<String> = (1..=7)
        .map(|i| unique(&format!("Pt{i}")).replace('-', "Q"))
        .collect();
    let telegram = format!(
        "https://api.telegram.org/bot7012345678:{}/sendMessage",
        s[0]
    );
    let slack = format!(
        "https://hooks.slack.com/services/T0AB12CD3/B0CD34EF5/{}",
        s[1]
    );
    let discord = format!(
        "https://discord.com/api/webhooks/123456789012345678/{}",
        s[2]
    );
    let npm = format!("https://registry.npmjs.org/-/npm/v1/tokens/token/{}", s[3]);
    let fury = format!("https://pypi.fury.io/{}/acme/", s[4]);
    let shell = format!(
        "curl -s https://example.invalid/api/token/{} -o /dev/null",
        s[5]
    );
    let env = format!("NOTIFY_URL=https://hooks.slack.com/services/T1/B2/{}", s[6]);
    let argv = [
        "/bin/true",
        &telegram,
        &slack,
        &discord,
        &npm,
        &fury,
        &shell,
    ];
    let extra = ["--env", &env];
    run(fx.moat(exec_args(&log, &extra, &argv))).expect_code(0);
    let ev_out = run(fx.moat(exec_args(
        &log,
        &[&extra[..], &["--events"][..]].concat(),
        &argv,
    )));
    ev_out.expect_code(0);
    let text = std::fs::read_to_string(&log).expect("log");
    // Positive controls: each URL was logged, its host and place kept.
    for kept in [
        "api.telegram.org/***/sendMessage",
        "hooks.slack.com/services/***",
        "discord.com/api/webhooks/123456789012345678/***",
        "/-/npm/v1/tokens/token/***",
        "pypi.fury.io/***/acme/",
        "example.invalid/api/token/***",
    ] {
        assert!(text.contains(kept), "{kept} not in the log:\n{text}");
        ev_out.expect_stdout_has(kept);
    }
    assert!(text.contains("NOTIFY_URL"), "env name not in the log");
    for (i, sec) in s.iter().enumerate() {
        assert!(
            !text.contains(sec.as_str()),
            "LEAK: URL-path token #{} ({sec}) in the audit log:\n{text}",
            i + 1
        );
        ev_out.expect_absent(sec, &format!("URL-path token #{} in --events", i + 1));
    }
}

// ----------------------------------------------------- 5. --events is live

#[test]
fn events_stream_stdout_before_the_command_exits() {
    let fx = Fixture::new();
    let log = fx.root.join("audit.jsonl");
    let mut cmd = fx.moat(exec_args(
        &log,
        &["--events"],
        &[
            "/bin/sh",
            "-c",
            "echo first; echo oops >&2; sleep 2; echo second",
        ],
    ));
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn moat");
    let so = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let rd = thread::spawn(move || {
        for l in BufReader::new(so).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let mut seen: Vec<Value> = Vec::new();
    let mut running_at_first_stdout = None;
    while start.elapsed() < Duration::from_secs(30) {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(l) => {
                let v: Value =
                    serde_json::from_str(&l).unwrap_or_else(|e| panic!("event not JSON: {e}: {l}"));
                if v["type"] == "execution.stdout" && running_at_first_stdout.is_none() {
                    // Ordering, not wall clock: is moat (and so the command) still running?
                    running_at_first_stdout = Some(matches!(child.try_wait(), Ok(None)));
                    assert!(
                        !seen.iter().any(|e| e["type"] == "execution.finished"),
                        "stdout event after execution.finished"
                    );
                }
                seen.push(v);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let status = child.wait().expect("wait");
    let _ = rd.join();
    assert!(status.success(), "moat exit {status:?}");
    assert_eq!(
        running_at_first_stdout,
        Some(true),
        "the first execution.stdout event arrived only after moat exited (not live); events: {seen:#?}"
    );
    let types: Vec<&str> = seen
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(types.first(), Some(&"policy.resolved"), "{types:?}");
    assert_eq!(types.last(), Some(&"execution.finished"), "{types:?}");
    let decode = |kind: &str| -> Vec<u8> {
        let mut out = Vec::new();
        for e in seen.iter().filter(|e| e["type"] == kind) {
            let data = base64::engine::general_purpose::STANDARD
                .decode(e["data"].as_str().expect("data"))
                .expect("base64");
            assert_eq!(
                e["offset"].as_u64(),
                Some(out.len() as u64),
                "offset of {e}"
            );
            assert_eq!(
                e["length"].as_u64(),
                Some(data.len() as u64),
                "length of {e}"
            );
            out.extend(data);
        }
        out
    };
    assert_eq!(decode("execution.stdout"), b"first\nsecond\n");
    assert_eq!(decode("execution.stderr"), b"oops\n");
    assert!(
        seen.iter()
            .filter(|e| e["type"] == "execution.stdout")
            .count()
            >= 2,
        "both writes in one chunk: not live"
    );
    // The log got the lifecycle events but not the output chunks.
    let lt: Vec<String> = events(&log)
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?").to_string())
        .collect();
    assert_eq!(lt, RUN_TYPES, "log events");
}

// --------------------------------------- 6. the log is out of the sandbox's reach

/// One attack in a fresh fixture whose workspace is HOME, with the log at its
/// default place under that HOME. Returns a failure description, if any.
fn log_attack(attack: &dyn Fn(&str, &str, &str) -> String) -> Option<String> {
    let fx = Fixture::home_as_workspace();
    let log = default_log(&fx.home);
    run(fx.moat(["exec", "--", "/bin/true"])).expect_code(0);
    let before = std::fs::read(&log).expect("log exists after a run");
    let (l, d, h) = (
        log.to_string_lossy().into_owned(),
        log.parent().expect("dir").to_string_lossy().into_owned(),
        fx.home.to_string_lossy().into_owned(),
    );
    let a = attack(&l, &d, &h);
    let out = run(fx.sh(
        "workspace-write",
        &["--cwd", &h, "--quiet"],
        &format!("{a}; echo \"RC=$?\""),
    ));
    // A second run, as a later agent step would: it must not be able to
    // reach the log wherever the first one managed to put it.
    let out2 = run(fx.sh(
        "workspace-write",
        &["--cwd", &h, "--quiet"],
        &format!("for f in $(find {h} -name audit.jsonl 2>/dev/null); do echo ATTACK >> \"$f\" && echo \"WROTE $f\"; done; true"),
    ));
    let mut why = Vec::new();
    match std::fs::read(&log) {
        Ok(now) if now.starts_with(&before) => {}
        Ok(_) => why.push(format!(
            "{l} no longer starts with its previous bytes (replaced by a fresh chain or edited)"
        )),
        Err(e) => why.push(format!("{l} is gone: {e}")),
    }
    if let Ok(found) = Command::new("find")
        .args([&h, "-name", "audit.jsonl"])
        .output()
    {
        let found = String::from_utf8_lossy(&found.stdout).trim().to_string();
        if found != l {
            why.push(format!("audit.jsonl files on the host now: {found:?}"));
        }
    }
    if out.stdout.contains("RC=0") {
        why.push("the attack command reported success".into());
    }
    if out2.stdout.contains("WROTE") {
        why.push(format!(
            "a later run appended to a log: {}",
            out2.stdout.trim()
        ));
    }
    if verify(&fx, &log).code != Some(0) {
        why.push("moat audit verify fails".into());
    }
    if why.is_empty() {
        check_chain(&log);
        None
    } else {
        Some(format!("attack `{a}`: {}\n{}", why.join("; "), out.dump()))
    }
}

#[test]
fn sandboxed_command_cannot_touch_the_log() {
    type Attack = Box<dyn Fn(&str, &str, &str) -> String>;
    let attacks: Vec<Attack> = vec![
        Box::new(|l, _, _| format!("echo ATTACK >> {l}")),
        Box::new(|l, _, _| format!(": > {l}")),
        Box::new(|l, _, _| format!("truncate -s 0 {l}")),
        Box::new(|l, _, _| format!("{PY} -c 'open(\"{l}\", \"r+\").truncate(0)'")),
        Box::new(|l, _, _| format!("mv {l} {l}.moved")),
        Box::new(|l, _, _| format!("rm {l}")),
        Box::new(|l, _, h| format!("ln {l} {h}/hardlink && echo ATTACK >> {h}/hardlink")),
        Box::new(|_, d, _| format!("touch {d}/new-file")),
        Box::new(|_, d, h| format!("mv {d} {h}/moved-moat-dir")),
        Box::new(|_, _, h| format!("rm -rf {h}/.local")),
        Box::new(|_, _, h| format!("mv {h}/.local/state {h}/moved-state")),
        Box::new(|_, _, h| format!("mv {h}/.local {h}/moved-local")),
    ];
    let failures: Vec<String> = attacks
        .iter()
        .filter_map(|a| log_attack(a.as_ref()))
        .collect();

    // Positive control: the workspace (= HOME) itself is writable in such a run.
    let fx = Fixture::home_as_workspace();
    let h = fx.home.to_string_lossy().into_owned();
    run(fx.sh(
        "workspace-write",
        &["--cwd", &h],
        &format!("echo ok >> {h}/ws-write-ok"),
    ))
    .expect_code(0);
    assert_eq!(read(fx.home.join("ws-write-ok")).as_deref(), Some("ok\n"));

    assert!(
        failures.is_empty(),
        "{} attack(s) on the audit log succeeded:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn explicit_audit_log_inside_the_workspace_is_read_only() {
    let fx = Fixture::new();
    let log = fx.w("var/logs/audit.jsonl");
    std::fs::create_dir_all(log.parent().expect("dir")).expect("mkdir");
    run(fx.moat(exec_args(&log, &[], &["/bin/true"]))).expect_code(0);
    let before = std::fs::read(&log).expect("log");
    let l = log.to_string_lossy();
    let ws = fx.ws.display();
    let out = run(fx.moat(exec_args(
        &log,
        &["--policy", "workspace-write", "--quiet"],
        &[BASH, "-c", &format!("echo ATTACK >> {l}; echo RC1=$?; : > {l}; echo RC2=$?; echo ok > {ws}/ctl; echo RC3=$?")],
    )));
    out.expect_stdout_has("RC3=0");
    assert!(
        !out.stdout.contains("RC1=0") && !out.stdout.contains("RC2=0"),
        "{}",
        out.dump()
    );
    assert!(std::fs::read(&log).expect("log").starts_with(&before));
    verify(&fx, &log).expect_code(0);

    // Moving an ancestor of the log directory that lies in the workspace.
    let out = run(fx.moat(exec_args(
        &log,
        &["--policy", "workspace-write", "--quiet"],
        &[
            BASH,
            "-c",
            &format!("mv {ws}/var {ws}/var-moved; echo RC=$?"),
        ],
    )));
    let moved = fx.w("var-moved/logs/audit.jsonl");
    assert!(
        !exists(&moved)
            && std::fs::read(&log)
                .map(|b| b.starts_with(&before))
                .unwrap_or(false),
        "the sandboxed command moved the audit log's parent directory out of the protected place \
         (log now at {}: {}), where later runs can write it\n{}",
        moved.display(),
        exists(&moved),
        out.dump()
    );
}

// ------------------------------------------------------------ 7. denials

#[test]
fn denials_are_reported_on_stderr_json_events_and_log() {
    let fx = Fixture::new();
    let log = fx.root.join("audit.jsonl");
    let target = format!("/etc/{}", unique("moat-test"));
    // Against the no-op stand-in (CI's noop phase, as root) the touch
    // happens on the host: the file must not outlive the case.
    let _cleanup = RmOnDrop(target.clone().into());
    let argv = ["/usr/bin/touch", target.as_str()];

    let out = run(fx.moat(exec_args(&log, &[], &argv)));
    assert_ne!(out.code, Some(0));
    assert!(!exists(&target), "the write outside the sandbox happened");
    let line = out
        .stderr
        .lines()
        .find(|l| l.starts_with("moat: denied"))
        .map(String::from);
    assert!(
        line.as_deref().is_some_and(|l| l.contains(&target)),
        "no 'moat: denied ... {target}' line on stderr\n{}",
        out.dump()
    );

    let out = run(fx.moat(exec_args(&log, &["--quiet"], &argv)));
    assert_ne!(out.code, Some(0));
    assert!(
        out.stderr.contains("touch"),
        "positive control: the command's own error is still shown\n{}",
        out.dump()
    );
    assert!(
        !out.stderr.contains("moat: denied"),
        "--quiet still prints the summary\n{}",
        out.dump()
    );

    let out = run(fx.moat(exec_args(&log, &["--json"], &argv)));
    let j = out.json();
    let den = j["denials"]
        .as_array()
        .unwrap_or_else(|| panic!("no denials array\n{}", out.dump()));
    assert!(
        den.iter().any(|d| d["path"] == target.as_str()),
        "denials lack {target}: {den:?}"
    );
    assert!(
        !j["stderr"].as_str().unwrap_or("").contains("moat: denied"),
        "summary leaked into captured stderr"
    );

    let out = run(fx.moat(exec_args(&log, &["--events"], &argv)));
    let evs: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let pos_d = evs
        .iter()
        .position(|e| e["type"] == "sandbox.denied" && e["path"] == target.as_str());
    assert!(pos_d.is_some(), "no sandbox.denied in --events: {evs:#?}");
    assert_eq!(
        evs.last().map(|e| e["type"].clone()),
        Some(Value::from("execution.finished"))
    );

    let ev = events(&log);
    let denied: Vec<&Value> = ev
        .iter()
        .filter(|e| e["type"] == "sandbox.denied")
        .collect();
    assert_eq!(denied.len(), 4, "one sandbox.denied per run: {denied:#?}");
    assert!(denied.iter().all(|e| e["path"] == target.as_str()));
    check_chain(&log);

    // Negative control: a clean run reports no denial anywhere.
    let out = run(fx.moat(exec_args(&log, &["--json"], &["/bin/true"])));
    assert_eq!(out.json()["denials"], serde_json::json!([]));
    let ev2 = events(&log);
    assert!(ev2[ev.len()..]
        .iter()
        .all(|e| e["type"] != "sandbox.denied"));
}
