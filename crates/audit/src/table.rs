//! The human table of `moat audit tail`.

use std::fmt::Write;

use serde_json::Value;

/// Longest summary column, in characters.
const SUMMARY_MAX: usize = 120;
/// Width of the type column.
const TYPE_WIDTH: usize = 18;

/// One row per event: time (UTC, to the second), a short execution id, the
/// type, and a summary (argv for `execution.started`; exit, status and
/// duration for `execution.finished`; host:port, decision and reason for
/// `network.decision`; operation, path, errno and reason for
/// `sandbox.denied`; the reason for `execution.failed`). Control characters
/// are escaped, so a logged argv cannot drive the terminal.
pub fn format_table(events: &[Value]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<19}  {:<8}  {:<TYPE_WIDTH$}  SUMMARY",
        "TIME (UTC)", "EXEC", "TYPE"
    );
    for ev in events {
        let time = str_field(ev, "time").map(short_time).unwrap_or_default();
        let exec = str_field(ev, "execution_id")
            .map(short_id)
            .unwrap_or_default();
        let kind = clean(str_field(ev, "type").unwrap_or("?"), 40);
        let summary = clean(&summary(ev), SUMMARY_MAX);
        let _ = writeln!(out, "{time:<19}  {exec:<8}  {kind:<TYPE_WIDTH$}  {summary}");
    }
    out
}

/// The short form of an execution id shown by the table (`moat audit show`
/// accepts it as a prefix): the first 8 characters after `exec_`.
pub(crate) fn short_id(id: &str) -> String {
    let rest = id.strip_prefix("exec_").unwrap_or(id);
    clean(&rest.chars().take(8).collect::<String>(), 8)
}

fn short_time(t: &str) -> String {
    // 2026-11-30T08:21:26.967279Z -> 2026-11-30 08:21:26
    let mut s = clean(&t.chars().take(19).collect::<String>(), 19);
    if s.len() > 10 && s.as_bytes()[10] == b'T' {
        s.replace_range(10..11, " ");
    }
    s
}

fn str_field<'a>(ev: &'a Value, key: &str) -> Option<&'a str> {
    ev.get(key).and_then(Value::as_str)
}

fn summary(ev: &Value) -> String {
    let kind = str_field(ev, "type").unwrap_or("");
    match kind {
        "execution.started" => {
            let argv = ev.get("argv").and_then(Value::as_array).map(|a| {
                a.iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), shell_word))
                    .collect::<Vec<_>>()
                    .join(" ")
            });
            let mut s = argv.unwrap_or_default();
            if let Some(cwd) = str_field(ev, "cwd") {
                let _ = write!(s, "  (in {cwd})");
            }
            s
        }
        "execution.finished" => {
            let mut parts = Vec::new();
            if let Some(code) = ev.get("exit_code").filter(|v| !v.is_null()) {
                parts.push(format!("exit {code}"));
            }
            if let Some(sig) = ev.get("signal").filter(|v| !v.is_null()) {
                parts.push(format!("signal {sig}"));
            }
            if let Some(status) = str_field(ev, "status") {
                parts.push(status.to_owned());
            }
            if ev.get("timed_out").and_then(Value::as_bool) == Some(true)
                && str_field(ev, "status") != Some("timed_out")
            {
                parts.push("timed out".into());
            }
            if let Some(ms) = ev.get("duration_ms").and_then(Value::as_u64) {
                parts.push(format!("{ms} ms"));
            }
            parts.join(", ")
        }
        "execution.failed" => str_field(ev, "reason")
            .or_else(|| str_field(ev, "error"))
            .unwrap_or("")
            .to_owned(),
        "network.decision" => {
            let host = str_field(ev, "host").unwrap_or("?");
            let target = match ev.get("port").filter(|v| !v.is_null()) {
                Some(port) => format!("{host}:{port}"),
                None => host.to_owned(),
            };
            let decision = str_field(ev, "decision").unwrap_or("");
            match str_field(ev, "reason") {
                Some(reason) => format!("{target} {decision} ({reason})"),
                None => format!("{target} {decision}"),
            }
        }
        "sandbox.denied" => {
            let op = str_field(ev, "operation").or_else(|| str_field(ev, "op"));
            let mut s = [op, str_field(ev, "path"), str_field(ev, "errno")]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" ");
            if let Some(reason) = str_field(ev, "reason") {
                let _ = write!(s, " ({reason})");
            }
            s
        }
        "sandbox.sweep_failed" => {
            let path = str_field(ev, "path").unwrap_or("?");
            let error = str_field(ev, "error").unwrap_or("");
            format!("{path} NOT NEUTRALISED ({error})")
        }
        "policy.resolved" => {
            let level = str_field(ev, "sandbox_level").unwrap_or("?");
            let network = ev
                .pointer("/network/mode")
                .and_then(Value::as_str)
                .unwrap_or("?");
            let hash = str_field(ev, "policy_hash").unwrap_or("");
            let short = hash
                .strip_prefix("sha256:")
                .map_or(hash, |h| h.get(..12).unwrap_or(h));
            format!("level {level}, network {network}, policy {short}")
        }
        _ => {
            // Anything else: its own fields, compactly.
            const ENVELOPE: &[&str] = &[
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
            let mut s = String::new();
            if let Some(map) = ev.as_object() {
                for (k, v) in map.iter().filter(|(k, _)| !ENVELOPE.contains(&k.as_str())) {
                    if !s.is_empty() {
                        s.push(' ');
                    }
                    let _ = write!(
                        s,
                        "{k}={}",
                        v.as_str().map_or_else(|| v.to_string(), str::to_owned)
                    );
                }
            }
            s
        }
    }
}

/// An argv word, quoted only when a shell would need it.
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'-' | b'_' | b'.' | b'/' | b'=' | b':' | b',' | b'+' | b'@' | b'%'
                )
        });
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// At most `max` characters, control characters escaped, `…` when cut.
fn clean(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n >= max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows() {
        let evs = vec![
            json!({"type": "execution.started", "time": "2026-11-30T08:21:26.967279Z", "execution_id": "exec_0123456789abcdef",
                   "argv": ["sh", "-c", "echo hi\u{1b}[2J"], "cwd": "/w"}),
            json!({"type": "execution.finished", "time": "2026-11-30T08:21:27.000001Z", "execution_id": "exec_0123456789abcdef",
                   "exit_code": 0, "signal": null, "status": "finished", "duration_ms": 33, "timed_out": false}),
            json!({"type": "network.decision", "execution_id": "e", "host": "pypi.org", "port": 443, "decision": "deny", "reason": "not in routes"}),
            json!({"type": "sandbox.denied", "execution_id": "e", "operation": "write", "path": "/home/u/.bashrc", "errno": "EROFS", "reason": "outside workspace"}),
            json!({"type": "execution.failed", "execution_id": "e", "reason": "landlock unavailable"}),
        ];
        let t = format_table(&evs);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 6);
        assert!(lines[1].starts_with("2026-11-30 08:21:26  01234567  execution.started   sh -c 'echo hi\\u{1b}[2J'  (in /w)"), "{}", lines[1]);
        assert!(
            lines[2].ends_with("exit 0, finished, 33 ms"),
            "{}",
            lines[2]
        );
        assert!(
            lines[3].ends_with("pypi.org:443 deny (not in routes)"),
            "{}",
            lines[3]
        );
        assert!(
            lines[4].ends_with("write /home/u/.bashrc EROFS (outside workspace)"),
            "{}",
            lines[4]
        );
        assert!(lines[5].ends_with("landlock unavailable"), "{}", lines[5]);
        assert!(!t.contains('\u{1b}'));
    }
}
