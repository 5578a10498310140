//! Shared fixtures for the proxy integration tests: proxies, origins, curl.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moat_policy::net::NetRules;
use moat_proxy::{DecisionRecord, ProxyConfig, ProxyHandle};

pub struct Proxy {
    pub handle: ProxyHandle,
    pub http: u16,
    pub socks: u16,
    pub seen: Arc<Mutex<Vec<DecisionRecord>>>,
}

impl Proxy {
    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }
    pub fn socks_addr(&self) -> std::net::SocketAddr {
        format!("127.0.0.1:{}", self.socks).parse().unwrap()
    }
    /// Shuts down and returns the records; checks the callback saw the same.
    pub fn finish(self) -> Vec<DecisionRecord> {
        let recs = self.handle.shutdown();
        assert_eq!(
            *self.seen.lock().unwrap(),
            recs,
            "callback and shutdown records differ"
        );
        recs
    }
}

pub fn rules(allow: &[&str], deny: &[&str]) -> NetRules {
    let a: Vec<String> = allow.iter().map(|s| s.to_string()).collect();
    let d: Vec<String> = deny.iter().map(|s| s.to_string()).collect();
    NetRules::from_args(&a, &d).unwrap()
}

pub fn proxy(allow: &[&str], deny: &[&str]) -> Proxy {
    proxy_with(ProxyConfig::new(rules(allow, deny)))
}

pub fn proxy_with(mut config: ProxyConfig) -> Proxy {
    config.connect_timeout = Duration::from_secs(5);
    let h = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = TcpListener::bind("127.0.0.1:0").unwrap();
    let (http, socks) = (
        h.local_addr().unwrap().port(),
        s.local_addr().unwrap().port(),
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    let handle = moat_proxy::start(
        h,
        s,
        config,
        Box::new(move |r| seen2.lock().unwrap().push(r)),
    )
    .unwrap();
    Proxy {
        handle,
        http,
        socks,
        seen,
    }
}

/// A server on 127.0.0.1 that counts accepted connections.
pub struct Origin {
    pub port: u16,
    pub hits: Arc<AtomicUsize>,
}

impl Origin {
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

fn serve<F>(l: TcpListener, f: F) -> Origin
where
    F: Fn(TcpStream) + Send + Sync + 'static,
{
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h2 = Arc::clone(&hits);
    let f = Arc::new(f);
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { continue };
            h2.fetch_add(1, Ordering::SeqCst);
            let f = Arc::clone(&f);
            std::thread::spawn(move || f(c));
        }
    });
    Origin { port, hits }
}

/// HTTP/1.1 origin: answers every request with 200 and a body echoing the
/// request head it received. Keeps the connection alive unless the request
/// says `Connection: close`.
pub fn http_origin() -> Origin {
    http_origin_on(TcpListener::bind("127.0.0.1:0").unwrap())
}

pub fn http_origin_on(l: TcpListener) -> Origin {
    serve(l, |c| {
        let mut r = BufReader::new(c.try_clone().unwrap());
        let mut w = c;
        loop {
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                head.push_str(&line);
                if line == "\r\n" {
                    break;
                }
            }
            let lower = head.to_ascii_lowercase();
            let len = lower
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse::<usize>().unwrap())
                .unwrap_or(0);
            let mut body = vec![0u8; len];
            r.read_exact(&mut body).unwrap();
            let mut out = format!("origin saw:\n{head}").into_bytes();
            out.extend_from_slice(&body);
            let close = lower.contains("connection: close");
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive\r\nContent-Type: text/plain\r\n\r\n",
                out.len()
            );
            if w.write_all(resp.as_bytes()).is_err() || w.write_all(&out).is_err() {
                return;
            }
            if close {
                let _ = w.shutdown(Shutdown::Write);
                return;
            }
        }
    })
}

/// Echoes bytes until EOF.
pub fn echo_server() -> Origin {
    serve(TcpListener::bind("127.0.0.1:0").unwrap(), |mut c| {
        let mut buf = [0u8; 65536];
        loop {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if c.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = c.shutdown(Shutdown::Write);
    })
}

/// A port where nothing listens (bound, then closed).
pub fn dead_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs curl with proxy variables cleared and a time limit.
pub fn curl(args: &[&str]) -> Out {
    let mut cmd = Command::new("curl");
    for v in [
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
    ] {
        cmd.env_remove(v);
    }
    let o = cmd
        .args(["-sS", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl is installed");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Opens a CONNECT tunnel by hand; returns the stream after the 200.
pub fn connect_tunnel(proxy_port: u16, target: &str) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", proxy_port))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 {
            return Err(std::io::Error::other("eof in CONNECT response"));
        }
        head.push(b[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(std::io::Error::other(
            String::from_utf8_lossy(&head).into_owned(),
        ));
    }
    Ok(s)
}

/// Sends raw bytes to the HTTP proxy port and returns everything it answers.
pub fn raw_http(proxy_port: u16, req: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", proxy_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(req);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

pub fn only<'a>(recs: &'a [DecisionRecord], host: &str, port: u16) -> &'a DecisionRecord {
    let v: Vec<&DecisionRecord> = recs
        .iter()
        .filter(|r| r.host == host && r.port == port)
        .collect();
    assert_eq!(
        v.len(),
        1,
        "expected one record for {host}:{port} in {recs:#?}"
    );
    v[0]
}
