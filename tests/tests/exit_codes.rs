//! Exit-status family: the command's code, 128+signal, 124 timeout,
//! 125 refusal, 126 not executable, 127 not found, duration parsing.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use moat_conformance::*;

#[test]
fn command_exit_codes_pass_through_at_every_level_contract() {
    let fx = Fixture::new();
    for level in ALL_LEVELS {
        run(fx.sh(level, &[], "exit 0")).expect_code(0);
        run(fx.sh(level, &[], "exit 7")).expect_code(7);
        run(fx.sh(level, &[], "exit 255")).expect_code(255);
        run(fx.sh(level, &[], "kill -9 $$")).expect_code(137);
        run(fx.sh(level, &[], "kill -TERM $$")).expect_code(143);
        let out = run(fx.moat(["exec", "--policy", level, "--", "/bin/false"]));
        out.expect_code(1);
    }
}

#[test]
fn timeout_returns_124_at_every_level_contract() {
    let fx = Fixture::new();
    for level in ALL_LEVELS {
        let out = spawn(fx.sh(
            level,
            &["--timeout", "1s"],
            "sleep 30; echo SHOULD-NOT-PRINT",
        ))
        .wait_limit(Duration::from_secs(40));
        out.expect_code(124);
        assert!(!out.stdout.contains("SHOULD-NOT-PRINT"));
    }
}

#[test]
fn timeout_duration_formats_contract() {
    let fx = Fixture::new();
    let out = spawn(fx.sh("read-only", &["--timeout", "500ms"], "sleep 20"))
        .wait_limit(Duration::from_secs(30));
    out.expect_code(124);
    let out = spawn(fx.sh("read-only", &["--timeout", "2"], "sleep 20"))
        .wait_limit(Duration::from_secs(30));
    out.expect_code(124);
    for t in ["2s", "1m", "30"] {
        run(fx.sh("read-only", &["--timeout", t], "exit 5")).expect_code(5);
    }
}

#[test]
fn missing_program_is_127_contract() {
    let fx = Fixture::new();
    for level in ALL_LEVELS {
        run(fx.moat(["exec", "--policy", level, "--", "/nonexistent/moat-prog"])).expect_code(127);
        run(fx.moat(["exec", "--policy", level, "--", "moat-no-such-program-xyz"]))
            .expect_code(127);
    }
}

#[test]
fn non_executable_file_is_126_contract() {
    let fx = Fixture::new();
    let p = fx.w("not-exec.sh");
    write(&p, "#!/bin/sh\necho hi\n");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    for level in ALL_LEVELS {
        run(fx.moat(["exec", "--policy", level, "--", p.to_str().unwrap()])).expect_code(126);
        run(fx.moat(["exec", "--policy", level, "--", "./not-exec.sh"])).expect_code(126);
    }
    // A directory is not executable either.
    run(fx.moat(["exec", "--", fx.ws.to_str().unwrap()])).expect_code(126);
}

#[test]
fn program_resolved_via_path_contract() {
    let fx = Fixture::new();
    let out = run(fx.moat(["exec", "--", "echo", "hello;", "$(id)", "`x`"]));
    out.expect_code(0);
    assert_eq!(
        out.stdout,
        "hello; $(id) `x`\n",
        "arguments must reach the program verbatim\n{}",
        out.dump()
    );
}

/// Each refused invocation would create a marker file in the workspace had
/// the command run; the marker's absence shows moat refused before running
/// it (exit 125 alone would also fit a command that ran and failed).
#[test]
fn refusals_are_125() {
    let fx = Fixture::new();
    let x = fx.root.join("x");
    std::fs::create_dir_all(&x).unwrap();
    let xs = x.to_str().unwrap();
    let marker = fx.w("refused-command-ran");
    let ms = marker.to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["exec", "--allow-domain", "example.com"],
        vec!["exec", "--network", "proxy", "--allow-domain", "*"],
        vec!["exec", "--network", "proxy", "--allow-domain", "*.com"],
        vec![
            "exec",
            "--policy",
            "workspace-write",
            "--ro",
            xs,
            "--rw",
            xs,
        ],
        vec!["exec", "--ro", "/nonexistent/moat-path"],
        vec!["exec", "--cwd", "/nonexistent/moat-cwd"],
    ];
    for case in cases {
        let mut args = case.clone();
        args.extend(["--", "/usr/bin/touch", ms]);
        let out = run(fx.moat(&args));
        out.expect_code(125);
        assert!(
            !exists(&marker),
            "moat exited 125 for {case:?} but the command ran (marker created)\n{}",
            out.dump()
        );
        assert!(
            !out.stderr.trim().is_empty() && !out.stderr.contains("panicked"),
            "a refusal must say why on stderr\n{}",
            out.dump()
        );
    }
}
