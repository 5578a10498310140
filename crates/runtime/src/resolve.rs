//! Policy flags → a resolved [`Policy`]: the one resolution `moat exec`,
//! a nested run, `moat serve`'s ceiling and every execution it starts go
//! through, so a harness embedding the runtime resolves flags exactly as
//! the command line does. `moat exec` is `moat run` with an empty profile:
//! the flags are the only settings layer above moat's defaults, merged by
//! the same resolver (`moat_config::resolve`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use moat_config::{resolve, ConfigError, FlagOrigin, PolicyFlags, Resolved, Sources};
use moat_policy::{Policy, PolicyError};

/// Why flags do not resolve to a policy. Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("cannot read the current directory: {0}")]
    CurrentDir(std::io::Error),
    #[error("the workspace {} does not exist: {error}", path.display())]
    WorkspaceMissing {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("the workspace {} is not a directory", .0.display())]
    WorkspaceNotDir(PathBuf),
    #[error("the root {} cannot be resolved: {error}", path.display())]
    RootMissing {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("the root {} is not a directory", .0.display())]
    RootNotDir(PathBuf),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// HOME as this process has it (`/` without one).
pub fn home_from_env() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// [`resolve_policy_in`] in this process's current directory, against its HOME.
pub fn resolve_policy(flags: &PolicyFlags) -> Result<(Policy, Option<Duration>), ResolveError> {
    let here = std::env::current_dir().map_err(ResolveError::CurrentDir)?;
    resolve_policy_in(flags, &here, &home_from_env())
}

/// The policy `flags` give for a given current directory and HOME (a
/// nested request is resolved in the caller's directory, against the real
/// home), with its timeout.
pub fn resolve_policy_in(
    flags: &PolicyFlags,
    here: &Path,
    home_raw: &Path,
) -> Result<(Policy, Option<Duration>), ResolveError> {
    let settings = flags.to_settings(FlagOrigin::CommandLine { here })?;
    let workspace = workspace_of(flags, here, home_raw)?;
    let resolved = resolve(
        None,
        None,
        Sources {
            flags: Some(settings),
            home: Some(home_raw.to_path_buf()),
            ..Sources::default()
        },
    )?;
    let policy = finish_policy(&resolved, flags, workspace, home_raw)?;
    let timeout = policy.timeout_ms.map(Duration::from_millis);
    Ok((policy, timeout))
}

/// The workspace `--cwd` names (default: `here`), canonical, a directory.
pub fn workspace_of(
    flags: &PolicyFlags,
    here: &Path,
    home_raw: &Path,
) -> Result<PathBuf, ResolveError> {
    // The current directory as the kernel reports it (getcwd) is already
    // canonical: it is used as is, never walked again by path, where a
    // component swapped for a symlink meanwhile would lead elsewhere (a
    // `moat serve` execution starts in the directory it checked, by fd).
    let Some(ws_arg) = flags.cwd.clone() else {
        if !here.is_dir() {
            return Err(ResolveError::WorkspaceNotDir(here.to_path_buf()));
        }
        return Ok(here.to_path_buf());
    };
    let workspace = std::fs::canonicalize(expand(&ws_arg, home_raw, here)).map_err(|error| {
        ResolveError::WorkspaceMissing {
            path: ws_arg.clone(),
            error,
        }
    })?;
    if !workspace.is_dir() {
        return Err(ResolveError::WorkspaceNotDir(workspace));
    }
    Ok(workspace)
}

/// The merged settings as a policy: paths canonicalized (a missing one from
/// a flag is an error, from a profile or a config file left out), the
/// upstream proxy's credentials added from the environment or a file.
pub fn finish_policy(
    resolved: &Resolved,
    flags: &PolicyFlags,
    workspace: PathBuf,
    home_raw: &Path,
) -> Result<Policy, ResolveError> {
    let home = std::fs::canonicalize(home_raw).unwrap_or(home_raw.to_path_buf());
    let mut built =
        resolved.to_policy_request(workspace, home, |p| match std::fs::canonicalize(p) {
            Ok(c) => Ok(Some(c)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.to_string()),
        })?;
    if built.request.upstream_proxy.is_some() {
        built.request.upstream_proxy =
            flags.upstream_with_credentials(std::env::var(moat_config::UPSTREAM_AUTH_ENV).ok())?;
    }
    Ok(Policy::resolve(built.request)?)
}

/// `~/x` → HOME/x; relative → absolute from `here`.
pub fn expand(p: &Path, home: &Path, here: &Path) -> PathBuf {
    if let Ok(rest) = p.strip_prefix("~") {
        return home.join(rest);
    }
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        here.join(p)
    }
}
