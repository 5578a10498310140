//! Precedence: merging every source into one [`Resolved`] set of grants, each with the source it came from, and from it a `PolicyRequest`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use moat_policy::net::{expand_presets, DomainPattern};
use moat_policy::{Access, Level, NetworkMode, PolicyRequest};
use serde::{Serialize, Serializer};

use crate::error::ConfigError;
use crate::load::UserConfig;
use crate::profile::Profile;
use crate::project::ProjectFile;
use crate::settings::{access_str, expand_tilde, protected_exact, NetClass, PathSpec, Settings};

/// Where a grant came from, as `moat profile show` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// A command-line flag.
    Flag,
    /// The `MOAT_ARGS` environment variable.
    MoatArgs,
    /// The (trusted) project file at this path.
    Project(PathBuf),
    /// The user config at this path.
    Config(PathBuf),
    /// The tool's profile.
    Profile(String),
    /// moat's built-in defaults.
    Default,
    /// The program's own install tree, added read-only at
    /// workspace-contained so the tool can start.
    InstallTree,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag => f.write_str("flag"),
            Source::MoatArgs => f.write_str("MOAT_ARGS"),
            Source::Project(p) => write!(f, "project:{}", p.display()),
            Source::Config(p) => write!(f, "config:{}", p.display()),
            Source::Profile(n) => write!(f, "profile:{n}"),
            Source::Default => f.write_str("default"),
            Source::InstallTree => f.write_str("install-tree"),
        }
    }
}

impl Serialize for Source {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// A value and the source that decided it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Sourced<T> {
    pub value: T,
    pub source: Source,
}

/// Every source of settings for one run. `project` must already be trusted
/// (the CLI refuses to run with an untrusted one). `home` is the caller's
/// home, used to compare `~/x` with `/home/me/x`; `None` compares as written.
/// `defaults: None` means [`Settings::builtin_defaults`].
#[derive(Clone, Debug, Default)]
pub struct Sources {
    pub flags: Option<Settings>,
    pub moat_args: Option<Settings>,
    pub project: Option<ProjectFile>,
    pub user_config: Option<UserConfig>,
    pub profile: Option<Profile>,
    pub defaults: Option<Settings>,
    pub home: Option<PathBuf>,
}

/// The merged settings of one run, each grant with its source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Resolved {
    pub tool: Option<String>,
    /// The profile's program (to resolve on PATH), when a profile applies.
    pub program: Option<String>,
    /// The profile subcommand override that applied (argv1), if any.
    pub subcommand: Option<String>,
    pub level: Sourced<Level>,
    pub network: Sourced<NetworkMode>,
    pub net_class: Sourced<NetClass>,
    pub allow_domains: Vec<Sourced<String>>,
    pub deny_domains: Vec<Sourced<String>>,
    /// Paths as written (`~/…` or absolute), read-only.
    pub ro: Vec<Sourced<PathBuf>>,
    /// Paths as written, read-write.
    pub rw: Vec<Sourced<PathBuf>>,
    pub env: BTreeMap<String, Sourced<String>>,
    pub pass_env: Vec<Sourced<String>>,
    pub protected_opt_in: Vec<Sourced<PathBuf>>,
    pub timeout_ms: Option<Sourced<u64>>,
    /// Each resource limit from the strongest source that sets it.
    pub limits: Vec<Sourced<(&'static str, u64)>>,
    /// `--limits` / `limits.mode`.
    pub limits_mode: Option<Sourced<moat_policy::LimitsMode>>,
    /// `--backend` / `backend`.
    pub backend: Option<Sourced<moat_policy::Backend>>,
    /// `--upstream-proxy` (without credentials), from a flag.
    pub upstream_proxy: Option<Sourced<String>>,
    /// With `MOAT_ARGS`: the paths the other sources grant, which every
    /// `MOAT_ARGS` path must lie under once symlinks are resolved.
    #[serde(skip)]
    pub moat_args_base: Vec<(PathBuf, Access)>,
    /// Things that were dropped or adjusted, for `moat profile show`.
    pub notes: Vec<String>,
}

/// One line of `moat profile show`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GrantLine {
    pub grant: &'static str,
    pub value: String,
    pub source: String,
}

/// What [`Resolved::to_policy_request`] built, and what it left out.
#[derive(Clone, Debug)]
pub struct BuiltRequest {
    pub request: PolicyRequest,
    /// Paths from a profile, the user config or the project file that do not
    /// exist on this host (a cache not created yet); they are left out.
    pub skipped_missing: Vec<Sourced<PathBuf>>,
}

type Layer = (Source, Settings);

/// The sources in precedence order, strongest first. Top-level scalar keys
/// of the project file and the user config are defaults that yield to the
/// profile; their grant lists and `[tools.NAME]` rank above it.
fn layers(tool: Option<&str>, argv1: Option<&str>, s: &Sources) -> Vec<Layer> {
    let mut out = Vec::new();
    if let Some(f) = &s.flags {
        out.push((Source::Flag, f.clone()));
    }
    if let Some(m) = &s.moat_args {
        out.push((Source::MoatArgs, m.clone()));
    }
    let tool_over = |tools: &BTreeMap<String, Settings>| {
        tool.and_then(|t| tools.get(t)).cloned().unwrap_or_default()
    };
    if let Some(p) = &s.project {
        out.push((
            Source::Project(p.path.clone()),
            p.defaults.lists_only().overlaid(&tool_over(&p.tools)),
        ));
    }
    if let Some(c) = &s.user_config {
        out.push((
            Source::Config(c.path.clone()),
            c.defaults.lists_only().overlaid(&tool_over(&c.tools)),
        ));
    }
    if let Some(p) = &s.profile {
        out.push((Source::Profile(p.name.clone()), p.settings_for(argv1)));
    }
    if let Some(p) = &s.project {
        out.push((Source::Project(p.path.clone()), p.defaults.scalars_only()));
    }
    if let Some(c) = &s.user_config {
        out.push((Source::Config(c.path.clone()), c.defaults.scalars_only()));
    }
    out.push((
        Source::Default,
        s.defaults
            .clone()
            .unwrap_or_else(Settings::builtin_defaults),
    ));
    out.push((Source::Default, Settings::builtin_defaults()));
    out
}

fn key_of(p: &Path, home: Option<&Path>) -> PathBuf {
    match home {
        Some(h) => expand_tilde(p, h),
        None => p.to_path_buf(),
    }
}

fn first<T>(layers: &[Layer], get: impl Fn(&Settings) -> Option<T>) -> Option<Sourced<T>> {
    layers.iter().find_map(|(src, s)| {
        get(s).map(|value| Sourced {
            value,
            source: src.clone(),
        })
    })
}

/// Merges `layers` (strongest first) without the MOAT_ARGS check.
fn merge(layers: &[Layer], home: Option<&Path>) -> Result<Resolved, ConfigError> {
    // The last layer is always moat's own defaults, so these fallbacks only
    // matter for a hand-built layer list.
    let default = |value| Sourced {
        value,
        source: Source::Default,
    };
    let level = first(layers, |s| s.level).unwrap_or_else(|| default(Level::ReadOnly));
    let network = first(layers, |s| s.network).unwrap_or(Sourced {
        value: NetworkMode::Disabled,
        source: Source::Default,
    });
    let net_class = first(layers, |s| s.net_class).unwrap_or(Sourced {
        value: NetClass::Unconfined,
        source: Source::Default,
    });
    let timeout_ms = first(layers, |s| s.timeout_ms);
    let limits = moat_policy::Limits::default()
        .by_name()
        .iter()
        .filter_map(|(name, _)| {
            let name = *name;
            first(layers, |s| {
                s.limits
                    .by_name()
                    .iter()
                    .find(|(n, _)| *n == name)
                    .and_then(|(_, v)| v.map(|v| (name, v)))
            })
        })
        .collect();
    let limits_mode = first(layers, |s| s.limits_mode);
    let backend = first(layers, |s| s.backend);
    let upstream_proxy = first(layers, |s| s.upstream_proxy.clone());
    let mut notes = Vec::new();
    let rank = |get: fn(&Settings) -> bool| {
        layers
            .iter()
            .position(|(_, s)| get(s))
            .unwrap_or(usize::MAX)
    };
    let mut net_class = net_class;
    if level.value == Level::DangerFullAccess
        && net_class.value != NetClass::Unconfined
        && rank(|s| s.net_class.is_some()) > rank(|s| s.level.is_some())
    {
        // danger-full-access confines nothing, so a weaker source's net class
        // cannot apply; a stronger one is left for the policy to refuse.
        notes.push(format!(
            "net_class {} (from {}) does not apply at {} (from {})",
            net_class.value.as_str(),
            net_class.source,
            level.value,
            level.source
        ));
        net_class = Sourced {
            value: NetClass::Unconfined,
            source: level.source.clone(),
        };
    }
    let mut network = network;
    if level.value == Level::DangerFullAccess
        && network.value != NetworkMode::Unmanaged
        && rank(|s| s.network.is_some()) > rank(|s| s.level.is_some())
    {
        // Likewise danger-full-access runs on the host network.
        notes.push(format!(
            "network {} (from {}) does not apply at {} (from {})",
            network.value, network.source, level.value, level.source
        ));
        network = Sourced {
            value: NetworkMode::Unmanaged,
            source: level.source.clone(),
        };
    }

    // Paths: one entry per path (compared with ~ expanded); two modes is an error.
    let mut paths: Vec<(PathBuf, Sourced<PathSpec>)> = Vec::new();
    for (src, s) in layers {
        for spec in &s.paths {
            let key = key_of(&spec.path, home);
            if let Some((_, prev)) = paths.iter().find(|(k, _)| *k == key) {
                if prev.value.access != spec.access {
                    return Err(ConfigError::Conflict {
                        path: spec.path.clone(),
                        first_mode: access_str(prev.value.access),
                        first_source: prev.source.to_string(),
                        second_mode: access_str(spec.access),
                        second_source: src.to_string(),
                    });
                }
                continue;
            }
            paths.push((
                key,
                Sourced {
                    value: spec.clone(),
                    source: src.clone(),
                },
            ));
        }
    }

    let mut protected_opt_in: Vec<Sourced<PathBuf>> = Vec::new();
    let mut push_opt_in = |p: &Path, src: &Source| {
        if !protected_opt_in
            .iter()
            .any(|o| key_of(&o.value, home) == key_of(p, home))
        {
            protected_opt_in.push(Sourced {
                value: p.to_path_buf(),
                source: src.clone(),
            });
        }
    };
    for (src, s) in layers {
        for p in &s.protected_opt_in {
            push_opt_in(p, src);
        }
        if *src == Source::Flag {
            // Naming a protected path itself on the command line opts it in, as with `moat exec`.
            for spec in &s.paths {
                if protected_exact(&spec.path, home).is_some() {
                    push_opt_in(&spec.path, src);
                }
            }
        }
    }
    for (key, p) in &paths {
        if let Some(prot) =
            protected_exact(key, home).or_else(|| protected_exact(&p.value.path, None))
        {
            let opted = protected_opt_in
                .iter()
                .any(|o| key_of(&o.value, home) == *key);
            if !opted {
                return Err(ConfigError::ProtectedNotOptedIn {
                    path: p.value.path.clone(),
                    protected: format!("~/{prot}"),
                    source_label: p.source.to_string(),
                });
            }
        }
    }

    let mut domains = |get: fn(&Settings) -> &Vec<String>,
                       what: &str|
     -> Result<Vec<Sourced<String>>, ConfigError> {
        let mut out: Vec<Sourced<String>> = Vec::new();
        for (src, s) in layers {
            for d in get(s) {
                if out.iter().any(|x| x.value == *d) {
                    continue;
                }
                if network.value != NetworkMode::Proxy {
                    if matches!(src, Source::Flag | Source::MoatArgs) {
                        return Err(ConfigError::NeedsProxy {
                            what: format!("{what} {d}"),
                            source_label: src.to_string(),
                            network: network.value.as_str(),
                            network_source: network.source.to_string(),
                        });
                    }
                    notes.push(format!(
                        "{what} {d} (from {src}) does not apply: the network is {} (from {})",
                        network.value, network.source
                    ));
                    continue;
                }
                out.push(Sourced {
                    value: d.clone(),
                    source: src.clone(),
                });
            }
        }
        Ok(out)
    };
    let allow_domains = domains(|s| &s.allow_domains, "--allow-domain")?;
    let deny_domains = domains(|s| &s.deny_domains, "--deny-domain")?;

    let mut env: BTreeMap<String, Sourced<String>> = BTreeMap::new();
    let mut pass_env: Vec<Sourced<String>> = Vec::new();
    for (src, s) in layers {
        for (k, v) in &s.env {
            env.entry(k.clone()).or_insert_with(|| Sourced {
                value: v.clone(),
                source: src.clone(),
            });
        }
        for k in &s.pass_env {
            if !pass_env.iter().any(|x| x.value == *k) {
                pass_env.push(Sourced {
                    value: k.clone(),
                    source: src.clone(),
                });
            }
        }
    }

    let mut ro = Vec::new();
    let mut rw = Vec::new();
    for (_, p) in paths {
        let item = Sourced {
            value: p.value.path,
            source: p.source,
        };
        match p.value.access {
            Access::ReadOnly => ro.push(item),
            Access::ReadWrite => rw.push(item),
        }
    }

    Ok(Resolved {
        tool: None,
        program: None,
        subcommand: None,
        level,
        network,
        net_class,
        allow_domains,
        deny_domains,
        ro,
        rw,
        env,
        pass_env,
        protected_opt_in,
        timeout_ms,
        limits,
        limits_mode,
        backend,
        upstream_proxy,
        moat_args_base: Vec::new(),
        notes,
    })
}

/// Whether level `new` gives no more than `base`. Read-only and
/// workspace-contained are both narrower than workspace-write but not
/// comparable with each other; danger-full-access is the widest.
pub fn level_within(new: Level, base: Level) -> bool {
    new == base
        || base == Level::DangerFullAccess
        || (base == Level::WorkspaceWrite
            && matches!(new, Level::ReadOnly | Level::WorkspaceContained))
}

/// Whether network mode `new` gives no more than `base`
/// (disabled < proxy < unmanaged).
pub fn network_within(new: NetworkMode, base: NetworkMode) -> bool {
    network_rank(new) <= network_rank(base)
}

/// Whether every allow pattern in `new` is already let through by `base`.
pub fn domains_within(new: &[DomainPattern], base: &[DomainPattern]) -> bool {
    new.iter().all(|p| domain_covered(p, base))
}

fn network_rank(n: NetworkMode) -> u8 {
    match n {
        NetworkMode::Disabled => 0,
        NetworkMode::Proxy => 1,
        NetworkMode::Unmanaged => 2,
    }
}

/// Whether `base` (allow patterns) already lets through everything `pat` does.
fn domain_covered(pat: &DomainPattern, base: &[DomainPattern]) -> bool {
    let text = pat.as_str();
    let host = match pat.port() {
        Some(p) => text.strip_suffix(&format!(":{p}")).unwrap_or(text),
        None => text,
    };
    base.iter().any(|b| {
        b.as_str() == text
            || match pat.port() {
                Some(port) => b.matches(host, port),
                None => b.port().is_none() && b.matches(host, 1),
            }
    })
}

/// Refuses every part of `moat_args` that gives more than `baseline` (the
/// merge of the project file, the user config, the profile and the
/// defaults), unless the user config or the project file names that exact
/// level or network. Scalars also set by a flag are not checked: the flag wins.
fn check_moat_args(
    moat_args: &Settings,
    flags: Option<&Settings>,
    baseline: &Resolved,
    trusted: &[&Layer],
    home: Option<&Path>,
) -> Result<(), ConfigError> {
    let widen = |what: String| Err(ConfigError::MoatArgsWidening { what });
    let flag_sets = |get: fn(&Settings) -> bool| flags.is_some_and(get);

    if let Some(l) = moat_args.level {
        let granted = trusted.iter().any(|(_, s)| s.level == Some(l));
        if !flag_sets(|f| f.level.is_some()) && !level_within(l, baseline.level.value) && !granted {
            return widen(format!(
                "--policy {l} is not narrower than {} (from {})",
                baseline.level.value, baseline.level.source
            ));
        }
    }
    if let Some(n) = moat_args.network {
        let granted = trusted.iter().any(|(_, s)| s.network == Some(n));
        if !flag_sets(|f| f.network.is_some())
            && network_rank(n) > network_rank(baseline.network.value)
            && !granted
        {
            return widen(format!(
                "--network {n} gives more than {} (from {})",
                baseline.network.value, baseline.network.source
            ));
        }
    }
    let base_paths: Vec<(PathBuf, Access)> = baseline
        .ro
        .iter()
        .map(|p| (key_of(&p.value, home), Access::ReadOnly))
        .chain(
            baseline
                .rw
                .iter()
                .map(|p| (key_of(&p.value, home), Access::ReadWrite)),
        )
        .collect();
    for spec in &moat_args.paths {
        let key = key_of(&spec.path, home);
        let covered = base_paths.iter().any(|(b, a)| {
            key.starts_with(b) && (*a == Access::ReadWrite || spec.access == Access::ReadOnly)
        });
        if !covered {
            let flag = if spec.access == Access::ReadOnly {
                "--ro"
            } else {
                "--rw"
            };
            return widen(format!(
                "{flag} {} is not granted by any other source",
                spec.path.display()
            ));
        }
    }
    let base_allow: Vec<String> = baseline
        .allow_domains
        .iter()
        .map(|d| d.value.clone())
        .collect();
    let base_allow = expand_presets(&base_allow).unwrap_or_default();
    for d in &moat_args.allow_domains {
        let pats = expand_presets(std::slice::from_ref(d)).map_err(|e| ConfigError::MoatArgs {
            arg: format!("--allow-domain {d}"),
            why: e.to_string(),
        })?;
        if let Some(p) = pats.iter().find(|p| !domain_covered(p, &base_allow)) {
            return widen(format!(
                "--allow-domain {d} adds {p}, which no other source allows"
            ));
        }
    }
    for k in &moat_args.pass_env {
        if !baseline.pass_env.iter().any(|x| x.value == *k) {
            return widen(format!(
                "--pass-env {k} lets a host variable through that no other source passes"
            ));
        }
    }
    Ok(())
}

/// Merges every source for one run of `tool` (its profile name, if any)
/// with first argument `argv1`. Strongest first: command-line flags,
/// `MOAT_ARGS`, the project file, the user config, the profile (with its
/// `[subcommands.ARGV1]` override), built-in defaults. `MOAT_ARGS` may only
/// narrow (see [`level_within`]); a widening is an error unless the user
/// config or the trusted project file already grants it.
pub fn resolve(
    tool: Option<&str>,
    argv1: Option<&str>,
    sources: Sources,
) -> Result<Resolved, ConfigError> {
    let home = sources.home.as_deref();
    let all = layers(tool, argv1, &sources);
    let mut moat_args_base = Vec::new();
    if let Some(m) = &sources.moat_args {
        let lower: Vec<Layer> = all
            .iter()
            .filter(|(src, _)| !matches!(src, Source::Flag | Source::MoatArgs))
            .cloned()
            .collect();
        let baseline = merge(&lower, home)?;
        let trusted: Vec<&Layer> = lower
            .iter()
            .filter(|(src, _)| matches!(src, Source::Project(_) | Source::Config(_)))
            .collect();
        check_moat_args(m, sources.flags.as_ref(), &baseline, &trusted, home)?;
        moat_args_base = baseline
            .ro
            .iter()
            .map(|p| (p.value.clone(), Access::ReadOnly))
            .chain(
                baseline
                    .rw
                    .iter()
                    .map(|p| (p.value.clone(), Access::ReadWrite)),
            )
            .collect();
    }
    let mut r = merge(&all, home)?;
    r.moat_args_base = moat_args_base;
    r.tool = tool.map(str::to_string);
    if let Some(p) = &sources.profile {
        r.program = Some(p.program.clone());
        r.subcommand = argv1
            .filter(|a| p.subcommands.contains_key(*a))
            .map(str::to_string);
    }
    Ok(r)
}

impl Resolved {
    /// The limits as the policy takes them. A limit that only a profile or
    /// moat's defaults set is best-effort: a default that this host cannot
    /// enforce must not stop every run of the tool.
    pub fn policy_limits(&self) -> moat_policy::Limits {
        let mut out = moat_policy::Limits {
            mode: self
                .limits_mode
                .as_ref()
                .map(|m| m.value)
                .unwrap_or_default(),
            ..Default::default()
        };
        for l in &self.limits {
            let (name, value) = l.value;
            out.set(name, Some(value));
            if matches!(l.source, Source::Profile(_) | Source::Default) {
                out.best_effort.push(name.to_string());
            }
        }
        out
    }

    /// Every grant, one per line, with its source (for `moat profile show`).
    pub fn grant_lines(&self) -> Vec<GrantLine> {
        let mut out = Vec::new();
        let mut push = |grant: &'static str, value: String, source: &Source| {
            out.push(GrantLine {
                grant,
                value,
                source: source.to_string(),
            });
        };
        push("level", self.level.value.to_string(), &self.level.source);
        push(
            "network",
            self.network.value.to_string(),
            &self.network.source,
        );
        push(
            "net_class",
            self.net_class.value.as_str().to_string(),
            &self.net_class.source,
        );
        for d in &self.allow_domains {
            push("allow_domain", d.value.clone(), &d.source);
        }
        for d in &self.deny_domains {
            push("deny_domain", d.value.clone(), &d.source);
        }
        for p in &self.ro {
            push("ro", p.value.display().to_string(), &p.source);
        }
        for p in &self.rw {
            push("rw", p.value.display().to_string(), &p.source);
        }
        for p in &self.protected_opt_in {
            push("protected_opt_in", p.value.display().to_string(), &p.source);
        }
        for (k, v) in &self.env {
            push("env", format!("{k}={}", v.value), &v.source);
        }
        for k in &self.pass_env {
            push("pass_env", k.value.clone(), &k.source);
        }
        if let Some(t) = &self.timeout_ms {
            push("timeout", format!("{}ms", t.value), &t.source);
        }
        for l in &self.limits {
            push("limit", format!("{}={}", l.value.0, l.value.1), &l.source);
        }
        if let Some(b) = &self.backend {
            push("backend", b.value.as_str().to_string(), &b.source);
        }
        if let Some(m) = &self.limits_mode {
            push("limits_mode", format!("{:?}", m.value), &m.source);
        }
        if let Some(u) = &self.upstream_proxy {
            push("upstream_proxy", u.value.clone(), &u.source);
        }
        out
    }

    /// [`Resolved::grant_lines`] as an aligned table, then the notes.
    pub fn render(&self) -> String {
        let lines = self.grant_lines();
        let gw = lines.iter().map(|l| l.grant.len()).max().unwrap_or(0);
        let vw = lines
            .iter()
            .map(|l| l.value.chars().count())
            .max()
            .unwrap_or(0);
        let mut out = String::new();
        for l in &lines {
            out.push_str(&format!(
                "{:<gw$}  {:<vw$}  {}\n",
                l.grant, l.value, l.source
            ));
        }
        for n in &self.notes {
            out.push_str(&format!("note: {n}\n"));
        }
        out
    }

    /// Builds the policy request. `map_path` receives each path with `~`
    /// already expanded against `home` and returns its canonical form,
    /// `Ok(None)` when it does not exist, or `Err(why)`. A missing path from
    /// a flag or `MOAT_ARGS` is an error; one from a profile, the user
    /// config or the project file is left out (see
    /// [`BuiltRequest::skipped_missing`]). After canonicalization two
    /// spellings of one path with different modes are still a conflict, and
    /// a protected path needs its opt-in.
    pub fn to_policy_request(
        &self,
        workspace: PathBuf,
        home: PathBuf,
        mut map_path: impl FnMut(&Path) -> Result<Option<PathBuf>, String>,
    ) -> Result<BuiltRequest, ConfigError> {
        let mut skipped = Vec::new();
        let mut mapped: Vec<(PathBuf, Access, &Sourced<PathBuf>)> = Vec::new();
        let all = self
            .ro
            .iter()
            .map(|p| (p, Access::ReadOnly))
            .chain(self.rw.iter().map(|p| (p, Access::ReadWrite)));
        for (p, access) in all {
            let expanded = expand_tilde(&p.value, &home);
            let canonical = map_path(&expanded).map_err(|why| ConfigError::Path {
                path: p.value.clone(),
                source_label: p.source.to_string(),
                why,
            })?;
            let Some(canonical) = canonical else {
                if matches!(p.source, Source::Flag | Source::MoatArgs) {
                    return Err(ConfigError::Path {
                        path: p.value.clone(),
                        source_label: p.source.to_string(),
                        why: "it does not exist; create it or drop the flag".to_string(),
                    });
                }
                skipped.push(p.clone());
                continue;
            };
            if let Some((_, prev_access, prev)) = mapped.iter().find(|(c, _, _)| *c == canonical) {
                if *prev_access != access {
                    return Err(ConfigError::Conflict {
                        path: canonical,
                        first_mode: access_str(*prev_access),
                        first_source: prev.source.to_string(),
                        second_mode: access_str(access),
                        second_source: p.source.to_string(),
                    });
                }
                continue;
            }
            mapped.push((canonical, access, p));
        }
        // MOAT_ARGS may only narrow: compared on resolved paths, so a
        // symlink inside a granted directory cannot carry a grant outside it.
        if mapped.iter().any(|m| m.2.source == Source::MoatArgs) {
            let mut base: Vec<(PathBuf, Access)> = Vec::new();
            for (b, access) in &self.moat_args_base {
                if let Ok(Some(c)) = map_path(&expand_tilde(b, &home)) {
                    base.push((c, *access));
                }
            }
            for (c, access, p) in mapped.iter().filter(|m| m.2.source == Source::MoatArgs) {
                let covered = base.iter().any(|(b, a)| {
                    c.starts_with(b) && (*a == Access::ReadWrite || *access == Access::ReadOnly)
                });
                if !covered {
                    return Err(ConfigError::MoatArgsWidening {
                        what: format!(
                            "--{} {} resolves to {}, which no other source grants",
                            access_str(*access),
                            p.value.display(),
                            c.display()
                        ),
                    });
                }
            }
        }
        let opted: Vec<PathBuf> = self
            .protected_opt_in
            .iter()
            .map(|o| expand_tilde(&o.value, &home))
            .collect();
        for (c, _, p) in &mapped {
            if let Some(prot) = protected_exact(c, Some(&home)) {
                if !opted.contains(c) {
                    return Err(ConfigError::ProtectedNotOptedIn {
                        path: p.value.clone(),
                        protected: format!("~/{prot}"),
                        source_label: p.source.to_string(),
                    });
                }
            }
        }
        let proxy = self.network.value == NetworkMode::Proxy;
        let request = PolicyRequest {
            level: Some(self.level.value),
            network: Some(self.network.value),
            workspace,
            home,
            ro: mapped
                .iter()
                .filter(|m| m.1 == Access::ReadOnly)
                .map(|m| m.0.clone())
                .collect(),
            rw: mapped
                .iter()
                .filter(|m| m.1 == Access::ReadWrite)
                .map(|m| m.0.clone())
                .collect(),
            env: self
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.value.clone()))
                .collect(),
            pass_env: self.pass_env.iter().map(|k| k.value.clone()).collect(),
            timeout_ms: self.timeout_ms.as_ref().map(|t| t.value),
            limits: self.policy_limits(),
            backend: self.backend.as_ref().map(|b| b.value).unwrap_or_default(),
            allow_domains: if proxy {
                self.allow_domains.iter().map(|d| d.value.clone()).collect()
            } else {
                Vec::new()
            },
            deny_domains: if proxy {
                self.deny_domains.iter().map(|d| d.value.clone()).collect()
            } else {
                Vec::new()
            },
            upstream_proxy: self.upstream_proxy.as_ref().map(|u| u.value.clone()),
            // The built-in default (no filter) is left out, so a policy
            // resolved from flags alone hashes as it did before profiles.
            net_class: match (&self.net_class.source, self.net_class.value) {
                (Source::Default, NetClass::Unconfined) => None,
                (_, c) => Some(c),
            },
            tool: self.tool.clone(),
            ..Default::default()
        };
        Ok(BuiltRequest {
            request,
            skipped_missing: skipped,
        })
    }

    /// [`Resolved::to_policy_request`] then `Policy::resolve`.
    pub fn to_policy(
        &self,
        workspace: PathBuf,
        home: PathBuf,
        map_path: impl FnMut(&Path) -> Result<Option<PathBuf>, String>,
    ) -> Result<(moat_policy::Policy, Vec<Sourced<PathBuf>>), ConfigError> {
        let built = self.to_policy_request(workspace, home, map_path)?;
        Ok((
            moat_policy::Policy::resolve(built.request)?,
            built.skipped_missing,
        ))
    }
}

#[cfg(test)]
mod tests;
