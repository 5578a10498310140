//! The SOCKS5 listener: no-auth, CONNECT, ATYP domain/IPv4/IPv6 (RFC 1928).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use moat_policy::net::{decide, Reason};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::dial::{dial, DialFail};
use crate::http::HEAD_TIMEOUT;
use crate::relay::{relay, write_counted};
use crate::server::Ctx;

const P: &str = "socks5";

/// SOCKS5 reply codes used here.
pub(crate) mod rep {
    pub const SUCCEEDED: u8 = 0x00;
    pub const GENERAL_FAILURE: u8 = 0x01;
    pub const NOT_ALLOWED: u8 = 0x02;
    pub const HOST_UNREACHABLE: u8 = 0x04;
    pub const CONNECTION_REFUSED: u8 = 0x05;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x07;
    pub const ATYP_NOT_SUPPORTED: u8 = 0x08;
}

enum Negotiated {
    Connect {
        host: String,
        port: u16,
    },
    /// A request we refuse as malformed/unsupported, with its reply code.
    Bad {
        reply: u8,
        host: String,
        port: u16,
    },
}

async fn negotiate(c: &mut TcpStream) -> std::io::Result<Option<Negotiated>> {
    let mut hdr = [0u8; 2];
    c.read_exact(&mut hdr).await?;
    if hdr[0] != 5 {
        return Ok(None);
    }
    let mut methods = vec![0u8; usize::from(hdr[1])];
    c.read_exact(&mut methods).await?;
    if !methods.contains(&0) {
        c.write_all(&[5, 0xff]).await?;
        return Ok(None);
    }
    c.write_all(&[5, 0]).await?;
    let mut req = [0u8; 4];
    c.read_exact(&mut req).await?;
    if req[0] != 5 {
        return Ok(None);
    }
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            c.read_exact(&mut a).await?;
            Ipv4Addr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            c.read_exact(&mut a).await?;
            Ipv6Addr::from(a).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            c.read_exact(&mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            c.read_exact(&mut name).await?;
            let ok = !name.is_empty()
                && name
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
            let mut port = [0u8; 2];
            c.read_exact(&mut port).await?;
            if !ok {
                return Ok(Some(Negotiated::Bad {
                    reply: rep::GENERAL_FAILURE,
                    host: String::new(),
                    port: u16::from_be_bytes(port),
                }));
            }
            let host = String::from_utf8_lossy(&name).to_ascii_lowercase();
            return Ok(Some(finish(req[1], host, u16::from_be_bytes(port))));
        }
        _ => {
            return Ok(Some(Negotiated::Bad {
                reply: rep::ATYP_NOT_SUPPORTED,
                host: String::new(),
                port: 0,
            }))
        }
    };
    let mut port = [0u8; 2];
    c.read_exact(&mut port).await?;
    Ok(Some(finish(req[1], host, u16::from_be_bytes(port))))
}

fn finish(cmd: u8, host: String, port: u16) -> Negotiated {
    if cmd != 1 {
        Negotiated::Bad {
            reply: rep::COMMAND_NOT_SUPPORTED,
            host,
            port,
        }
    } else if port == 0 {
        Negotiated::Bad {
            reply: rep::GENERAL_FAILURE,
            host,
            port,
        }
    } else {
        Negotiated::Connect { host, port }
    }
}

fn reply(code: u8, bound: Option<SocketAddr>) -> Vec<u8> {
    let mut r = vec![5, code, 0];
    match bound {
        Some(SocketAddr::V6(a)) => {
            r.push(4);
            r.extend_from_slice(&a.ip().octets());
            r.extend_from_slice(&a.port().to_be_bytes());
        }
        Some(SocketAddr::V4(a)) => {
            r.push(1);
            r.extend_from_slice(&a.ip().octets());
            r.extend_from_slice(&a.port().to_be_bytes());
        }
        None => r.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0]),
    }
    r
}

async fn refuse(c: &mut TcpStream, ctx: &Ctx, host: &str, port: u16, reason: Reason, code: u8) {
    ctx.deny(P, host, port, reason);
    if c.write_all(&reply(code, None)).await.is_ok() {
        let _ = c.shutdown().await;
    }
}

pub(crate) async fn serve(mut client: TcpStream, ctx: Ctx) {
    let (host, port) = match tokio::time::timeout(HEAD_TIMEOUT, negotiate(&mut client)).await {
        Ok(Ok(Some(Negotiated::Connect { host, port }))) => (host, port),
        Ok(Ok(Some(Negotiated::Bad { reply, host, port }))) => {
            return refuse(&mut client, &ctx, &host, port, Reason::BadRequest, reply).await
        }
        Ok(Ok(None)) => return ctx.deny(P, "", 0, Reason::BadRequest),
        // The client went away or stalled mid-handshake: nothing was asked.
        Ok(Err(_)) | Err(_) => return,
    };
    if let Err(r) = decide(&ctx.config().rules, &host, port) {
        return refuse(&mut client, &ctx, &host, port, r, rep::NOT_ALLOWED).await;
    }
    let dialed = match dial(ctx.config(), &host, port).await {
        Ok(d) => d,
        Err(DialFail { reason, refused }) => {
            let code = match reason {
                Reason::UpstreamFailed if refused => rep::CONNECTION_REFUSED,
                Reason::UpstreamFailed => rep::HOST_UNREACHABLE,
                _ => rep::NOT_ALLOWED,
            };
            return refuse(&mut client, &ctx, &host, port, reason, code).await;
        }
    };
    let rec = ctx.carried(P, &host, port, dialed.addr.to_string());
    let mut remote = dialed.stream;
    // The bound address is not reported: it is the supervisor's, not the
    // sandbox's business.
    if client
        .write_all(&reply(rep::SUCCEEDED, None))
        .await
        .is_err()
        || write_counted(&mut client, &dialed.pending, &rec.down)
            .await
            .is_err()
    {
        return;
    }
    relay(&mut client, &mut remote, &rec.up, &rec.down).await;
}
