//! Network allow/deny patterns, presets, decisions and the address guard for `--network proxy` (pure, no I/O).
//!
//! A [`DomainPattern`] is one `--allow-domain`/`--deny-domain` entry:
//! `example.com` (that host, any port), `*.example.com` (strict subdomains,
//! not the apex), an optional `:PORT`, IPv4 literals, bracketed IPv6 literals
//! (`[::1]:8080`) and `localhost[:PORT]`. Patterns are canonicalised
//! (lowercase, no trailing dot) and serialise as that canonical string.
//!
//! [`decide`] answers "may this name be asked for" (deny wins over allow; no
//! allow entries means nothing is reachable). [`guard`] answers "may this
//! resolved address be connected to": anything that is not a public address
//! is refused unless that exact IP literal — or `localhost`, for a loopback
//! address — is itself allowed. Deny patterns that are IP literals also apply
//! to the resolved address, so `--deny-domain 10.0.0.5` cannot be bypassed
//! through a name.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Serialize, Serializer};

/// Named pattern sets, referenced as `@NAME` (e.g. `@package-registries`).
/// The first element is the name without the `@`.
pub const PRESETS: &[(&str, &[&str])] = &[(
    "package-registries",
    &[
        "crates.io:443",
        "static.crates.io:443",
        "index.crates.io:443",
        "pypi.org:443",
        "files.pythonhosted.org:443",
        "registry.npmjs.org:443",
        "github.com:443",
        "codeload.github.com:443",
        "objects.githubusercontent.com:443",
        "raw.githubusercontent.com:443",
    ],
)];

/// A pattern or preset moat refuses, with the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("invalid network pattern {pattern:?}: {why}")]
    Invalid { pattern: String, why: String },
    #[error("unknown network preset {name:?}; known presets: {known}")]
    UnknownPreset { name: String, known: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum HostPat {
    /// One exact DNS name (includes `localhost`).
    Name(String),
    /// `*.SUFFIX`: strict subdomains of SUFFIX (stored without `*.`).
    Wildcard(String),
    /// An IP literal, stored in canonical form (v4-mapped v6 becomes v4).
    Ip(IpAddr),
}

/// One allow/deny entry in canonical form. See the module docs for syntax.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DomainPattern {
    canonical: String,
    host: HostPat,
    port: Option<u16>,
}

impl PartialOrd for DomainPattern {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DomainPattern {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.canonical.cmp(&other.canonical)
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical)
    }
}

impl Serialize for DomainPattern {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.canonical)
    }
}

impl DomainPattern {
    /// Parses and canonicalises one pattern; the error names the pattern.
    pub fn parse(s: &str) -> Result<DomainPattern, PatternError> {
        let bad = |why: &str| PatternError::Invalid {
            pattern: s.to_string(),
            why: why.to_string(),
        };
        if s.is_empty() {
            return Err(bad("empty pattern"));
        }
        if !s.is_ascii() {
            return Err(bad(
                "non-ASCII names are not supported; use the punycode (xn--) form",
            ));
        }
        if s.contains("://") {
            return Err(bad(
                "a pattern is a host[:port], not a URL; drop the scheme",
            ));
        }
        if s.contains(['/', '?', '#', '@']) {
            return Err(bad(
                "a pattern is a host[:port]; paths, queries and userinfo are not allowed",
            ));
        }
        if s.chars()
            .any(|c| c.is_ascii_whitespace() || c.is_ascii_control())
        {
            return Err(bad("whitespace is not allowed"));
        }
        if s.starts_with('@') {
            return Err(bad(
                "presets (@name) are expanded by expand_presets, not parse",
            ));
        }

        let (host_part, port_part) = if let Some(rest) = s.strip_prefix('[') {
            let Some(end) = rest.find(']') else {
                return Err(bad("unterminated '[' in IPv6 literal"));
            };
            let inner = &rest[..end];
            let after = &rest[end + 1..];
            let ip: Ipv6Addr = inner
                .parse()
                .map_err(|_| bad("not a valid IPv6 address inside [...]"))?;
            let port = match after {
                "" => None,
                p => match p.strip_prefix(':') {
                    Some(p) => Some(parse_port(p).map_err(&bad)?),
                    None => return Err(bad("unexpected text after ']'")),
                },
            };
            let ip = IpAddr::V6(ip).to_canonical();
            return Ok(Self::build(HostPat::Ip(ip), port));
        } else {
            match s.matches(':').count() {
                0 => (s, None),
                1 => match s.split_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (s, None),
                },
                _ => {
                    return Err(bad(
                        "IPv6 literals must be written in brackets, e.g. [::1]:8080",
                    ))
                }
            }
        };
        let port = match port_part {
            Some(p) => Some(parse_port(p).map_err(&bad)?),
            None => None,
        };
        let lower = host_part.to_ascii_lowercase();
        let host = lower.strip_suffix('.').unwrap_or(&lower);
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        if let Ok(v4) = host.parse::<Ipv4Addr>() {
            return Ok(Self::build(HostPat::Ip(IpAddr::V4(v4)), port));
        }
        let (wild, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host),
        };
        if name.contains('*') {
            return Err(bad(if host == "*" {
                "'*' matches every host; list the hosts instead"
            } else {
                "a wildcard is only allowed as a leading '*.'"
            }));
        }
        let labels: Vec<&str> = name.split('.').collect();
        for l in &labels {
            check_label(l).map_err(&bad)?;
        }
        if name.len() > 253 {
            return Err(bad("name longer than 253 characters"));
        }
        if labels
            .last()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad("not a valid IPv4 address or domain name"));
        }
        if wild {
            if labels.len() < 2 {
                return Err(bad(
                    "'*.TLD' is too broad; name a registrable domain, e.g. *.example.com",
                ));
            }
            return Ok(Self::build(HostPat::Wildcard(name.to_string()), port));
        }
        if labels.len() < 2 && name != "localhost" {
            return Err(bad(
                "a bare TLD or single-label name is too broad (only 'localhost' is allowed)",
            ));
        }
        Ok(Self::build(HostPat::Name(name.to_string()), port))
    }

    fn build(host: HostPat, port: Option<u16>) -> DomainPattern {
        let mut canonical = match &host {
            HostPat::Name(n) => n.clone(),
            HostPat::Wildcard(n) => format!("*.{n}"),
            HostPat::Ip(IpAddr::V4(ip)) => ip.to_string(),
            HostPat::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
        };
        if let Some(p) = port {
            canonical.push_str(&format!(":{p}"));
        }
        DomainPattern {
            canonical,
            host,
            port,
        }
    }

    /// The canonical text (`*.example.com:443`, `[::1]`, `10.0.0.1:80`).
    pub fn as_str(&self) -> &str {
        &self.canonical
    }

    /// The port this pattern is limited to, if any.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    fn port_ok(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    /// Whether a requested `host` (name, IPv4 literal, or IPv6 literal with
    /// or without brackets; any case, optional trailing dot) and `port` fall
    /// under this pattern.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        if !self.port_ok(port) {
            return false;
        }
        let h = normalize_host(host);
        match &self.host {
            HostPat::Name(n) => h == *n,
            HostPat::Wildcard(suffix) => {
                h.len() > suffix.len() + 1
                    && h.ends_with(suffix.as_str())
                    && h.as_bytes()[h.len() - suffix.len() - 1] == b'.'
            }
            HostPat::Ip(ip) => parse_ip_host(&h).is_some_and(|x| x == *ip),
        }
    }

    /// Whether this pattern is exactly the IP literal `ip` (port-compatible).
    fn is_ip(&self, ip: IpAddr, port: u16) -> bool {
        matches!(self.host, HostPat::Ip(p) if p == ip.to_canonical()) && self.port_ok(port)
    }

    fn is_localhost(&self, port: u16) -> bool {
        matches!(&self.host, HostPat::Name(n) if n == "localhost") && self.port_ok(port)
    }
}

fn parse_port(p: &str) -> Result<u16, &'static str> {
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.len() > 5 {
        return Err("port must be a number from 1 to 65535");
    }
    match p.parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => u16::try_from(n).map_err(|_| "port out of range"),
        _ => Err("port must be a number from 1 to 65535"),
    }
}

fn check_label(l: &str) -> Result<(), &'static str> {
    if l.is_empty() {
        return Err("empty label (two dots in a row, or a leading dot)");
    }
    if l.len() > 63 {
        return Err("a label is longer than 63 characters");
    }
    if !l
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err("names may only contain letters, digits, '-' and '_'");
    }
    if l.starts_with('-') || l.ends_with('-') {
        return Err("a label may not start or end with '-'");
    }
    Ok(())
}

fn normalize_host(host: &str) -> String {
    let lower = host.to_ascii_lowercase();
    let h = lower.strip_suffix('.').unwrap_or(&lower);
    h.to_string()
}

fn parse_ip_host(h: &str) -> Option<IpAddr> {
    let inner = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    inner.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// Parses allow/deny arguments, expanding `@preset` entries from [`PRESETS`].
/// Order is kept; duplicates are left for [`NetRules::new`] to remove.
pub fn expand_presets(items: &[String]) -> Result<Vec<DomainPattern>, PatternError> {
    let mut out = Vec::new();
    for item in items {
        if let Some(name) = item.strip_prefix('@') {
            let Some((_, hosts)) = PRESETS.iter().find(|(n, _)| *n == name) else {
                let known: Vec<String> = PRESETS.iter().map(|(n, _)| format!("@{n}")).collect();
                return Err(PatternError::UnknownPreset {
                    name: item.clone(),
                    known: known.join(", "),
                });
            };
            for h in hosts.iter() {
                out.push(DomainPattern::parse(h)?);
            }
        } else {
            out.push(DomainPattern::parse(item)?);
        }
    }
    Ok(out)
}

/// Why the proxy refused (or could not carry) a request. The strings are
/// stable: they appear in 403 bodies, `network.requests` and the audit log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// No allow entry matches the host and port.
    NotAllowed,
    /// A deny entry matches (deny wins over allow).
    Denied,
    /// The name resolved only to loopback/private/link-local/metadata
    /// addresses that are not explicitly allowed.
    PrivateAddress,
    /// The client's request could not be understood.
    BadRequest,
    /// The host was allowed but could not be reached (DNS, connect, upstream
    /// proxy).
    UpstreamFailed,
}

impl Reason {
    pub const ALL: [Reason; 5] = [
        Reason::NotAllowed,
        Reason::Denied,
        Reason::PrivateAddress,
        Reason::BadRequest,
        Reason::UpstreamFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotAllowed => "not_allowed",
            Reason::Denied => "denied",
            Reason::PrivateAddress => "private_address",
            Reason::BadRequest => "bad_request",
            Reason::UpstreamFailed => "upstream_failed",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The allow and deny lists, sorted and deduplicated by canonical form.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NetRules {
    pub allow: Vec<DomainPattern>,
    pub deny: Vec<DomainPattern>,
}

impl NetRules {
    /// Builds rules with both lists sorted and deduplicated.
    pub fn new(mut allow: Vec<DomainPattern>, mut deny: Vec<DomainPattern>) -> NetRules {
        allow.sort();
        allow.dedup();
        deny.sort();
        deny.dedup();
        NetRules { allow, deny }
    }

    /// Parses `--allow-domain`/`--deny-domain` arguments (presets expanded).
    pub fn from_args(allow: &[String], deny: &[String]) -> Result<NetRules, PatternError> {
        Ok(NetRules::new(expand_presets(allow)?, expand_presets(deny)?))
    }
}

/// Decides whether `host:port` may be requested at all, before resolution.
/// Deny wins over allow; with no allow entries nothing is reachable.
pub fn decide(rules: &NetRules, host: &str, port: u16) -> Result<(), Reason> {
    if rules.deny.iter().any(|p| p.matches(host, port)) {
        return Err(Reason::Denied);
    }
    if rules.allow.iter().any(|p| p.matches(host, port)) {
        Ok(())
    } else {
        Err(Reason::NotAllowed)
    }
}

/// What kind of address an IP is, for the address guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AddrClass {
    /// Globally routable (or at least not one of the classes below).
    Public,
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// RFC 1918, 100.64.0.0/10 (CGNAT), fc00::/7 (ULA), and other
    /// non-global ranges: 192.0.0.0/24, 198.18.0.0/15, 240.0.0.0/4,
    /// multicast, broadcast, fec0::/10, ::/96 (IPv4-compatible).
    Private,
    /// 169.254.0.0/16, fe80::/10.
    LinkLocal,
    /// Cloud metadata endpoints: 169.254.169.254, fd00:ec2::254.
    Metadata,
    /// 0.0.0.0/8 and :: (connecting to them reaches the local host).
    Unspecified,
}

/// Classifies an address. IPv4-mapped (`::ffff:a.b.c.d`), NAT64
/// (`64:ff9b::/96`) and 6to4 (`2002::/16`) addresses are classified by the
/// IPv4 address they embed when that one is not public.
pub fn classify(ip: IpAddr) -> AddrClass {
    match ip.to_canonical() {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddrClass {
    let [a, b, c, _] = ip.octets();
    if a == 0 {
        AddrClass::Unspecified
    } else if a == 127 {
        AddrClass::Loopback
    } else if ip == Ipv4Addr::new(169, 254, 169, 254) {
        AddrClass::Metadata
    } else if a == 169 && b == 254 {
        AddrClass::LinkLocal
    } else if a == 10
        || (a == 172 && (16..=31).contains(&b))
        || (a == 192 && b == 168)
        || (a == 100 && (64..=127).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (18..=19).contains(&b))
        || a >= 224
    {
        AddrClass::Private
    } else {
        AddrClass::Public
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddrClass {
    let seg = ip.segments();
    if ip.is_unspecified() {
        return AddrClass::Unspecified;
    }
    if ip.is_loopback() {
        return AddrClass::Loopback;
    }
    if ip == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x254) {
        return AddrClass::Metadata;
    }
    let embedded = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        classify_v4(Ipv4Addr::new(a, b, c, d))
    };
    // NAT64 well-known prefix 64:ff9b::/96.
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return embedded(seg[6], seg[7]);
    }
    // 6to4 2002:AABB:CCDD::/48.
    if seg[0] == 0x2002 {
        let c = embedded(seg[1], seg[2]);
        if c != AddrClass::Public {
            return c;
        }
    }
    if seg[0] & 0xfe00 == 0xfc00 {
        AddrClass::Private
    } else if seg[0] & 0xffc0 == 0xfe80 {
        AddrClass::LinkLocal
    } else if seg[0] & 0xffc0 == 0xfec0 || seg[0] & 0xff00 == 0xff00 || seg[..6] == [0; 6] {
        AddrClass::Private
    } else {
        AddrClass::Public
    }
}

/// The address guard: may the proxy connect to `ip` (one resolution result
/// of the allowed `host`) on `port`?
///
/// - A deny entry that is the IP literal `ip` → [`Reason::Denied`].
/// - A public address → allowed.
/// - Otherwise → [`Reason::PrivateAddress`], unless the allow list contains
///   that exact IP literal (port-less or with this port), or — for a
///   loopback address — `localhost` (port-less or with this port).
///
/// `host` is the requested name; it is accepted for symmetry with
/// [`decide`] and future rules but the decision here rests on `ip`.
pub fn guard(rules: &NetRules, host: &str, ip: IpAddr, port: u16) -> Result<(), Reason> {
    let _ = host;
    let ip = ip.to_canonical();
    if rules.deny.iter().any(|p| p.is_ip(ip, port)) {
        return Err(Reason::Denied);
    }
    let class = classify(ip);
    if class == AddrClass::Public {
        return Ok(());
    }
    let explicit = rules
        .allow
        .iter()
        .any(|p| p.is_ip(ip, port) || (class == AddrClass::Loopback && p.is_localhost(port)));
    if explicit {
        Ok(())
    } else {
        Err(Reason::PrivateAddress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> DomainPattern {
        match DomainPattern::parse(s) {
            Ok(p) => p,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    fn err(s: &str) -> String {
        match DomainPattern::parse(s) {
            Ok(p) => panic!("{s} unexpectedly parsed as {p}"),
            Err(e) => e.to_string(),
        }
    }

    fn rules(allow: &[&str], deny: &[&str]) -> NetRules {
        let a: Vec<String> = allow.iter().map(|s| s.to_string()).collect();
        let d: Vec<String> = deny.iter().map(|s| s.to_string()).collect();
        match NetRules::from_args(&a, &d) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    fn ip(s: &str) -> IpAddr {
        match s.parse() {
            Ok(i) => i,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(p("Example.COM.").as_str(), "example.com");
        assert_eq!(p("*.Example.com:443").as_str(), "*.example.com:443");
        assert_eq!(
            p("registry.npmjs.org:443").as_str(),
            "registry.npmjs.org:443"
        );
        assert_eq!(p("10.0.0.1").as_str(), "10.0.0.1");
        assert_eq!(p("10.0.0.1:80").as_str(), "10.0.0.1:80");
        assert_eq!(p("[::1]:8080").as_str(), "[::1]:8080");
        assert_eq!(p("[FD00:0::1]").as_str(), "[fd00::1]");
        assert_eq!(p("[::ffff:127.0.0.1]").as_str(), "127.0.0.1");
        assert_eq!(p("localhost").as_str(), "localhost");
        assert_eq!(p("LOCALHOST:3000").as_str(), "localhost:3000");
        assert_eq!(
            p("my_host.internal.example").as_str(),
            "my_host.internal.example"
        );
        assert_eq!(p("a.b:65535").port(), Some(65535));
    }

    #[test]
    fn serialises_as_canonical_string() {
        let r = rules(
            &["b.example.com", "A.example.com:443", "a.example.com:443"],
            &["[::1]"],
        );
        let j = serde_json::to_string(&r).unwrap_or_default();
        assert_eq!(
            j,
            r#"{"allow":["a.example.com:443","b.example.com"],"deny":["[::1]"]}"#
        );
    }

    #[test]
    fn rejections_name_the_pattern() {
        for bad in [
            "",
            "*",
            "*:443",
            "*.com",
            "*.COM.",
            "com",
            "internal",
            "foo.*.com",
            "*foo.com",
            "f*o.example.com",
            "**.example.com",
            "a..b",
            ".a.b",
            "a.b:0",
            "a.b:65536",
            "a.b:",
            "a.b:x",
            "a.b:-1",
            "https://example.com",
            "example.com/path",
            "user@example.com",
            "exa mple.com",
            "::1",
            "[::1",
            "[::1]x",
            "[zz::1]",
            "[127.0.0.1]",
            "-a.example.com",
            "a-.example.com",
            "1.2.3.999",
            "1.2.3",
            "*.localhost",
            "@package-registries",
            "ex\u{e4}mple.com",
        ] {
            let e = err(bad);
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
        assert!(err("ex\u{e4}mple.com").contains("non-ASCII"));
        assert!(err("*.com").contains("too broad"));
        assert!(err("com").contains("too broad"));
        assert!(err("*").contains("every host"));
        assert!(err("a.b:0").contains("1 to 65535"));
        assert!(err("https://x.com").contains("scheme"));
        assert!(err("x.com/y").contains("path"));
        assert!(err("::1").contains("brackets"));
        assert!(err("a.b.com:70000").contains("65535"));
        assert!(err(&format!("{}.com", "a".repeat(64))).contains("63"));
        assert!(err(&format!("{}com", "abcdefghi.".repeat(26))).contains("253"));
    }

    #[test]
    fn exact_and_wildcard_matching() {
        let e = p("example.com");
        assert!(e.matches("example.com", 80));
        assert!(e.matches("EXAMPLE.com.", 443));
        assert!(!e.matches("www.example.com", 443));
        assert!(!e.matches("badexample.com", 443));
        assert!(!e.matches("example.com.evil.org", 443));

        let w = p("*.example.com");
        assert!(w.matches("a.example.com", 1));
        assert!(w.matches("a.b.example.com", 1));
        assert!(w.matches("A.Example.Com.", 1));
        assert!(!w.matches("example.com", 443));
        assert!(!w.matches(".example.com", 443));
        assert!(!w.matches("badexample.com", 443));
        assert!(!w.matches("xexample.com", 443));

        let wp = p("*.example.com:443");
        assert!(wp.matches("a.example.com", 443));
        assert!(!wp.matches("a.example.com", 80));
        let ep = p("registry.npmjs.org:443");
        assert!(ep.matches("registry.npmjs.org", 443));
        assert!(!ep.matches("registry.npmjs.org", 80));
    }

    #[test]
    fn ip_literal_matching() {
        let v4 = p("127.0.0.1:8080");
        assert!(v4.matches("127.0.0.1", 8080));
        assert!(v4.matches("[::ffff:127.0.0.1]", 8080));
        assert!(!v4.matches("127.0.0.1", 8081));
        assert!(!v4.matches("127.0.0.2", 8080));
        let v6 = p("[::1]");
        assert!(v6.matches("::1", 1));
        assert!(v6.matches("[::1]", 2));
        assert!(v6.matches("[0:0::1]", 2));
        assert!(!v6.matches("::2", 1));
        assert!(!v6.matches("localhost", 1));
        assert!(!p("localhost").matches("127.0.0.1", 1));
        assert!(p("localhost").matches("localhost.", 1));
    }

    #[test]
    fn presets_expand_exactly() {
        let v = match expand_presets(&[
            "@package-registries".to_string(),
            "x.example.com".to_string(),
        ]) {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        };
        let s: Vec<&str> = v.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            s,
            [
                "crates.io:443",
                "static.crates.io:443",
                "index.crates.io:443",
                "pypi.org:443",
                "files.pythonhosted.org:443",
                "registry.npmjs.org:443",
                "github.com:443",
                "codeload.github.com:443",
                "objects.githubusercontent.com:443",
                "raw.githubusercontent.com:443",
                "x.example.com",
            ]
        );
        let e = match expand_presets(&["@nope".to_string()]) {
            Ok(_) => panic!("unknown preset accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("@nope") && e.contains("@package-registries"),
            "{e}"
        );
    }

    #[test]
    fn reasons_are_stable() {
        let s: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            s,
            [
                "not_allowed",
                "denied",
                "private_address",
                "bad_request",
                "upstream_failed"
            ]
        );
        for r in Reason::ALL {
            assert_eq!(
                serde_json::to_string(&r).unwrap_or_default(),
                format!("\"{r}\"")
            );
        }
    }

    #[test]
    fn decide_deny_wins_and_empty_allows_nothing() {
        assert_eq!(
            decide(&rules(&[], &[]), "example.com", 443),
            Err(Reason::NotAllowed)
        );
        let r = rules(
            &["*.example.com", "example.com:443"],
            &["secret.example.com", "*.example.com:22"],
        );
        assert_eq!(decide(&r, "a.example.com", 443), Ok(()));
        assert_eq!(decide(&r, "example.com", 443), Ok(()));
        assert_eq!(decide(&r, "example.com", 80), Err(Reason::NotAllowed));
        assert_eq!(decide(&r, "secret.example.com", 443), Err(Reason::Denied));
        assert_eq!(decide(&r, "a.example.com", 22), Err(Reason::Denied));
        assert_eq!(decide(&r, "example.org", 443), Err(Reason::NotAllowed));
        let r = rules(&["@package-registries"], &["github.com"]);
        assert_eq!(decide(&r, "crates.io", 443), Ok(()));
        assert_eq!(decide(&r, "crates.io", 80), Err(Reason::NotAllowed));
        assert_eq!(decide(&r, "github.com", 443), Err(Reason::Denied));
    }

    #[test]
    fn classify_ranges() {
        use AddrClass::*;
        for (a, c) in [
            ("8.8.8.8", Public),
            ("1.1.1.1", Public),
            ("2606:4700::1111", Public),
            ("127.0.0.1", Loopback),
            ("127.5.6.7", Loopback),
            ("::1", Loopback),
            ("::ffff:127.0.0.1", Loopback),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("172.32.0.1", Public),
            ("172.15.0.1", Public),
            ("192.168.1.1", Private),
            ("100.64.0.1", Private),
            ("100.127.255.255", Private),
            ("100.128.0.1", Public),
            ("198.18.0.1", Private),
            ("224.0.0.1", Private),
            ("255.255.255.255", Private),
            ("::ffff:10.0.0.1", Private),
            ("fc00::1", Private),
            ("fd12:3456::1", Private),
            ("ff02::1", Private),
            ("::10.0.0.1", Private),
            ("169.254.1.1", LinkLocal),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("169.254.169.254", Metadata),
            ("::ffff:169.254.169.254", Metadata),
            ("fd00:ec2::254", Metadata),
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("::", Unspecified),
            ("::ffff:0.0.0.0", Unspecified),
            ("64:ff9b::7f00:1", Loopback),
            ("64:ff9b::808:808", Public),
            ("2002:a00:1::1", Private),
            ("2002:808:808::1", Public),
        ] {
            assert_eq!(classify(ip(a)), c, "{a}");
        }
    }

    #[test]
    fn guard_private_needs_explicit_literal() {
        let r = rules(&["*.example.com"], &[]);
        assert_eq!(guard(&r, "a.example.com", ip("93.184.216.34"), 443), Ok(()));
        for a in [
            "127.0.0.1",
            "::1",
            "10.0.0.1",
            "169.254.169.254",
            "fd00:ec2::254",
            "fe80::1",
            "0.0.0.0",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(
                guard(&r, "a.example.com", ip(a), 443),
                Err(Reason::PrivateAddress),
                "{a}"
            );
        }

        let r = rules(
            &["*.example.com", "10.0.0.1", "[::1]:8080", "127.0.0.1:9000"],
            &[],
        );
        assert_eq!(guard(&r, "a.example.com", ip("10.0.0.1"), 1), Ok(()));
        assert_eq!(guard(&r, "a.example.com", ip("::ffff:10.0.0.1"), 1), Ok(()));
        assert_eq!(
            guard(&r, "a.example.com", ip("10.0.0.2"), 1),
            Err(Reason::PrivateAddress)
        );
        assert_eq!(guard(&r, "a.example.com", ip("::1"), 8080), Ok(()));
        assert_eq!(
            guard(&r, "a.example.com", ip("::1"), 8081),
            Err(Reason::PrivateAddress)
        );
        assert_eq!(guard(&r, "x", ip("127.0.0.1"), 9000), Ok(()));
        assert_eq!(
            guard(&r, "x", ip("127.0.0.1"), 9001),
            Err(Reason::PrivateAddress)
        );

        // localhost[:PORT] permits loopback only.
        let r = rules(&["localhost:3000"], &[]);
        assert_eq!(guard(&r, "localhost", ip("127.0.0.1"), 3000), Ok(()));
        assert_eq!(guard(&r, "localhost", ip("::1"), 3000), Ok(()));
        assert_eq!(
            guard(&r, "localhost", ip("127.0.0.1"), 3001),
            Err(Reason::PrivateAddress)
        );
        assert_eq!(
            guard(&r, "localhost", ip("10.0.0.1"), 3000),
            Err(Reason::PrivateAddress)
        );
        let r = rules(&["localhost"], &[]);
        assert_eq!(guard(&r, "localhost", ip("127.0.0.1"), 1), Ok(()));
        assert_eq!(
            guard(&r, "localhost", ip("169.254.169.254"), 1),
            Err(Reason::PrivateAddress)
        );

        // Metadata is reachable only through its literal.
        let r = rules(&["169.254.169.254:80"], &[]);
        assert_eq!(
            guard(&r, "169.254.169.254", ip("169.254.169.254"), 80),
            Ok(())
        );
    }

    #[test]
    fn guard_applies_ip_denies_to_resolved_addresses() {
        let r = rules(&["*.example.com"], &["93.184.216.34", "[2001:db8::1]:443"]);
        assert_eq!(
            guard(&r, "a.example.com", ip("93.184.216.34"), 443),
            Err(Reason::Denied)
        );
        assert_eq!(
            guard(&r, "a.example.com", ip("2001:db8::1"), 443),
            Err(Reason::Denied)
        );
        assert_eq!(guard(&r, "a.example.com", ip("2001:db8::1"), 80), Ok(()));
        let r = rules(&["10.0.0.1"], &["10.0.0.1"]);
        assert_eq!(guard(&r, "x", ip("10.0.0.1"), 80), Err(Reason::Denied));
    }
}
