//! Partial setting sets (one per source), the TOML keys they come from, and their validation.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use moat_policy::{Access, Level, NetworkMode, PROTECTED_HOME_PATHS};
use serde::Deserialize;

use crate::error::ConfigError;

/// What a tool's processes may do with inet sockets (enforced by seccomp in
/// the sandbox): moat-policy's type, re-exported here.
pub use moat_policy::NetClass;

/// One extra host path with its access, as written (`~/…`, absolute, or —
/// in a project file — already joined to the project root).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathSpec {
    pub path: PathBuf,
    pub access: Access,
}

/// A partial setting set: what one source (flags, `MOAT_ARGS`, the project
/// file, the user config, a profile, the built-in defaults) says. `None` and
/// empty lists mean "this source says nothing about it".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub level: Option<Level>,
    pub network: Option<NetworkMode>,
    pub net_class: Option<NetClass>,
    /// Allow patterns as written (presets such as `@package-registries` kept).
    pub allow_domains: Vec<String>,
    pub deny_domains: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub pass_env: Vec<String>,
    /// Protected paths (`~/.ssh`) this source lets a mount name.
    pub protected_opt_in: Vec<PathBuf>,
    pub paths: Vec<PathSpec>,
    pub timeout_ms: Option<u64>,
    /// `--upstream-proxy` as given, without credentials (flags only).
    pub upstream_proxy: Option<String>,
    /// Resource limits this source sets (its `mode` is unused: see `limits_mode`).
    pub limits: moat_policy::Limits,
    /// `--limits` / `limits.mode`: strict or best-effort.
    pub limits_mode: Option<moat_policy::LimitsMode>,
    /// `--backend` / `backend`.
    pub backend: Option<moat_policy::Backend>,
}

impl Settings {
    /// The built-in defaults: read-only, network disabled, no net class filter.
    pub fn builtin_defaults() -> Settings {
        Settings {
            level: Some(Level::ReadOnly),
            network: Some(NetworkMode::Disabled),
            net_class: Some(NetClass::Unconfined),
            ..Settings::default()
        }
    }

    /// Only the scalar keys (level, network, net_class, timeout).
    pub fn scalars_only(&self) -> Settings {
        Settings {
            level: self.level,
            network: self.network,
            net_class: self.net_class,
            timeout_ms: self.timeout_ms,
            upstream_proxy: self.upstream_proxy.clone(),
            limits: self.limits.clone(),
            limits_mode: self.limits_mode,
            backend: self.backend,
            ..Settings::default()
        }
    }

    /// Everything but the scalar keys (the grant lists and env).
    pub fn lists_only(&self) -> Settings {
        Settings {
            level: None,
            network: None,
            net_class: None,
            timeout_ms: None,
            upstream_proxy: None,
            limits: moat_policy::Limits::default(),
            limits_mode: None,
            backend: None,
            ..self.clone()
        }
    }

    /// True when this source says nothing at all.
    pub fn is_empty(&self) -> bool {
        *self == Settings::default()
    }

    /// `self` with `over` laid on top (scalars of `over` win, lists are
    /// joined, env keys of `over` win). Used inside one source, e.g. a
    /// profile and its subcommand override.
    pub fn overlaid(&self, over: &Settings) -> Settings {
        let mut out = self.clone();
        out.level = over.level.or(self.level);
        out.network = over.network.or(self.network);
        out.net_class = over.net_class.or(self.net_class);
        out.timeout_ms = over.timeout_ms.or(self.timeout_ms);
        out.upstream_proxy = over.upstream_proxy.clone().or(self.upstream_proxy.clone());
        out.limits = self.limits.merged(&over.limits);
        out.limits_mode = over.limits_mode.or(self.limits_mode);
        out.backend = over.backend.or(self.backend);
        extend_unique(&mut out.allow_domains, &over.allow_domains);
        extend_unique(&mut out.deny_domains, &over.deny_domains);
        extend_unique(&mut out.pass_env, &over.pass_env);
        extend_unique(&mut out.protected_opt_in, &over.protected_opt_in);
        extend_unique(&mut out.paths, &over.paths);
        for (k, v) in &over.env {
            out.env.insert(k.clone(), v.clone());
        }
        out
    }
}

fn extend_unique<T: Clone + PartialEq>(into: &mut Vec<T>, from: &[T]) {
    for x in from {
        if !into.contains(x) {
            into.push(x.clone());
        }
    }
}

/// `ro`/`rw` as a TOML mount mode.
pub(crate) fn access_str(a: Access) -> &'static str {
    match a {
        Access::ReadOnly => "ro",
        Access::ReadWrite => "rw",
    }
}

/// One `[[mounts]]` entry as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMount {
    pub path: String,
    pub mode: String,
    /// Profiles only: what to create when the path is missing (`dir`,
    /// `file`); read by `profile.rs`, see [`crate::FirstUse`].
    #[serde(default)]
    pub create: Option<String>,
    /// Profiles only: the tool replaces this file by an atomic rename.
    #[serde(default)]
    pub replaced_by_rename: bool,
    /// Profiles only: JSON keys of the synced file the host tool trusts to
    /// run commands; see [`crate::FirstUse::host_executed_keys`].
    #[serde(default)]
    pub host_executed_keys: Vec<String>,
}

/// The overridable keys shared by a profile's `[subcommands.X]`, the user
/// config (top level and `[tools.X]`) and the project file (top level and
/// `[tools.X]`). `ro`/`rw` are shorthand for `[[mounts]]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOverrides {
    pub level: Option<String>,
    pub network: Option<String>,
    pub net_class: Option<String>,
    #[serde(default)]
    pub allow_domains: Vec<String>,
    #[serde(default)]
    pub deny_domains: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub pass_env: Vec<String>,
    #[serde(default)]
    pub protected_opt_in: Vec<String>,
    #[serde(default)]
    pub mounts: Vec<RawMount>,
    #[serde(default)]
    pub ro: Vec<String>,
    #[serde(default)]
    pub rw: Vec<String>,
    pub timeout: Option<String>,
    pub limits: Option<RawLimits>,
    pub backend: Option<String>,
}

/// A `[limits]` table as written: sizes as strings (`"2G"`), counts as
/// integers, `cpu_time` as a duration (`"10m"`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub memory: Option<String>,
    pub pids: Option<u64>,
    pub cpu_time: Option<String>,
    pub file_size: Option<String>,
    pub open_files: Option<u64>,
    pub tmp_size: Option<String>,
    pub output: Option<String>,
    /// `strict` or `best-effort`.
    pub mode: Option<String>,
}

/// Declares a file-level TOML struct: the overridable keys of
/// [`RawOverrides`] plus the file's own extra keys, with `into_parts`
/// splitting the two. (serde's `flatten` does not work with
/// `deny_unknown_fields`, hence the macro.)
macro_rules! raw_file_struct {
    ($name:ident { $($extra:ident : $ty:ty),* $(,)? }) => {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(crate) struct $name {
            level: Option<String>,
            network: Option<String>,
            net_class: Option<String>,
            #[serde(default)]
            allow_domains: Vec<String>,
            #[serde(default)]
            deny_domains: Vec<String>,
            #[serde(default)]
            env: std::collections::BTreeMap<String, String>,
            #[serde(default)]
            pass_env: Vec<String>,
            #[serde(default)]
            protected_opt_in: Vec<String>,
            #[serde(default)]
            mounts: Vec<$crate::settings::RawMount>,
            #[serde(default)]
            ro: Vec<String>,
            #[serde(default)]
            rw: Vec<String>,
            timeout: Option<String>,
            limits: Option<$crate::settings::RawLimits>,
            backend: Option<String>,
            $(#[serde(default)] $extra: $ty,)*
        }

        impl $name {
            #[allow(unused_parens)]
            fn into_parts(self) -> ($crate::settings::RawOverrides, ($($ty),*)) {
                (
                    $crate::settings::RawOverrides {
                        level: self.level,
                        network: self.network,
                        net_class: self.net_class,
                        allow_domains: self.allow_domains,
                        deny_domains: self.deny_domains,
                        env: self.env,
                        pass_env: self.pass_env,
                        protected_opt_in: self.protected_opt_in,
                        mounts: self.mounts,
                        ro: self.ro,
                        rw: self.rw,
                        timeout: self.timeout,
                        limits: self.limits,
                        backend: self.backend,
                    },
                    ($(self.$extra),*),
                )
            }
        }
    };
}
pub(crate) use raw_file_struct;

/// Which kind of file a setting set comes from: it decides what is allowed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind<'a> {
    /// A tool profile (built-in or the user's): no danger level.
    Profile,
    /// The user's own config: anything.
    Config,
    /// A project file: only grants inside `root`, nothing that widens past the project.
    Project {
        root: &'a Path,
        home: Option<&'a Path>,
    },
}

/// Where a setting set is being read from, for error messages.
pub(crate) struct Ctx<'a> {
    pub file: &'a str,
    /// Key prefix such as `subcommands.fetch.` or `tools.git.`.
    pub prefix: String,
    pub kind: Kind<'a>,
}

impl Ctx<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}{k}", self.prefix)
    }

    fn invalid(&self, k: &str, value: impl fmt::Display, why: impl Into<String>) -> ConfigError {
        ConfigError::invalid(self.file, &self.key(k), value, why)
    }

    fn refused(&self, k: &str, value: impl fmt::Display, why: impl Into<String>) -> ConfigError {
        ConfigError::ProjectRefused {
            file: self.file.to_string(),
            key: self.key(k),
            value: value.to_string(),
            why: why.into(),
        }
    }

    fn is_project(&self) -> bool {
        matches!(self.kind, Kind::Project { .. })
    }
}

/// Parses a level name: the profile short forms `ro`, `rw`, `contained`,
/// `danger`, and the full names (`read-only`, …).
pub fn parse_level(s: &str) -> Option<Level> {
    match s {
        "ro" => Some(Level::ReadOnly),
        "rw" => Some(Level::WorkspaceWrite),
        "contained" => Some(Level::WorkspaceContained),
        "danger" => Some(Level::DangerFullAccess),
        _ => Level::parse(s),
    }
}

/// A TOML-quoted rendering of a value for error messages.
fn q(s: &str) -> String {
    format!("{s:?}")
}

impl RawOverrides {
    /// Validates and types the keys; returns the settings and warnings (e.g.
    /// an `unmanaged` network in a profile).
    pub(crate) fn into_settings(
        self,
        ctx: &Ctx<'_>,
    ) -> Result<(Settings, Vec<String>), ConfigError> {
        let mut warnings = Vec::new();
        let mut out = Settings::default();

        if let Some(l) = &self.level {
            let level = parse_level(l).ok_or_else(|| {
                ctx.invalid(
                    "level",
                    q(l),
                    "use ro, rw or contained (read-only, workspace-write, workspace-contained)",
                )
            })?;
            if level == Level::DangerFullAccess {
                match ctx.kind {
                    Kind::Profile => {
                        return Err(ctx.invalid(
                            "level",
                            q(l),
                            "a profile cannot turn the sandbox off; use ro, rw or contained, and pass --policy danger-full-access yourself when you mean it",
                        ))
                    }
                    Kind::Project { .. } => {
                        return Err(ctx.refused("level", q(l), "danger-full-access turns the sandbox off"))
                    }
                    Kind::Config => warnings.push(format!(
                        "{}: {} = {}: the sandbox is off for every run this applies to",
                        ctx.file,
                        ctx.key("level"),
                        q(l)
                    )),
                }
            }
            out.level = Some(level);
        }

        if let Some(n) = &self.network {
            let mode = NetworkMode::parse(n)
                .ok_or_else(|| ctx.invalid("network", q(n), "use disabled, proxy or unmanaged"))?;
            if mode == NetworkMode::Unmanaged {
                if ctx.is_project() {
                    return Err(ctx.refused(
                        "network",
                        q(n),
                        "unmanaged gives the command the host network unfiltered",
                    ));
                }
                warnings.push(format!(
                    "{}: {} = {}: the tool gets the host network unfiltered; prefer network = \"proxy\" with allow_domains",
                    ctx.file,
                    ctx.key("network"),
                    q(n)
                ));
            }
            out.network = Some(mode);
        }

        if let Some(c) = &self.net_class {
            let class = NetClass::parse(c).ok_or_else(|| {
                ctx.invalid(
                    "net_class",
                    q(c),
                    "use net-denied, net-connect, net-listen or unconfined",
                )
            })?;
            if class == NetClass::Unconfined && ctx.is_project() {
                return Err(ctx.refused(
                    "net_class",
                    q(c),
                    "unconfined removes the tool's socket filter",
                ));
            }
            out.net_class = Some(class);
        }

        for (key, list) in [
            ("allow_domains", &self.allow_domains),
            ("deny_domains", &self.deny_domains),
        ] {
            for d in list {
                moat_policy::net::expand_presets(std::slice::from_ref(d))
                    .map_err(|e| ctx.invalid(key, q(d), e.to_string()))?;
            }
        }
        out.allow_domains = self.allow_domains;
        out.deny_domains = self.deny_domains;

        for (k, v) in &self.env {
            check_env_name(k).map_err(|why| ctx.invalid("env", q(k), why))?;
            if v.contains('\0') {
                return Err(ctx.invalid(
                    &format!("env.{k}"),
                    q(v),
                    "values cannot contain a NUL byte",
                ));
            }
        }
        out.env = self.env;

        for k in &self.pass_env {
            check_env_name(k).map_err(|why| ctx.invalid("pass_env", q(k), why))?;
            if ctx.is_project() && moat_policy::is_secret_env_name(k) {
                return Err(ctx.refused(
                    "pass_env",
                    q(k),
                    "the name looks like a secret, and a committed file must not pull host secrets into a run",
                ));
            }
        }
        out.pass_env = self.pass_env;

        for p in &self.protected_opt_in {
            if ctx.is_project() {
                return Err(ctx.refused(
                    "protected_opt_in",
                    q(p),
                    "protected paths hold credentials and agent state",
                ));
            }
            let path = PathBuf::from(p);
            if protected_exact(&path, None).is_none() {
                return Err(ctx.invalid(
                    "protected_opt_in",
                    q(p),
                    format!(
                        "name one of the protected paths exactly, as ~/PATH: {}",
                        protected_list()
                    ),
                ));
            }
            out.protected_opt_in.push(path);
        }

        let mounts = self
            .mounts
            .iter()
            .map(|m| {
                (
                    format!("mounts[{}]", m.path),
                    m.path.as_str(),
                    Some(m.mode.as_str()),
                )
            })
            .chain(
                self.ro
                    .iter()
                    .map(|p| ("ro".to_string(), p.as_str(), Some("ro"))),
            )
            .chain(
                self.rw
                    .iter()
                    .map(|p| ("rw".to_string(), p.as_str(), Some("rw"))),
            );
        if !matches!(ctx.kind, Kind::Profile) {
            if let Some(m) = self
                .mounts
                .iter()
                .find(|m| m.create.is_some() || m.replaced_by_rename)
            {
                return Err(ctx.invalid(
                    &format!("mounts[{}]", m.path),
                    q(&m.path),
                    "create and replaced_by_rename belong in a tool profile; create the path yourself",
                ));
            }
        }
        for (key, raw, mode) in mounts {
            let access = match mode {
                Some("ro") => Access::ReadOnly,
                Some("rw") => Access::ReadWrite,
                other => {
                    return Err(ctx.invalid(
                        &format!("{key}.mode"),
                        q(other.unwrap_or("")),
                        "use \"ro\" or \"rw\"",
                    ))
                }
            };
            let path = mount_path(ctx, &key, raw)?;
            let spec = PathSpec { path, access };
            if let Some(prev) = out.paths.iter().find(|p| p.path == spec.path) {
                if prev.access != spec.access {
                    return Err(ctx.invalid(
                        &key,
                        q(raw),
                        format!(
                            "listed both {} and {}; keep one",
                            access_str(prev.access),
                            access_str(spec.access)
                        ),
                    ));
                }
                continue;
            }
            out.paths.push(spec);
        }

        if let Some(t) = &self.timeout {
            out.timeout_ms = Some(
                moat_policy::parse_duration(t)
                    .map_err(|e| ctx.invalid("timeout", q(t), e.to_string()))?,
            );
        }
        if let Some(b) = &self.backend {
            if !matches!(ctx.kind, Kind::Config) {
                // Which backend a host uses is the user's call, not a tool's or a project's.
                return Err(ctx.invalid(
                    "backend",
                    q(b),
                    "only your own config (or --backend) chooses the backend",
                ));
            }
            out.backend = Some(moat_policy::Backend::parse(b).ok_or_else(|| {
                ctx.invalid(
                    "backend",
                    q(b),
                    "use \"namespaces\", \"landlock\" or \"auto\"",
                )
            })?);
        }
        if let Some(l) = &self.limits {
            let size = |k: &str, v: &Option<String>| -> Result<Option<u64>, ConfigError> {
                v.as_ref()
                    .map(|s| {
                        moat_policy::parse_size(s)
                            .map_err(|e| ctx.invalid(&format!("limits.{k}"), q(s), e.to_string()))
                    })
                    .transpose()
            };
            let count = |k: &str, v: Option<u64>| -> Result<Option<u64>, ConfigError> {
                match v {
                    Some(0) => {
                        Err(ctx.invalid(&format!("limits.{k}"), 0, "use a whole number above zero"))
                    }
                    other => Ok(other),
                }
            };
            out.limits = moat_policy::Limits {
                memory: size("memory", &l.memory)?,
                pids: count("pids", l.pids)?,
                cpu_time_ms: l
                    .cpu_time
                    .as_ref()
                    .map(|t| {
                        moat_policy::parse_duration(t)
                            .map_err(|e| ctx.invalid("limits.cpu_time", q(t), e.to_string()))
                    })
                    .transpose()?,
                file_size: size("file_size", &l.file_size)?,
                open_files: count("open_files", l.open_files)?,
                tmp_size: size("tmp_size", &l.tmp_size)?,
                output: size("output", &l.output)?,
                ..Default::default()
            };
            if let Some(m) = &l.mode {
                if matches!(ctx.kind, Kind::Project { .. }) {
                    // A project may add limits, never relax the user's.
                    return Err(ctx.invalid(
                        "limits.mode",
                        q(m),
                        "a project file cannot choose how strictly limits hold; set it in your own config or with --limits",
                    ));
                }
                out.limits_mode = Some(moat_policy::LimitsMode::parse(m).ok_or_else(|| {
                    ctx.invalid("limits.mode", q(m), "use \"strict\" or \"best-effort\"")
                })?);
            }
        }
        Ok((out, warnings))
    }
}

/// Validates one mount path and puts it in the form the settings keep.
fn mount_path(ctx: &Ctx<'_>, key: &str, raw: &str) -> Result<PathBuf, ConfigError> {
    if raw.is_empty() || raw.contains('\0') {
        return Err(ctx.invalid(key, q(raw), "a path is non-empty and has no NUL byte"));
    }
    let p = PathBuf::from(raw);
    match ctx.kind {
        Kind::Profile | Kind::Config => {
            if !(p.is_absolute() || is_tilde(&p)) {
                return Err(ctx.invalid(
                    key,
                    q(raw),
                    "write an absolute path or one starting with ~/",
                ));
            }
            if p.components().any(|c| c == Component::ParentDir) {
                return Err(ctx.invalid(key, q(raw), "write the path without '..'"));
            }
            Ok(normalize_lexically(&p))
        }
        Kind::Project { root, home } => {
            let joined = if is_tilde(&p) {
                match home {
                    Some(h) => expand_tilde(&p, h),
                    None => {
                        return Err(ctx.invalid(
                            key,
                            q(raw),
                            "~ cannot be expanded: HOME is unknown",
                        ))
                    }
                }
            } else if p.is_absolute() {
                p
            } else {
                root.join(p)
            };
            Ok(normalize_lexically(&joined))
        }
    }
}

pub(crate) fn check_env_name(k: &str) -> Result<(), &'static str> {
    if k.is_empty() || k.contains('=') || k.contains('\0') {
        return Err("a variable name is non-empty and contains no '=' or NUL");
    }
    Ok(())
}

/// True for `~` and `~/…`.
pub fn is_tilde(p: &Path) -> bool {
    p.components().next() == Some(Component::Normal(std::ffi::OsStr::new("~")))
}

/// `~` and `~/REST` become `HOME` and `HOME/REST`; other paths are returned as they are.
pub fn expand_tilde(p: &Path, home: &Path) -> PathBuf {
    match p.strip_prefix("~") {
        Ok(rest) if is_tilde(p) => {
            if rest.as_os_str().is_empty() {
                home.to_path_buf()
            } else {
                home.join(rest)
            }
        }
        _ => p.to_path_buf(),
    }
}

/// Removes `.` and resolves `..` lexically (never above the root), and drops
/// trailing slashes. Symlinks are not looked at.
pub fn normalize_lexically(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Prefix(x) => out.push(x.as_os_str()),
            Component::RootDir => out.push("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                let is_root = out.as_os_str() == "/";
                if !is_root && !out.pop() {
                    out.push("..");
                }
            }
            Component::Normal(n) => out.push(n),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// The home-relative part of `p` (`~/X` or, when `home` is known, `HOME/X`).
fn home_rel<'a>(p: &'a Path, home: Option<&Path>) -> Option<&'a Path> {
    if is_tilde(p) {
        return p.strip_prefix("~").ok();
    }
    home.and_then(|h| p.strip_prefix(h).ok())
}

/// The protected entry `p` names exactly (`~/.ssh`, or `HOME/.ssh` with `home`).
pub fn protected_exact(p: &Path, home: Option<&Path>) -> Option<&'static str> {
    let rel = home_rel(p, home)?;
    PROTECTED_HOME_PATHS
        .iter()
        .copied()
        .find(|x| rel == Path::new(x))
}

/// The protected entry `p` lies strictly inside, if any.
pub fn protected_containing(p: &Path, home: Option<&Path>) -> Option<&'static str> {
    let rel = home_rel(p, home)?;
    PROTECTED_HOME_PATHS
        .iter()
        .copied()
        .find(|x| rel != Path::new(x) && rel.starts_with(x))
}

pub(crate) fn protected_list() -> String {
    PROTECTED_HOME_PATHS
        .iter()
        .map(|p| format!("~/{p}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_normalization() {
        assert_eq!(
            normalize_lexically(Path::new("/a/b/../c/./d/")),
            PathBuf::from("/a/c/d")
        );
        assert_eq!(normalize_lexically(Path::new("/../..")), PathBuf::from("/"));
        assert_eq!(
            normalize_lexically(Path::new("/p/../other")),
            PathBuf::from("/other")
        );
        assert_eq!(
            normalize_lexically(Path::new("~/.cargo//registry")),
            PathBuf::from("~/.cargo/registry")
        );
    }

    #[test]
    fn tilde_expansion() {
        let h = Path::new("/home/me");
        assert_eq!(expand_tilde(Path::new("~"), h), PathBuf::from("/home/me"));
        assert_eq!(
            expand_tilde(Path::new("~/.ssh"), h),
            PathBuf::from("/home/me/.ssh")
        );
        assert_eq!(expand_tilde(Path::new("/x/~"), h), PathBuf::from("/x/~"));
        assert_eq!(
            expand_tilde(Path::new("~other/x"), h),
            PathBuf::from("~other/x")
        );
    }

    #[test]
    fn protected_matching() {
        assert_eq!(protected_exact(Path::new("~/.ssh"), None), Some(".ssh"));
        assert_eq!(
            protected_exact(Path::new("/home/me/.ssh"), Some(Path::new("/home/me"))),
            Some(".ssh")
        );
        assert_eq!(protected_exact(Path::new("~/.ssh/id"), None), None);
        assert_eq!(
            protected_containing(Path::new("~/.ssh/id"), None),
            Some(".ssh")
        );
        assert_eq!(protected_containing(Path::new("~/.sshx"), None), None);
    }

    #[test]
    fn levels_parse_short_and_long() {
        assert_eq!(parse_level("ro"), Some(Level::ReadOnly));
        assert_eq!(parse_level("workspace-write"), Some(Level::WorkspaceWrite));
        assert_eq!(parse_level("contained"), Some(Level::WorkspaceContained));
        assert_eq!(parse_level("danger"), Some(Level::DangerFullAccess));
        assert_eq!(parse_level("nope"), None);
    }
}
