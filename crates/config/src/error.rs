//! The one error type of the configuration layer; every message says what to change.

use std::path::PathBuf;

/// Why a profile, config file, project file, `MOAT_ARGS` or trust store
/// operation was refused. Each message names the file (or source), the key
/// and the value, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A TOML file that does not parse, or carries a key moat does not know.
    #[error("{file}: {problem}; {fix}")]
    Parse {
        file: String,
        problem: String,
        fix: String,
    },

    /// A key whose value moat refuses.
    #[error("{file}: {key} = {value}: {why}")]
    Invalid {
        file: String,
        key: String,
        value: String,
        why: String,
    },

    /// A project file asking for something only the user may grant.
    #[error("{file}: {key} = {value} is refused: {why}. A project file cannot grant this; if you want it, put it in your own config (~/.config/moat/config.toml) or pass it as a flag")]
    ProjectRefused {
        file: String,
        key: String,
        value: String,
        why: String,
    },

    /// Two sources claim one path with different modes.
    #[error("{path} is {first_mode} in {first_source} but {second_mode} in {second_source}, and moat never picks one silently; fix it in one of three places: (1) the command-line flag or MOAT_ARGS, (2) the project file (.moat.toml), (3) your user config (~/.config/moat/config.toml) or your copy of the tool profile (~/.config/moat/profiles/TOOL.toml overrides a built-in)")]
    Conflict {
        path: PathBuf,
        first_mode: &'static str,
        first_source: String,
        second_mode: &'static str,
        second_source: String,
    },

    /// A path that is a protected path but is not opted in.
    #[error("{path} (from {source_label}) is the protected path {protected}, which stays an empty stand-in unless opted in; add \"{protected}\" to protected_opt_in in your config or the tool's profile, or pass it as --ro/--rw on the command line")]
    ProtectedNotOptedIn {
        path: PathBuf,
        protected: String,
        source_label: String,
    },

    /// A grant that only applies in proxy mode while the network is something else.
    #[error("{what} (from {source_label}) only applies with network proxy, but the network is {network} (from {network_source}); add --network proxy or drop it")]
    NeedsProxy {
        what: String,
        source_label: String,
        network: &'static str,
        network_source: String,
    },

    /// A command-line policy flag moat does not accept.
    #[error("{arg}: {why}")]
    Flag { arg: String, why: String },

    /// An argument in `MOAT_ARGS` moat does not accept.
    #[error("MOAT_ARGS: {arg}: {why}")]
    MoatArgs { arg: String, why: String },

    /// `MOAT_ARGS` asking for more than the trusted configuration grants.
    #[error("MOAT_ARGS widens the boundary: {what}; MOAT_ARGS may only narrow what the profile, your config and a trusted project file grant. Grant it in ~/.config/moat/config.toml (or [tools.TOOL] there), or pass it as an explicit command-line flag")]
    MoatArgsWidening { what: String },

    /// A file-system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The trust store exists but is not what moat wrote.
    #[error("the trust store {path} is unreadable ({why}); move it aside and run `moat trust` again for each project")]
    TrustStoreCorrupt { path: PathBuf, why: String },

    /// A path the caller's mapping closure could not turn into a host path.
    #[error("{path} (from {source_label}): {why}")]
    Path {
        path: PathBuf,
        source_label: String,
        why: String,
    },

    /// The policy layer refused the request built from the configuration.
    #[error(transparent)]
    Policy(#[from] moat_policy::PolicyError),
}

impl ConfigError {
    pub(crate) fn invalid(
        file: &str,
        key: &str,
        value: impl std::fmt::Display,
        why: impl Into<String>,
    ) -> Self {
        ConfigError::Invalid {
            file: file.to_string(),
            key: key.to_string(),
            value: value.to_string(),
            why: why.into(),
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ConfigError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Maps a TOML/serde error into a message naming the file and the key.
    pub(crate) fn from_toml(file: &str, text: &str, err: &toml::de::Error) -> Self {
        let msg = err.message().to_string();
        let line = err
            .span()
            .map(|s| 1 + text.get(..s.start).unwrap_or("").matches('\n').count());
        let at = line.map(|l| format!(" (line {l})")).unwrap_or_default();
        if let Some(rest) = msg.strip_prefix("unknown field `") {
            let key = rest.split('`').next().unwrap_or("");
            let expected = rest
                .split_once(", expected ")
                .map(|(_, e)| e.to_string())
                .unwrap_or_default();
            return ConfigError::Parse {
                file: file.to_string(),
                problem: format!("unknown key `{key}`{at}"),
                fix: if expected.is_empty() {
                    "remove it or fix its spelling".to_string()
                } else {
                    format!("remove it or fix its spelling (expected {expected})")
                },
            };
        }
        ConfigError::Parse {
            file: file.to_string(),
            problem: format!("{}{at}", msg.trim_end()),
            fix: "fix the TOML (see the moat README for the format)".to_string(),
        }
    }
}
