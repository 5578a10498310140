//! Resource limits of one run (`--memory`, `--pids`, `--cpu-time`,
//! `--file-size`, `--open-files`, `--tmp-size`, `--output-limit`) and the
//! parsing of their sizes. Which kernel mechanism enforces each limit is a
//! host fact, decided by the Linux backend when the run starts.

use serde::{Deserialize, Serialize};

/// A size moat does not understand.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "invalid size {0:?}: use bytes or a number with K, M, G or T (powers of 1024), e.g. 512M or 2G"
)]
pub struct SizeError(pub String);

/// A count moat does not understand.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid count {0:?}: use a whole number above zero, e.g. 256")]
pub struct CountError(pub String);

/// Parses `512M`, `2G`, `1.5G`, `4096` (bytes) into bytes; suffixes are
/// powers of 1024 (an optional trailing `B`/`iB` is accepted). Zero is
/// refused: a limit of nothing is a mistake, not a policy.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let err = || SizeError(s.to_string());
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, scale) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        Some('T' | 't') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n = num.trim();
    if n.is_empty() || !n.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(err());
    }
    let v: f64 = n.parse().map_err(|_| err())?;
    let bytes = (v * scale as f64).round();
    if !(1.0..=9.0e18).contains(&bytes) {
        return Err(err());
    }
    Ok(bytes as u64)
}

/// Parses a positive whole number (`--pids`, `--open-files`).
pub fn parse_count(s: &str) -> Result<u64, CountError> {
    match s.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(CountError(s.to_string())),
    }
}

/// What to do with a limit this host cannot enforce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LimitsMode {
    /// Refuse the run (exit 125) naming the limit and what is missing.
    #[default]
    Strict,
    /// Run anyway; the result says the limit was not enforced.
    BestEffort,
}

impl LimitsMode {
    pub fn parse(s: &str) -> Option<LimitsMode> {
        match s {
            "strict" => Some(LimitsMode::Strict),
            "best-effort" => Some(LimitsMode::BestEffort),
            _ => None,
        }
    }
}

/// The resource limits of one run. Sizes are bytes, times milliseconds;
/// `None` is "no limit from moat" (the host's own limits still apply).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Memory of the whole run (cgroup), else virtual memory per process (RLIMIT_AS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// Processes and threads of the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// CPU time per process (RLIMIT_CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_time_ms: Option<u64>,
    /// Largest file a process may write (RLIMIT_FSIZE).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_size: Option<u64>,
    /// Open file descriptors per process (RLIMIT_NOFILE).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
    /// Size of each of the sandbox's private tmpfs (/tmp, HOME, /dev/shm).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tmp_size: Option<u64>,
    /// stdout + stderr bytes before moat stops the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<u64>,
    pub mode: LimitsMode,
    /// Limits that are best-effort whatever the mode: they came from a
    /// profile's or moat's defaults, not from the user.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub best_effort: Vec<String>,
}

impl Limits {
    /// No limit is set.
    pub fn is_unset(&self) -> bool {
        self.memory.is_none()
            && self.pids.is_none()
            && self.cpu_time_ms.is_none()
            && self.file_size.is_none()
            && self.open_files.is_none()
            && self.tmp_size.is_none()
            && self.output.is_none()
    }

    /// Each limit by its name (`memory`, `pids`, `cpu_time`, `file_size`,
    /// `open_files`, `tmp_size`, `output`), for walking them all.
    pub fn by_name(&self) -> [(&'static str, Option<u64>); 7] {
        [
            ("memory", self.memory),
            ("pids", self.pids),
            ("cpu_time", self.cpu_time_ms),
            ("file_size", self.file_size),
            ("open_files", self.open_files),
            ("tmp_size", self.tmp_size),
            ("output", self.output),
        ]
    }

    /// Sets the limit named `name` (see [`Limits::by_name`]).
    pub fn set(&mut self, name: &str, value: Option<u64>) {
        match name {
            "memory" => self.memory = value,
            "pids" => self.pids = value,
            "cpu_time" => self.cpu_time_ms = value,
            "file_size" => self.file_size = value,
            "open_files" => self.open_files = value,
            "tmp_size" => self.tmp_size = value,
            _ => self.output = value,
        }
    }

    /// These limits, each at most `outer`'s (a nested run gets no more than
    /// the run it was started from; it is counted on its own, though, not
    /// inside the outer run's budget). Strict if either is strict.
    pub fn bounded_by(&self, outer: &Limits) -> Limits {
        let mut out = self.clone();
        for ((name, mine), (_, theirs)) in self.by_name().into_iter().zip(outer.by_name()) {
            if let Some(t) = theirs {
                out.set(name, Some(mine.map_or(t, |m| m.min(t))));
                if mine.is_none() && outer.best_effort.iter().any(|b| b == name) {
                    out.best_effort.push(name.to_string());
                }
            }
        }
        if outer.mode == LimitsMode::Strict {
            out.mode = LimitsMode::Strict;
        }
        out
    }

    /// `over`'s limits where set, else these (a later layer wins per limit).
    pub fn merged(&self, over: &Limits) -> Limits {
        Limits {
            memory: over.memory.or(self.memory),
            pids: over.pids.or(self.pids),
            cpu_time_ms: over.cpu_time_ms.or(self.cpu_time_ms),
            file_size: over.file_size.or(self.file_size),
            open_files: over.open_files.or(self.open_files),
            tmp_size: over.tmp_size.or(self.tmp_size),
            output: over.output.or(self.output),
            mode: over.mode,
            best_effort: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_powers_of_1024() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        for bad in ["", "0", "G", "-1M", "2X", "1e9"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn counts_are_positive_integers() {
        assert_eq!(parse_count("256"), Ok(256));
        for bad in ["0", "-1", "1.5", "x", ""] {
            assert!(parse_count(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_nested_run_gets_at_most_the_outer_limits() {
        let outer = Limits {
            pids: Some(64),
            memory: Some(1 << 30),
            ..Default::default()
        };
        let inner = Limits {
            pids: Some(1000),
            memory: Some(1 << 20),
            mode: LimitsMode::BestEffort,
            ..Default::default()
        };
        let b = inner.bounded_by(&outer);
        assert_eq!(b.pids, Some(64));
        assert_eq!(b.memory, Some(1 << 20));
        assert_eq!(b.mode, LimitsMode::Strict);
        assert_eq!(Limits::default().bounded_by(&outer).pids, Some(64));
    }

    #[test]
    fn a_later_layer_wins_per_limit() {
        let base = Limits {
            pids: Some(1024),
            tmp_size: Some(1 << 30),
            ..Default::default()
        };
        let over = Limits {
            pids: Some(64),
            ..Default::default()
        };
        let m = base.merged(&over);
        assert_eq!(m.pids, Some(64));
        assert_eq!(m.tmp_size, Some(1 << 30));
    }
}
