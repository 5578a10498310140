//! Red-team of the edges a run leaves behind: what the host's git runs
//! later in the workspace. Each case plants something from inside the
//! sandbox, then runs the host's own `git` in the workspace after the run
//! and asserts the planted program did not run (its marker file is absent).

use std::path::Path;
use std::process::Command;

use moat_conformance::*;

/// The host's `git` in `dir`, with no global or system config (HOME is the
/// fixture's), as a user's shell prompt or IDE runs it after the run.
fn host_git(dir: &Path, home: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .args(["-c", "user.email=a@b", "-c", "user.name=a"])
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("run git")
}

fn git_ok(dir: &Path, home: &Path, args: &[&str]) {
    let out = host_git(dir, home, args);
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A bare repository is a git dir without a `.git`: git takes any
/// directory holding `HEAD`, `objects` and `refs` for one and reads its
/// `config` when it starts there. A command that leaves one in the
/// workspace (`git init --bare sub` plus `core.fsmonitor`, `core.bare =
/// false`, `core.worktree = .`) has the host's `git status` in that
/// directory run its program; so does one that turns the workspace root
/// itself into a git dir.
#[test]
fn bare_git_dir_left_in_the_workspace_runs_nothing_on_the_host() {
    let plant = |dir: &str, marker: &str| {
        format!(
            "mkdir -p {dir}/objects {dir}/refs {dir}/hooks && echo 'ref: refs/heads/main' > {dir}/HEAD && \
             printf '[core]\\n\\tfsmonitor = \"touch {marker}; false\"\\n\\tbare = false\\n\\tworktree = .\\n' > {dir}/config && \
             printf '#!/bin/sh\\ntouch {marker}\\n' > {dir}/hooks/post-checkout && chmod +x {dir}/hooks/post-checkout && echo planted"
        )
    };
    for level in ["workspace-write", "workspace-contained"] {
        // Below a repository the workspace has, and at a workspace root
        // that has none.
        for (with_repo, dir) in [(true, "vendor/lib"), (false, ".")] {
            let fx = Fixture::new();
            if with_repo {
                git_ok(&fx.ws, &fx.home, &["init", "-q", "."]);
                git_ok(
                    &fx.ws,
                    &fx.home,
                    &["commit", "-q", "--allow-empty", "-m", "init"],
                );
            }
            let marker = fx.root.join("PWNED");
            let out = run(fx.sh(
                level,
                &["--no-audit"],
                &plant(dir, &marker.display().to_string()),
            ));
            assert!(
                out.stdout.contains("planted"),
                "control: the command ran\n{}",
                out.dump()
            );
            let gd = fx.ws.join(dir);
            let st = host_git(&gd, &fx.home, &["status"]);
            assert!(
                !exists(&marker),
                "{level}, {dir}: the host's `git status` ran the planted fsmonitor\n{}\ngit: {}",
                out.dump(),
                String::from_utf8_lossy(&st.stderr)
            );
            assert!(
                !exists(gd.join("hooks/post-checkout")),
                "{level}, {dir}: the planted hook survived the run\n{}",
                out.dump()
            );
            // The repository itself stays (only what runs goes), and the
            // sweep says what it removed.
            assert!(exists(gd.join("HEAD")), "{level}, {dir}: HEAD removed");
            assert!(
                out.stderr.contains("core.fsmonitor"),
                "{level}, {dir}: the removal is not reported\n{}",
                out.dump()
            );
        }
    }
}

/// A bare repository that is already in the workspace (a test fixture, a
/// local remote) gets what a `.git` gets during the run: its hooks and
/// config are read-only.
#[test]
fn existing_bare_git_dir_in_the_workspace_is_write_protected() {
    let fx = Fixture::new();
    let out = host_git(&fx.ws, &fx.home, &["init", "-q", "--bare", "remote.git"]);
    assert!(out.status.success(), "git init --bare failed");
    let bare = fx.ws.join("remote.git");
    let config_before = read(bare.join("config")).unwrap_or_default();
    for level in ["workspace-write", "workspace-contained"] {
        let out = run(fx.sh(
            level,
            &["--no-audit"],
            "echo '[core] fsmonitor = \"touch x\"' >> remote.git/config; \
             printf '#!/bin/sh\\n' > remote.git/hooks/post-receive; echo ran",
        ));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        assert_eq!(
            read(bare.join("config")).unwrap_or_default(),
            config_before,
            "{level}: the bare repository's config was changed\n{}",
            out.dump()
        );
        assert!(
            !exists(bare.join("hooks/post-receive")),
            "{level}: a hook was planted in the bare repository\n{}",
            out.dump()
        );
    }
}

/// `core.hooksPath` moves the hooks git runs out of `.git/hooks`, often
/// into the work tree (husky's `.husky/_`, a `.githooks` directory): there
/// they are as live on the host as `.git/hooks` and must be as read-only.
/// One the command creates where the config points is swept.
#[test]
fn hooks_path_in_the_workspace_is_write_protected() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        git_ok(&fx.ws, &fx.home, &["init", "-q", "."]);
        let marker = fx.root.join("PWNED");
        let hook = format!("#!/bin/sh\ntouch {}\n", marker.display());
        write(fx.ws.join(".husky/_/pre-commit"), "#!/bin/sh\nexit 0\n");
        let chmod = Command::new("chmod")
            .arg("+x")
            .arg(fx.ws.join(".husky/_/pre-commit"))
            .status()
            .expect("chmod");
        assert!(chmod.success());
        git_ok(&fx.ws, &fx.home, &["config", "core.hooksPath", ".husky/_"]);
        // A second repository whose hooks directory does not exist yet.
        let sub = fx.ws.join("sub");
        std::fs::create_dir(&sub).expect("mkdir sub");
        git_ok(&sub, &fx.home, &["init", "-q", "."]);
        git_ok(&sub, &fx.home, &["config", "core.hooksPath", ".githooks"]);
        let script = format!(
            "printf '{hook}' > .husky/_/pre-commit; mkdir -p sub/.githooks && printf '{hook}' > sub/.githooks/pre-commit && \
             chmod +x sub/.githooks/pre-commit; echo ran",
            hook = hook.replace('\n', "\\n")
        );
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        for dir in [&fx.ws, &sub] {
            let _ = host_git(dir, &fx.home, &["commit", "-q", "--allow-empty", "-m", "x"]);
        }
        assert!(
            !exists(&marker),
            "{level}: the host's `git commit` ran a hook the command wrote through core.hooksPath\n{}",
            out.dump()
        );
    }
}

/// A repository's config that includes a file in the work tree (`[include]
/// path = ../project.gitconfig`, a common way to share settings) makes
/// that file as live as `.git/config`: a `core.fsmonitor` written there
/// runs on the next host `git status`.
#[test]
fn config_included_from_the_workspace_is_write_protected() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        git_ok(&fx.ws, &fx.home, &["init", "-q", "."]);
        write(fx.ws.join("project.gitconfig"), "[user]\n\tname = a\n");
        git_ok(
            &fx.ws,
            &fx.home,
            &["config", "include.path", "../project.gitconfig"],
        );
        git_ok(
            &fx.ws,
            &fx.home,
            &[
                "config",
                "--add",
                "includeIf.onbranch:main.path",
                "../later.gitconfig",
            ],
        );
        let marker = fx.root.join("PWNED");
        let script = format!(
            "printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' > project.gitconfig; \
             printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' > later.gitconfig; echo ran",
            m = marker.display()
        );
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        let _ = host_git(&fx.ws, &fx.home, &["checkout", "-q", "-b", "main"]);
        let _ = host_git(&fx.ws, &fx.home, &["status"]);
        assert!(
            !exists(&marker),
            "{level}: the host's git ran an fsmonitor the command wrote into an included config\n{}",
            out.dump()
        );
    }
}

/// A hooks path that is the workspace root itself cannot be kept
/// read-only without making the whole workspace read-only: moat refuses
/// the run (exit 125, naming the key and the fix) instead of running it
/// with live hooks.
#[test]
fn hooks_path_at_the_workspace_root_is_refused() {
    let fx = Fixture::new();
    git_ok(&fx.ws, &fx.home, &["init", "-q", "."]);
    git_ok(&fx.ws, &fx.home, &["config", "core.hooksPath", "."]);
    let out = run(fx.sh("workspace-write", &["--no-audit"], "echo ran"));
    assert_eq!(out.code, Some(125), "{}", out.dump());
    assert!(!out.stdout.contains("ran"), "{}", out.dump());
    assert!(out.stderr.contains("core.hooksPath"), "{}", out.dump());
}

/// At workspace-contained a directory grant is the only way the command
/// sees another project: `--ro ~/other` / `--rw ~/other` must not show
/// that project's `.env` files (at its root or deeper) or the token in its
/// `.git/config`, exactly as the workspace's are not shown. Naming the
/// file itself opts it in.
#[test]
fn directory_grant_at_contained_hides_env_files_and_git_credentials() {
    let fx = Fixture::new();
    let other = fx.outside.join("proj");
    write(other.join(".env"), &format!("A={}\n", fx.env_secret));
    write(
        other.join("app/.env.local"),
        &format!("B={}\n", fx.env_secret),
    );
    write(other.join("README"), "public\n");
    git_ok(&other, &fx.home, &["init", "-q", "."]);
    let token = unique("ghp_GRANTTOKEN");
    git_ok(
        &other,
        &fx.home,
        &[
            "remote",
            "add",
            "origin",
            &format!("https://{token}@github.com/o/r"),
        ],
    );
    let o = other.display().to_string();
    for mode in ["--ro", "--rw"] {
        let out = run(fx.sh(
            "workspace-contained",
            &["--no-audit", mode, &o],
            &format!("cat {o}/README; cat {o}/.env {o}/app/.env.local {o}/.git/config; git -C {o} remote -v"),
        ));
        assert!(
            out.stdout.contains("public"),
            "control: the grant is visible\n{}",
            out.dump()
        );
        assert!(
            !out.stdout.contains(&fx.env_secret),
            "{mode}: a .env of the granted directory was readable\n{}",
            out.dump()
        );
        assert!(
            !out.stdout.contains(&token),
            "{mode}: the token in the granted checkout's .git/config was readable\n{}",
            out.dump()
        );
        assert!(
            out.stdout.contains("github.com/o/r"),
            "{mode}: git no longer reads the granted checkout's remote\n{}",
            out.dump()
        );
    }
    // Opting in: the file named exactly is shown raw.
    let out = run(fx.sh(
        "workspace-contained",
        &["--no-audit", "--ro", &o, "--ro", &format!("{o}/.env")],
        &format!("cat {o}/.env"),
    ));
    assert!(
        out.stdout.contains(&fx.env_secret),
        "opt-in by name\n{}",
        out.dump()
    );
}

/// A writable grant that is a bare repository (`--rw ~/remote.git`, so
/// the command can push to a local remote) must not let the command plant
/// a hook there: the host's next push into it would run the hook.
#[test]
fn writable_grant_of_a_bare_repository_keeps_its_hooks_and_config() {
    let fx = Fixture::new();
    let remote = fx.outside.join("remote.git");
    let out = host_git(
        &fx.outside,
        &fx.home,
        &["init", "-q", "--bare", "remote.git"],
    );
    assert!(out.status.success(), "git init --bare failed");
    let config_before = read(remote.join("config")).unwrap_or_default();
    let r = remote.display().to_string();
    let marker = fx.root.join("PWNED");
    for level in ["read-only", "workspace-write", "workspace-contained"] {
        let out = run(fx.sh(
            level,
            &["--no-audit", "--rw", &r],
            &format!(
                "printf '#!/bin/sh\\ntouch {m}\\n' > {r}/hooks/post-receive; chmod +x {r}/hooks/post-receive; \
                 printf '[core]\\n\\tfsmonitor = \"touch {m}\"\\n' >> {r}/config; touch {r}/granted; echo ran",
                m = marker.display()
            ),
        ));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        assert!(
            exists(remote.join("granted")),
            "control: the grant is writable\n{}",
            out.dump()
        );
        assert!(
            !exists(remote.join("hooks/post-receive")),
            "{level}: a hook was planted in the granted bare repository\n{}",
            out.dump()
        );
        assert_eq!(
            read(remote.join("config")).unwrap_or_default(),
            config_before,
            "{level}: the granted bare repository's config was changed\n{}",
            out.dump()
        );
        std::fs::remove_file(remote.join("granted")).expect("rm granted");
    }
}

/// A program outside the contained view is refused with the flag that
/// shows it, and that flag, used as printed, makes it run: for a program
/// installed the way npm installs one (a `bin/NAME` symlink into
/// `lib/node_modules/@scope/name/`, reading its own package files), the
/// link's path alone (`--ro bin/NAME`) resolves to the target file and
/// leaves the link missing, so the hint must name what holds both.
#[test]
fn hint_for_a_program_outside_the_view_works_as_printed() {
    let fx = Fixture::new();
    let prefix = fx.outside.join("agents");
    let pkg = prefix.join("lib/node_modules/@acme/tool");
    let marker = unique("PKGJSON");
    write(
        pkg.join("package.json"),
        &format!("{{\"name\":\"{marker}\"}}\n"),
    );
    write(
        pkg.join("bin/tool.sh"),
        "#!/bin/sh\ncat \"$(dirname \"$(readlink -f \"$0\")\")/../package.json\"\n",
    );
    let chmod = Command::new("chmod")
        .arg("+x")
        .arg(pkg.join("bin/tool.sh"))
        .status()
        .expect("chmod");
    assert!(chmod.success());
    std::fs::create_dir_all(prefix.join("bin")).expect("mkdir bin");
    std::os::unix::fs::symlink(
        "../lib/node_modules/@acme/tool/bin/tool.sh",
        prefix.join("bin/tool"),
    )
    .expect("symlink");
    for program in [prefix.join("bin/tool"), pkg.join("bin/tool.sh")] {
        let p = program.display().to_string();
        let out = run(fx.moat([
            "exec",
            "--policy",
            "workspace-contained",
            "--no-audit",
            "--",
            &p,
        ]));
        assert_eq!(
            out.code,
            Some(127),
            "{p}: refused as not found\n{}",
            out.dump()
        );
        let hint = out
            .stderr
            .split("add ")
            .nth(1)
            .and_then(|h| h.split(" to show it").next())
            .unwrap_or_default()
            .to_string();
        assert!(
            hint.starts_with("--ro /"),
            "{p}: a concrete flag in the hint\n{}",
            out.dump()
        );
        let mut args = vec!["exec", "--policy", "workspace-contained", "--no-audit"];
        args.extend(hint.split(' '));
        args.extend(["--", &p]);
        let out = run(fx.moat(args));
        assert!(
            out.code == Some(0) && out.stdout.contains(&marker),
            "{p}: the program did not run with the hint's flags ({hint})\n{}",
            out.dump()
        );
    }
}

/// A writable grant holding repositories below its root (`--rw
/// ~/projects`): their hooks and config stay read-only during the run (as
/// the workspace's nested checkouts' do), a repository the command creates
/// there keeps no hook and no program-running key, and the user's own
/// hooks are left alone.
#[test]
fn writable_grant_keeps_the_git_dirs_below_it_inert() {
    for level in ["read-only", "workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        let projects = fx.outside.join("projects");
        let a = projects.join("a");
        std::fs::create_dir_all(&a).expect("mkdir a");
        git_ok(&a, &fx.home, &["init", "-q", "."]);
        write(a.join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n");
        let a_config = read(a.join(".git/config")).unwrap_or_default();
        let marker = fx.root.join("PWNED");
        let m = marker.display();
        let p = projects.display().to_string();
        let script = format!(
            "cd {p} && printf '#!/bin/sh\\ntouch {m}\\n' > a/.git/hooks/post-checkout; \
             printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' >> a/.git/config; \
             git init -q b && printf '#!/bin/sh\\ntouch {m}\\n' > b/.git/hooks/post-checkout && chmod +x b/.git/hooks/post-checkout && \
             git -C b config core.fsmonitor 'touch {m}; false' && echo ran"
        );
        let out = run(fx.sh(level, &["--no-audit", "--rw", &p], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        assert_eq!(
            read(a.join(".git/config")).unwrap_or_default(),
            a_config,
            "{level}: an existing repository's config below the grant was changed\n{}",
            out.dump()
        );
        assert!(
            !exists(a.join(".git/hooks/post-checkout")),
            "{level}: a hook was written into an existing repository below the grant\n{}",
            out.dump()
        );
        assert!(
            exists(a.join(".git/hooks/pre-commit")),
            "{level}: the user's own hook was moved\n{}",
            out.dump()
        );
        let _ = host_git(&projects.join("b"), &fx.home, &["status"]);
        assert!(
            !exists(&marker),
            "{level}: the host's git ran what the command left in a new repository below the grant\n{}",
            out.dump()
        );
        assert!(
            !exists(projects.join("b/.git/hooks/post-checkout")),
            "{level}: the new repository kept its hook\n{}",
            out.dump()
        );
    }
}

/// Git hook managers keep the commands git hooks run in the work tree:
/// husky v9 points `core.hooksPath` at `.husky/_`, whose stubs run
/// `.husky/<hook>`; pre-commit and lefthook run what their config files
/// name. A command that edits them has the host's next `git commit` run
/// its code, so they are write-protected like `.git/hooks` (new ones are
/// moved aside after the run).
#[test]
fn git_hook_manager_configs_are_write_protected() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        git_ok(&fx.ws, &fx.home, &["init", "-q", "."]);
        // husky v9's layout: a stub in .husky/_ that runs .husky/pre-commit.
        write(
            fx.ws.join(".husky/_/pre-commit"),
            "#!/bin/sh\ns=\"$(dirname \"$(dirname \"$0\")\")/$(basename \"$0\")\"\n[ -f \"$s\" ] && sh -e \"$s\"\nexit 0\n",
        );
        write(fx.ws.join(".husky/pre-commit"), "exit 0\n");
        let chmod = Command::new("chmod")
            .arg("+x")
            .arg(fx.ws.join(".husky/_/pre-commit"))
            .status()
            .expect("chmod");
        assert!(chmod.success());
        git_ok(&fx.ws, &fx.home, &["config", "core.hooksPath", ".husky/_"]);
        write(fx.ws.join(".pre-commit-config.yaml"), "repos: []\n");
        let marker = fx.root.join("PWNED");
        let m = marker.display();
        let script = format!(
            "echo 'touch {m}' > .husky/pre-commit; \
             printf 'repos:\\n- repo: local\\n  hooks:\\n  - id: x\\n    name: x\\n    entry: touch {m}\\n    language: system\\n' > .pre-commit-config.yaml; \
             printf 'pre-commit:\\n  commands:\\n    x:\\n      run: touch {m}\\n' > lefthook.yml; echo ran"
        );
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        let _ = host_git(
            &fx.ws,
            &fx.home,
            &["commit", "-q", "--allow-empty", "-m", "x"],
        );
        assert!(
            !exists(&marker),
            "{level}: the host's `git commit` ran the husky script the command wrote\n{}",
            out.dump()
        );
        assert_eq!(
            read(fx.ws.join(".pre-commit-config.yaml")).unwrap_or_default(),
            "repos: []\n",
            "{level}: .pre-commit-config.yaml was changed\n{}",
            out.dump()
        );
        assert!(
            !exists(fx.ws.join("lefthook.yml")),
            "{level}: a new lefthook.yml survived the run\n{}",
            out.dump()
        );
    }
}

/// A submodule's git dir (`.git/modules/NAME`) may keep `core.worktree`,
/// which `git submodule add` writes — but only where it points into the
/// workspace. Pointed at a directory outside, the host's next checkout in
/// that submodule writes the submodule's files there (`~/.bashrc`).
#[test]
fn submodule_worktree_outside_the_workspace_is_dropped() {
    let fx = Fixture::new();
    let src = fx.outside.join("subsrc");
    std::fs::create_dir_all(&src).expect("mkdir");
    git_ok(&src, &fx.home, &["init", "-q", "."]);
    write(src.join("payload"), "from the submodule\n");
    git_ok(&src, &fx.home, &["add", "payload"]);
    git_ok(&src, &fx.home, &["commit", "-q", "-m", "x"]);
    let victim = fx.outside.join("victim");
    std::fs::create_dir_all(&victim).expect("mkdir victim");
    for level in ["workspace-write", "workspace-contained"] {
        let ws = fx.ws.join(level);
        std::fs::create_dir_all(&ws).expect("mkdir ws");
        git_ok(&ws, &fx.home, &["init", "-q", "."]);
        git_ok(
            &ws,
            &fx.home,
            &["commit", "-q", "--allow-empty", "-m", "init"],
        );
        let script = format!(
            "git -c protocol.file.allow=always submodule add -q file://{src} sub 2>/dev/null; \
             git config -f .git/modules/sub/config core.worktree {victim} && echo ran",
            src = src.display(),
            victim = victim.display()
        );
        let out = run(fx.sh(
            level,
            &[
                "--no-audit",
                "--cwd",
                &ws.display().to_string(),
                "--ro",
                &src.display().to_string(),
            ],
            &script,
        ));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        let _ = host_git(&ws.join("sub"), &fx.home, &["checkout", "-f", "-q", "HEAD"]);
        assert!(
            !exists(victim.join("payload")),
            "{level}: the host's checkout in the submodule wrote outside the workspace\n{}",
            out.dump()
        );
    }
}

/// `git push` to a repository on this machine outside the writable area
/// fails with git's "remote unpack failed", which names no path and no
/// errno; moat still says which repository was refused and which flag
/// grants it, and the remote is unchanged.
#[test]
fn push_to_a_read_only_local_remote_names_the_flag() {
    let fx = Fixture::new();
    let out = host_git(
        &fx.outside,
        &fx.home,
        &["init", "-q", "--bare", "remote.git"],
    );
    assert!(out.status.success());
    let remote = fx.outside.join("remote.git");
    let script = format!(
        "git clone -q file://{r} r 2>/dev/null; cd r && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m one && git push -q origin HEAD; echo pushed",
        r = remote.display()
    );
    let out = run(fx.sh("workspace-write", &["--no-audit"], &script));
    assert!(
        out.stdout.contains("pushed"),
        "control: the command ran\n{}",
        out.dump()
    );
    assert!(
        !exists(remote.join("refs/heads/master")) && !exists(remote.join("refs/heads/main")),
        "the read-only remote received the push\n{}",
        out.dump()
    );
    assert!(
        out.stderr
            .contains(&format!("moat: denied write {} ", remote.display()))
            && out.stderr.contains("--rw"),
        "the refusal does not name the repository and the flag\n{}",
        out.dump()
    );
}

/// Mercurial's `.hg/hgrc` and Jujutsu's repo and workspace config run
/// programs on the host (`[hooks]`, `fix.tools`, `ui.pager`) exactly like
/// `.git/config`: write-protected in every admin dir at any depth, and what
/// the command creates there (a new repository's config, an admin dir's
/// config where there was none) moved aside after the run while the
/// repository itself is kept.
#[test]
fn hg_and_jj_config_at_any_depth_is_write_protected() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        let existing = [".hg/hgrc", "sub/.hg/hgrc", "vendor/x/.jj/repo/config.toml"];
        for p in existing {
            write(fx.ws.join(p), "[ui]\n");
        }
        // A secondary jj workspace: `.jj/repo` is a file naming the
        // repository jj reads its config from.
        write(fx.ws.join("second/.jj/repo"), "/nonexistent/.jj/repo\n");
        std::fs::create_dir_all(fx.ws.join("deep/er/.hg")).unwrap();
        std::fs::create_dir_all(fx.ws.join("vendor/x/.jj/repo/store")).unwrap();
        let created = [
            "deep/er/.hg/hgrc",
            "vendor/x/.jj/workspace-config.toml",
            ".jj/repo/config.toml",
            "new/a/.hg/hgrc",
            "new/b/.jj/repo/config.toml",
            "new/b/.jj/repo/config-id",
        ];
        let script = existing
            .iter()
            .map(|p| format!("printf '[hooks]\\npre-status = touch PWNED\\n' >> {p}; "))
            .chain(created.iter().map(|p| {
                format!(
                    "mkdir -p $(dirname {p}); printf '[hooks]\\npre-status = touch PWNED\\n' > {p}; "
                )
            }))
            .collect::<String>()
            + "mkdir -p evil && printf '[hooks]\\npre-status = touch PWNED\\n' > evil/config.toml; \
               echo \"$PWD/evil\" > second/.jj/repo; echo ran";
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        assert_eq!(
            read(fx.ws.join("second/.jj/repo")).as_deref(),
            Some("/nonexistent/.jj/repo\n"),
            "{level}: the command repointed a jj workspace at a repository of its own\n{}",
            out.dump()
        );
        for p in existing {
            assert_eq!(
                read(fx.ws.join(p)).as_deref(),
                Some("[ui]\n"),
                "{level}: the user's {p} changed or went\n{}",
                out.dump()
            );
        }
        for p in created {
            let text = read(fx.ws.join(p)).unwrap_or_default();
            assert!(
                !text.contains("PWNED"),
                "{level}: {p} holds the hook the command wrote (the host's hg/jj would run it)\n{}",
                out.dump()
            );
        }
        // The repositories the command made are kept, only their config went.
        for d in ["new/a/.hg", "new/b/.jj/repo", ".jj/repo"] {
            assert!(
                fx.ws.join(d).is_dir(),
                "{level}: {d} itself was removed\n{}",
                out.dump()
            );
        }
    }
}

/// An `%include PATH` in an `.hg/hgrc` makes the included file (relative
/// to the hgrc's directory) as live as the hgrc: its `[hooks]` run on the
/// host's next `hg status`. Existing ones are read-only, one that does not
/// exist yet is moved aside after the run if the command creates it.
#[test]
fn hgrc_included_file_in_the_workspace_is_write_protected() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        write(
            fx.ws.join(".hg/hgrc"),
            "[ui]\n%include ../shared.hgrc\n%include ../conf/later.rc\n",
        );
        write(fx.ws.join("shared.hgrc"), "%include nested.rc\n");
        write(fx.ws.join("nested.rc"), "[ui]\n");
        std::fs::create_dir_all(fx.ws.join("conf")).unwrap();
        let hook = "printf '[hooks]\\npre-status = touch PWNED\\n'";
        let script =
            format!("{hook} >> shared.hgrc; {hook} >> nested.rc; {hook} > conf/later.rc; echo ran");
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        for p in ["shared.hgrc", "nested.rc", "conf/later.rc"] {
            assert!(
                !read(fx.ws.join(p)).unwrap_or_default().contains("PWNED"),
                "{level}: {p}, included from .hg/hgrc, holds the hook the command wrote\n{}",
                out.dump()
            );
        }
    }
}

/// A write-protected path that is a symlink is protected where the host's
/// tool will open it: the end of the chain is read-only (a `.git/config ->
/// ../project.gitconfig`, a `.vscode -> editor/vscode`), a dangling link's
/// target (`.git/hooks -> ../githooks`) is swept when the command creates
/// it, and a link the command retargets or replaces is moved aside.
#[test]
fn symlinked_write_protected_paths_are_protected_where_they_lead() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        git_ok(&fx.ws, &fx.home, &["init", "-q", "."]);
        std::fs::rename(fx.ws.join(".git/config"), fx.ws.join("project.gitconfig")).unwrap();
        std::os::unix::fs::symlink("../project.gitconfig", fx.ws.join(".git/config")).unwrap();
        std::fs::remove_dir_all(fx.ws.join(".git/hooks")).unwrap();
        std::os::unix::fs::symlink("../githooks", fx.ws.join(".git/hooks")).unwrap();
        // Two links on the way: `.vscode -> editor/vscode`, `editor -> real-editor`.
        std::fs::create_dir_all(fx.ws.join("real-editor/vscode")).unwrap();
        std::os::unix::fs::symlink("real-editor", fx.ws.join("editor")).unwrap();
        std::os::unix::fs::symlink("editor/vscode", fx.ws.join(".vscode")).unwrap();
        let marker = fx.root.join("PWNED");
        let m = marker.display();
        let script = format!(
            "printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' >> project.gitconfig; \
             mkdir -p githooks && printf '#!/bin/sh\\ntouch {m}\\n' > githooks/post-checkout && chmod +x githooks/post-checkout; \
             echo '{{\"tasks\":[]}}' > editor/vscode/tasks.json; echo ran"
        );
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        let _ = host_git(&fx.ws, &fx.home, &["status"]);
        let _ = host_git(&fx.ws, &fx.home, &["checkout", "-q", "-b", "x"]);
        assert!(
            !exists(&marker),
            "{level}: the host's git ran what the command wrote through a symlinked .git/config or .git/hooks\n{}",
            out.dump()
        );
        assert!(
            !exists(fx.ws.join("editor/vscode/tasks.json")),
            "{level}: the command wrote tasks.json where the .vscode link leads\n{}",
            out.dump()
        );
        // Retargeting the links instead.
        let script = format!(
            "printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' > evil.gitconfig; \
             rm .git/config && ln -s ../evil.gitconfig .git/config; \
             mkdir -p evil/vscode && echo '{{\"tasks\":[]}}' > evil/vscode/tasks.json && rm editor && ln -s evil editor; echo ran"
        );
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        let _ = host_git(&fx.ws, &fx.home, &["status"]);
        assert!(
            !exists(&marker),
            "{level}: the host's git ran the fsmonitor of a config the command relinked\n{}",
            out.dump()
        );
        assert!(
            !exists(fx.ws.join(".vscode/tasks.json")),
            "{level}: .vscode/tasks.json reaches the command's file through a link it relinked\n{}",
            out.dump()
        );
    }
}

/// A symlink the command leaves in the workspace that leads to a secret,
/// into one, to a directory holding one (the home, `/`) or a secret path
/// that does not exist yet, or into or through `/proc` (a host tool's own
/// environment, cwd and fds)
/// is removed after the run: a host tool or agent following it later would
/// read what the sandbox hid. So is one to a write-protected file of the
/// home (`~/.bashrc`): an agent writing "a project file" through it would
/// change the shell's startup file. Other links stay, and so does a link the
/// user made before the run.
#[test]
fn symlinks_left_to_secrets_are_removed_after_the_run() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        let h = fx.home.display();
        std::os::unix::fs::symlink(fx.home.join(".ssh"), fx.ws.join("users-own")).unwrap();
        let script = format!(
            "mkdir -p d && ln -s {h}/.ssh d/key && ln -s {h} home && ln -s / root && \
             ln -s {h}/.docker not-yet && ln -s /proc/self/environ env && ln -s d/key twice && \
             ln -s {h}/.bashrc rc && \
             ln -s /proc/self/cwd/README cwd && ln -s /dev/fd/1 fd && \
             ln -s ../README d/readme && ln -s /usr/share share && echo ran"
        );
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        // `cwd` and `fd` pass through /proc's magic links, which each
        // process resolves to its own cwd and fds: what moat reaches
        // through them says nothing of what a host tool following them
        // later reaches (its cwd's `../../.ssh/id_rsa`).
        for l in [
            "d/key", "home", "root", "not-yet", "env", "twice", "rc", "cwd", "fd",
        ] {
            assert!(
                !exists(fx.ws.join(l)),
                "{level}: the link {l} the command left to a secret is still there\n{}",
                out.dump()
            );
        }
        for l in ["d/readme", "share", "users-own"] {
            assert!(
                exists(fx.ws.join(l)),
                "{level}: the harmless link {l} was removed\n{}",
                out.dump()
            );
        }
    }
}

/// Two runs at once in one workspace, interleaved by marker files: the
/// first run's command runs `a_script` (it touches `a-ready` when its part
/// is done, then waits for `go-a`); the second run starts once `a-ready`
/// is there, so its walk sees what the first command made, and its command
/// touches `b-ready`, waits for `go-b`, then runs the rest of `b_script`.
/// The first run ends (its sweep runs) before the second command goes on.
/// Returns the second run's stderr. Hang guard: a marker that never comes
/// fails the case (the runs are killed when their handles drop).
fn two_interleaved_runs(fx: &Fixture, a_script: &str, b_script: &str) -> String {
    let wait = |p: &Path, what: &str| {
        let deadline = std::time::Instant::now() + SAFETY_TIMEOUT;
        while !exists(p) {
            assert!(
                std::time::Instant::now() < deadline,
                "hang guard: {what} never appeared"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let spawn = |script: String| {
        ChildGuard(
            fx.sh("workspace-write", &["--no-audit"], &script)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a run"),
        )
    };
    let finish = |mut g: ChildGuard, which: &str| -> String {
        let (mut stdout, mut stderr) = (String::new(), String::new());
        use std::io::Read;
        g.0.stdout.take().unwrap().read_to_string(&mut stdout).ok();
        g.0.stderr.take().unwrap().read_to_string(&mut stderr).ok();
        // Exited, so its sweep is done before the next step.
        g.0.wait().expect("wait for the run");
        assert!(
            stdout.contains("ran"),
            "control: the {which} command ran\n{stderr}"
        );
        stderr
    };
    let a = spawn(format!(
        "{a_script} && touch a-ready && while [ ! -e go-a ]; do sleep 0.05; done; echo ran"
    ));
    wait(&fx.ws.join("a-ready"), "the first command's a-ready");
    let b = spawn(format!(
        "touch b-ready && while [ ! -e go-b ]; do sleep 0.05; done; {b_script} && echo ran"
    ));
    // The second run's command runs after its walk recorded the links.
    wait(&fx.ws.join("b-ready"), "the second command's b-ready");
    std::fs::write(fx.ws.join("go-a"), "").unwrap();
    finish(a, "first");
    std::fs::write(fx.ws.join("go-b"), "").unwrap();
    finish(b, "second")
}

/// Two runs at once in one workspace: a link to a secret the first run's
/// command made is there when the second run's walk records the links
/// "before" it. The first run's sweep removes it; the second command then
/// makes it again, with the same target. A new link (a new inode), not the
/// one recorded, so the second sweep removes it too.
#[test]
fn a_link_to_a_secret_remade_by_a_concurrent_run_is_removed() {
    let fx = Fixture::new();
    let h = fx.home.display();
    let stderr = two_interleaved_runs(
        &fx,
        &format!("ln -s {h}/.ssh k"),
        &format!("rm -f k && ln -s {h}/.ssh k"),
    );
    assert!(
        !exists(fx.ws.join("k")),
        "the link to ~/.ssh the second command made again (same target as the one its walk saw) is still there\n{stderr}"
    );
}

/// Two runs at once, a symlinked `.vscode` (`.vscode -> editor/vscode`,
/// `editor -> real-editor`): the first run's command retargets `editor`
/// at a directory of its own holding a `tasks.json`, then the second run's
/// walk pins `editor` as it finds it. The first run's sweep moves the
/// retargeted link aside; the second command makes it again with the same
/// target. A new link, not the one pinned: moved aside too.
#[test]
fn a_pinned_link_remade_by_a_concurrent_run_is_moved_aside() {
    let fx = Fixture::new();
    std::fs::create_dir_all(fx.ws.join("real-editor/vscode")).unwrap();
    std::os::unix::fs::symlink("real-editor", fx.ws.join("editor")).unwrap();
    std::os::unix::fs::symlink("editor/vscode", fx.ws.join(".vscode")).unwrap();
    let stderr = two_interleaved_runs(
        &fx,
        "mkdir -p evil/vscode && echo '{\"tasks\":[]}' > evil/vscode/tasks.json && \
         rm editor && ln -s evil editor",
        "rm -f editor && ln -s evil editor",
    );
    assert!(
        !exists(fx.ws.join(".vscode/tasks.json")),
        ".vscode/tasks.json reaches the first command's file through the link the second command made again\n{stderr}"
    );
}

/// mise runs `[hooks] enter` and `[env] _.source` on `cd` from every
/// project config it reads, not only `mise.toml`: `mise.local.toml`,
/// `.mise/config.toml`, `.config/mise.toml`, `.config/mise/config.toml`…
/// An existing one stays as it was, a new one goes after the run.
#[test]
fn mise_project_configs_are_write_protected() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        write(fx.ws.join("mise.local.toml"), "[tools]\n");
        let hook = "printf '[hooks]\\nenter = \"touch PWNED\"\\n'";
        let created = [
            ".mise.local.toml",
            ".mise/config.toml",
            "mise/config.toml",
            ".config/mise.toml",
            ".config/mise/config.toml",
        ];
        let script = format!("{hook} >> mise.local.toml; ")
            + &created
                .iter()
                .map(|p| format!("mkdir -p $(dirname {p}); {hook} > {p}; "))
                .collect::<String>()
            + "echo ran";
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        assert_eq!(
            read(fx.ws.join("mise.local.toml")).as_deref(),
            Some("[tools]\n"),
            "{level}: mise.local.toml was changed\n{}",
            out.dump()
        );
        for p in created {
            assert!(
                !read(fx.ws.join(p)).unwrap_or_default().contains("PWNED"),
                "{level}: a new {p} with a hook survived the run\n{}",
                out.dump()
            );
        }
    }
}

/// Dotfiles kept in a repository: the home's startup files are symlinks
/// into the workspace (`~/.bashrc -> ~/dotfiles/bashrc`). The home is
/// outside the workspace, so read-only, but the host's next shell opens
/// what the link leads to: that file is write-protected in the workspace
/// (read-only, or moved aside when the link dangles and the command
/// creates it).
#[test]
fn home_startup_files_linked_into_the_workspace_are_write_protected() {
    use std::os::unix::fs::symlink;
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        write(fx.ws.join("bashrc"), "# rc\n");
        std::fs::create_dir_all(fx.ws.join("nvim")).unwrap();
        symlink(fx.ws.join("bashrc"), fx.home.join(".bashrc")).unwrap();
        symlink(fx.ws.join("profile"), fx.home.join(".profile")).unwrap();
        std::fs::create_dir_all(fx.home.join(".config")).unwrap();
        symlink(fx.ws.join("nvim"), fx.home.join(".config/nvim")).unwrap();
        let script = "echo 'touch PWNED' >> bashrc; echo 'touch PWNED' > profile; \
                      echo 'os.execute(\"touch PWNED\")' > nvim/init.lua; echo ran";
        let out = run(fx.sh(level, &["--no-audit"], script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        assert_eq!(
            read(fx.home.join(".bashrc")).as_deref(),
            Some("# rc\n"),
            "{level}: ~/.bashrc (a link into the workspace) was changed\n{}",
            out.dump()
        );
        for p in [".profile", ".config/nvim/init.lua"] {
            assert!(
                !read(fx.home.join(p)).unwrap_or_default().contains("PWNED"),
                "{level}: ~/{p} reaches what the command wrote in the workspace\n{}",
                out.dump()
            );
        }
    }
}

/// A config a repository includes through a symlink (`include.path =
/// ../shared.gitconfig`, `shared.gitconfig -> team/git.conf`) is read where
/// the link leads; a command that retargets the link to a file of its own
/// has the link moved aside after the run, so the host's git never reads
/// the new target.
#[test]
fn relinked_include_of_a_git_config_is_moved_aside() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        git_ok(&fx.ws, &fx.home, &["init", "-q", "."]);
        write(fx.ws.join("team/git.conf"), "[user]\n\tname = a\n");
        std::os::unix::fs::symlink("team/git.conf", fx.ws.join("shared.gitconfig")).unwrap();
        git_ok(
            &fx.ws,
            &fx.home,
            &["config", "include.path", "../shared.gitconfig"],
        );
        let marker = fx.root.join("PWNED");
        let script = format!(
            "printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' > evil.conf; \
             rm shared.gitconfig && ln -s evil.conf shared.gitconfig; echo ran",
            m = marker.display()
        );
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        let _ = host_git(&fx.ws, &fx.home, &["status"]);
        assert!(
            !exists(&marker),
            "{level}: the host's git ran the fsmonitor of an included config the command relinked\n{}",
            out.dump()
        );
    }
}

/// A writable grant of a home directory's part (`--rw ~/.config`) keeps
/// the editor and shell configs in it read-only — also where a dangling
/// symlink (`~/.config/nvim -> nvim-real`, not made yet) leads: what the
/// command creates there is moved aside after the run.
#[test]
fn dangling_link_to_a_home_config_in_a_writable_grant_is_swept() {
    let fx = Fixture::new();
    let cfg = fx.home.join(".config");
    std::fs::create_dir_all(&cfg).unwrap();
    std::os::unix::fs::symlink("nvim-real", cfg.join("nvim")).unwrap();
    let script = format!(
        "mkdir -p {c}/nvim-real && echo 'os.execute(\"touch PWNED\")' > {c}/nvim-real/init.lua; echo ran",
        c = cfg.display()
    );
    let grant = cfg.display().to_string();
    let out = run(fx.sh("workspace-write", &["--no-audit", "--rw", &grant], &script));
    assert!(
        out.stdout.contains("ran"),
        "control: the command ran\n{}",
        out.dump()
    );
    assert!(
        !read(cfg.join("nvim/init.lua"))
            .unwrap_or_default()
            .contains("PWNED"),
        "~/.config/nvim/init.lua reaches what the command wrote through a dangling link\n{}",
        out.dump()
    );
}

/// The user's global git and hg config may pull in a file kept in the
/// workspace (a dotfiles repository: `[include] path =
/// ~/dotfiles/git.local`, `%include ~/dotfiles/hgrc.local`): what the
/// command writes there would run in every repository on the host. Such a
/// file is write-protected in the workspace, existing or not.
#[test]
fn global_config_includes_from_the_workspace_are_write_protected() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        git_ok(&fx.ws, &fx.home, &["init", "-q", "."]);
        write(fx.ws.join("git.local"), "[user]\n\tname = a\n");
        write(
            fx.home.join(".gitconfig"),
            &format!(
                "[include]\n\tpath = {}\n[includeIf \"gitdir:/\"]\n\tpath = {}\n[core]\n\thooksPath = {}\n",
                fx.ws.join("git.local").display(),
                fx.ws.join("later/git.conf").display(),
                fx.home.join("githooks").display()
            ),
        );
        // A global hooks directory whose hook links into the workspace.
        write(fx.ws.join("scripts/pc.sh"), "true\n");
        std::fs::create_dir_all(fx.home.join("githooks")).unwrap();
        std::os::unix::fs::symlink(
            fx.ws.join("scripts/pc.sh"),
            fx.home.join("githooks/pre-commit"),
        )
        .unwrap();
        write(
            fx.home.join(".hgrc"),
            &format!(
                "%include {}\n[hooks]\npre-status = {} --all\n[extensions]\nmine = {}\n",
                fx.ws.join("hgrc.local").display(),
                fx.ws.join("hghooks/status.sh").display(),
                fx.ws.join("hgext/mine.py").display()
            ),
        );
        write(fx.ws.join("hghooks/status.sh"), "true\n");
        std::fs::create_dir_all(fx.ws.join("later")).unwrap();
        let marker = fx.root.join("PWNED");
        let script = format!(
            "printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' >> git.local; \
             printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' > later/git.conf; \
             printf '[hooks]\\npre-status = touch {m}\\n' > hgrc.local; \
             echo 'touch {m}' > hghooks/status.sh; mkdir -p hgext; echo PWNED > hgext/mine.py; \
             echo 'touch {m}' > scripts/pc.sh; echo ran",
            m = marker.display()
        );
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        let _ = host_git(&fx.ws, &fx.home, &["status"]);
        assert!(
            !exists(&marker),
            "{level}: the host's git ran an fsmonitor the command wrote into a file the global config includes\n{}",
            out.dump()
        );
        assert!(
            !read(fx.ws.join("hgrc.local"))
                .unwrap_or_default()
                .contains("PWNED"),
            "{level}: hgrc.local, included by ~/.hgrc, holds the command's hook\n{}",
            out.dump()
        );
        assert_eq!(
            read(fx.ws.join("hghooks/status.sh")).as_deref(),
            Some("true\n"),
            "{level}: hghooks/status.sh, a hook of ~/.hgrc, was changed\n{}",
            out.dump()
        );
        assert_eq!(
            read(fx.ws.join("scripts/pc.sh")).as_deref(),
            Some("true\n"),
            "{level}: scripts/pc.sh, a hook the global core.hooksPath links to, was changed\n{}",
            out.dump()
        );
        assert!(
            !read(fx.ws.join("hgext/mine.py"))
                .unwrap_or_default()
                .contains("PWNED"),
            "{level}: hgext/mine.py, an extension of ~/.hgrc, survived the run\n{}",
            out.dump()
        );
    }
}

/// Editors that run what the project's own config names: Helix starts
/// each language server's `command` in `.helix/languages.toml` when the
/// user opens a file of the project; Neovim's and Vim's `exrc` sources
/// `.nvim.lua`, `.nvimrc`, `.exrc` (Vim: `.vimrc`…) from the directory it
/// starts in. An existing one stays as it was, a new one goes after the
/// run.
#[test]
fn editor_project_configs_are_write_protected() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        let langs = "[[language]]\nname = \"rust\"\n";
        write(fx.ws.join(".helix/languages.toml"), langs);
        let created = [
            ".helix/config.toml",
            ".nvim.lua",
            ".nvimrc",
            ".exrc",
            ".vimrc",
        ];
        let script = "printf '[language-server.x]\\ncommand = \"sh\"\\nargs = [\"-c\", \"touch PWNED\"]\\n' >> .helix/languages.toml; "
            .to_string()
            + &created
                .iter()
                .map(|p| format!("echo 'PWNED' > {p}; "))
                .collect::<String>()
            + "echo ran";
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        assert_eq!(
            read(fx.ws.join(".helix/languages.toml")).as_deref(),
            Some(langs),
            "{level}: .helix/languages.toml was changed\n{}",
            out.dump()
        );
        for p in created {
            assert!(
                !read(fx.ws.join(p)).unwrap_or_default().contains("PWNED"),
                "{level}: a new {p} survived the run\n{}",
                out.dump()
            );
        }
    }
}

/// Hook managers install hooks as symlinks into the work tree
/// (`.git/hooks/pre-commit -> ../../scripts/pre-commit`, the same in a
/// `core.hooksPath` directory): the hooks directory is read-only, but the
/// host's next `git commit` runs the file the link leads to. That file is
/// write-protected like the hook.
#[test]
fn hook_links_into_the_workspace_protect_their_targets() {
    for level in ["workspace-write", "workspace-contained"] {
        for hooks_path in [None, Some(".githooks")] {
            let fx = Fixture::new();
            git_ok(&fx.ws, &fx.home, &["init", "-q", "."]);
            let body = "#!/bin/sh\nexit 0\n";
            write(fx.ws.join("scripts/pre-commit"), body);
            let chmod = Command::new("chmod")
                .arg("+x")
                .arg(fx.ws.join("scripts/pre-commit"))
                .status()
                .expect("chmod");
            assert!(chmod.success());
            let (dir, target) = match hooks_path {
                None => (fx.ws.join(".git/hooks"), "../../scripts/pre-commit"),
                Some(h) => {
                    git_ok(&fx.ws, &fx.home, &["config", "core.hooksPath", h]);
                    (fx.ws.join(h), "../scripts/pre-commit")
                }
            };
            std::fs::create_dir_all(&dir).expect("hooks dir");
            std::os::unix::fs::symlink(target, dir.join("pre-commit")).expect("hook link");
            let marker = fx.root.join("PWNED");
            let script = format!(
                "printf '#!/bin/sh\\ntouch {}\\n' > scripts/pre-commit; echo ran",
                marker.display()
            );
            let out = run(fx.sh(level, &["--no-audit"], &script));
            assert!(
                out.stdout.contains("ran"),
                "control: the command ran\n{}",
                out.dump()
            );
            let commit = host_git(
                &fx.ws,
                &fx.home,
                &["commit", "-q", "--allow-empty", "-m", "x"],
            );
            assert!(
                commit.status.success(),
                "control: the host's commit ran its hook\n{}",
                String::from_utf8_lossy(&commit.stderr)
            );
            assert!(
                !exists(&marker),
                "{level} {hooks_path:?}: the host's `git commit` ran what the command wrote through the hook's link\n{}",
                out.dump()
            );
            assert_eq!(
                read(fx.ws.join("scripts/pre-commit")).as_deref(),
                Some(body),
                "{level} {hooks_path:?}: the hook's target was changed\n{}",
                out.dump()
            );
        }
    }
}

/// On the Landlock backend a write-protected path is a read-only rule
/// inside the writable workspace, and the directory holding it is
/// list-only (Landlock cannot allow new entries beside it while refusing
/// it). Both refusals are EACCES to the command; moat's report names which
/// it is, not "outside the workspace" or nothing.
#[test]
fn landlock_refusals_name_write_protected_and_list_only() {
    let fx = Fixture::new();
    git_ok(&fx.ws, &fx.home, &["init", "-q", "."]);
    write(fx.ws.join(".vscode/tasks.json"), "{}\n");
    let out = run(fx.sh(
        "workspace-write",
        &["--no-audit", "--backend", "landlock"],
        "echo x > .vscode/tasks.json; echo x > .git/hooks/pre-commit; echo x > newfile; echo ran",
    ));
    assert!(
        out.stdout.contains("ran"),
        "control: the command ran\n{}",
        out.dump()
    );
    assert_eq!(
        read(fx.ws.join(".vscode/tasks.json")).as_deref(),
        Some("{}\n"),
        "the command changed .vscode/tasks.json\n{}",
        out.dump()
    );
    for p in [".vscode/tasks.json", ".git/hooks/pre-commit"] {
        let line = format!("{} (write-protected", fx.ws.join(p).display());
        assert!(
            out.stderr
                .lines()
                .any(|l| l.starts_with("moat: denied") && l.contains(&line)),
            "the refusal of {p} does not say write-protected\n{}",
            out.dump()
        );
    }
    let line = format!("{} (", fx.ws.join("newfile").display());
    let said = out
        .stderr
        .lines()
        .find(|l| l.starts_with("moat: denied") && l.contains(&line))
        .unwrap_or_default();
    assert!(
        said.contains("list-only") && said.contains("--backend"),
        "the refusal of a new file in the list-only workspace root does not name why: {said:?}\n{}",
        out.dump()
    );
}

/// Mercurial runs what a protected hgrc's `[hooks]` and `[extensions]`
/// name, relative to the repository's root: a shell hook's script
/// (`./hooks/check.sh`), a Python hook's file (`python:hooks/x.py:run`),
/// an extension's file (`mine = ./ext/mine.py`), also from a nested
/// repository and from an `%include`d file. Existing ones are read-only;
/// one that does not exist yet is moved aside after the run if the
/// command creates it.
#[test]
fn hgrc_hook_and_extension_files_are_write_protected() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        write(
            fx.ws.join(".hg/hgrc"),
            "%include ../inc.rc\n[hooks]\nprecommit = ./hooks/check.sh --fast\npretxncommit.x = python:hooks/x.py:run\n[extensions]\nmine = ./ext/mine.py\n",
        );
        write(
            fx.ws.join("inc.rc"),
            "[hooks]\nchangegroup = sh tools/notify.sh\n",
        );
        write(
            fx.ws.join("sub/.hg/hgrc"),
            "[hooks]\npre-status = ./lint.sh\n",
        );
        let files = [
            "hooks/check.sh",
            "hooks/x.py",
            "tools/notify.sh",
            "sub/lint.sh",
        ];
        for f in files {
            write(fx.ws.join(f), "true\n");
        }
        let script = files
            .iter()
            .chain(["ext/mine.py"].iter())
            .map(|f| format!("mkdir -p $(dirname {f}); echo PWNED > {f}; "))
            .collect::<String>()
            + "echo ran";
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("ran"),
            "control: the command ran\n{}",
            out.dump()
        );
        for f in files {
            assert_eq!(
                read(fx.ws.join(f)).as_deref(),
                Some("true\n"),
                "{level}: {f}, which an hgrc's hook runs, was changed\n{}",
                out.dump()
            );
        }
        assert!(
            !read(fx.ws.join("ext/mine.py"))
                .unwrap_or_default()
                .contains("PWNED"),
            "{level}: ext/mine.py, an extension the hgrc loads, survived the run\n{}",
            out.dump()
        );
    }
}

/// A hook link whose chain moat cannot follow the way the host's git does
/// is refused, never left unprotected: links whose targets are thousands
/// of components long (`a/../a/../…`: the kernel resolves them, moat's
/// resolver stops at 4096 components), and a link through
/// `/proc/self/cwd` (moat, run from elsewhere with the repository granted,
/// resolves it against its own cwd; git runs hooks in the work tree).
#[test]
fn hook_links_moat_cannot_resolve_refuse_the_run() {
    for variant in ["long", "proc"] {
        let fx = Fixture::new();
        git_ok(&fx.ws, &fx.home, &["init", "-q", "."]);
        let body = "#!/bin/sh\nexit 0\n";
        let target = fx.ws.join("scripts/pre-commit");
        write(&target, body);
        let chmod = Command::new("chmod")
            .arg("+x")
            .arg(&target)
            .status()
            .expect("chmod");
        assert!(chmod.success());
        let hooks = fx.ws.join(".git/hooks");
        std::fs::create_dir_all(&hooks).expect("hooks dir");
        std::fs::create_dir_all(fx.ws.join("a")).expect("a");
        let elsewhere = fx.root.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).expect("elsewhere");
        let link = |t: &str, at: &Path| std::os::unix::fs::symlink(t, at).expect("link");
        if variant == "long" {
            let pad = "a/../".repeat(800);
            link("../../c1", &hooks.join("pre-commit"));
            link(&format!("{pad}c2"), &fx.ws.join("c1"));
            link(&format!("{pad}c3"), &fx.ws.join("c2"));
            link(&format!("{pad}scripts/pre-commit"), &fx.ws.join("c3"));
        } else {
            link(
                "/proc/self/cwd/scripts/pre-commit",
                &hooks.join("pre-commit"),
            );
        }
        let marker = fx.root.join("PWNED");
        let script = format!(
            "printf '#!/bin/sh\\ntouch {}\\n' > {}; echo ran",
            marker.display(),
            target.display()
        );
        let ws = fx.ws.display().to_string();
        let cmd = if variant == "proc" {
            let mut c = fx.sh("workspace-write", &["--no-audit", "--rw", &ws], &script);
            c.current_dir(&elsewhere);
            c
        } else {
            fx.sh("workspace-write", &["--no-audit"], &script)
        };
        let out = run(cmd);
        let commit = host_git(
            &fx.ws,
            &fx.home,
            &["commit", "-q", "--allow-empty", "-m", "x"],
        );
        assert!(
            !exists(&marker),
            "{variant}: the host's `git commit` ran what the command wrote through the hook's link (commit: {})\n{}",
            String::from_utf8_lossy(&commit.stderr),
            out.dump()
        );
        assert_eq!(
            read(&target).as_deref(),
            Some(body),
            "{variant}: the hook's target was changed\n{}",
            out.dump()
        );
        out.expect_code(125);
    }
}
