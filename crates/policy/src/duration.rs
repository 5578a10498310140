//! Parsing of `--timeout` durations: `500ms`, `2s`, `1m`, or plain seconds.

/// A duration string moat does not understand.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {0:?}: use e.g. 500ms, 2s, 1m or plain seconds (30)")]
pub struct DurationError(pub String);

/// The longest duration moat takes, in milliseconds (about 31,700 years:
/// anything longer is a mistake or an overflow).
pub const MAX_DURATION_MS: u64 = 1_000_000_000_000_000;

/// Parses a duration into milliseconds. Zero is refused: a run that may not
/// run at all is a mistake, not a policy.
pub fn parse_duration(s: &str) -> Result<u64, DurationError> {
    let err = || DurationError(s.to_string());
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3_600_000.0)
    } else {
        (t, 1000.0)
    };
    let n = num.trim();
    if n.is_empty() || !n.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(err());
    }
    let v: f64 = n.parse().map_err(|_| err())?;
    let ms = (v * scale).round();
    if !(1.0..=MAX_DURATION_MS as f64).contains(&ms) {
        return Err(err());
    }
    Ok(ms as u64)
}
