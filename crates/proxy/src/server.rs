//! Runtime, accept loops, per-connection tasks, record sink and shutdown.

use std::net::TcpListener as StdListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use moat_policy::net::Reason;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

use crate::{DecisionRecord, OnDecision, ProxyConfig, Records};

/// Most records a [`ProxyHandle`] keeps for `shutdown`/`records` (every
/// record still reaches `on_decision`): a command making endless requests
/// must not grow moat's memory without bound.
pub const MAX_KEPT_RECORDS: usize = 1024;

/// How long `shutdown` waits for connection tasks to notice the stop.
const DRAIN_TASKS: Duration = Duration::from_secs(2);

/// A running proxy. Dropping it shuts it down too (discarding the records).
pub struct ProxyHandle {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    records: Records,
}

impl ProxyHandle {
    /// Closes the listeners and every open connection (carried connections
    /// are recorded with their byte counts so far), joins the runtime thread
    /// and returns the records in the order they were emitted (the first
    /// [`MAX_KEPT_RECORDS`]).
    pub fn shutdown(mut self) -> Vec<DecisionRecord> {
        self.stop_and_join();
        let mut g = self.records.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *g)
    }

    /// A snapshot of the records emitted so far.
    pub fn records(&self) -> Vec<DecisionRecord> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn stop_and_join(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// State shared by every connection task.
pub(crate) struct Shared {
    pub config: ProxyConfig,
    records: Records,
    on_decision: OnDecision,
}

impl Shared {
    fn emit(&self, rec: DecisionRecord) {
        let mut g = self.records.lock().unwrap_or_else(|e| e.into_inner());
        (self.on_decision)(rec.clone());
        if g.len() < MAX_KEPT_RECORDS {
            g.push(rec);
        }
    }
}

/// One accepted client connection's context.
pub(crate) struct Ctx {
    pub shared: Arc<Shared>,
    pub started: Instant,
}

impl Ctx {
    pub fn config(&self) -> &ProxyConfig {
        &self.shared.config
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records a refusal right away.
    pub fn deny(&self, protocol: &'static str, host: &str, port: u16, reason: Reason) {
        self.shared.emit(DecisionRecord {
            protocol,
            host: host.to_string(),
            port,
            decision: "deny",
            reason: Some(reason.as_str()),
            address: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: self.elapsed_ms(),
        });
    }

    /// Starts the record of a carried connection; it is emitted when the
    /// returned guard drops (connection closed, or task cancelled).
    pub fn carried(
        &self,
        protocol: &'static str,
        host: &str,
        port: u16,
        address: String,
    ) -> Carried {
        Carried {
            shared: Arc::clone(&self.shared),
            started: self.started,
            protocol,
            host: host.to_string(),
            port,
            address,
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
        }
    }
}

/// Byte counters of a carried connection; emits its record on drop.
pub(crate) struct Carried {
    shared: Arc<Shared>,
    started: Instant,
    protocol: &'static str,
    host: String,
    port: u16,
    address: String,
    pub up: AtomicU64,
    pub down: AtomicU64,
}

impl Drop for Carried {
    fn drop(&mut self) {
        self.shared.emit(DecisionRecord {
            protocol: self.protocol,
            host: std::mem::take(&mut self.host),
            port: self.port,
            decision: "allow",
            reason: None,
            address: Some(std::mem::take(&mut self.address)),
            bytes_up: self.up.load(Ordering::Relaxed),
            bytes_down: self.down.load(Ordering::Relaxed),
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        });
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Http,
    Socks,
}

pub(crate) fn start(
    http: StdListener,
    socks: StdListener,
    config: ProxyConfig,
    on_decision: OnDecision,
) -> std::io::Result<ProxyHandle> {
    http.set_nonblocking(true)?;
    socks.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("moat-proxy")
        .enable_io()
        .enable_time()
        .build()?;
    let (http, socks) = {
        let _enter = rt.enter();
        (TcpListener::from_std(http)?, TcpListener::from_std(socks)?)
    };
    let records: Records = Arc::new(Mutex::new(Vec::new()));
    let shared = Arc::new(Shared {
        config,
        records: Arc::clone(&records),
        on_decision,
    });
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("moat-proxy-main".into())
        .spawn(move || {
            rt.block_on(run(http, socks, shared, stop_rx));
            rt.shutdown_timeout(Duration::from_millis(200));
        })?;
    Ok(ProxyHandle {
        stop: Some(stop_tx),
        thread: Some(thread),
        records,
    })
}

async fn run(
    http: TcpListener,
    socks: TcpListener,
    shared: Arc<Shared>,
    stop: oneshot::Receiver<()>,
) {
    let (tx, rx) = watch::channel(false);
    let a = tokio::spawn(accept_loop(
        http,
        Kind::Http,
        Arc::clone(&shared),
        rx.clone(),
    ));
    let b = tokio::spawn(accept_loop(socks, Kind::Socks, shared, rx));
    // A dropped handle also means stop.
    let _ = stop.await;
    let _ = tx.send(true);
    let _ = a.await;
    let _ = b.await;
    // Every connection task holds a receiver; wait for all of them to finish.
    let _ = tokio::time::timeout(DRAIN_TASKS, tx.closed()).await;
}

async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

async fn accept_loop(
    l: TcpListener,
    kind: Kind,
    shared: Arc<Shared>,
    mut rx: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = stopped(&mut rx) => break,
            r = l.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                let ctx = Ctx {
                    shared: Arc::clone(&shared),
                    started: Instant::now(),
                };
                let mut crx = rx.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = stopped(&mut crx) => {}
                        _ = serve(stream, kind, ctx) => {}
                    }
                });
            }
            // EMFILE and friends: back off instead of spinning.
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

async fn serve(stream: TcpStream, kind: Kind, ctx: Ctx) {
    let _ = stream.set_nodelay(true);
    match kind {
        Kind::Http => crate::http::serve(stream, ctx).await,
        Kind::Socks => crate::socks::serve(stream, ctx).await,
    }
}
