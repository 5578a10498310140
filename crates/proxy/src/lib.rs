//! moat's managed network proxy: HTTP (absolute-form and CONNECT) and SOCKS5 on pre-bound listeners.
//!
//! The listeners are created by moat inside the sandbox's network namespace
//! and handed to the supervisor, which stays in the host namespace. [`start`]
//! serves them on a tokio runtime of its own: every decision
//! ([`moat_policy::net::decide`], then [`moat_policy::net::guard`] on every
//! resolved address) and every outbound connection happens here, in the
//! supervisor. Names are resolved once, and the proxy connects only to an
//! address that passed the guard, so there is no DNS-rebinding window.
//!
//! Each request yields one [`DecisionRecord`]: denials as soon as they are
//! decided, carried connections when they close (with final byte counts).
//! Records never contain credentials, paths, query strings or headers.
//!
//! # Answers the sandboxed client sees
//! - HTTP: `403 Forbidden` with body `moat: blocked HOST:PORT (REASON)\n`,
//!   `400 Bad Request` with `moat: bad request (bad_request)\n`,
//!   `502 Bad Gateway` with `moat: cannot reach HOST:PORT (upstream_failed)\n`.
//!   Every such answer also carries an `X-Moat-Reason: REASON` header.
//! - SOCKS5: reply `0x02` (not allowed by ruleset) for `not_allowed`,
//!   `denied` and `private_address`; `0x04` (host unreachable) or `0x05`
//!   (connection refused) for `upstream_failed`; `0x07`/`0x08` for
//!   unsupported commands/address types.
//!
//! # Upstream proxy
//! With [`ProxyConfig::upstream`], allowed CONNECT and SOCKS5 connections are
//! opened through the upstream with `CONNECT host:port`, and plain HTTP
//! requests are forwarded to it in absolute form, with `Proxy-Authorization:
//! Basic` when the URL had userinfo. The local decision is made first; the
//! address guard then applies to IP-literal targets only, since names are
//! resolved by the upstream.
#![forbid(unsafe_code)]

mod dial;
mod http;
mod relay;
mod server;
mod socks;
mod stdio;
mod upstream;

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

pub use server::{ProxyHandle, MAX_KEPT_RECORDS};

/// What to do about a refusal, with the flag that changes it: one text for
/// the 403 body, `moat proxy-connect`'s message and moat's stderr line.
pub fn refusal_hint(host: &str, port: u16, reason: moat_policy::net::Reason) -> String {
    use moat_policy::net::Reason;
    let hp = http::host_port(host, port);
    match reason {
        Reason::NotAllowed => format!("no allow entry matches; add --allow-domain {hp} to allow it"),
        Reason::Denied => "a --deny-domain entry matches it, and deny wins over allow".into(),
        Reason::PrivateAddress => format!(
            "it resolves to a loopback, private or metadata address; if you mean it, allow that exact IP literal with --allow-domain IP:{port}"
        ),
        Reason::BadRequest => {
            "the proxy takes absolute-form HTTP, CONNECT, or SOCKS5 with a host name".into()
        }
        Reason::UpstreamFailed => {
            "allowed, but the host (or the upstream proxy) could not be reached".into()
        }
    }
}

/// The one-line refusal: `moat: blocked HOST:PORT (REASON); HINT`.
pub fn refusal_line(host: &str, port: u16, reason: moat_policy::net::Reason) -> String {
    let hp = http::host_port(host, port);
    let verb = if reason == moat_policy::net::Reason::UpstreamFailed {
        "cannot reach"
    } else {
        "blocked"
    };
    format!(
        "moat: {verb} {hp} ({reason}); {}",
        refusal_hint(host, port, reason),
        reason = reason.as_str()
    )
}
pub use stdio::{socks_connect, socks_relay, socks_stdio};
pub use upstream::{parse_upstream, Upstream};

/// What the proxy enforces and how it reaches the outside.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Allow/deny patterns (see [`moat_policy::net`]).
    pub rules: moat_policy::net::NetRules,
    /// Corporate proxy to chain through (HTTP CONNECT), if any.
    pub upstream: Option<Upstream>,
    /// Budget for resolving and connecting to a target (or the upstream).
    pub connect_timeout: Duration,
    /// `Authorization` values the proxy adds to plain-HTTP requests for one
    /// host and port (the user's own registry credentials, which never
    /// enter the sandbox). HTTPS cannot carry them without TLS interception.
    pub credentials: Vec<HostCredential>,
}

/// An `Authorization` value for requests to one host and port (and path
/// prefix).
#[derive(Clone, PartialEq, Eq)]
pub struct HostCredential {
    /// Lowercase host name or IP literal (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// Added only to requests whose path starts with this (`/` for the
    /// whole host; npm's `//host/path/:_authToken` is for `/path/` only).
    /// Where several match, the longest wins, as npm picks its own.
    pub path_prefix: String,
    /// The header value, e.g. `Basic dXNlcjpwdw==` or `Bearer TOKEN`.
    pub authorization: String,
}

impl std::fmt::Debug for HostCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostCredential({}:{}, ***)", self.host, self.port)
    }
}

impl ProxyConfig {
    /// Rules only, direct connections, 10 s connect timeout.
    pub fn new(rules: moat_policy::net::NetRules) -> ProxyConfig {
        ProxyConfig {
            rules,
            upstream: None,
            connect_timeout: Duration::from_secs(10),
            credentials: Vec::new(),
        }
    }
}

/// One proxied request: a `network.decision` record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DecisionRecord {
    /// `"http"` (absolute-form request), `"connect"` or `"socks5"`.
    pub protocol: &'static str,
    /// The requested host as the client named it (lowercase; IPv6 without
    /// brackets); empty when the request could not be parsed.
    pub host: String,
    pub port: u16,
    /// `"allow"` when the proxy carried the traffic, `"deny"` otherwise.
    pub decision: &'static str,
    /// A stable reason code when `decision` is `"deny"`:
    /// `not_allowed`, `denied`, `private_address`, `bad_request`,
    /// `upstream_failed`.
    pub reason: Option<&'static str>,
    /// The IP:port actually connected to (the upstream proxy's, when
    /// chaining).
    pub address: Option<String>,
    /// Bytes sent towards the target (for plain HTTP, including the request
    /// head moat wrote).
    pub bytes_up: u64,
    /// Bytes sent back to the client (for plain HTTP, including the response
    /// head).
    pub bytes_down: u64,
    /// From accepting the client connection to closing it (or to the denial).
    pub duration_ms: u64,
}

/// Errors of this crate's configuration surface.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProxyError {
    #[error("invalid upstream proxy URL: {0}")]
    BadUpstream(String),
}

/// Callback invoked once per request; called from the proxy's runtime, so it
/// must be quick and must not block.
pub type OnDecision = Box<dyn Fn(DecisionRecord) + Send + Sync>;

/// Starts serving on already-listening sockets (they may come from another
/// network namespace: nothing is rebound). Builds a multi-threaded tokio
/// runtime (2 workers) whose main task runs on a dedicated thread.
///
/// `on_decision` is called once per request: immediately for denials, and
/// when the connection closes (with final byte counts) for carried traffic.
pub fn start(
    http: TcpListener,
    socks: TcpListener,
    config: ProxyConfig,
    on_decision: OnDecision,
) -> std::io::Result<ProxyHandle> {
    server::start(http, socks, config, on_decision)
}

pub(crate) type Records = Arc<Mutex<Vec<DecisionRecord>>>;
