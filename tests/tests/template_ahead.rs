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

/// A stand-in under a directory the command cannot search (`~/.cargo` at
/// mode 000 holding `credentials.toml`): root's probe sees the file, so a
/// stand-in is laid ahead over it, and the check at request time that it
/// is still in place must not need the search permission the confined
/// command no longer has (it failed closed, "the view's inputs kept
/// changing", every execution). A real change is still caught: the host
/// saves the file again after the next view was laid (detaching the
/// stand-in laid ahead) and makes the directory searchable once the
/// command runs, which then finds only a stand-in. Unprivileged, the
/// probe cannot look in, nor can the sandbox, and it runs the same.
#[test]
fn template_stand_in_under_an_unsearchable_directory_runs_and_stays_hidden() {
    use std::os::unix::fs::PermissionsExt as _;
    let fx = Fixture::new();
    let cargo = fx.home.join(".cargo");
    let file = cargo.join("credentials.toml");
    let secret = unique("CARGOSECRET");
    write(&file, &format!("token = \"{secret}\"\n"));
    let chmod = |mode| {
        std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(mode)).expect("chmod")
    };
    chmod(0o000);
    let mut s = ServeSession::start(&fx, &["--policy", "workspace-write"]);
    let (out, r) = s.run(&format!("cat {}; echo FIRST-RAN", file.display()));
    assert!(
        out.contains("FIRST-RAN"),
        "the template execution did not run: {out} {r}"
    );
    assert_eq!(r["launch"], "template", "{r}");
    assert!(!out.contains(&secret), "visible:\n{out}");

    // Whether moat (this user) can look beneath a mode-000 directory: only
    // then did its probe see the file, and only then is there a stand-in
    // to detach (unprivileged, a directory made searchable during a run
    // shows what the probe could not see: README Limitations).
    if std::fs::symlink_metadata(&file).is_err() {
        return;
    }
    wait_until_the_next_view_is_laid(&s);
    // An atomic save over the stood-in file, the directory unsearchable
    // again before the request.
    chmod(0o700);
    write(
        cargo.join("credentials.tmp"),
        &format!("token = \"{secret}\"\n"),
    );
    std::fs::rename(cargo.join("credentials.tmp"), &file).expect("rename over credentials.toml");
    chmod(0o000);
    // The command waits (bounded) until it can search the directory, which
    // the host allows once the command runs (its marker is on its argv).
    let marker = unique("WAITER");
    let waiter = std::thread::spawn({
        let (marker, cargo) = (marker.clone(), cargo.clone());
        move || {
            for _ in 0..6000 {
                if !procs_with(&marker).is_empty() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o700))
                .expect("chmod 700");
        }
    });
    let (out, r) = s.run(&format!(
        ": {marker}; i=0; while [ $i -lt 600 ] && ! [ -x {c} ]; do sleep 0.05; i=$((i+1)); done; \
         cat {f}; echo SECOND-RAN",
        c = cargo.display(),
        f = file.display()
    ));
    waiter.join().expect("the chmod thread");
    assert!(
        out.contains("SECOND-RAN"),
        "the template execution did not run: {out} {r}"
    );
    assert_eq!(r["launch"], "template", "{r}");
    assert!(
        !out.contains(&secret),
        "credentials saved after the view was laid, under a directory the command could \
         not search at request time, are visible:\n{out}"
    );
}
