//! Repeated network decisions folded into one record each, in bounded
//! memory: a command that makes 3,000 refused requests to one host leaves
//! one `network.decision` line with `"count": 3000`, not 3,000 lines.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// Most distinct (protocol, host, port, decision, reason) records kept; the
/// decisions beyond are counted in one overflow record per decision and
/// reason (`"host": "*"`, `"overflow": true`).
pub const MAX_DISTINCT_DECISIONS: usize = 512;

/// Longest host name kept in a record (a DNS name is at most 253 bytes;
/// anything longer is a client's garbage and is cut).
const MAX_HOST: usize = 255;

type Key = (String, String, String, String, String);

/// Folds decision records (`network.decision` fields: protocol, host, port,
/// decision, reason, address, bytes_up, bytes_down, duration_ms) into one
/// record per (protocol, host, port, decision, reason), with `count`,
/// `first_time` and `last_time`; bytes and duration are totals, `address`
/// the last one connected to. First-seen order is kept.
#[derive(Debug, Default)]
pub struct DecisionAggregator {
    records: Vec<Map<String, Value>>,
    index: HashMap<Key, usize>,
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn add_u64(map: &mut Map<String, Value>, key: &str, more: Option<&Value>) {
    let more = more.and_then(Value::as_u64).unwrap_or(0);
    let sum = map
        .get(key)
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .saturating_add(more);
    map.insert(key.into(), Value::from(sum));
}

impl DecisionAggregator {
    pub fn new() -> DecisionAggregator {
        DecisionAggregator::default()
    }

    /// Adds one decision (a JSON object; anything else is ignored) made at
    /// `time` (RFC 3339).
    pub fn add(&mut self, record: Value, time: &str) {
        let Value::Object(mut fields) = record else {
            return;
        };
        if let Some(Value::String(host)) = fields.get_mut("host") {
            if host.len() > MAX_HOST {
                let mut end = MAX_HOST;
                while !host.is_char_boundary(end) {
                    end -= 1;
                }
                host.truncate(end);
            }
        }
        let mut key: Key = (
            text(fields.get("protocol")),
            text(fields.get("host")),
            text(fields.get("port")),
            text(fields.get("decision")),
            text(fields.get("reason")),
        );
        if !self.index.contains_key(&key) && self.index.len() >= MAX_DISTINCT_DECISIONS {
            // Too many distinct targets: fold into one record per decision
            // and reason, so memory and the log stay bounded.
            key.0 = "*".into();
            key.1 = "*".into();
            key.2 = String::new();
            fields.insert("protocol".into(), Value::from("*"));
            fields.insert("host".into(), Value::from("*"));
            fields.insert("port".into(), Value::Null);
            fields.insert("address".into(), Value::Null);
            fields.insert("overflow".into(), Value::Bool(true));
        }
        match self.index.get(&key) {
            Some(&i) => {
                let rec = &mut self.records[i];
                add_u64(rec, "count", Some(&Value::from(1u64)));
                add_u64(rec, "bytes_up", fields.get("bytes_up"));
                add_u64(rec, "bytes_down", fields.get("bytes_down"));
                add_u64(rec, "duration_ms", fields.get("duration_ms"));
                if let Some(a) = fields.get("address").filter(|a| !a.is_null()) {
                    rec.insert("address".into(), a.clone());
                }
                rec.insert("last_time".into(), Value::from(time));
            }
            None => {
                fields.insert("count".into(), Value::from(1u64));
                fields.insert("first_time".into(), Value::from(time));
                fields.insert("last_time".into(), Value::from(time));
                self.index.insert(key, self.records.len());
                self.records.push(fields);
            }
        }
    }

    /// The folded records, in the order each was first seen.
    pub fn records(&self) -> Vec<Value> {
        self.records.iter().cloned().map(Value::Object).collect()
    }

    /// How many decisions were added in all.
    pub fn total(&self) -> u64 {
        self.records
            .iter()
            .filter_map(|r| r.get("count").and_then(Value::as_u64))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deny(host: &str, port: u16) -> Value {
        json!({"protocol": "socks5", "host": host, "port": port, "decision": "deny",
               "reason": "not_allowed", "address": null, "bytes_up": 0, "bytes_down": 0, "duration_ms": 1})
    }

    #[test]
    fn repeated_decisions_fold_into_one_record() {
        let mut agg = DecisionAggregator::new();
        for i in 0..3000 {
            agg.add(deny("blocked.invalid", 443), &format!("t{i}"));
        }
        agg.add(deny("blocked.invalid", 80), "t-other");
        let recs = agg.records();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0]["count"], 3000);
        assert_eq!(recs[0]["first_time"], "t0");
        assert_eq!(recs[0]["last_time"], "t2999");
        assert_eq!(recs[0]["duration_ms"], 3000);
        assert_eq!(recs[1]["port"], 80);
        assert_eq!(recs[1]["count"], 1);
        assert_eq!(agg.total(), 3001);
    }

    #[test]
    fn distinct_targets_are_bounded() {
        let mut agg = DecisionAggregator::new();
        for i in 0..(MAX_DISTINCT_DECISIONS as u32 + 5000) {
            agg.add(deny(&format!("h{i}.invalid"), 443), "t");
        }
        let recs = agg.records();
        assert_eq!(recs.len(), MAX_DISTINCT_DECISIONS + 1);
        let overflow = &recs[MAX_DISTINCT_DECISIONS];
        assert_eq!(overflow["host"], "*");
        assert_eq!(overflow["overflow"], true);
        assert_eq!(overflow["count"], 5000);
        assert_eq!(agg.total(), MAX_DISTINCT_DECISIONS as u64 + 5000);
    }

    #[test]
    fn allowed_bytes_are_totals_and_hosts_are_cut() {
        let mut agg = DecisionAggregator::new();
        let long = "a".repeat(10_000);
        for _ in 0..2 {
            agg.add(
                json!({"protocol": "connect", "host": long, "port": 443, "decision": "allow",
                       "reason": null, "address": "10.0.0.1:443", "bytes_up": 10, "bytes_down": 20, "duration_ms": 5}),
                "t",
            );
        }
        let recs = agg.records();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0]["bytes_up"], 20);
        assert_eq!(recs[0]["bytes_down"], 40);
        assert_eq!(recs[0]["host"].as_str().map(str::len), Some(MAX_HOST));
    }
}
