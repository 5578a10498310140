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

#[test]
fn three_hundred_tunnels_and_one_silent_peer() {
    let echo = echo_server();
    let p = proxy(&[&format!("127.0.0.1:{}", echo.port)], &[]);
    let target = format!("127.0.0.1:{}", echo.port);

    // The silent one opens its tunnel first and never sends anything.
    let mut silent = connect_tunnel(p.http, &target).unwrap();

    // Every tunnel is open before any data flows: 300 at once.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(299));
    let workers: Vec<_> = (0..299)
        .map(|i| {
            let target = target.clone();
            let port = p.http;
            let barrier = std::sync::Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut s = connect_tunnel(port, &target).unwrap();
                barrier.wait();
                let msg: Vec<u8> = (0..65536u32).map(|j| ((i + j) % 256) as u8).collect();
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

    assert_eq!(recs.len(), 300);
    assert!(recs
        .iter()
        .all(|r| r.protocol == "connect" && r.decision == "allow"));
    let full = recs
        .iter()
        .filter(|r| r.bytes_up == 65536 && r.bytes_down == 65536)
        .count();
    assert_eq!(full, 299);
    // The silent tunnel's record comes last: it closed at shutdown.
    assert_eq!((recs[299].bytes_up, recs[299].bytes_down), (0, 0));
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
