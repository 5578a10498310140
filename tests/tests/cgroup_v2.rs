//! The cgroup v2 mechanism as this host reports and uses it. `moat
//! capabilities` must say, under `limits.cgroup_v2_delegated`, whether moat's
//! own v2 cgroup can give per-run leaves and, when not, why and what to run
//! instead; a run's limits must use what it says. On this project's hybrid
//! test machine the v2 hierarchy has no `memory`/`pids` (bound to v1), so
//! the file-level protocol itself is unit-tested in `moat-linux`
//! (`limits::tests::v2_*`, against a simulated cgroupfs); here the report
//! and the choice are checked end to end on whatever host runs the suite.

use moat_conformance::*;
use serde_json::Value;

fn limits_caps(fx: &Fixture) -> Value {
    let out = run(fx.moat(["capabilities"]));
    out.expect_code(0);
    out.json()["limits"].clone()
}

const FIX: &str = "systemd-run --user --scope -p Delegate=yes moat";

#[test]
fn capabilities_say_whether_a_delegated_cgroup_v2_is_used_and_why_not() {
    let fx = Fixture::new();
    let caps = limits_caps(&fx);
    let v2 = &caps["cgroup_v2_delegated"];
    assert!(v2.is_object(), "no cgroup_v2_delegated: {caps:#}");
    if v2["dir"].is_null() {
        let why = v2["detail"].as_str().unwrap_or_default();
        assert!(!why.is_empty(), "no reason given: {v2:#}");
        // Every reason but "no cgroup2 at all / not in one" names the fix.
        if !why.starts_with("no cgroup2") && !why.starts_with("moat is in no cgroup v2") {
            assert!(why.contains(FIX), "{why}");
        }
        for limit in ["memory", "pids"] {
            assert_ne!(
                caps["sandboxed"][limit]["mechanism"], "cgroup_v2",
                "{caps:#}"
            );
        }
        return;
    }
    for limit in ["memory", "pids"] {
        let state = v2[limit].as_str().unwrap_or_default();
        let mech = &caps["sandboxed"][limit]["mechanism"];
        if state == "usable" {
            assert_eq!(mech, "cgroup_v2", "{limit}: {caps:#}");
        } else {
            assert!(state.contains(FIX), "{limit}: {state}");
            assert_ne!(mech, "cgroup_v2", "{limit}: {caps:#}");
        }
    }
}

/// A run under `--memory` and `--pids` uses the mechanisms the report names,
/// and when that is not cgroup v2, moat neither moves itself nor leaves
/// anything in its v2 cgroup (on a hybrid host, the v2 root).
#[test]
fn a_limited_run_uses_the_reported_mechanism_and_leaves_no_v2_leaf() {
    let fx = Fixture::new();
    let caps = limits_caps(&fx);
    let v2_dir = caps["cgroup_v2_delegated"]["dir"]
        .as_str()
        .map(std::path::PathBuf::from);
    let before: Vec<String> = v2_dir
        .as_ref()
        .and_then(|d| std::fs::read_dir(d).ok())
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("moat-"))
                .collect()
        })
        .unwrap_or_default();
    let out = run(fx.sh(
        "workspace-write",
        &[
            "--json",
            "--memory",
            "512M",
            "--pids",
            "128",
            "--limits",
            "best-effort",
        ],
        "echo LIMITED-RAN",
    ));
    let v = out.json();
    assert!(
        v["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("LIMITED-RAN"),
        "{}",
        out.dump()
    );
    for limit in ["memory", "pids"] {
        let used = v["limits"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["limit"] == limit))
            .map(|x| x["mechanism"].clone())
            .unwrap_or(Value::Null);
        assert_eq!(
            used,
            caps["sandboxed"][limit]["mechanism"],
            "{limit}\n{}",
            out.dump()
        );
    }
    let uses_v2 = ["memory", "pids"]
        .iter()
        .any(|l| caps["sandboxed"][*l]["mechanism"] == "cgroup_v2");
    if let (false, Some(d)) = (uses_v2, &v2_dir) {
        let after: Vec<String> = std::fs::read_dir(d)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("moat-"))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(before, after, "moat touched its v2 cgroup {}", d.display());
    }
    // The run's own leaf is gone, wherever it was.
    let id = v["execution_id"].as_str().unwrap_or_default();
    let leftover = std::process::Command::new("find")
        .args(["/sys/fs/cgroup", "-name", &format!("moat-{id}")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(leftover.trim().is_empty(), "cgroup left behind: {leftover}");
}
