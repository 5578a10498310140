//! Red team of the template's work ahead of the request: the next
//! execution's view is laid and its command confined before its request,
//! so whatever the host changes in between must be caught when the request
//! comes. Each case waits until the next execution's command is waiting
//! (`wait_until_the_next_view_is_laid`), changes the host, then runs a
//! probe that prints a marker and tries to read or write what the change
//! exposed; the secret's bytes (or the host file's change) are asserted
//! absent.

use moat_conformance::*;

/// The parent of a stand-in renamed away and made again (`mv sub old;
/// mkdir sub; …; rm -rf old`): no rename touches the stand-in's own
/// dentry until the old tree is removed, and the new `sub/.env` was never
/// covered in the view laid ahead.
#[test]
fn template_env_file_under_a_directory_made_again_after_the_next_view_was_laid_stays_hidden() {
    let fx = Fixture::new();
    write(fx.w("a/b/sub/.env"), "TOKEN=old\n");
    let mut s = ServeSession::start(&fx, &["--policy", "workspace-write"]);
    let (out, r) = s.run("cat a/b/sub/.env; echo FIRST-RAN");
    assert!(out.contains("FIRST-RAN"), "{out} {r}");
    assert!(
        !out.contains("TOKEN=old"),
        "the .env is not stood in:\n{out}"
    );
    wait_until_the_next_view_is_laid(&s);
    std::fs::rename(fx.w("a/b/sub"), fx.w("a/b/old")).expect("rename sub");
    write(fx.w("a/b/sub/.env"), &format!("TOKEN={}\n", fx.env_secret));
    std::fs::remove_dir_all(fx.w("a/b/old")).expect("remove the old tree");
    let (out, r) = s.run("cat a/b/sub/.env; echo SECOND-RAN");
    assert!(out.contains("SECOND-RAN"), "{out} {r}");
    assert!(
        !out.contains(&fx.env_secret),
        "a .env in a directory made again after the view was laid is visible:\n{out}"
    );
    assert_eq!(r["launch"], "template", "{r}");
}

/// A protected home directory replaced whole (`mv ~/.ssh ~/.ssh.old; mkdir
/// ~/.ssh` with a new key; the old one removed) after the next view was
/// laid with its stand-in.
#[test]
fn template_new_ssh_dir_made_after_the_next_view_was_laid_stays_hidden() {
    let fx = Fixture::new();
    let mut s = ServeSession::start(&fx, &["--policy", "workspace-write"]);
    let ssh = fx.home.join(".ssh");
    let script = format!("cat {}/id_new 2>&1; echo PROBE-RAN", ssh.display());
    let (out, r) = s.run(&script);
    assert!(out.contains("PROBE-RAN"), "{out} {r}");
    wait_until_the_next_view_is_laid(&s);
    let old = fx.home.join(".ssh.old");
    std::fs::rename(&ssh, &old).expect("rename ~/.ssh");
    let key = unique("NEWSSHKEY");
    write(ssh.join("id_new"), &key);
    std::fs::remove_dir_all(&old).expect("remove the old ~/.ssh");
    let (out, r) = s.run(&script);
    assert!(out.contains("PROBE-RAN"), "{out} {r}");
    assert!(
        !out.contains(&key),
        "a key in a ~/.ssh made again after the view was laid is visible:\n{out}"
    );
    assert_eq!(r["launch"], "template", "{r}");
}

/// `.git/hooks` replaced by a host directory of the same name holding a
/// hook, after the next view was laid with `.git/hooks` write-protected:
/// the next execution must not be able to change that hook (a later host
/// `git commit` runs it).
#[test]
fn template_git_hooks_made_again_after_the_next_view_was_laid_stay_write_protected() {
    let fx = Fixture::new();
    write(fx.w(".git/HEAD"), "ref: refs/heads/main\n");
    write(fx.w(".git/config"), "[core]\n");
    write(fx.w(".git/hooks/README"), "hooks\n");
    let mut s = ServeSession::start(&fx, &["--policy", "workspace-write"]);
    let (out, r) = s.run("echo FIRST-RAN");
    assert!(out.contains("FIRST-RAN"), "{out} {r}");
    wait_until_the_next_view_is_laid(&s);
    std::fs::rename(fx.w(".git/hooks"), fx.w(".git/hooks.old")).expect("rename hooks");
    write(fx.w(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n");
    std::fs::remove_dir_all(fx.w(".git/hooks.old")).expect("remove old hooks");
    let t = unique("HOOKWRITE");
    let (out, r) = s.run(&format!(
        "echo 'touch /tmp/{t}' >> .git/hooks/pre-commit && echo WROTE-HOOK; \
         echo x > .git/hooks/post-checkout && echo MADE-HOOK; echo SECOND-RAN"
    ));
    assert!(out.contains("SECOND-RAN"), "{out} {r}");
    assert!(
        !out.contains("WROTE-HOOK"),
        "the hook was appended to:\n{out}"
    );
    assert!(!out.contains("MADE-HOOK"), "a hook was created:\n{out}");
    assert!(
        !read(fx.w(".git/hooks/pre-commit"))
            .unwrap_or_default()
            .contains(&t),
        "the host's hook changed"
    );
    assert!(!exists(fx.w(".git/hooks/post-checkout")));
    assert_eq!(r["launch"], "template", "{r}");
}
