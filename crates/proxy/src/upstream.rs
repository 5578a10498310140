//! The optional upstream (corporate) proxy: URL parsing, Basic credentials, CONNECT chaining.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::http::{read_head, status_code, Head};
use crate::ProxyError;

/// Largest upstream response head accepted.
const MAX_UPSTREAM_HEAD: usize = 16 * 1024;

/// `http://[user:pass@]host:port`. `Debug` never shows the credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Upstream {
    host: String,
    port: u16,
    /// base64("user:pass"), ready for `Proxy-Authorization: Basic`.
    basic: Option<String>,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("credentials", &self.basic.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Upstream {
    /// Host (IPv6 without brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn has_credentials(&self) -> bool {
        self.basic.is_some()
    }

    /// `http://host:port`, without credentials: safe to print.
    pub fn redacted(&self) -> String {
        format!("http://{}", crate::http::host_port(&self.host, self.port))
    }

    pub(crate) fn proxy_authorization(&self) -> Option<String> {
        self.basic
            .as_ref()
            .map(|b| format!("Proxy-Authorization: Basic {b}\r\n"))
    }

    /// Opens a TCP connection to the upstream proxy itself.
    pub(crate) async fn connect(
        &self,
        timeout: Duration,
    ) -> std::io::Result<(TcpStream, SocketAddr)> {
        let fut = async {
            let mut last = None;
            for addr in tokio::net::lookup_host((self.host.as_str(), self.port)).await? {
                match TcpStream::connect(addr).await {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok((s, addr));
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(last
                .unwrap_or_else(|| std::io::Error::other("upstream proxy name has no addresses")))
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "upstream proxy connect timed out",
            )
        })?
    }

    /// Opens a tunnel to `host:port` through the upstream with CONNECT.
    /// Returns the stream, the upstream's address and any bytes the upstream
    /// sent after its response head (already tunnel data).
    pub(crate) async fn tunnel(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> std::io::Result<(TcpStream, SocketAddr, Vec<u8>)> {
        let (mut s, addr) = self.connect(timeout).await?;
        let target = crate::http::host_port(host, port);
        let mut req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(a) = self.proxy_authorization() {
            req.push_str(&a);
        }
        req.push_str("\r\n");
        let fut = async {
            s.write_all(req.as_bytes()).await?;
            let mut buf = Vec::with_capacity(1024);
            match read_head(&mut s, &mut buf, MAX_UPSTREAM_HEAD).await? {
                Head::Complete(end) => {
                    let code = status_code(&buf[..end]);
                    if code.is_some_and(|c| (200..300).contains(&c)) {
                        Ok(buf[end..].to_vec())
                    } else {
                        Err(std::io::Error::other(format!(
                            "upstream proxy refused CONNECT with status {}",
                            code.unwrap_or(0)
                        )))
                    }
                }
                _ => Err(std::io::Error::other(
                    "upstream proxy sent no valid response",
                )),
            }
        };
        let rest = tokio::time::timeout(timeout, fut).await.map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "upstream proxy CONNECT timed out",
            )
        })??;
        Ok((s, addr, rest))
    }
}

/// Parses `http://[user:pass@]host[:port][/]` (scheme optional; port
/// defaults to 80). Userinfo may be percent-encoded. Error messages never
/// contain the credentials.
pub fn parse_upstream(url: &str) -> Result<Upstream, ProxyError> {
    let bad = |why: &str| ProxyError::BadUpstream(why.to_string());
    let rest = match url.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, _)) => {
            return Err(bad(&format!(
                "scheme {scheme:?} is not supported; use http://[user:pass@]host:port"
            )))
        }
        None => url,
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Err(bad("a proxy URL has no path, query or fragment"));
    }
    let (userinfo, hostport) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    let (host, port) = crate::http::parse_authority(hostport, Some(80))
        .ok_or_else(|| bad("expected http://[user:pass@]host:port with a valid host and port"))?;
    let basic = match userinfo {
        None => None,
        Some(u) => {
            let (user, pass) = u.split_once(':').unwrap_or((u, ""));
            let user =
                percent_decode(user).ok_or_else(|| bad("bad percent-encoding in the user name"))?;
            let pass =
                percent_decode(pass).ok_or_else(|| bad("bad percent-encoding in the password"))?;
            let mut raw = user;
            raw.push(b':');
            raw.extend_from_slice(&pass);
            Some(base64(&raw))
        }
    };
    Ok(Upstream { host, port, basic })
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(T[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("user:pass", "dXNlcjpwYXNz"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn parses_upstreams() {
        let u =
            parse_upstream("http://user:p%40ss@proxy.corp:3128").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (u.host(), u.port(), u.has_credentials()),
            ("proxy.corp", 3128, true)
        );
        assert_eq!(
            u.proxy_authorization().as_deref(),
            Some("Proxy-Authorization: Basic dXNlcjpwQHNz\r\n")
        );
        assert!(!format!("{u:?}").contains("dXNl"));
        assert_eq!(u.redacted(), "http://proxy.corp:3128");
        let u = parse_upstream("HTTP://[::1]:8080/").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (u.host(), u.port(), u.has_credentials()),
            ("::1", 8080, false)
        );
        let u = parse_upstream("10.0.0.1").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((u.host(), u.port()), ("10.0.0.1", 80));
        for bad in [
            "https://p:1",
            "socks5://p:1",
            "http://p:0",
            "http://p:99999",
            "http://p:1/x",
            "http://:1",
            "http://a b:1",
            "http://u:%zz@p:1",
        ] {
            let e = parse_upstream(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(!e.is_empty(), "{bad} accepted");
            assert!(!e.contains("%zz"), "{e}");
        }
    }
}
