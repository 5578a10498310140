//! moat's events as types: what `moat exec --events` writes, the audit log
//! records, and the service reads back from its per-execution supervisors.
//! One enum for writing and reading, so the wire cannot drift between them.
//!
//! The wire form is the event's own fields plus RFC-0004's envelope
//! (`type`, `time`, `execution_id`, `session_id`, `policy_hash`,
//! `policy_epoch`, `moat_version`), stamped by [`moat_audit::event`]; keys
//! are written in sorted order (a `serde_json::Value` object), as before.

use std::path::PathBuf;

use moat_audit::RunContext;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One event of a run, as its `type` names it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    /// The policy a run goes under, before anything runs.
    #[serde(rename = "policy.resolved")]
    PolicyResolved {
        #[serde(default)]
        policy_id: String,
        #[serde(default)]
        sandbox_level: String,
        #[serde(default)]
        network: Value,
        /// The canonical policy; `Null` in an event read back
        /// ([`Event::read`]): it stays in the wire event, not copied.
        #[serde(default)]
        policy: Value,
        /// The request's metadata, redacted (absent when none was given).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<Map<String, Value>>,
    },
    /// The command is about to exec.
    #[serde(rename = "execution.started")]
    Started {
        #[serde(default)]
        argv: Vec<String>,
        #[serde(default)]
        cwd: String,
        #[serde(default)]
        pid: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_execution_id: Option<String>,
    },
    /// A chunk of stdout, base64.
    #[serde(rename = "execution.stdout")]
    Stdout(Chunk),
    /// A chunk of stderr, base64.
    #[serde(rename = "execution.stderr")]
    Stderr(Chunk),
    /// One decision of the network proxy (its record's own fields).
    #[serde(rename = "network.decision")]
    NetworkDecision(Map<String, Value>),
    /// An access the sandbox refused.
    #[serde(rename = "sandbox.denied")]
    Denied(Denial),
    /// A path the sweep could not neutralise: still live on the host.
    #[serde(rename = "sandbox.sweep_failed")]
    SweepFailed {
        #[serde(default)]
        path: PathBuf,
        #[serde(default)]
        error: String,
    },
    /// The command ran and ended.
    #[serde(rename = "execution.finished")]
    Finished(Finished),
    /// Nothing ran (refused or failed to start).
    #[serde(rename = "execution.failed")]
    Failed {
        #[serde(default)]
        reason: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
    /// An event type this build does not know (read side only).
    #[serde(other)]
    Other,
}

/// A chunk of output: where it starts in its stream, its length, its bytes.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Chunk {
    #[serde(default)]
    pub offset: u64,
    #[serde(default)]
    pub length: usize,
    /// The bytes, base64 (standard alphabet, padded).
    #[serde(default)]
    pub data: String,
}

impl Chunk {
    pub fn new(offset: u64, bytes: &[u8]) -> Chunk {
        use base64::Engine as _;
        Chunk {
            offset,
            length: bytes.len(),
            data: base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }

    /// The chunk's bytes (empty when the data is not base64).
    pub fn bytes(&self) -> Vec<u8> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(&self.data)
            .unwrap_or_default()
    }
}

/// How a run that ran ended.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Finished {
    #[serde(default)]
    pub exit_code: i32,
    #[serde(default)]
    pub signal: Option<i32>,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub duration_ms: u64,
    #[serde(default)]
    pub timed_out: bool,
    #[serde(default)]
    pub termination_reason: Option<String>,
    #[serde(default)]
    pub backend: String,
    /// How the sandbox was launched: `oneshot` (built for this run) or
    /// `template` (forked from a pre-built one, serve/mcp).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub launch: String,
    #[serde(default)]
    pub layers: Layers,
    #[serde(default)]
    pub resource_usage: Value,
    #[serde(default)]
    pub limits: Value,
}

/// What each confinement layer gave the run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Layers {
    #[serde(default)]
    pub namespaces: String,
    #[serde(default)]
    pub landlock: String,
    #[serde(default)]
    pub seccomp: String,
}

impl From<&moat_linux::Layers> for Layers {
    fn from(l: &moat_linux::Layers) -> Layers {
        Layers {
            namespaces: l.namespaces.as_str().to_string(),
            landlock: l.landlock.as_str().to_string(),
            seccomp: l.seccomp.as_str().to_string(),
        }
    }
}

/// An access the sandbox refused: what (`operation`), where (`path`, or
/// `host` and `port`), why (`reason`, a stable code), and `detail`, the
/// sentence naming the flag that would grant it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Denial {
    #[serde(default)]
    pub operation: String,
    /// The path, absolute (shown lossily when it is not UTF-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<String>,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub detail: String,
    /// The stderr line the refusal was read from (network failures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<String>,
    /// Anything else a denial carries (a newer moat's fields), kept as read.
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

impl Denial {
    /// A refusal `explain` attributed to the plan: its stable code, and its
    /// phrase (the flag that would grant it) as the detail.
    pub fn explained(
        operation: &str,
        path: &std::path::Path,
        errno: &str,
        reason: moat_linux::explain::DenyReason,
        level: moat_policy::Level,
    ) -> Denial {
        Denial {
            operation: operation.to_string(),
            path: Some(path.to_string_lossy().into_owned()),
            errno: Some(errno.to_string()),
            reason: reason.code().to_string(),
            detail: reason.phrase(level),
            ..Denial::default()
        }
    }

    /// The operation, `access` when none was read.
    pub fn operation(&self) -> &str {
        if self.operation.is_empty() {
            "access"
        } else {
            &self.operation
        }
    }

    /// What was refused: the path, the host, or a target a newer moat named.
    pub fn target(&self) -> &str {
        self.path
            .as_deref()
            .or(self.host.as_deref())
            .or(self.more.get("target").and_then(Value::as_str))
            .unwrap_or("?")
    }

    /// `write /etc/x (outside_writable); read-only policy; use …`: the
    /// refusal and what would grant it, for a model reading a tool result.
    pub fn line_for_model(&self) -> String {
        format!(
            "{} {} ({}); {}",
            self.operation(),
            self.target(),
            self.reason,
            self.detail
        )
    }

    /// Removes the envelope from the fields a read denial carried along.
    pub fn strip_envelope(&mut self) {
        for k in ENVELOPE_KEYS {
            self.more.remove(*k);
        }
    }
}

/// The envelope's keys (and the log's `seq`/`prev`).
const ENVELOPE_KEYS: &[&str] = &[
    "type",
    "time",
    "execution_id",
    "session_id",
    "policy_hash",
    "policy_epoch",
    "moat_version",
    "parent_execution_id",
    "seq",
    "prev",
];

/// A `policy.resolved` read back without its `policy` ([`Event::read`]).
#[derive(Deserialize)]
struct ResolvedHead {
    #[serde(default)]
    policy_id: String,
    #[serde(default)]
    sandbox_level: String,
    #[serde(default)]
    network: Value,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

/// The envelope of an event read back.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Envelope {
    #[serde(default)]
    pub time: String,
    #[serde(default)]
    pub execution_id: String,
    #[serde(default)]
    pub session_id: String,
    #[serde(default)]
    pub policy_hash: Option<String>,
    #[serde(default)]
    pub policy_epoch: Option<String>,
}

impl Event {
    /// The wire name of [`Event::Started`]: the command is about to exec
    /// (the sandbox's init exists by then).
    pub const STARTED_KIND: &'static str = "execution.started";

    /// The event's `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::PolicyResolved { .. } => "policy.resolved",
            Event::Started { .. } => Event::STARTED_KIND,
            Event::Stdout(_) => "execution.stdout",
            Event::Stderr(_) => "execution.stderr",
            Event::NetworkDecision(_) => "network.decision",
            Event::Denied(_) => "sandbox.denied",
            Event::SweepFailed { .. } => "sandbox.sweep_failed",
            Event::Finished(_) => "execution.finished",
            Event::Failed { .. } => "execution.failed",
            Event::Other => "other",
        }
    }

    /// The event's own fields (without `type`).
    fn fields(&self) -> Map<String, Value> {
        let mut map = match serde_json::to_value(self) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        map.remove("type");
        map
    }

    /// The wire form, stamped now with the run's envelope.
    pub fn stamp(&self, ctx: &RunContext) -> Value {
        moat_audit::event(ctx, self.kind(), self.fields())
    }

    /// The wire form with a partial envelope, for a run refused before its
    /// policy was known (no epoch, no version; `policy_hash` may be null).
    pub fn stamp_bare(
        &self,
        execution_id: &str,
        session_id: &str,
        policy_hash: Option<String>,
    ) -> Value {
        let mut map = self.fields();
        map.insert("type".into(), Value::String(self.kind().to_string()));
        map.insert("time".into(), Value::String(moat_audit::now_rfc3339()));
        map.insert("execution_id".into(), Value::String(execution_id.into()));
        map.insert("session_id".into(), Value::String(session_id.into()));
        map.insert(
            "policy_hash".into(),
            policy_hash.map(Value::String).unwrap_or(Value::Null),
        );
        Value::Object(map)
    }

    /// Reads one wire event: its envelope and the typed event. A denial
    /// keeps its own fields only.
    pub fn read(v: &Value) -> (Envelope, Event) {
        // Read from the borrowed value, not a copy of it: a service reads
        // every event of every execution, and `policy.resolved` carries the
        // whole canonical policy (≈ 5 KB of JSON, copied twice here before).
        let envelope = Envelope::deserialize(v).unwrap_or_default();
        // `policy.resolved` by its tag, then its own small fields: the
        // enum's derive would first buffer the whole event (the canonical
        // policy too) into serde's `Content`, then copy the policy again
        // into a `Value` no reader of a read-back event looks at.
        if v.get("type").and_then(Value::as_str) == Some("policy.resolved") {
            let event =
                ResolvedHead::deserialize(v).map_or(Event::Other, |h| Event::PolicyResolved {
                    policy_id: h.policy_id,
                    sandbox_level: h.sandbox_level,
                    network: h.network,
                    policy: Value::Null,
                    metadata: h.metadata,
                });
            return (envelope, event);
        }
        let mut event = Event::deserialize(v).unwrap_or_else(|_| {
            // A denial of a shape this build does not know (a field of
            // another type): reported as moat wrote it, never dropped.
            if v["type"] == "sandbox.denied" {
                Event::Denied(Denial {
                    more: v.as_object().cloned().unwrap_or_default(),
                    ..Denial::default()
                })
            } else {
                Event::Other
            }
        });
        if let Event::Denied(d) = &mut event {
            d.strip_envelope();
        }
        (envelope, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn denials_read_back_keep_their_own_fields() {
        let ev = json!({"type": "sandbox.denied", "execution_id": "exec_1", "time": "t",
            "operation": "connect", "host": "example.com", "port": 443, "reason": "not_allowed",
            "detail": "add --allow-domain example.com", "future": 1});
        let (env, Event::Denied(d)) = Event::read(&ev) else {
            panic!("not a denial");
        };
        assert_eq!(env.execution_id, "exec_1");
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!({"operation": "connect", "host": "example.com", "port": 443,
                   "reason": "not_allowed", "detail": "add --allow-domain example.com", "future": 1})
        );
    }

    #[test]
    fn a_resolved_policy_reads_back_by_its_own_fields() {
        let ev = json!({"type": "policy.resolved", "execution_id": "exec_1", "time": "t",
            "policy_id": "workspace-contained", "sandbox_level": "strict",
            "network": {"mode": "disabled"}, "policy": {"big": [1, 2, 3]},
            "metadata": {"k": "v"}});
        let (
            env,
            Event::PolicyResolved {
                policy_id,
                sandbox_level,
                network,
                policy,
                metadata,
            },
        ) = Event::read(&ev)
        else {
            panic!("not a resolved policy");
        };
        assert_eq!(env.execution_id, "exec_1");
        assert_eq!(
            (policy_id.as_str(), sandbox_level.as_str()),
            ("workspace-contained", "strict")
        );
        assert_eq!(network, json!({"mode": "disabled"}));
        assert_eq!(policy, Value::Null, "the policy stays in the wire event");
        assert_eq!(metadata.unwrap()["k"], "v");
        // A field of another type: not a resolved policy, as before.
        let odd = json!({"type": "policy.resolved", "policy_id": 3});
        assert!(matches!(Event::read(&odd).1, Event::Other));
    }

    #[test]
    fn events_round_trip_through_the_wire() {
        let ctx = RunContext {
            execution_id: "exec_1".into(),
            session_id: "s".into(),
            policy_hash: "h".into(),
            policy_epoch: "h".into(),
            moat_version: "0".into(),
        };
        let fin = Event::Finished(Finished {
            exit_code: 124,
            timed_out: true,
            ..Finished::default()
        });
        let wire = fin.stamp(&ctx);
        assert_eq!(wire["type"], "execution.finished");
        assert_eq!(wire["signal"], Value::Null);
        assert!(matches!(
            Event::read(&wire).1,
            Event::Finished(Finished {
                exit_code: 124,
                timed_out: true,
                ..
            })
        ));
        let failed = Event::Failed {
            reason: Some("no".into()),
            exit_code: None,
        }
        .stamp(&ctx);
        assert!(failed.get("exit_code").is_none());
        let odd = json!({"type": "sandbox.denied", "time": "t", "port": "not-a-number", "path": 3});
        let Event::Denied(d) = Event::read(&odd).1 else {
            panic!("an odd denial was dropped");
        };
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!({"operation": "", "reason": "", "detail": "", "port": "not-a-number", "path": 3})
        );
        let other = json!({"type": "something.new", "host": "x"});
        assert!(matches!(Event::read(&other).1, Event::Other));
        let out = Event::Stdout(Chunk::new(3, b"hi")).stamp(&ctx);
        assert_eq!(out["data"], "aGk=");
        assert_eq!(out["length"], 2);
    }
}
