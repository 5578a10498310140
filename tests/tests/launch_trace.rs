//! The opt-in launch timing trace (`MOAT_TRACE_TIMING=1`): each launch step
//! on stderr with its duration, from the supervisor, the init and the
//! command's process alike; nothing of it without the variable.

use moat_conformance::*;

/// Parses `moat-timing: PID STEP +DELTA (TOTAL)` lines into (step, delta, total).
fn trace_lines(stderr: &str) -> Vec<(String, u64, u64)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("moat-timing: "))
        .filter_map(|rest| {
            let (_pid, rest) = rest.split_once(' ')?;
            let (step, nums) = rest.rsplit_once(" +")?;
            let (delta, total) = nums.split_once(" (")?;
            Some((
                step.to_string(),
                delta.parse().ok()?,
                total.trim_end_matches(')').parse().ok()?,
            ))
        })
        .collect()
}

#[test]
fn the_trace_names_every_launch_step_when_asked_contract() {
    let fx = Fixture::new();
    for level in ["workspace-contained", "read-only"] {
        let mut cmd = fx.sh(level, &[], "echo TRACE_RAN");
        cmd.env("MOAT_TRACE_TIMING", "1");
        let out = run(cmd);
        out.expect_code(0).expect_stdout_has("TRACE_RAN");
        let steps = trace_lines(&out.stderr);
        let names: Vec<&str> = steps.iter().map(|(s, _, _)| s.as_str()).collect();
        // The host side, the init inside the namespaces, and the command's
        // own process before exec each report.
        for want in [
            "start",
            "parse arguments",
            "probe the host",
            "plan",
            "clone the init (new namespaces)",
            "init: mounts (the view)",
            "command: Landlock",
            "command: seccomp",
            "supervise until the init is gone",
            "sweep",
            "report",
        ] {
            assert!(
                names.contains(&want),
                "{level}: no step {want:?}\n{}",
                out.dump()
            );
        }
        // Totals are from one clock: the last step's is the largest.
        let last = steps.last().map(|s| s.2).unwrap_or(0);
        assert!(steps.iter().all(|s| s.2 <= last), "{level}: {steps:?}");
    }
}

#[test]
fn no_trace_without_the_variable_contract() {
    let fx = Fixture::new();
    let out = run(fx.sh("workspace-contained", &[], "echo QUIET_RAN"));
    out.expect_code(0).expect_stdout_has("QUIET_RAN");
    out.expect_absent("moat-timing:", "a timing line without MOAT_TRACE_TIMING");
    let mut cmd = fx.sh("workspace-contained", &[], "echo ZERO_RAN");
    cmd.env("MOAT_TRACE_TIMING", "0");
    let out = run(cmd);
    out.expect_code(0).expect_stdout_has("ZERO_RAN");
    out.expect_absent("moat-timing:", "a timing line with MOAT_TRACE_TIMING=0");
}
