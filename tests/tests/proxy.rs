//! Proxy family (`--network proxy`, issue 3): real clients (curl, git, pip,
//! python sockets) inside the sandbox against servers this test starts on the
//! host's 127.0.0.1. Every case asserts what the host-side server saw
//! (connections, request lines) — the side effect — and every refusal has a
//! positive control showing the same server is reachable when allowed.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;

use moat_conformance::*;

const CURL: &str = "/usr/bin/curl";

/// `moat exec --policy LEVEL --network proxy EXTRA... -- ARGV...`
fn pexec(fx: &Fixture, level: &str, extra: &[&str], argv: &[&str]) -> Command {
    let mut a: Vec<String> = vec![
        "exec".into(),
        "--policy".into(),
        level.into(),
        "--network".into(),
        "proxy".into(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push("--".into());
    a.extend(argv.iter().map(|s| s.to_string()));
    fx.moat(a)
}

/// `--allow-domain X` for each X.
fn allow(pats: &[&str]) -> Vec<String> {
    pats.iter()
        .flat_map(|p| ["--allow-domain".to_string(), p.to_string()])
        .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// curl inside the sandbox, printing the body then `CODE=<http code>`.
fn curl(fx: &Fixture, extra: &[&str], curl_args: &[&str]) -> Out {
    let mut argv = vec![
        CURL,
        "-sS",
        "--max-time",
        "20",
        "-w",
        "\nCODE=%{http_code}\n",
    ];
    argv.extend_from_slice(curl_args);
    run(pexec(fx, "read-only", extra, &argv))
}

/// A request made from the test process itself (host side, no sandbox):
/// the positive control that a server really counts connections.
fn host_get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("host connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").expect("host write");
    let mut r = String::new();
    let _ = s.read_to_string(&mut r);
    r
}

fn assert_no_conn(srv: &HttpServer, what: &str, out: &Out) {
    let n = srv.settled_connections();
    assert_eq!(
        n,
        0,
        "LEAK: {what}: host server on 127.0.0.1:{} saw {n} connection(s): {:?}\n{}",
        srv.port,
        srv.requests(),
        out.dump()
    );
}

// ------------------------------------------------------------------ 1. HTTP

#[test]
fn http_proxy_allowed_port_works_other_port_refused_deny_wins() {
    let fx = Fixture::new();
    let body = unique("BODY");
    let ok = HttpServer::fixed(&body);
    let other = HttpServer::fixed("other-server");
    let a = allow(&[&format!("127.0.0.1:{}", ok.port)]);

    // Allowed: the body arrives, the server saw the request.
    let out = curl(
        &fx,
        &strs(&a),
        &[&format!("http://127.0.0.1:{}/allowed", ok.port)],
    );
    out.expect_code(0)
        .expect_stdout_has(&body)
        .expect_stdout_has("CODE=200");
    assert!(
        ok.requests().iter().any(|r| r.starts_with("GET /allowed")),
        "server saw no GET /allowed: {:?}\n{}",
        ok.requests(),
        out.dump()
    );

    // Same IP, a port not on the list: 403 with the reason, nothing reached.
    let out = curl(
        &fx,
        &strs(&a),
        &[&format!("http://127.0.0.1:{}/x", other.port)],
    );
    out.expect_stdout_has("CODE=403")
        .expect_stdout_has(&format!(
            "moat: blocked 127.0.0.1:{} (not_allowed)",
            other.port
        ));
    assert_no_conn(&other, "non-allowed port", &out);
    // Positive control: that server does count connections.
    assert!(host_get(other.port, "/ctl").contains("other-server"));
    assert_eq!(other.connections(), 1);

    // Deny wins over allow, for the exact entry and for localhost by name.
    let before = ok.connections();
    let mut a2 = a.clone();
    a2.extend(["--deny-domain".into(), format!("127.0.0.1:{}", ok.port)]);
    let out = curl(
        &fx,
        &strs(&a2),
        &[&format!("http://127.0.0.1:{}/denied", ok.port)],
    );
    out.expect_stdout_has("CODE=403")
        .expect_stdout_has(&format!("moat: blocked 127.0.0.1:{} (denied)", ok.port));
    out.expect_absent(&body, "body of a denied server");
    let a3 = [
        "--allow-domain".to_string(),
        format!("localhost:{}", ok.port),
        "--deny-domain".into(),
        "localhost".into(),
    ];
    let out3 = curl(
        &fx,
        &strs(&a3),
        &[&format!("http://localhost:{}/denied2", ok.port)],
    );
    out3.expect_stdout_has("CODE=403")
        .expect_stdout_has("(denied)");
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        ok.connections(),
        before,
        "LEAK: a denied request reached the server: {:?}\n{}\n{}",
        ok.requests(),
        out.dump(),
        out3.dump()
    );

    // No allow entries at all: nothing reachable.
    let out = curl(&fx, &[], &[&format!("http://127.0.0.1:{}/none", ok.port)]);
    out.expect_stdout_has("CODE=403")
        .expect_stdout_has("(not_allowed)");
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        ok.connections(),
        before,
        "LEAK with no allow list\n{}",
        out.dump()
    );
}

// ------------------------------------------------------------ 2. CONNECT

#[test]
fn connect_tunnel_allowed_and_refused() {
    let fx = Fixture::new();
    let body = unique("TUNNEL");
    let ok = HttpServer::fixed(&body);
    let other = HttpServer::fixed("other");
    let a = allow(&[&format!("127.0.0.1:{}", ok.port)]);

    let out = curl(
        &fx,
        &strs(&a),
        &["-p", &format!("http://127.0.0.1:{}/t", ok.port)],
    );
    out.expect_code(0).expect_stdout_has(&body);
    // Through a tunnel the origin server gets origin-form, not a proxy request.
    assert!(
        ok.requests().iter().any(|r| r.starts_with("GET /t ")),
        "server did not see the tunnelled GET /t: {:?}\n{}",
        ok.requests(),
        out.dump()
    );

    let out = curl(
        &fx,
        &strs(&a),
        &["-p", &format!("http://127.0.0.1:{}/t", other.port)],
    );
    assert_ne!(
        out.code,
        Some(0),
        "CONNECT to a non-allowed port succeeded\n{}",
        out.dump()
    );
    assert!(
        out.stderr.contains("403"),
        "curl should report the 403 to CONNECT\n{}",
        out.dump()
    );
    assert_no_conn(&other, "CONNECT to a non-allowed port", &out);
}

// ------------------------------------------------------------- 3. SOCKS5

#[test]
fn socks5h_allowed_and_refused() {
    let fx = Fixture::new();
    let body = unique("SOCKS");
    let ok = HttpServer::fixed(&body);
    let other = HttpServer::fixed("other");
    let a = allow(&[
        &format!("127.0.0.1:{}", ok.port),
        &format!("localhost:{}", ok.port),
    ]);

    // Explicit socks5h endpoint, IP and name (the name is resolved by moat).
    for host in ["127.0.0.1", "localhost"] {
        let url = format!("http://{host}:{}/s-{host}", ok.port);
        let out = curl(
            &fx,
            &strs(&a),
            &["--socks5-hostname", "127.0.0.1:1080", &url],
        );
        out.expect_code(0).expect_stdout_has(&body);
        assert!(
            ok.requests()
                .iter()
                .any(|r| r.starts_with(&format!("GET /s-{host} "))),
            "server did not see the SOCKS request for {host}: {:?}\n{}",
            ok.requests(),
            out.dump()
        );
    }

    // Through the ALL_PROXY moat sets (HTTP proxy variables removed).
    let url = format!("http://localhost:{}/s-env", ok.port);
    let out = run(pexec(
        &fx,
        "read-only",
        &strs(&a),
        &[
            "/usr/bin/env",
            "-u",
            "http_proxy",
            "-u",
            "HTTP_PROXY",
            CURL,
            "-sS",
            "--max-time",
            "20",
            &url,
        ],
    ));
    out.expect_code(0).expect_stdout_has(&body);
    assert!(ok.requests().iter().any(|r| r.starts_with("GET /s-env ")));

    // Refused: SOCKS reply 0x02, curl exit 97, nothing reached.
    let url = format!("http://127.0.0.1:{}/s", other.port);
    let out = curl(
        &fx,
        &strs(&a),
        &["--socks5-hostname", "127.0.0.1:1080", &url],
    );
    out.expect_code(97);
    assert_no_conn(&other, "SOCKS to a non-allowed port", &out);
}

// ------------------------------------------------------- 4. address guard

/// A name other than `localhost` that /etc/hosts maps to a loopback address.
fn loopback_alias() -> Option<String> {
    let hosts = std::fs::read_to_string("/etc/hosts").ok()?;
    for l in hosts.lines() {
        let l = l.split('#').next().unwrap_or("");
        let mut w = l.split_whitespace();
        let Some(ip) = w.next() else { continue };
        if !ip.starts_with("127.") {
            continue;
        }
        for name in w {
            // moat refuses single-label patterns, so the alias needs a dot.
            if !name.contains("localhost") && name.contains('.') {
                return Some(name.to_string());
            }
        }
    }
    None
}

#[test]
fn address_guard_localhost_explicit_only() {
    let fx = Fixture::new();
    let body = unique("GUARD");
    let srv = HttpServer::fixed(&body);
    let p = srv.port;

    // localhost:PORT explicitly allowed: works.
    let out = curl(
        &fx,
        &strs(&allow(&[&format!("localhost:{p}")])),
        &[&format!("http://localhost:{p}/lh")],
    );
    out.expect_code(0).expect_stdout_has(&body);
    let n0 = srv.connections();
    assert!(n0 >= 1);

    // Only *.example.com allowed: a loopback literal is refused.
    let out = curl(
        &fx,
        &strs(&allow(&["*.example.com"])),
        &[&format!("http://127.0.0.1:{p}/x")],
    );
    out.expect_stdout_has("CODE=403")
        .expect_stdout_has(&format!("moat: blocked 127.0.0.1:{p} ("));
    // A loopback literal does not match a name pattern, and localhost is not
    // implied by allowing 127.0.0.1 the other way round either.
    let out2 = curl(
        &fx,
        &strs(&allow(&["*.example.com"])),
        &[&format!("http://localhost:{p}/y")],
    );
    out2.expect_stdout_has("CODE=403");
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        srv.connections(),
        n0,
        "LEAK: {:?}\n{}\n{}",
        srv.requests(),
        out.dump(),
        out2.dump()
    );

    // An allowed NAME that resolves to loopback (via /etc/hosts) is refused
    // with private_address unless the IP literal is allowed too.
    let Some(alias) = loopback_alias() else {
        // Root reruns this test in a private mount namespace whose
        // /etc/hosts has such a name (the host file stays untouched);
        // .ci/run adds one for the unprivileged phase.
        if euid() == 0 && std::env::var_os(HOSTS_INNER).is_none() {
            return rerun_with_loopback_alias("address_guard_localhost_explicit_only");
        }
        skip("no multi-label non-localhost loopback name in /etc/hosts; name->loopback guard case not run (.ci/run adds loop.moat.test)");
        return;
    };
    let out = curl(
        &fx,
        &strs(&allow(&[&format!("{alias}:{p}")])),
        &[&format!("http://{alias}:{p}/alias")],
    );
    out.expect_stdout_has("CODE=403")
        .expect_stdout_has(&format!("moat: blocked {alias}:{p} (private_address)"));
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        srv.connections(),
        n0,
        "LEAK via {alias}: {:?}\n{}",
        srv.requests(),
        out.dump()
    );
    // Positive control: with the literal allowed as well, the same name works.
    let out = curl(
        &fx,
        &strs(&allow(&[
            &format!("{alias}:{p}"),
            &format!("127.0.0.1:{p}"),
        ])),
        &[&format!("http://{alias}:{p}/alias-ok")],
    );
    out.expect_code(0).expect_stdout_has(&body);
    println!("alias-case-ran via {alias}");
}

/// Set in the rerun `rerun_with_loopback_alias` starts.
const HOSTS_INNER: &str = "MOAT_CONFORMANCE_HOSTS_INNER";

/// Run test `name` again in a private mount namespace whose /etc/hosts maps
/// `loop.moat.test` to 127.0.0.1, and require that its alias case ran.
fn rerun_with_loopback_alias(name: &str) {
    let dir = std::env::temp_dir().join(unique("hosts"));
    std::fs::create_dir_all(&dir).unwrap();
    let hosts = dir.join("hosts");
    let mut text = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    text.push_str("\n127.0.0.1 loop.moat.test\n");
    std::fs::write(&hosts, text).unwrap();
    let out = std::process::Command::new("unshare")
        .args([
            "--mount",
            "sh",
            "-c",
            "mount --make-rprivate / && mount --bind \"$1\" /etc/hosts && exec \"$2\" --exact \"$3\" --nocapture --test-threads 1",
            "sh",
        ])
        .arg(&hosts)
        .arg(std::env::current_exe().unwrap())
        .arg(name)
        .env(HOSTS_INNER, "1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "rerun with a private /etc/hosts failed:\n{text}"
    );
    assert!(
        text.contains("alias-case-ran via loop.moat.test"),
        "the name->loopback case did not run in the rerun:\n{text}"
    );
}

// ------------------------------------------------------------ 5. bypasses

#[test]
fn bypass_noproxy_direct_connect_records_nothing() {
    let fx = Fixture::new();
    let body = unique("DIRECT");
    let srv = HttpServer::fixed(&body);
    let p = srv.port;
    let a = allow(&[&format!("127.0.0.1:{p}")]);

    // curl ignoring the proxy variables: the host's 127.0.0.1 is not the sandbox's.
    let out = run(pexec(
        &fx,
        "read-only",
        &strs(&a),
        &[
            CURL,
            "-sS",
            "--max-time",
            "10",
            "--noproxy",
            "*",
            &format!("http://127.0.0.1:{p}/direct"),
        ],
    ));
    assert_ne!(out.code, Some(0), "direct curl succeeded\n{}", out.dump());
    out.expect_absent(&body, "server body over a direct connection");

    // python socket.create_connection to the host port, and to the host's
    // non-loopback address, both fail.
    let wide = TcpListener::bind("0.0.0.0:0").expect("bind 0.0.0.0");
    let wport = wide.local_addr().expect("addr").port();
    wide.set_nonblocking(true).expect("nb");
    let ip = host_ipv4();
    let code = r#"
import socket, sys
for host, port in [("127.0.0.1", int(sys.argv[1])), (sys.argv[2], int(sys.argv[3]))]:
    if host == "-":
        continue
    try:
        s = socket.create_connection((host, port), timeout=5); s.sendall(b"LEAK"); s.close()
        print("CONNECT", host, "OK", flush=True)
    except OSError as e:
        print("CONNECT", host, "ERRNO", e.errno, flush=True)
"#;
    let ips = ip.map(|i| i.to_string()).unwrap_or_else(|| "-".into());
    let mut argv: Vec<String> = vec!["exec".into(), "--network".into(), "proxy".into()];
    argv.extend(a.iter().cloned());
    argv.extend([
        "--".into(),
        PY.into(),
        "-c".into(),
        code.into(),
        p.to_string(),
        ips.clone(),
        wport.to_string(),
    ]);
    let out2 = run(fx.moat(argv));
    out2.expect_code(0);
    let lines: Vec<String> = out2
        .stdout
        .lines()
        .filter(|l| l.starts_with("CONNECT"))
        .map(String::from)
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("CONNECT 127.0.0.1 ERRNO")),
        "python direct connect to 127.0.0.1:{p} did not fail\n{}",
        out2.dump()
    );
    assert!(
        !out2.stdout.contains(" OK"),
        "a direct connect succeeded\n{}",
        out2.dump()
    );
    assert_no_conn(&srv, "direct connection (curl --noproxy / python)", &out);
    let mut wide_hits = 0;
    while wide.accept().is_ok() {
        wide_hits += 1;
    }
    assert_eq!(
        wide_hits,
        0,
        "LEAK: listener on 0.0.0.0:{wport} reached via {ips}\n{}",
        out2.dump()
    );
    if let Some(ip) = ip {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("CONNECT {ip} ERRNO"))),
            "{}",
            out2.dump()
        );
        // Positive control: the host itself reaches that address.
        TcpStream::connect((ip, wport)).expect("host connect to own address");
        thread::sleep(Duration::from_millis(50));
        let mut n = 0;
        while wide.accept().is_ok() {
            n += 1;
        }
        assert_eq!(
            n, 1,
            "positive control: listener on {ip}:{wport} does not count"
        );
    } else {
        skip("no global IPv4 address: direct connect to a host address not probed");
    }

    // Positive control for the same server through the proxy.
    let out = curl(&fx, &strs(&a), &[&format!("http://127.0.0.1:{p}/ctl")]);
    out.expect_code(0).expect_stdout_has(&body);
}

#[test]
fn bypass_caller_http_proxy_env_reaches_nothing() {
    let fx = Fixture::new();
    let target = HttpServer::fixed("target");
    let (fake, fport) = Listener::tcp();
    let fake_url = format!("http://127.0.0.1:{fport}");
    let a = allow(&[&format!("127.0.0.1:{}", target.port)]);
    let url = format!("http://127.0.0.1:{}/via-fake", target.port);
    let script = format!(
        "echo \"SEEN http_proxy=$http_proxy HTTP_PROXY=$HTTP_PROXY\"; {CURL} -sS --max-time 10 {url}; echo \"RC=$?\""
    );

    // --env: the caller's value replaces moat's, and still goes nowhere.
    let mut extra = strs(&a);
    let e1 = format!("http_proxy={fake_url}");
    let e2 = format!("HTTP_PROXY={fake_url}");
    extra.extend(["--env", &e1, "--env", &e2]);
    let out = run(fx.sh(
        "read-only",
        &[&["--network", "proxy"][..], extra.as_slice()].concat(),
        &script,
    ));
    assert!(
        out.stdout
            .contains(&format!("SEEN http_proxy={fake_url} HTTP_PROXY={fake_url}")),
        "the --env proxy value was not in effect (test would be vacuous)\n{}",
        out.dump()
    );
    assert!(
        !out.stdout.contains("RC=0"),
        "curl via the caller's proxy succeeded\n{}",
        out.dump()
    );
    assert!(
        out.stderr.contains(&fport.to_string()),
        "curl did not try the fake proxy port {fport}\n{}",
        out.dump()
    );

    // --pass-env of a host HTTP_PROXY: whatever wins, nothing reaches the host.
    let mut c = fx.sh(
        "read-only",
        &[
            &[
                "--network",
                "proxy",
                "--pass-env",
                "HTTP_PROXY",
                "--pass-env",
                "http_proxy",
            ][..],
            strs(&a).as_slice(),
        ]
        .concat(),
        &format!("{CURL} -sS --max-time 10 {url}; echo \"RC=$?\""),
    );
    c.env("HTTP_PROXY", &fake_url).env("http_proxy", &fake_url);
    let out2 = run(c);
    let (hits, data) = fake.finish();
    assert_eq!(
        hits,
        0,
        "LEAK: host 'proxy' listener on {fport} got {hits} connection(s): {:?}\n{}\n{}",
        String::from_utf8_lossy(&data),
        out.dump(),
        out2.dump()
    );
    // With --pass-env moat's proxy stays in charge (or the request fails);
    // either way the target was reached at most through moat.
    if out2.stdout.contains("RC=0") {
        assert!(target
            .requests()
            .iter()
            .any(|r| r.starts_with("GET /via-fake")));
    }
    let reqs_via_env = target.requests().len();
    assert!(
        reqs_via_env <= 1,
        "target reached more often than the one moat-proxied request: {:?}",
        target.requests()
    );
}

#[test]
fn bypass_udp_datagram_reaches_nothing() {
    let fx = Fixture::new();
    let (ul, up) = Listener::udp();
    let code = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(5):
    try:
        s.sendto(b"LEAK-UDP", ("127.0.0.1", int(sys.argv[1]))); print("SENT", flush=True)
    except OSError as e:
        print("ERRNO", e.errno, flush=True)
"#;
    let out = run(fx.py(
        "read-only",
        &[
            "--network",
            "proxy",
            "--allow-domain",
            &format!("127.0.0.1:{up}"),
        ],
        code,
        &[&up.to_string()],
    ));
    out.expect_code(0);
    thread::sleep(Duration::from_millis(300));
    let inside = ul.hits.load(Ordering::SeqCst);
    // Positive control: a datagram from the host itself is counted.
    let s = UdpSocket::bind("127.0.0.1:0").expect("udp");
    s.send_to(b"control", ("127.0.0.1", up)).expect("send");
    let (hits, data) = ul.finish();
    assert_eq!(
        inside,
        0,
        "LEAK: host UDP listener got datagrams from the sandbox: {:?}\n{}",
        String::from_utf8_lossy(&data),
        out.dump()
    );
    assert_eq!(hits, 1, "positive control: the UDP listener does not count");
}

// ------------------------------------------------------- 6. git over HTTP

fn host_git(dir: &Path, fx: &Fixture, args: &[&str]) {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=moat",
            "-c",
            "user.email=moat@example.invalid",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", HOST_PATH)
        .env("HOME", &fx.home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("run host git");
    assert!(
        out.status.success(),
        "host git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn git_clone_over_http_through_proxy() {
    let fx = Fixture::new();
    let marker = unique("GITFILE");
    let src = fx.root.join("gitsrc");
    let served = fx.root.join("served");
    std::fs::create_dir_all(&src).expect("mkdir");
    std::fs::create_dir_all(&served).expect("mkdir");
    host_git(&src, &fx, &["init", "-q"]);
    write(src.join("hello.txt"), &format!("{marker}\n"));
    host_git(&src, &fx, &["add", "hello.txt"]);
    host_git(&src, &fx, &["commit", "-q", "-m", "init"]);
    host_git(
        &fx.root,
        &fx,
        &["clone", "-q", "--bare", "gitsrc", "served/repo.git"],
    );
    host_git(&served.join("repo.git"), &fx, &["update-server-info"]);
    let srv = HttpServer::dir(&served);
    let url = format!("http://127.0.0.1:{}/repo.git", srv.port);

    // Without an allow entry: fails, nothing lands, server saw nothing.
    let out = run(pexec(
        &fx,
        "workspace-write",
        &[],
        &["git", "clone", &url, "denied"],
    ));
    assert_ne!(
        out.code,
        Some(0),
        "git clone without allow succeeded\n{}",
        out.dump()
    );
    assert!(read(fx.w("denied/hello.txt")).is_none());
    assert_no_conn(&srv, "git clone without allow entry", &out);

    // Allowed: the file lands in the workspace.
    let a = allow(&[&format!("127.0.0.1:{}", srv.port)]);
    let mut extra = strs(&a);
    extra.extend(["--timeout", "60s"]);
    let out = run(pexec(
        &fx,
        "workspace-write",
        &extra,
        &["git", "clone", &url, "cloned"],
    ));
    out.expect_code(0);
    assert_eq!(
        read(fx.w("cloned/hello.txt")).as_deref(),
        Some(format!("{marker}\n").as_str()),
        "cloned file missing or wrong\n{}",
        out.dump()
    );
    assert!(
        srv.requests()
            .iter()
            .any(|r| r.contains("/repo.git/info/refs")),
        "server saw no info/refs request: {:?}",
        srv.requests()
    );
}

// ------------------------------------------------ 7. pip from a local index

const MAKE_WHEEL: &str = r#"
import base64, hashlib, os, sys, zipfile
root, name, marker = sys.argv[1], sys.argv[2], sys.argv[3]
ver = "1.0"
dist = f"{name}-{ver}.dist-info"
files = {
    f"{name}/__init__.py": f"MARK = {marker!r}\n".encode(),
    f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n".encode(),
    f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: moat-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = ""
for p, d in files.items():
    h = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
    record += f"{p},sha256={h},{len(d)}\n"
record += f"{dist}/RECORD,,\n"
files[f"{dist}/RECORD"] = record.encode()
whl = f"{name}-{ver}-py3-none-any.whl"
os.makedirs(os.path.join(root, "files"), exist_ok=True)
with zipfile.ZipFile(os.path.join(root, "files", whl), "w") as z:
    for p, d in files.items():
        z.writestr(p, d)
digest = hashlib.sha256(open(os.path.join(root, "files", whl), "rb").read()).hexdigest()
os.makedirs(os.path.join(root, "simple", name), exist_ok=True)
with open(os.path.join(root, "simple", "index.html"), "w") as f:
    f.write(f'<!DOCTYPE html><html><body><a href="{name}/">{name}</a></body></html>\n')
with open(os.path.join(root, "simple", name, "index.html"), "w") as f:
    f.write(f'<!DOCTYPE html><html><body><a href="../../files/{whl}#sha256={digest}">{whl}</a></body></html>\n')
"#;

#[test]
fn pip_install_from_local_index_through_proxy() {
    let fx = Fixture::new();
    let pipv = Command::new(PY).args(["-m", "pip", "--version"]).output();
    if !pipv.map(|o| o.status.success()).unwrap_or(false) {
        skip("pip is not installed for /usr/bin/python3 (apt-get install python3-pip)");
        return;
    }
    let marker = unique("PIPMARK");
    let name = "moatprobe";
    let served = fx.root.join("index");
    let st = Command::new(PY)
        .args(["-c", MAKE_WHEEL])
        .arg(&served)
        .args([name, &marker])
        .status()
        .expect("make wheel");
    assert!(st.success(), "building the test wheel failed");
    let srv = HttpServer::dir(&served);
    let index = format!("http://127.0.0.1:{}/simple/", srv.port);
    let pip = |extra: &[&str]| {
        let mut e = extra.to_vec();
        e.extend(["--timeout", "90s"]);
        run(pexec(
            &fx,
            "workspace-write",
            &e,
            &[
                PY,
                "-m",
                "pip",
                "install",
                "--no-cache-dir",
                "--disable-pip-version-check",
                "--no-input",
                "--retries",
                "0",
                "--timeout",
                "15",
                "--target",
                "./site",
                "-i",
                &index,
                name,
            ],
        ))
    };

    // Not allowed: nothing installed, nothing reached.
    let out = pip(&[]);
    assert_ne!(
        out.code,
        Some(0),
        "pip install without allow succeeded\n{}",
        out.dump()
    );
    assert!(!exists(fx.w("site").join(name)));
    assert_no_conn(&srv, "pip without allow entry", &out);

    // Allowed: the package lands in the workspace and imports.
    let a = allow(&[&format!("127.0.0.1:{}", srv.port)]);
    let out = pip(&strs(&a));
    out.expect_code(0);
    let init = read(fx.w("site").join(name).join("__init__.py"));
    assert!(
        init.as_deref().is_some_and(|s| s.contains(&marker)),
        "installed module missing: {init:?}\n{}",
        out.dump()
    );
    assert!(
        srv.requests()
            .iter()
            .any(|r| r.contains(&format!("/simple/{name}/"))),
        "index not queried: {:?}",
        srv.requests()
    );
    let out = run(fx.py(
        "read-only",
        &["--env", "PYTHONPATH=site"],
        &format!("import {name}; print('IMPORTED', {name}.MARK)"),
        &[],
    ));
    out.expect_code(0)
        .expect_stdout_has(&format!("IMPORTED {marker}"));
}

// ------------------------------------------------ 8. --json network.requests

#[test]
fn json_network_requests_match_what_happened() {
    let fx = Fixture::new();
    let body = unique("JSONREQ");
    let ok = HttpServer::fixed(&body);
    let no = HttpServer::fixed("no");
    let den = HttpServer::fixed("den");
    let log = fx.root.join("audit.jsonl");
    let mut a = allow(&[
        &format!("127.0.0.1:{}", ok.port),
        &format!("127.0.0.1:{}", den.port),
    ]);
    a.extend([
        "--deny-domain".into(),
        format!("127.0.0.1:{}", den.port),
        "--json".into(),
        "--audit-log".into(),
        log.to_string_lossy().into_owned(),
    ]);
    let script = format!(
        "{CURL} -sS --max-time 20 http://127.0.0.1:{ok}/a; {CURL} -sS --max-time 20 http://127.0.0.1:{no}/b; \
         {CURL} -sS --max-time 20 http://127.0.0.1:{den}/c; {CURL} -sS --max-time 20 -p http://127.0.0.1:{ok}/d; true",
        ok = ok.port,
        no = no.port,
        den = den.port
    );
    let mut extra = vec!["--network", "proxy"];
    extra.extend(strs(&a));
    let out = run(fx.sh("read-only", &extra, &script));
    out.expect_code(0);
    let j = out.json();
    assert!(
        j["stdout"].as_str().unwrap_or("").contains(&body),
        "{}",
        out.dump()
    );
    assert_eq!(j["network"]["mode"], "proxy");
    let reqs = j["network"]["requests"]
        .as_array()
        .unwrap_or_else(|| panic!("no network.requests\n{}", out.dump()))
        .clone();
    assert_eq!(
        reqs.len(),
        4,
        "expected 4 decisions (2 allow, 2 deny): {reqs:#?}"
    );
    let keys = [
        "protocol",
        "host",
        "port",
        "decision",
        "reason",
        "address",
        "bytes_up",
        "bytes_down",
        "duration_ms",
    ];
    for r in &reqs {
        for k in keys {
            assert!(r.get(k).is_some(), "record lacks {k}: {r}");
        }
        assert_eq!(r["host"], "127.0.0.1", "{r}");
    }
    let find = |port: u16| {
        reqs.iter()
            .filter(|r| r["port"] == port)
            .cloned()
            .collect::<Vec<_>>()
    };
    let allowed = find(ok.port);
    assert_eq!(allowed.len(), 2, "{reqs:#?}");
    for r in &allowed {
        assert_eq!(r["decision"], "allow", "{r}");
        assert!(r["reason"].is_null(), "{r}");
        assert_eq!(r["address"], format!("127.0.0.1:{}", ok.port), "{r}");
        assert!(
            r["bytes_up"].as_u64().unwrap_or(0) >= 16,
            "bytes_up too small: {r}"
        );
        assert!(
            r["bytes_down"].as_u64().unwrap_or(0) >= body.len() as u64,
            "bytes_down too small: {r}"
        );
    }
    assert_ne!(
        allowed[0]["protocol"], allowed[1]["protocol"],
        "plain HTTP and CONNECT recorded alike: {allowed:#?}"
    );
    let n = find(no.port);
    assert_eq!(n.len(), 1);
    assert_eq!(n[0]["decision"], "deny");
    assert_eq!(n[0]["reason"], "not_allowed");
    assert!(n[0]["address"].is_null(), "{}", n[0]);
    assert_eq!(n[0]["bytes_up"], 0);
    let d = find(den.port);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["decision"], "deny");
    assert_eq!(d[0]["reason"], "denied");
    // The servers agree: only `ok` was reached, twice.
    assert_eq!(ok.connections(), 2, "{:?}", ok.requests());
    assert_eq!(no.settled_connections() + den.connections(), 0);

    // The same decisions are network.decision events in the audit log.
    let text = read(&log).expect("audit log");
    let ev: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .filter(|v: &serde_json::Value| v["type"] == "network.decision")
        .collect();
    assert_eq!(ev.len(), 4, "network.decision events: {ev:#?}");
    for (e, r) in ev.iter().zip(&reqs) {
        for k in ["host", "port", "decision", "reason", "protocol"] {
            assert_eq!(
                e[k], r[k],
                "log event {e} vs --json record {r} differ in {k}"
            );
        }
        assert_eq!(e["execution_id"], j["execution_id"]);
    }
}

// ------------------------------------------- 9. launch, env, bad patterns

#[test]
fn proxy_mode_launches_and_sets_proxy_env() {
    let fx = Fixture::new();
    for level in SANDBOXED {
        let out = run(pexec(&fx, level, &[], &["/bin/true"]));
        out.expect_code(0);
        assert!(
            out.stderr.is_empty(),
            "unexpected stderr at {level}\n{}",
            out.dump()
        );
    }
    let out = run(pexec(&fx, "read-only", &[], &["/usr/bin/env"]));
    out.expect_code(0);
    let want = [
        ("HTTP_PROXY", "http://127.0.0.1:3128"),
        ("HTTPS_PROXY", "http://127.0.0.1:3128"),
        ("http_proxy", "http://127.0.0.1:3128"),
        ("https_proxy", "http://127.0.0.1:3128"),
        ("ALL_PROXY", "socks5h://127.0.0.1:1080"),
        ("all_proxy", "socks5h://127.0.0.1:1080"),
        ("NO_PROXY", ""),
        ("no_proxy", ""),
        ("NODE_USE_ENV_PROXY", "1"),
    ];
    for (k, v) in want {
        assert_eq!(out.field(k).as_deref(), Some(v), "{k}\n{}", out.dump());
    }
    let git_ssh = out.field("GIT_SSH_COMMAND").unwrap_or_default();
    assert!(
        git_ssh.contains("/moat/bin/moat proxy-connect %h %p"),
        "{git_ssh}"
    );
    let jto = out.field("JAVA_TOOL_OPTIONS").unwrap_or_default();
    for p in [
        "-Dhttp.proxyHost=127.0.0.1",
        "-Dhttp.proxyPort=3128",
        "-Dhttps.proxyHost=127.0.0.1",
        "-Dhttps.proxyPort=3128",
    ] {
        assert!(jto.contains(p), "JAVA_TOOL_OPTIONS lacks {p}: {jto}");
    }
    // --env overrides moat's value.
    let out = run(pexec(
        &fx,
        "read-only",
        &["--env", "HTTPS_PROXY=http://override.invalid:1"],
        &["/usr/bin/env"],
    ));
    assert_eq!(
        out.field("HTTPS_PROXY").as_deref(),
        Some("http://override.invalid:1"),
        "{}",
        out.dump()
    );
}

#[test]
fn too_broad_patterns_refused_before_running() {
    let fx = Fixture::new();
    for (flag, pat) in [
        ("--allow-domain", "*"),
        ("--allow-domain", "*.com"),
        ("--deny-domain", "*"),
    ] {
        let marker = fx.w(&unique("ran"));
        let m = marker.to_string_lossy().into_owned();
        let out = run(pexec(
            &fx,
            "workspace-write",
            &[flag, pat],
            &["/usr/bin/touch", &m],
        ));
        // A broad deny is refused like a broad allow (one pattern parser):
        // exit 125, the command never ran, the pattern named.
        out.expect_code(125);
        assert!(
            !exists(&marker),
            "{flag} {pat}: refused but the command ran\n{}",
            out.dump()
        );
        assert!(
            out.stderr.contains(pat),
            "error does not name {pat}\n{}",
            out.dump()
        );
        assert!(
            !exists(&marker),
            "the command ran despite the refused pattern {pat}"
        );
    }
    // Positive control: a proper pattern runs the command.
    let marker = fx.w("ran-ok");
    run(pexec(
        &fx,
        "workspace-write",
        &["--allow-domain", "*.example.com"],
        &["/usr/bin/touch", &marker.to_string_lossy()],
    ))
    .expect_code(0);
    assert!(exists(&marker));
}

// ---------------------------------------- git-over-SSH helper: proxy-connect

#[test]
fn proxy_connect_helper_tunnels_only_allowed() {
    let fx = Fixture::new();
    let body = unique("PCONN");
    let ok = HttpServer::fixed(&body);
    let other = HttpServer::fixed("other");
    let script = |port: u16| {
        format!("printf 'GET /pc HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' | /moat/bin/moat proxy-connect 127.0.0.1 {port}; echo \"RC=$?\"")
    };
    let a = allow(&[&format!("127.0.0.1:{}", ok.port)]);
    let mut extra = vec!["--network", "proxy", "--timeout", "30s"];
    extra.extend(strs(&a));
    let out = run(fx.sh("read-only", &extra, &script(ok.port)));
    out.expect_stdout_has(&body).expect_stdout_has("RC=0");
    let out = run(fx.sh("read-only", &extra, &script(other.port)));
    assert!(
        !out.stdout.contains("RC=0"),
        "proxy-connect to a non-allowed port succeeded\n{}",
        out.dump()
    );
    assert_no_conn(&other, "proxy-connect to a non-allowed port", &out);
}

// ------------------------------------------------------ concurrency (small)

#[test]
fn many_parallel_requests_through_one_proxy() {
    let fx = Fixture::new();
    let body = unique("PAR");
    let srv = HttpServer::fixed(&body);
    let n = 40;
    let script = format!(
        "{CURL} -sS --max-time 10 --noproxy '*' http://127.0.0.1:{p}/direct >/dev/null 2>&1 && echo DIRECT-OK || echo DIRECT-BLOCKED; \
         for i in $(seq {n}); do {CURL} -sS --max-time 30 http://127.0.0.1:{p}/p$i -o /tmp/o$i & done; wait; cat /tmp/o* | grep -o {body} | wc -l",
        p = srv.port
    );
    let out = run(fx.sh(
        "read-only",
        &[
            "--network",
            "proxy",
            "--allow-domain",
            &format!("127.0.0.1:{}", srv.port),
        ],
        &script,
    ));
    out.expect_code(0);
    // The requests went through the proxy: a direct one (the same host and
    // port, bypassing the proxy) was blocked and never reached the server.
    out.expect_stdout_has("DIRECT-BLOCKED");
    assert_eq!(
        out.stdout.lines().last().map(str::trim),
        Some(n.to_string().as_str()),
        "not every parallel request got the body\n{}",
        out.dump()
    );
    assert_eq!(srv.connections(), n, "{:?}", srv.requests());
}
