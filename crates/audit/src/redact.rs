//! Redaction of secrets in argv and URLs before anything reaches the log or
//! the event stream.
//!
//! Redaction is parsing, not pattern-matching: an argument is read as what
//! it is — an option and its value (`--password=V`, `--password V`, `-pV`,
//! `-u user:V`, `-uuser:V`), a header (`Name: V`), a URL (userinfo, query
//! `key=V`, path segments that carry a token: [`url_path_secrets`]), a
//! `NAME=V` assignment, a JSON member (`"name": V`) or a shell
//! command line made of such words — and every one of those forms looks its
//! name up in ONE table, [`SECRET_NAMES`] (plus the name parts and suffixes
//! next to it). Adding a name there covers it in every form. Words shaped
//! like well-known tokens (`ghp_…`, `sk-…`, `AKIA…`) are hidden wherever
//! they appear. The value becomes `***`; the name stays.
//!
//! Names are compared lowercased with `_` read as `-` (`ACCESS_TOKEN`,
//! `access-token` and `Access_Token` are one name). Option names starting
//! with `no-` or ending in `-stdin`/`-file` take no secret (the value says
//! where the secret is). Short options are only secret for the programs
//! that use them so ([`SHORT_SECRET_OPTIONS`]): `-p` is a port for ssh, a
//! password for `mysql -pPW` (attached only: `mysql -p db` prompts) and
//! `sshpass -p PW`. Each rule also applies inside a longer string
//! (`sh -c "…"`), where a value ends at whitespace, a quote or a separator;
//! a whole argument of the form `NAME=VALUE` hides everything after the
//! `=`, spaces included. Redaction errs toward hiding too much. The corpus
//! in `tests/redact_corpus.txt` pins every form and the arguments that must
//! pass unchanged.

use moat_policy::is_secret_env_name;

/// What a hidden value is replaced with.
pub const REDACTED: &str = "***";

/// Where a name is read: an option (`--name=V`, `--name V`), a header
/// (`Name: V`), or a key (`?name=V`, `name=V,…`, `NAME=V`, `"name": V`).
const OPT: u8 = 1;
const HDR: u8 = 2;
const KEY: u8 = 4;
const ALL: u8 = OPT | HDR | KEY;

/// THE table of secret-bearing names (normalised: lowercase, `-` for `_`),
/// with the forms in which each carries a secret. Names containing one of
/// [`SECRET_NAME_PARTS`] or ending in one of [`SECRET_NAME_SUFFIXES`] are
/// secret in every form without being listed.
pub const SECRET_NAMES: &[(&str, u8)] = &[
    ("authorization", HDR | KEY),
    ("proxy-authorization", HDR | KEY),
    ("cookie", ALL),
    ("set-cookie", HDR | KEY),
    ("auth", ALL),
    ("proxy-auth", OPT | HDR),
    ("pass", OPT | KEY),
    ("passin", OPT),
    ("passout", OPT),
    ("key", KEY),
    ("sig", KEY),
    ("signature", KEY),
    ("code", KEY),
    ("session", KEY),
    ("sessionid", KEY),
    ("session-id", KEY),
    ("jwt", KEY),
    ("x-api-key", ALL),
    ("private-token", ALL),
];

/// Substrings that make a name secret in every form.
const SECRET_NAME_PARTS: &[&str] = &[
    "token",
    "secret",
    "password",
    "passwd",
    "apikey",
    "api-key",
    "credential",
    "passphrase",
    "private-key",
];

/// Endings that make a name secret in every form (`X-Goog-Signature`,
/// `X-Amz-Credential`, `Proxy-Authorization`, `MY_COOKIE`, `X-Vault-Auth`).
const SECRET_NAME_SUFFIXES: &[&str] = &[
    "-authorization",
    "-auth",
    "-cookie",
    "-signature",
    "-credential",
];

/// Options whose value is `user:password`: only what follows the first
/// colon is hidden (`--user a:PW`, `--user=a:PW`, `-u a:PW`, `-ua:PW`).
const USERPASS_LONG: &[&str] = &["user", "proxy-user"];
const USERPASS_SHORT: &[u8] = b"uU";

/// A short option that takes a secret, for the programs that use it so.
struct ShortOption {
    flag: u8,
    programs: &'static [&'static str],
    /// Only `-pSECRET` (the separate form means something else).
    attached_only: bool,
}

const MYSQL_CLIENTS: &[&str] = &[
    "mysql",
    "mysqldump",
    "mysqladmin",
    "mysqlimport",
    "mysqlshow",
    "mysqlcheck",
    "mysqlpump",
    "mysqlslap",
    "mariadb",
    "mariadb-dump",
    "mariadb-admin",
];

/// Short options whose value is a secret (see [`ShortOption`]).
const SHORT_SECRET_OPTIONS: &[ShortOption] = &[
    ShortOption {
        flag: b'p',
        programs: MYSQL_CLIENTS,
        attached_only: true,
    },
    ShortOption {
        flag: b'p',
        programs: &["sshpass"],
        attached_only: false,
    },
    ShortOption {
        flag: b'a',
        programs: &["redis-cli"],
        attached_only: false,
    },
    ShortOption {
        flag: b'b',
        programs: &["curl"],
        attached_only: false,
    },
];

/// Longest quoted JSON key looked back for before a `:`.
const MAX_JSON_KEY: usize = 128;

/// `name` lowercased with `_` as `-`.
fn normalise(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '_' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// Whether `name` carries a secret when read in `form` (OPT, HDR or KEY).
fn is_secret_name(name: &str, form: u8) -> bool {
    let n = normalise(name);
    if n.is_empty() {
        return false;
    }
    if form == OPT && (n.starts_with("no-") || n.ends_with("-stdin") || n.ends_with("-file")) {
        return false;
    }
    SECRET_NAMES
        .iter()
        .any(|(known, forms)| *known == n && forms & form != 0)
        || SECRET_NAME_PARTS.iter().any(|p| n.contains(p))
        || SECRET_NAME_SUFFIXES.iter().any(|s| n.ends_with(s))
        || (form == KEY && is_secret_env_name(name))
}

/// Redacts one argument (or any string: a URL, a header, a shell command
/// line).
pub fn redact_arg(arg: &str) -> String {
    let mut ranges = string_ranges(arg);
    if arg.bytes().any(|b| b.is_ascii_whitespace()) {
        // A command line: its words are an argv of their own.
        let words = shell_words(arg);
        let texts: Vec<&str> = words.iter().map(|&(a, b)| &arg[a..b]).collect();
        walk_argv(&texts, |i, (a, b)| {
            let base = words[i].0;
            ranges.push((base + a, base + b));
        });
    }
    apply(arg, ranges)
}

/// What one string hides on its own, wherever it stands.
fn string_ranges(arg: &str) -> Vec<Range> {
    let mut ranges = Vec::new();
    url_userinfo(arg, &mut ranges);
    url_path_secrets(arg, &mut ranges);
    header_values(arg, &mut ranges);
    key_values(arg, &mut ranges);
    known_token_shapes(arg, &mut ranges);
    bare_userinfo(arg, &mut ranges);
    ranges
}

/// The words of a command line, each without the quotes around it:
/// (start, end) byte offsets.
fn shell_words(s: &str) -> Vec<Range> {
    let b = s.as_bytes();
    let mut words = Vec::new();
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let start = i;
        // A quoted word runs to its closing quote, spaces included (the
        // value of `--token 'a b'`); when it holds a command line of its
        // own (`sh -c "mysql -pPW"`), its words follow it.
        if let Some(&q @ (b'\'' | b'"')) = b.get(i) {
            if let Some(close) = b[i + 1..].iter().position(|&c| c == q) {
                let (a, e) = (i + 1, i + 1 + close);
                words.push((a, e));
                if b[a..e].iter().any(|c| c.is_ascii_whitespace()) {
                    words.extend(
                        shell_words(&s[a..e])
                            .into_iter()
                            .map(|(x, y)| (a + x, a + y)),
                    );
                }
                i = e + 1;
                continue;
            }
        }
        while i < b.len() && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        if start < i {
            let (mut a, mut e) = (start, i);
            while a < e && matches!(b[a], b'\'' | b'"') {
                a += 1;
            }
            while e > a && matches!(b[e - 1], b'\'' | b'"' | b';') {
                e -= 1;
            }
            words.push((a, e));
        }
    }
    words
}

/// `user:pass@host` without a scheme: the password part.
fn bare_userinfo(s: &str, ranges: &mut Vec<Range>) {
    for (at, _) in s.match_indices('@') {
        let start = s[..at]
            .rfind(|c: char| c.is_whitespace() || c == '/' || c == '\'' || c == '"')
            .map(|i| i + 1)
            .unwrap_or(0);
        if let Some(colon) = s[start..at].find(':') {
            let pw_start = start + colon + 1;
            if pw_start < at {
                ranges.push((pw_start, at));
            }
        }
    }
}

/// Prefixes of well-known credential formats (GitHub, GitLab, Slack,
/// Anthropic/OpenAI, AWS access keys, Stripe, Google API keys).
const TOKEN_PREFIXES: &[&str] = &[
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxs-",
    "sk-ant-",
    "sk-proj-",
    "sk-",
    "AKIA",
    "ASIA",
    "sk_live_",
    "rk_live_",
    "AIza",
];

/// Whole words that look like a known token format: a listed prefix
/// followed by at least 12 token characters.
fn known_token_shapes(s: &str, ranges: &mut Vec<Range>) {
    let bytes = s.as_bytes();
    let is_tok = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    let mut i = 0;
    while i < bytes.len() {
        if !is_tok(bytes[i]) || (i > 0 && is_tok(bytes[i - 1])) {
            i += 1;
            continue;
        }
        let mut end = i;
        while end < bytes.len() && is_tok(bytes[end]) {
            end += 1;
        }
        let word = &s[i..end];
        if TOKEN_PREFIXES
            .iter()
            .any(|p| word.starts_with(p) && word.len() >= p.len() + 12)
        {
            ranges.push((i, end));
        }
        i = end;
    }
}

/// Redacts a whole argv: each argument as [`redact_arg`], plus the values
/// options take in the next argument or attached (see [`walk_argv`]).
pub fn redact_argv(argv: &[String]) -> Vec<String> {
    let texts: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut extra: Vec<Vec<Range>> = vec![Vec::new(); argv.len()];
    walk_argv(&texts, |i, r| extra[i].push(r));
    argv.iter()
        .zip(extra)
        .map(|(arg, more)| {
            if more.is_empty() {
                redact_arg(arg)
            } else {
                // Ranges are in the argument's own bytes; redact it whole.
                let mut ranges = string_ranges(arg);
                ranges.extend(more);
                let partly = apply(arg, ranges);
                if arg.bytes().any(|b| b.is_ascii_whitespace()) {
                    redact_arg(&partly)
                } else {
                    partly
                }
            }
        })
        .collect()
}

/// `-x` or `--xx`, not `-` alone, `--` or a negative number.
fn is_option_word(w: &str) -> bool {
    w.len() > 1
        && w.starts_with('-')
        && w != "--"
        && !w[1..].starts_with(|c: char| c.is_ascii_digit())
}

/// Walks an argv (or a command line's words) and reports, per word index,
/// the byte range of that word holding a secret an option gave it:
/// - after `--name` (a secret option) the next word, whole;
/// - after `--user`/`-u`/`-U`, or attached (`-ua:PW`), what follows the
///   first colon;
/// - the short options of [`SHORT_SECRET_OPTIONS`], attached (`-pPW`) or as
///   the next word, once their program appeared earlier in the argv.
fn walk_argv(words: &[&str], mut hide: impl FnMut(usize, Range)) {
    let mut programs: Vec<&str> = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let short_secret = |flag: u8, attached: bool| {
            SHORT_SECRET_OPTIONS.iter().any(|o| {
                o.flag == flag
                    && (attached || !o.attached_only)
                    && o.programs.iter().any(|p| programs.contains(p))
            })
        };
        if let Some(prev) = i.checked_sub(1).map(|j| words[j]) {
            let value_ok = !is_option_word(w) && !w.is_empty();
            // `--name`, and Go-style `-name` (longer than one letter).
            let long = prev
                .strip_prefix("--")
                .or_else(|| prev.strip_prefix('-').filter(|n| n.len() > 1))
                .filter(|n| !n.contains('=') && !n.starts_with('-'));
            if let Some(name) = long {
                if value_ok && is_secret_name(name, OPT) {
                    hide(i, (0, w.len()));
                } else if USERPASS_LONG.contains(&normalise(name).as_str()) {
                    if let Some(c) = w.find(':') {
                        hide(i, (c + 1, w.len()));
                    }
                }
            } else if let [b'-', flag] = prev.as_bytes() {
                if USERPASS_SHORT.contains(flag) {
                    if let Some(c) = w.find(':') {
                        hide(i, (c + 1, w.len()));
                    }
                } else if value_ok && short_secret(*flag, false) {
                    hide(i, (0, w.len()));
                }
            }
        }
        // Attached short values: `-pPW`, `-ua:PW`.
        if let [b'-', flag, rest @ ..] = w.as_bytes() {
            if *flag != b'-' && !rest.is_empty() {
                if USERPASS_SHORT.contains(flag) {
                    if let Some(c) = w.find(':') {
                        hide(i, (c + 1, w.len()));
                    }
                } else if short_secret(*flag, true) {
                    hide(i, (2, w.len()));
                }
            }
        }
        programs.push(w.rsplit('/').next().unwrap_or(w));
    }
}

/// A byte range of `s` to replace with [`REDACTED`].
type Range = (usize, usize);

fn apply(s: &str, mut ranges: Vec<Range>) -> String {
    ranges.retain(|(a, b)| a < b);
    if ranges.is_empty() {
        return s.to_owned();
    }
    ranges.sort_unstable();
    let mut out = String::with_capacity(s.len());
    let mut pos = 0;
    let mut iter = ranges.into_iter().peekable();
    while let Some((start, mut end)) = iter.next() {
        while let Some(&(next_start, next_end)) = iter.peek() {
            if next_start > end {
                break;
            }
            end = end.max(next_end);
            iter.next();
        }
        let start = start.max(pos);
        // Ranges start and end next to ASCII delimiters or at the ends of
        // `s`, so they are char boundaries; `get` keeps that a non-panicking
        // assumption.
        if let (Some(before), true) = (s.get(pos..start), s.is_char_boundary(end)) {
            out.push_str(before);
            out.push_str(REDACTED);
            pos = end;
        }
    }
    out.push_str(s.get(pos..).unwrap_or(""));
    out
}

fn is_value_end(b: u8) -> bool {
    b.is_ascii_whitespace()
        || matches!(
            b,
            b'&' | b'#' | b';' | b'\'' | b'"' | b'`' | b'|' | b')' | b',' | b'<' | b'>'
        )
}

fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
}

/// `user:pw@` in every `scheme://user:pw@host`.
fn url_userinfo(s: &str, ranges: &mut Vec<Range>) {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(off) = s[from..].find("://") {
        let sep = from + off;
        from = sep + 3;
        let scheme_ok = sep > 0 && b[sep - 1].is_ascii_alphanumeric();
        if !scheme_ok {
            continue;
        }
        let start = sep + 3;
        let end = b[start..]
            .iter()
            .position(|&c| {
                matches!(c, b'/' | b'?' | b'#' | b'\'' | b'"' | b'`') || c.is_ascii_whitespace()
            })
            .map_or(b.len(), |p| start + p);
        if let Some(at) = b[start..end].iter().rposition(|&c| c == b'@') {
            ranges.push((start, start + at));
        }
    }
}

/// Hosts whose whole path (after its first segment) is a webhook's secret
/// (`https://hooks.slack.com/services/T…/B…/SECRET`).
const WEBHOOK_HOST_PREFIX: &str = "hooks.";

/// Path segments after which every segment is a webhook's secret, but an
/// all-digit id (`/api/webhooks/ID/TOKEN`, Mattermost's `/hooks/KEY`).
const WEBHOOK_SEGMENTS: &[&str] = &["hooks", "webhooks", "webhook"];

/// Secrets carried in a URL's path (`scheme://host/path`, not `file:`),
/// segment by segment. A segment is hidden when:
/// - the segment before it names a secret and it does not itself
///   (`/token/V`, `/api-key/V`, npm's `/-/npm/v1/tokens/token/V`:
///   [`is_path_secret_name`]);
/// - it follows a webhook segment (`/webhooks/`, `/hooks/`) or lies in a
///   `hooks.*` host's path past its first segment, and is not all digits
///   (Discord's and Slack's webhook URLs are the credential);
/// - it looks generated ([`looks_generated`]: Telegram's
///   `/bot123456:AAH…/`, a Gemfury `/TOKEN/` path, a signed link's key).
///
/// Errs toward hiding (an odd repository name may go); query strings and
/// userinfo are handled by their own rules.
fn url_path_secrets(s: &str, ranges: &mut Vec<Range>) {
    let b = s.as_bytes();
    let ends_part =
        |c: u8| matches!(c, b'\'' | b'"' | b'`' | b'<' | b'>') || c.is_ascii_whitespace();
    let mut from = 0;
    while let Some(off) = s[from..].find("://") {
        let sep = from + off;
        from = sep + 3;
        let scheme_start = b[..sep]
            .iter()
            .rposition(|&c| !(c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.')))
            .map_or(0, |p| p + 1);
        let scheme = &s[scheme_start..sep];
        if scheme.is_empty() || scheme.eq_ignore_ascii_case("file") {
            continue;
        }
        let start = sep + 3;
        let authority_end = b[start..]
            .iter()
            .position(|&c| matches!(c, b'/' | b'?' | b'#') || ends_part(c))
            .map_or(b.len(), |p| start + p);
        if b.get(authority_end) != Some(&b'/') {
            continue;
        }
        let authority = &s[start..authority_end];
        let host = authority.rsplit('@').next().unwrap_or(authority);
        let hook_host = host.len() > WEBHOOK_HOST_PREFIX.len()
            && host[..WEBHOOK_HOST_PREFIX.len()].eq_ignore_ascii_case(WEBHOOK_HOST_PREFIX);
        let path_end = b[authority_end..]
            .iter()
            .position(|&c| matches!(c, b'?' | b'#') || ends_part(c))
            .map_or(b.len(), |p| authority_end + p);
        let mut after_name = false;
        let mut after_hook = false;
        let mut seg_start = authority_end + 1;
        let mut index = 0;
        while seg_start <= path_end {
            let seg_end = b[seg_start..path_end]
                .iter()
                .position(|&c| c == b'/')
                .map_or(path_end, |p| seg_start + p);
            let seg = &s[seg_start..seg_end];
            if !seg.is_empty() {
                let hook = (after_hook || (hook_host && index > 0))
                    && !seg.bytes().all(|c| c.is_ascii_digit());
                let named = after_name && !is_path_secret_name(seg);
                if named || hook || looks_generated(seg) {
                    ranges.push((seg_start, seg_end));
                }
                after_name = is_path_secret_name(seg);
                after_hook |= WEBHOOK_SEGMENTS.contains(&normalise(seg).as_str());
                index += 1;
            }
            seg_start = seg_end + 1;
        }
        from = path_end.max(from);
    }
}

/// A path segment that names a secret, so the next one is its value: a
/// name with a secret part or ending (`token`, `tokens`, `api-key`,
/// `client-secret`, `password`), or `key`, `auth`, `jwt`. Not the short
/// key-form names (`code`, `session`, `sig`): as a path they are a place.
fn is_path_secret_name(seg: &str) -> bool {
    if seg.len() > 64 || !seg.bytes().all(is_key_byte) {
        return false;
    }
    let n = normalise(seg);
    SECRET_NAME_PARTS.iter().any(|p| n.contains(p))
        || SECRET_NAME_SUFFIXES.iter().any(|x| n.ends_with(x))
        || matches!(n.as_str(), "key" | "keys" | "auth" | "jwt")
}

/// A path segment shaped like a generated credential: only token
/// characters (letters, digits, `_`, `-`, `:`), and either at least 20 of
/// them mixing upper case, lower case and at least 3 digits (base62/64
/// keys), or at least 24 letters and digits of one case with a letter
/// past `f` (base36 keys; a hex digest, a commit id or a UUID stays). A
/// name with a dot (`pkg-1.2.3.tgz`) is never one.
fn looks_generated(seg: &str) -> bool {
    let b = seg.as_bytes();
    if b.len() < 20
        || !b
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b':'))
    {
        return false;
    }
    let upper = b.iter().any(u8::is_ascii_uppercase);
    let lower = b.iter().any(u8::is_ascii_lowercase);
    let digits = b.iter().filter(|c| c.is_ascii_digit()).count();
    if upper && lower && digits >= 3 {
        return true;
    }
    b.len() >= 24
        && !(upper && lower)
        && digits >= 3
        && b.iter().all(u8::is_ascii_alphanumeric)
        && b.iter()
            .any(|c| c.is_ascii_alphabetic() && !c.is_ascii_hexdigit())
}

/// Values of credential headers: `Authorization: Bearer x` (the rest of the
/// string, or up to the quote that opened it), and `"key": "value"` JSON
/// members with a token-like key.
fn header_values(s: &str, ranges: &mut Vec<Range>) {
    let b = s.as_bytes();
    // Colons inside a value already hidden are skipped: keeps this linear.
    let mut covered = 0;
    for (i, _) in b.iter().enumerate().filter(|(_, &c)| c == b':') {
        if i < covered || b[i + 1..].starts_with(b"//") {
            continue; // a URL scheme
        }
        let mut name_start = i;
        while name_start > 0
            && (b[name_start - 1].is_ascii_alphanumeric()
                || matches!(b[name_start - 1], b'-' | b'_'))
        {
            name_start -= 1;
        }
        let mut v = i + 1;
        while v < b.len() && b[v] == b' ' {
            v += 1;
        }
        if name_start < i {
            if !is_secret_name(&s[name_start..i], HDR) {
                continue;
            }
            // Inside a quoted segment the value ends at the closing quote;
            // otherwise at the end of the line.
            let quote = if name_start > 0 && matches!(b[name_start - 1], b'\'' | b'"') {
                Some(b[name_start - 1])
            } else {
                None
            };
            let end = match quote {
                Some(q) => b[v..]
                    .iter()
                    .position(|&c| c == q)
                    .map_or(b.len(), |p| v + p),
                None => b[v..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |p| v + p),
            };
            ranges.push((v, end));
            covered = end;
        } else if i > 0 {
            // `"key": value` (JSON): find the quoted key before the colon.
            let mut k_end = i;
            while k_end > 0 && b[k_end - 1] == b' ' {
                k_end -= 1;
            }
            if k_end == 0 || b[k_end - 1] != b'"' {
                continue;
            }
            let lookback = k_end.saturating_sub(1 + MAX_JSON_KEY);
            let Some(k_start) = b[lookback..k_end - 1]
                .iter()
                .rposition(|&c| c == b'"')
                .map(|p| lookback + p)
            else {
                continue;
            };
            // A JSON member is a key, and may be a header by name
            // (`{"Authorization": "Bearer …"}`).
            let key = &s[k_start + 1..k_end - 1];
            if !(is_secret_name(key, KEY) || is_secret_name(key, HDR)) {
                continue;
            }
            if v < b.len() && b[v] == b'"' {
                let mut e = v + 1;
                while e < b.len() && b[e] != b'"' {
                    e += if b[e] == b'\\' { 2 } else { 1 };
                }
                ranges.push((v + 1, e.min(b.len())));
                covered = e;
            } else {
                let end = b[v..]
                    .iter()
                    .position(|&c| matches!(c, b',' | b'}' | b']') || c.is_ascii_whitespace());
                covered = end.map_or(b.len(), |p| v + p);
                ranges.push((v, covered));
            }
        }
    }
}

/// `NAME=VALUE`, `--flag=VALUE`, `?key=VALUE&…` with a secret name.
fn key_values(s: &str, ranges: &mut Vec<Range>) {
    let b = s.as_bytes();
    let mut covered = 0;
    for (i, _) in b.iter().enumerate().filter(|(_, &c)| c == b'=') {
        if i < covered {
            continue; // inside a value already hidden
        }
        if b.get(i + 1) == Some(&b'=') || (i > 0 && matches!(b[i - 1], b'=' | b'!' | b'<' | b'>')) {
            continue; // a comparison, not an assignment
        }
        let mut key_start = i;
        while key_start > 0 && is_key_byte(b[key_start - 1]) {
            key_start -= 1;
        }
        let key = &s[key_start..i];
        if key.is_empty() {
            continue;
        }
        let v = i + 1;
        let secret = match key.strip_prefix('-') {
            Some(flag) => {
                let flag = flag.trim_start_matches('-');
                if USERPASS_LONG.contains(&normalise(flag).as_str()) {
                    // `--user=a:PW`: the password part only.
                    let end = b[v..]
                        .iter()
                        .position(|&c| c.is_ascii_whitespace() || matches!(c, b'\'' | b'"'))
                        .map_or(b.len(), |p| v + p);
                    if let Some(c) = b[v..end].iter().position(|&c| c == b':') {
                        ranges.push((v + c + 1, end));
                        covered = end;
                    }
                    continue;
                }
                is_secret_name(flag, OPT)
            }
            None => is_secret_name(key, KEY),
        };
        if !secret {
            continue;
        }
        let end = if let Some(&q @ (b'\'' | b'"')) = b.get(v) {
            let close = b[v + 1..]
                .iter()
                .position(|&c| c == q)
                .map_or(b.len(), |p| v + 1 + p);
            ranges.push((v + 1, close));
            covered = close;
            continue;
        } else if key_start == 0 {
            b.len() // the whole argument is one assignment: spaces may be part of the value
        } else {
            b[v..]
                .iter()
                .position(|&c| is_value_end(c))
                .map_or(b.len(), |p| v + p)
        };
        ranges.push((v, end));
        covered = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> String {
        redact_arg(s)
    }

    fn argv(a: &[&str]) -> Vec<String> {
        redact_argv(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn urls() {
        assert_eq!(
            r("https://user:pa55@github.com/x.git"),
            "https://***@github.com/x.git"
        );
        assert_eq!(r("https://ghp_abc@github.com"), "https://***@github.com");
        assert_eq!(
            r("https://api.example.com/v1?access_token=abc123&page=2#frag"),
            "https://api.example.com/v1?access_token=***&page=2#frag"
        );
        assert_eq!(
            r("https://s3.amazonaws.com/b/o?X-Amz-Credential=AK%2F1&X-Amz-Signature=deadbeef&x=1"),
            "https://s3.amazonaws.com/b/o?X-Amz-Credential=***&X-Amz-Signature=***&x=1"
        );
        assert_eq!(
            r("https://example.com/search?q=rust&page=1"),
            "https://example.com/search?q=rust&page=1"
        );
        assert_eq!(r("git@github.com:o/r.git"), "git@github.com:o/r.git");
        assert_eq!(r("?code=xyz&state=s"), "?code=***&state=s");
    }

    #[test]
    fn headers() {
        assert_eq!(r("Authorization: Bearer eyJabc.def"), "Authorization: ***");
        assert_eq!(r("authorization:Basic dXNlcjpwYXNz"), "authorization:***");
        assert_eq!(r("Cookie: sid=abc; theme=dark"), "Cookie: ***");
        assert_eq!(r("Set-Cookie: sid=abc"), "Set-Cookie: ***");
        assert_eq!(
            r("Proxy-Authorization: Basic x"),
            "Proxy-Authorization: ***"
        );
        assert_eq!(r("X-Api-Key: k1"), "X-Api-Key: ***");
        assert_eq!(r("Private-Token: glpat-1"), "Private-Token: ***");
        assert_eq!(
            r("Content-Type: application/json"),
            "Content-Type: application/json"
        );
        assert_eq!(
            r("curl -H 'Authorization: Bearer tok' https://x.dev/api"),
            "curl -H 'Authorization: ***' https://x.dev/api"
        );
        assert_eq!(
            r("--header=Authorization: token abc"),
            "--header=Authorization: ***"
        );
        assert_eq!(
            r("http.extraHeader=Authorization: Basic Zm9v"),
            "http.extraHeader=Authorization: ***"
        );
    }

    #[test]
    fn assignments_and_flags() {
        assert_eq!(r("SECRET_TOKEN=value"), "SECRET_TOKEN=***");
        assert_eq!(r("openai_api_key=sk-1"), "openai_api_key=***");
        assert_eq!(
            r("AWS_SECRET_ACCESS_KEY=a b c"),
            "AWS_SECRET_ACCESS_KEY=***"
        );
        assert_eq!(r("GITHUB_TOKEN=x"), "GITHUB_TOKEN=***");
        assert_eq!(r("MY_COOKIE=c"), "MY_COOKIE=***");
        assert_eq!(r("PATH=/usr/bin"), "PATH=/usr/bin");
        assert_eq!(r("--password=hunter2"), "--password=***");
        assert_eq!(r("--token=t"), "--token=***");
        assert_eq!(r("--client-secret=s"), "--client-secret=***");
        assert_eq!(r("--key=2"), "--key=2");
        assert_eq!(r("--author=Me <me@x>"), "--author=Me <me@x>");
        assert_eq!(
            r("username=u,password=p,uid=1000"),
            "username=u,password=***,uid=1000"
        );
        assert_eq!(r("a==b"), "a==b");
        assert_eq!(r("dGVzdA=="), "dGVzdA==");
    }

    #[test]
    fn inside_shell_strings() {
        assert_eq!(
            r("export OPENAI_API_KEY=sk-live-1; python run.py"),
            "export OPENAI_API_KEY=***; python run.py"
        );
        assert_eq!(r("X_TOKEN=\"a b\" make"), "X_TOKEN=\"***\" make");
        assert_eq!(
            r("mysql --password secret -h db"),
            "mysql --password *** -h db"
        );
        assert_eq!(r("tool --token 'a b' go"), "tool --token '***' go");
        assert_eq!(
            r("curl -d '{\"password\": \"pw1\", \"user\": \"u\"}'"),
            "curl -d '{\"password\": \"***\", \"user\": \"u\"}'"
        );
        assert_eq!(r("ls -la /tmp"), "ls -la /tmp");
    }

    #[test]
    fn argv_following_values() {
        assert_eq!(
            argv(&[
                "curl",
                "-H",
                "Authorization: Bearer abc",
                "-u",
                "me:pw",
                "https://x"
            ]),
            [
                "curl",
                "-H",
                "Authorization: ***",
                "-u",
                "me:***",
                "https://x"
            ]
        );
        assert_eq!(
            argv(&["tool", "--password", "pw", "--token", "t", "x"]),
            ["tool", "--password", "***", "--token", "***", "x"]
        );
        assert_eq!(
            argv(&["ssh", "-p", "2222", "host"]),
            ["ssh", "-p", "2222", "host"]
        );
        assert_eq!(
            argv(&["sshpass", "-p", "pw", "ssh", "h"]),
            ["sshpass", "-p", "***", "ssh", "h"]
        );
        assert_eq!(
            argv(&["git", "push", "-u", "origin", "main"]),
            ["git", "push", "-u", "origin", "main"]
        );
        assert_eq!(
            argv(&["docker", "login", "--password-stdin", "-u", "me"]),
            ["docker", "login", "--password-stdin", "-u", "me"]
        );
        assert_eq!(
            argv(&["x", "--token", "--verbose"]),
            ["x", "--token", "--verbose"]
        );
    }

    /// Inputs built to make a naive scanner quadratic; the results pin what
    /// is hidden (the test harness's own timeout is the hang guard: no
    /// wall-clock assertion here).
    #[test]
    fn long_hostile_input_is_handled() {
        let json = "{\"a\":".repeat(200_000);
        assert_eq!(r(&json), json);
        let hdrs = "token:".repeat(200_000);
        assert_eq!(r(&hdrs), "token:***");
        let kv = "password=".repeat(200_000);
        assert_eq!(r(&kv), "password=***");
        let words = "--password ".repeat(100_000);
        assert_eq!(
            r(&words),
            words,
            "a flag is not the value of the flag before it"
        );
    }

    #[test]
    fn non_ascii_is_kept_intact() {
        assert_eq!(r("héllo=wörld token=ü€ done"), "héllo=wörld token=*** done");
        assert_eq!(r("https://ü:ö@h/"), "https://***@h/");
    }
}

#[cfg(test)]
mod token_tests {
    use super::*;

    #[test]
    fn known_token_shapes_and_bare_userinfo_are_redacted() {
        for secret in [
            "ghp_ABCDEFGHIJKLMNOPQRSTUVWX",
            "sk-ant-api03-SECRETSECRETSECRET",
            "AKIAABCDEFGHIJKLMNOP",
            "glpat-abcdefghijklmnop",
        ] {
            let out = redact_arg(&format!("x {secret} y"));
            assert!(!out.contains(secret), "{out}");
        }
        assert!(!redact_arg("user:pass_R12@host").contains("pass_R12"));
        assert_eq!(
            redact_arg("plain-word and sk-short"),
            "plain-word and sk-short"
        );
        let argv: Vec<String> = ["mysql", "-u", "admin:BASICPW"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(!redact_argv(&argv).join(" ").contains("BASICPW"));
    }
}
