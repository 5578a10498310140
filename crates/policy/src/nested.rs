//! Nested runs: a `moat exec` started inside a sandbox may only narrow.
//! The check itself compares the inner run's view with the outer run's
//! (moat-linux's `view` module, which knows the host); this module holds the
//! pure parts it needs: the refusal, and whether one domain pattern covers
//! another.

use crate::net::DomainPattern;

/// Why a nested request was refused: the grant, and what the outer run allows.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("nested run refused: {grant} would widen the outer sandbox ({why})")]
pub struct Widening {
    pub grant: String,
    pub why: String,
}

/// Whether outer pattern `o` admits everything inner pattern `i` admits.
pub fn covers(o: &DomainPattern, i: &DomainPattern) -> bool {
    if o == i {
        return true;
    }
    let (ohost, oport) = split(o.as_str());
    let (ihost, iport) = split(i.as_str());
    let port_ok = oport.is_none() || oport == iport;
    if !port_ok {
        return false;
    }
    if let Some(suffix) = ohost.strip_prefix("*.") {
        // *.d covers x.d and *.x.d
        let ih = ihost.strip_prefix("*.").unwrap_or(ihost);
        return ih.ends_with(&format!(".{suffix}"));
    }
    ohost == ihost
}

fn split(p: &str) -> (&str, Option<&str>) {
    if let Some(rest) = p.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((h, tail)) => (h, tail.strip_prefix(':')),
            None => (p, None),
        };
    }
    match p.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => (h, Some(port)),
        _ => (p, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pat(s: &str) -> DomainPattern {
        DomainPattern::parse(s).unwrap()
    }

    #[test]
    fn patterns_cover_only_narrower_ones() {
        assert!(covers(&pat("*.example.com"), &pat("api.example.com:443")));
        assert!(covers(&pat("*.example.com"), &pat("*.a.example.com")));
        assert!(covers(&pat("pypi.org:443"), &pat("pypi.org:443")));
        assert!(
            !covers(&pat("pypi.org:443"), &pat("pypi.org")),
            "any port is wider than :443"
        );
        assert!(!covers(&pat("*.example.com"), &pat("example.org")));
        assert!(!covers(&pat("example.com"), &pat("evil.org")));
    }
}
