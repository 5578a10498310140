//! A request's `metadata` (RFC-0006: client-provided, opaque, copied into
//! the audit records after size limits and redaction): a JSON object, at
//! most [`MAX_METADATA`] bytes, every value under a secret-bearing name
//! replaced by `***` and every string redacted as an argument is.

use serde_json::{Map, Value};

/// Longest metadata accepted, as compact JSON.
pub const MAX_METADATA: usize = 16 * 1024;
/// Deepest nesting accepted.
const MAX_DEPTH: usize = 8;

/// Why metadata was refused; `code()` is the stable `error.data.reason`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MetadataError {
    #[error("metadata must be a JSON object of names to values")]
    NotAnObject,
    #[error("metadata is {0} bytes as JSON; at most {MAX_METADATA} are recorded: send less")]
    TooLarge(usize),
    #[error("metadata nests deeper than {MAX_DEPTH} levels: flatten it")]
    TooDeep,
}

impl MetadataError {
    pub fn code(&self) -> &'static str {
        match self {
            MetadataError::NotAnObject | MetadataError::TooDeep => "metadata_invalid",
            MetadataError::TooLarge(_) => "metadata_too_large",
        }
    }
}

/// Checks `v` and returns it redacted, ready to record.
pub fn sanitize(v: &Value) -> Result<Map<String, Value>, MetadataError> {
    let Value::Object(map) = v else {
        return Err(MetadataError::NotAnObject);
    };
    let size = v.to_string().len();
    if size > MAX_METADATA {
        return Err(MetadataError::TooLarge(size));
    }
    if depth(v) > MAX_DEPTH {
        return Err(MetadataError::TooDeep);
    }
    Ok(map.iter().map(|(k, v)| (k.clone(), redact(k, v))).collect())
}

fn depth(v: &Value) -> usize {
    match v {
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Whether moat's redaction takes `name` for a secret-bearing name (one
/// table for argv, URLs, headers and this: `NAME=VALUE` hides the value
/// exactly when the name is secret).
fn secret_name(name: &str) -> bool {
    let probe = format!("{name}=plainvalue");
    moat_audit::redact_arg(&probe) != probe
}

fn redact(name: &str, v: &Value) -> Value {
    if secret_name(name) {
        return Value::String(moat_audit::REDACTED.to_string());
    }
    match v {
        Value::String(s) => Value::String(moat_audit::redact_arg(s)),
        Value::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (k.clone(), redact(k, v))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| redact(name, x)).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_hidden_and_the_rest_kept() {
        let m = sanitize(&json!({"agent_id": "a1", "n": 3, "nested": {"api_token": "abc", "ok": true},
            "password": 12, "url": "https://u:pw@example.com/x", "list": ["ghp_0123456789abcdefghij0123456789abcd"]}))
        .unwrap();
        assert_eq!(m["agent_id"], "a1");
        assert_eq!(m["n"], 3);
        assert_eq!(m["nested"]["api_token"], "***");
        assert_eq!(m["nested"]["ok"], true);
        assert_eq!(m["password"], "***");
        assert!(!m["url"].as_str().unwrap().contains("pw"));
        assert!(!m["list"][0]
            .as_str()
            .unwrap()
            .contains("0123456789abcdefghij"));
    }

    #[test]
    fn not_an_object_too_large_or_too_deep_is_refused() {
        assert_eq!(sanitize(&json!([1])), Err(MetadataError::NotAnObject));
        assert_eq!(
            sanitize(&json!({"x": "y".repeat(MAX_METADATA)}))
                .unwrap_err()
                .code(),
            "metadata_too_large"
        );
        let mut deep = json!(1);
        for _ in 0..10 {
            deep = json!({ "a": deep });
        }
        assert_eq!(sanitize(&deep), Err(MetadataError::TooDeep));
    }
}
