//! Many concurrent tunnels, a stalled peer, and prompt shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::*;
use moat_proxy::DecisionRecord;

/// Shut the proxy down; fail (instead of hanging the suite) if shutdown
/// waits on a client. The limit is a hang guard, not a speed claim.
fn finish_or_hang(p: Proxy) -> Vec<DecisionRecord> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(p.finish());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("proxy shutdown hung while idle clients stayed connected")
}

/// Raise this process's soft descriptor limit to its hard limit, as moat
/// does for its proxy (`proxy_listeners` in moat-runtime), and return it.
/// Hosts commonly start programs with a soft limit of 1024; 300 tunnels
/// held open at once need ≈ 1,500 descriptors in this one process (client,
/// its clone, proxy side, upstream side, echo side).
fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    getrlimit(Resource::RLIMIT_NOFILE).unwrap().0
}

#[test]
fn three_hundred_tunnels_and_one_silent_peer() {
    // Five descriptors per tunnel plus headroom for the runtime and the
    // test harness; a host whose hard limit is below that gets fewer
    // tunnels (said on stdout), never a hang.
    let soft = raise_nofile();
    let tunnels = 300.min(usize::try_from(soft.saturating_sub(256) / 5).unwrap());
    assert!(
        tunnels >= 100,
        "RLIMIT_NOFILE {soft} is too low for this case"
    );
    if tunnels < 300 {
        println!("note: hard RLIMIT_NOFILE is {soft}: {tunnels} tunnels instead of 300");
    }
    // A hang guard, not a speed claim: a tunnel the proxy cannot accept
    // would hold every worker at the barrier forever.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        many_tunnels_and_one_silent_peer(tunnels);
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("the tunnels case failed (its panic is printed above)")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{tunnels} tunnels did not complete in 300 s: a tunnel was never served")
        }
    }
}

fn many_tunnels_and_one_silent_peer(tunnels: usize) {
    let echo = echo_server();
    let p = proxy(&[&format!("127.0.0.1:{}", echo.port)], &[]);
    let target = format!("127.0.0.1:{}", echo.port);

    // The silent one opens its tunnel first and never sends anything.
    let mut silent = connect_tunnel(p.http, &target).unwrap();

    // Every tunnel is open before any data flows: all at once.
    let busy = tunnels - 1;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(busy));
    let workers: Vec<_> = (0..busy)
        .map(|i| {
            let target = target.clone();
            let port = p.http;
            let barrier = std::sync::Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut s = connect_tunnel(port, &target).unwrap();
                barrier.wait();
                let msg: Vec<u8> = (0..65536usize).map(|j| ((i + j) % 256) as u8).collect();
                let mut w = s.try_clone().unwrap();
                let m2 = msg.clone();
                let t = std::thread::spawn(move || {
                    w.write_all(&m2).unwrap();
                    w.shutdown(std::net::Shutdown::Write).unwrap();
                });
                let mut got = Vec::new();
                s.read_to_end(&mut got).unwrap();
                t.join().unwrap();
                assert!(got == msg, "tunnel {i} corrupted data");
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }

    // A client sees its tunnel's end (the FIN the proxy forwards) a moment
    // before the proxy's task drops the tunnel and emits its record: wait
    // for every busy tunnel's record, so the silent one's is known to come
    // from the shutdown (it raced them in CI under load). A hang guard, not
    // a speed claim.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while p.handle.records().len() < busy {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {busy} busy tunnels were recorded after their clients finished",
            p.handle.records().len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = p.handle.records();
    assert_eq!(
        before.len(),
        busy,
        "the silent tunnel was recorded (closed) before the shutdown"
    );

    // The silent tunnel is still open; shutdown closes it (does not wait
    // for it to speak).
    let recs = finish_or_hang(p);
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(silent.read(&mut b), Ok(0) | Err(_)),
        "silent tunnel still open after shutdown"
    );

    assert_eq!(recs.len(), tunnels);
    assert!(recs
        .iter()
        .all(|r| r.protocol == "connect" && r.decision == "allow"));
    let full = recs
        .iter()
        .filter(|r| r.bytes_up == 65536 && r.bytes_down == 65536)
        .count();
    assert_eq!(full, busy);
    // The silent tunnel's record comes last: it closed at shutdown.
    assert_eq!((recs[busy].bytes_up, recs[busy].bytes_down), (0, 0));
}

#[test]
fn shutdown_with_idle_clients_is_prompt() {
    let p = proxy(&["example.com"], &[]);
    // Clients that connect and never send a request head.
    let idle: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", p.http)).unwrap())
        .collect();
    let idle_socks: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", p.socks)).unwrap())
        .collect();
    let recs = finish_or_hang(p);
    assert!(recs.is_empty(), "{recs:#?}");
    for mut s in idle.into_iter().chain(idle_socks) {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
    }
}
