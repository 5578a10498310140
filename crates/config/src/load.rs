//! Where moat's files live, and loading the user's profiles and config (paths are passed in; `*_from_env` read the world).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::catalogue::{builtin_names, BUILTIN_SOURCES};
use crate::error::ConfigError;
use crate::profile::{parse_profile, Profile};
use crate::settings::{raw_file_struct, Ctx, Kind, RawOverrides, Settings};

/// `$XDG_CONFIG_HOME/moat` when that is absolute, else `HOME/.config/moat`.
pub fn config_dir(xdg_config_home: Option<&OsStr>, home: Option<&Path>) -> Option<PathBuf> {
    xdg_dir(xdg_config_home, home, ".config")
}

/// `$XDG_STATE_HOME/moat` when that is absolute, else `HOME/.local/state/moat`.
pub fn state_dir(xdg_state_home: Option<&OsStr>, home: Option<&Path>) -> Option<PathBuf> {
    xdg_dir(xdg_state_home, home, ".local/state")
}

fn xdg_dir(xdg: Option<&OsStr>, home: Option<&Path>, fallback: &str) -> Option<PathBuf> {
    match xdg.map(Path::new) {
        Some(p) if p.is_absolute() => Some(p.join("moat")),
        _ => home
            .filter(|h| h.is_absolute())
            .map(|h| h.join(fallback).join("moat")),
    }
}

/// [`config_dir`] from `XDG_CONFIG_HOME` and `HOME`.
pub fn config_dir_from_env() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    config_dir(
        std::env::var_os("XDG_CONFIG_HOME").as_deref(),
        home.as_deref(),
    )
}

/// [`state_dir`] from `XDG_STATE_HOME` and `HOME`.
pub fn state_dir_from_env() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    state_dir(
        std::env::var_os("XDG_STATE_HOME").as_deref(),
        home.as_deref(),
    )
}

/// `<config_dir>/config.toml`.
pub fn user_config_path(config_dir: &Path) -> PathBuf {
    config_dir.join("config.toml")
}

/// `<config_dir>/profiles`.
pub fn user_profiles_dir(config_dir: &Path) -> PathBuf {
    config_dir.join("profiles")
}

/// Where a profile in the catalogue came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProfileOrigin {
    BuiltIn,
    /// A user profile file (overrides a built-in of the same name).
    User(PathBuf),
}

impl std::fmt::Display for ProfileOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProfileOrigin::BuiltIn => f.write_str("built-in"),
            ProfileOrigin::User(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Every profile moat knows: the built-ins, with user profiles replacing
/// them by name.
#[derive(Clone, Debug, Default)]
pub struct Catalogue {
    pub profiles: BTreeMap<String, (Profile, ProfileOrigin)>,
}

impl Catalogue {
    /// Only the built-in profiles.
    pub fn builtin() -> Result<Catalogue, ConfigError> {
        let mut profiles = BTreeMap::new();
        for (name, text) in BUILTIN_SOURCES {
            let p = parse_profile(text, &format!("built-in profile {name}"))?;
            profiles.insert(p.name.clone(), (p, ProfileOrigin::BuiltIn));
        }
        Ok(Catalogue { profiles })
    }

    /// The built-ins with `user` laid over them by name.
    pub fn with_user_profiles(user: Vec<(Profile, PathBuf)>) -> Result<Catalogue, ConfigError> {
        let mut cat = Catalogue::builtin()?;
        for (p, path) in user {
            cat.profiles
                .insert(p.name.clone(), (p, ProfileOrigin::User(path)));
        }
        Ok(cat)
    }

    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.profiles.get(name).map(|(p, _)| p)
    }

    pub fn origin(&self, name: &str) -> Option<&ProfileOrigin> {
        self.profiles.get(name).map(|(_, o)| o)
    }

    /// Sorted profile names.
    pub fn names(&self) -> Vec<&str> {
        self.profiles.keys().map(String::as_str).collect()
    }
}

/// Parses a user profile file; its `name` must match the file's stem, so
/// `profiles/git.toml` is the one that overrides the built-in `git`.
pub fn parse_user_profile(text: &str, path: &Path) -> Result<Profile, ConfigError> {
    let label = path.display().to_string();
    let p = parse_profile(text, &label)?;
    let stem = path.file_stem().and_then(OsStr::to_str).unwrap_or("");
    if stem != p.name {
        return Err(ConfigError::invalid(
            &label,
            "name",
            format!("{:?}", p.name),
            format!(
                "the file is named {stem}.toml; rename the file to {}.toml or set name = {stem:?}",
                p.name
            ),
        ));
    }
    Ok(p)
}

/// Reads `<config_dir>/profiles/*.toml` (sorted by file name). A missing
/// directory is no profiles; an unreadable or invalid file is an error.
pub fn load_user_profiles(config_dir: &Path) -> Result<Vec<(Profile, PathBuf)>, ConfigError> {
    let dir = user_profiles_dir(config_dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ConfigError::io("cannot list", dir, e)),
    };
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| ConfigError::io("cannot list", &dir, e))?;
        let path = entry.path();
        if path.extension() == Some(OsStr::new("toml")) {
            paths.push(path);
        }
    }
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let text =
            std::fs::read_to_string(&path).map_err(|e| ConfigError::io("cannot read", &path, e))?;
        out.push((parse_user_profile(&text, &path)?, path));
    }
    Ok(out)
}

/// [`Catalogue::with_user_profiles`] of [`load_user_profiles`].
pub fn load_catalogue(config_dir: &Path) -> Result<Catalogue, ConfigError> {
    Catalogue::with_user_profiles(load_user_profiles(config_dir)?)
}

raw_file_struct!(RawConfig {
    shim_dir: Option<String>,
    tools: BTreeMap<String, RawOverrides>,
});

/// The user's own `config.toml`.
///
/// Top-level scalar keys (`level`, `network`, `net_class`, `timeout`) are the
/// user's *defaults*: they replace moat's built-in defaults but yield to a
/// tool's profile. Top-level grant lists (`allow_domains`, `deny_domains`,
/// `ro`/`rw`/`mounts`, `env`, `pass_env`, `protected_opt_in`) and everything
/// in `[tools.NAME]` rank above the profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserConfig {
    pub path: PathBuf,
    pub defaults: Settings,
    pub tools: BTreeMap<String, Settings>,
    /// `shim_dir` as written (`~/…` or absolute).
    pub shim_dir: Option<PathBuf>,
    pub warnings: Vec<String>,
}

impl UserConfig {
    /// Where `moat shim install` puts its symlinks: `shim_dir`, default `~/.local/bin`, with `~` expanded.
    pub fn shim_dir(&self, home: &Path) -> PathBuf {
        default_or_shim_dir(self.shim_dir.as_deref(), home)
    }
}

/// `shim_dir` (or `~/.local/bin`) with `~` expanded against `home`.
pub fn default_or_shim_dir(shim_dir: Option<&Path>, home: &Path) -> PathBuf {
    match shim_dir {
        Some(p) => crate::settings::expand_tilde(p, home),
        None => home.join(".local/bin"),
    }
}

/// Parses the user config; `path` names it in errors and in grant sources.
pub fn parse_user_config(text: &str, path: &Path) -> Result<UserConfig, ConfigError> {
    let label = path.display().to_string();
    let raw: RawConfig =
        toml::from_str(text).map_err(|e| ConfigError::from_toml(&label, text, &e))?;
    let (top, (shim_dir, tools_raw)) = raw.into_parts();
    let (defaults, mut warnings) = top.into_settings(&Ctx {
        file: &label,
        prefix: String::new(),
        kind: Kind::Config,
    })?;
    let mut tools = BTreeMap::new();
    for (name, over) in tools_raw {
        check_tool_name(&label, &name)?;
        let (s, w) = over.into_settings(&Ctx {
            file: &label,
            prefix: format!("tools.{name}."),
            kind: Kind::Config,
        })?;
        warnings.extend(w);
        tools.insert(name, s);
    }
    let shim_dir = match shim_dir {
        Some(s) => {
            let p = PathBuf::from(&s);
            if !(p.is_absolute() || crate::settings::is_tilde(&p)) {
                return Err(ConfigError::invalid(
                    &label,
                    "shim_dir",
                    format!("{s:?}"),
                    "write an absolute path or one starting with ~/",
                ));
            }
            Some(p)
        }
        None => None,
    };
    Ok(UserConfig {
        path: path.to_path_buf(),
        defaults,
        tools,
        shim_dir,
        warnings,
    })
}

pub(crate) fn check_tool_name(file: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.contains('/') || name.contains(char::is_whitespace) {
        return Err(ConfigError::invalid(
            file,
            "tools",
            format!("{name:?}"),
            "a tool name is a bare command name",
        ));
    }
    Ok(())
}

/// Reads the user config at `path`; a missing file is `Ok(None)`.
pub fn load_user_config(path: &Path) -> Result<Option<UserConfig>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_user_config(&text, path).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ConfigError::io("cannot read", path, e)),
    }
}

/// Finds `program` on `path_var` (a `PATH` value), skipping `shim_dir` and
/// any candidate `is_moat` says is moat itself (a shim, or the moat binary
/// under another name). `is_executable` is the caller's file check. Pure:
/// all I/O is in the closures.
pub fn resolve_program(
    program: &str,
    path_var: &OsStr,
    shim_dir: Option<&Path>,
    is_executable: impl Fn(&Path) -> bool,
    is_moat: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    if program.is_empty() || program.contains('/') {
        return None;
    }
    for dir in std::env::split_paths(path_var) {
        if !dir.is_absolute() {
            continue; // a relative PATH entry would resolve against the caller's cwd
        }
        if shim_dir.is_some_and(|s| {
            crate::settings::normalize_lexically(&dir) == crate::settings::normalize_lexically(s)
        }) {
            continue;
        }
        let candidate = dir.join(program);
        if is_executable(&candidate) && !is_moat(&candidate) {
            return Some(candidate);
        }
    }
    None
}

/// Names that could be shimmed: every profile in the catalogue but `moat`.
pub fn shimmable_names(cat: &Catalogue) -> Vec<&str> {
    cat.names().into_iter().filter(|n| *n != "moat").collect()
}

/// All built-in names plus user profile names, for completion and `profile list`.
pub fn all_profile_names(cat: &Catalogue) -> Vec<String> {
    let mut v: Vec<String> = builtin_names().into_iter().map(str::to_string).collect();
    for n in cat.names() {
        if !v.iter().any(|x| x == n) {
            v.push(n.to_string());
        }
    }
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use moat_policy::{Level, NetworkMode};

    #[test]
    fn xdg_dirs() {
        let home = Path::new("/home/me");
        assert_eq!(
            config_dir(None, Some(home)),
            Some(PathBuf::from("/home/me/.config/moat"))
        );
        assert_eq!(
            config_dir(Some(OsStr::new("/x")), Some(home)),
            Some(PathBuf::from("/x/moat"))
        );
        assert_eq!(
            config_dir(Some(OsStr::new("rel")), Some(home)),
            Some(PathBuf::from("/home/me/.config/moat"))
        );
        assert_eq!(
            state_dir(None, Some(home)),
            Some(PathBuf::from("/home/me/.local/state/moat"))
        );
        assert_eq!(state_dir(None, None), None);
    }

    #[test]
    fn user_profiles_override_builtins_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let profiles = dir.path().join("profiles");
        std::fs::create_dir_all(&profiles).unwrap();
        std::fs::write(
            profiles.join("git.toml"),
            "name = \"git\"\nlevel = \"ro\"\n",
        )
        .unwrap();
        std::fs::write(profiles.join("ssh.toml"), "name = \"ssh\"\nprotected_opt_in = [\"~/.ssh\"]\n[[mounts]]\npath = \"~/.ssh\"\nmode = \"ro\"\n").unwrap();
        std::fs::write(profiles.join("notes.txt"), "ignored").unwrap();
        let cat = load_catalogue(dir.path()).unwrap();
        assert_eq!(cat.get("git").unwrap().base.level, Some(Level::ReadOnly));
        assert_eq!(
            cat.origin("git"),
            Some(&ProfileOrigin::User(profiles.join("git.toml")))
        );
        assert_eq!(cat.origin("cargo"), Some(&ProfileOrigin::BuiltIn));
        assert!(cat.get("ssh").is_some());
        assert_eq!(cat.names().len(), BUILTIN_SOURCES.len() + 1);
    }

    #[test]
    fn user_profile_errors_name_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let profiles = dir.path().join("profiles");
        std::fs::create_dir_all(&profiles).unwrap();
        std::fs::write(
            profiles.join("git.toml"),
            "name = \"git\"\nnetwrok = \"proxy\"\n",
        )
        .unwrap();
        let e = load_catalogue(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(&profiles.join("git.toml").display().to_string()),
            "{e}"
        );
        assert!(e.contains("netwrok"), "{e}");
        std::fs::write(profiles.join("git.toml"), "name = \"gitx\"\n").unwrap();
        let e = load_catalogue(dir.path()).unwrap_err().to_string();
        assert!(e.contains("rename"), "{e}");
    }

    #[test]
    fn missing_config_dir_is_just_the_builtins() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            load_catalogue(&dir.path().join("nope"))
                .unwrap()
                .names()
                .len(),
            BUILTIN_SOURCES.len()
        );
        assert!(load_user_config(&dir.path().join("config.toml"))
            .unwrap()
            .is_none());
    }

    #[test]
    fn user_config_parses_defaults_tools_and_shim_dir() {
        let text = r#"
level = "workspace-write"
network = "proxy"
allow_domains = ["@package-registries"]
deny_domains = ["evil.example"]
env = { RUST_LOG = "info" }
shim_dir = "~/bin/moat-shims"
[tools.git]
allow_domains = ["git.corp.example:443"]
[tools.claude]
allow_domains = ["claude.ai:443", "console.anthropic.com:443"]
"#;
        let c = parse_user_config(text, Path::new("/home/me/.config/moat/config.toml")).unwrap();
        assert_eq!(c.defaults.level, Some(Level::WorkspaceWrite));
        assert_eq!(c.defaults.network, Some(NetworkMode::Proxy));
        assert_eq!(c.tools["git"].allow_domains, ["git.corp.example:443"]);
        assert_eq!(
            c.shim_dir(Path::new("/home/me")),
            PathBuf::from("/home/me/bin/moat-shims")
        );
        let d = parse_user_config("", Path::new("/c.toml")).unwrap();
        assert_eq!(
            d.shim_dir(Path::new("/home/me")),
            PathBuf::from("/home/me/.local/bin")
        );
    }

    #[test]
    fn user_config_may_say_danger_and_unmanaged_but_is_warned() {
        let c = parse_user_config(
            "[tools.x]\nlevel = \"danger-full-access\"\nnetwork = \"unmanaged\"\n",
            Path::new("/c.toml"),
        )
        .unwrap();
        assert_eq!(c.warnings.len(), 2);
        let e = parse_user_config("[tools.x]\nlvl = 1\n", Path::new("/c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/c.toml") && e.contains("`lvl`"), "{e}");
        let e = parse_user_config("shim_dir = \"bin\"\n", Path::new("/c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shim_dir"), "{e}");
    }

    #[test]
    fn program_resolution_skips_the_shim_dir_and_moat() {
        let path = OsStr::new("/home/me/.local/bin:rel:/opt/moat/bin:/usr/bin:/bin");
        let exists = |p: &Path| {
            [
                "/home/me/.local/bin/git",
                "/opt/moat/bin/git",
                "/usr/bin/git",
                "/bin/git",
                "rel/git",
            ]
            .contains(&p.to_str().unwrap())
        };
        let is_moat = |p: &Path| p.starts_with("/opt/moat");
        let shim = Path::new("/home/me/.local/bin/");
        assert_eq!(
            resolve_program("git", path, Some(shim), exists, is_moat),
            Some(PathBuf::from("/usr/bin/git"))
        );
        assert_eq!(
            resolve_program("git", path, None, exists, |_| false),
            Some(PathBuf::from("/home/me/.local/bin/git"))
        );
        assert_eq!(
            resolve_program("a/git", path, None, exists, |_| false),
            None
        );
        assert_eq!(resolve_program("nope", path, None, exists, |_| false), None);
    }
}
