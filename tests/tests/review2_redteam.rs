//! Red-team of three recent changes: the workspace git config shown as a
//! redacted copy (`MountOp::Redacted`): a config too large to read is not
//! shown raw; a gitfile pointing into a protected directory copies nothing
//! out of it; a config that is a FIFO or a device does not hang the launch.

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

/// A token in a remote URL appended to the git dir `dir`'s config, then
/// `pad` bytes of comment.
fn plant(dir: &Path, pad: usize) -> String {
    let token = unique("R2TOK");
    let cfg = dir.join("config");
    let mut text = read(&cfg).expect("config");
    text.push_str(&format!(
        "[remote \"origin\"]\n\turl = https://x-access-token:{token}@example.invalid/o/r\n"
    ));
    text.push('#');
    text.push_str(&"x".repeat(pad));
    text.push('\n');
    write(&cfg, &text);
    token
}

/// A git config larger than moat reads (256 KiB) with a token in it was
/// left out of the redaction and so shown raw: the token was readable with
/// `cat .git/config` and `git config`. It is now hidden, with a comment.
#[test]
fn an_oversized_git_config_is_not_shown_raw() {
    for level in LEVELS {
        let fx = Fixture::new();
        git(&fx.ws, &["init", "-q", "-b", "main"]);
        let token = plant(&fx.w(".git"), 300 * 1024);
        let out = run(fx.sh(
            level,
            &[],
            "echo R2-RAN; cat .git/config; git config --list; grep -r . .git 2>/dev/null | grep -v '^.git/objects'; echo R2-DONE",
        ));
        out.expect_stdout_has("R2-RAN")
            .expect_stdout_has("R2-DONE")
            .expect_stdout_has("this git config is not shown");
        out.expect_absent(&token, "a token in an oversized git config");
        // The host file is unchanged.
        assert!(read(fx.w(".git/config")).is_some_and(|c| c.contains(&token)));
    }
}

/// A workspace `.git` gitfile (the command can write one) pointing at a
/// repository inside a protected directory (`~/.password-store`, which
/// pass keeps in git): moat reads that config to redact it, but nothing of
/// it reaches the view; the protected directory stays an empty stand-in.
#[test]
fn a_gitfile_into_a_protected_dir_copies_nothing_out_of_it() {
    for level in LEVELS {
        let fx = Fixture::new();
        let store = fx.home.join(".password-store");
        std::fs::create_dir_all(&store).expect("mkdir store");
        git(&store, &["init", "-q", "-b", "main"]);
        let token = plant(&store.join(".git"), 0);
        let marker = unique("R2STOREURL");
        let cfg = store.join(".git/config");
        let mut text = read(&cfg).expect("config");
        text.push_str(&format!(
            "[remote \"b\"]\n\turl = https://{marker}.invalid/\n"
        ));
        write(&cfg, &text);
        write(
            fx.w(".git"),
            &format!("gitdir: {}\n", store.join(".git").display()),
        );
        let script = format!(
            "echo R2-RAN; cat {p}/.git/config; ls -la {p} {p}/.git; git config --list; echo R2-DONE",
            p = store.display()
        );
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("R2-RAN").expect_stdout_has("R2-DONE");
        out.expect_absent(&token, "a token in a protected repository's config");
        out.expect_absent(&marker, "a protected repository's config");
    }
}

/// A `.git/config` that is a FIFO (or a `config.worktree` and a
/// submodule config that are symlinks to /dev/zero) is not read, so the
/// launch neither blocks nor reads without end: the command runs.
#[test]
fn a_fifo_or_device_git_config_does_not_hang_the_launch_contract() {
    for level in LEVELS {
        let fx = Fixture::new();
        std::fs::create_dir_all(fx.w(".git/modules/m")).expect("mkdir");
        write(fx.w(".git/HEAD"), "ref: refs/heads/main\n");
        write(fx.w(".git/modules/m/HEAD"), "ref: refs/heads/main\n");
        let fifo = Command::new("mkfifo")
            .arg(fx.w(".git/config"))
            .status()
            .expect("mkfifo");
        assert!(fifo.success());
        std::os::unix::fs::symlink("/dev/zero", fx.w(".git/config.worktree")).expect("symlink");
        std::os::unix::fs::symlink("/dev/zero", fx.w(".git/modules/m/config")).expect("symlink");
        let out = run(fx.sh(level, &[], "echo R2-RAN"));
        out.expect_stdout_has("R2-RAN");
    }
}

/// At `workspace-contained` nothing outside the workspace is in the view:
/// a gitfile pointing at a repository beside the workspace does not make
/// moat lay that repository's (redacted) config into the view.
#[test]
fn a_gitfile_out_of_a_contained_workspace_shows_nothing_of_its_target() {
    let fx = Fixture::new();
    let repo = fx.root.join("elsewhere");
    std::fs::create_dir_all(&repo).expect("mkdir repo");
    git(&repo, &["init", "-q", "-b", "main"]);
    let token = plant(&repo.join(".git"), 0);
    let marker = unique("R2ELSEWHERE");
    let cfg = repo.join(".git/config");
    let mut text = read(&cfg).expect("config");
    text.push_str(&format!(
        "[remote \"b\"]\n\turl = https://{marker}.invalid/\n"
    ));
    write(&cfg, &text);
    write(
        fx.w(".git"),
        &format!("gitdir: {}\n", repo.join(".git").display()),
    );
    let script = format!(
        "echo R2-RAN; cat {p}/.git/config; ls -la {p}; git config --list; echo R2-DONE",
        p = repo.display()
    );
    let out = run(fx.sh("workspace-contained", &[], &script));
    out.expect_stdout_has("R2-RAN").expect_stdout_has("R2-DONE");
    out.expect_absent(&token, "a token in a config outside the workspace");
    out.expect_absent(&marker, "a config outside the workspace");
}
