//! Loopback benchmark of the proxy: CONNECT-tunnel throughput and small-request latency vs direct.
//!
//! Usage: `bench [BYTES] [REQUESTS]` (defaults 1 GiB, 1000). Prints a
//! markdown table. Everything runs on 127.0.0.1 in this process.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use moat_policy::net::NetRules;
use moat_proxy::{start, ProxyConfig};

type R<T> = Result<T, Box<dyn std::error::Error>>;

const CHUNK: usize = 256 * 1024;

/// Serves BYTES zero bytes to each connection, then closes.
fn source(bytes: u64) -> R<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut c = c;
                let buf = vec![0u8; CHUNK];
                let mut left = bytes;
                while left > 0 {
                    let n = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
                    if c.write_all(&buf[..n]).is_err() {
                        return;
                    }
                    left -= n as u64;
                }
                let _ = c.shutdown(Shutdown::Write);
            });
        }
    });
    Ok(port)
}

/// Answers one small HTTP response per connection.
fn http_server() -> R<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut c = c;
                let _ = c.set_nodelay(true);
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                );
                let _ = c.shutdown(Shutdown::Write);
            });
        }
    });
    Ok(port)
}

fn drain(mut s: TcpStream) -> R<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

fn tunnel(proxy: u16, target: &str) -> R<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", proxy))?;
    let _ = s.set_nodelay(true);
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 {
            return Err("eof in CONNECT response".into());
        }
        head.push(b[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(String::from_utf8_lossy(&head).into_owned().into());
    }
    Ok(s)
}

fn request(port: u16, line: &str) -> R<Duration> {
    let t = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    let _ = s.set_nodelay(true);
    write!(s, "{line}\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    if !out.ends_with(b"hello") {
        return Err(format!("bad response: {}", String::from_utf8_lossy(&out)).into());
    }
    Ok(t.elapsed())
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)].as_secs_f64() * 1e6
}

fn main() -> R<()> {
    let mut args = std::env::args().skip(1);
    let bytes: u64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1 << 30);
    let requests: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1000);

    let src = source(bytes)?;
    let web = http_server()?;
    let rules = NetRules::from_args(&["127.0.0.1".to_string()], &[])?;
    let h = TcpListener::bind("127.0.0.1:0")?;
    let s = TcpListener::bind("127.0.0.1:0")?;
    let hp = h.local_addr()?.port();
    let proxy = start(h, s, ProxyConfig::new(rules), Box::new(|_| {}))?;

    // (b) throughput: best of 3 runs each, alternating.
    let target = format!("127.0.0.1:{src}");
    let (mut direct, mut proxied) = (0f64, 0f64);
    for _ in 0..3 {
        let t = Instant::now();
        let n = drain(TcpStream::connect(("127.0.0.1", src))?)?;
        direct = direct.max(n as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let n = drain(tunnel(hp, &target)?)?;
        proxied = proxied.max(n as f64 / t.elapsed().as_secs_f64());
        if n != bytes {
            return Err(format!("tunnel carried {n} of {bytes} bytes").into());
        }
    }

    // (c) latency of small requests, interleaved.
    let (mut d, mut p) = (Vec::with_capacity(requests), Vec::with_capacity(requests));
    for _ in 0..requests {
        d.push(request(web, "GET / HTTP/1.1")?);
        p.push(request(
            hp,
            &format!("GET http://127.0.0.1:{web}/ HTTP/1.1"),
        )?);
    }
    let recs = proxy.shutdown();

    let gib = |b: f64| b / f64::from(1u32 << 30);
    let (d50, d99, p50, p99) = (
        pct(&mut d, 0.5),
        pct(&mut d, 0.99),
        pct(&mut p, 0.5),
        pct(&mut p, 0.99),
    );
    println!("| measure | direct | through proxy | ratio / added |");
    println!("|---|---|---|---|");
    println!(
        "| (b) {:.2} GiB download, CONNECT tunnel | {:.2} GiB/s | {:.2} GiB/s | {:.2} (target ≥ 0.70) |",
        gib(bytes as f64),
        gib(direct),
        gib(proxied),
        proxied / direct
    );
    println!(
        "| (c) {requests} small HTTP requests, p50 | {d50:.0} µs | {p50:.0} µs | +{:.0} µs |",
        p50 - d50
    );
    println!(
        "| (c) {requests} small HTTP requests, p99 | {d99:.0} µs | {p99:.0} µs | +{:.0} µs |",
        p99 - d99
    );
    println!();
    println!(
        "records: {} (3 tunnels + {requests} requests expected)",
        recs.len()
    );
    Ok(())
}
