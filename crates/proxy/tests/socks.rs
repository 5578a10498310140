//! SOCKS5 listener via curl (socks5h and socks5) and the blocking `socks_stdio` client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;

#[test]
fn socks5h_allowed_and_denied() {
    let origin = http_origin();
    let other = http_origin();
    let p = proxy(&[&format!("localhost:{}", origin.port)], &[]);
    let s = format!("127.0.0.1:{}", p.socks);

    let o = curl(&[
        "--socks5-hostname",
        &s,
        "-w",
        "\n%{http_code}",
        &format!("http://localhost:{}/via-socks", origin.port),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("GET /via-socks HTTP/1.1") && o.stdout.ends_with("\n200"),
        "{}",
        o.stdout
    );

    let o = curl(&[
        "--socks5-hostname",
        &s,
        &format!("http://localhost:{}/", other.port),
    ]);
    assert_eq!(
        o.code, 97,
        "curl should fail the SOCKS handshake: {}",
        o.stderr
    );
    let o = curl(&["--socks5-hostname", &s, "http://example.org/"]);
    assert_eq!(o.code, 97, "{}", o.stderr);
    assert_eq!(other.hits(), 0);

    let recs = p.finish();
    let r = only(&recs, "localhost", origin.port);
    assert_eq!(
        (r.protocol, r.decision, r.reason),
        ("socks5", "allow", None)
    );
    assert!(r.bytes_up > 0 && r.bytes_down > 0, "{r:?}");
    let r = only(&recs, "localhost", other.port);
    assert_eq!(
        (r.protocol, r.decision, r.reason),
        ("socks5", "deny", Some("not_allowed"))
    );
    let r = only(&recs, "example.org", 80);
    assert_eq!((r.decision, r.reason), ("deny", Some("not_allowed")));
}

#[test]
fn socks5_ipv4_atyp_needs_the_literal() {
    let origin = http_origin();
    let p = proxy(&[&format!("127.0.0.1:{}", origin.port)], &[]);
    let s = format!("127.0.0.1:{}", p.socks);
    // curl resolves locally and sends ATYP IPv4.
    let o = curl(&[
        "--socks5",
        &s,
        "-w",
        "\n%{http_code}",
        &format!("http://127.0.0.1:{}/v4", origin.port),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.ends_with("\n200"), "{}", o.stdout);
    let recs = p.finish();
    let r = only(&recs, "127.0.0.1", origin.port);
    assert_eq!((r.protocol, r.decision), ("socks5", "allow"));
}

#[test]
fn socks_reply_codes() {
    let dead = dead_port();
    let p = proxy(&[&format!("localhost:{dead}")], &["bad.example.com"]);
    let e = moat_proxy::socks_connect(p.socks_addr(), "example.org", 443)
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("(0x02)"), "{e}");
    let e = moat_proxy::socks_connect(p.socks_addr(), "bad.example.com", 443)
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    let e = moat_proxy::socks_connect(p.socks_addr(), "localhost", dead)
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    assert!(e.to_string().contains("(0x05)"), "{e}");
    let recs = p.finish();
    let reasons: Vec<_> = recs.iter().map(|r| r.reason.unwrap_or("")).collect();
    assert_eq!(reasons, ["not_allowed", "denied", "upstream_failed"]);
}

#[test]
fn socks_stdio_relays_both_ways() {
    let echo = echo_server();
    let p = proxy(&[&format!("localhost:{}", echo.port)], &[]);
    // Our end `ours` plays the ssh process: it writes what goes to stdin
    // and reads what comes out of stdout.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let input = theirs.try_clone().unwrap();
    let output = theirs;
    let addr = p.socks_addr();
    let port = echo.port;
    let t =
        std::thread::spawn(move || moat_proxy::socks_relay(addr, "localhost", port, input, output));

    let mut ours_w = ours.try_clone().unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let p2 = payload.clone();
    let writer = std::thread::spawn(move || {
        ours_w.write_all(&p2).unwrap();
        // EOF on "stdin": half-close so the echo server finishes.
        ours_w.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let mut got = Vec::new();
    let mut r = &ours;
    r.read_to_end(&mut got)
        .unwrap_or_else(|e| panic!("after {} bytes: {e}", got.len()));
    writer.join().unwrap();
    t.join().unwrap().unwrap();
    assert_eq!(got.len(), payload.len());
    assert!(got == payload);

    let recs = p.finish();
    let r = only(&recs, "localhost", echo.port);
    assert_eq!(
        (r.protocol, r.decision, r.bytes_up, r.bytes_down),
        ("socks5", "allow", 200_000, 200_000)
    );
}

#[test]
fn socks_stdio_reports_refusal() {
    let p = proxy(&["example.com"], &[]);
    let (a, _b) = UnixStream::pair().unwrap();
    let e = moat_proxy::socks_relay(p.socks_addr(), "example.org", 22, a.try_clone().unwrap(), a)
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("not allowed"), "{e}");
    p.finish();
}
