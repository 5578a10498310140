//! The sandbox's side of proxy networking: inside the new network namespace
//! the init brings loopback up, creates the two listening sockets the
//! command's proxy variables point at, and passes them to the supervisor
//! over a unix socket pair (SCM_RIGHTS). The supervisor, which stays in the
//! host's network namespace, serves them: no relay process, no extra binary,
//! no route out of the namespace except through those two sockets.

use std::io::IoSlice;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use crate::sys;

/// Where the proxy endpoints listen inside the sandbox.
pub const HTTP_PROXY_ADDR: &str = "127.0.0.1:3128";
pub const SOCKS_PROXY_ADDR: &str = "127.0.0.1:1080";

/// In the init, inside the new network namespace: loopback up, listeners
/// bound, both sent to the supervisor over `fd`.
pub(crate) fn create_and_send_listeners(fd: RawFd) -> Result<(), String> {
    sys::bring_loopback_up()
        .map_err(|e| format!("bring up loopback in the sandbox's network namespace: {e}"))?;
    let bind = |a: &str| -> Result<TcpListener, String> {
        let addr: SocketAddr = a.parse().map_err(|e| format!("{a}: {e}"))?;
        TcpListener::bind(addr).map_err(|e| format!("listen on {a} inside the sandbox: {e}"))
    };
    let http = bind(HTTP_PROXY_ADDR)?;
    let socks = bind(SOCKS_PROXY_ADDR)?;
    send_fds(fd, b'P', &[http.as_raw_fd(), socks.as_raw_fd()])
        .map_err(|e| format!("hand the proxy sockets to moat: {e}"))
    // Our copies close here; the supervisor's stay open.
}

/// Sends `fds` tagged with one byte over the handoff socket.
pub(crate) fn send_fds(sock: RawFd, tag: u8, fds: &[RawFd]) -> nix::Result<()> {
    let cmsg = [ControlMessage::ScmRights(fds)];
    let tag = [tag];
    let iov = [IoSlice::new(&tag)];
    sendmsg::<()>(sock, &iov, &cmsg, MsgFlags::empty(), None).map(drop)
}

/// What the init hands to the supervisor.
pub enum Handoff {
    /// The HTTP and SOCKS5 listeners inside the sandbox's network namespace.
    Proxy(TcpListener, TcpListener),
    /// The listener at [`BROKER_SOCKET`] for nested runs.
    Broker(std::os::unix::net::UnixListener),
    /// The master of the command's own pty (opened in the sandbox's devpts).
    Pty(OwnedFd),
}

/// Receives one handoff message; None at EOF or on a malformed message.
pub fn receive(sock: &UnixStream) -> Option<Handoff> {
    let mut byte = [0u8; 1];
    let (bytes, fds) = sys::recv_with_fds::<2>(sock.as_fd(), &mut byte).ok()?;
    if bytes == 0 {
        return None;
    }
    let mut fds = fds.into_iter();
    match (byte[0], fds.next(), fds.next()) {
        (b'P', Some(a), Some(b)) => {
            Some(Handoff::Proxy(TcpListener::from(a), TcpListener::from(b)))
        }
        (b'B', Some(a), None) => Some(Handoff::Broker(std::os::unix::net::UnixListener::from(a))),
        (b'T', Some(a), None) => Some(Handoff::Pty(a)),
        _ => None,
    }
}

/// Where nested `moat exec` calls find the outer supervisor, inside the view.
pub const BROKER_SOCKET: &str = "/moat/broker.sock";

/// Environment that routes every proxy-aware client through the endpoints.
/// `moat_bin` is moat's own binary inside the view (ssh's ProxyCommand).
pub fn proxy_env(moat_bin: &str) -> Vec<(String, String)> {
    let http = format!("http://{HTTP_PROXY_ADDR}");
    let socks = format!("socks5h://{SOCKS_PROXY_ADDR}");
    let (host, port) = HTTP_PROXY_ADDR
        .split_once(':')
        .unwrap_or(("127.0.0.1", "3128"));
    let mut env = Vec::new();
    for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        env.push((k.to_string(), http.clone()));
    }
    for k in ["ALL_PROXY", "all_proxy"] {
        env.push((k.to_string(), socks.clone()));
    }
    for k in ["NO_PROXY", "no_proxy"] {
        env.push((k.to_string(), String::new()));
    }
    env.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
    env.push((
        "GIT_SSH_COMMAND".into(),
        format!("ssh -o ProxyCommand='{moat_bin} proxy-connect %h %p'"),
    ));
    env.push((
        "JAVA_TOOL_OPTIONS".into(),
        format!(
            "-Dhttp.proxyHost={host} -Dhttp.proxyPort={port} -Dhttps.proxyHost={host} -Dhttps.proxyPort={port} -Dhttp.nonProxyHosts="
        ),
    ));
    env
}
