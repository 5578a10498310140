//! Chaining through an upstream (corporate) proxy, with credentials.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use common::*;
use moat_proxy::{parse_upstream, ProxyConfig};

/// A minimal upstream proxy: logs each request line and Proxy-Authorization,
/// handles CONNECT and absolute-form requests.
fn fake_upstream() -> (u16, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = Arc::clone(&log);
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let log = Arc::clone(&log2);
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if c.read(&mut b).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let head = String::from_utf8(head).unwrap();
                let line = head.lines().next().unwrap().to_string();
                let auth = head
                    .lines()
                    .find(|l| l.to_ascii_lowercase().starts_with("proxy-authorization:"))
                    .unwrap_or("no-auth")
                    .to_string();
                log.lock().unwrap().push(format!("{line} | {auth}"));
                let mut parts = line.split(' ');
                let (method, target) = (parts.next().unwrap(), parts.next().unwrap());
                let mut up = if method == "CONNECT" {
                    let up = TcpStream::connect(target).unwrap();
                    c.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
                    up
                } else {
                    let rest = target.strip_prefix("http://").unwrap();
                    let (authority, path) = rest.split_at(rest.find('/').unwrap());
                    let mut up = TcpStream::connect(authority).unwrap();
                    let fwd = head.replacen(target, path, 1);
                    up.write_all(fwd.as_bytes()).unwrap();
                    up
                };
                let mut c2 = c.try_clone().unwrap();
                let mut up2 = up.try_clone().unwrap();
                let t = std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c2, &mut up2);
                    let _ = up2.shutdown(Shutdown::Write);
                });
                let _ = std::io::copy(&mut up, &mut c);
                let _ = c.shutdown(Shutdown::Write);
                let _ = t.join();
            });
        }
    });
    (port, log)
}

#[test]
fn chains_connect_and_plain_http_through_upstream_with_credentials() {
    let origin = http_origin();
    let (uport, log) = fake_upstream();
    let mut cfg = ProxyConfig::new(rules(
        &[&format!("127.0.0.1:{}", origin.port), "allowed.example.com"],
        &[],
    ));
    cfg.upstream = Some(parse_upstream(&format!("http://user:pa%3Ass@127.0.0.1:{uport}")).unwrap());
    let p = proxy_with(cfg);

    let o = curl(&[
        "-p",
        "-x",
        &p.http_url(),
        "-w",
        "\n%{http_code}",
        &format!("http://127.0.0.1:{}/tunnel", origin.port),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("GET /tunnel HTTP/1.1") && o.stdout.ends_with("\n200"),
        "{}",
        o.stdout
    );

    let o = curl(&[
        "-x",
        &p.http_url(),
        "-w",
        "\n%{http_code}",
        &format!("http://127.0.0.1:{}/plain", origin.port),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("GET /plain HTTP/1.1") && o.stdout.ends_with("\n200"),
        "{}",
        o.stdout
    );

    let o = curl(&[
        "--socks5-hostname",
        &format!("127.0.0.1:{}", p.socks),
        "-w",
        "\n%{http_code}",
        &format!("http://127.0.0.1:{}/socks", origin.port),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.ends_with("\n200"), "{}", o.stdout);

    // Decided locally: a refused host never reaches the upstream.
    let o = curl(&[
        "-x",
        &p.http_url(),
        "-w",
        "%{http_code}",
        "http://example.org/",
    ]);
    assert_eq!(
        o.stdout,
        format!(
            "{}\n403",
            moat_proxy::refusal_line("example.org", 80, moat_policy::net::Reason::NotAllowed)
        )
    );

    // base64("user:pa:ss")
    let auth = "Proxy-Authorization: Basic dXNlcjpwYTpzcw==";
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            format!("CONNECT 127.0.0.1:{} HTTP/1.1 | {auth}", origin.port),
            format!(
                "GET http://127.0.0.1:{}/plain HTTP/1.1 | {auth}",
                origin.port
            ),
            format!("CONNECT 127.0.0.1:{} HTTP/1.1 | {auth}", origin.port),
        ]
    );
    let recs = p.finish();
    assert_eq!(recs.len(), 4);
    let upstream_addr = format!("127.0.0.1:{uport}");
    for r in &recs[..3] {
        assert_eq!(
            (r.decision, r.address.as_deref()),
            ("allow", Some(upstream_addr.as_str())),
            "{r:?}"
        );
    }
    let json = serde_json::to_string(&recs).unwrap();
    assert!(!json.contains("dXNl") && !json.contains("user"), "{json}");
}

#[test]
fn upstream_down_is_upstream_failed() {
    let dead = dead_port();
    let mut cfg = ProxyConfig::new(rules(&["allowed.example.com"], &[]));
    cfg.upstream = Some(parse_upstream(&format!("http://127.0.0.1:{dead}")).unwrap());
    let p = proxy_with(cfg);
    let o = curl(&[
        "-x",
        &p.http_url(),
        "-w",
        "%{http_code}",
        "http://allowed.example.com/",
    ]);
    assert_eq!(
        o.stdout,
        format!(
            "{}\n502",
            moat_proxy::refusal_line(
                "allowed.example.com",
                80,
                moat_policy::net::Reason::UpstreamFailed
            )
        )
    );
    let o = curl(&[
        "-p",
        "-x",
        &p.http_url(),
        "-w",
        "%{http_connect}",
        "http://allowed.example.com:443/",
    ]);
    assert_eq!(o.stdout, "502");
    let recs = p.finish();
    assert!(
        recs.iter().all(|r| r.reason == Some("upstream_failed")),
        "{recs:#?}"
    );
}
