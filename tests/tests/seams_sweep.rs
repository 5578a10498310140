//! The run's edges (issue 8 §1, §4, §5; issue 10 item 4): what the command
//! leaves behind that the host executes later (the post-run sweep), the
//! `.env` walk that a previous run must not be able to switch off, git
//! internals and agent configs, and `git init` surviving a run.
//!
//! Each attack is followed by what the host would do next (a host `git
//! status` outside moat) and asserts its side effect: the marker file the
//! planted command would create never appears.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use moat_conformance::*;

/// A host `git` outside moat, with only the fixture's (empty) home config.
fn host_git(fx: &Fixture, dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &fx.home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
        .output()
        .expect("run host git")
}

fn host_repo(fx: &Fixture, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let o = host_git(fx, dir, &["init", "-q"]);
    assert!(o.status.success(), "host git init: {o:?}");
    let o = host_git(fx, dir, &["commit", "-q", "--allow-empty", "-m", "first"]);
    assert!(o.status.success(), "host git commit: {o:?}");
}

/// The marker a planted fsmonitor/hook would create, and the config line
/// that plants it.
fn marker(fx: &Fixture, name: &str) -> (PathBuf, String) {
    let m = fx.root.join(name);
    let line = format!("\tfsmonitor = \"touch {};:\"\n", m.display());
    (m, line)
}

fn quarantined_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.contains("moat-quarantine") {
                out.push(e.path().display().to_string());
            }
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(e.path());
            }
        }
    }
    out
}

// ------------------------------------------------------------ §1 the sweep

/// The script that plants an fsmonitor through `.git/commondir` (an
/// `evil/` git dir next to `.git`), then makes `.git` unwritable so a
/// naive sweep can neither rename nor delete.
fn commondir_attack(fsmonitor_line: &str) -> String {
    format!(
        "mkdir -p evil/objects evil/refs/heads && echo 'ref: refs/heads/main' > evil/HEAD && \
         printf '[core]\\n\\trepositoryformatversion = 0\\n{}' > evil/config && \
         echo ../evil > .git/commondir && chmod a-w .git && echo PLANTED",
        fsmonitor_line.replace('\t', "\\t").replace('\n', "\\n")
    )
}

#[test]
fn chmod_cannot_stop_the_sweep_of_a_planted_commondir() {
    let fx = Fixture::new();
    host_repo(&fx, &fx.ws);
    let (m, line) = marker(&fx, "FSMONITOR-COMMONDIR");
    let out = run(fx.sh("workspace-write", &[], &commondir_attack(&line)));
    out.expect_stdout_has("PLANTED");
    let _ = std::fs::set_permissions(fx.w(".git"), std::fs::Permissions::from_mode(0o755));
    assert!(
        !exists(fx.w(".git/commondir")),
        ".git/commondir still live on the host\n{}",
        out.dump()
    );
    let st = host_git(&fx, &fx.ws, &["status"]);
    assert!(
        !exists(&m),
        "the host's git status ran the command's fsmonitor\n{}\n{st:?}",
        out.dump()
    );
    assert_ne!(
        out.code,
        Some(122),
        "a sweep that succeeded reported failure\n{}",
        out.dump()
    );
    assert!(
        out.stderr.contains("commondir"),
        "the sweep was not reported\n{}",
        out.dump()
    );
}

#[test]
fn commondir_attack_positive_control() {
    // Unconfined, the same attack makes the host's git run the fsmonitor:
    // the marker check above can see it.
    let fx = Fixture::new();
    host_repo(&fx, &fx.ws);
    let (m, line) = marker(&fx, "FSMONITOR-CONTROL");
    let out = run(fx.sh("danger-full-access", &[], &commondir_attack(&line)));
    out.expect_stdout_has("PLANTED");
    let _ = std::fs::set_permissions(fx.w(".git"), std::fs::Permissions::from_mode(0o755));
    let st = host_git(&fx, &fx.ws, &["status"]);
    assert!(
        exists(&m),
        "control: the planted fsmonitor did not run\n{st:?}\n{}",
        out.dump()
    );
}

#[test]
fn a_whole_new_git_dir_behind_chmod_is_neutralised() {
    let fx = Fixture::new();
    let (m, line) = marker(&fx, "FSMONITOR-NEWGIT");
    let script = format!(
        "mkdir -p .git/objects .git/refs/heads .git/hooks && echo 'ref: refs/heads/main' > .git/HEAD && \
         printf '[core]\\n\\trepositoryformatversion = 0\\n{}' > .git/config && \
         printf '#!/bin/sh\\ntouch {}\\n' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout && \
         chmod a-w .git/hooks .git . && echo PLANTED",
        line.replace('\t', "\\t").replace('\n', "\\n"),
        fx.root.join("HOOK-RAN").display()
    );
    let out = run(fx.sh("workspace-write", &[], &script));
    out.expect_stdout_has("PLANTED");
    for d in [fx.ws.clone(), fx.w(".git"), fx.w(".git/hooks")] {
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755));
    }
    assert!(
        !exists(fx.w(".git/hooks/post-checkout")),
        "hook left live\n{}",
        out.dump()
    );
    let cfg = read(fx.w(".git/config")).unwrap_or_default();
    assert!(
        !cfg.contains("fsmonitor"),
        "fsmonitor left in .git/config: {cfg}\n{}",
        out.dump()
    );
    let st = host_git(&fx, &fx.ws, &["status"]);
    assert!(
        !exists(&m),
        "the host's git status ran the fsmonitor\n{st:?}\n{}",
        out.dump()
    );
    let _ = host_git(&fx, &fx.ws, &["checkout", "-q", "-b", "x"]);
    assert!(
        !exists(fx.root.join("HOOK-RAN")),
        "the host's git ran the hook\n{}",
        out.dump()
    );
}

#[test]
fn the_sweep_never_follows_a_symlink_the_command_planted() {
    let fx = Fixture::home_as_workspace();
    // ~/.config holds nothing protected, so it can be moved.
    std::fs::remove_dir_all(fx.home.join(".config")).unwrap();
    std::fs::create_dir_all(fx.home.join(".config/misc")).unwrap();
    let target = fx.outside.join("target");
    for d in ["git", "systemd", "autostart", "fish"] {
        std::fs::create_dir_all(target.join(d)).unwrap();
        write(target.join(d).join("keep"), "OUTSIDE\n");
    }
    // moat's own config dir lives elsewhere here, so nothing protected
    // pins ~/.config and the command can swap it for a symlink.
    let mut c = fx.sh(
        "workspace-write",
        &[],
        &format!(
            "mv .config .config-old && ln -s {} .config && echo PLANTED",
            target.display()
        ),
    );
    c.env("XDG_CONFIG_HOME", fx.root.join("xdg-config"))
        .env("XDG_STATE_HOME", fx.root.join("xdg-state"));
    let out = run(c);
    out.expect_stdout_has("PLANTED");
    for d in ["git", "systemd", "autostart", "fish"] {
        assert_eq!(
            read(target.join(d).join("keep")).as_deref(),
            Some("OUTSIDE\n"),
            "{d} outside the workspace was moved\n{}",
            out.dump()
        );
    }
    assert!(
        quarantined_under(&fx.outside).is_empty(),
        "something outside the workspace was renamed: {:?}\n{}",
        quarantined_under(&fx.outside),
        out.dump()
    );
    // The planted symlink itself no longer leads the host's tools there.
    let still = std::fs::read_link(fx.home.join(".config")).ok();
    assert_ne!(
        still.as_deref(),
        Some(target.as_path()),
        "the symlink is still live\n{}",
        out.dump()
    );
}

#[test]
fn an_unlistable_workspace_never_loses_the_users_git() {
    let fx = Fixture::new();
    host_repo(&fx, &fx.ws);
    write(fx.w(".env"), &format!("TOKEN={}\n", fx.env_secret));
    let head = read(fx.w(".git/HEAD"));
    std::fs::set_permissions(&fx.ws, std::fs::Permissions::from_mode(0o311)).unwrap();
    let out = run(fx.sh("workspace-write", &[], "cat .env; echo RAN"));
    std::fs::set_permissions(&fx.ws, std::fs::Permissions::from_mode(0o755)).unwrap();
    out.expect_absent(&fx.env_secret, ".env of an unlistable workspace");
    assert_eq!(
        read(fx.w(".git/HEAD")),
        head,
        "the user's .git was moved\n{}",
        out.dump()
    );
    assert!(
        quarantined_under(&fx.ws).is_empty(),
        "{:?}\n{}",
        quarantined_under(&fx.ws),
        out.dump()
    );
    if euid() != 0 {
        out.expect_code(125);
        assert!(
            out.stderr.contains(&fx.ws.display().to_string()),
            "the refusal does not name the directory\n{}",
            out.dump()
        );
    } else {
        // Root lists it anyway: the run happens with the .env hidden.
        out.expect_stdout_has("RAN");
    }
}

// ------------------------------------------------------------ §4 the walk

#[test]
fn an_unreadable_subdirectory_stops_the_run_instead_of_unhiding_env() {
    let fx = Fixture::new();
    write(fx.w("config/.env"), &format!("TOKEN={}\n", fx.env_secret));
    std::fs::set_permissions(fx.w("config"), std::fs::Permissions::from_mode(0o311)).unwrap();
    for level in ["read-only", "workspace-write", "workspace-contained"] {
        let out = run(fx.sh(level, &[], "cat config/.env; echo RAN"));
        out.expect_absent(&fx.env_secret, &format!("config/.env at {level}"));
        if euid() != 0 {
            out.expect_code(125);
            assert!(
                out.stderr.contains("config") && out.stderr.contains("chmod"),
                "the refusal names neither the directory nor the fix\n{}",
                out.dump()
            );
        } else {
            out.expect_stdout_has("RAN");
        }
    }
    std::fs::set_permissions(fx.w("config"), std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn no_walk_budget_can_be_exhausted() {
    let fx = Fixture::new();
    // 2001 directories sorting before `config/`, and a .env deeper than
    // the old depth limit.
    for i in 0..2001 {
        std::fs::create_dir_all(fx.w(&format!("a{i:04}"))).unwrap();
    }
    write(fx.w("config/.env"), &format!("TOKEN={}\n", fx.env_secret));
    write(
        fx.w("d1/d2/d3/d4/d5/.env.local"),
        &format!("TOKEN={}\n", fx.env_secret),
    );
    write(fx.w("build/.env"), &format!("TOKEN={}\n", fx.env_secret));
    let out = run(fx.sh(
        "workspace-write",
        &[],
        "cat config/.env d1/d2/d3/d4/d5/.env.local build/.env; echo RAN",
    ));
    out.expect_stdout_has("RAN");
    out.expect_absent(&fx.env_secret, "a .env beyond the old walk budget");
}

// ------------------------------------------------------------ §5 git internals, agent configs

#[test]
fn linked_worktree_admin_files_cannot_redirect_git() {
    let fx = Fixture::new();
    host_repo(&fx, &fx.ws);
    let o = host_git(&fx, &fx.ws, &["worktree", "add", "-q", "wt1"]);
    assert!(o.status.success(), "{o:?}");
    let before = read(fx.w(".git/worktrees/wt1/commondir"));
    let (m1, line) = marker(&fx, "FSMONITOR-WT1");
    let (m2, _) = marker(&fx, "FSMONITOR-WT2");
    let line2 = line.replace("FSMONITOR-WT1", "FSMONITOR-WT2");
    let script = format!(
        "mkdir -p evil/objects evil/refs/heads && echo 'ref: refs/heads/main' > evil/HEAD && \
         printf '[core]\\n\\trepositoryformatversion = 0\\n{l1}' > evil/config && \
         echo ../../../evil > .git/worktrees/wt1/commondir; \
         printf '[core]\\n{l1}' > .git/worktrees/wt1/config.worktree; \
         git worktree add -q wt2 2>&1; echo ../../../evil > .git/worktrees/wt2/commondir; \
         printf '[core]\\n{l2}' > .git/worktrees/wt2/config.worktree; echo PLANTED",
        l1 = line.replace('\t', "\\t").replace('\n', "\\n"),
        l2 = line2.replace('\t', "\\t").replace('\n', "\\n"),
    );
    let out = run(fx.sh("workspace-write", &[], &script));
    out.expect_stdout_has("PLANTED");
    assert_eq!(
        read(fx.w(".git/worktrees/wt1/commondir")),
        before,
        "{}",
        out.dump()
    );
    let _ = host_git(&fx, &fx.w("wt1"), &["status"]);
    if exists(fx.w("wt2")) {
        let _ = host_git(&fx, &fx.w("wt2"), &["status"]);
    }
    let _ = host_git(
        &fx,
        &fx.ws,
        &["-c", "extensions.worktreeConfig=true", "status"],
    );
    assert!(
        !exists(&m1),
        "wt1's admin files ran an fsmonitor\n{}",
        out.dump()
    );
    assert!(
        !exists(&m2),
        "a new worktree's admin files ran an fsmonitor\n{}",
        out.dump()
    );
}

#[test]
fn nested_submodule_git_dirs_are_read_only() {
    let fx = Fixture::new();
    host_repo(&fx, &fx.ws);
    let b = fx.w(".git/modules/a/modules/b");
    write(b.join("HEAD"), "ref: refs/heads/main\n");
    write(b.join("config"), "[core]\n\tbare = false\n");
    std::fs::create_dir_all(b.join("hooks")).unwrap();
    let out = run(fx.sh(
        "workspace-write",
        &[],
        "printf '\\tfsmonitor = evil\\n' >> .git/modules/a/modules/b/config; \
         echo evil > .git/modules/a/modules/b/hooks/post-checkout; \
         mkdir -p .git/modules/c/hooks && echo ref > .git/modules/c/HEAD && echo evil > .git/modules/c/hooks/pre-commit; \
         printf '[core]\\n\\tfsmonitor = evil\\n' > .git/modules/c/config; echo PLANTED",
    ));
    out.expect_stdout_has("PLANTED");
    assert_eq!(
        read(b.join("config")).as_deref(),
        Some("[core]\n\tbare = false\n"),
        "{}",
        out.dump()
    );
    assert!(!exists(b.join("hooks/post-checkout")), "{}", out.dump());
    assert!(
        !exists(fx.w(".git/modules/c/hooks/pre-commit")),
        "{}",
        out.dump()
    );
    assert!(
        !read(fx.w(".git/modules/c/config"))
            .unwrap_or_default()
            .contains("fsmonitor"),
        "{}",
        out.dump()
    );
}

const AGENT_CONFIGS: &[&str] = &[
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".claude/hooks/on-stop.sh",
    ".claude/commands/x.md",
    ".cursor/mcp.json",
    ".codex/config.toml",
    ".gemini/settings.json",
    ".aider.conf.yml",
    ".continue/config.yaml",
    ".devcontainer/devcontainer.json",
    ".windsurf/hooks.json",
    ".zed/tasks.json",
    "opencode.json",
];

fn plant(names: &[&str]) -> String {
    let mut s = String::new();
    for n in names {
        s.push_str(&format!(
            "mkdir -p \"$(dirname '{n}')\"; echo EVIL >> '{n}'; "
        ));
    }
    s.push_str("echo ok > allowed.txt; echo DONE");
    s
}

#[test]
fn agent_configs_cannot_be_created() {
    let fx = Fixture::new();
    let out = run(fx.sh("workspace-write", &[], &plant(AGENT_CONFIGS)));
    out.expect_stdout_has("DONE");
    let live: Vec<&str> = AGENT_CONFIGS
        .iter()
        .copied()
        .filter(|n| exists(fx.w(n)))
        .collect();
    assert!(
        live.is_empty(),
        "agent configs created on the host: {live:?}\n{}",
        out.dump()
    );
    assert_eq!(
        read(fx.w("allowed.txt")).as_deref(),
        Some("ok\n"),
        "{}",
        out.dump()
    );
}

#[test]
fn agent_configs_cannot_be_changed() {
    let fx = Fixture::new();
    for n in AGENT_CONFIGS {
        write(fx.w(n), "ORIGINAL\n");
    }
    let mut script = plant(AGENT_CONFIGS);
    for n in AGENT_CONFIGS {
        script = format!("rm -f '{n}'; {script}");
    }
    let out = run(fx.sh("workspace-write", &[], &script));
    out.expect_stdout_has("DONE");
    let changed: Vec<&str> = AGENT_CONFIGS
        .iter()
        .copied()
        .filter(|n| read(fx.w(n)).as_deref() != Some("ORIGINAL\n"))
        .collect();
    assert!(
        changed.is_empty(),
        "agent configs changed: {changed:?}\n{}",
        out.dump()
    );
}

#[test]
fn a_project_grant_of_its_root_never_reaches_git_hooks() {
    let fx = Fixture::new();
    host_repo(&fx, &fx.ws);
    std::fs::create_dir_all(fx.w("sub")).unwrap();
    write(fx.w(".moat.toml"), "rw = [\".\"]\n");
    let state = fx.root.join("state");
    let mut t = fx.moat(["trust", fx.ws.to_str().unwrap()]);
    t.env("XDG_STATE_HOME", &state);
    run(t).expect_code(0);
    let mut c = fx.moat([
        "run",
        "sh",
        "-c",
        "echo evil > ../.git/hooks/pre-commit; printf '[core]\\n\\tfsmonitor = evil\\n' >> ../.git/config; echo ok > ../granted.txt; echo DONE",
    ]);
    c.current_dir(fx.w("sub")).env("XDG_STATE_HOME", &state);
    let out = run(c);
    out.expect_stdout_has("DONE");
    assert_eq!(
        read(fx.w("granted.txt")).as_deref(),
        Some("ok\n"),
        "positive control: the project grant did not apply\n{}",
        out.dump()
    );
    assert!(
        !exists(fx.w(".git/hooks/pre-commit")),
        "the project grant made .git/hooks writable\n{}",
        out.dump()
    );
    assert!(
        !read(fx.w(".git/config"))
            .unwrap_or_default()
            .contains("fsmonitor"),
        "{}",
        out.dump()
    );
}

#[test]
fn a_grant_on_a_write_protected_path_is_refused() {
    let fx = Fixture::new();
    host_repo(&fx, &fx.ws);
    let hooks = fx.w(".git/hooks");
    let out = run(fx.sh(
        "workspace-write",
        &["--rw", hooks.to_str().unwrap()],
        "echo evil > .git/hooks/pre-commit; echo RAN",
    ));
    out.expect_code(125);
    assert!(!exists(fx.w(".git/hooks/pre-commit")), "{}", out.dump());
    assert!(out.stderr.contains("write-protected"), "{}", out.dump());
}

// ------------------------------------------------------------ git init survives

#[test]
fn git_init_survives_without_what_the_host_would_run() {
    let fx = Fixture::new();
    let (m, _) = marker(&fx, "FSMONITOR-INIT");
    let hook_marker = fx.root.join("HOOK-INIT");
    let script = format!(
        "git init -q && git config user.name 'Agent Smith' && git config core.fsmonitor 'touch {m};:' && \
         git config core.hooksPath /tmp && git config alias.st '!touch {m}' && \
         git config remote.origin.url https://example.invalid/r.git && \
         printf '#!/bin/sh\\ntouch {h}\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && \
         echo hi > f && echo INITED",
        m = m.display(),
        h = hook_marker.display()
    );
    let mut c = fx.sh("workspace-write", &["--json"], &script);
    c.env("GIT_CONFIG_NOSYSTEM", "1");
    let out = run(c);
    let v = out.json();
    assert!(
        v["stdout"].as_str().unwrap_or("").contains("INITED"),
        "{}",
        out.dump()
    );
    // The repository is there and usable from the host.
    assert!(
        exists(fx.w(".git/HEAD")),
        "the new repository was removed\n{}",
        out.dump()
    );
    let name = host_git(&fx, &fx.ws, &["config", "--get", "user.name"]);
    assert_eq!(
        String::from_utf8_lossy(&name.stdout).trim(),
        "Agent Smith",
        "an inert key was dropped\n{}",
        out.dump()
    );
    let url = host_git(&fx, &fx.ws, &["config", "--get", "remote.origin.url"]);
    assert_eq!(
        String::from_utf8_lossy(&url.stdout).trim(),
        "https://example.invalid/r.git"
    );
    for k in ["core.fsmonitor", "core.hookspath", "alias.st"] {
        let o = host_git(&fx, &fx.ws, &["config", "--get", k]);
        assert!(o.stdout.is_empty(), "{k} survived\n{}", out.dump());
    }
    assert!(!exists(fx.w(".git/hooks/pre-commit")), "{}", out.dump());
    // What the host does next runs none of it.
    let _ = host_git(&fx, &fx.ws, &["status"]);
    let _ = host_git(&fx, &fx.ws, &["add", "f"]);
    let c = host_git(&fx, &fx.ws, &["commit", "-q", "-m", "x"]);
    assert!(
        c.status.success(),
        "host commit in the kept repository failed: {c:?}"
    );
    assert!(
        !exists(&m),
        "the host's git ran the fsmonitor\n{}",
        out.dump()
    );
    assert!(
        !exists(&hook_marker),
        "the host's git ran the hook\n{}",
        out.dump()
    );
    // Each neutralised key is reported.
    let swept = v["swept"].to_string();
    for k in ["core.fsmonitor", "core.hookspath", "alias.st", "pre-commit"] {
        assert!(swept.contains(k), "{k} not reported in swept: {swept}");
    }
    assert!(v.get("sweep_failed").is_none(), "{}", out.dump());
}

#[test]
fn git_init_hooks_positive_control() {
    let fx = Fixture::new();
    let hook_marker = fx.root.join("HOOK-CONTROL");
    let script = format!(
        "git init -q && printf '#!/bin/sh\\ntouch {h}\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && echo hi > f && echo INITED",
        h = hook_marker.display()
    );
    let out = run(fx.sh("danger-full-access", &[], &script));
    out.expect_stdout_has("INITED");
    let _ = host_git(&fx, &fx.ws, &["add", "f"]);
    let _ = host_git(&fx, &fx.ws, &["commit", "-q", "-m", "x"]);
    assert!(
        exists(&hook_marker),
        "control: the planted hook did not run\n{}",
        out.dump()
    );
}

#[test]
fn a_git_config_symlink_is_moved_aside_not_followed() {
    // `.git/config` as a symlink to a file outside: moved aside, the
    // target untouched.
    let fx = Fixture::new();
    write(fx.outside.join("cfg"), "[core]\n\tfsmonitor = evil\n");
    let out = run(fx.sh(
        "workspace-write",
        &[],
        &format!(
            "git init -q && rm .git/config && ln -s {} .git/config && echo DONE",
            fx.outside.join("cfg").display()
        ),
    ));
    out.expect_stdout_has("DONE");
    assert!(
        std::fs::symlink_metadata(fx.w(".git/config")).is_err(),
        "{}",
        out.dump()
    );
    assert_eq!(
        read(fx.outside.join("cfg")).as_deref(),
        Some("[core]\n\tfsmonitor = evil\n")
    );
}

#[test]
fn a_nested_repository_created_by_the_command_is_kept_and_neutralised() {
    let fx = Fixture::new();
    host_repo(&fx, &fx.ws);
    let (m, _) = marker(&fx, "FSMONITOR-NESTED");
    let script = format!(
        "mkdir -p deep/er && git init -q deep/er/sub && git -C deep/er/sub config core.fsmonitor 'touch {m};:' && \
         git -C deep/er/sub config user.name Nested && echo hi > deep/er/sub/f && \
         git worktree add -q wt2 2>&1 && echo INITED",
        m = m.display()
    );
    let out = run(fx.sh("workspace-write", &[], &script));
    out.expect_stdout_has("INITED");
    let sub = fx.w("deep/er/sub");
    assert!(
        exists(sub.join(".git/HEAD")),
        "the nested repository was removed\n{}",
        out.dump()
    );
    let name = host_git(&fx, &sub, &["config", "--get", "user.name"]);
    assert_eq!(
        String::from_utf8_lossy(&name.stdout).trim(),
        "Nested",
        "{}",
        out.dump()
    );
    let _ = host_git(&fx, &sub, &["status"]);
    assert!(
        !exists(&m),
        "the host's git status in the nested repository ran its fsmonitor\n{}",
        out.dump()
    );
    // A linked worktree the command added keeps working from the host.
    let st = host_git(&fx, &fx.w("wt2"), &["status"]);
    assert!(
        st.status.success(),
        "the command's worktree was broken: {st:?}\n{}",
        out.dump()
    );
}

#[test]
fn a_gitfile_pointing_outside_the_workspace_git_is_neutralised() {
    let fx = Fixture::new();
    let (m, line) = marker(&fx, "FSMONITOR-GITFILE");
    let script = format!(
        "mkdir -p evil/objects evil/refs/heads sub && echo 'ref: refs/heads/main' > evil/HEAD && \
         printf '[core]\\n\\trepositoryformatversion = 0\\n{}' > evil/config && \
         echo \"gitdir: $PWD/evil\" > sub/.git && echo PLANTED",
        line.replace('\t', "\\t").replace('\n', "\\n")
    );
    let out = run(fx.sh("workspace-write", &[], &script));
    out.expect_stdout_has("PLANTED");
    let _ = host_git(&fx, &fx.w("sub"), &["status"]);
    assert!(
        !exists(&m),
        "the planted gitfile made the host's git run an fsmonitor\n{}",
        out.dump()
    );
}

/// A path the sweep cannot neutralise (here: made immutable on the host
/// while the command runs, which only root can do) is never reported done:
/// red on stderr, `sweep_failed` in `--json`, exit 122.
#[test]
fn what_the_sweep_cannot_remove_fails_the_run_with_122_contract() {
    if euid() != 0 {
        skip("needs root to make a file immutable (chattr +i) during the run");
        return;
    }
    let fx = Fixture::new();
    let go = fx.w("go");
    let mut c = fx.sh(
        "workspace-write",
        &["--json", "--timeout", "60s"],
        "echo x > .mcp.json && echo READY > ready; while [ ! -e go ]; do sleep 0.05; done; echo DONE",
    );
    c.stdout(std::process::Stdio::piped());
    let child = spawn(c);
    let ready = fx.w("ready");
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !exists(&ready) && std::time::Instant::now() < limit {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let st = Command::new("chattr")
        .arg("+i")
        .arg(fx.w(".mcp.json"))
        .status()
        .unwrap();
    assert!(st.success(), "chattr +i failed");
    write(&go, "go\n");
    let out = child.wait();
    let _ = Command::new("chattr")
        .arg("-i")
        .arg(fx.w(".mcp.json"))
        .status();
    out.expect_code(122);
    let v = out.json();
    let failed = v["sweep_failed"].to_string();
    assert!(failed.contains(".mcp.json"), "{}", out.dump());
    assert!(out.stderr.contains("NOT NEUTRALISED"), "{}", out.dump());
    let log = read(fx.home.join(".local/state/moat/audit.jsonl")).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("sandbox.sweep_failed") && l.contains(".mcp.json")),
        "the audit log does not record the failure:\n{log}"
    );
    assert!(
        v["swept"].is_null() || !v["swept"].to_string().contains(".mcp.json"),
        "reported done: {}",
        out.dump()
    );
}

#[test]
fn a_listable_but_unsearchable_directory_stops_the_run() {
    // `chmod a-x config`: the walk sees the `.env` name but cannot stat it;
    // a later command (same owner) could add the bit back and read it.
    let fx = Fixture::new();
    write(fx.w("config/.env"), &format!("TOKEN={}\n", fx.env_secret));
    std::fs::set_permissions(fx.w("config"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(fx.sh(
        "workspace-write",
        &[],
        "chmod u+x config; cat config/.env; echo RAN",
    ));
    std::fs::set_permissions(fx.w("config"), std::fs::Permissions::from_mode(0o755)).unwrap();
    out.expect_absent(&fx.env_secret, "config/.env behind chmod a-x");
    if euid() != 0 {
        out.expect_code(125);
    } else {
        out.expect_stdout_has("RAN");
    }
}

#[test]
fn a_fifo_planted_as_git_config_cannot_hang_the_sweep() {
    let fx = Fixture::new();
    let mut c = fx.sh(
        "workspace-write",
        &[],
        "git init -q && rm .git/config && mkfifo .git/config && mkfifo .git/commondir && echo PLANTED",
    );
    c.env("GIT_CONFIG_NOSYSTEM", "1");
    let out = spawn(c).wait_limit(std::time::Duration::from_secs(60));
    out.expect_stdout_has("PLANTED");
    assert!(out.code.is_some(), "moat hung on a FIFO\n{}", out.dump());
    assert!(
        std::fs::symlink_metadata(fx.w(".git/config")).is_err(),
        "{}",
        out.dump()
    );
    assert!(
        std::fs::symlink_metadata(fx.w(".git/commondir")).is_err(),
        "{}",
        out.dump()
    );
}

#[test]
fn a_hook_cannot_be_live_even_during_the_run_in_a_repo_without_hooks() {
    // Prevention: an existing .git without `hooks` gets an empty read-only
    // one before the run, so a host `git commit` during the run cannot run
    // a hook the command planted.
    let fx = Fixture::new();
    host_repo(&fx, &fx.ws);
    std::fs::remove_dir_all(fx.w(".git/hooks")).unwrap();
    let out = run(fx.sh(
        "workspace-write",
        &[],
        "mkdir -p .git/hooks; if echo evil > .git/hooks/pre-commit; then echo WRITTEN; else echo BLOCKED; fi",
    ));
    out.expect_stdout_has("BLOCKED");
    assert!(!out.stdout.contains("WRITTEN"), "{}", out.dump());
    assert!(!exists(fx.w(".git/hooks/pre-commit")), "{}", out.dump());
}

#[test]
fn moats_own_dirs_are_never_taken_for_the_commands() {
    // moat creates ~/.config/moat and ~/.local/state/moat before a run; the
    // sweep must see them as existing, not as something the command made.
    let fx = Fixture::home_as_workspace();
    let out = run(fx.sh("workspace-write", &[], "echo RAN"));
    out.expect_stdout_has("RAN");
    assert!(fx.home.join(".config/moat").is_dir(), "{}", out.dump());
    assert!(
        quarantined_under(&fx.home.join(".config")).is_empty(),
        "moat swept its own dir: {:?}\n{}",
        quarantined_under(&fx.home.join(".config")),
        out.dump()
    );
    assert!(!out.stderr.contains("denied create"), "{}", out.dump());
}
