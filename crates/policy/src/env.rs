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
