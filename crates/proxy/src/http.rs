//! The HTTP proxy listener: absolute-form requests (forwarded with `Connection: close`) and CONNECT tunnels.

use std::time::Duration;

use moat_policy::net::{decide, guard, Reason};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::dial::{connect_direct, dial, ip_literal, DialFail};
use crate::relay::{copy_half, relay, write_counted};
use crate::server::Ctx;

/// Largest request or response head the proxy reads (→ 400 beyond).
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// How long a client may take to send its request head.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Request headers that only concern the hop between client and proxy.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "upgrade",
    "host",
];

/// Methods a registry credential is added to (see `serve_plain`).
const CREDENTIAL_METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];

/// Outcome of reading a head.
pub(crate) enum Head {
    /// The head ends at this offset (just past the blank line).
    Complete(usize),
    /// The peer closed before a complete head.
    Eof,
    /// No blank line within the limit.
    TooLarge,
}

/// Reads until `\r\n\r\n`; bytes past the head stay in `buf`.
pub(crate) async fn read_head<R>(r: &mut R, buf: &mut Vec<u8>, max: usize) -> std::io::Result<Head>
where
    R: AsyncRead + Unpin + ?Sized,
{
    let mut scanned = 0;
    loop {
        if let Some(pos) = buf[scanned..].windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(Head::Complete(scanned + pos + 4));
        }
        if buf.len() > max {
            return Ok(Head::TooLarge);
        }
        scanned = buf.len().saturating_sub(3);
        buf.reserve(8192);
        if r.read_buf(buf).await? == 0 {
            return Ok(Head::Eof);
        }
    }
}

/// The status code of a response head.
pub(crate) fn status_code(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split(' ');
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    parts.next()?.trim_end().parse().ok()
}

/// `host:port`, with brackets around an IPv6 host.
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Parses `host[:port]` / `[v6][:port]`; the host comes back lowercase, IPv6
/// without brackets. `default_port: None` makes the port mandatory.
pub(crate) fn parse_authority(s: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (inner, after) = rest.split_once(']')?;
        let ip: std::net::Ipv6Addr = inner.parse().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (ip.to_string(), port)
    } else {
        let (h, p) = match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        };
        if h.is_empty()
            || h.len() > 253
            || !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        {
            return None;
        }
        (h.to_ascii_lowercase(), p)
    };
    let port = match port {
        Some(p) => {
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse::<u16>().ok().filter(|&n| n != 0)?
        }
        None => default_port?,
    };
    Some((host, port))
}

struct Request<'a> {
    method: &'a str,
    target: &'a str,
    version: &'a str,
    /// (lowercase name, raw line without CRLF)
    headers: Vec<(String, &'a [u8])>,
}

fn parse_request(head: &[u8]) -> Option<Request<'_>> {
    let body = head.strip_suffix(b"\r\n\r\n")?;
    let mut lines = body
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let first = std::str::from_utf8(lines.next()?).ok()?;
    if first.bytes().any(|b| b.is_ascii_control() || !b.is_ascii()) {
        return None;
    }
    let mut parts = first.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || !method
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        || target.is_empty()
        || !matches!(version, "HTTP/1.0" | "HTTP/1.1")
    {
        return None;
    }
    let mut headers = Vec::new();
    for line in lines {
        // Obsolete line folding and header-less lines are refused.
        if line.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
            return None;
        }
        let colon = line.iter().position(|&b| b == b':')?;
        let name = std::str::from_utf8(&line[..colon]).ok()?;
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        if line.iter().any(|&b| b == b'\r' || b == 0) {
            return None;
        }
        headers.push((name.to_ascii_lowercase(), line));
    }
    Some(Request {
        method,
        target,
        version,
        headers,
    })
}

/// Splits `http://authority/path?q` into (authority without userinfo,
/// origin-form path with query, fragment dropped).
fn split_absolute(target: &str) -> Option<(&str, &str)> {
    let scheme = target.get(..7)?;
    if !scheme.eq_ignore_ascii_case("http://") {
        return None;
    }
    let rest = &target[7..];
    let rest = rest.split('#').next().unwrap_or(rest);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    Some((authority, path))
}

async fn answer(client: &mut TcpStream, status: &str, reason: Reason, body: &str) {
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-Moat-Reason: {}\r\n\r\n{body}",
        body.len(),
        reason.as_str()
    );
    if client.write_all(msg.as_bytes()).await.is_err() {
        return;
    }
    let _ = client.shutdown().await;
    // Read what the client still sends for a moment, so that closing with
    // unread data does not reset the connection before it read the answer.
    let mut sink = [0u8; 8192];
    let mut total = 0usize;
    let drain = async {
        while let Ok(n) = client.read(&mut sink).await {
            total += n;
            if n == 0 || total > 1 << 20 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), drain).await;
}

async fn bad_request(client: &mut TcpStream, ctx: &Ctx, protocol: &'static str) {
    ctx.deny(protocol, "", 0, Reason::BadRequest);
    answer(
        client,
        "400 Bad Request",
        Reason::BadRequest,
        "moat: bad request (bad_request)\n",
    )
    .await;
}

async fn refuse(
    client: &mut TcpStream,
    ctx: &Ctx,
    protocol: &'static str,
    host: &str,
    port: u16,
    reason: Reason,
) {
    ctx.deny(protocol, host, port, reason);
    let body = format!("{}\n", crate::refusal_line(host, port, reason));
    if reason == Reason::UpstreamFailed {
        answer(client, "502 Bad Gateway", reason, &body).await;
    } else {
        answer(client, "403 Forbidden", reason, &body).await;
    }
}

pub(crate) async fn serve(mut client: TcpStream, ctx: Ctx) {
    let mut buf = Vec::with_capacity(4096);
    let end = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client, &mut buf, MAX_HEAD))
        .await
    {
        Ok(Ok(Head::Complete(n))) => n,
        _ if buf.is_empty() => return,
        _ => return bad_request(&mut client, &ctx, "http").await,
    };
    let Some(req) = parse_request(&buf[..end]) else {
        return bad_request(&mut client, &ctx, "http").await;
    };
    if req.method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = parse_authority(req.target, None) else {
            return bad_request(&mut client, &ctx, "connect").await;
        };
        return serve_connect(client, &ctx, &host, port, &buf[end..]).await;
    }
    let Some((authority, path)) = split_absolute(req.target) else {
        return bad_request(&mut client, &ctx, "http").await;
    };
    let Some((host, port)) = parse_authority(authority, Some(80)) else {
        return bad_request(&mut client, &ctx, "http").await;
    };
    serve_plain(client, &ctx, &req, &host, port, path, &buf[end..]).await
}

async fn serve_connect(mut client: TcpStream, ctx: &Ctx, host: &str, port: u16, early: &[u8]) {
    const P: &str = "connect";
    if let Err(r) = decide(&ctx.config().rules, host, port) {
        return refuse(&mut client, ctx, P, host, port, r).await;
    }
    let dialed = match dial(ctx.config(), host, port).await {
        Ok(d) => d,
        Err(DialFail { reason, .. }) => {
            return refuse(&mut client, ctx, P, host, port, reason).await
        }
    };
    let rec = ctx.carried(P, host, port, dialed.addr.to_string());
    let mut remote = dialed.stream;
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
        || write_counted(&mut remote, early, &rec.up).await.is_err()
        || write_counted(&mut client, &dialed.pending, &rec.down)
            .await
            .is_err()
    {
        return;
    }
    relay(&mut client, &mut remote, &rec.up, &rec.down).await;
}

/// Whether a request's origin-form `path` (query included) lies below a
/// credential's `prefix`: `/path/` covers `/path/x` and `/path` itself, and
/// never `/pathology`; `/` covers everything.
fn scoped_to(path: &str, prefix: &str) -> bool {
    let dir = prefix.trim_end_matches('/');
    let path = path.split(['?', '#']).next().unwrap_or(path);
    dir.is_empty()
        || path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

async fn serve_plain(
    mut client: TcpStream,
    ctx: &Ctx,
    req: &Request<'_>,
    host: &str,
    port: u16,
    path: &str,
    early: &[u8],
) {
    const P: &str = "http";
    let cfg = ctx.config();
    if let Err(r) = decide(&cfg.rules, host, port) {
        return refuse(&mut client, ctx, P, host, port, r).await;
    }
    let connected = match &cfg.upstream {
        Some(up) => {
            if let Some(Err(r)) = ip_literal(host).map(|ip| guard(&cfg.rules, host, ip, port)) {
                return refuse(&mut client, ctx, P, host, port, r).await;
            }
            up.connect(cfg.connect_timeout).await.map_err(|_| DialFail {
                reason: Reason::UpstreamFailed,
                refused: false,
            })
        }
        None => connect_direct(cfg, host, port).await,
    };
    let (mut remote, addr) = match connected {
        Ok(c) => c,
        Err(f) => return refuse(&mut client, ctx, P, host, port, f.reason).await,
    };
    let rec = ctx.carried(P, host, port, addr.to_string());

    let authority = if port == 80 {
        if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        }
    } else {
        host_port(host, port)
    };
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    let mut out = Vec::with_capacity(1024);
    match &cfg.upstream {
        Some(_) => out.extend_from_slice(
            format!(
                "{} http://{authority}{path} {}\r\n",
                req.method, req.version
            )
            .as_bytes(),
        ),
        None => {
            out.extend_from_slice(format!("{} {path} {}\r\n", req.method, req.version).as_bytes())
        }
    }
    out.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    let listed: Vec<String> = req
        .headers
        .iter()
        .filter(|(n, _)| n == "connection" || n == "proxy-connection")
        .flat_map(|(_, line)| {
            let v = String::from_utf8_lossy(line);
            let v = v
                .split_once(':')
                .map(|(_, v)| v.to_string())
                .unwrap_or_default();
            v.split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .filter(|t| t != "content-length" && t != "transfer-encoding")
        .collect();
    for (name, line) in &req.headers {
        if HOP_BY_HOP.contains(&name.as_str()) || listed.contains(name) {
            continue;
        }
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n");
    // The user's credential for this host, added here so it never enters
    // the sandbox; a request that brings its own keeps it. Only on methods
    // a registry serves: TRACE (and IIS's TRACK) answer with the request
    // itself, which would hand the credential to the command.
    if !req.headers.iter().any(|(n, _)| n == "authorization")
        && CREDENTIAL_METHODS
            .iter()
            .any(|m| req.method.eq_ignore_ascii_case(m))
    {
        if let Some(c) = cfg
            .credentials
            .iter()
            .filter(|c| c.host == host && c.port == port && scoped_to(&path, &c.path_prefix))
            .max_by_key(|c| c.path_prefix.len())
        {
            out.extend_from_slice(format!("Authorization: {}\r\n", c.authorization).as_bytes());
        }
    }
    if let Some(a) = cfg.upstream.as_ref().and_then(|u| u.proxy_authorization()) {
        out.extend_from_slice(a.as_bytes());
    }
    out.extend_from_slice(b"\r\n");

    let (mut cr, mut cw) = client.split();
    let (mut rr, mut rw) = remote.split();
    let up = async {
        if write_counted(&mut rw, &out, &rec.up).await.is_err()
            || write_counted(&mut rw, early, &rec.up).await.is_err()
            || copy_half(&mut cr, &mut rw, &rec.up).await.is_err()
        {
            return;
        }
        // The client finished its request; the response decides the end.
        std::future::pending::<()>().await
    };
    let down = async {
        let mut rbuf = Vec::with_capacity(8192);
        match read_head(&mut rr, &mut rbuf, MAX_HEAD).await? {
            Head::Complete(end) => {
                write_counted(&mut cw, &rewrite_response(&rbuf[..end]), &rec.down).await?;
                write_counted(&mut cw, &rbuf[end..], &rec.down).await?;
            }
            Head::Eof | Head::TooLarge => write_counted(&mut cw, &rbuf, &rec.down).await?,
        }
        copy_half(&mut rr, &mut cw, &rec.down).await
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// Marks a final response `Connection: close` (the proxy does not keep
/// client connections alive); interim 1xx heads pass unchanged.
fn rewrite_response(head: &[u8]) -> Vec<u8> {
    if status_code(head).is_some_and(|c| (100..200).contains(&c)) {
        return head.to_vec();
    }
    let body = head.strip_suffix(b"\r\n\r\n").unwrap_or(head);
    let mut out = Vec::with_capacity(head.len() + 32);
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if i > 0 {
            let name = line.split(|&b| b == b':').next().unwrap_or(b"");
            let name = String::from_utf8_lossy(name).trim().to_ascii_lowercase();
            if matches!(
                name.as_str(),
                "connection" | "keep-alive" | "proxy-connection"
            ) {
                continue;
            }
        }
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        assert_eq!(
            parse_authority("Example.COM:443", None),
            Some(("example.com".into(), 443))
        );
        assert_eq!(
            parse_authority("example.com", Some(80)),
            Some(("example.com".into(), 80))
        );
        assert_eq!(
            parse_authority("[::1]:8080", None),
            Some(("::1".into(), 8080))
        );
        assert_eq!(parse_authority("[::1]", Some(80)), Some(("::1".into(), 80)));
        for bad in [
            "example.com",
            "a:0",
            "a:65536",
            "a:x",
            ":80",
            "[::1",
            "[zz]:1",
            "a b:1",
            "a\r\nb:1",
            "a:1:2",
            "::1:80",
        ] {
            assert_eq!(parse_authority(bad, None), None, "{bad}");
        }
    }

    #[test]
    fn absolute_targets() {
        assert_eq!(split_absolute("http://a.b/c?d#e"), Some(("a.b", "/c?d")));
        assert_eq!(split_absolute("HTTP://u:p@a.b:81"), Some(("a.b:81", "")));
        assert_eq!(split_absolute("http://a.b?q"), Some(("a.b", "?q")));
        assert_eq!(split_absolute("https://a.b/"), None);
        assert_eq!(split_absolute("/x"), None);
    }

    #[test]
    fn requests() {
        let h = b"GET http://a.b/ HTTP/1.1\r\nHost: a.b\r\nX-Y: z\r\n\r\n";
        let r = parse_request(h).unwrap_or_else(|| panic!("parse"));
        assert_eq!(
            (r.method, r.target, r.version),
            ("GET", "http://a.b/", "HTTP/1.1")
        );
        assert_eq!(r.headers.len(), 2);
        assert_eq!(r.headers[1].0, "x-y");
        for bad in [
            &b"GET http://a.b/ HTTP/2\r\n\r\n"[..],
            b"GET  http://a.b/ HTTP/1.1\r\n\r\n",
            b"GET http://a.b/ HTTP/1.1\r\nX: y\r\n folded\r\n\r\n",
            b"GET http://a.b/ HTTP/1.1\r\nnocolon\r\n\r\n",
            b"\r\n\r\n",
        ] {
            assert!(
                parse_request(bad).is_none(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn response_rewrite() {
        let r = rewrite_response(b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\nContent-Length: 2\r\n\r\n");
        assert_eq!(
            r,
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        );
        let c = b"HTTP/1.1 100 Continue\r\n\r\n";
        assert_eq!(rewrite_response(c), c.to_vec());
        assert_eq!(status_code(b"HTTP/1.0 404 Not Found\r\n\r\n"), Some(404));
        assert_eq!(status_code(b"SSH-2.0\r\n\r\n"), None);
    }
}
