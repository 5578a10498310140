//! `MOAT_ARGS`: moat flags carried to a shimmed tool through the environment, shell-split and parsed into a setting set.

use std::path::{Component, PathBuf};

use moat_policy::Access;

use crate::error::ConfigError;
use crate::settings::{
    check_env_name, is_tilde, normalize_lexically, parse_level, PathSpec, Settings,
};

/// The flags `MOAT_ARGS` may carry.
pub const MOAT_ARGS_FLAGS: &[&str] = &[
    "--policy",
    "--network",
    "--ro",
    "--rw",
    "--allow-domain",
    "--deny-domain",
    "--env",
    "--pass-env",
    "--timeout",
];

fn err(arg: &str, why: impl Into<String>) -> ConfigError {
    ConfigError::MoatArgs {
        arg: arg.to_string(),
        why: why.into(),
    }
}

/// Shell-splits and parses a `MOAT_ARGS` value. Each flag takes one value,
/// as `--flag VALUE` or `--flag=VALUE`; anything else is an error. Paths
/// must be absolute or start with `~/`, without `..`. Whether the result
/// widens the boundary is decided by [`crate::resolve`], which knows the
/// other sources.
pub fn parse_moat_args(value: &str) -> Result<Settings, ConfigError> {
    let words = shlex::split(value).ok_or_else(|| {
        err(
            value,
            "unbalanced quotes or a trailing backslash; quote it as in a shell",
        )
    })?;
    let mut out = Settings::default();
    let mut it = words.into_iter();
    while let Some(word) = it.next() {
        let (flag, inline) = match word.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (word.clone(), None),
        };
        if !MOAT_ARGS_FLAGS.contains(&flag.as_str()) {
            return Err(err(
                &word,
                format!(
                    "not a flag MOAT_ARGS may carry; it takes only {}",
                    MOAT_ARGS_FLAGS.join(", ")
                ),
            ));
        }
        let value = match inline {
            Some(v) => v,
            None => it.next().ok_or_else(|| err(&flag, "missing its value"))?,
        };
        let shown = format!("{flag} {value}");
        match flag.as_str() {
            "--policy" => {
                out.level = Some(parse_level(&value).ok_or_else(|| {
                    err(
                        &shown,
                        "use read-only, workspace-write, workspace-contained or danger-full-access",
                    )
                })?)
            }
            "--network" => {
                out.network = Some(
                    moat_policy::NetworkMode::parse(&value)
                        .ok_or_else(|| err(&shown, "use disabled, proxy or unmanaged"))?,
                )
            }
            "--ro" | "--rw" => {
                let p = PathBuf::from(&value);
                if !(p.is_absolute() || is_tilde(&p)) {
                    return Err(err(
                        &shown,
                        "write an absolute path or one starting with ~/",
                    ));
                }
                if p.components().any(|c| c == Component::ParentDir) {
                    return Err(err(&shown, "write the path without '..'"));
                }
                let access = if flag == "--ro" {
                    Access::ReadOnly
                } else {
                    Access::ReadWrite
                };
                let spec = PathSpec {
                    path: normalize_lexically(&p),
                    access,
                };
                if let Some(prev) = out.paths.iter().find(|s| s.path == spec.path) {
                    if prev.access != access {
                        return Err(err(
                            &shown,
                            "the same path is given both --ro and --rw; keep one",
                        ));
                    }
                    continue;
                }
                out.paths.push(spec);
            }
            "--allow-domain" | "--deny-domain" => {
                moat_policy::net::expand_presets(std::slice::from_ref(&value))
                    .map_err(|e| err(&shown, e.to_string()))?;
                let list = if flag == "--allow-domain" {
                    &mut out.allow_domains
                } else {
                    &mut out.deny_domains
                };
                if !list.contains(&value) {
                    list.push(value);
                }
            }
            "--env" => {
                let (k, v) = value
                    .split_once('=')
                    .ok_or_else(|| err(&shown, "use --env NAME=VALUE"))?;
                check_env_name(k).map_err(|why| err(&shown, why))?;
                if v.contains('\0') {
                    return Err(err(&shown, "values cannot contain a NUL byte"));
                }
                out.env.insert(k.to_string(), v.to_string());
            }
            "--pass-env" => {
                check_env_name(&value).map_err(|why| err(&shown, why))?;
                if !out.pass_env.contains(&value) {
                    out.pass_env.push(value);
                }
            }
            "--timeout" => {
                out.timeout_ms = Some(
                    moat_policy::parse_duration(&value).map_err(|e| err(&shown, e.to_string()))?,
                )
            }
            _ => return Err(err(&word, "not a flag MOAT_ARGS may carry")),
        }
    }
    Ok(out)
}

/// Reads `MOAT_ARGS` from the environment: `Ok(None)` when unset or blank.
pub fn moat_args_from_env() -> Result<Option<Settings>, ConfigError> {
    match std::env::var_os("MOAT_ARGS") {
        None => Ok(None),
        Some(v) => {
            let s = v
                .into_string()
                .map_err(|_| err("MOAT_ARGS", "the value is not valid UTF-8"))?;
            if s.trim().is_empty() {
                return Ok(None);
            }
            parse_moat_args(&s).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moat_policy::{Level, NetworkMode};
    use std::path::Path;

    #[test]
    fn parses_every_flag_in_both_forms() {
        let s = parse_moat_args(
            "--policy read-only --network=proxy --ro /opt/data --rw '~/.cache/my tool' --allow-domain example.com:443 \
             --deny-domain=ads.example.com --env 'GREETING=hello world' --pass-env CI --timeout 30s",
        )
        .unwrap();
        assert_eq!(s.level, Some(Level::ReadOnly));
        assert_eq!(s.network, Some(NetworkMode::Proxy));
        assert_eq!(
            s.paths[0],
            PathSpec {
                path: "/opt/data".into(),
                access: Access::ReadOnly
            }
        );
        assert_eq!(s.paths[1].path, Path::new("~/.cache/my tool"));
        assert_eq!(s.allow_domains, ["example.com:443"]);
        assert_eq!(s.deny_domains, ["ads.example.com"]);
        assert_eq!(s.env["GREETING"], "hello world");
        assert_eq!(s.pass_env, ["CI"]);
        assert_eq!(s.timeout_ms, Some(30_000));
        assert!(parse_moat_args("").unwrap().is_empty());
    }

    #[test]
    fn refuses_anything_else() {
        for (v, needle) in [
            ("--cwd /", "--cwd"),
            ("--json", "--json"),
            ("-- rm -rf /", "--"),
            ("status", "status"),
            ("--ro", "missing its value"),
            ("--ro relative/path", "absolute"),
            ("--rw /a/../b", ".."),
            ("--ro /a --rw /a", "both"),
            ("--policy yolo", "read-only"),
            ("--network open", "disabled"),
            ("--allow-domain https://x.com", "scheme"),
            ("--allow-domain @nope", "unknown network preset"),
            ("--env NOVALUE", "NAME=VALUE"),
            ("--timeout soon", "invalid duration"),
            ("--ro '/unterminated", "quotes"),
        ] {
            let e = parse_moat_args(v).unwrap_err().to_string();
            assert!(e.starts_with("MOAT_ARGS"), "{v}: {e}");
            assert!(e.contains(needle), "{v}: {e}");
        }
    }
}
