//! Red-team cases for `moat serve` executions forked from a sandbox
//! template (issue 11 §5), driven through `moat serve --stdio`: a mount
//! that narrows a host path (a stand-in, a read-only bind in the
//! workspace) sits on a host dentry, and the host unlinking or renaming
//! over it detaches it in every mount namespace but the caller's while the
//! plan (so the template key) stays the same. A later execution must still
//! get the view the one-shot path would lay now. (More cases, including
//! one-shot parity, are in tests/python/test_template_redteam.py.)

use moat_conformance::*;

#[test]
fn template_env_file_replaced_on_the_host_stays_hidden() {
    // The fixture's workspace is under /var/tmp: its stand-ins would be
    // mounts of the template's shared view.
    let fx = Fixture::new();
    write(fx.w(".env"), "TOKEN=old\n");
    let mut s = ServeSession::start(&fx, &["--policy", "workspace-write"]);
    let (out, r) = s.run("cat .env; echo FIRST-RAN");
    assert!(out.contains("FIRST-RAN"), "{out} {r}");
    // An editor's atomic save: a new file renamed over the old one.
    write(fx.w(".env.tmp"), &format!("TOKEN={}\n", fx.env_secret));
    std::fs::rename(fx.w(".env.tmp"), fx.w(".env")).expect("rename over .env");
    let (out, r) = s.run("cat .env; echo SECOND-RAN");
    assert!(out.contains("SECOND-RAN"), "{out} {r}");
    assert!(
        !out.contains(&fx.env_secret),
        "the .env saved on the host after the template was built is visible:\n{out}"
    );
    assert_eq!(r["launch"], "template", "{r}");
}

#[test]
fn template_git_config_rewritten_on_the_host_stays_write_protected() {
    let fx = Fixture::new();
    write(fx.w(".git/config"), "[core]\n");
    write(fx.w(".git/HEAD"), "ref: refs/heads/main\n");
    let mut s = ServeSession::start(&fx, &["--policy", "workspace-write"]);
    let (out, r) = s.run("echo FIRST-RAN");
    assert!(out.contains("FIRST-RAN"), "{out} {r}");
    // `git config` writes config.lock and renames it over config.
    write(fx.w(".git/config.lock"), "[core]\n\tbare = false\n");
    std::fs::rename(fx.w(".git/config.lock"), fx.w(".git/config")).expect("rename");
    let t = unique("HOOKS");
    let (out, r) = s.run(&format!(
        "printf '[core]\\n\\thooksPath = /x/{t}\\n' >> .git/config; echo SECOND-RAN"
    ));
    assert!(out.contains("SECOND-RAN"), "{out} {r}");
    let config = read(fx.w(".git/config")).unwrap_or_default();
    assert!(
        !config.contains(&t),
        "a template execution wrote the host's .git/config:\n{config}"
    );
    assert_eq!(r["launch"], "template", "{r}");
}
