//! The address guard on names: run in a private mount namespace whose
//! /etc/hosts maps test names to loopback, private and metadata addresses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::*;

const HOSTS: &str = "127.0.0.1 localhost\n\
127.0.0.1 loop.moat.test\n\
10.11.12.13 private.moat.test\n\
169.254.169.254 meta.moat.test\n\
10.11.12.13 mixed.moat.test\n\
127.0.0.1 mixed.moat.test\n";

const INNER: &str = "MOAT_PROXY_GUARD_INNER";

#[test]
fn names_resolving_to_non_public_addresses() {
    if std::env::var_os(INNER).is_some() {
        return inner();
    }
    // Root gets a plain mount namespace; an unprivileged user a user
    // namespace mapped to root around it (the proxy code under test runs
    // the same either way: it only resolves names and connects).
    let Some(unshare) = [
        &["--mount"][..],
        &["--user", "--map-root-user", "--mount"][..],
    ]
    .into_iter()
    .find(|flags| {
        Command::new("unshare")
            .args(*flags)
            .arg("true")
            .status()
            .is_ok_and(|s| s.success())
    }) else {
        // Counted by scripts/test-all; fails CI unless allow-listed.
        println!(
            "SKIP: cannot create a mount namespace here (unshare --mount and --user both fail)"
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("moat-proxy-guard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, HOSTS).unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(unshare)
        .args(["sh", "-c", "mount --make-rprivate / && mount --bind \"$1\" /etc/hosts && exec \"$2\" --exact names_resolving_to_non_public_addresses --nocapture --test-threads 1", "sh"])
        .arg(&hosts)
        .arg(&exe)
        .env(INNER, "1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "inner run failed:\n{text}");
    assert!(
        text.contains("guard-inner-ok"),
        "inner body did not run:\n{text}"
    );
}

fn inner() {
    let origin = http_origin();
    let port = origin.port;
    let url = |h: &str| format!("http://{h}:{port}/");

    // Allowed by name, but resolves to loopback: refused.
    let p = proxy(&["*.moat.test"], &[]);
    let o = curl(&[
        "-x",
        &p.http_url(),
        "-w",
        "%{http_code}",
        &url("loop.moat.test"),
    ]);
    assert_eq!(
        o.stdout,
        format!(
            "{}\n403",
            moat_proxy::refusal_line(
                "loop.moat.test",
                port,
                moat_policy::net::Reason::PrivateAddress
            )
        )
    );
    let o = curl(&[
        "-p",
        "-x",
        &p.http_url(),
        "-w",
        "%{http_connect}",
        &url("loop.moat.test"),
    ]);
    assert_eq!(o.stdout, "403");
    let o = curl(&[
        "--socks5-hostname",
        &format!("127.0.0.1:{}", p.socks),
        &url("loop.moat.test"),
    ]);
    assert_eq!(o.code, 97, "{}", o.stderr);
    for h in ["private.moat.test", "meta.moat.test"] {
        let e = moat_proxy::socks_connect(p.socks_addr(), h, 80)
            .err()
            .unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{h}: {e}");
    }
    assert_eq!(origin.hits(), 0);
    let recs = p.finish();
    assert_eq!(recs.len(), 5);
    assert!(
        recs.iter()
            .all(|r| r.reason == Some("private_address") && r.address.is_none()),
        "{recs:#?}"
    );

    // The exact literal (or localhost) in the allow list lets it through.
    for extra in [
        format!("127.0.0.1:{port}"),
        "127.0.0.1".to_string(),
        format!("localhost:{port}"),
    ] {
        let p = proxy(&["*.moat.test", &extra], &[]);
        let o = curl(&[
            "-x",
            &p.http_url(),
            "-w",
            "\n%{http_code}",
            &url("loop.moat.test"),
        ]);
        assert!(o.stdout.ends_with("\n200"), "{extra}: {}", o.stdout);
        // A name with a private and a loopback address: only the allowed
        // loopback one is ever connected to.
        let o = curl(&[
            "-p",
            "-x",
            &p.http_url(),
            "-w",
            "\n%{http_code}",
            &url("mixed.moat.test"),
        ]);
        assert!(o.stdout.ends_with("\n200"), "{extra}: {}", o.stdout);
        let recs = p.finish();
        let want = format!("127.0.0.1:{port}");
        assert!(
            recs.iter()
                .all(|r| r.decision == "allow" && r.address.as_deref() == Some(want.as_str())),
            "{recs:#?}"
        );
    }
    // A literal for another port does not.
    let p = proxy(
        &[
            "*.moat.test",
            &format!("127.0.0.1:{}", port.wrapping_add(1).max(1)),
        ],
        &[],
    );
    let o = curl(&[
        "-x",
        &p.http_url(),
        "-w",
        "%{http_code}",
        &url("loop.moat.test"),
    ]);
    assert!(
        o.stdout.contains("(private_address)") && o.stdout.ends_with("\n403"),
        "{}",
        o.stdout
    );
    p.finish();
    // A deny on the IP literal applies to names resolving to it.
    let p = proxy(&["*.moat.test", "127.0.0.1"], &["127.0.0.1"]);
    let o = curl(&[
        "-x",
        &p.http_url(),
        "-w",
        "%{http_code}",
        &url("loop.moat.test"),
    ]);
    assert_eq!(
        o.stdout,
        format!(
            "{}\n403",
            moat_proxy::refusal_line("loop.moat.test", port, moat_policy::net::Reason::Denied)
        )
    );
    p.finish();
    println!("guard-inner-ok");
}
