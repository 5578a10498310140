//! moat's configuration layer: tool profiles and the built-in catalogue, the
//! user config, the project file `.moat.toml` and its trust store,
//! `MOAT_ARGS`, and the precedence that merges them into one set of grants
//! (each with its source) and a [`moat_policy::PolicyRequest`].
//!
//! Pure by design: parsing, validation and precedence take values and paths.
//! The few functions that read the world say so (`*_from_env`, `load_*`,
//! [`TrustStore`]); the CLI passes env-derived paths in.
//!
//! # Precedence (strongest first)
//! command-line flags, `MOAT_ARGS`, the project file, the user config, the
//! profile (with its `[subcommands.ARGV1]` override), built-in defaults.
//! Top-level scalar keys (`level`, `network`, `net_class`, `timeout`) of the
//! project file and the user config are *defaults*: they yield to a tool's
//! profile, while their grant lists and `[tools.NAME]` sections rank above it.
//!
//! # Security notes
//! - A project file can only grant paths inside its own directory (after
//!   `..` and symlinks), never protected paths, `.env*`, danger-full-access,
//!   an unmanaged network, an unconfined net class, or secret-looking
//!   `pass_env` names. It only applies once trusted at its exact sha256.
//! - `MOAT_ARGS` may narrow freely; a widening is refused unless the user
//!   config or the trusted project file already grants it.
//! - Two sources claiming one path with different modes is an error naming both.
#![forbid(unsafe_code)]

mod catalogue;
mod error;
mod flags;
mod load;
mod moat_args;
mod profile;
mod project;
mod resolve;
mod settings;
mod trust;
mod userconf;

pub use catalogue::{
    builtin, builtin_checked, builtin_names, builtin_source, session_shims, BUILTIN_SOURCES,
};
pub use error::ConfigError;
pub use flags::{
    moat_args_flag_names, parse_moat_args_words, policy_flag_names, url_has_userinfo,
    url_without_userinfo, FlagOrigin, LimitFlags, PolicyFlags, NOT_IN_MOAT_ARGS, UPSTREAM_AUTH_ENV,
};
pub use load::{
    all_profile_names, config_dir, config_dir_from_env, default_or_shim_dir, load_catalogue,
    load_user_config, load_user_profiles, parse_user_config, parse_user_profile, resolve_program,
    shimmable_names, state_dir, state_dir_from_env, user_config_path, user_profiles_dir, Catalogue,
    ProfileOrigin, UserConfig,
};
pub use moat_args::{moat_args_from_env, parse_moat_args};
pub use profile::{parse_profile, FirstUse, FirstUseKind, Profile};
pub use project::{
    find_project_file, find_project_file_with, load_project, parse_project, project_digest,
    ProjectFile, PROJECT_FILE_NAME,
};
pub use resolve::{
    domains_within, level_within, network_within, resolve, BuiltRequest, GrantLine, Resolved,
    Source, Sourced, Sources,
};
pub use settings::{
    expand_tilde, is_tilde, normalize_lexically, parse_level, protected_containing,
    protected_exact, NetClass, PathSpec, Settings,
};
pub use trust::{
    is_trusted, render_grants, rfc3339_utc, TrustEntry, TrustMap, TrustStore, TRUST_FILE_NAME,
};
pub use userconf::{
    git_include_targets, git_include_targets_in, http_registry_credentials, redact_config_text,
    redacted_user_configs, redacted_user_configs_in, tool_config_key_files,
    tool_config_key_files_in, tool_config_view, workspace_git_config_credentials,
    workspace_git_config_too_large, workspace_git_config_view, ConfigReads, CredentialKind,
    HttpCredential, RedactedConfig, HOME_TOOL_CONFIGS, SYSTEM_TOOL_CONFIGS, USER_TOOL_CONFIGS,
    WORKSPACE_TOOL_CONFIGS,
};
