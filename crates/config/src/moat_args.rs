//! `MOAT_ARGS`: moat flags carried to a shimmed tool through the environment, shell-split and parsed into a setting set.

use crate::error::ConfigError;
use crate::flags::{parse_moat_args_words, FlagOrigin};
use crate::settings::Settings;

fn err(arg: &str, why: impl Into<String>) -> ConfigError {
    ConfigError::MoatArgs {
        arg: arg.to_string(),
        why: why.into(),
    }
}

/// Shell-splits and parses a `MOAT_ARGS` value through the one flag table
/// ([`crate::PolicyFlags`]): the same flags, spellings and value checks as
/// the command line, minus [`crate::NOT_IN_MOAT_ARGS`]. Paths must be
/// absolute or start with `~/`, without `..`. Whether the result widens the
/// boundary is decided by [`crate::resolve`], which knows the other sources.
pub fn parse_moat_args(value: &str) -> Result<Settings, ConfigError> {
    let words = shlex::split(value).ok_or_else(|| {
        err(
            value,
            "unbalanced quotes or a trailing backslash; quote it as in a shell",
        )
    })?;
    parse_moat_args_words(&words)?.to_settings(FlagOrigin::MoatArgs)
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
    use crate::settings::PathSpec;
    use moat_policy::{Access, Level, NetworkMode};
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
        // The short level names are accepted here as on the command line.
        assert_eq!(
            parse_moat_args("--policy=ro").unwrap().level,
            Some(Level::ReadOnly)
        );
    }

    #[test]
    fn refuses_anything_else() {
        for (v, needle) in [
            ("--cwd /", "--cwd"),
            ("--json", "--json"),
            ("-- rm -rf /", "--"),
            ("status", "status"),
            ("--ro", "a value is required"),
            ("--ro relative/path", "absolute"),
            ("--rw /a/../b", ".."),
            ("--ro /a --rw /a", "both"),
            ("--policy yolo", "read-only"),
            ("--upstream-proxy http://p:1", "may carry"),
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
