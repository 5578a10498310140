//! A checker for generated SBPL: parentheses balance, strings and regex
//! literals close, and every list starts with an operation, action or
//! filter moat knows (a typo would make `sandbox-exec` refuse the profile
//! on a Mac, which CI here cannot run).

/// Actions, operations and filters moat's profiles may use.
pub const KNOWN: &[&str] = &[
    // actions and the header
    "version",
    "allow",
    "deny",
    // operations
    "default",
    "process-exec",
    "process-fork",
    "process-info*",
    "signal",
    "sysctl-read",
    "pseudo-tty",
    "ipc-posix-sem",
    "mach-lookup",
    "file-read*",
    "file-read-metadata",
    "file-read-data",
    "file-write*",
    "file-write-data",
    "network*",
    "network-outbound",
    // filters
    "require-all",
    "require-any",
    "require-not",
    "subpath",
    "literal",
    "regex",
    "param",
    "target",
    "global-name",
    "remote",
    "ip",
];

/// Why a profile is malformed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SbplError {
    #[error("unbalanced parentheses at byte {0}")]
    Unbalanced(usize),
    #[error("unterminated string at byte {0}")]
    Unterminated(usize),
    #[error("unknown SBPL word {0:?} at byte {1}")]
    Unknown(String, usize),
    #[error("a list with no head at byte {0}")]
    EmptyList(usize),
}

/// Checks `profile`; returns the number of lists it holds.
pub fn check(profile: &str) -> Result<usize, SbplError> {
    let b = profile.as_bytes();
    let mut depth: usize = 0;
    let mut lists = 0;
    let mut i = 0;
    // Whether the next word read is the head of a list just opened.
    let mut want_head: Option<usize> = None;
    while i < b.len() {
        match b[i] {
            b';' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'(' => {
                if let Some(at) = want_head {
                    return Err(SbplError::EmptyList(at));
                }
                depth += 1;
                lists += 1;
                want_head = Some(i);
                i += 1;
            }
            b')' => {
                if let Some(at) = want_head {
                    return Err(SbplError::EmptyList(at));
                }
                depth = depth.checked_sub(1).ok_or(SbplError::Unbalanced(i))?;
                i += 1;
            }
            b'"' | b'#' => {
                let start = i;
                if b[i] == b'#' {
                    i += 1;
                    if b.get(i) != Some(&b'"') {
                        return Err(SbplError::Unknown("#".into(), start));
                    }
                }
                i += 1;
                loop {
                    match b.get(i) {
                        None => return Err(SbplError::Unterminated(start)),
                        Some(b'\\') => i += 2,
                        Some(b'"') => break,
                        Some(_) => i += 1,
                    }
                }
                i += 1;
                if let Some(at) = want_head.take() {
                    return Err(SbplError::EmptyList(at));
                }
            }
            c if c.is_ascii_whitespace() => i += 1,
            _ => {
                let start = i;
                while i < b.len() && !b[i].is_ascii_whitespace() && !b"()\";".contains(&b[i]) {
                    i += 1;
                }
                let word = &profile[start..i];
                let head = want_head.take().is_some();
                // Heads must be known; bare words elsewhere are known
                // operations (`(deny file-read* file-write* …)`) or numbers.
                let number = word.bytes().all(|c| c.is_ascii_digit());
                let bare_ok = matches!(word, "same-sandbox") || number;
                let allowed = KNOWN.contains(&word) || (bare_ok && !head);
                if !allowed {
                    return Err(SbplError::Unknown(word.into(), start));
                }
            }
        }
    }
    if depth != 0 {
        return Err(SbplError::Unbalanced(b.len()));
    }
    Ok(lists)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_a_small_profile() {
        assert_eq!(
            check("(version 1)\n(deny default) ; c\n(allow file-read* (subpath \"/a\\\"b\"))"),
            Ok(4)
        );
    }

    #[test]
    fn refuses_what_sandbox_exec_would() {
        assert!(matches!(
            check("(allow file-read*"),
            Err(SbplError::Unbalanced(_))
        ));
        assert!(matches!(check("(allow x))"), Err(SbplError::Unknown(..))));
        assert!(matches!(
            check("(allow file-read* (subpath \"/a))"),
            Err(SbplError::Unterminated(_))
        ));
        assert!(matches!(
            check("(allow file-write (subpath \"/a\"))"),
            Err(SbplError::Unknown(..))
        ));
        assert!(matches!(check("(allow ())"), Err(SbplError::EmptyList(_))));
        assert!(matches!(check(")("), Err(SbplError::Unbalanced(_))));
    }
}
