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

/// The result of one execution.
#[derive(Clone, Debug, Serialize)]
pub struct ExecutionResult {
    pub execution_id: String,
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub status: String,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
    /// Why it ended (null when it never started; absent when refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_reason: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_usage: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Value>,
    pub sandbox: SandboxReport,
    pub network: NetworkReport,
    pub policy_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub denials: Option<Vec<Denial>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swept: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep_failed: Option<Vec<Value>>,
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
            execution_id: execution_id.to_string(),
            exit_code: EXIT_MOAT_FAILED,
            signal: None,
            timed_out: false,
            status: "failed_to_start".to_string(),
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 0,
            termination_reason: None,
            resource_usage: None,
            limits: None,
            sandbox: SandboxReport {
                enforced: false,
                level: policy.map(|p| p.level.as_str().to_string()),
                backend: None,
                not_given: None,
                launch: None,
                layers: None,
            },
            network: NetworkReport {
                mode: policy.map(|p| p.network.mode.as_str().to_string()),
                requests: None,
            },
            policy_hash: policy.map(|p| p.hash()),
            denials: None,
            error: Some(msg.to_string()),
            swept: None,
            sweep_failed: None,
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
            execution_id: c.execution_id.clone(),
            exit_code: if o.sweep_failed.is_empty() {
                o.exit_code
            } else {
                EXIT_SWEEP_FAILED
            },
            signal: o.signal,
            timed_out: o.timed_out,
            status: status_str(o.status).to_string(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            stdout_truncated: o.stdout_truncated,
            stderr_truncated: o.stderr_truncated,
            duration_ms: o.duration.as_millis() as u64,
            termination_reason: Some(o.termination_reason.map(|r| r.as_str().to_string())),
            resource_usage: Some(serde_json::to_value(o.usage).unwrap_or(Value::Null)),
            limits: Some(serde_json::to_value(&o.limits).unwrap_or(Value::Null)),
            sandbox: SandboxReport {
                enforced,
                level: Some(policy.level.as_str().to_string()),
                backend: Some(o.backend.to_string()),
                not_given: Some(o.not_given.iter().map(|s| s.to_string()).collect()),
                launch: Some(o.launch.to_string()),
                layers: Some(Layers::from(&o.layers)),
            },
            network: NetworkReport {
                mode: Some(policy.network.mode.as_str().to_string()),
                requests: (policy.network.mode == NetworkMode::Proxy).then(|| c.requests.clone()),
            },
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
        }
    }
}
