//! The result of one execution as one typed object: what `moat exec
//! --json` prints. Fields a refused run cannot have are absent, not null,
//! as moat has always written them.

use moat_linux::RunStatus;
use moat_policy::{NetworkMode, Policy};
use serde::Serialize;
use serde_json::Value;

use crate::{status_str, Completed, Denial, Layers};

/// Exit code of a run moat refused or could not start.
pub const EXIT_MOAT_FAILED: i32 = 125;
/// Exit code of a run whose sweep left a path live on the host.
pub const EXIT_SWEEP_FAILED: i32 = 122;

/// The result of one execution, for every surface that reports one:
/// `moat exec --json` (from a [`Completed`] run), the service's
/// `getExecution` and the MCP `structuredContent` (from what the service
/// read of the run's events, [`ExecutionResult::service`]). A field one
/// surface does not report is `None` and absent from its JSON; a field
/// that surface reports as `null` is `Some(None)`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExecutionResult {
    /// Absent only when nothing was started (an MCP call refused first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// How a service execution's sandbox was launched: `template` (forked
    /// from a pre-built one) or `oneshot` (its own `moat exec` child).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch: Option<String>,
    /// The request was refused before an execution existed (MCP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<bool>,
    /// The protocol's session (service).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub status: String,
    /// Why it ended (null while running or when it never started; absent
    /// from a refused `--json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_reason: Option<Option<String>>,
    /// The protocol's stable error code of the end (`EXECUTION_TIMEOUT`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_id: Option<String>,
    pub policy_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_epoch: Option<String>,
    /// The exit code (null while running).
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_bytes: Option<u64>,
    /// A kept stream passed its limit (service).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_truncated: Option<bool>,
    /// The output, when this surface returns it (`--json`, MCP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_truncated: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_truncated: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_usage: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub denials: Option<Vec<Denial>>,
    /// Why moat refused or failed (`--json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why it failed to start (service; null otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swept: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep_failed: Option<Vec<Value>>,
}

/// The backend RunSeal's public objects name.
pub const BACKEND: &str = "moat-linux";

/// The `Execution` object `execute` answers with, as soon as the run's
/// policy is resolved and on record (RFC-0006).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Execution {
    pub execution_id: String,
    pub session_id: String,
    pub policy_id: String,
    pub policy_hash: String,
    pub policy_epoch: String,
    pub backend: &'static str,
    pub status: String,
}

impl Execution {
    /// The execution the service follows, as it is now.
    pub fn of(v: &ServiceView) -> Execution {
        Execution {
            execution_id: v.execution_id.clone(),
            session_id: v.session_id.clone(),
            policy_id: v.policy_id.clone(),
            policy_hash: v.policy_hash.clone(),
            policy_epoch: v.policy_epoch.clone(),
            backend: BACKEND,
            status: v.status.clone(),
        }
    }

    /// The wire form.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// One entry of `listExecutions`: an execution's public summary (no
/// output, no denials: `getExecution` has those).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExecutionSummary {
    pub execution_id: String,
    pub session_id: String,
    pub status: String,
    pub policy_id: String,
    pub policy_hash: String,
    pub policy_epoch: String,
    pub backend: &'static str,
    pub started_at: String,
    /// Null while it runs.
    pub finished_at: Option<String>,
}

impl ExecutionSummary {
    /// The summary of the execution the service follows, as it is now.
    pub fn of(v: &ServiceView) -> ExecutionSummary {
        ExecutionSummary {
            execution_id: v.execution_id.clone(),
            session_id: v.session_id.clone(),
            status: v.status.clone(),
            policy_id: v.policy_id.clone(),
            policy_hash: v.policy_hash.clone(),
            policy_epoch: v.policy_epoch.clone(),
            backend: BACKEND,
            started_at: v.started_at.clone(),
            finished_at: v.finished_at.clone(),
        }
    }
}

/// What the service knows of one execution, read from its events.
#[derive(Clone, Debug, Default)]
pub struct ServiceView {
    pub execution_id: String,
    pub session_id: String,
    pub status: String,
    pub termination_reason: Option<String>,
    pub policy_id: String,
    pub policy_hash: String,
    pub policy_epoch: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub cancel_requested: bool,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub output_truncated: bool,
    /// The run's `resource_usage` (from `execution.finished`), if it ended so.
    pub resource_usage: Option<Value>,
    pub duration_ms: Option<u64>,
    pub denials: Vec<Denial>,
    pub reason: Option<String>,
    /// `template` or `oneshot`: how the sandbox was launched.
    pub launch: Option<String>,
}

/// What confined the run.
#[derive(Clone, Debug, Serialize)]
pub struct SandboxReport {
    pub enforced: bool,
    pub level: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_given: Option<Vec<String>>,
    /// `oneshot` or `template` (see the `execution.finished` event).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<Layers>,
}

/// The run's network mode and, in proxy mode, the decisions folded per target.
#[derive(Clone, Debug, Serialize)]
pub struct NetworkReport {
    pub mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<Vec<Value>>,
}

impl ExecutionResult {
    /// The result of a run moat refused before anything ran.
    pub fn refused(execution_id: &str, policy: Option<&Policy>, msg: &str) -> ExecutionResult {
        ExecutionResult {
            execution_id: Some(execution_id.to_string()),
            exit_code: Some(EXIT_MOAT_FAILED),
            signal: None,
            timed_out: false,
            status: "failed_to_start".to_string(),
            stdout: Some(String::new()),
            stderr: Some(String::new()),
            stdout_truncated: Some(false),
            stderr_truncated: Some(false),
            duration_ms: Some(0),
            sandbox: Some(SandboxReport {
                enforced: false,
                level: policy.map(|p| p.level.as_str().to_string()),
                backend: None,
                not_given: None,
                launch: None,
                layers: None,
            }),
            network: Some(NetworkReport {
                mode: policy.map(|p| p.network.mode.as_str().to_string()),
                requests: None,
            }),
            policy_hash: policy.map(|p| p.hash()),
            error: Some(msg.to_string()),
            ..ExecutionResult::default()
        }
    }

    /// A request refused before any execution existed (a `cwd` outside
    /// the roots, a wider policy…), as an MCP result: `status: "denied"`
    /// (RFC-0006's status for it), the stable `error_code` and the reason.
    pub fn refused_request(reason: &str, error_code: &str) -> ExecutionResult {
        ExecutionResult {
            refused: Some(true),
            status: "denied".to_string(),
            error_code: Some(Some(error_code.to_string())),
            reason: Some(Some(reason.to_string())),
            denials: Some(Vec::new()),
            ..ExecutionResult::default()
        }
    }

    /// The protocol's result of an execution the service follows (while
    /// running: the fields known so far).
    pub fn service(v: &ServiceView) -> ExecutionResult {
        let timed_out = v.termination_reason.as_deref() == Some("timeout");
        // The measured usage once the run reported it; until then what is
        // known (nothing is measured while it runs).
        let resource_usage = v.resource_usage.clone().unwrap_or_else(|| {
            serde_json::json!({"duration_ms": v.duration_ms, "max_rss_bytes": null, "cpu_ms": null})
        });
        ExecutionResult {
            execution_id: Some(v.execution_id.clone()),
            session_id: Some(v.session_id.clone()),
            status: v.status.clone(),
            termination_reason: Some(v.termination_reason.clone()),
            error_code: Some(timed_out.then(|| "EXECUTION_TIMEOUT".to_string())),
            policy_id: Some(v.policy_id.clone()),
            policy_hash: Some(v.policy_hash.clone()),
            policy_epoch: Some(v.policy_epoch.clone()),
            exit_code: v.exit_code,
            signal: v.signal,
            timed_out,
            cancel_requested: Some(v.cancel_requested),
            started_at: Some(v.started_at.clone()),
            finished_at: Some(v.finished_at.clone()),
            stdout_bytes: Some(v.stdout_bytes),
            stderr_bytes: Some(v.stderr_bytes),
            output_truncated: Some(v.output_truncated),
            resource_usage: Some(resource_usage),
            denials: Some(v.denials.clone()),
            reason: Some(v.reason.clone()),
            launch: v.launch.clone(),
            ..ExecutionResult::default()
        }
    }

    /// The wire form (keys sorted, as moat has always printed them).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl From<&Completed> for ExecutionResult {
    fn from(c: &Completed) -> ExecutionResult {
        let (o, policy) = (&c.outcome, &c.policy);
        let enforced = policy.level.is_sandboxed() && o.status != RunStatus::FailedToStart;
        ExecutionResult {
            execution_id: Some(c.execution_id.clone()),
            exit_code: Some(if o.sweep_failed.is_empty() {
                o.exit_code
            } else {
                EXIT_SWEEP_FAILED
            }),
            signal: o.signal,
            timed_out: o.timed_out,
            status: status_str(o.status).to_string(),
            stdout: Some(String::from_utf8_lossy(&o.stdout).into_owned()),
            stderr: Some(String::from_utf8_lossy(&o.stderr).into_owned()),
            stdout_truncated: Some(o.stdout_truncated),
            stderr_truncated: Some(o.stderr_truncated),
            duration_ms: Some(o.duration.as_millis() as u64),
            termination_reason: Some(o.termination_reason.map(|r| r.as_str().to_string())),
            resource_usage: Some(serde_json::to_value(o.usage).unwrap_or(Value::Null)),
            limits: Some(serde_json::to_value(&o.limits).unwrap_or(Value::Null)),
            sandbox: Some(SandboxReport {
                enforced,
                level: Some(policy.level.as_str().to_string()),
                backend: Some(o.backend.to_string()),
                not_given: Some(o.not_given.iter().map(|s| s.to_string()).collect()),
                launch: Some(o.launch.to_string()),
                layers: Some(Layers::from(&o.layers)),
            }),
            network: Some(NetworkReport {
                mode: Some(policy.network.mode.as_str().to_string()),
                requests: (policy.network.mode == NetworkMode::Proxy).then(|| c.requests.clone()),
            }),
            policy_hash: Some(policy.hash()),
            denials: Some(c.denials.clone()),
            error: o.error.clone(),
            swept: (!o.swept.is_empty()).then(|| {
                o.swept
                    .iter()
                    .map(|s| serde_json::json!({"path": s.path, "moved_to": s.moved_to, "detail": s.detail}))
                    .collect()
            }),
            sweep_failed: (!o.sweep_failed.is_empty()).then(|| {
                o.sweep_failed
                    .iter()
                    .map(|f| serde_json::json!({"path": f.path, "error": f.error}))
                    .collect()
            }),
            ..ExecutionResult::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(r: &ExecutionResult) -> Vec<String> {
        match r.to_value() {
            Value::Object(m) => m.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// `execute`'s `Execution` and `listExecutions`' summary keep the
    /// fields the service has always written (docs/protocol.md).
    #[test]
    fn the_execution_and_its_summary_keep_their_wire_fields() {
        let v = ServiceView {
            execution_id: "exec_1".into(),
            session_id: "s".into(),
            status: "running".into(),
            policy_id: "workspace-write".into(),
            policy_hash: "h".into(),
            policy_epoch: "h".into(),
            started_at: "t0".into(),
            ..ServiceView::default()
        };
        assert_eq!(
            Execution::of(&v).to_value(),
            serde_json::json!({
                "execution_id": "exec_1", "session_id": "s", "policy_id": "workspace-write",
                "policy_hash": "h", "policy_epoch": "h", "backend": "moat-linux",
                "status": "running",
            })
        );
        assert_eq!(
            serde_json::to_value(ExecutionSummary::of(&v)).unwrap(),
            serde_json::json!({
                "execution_id": "exec_1", "session_id": "s", "status": "running",
                "policy_id": "workspace-write", "policy_hash": "h", "policy_epoch": "h",
                "backend": "moat-linux", "started_at": "t0", "finished_at": null,
            })
        );
    }

    /// The fields each surface has always printed: the wire formats are
    /// pinned here, so a field meant for one surface cannot leak into another.
    #[test]
    fn each_surface_keeps_its_own_fields() {
        let refused = ExecutionResult::refused("exec_1", None, "no");
        assert_eq!(
            keys(&refused),
            [
                "duration_ms",
                "error",
                "execution_id",
                "exit_code",
                "network",
                "policy_hash",
                "sandbox",
                "signal",
                "status",
                "stderr",
                "stderr_truncated",
                "stdout",
                "stdout_truncated",
                "timed_out"
            ]
        );
        let v = refused.to_value();
        assert_eq!(
            v["sandbox"],
            serde_json::json!({"enforced": false, "level": null})
        );
        assert_eq!(v["network"], serde_json::json!({"mode": null}));
        assert_eq!(v["exit_code"], 125);
        let service = ExecutionResult::service(&ServiceView {
            status: "running".into(),
            ..ServiceView::default()
        });
        assert_eq!(
            keys(&service),
            [
                "cancel_requested",
                "denials",
                "error_code",
                "execution_id",
                "exit_code",
                "finished_at",
                "output_truncated",
                "policy_epoch",
                "policy_hash",
                "policy_id",
                "reason",
                "resource_usage",
                "session_id",
                "signal",
                "started_at",
                "status",
                "stderr_bytes",
                "stdout_bytes",
                "termination_reason",
                "timed_out"
            ]
        );
        let v = service.to_value();
        assert_eq!(v["exit_code"], Value::Null);
        assert_eq!(v["finished_at"], Value::Null);
        let refused = ExecutionResult::refused_request("cwd outside the roots", "POLICY_DENIED");
        assert_eq!(
            keys(&refused),
            [
                "denials",
                "error_code",
                "exit_code",
                "policy_hash",
                "reason",
                "refused",
                "signal",
                "status",
                "timed_out"
            ]
        );
        assert_eq!(
            v["resource_usage"],
            serde_json::json!({"duration_ms": null, "max_rss_bytes": null, "cpu_ms": null})
        );
    }
}
