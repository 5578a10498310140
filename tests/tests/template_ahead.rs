//! A template execution's view is laid, and its command confined, ahead of
//! its request (issue 11 §5): the mounts that narrow a host path (a `.env`
//! stand-in, a read-only `.git/config`) then sit on host dentries for a
//! while before the request comes, and the host replacing one (an atomic
//! save: a new file renamed over the old) detaches it. These cases wait
//! until the next execution's command is confined and waiting — its view
//! laid — before they replace the file, so the detached mount is the one
//! laid ahead, every run (tests/tests/template_redteam.rs races the next
//! view's mounts against the rename).

use moat_conformance::*;

#[test]
fn template_env_file_replaced_after_the_next_view_was_laid_stays_hidden() {
    let fx = Fixture::new();
    write(fx.w(".env"), "TOKEN=old\n");
    let mut s = ServeSession::start(&fx, &["--policy", "workspace-write"]);
    let (out, r) = s.run("cat .env; echo FIRST-RAN");
    assert!(out.contains("FIRST-RAN"), "{out} {r}");
    assert!(
        !out.contains("TOKEN=old"),
        "the .env is not stood in:\n{out}"
    );
    wait_until_the_next_view_is_laid(&s);
    // An editor's atomic save: a new file renamed over the old one, whose
    // dentry the stand-in laid ahead sits on.
    write(fx.w(".env.tmp"), &format!("TOKEN={}\n", fx.env_secret));
    std::fs::rename(fx.w(".env.tmp"), fx.w(".env")).expect("rename over .env");
    let (out, r) = s.run("cat .env; echo SECOND-RAN");
    assert!(out.contains("SECOND-RAN"), "{out} {r}");
    assert!(
        !out.contains(&fx.env_secret),
        "the .env saved on the host after the view was laid is visible:\n{out}"
    );
    assert_eq!(r["launch"], "template", "{r}");
    // The host file is the one saved (the run changed nothing).
    assert!(read(fx.w(".env"))
        .unwrap_or_default()
        .contains(&fx.env_secret));
}

#[test]
fn template_git_config_replaced_after_the_next_view_was_laid_stays_write_protected() {
    let fx = Fixture::new();
    write(fx.w(".git/config"), "[core]\n");
    write(fx.w(".git/HEAD"), "ref: refs/heads/main\n");
    let mut s = ServeSession::start(&fx, &["--policy", "workspace-write"]);
    let (out, r) = s.run("echo FIRST-RAN");
    assert!(out.contains("FIRST-RAN"), "{out} {r}");
    wait_until_the_next_view_is_laid(&s);
    // `git config` writes config.lock and renames it over config.
    write(fx.w(".git/config.lock"), "[core]\n\tbare = false\n");
    std::fs::rename(fx.w(".git/config.lock"), fx.w(".git/config")).expect("rename");
    let t = unique("HOOKS");
    let (out, r) = s.run(&format!(
        "printf '[core]\\n\\thooksPath = /x/{t}\\n' >> .git/config && echo WROTE; echo SECOND-RAN"
    ));
    assert!(out.contains("SECOND-RAN"), "{out} {r}");
    assert!(!out.contains("WROTE"), "the append succeeded:\n{out}");
    let config = read(fx.w(".git/config")).unwrap_or_default();
    assert!(
        !config.contains(&t),
        "a template execution wrote the host's .git/config:\n{config}"
    );
    assert_eq!(r["launch"], "template", "{r}");
}
