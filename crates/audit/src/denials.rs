//! Post-mortem denials: refusals read back from a command's stderr
//! ("Read-only file system", "Permission denied", "Operation not permitted"),
//! with the path they name when there is one.
//!
//! This sees what the command chose to print, in the C or an English locale:
//! a refusal it swallowed, or printed translated, is not caught.

/// At most this many denials are returned.
pub const MAX_DENIALS: usize = 64;
/// Longest stderr line kept in a [`Denial`] (bytes, cut at a char boundary).
const MAX_LINE: usize = 512;
/// Longest prefix of a stderr line that is parsed.
const MAX_SCAN: usize = 8192;
/// Longest path kept.
const MAX_PATH: usize = 4096;

/// One refusal reported by the command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// The path the message names, as printed (may be relative).
    pub path: Option<String>,
    /// `"EROFS"`, `"EACCES"` or `"EPERM"`.
    pub errno: &'static str,
    /// What the command tried, guessed from the wording: `"write"`, `"read"`,
    /// `"execute"` or `"access"` when it cannot be told.
    pub op: &'static str,
    /// The stderr line (trimmed, at most 512 bytes).
    pub line: String,
}

/// Message fragments (lowercase) and the errno each stands for. Earlier
/// entries win when a line holds several.
const MARKERS: &[(&str, &str)] = &[
    ("read-only file system", "EROFS"),
    ("[errno 30]", "EROFS"),
    ("erofs", "EROFS"),
    ("permission denied", "EACCES"),
    ("[errno 13]", "EACCES"),
    ("eacces", "EACCES"),
    ("operation not permitted", "EPERM"),
    ("[errno 1]", "EPERM"),
    ("eperm", "EPERM"),
];

const WRITE_WORDS: &[&str] = &[
    "cannot touch",
    "cannot create",
    "can't create",
    "cannot remove",
    "cannot move",
    "cannot make",
    "cannot write",
    "can't write",
    "could not lock",
    "could not create",
    "unable to create",
    "unable to write",
    "failed to write",
    "failed to create",
    "cannot overwrite",
    "cannot change",
    "cannot set",
    "mkdir",
    "unlink",
    "rename",
];
const READ_WORDS: &[&str] = &[
    "cannot open directory",
    "cannot access",
    "cannot read",
    "can't read",
    "cannot open",
    "can't open",
    "could not open",
    "failed to open",
    "unable to open",
    "opendir",
    "cannot stat",
    ", open '",
    ", scandir '",
    "open /",
];
const EXEC_WORDS: &[&str] = &["cannot execute", "can't execute", "exec", "cannot run"];

/// Denials in `stderr`, in order of appearance, at most [`MAX_DENIALS`],
/// one per (path, errno).
pub fn parse_denials(stderr: &str) -> Vec<Denial> {
    let mut out: Vec<Denial> = Vec::new();
    for raw in stderr.lines() {
        if out.len() >= MAX_DENIALS {
            break;
        }
        // Only the start of a very long line is looked at (bounded work).
        let line = truncate(raw.trim(), MAX_SCAN);
        let lower = line.to_ascii_lowercase();
        let Some((errno, at)) = classify(&lower) else {
            continue;
        };
        let path = extract_path(line, at);
        if out.iter().any(|d| d.errno == errno && d.path == path) {
            continue;
        }
        let op = if errno == "EROFS" || WRITE_WORDS.iter().any(|w| lower.contains(w)) {
            "write"
        } else if EXEC_WORDS.iter().any(|w| lower.contains(w)) {
            "execute"
        } else if READ_WORDS.iter().any(|w| lower.contains(w)) {
            "read"
        } else {
            "access"
        };
        out.push(Denial {
            path,
            errno,
            op,
            line: truncate(line, MAX_LINE).to_owned(),
        });
    }
    if let Some(d) = local_push_refused(stderr) {
        if out.len() < MAX_DENIALS && !out.iter().any(|o| o.path == d.path) {
            out.push(d);
        }
    }
    out
}

/// `git push` to a repository on this machine that the sandbox shows
/// read-only: the receiving side prints no errno and no path ("remote
/// unpack failed: unable to create temporary object directory"); the
/// repository is the `To URL` line's, a `file://` URL or a plain path.
fn local_push_refused(stderr: &str) -> Option<Denial> {
    let failed = stderr.lines().find(|l| {
        let l = l.to_ascii_lowercase();
        l.contains("remote unpack failed")
            || l.contains("unable to create temporary object directory")
    })?;
    let url = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("To "))?
        .trim();
    let path = url.strip_prefix("file://").unwrap_or(url);
    if !path.starts_with('/') || path.len() > MAX_PATH {
        return None;
    }
    Some(Denial {
        path: Some(path.to_owned()),
        errno: "EROFS",
        op: "write",
        line: truncate(failed.trim(), MAX_LINE).to_owned(),
    })
}

/// The errno a line reports, and where its first marker starts.
fn classify(lower: &str) -> Option<(&'static str, usize)> {
    let errno = MARKERS.iter().find(|(m, _)| contains_marker(lower, m))?.1;
    let at = MARKERS
        .iter()
        .filter_map(|(m, _)| find_marker(lower, m))
        .min()?;
    Some((errno, at))
}

/// Bare errno names (`eperm`) count only as whole words.
fn find_marker(lower: &str, marker: &str) -> Option<usize> {
    let whole_word = !marker.contains(' ') && !marker.starts_with('[');
    let b = lower.as_bytes();
    let mut from = 0;
    while let Some(off) = lower[from..].find(marker) {
        let start = from + off;
        let end = start + marker.len();
        let boundary = |i: Option<&u8>| i.is_none_or(|c| !c.is_ascii_alphanumeric() && *c != b'_');
        if !whole_word
            || (boundary(start.checked_sub(1).and_then(|i| b.get(i))) && boundary(b.get(end)))
        {
            return Some(start);
        }
        from = end;
    }
    None
}

fn contains_marker(lower: &str, marker: &str) -> bool {
    find_marker(lower, marker).is_some()
}

/// The path a message names: the quoted string closest before the error
/// text, else the first quoted string after it, else the `: `-separated
/// field just before it (`cat: /a/b: Permission denied`, `sh: 1: cannot
/// create /a/b: …`).
fn extract_path(line: &str, marker_at: usize) -> Option<String> {
    let quoted = quoted_strings(line);
    let before = quoted
        .iter()
        .rev()
        .find(|q| q.1 <= marker_at && !q.2.is_empty());
    let after = quoted
        .iter()
        .find(|q| q.0 >= marker_at && looks_like_path(q.2));
    if let Some(q) = before.or(after) {
        return Some(truncate(q.2, MAX_PATH).to_owned());
    }
    let head = line
        .get(..marker_at)?
        .trim_end()
        .trim_end_matches([':', ','])
        .trim_end();
    let fields: Vec<&str> = head.split(": ").collect();
    let last = fields.last()?.trim();
    // A lone first field is the program's name ("cat"), never the path.
    let bare_word_ok = fields.len() > 1;
    // "cannot create NAME" (dash): what follows the verb is the path.
    let after_verb = last
        .strip_prefix("cannot ")
        .and_then(|r| r.split_once(' '))
        .map(|(_, p)| p.trim());
    let candidate = if bare_word_ok
        && !last.contains(' ')
        && !last.is_empty()
        && !last.bytes().all(|b| b.is_ascii_digit())
    {
        Some(last)
    } else if let Some(p) = after_verb.filter(|p| !p.is_empty() && !p.contains(' ')) {
        Some(p)
    } else {
        // "cannot create .local/x" (dash): a relative path is the last
        // word when it has a slash or is a dotfile.
        last.split_whitespace()
            .rev()
            .find(|w| looks_like_path(w) || w.contains('/') || (w.starts_with('.') && w.len() > 1))
    };
    candidate.map(|p| truncate(p.trim_end_matches([':', ',']), MAX_PATH).to_owned())
}

fn looks_like_path(s: &str) -> bool {
    s.starts_with('/') || s.starts_with("./") || s.starts_with("../") || s.starts_with("~/")
}

/// Quoted strings as (start byte, end byte, content): '…', "…", `…`, `…',
/// ‘…’, “…”. An apostrophe inside a word (can't) opens nothing.
fn quoted_strings(line: &str) -> Vec<(usize, usize, &str)> {
    let mut out = Vec::new();
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        let (start, c) = chars[i];
        let closers: &[char] = match c {
            '\'' => &['\''],
            '"' => &['"'],
            '`' => &['`', '\''],
            '\u{2018}' => &['\u{2019}'],
            '\u{201c}' => &['\u{201d}'],
            _ => {
                i += 1;
                continue;
            }
        };
        let left_ok = i == 0 || !chars[i - 1].1.is_alphanumeric();
        if !left_ok {
            i += 1;
            continue;
        }
        let close = (i + 1..chars.len()).find(|&j| {
            closers.contains(&chars[j].1)
                && chars.get(j + 1).is_none_or(|(_, n)| !n.is_alphanumeric())
        });
        match close {
            Some(j) => {
                let content_start = start + c.len_utf8();
                out.push((
                    start,
                    chars[j].0 + chars[j].1.len_utf8(),
                    &line[content_start..chars[j].0],
                ));
                i = j + 1;
            }
            None => i += 1,
        }
    }
    out
}

/// A network failure the command reported: a name that did not resolve, a
/// network that is unreachable, or a socket refused with EPERM (seccomp).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetFailure {
    /// `"resolve"`, `"unreachable"` or `"socket_refused"`.
    pub kind: &'static str,
    /// The host the message names, when it names one.
    pub host: Option<String>,
    /// The stderr line (trimmed, at most 512 bytes).
    pub line: String,
}

/// Fragments (lowercase) of failed lookups and connections, and their kind.
const NET_MARKERS: &[(&str, &str)] = &[
    ("could not resolve host", "resolve"),
    ("could not resolve hostname", "resolve"),
    ("could not resolve proxy", "resolve"),
    ("temporary failure in name resolution", "resolve"),
    ("name or service not known", "resolve"),
    ("no address associated with hostname", "resolve"),
    ("getaddrinfo eai_again", "resolve"),
    ("getaddrinfo enotfound", "resolve"),
    ("failed to lookup address", "resolve"),
    ("dns error", "resolve"),
    ("network is unreachable", "unreachable"),
    ("[errno 101]", "unreachable"),
    ("enetunreach", "unreachable"),
    ("connect eperm", "socket_refused"),
    ("socket: operation not permitted", "socket_refused"),
    ("connect: operation not permitted", "socket_refused"),
    ("failed to connect", "socket_refused"),
    // Python's socket() under seccomp: no path follows (checked below).
    ("[errno 1] operation not permitted", "socket_refused"),
];

/// Network failures in `stderr`, at most [`MAX_DENIALS`], one per (kind, host).
/// `failed to connect` counts only with `operation not permitted` on the line.
pub fn parse_network_failures(stderr: &str) -> Vec<NetFailure> {
    let mut out: Vec<NetFailure> = Vec::new();
    for raw in stderr.lines() {
        if out.len() >= MAX_DENIALS {
            break;
        }
        let line = truncate(raw.trim(), MAX_SCAN);
        let lower = line.to_ascii_lowercase();
        let Some((marker, kind)) = NET_MARKERS.iter().find(|(m, _)| lower.contains(m)) else {
            continue;
        };
        if *marker == "failed to connect" && !lower.contains("operation not permitted") {
            continue;
        }
        if *marker == "[errno 1] operation not permitted"
            && !lower.ends_with("operation not permitted")
        {
            // With a path after it, it is a file refusal.
            continue;
        }
        let host = net_host(line, &lower, marker);
        if out.iter().any(|f| f.kind == *kind && f.host == host) {
            continue;
        }
        out.push(NetFailure {
            kind,
            host,
            line: truncate(line, MAX_LINE).to_owned(),
        });
    }
    out
}

/// The host a network failure names: after the marker (`Could not resolve
/// host: X`, `getaddrinfo EAI_AGAIN X`), or Python's `host='X'`.
fn net_host(line: &str, lower: &str, marker: &str) -> Option<String> {
    if let Some(at) = lower.find("host='") {
        let rest = &line[at + 6..];
        return rest
            .split('\'')
            .next()
            .filter(|h| valid_host(h))
            .map(str::to_owned);
    }
    let at = lower.find(marker)? + marker.len();
    let word = line[at..]
        .trim_start_matches([':', ' '])
        .split([' ', ',', ';', ')', '('])
        .next()?
        .trim_matches(['\'', '"', ':', '.']);
    valid_host(word).then(|| word.to_owned())
}

fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.contains('.')
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(line: &str) -> (Option<String>, &'static str, &'static str) {
        let d = parse_denials(line);
        assert_eq!(d.len(), 1, "{line:?} -> {d:?}");
        (d[0].path.clone(), d[0].errno, d[0].op)
    }

    fn p(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    #[test]
    fn git_push_to_a_read_only_local_repository() {
        let text = "error: remote unpack failed: unable to create temporary object directory\n\
                    To file:///home/u/remote.git\n ! [remote rejected] HEAD -> master (unpacker error)\n";
        let d = parse_denials(text);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            (d[0].path.clone(), d[0].errno, d[0].op),
            (p("/home/u/remote.git"), "EROFS", "write")
        );
        let plain = text.replace("file://", "");
        assert_eq!(parse_denials(&plain)[0].path, p("/home/u/remote.git"));
        // A remote over the network names no path on this machine.
        let remote = text.replace("file:///home/u/remote.git", "https://github.com/o/r");
        assert!(parse_denials(&remote).is_empty());
    }

    #[test]
    fn coreutils() {
        assert_eq!(
            one("touch: cannot touch '/x/y': Read-only file system"),
            (p("/x/y"), "EROFS", "write")
        );
        assert_eq!(
            one("cat: /a/b: Permission denied"),
            (p("/a/b"), "EACCES", "access")
        );
        assert_eq!(
            one("ls: cannot open directory '/x': Permission denied"),
            (p("/x"), "EACCES", "read")
        );
        assert_eq!(
            one("mkdir: cannot create directory \u{2018}/w/d\u{2019}: Read-only file system"),
            (p("/w/d"), "EROFS", "write")
        );
        assert_eq!(
            one("mv: cannot move 'a' to '/x/b': Permission denied"),
            (p("/x/b"), "EACCES", "write")
        );
        assert_eq!(
            one("touch: cannot touch 'notes.txt': Read-only file system"),
            (p("notes.txt"), "EROFS", "write")
        );
        assert_eq!(
            one("rm: cannot remove '/w/.git/hooks/pre-commit': Permission denied"),
            (p("/w/.git/hooks/pre-commit"), "EACCES", "write")
        );
    }

    #[test]
    fn shells() {
        assert_eq!(
            one("bash: /a/b: Operation not permitted"),
            (p("/a/b"), "EPERM", "access")
        );
        assert_eq!(
            one("bash: line 1: /home/u/.bashrc: Read-only file system"),
            (p("/home/u/.bashrc"), "EROFS", "write")
        );
        assert_eq!(
            one("sh: 1: cannot create /home/u/.profile: Read-only file system"),
            (p("/home/u/.profile"), "EROFS", "write")
        );
        assert_eq!(
            one("bash: ./run.sh: Permission denied"),
            (p("./run.sh"), "EACCES", "access")
        );
    }

    #[test]
    fn python_and_others() {
        assert_eq!(
            one("python3: can't open file '/a/b': [Errno 13] Permission denied"),
            (p("/a/b"), "EACCES", "read")
        );
        assert_eq!(
            one("PermissionError: [Errno 1] Operation not permitted"),
            (None, "EPERM", "access")
        );
        assert_eq!(
            one("PermissionError: [Errno 13] Permission denied: '/etc/moat.conf'"),
            (p("/etc/moat.conf"), "EACCES", "access")
        );
        assert_eq!(
            one("OSError: [Errno 30] Read-only file system: '/usr/x'"),
            (p("/usr/x"), "EROFS", "write")
        );
        assert_eq!(
            one("Error: EACCES: permission denied, open '/home/u/.npmrc'"),
            (p("/home/u/.npmrc"), "EACCES", "read")
        );
        assert_eq!(
            one("error: could not lock config file /w/.git/config: Permission denied"),
            (p("/w/.git/config"), "EACCES", "write")
        );
        assert_eq!(
            one("open /var/x: permission denied"),
            (p("/var/x"), "EACCES", "read")
        );
        assert_eq!(
            one("error: failed to open `/w/Cargo.lock`: Permission denied (os error 13)"),
            (p("/w/Cargo.lock"), "EACCES", "read")
        );
    }

    #[test]
    fn a_real_stderr_mixture() {
        let stderr = "\
Traceback (most recent call last):
  File \"/w/x.py\", line 1, in <module>
PermissionError: [Errno 13] Permission denied: '/home/u/.ssh/id_rsa'
touch: cannot touch '/x/y': Read-only file system
touch: cannot touch '/x/y': Read-only file system
compiling foo v0.1.0
warning: unused variable
socket: Operation not permitted
";
        let d = parse_denials(stderr);
        assert_eq!(d.len(), 3, "{d:?}");
        assert_eq!(d[0].path.as_deref(), Some("/home/u/.ssh/id_rsa"));
        assert_eq!(d[1].path.as_deref(), Some("/x/y"));
        assert_eq!(d[2].errno, "EPERM");
        assert_eq!(d[2].path, None);
        assert_eq!(
            d[1].line,
            "touch: cannot touch '/x/y': Read-only file system"
        );
    }

    #[test]
    fn no_false_positives_and_bounded() {
        assert!(parse_denials("all good\npermissions: ok\nsuperuser\nEPERMISSIVE").is_empty());
        let many: String = (0..500)
            .map(|i| format!("cat: /f{i}: Permission denied\n"))
            .collect();
        assert_eq!(parse_denials(&many).len(), MAX_DENIALS);
        let long = format!("cat: /{}: Permission denied", "é".repeat(3000));
        let d = parse_denials(&long);
        assert!(d[0].line.len() <= 512);
        // Hostile input completes (a quadratic scan would hang the suite);
        // how fast is a benchmark's question, not a test's.
        let hostile = format!("{} Permission denied", " 'x".repeat(400_000));
        assert!(parse_denials(&hostile).len() <= MAX_DENIALS);
    }
}

#[cfg(test)]
mod net_tests {
    use super::*;

    #[test]
    fn network_failures_name_their_host() {
        let text = "curl: (6) Could not resolve host: example.com\n\
            npm error request to https://registry.npmjs.org/left-pad failed, reason: getaddrinfo EAI_AGAIN registry.npmjs.org\n\
            WARNING: Retrying ... NewConnectionError('Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')': HTTPSConnectionPool(host='pypi.org', port=443)\n\
            fatal: unable to access 'https://github.com/x/y/': Could not resolve host: github.com\n\
            npm error connect EPERM 127.0.0.1:3128\n\
            PermissionError: [Errno 1] Operation not permitted: '/etc/x'\n\
            ordinary line\n";
        let f = parse_network_failures(text);
        let hosts: Vec<(&str, Option<&str>)> =
            f.iter().map(|x| (x.kind, x.host.as_deref())).collect();
        assert_eq!(
            hosts,
            [
                ("resolve", Some("example.com")),
                ("resolve", Some("registry.npmjs.org")),
                ("resolve", Some("pypi.org")),
                ("resolve", Some("github.com")),
                ("socket_refused", None),
            ]
        );
        let py = parse_network_failures("PermissionError: [Errno 1] Operation not permitted\n");
        assert_eq!(py.len(), 1);
        assert_eq!(py[0].kind, "socket_refused");
    }
}
