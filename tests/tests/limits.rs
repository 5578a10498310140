//! Resource limits: a fork bomb, a large allocation, a flood of output, a
//! filled /tmp, a CPU hog and an oversized file each end the way the limit
//! says, with `termination_reason` naming it; what cannot be enforced on the
//! host is refused unless `--limits best-effort`.
//!
//! The mechanism differs by user and host (a per-run cgroup v1 as root on a
//! v1 host, rlimits otherwise); each test reads which one this host gives
//! from `moat capabilities` and asserts the behaviour of that mechanism.

use std::sync::OnceLock;
use std::time::Duration;

use moat_conformance::*;
use serde_json::Value;

/// `moat capabilities`'s `limits` section (probed once per test binary).
fn limit_caps() -> &'static Value {
    static CAPS: OnceLock<Value> = OnceLock::new();
    CAPS.get_or_init(|| {
        let fx = Fixture::new();
        let out = run(fx.moat(["capabilities"]));
        out.expect_code(0);
        out.json()["limits"].clone()
    })
}

/// The mechanism sandboxed runs get for `limit` here, or None.
fn mechanism(limit: &str) -> Option<String> {
    limit_caps()["sandboxed"][limit]["mechanism"]
        .as_str()
        .map(str::to_string)
}

fn json_run(fx: &Fixture, level: &str, extra: &[&str], script: &str) -> (Out, Value) {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let out = run(fx.sh(level, &args, script));
    let v = out.json();
    (out, v)
}

fn reason(v: &Value) -> &str {
    v["termination_reason"].as_str().unwrap_or("<none>")
}

fn applied<'a>(v: &'a Value, limit: &str) -> &'a Value {
    v["limits"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["limit"] == limit))
        .unwrap_or(&Value::Null)
}

#[test]
fn fork_bomb_under_pids_ends_with_pids_and_host_keeps_answering() {
    let fx = Fixture::new();
    let Some(mech) = mechanism("pids") else {
        // Refused, not run unbounded (the contract test covers the message).
        let out = run(fx.sh("workspace-write", &["--pids", "64"], "echo RAN"));
        out.expect_code(125)
            .expect_absent("RAN", "a refused run's output");
        return;
    };
    // A bounded bomb (2^9 - 1 sleeping processes) so a moat that limits nothing
    // fails this test instead of taking the machine down. Each process
    // records that it started; with --pids 64 at most 64 can exist at once,
    // and none exits before the run ends.
    let log = fx.w("started");
    let script = format!(
        "echo BOMB-START; f() {{ echo x >> {log}; if [ $1 -lt 8 ]; then f $(($1+1)) & f $(($1+1)) & fi; sleep 30; }}; f 0; wait",
        log = log.display()
    );
    let cmd = fx.sh(
        "workspace-write",
        &["--json", "--pids", "64", "--timeout", "80s"],
        &script,
    );
    let mut running = spawn(cmd);
    // The host-side probe: fork+exec keeps working while the bomb runs.
    let (mut answered, mut failed) = (0u32, 0u32);
    while !running.finished() {
        match std::process::Command::new("/bin/true").status() {
            Ok(s) if s.success() => answered += 1,
            _ => failed += 1,
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = running.wait();
    let v = out.json();
    assert!(out.stdout.contains("BOMB-START"), "{}", out.dump());
    assert_eq!(reason(&v), "pids", "{}", out.dump());
    assert_eq!(
        applied(&v, "pids")["mechanism"],
        mech.as_str(),
        "{}",
        out.dump()
    );
    assert_eq!(applied(&v, "pids")["enforced"], true);
    let started = read(&log).unwrap_or_default().lines().count();
    assert!(
        (1..=64).contains(&started),
        "{started} bomb processes started under --pids 64\n{}",
        out.dump()
    );
    assert_eq!(failed, 0, "host-side probe failed while the bomb ran");
    assert!(answered > 0, "host-side probe never ran");
    // The run's cgroup is gone (v1 hierarchies and the v2 one alike).
    let id = v["execution_id"].as_str().unwrap_or_default();
    let leftover = std::process::Command::new("find")
        .args(["/sys/fs/cgroup", "-name", &format!("moat-{id}")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(leftover.trim().is_empty(), "cgroup left behind: {leftover}");
}

#[test]
fn allocation_over_memory_limit_is_stopped() {
    let fx = Fixture::new();
    let code =
        "print('ALLOC-START', flush=True)\ns = b'x' * (2 << 30)\nprint('ALLOCATED', flush=True)";
    let out = run(fx.py(
        "workspace-write",
        &["--json", "--memory", "256M", "--timeout", "80s"],
        code,
        &[],
    ));
    let v = out.json();
    let stdout = v["stdout"].as_str().unwrap_or_default();
    assert!(stdout.contains("ALLOC-START"), "{}", out.dump());
    assert!(
        !stdout.contains("ALLOCATED"),
        "2 GiB allocated under --memory 256M\n{}",
        out.dump()
    );
    let mech = mechanism("memory").unwrap_or_default();
    assert_eq!(applied(&v, "memory")["mechanism"], mech.as_str());
    match mech.as_str() {
        // The cgroup's OOM killer ended it, and moat says so.
        "cgroup_v1" | "cgroup_v2" => {
            assert_eq!(reason(&v), "memory", "{}", out.dump());
            assert_eq!(v["signal"], 9, "{}", out.dump());
            let peak = v["resource_usage"]["max_rss_bytes"].as_u64().unwrap_or(0);
            assert!(peak <= 300 << 20, "peak RSS {peak} above the limit");
        }
        // RLIMIT_AS: the allocation itself fails (ENOMEM → MemoryError); the
        // command decides how to end, so the reason is its exit.
        "rlimit_as" => {
            assert!(
                v["stderr"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("MemoryError"),
                "{}",
                out.dump()
            );
            assert_eq!(reason(&v), "exit", "{}", out.dump());
        }
        other => panic!("unexpected memory mechanism {other:?}\n{}", out.dump()),
    }
}

/// `yes` is bounded to 16 MiB by `head`, far past every limit here: against
/// a moat that enforces nothing the case fails on the byte count instead of
/// filling the test's memory.
#[test]
fn yes_under_output_limit_ends_with_output() {
    let fx = Fixture::new();
    let log = fx.w("audit.jsonl");
    let (out, v) = json_run(
        &fx,
        "read-only",
        &["--output-limit", "64K", "--timeout", "80s"],
        "echo OUT-START; yes | head -c 16777216",
    );
    assert_eq!(reason(&v), "output", "{}", out.dump());
    let stdout = v["stdout"].as_str().unwrap_or_default();
    assert!(stdout.starts_with("OUT-START\n"), "{}", out.dump());
    assert_eq!(
        stdout.len(),
        64 << 10,
        "bytes passed under --output-limit 64K"
    );
    assert_eq!(applied(&v, "output")["mechanism"], "supervisor");
    // Passed straight through (no --json): exactly the limit reaches stdout.
    let plain = run(fx.sh(
        "read-only",
        &["--output-limit", "1K", "--timeout", "80s"],
        "yes | head -c 16777216",
    ));
    assert_eq!(plain.stdout.len(), 1024, "{}", plain.dump());
    // Events and the audit log say which limit ended the run.
    let ev = run(fx.sh(
        "read-only",
        &[
            "--events",
            "--output-limit",
            "4K",
            "--audit-log",
            log.to_str().unwrap_or_default(),
        ],
        "yes | head -c 16777216",
    ));
    let finished: Value = ev
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "execution.finished")
        .unwrap_or_else(|| panic!("no execution.finished\n{}", ev.dump()));
    assert_eq!(finished["termination_reason"], "output", "{}", ev.dump());
    let audited = read(&log).unwrap_or_default();
    let rec = audited
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "execution.finished")
        .unwrap_or_else(|| panic!("no execution.finished in the audit log\n{audited}"));
    assert_eq!(rec["termination_reason"], "output");
    assert!(rec["resource_usage"]["duration_ms"].is_u64());
}

#[test]
fn dd_into_tmp_over_tmp_size_fails_with_enospc() {
    let fx = Fixture::new();
    for level in SANDBOXED {
        for dir in ["/tmp", "$HOME"] {
            let script = format!(
                "echo DD-START; dd if=/dev/zero of={dir}/fill bs=1M count=64 2>&1; echo DD-RC=$?; stat -c SIZE=%s {dir}/fill"
            );
            let out = run(fx.sh(level, &["--tmp-size", "16M"], &script));
            out.expect_code(0).expect_stdout_has("DD-START");
            assert!(
                out.stdout.contains("No space left on device"),
                "{level} {dir}: {}",
                out.dump()
            );
            assert_eq!(out.field("DD-RC").as_deref(), Some("1"), "{}", out.dump());
            let size: u64 = out
                .field("SIZE")
                .and_then(|s| s.parse().ok())
                .unwrap_or(u64::MAX);
            assert!(size <= 16 << 20, "{level} {dir}: wrote {size} bytes");
        }
    }
}

#[test]
fn cpu_hog_under_cpu_time_ends_with_cpu() {
    let fx = Fixture::new();
    let (out, v) = json_run(
        &fx,
        "read-only",
        &["--cpu-time", "1s", "--timeout", "80s"],
        "echo CPU-START; while :; do :; done",
    );
    assert!(
        out.stdout.contains("CPU-START")
            || v["stdout"]
                .as_str()
                .unwrap_or_default()
                .contains("CPU-START")
    );
    assert_eq!(reason(&v), "cpu", "{}", out.dump());
    assert_eq!(v["signal"], libc_sigxcpu(), "{}", out.dump());
    // rusage samples CPU time at tick granularity: near the second, not exactly.
    let cpu = v["resource_usage"]["cpu_ms"].as_u64().unwrap_or(0);
    assert!(cpu >= 500, "cpu_ms {cpu} for a run stopped at 1s of CPU");
}

fn libc_sigxcpu() -> i64 {
    24
}

#[test]
fn oversized_file_ends_with_file_size() {
    let fx = Fixture::new();
    let target = fx.w("big");
    let script = format!(
        "echo FS-START; exec dd if=/dev/zero of={} bs=64K count=64",
        target.display()
    );
    let (out, v) = json_run(&fx, "workspace-write", &["--file-size", "1M"], &script);
    assert!(
        v["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("FS-START"),
        "{}",
        out.dump()
    );
    assert_eq!(reason(&v), "file_size", "{}", out.dump());
    let len = std::fs::metadata(&target).map(|m| m.len()).unwrap_or(0);
    assert!(len <= 1 << 20, "wrote {len} bytes under --file-size 1M");
}

#[test]
fn open_files_limit_refuses_more_descriptors() {
    let fx = Fixture::new();
    let code = "import os\nfds = []\ntry:\n    while True:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\nexcept OSError as e:\n    print('OPENED', len(fds), e.errno)";
    let out = run(fx.py("read-only", &["--open-files", "32"], code, &[]));
    out.expect_code(0);
    let line = out.field("OPENED").unwrap_or_default();
    let mut parts = line.split_whitespace();
    let opened: usize = parts
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX);
    assert!(opened < 32, "{opened} descriptors under --open-files 32");
    assert_eq!(parts.next(), Some("24"), "EMFILE expected\n{}", out.dump());
}

#[test]
fn unenforceable_limit_is_refused_unless_best_effort_contract() {
    let fx = Fixture::new();
    // danger-full-access has no private /tmp: --tmp-size cannot hold there.
    let out = run(fx.sh("danger-full-access", &["--tmp-size", "16M"], "echo RAN"));
    out.expect_code(125)
        .expect_absent("RAN", "a refused run's output");
    assert!(out.stderr.contains("--tmp-size"), "{}", out.dump());
    assert!(
        out.stderr.contains("--limits best-effort"),
        "{}",
        out.dump()
    );
    let (out, v) = json_run(
        &fx,
        "danger-full-access",
        &["--tmp-size", "16M", "--limits", "best-effort"],
        "echo RAN",
    );
    out.expect_code(0);
    let a = applied(&v, "tmp_size");
    assert_eq!(a["enforced"], false, "{}", out.dump());
    assert_eq!(a["mechanism"], Value::Null);
    // Bad values are moat's refusal too.
    for bad in [["--memory", "lots"], ["--pids", "0"], ["--limits", "maybe"]] {
        let out = run(fx.sh("read-only", &bad, "echo RAN"));
        assert_ne!(out.code, Some(0), "{bad:?} accepted\n{}", out.dump());
        out.expect_absent("RAN", "output of a run with a bad flag");
    }
}

#[test]
fn resource_usage_is_reported_contract() {
    let fx = Fixture::new();
    let (out, v) = json_run(&fx, "read-only", &[], "echo HI");
    out.expect_code(0);
    assert_eq!(reason(&v), "exit");
    let u = &v["resource_usage"];
    assert!(u["duration_ms"].is_u64(), "{u}");
    assert!(u["cpu_ms"].is_u64(), "{u}");
    assert!(u["max_rss_bytes"].as_u64().unwrap_or(0) > 0, "{u}");
    let (_, v) = json_run(&fx, "read-only", &[], "kill -TERM $$");
    assert_eq!(reason(&v), "signal");
}

#[test]
fn limits_from_a_profile_and_the_user_config_hold() {
    let fx = Fixture::new();
    let cfg = fx.root.join("xdg-config");
    let profiles = cfg.join("moat/profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    write(
        profiles.join("filler.toml"),
        "name = \"filler\"\nprogram = \"bash\"\nlevel = \"rw\"\n[limits]\ntmp_size = \"16M\"\n",
    );
    let moat_run = |args: &[&str]| {
        let mut c = fx.moat(["run", "--json"].iter().chain(args));
        c.env("XDG_CONFIG_HOME", &cfg)
            .env("XDG_STATE_HOME", fx.root.join("xdg-state"));
        run(c)
    };
    let script = "echo FILL-START; dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1; echo DD-RC=$?";
    // From the profile: enforced here, but best-effort by nature (a default).
    let out = moat_run(&["filler", "-c", script]);
    let v = out.json();
    let stdout = v["stdout"].as_str().unwrap_or_default();
    assert!(stdout.contains("FILL-START"), "{}", out.dump());
    assert!(stdout.contains("No space left on device"), "{}", out.dump());
    assert!(stdout.contains("DD-RC=1"), "{}", out.dump());
    assert_eq!(applied(&v, "tmp_size")["value"], 16 << 20);
    // The user config's [tools.filler.limits] wins over the profile's (its
    // top-level [limits] are defaults that yield to a profile, like the
    // other top-level keys).
    write(
        cfg.join("moat/config.toml"),
        "[limits]\ntmp_size = \"1G\"\n[tools.filler.limits]\ntmp_size = \"8M\"\n",
    );
    let out = moat_run(&["filler", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>/dev/null; echo SIZE=$(stat -c %s /tmp/fill)"]);
    let v = out.json();
    assert_eq!(applied(&v, "tmp_size")["value"], 8 << 20, "{}", out.dump());
    let size: u64 = v["stdout"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .strip_prefix("SIZE=")
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(size <= 8 << 20, "wrote {size} bytes under the config's 8M");
    // And a flag wins over both.
    let out = moat_run(&["--tmp-size", "4M", "filler", "-c", "true"]);
    assert_eq!(
        applied(&out.json(), "tmp_size")["value"],
        4 << 20,
        "{}",
        out.dump()
    );
}

#[test]
fn a_nested_run_gets_at_most_the_outer_limits() {
    let fx = Fixture::new();
    // The nested moat runs on the host (through the outer broker), outside
    // the outer run's cgroup: its own limits must be bounded by the outer's.
    let (out, v) = json_run(
        &fx,
        "workspace-write",
        &["--output-limit", "64K"],
        "echo NESTED-START; moat exec --json --output-limit 1M -- true",
    );
    out.expect_code(0);
    let stdout = v["stdout"].as_str().unwrap_or_default();
    assert!(stdout.contains("NESTED-START"), "{}", out.dump());
    let inner: Value = serde_json::from_str(stdout[stdout.find('{').unwrap_or(0)..].trim())
        .unwrap_or_else(|e| panic!("{e}\n{}", out.dump()));
    assert_eq!(
        applied(&inner, "output")["value"],
        64 << 10,
        "{}",
        out.dump()
    );
}
