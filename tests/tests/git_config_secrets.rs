//! "Can a bad turn of the model read my keys" through the workspace's own
//! git config: the forms that carry a credential there (a token in a remote
//! URL, actions/checkout's `http.*.extraheader`, a `[credential] helper`
//! that echoes a password, `url."https://TOKEN@host/".insteadOf`) are
//! planted with random token bytes; the command reads `.git/config`, asks
//! git for its config and remotes and greps the whole workspace. The
//! sandbox sees a redacted copy (a `# moat: removed:` line names what went),
//! git keeps working inside, the Landlock backend refuses the read, and
//! `--ro PATH` shows the raw file.

use std::path::Path;
use std::process::Command;

use moat_conformance::*;

/// The levels with a mount namespace (a redacted copy over the file).
const LEVELS: &[&str] = &["read-only", "workspace-write", "workspace-contained"];

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Four distinct tokens, one per form, planted in the git dir `dir`'s config.
fn plant(dir: &Path) -> Vec<String> {
    let t: Vec<String> = (0..4).map(|i| unique(&format!("GITTOK{i}x"))).collect();
    let cfg = dir.join("config");
    let mut text = read(&cfg).expect("config");
    text.push_str(&format!(
        "[remote \"origin\"]\n\turl = https://x-access-token:{}@example.invalid/o/r\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n\
         [http \"https://example.invalid/\"]\n\textraheader = AUTHORIZATION: basic {}\n\
         [credential]\n\thelper = \"!f() {{ echo password={}; }}; f\"\n\
         [url \"https://{}@example.invalid/\"]\n\tinsteadOf = https://mirror.invalid/\n",
        t[0], t[1], t[2], t[3]
    ));
    write(&cfg, &text);
    t
}

fn repo(fx: &Fixture) -> Vec<String> {
    git(&fx.ws, &["init", "-q", "-b", "main"]);
    plant(&fx.w(".git"))
}

fn assert_no_tokens(out: &Out, tokens: &[String]) {
    for t in tokens {
        out.expect_absent(t, "a git config token");
    }
}

const PROBE: &str = "echo GITCFG-RAN; cat .git/config; git config --list --show-origin; git remote -v; grep -r . . 2>/dev/null | grep -v '^./.git/objects' ; echo GITCFG-DONE";

#[test]
fn workspace_git_config_tokens_are_absent_at_every_level() {
    for level in LEVELS {
        let fx = Fixture::new();
        let tokens = repo(&fx);
        let out = run(fx.sh(level, &[], PROBE));
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has("GITCFG-DONE");
        assert_no_tokens(&out, &tokens);
        // The copy names what went, and the remote still works by name.
        out.expect_stdout_has("# moat: removed:")
            .expect_stdout_has("http.*.extraheader")
            .expect_stdout_has("section credential")
            .expect_stdout_has("origin\thttps://example.invalid/o/r (fetch)");
        // The host file is unchanged.
        assert!(read(fx.w(".git/config")).is_some_and(|c| c.contains(&tokens[0])));
    }
}

#[test]
fn submodule_configs_are_redacted() {
    for level in LEVELS {
        let fx = Fixture::new();
        git(&fx.ws, &["init", "-q", "-b", "main"]);
        // A submodule's git dir under .git/modules (a name with a slash).
        let m = fx.w(".git/modules/lib/x");
        git(&fx.root, &["init", "-q", "--bare", m.to_str().unwrap()]);
        let tokens = plant(&m);
        let out = run(fx.sh(
            level,
            &[],
            "echo GITCFG-RAN; cat .git/modules/lib/x/config; git --git-dir=.git/modules/lib/x config --list; grep -r . .git 2>/dev/null | grep -v '^.git/objects'; echo GITCFG-DONE",
        ));
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has("GITCFG-DONE")
            .expect_stdout_has("# moat: removed:");
        assert_no_tokens(&out, &tokens);
    }
}

#[test]
fn a_linked_worktrees_common_config_is_redacted() {
    for level in LEVELS {
        let fx = Fixture::new();
        // The workspace is a linked worktree of a repository outside it:
        // its `.git` is a gitfile; git reads the main repo's config.
        let main = fx.outside.join("main");
        git(
            &fx.root,
            &["init", "-q", "-b", "main", main.to_str().unwrap()],
        );
        git(
            &main,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                "x",
            ],
        );
        std::fs::remove_dir_all(&fx.ws).unwrap();
        git(&main, &["worktree", "add", "-q", fx.ws.to_str().unwrap()]);
        let tokens = plant(&main.join(".git"));
        let script = format!(
            "echo GITCFG-RAN; git config --list --show-origin; git remote -v; git status --short; cat {}/.git/config; echo GITCFG-DONE",
            main.display()
        );
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has("GITCFG-DONE");
        // At workspace-contained the main repository is not in the view.
        if *level != "workspace-contained" {
            out.expect_stdout_has("origin\thttps://example.invalid/o/r (fetch)");
        }
        assert_no_tokens(&out, &tokens);
    }
}

#[test]
fn git_commits_and_fetches_inside_with_the_redacted_config() {
    let fx = Fixture::new();
    let tokens = repo(&fx);
    // A loopback remote without credentials, outside the workspace.
    let bare = fx.outside.join("up.git");
    git(
        &fx.root,
        &["init", "-q", "--bare", "-b", "main", bare.to_str().unwrap()],
    );
    let seed = fx.outside.join("seed");
    git(
        &fx.root,
        &["init", "-q", "-b", "main", seed.to_str().unwrap()],
    );
    git(
        &seed,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "upstream",
        ],
    );
    git(&seed, &["push", "-q", bare.to_str().unwrap(), "main"]);
    git(
        &fx.ws,
        &["remote", "add", "up", &format!("file://{}", bare.display())],
    );
    let script = "set -e; git status --short; git log --oneline -1 || true; \
                  git -c user.name=t -c user.email=t@t commit -q --allow-empty -m inside; \
                  git log --oneline -1 | grep -q inside && echo GITCFG-COMMITTED; \
                  git fetch -q up && git rev-parse -q --verify up/main >/dev/null && echo GITCFG-FETCHED; \
                  git remote -v";
    let out = run(fx.sh("workspace-write", &[], script));
    out.expect_code(0)
        .expect_stdout_has("GITCFG-COMMITTED")
        .expect_stdout_has("GITCFG-FETCHED")
        .expect_stdout_has("origin\thttps://example.invalid/o/r (push)");
    assert_no_tokens(&out, &tokens);
}

#[test]
fn a_symlinked_config_or_git_dir_copies_no_secret() {
    for level in ["read-only", "workspace-write"] {
        // `.git/config` pointing at a private key: moat does not read it
        // (and the key stays hidden where git would follow the link).
        let fx = Fixture::new();
        git(&fx.ws, &["init", "-q", "-b", "main"]);
        std::fs::remove_file(fx.w(".git/config")).unwrap();
        std::os::unix::fs::symlink(fx.home.join(".ssh/id_rsa"), fx.w(".git/config")).unwrap();
        let out = run(fx.sh(
            level,
            &[],
            "echo GITCFG-RAN; cat .git/config; git status 2>&1; grep -r . .git 2>/dev/null",
        ));
        out.expect_stdout_has("GITCFG-RAN");
        out.expect_absent(&fx.ssh_secret, "a key behind a symlinked .git/config");

        // `.git` itself a symlink to a git dir elsewhere with a token in
        // its config: that config is what git reads, so it is redacted.
        let fx = Fixture::new();
        let real = fx.outside.join("real");
        git(
            &fx.root,
            &["init", "-q", "-b", "main", real.to_str().unwrap()],
        );
        let tokens = plant(&real.join(".git"));
        std::os::unix::fs::symlink(real.join(".git"), fx.w(".git")).unwrap();
        let out = run(fx.sh(level, &[], PROBE));
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has("# moat: removed:");
        assert_no_tokens(&out, &tokens);
    }
}

#[test]
fn landlock_backend_refuses_reading_a_git_config_with_credentials() {
    for level in LEVELS {
        let fx = Fixture::new();
        let tokens = repo(&fx);
        let out = run(fx.sh(
            level,
            &["--backend", "landlock"],
            "echo GITCFG-RAN; cat .git/config; grep -r . . 2>/dev/null; echo GITCFG-DONE",
        ));
        if out.code == Some(125) && out.stderr.contains("Landlock") {
            skip("no Landlock ABI 6 on this kernel");
            return;
        }
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has("GITCFG-DONE");
        assert_no_tokens(&out, &tokens);
        assert!(
            out.stderr.contains(".git/config") && out.stderr.contains("credentials"),
            "the denial names the file and why: {}",
            out.dump()
        );
    }
}

#[test]
fn an_explicit_grant_shows_the_raw_file_contract() {
    for level in ["read-only", "workspace-write"] {
        let fx = Fixture::new();
        let tokens = repo(&fx);
        let grant = fx.w(".git/config");
        let out = run(fx.sh(
            level,
            &["--ro", grant.to_str().unwrap()],
            "echo GITCFG-RAN; cat .git/config; echo tamper >> .git/config",
        ));
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has(&tokens[0]);
        assert!(
            !read(&grant).unwrap().contains("tamper"),
            "still write-protected"
        );
    }
}

#[test]
fn a_token_added_after_a_template_was_built_stays_out_of_its_executions() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        git(&fx.ws, &["init", "-q", "-b", "main"]);
        git(
            &fx.ws,
            &["remote", "add", "origin", "https://example.invalid/o/r"],
        );
        let mut s = ServeSession::start(&fx, &["--policy", level]);
        let (out, r) = s.run("cat .git/config; echo GITCFG-BUILT");
        assert!(out.contains("GITCFG-BUILT"), "{out} {r}");
        assert!(
            !out.contains("# moat:"),
            "a clean config is shown as it is: {out}"
        );
        // The host's config gains a token after the template was built,
        // then another one (an edit of a config that already had one).
        for _ in 0..2 {
            let t = unique("GITTOKTPLx");
            git(
                &fx.ws,
                &[
                    "remote",
                    "set-url",
                    "origin",
                    &format!("https://x-access-token:{t}@example.invalid/o/r"),
                ],
            );
            let (out, r) = s.run("cat .git/config; git remote -v; echo GITCFG-RAN");
            assert!(out.contains("GITCFG-RAN"), "{out} {r}");
            assert!(out.contains("# moat: removed:"), "{out} {r}");
            assert!(
                !out.contains(&t),
                "the token added later is visible:\n{out}"
            );
        }
    }
}

#[test]
fn a_nested_checkouts_config_is_redacted() {
    for level in LEVELS {
        let fx = Fixture::new();
        git(&fx.ws, &["init", "-q", "-b", "main"]);
        // A vendored checkout with its own .git dir.
        let dep = fx.w("vendor/dep");
        git(
            &fx.root,
            &["init", "-q", "-b", "main", dep.to_str().unwrap()],
        );
        let tokens = plant(&dep.join(".git"));
        let out = run(fx.sh(
            level,
            &[],
            "echo GITCFG-RAN; cat vendor/dep/.git/config; git -C vendor/dep remote -v; grep -r . vendor 2>/dev/null | grep -v '/objects/'; echo GITCFG-DONE",
        ));
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has("GITCFG-DONE")
            .expect_stdout_has("# moat: removed:")
            .expect_stdout_has("origin\thttps://example.invalid/o/r (fetch)");
        assert_no_tokens(&out, &tokens);
    }
}

#[test]
fn a_nested_run_sees_the_redacted_config_too() {
    let fx = Fixture::new();
    let tokens = repo(&fx);
    let out = run(fx.sh(
        "workspace-write",
        &[],
        &format!("moat exec --policy read-only -- {BASH} -c \"{PROBE}\""),
    ));
    out.expect_stdout_has("GITCFG-RAN")
        .expect_stdout_has("GITCFG-DONE")
        .expect_stdout_has("# moat: removed:");
    assert_no_tokens(&out, &tokens);
}

#[test]
fn a_per_worktree_config_is_redacted() {
    for level in LEVELS {
        let fx = Fixture::new();
        git(&fx.ws, &["init", "-q", "-b", "main"]);
        git(&fx.ws, &["config", "extensions.worktreeConfig", "true"]);
        let t = unique("GITTOKWTx");
        write(
            fx.w(".git/config.worktree"),
            &format!("[remote \"wt\"]\n\turl = https://u:{t}@example.invalid/w\n"),
        );
        let out = run(fx.sh(
            level,
            &[],
            "echo GITCFG-RAN; cat .git/config.worktree; git config --list --show-origin; git remote -v; echo GITCFG-DONE",
        ));
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has("GITCFG-DONE")
            .expect_stdout_has("wt\thttps://example.invalid/w (fetch)");
        out.expect_absent(&t, "a token in config.worktree");
    }
}

/// A directory grant of another checkout (`--ro DIR`) shows its
/// `.git/config` redacted, as the workspace's: at `workspace-contained`
/// the grant is what makes it visible at all.
#[test]
fn a_granted_checkouts_git_config_is_redacted() {
    for level in LEVELS {
        let fx = Fixture::new();
        let other = fx.outside.join("other");
        git(
            &fx.root,
            &["init", "-q", "-b", "main", other.to_str().unwrap()],
        );
        let tokens = plant(&other.join(".git"));
        let o = other.display();
        let out = run(fx.sh(
            level,
            &["--ro", other.to_str().unwrap()],
            &format!(
                "echo GITCFG-RAN; cat {o}/.git/config; git -C {o} config --list; git -C {o} remote -v; \
                 grep -r . {o}/.git 2>/dev/null | grep -v /objects/; echo GITCFG-DONE"
            ),
        ));
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has("GITCFG-DONE")
            .expect_stdout_has("# moat: removed:")
            .expect_stdout_has("origin\thttps://example.invalid/o/r (fetch)");
        assert_no_tokens(&out, &tokens);
    }
}

/// The user's own home by passwd (`~NAME/…` includes resolve there): its
/// name and directory, when /etc/passwd has the invoking uid.
fn passwd_self() -> Option<(String, std::path::PathBuf)> {
    let uid = euid().to_string();
    std::fs::read_to_string("/etc/passwd")
        .ok()?
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 5 && f[2] == uid).then(|| (f[0].to_string(), f[5].into()))
        })
}

/// Includes git follows that the one-level, `~/`-only look missed: an
/// include's include (`~/.gitconfig` → `~/.gitconfig.local` → a token
/// file), and `~NAME/…` (a user's home by name). Each target is hidden.
#[test]
fn nested_and_user_named_git_includes_are_hidden() {
    let Some((name, real_home)) = passwd_self() else {
        skip("the invoking uid has no /etc/passwd entry");
        return;
    };
    for level in ["read-only", "workspace-write"] {
        let fx = Fixture::new();
        let t: Vec<String> = (0..2).map(|i| unique(&format!("INCTOK{i}x"))).collect();
        let by_name = real_home.join(format!(".{}", unique("moat-inc")));
        write(
            fx.home.join(".gitconfig"),
            &format!(
                "[user]\n\tname = A\n[include]\n\tpath = ~/.gitconfig.local\n\tpath = ~{name}/{}\n",
                by_name.file_name().unwrap().to_string_lossy()
            ),
        );
        write(
            fx.home.join(".gitconfig.local"),
            "[include]\n\tpath = .gitconfig.tokens\n",
        );
        write(
            fx.home.join(".gitconfig.tokens"),
            &format!("[github]\n\tpat = {}\n", t[0]),
        );
        let written = std::fs::write(&by_name, format!("[gitlab]\n\tpat = {}\n", t[1]));
        let script = format!(
            "echo GITCFG-RAN; cat {h}/.gitconfig.local {h}/.gitconfig.tokens {n}; echo GITCFG-DONE",
            h = fx.home.display(),
            n = by_name.display()
        );
        let out = run(fx.sh(level, &[], &script));
        let _ = std::fs::remove_file(&by_name);
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has("GITCFG-DONE");
        out.expect_absent(&t[0], "a token two includes away");
        if written.is_ok() {
            out.expect_absent(&t[1], "a token in a ~NAME/ include");
        }
    }
}

/// `$XDG_CONFIG_HOME/git/config` (and `credentials` beside it) when
/// `XDG_CONFIG_HOME` is not `~/.config`: git reads them there, so they are
/// redacted and hidden at their host paths.
#[test]
fn an_xdg_git_config_outside_home_is_redacted() {
    for level in ["read-only", "workspace-write"] {
        let fx = Fixture::new();
        let xdg = fx.outside.join("xdg");
        write(xdg.join("git/config"), "[core]\n");
        let mut tokens = plant(&xdg.join("git"));
        let cred = unique("XDGCRED");
        write(
            xdg.join("git/credentials"),
            &format!("https://u:{cred}@example.invalid\n"),
        );
        tokens.push(cred);
        let x = xdg.display();
        let mut cmd = fx.sh(
            level,
            &[],
            &format!("echo GITCFG-RAN; cat {x}/git/config {x}/git/credentials; echo GITCFG-DONE"),
        );
        cmd.env("XDG_CONFIG_HOME", &xdg);
        let out = run(cmd);
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has("GITCFG-DONE")
            .expect_stdout_has("# moat: removed:");
        assert_no_tokens(&out, &tokens);
    }
}

/// The system's `/etc/gitconfig`: a token there (an `extraheader`, a
/// credential helper) and what it includes. The host's file is left alone:
/// the planted one is bound over it in a private mount namespace, which
/// needs root (unprivileged, the case skips: tests/skips-allowed.txt).
#[test]
fn the_system_git_config_is_redacted() {
    let probe = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) || !Path::new("/etc/gitconfig").is_file() {
        skip("binding over /etc/gitconfig needs a private mount namespace (root) and the file");
        return;
    }
    for level in LEVELS {
        let fx = Fixture::new();
        // `plant` appends to DIR/config.
        write(fx.outside.join("sys/config"), "[core]\n");
        let tokens = plant(&fx.outside.join("sys"));
        let planted = fx.outside.join("sys/gitconfig");
        std::fs::rename(fx.outside.join("sys/config"), &planted).unwrap();
        let inc_tok = unique("SYSINCTOK");
        let inc = fx.outside.join("sys/gitconfig.inc");
        write(&inc, &format!("[x]\n\ty = {inc_tok}\n"));
        let mut text = read(&planted).unwrap();
        text.push_str(&format!("[include]\n\tpath = {}\n", inc.display()));
        write(&planted, &text);
        let inner = fx.sh(
            level,
            &[],
            &format!(
                "echo GITCFG-RAN; cat /etc/gitconfig; git config --system --list; cat {}; echo GITCFG-DONE",
                inc.display()
            ),
        );
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount --bind \"$0\" /etc/gitconfig && exec \"$@\"")
            .arg(&planted)
            .arg(inner.get_program())
            .args(inner.get_args())
            .env_clear()
            .current_dir(inner.get_current_dir().unwrap())
            .stdin(std::process::Stdio::null());
        for (k, v) in inner.get_envs() {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        let out = run(cmd);
        out.expect_stdout_has("GITCFG-RAN")
            .expect_stdout_has("GITCFG-DONE")
            .expect_stdout_has("# moat: removed:");
        assert_no_tokens(&out, &tokens);
        out.expect_absent(&inc_tok, "a file the system git config includes");
    }
}
