//! The user's own tool configuration, redacted for the sandbox: where code
//! comes from (pip's index, npm's registry and settings) and who commits
//! (git's identity) reach the tool; credentials in those files do not.
//!
//! Redaction keeps structure, not text: only section headers, comments and
//! `key = value` lines survive, a key that names a credential is dropped
//! (with git's whole `[credential]` sections and includes moat cannot
//! follow), and every URL loses its userinfo. A line moat cannot read as one
//! of those is dropped, so a file that is not a configuration file (a key
//! behind a symlink) yields nothing secret.

use std::path::{Path, PathBuf};

/// The files copied, relative to HOME.
pub const USER_TOOL_CONFIGS: &[&str] = &[
    ".config/pip/pip.conf",
    ".pip/pip.conf",
    ".npmrc",
    ".gitconfig",
    ".config/git/config",
];

/// Largest file copied (a configuration file is small).
const MAX_SIZE: u64 = 256 * 1024;

/// Words in a key (lowercased) that mark a credential.
const SECRET_KEY_WORDS: &[&str] = &[
    "password",
    "passwd",
    "token",
    "secret",
    "_auth",
    "extraheader",
    "cookie",
    "keyfile",
    "privatekey",
    "private-key",
    "client-key",
    "credential",
];

/// One redacted copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedactedConfig {
    /// Relative to HOME (the same place under the sandbox HOME).
    pub rel: PathBuf,
    pub contents: String,
    /// What was removed: key names and "userinfo of KEY", never values.
    pub removed: Vec<String>,
}

/// Reads and redacts the user's tool configuration files under `home`.
/// Missing, unreadable, oversized or non-UTF-8 files are skipped.
pub fn redacted_user_configs(home: &Path) -> Vec<RedactedConfig> {
    USER_TOOL_CONFIGS
        .iter()
        .filter_map(|rel| {
            let path = home.join(rel);
            let meta = std::fs::metadata(&path).ok()?;
            if !meta.is_file() || meta.len() > MAX_SIZE {
                return None;
            }
            let text = std::fs::read_to_string(&path).ok()?;
            let (contents, removed) = redact_config_text(&text)?;
            // Nothing but credentials (or nothing at all): no copy.
            let settings = contents.lines().any(|l| {
                let l = l.trim();
                !l.is_empty() && !l.starts_with(['#', ';', '['])
            });
            if !settings {
                return None;
            }
            let header = format!(
                "# moat: a copy of ~/{rel} with credentials removed; the original stays on the host\n"
            );
            Some(RedactedConfig {
                rel: PathBuf::from(rel),
                contents: header + &contents,
                removed,
            })
        })
        .collect()
}

/// Whether a key names a credential (`//host/:_authToken`, `password`,
/// `http.extraHeader`, …).
fn secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    let last = k.rsplit([':', '.', '/']).next().unwrap_or(&k);
    SECRET_KEY_WORDS.iter().any(|w| k.contains(w)) || last == "auth" || last == "_auth"
}

/// A key as configuration files write them (`index-url`, `user.name`,
/// `//host/path/:always-auth`, `@scope:registry`).
fn plain_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 100
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:@/".contains(c))
}

/// Redacts INI-like text (pip.conf, .npmrc, git config). Returns the kept
/// text and what was removed, or None when the text does not read as a
/// configuration file (a PEM block, a line that is neither a section, a
/// comment nor `key = value`): then nothing of it is copied.
pub fn redact_config_text(text: &str) -> Option<(String, Vec<String>)> {
    if text.contains("-----BEGIN") {
        return None;
    }
    let mut out = String::new();
    let mut removed = Vec::new();
    // Inside a section dropped whole ([credential], [include], [includeIf]).
    let mut skipping = false;
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            if !skipping {
                out.push_str(raw);
                out.push('\n');
            }
            continue;
        }
        if line.starts_with('[') {
            let end = line.find(']')?;
            let header = &line[..=end];
            let name = header[1..end]
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_lowercase();
            skipping = matches!(name.as_str(), "credential" | "include" | "includeif");
            if skipping {
                removed.push(format!("section {name}"));
                continue;
            }
            let (clean, had) = moat_policy::strip_url_userinfo(header);
            if had {
                removed.push(format!("userinfo of section {name}"));
            }
            out.push_str(&clean);
            out.push('\n');
            continue;
        }
        if skipping {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            // git allows a bare boolean key (`[core] bare`).
            if line.len() <= 32 && line.chars().all(|c| c.is_ascii_alphabetic() || c == '-') {
                out.push_str(line);
                out.push('\n');
                continue;
            }
            return None;
        };
        let key = key.trim();
        if !plain_key(key) {
            return None;
        }
        if secret_key(key) {
            removed.push(key.to_string());
            continue;
        }
        let (value, had) = moat_policy::strip_url_userinfo(value.trim());
        if had {
            removed.push(format!("userinfo of {key}"));
        }
        out.push_str(&format!("{key} = {value}\n"));
    }
    Some((out, removed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npmrc_keeps_settings_and_drops_credentials() {
        let (out, removed) = redact_config_text(
            "registry=https://npm.corp.example/\nfund=false\ninit-author-name=Ada\n\
             //npm.corp.example/:_authToken=NPMSECRET\n_auth=QUJDU0VDUkVU\n\
             //npm.corp.example/:_password=PWSECRET\nemail=ada@example.com\n\
             @corp:registry=https://user:URLSECRET@npm.corp.example/\n",
        )
        .unwrap();
        for kept in [
            "registry = https://npm.corp.example/",
            "fund = false",
            "init-author-name = Ada",
            "@corp:registry = https://npm.corp.example/",
        ] {
            assert!(out.contains(kept), "{kept}: {out}");
        }
        for secret in ["NPMSECRET", "QUJDU0VDUkVU", "PWSECRET", "URLSECRET"] {
            assert!(!out.contains(secret), "{secret}: {out}");
            assert!(!removed.iter().any(|r| r.contains(secret)));
        }
        assert!(removed.iter().any(|r| r.ends_with(":_authToken")));
    }

    #[test]
    fn pip_and_git_keep_index_and_identity() {
        let (out, _) = redact_config_text(
            "[global]\nindex-url = https://me:PIPSECRET@pypi.corp.example/simple\ntimeout = 30\n",
        )
        .unwrap();
        assert!(
            out.contains("index-url = https://pypi.corp.example/simple"),
            "{out}"
        );
        assert!(!out.contains("PIPSECRET"));
        let (out, _) = redact_config_text(
            "[user]\n\tname = Ada Lovelace\n\temail = ada@example.com\n[credential]\n\thelper = store\n\
             [http \"https://x\"]\n\textraHeader = Authorization: Bearer GITSECRET\n\
             [url \"https://tok:URLSECRET@github.com/\"]\n\tinsteadOf = https://github.com/\n\
             [include]\n\tpath = ~/.gitconfig.local\n[core]\n\tbare\n",
        )
        .unwrap();
        assert!(out.contains("name = Ada Lovelace"), "{out}");
        assert!(out.contains("email = ada@example.com"), "{out}");
        assert!(out.contains("[url \"https://github.com/\"]"), "{out}");
        for secret in ["GITSECRET", "URLSECRET", "helper", "gitconfig.local"] {
            assert!(!out.contains(secret), "{secret}: {out}");
        }
        assert!(out.contains("bare"), "{out}");
    }

    #[test]
    fn a_file_that_is_not_configuration_yields_nothing() {
        for text in [
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n",
            "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7+xyz/abc=\n",
            "AKIAABCDEFGHIJKLMNOP\nwJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY\n",
        ] {
            assert_eq!(redact_config_text(text), None, "{text}");
        }
    }
}
