//! moat's audit trail: one hash-chained JSONL log shared by every run, the
//! event envelope, redaction of secrets before anything is logged, and a
//! post-mortem reading of denials from a command's stderr.
//!
//! Every line of the log is one compact JSON object. Besides the envelope
//! (`type`, `time`, `execution_id`, `session_id`, `policy_hash`,
//! `policy_epoch`, `moat_version`) the log adds `seq` (1, 2, 3, …) and `prev`
//! (`sha256:` of the previous line's bytes without its newline, [`GENESIS`]
//! for the first line) under an exclusive `flock`, so any edit, deletion or
//! reordering of a line breaks the chain and [`verify`] names the first
//! broken line.

mod aggregate;
mod denials;
mod envelope;
mod log;
mod redact;
mod table;
mod time;

pub use aggregate::{DecisionAggregator, MAX_DISTINCT_DECISIONS};
pub use denials::{parse_denials, parse_network_failures, Denial, NetFailure, MAX_DENIALS};
pub use envelope::{default_log_path, event, session_id_from_env, RunContext};
pub use log::{
    lines_from, read_events, tail_lines, verify, AuditError, AuditLog, VerifyError, VerifyReport,
    GENESIS,
};
pub use redact::{redact_arg, redact_argv, REDACTED};
pub use table::format_table;
pub use time::{format_rfc3339, now_rfc3339};
