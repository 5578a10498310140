//! What a nested run (a `moat exec` from inside a sandbox) shares with the
//! runtime: the outer run's side ([`Outer`], the broker seam) and what the
//! broker hands to the moat process that runs the request ([`Handoff`]).
//! The broker itself (the socket protocol) lives with the CLI.

use std::path::PathBuf;

use moat_linux::view::View;
use moat_policy::Policy;

/// What a nested run inherits from the outer one.
#[derive(Clone)]
pub struct Outer {
    pub policy: Policy,
    /// The outer run's view: a nested run gets at most this.
    pub view: Option<View>,
    pub session_id: String,
    pub execution_id: String,
    /// The outer run's audit log: nested runs are always recorded there.
    pub audit_log: Option<PathBuf>,
}

/// Serves nested requests arriving on the sandbox's broker socket.
pub trait NestedBroker {
    /// Serves one connection (on its own thread, or refuses it).
    fn serve(&mut self, conn: std::os::unix::net::UnixStream);
    /// Refuses new requests and stops the nested runs still going.
    fn shutdown(self: Box<Self>);
}

/// Builds the broker when the first nested request arrives.
pub type BrokerFactory = Box<dyn FnOnce(Outer) -> Box<dyn NestedBroker>>;

/// What the moat process that runs a nested request reads from its pipe.
pub struct Handoff {
    /// The outer run's view, with the caller's net class folded in.
    pub outer: View,
    /// `--pass-env` values from the caller's environment.
    pub pass_env: Vec<(String, String)>,
    /// The outer run's upstream proxy as given (credentials included): a
    /// nested run in proxy mode uses it and cannot choose another.
    pub upstream_url: Option<String>,
    /// The outer run's resource limits: the nested run's are at most these.
    pub limits: moat_policy::Limits,
}

/// Applies a handoff to the nested run's host facts: the outer view's
/// stand-ins and read-only paths, and the passed-through values.
pub fn apply_handoff(h: &Handoff, facts: &mut moat_linux::HostFacts) {
    moat_linux::view::inherit_facts(&h.outer, facts);
    for (k, v) in &h.pass_env {
        facts.env.retain(|(n, _)| n != k);
        facts.env.push((k.clone(), v.clone()));
    }
}

/// Narrows a nested run's policy to what the outer run allows (see
/// [`moat_linux::view::inherit_policy`]) and gives it the outer upstream proxy.
pub fn inherit_policy(h: &Handoff, policy: &mut Policy) -> Result<(), String> {
    moat_linux::view::inherit_policy(&h.outer, policy, None).map_err(|e| e.to_string())?;
    if policy.network.mode == moat_policy::NetworkMode::Proxy {
        policy.network.upstream_url = h.upstream_url.clone();
    }
    policy.limits = policy.limits.bounded_by(&h.limits);
    Ok(())
}
