//! The host replacing a protected path while a one-shot run is live: an
//! editor's atomic save over the workspace's `.env`, `git config` renaming
//! its lock file over `.git/config`. The host's rename detaches the mount
//! moat laid over the old file in every namespace; the run must never see
//! the new secret, nor write the new host-executed file (ARCHITECTURE.md,
//! "A one-shot run's watch over narrowing mounts").

use std::path::Path;
use std::time::{Duration, Instant};

use moat_conformance::*;

/// Generous: how long the host waits for the run to be stopped after its
/// rename before it lets the command go on (only a broken moat waits it out).
const STOP_GUARD: Duration = Duration::from_secs(20);

/// Waits (hang guard) for `path` to exist.
fn wait_file(path: &Path, running: &mut Running) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            !running.finished(),
            "moat ended before the command wrote {}",
            path.display()
        );
        assert!(
            start.elapsed() < SAFETY_TIMEOUT,
            "HUNG: {} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Replaces `path` on the host as an editor or git does: a new file beside
/// it, renamed over it.
fn replace_by_rename(path: &Path, contents: &str) {
    let tmp = path.with_extension("moat-test-tmp");
    write(&tmp, contents);
    std::fs::rename(&tmp, path).expect("rename over the protected file");
}

/// After the host's rename: waits for moat to stop the run (up to the
/// guard), then tells the command the host is done either way.
fn host_saw(running: &mut Running, ws: &Path) {
    let start = Instant::now();
    while !running.finished() && start.elapsed() < STOP_GUARD {
        std::thread::sleep(Duration::from_millis(10));
    }
    write(ws.join("host-saw"), "");
}

/// The documented stop: exit 125, the path named, `host_replaced`.
fn expect_stopped(out: &Out, path: &Path) {
    out.expect_code(125);
    let msg = format!("the host replaced {}", path.display());
    assert!(
        out.stderr.contains(&msg) && out.stderr.contains("run the command again"),
        "the stop does not name {} and what to do\n{}",
        path.display(),
        out.dump()
    );
}

#[test]
fn host_renaming_over_env_mid_run_never_shows_the_new_secret() {
    let fx = Fixture::new();
    let env = fx.w(".env");
    write(&env, &fx.env_secret);
    let new_secret = unique("NEWENVSECRET");
    let log = fx.root.join("audit.jsonl");
    let script = "cat .env; echo; echo READ-BEFORE; : > ready; \
                  while [ ! -e host-saw ]; do sleep 0.05; done; \
                  for i in $(seq 1 100); do cat .env; echo; done; echo READ-AFTER";
    let mut running = spawn(fx.sh(
        "workspace-write",
        &["--audit-log", log.to_str().unwrap_or_default()],
        script,
    ));
    wait_file(&fx.w("ready"), &mut running);
    replace_by_rename(&env, &new_secret);
    host_saw(&mut running, &fx.ws);
    let out = running.wait();
    out.expect_absent(&new_secret, "the secret the host wrote into .env mid-run")
        .expect_absent(&fx.env_secret, ".env's secret at launch");
    out.expect_stdout_has("READ-BEFORE");
    if out.code == Some(0) {
        // Kept running: the stand-in stayed over the new file.
        out.expect_stdout_has("READ-AFTER");
    } else {
        expect_stopped(&out, &env);
        let text = read(&log).unwrap_or_default();
        assert!(
            text.lines()
                .any(|l| l.contains("\"termination_reason\":\"host_replaced\"")),
            "no finish record with termination_reason host_replaced in the audit log\n{text}"
        );
    }
    assert_eq!(read(&env).as_deref(), Some(new_secret.as_str()));
}

#[test]
fn host_renaming_over_git_config_mid_run_keeps_it_unwritable() {
    let fx = Fixture::new();
    let init = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(&fx.ws)
        .status()
        .expect("git init");
    assert!(init.success(), "git init failed");
    let config = fx.w(".git/config");
    assert!(config.exists(), "git init made no .git/config");
    let replaced = format!("[core]\n\tbare = false\n# {}\n", unique("HOSTCFG"));
    let script = ": > ready; while [ ! -e host-saw ]; do sleep 0.05; done; \
                  if printf '[core]\\n\\tfsmonitor = touch PWNED\\n' >> .git/config; \
                  then echo WRITE-OK; else echo \"WRITE-FAILED $?\"; fi; echo DONE";
    let mut running = spawn(fx.sh("workspace-write", &["--json"], script));
    wait_file(&fx.w("ready"), &mut running);
    replace_by_rename(&config, &replaced);
    host_saw(&mut running, &fx.ws);
    let out = running.wait();
    assert_eq!(
        read(&config).as_deref(),
        Some(replaced.as_str()),
        "the command changed the host's new .git/config\n{}",
        out.dump()
    );
    let v = out.json();
    let stdout = v["stdout"].as_str().unwrap_or_default().to_string();
    assert!(
        !stdout.contains("WRITE-OK"),
        "the command's write succeeded\n{}",
        out.dump()
    );
    if v["exit_code"] == 0 {
        // Kept running: the write was refused (read-only), and said so.
        assert!(
            stdout.contains("WRITE-FAILED 1") && stdout.contains("DONE"),
            "{}",
            out.dump()
        );
        assert!(
            v["stderr"]
                .as_str()
                .unwrap_or_default()
                .contains("Read-only file system"),
            "{}",
            out.dump()
        );
    } else {
        assert_eq!(v["exit_code"], 125, "{}", out.dump());
        assert_eq!(v["termination_reason"], "host_replaced", "{}", out.dump());
        let err = v["error"].as_str().unwrap_or_default();
        assert!(
            err.contains(&format!("the host replaced {}", config.display())),
            "{}",
            out.dump()
        );
        assert!(!stdout.contains("DONE"), "{}", out.dump());
    }
}

/// The watch stops a run only for a protected path: an editor saving an
/// ordinary file of the workspace (a rename over it, in the directory
/// the watch covers because `.env` is there), and files made and removed
/// beside it, leave the run alone and visible to it.
#[test]
fn host_renaming_over_an_unprotected_file_keeps_the_run_positive_control() {
    let fx = Fixture::new();
    write(fx.w(".env"), &fx.env_secret);
    let saved = unique("SAVED");
    let script = ": > ready; while [ ! -e host-saw ]; do sleep 0.05; done; \
                  cat README; echo; echo DONE";
    let mut running = spawn(fx.sh("workspace-write", &[], script));
    wait_file(&fx.w("ready"), &mut running);
    replace_by_rename(&fx.w("README"), &saved);
    for i in 0..50 {
        let p = fx.w(&format!("scratch-{i}"));
        write(&p, "x");
        std::fs::remove_file(&p).expect("remove scratch");
    }
    write(fx.ws.join("host-saw"), "");
    let out = running.wait();
    out.expect_code(0);
    out.expect_stdout_has(&saved).expect_stdout_has("DONE");
}

/// The command cannot make the watch pass over a target. Its workspace is
/// the user's with a group the run does not map (a setgid team directory):
/// the init's capabilities do not apply to it, so the command, its owner,
/// can `chmod 0600` it while the watch is armed and back after. A watch
/// that skipped what it could not reach then let the command write the
/// `.git/config` the host renamed in mid-run (code run by the host's next
/// git command). The run must stop (or keep `.git/config` unwritable).
#[test]
fn a_workspace_made_unsearchable_while_the_watch_is_armed_stops_the_run() {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new();
    let init = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(&fx.ws)
        .status()
        .expect("git init");
    assert!(init.success(), "git init failed");
    // A group the run does not map: only the caller's own gid is mapped.
    if std::os::unix::fs::chown(&fx.ws, None, Some(65534)).is_err() {
        skip("giving the workspace a group the run does not map needs root (chown to gid 65534)");
        return;
    }
    let config = fx.w(".git/config");
    let replaced = format!("[core]\n\tbare = false\n# {}\n", unique("HOSTCFG"));
    let script = "chmod 600 \"$PWD\"; sleep 1; chmod 755 \"$PWD\"; : > ready; \
                  while [ ! -e host-saw ]; do sleep 0.05; done; \
                  if printf '[core]\\n\\tfsmonitor = touch PWNED\\n' >> .git/config; \
                  then echo WRITE-OK; else echo \"WRITE-FAILED $?\"; fi; echo DONE";
    let mut running = spawn(fx.sh("workspace-write", &["--json"], script));
    let start = Instant::now();
    while !fx.w("ready").exists() && !running.finished() {
        assert!(start.elapsed() < SAFETY_TIMEOUT, "HUNG: no ready, no end");
        std::thread::sleep(Duration::from_millis(10));
    }
    let stopped_before_ready = !fx.w("ready").exists();
    if !stopped_before_ready {
        replace_by_rename(&config, &replaced);
        host_saw(&mut running, &fx.ws);
    }
    let out = running.wait();
    let _ = std::fs::set_permissions(&fx.ws, std::fs::Permissions::from_mode(0o755));
    let v = out.json();
    let stdout = v["stdout"].as_str().unwrap_or_default().to_string();
    assert!(
        !stdout.contains("WRITE-OK"),
        "the command's write succeeded\n{}",
        out.dump()
    );
    if stopped_before_ready {
        // Stopped when the watch could not reach the directory: the
        // command had started, so a stopped run, never a failed start.
        assert_eq!(v["exit_code"], 125, "{}", out.dump());
        assert_eq!(v["termination_reason"], "watch_failed", "{}", out.dump());
        assert_ne!(v["status"], "failed_to_start", "{}", out.dump());
        let err = v["error"].as_str().unwrap_or_default();
        assert!(
            err.contains("moat cannot watch") && err.contains("was stopped"),
            "{}",
            out.dump()
        );
    } else {
        assert_eq!(
            read(&config).as_deref(),
            Some(replaced.as_str()),
            "the command changed the host's new .git/config\n{}",
            out.dump()
        );
        assert_ne!(
            v["exit_code"],
            0,
            "the run went on past the host's rename\n{}",
            out.dump()
        );
    }
}
