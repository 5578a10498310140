//! Tool profiles: the TOML declaration of one tool's boundary, parsed and validated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use moat_policy::NetworkMode;
use serde::Deserialize;

use crate::error::ConfigError;
use crate::settings::{
    protected_containing, protected_exact, Ctx, Kind, NetClass, RawMount, RawOverrides, Settings,
};

/// What a missing profile grant is, so moat can create it before the first
/// run instead of dropping it (`create = "dir"` / `"file"` on a mount).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstUseKind {
    /// Created with mode 0700.
    Dir,
    /// Created empty with mode 0600.
    File,
}

/// A home grant the tool's first run creates: `~/.claude`, `~/.claude.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstUse {
    /// As written, `~/…`.
    pub path: PathBuf,
    pub kind: FirstUseKind,
    /// The tool replaces the file by an atomic rename (write a temporary,
    /// rename it over): rename onto a bind-mounted file fails with EBUSY, so
    /// moat gives the run a private copy and merges it back afterwards.
    pub replaced_by_rename: bool,
    /// Key paths in the synced JSON file (`mcpServers`, `projects.*.mcpServers`;
    /// `*` is any one key) whose values the tool on the host trusts to run
    /// commands or skip its own prompts. The merge back keeps the host's
    /// values of these: the run cannot add or change them.
    pub host_executed_keys: Vec<String>,
}

/// A validated tool profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    /// The program resolved on the host PATH (skipping moat's shim directory).
    pub program: String,
    pub description: Option<String>,
    /// A composition tool (shell, interpreter, `make`, `env`-like runner):
    /// inside a session it inherits the class of whatever launched it and
    /// never narrows the session by itself. Its settings apply only when it
    /// is the command moat starts (`moat run bash`). See [`session_shims`].
    pub launcher: bool,
    /// The profile's own settings (its top-level keys).
    pub base: Settings,
    /// `[subcommands.NAME]`: overrides applied when `argv[1] == NAME`.
    pub subcommands: BTreeMap<String, Settings>,
    /// Things `moat profile check` should point out (e.g. an unmanaged network).
    pub warnings: Vec<String>,
    /// Grants created on first use (from every `[[mounts]]` with `create`).
    pub first_use: Vec<FirstUse>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: String,
    program: Option<String>,
    description: Option<String>,
    #[serde(default)]
    launcher: bool,
    level: Option<String>,
    network: Option<String>,
    net_class: Option<String>,
    #[serde(default)]
    allow_domains: Vec<String>,
    #[serde(default)]
    deny_domains: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    pass_env: Vec<String>,
    #[serde(default)]
    protected_opt_in: Vec<String>,
    #[serde(default)]
    mounts: Vec<RawMount>,
    timeout: Option<String>,
    limits: Option<crate::settings::RawLimits>,
    #[serde(default)]
    subcommands: BTreeMap<String, RawOverrides>,
}

impl Profile {
    /// The profile's settings for one invocation: the subcommand override
    /// for `argv1` (only when it names a declared subcommand exactly) laid on
    /// the base. A missing `net_class` follows the network: `net-denied`
    /// when the network is disabled, `net-connect` otherwise.
    pub fn settings_for(&self, argv1: Option<&str>) -> Settings {
        let mut s = match argv1.and_then(|a| self.subcommands.get(a)) {
            Some(over) => self.base.overlaid(over),
            None => self.base.clone(),
        };
        if s.net_class.is_none() {
            s.net_class = Some(match s.network {
                None | Some(NetworkMode::Disabled) => NetClass::NetDenied,
                Some(_) => NetClass::NetConnect,
            });
        }
        s
    }
}

/// Parses and validates a profile. `file` names it in errors (a path, or
/// `built-in profile git`).
pub fn parse_profile(text: &str, file: &str) -> Result<Profile, ConfigError> {
    let raw: RawProfile =
        toml::from_str(text).map_err(|e| ConfigError::from_toml(file, text, &e))?;
    check_name(file, "name", &raw.name)?;
    let program = raw.program.clone().unwrap_or_else(|| raw.name.clone());
    check_name(file, "program", &program)?;
    let mut first_use = Vec::new();
    let all_mounts =
        raw.mounts
            .iter()
            .map(|m| (String::new(), m))
            .chain(raw.subcommands.iter().flat_map(|(sub, o)| {
                o.mounts
                    .iter()
                    .map(move |m| (format!("subcommands.{sub}."), m))
            }));
    for (prefix, m) in all_mounts {
        if let Some(f) = first_use_of(file, &prefix, m)? {
            if !first_use.iter().any(|x: &FirstUse| x.path == f.path) {
                first_use.push(f);
            }
        }
    }

    let base_raw = RawOverrides {
        level: raw.level,
        network: raw.network,
        net_class: raw.net_class,
        allow_domains: raw.allow_domains,
        deny_domains: raw.deny_domains,
        env: raw.env,
        pass_env: raw.pass_env,
        protected_opt_in: raw.protected_opt_in,
        mounts: raw.mounts,
        ro: Vec::new(),
        rw: Vec::new(),
        timeout: raw.timeout,
        limits: raw.limits,
        backend: None,
    };
    let ctx = Ctx {
        file,
        prefix: String::new(),
        kind: Kind::Profile,
    };
    let (base, mut warnings) = base_raw.into_settings(&ctx)?;

    let mut subcommands = BTreeMap::new();
    for (sub, over) in raw.subcommands {
        if sub.is_empty() || sub.contains(char::is_whitespace) {
            return Err(ConfigError::invalid(
                file,
                "subcommands",
                format!("{sub:?}"),
                "a subcommand is one non-empty word",
            ));
        }
        let ctx = Ctx {
            file,
            prefix: format!("subcommands.{sub}."),
            kind: Kind::Profile,
        };
        let (s, w) = over.into_settings(&ctx)?;
        warnings.extend(w);
        subcommands.insert(sub, s);
    }

    let profile = Profile {
        name: raw.name,
        program,
        description: raw.description,
        launcher: raw.launcher,
        base,
        subcommands,
        warnings,
        first_use,
    };
    let mut variants: Vec<(String, Settings)> = vec![(String::new(), profile.settings_for(None))];
    for sub in profile.subcommands.keys() {
        variants.push((
            format!("subcommands.{sub}."),
            profile.settings_for(Some(sub)),
        ));
    }
    for (prefix, s) in &variants {
        check_consistent(file, prefix, s)?;
    }
    Ok(profile)
}

/// The `create` / `replaced_by_rename` keys of one mount, validated.
fn first_use_of(
    file: &str,
    prefix: &str,
    m: &crate::settings::RawMount,
) -> Result<Option<FirstUse>, ConfigError> {
    let key = format!("{prefix}mounts[{}]", m.path);
    let kind = match m.create.as_deref() {
        None if m.replaced_by_rename => {
            return Err(ConfigError::invalid(
                file,
                &format!("{key}.replaced_by_rename"),
                "true",
                "declare the file with create = \"file\" as well",
            ))
        }
        None => return Ok(None),
        Some("dir") => FirstUseKind::Dir,
        Some("file") => FirstUseKind::File,
        Some(other) => {
            return Err(ConfigError::invalid(
                file,
                &format!("{key}.create"),
                format!("{other:?}"),
                "use \"dir\" or \"file\"",
            ))
        }
    };
    if !m.path.starts_with("~/") || m.mode != "rw" {
        return Err(ConfigError::invalid(
            file,
            &format!("{key}.create"),
            format!("{:?}", m.path),
            "moat creates only read-write grants under ~/ (the tool's own state)",
        ));
    }
    if !m.host_executed_keys.is_empty() && !m.replaced_by_rename {
        return Err(ConfigError::invalid(
            file,
            &format!("{key}.host_executed_keys"),
            format!("{:?}", m.host_executed_keys),
            "only a synced file (replaced_by_rename = true) is merged back key by key",
        ));
    }
    if let Some(bad) = m
        .host_executed_keys
        .iter()
        .find(|k| k.split('.').any(str::is_empty))
    {
        return Err(ConfigError::invalid(
            file,
            &format!("{key}.host_executed_keys"),
            format!("{bad:?}"),
            "write a dotted key path such as \"projects.*.mcpServers\"",
        ));
    }
    if m.replaced_by_rename && kind != FirstUseKind::File {
        return Err(ConfigError::invalid(
            file,
            &format!("{key}.replaced_by_rename"),
            "true",
            "only a file is replaced by rename; use create = \"file\"",
        ));
    }
    Ok(Some(FirstUse {
        path: crate::settings::normalize_lexically(Path::new(&m.path)),
        kind,
        replaced_by_rename: m.replaced_by_rename,
        host_executed_keys: m.host_executed_keys.clone(),
    }))
}

fn check_name(file: &str, key: &str, v: &str) -> Result<(), ConfigError> {
    if v.is_empty()
        || v.contains('/')
        || v.contains('\0')
        || v.contains(char::is_whitespace)
        || v == "."
        || v == ".."
    {
        return Err(ConfigError::invalid(
            file,
            key,
            format!("{v:?}"),
            "use a bare command name: non-empty, no '/', no whitespace",
        ));
    }
    Ok(())
}

/// Checks one effective setting set of a profile: protected mounts are
/// opted in, domains only come with the proxy network.
fn check_consistent(file: &str, prefix: &str, s: &Settings) -> Result<(), ConfigError> {
    for p in &s.paths {
        if let Some(prot) = protected_exact(&p.path, None) {
            if !s
                .protected_opt_in
                .iter()
                .any(|o| o == Path::new("~").join(prot).as_path())
            {
                return Err(ConfigError::invalid(
                    file,
                    &format!("{prefix}mounts"),
                    p.path.display(),
                    format!("~/{prot} is a protected path; add \"~/{prot}\" to protected_opt_in to let this tool see it"),
                ));
            }
        }
        if let Some(prot) = protected_containing(&p.path, None) {
            return Err(ConfigError::invalid(
                file,
                &format!("{prefix}mounts"),
                p.path.display(),
                format!("the path lies inside the protected path ~/{prot}; mount ~/{prot} itself and opt it in with protected_opt_in"),
            ));
        }
    }
    let network = s.network.unwrap_or(NetworkMode::Disabled);
    if network != NetworkMode::Proxy {
        for (key, list) in [
            ("allow_domains", &s.allow_domains),
            ("deny_domains", &s.deny_domains),
        ] {
            if let Some(d) = list.first() {
                return Err(ConfigError::invalid(
                    file,
                    &format!("{prefix}{key}"),
                    format!("{d:?}"),
                    format!("domains only apply with network = \"proxy\", and the network here is {network}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use moat_policy::{Access, Level};

    const GIT: &str = r#"
name = "git"
program = "git"
level = "rw"
network = "disabled"
net_class = "net-denied"
env = { GIT_TERMINAL_PROMPT = "0" }
pass_env = ["GIT_AUTHOR_NAME"]
[[mounts]]
path = "~/.config/git/ignore"
mode = "ro"
[subcommands.fetch]
network = "proxy"
allow_domains = ["github.com:443", "gitlab.com:443"]
net_class = "net-connect"
"#;

    #[test]
    fn parses_the_documented_example() {
        let p = parse_profile(GIT, "git.toml").unwrap();
        assert_eq!(p.name, "git");
        assert_eq!(p.base.level, Some(Level::WorkspaceWrite));
        assert_eq!(p.base.paths[0].path, Path::new("~/.config/git/ignore"));
        assert_eq!(p.base.paths[0].access, Access::ReadOnly);
        assert_eq!(p.base.env["GIT_TERMINAL_PROMPT"], "0");
        assert!(p.warnings.is_empty());
    }

    #[test]
    fn subcommand_override_applies_only_for_its_argv1() {
        let p = parse_profile(GIT, "git.toml").unwrap();
        let fetch = p.settings_for(Some("fetch"));
        assert_eq!(fetch.network, Some(NetworkMode::Proxy));
        assert_eq!(fetch.net_class, Some(NetClass::NetConnect));
        assert_eq!(fetch.allow_domains, ["github.com:443", "gitlab.com:443"]);
        for other in [
            None,
            Some("status"),
            Some("--fetch"),
            Some("fetchx"),
            Some("FETCH"),
        ] {
            let s = p.settings_for(other);
            assert_eq!(s.network, Some(NetworkMode::Disabled), "{other:?}");
            assert_eq!(s.net_class, Some(NetClass::NetDenied));
            assert!(s.allow_domains.is_empty());
        }
    }

    #[test]
    fn unknown_keys_are_rejected_naming_file_and_key() {
        let e = parse_profile("name = \"x\"\nlevl = \"ro\"\n", "/cfg/profiles/x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/cfg/profiles/x.toml"), "{e}");
        assert!(e.contains("unknown key `levl`"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        let e = parse_profile(
            "name = \"x\"\n[subcommands.fetch]\nnetwrk = \"proxy\"\n",
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown key `netwrk`"), "{e}");
        let e = parse_profile(
            "name = \"x\"\n[[mounts]]\npath = \"/a\"\nmode = \"ro\"\nopt = 1\n",
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown key `opt`"), "{e}");
    }

    #[test]
    fn bad_values_are_rejected() {
        let cases = [
            ("name = \"\"", "name"),
            ("name = \"a/b\"", "name"),
            ("name = \"x\"\nprogram = \"/usr/bin/x\"", "program"),
            ("name = \"x\"\nlevel = \"danger\"", "level"),
            ("name = \"x\"\nlevel = \"danger-full-access\"", "level"),
            ("name = \"x\"\nlevel = \"rwx\"", "level"),
            ("name = \"x\"\nnetwork = \"open\"", "network"),
            ("name = \"x\"\nnet_class = \"net-all\"", "net_class"),
            (
                "name = \"x\"\nprotected_opt_in = [\"~/.bashrc\"]",
                "protected_opt_in",
            ),
            (
                "name = \"x\"\nprotected_opt_in = [\"/root/.ssh\"]",
                "protected_opt_in",
            ),
            (
                "name = \"x\"\n[[mounts]]\npath = \"relative\"\nmode = \"ro\"",
                "mounts",
            ),
            (
                "name = \"x\"\n[[mounts]]\npath = \"~/a/../b\"\nmode = \"ro\"",
                "mounts",
            ),
            (
                "name = \"x\"\n[[mounts]]\npath = \"/a\"\nmode = \"rx\"",
                "mode",
            ),
            (
                "name = \"x\"\n[[mounts]]\npath = \"~/.ssh\"\nmode = \"ro\"",
                "protected_opt_in",
            ),
            (
                "name = \"x\"\n[[mounts]]\npath = \"~/.ssh/id_rsa\"\nmode = \"ro\"",
                "inside the protected",
            ),
            (
                "name = \"x\"\nnetwork = \"proxy\"\nallow_domains = [\"https://x.com\"]",
                "allow_domains",
            ),
            (
                "name = \"x\"\nnetwork = \"proxy\"\nallow_domains = [\"@nope\"]",
                "allow_domains",
            ),
            (
                "name = \"x\"\nallow_domains = [\"x.com\"]",
                "only apply with network",
            ),
            ("name = \"x\"\nenv = { \"A=B\" = \"1\" }", "env"),
            ("name = \"x\"\ntimeout = \"soon\"", "timeout"),
        ];
        for (text, needle) in cases {
            let e = parse_profile(text, "x.toml").unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
            assert!(e.contains("x.toml"), "{text}: {e}");
        }
    }

    #[test]
    fn presets_and_unmanaged_are_accepted_with_a_warning_for_unmanaged() {
        let p = parse_profile(
            "name = \"x\"\nnetwork = \"proxy\"\nallow_domains = [\"@package-registries\"]",
            "x.toml",
        )
        .unwrap();
        assert!(p.warnings.is_empty());
        let p = parse_profile("name = \"x\"\nnetwork = \"unmanaged\"", "x.toml").unwrap();
        assert_eq!(p.warnings.len(), 1);
        assert!(p.warnings[0].contains("unmanaged"));
        assert_eq!(p.settings_for(None).net_class, Some(NetClass::NetConnect));
    }

    #[test]
    fn program_defaults_to_name_and_protected_opt_in_allows_the_mount() {
        let p = parse_profile(
            "name = \"ssh\"\nprotected_opt_in = [\"~/.ssh\"]\n[[mounts]]\npath = \"~/.ssh\"\nmode = \"ro\"",
            "ssh.toml",
        )
        .unwrap();
        assert_eq!(p.program, "ssh");
        assert_eq!(p.base.protected_opt_in, [Path::new("~/.ssh")]);
    }
}
