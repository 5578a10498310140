//! The service's ceiling rule, as a library: a server's own policy flags
//! are the ceiling, and a request may narrow them, never widen them. A
//! request's `cwd` must lie inside one of the server's roots once symlinks
//! are resolved (a link leading out is refused), its level, network mode
//! and allow list must be within the server's, and its timeout is the
//! smaller of the two. `moat serve`, `moat mcp` and any harness embedding
//! moat-runtime get the same rule from [`Ceiling::narrow`].
//!
//! Anything wider than the ceiling is refused, never clamped: a model that
//! asked for more is told so, with a stable code ([`RefusalCode`]).
//!
//! An embedder's flow (the service's, less its transport):
//!
//! ```no_run
//! use std::path::Path;
//! use moat_runtime::{resolve_policy_in, Ceiling, PolicyRef, RequestPolicy};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let here = Path::new("/srv/project");
//! let home = moat_runtime::resolve::home_from_env();
//! // The server's own flags are the ceiling.
//! let server = moat_config::PolicyFlags {
//!     policy: Some(moat_policy::Level::WorkspaceWrite),
//!     ..Default::default()
//! };
//! let ceiling = Ceiling::new(&server, &[here.to_path_buf()], here, &home)?;
//! // A model's request: a narrower policy is taken, a wider one refused.
//! let request = RequestPolicy {
//!     policy: PolicyRef::parse(Some(&serde_json::json!("read-only")))?,
//!     cwd: Some("src".into()),
//!     ..Default::default()
//! };
//! let flags = ceiling.narrow(&request)?;
//! // `flags.cwd` is the checked directory. Start the run in it by fd
//! // (`moat_linux::fd::open_path_nofollow`, as `moat serve` does) rather
//! // than walking the path again: a component swapped for a symlink
//! // after the check would lead elsewhere.
//! let dir = flags.cwd.clone().unwrap_or_default();
//! let (policy, timeout) = resolve_policy_in(&flags, &dir, &home)?;
//! # let _ = (policy, timeout);
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use moat_config::{domains_within, level_within, network_within, parse_level, PolicyFlags};
use moat_policy::net::DomainPattern;
use moat_policy::{Level, NetworkMode, Policy};
use serde_json::Value;

use crate::resolve::{resolve_policy_in, ResolveError};

/// The stable code of a refused request (the protocol's `error.data.code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalCode {
    /// The request is malformed (a cwd that does not resolve, a bad env name).
    InvalidRequest,
    /// The request's policy does not parse (an unknown name or field).
    PolicyInvalid,
    /// The request asks for more than the ceiling gives.
    PolicyDenied,
    /// The host lacks what the policy needs (a kernel feature, a namespace).
    BackendCapabilityMissing,
}

impl RefusalCode {
    /// `INVALID_REQUEST`, `POLICY_INVALID` or `POLICY_DENIED`.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalCode::InvalidRequest => "INVALID_REQUEST",
            RefusalCode::PolicyInvalid => "POLICY_INVALID",
            RefusalCode::PolicyDenied => "POLICY_DENIED",
            RefusalCode::BackendCapabilityMissing => "BACKEND_CAPABILITY_MISSING",
        }
    }

    /// The code of a run refused before anything ran, from moat's reason:
    /// what the host lacks, or else what the policy refuses.
    pub fn of_refused_run(reason: &str) -> RefusalCode {
        let lower = reason.to_lowercase();
        const MISSING: [&str; 6] = [
            "kernel",
            "not supported",
            "unavailable",
            "landlock",
            "seccomp",
            "namespace",
        ];
        if MISSING.iter().any(|m| lower.contains(m)) {
            RefusalCode::BackendCapabilityMissing
        } else {
            RefusalCode::PolicyDenied
        }
    }
}

/// A request the ceiling refuses: its code, a message that says what to
/// change, and for a widening the stable reason and what was wider.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub code: RefusalCode,
    pub message: String,
    /// `wider_than_server_policy` for a widening.
    pub reason: Option<&'static str>,
    /// What was wider, for a widening.
    pub detail: Option<String>,
}

impl Refusal {
    fn new(code: RefusalCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
            reason: None,
            detail: None,
        }
    }

    fn invalid(message: impl Into<String>) -> Refusal {
        Refusal::new(RefusalCode::PolicyInvalid, message)
    }

    fn wider(detail: String) -> Refusal {
        Refusal {
            code: RefusalCode::PolicyDenied,
            message: format!("{detail}: a request may narrow the server's policy, never widen it"),
            reason: Some("wider_than_server_policy"),
            detail: Some(detail),
        }
    }
}

/// A RunSeal `PolicyRef`, parsed: a name (`read-only`, `rw`,
/// `workspace-write-proxy`: a level, optionally followed by a network mode)
/// or an object (`level`/`sandbox_level`/`policy_id`, `network` as a mode
/// or `{"mode": …}`, `allow_domains`, `deny_domains`). Unknown fields are
/// refused, never ignored (one could be a grant).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyRef {
    pub level: Option<Level>,
    pub network: Option<NetworkMode>,
    /// `None`: the server's allow list; `Some`: only these (each within it).
    pub allow_domains: Option<Vec<DomainPattern>>,
    /// Added to the server's deny list.
    pub deny_domains: Vec<DomainPattern>,
}

/// The fields a request's policy object may set.
const POLICY_FIELDS: [&str; 7] = [
    "version",
    "policy_id",
    "level",
    "sandbox_level",
    "network",
    "allow_domains",
    "deny_domains",
];

impl PolicyRef {
    /// Parses a request's `policy` (absent or null: the server's own).
    pub fn parse(p: Option<&Value>) -> Result<PolicyRef, Refusal> {
        match p {
            None | Some(Value::Null) => Ok(PolicyRef::default()),
            Some(Value::String(s)) => {
                let (level, network) = policy_name(s)?;
                Ok(PolicyRef {
                    level: Some(level),
                    network,
                    ..PolicyRef::default()
                })
            }
            Some(Value::Object(o)) => {
                if let Some(k) = o.keys().find(|k| !POLICY_FIELDS.contains(&k.as_str())) {
                    return Err(Refusal::invalid(format!(
                        "policy field {k:?} is not supported by this server; a request may set {}",
                        POLICY_FIELDS.join(", ")
                    )));
                }
                let mut r = PolicyRef::default();
                // A field of another shape than the one read is refused, never
                // skipped: skipped, a narrowing the client asked for would be
                // dropped and the run would get the server's wider policy.
                for key in ["policy_id", "level", "sandbox_level"] {
                    match o.get(key) {
                        None | Some(Value::Null) => {}
                        Some(Value::String(s)) => {
                            let (l, n) = policy_name(s)?;
                            r.level = Some(l);
                            r.network = r.network.or(n);
                        }
                        Some(_) => {
                            return Err(Refusal::invalid(format!(
                                "policy field {key} must be a name"
                            )))
                        }
                    }
                }
                let net_name = match o.get("network") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(Value::Object(n)) => {
                        if let Some(k) = n.keys().find(|k| k.as_str() != "mode") {
                            return Err(Refusal::invalid(format!(
                                "network field {k:?} is not supported by this server; the network object may set mode (allow_domains and deny_domains go in the policy object)"
                            )));
                        }
                        match n.get("mode") {
                            None | Some(Value::Null) => None,
                            Some(Value::String(m)) => Some(m.clone()),
                            Some(_) => return Err(Refusal::invalid("network.mode must be a name")),
                        }
                    }
                    Some(_) => {
                        return Err(Refusal::invalid(
                            "policy field network must be a mode name or {\"mode\": NAME}",
                        ))
                    }
                };
                if let Some(s) = net_name {
                    r.network = Some(NetworkMode::parse(&s).ok_or_else(|| {
                        Refusal::invalid(format!(
                            "unknown network mode {s:?}: use disabled, proxy or unmanaged"
                        ))
                    })?);
                }
                r.allow_domains = patterns(o.get("allow_domains"), "allow_domains")?;
                r.deny_domains =
                    patterns(o.get("deny_domains"), "deny_domains")?.unwrap_or_default();
                Ok(r)
            }
            Some(_) => Err(Refusal::invalid("policy must be a name or an object")),
        }
    }
}

/// A level name, optionally followed by `-` and a network mode.
fn policy_name(s: &str) -> Result<(Level, Option<NetworkMode>), Refusal> {
    if let Some(l) = parse_level(s) {
        return Ok((l, None));
    }
    for n in NetworkMode::ALL {
        if let Some(l) = s
            .strip_suffix(n.as_str())
            .and_then(|h| h.strip_suffix('-'))
            .and_then(parse_level)
        {
            return Ok((l, Some(n)));
        }
    }
    Err(Refusal::invalid(format!(
        "unknown policy {s:?}: use a level (read-only, workspace-write, workspace-contained, danger-full-access), optionally followed by -proxy, -disabled or -unmanaged"
    )))
}

/// A list of domain patterns (absent or null: `None`).
fn patterns(v: Option<&Value>, key: &str) -> Result<Option<Vec<DomainPattern>>, Refusal> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .ok_or_else(|| Refusal::invalid(format!("{key} must be strings")))
                    .and_then(|s| {
                        DomainPattern::parse(s)
                            .map_err(|e| Refusal::invalid(format!("{key}: {s}: {e}")))
                    })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(Refusal::invalid(format!("{key} must be an array"))),
    }
}

/// What one request asks for, to be checked against the ceiling.
#[derive(Clone, Debug, Default)]
pub struct RequestPolicy {
    pub policy: PolicyRef,
    /// Relative: from the first root; absent: the first root.
    pub cwd: Option<String>,
    pub timeout_ms: Option<u64>,
    /// Variables set in the sandbox (names checked here).
    pub env: BTreeMap<String, String>,
}

/// A server's ceiling: its own flags (resolved once, so a server whose
/// policy does not resolve does not start) and the roots a request's cwd
/// must lie in.
#[derive(Clone, Debug)]
pub struct Ceiling {
    flags: PolicyFlags,
    policy: Policy,
    roots: Vec<PathBuf>,
    here: PathBuf,
    home: PathBuf,
}

impl Ceiling {
    /// Resolves `flags` in `here` against `home`, and the roots
    /// (canonical directories; none given: the ceiling's workspace). The
    /// flags' relative paths are made absolute from `here`: executions
    /// start in the request's directory.
    pub fn new(
        flags: &PolicyFlags,
        roots: &[PathBuf],
        here: &Path,
        home: &Path,
    ) -> Result<Ceiling, ResolveError> {
        let (policy, _) = resolve_policy_in(flags, here, home)?;
        let mut canonical = Vec::new();
        for r in roots {
            let c =
                std::fs::canonicalize(here.join(r)).map_err(|error| ResolveError::RootMissing {
                    path: r.clone(),
                    error,
                })?;
            if !c.is_dir() {
                return Err(ResolveError::RootNotDir(c));
            }
            canonical.push(c);
        }
        if canonical.is_empty() {
            canonical.push(policy.workspace.clone());
        }
        let mut flags = flags.clone();
        let absolute = |p: &mut PathBuf| {
            if p.is_relative() && !p.starts_with("~") {
                *p = here.join(&*p);
            }
        };
        flags.ro.iter_mut().for_each(absolute);
        flags.rw.iter_mut().for_each(absolute);
        if let Some(p) = flags.upstream_proxy_auth_file.as_mut() {
            absolute(p);
        }
        Ok(Ceiling {
            flags,
            policy,
            roots: canonical,
            here: here.to_path_buf(),
            home: home.to_path_buf(),
        })
    }

    /// The ceiling's resolved policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The roots a request's cwd may lie in, canonical.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// The request's `cwd`, resolved (symlinks followed, then checked: a
    /// link that leads out of every root is refused) and inside a root.
    /// Relative paths are taken from the first root.
    pub fn resolve_cwd(&self, cwd: Option<&str>) -> Result<PathBuf, Refusal> {
        let first = self.roots.first().cloned().unwrap_or_default();
        let asked = match cwd {
            None => return Ok(first),
            Some(c) => Path::new(c),
        };
        let joined = if asked.is_absolute() {
            asked.to_path_buf()
        } else {
            first.join(asked)
        };
        let real = std::fs::canonicalize(&joined).map_err(|e| {
            Refusal::new(
                RefusalCode::InvalidRequest,
                format!("cwd {} cannot be resolved: {e}", joined.display()),
            )
        })?;
        if !self.roots.iter().any(|r| real.starts_with(r)) {
            let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
            return Err(Refusal::new(
                RefusalCode::PolicyDenied,
                format!(
                    "cwd {} (resolved {}) is outside the server's roots {}; start the server with --root DIR to allow it",
                    joined.display(),
                    real.display(),
                    roots.join(", ")
                ),
            ));
        }
        if !real.is_dir() {
            return Err(Refusal::new(
                RefusalCode::InvalidRequest,
                format!("cwd {} is not a directory", real.display()),
            ));
        }
        Ok(real)
    }

    /// The flags of one execution: the ceiling's, narrowed by the request,
    /// with `cwd` set to the checked directory. Anything wider than the
    /// ceiling is refused, never clamped.
    pub fn narrow(&self, req: &RequestPolicy) -> Result<PolicyFlags, Refusal> {
        let mut flags = self.flags.clone();
        flags.cwd = Some(self.resolve_cwd(req.cwd.as_deref())?);
        let ceiling = &self.policy;
        let asked = &req.policy;
        if let Some(l) = asked.level {
            if !level_within(l, ceiling.level) {
                return Err(Refusal::wider(format!(
                    "level {} is wider than the server's {}",
                    l.as_str(),
                    ceiling.level.as_str()
                )));
            }
            flags.policy = Some(l);
        }
        if let Some(n) = asked.network {
            if !network_within(n, ceiling.network.mode) {
                return Err(Refusal::wider(format!(
                    "network {} is wider than the server's {}",
                    n.as_str(),
                    ceiling.network.mode.as_str()
                )));
            }
            flags.network = Some(n);
        }
        if let Some(allow) = &asked.allow_domains {
            if !domains_within(allow, &ceiling.network.rules.allow) {
                return Err(Refusal::wider(
                    "allow_domains names a host the server's allow list does not".to_string(),
                ));
            }
            flags.allow_domain = allow.iter().map(|p| p.as_str().to_string()).collect();
        }
        flags
            .deny_domain
            .extend(asked.deny_domains.iter().map(|p| p.as_str().to_string()));
        if flags.network == Some(NetworkMode::Disabled) {
            // The allow/deny lists and the upstream belong to proxy mode:
            // narrowed to no network, they go (moat refuses them otherwise).
            flags.allow_domain.clear();
            flags.deny_domain.clear();
            flags.upstream_proxy = None;
            flags.upstream_proxy_auth_file = None;
        }
        flags.timeout = match (req.timeout_ms, ceiling.timeout_ms) {
            (Some(r), Some(c)) => Some(r.min(c)),
            (Some(r), None) => Some(r),
            (None, c) => c,
        };
        for (k, v) in &req.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(Refusal::new(
                    RefusalCode::InvalidRequest,
                    format!("env name {k:?} is not a valid variable name"),
                ));
            }
            flags.env.push((k.clone(), v.clone()));
        }
        self.check_cwd_view(&flags)?;
        Ok(flags)
    }

    /// Refuses a `cwd` whose view, as the execution's workspace, reaches
    /// further than the same execution's view at a root containing it: a
    /// directory the root's view keeps read-only or hidden (its `.git`
    /// hooks, `.claude`, `.vscode`, a `.env.d`, a `--ro` grant inside it, a
    /// home path that runs code) would otherwise become a writable or
    /// visible workspace, since moat protects those relative to the
    /// workspace (Codex's CVE-2025-59532 is the same step). Checked against
    /// every root that contains it (the strictest wins), with the
    /// comparison nested runs use; a `cwd` that is a root needs no check.
    fn check_cwd_view(&self, flags: &PolicyFlags) -> Result<(), Refusal> {
        let Some(dir) = flags.cwd.as_deref() else {
            return Ok(());
        };
        if flags.policy.unwrap_or(self.policy.level) == Level::DangerFullAccess {
            return Ok(());
        }
        let containing: Vec<&PathBuf> = self
            .roots
            .iter()
            .filter(|r| dir.starts_with(r) && r.as_path() != dir)
            .collect();
        if containing.is_empty() {
            return Ok(());
        }
        let inner = self.view_of(flags)?;
        for root in containing {
            let mut at_root = flags.clone();
            at_root.cwd = Some(root.clone());
            let outer = self.view_of(&at_root)?;
            if let Some((path, reach)) = moat_linux::view::reaches_further(&outer, &inner) {
                let what = if reach == 0 {
                    "hides"
                } else {
                    "keeps read-only"
                };
                return Err(Refusal {
                    code: RefusalCode::PolicyDenied,
                    message: format!(
                        "cwd {} would open {}, which the server's policy {what} at its root {}; run in the root or a plain directory inside it",
                        dir.display(),
                        path.display(),
                        root.display()
                    ),
                    reason: Some("cwd_in_protected_path"),
                    detail: Some(format!("{} {what}", path.display())),
                });
            }
        }
        Ok(())
    }

    /// The view an execution with `flags` gets on this host now.
    fn view_of(&self, flags: &PolicyFlags) -> Result<moat_linux::view::View, Refusal> {
        let (policy, _) = resolve_policy_in(flags, &self.here, &self.home)
            .map_err(|e| Refusal::new(RefusalCode::PolicyDenied, e.to_string()))?;
        let env = std::env::vars_os()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect();
        Ok(moat_linux::view::compute(
            &policy,
            &moat_linux::HostFacts::probe(&policy, env),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A ceiling over a fresh directory `root` (its only root), with these
    /// flags; HOME is the root too (nothing of the real one is read).
    fn ceiling(root: &Path, flags: PolicyFlags) -> Ceiling {
        Ceiling::new(&flags, &[root.to_path_buf()], root, root).unwrap()
    }

    /// A fresh canonical directory, removed with the returned guard.
    fn tmp() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(dir.path()).unwrap();
        (dir, path)
    }

    fn with(policy: PolicyRef) -> RequestPolicy {
        RequestPolicy {
            policy,
            ..RequestPolicy::default()
        }
    }

    fn flags(level: Level, network: NetworkMode) -> PolicyFlags {
        PolicyFlags {
            policy: Some(level),
            network: Some(network),
            ..PolicyFlags::default()
        }
    }

    #[test]
    fn policy_names_take_runseal_composites_and_moat_short_forms() {
        let r = PolicyRef::parse(Some(&json!("workspace-write-proxy"))).unwrap();
        assert_eq!(
            (r.level, r.network),
            (Some(Level::WorkspaceWrite), Some(NetworkMode::Proxy))
        );
        let r = PolicyRef::parse(Some(&json!("ro"))).unwrap();
        assert_eq!((r.level, r.network), (Some(Level::ReadOnly), None));
        let r = PolicyRef::parse(Some(
            &json!({"sandbox_level": "danger-full-access", "network": {"mode": "disabled"}}),
        ))
        .unwrap();
        assert_eq!(
            (r.level, r.network),
            (Some(Level::DangerFullAccess), Some(NetworkMode::Disabled))
        );
        let bad = PolicyRef::parse(Some(&json!("workspace-writ"))).unwrap_err();
        assert_eq!(bad.code, RefusalCode::PolicyInvalid);
        // An unknown field is refused, never ignored (it could be a grant).
        assert!(PolicyRef::parse(Some(&json!({"filesystem": {"rw": ["/"]}}))).is_err());
        assert!(PolicyRef::parse(Some(&json!(3))).is_err());
    }

    #[test]
    fn a_wider_level_is_refused_and_a_narrower_one_taken() {
        let (_guard, root) = tmp();
        let c = ceiling(&root, flags(Level::WorkspaceWrite, NetworkMode::Disabled));
        let wide = c
            .narrow(&with(PolicyRef {
                level: Some(Level::DangerFullAccess),
                ..PolicyRef::default()
            }))
            .unwrap_err();
        assert_eq!(wide.code, RefusalCode::PolicyDenied);
        assert_eq!(wide.reason, Some("wider_than_server_policy"));
        assert!(wide.message.contains("danger-full-access"), "{wide}");
        let narrow = c
            .narrow(&with(PolicyRef {
                level: Some(Level::ReadOnly),
                ..PolicyRef::default()
            }))
            .unwrap();
        assert_eq!(narrow.policy, Some(Level::ReadOnly));
        // Read-only and workspace-contained are not comparable: neither
        // narrows the other.
        let c = ceiling(&root, flags(Level::ReadOnly, NetworkMode::Disabled));
        let sideways = c.narrow(&with(PolicyRef {
            level: Some(Level::WorkspaceContained),
            ..PolicyRef::default()
        }));
        assert_eq!(sideways.unwrap_err().code, RefusalCode::PolicyDenied);
    }

    #[test]
    fn a_wider_network_is_refused_and_a_narrower_one_drops_the_proxy_lists() {
        let (_guard, root) = tmp();
        let mut f = flags(Level::WorkspaceWrite, NetworkMode::Proxy);
        f.allow_domain = vec!["example.com".into()];
        let c = ceiling(&root, f);
        let wide = c
            .narrow(&with(PolicyRef {
                network: Some(NetworkMode::Unmanaged),
                ..PolicyRef::default()
            }))
            .unwrap_err();
        assert_eq!(wide.code, RefusalCode::PolicyDenied);
        assert!(wide.message.contains("unmanaged"), "{wide}");
        let off = c
            .narrow(&with(PolicyRef {
                network: Some(NetworkMode::Disabled),
                ..PolicyRef::default()
            }))
            .unwrap();
        assert_eq!(off.network, Some(NetworkMode::Disabled));
        assert!(off.allow_domain.is_empty());
    }

    #[test]
    fn an_allow_domain_outside_the_servers_list_is_refused() {
        let (_guard, root) = tmp();
        let mut f = flags(Level::WorkspaceWrite, NetworkMode::Proxy);
        f.allow_domain = vec!["*.example.com".into()];
        let c = ceiling(&root, f);
        let pat = |s: &str| DomainPattern::parse(s).unwrap();
        let outside = c
            .narrow(&with(PolicyRef {
                allow_domains: Some(vec![pat("evil.test")]),
                ..PolicyRef::default()
            }))
            .unwrap_err();
        assert_eq!(outside.code, RefusalCode::PolicyDenied);
        assert_eq!(outside.reason, Some("wider_than_server_policy"));
        let inside = c
            .narrow(&with(PolicyRef {
                allow_domains: Some(vec![pat("api.example.com")]),
                deny_domains: vec![pat("bad.example.com")],
                ..PolicyRef::default()
            }))
            .unwrap();
        assert_eq!(inside.allow_domain, vec!["api.example.com".to_string()]);
        assert_eq!(inside.deny_domain, vec!["bad.example.com".to_string()]);
    }

    #[test]
    fn a_cwd_outside_the_roots_is_refused_and_one_inside_taken() {
        let (_guard, base) = tmp();
        let root = base.join("root");
        let other = base.join("other");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let c = ceiling(&root, flags(Level::WorkspaceWrite, NetworkMode::Disabled));
        let out = c
            .narrow(&RequestPolicy {
                cwd: Some(other.to_string_lossy().into_owned()),
                ..RequestPolicy::default()
            })
            .unwrap_err();
        assert_eq!(out.code, RefusalCode::PolicyDenied);
        assert!(out.message.contains("outside the server's roots"), "{out}");
        // `..` out of the root is the same refusal.
        let dotdot = c.resolve_cwd(Some("../other")).unwrap_err();
        assert_eq!(dotdot.code, RefusalCode::PolicyDenied);
        let sub = c
            .narrow(&RequestPolicy {
                cwd: Some("sub".into()),
                ..RequestPolicy::default()
            })
            .unwrap();
        assert_eq!(sub.cwd, Some(root.join("sub")));
        // No cwd: the first root.
        assert_eq!(c.resolve_cwd(None).unwrap(), root);
    }

    #[test]
    fn a_symlink_inside_a_root_that_leads_out_is_refused() {
        let (_guard, base) = tmp();
        let root = base.join("root");
        let other = base.join("other");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::os::unix::fs::symlink(&other, root.join("link")).unwrap();
        let c = ceiling(&root, flags(Level::WorkspaceWrite, NetworkMode::Disabled));
        let out = c.resolve_cwd(Some("link")).unwrap_err();
        assert_eq!(out.code, RefusalCode::PolicyDenied);
        assert!(out.message.contains(&other.display().to_string()), "{out}");
        let abs = root.join("link").to_string_lossy().into_owned();
        assert_eq!(
            c.resolve_cwd(Some(&abs)).unwrap_err().code,
            RefusalCode::PolicyDenied
        );
    }

    #[test]
    fn the_timeout_is_the_smaller_of_the_request_and_the_ceiling() {
        let (_guard, root) = tmp();
        let mut f = flags(Level::WorkspaceWrite, NetworkMode::Disabled);
        f.timeout = Some(5_000);
        let c = ceiling(&root, f);
        let t = |asked: Option<u64>| {
            c.narrow(&RequestPolicy {
                timeout_ms: asked,
                ..RequestPolicy::default()
            })
            .unwrap()
            .timeout
        };
        assert_eq!(t(Some(60_000)), Some(5_000));
        assert_eq!(t(Some(100)), Some(100));
        assert_eq!(t(None), Some(5_000));
        let c = ceiling(&root, flags(Level::WorkspaceWrite, NetworkMode::Disabled));
        assert_eq!(
            c.narrow(&RequestPolicy {
                timeout_ms: Some(7),
                ..RequestPolicy::default()
            })
            .unwrap()
            .timeout,
            Some(7)
        );
    }

    #[test]
    fn a_refused_run_is_blamed_on_the_host_only_when_it_names_what_is_missing() {
        assert_eq!(
            RefusalCode::of_refused_run("user namespaces are not supported by this kernel"),
            RefusalCode::BackendCapabilityMissing
        );
        assert_eq!(
            RefusalCode::of_refused_run("--rw /nope: no such path"),
            RefusalCode::PolicyDenied
        );
    }

    #[test]
    fn a_bad_env_name_is_an_invalid_request() {
        let (_guard, root) = tmp();
        let c = ceiling(&root, flags(Level::WorkspaceWrite, NetworkMode::Disabled));
        let env = BTreeMap::from([("A=B".to_string(), "x".to_string())]);
        let bad = c
            .narrow(&RequestPolicy {
                env,
                ..RequestPolicy::default()
            })
            .unwrap_err();
        assert_eq!(bad.code, RefusalCode::InvalidRequest);
    }

    #[test]
    fn a_narrowing_of_another_shape_is_refused_not_dropped() {
        for p in [
            json!({"level": ["read-only"]}),
            json!({"sandbox_level": {"name": "read-only"}}),
            json!({"network": 0}),
            json!({"network": {"mode": "proxy", "allow_domains": ["a.example.com"]}}),
            json!({"network": {"mode": 1}}),
        ] {
            let bad = PolicyRef::parse(Some(&p)).unwrap_err();
            assert_eq!(bad.code, RefusalCode::PolicyInvalid, "{p}");
        }
    }

    #[test]
    fn a_cwd_that_would_open_what_the_root_protects_is_refused() {
        let (_guard, root) = tmp();
        std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(root.join("src/pkg")).unwrap();
        let c = ceiling(&root, flags(Level::WorkspaceWrite, NetworkMode::Disabled));
        let at = |cwd: &str| {
            c.narrow(&RequestPolicy {
                cwd: Some(cwd.to_string()),
                ..RequestPolicy::default()
            })
        };
        for cwd in [".git", ".git/hooks"] {
            let bad = at(cwd).unwrap_err();
            assert_eq!(bad.code, RefusalCode::PolicyDenied, "{cwd}");
            assert_eq!(bad.reason, Some("cwd_in_protected_path"), "{cwd}");
        }
        assert_eq!(at("src/pkg").unwrap().cwd, Some(root.join("src/pkg")));
    }
}
