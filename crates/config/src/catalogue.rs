//! The built-in profile catalogue: TOML files in `catalogue/`, embedded in the binary.

use std::collections::BTreeMap;

use moat_policy::ShimSpec;

use crate::error::ConfigError;
use crate::load::Catalogue;
use crate::profile::{parse_profile, Profile};

/// Every built-in profile's name and TOML text, in catalogue order.
pub const BUILTIN_SOURCES: &[(&str, &str)] = &[
    ("git", include_str!("../catalogue/git.toml")),
    ("cargo", include_str!("../catalogue/cargo.toml")),
    ("npm", include_str!("../catalogue/npm.toml")),
    ("npx", include_str!("../catalogue/npx.toml")),
    ("pnpm", include_str!("../catalogue/pnpm.toml")),
    ("yarn", include_str!("../catalogue/yarn.toml")),
    ("pip", include_str!("../catalogue/pip.toml")),
    ("uv", include_str!("../catalogue/uv.toml")),
    ("python", include_str!("../catalogue/python.toml")),
    ("python3", include_str!("../catalogue/python3.toml")),
    ("node", include_str!("../catalogue/node.toml")),
    ("go", include_str!("../catalogue/go.toml")),
    ("make", include_str!("../catalogue/make.toml")),
    ("rg", include_str!("../catalogue/rg.toml")),
    ("jq", include_str!("../catalogue/jq.toml")),
    ("curl", include_str!("../catalogue/curl.toml")),
    ("bash", include_str!("../catalogue/bash.toml")),
    ("sh", include_str!("../catalogue/sh.toml")),
    ("claude", include_str!("../catalogue/claude.toml")),
    ("codex", include_str!("../catalogue/codex.toml")),
    ("aider", include_str!("../catalogue/aider.toml")),
];

/// The built-in profile `name`, parsed. `None` when there is none (or, which
/// the tests rule out, when it does not parse).
pub fn builtin(name: &str) -> Option<Profile> {
    builtin_checked(name)?.ok()
}

/// The built-in profile `name` with its parse result, for `moat profile check`.
pub fn builtin_checked(name: &str) -> Option<Result<Profile, ConfigError>> {
    let (_, text) = BUILTIN_SOURCES.iter().find(|(n, _)| *n == name)?;
    Some(parse_profile(text, &format!("built-in profile {name}")))
}

/// The names of the built-in profiles, sorted.
pub fn builtin_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = BUILTIN_SOURCES.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    names
}

/// The TOML text of a built-in profile (for `moat profile show --source` or
/// as a starting point for a user profile).
pub fn builtin_source(name: &str) -> Option<&'static str> {
    BUILTIN_SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
}

/// The in-session shims of a run of `tool`: which names, typed inside the
/// session, add which network class before the real program runs.
///
/// The rule (README "Launchers inherit, leaves narrow"): composition tools — profiles
/// with `launcher = true`: shells, interpreters, `make` — get no shim, so
/// they inherit the class of whatever launched them (npm's `#!/usr/bin/env
/// node`, an agent's `bash -c 'curl …'`). Only leaf tools narrow, each to
/// the class its profile declares. A profile's own name beats another
/// profile's program alias (`python3` the profile over `python`'s program),
/// and the session's own tool gets no shim under its name.
pub fn session_shims(cat: &Catalogue, tool: &str) -> Vec<ShimSpec> {
    let spec = |name: &str, p: &Profile| ShimSpec {
        name: name.to_string(),
        program: p.program.clone(),
        net_class: p.base.net_class,
        subcommands: p
            .subcommands
            .iter()
            .filter_map(|(k, s)| s.net_class.map(|c| (k.clone(), c)))
            .collect(),
    };
    // Names claimed by a profile of that name: a shim (leaf) or none (launcher).
    let mut by_name: BTreeMap<String, Option<ShimSpec>> = BTreeMap::new();
    for n in cat.names() {
        if let Some(p) = cat.get(n) {
            by_name.insert(n.to_string(), (!p.launcher).then(|| spec(n, p)));
        }
    }
    // Then program aliases for names no profile claims; a launcher's alias
    // is a launcher too (python → python3).
    for n in cat.names() {
        let Some(p) = cat.get(n) else { continue };
        if p.program != p.name && !by_name.contains_key(&p.program) {
            by_name.insert(
                p.program.clone(),
                (!p.launcher).then(|| spec(&p.program, p)),
            );
        } else if p.launcher && p.program != p.name {
            // A leaf alias from another profile never shadows a launcher's program.
            if let Some(slot) = by_name.get_mut(&p.program) {
                if cat.get(&p.program).is_none() {
                    *slot = None;
                }
            }
        }
    }
    by_name
        .into_iter()
        .filter(|(n, _)| n != tool && n != "moat")
        .filter_map(|(_, s)| s)
        .filter(|s| !s.name.contains('/') && !s.program.contains('/'))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::NetClass;
    use moat_policy::{Level, NetworkMode};
    use std::path::Path;

    #[test]
    fn every_builtin_parses_validates_and_is_named_after_its_file() {
        assert_eq!(BUILTIN_SOURCES.len(), 21);
        for (name, text) in BUILTIN_SOURCES {
            let p = parse_profile(text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(p.name, *name);
            // Each runs the program of its name, except python, which runs
            // python3 (Debian and others ship no `python` without an extra package).
            let expected = if *name == "python" { "python3" } else { *name };
            // Composition tools are launchers; leaf tools are not.
            let launcher = ["bash", "sh", "node", "python", "python3", "make"].contains(name);
            assert_eq!(p.launcher, launcher, "{name}");
            assert_eq!(p.program, expected);
            assert!(p.warnings.is_empty(), "{name}: {:?}", p.warnings);
            assert!(p.description.is_some(), "{name}");
            for argv1 in std::iter::once(None).chain(p.subcommands.keys().map(|k| Some(k.as_str())))
            {
                let s = p.settings_for(argv1);
                assert_ne!(s.level, Some(Level::DangerFullAccess));
                assert_ne!(s.network, Some(NetworkMode::Unmanaged), "{name} {argv1:?}");
                assert_ne!(s.net_class, Some(NetClass::Unconfined), "{name} {argv1:?}");
                assert!(
                    s.level.is_some() && s.network.is_some() && s.net_class.is_some(),
                    "{name}: explicit"
                );
            }
        }
    }

    #[test]
    fn every_builtin_line_with_a_grant_is_commented() {
        for (name, text) in BUILTIN_SOURCES {
            for line in text.lines() {
                let t = line.trim();
                let is_grant = t.contains(" = ") && !t.starts_with('#') && !t.starts_with("name =")
                    && !t.starts_with("program =") && !t.starts_with("description =")
                    // a mount's justification sits on its path line
                    && !t.starts_with("mode =");
                if is_grant {
                    assert!(t.contains(" # "), "{name}: uncommented grant: {t}");
                }
            }
        }
    }

    #[test]
    fn names_and_lookup() {
        let names = builtin_names();
        assert!(names.windows(2).all(|w| w[0] < w[1]));
        assert!(builtin("nope").is_none());
        let cargo = builtin("cargo").unwrap();
        assert_eq!(cargo.base.level, Some(Level::WorkspaceWrite));
        assert_eq!(
            cargo.settings_for(Some("fmt")).network,
            Some(NetworkMode::Disabled)
        );
        assert_eq!(
            cargo.settings_for(Some("build")).network,
            Some(NetworkMode::Proxy)
        );
        assert!(cargo
            .base
            .paths
            .iter()
            .any(|p| p.path == Path::new("~/.cargo/registry")));
        let rg = builtin("rg").unwrap().settings_for(None);
        assert_eq!(
            (rg.level, rg.net_class),
            (Some(Level::ReadOnly), Some(NetClass::NetDenied))
        );
        let curl = builtin("curl").unwrap().settings_for(None);
        assert_eq!(curl.network, Some(NetworkMode::Proxy));
        assert!(curl.allow_domains.is_empty());
        let claude = builtin("claude").unwrap().settings_for(None);
        assert_eq!(claude.protected_opt_in.len(), 2);
        assert_eq!(claude.env.len(), 4);
        assert_eq!(claude.pass_env, ["ANTHROPIC_API_KEY"]);
    }

    fn user(cat: &mut Catalogue, text: &str) {
        let p = parse_profile(text, "user").unwrap();
        cat.profiles.insert(
            p.name.clone(),
            (p, crate::load::ProfileOrigin::User("u.toml".into())),
        );
    }

    #[test]
    fn launchers_get_no_session_shim_and_leaves_keep_their_class() {
        let cat = Catalogue::builtin().unwrap();
        let shims = session_shims(&cat, "npm");
        let names: Vec<&str> = shims.iter().map(|s| s.name.as_str()).collect();
        for launcher in ["bash", "sh", "node", "python", "python3", "make"] {
            assert!(
                !names.contains(&launcher),
                "{launcher} is shimmed: {names:?}"
            );
        }
        assert!(!names.contains(&"npm"), "the session's own tool");
        let git = shims.iter().find(|s| s.name == "git").unwrap();
        assert_eq!(git.class_for(Some("status")), Some(NetClass::NetDenied));
        assert_eq!(git.class_for(Some("fetch")), Some(NetClass::NetConnect));
        assert!(names.contains(&"curl") && names.contains(&"rg"));
    }

    #[test]
    fn a_leaf_alias_never_shadows_a_launcher_but_a_profile_name_does() {
        let mut cat = Catalogue::builtin().unwrap();
        // A leaf whose program is bash: its alias must not narrow `bash`.
        user(
            &mut cat,
            "name = \"agentx\"\nprogram = \"bash\"\nnetwork = \"proxy\"\nnet_class = \"net-connect\"\n",
        );
        let shims = session_shims(&cat, "claude");
        assert!(shims.iter().any(|s| s.name == "agentx"));
        assert!(!shims.iter().any(|s| s.name == "bash"), "{shims:?}");
        // A user profile *named* python3 without `launcher` is a leaf: it narrows.
        user(
            &mut cat,
            "name = \"python3\"\nnetwork = \"disabled\"\nnet_class = \"net-denied\"\n",
        );
        let shims = session_shims(&cat, "claude");
        let py3 = shims.iter().find(|s| s.name == "python3").unwrap();
        assert_eq!(py3.net_class, Some(NetClass::NetDenied));
        assert!(!shims.iter().any(|s| s.name == "python"));
    }
}
