//! macOS Seatbelt: the View as an SBPL profile for `sandbox-exec`.
//! Default deny; exec and fork allowed; reads and writes per level from the
//! view's entries; write-protected names (also not-yet-existing ones) by
//! path rules; stand-ins become deny rules (Seatbelt refuses, it cannot show
//! an empty directory); network none, only the proxy's loopback ports, or
//! all (unmanaged). The sandbox HOME and TMPDIR are private directories the
//! launcher creates and passes as the `MOAT_HOME` / `MOAT_TMP` parameters.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use moat_linux::view::{Mode, View, Why};
use moat_policy::{
    Level, NetworkMode, Policy, WRITE_PROTECTED_GIT_PATHS, WRITE_PROTECTED_WORKSPACE_NAMES,
};

/// The launcher, by absolute path (never looked up on PATH).
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";
/// Profile parameters the launcher passes with `-D`.
pub const PARAM_HOME: &str = "MOAT_HOME";
pub const PARAM_TMP: &str = "MOAT_TMP";
/// What a contained view reads on macOS besides the view's own entries: the
/// system runtime (dyld's shared cache lives under /System and /private/var/db).
pub const MACOS_RUNTIME: &[&str] = &[
    "/System",
    "/usr",
    "/bin",
    "/sbin",
    "/Library/Apple",
    "/private/etc",
    "/private/var/db/dyld",
    "/dev",
];
/// Mach services a command needs to resolve users and names, nothing more.
pub const MACH_SERVICES: &[&str] = &[
    "com.apple.system.opendirectoryd.libinfo",
    "com.apple.system.notification_center",
    "com.apple.system.logger",
    "com.apple.trustd.agent",
];

/// A string literal in SBPL (backslash and quote escaped).
fn q(p: &Path) -> String {
    let raw = p.to_string_lossy();
    let mut out = String::with_capacity(raw.len() + 2);
    out.push('"');
    for c in raw.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A regex literal (`#"..."`) matching `p` exactly as a path prefix.
fn regex_prefix(p: &Path, tail: &str) -> String {
    let mut out = String::from("#\"^");
    for c in p.to_string_lossy().chars() {
        if "\\^$.|?*+()[]{}".contains(c) {
            out.push('\\');
        }
        if c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push_str(tail);
    out.push('"');
    out
}

/// Paths the command must not write beneath a writable entry: the view's
/// write-protected entries and swept (missing) paths, and the policy's
/// write-protected names under the workspace whether they exist or not.
fn write_protected(policy: &Policy, view: &View) -> (Vec<PathBuf>, Vec<String>) {
    let mut paths: Vec<PathBuf> = view
        .entries
        .iter()
        .filter(|x| !x.relocated && matches!(x.mode, Mode::WriteProtected))
        .map(|x| x.path.clone())
        .chain(view.swept.iter().cloned())
        .collect();
    let mut regexes = Vec::new();
    if policy.level.workspace_writable() {
        let ws = &view.workspace;
        let explicit = |p: &Path| policy.paths.iter().any(|g| g.path == p);
        // (Prefix names such as `.moat*` are the regex below.)
        for n in WRITE_PROTECTED_WORKSPACE_NAMES
            .iter()
            .filter(|n| !n.contains('*'))
        {
            let p = ws.join(n);
            if !explicit(&p) {
                paths.push(p);
            }
        }
        for n in WRITE_PROTECTED_GIT_PATHS {
            paths.push(ws.join(".git").join(n));
        }
        for n in moat_policy::WRITE_PROTECTED_VCS_PATHS {
            paths.push(ws.join(n));
        }
        regexes.push(regex_prefix(ws, "/\\.moat"));
    }
    // A git dir's and an hg/jj admin dir's config parts at any depth of
    // every writable root, as on Linux (there the sweep also finds the
    // ones the command creates; Seatbelt has no sweep, so a rule for each
    // name at every depth, existing or not).
    let mut roots: Vec<&Path> = view.writable().collect();
    if policy.level.workspace_writable() {
        roots.push(&view.workspace);
    }
    roots.sort();
    roots.dedup();
    // One inside another is covered by the outer one's rules.
    let outer: Vec<&Path> = roots
        .iter()
        .filter(|r| !roots.iter().any(|o| o != *r && r.starts_with(o)))
        .copied()
        .collect();
    let esc = |n: &str| n.replace('.', "\\.");
    for root in outer {
        let parts = WRITE_PROTECTED_GIT_PATHS
            .iter()
            .map(|n| format!(".git/{n}"))
            .chain(
                moat_policy::WRITE_PROTECTED_VCS_PATHS
                    .iter()
                    .map(|n| n.to_string()),
            );
        for part in parts {
            regexes.push(regex_prefix(root, &format!("/(.+/)?{}(/|$)", esc(&part))));
        }
    }
    paths.sort();
    paths.dedup();
    (paths, regexes)
}

/// The profile for `policy`'s view. Pure.
pub fn profile(policy: &Policy, view: &View) -> String {
    let mut o = String::new();
    let net = view.network.mode.unwrap_or(NetworkMode::Disabled);
    let _ = writeln!(o, ";; moat policy {}", policy.hash());
    let _ = writeln!(
        o,
        ";; generated by `moat export seatbelt`: --policy {} --network {net}; workspace {:?}",
        policy.level,
        // Debug form: a newline in the path must not end the comment.
        view.workspace.to_string_lossy()
    );
    let _ = writeln!(
        o,
        ";; stand-ins are deny rules here (Seatbelt refuses; it cannot show an empty directory)"
    );
    o.push_str("(version 1)\n(deny default)\n");
    o.push_str("(allow process-exec)\n(allow process-fork)\n");
    o.push_str("(allow signal (target same-sandbox))\n");
    o.push_str("(allow process-info* (target same-sandbox))\n");
    o.push_str("(allow sysctl-read)\n(allow pseudo-tty)\n(allow ipc-posix-sem)\n");
    o.push_str("(allow mach-lookup");
    for m in MACH_SERVICES {
        let _ = write!(o, "\n  (global-name \"{m}\")");
    }
    o.push_str(")\n");

    // Hidden paths, as one filter list reused by the read and write rules.
    let hidden: Vec<&Path> = view
        .entries
        .iter()
        .filter(|x| x.mode == Mode::Hidden)
        .map(|x| x.path.as_path())
        .collect();
    let not_hidden = |o: &mut String| {
        for h in &hidden {
            let _ = write!(o, "\n    (require-not (subpath {}))", q(h));
        }
    };

    // Reads.
    o.push_str(";; reads\n");
    let home = format!("(subpath (param \"{PARAM_HOME}\"))");
    let tmp = format!("(subpath (param \"{PARAM_TMP}\"))");
    let mut read_roots: Vec<String> = Vec::new();
    if policy.level == Level::WorkspaceContained {
        read_roots.extend(
            MACOS_RUNTIME
                .iter()
                .map(|p| format!("(subpath {})", q(Path::new(p)))),
        );
        for x in &view.entries {
            if x.host.is_some()
                && matches!(x.mode, Mode::Read | Mode::Write | Mode::WriteProtected)
                && !x.relocated
            {
                read_roots.push(format!("(subpath {})", q(&x.path)));
            }
        }
        // Path lookups walk every parent directory.
        o.push_str("(allow file-read-metadata)\n");
    } else {
        read_roots.push("(subpath \"/\")".into());
    }
    read_roots.push(home.clone());
    read_roots.push(tmp.clone());
    read_roots.dedup();
    o.push_str("(allow file-read*\n  (require-all\n    (require-any");
    for r in &read_roots {
        let _ = write!(o, "\n      {r}");
    }
    o.push(')');
    not_hidden(&mut o);
    o.push_str("))\n");

    // Writes.
    o.push_str(";; writes\n");
    let (protected, regexes) = write_protected(policy, view);
    let mut write_roots = vec![home, tmp];
    for w in view.writable() {
        write_roots.push(format!("(subpath {})", q(w)));
    }
    o.push_str("(allow file-write*\n  (require-all\n    (require-any");
    for r in &write_roots {
        let _ = write!(o, "\n      {r}");
    }
    o.push(')');
    for p in &protected {
        let _ = write!(o, "\n    (require-not (subpath {}))", q(p));
    }
    for r in &regexes {
        let _ = write!(o, "\n    (require-not (regex {r}))");
    }
    not_hidden(&mut o);
    o.push_str("))\n");
    o.push_str("(allow file-write-data (literal \"/dev/null\") (literal \"/dev/tty\"))\n");

    // Stand-ins: refused outright, whatever an allow above says.
    if !hidden.is_empty() {
        o.push_str(";; protected paths (stand-ins on Linux)\n(deny file-read* file-write*");
        for h in &hidden {
            let _ = write!(o, "\n  (subpath {})", q(h));
        }
        o.push_str(")\n");
    }
    // moat's own state and configuration are never writable.
    let state: Vec<&Path> = view
        .entries
        .iter()
        .filter(|x| matches!(x.why, Why::MoatConfig))
        .map(|x| x.path.as_path())
        .collect();
    if !state.is_empty() {
        o.push_str("(deny file-write*");
        for p in state {
            let _ = write!(o, "\n  (subpath {})", q(p));
        }
        o.push_str(")\n");
    }

    // Network.
    o.push_str(";; network\n");
    match net {
        NetworkMode::Disabled => o.push_str(";; none\n"),
        NetworkMode::Proxy => {
            let (http, socks) = (
                moat_linux::netns::HTTP_PROXY_ADDR,
                moat_linux::netns::SOCKS_PROXY_ADDR,
            );
            let port = |a: &str| a.rsplit(':').next().unwrap_or_default().to_string();
            let _ = writeln!(
                o,
                "(allow network-outbound\n  (remote ip \"localhost:{}\")\n  (remote ip \"localhost:{}\"))",
                port(http),
                port(socks)
            );
        }
        NetworkMode::Unmanaged => o.push_str("(allow network*)\n"),
    }
    o
}

/// What this target enforces differently from moat's Linux backend, for
/// `capabilities` and the README.
pub fn differences() -> serde_json::Value {
    serde_json::json!({
        "stand_ins": "deny: a protected path is refused (EPERM), not shown as an empty directory",
        "tmp_and_home": "private directories created by the launcher (MOAT_TMP, MOAT_HOME), not a tmpfs",
        "seccomp": "none: Seatbelt filters operations, not syscalls",
        "namespaces": "none: the process tree is the host's; no pid namespace",
        "network_proxy": "only the proxy's loopback ports are reachable; the proxy itself runs on the host",
    })
}
