//! Resolve once, guard every candidate address, connect only to one that passed (or tunnel via upstream).

use std::net::{IpAddr, SocketAddr};

use moat_policy::net::{guard, Reason};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::ProxyConfig;

/// An open connection to the target (or a tunnel to it through the upstream).
pub(crate) struct Dialed {
    pub stream: TcpStream,
    /// The address actually connected to.
    pub addr: SocketAddr,
    /// Bytes already received from the target (upstream CONNECT leftovers).
    pub pending: Vec<u8>,
}

/// Why dialing failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DialFail {
    pub reason: Reason,
    /// The target actively refused (SOCKS reply 0x05 rather than 0x04).
    pub refused: bool,
}

impl DialFail {
    fn policy(reason: Reason) -> DialFail {
        DialFail {
            reason,
            refused: false,
        }
    }

    fn unreachable(refused: bool) -> DialFail {
        DialFail {
            reason: Reason::UpstreamFailed,
            refused,
        }
    }
}

/// Parses an IP-literal host (IPv6 with or without brackets).
pub(crate) fn ip_literal(host: &str) -> Option<IpAddr> {
    let h = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    h.parse().ok()
}

/// Opens a byte stream to `host:port`, which `decide` already allowed.
pub(crate) async fn dial(cfg: &ProxyConfig, host: &str, port: u16) -> Result<Dialed, DialFail> {
    if let Some(up) = &cfg.upstream {
        if let Some(ip) = ip_literal(host) {
            guard(&cfg.rules, host, ip, port).map_err(DialFail::policy)?;
        }
        return match up.tunnel(host, port, cfg.connect_timeout).await {
            Ok((stream, addr, pending)) => Ok(Dialed {
                stream,
                addr,
                pending,
            }),
            Err(_) => Err(DialFail::unreachable(false)),
        };
    }
    let (stream, addr) = connect_direct(cfg, host, port).await?;
    Ok(Dialed {
        stream,
        addr,
        pending: Vec::new(),
    })
}

/// Resolves `host` once, keeps the addresses that pass the guard, and
/// connects to the first of them that answers, within `connect_timeout`.
pub(crate) async fn connect_direct(
    cfg: &ProxyConfig,
    host: &str,
    port: u16,
) -> Result<(TcpStream, SocketAddr), DialFail> {
    let deadline = Instant::now() + cfg.connect_timeout;
    let candidates: Vec<SocketAddr> = match ip_literal(host) {
        Some(ip) => vec![SocketAddr::new(ip, port)],
        None => {
            match tokio::time::timeout_at(deadline, tokio::net::lookup_host((host, port))).await {
                Ok(Ok(it)) => it.collect(),
                _ => return Err(DialFail::unreachable(false)),
            }
        }
    };
    let mut refusal = None;
    let mut passed = Vec::new();
    for a in candidates {
        match guard(&cfg.rules, host, a.ip(), port) {
            Ok(()) => passed.push(a),
            Err(r) => {
                // `denied` outranks `private_address` in what we report.
                if refusal != Some(Reason::Denied) {
                    refusal = Some(r);
                }
            }
        }
    }
    if passed.is_empty() {
        return Err(match refusal {
            Some(r) => DialFail::policy(r),
            None => DialFail::unreachable(false),
        });
    }
    let mut refused = false;
    for a in passed {
        match tokio::time::timeout_at(deadline, TcpStream::connect(a)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok((s, a));
            }
            Ok(Err(e)) => refused = e.kind() == std::io::ErrorKind::ConnectionRefused,
            Err(_) => return Err(DialFail::unreachable(false)),
        }
    }
    Err(DialFail::unreachable(refused))
}
