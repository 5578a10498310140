//! Which environment variables may reach a sandboxed command by default.

/// Host variables kept in the safe base (HOME and TMPDIR are replaced by the
/// sandbox's own; `LC_*` is matched by prefix).
pub const SAFE_BASE_ENV: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "TERM",
    "USER",
    "LOGNAME",
    "COLORTERM",
    "TZ",
];

/// Names that look like credentials. They never pass implicitly, only by an
/// explicit `--pass-env NAME`.
pub fn is_secret_env_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    const SUFFIXES: &[&str] = &[
        "_TOKEN",
        "_KEY",
        "_SECRET",
        "_PASSWORD",
        "_AUTHORIZATION",
        "_COOKIE",
        "_CREDENTIALS",
        "_PASSWD",
        "_APIKEY",
    ];
    const EXACT: &[&str] = &[
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "TOKEN",
        "PASSWORD",
        "SECRET",
        "API_KEY",
        "GITHUB_TOKEN",
        "GH_TOKEN",
    ];
    upper.starts_with("AWS_")
        || SUFFIXES.iter().any(|s| upper.ends_with(s))
        || EXACT.contains(&upper.as_str())
}

/// Prefixes of host variables that configure tools (where packages come
/// from, who commits). They pass into a sandboxed command by default, unless
/// [`tool_config_env`] refuses them.
pub const TOOL_CONFIG_ENV_PREFIXES: &[&str] = &[
    "PIP_",
    "NPM_CONFIG_",
    "CARGO_",
    "GIT_AUTHOR_",
    "GIT_COMMITTER_",
    "UV_",
];

/// Words that make a tool-configuration variable look like a credential.
const SECRET_WORDS: &[&str] = &[
    "AUTH",
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "SECRET",
    "KEY",
    "CREDENTIAL",
    "COOKIE",
];

/// The value a tool-configuration variable passes with, or None when it
/// does not pass: not one of [`TOOL_CONFIG_ENV_PREFIXES`], secret-looking,
/// a proxy setting (moat sets its own), or a `*_HOME`-style location of
/// moat's own. A URL's userinfo (`https://user:pw@host`) is removed.
pub fn tool_config_env(name: &str, value: &str) -> Option<String> {
    let upper = name.to_ascii_uppercase();
    // The words are looked for after the prefix (GIT_AUTHOR_NAME is no auth).
    let rest = TOOL_CONFIG_ENV_PREFIXES
        .iter()
        .find_map(|p| upper.strip_prefix(p))?;
    if is_secret_env_name(name)
        || SECRET_WORDS.iter().any(|w| rest.contains(w))
        || rest.contains("PROXY")
    {
        return None;
    }
    Some(strip_url_userinfo(value).0)
}

/// Removes the userinfo of every URL in `text` (`scheme://user:pw@host` →
/// `scheme://host`); says whether it removed any.
pub fn strip_url_userinfo(text: &str) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut removed = false;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| {
                c == '/' || c == '?' || c == '#' || c.is_whitespace() || c == '"' || c == '\''
            })
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(i) => {
                removed = true;
                out.push_str(&authority[i + 1..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    (out, removed)
}

#[cfg(test)]
mod tool_env_tests {
    use super::*;

    #[test]
    fn tool_configuration_passes_without_credentials() {
        assert_eq!(
            tool_config_env("PIP_INDEX_URL", "https://me:pw@pypi.corp/simple"),
            Some("https://pypi.corp/simple".into())
        );
        assert_eq!(
            tool_config_env("NPM_CONFIG_REGISTRY", "https://npm.corp/"),
            Some("https://npm.corp/".into())
        );
        assert_eq!(
            tool_config_env("GIT_AUTHOR_NAME", "Ada"),
            Some("Ada".into())
        );
        for refused in [
            "NPM_CONFIG__AUTH",
            "NPM_CONFIG_//npm.corp/:_authToken",
            "CARGO_REGISTRIES_CORP_TOKEN",
            "PIP_PASSWORD",
            "UV_INDEX_CORP_PASSWORD",
            "NPM_CONFIG_HTTPS_PROXY",
            "PIP_PROXY",
            "HOME",
            "GIT_ASKPASS",
        ] {
            assert_eq!(tool_config_env(refused, "x"), None, "{refused}");
        }
        assert_eq!(
            strip_url_userinfo("a https://u@h/x and http://u:p@[::1]:8/ end").0,
            "a https://h/x and http://[::1]:8/ end"
        );
    }
}
