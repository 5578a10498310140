//! Blocking SOCKS5 client relaying stdin/stdout: ssh's `ProxyCommand` inside the sandbox.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

fn refused(code: u8) -> std::io::Error {
    use std::io::ErrorKind as K;
    let (kind, what) = match code {
        0x01 => (K::Other, "general failure"),
        0x02 => (
            K::PermissionDenied,
            "connection not allowed by ruleset (moat network policy)",
        ),
        0x03 => (K::Other, "network unreachable"),
        0x04 => (K::Other, "host unreachable"),
        0x05 => (K::ConnectionRefused, "connection refused"),
        0x06 => (K::TimedOut, "TTL expired"),
        0x07 => (K::Unsupported, "command not supported"),
        0x08 => (K::Unsupported, "address type not supported"),
        _ => (K::Other, "unknown SOCKS5 reply"),
    };
    std::io::Error::new(
        kind,
        format!("SOCKS5 proxy refused the connection: {what} (0x{code:02x})"),
    )
}

/// Connects to the SOCKS5 proxy at `proxy` and asks for `host:port` by
/// name (ATYP domain). Returns the connected stream after a success reply.
pub fn socks_connect(proxy: SocketAddr, host: &str, port: u16) -> std::io::Result<TcpStream> {
    let name = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let len = u8::try_from(name.len())
        .ok()
        .filter(|&l| l > 0)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "host name must be 1..=255 bytes",
            )
        })?;
    let mut s = TcpStream::connect_timeout(&proxy, Duration::from_secs(10))?;
    let _ = s.set_nodelay(true);
    s.write_all(&[5, 1, 0])?;
    let mut m = [0u8; 2];
    s.read_exact(&mut m)?;
    if m != [5, 0] {
        return Err(std::io::Error::other(
            "SOCKS5 proxy did not accept the no-auth method",
        ));
    }
    let mut req = vec![5, 1, 0, 3, len];
    req.extend_from_slice(name.as_bytes());
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req)?;
    let mut r = [0u8; 4];
    s.read_exact(&mut r)?;
    if r[0] != 5 {
        return Err(std::io::Error::other("not a SOCKS5 reply"));
    }
    if r[1] != 0 {
        return Err(refused(r[1]));
    }
    let rest = match r[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => {
            let mut l = [0u8; 1];
            s.read_exact(&mut l)?;
            usize::from(l[0]) + 2
        }
        _ => return Err(std::io::Error::other("bad SOCKS5 reply address type")),
    };
    let mut skip = vec![0u8; rest];
    s.read_exact(&mut skip)?;
    Ok(s)
}

/// [`socks_stdio`] with explicit streams: `input` is copied to the
/// connection (its EOF half-closes the connection's write side) on a helper
/// thread, and the connection is copied to `output` (flushed per chunk).
/// Returns when the remote side closes; a helper blocked on `input` is left
/// to end with the process.
pub fn socks_relay<R, W>(
    proxy: SocketAddr,
    host: &str,
    port: u16,
    mut input: R,
    mut output: W,
) -> std::io::Result<()>
where
    R: Read + Send + 'static,
    W: Write,
{
    let s = socks_connect(proxy, host, port)?;
    let mut up = s.try_clone()?;
    std::thread::Builder::new()
        .name("moat-socks-stdin".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if up.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = up.shutdown(Shutdown::Write);
        })?;
    let mut down = s;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match down.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
            Err(e) => return Err(e),
        };
        if n == 0 {
            output.flush()?;
            return Ok(());
        }
        output.write_all(&buf[..n])?;
        output.flush()?;
    }
}

/// For ssh's `ProxyCommand` inside the sandbox: connects to the SOCKS5
/// proxy at `proxy`, requests `host:port` by name (ATYP domain), then relays
/// stdin→socket and socket→stdout. Blocking std I/O only; returns when the
/// remote side closes (stdin EOF half-closes the socket first).
pub fn socks_stdio(proxy: SocketAddr, host: &str, port: u16) -> std::io::Result<()> {
    socks_relay(
        proxy,
        host,
        port,
        std::io::stdin(),
        std::io::stdout().lock(),
    )
}
