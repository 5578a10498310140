//! Bidirectional byte relay with live counters and half-close propagation.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// First per-direction buffer size: small, so idle and chatty connections
/// cost little memory.
const BUF_MIN: usize = 16 * 1024;
/// Largest per-direction buffer: a read that fills the buffer doubles it up
/// to this, so bulk transfers cost few syscalls per megabyte (measured on
/// loopback: 64 KiB buffers reach ~50% of direct throughput, 1 MiB ~80%).
const BUF_MAX: usize = 1024 * 1024;

/// Copies `r` to `w` until EOF, then shuts `w`'s write side down (FIN).
pub(crate) async fn copy_half<R, W>(r: &mut R, w: &mut W, count: &AtomicU64) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut buf = vec![0u8; BUF_MIN];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            w.shutdown().await?;
            return Ok(());
        }
        w.write_all(&buf[..n]).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        if n == buf.len() && buf.len() < BUF_MAX {
            buf.resize(buf.len() * 2, 0);
        }
    }
}

/// Relays between `client` and `remote` until both directions are closed or
/// either fails. `up` counts client→remote bytes, `down` the reverse.
pub(crate) async fn relay(
    client: &mut TcpStream,
    remote: &mut TcpStream,
    up: &AtomicU64,
    down: &AtomicU64,
) {
    let (mut cr, mut cw) = client.split();
    let (mut rr, mut rw) = remote.split();
    let _ = tokio::try_join!(
        copy_half(&mut cr, &mut rw, up),
        copy_half(&mut rr, &mut cw, down)
    );
}

/// Writes `data` (if any) and counts it.
pub(crate) async fn write_counted<W>(
    w: &mut W,
    data: &[u8],
    count: &AtomicU64,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin + ?Sized,
{
    if !data.is_empty() {
        w.write_all(data).await?;
        count.fetch_add(data.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}
