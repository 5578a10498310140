//! moat inside a container: runc runs a bundle whose root is the host's
//! `/usr` and `/etc` bound read-only (no image registry), with moat's binary
//! and the workspace bound in. Under a seccomp profile that refuses
//! CLONE_NEWUSER (what Docker's default profile does) the default backend
//! refuses, naming `--backend landlock`, and `--backend auto` gets the
//! Landlock backend with its guarantees. As root the container runs its
//! process as an unprivileged uid (root in a container without CAP_SETFCAP
//! may not map itself into a new user namespace); as an unprivileged user
//! runc runs rootless (its own user namespace).
//!
//! With user namespaces allowed and an unmasked /proc, moat gives its full
//! namespaces backend inside the container. With the default masked /proc
//! the kernel refuses moat a fresh procfs (a procfs may only be mounted
//! where one is already fully visible), and moat says so and how to fix it.

use moat_conformance::runc_bundle::*;
use moat_conformance::*;
use serde_json::Value;

// Writes go to a subdirectory: on the Landlock backend a directory holding a
// protected entry (the workspace root with its .env) is list-only.
const PROBE: &str = "echo PROBE-RAN; cat /ws/.env; echo written > /ws/sub/made && echo WROTE; python3 -c 'import socket; socket.socket()' 2>/dev/null && echo SOCKET-OPENED; true";

#[test]
fn default_seccomp_of_a_container_gets_the_landlock_backend() {
    let fx = Fixture::new();
    prepare_ws(&fx);
    let script = format!(
        "/moat/moat exec --no-audit --policy workspace-write -- echo RAN; echo DEFAULT-EXIT=$?; \
         /moat/moat exec --no-audit --json --backend auto --policy workspace-write -- sh -c \"{PROBE}\""
    );
    let dir = bundle(
        &fx,
        "seccomp",
        &["sh", "-c", &script],
        Some(no_userns_seccomp()),
        true,
    );
    let Some(out) = run_bundle(&fx, &dir) else {
        return;
    };
    // The default backend refuses, naming the option.
    assert!(out.stdout.contains("DEFAULT-EXIT=125"), "{}", out.dump());
    assert!(!out.stdout.lines().any(|l| l == "RAN"), "{}", out.dump());
    assert!(out.stderr.contains("--backend landlock"), "{}", out.dump());
    let json_start = out.stdout.find('{').unwrap_or(0);
    let v: Value = serde_json::from_str(out.stdout[json_start..].trim())
        .unwrap_or_else(|e| panic!("{e}\n{}", out.dump()));
    assert_eq!(v["sandbox"]["backend"], "landlock", "{}", out.dump());
    let stdout = v["stdout"].as_str().unwrap_or_default();
    assert!(
        stdout.contains("PROBE-RAN") && stdout.contains("WROTE"),
        "{}",
        out.dump()
    );
    assert!(
        !stdout.contains(&fx.env_secret),
        "the .env leaked\n{}",
        out.dump()
    );
    assert!(!stdout.contains("SOCKET-OPENED"), "{}", out.dump());
    assert_eq!(read(fx.w("sub/made")).as_deref(), Some("written\n"));
}

#[test]
fn full_backend_inside_a_container_with_user_namespaces_and_unmasked_proc() {
    let fx = Fixture::new();
    prepare_ws(&fx);
    let args = [
        "/moat/moat",
        "exec",
        "--no-audit",
        "--json",
        "--policy",
        "workspace-write",
        "--",
        "sh",
        "-c",
        PROBE,
    ];
    let dir = bundle(&fx, "ns", &args, None, false);
    let Some(out) = run_bundle(&fx, &dir) else {
        return;
    };
    let v = out.json();
    assert_eq!(v["sandbox"]["backend"], "namespaces", "{}", out.dump());
    assert_eq!(v["sandbox"]["layers"]["namespaces"], "full");
    let stdout = v["stdout"].as_str().unwrap_or_default();
    assert!(
        stdout.contains("PROBE-RAN") && stdout.contains("WROTE"),
        "{}",
        out.dump()
    );
    assert!(
        !stdout.contains(&fx.env_secret),
        "the .env leaked\n{}",
        out.dump()
    );
    assert!(!stdout.contains("SOCKET-OPENED"), "{}", out.dump());
    assert_eq!(read(fx.w("sub/made")).as_deref(), Some("written\n"));
    // The default masked /proc: refused, with the reason and the fixes.
    let args = ["/moat/moat", "exec", "--no-audit", "--", "echo", "RAN"];
    let dir = bundle(&fx, "masked", &args, None, true);
    let Some(out) = run_bundle(&fx, &dir) else {
        return;
    };
    out.expect_code(125)
        .expect_absent("RAN", "a refused run's output");
    assert!(out.stderr.contains("procMount: Unmasked"), "{}", out.dump());
    assert!(out.stderr.contains("--backend landlock"), "{}", out.dump());
}
