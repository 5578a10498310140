//! `moat serve` executions forked from a pre-built sandbox template (issue
//! 11 §5), driven through `moat serve --stdio` as a harness would: nothing
//! of one execution reaches the next, and a secret that appears after the
//! template was built stays hidden. (The abstract-socket, cancel, killed
//! template and same-result cases are in tests/python/test_template.py.)

use moat_conformance::*;

#[test]
fn template_execution_sees_no_file_process_env_or_fd_of_the_previous_one() {
    let fx = Fixture::new();
    let t = unique("tpl");
    let mut s = ServeSession::start(&fx, &["--policy", "workspace-contained"]);
    let (out, r) = s.run(&format!(
        "echo x > /tmp/tmpleft-{t}; echo x > $HOME/homeleft-{t}; echo x > /dev/shm/shmleft-{t}; \
         exec 7>/tmp/fdleft-{t}; export LEFT_{n}=envleft; sh -c 'sleep 1000' {t} & echo FIRST-RAN",
        n = t.replace('-', "_")
    ));
    assert_eq!(r["launch"], "template", "{r}");
    assert!(out.contains("FIRST-RAN"), "{out} {r}");
    assert!(
        wait_gone(&t, std::time::Duration::from_secs(30)).is_empty(),
        "the first execution's background process outlived it"
    );
    let (out, r) = s.run(
        "ls -a /tmp $HOME /dev/shm; echo FDS; ls /proc/self/fd; echo PIDS; ls /proc | grep '^[0-9]'; \
         echo ENV; env; echo SECOND-RAN",
    );
    assert_eq!(r["launch"], "template", "{r}");
    assert!(out.contains("SECOND-RAN"), "{out} {r}");
    for left in ["tmpleft", "homeleft", "shmleft", "fdleft", "envleft"] {
        assert!(
            !out.contains(&format!("{left}-{t}")) && !out.contains(&format!("={left}")),
            "{left} of the first execution is visible:\n{out}"
        );
    }
    let between = |a: &str, b: &str| -> Vec<u32> {
        out.split(a)
            .nth(1)
            .and_then(|x| x.split(b).next())
            .unwrap_or("")
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect()
    };
    let fds = between("FDS\n", "PIDS");
    assert!(
        !fds.is_empty() && fds.iter().all(|f| *f <= 3),
        "an fd beyond stdio (and ls's own): {fds:?}"
    );
    let pids = between("PIDS\n", "ENV");
    assert!(
        !pids.is_empty() && pids.iter().all(|p| *p < 10),
        "processes other than this execution's own: {pids:?}"
    );
}

#[test]
fn template_secret_created_after_the_template_was_built_stays_hidden() {
    // The workspace is HOME, so a protected home path can appear in it.
    let fx = Fixture::home_as_workspace();
    let mut s = ServeSession::start(&fx, &["--policy", "workspace-write"]);
    let (out, r) = s.run("echo BUILT");
    assert_eq!(r["launch"], "template", "{r}");
    assert!(out.contains("BUILT"), "{out} {r}");
    // The host changes after the template was built.
    write(fx.w(".env"), &format!("TOKEN={}\n", fx.env_secret));
    write(
        fx.w(".config/gcloud/credentials.db"),
        &format!("{}\n", fx.netrc_secret),
    );
    let (out, r) = s.run(
        "cat .env; echo; ls -a .config/gcloud; cat .config/gcloud/credentials.db; echo CAT-RAN",
    );
    assert_eq!(r["launch"], "template", "{r}");
    assert!(out.contains("CAT-RAN"), "{out} {r}");
    assert!(
        !out.contains(&fx.env_secret),
        "the .env created after the template was built is visible:\n{out}"
    );
    assert!(
        !out.contains(&fx.netrc_secret),
        "the ~/.config/gcloud created after the template was built is visible:\n{out}"
    );
    // The host files are untouched.
    assert_eq!(
        read(fx.w(".env")),
        Some(format!("TOKEN={}\n", fx.env_secret))
    );
}

#[test]
fn template_and_oneshot_launch_each_report_which_ran() {
    let fx = Fixture::new();
    for launch in ["template", "oneshot"] {
        let mut s = ServeSession::start(&fx, &["--policy", "workspace-write", "--launch", launch]);
        let (out, r) = s.run("echo RAN; exit 3");
        assert!(out.contains("RAN"), "{out} {r}");
        assert_eq!(r["exit_code"], 3, "{r}");
        assert_eq!(r["launch"], launch, "{r}");
    }
}

#[test]
fn template_nested_moat_exec_fails_closed_and_says_how_to_get_nested_runs() {
    let fx = Fixture::new();
    let t = unique("nest");
    let mut s = ServeSession::start(&fx, &["--policy", "workspace-write"]);
    let (out, r) = s.run(&format!(
        "echo NESTED-START; moat exec --no-audit -- sh -c 'echo x > {w}/ran-{t}' 2>&1; echo NESTED-EXIT=$?",
        w = fx.ws.display()
    ));
    assert_eq!(r["launch"], "template", "{r}");
    assert!(out.contains("NESTED-START"), "{out} {r}");
    // Fails closed: moat's own failure, and the inner command never ran.
    assert!(out.contains("NESTED-EXIT=125"), "{out}");
    assert!(!fx.ws.join(format!("ran-{t}")).exists(), "{out}");
    // The message names the cause and the fix, not a foreign seccomp filter.
    assert!(
        out.contains("nested runs are not available") && out.contains("--launch oneshot"),
        "{out}"
    );
}
