//! moat for a normal agent day, refusals and terminals (issue 10 items 7
//! and 8): network refusals are explained where the agent looks (stderr,
//! the 403 body, `--json` denials), and an interactive command gets a
//! terminal of its own inside the sandbox.
//!
//! Side effects asserted: the local server saw no connection, the secret
//! bytes never arrived, the window size the host set is the one the
//! command sees.

use moat_conformance::*;

const CURL: &str = "/usr/bin/curl";

// ------------------------------------------------- item 7: network refusals

#[test]
fn proxy_refusal_is_explained_in_the_body_on_stderr_and_in_denials() {
    let fx = Fixture::new();
    let secret = unique("SERVEDSECRET");
    let server = HttpServer::fixed(&secret);
    let p = server.port;
    let other = format!("127.0.0.1:{}", p.wrapping_add(1).max(1));
    let target = format!("http://127.0.0.1:{p}/");
    let hp = format!("127.0.0.1:{p}");
    let script = format!(
        "{CURL} -sS -m 20 {target}; echo; \
         {CURL} -sS -m 20 -o /dev/null -x '' --socks5-hostname 127.0.0.1:1080 {target}; \
         echo PROBE_DONE"
    );
    let base = [
        "exec",
        "--policy",
        "workspace-write",
        "--network",
        "proxy",
        "--allow-domain",
        other.as_str(),
    ];
    // Plain: the 403 body names the reason and the flag; so does stderr.
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--", BASH, "-c", &script]);
    let out = run(fx.moat(&args));
    out.expect_stdout_has("PROBE_DONE");
    out.expect_absent(&secret, "the refused server's body");
    out.expect_stdout_has(&format!(
        "moat: blocked {hp} (not_allowed); no allow entry matches; add --allow-domain {hp}"
    ));
    let line = format!("moat: blocked {hp} (not_allowed)");
    let stderr_lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with(&line))
        .collect();
    // One line for the host, port and reason, though two clients asked.
    assert_eq!(stderr_lines.len(), 1, "{}", out.dump());
    assert!(
        stderr_lines[0].contains(&format!("--allow-domain {hp}")),
        "{}",
        out.dump()
    );
    assert_eq!(server.settled_connections(), 0, "the server was reached");

    // --json: an entry in denials, with the reason and the flag.
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--json", "--", BASH, "-c", &script]);
    let out = run(fx.moat(&args));
    let v = out.json();
    let denials = v["denials"].as_array().cloned().unwrap_or_default();
    let d = denials
        .iter()
        .find(|d| d["operation"] == "connect" && d["port"] == p)
        .unwrap_or_else(|| panic!("no network denial\n{}", out.dump()));
    assert_eq!(d["host"], "127.0.0.1");
    assert_eq!(d["reason"], "not_allowed");
    assert!(
        d["detail"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("--allow-domain {hp}")),
        "{d}"
    );

    // --quiet: nothing on moat's stderr.
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--quiet", "--", BASH, "-c", &script]);
    let out = run(fx.moat(&args));
    out.expect_stdout_has("PROBE_DONE");
    assert!(
        !out.stderr.contains("moat: blocked"),
        "--quiet printed\n{}",
        out.dump()
    );
    assert_eq!(server.settled_connections(), 0, "the server was reached");
}

#[test]
fn disabled_network_says_which_flags_give_it() {
    let fx = Fixture::new();
    let script = format!(
        "{CURL} -sS -m 20 -o /dev/null https://example.com/; \
         {PY} -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), timeout=5)'; \
         echo PROBE_DONE"
    );
    for level in SANDBOXED {
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("PROBE_DONE");
        assert!(
            out.stderr.contains("Could not resolve host"),
            "the lookup did not fail\n{}",
            out.dump()
        );
        assert!(
            out.stderr.contains(
                "moat: network is disabled; use --network proxy --allow-domain example.com"
            ),
            "{level}\n{}",
            out.dump()
        );
        let out = run(fx.sh(level, &["--json"], &script));
        let v = out.json();
        let ok = v["denials"].as_array().is_some_and(|a| {
            a.iter()
                .any(|d| d["reason"] == "network_disabled" && d["host"] == "example.com")
        });
        assert!(ok, "{level}: no network_disabled denial\n{}", out.dump());
    }
}
