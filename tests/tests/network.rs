//! Network family: --network disabled (netns + seccomp socket filter), host
//! loopback TCP/UDP listeners, DNS, and host unix sockets (/tmp, /run,
//! $XDG_RUNTIME_DIR, $SSH_AUTH_SOCK, abstract).

use std::path::PathBuf;

use moat_conformance::*;

const NET_PROBE: &str = r#"
import socket, sys
tcp, udp = int(sys.argv[1]), int(sys.argv[2])
def fam(name, f, t, p=0):
    try:
        s = socket.socket(f, t, p); s.close(); print("PROBE", name, "OK", flush=True)
    except OSError as e:
        print("PROBE", name, "ERRNO", e.errno, flush=True)
fam("inet_stream", socket.AF_INET, socket.SOCK_STREAM)
fam("inet_dgram", socket.AF_INET, socket.SOCK_DGRAM)
fam("inet6_stream", socket.AF_INET6, socket.SOCK_STREAM)
fam("netlink", socket.AF_NETLINK, socket.SOCK_RAW, 0)
fam("packet", socket.AF_PACKET, socket.SOCK_RAW, 0)
fam("unix_stream", socket.AF_UNIX, socket.SOCK_STREAM)
fam("unix_dgram", socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    a, b = socket.socketpair(); a.send(b"x"); b.recv(1); print("PROBE socketpair OK", flush=True)
except OSError as e:
    print("PROBE socketpair ERRNO", e.errno, flush=True)
try:
    s = socket.create_connection(("127.0.0.1", tcp), timeout=3); s.sendall(b"LEAK-TCP"); s.close()
    print("PROBE tcp_connect OK", flush=True)
except OSError as e:
    print("PROBE tcp_connect ERRNO", e.errno, flush=True)
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"LEAK-UDP", ("127.0.0.1", udp))
    print("PROBE udp_send OK", flush=True)
except OSError as e:
    print("PROBE udp_send ERRNO", e.errno, flush=True)
"#;

#[test]
fn network_disabled_blocks_host_loopback_and_inet_sockets() {
    let fx = Fixture::new();
    for level in SANDBOXED {
        for explicit in [false, true] {
            let (tl, tp) = Listener::tcp();
            let (ul, up) = Listener::udp();
            let extra: &[&str] = if explicit {
                &["--network", "disabled"]
            } else {
                &[]
            };
            let out = run(fx.py(level, extra, NET_PROBE, &[&tp.to_string(), &up.to_string()]));
            let (th, _) = tl.finish();
            let (uh, _) = ul.finish();
            assert_eq!(th, 0, "TCP listener on host loopback got {th} connection(s) from {level} (explicit={explicit})\n{}", out.dump());
            assert_eq!(uh, 0, "UDP socket on host loopback got {uh} datagram(s) from {level} (explicit={explicit})\n{}", out.dump());
            expect_probe_errno(
                &out,
                &[
                    "inet_stream",
                    "inet_dgram",
                    "inet6_stream",
                    "netlink",
                    "packet",
                    "tcp_connect",
                    "udp_send",
                ],
                libc::EPERM,
            );
            let res = probe_results(&out);
            for ok in ["unix_stream", "unix_dgram", "socketpair"] {
                assert!(
                    res.iter().any(|(n, r)| n == ok && r == "OK"),
                    "AF_UNIX {ok} should be allowed at {level}\n{}",
                    out.dump()
                );
            }
        }
    }
}

#[test]
fn network_unmanaged_reaches_host_loopback_positive_control() {
    let fx = Fixture::new();
    for level in ["danger-full-access", "read-only"] {
        let (tl, tp) = Listener::tcp();
        let (ul, up) = Listener::udp();
        let out = run(fx.py(
            level,
            &["--network", "unmanaged"],
            NET_PROBE,
            &[&tp.to_string(), &up.to_string()],
        ));
        let (th, td) = tl.finish();
        let (uh, _) = ul.finish();
        assert!(
            th >= 1 && String::from_utf8_lossy(&td).contains("LEAK-TCP"),
            "unmanaged {level}: TCP listener saw nothing\n{}",
            out.dump()
        );
        assert!(
            uh >= 1,
            "unmanaged {level}: UDP saw nothing\n{}",
            out.dump()
        );
    }
}

#[test]
fn danger_full_access_cannot_be_put_behind_the_proxy() {
    let fx = Fixture::new();
    let marker = unique("proxyran");
    let out = run(fx.sh(
        "danger-full-access",
        &["--network", "proxy"],
        &format!("touch {marker}"),
    ));
    out.expect_code(125);
    assert!(
        !exists(fx.w(&marker)),
        "command ran despite the refusal of --network proxy at danger-full-access"
    );
}

/// A DNS server on host loopback (random UDP port) that answers every A
/// query with 203.0.113.7 and counts the queries it saw: a resolver the
/// test controls, so the case can fail on a host that cannot resolve
/// external names itself.
fn loopback_dns() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind dns");
    let port = sock.local_addr().expect("addr").port();
    sock.set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .expect("timeout");
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let mut b = [0u8; 512];
        while std::time::Instant::now() < deadline {
            let Ok((n, from)) = sock.recv_from(&mut b) else {
                continue;
            };
            if n < 12 {
                continue;
            }
            s2.fetch_add(1, Ordering::SeqCst);
            // Header: same id, response + recursion available, 1 question, 1 answer.
            let mut r = Vec::from(&b[..2]);
            r.extend_from_slice(&[0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0]);
            r.extend_from_slice(&b[12..n]);
            r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 203, 0, 113, 7]);
            let _ = sock.send_to(&r, from);
        }
    });
    (port, seen)
}

/// External names give nothing inside the sandbox: neither through the
/// host's configured resolver (getaddrinfo, getent) nor by querying a DNS
/// server directly (one on host loopback that answers every query). Each
/// attempt prints a PROBE line, so a probe that never ran fails the test.
#[test]
fn dns_gives_nothing_for_external_names() {
    use std::sync::atomic::Ordering;
    let fx = Fixture::new();
    let code = r#"
import socket, struct, sys
for n in ["example.com", "localhost"]:
    try:
        print("PROBE", n, "OK", sorted(set(a[4][0] for a in socket.getaddrinfo(n, 80))), flush=True)
    except OSError as e:
        print("PROBE", n, "ERR", e.errno, flush=True)
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\x07example\x03com\x00" + struct.pack(">HH", 1, 1)
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    s.sendto(q, ("127.0.0.1", int(sys.argv[1])))
    r = s.recv(512)
    print("PROBE dns_direct OK", ".".join(str(x) for x in r[-4:]), flush=True)
except OSError as e:
    print("PROBE dns_direct ERRNO", e.errno, flush=True)
"#;
    for level in SANDBOXED {
        let (port, seen) = loopback_dns();
        let out = run(fx.py(level, &[], code, &[&port.to_string()]));
        let res = probe_results(&out);
        let get = |name: &str| {
            res.iter()
                .find(|(n, _)| n == name)
                .map(|(_, r)| r.clone())
                .unwrap_or_else(|| panic!("probe {name} never ran at {level}\n{}", out.dump()))
        };
        let ext = get("example.com");
        assert!(
            ext.starts_with("ERR"),
            "external name resolved at {level}: {ext}\n{}",
            out.dump()
        );
        assert!(
            get("localhost").starts_with("OK"),
            "control: localhost resolves from /etc/hosts at {level}\n{}",
            out.dump()
        );
        expect_probe_errno(&out, &["dns_direct"], libc::EPERM);
        assert_eq!(
            seen.load(Ordering::SeqCst),
            0,
            "the loopback DNS server got a query from {level}\n{}",
            out.dump()
        );
        let out = run(fx.sh(level, &[], "getent hosts example.com && echo RESOLVED; echo GETENT1 $?; getent ahosts example.com && echo RESOLVED; echo GETENT2 $?"));
        out.expect_stdout_has("GETENT1")
            .expect_stdout_has("GETENT2");
        assert!(
            !out.stdout.contains("RESOLVED"),
            "getent resolved an external name at {level}\n{}",
            out.dump()
        );
    }
}

/// Every path in `paths` has a `PROBE path ERRNO n` line: the probe ran
/// for it and connect() failed (a missing line is a probe that never ran).
fn expect_probe_attempted(out: &Out, paths: &[String], level: &str) {
    let res = probe_results(out);
    for p in paths {
        match res.iter().find(|(n, _)| n == p) {
            Some((_, r)) if r.starts_with("ERRNO ") => {}
            other => panic!(
                "{level}: probe for {p} did not fail with an errno: {other:?}\n{}",
                out.dump()
            ),
        }
    }
}

const UNIX_PROBE: &str = r#"
import socket, sys
for p in sys.argv[1:]:
    if p.startswith("@"):
        addr = "\0" + p[1:]
    else:
        addr = p
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(2); s.connect(addr); s.sendall(b"LEAK-UNIX")
        print("PROBE", p, "CONNECTED", flush=True)
    except OSError as e:
        print("PROBE", p, "ERRNO", e.errno, flush=True)
"#;

struct Sockets {
    listeners: Vec<(String, Listener)>,
    paths: Vec<String>,
    ssh_sock: PathBuf,
    xdg: PathBuf,
}

fn make_sockets(fx: &Fixture) -> Sockets {
    let mut listeners = Vec::new();
    let mut paths = Vec::new();
    let tmp_sock = PathBuf::from(format!("/tmp/{}.sock", unique("tmpsock")));
    let ssh_sock = fx.root.join("agent").join("ssh-agent.sock");
    std::fs::create_dir_all(ssh_sock.parent().unwrap()).unwrap();
    let xdg = fx.root.join("xdg-runtime");
    std::fs::create_dir_all(&xdg).unwrap();
    let xdg_sock = xdg.join("bus");
    for p in [&tmp_sock, &ssh_sock, &xdg_sock] {
        listeners.push((p.display().to_string(), Listener::unix(p)));
        paths.push(p.display().to_string());
    }
    // /run is only writable for root; use it when we can.
    let run_sock = PathBuf::from(format!("/run/{}.sock", unique("runsock")));
    if std::fs::write(run_sock.with_extension("probe"), b"").is_ok() {
        let _ = std::fs::remove_file(run_sock.with_extension("probe"));
        listeners.push((run_sock.display().to_string(), Listener::unix(&run_sock)));
        paths.push(run_sock.display().to_string());
    } else {
        println!(
            "note: /run not writable for uid {}; /run socket case covered only when root",
            euid()
        );
    }
    Sockets {
        listeners,
        paths,
        ssh_sock,
        xdg,
    }
}

#[test]
fn host_unix_sockets_unreachable_at_sandboxed_levels() {
    for level in SANDBOXED {
        let fx = Fixture::new();
        let socks = make_sockets(&fx);
        let mut args: Vec<&str> = socks.paths.iter().map(String::as_str).collect();
        write(fx.w("unix_probe.py"), UNIX_PROBE);
        let catcmd = format!(
            "for p in {}; do timeout 2 cat $p </dev/null; done; /usr/bin/python3 unix_probe.py {}; echo END",
            args.join(" "),
            args.join(" ")
        );
        let mut c = fx.sh(level, &[], &catcmd);
        c.env("SSH_AUTH_SOCK", &socks.ssh_sock)
            .env("XDG_RUNTIME_DIR", &socks.xdg);
        let out = run(c);
        out.expect_stdout_has("END");
        // Every path was probed, and each connect failed with an errno.
        expect_probe_attempted(&out, &socks.paths, level);
        let mut hits = Vec::new();
        for (p, l) in socks.listeners {
            let (h, _) = l.finish();
            if h > 0 {
                hits.push(format!("{p}: {h}"));
            }
        }
        assert!(
            hits.is_empty(),
            "host unix sockets reached from {level}: {hits:?}\n{}",
            out.dump()
        );
        assert!(
            !out.stdout.contains("CONNECTED"),
            "connect() to a host socket succeeded at {level}\n{}",
            out.dump()
        );
        args.clear();
    }
}

#[test]
fn host_unix_sockets_reachable_under_danger_positive_control() {
    let fx = Fixture::new();
    let socks = make_sockets(&fx);
    let mut a: Vec<&str> = vec![];
    a.extend(socks.paths.iter().map(String::as_str));
    let mut c = fx.py("danger-full-access", &[], UNIX_PROBE, &a);
    c.env("SSH_AUTH_SOCK", &socks.ssh_sock);
    let out = run(c);
    for (p, l) in socks.listeners {
        let (h, d) = l.finish();
        assert!(
            h >= 1 && String::from_utf8_lossy(&d).contains("LEAK-UNIX"),
            "control: {p} not reached under danger-full-access\n{}",
            out.dump()
        );
    }
}

#[test]
fn host_abstract_socket_unreachable_with_network_disabled() {
    let fx = Fixture::new();
    for level in SANDBOXED {
        // A name per level: a child another test thread forked while the
        // previous level's listener was open holds its (close-on-exec) fd
        // until it execs, so the same name could still be bound here.
        let name = unique("abstract");
        let l = Listener::unix_abstract(&name);
        let at = format!("@{name}");
        let out = run(fx.py(level, &[], UNIX_PROBE, &[&at]));
        let (h, _) = l.finish();
        // The probe ran and connect() failed: the netns has its own
        // abstract namespace, so the name is not there (ECONNREFUSED).
        // EPERM would mean only Landlock's scope stopped it, i.e. the
        // network namespace is missing: a lost layer, so a failure.
        expect_probe_errno(&out, &[at.as_str()], libc::ECONNREFUSED);
        assert_eq!(
            h,
            0,
            "host abstract socket reached from {level}\n{}",
            out.dump()
        );
    }
    // Positive control: reachable without a sandbox.
    let name = unique("abstract");
    let l = Listener::unix_abstract(&name);
    let mut c = std::process::Command::new(PY);
    c.args(["-c", UNIX_PROBE, &format!("@{name}")]);
    let out = run(c);
    let (h, _) = l.finish();
    assert!(
        h >= 1,
        "control: abstract socket not reachable directly\n{}",
        out.dump()
    );
}
