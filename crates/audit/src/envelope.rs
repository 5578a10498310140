//! The event envelope: what every line carries, the session id, and where
//! the log lives by default.

use std::io::Read;
use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::time::now_rfc3339;

/// Envelope fields known when a run starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunContext {
    pub execution_id: String,
    pub session_id: String,
    pub policy_hash: String,
    pub policy_epoch: String,
    pub moat_version: String,
}

/// Keys the envelope owns; a same-named entry in an event's fields is
/// ignored. `seq` and `prev` belong to the log and are dropped here too.
const ENVELOPE_KEYS: &[&str] = &[
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

/// One event: `{"type": kind, "time", "execution_id", "session_id",
/// "policy_hash", "policy_epoch", "moat_version", ...fields}`, stamped now.
/// Without `seq`/`prev`: [`crate::AuditLog::append`] adds them, and the live
/// `--events` stream goes without them.
pub fn event(ctx: &RunContext, kind: &str, fields: Map<String, Value>) -> Value {
    let mut map = fields;
    for key in ENVELOPE_KEYS {
        map.remove(*key);
    }
    map.insert("type".into(), Value::String(kind.to_owned()));
    map.insert("time".into(), Value::String(now_rfc3339()));
    map.insert(
        "execution_id".into(),
        Value::String(ctx.execution_id.clone()),
    );
    map.insert("session_id".into(), Value::String(ctx.session_id.clone()));
    map.insert("policy_hash".into(), Value::String(ctx.policy_hash.clone()));
    map.insert(
        "policy_epoch".into(),
        Value::String(ctx.policy_epoch.clone()),
    );
    map.insert(
        "moat_version".into(),
        Value::String(ctx.moat_version.clone()),
    );
    Value::Object(map)
}

/// Longest accepted `MOAT_SESSION_ID`.
const MAX_SESSION_ID: usize = 128;

/// `MOAT_SESSION_ID` when it is set and sane (1–128 characters of
/// `[A-Za-z0-9._:-]`), else a fresh `sess_<32 hex>`.
pub fn session_id_from_env() -> String {
    match std::env::var("MOAT_SESSION_ID") {
        Ok(s) if is_sane_session_id(&s) => s,
        _ => format!("sess_{}", random_hex16()),
    }
}

pub(crate) fn is_sane_session_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_SESSION_ID
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// 16 random bytes as 32 hex digits, from `/dev/urandom`; should that fail,
/// a sha256 of the time, pid and an address (unique, though not secret —
/// a session id is a label, not a credential).
fn random_hex16() -> String {
    let mut bytes = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok();
    if !ok {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(now_rfc3339().as_bytes());
        h.update(std::process::id().to_le_bytes());
        h.update((&bytes as *const [u8; 16] as usize).to_le_bytes());
        let digest = h.finalize();
        bytes.copy_from_slice(&digest[..16]);
    }
    crate::log::hex(&bytes)
}

/// `$XDG_STATE_HOME/moat/audit.jsonl` when `XDG_STATE_HOME` is an absolute
/// path, else `$HOME/.local/state/moat/audit.jsonl`; `None` without either.
pub fn default_log_path(env: &[(String, String)]) -> Option<PathBuf> {
    let get = |name: &str| {
        env.iter()
            .rev() // the last assignment wins, as in a process environment
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| v.starts_with('/'))
    };
    if let Some(state) = get("XDG_STATE_HOME") {
        return Some(PathBuf::from(state).join("moat").join("audit.jsonl"));
    }
    get("HOME").map(|home| PathBuf::from(home).join(".local/state/moat/audit.jsonl"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn log_path_prefers_absolute_xdg_state_home() {
        assert_eq!(
            default_log_path(&env(&[("HOME", "/home/u"), ("XDG_STATE_HOME", "/st")])),
            Some(PathBuf::from("/st/moat/audit.jsonl"))
        );
        assert_eq!(
            default_log_path(&env(&[("HOME", "/home/u"), ("XDG_STATE_HOME", "rel")])),
            Some(PathBuf::from("/home/u/.local/state/moat/audit.jsonl"))
        );
        assert_eq!(default_log_path(&env(&[("HOME", "")])), None);
        assert_eq!(default_log_path(&[]), None);
    }

    #[test]
    fn session_ids() {
        assert!(is_sane_session_id("conv-42:turn.7_a"));
        assert!(!is_sane_session_id(""));
        assert!(!is_sane_session_id("a b"));
        assert!(!is_sane_session_id("x\n"));
        assert!(!is_sane_session_id(&"a".repeat(129)));
        let fresh = format!("sess_{}", random_hex16());
        assert_eq!(fresh.len(), 37);
        assert!(fresh[5..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(random_hex16(), random_hex16());
    }

    #[test]
    fn envelope_wins_over_fields() {
        let ctx = RunContext {
            execution_id: "exec_1".into(),
            session_id: "s".into(),
            policy_hash: "sha256:ab".into(),
            policy_epoch: "1".into(),
            moat_version: "0.1.0".into(),
        };
        let fields = json!({"type": "x", "seq": 9, "prev": "p", "argv": ["true"]});
        let Value::Object(fields) = fields else {
            panic!()
        };
        let ev = event(&ctx, "execution.started", fields);
        assert_eq!(ev["type"], "execution.started");
        assert_eq!(ev["execution_id"], "exec_1");
        assert_eq!(ev["argv"], json!(["true"]));
        assert!(ev.get("seq").is_none() && ev.get("prev").is_none());
    }
}
