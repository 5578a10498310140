//! A run's refusals, typed: swept write-protected paths, what the command's
//! stderr says was refused (attributed to the plan by `explain`), and the
//! network refusals (the proxy's denials, failed lookups in `disabled`).

use moat_linux::explain::{explain, DenyReason};
use moat_linux::{Plan, RunOutcome};
use moat_policy::{NetworkMode, Policy};
use serde_json::Value;

use crate::event::Denial;

/// A proxy record's reason code as the policy's type.
pub(crate) fn net_reason(code: &str) -> Option<moat_policy::net::Reason> {
    moat_policy::net::Reason::ALL
        .into_iter()
        .find(|r| r.as_str() == code)
}

/// The flag that gives a command the network, for a refusal in `disabled` mode.
pub fn disabled_hint(host: Option<&str>) -> String {
    format!(
        "network is disabled; use --network proxy --allow-domain {}",
        host.unwrap_or("HOST")
    )
}

fn stderr_text(o: &RunOutcome) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(if o.stderr.is_empty() {
        &o.stderr_tail
    } else {
        &o.stderr
    })
}

/// Network refusals of one run: the proxy's denials (one per host, port
/// and reason), and, from the command's stderr, lookups and sockets that
/// failed because the network is disabled or the net class refused them.
pub fn network_denials(policy: &Policy, requests: &[Value], o: &RunOutcome) -> Vec<Denial> {
    let mut out: Vec<Denial> = Vec::new();
    for r in requests.iter().filter(|r| r["decision"] == "deny") {
        let Some(reason) = r["reason"].as_str().and_then(net_reason) else {
            continue;
        };
        let host = r["host"].as_str().unwrap_or("");
        let port = r["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(0);
        let entry = Denial {
            operation: "connect".into(),
            host: Some(host.to_string()),
            port: Some(port),
            reason: reason.as_str().into(),
            detail: moat_proxy::refusal_hint(host, port, reason),
            ..Denial::default()
        };
        if !out
            .iter()
            .any(|d| d.host == entry.host && d.port == entry.port && d.reason == entry.reason)
        {
            out.push(entry);
        }
    }
    if !policy.level.is_sandboxed() {
        return out;
    }
    let text = stderr_text(o);
    let class = policy
        .net_class
        .filter(|c| *c != moat_policy::NetClass::Unconfined);
    for f in moat_audit::parse_network_failures(&text) {
        let (reason, detail) = match policy.network.mode {
            NetworkMode::Disabled => ("network_disabled", disabled_hint(f.host.as_deref())),
            NetworkMode::Proxy if f.kind == "socket_refused" => (
                "net_class",
                format!(
                    "a socket was refused (EPERM) by a network class: this run's is {}, and profiled tools inside keep their own (`moat profile show TOOL`)",
                    class.map(|c| c.as_str()).unwrap_or("unconfined")
                ),
            ),
            _ => continue,
        };
        out.push(Denial {
            operation: "connect".into(),
            host: f.host,
            reason: reason.into(),
            detail,
            line: Some(f.line),
            ..Denial::default()
        });
    }
    out
}

/// The refusals of a run, explained: swept write-protected paths, and what
/// the command's stderr says was refused, attributed to the plan. `outer`
/// is a nested run's outer view: then only what that view shows is looked
/// up on the host, since the explanations go back into the outer sandbox
/// and must not tell it what exists outside its view.
pub fn denials(plan: &Plan, o: &RunOutcome, outer: Option<&moat_linux::view::View>) -> Vec<Denial> {
    let host_exists =
        |p: &std::path::Path| outer.is_none_or(|v| v.shows_host(p)) && p.symlink_metadata().is_ok();
    let mut out = Vec::new();
    for s in &o.swept {
        let fate = match &s.moved_to {
            Some(to) => format!("moved to {}", to.display()),
            None => "deleted".to_string(),
        };
        out.push(Denial {
            operation: "create".into(),
            path: Some(s.path.to_string_lossy().into_owned()),
            reason: DenyReason::WriteProtected.code().into(),
            detail: format!("{}; {fate}", s.detail),
            ..Denial::default()
        });
    }
    let text = stderr_text(o);
    for d in moat_audit::parse_denials(&text) {
        let Some(path) = d.path.as_deref() else {
            continue;
        };
        if d.errno == "EACCES" && kernel_refused(plan, path) {
            continue;
        }
        if let Some(reason) = explain(plan, path, d.errno, host_exists) {
            out.push(Denial::explained(
                d.op,
                &moat_linux::explain::absolute(&plan.cwd, path),
                d.errno,
                reason,
                plan.level,
            ));
        } else if setid_refused(plan, &d, host_exists) {
            out.push(Denial::explained(
                "chmod",
                &moat_linux::explain::absolute(&plan.cwd, path),
                d.errno,
                moat_linux::explain::DenyReason::SetidMode,
                plan.level,
            ));
        }
    }
    // Paths outside the view read as missing: at workspace-contained most
    // of the host, at every level the host's /tmp (the sandbox has its own).
    if plan.sandboxed {
        for line in text
            .lines()
            .filter(|l| l.contains("No such file or directory"))
            .take(64)
        {
            let Some(path) = quoted_or_prefixed_path(line) else {
                continue;
            };
            if let Some(reason) = explain(plan, &path, "ENOENT", host_exists) {
                let abs = moat_linux::explain::absolute(&plan.cwd, &path);
                let shown = abs.to_string_lossy().into_owned();
                if out
                    .iter()
                    .any(|d| d.path.as_deref() == Some(shown.as_str()))
                {
                    continue;
                }
                let mut denial = Denial::explained("access", &abs, "ENOENT", reason, plan.level);
                if abs.starts_with("/tmp") {
                    denial.detail = format!(
                        "the sandbox's /tmp is its own, the host's is not shown; add --ro {} to show it",
                        abs.display()
                    );
                }
                out.push(denial);
            }
        }
    }
    out
}

/// Whether `d` is the seccomp floor's set-id refusal: EPERM on a mode
/// change (chmod's "changing permissions of", cp's "preserving permissions
/// for", tar's "Cannot change mode") of a file the caller
/// owns, where nothing else refuses the owner a chmod (a file of another
/// user's gets EPERM from the kernel for any mode, and is not explained).
fn setid_refused(
    plan: &Plan,
    d: &moat_audit::Denial,
    host_exists: impl Fn(&std::path::Path) -> bool,
) -> bool {
    use std::os::unix::fs::MetadataExt;
    if d.errno != "EPERM" || !plan.sandboxed || !plan.seccomp.deny_setid {
        return false;
    }
    let l = d.line.to_ascii_lowercase();
    let mode_change = ["permissions", "change mode", "chmod", "fchmod", "set mode"]
        .iter()
        .any(|w| l.contains(w));
    let Some(path) = d.path.as_deref() else {
        return false;
    };
    let abs = moat_linux::explain::absolute(&plan.cwd, path);
    mode_change
        && host_exists(&abs)
        && abs
            .symlink_metadata()
            .is_ok_and(|m| m.uid() == plan.uid && !m.file_type().is_symlink())
}

/// Whether the host path the view shows at `path` (relative to the run's
/// cwd) is refused to the caller by the kernel itself (another user's
/// 0600 file, /etc/shadow): then EACCES is the host's answer, which no
/// grant changes, not moat's. A stand-in's refusal is always moat's.
fn kernel_refused(plan: &Plan, path: &str) -> bool {
    let abs = moat_linux::explain::absolute(&plan.cwd, path);
    let host = match plan.view.mode_at(&abs) {
        Some(x) if x.mode == moat_linux::view::Mode::Hidden => return false,
        Some(x) => match (&x.host, abs.strip_prefix(&x.path)) {
            (Some(h), Ok(rest)) if rest.as_os_str().is_empty() => h.clone(),
            (Some(h), Ok(rest)) => h.join(rest),
            _ => return false,
        },
        None => abs,
    };
    moat_linux::probe::kernel_refuses_user(&host)
}

/// `cat: /a/b: No such file…` or `ls: cannot access '/a/b': No such…`.
fn quoted_or_prefixed_path(line: &str) -> Option<String> {
    if let Some(start) = line.find(['\'', '"', '‘']) {
        let rest = &line[start + line[start..].chars().next()?.len_utf8()..];
        if let Some(end) = rest.find(['\'', '"', '’']) {
            return Some(rest[..end].to_string());
        }
    }
    let mut parts = line.split(": ");
    let _prog = parts.next()?;
    let candidate = parts.next()?;
    (candidate.contains('/') || candidate.starts_with('.')).then(|| candidate.to_string())
}
