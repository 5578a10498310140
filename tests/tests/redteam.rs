//! Regressions for escapes a red-team review found: each asserts the side
//! effect the attack was after (a host file planted, a process surviving,
//! a log truncated).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use moat_conformance::*;

fn git(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .args(["-c", "user.email=a@b", "-c", "user.name=a"])
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "git {args:?} failed");
}

/// `.git/commondir` (and `config.worktree`) redirect git to a config and
/// hooks of the command's choosing: they must not survive the run.
#[test]
fn git_commondir_and_worktree_config_cannot_be_planted() {
    let fx = Fixture::new();
    git(&fx.ws, &["init", "-q", "."]);
    git(&fx.ws, &["commit", "-q", "--allow-empty", "-m", "init"]);
    for level in ["workspace-write", "workspace-contained"] {
        let out = run(fx.sh(
            level,
            &["--no-audit"],
            "mkdir -p .evil && printf '[core]\\n\\tfsmonitor = \"touch PWNED\"\\n' > .evil/config && \
             echo ../.evil > .git/commondir; printf '[core]\\n\\tfsmonitor = x\\n' > .git/config.worktree; echo planted",
        ));
        assert!(
            out.stdout.contains("planted"),
            "control: the command ran\n{}",
            out.dump()
        );
        assert!(
            !exists(fx.ws.join(".git/commondir")),
            "{level}: .git/commondir survived the run\n{}",
            out.dump()
        );
        // A new config.worktree may stay (sparse-checkout writes one), but
        // only with keys that run nothing.
        assert!(
            !read(fx.ws.join(".git/config.worktree"))
                .unwrap_or_default()
                .contains("fsmonitor"),
            "{level}: .git/config.worktree kept its fsmonitor\n{}",
            out.dump()
        );
    }
}

/// Under danger-full-access the command can kill its reaper; moat itself
/// must still leave nothing running. The marker process proves it started
/// (a file it creates before the reaper is killed, and a line the script
/// prints only after seeing that file).
#[test]
fn danger_full_access_tree_dies_even_if_the_reaper_is_killed() {
    let fx = Fixture::new();
    let marker = unique("orphan");
    let _g = MarkerGuard(marker.clone());
    let started = fx.w("orphan-started");
    let out = run(fx.sh(
        "danger-full-access",
        &["--no-audit"],
        &format!(
            "(touch {s}; exec -a {marker} sleep 300) & \
             while [ ! -e {s} ]; do sleep 0.01; done; echo ORPHAN-STARTED; kill -9 $PPID",
            s = started.display()
        ),
    ));
    assert!(
        exists(&started),
        "control: the marker process never started\n{}",
        out.dump()
    );
    // A hang guard, not a timing claim: the tree must be gone once moat is.
    let left = wait_gone(&marker, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "a process outlived moat: pids {left:?}\n{}",
        out.dump()
    );
    assert!(
        out.pipes_closed && out.stdout.contains("ORPHAN-STARTED"),
        "control: the script saw the marker start (and nothing holds its pipes)\n{}",
        out.dump()
    );
}

/// A nested run dies with an outer moat that is SIGKILLed. The nested
/// command is found by its exact argv[0] (the outer moat's own argv only
/// *contains* the marker), and proves it ran by creating a file.
#[test]
fn nested_runs_die_with_a_killed_outer_moat() {
    let fx = Fixture::new();
    let marker = unique("nestedsurvivor");
    let _g = MarkerGuard(marker.clone());
    let started = fx.w("NESTED_STARTED");
    let mut c = fx.sh(
        "workspace-write",
        &["--no-audit"],
        &format!(
            "/moat/bin/moat exec --policy workspace-write -- bash -c 'touch {s}; exec -a {marker} sleep 300' & sleep 300",
            s = started.display()
        ),
    );
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    // Wait (hang guard only) until the nested command itself runs.
    let seen = wait_for_proc(&marker, Duration::from_secs(60));
    let seen_file = exists(&started);
    child.kill().unwrap();
    let _ = child.wait();
    assert!(
        seen && seen_file,
        "control: the nested run never started (process seen: {seen}, file: {seen_file})"
    );
    let left = wait_gone(&marker, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "the nested command outlived the killed outer moat: pids {left:?}"
    );
}

/// Workspace = HOME: a missing ~/.ssh (or another protected path) and rc
/// files sourced by shells must not be planted.
#[test]
fn workspace_home_cannot_plant_ssh_keys_or_rc_files() {
    let fx = Fixture::new();
    let home = fx.root.join("fresh-home");
    std::fs::create_dir_all(&home).unwrap();
    let mut c = fx.sh(
        "workspace-write",
        &["--no-audit", "--cwd", home.to_str().unwrap()],
        "mkdir -p .ssh && echo key > .ssh/authorized_keys; echo evil > .bash_aliases; echo x > .vimrc; \
         mkdir -p .aws && echo k > .aws/credentials; echo ok > work.txt; echo planted",
    );
    c.env("HOME", &home);
    let out = run(c);
    assert!(out.stdout.contains("planted"), "control\n{}", out.dump());
    assert!(
        exists(home.join("work.txt")),
        "control: the workspace is writable\n{}",
        out.dump()
    );
    for p in [".ssh", ".bash_aliases", ".vimrc", ".aws"] {
        assert!(
            !exists(home.join(p)),
            "{p} survived the run\n{}",
            out.dump()
        );
    }
}

/// At most 8 nested runs go at once. Each nested command blocks until the
/// script has seen all 14 launches settle (started or refused), so the
/// overlap does not depend on timing; each started one leaves a file, so a
/// refusal (125) is shown to be a command that never ran.
#[test]
fn nested_runs_are_capped() {
    let fx = Fixture::new();
    let out = run(fx.sh(
        "workspace-write",
        &["--no-audit"],
        r#"mkdir -p cap && cd cap
for i in $(seq 14); do
  (/moat/bin/moat exec --policy workspace-write -- bash -c "touch started.$i; while [ ! -e GO ]; do sleep 0.05; done" >/dev/null 2>&1; echo rc=$? >> rcs) &
done
for t in $(seq 1200); do
  n=$(ls started.* 2>/dev/null | wc -l); r=$(cat rcs 2>/dev/null | wc -l)
  [ $((n + r)) -ge 14 ] && break
  sleep 0.05
done
echo "SETTLED started=$n finished=$r"
touch GO; wait; cat rcs; echo "STARTED-FILES $(ls started.* 2>/dev/null | wc -l)""#,
    ));
    out.expect_stdout_has("SETTLED");
    let refused = out.stdout.matches("rc=125").count();
    let ran = out.stdout.matches("rc=0").count();
    let started = out.field("STARTED-FILES").unwrap_or_default();
    assert!(ran >= 1, "control: nested runs work\n{}", out.dump());
    assert_eq!(
        ran + refused,
        14,
        "every launch either ran or was refused\n{}",
        out.dump()
    );
    assert!(
        ran <= 8 && refused >= 6,
        "{ran} ran at once (refused {refused})\n{}",
        out.dump()
    );
    assert_eq!(
        started,
        ran.to_string(),
        "a refused nested run must not have started its command\n{}",
        out.dump()
    );
}

/// A log the caller gave as stdout in append mode cannot be truncated.
#[test]
fn append_mode_stdout_cannot_be_truncated() {
    let fx = Fixture::new();
    let log = fx.root.join("out.log");
    std::fs::write(&log, "PRIOR\n").unwrap();
    // The caller's shell opens the log with O_APPEND (`>>`), as a harness would.
    let script = format!(
        "'{}' exec --no-audit --policy workspace-contained -- bash -c ': > /proc/self/fd/1; echo appended' >> '{}'",
        moat_bin().display(),
        log.display()
    );
    let status = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(&fx.ws)
        .env("HOME", &fx.home)
        .status()
        .unwrap();
    let out_code = status.code();
    let text = read(&log).unwrap_or_default();
    assert!(
        text.starts_with("PRIOR\n") && text.contains("appended"),
        "log: {text:?} (exit {out_code:?})"
    );
}

/// A nested run cannot read what the outer view replaced with its own
/// tmpfs: the host's /tmp and /run (and their sockets) stay out of reach.
#[test]
fn nested_runs_cannot_reach_host_tmp_or_run() {
    let fx = Fixture::new();
    for level in ["read-only", "workspace-write"] {
        let out = run(fx.sh(
            level,
            &["--no-audit"],
            "/moat/bin/moat exec --ro /tmp -- true; echo tmp=$?; /moat/bin/moat exec --ro /run -- true; echo run=$?; \
             /moat/bin/moat exec -- true; echo plain=$?",
        ));
        assert!(
            out.stdout.contains("plain=0"),
            "control: a nested run works at {level}\n{}",
            out.dump()
        );
        assert!(
            out.stdout.contains("tmp=125") && out.stdout.contains("run=125"),
            "{level}: host /tmp or /run granted\n{}",
            out.dump()
        );
    }
}

/// A request that never completes (here: the command sends the broker its
/// own end of the connection) must not keep moat alive after the command.
#[test]
fn a_stuck_nested_request_does_not_hang_moat() {
    let fx = Fixture::new();
    let code = "import socket, struct\ns = socket.socket(socket.AF_UNIX)\ns.connect('/moat/broker.sock')\nsocket.send_fds(s, [struct.pack('>I', 100)], [s.fileno()] * 3)\ns.close()\nprint('sent')";
    let out = run(fx.py("workspace-write", &["--no-audit"], code, &[]));
    out.expect_code(0);
    assert!(out.stdout.contains("sent"), "control\n{}", out.dump());
}

/// A project file that is a symlink (to another, trusted project's file)
/// is refused rather than trusted by its target's path.
#[test]
fn a_symlinked_project_file_is_refused() {
    let fx = Fixture::new();
    let other = fx.root.join("other");
    std::fs::create_dir_all(other.join(".git")).unwrap();
    std::fs::write(other.join(".moat.toml"), "rw = [\"data\"]\n").unwrap();
    std::fs::create_dir_all(other.join("data")).unwrap();
    std::fs::create_dir_all(fx.ws.join(".git")).unwrap();
    std::fs::create_dir_all(fx.w("sub")).unwrap();
    std::os::unix::fs::symlink(other.join(".moat.toml"), fx.w("sub/.moat.toml")).unwrap();
    let state = fx.root.join("state");
    // Trust the other project's file first (no terminal needed for `moat trust`).
    let mut t = fx.moat(["trust", other.to_str().unwrap()]);
    t.env("XDG_STATE_HOME", &state);
    run(t).expect_code(0);
    let mut c = fx.moat([
        "run",
        "sh",
        "-c",
        &format!("echo PWNED > {}/data/x", other.display()),
    ]);
    c.current_dir(fx.w("sub")).env("XDG_STATE_HOME", &state);
    let out = run(c);
    out.expect_code(125);
    assert!(
        out.stderr.contains("symlink"),
        "refused, but not for the symlink (the reason must name it)\n{}",
        out.dump()
    );
    assert!(
        !exists(other.join("data/x")),
        "the other project's grant was used\n{}",
        out.dump()
    );
}
