//! Policy and CLI surface family: --json result object, explain-policy and
//! its hash, capabilities, version, policy conflicts.

use serde_json::Value;

use moat_conformance::*;

fn is_bool_or_str(v: &Value) -> bool {
    v.is_boolean() || v.is_string() || v.is_object()
}

fn check_result_shape(j: &Value, out: &Out) {
    let d = out.dump();
    for k in [
        "execution_id",
        "exit_code",
        "signal",
        "timed_out",
        "status",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
        "duration_ms",
        "sandbox",
        "network",
        "policy_hash",
    ] {
        assert!(j.get(k).is_some(), "--json object lacks {k:?}\n{d}");
    }
    assert!(
        j["execution_id"].as_str().is_some_and(|s| !s.is_empty()),
        "execution_id\n{d}"
    );
    assert!(j["timed_out"].is_boolean(), "timed_out type\n{d}");
    assert!(
        j["stdout"].is_string() && j["stderr"].is_string(),
        "stdout/stderr type\n{d}"
    );
    assert!(
        j["stdout_truncated"].is_boolean() && j["stderr_truncated"].is_boolean(),
        "truncated type\n{d}"
    );
    assert!(
        j["duration_ms"].is_u64() || j["duration_ms"].is_f64(),
        "duration_ms type\n{d}"
    );
    assert!(
        j["sandbox"]["enforced"].is_boolean(),
        "sandbox.enforced\n{d}"
    );
    assert!(j["sandbox"]["level"].is_string(), "sandbox.level\n{d}");
    for l in ["namespaces", "landlock", "seccomp"] {
        assert!(
            is_bool_or_str(&j["sandbox"]["layers"][l]),
            "sandbox.layers.{l}\n{d}"
        );
    }
    assert!(j["network"]["mode"].is_string(), "network.mode\n{d}");
    assert!(
        j["policy_hash"]
            .as_str()
            .is_some_and(|h| h.starts_with("sha256:") && h.len() == 71),
        "policy_hash format\n{d}"
    );
}

#[test]
fn json_result_object() {
    let fx = Fixture::new();
    let out = run(fx.sh(
        "workspace-write",
        &["--json"],
        "echo out-line; echo err-line >&2; exit 3",
    ));
    out.expect_code(3);
    let j = out.json();
    check_result_shape(&j, &out);
    let d = out.dump();
    assert_eq!(j["exit_code"], 3, "{d}");
    assert!(j["signal"].is_null(), "{d}");
    assert_eq!(j["timed_out"], false, "{d}");
    assert_eq!(j["status"], "finished", "{d}");
    assert_eq!(j["stdout"], "out-line\n", "{d}");
    assert_eq!(j["stderr"], "err-line\n", "{d}");
    assert_eq!(j["sandbox"]["enforced"], true, "{d}");
    assert_eq!(j["sandbox"]["level"], "workspace-write", "{d}");
    assert_eq!(j["network"]["mode"], "disabled", "{d}");
    for l in ["namespaces", "landlock", "seccomp"] {
        let v = &j["sandbox"]["layers"][l];
        assert!(
            v != &Value::Bool(false) && v != "none",
            "layer {l} reported off on a host that has it: {v}\n{d}"
        );
    }
}

#[test]
fn json_levels_and_network_modes() {
    let fx = Fixture::new();
    for level in ALL_LEVELS {
        let out = run(fx.sh(level, &["--json"], "true"));
        out.expect_code(0);
        let j = out.json();
        check_result_shape(&j, &out);
        assert_eq!(j["sandbox"]["level"], level, "{}", out.dump());
        assert_eq!(
            j["sandbox"]["enforced"],
            level != "danger-full-access",
            "{}",
            out.dump()
        );
    }
    let out = run(fx.sh("read-only", &["--json", "--network", "unmanaged"], "true"));
    assert_eq!(out.json()["network"]["mode"], "unmanaged", "{}", out.dump());
}

#[test]
fn json_signal_and_failed_to_start() {
    let fx = Fixture::new();
    let out = run(fx.sh("read-only", &["--json"], "kill -9 $$"));
    out.expect_code(137);
    let j = out.json();
    check_result_shape(&j, &out);
    let s = &j["signal"];
    assert!(
        s == 9 || s == "SIGKILL" || s == "KILL",
        "signal should name SIGKILL: {s}\n{}",
        out.dump()
    );
    assert_eq!(j["status"], "finished", "{}", out.dump());

    let out = run(fx.moat(["exec", "--json", "--", "/nonexistent/moat-no-such-program"]));
    out.expect_code(127);
    let j = out.json();
    assert_eq!(j["status"], "failed_to_start", "{}", out.dump());
    assert_eq!(j["timed_out"], false, "{}", out.dump());
}

#[test]
fn json_captures_large_output() {
    let fx = Fixture::new();
    let out = run(fx.sh(
        "read-only",
        &["--json"],
        "head -c 300000 /dev/zero | tr '\\0' a; echo; echo done >&2",
    ));
    out.expect_code(0);
    let j = out.json();
    check_result_shape(&j, &out);
    let so = j["stdout"].as_str().unwrap();
    assert!(
        so.len() > 1000 && so.starts_with("aaaa"),
        "stdout not captured"
    );
    if j["stdout_truncated"] == false {
        assert_eq!(
            so.len(),
            300001,
            "stdout lost bytes without saying truncated"
        );
    }
    assert_eq!(j["stderr"], "done\n");
}

#[test]
fn explain_policy_hash_matches_exec_json() {
    let fx = Fixture::new();
    let extra = fx.root.join("extra");
    std::fs::create_dir_all(&extra).unwrap();
    let e = extra.to_str().unwrap();
    let variants: Vec<Vec<&str>> = vec![
        vec![],
        vec!["--policy", "workspace-write"],
        vec![
            "--policy",
            "workspace-contained",
            "--network",
            "disabled",
            "--ro",
            e,
        ],
        vec![
            "--policy",
            "workspace-write",
            "--rw",
            e,
            "--env",
            "A=b",
            "--timeout",
            "5s",
        ],
        vec!["--policy", "danger-full-access", "--network", "unmanaged"],
    ];
    let mut hashes = Vec::new();
    for v in &variants {
        let mut a = vec!["explain-policy"];
        a.extend(v);
        let ex = run(fx.moat(&a));
        ex.expect_code(0);
        let ej = ex.json();
        assert!(
            ej["policy"].is_object(),
            "explain-policy lacks policy object\n{}",
            ex.dump()
        );
        let h1 = ej["policy_hash"]
            .as_str()
            .unwrap_or_else(|| panic!("no policy_hash\n{}", ex.dump()))
            .to_string();
        assert!(h1.starts_with("sha256:"), "{}", ex.dump());
        // Stable across invocations.
        let ex2 = run(fx.moat(&a));
        assert_eq!(ex2.json()["policy_hash"], h1.as_str(), "hash not stable");
        let mut b = vec!["exec"];
        b.extend(v);
        b.extend(["--json", "--", "true"]);
        let r = run(fx.moat(&b));
        r.expect_code(0);
        assert_eq!(
            r.json()["policy_hash"],
            h1.as_str(),
            "exec --json policy_hash differs from explain-policy for {v:?}\n{}",
            r.dump()
        );
        hashes.push(h1);
    }
    let mut uniq = hashes.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(
        uniq.len(),
        hashes.len(),
        "different policies share a hash: {hashes:?}"
    );
}

#[test]
fn explain_policy_defaults_are_canonical() {
    let fx = Fixture::new();
    let a = run(fx.moat(["explain-policy"]));
    let b = run(fx.moat([
        "explain-policy",
        "--policy",
        "read-only",
        "--network",
        "disabled",
    ]));
    a.expect_code(0);
    b.expect_code(0);
    assert_eq!(
        a.json()["policy_hash"],
        b.json()["policy_hash"],
        "defaults should canonicalize to explicit read-only/disabled\n{}\n{}",
        a.dump(),
        b.dump()
    );
    // The hash is of the policy, not a constant: another level, another
    // network mode and an extra path each change it.
    let c = run(fx.moat(["explain-policy", "--policy", "workspace-write"]));
    let d = run(fx.moat(["explain-policy", "--network", "unmanaged"]));
    let e = run(fx.moat(["explain-policy", "--ro", fx.outside.to_str().unwrap()]));
    let mut hashes = vec![a.json()["policy_hash"].to_string()];
    for o in [&c, &d, &e] {
        o.expect_code(0);
        hashes.push(o.json()["policy_hash"].to_string());
    }
    let mut uniq = hashes.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(
        uniq.len(),
        hashes.len(),
        "different policies share a hash: {hashes:?}"
    );
}

#[test]
fn capabilities_json() {
    let fx = Fixture::new();
    let out = run(fx.moat(["capabilities"]));
    out.expect_code(0);
    let j = out.json();
    for k in [
        "platform",
        "sandbox_levels",
        "network_modes",
        "features",
        "capability_probes",
    ] {
        assert!(j.get(k).is_some(), "capabilities lacks {k}\n{}", out.dump());
    }
    for l in ALL_LEVELS {
        assert_eq!(
            j["sandbox_levels"][l],
            "supported",
            "level {l} should be supported on this host\n{}",
            out.dump()
        );
    }
    let modes = j["network_modes"].to_string();
    assert!(
        modes.contains("disabled") && modes.contains("unmanaged"),
        "{}",
        out.dump()
    );
}

#[test]
fn version_json() {
    let fx = Fixture::new();
    let out = run(fx.moat(["version", "--json"]));
    out.expect_code(0);
    let j = out.json();
    assert!(
        j["version"].as_str().is_some_and(|v| !v.is_empty()),
        "{}",
        out.dump()
    );
    assert!(
        !j["protocol_version"].is_null() && !j["policy_version"].is_null(),
        "{}",
        out.dump()
    );
    let plain = run(fx.moat(["version"]));
    plain.expect_code(0);
    assert!(
        plain.stdout.contains(j["version"].as_str().unwrap()),
        "{}",
        plain.dump()
    );
}

#[test]
fn conflicting_ro_rw_same_target_is_refused() {
    let fx = Fixture::new();
    let x = fx.root.join("conflict-dir");
    std::fs::create_dir_all(&x).unwrap();
    let xs = x.to_str().unwrap();
    let marker = unique("ran");
    let out = run(fx.sh(
        "workspace-write",
        &["--ro", xs, "--rw", xs],
        &format!("touch {marker}"),
    ));
    out.expect_code(125);
    assert!(
        out.stderr.contains(xs),
        "error should name the path\n{}",
        out.dump()
    );
    assert!(
        out.stderr.contains("--ro") && out.stderr.contains("--rw"),
        "{}",
        out.dump()
    );
    assert!(
        out.stderr.contains("rw"),
        "error should name both sources (ro and rw)\n{}",
        out.dump()
    );
    assert!(!exists(fx.w(&marker)), "command ran despite refusal");
    let ex = run(fx.moat(["explain-policy", "--ro", xs, "--rw", xs]));
    ex.expect_code(125);
}

#[test]
fn nonexistent_ro_rw_path_is_refused() {
    let fx = Fixture::new();
    let missing = fx.root.join("does-not-exist");
    let marker = unique("ran");
    for flag in ["--ro", "--rw"] {
        let out = run(fx.sh(
            "workspace-write",
            &[flag, missing.to_str().unwrap()],
            &format!("touch {marker}"),
        ));
        out.expect_code(125);
        assert!(
            out.stderr.contains("does-not-exist"),
            "error should name the path\n{}",
            out.dump()
        );
        assert!(!exists(fx.w(&marker)), "command ran despite refusal");
    }
}

#[test]
fn invalid_flags_are_refused() {
    let fx = Fixture::new();
    let marker = fx.w("invalid-flag-command-ran");
    let m = marker.to_str().unwrap();
    for (args, named) in [
        (vec!["exec", "--policy", "bogus-level"], "bogus-level"),
        (vec!["exec", "--network", "bogus"], "bogus"),
        (vec!["exec", "--timeout", "soon"], "soon"),
        (vec!["exec", "--env", "NOEQUALS"], "NOEQUALS"),
    ] {
        let mut a = args.clone();
        a.extend(["--", "/usr/bin/touch", m]);
        let out = run(fx.moat(&a));
        // 125 = moat refused; a usage error must not look like the command's exit 2.
        out.expect_code(125);
        assert!(
            !exists(&marker),
            "{args:?}: refused, yet the command ran\n{}",
            out.dump()
        );
        assert!(
            out.stderr.contains(named),
            "refusal should name the bad value {named:?}\n{}",
            out.dump()
        );
    }
}

/// This host has every layer in full (Landlock ABI >= 6): each sandboxed
/// level, with a file among the grants and the proxy, must say "full" —
/// "partial" would mean a rule was silently narrowed or dropped.
#[test]
fn every_layer_is_full_at_every_sandboxed_level() {
    let fx = Fixture::new();
    let file = fx.root.join("granted-file");
    std::fs::write(&file, "x").unwrap();
    let f = file.to_str().unwrap().to_string();
    for level in ["read-only", "workspace-write", "workspace-contained"] {
        for extra in [vec![], vec!["--ro", f.as_str()], vec!["--network", "proxy"]] {
            let mut flags = vec!["--json"];
            flags.extend(extra.iter().copied());
            let out = run(fx.sh(level, &flags, "true"));
            out.expect_code(0);
            let j = out.json();
            for l in ["namespaces", "landlock", "seccomp"] {
                assert_eq!(
                    j["sandbox"]["layers"][l],
                    "full",
                    "{level} {extra:?}: layer {l}\n{}",
                    out.dump()
                );
            }
        }
    }
}
