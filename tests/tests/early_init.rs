//! The early init: `moat exec` clones the sandbox's init right after it
//! resolves the policy and sends it the plan once the host is probed
//! (ARCHITECTURE.md, "Launch performance", third pass). The command on
//! that path is confined as on the serial one, keeps moat's cpu mask, and
//! a run refused after the early clone leaves no process behind.

use std::os::unix::process::CommandExt;

use moat_conformance::*;

/// The trace step the supervisor marks when it hands the plan to the
/// early init instead of cloning.
const EARLY_STEP: &str = "the plan sent to the early init";

/// Pids of every live process in session `sid` (zombies included: a
/// process not reaped yet is still left behind).
fn session_members(sid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // Fields after the command's ")": state, ppid, pgrp, session.
        let rest = stat.rsplit(')').next().unwrap_or("");
        let session = rest.split_whitespace().nth(3).and_then(|s| s.parse().ok());
        if session == Some(sid) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn the_command_on_the_early_path_is_fully_confined() {
    let fx = Fixture::new();
    let mut cmd = fx.sh(
        "workspace-contained",
        &["--network", "disabled"],
        "grep -E '^(CapEff|Seccomp|NoNewPrivs):' /proc/self/status; echo ppid=$PPID; \
         printf 'init-cmdline=[%s]\\n' \"$(tr -d '\\0' < /proc/1/cmdline)\"; \
         echo hostname=$(cat /proc/sys/kernel/hostname)",
    );
    cmd.env("MOAT_TRACE_TIMING", "1");
    let out = run(cmd);
    out.expect_code(0);
    // The early path was taken (the serial one would not mark this step).
    assert!(
        out.stderr.contains(EARLY_STEP),
        "the launch did not go through the early init\n{}",
        out.dump()
    );
    for want in [
        "CapEff:\t0000000000000000",
        "Seccomp:\t2",
        "NoNewPrivs:\t1",
        // The command's parent is pid 1 of its own pid namespace: the init,
        // whose command line is wiped.
        "ppid=1\n",
        "init-cmdline=[]",
        "hostname=moat",
    ] {
        out.expect_stdout_has(want);
    }
}

#[test]
fn a_refusal_after_the_early_clone_leaves_no_process_behind() {
    let fx = Fixture::new();
    // The audit log is opened after the early clone: one under a regular
    // file cannot be, and refuses the run there.
    let log = fx.w("README").join("audit.jsonl");
    let mut cmd = fx.sh(
        "workspace-contained",
        &[
            "--network",
            "disabled",
            "--audit-log",
            log.to_str().unwrap(),
        ],
        "echo RAN_ANYWAY",
    );
    cmd.env("MOAT_TRACE_TIMING", "1");
    // moat leads a session of its own: whatever it starts stays in it
    // (the init never calls setsid), so a member left after moat exited is
    // a process of this run.
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = spawn(cmd);
    let sid = child.child.id() as i32;
    while !child.finished() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let left = session_members(sid);
    let out = child.wait();
    out.expect_code(125)
        .expect_absent("RAN_ANYWAY", "the refused command's output");
    assert!(
        out.all().contains("cannot open the audit log"),
        "not the audit log's refusal\n{}",
        out.dump()
    );
    assert!(
        out.stderr
            .contains("moat-timing: 1 early init: namespaces, id maps, hostname")
            || out.stderr.contains("clone the init (new namespaces)"),
        "the early init was not cloned before the refusal\n{}",
        out.dump()
    );
    assert!(
        left.is_empty(),
        "processes of the refused run left behind: {left:?}\n{}",
        out.dump()
    );
}

#[test]
fn the_command_gets_moats_cpu_mask_contract() {
    let fx = Fixture::new();
    // moat inherits this process's mask; the early init may be moved to
    // one cpu while it waits, and takes the whole mask back before the
    // command starts.
    let mine = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .map(|l| l.to_string())
        .expect("own cpu mask");
    for _ in 0..5 {
        let out = run(fx.sh(
            "workspace-contained",
            &["--network", "disabled"],
            "grep '^Cpus_allowed_list:' /proc/self/status",
        ));
        out.expect_code(0).expect_stdout_has(&mine);
    }
}
