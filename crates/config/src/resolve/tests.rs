use super::*;
use crate::load::parse_user_config;
use crate::moat_args::parse_moat_args;
use crate::profile::parse_profile;
use crate::project::parse_project;

const HOME: &str = "/home/me";

fn profile(text: &str) -> Profile {
    parse_profile(text, "test profile").unwrap()
}

fn git() -> Profile {
    crate::catalogue::builtin("git").unwrap()
}

fn config(text: &str) -> UserConfig {
    parse_user_config(text, Path::new("/home/me/.config/moat/config.toml")).unwrap()
}

fn project(text: &str) -> ProjectFile {
    parse_project(
        text.as_bytes(),
        Path::new("/home/me/proj/.moat.toml"),
        Some(Path::new(HOME)),
        |_| None,
    )
    .unwrap()
}

fn flags(text: &str) -> Settings {
    // flags have the same shape as MOAT_ARGS; reuse its parser for brevity
    parse_moat_args(text).unwrap()
}

fn sources() -> Sources {
    Sources {
        home: Some(PathBuf::from(HOME)),
        ..Sources::default()
    }
}

const CFG: &str = "config:/home/me/.config/moat/config.toml";
const PRJ: &str = "project:/home/me/proj/.moat.toml";

#[test]
fn defaults_alone() {
    let r = resolve(None, None, sources()).unwrap();
    assert_eq!(
        r.level,
        Sourced {
            value: Level::ReadOnly,
            source: Source::Default
        }
    );
    assert_eq!(r.network.value, NetworkMode::Disabled);
    assert_eq!(r.net_class.value, NetClass::Unconfined);
    assert!(r.ro.is_empty() && r.rw.is_empty() && r.env.is_empty());
    assert_eq!(r.program, None);
}

#[test]
fn custom_defaults_layer_is_used_below_everything() {
    let s = Sources {
        defaults: Some(Settings {
            timeout_ms: Some(5),
            level: Some(Level::WorkspaceContained),
            ..Settings::default()
        }),
        ..sources()
    };
    let r = resolve(None, None, s).unwrap();
    assert_eq!(r.level.value, Level::WorkspaceContained);
    assert_eq!(r.timeout_ms.unwrap().value, 5);
    assert_eq!(
        r.network.value,
        NetworkMode::Disabled,
        "filled from moat's own defaults"
    );
}

#[test]
fn profile_beats_defaults_and_subcommand_override_applies_only_for_its_argv1() {
    let s = Sources {
        profile: Some(git()),
        ..sources()
    };
    let r = resolve(Some("git"), Some("status"), s.clone()).unwrap();
    assert_eq!(r.level.value, Level::WorkspaceWrite);
    assert_eq!(r.level.source.to_string(), "profile:git");
    assert_eq!(r.network.value, NetworkMode::Disabled);
    assert_eq!(r.net_class.value, NetClass::NetDenied);
    assert_eq!(r.subcommand, None);
    assert_eq!(r.program.as_deref(), Some("git"));
    assert!(r.allow_domains.is_empty());

    let r = resolve(Some("git"), Some("fetch"), s.clone()).unwrap();
    assert_eq!(r.network.value, NetworkMode::Proxy);
    assert_eq!(r.net_class.value, NetClass::NetConnect);
    assert_eq!(r.subcommand.as_deref(), Some("fetch"));
    assert_eq!(r.allow_domains.len(), 2);
    assert!(r
        .allow_domains
        .iter()
        .all(|d| d.source == Source::Profile("git".into())));

    let r = resolve(Some("git"), None, s).unwrap();
    assert_eq!(r.network.value, NetworkMode::Disabled);
}

#[test]
fn user_config_tool_section_beats_profile() {
    let c = config("[tools.git]\nlevel = \"ro\"\nallow_domains = [\"git.corp.example:443\"]\nenv = { GIT_TERMINAL_PROMPT = \"1\" }\n");
    let s = Sources {
        profile: Some(git()),
        user_config: Some(c),
        ..sources()
    };
    let r = resolve(Some("git"), Some("fetch"), s).unwrap();
    assert_eq!(r.level.value, Level::ReadOnly);
    assert_eq!(r.level.source.to_string(), CFG);
    assert_eq!(r.env["GIT_TERMINAL_PROMPT"].value, "1");
    assert_eq!(r.env["GIT_TERMINAL_PROMPT"].source.to_string(), CFG);
    assert!(r
        .allow_domains
        .iter()
        .any(|d| d.value == "git.corp.example:443" && d.source.to_string() == CFG));
    assert!(r
        .allow_domains
        .iter()
        .any(|d| d.value == "github.com:443" && d.source.to_string() == "profile:git"));
}

#[test]
fn user_config_top_level_scalars_are_defaults_below_the_profile() {
    let c = config("level = \"contained\"\ntimeout = \"1m\"\n");
    let s = Sources {
        profile: Some(git()),
        user_config: Some(c.clone()),
        ..sources()
    };
    let r = resolve(Some("git"), None, s).unwrap();
    assert_eq!(r.level.value, Level::WorkspaceWrite, "the profile says rw");
    assert_eq!(
        r.timeout_ms.as_ref().unwrap().source.to_string(),
        CFG,
        "the profile says nothing about timeouts"
    );
    // without a profile (moat exec) the config's defaults apply
    let r = resolve(
        None,
        None,
        Sources {
            user_config: Some(c),
            ..sources()
        },
    )
    .unwrap();
    assert_eq!(r.level.value, Level::WorkspaceContained);
    assert_eq!(r.level.source.to_string(), CFG);
}

#[test]
fn project_beats_user_config() {
    let c = config("[tools.git]\nlevel = \"ro\"\nenv = { A = \"config\" }\n");
    let p = project(
        "[tools.git]\nlevel = \"contained\"\nenv = { A = \"project\" }\nrw = [\"cache\"]\n",
    );
    let s = Sources {
        profile: Some(git()),
        user_config: Some(c),
        project: Some(p),
        ..sources()
    };
    let r = resolve(Some("git"), None, s).unwrap();
    assert_eq!(r.level.value, Level::WorkspaceContained);
    assert_eq!(r.level.source.to_string(), PRJ);
    assert_eq!(r.env["A"].value, "project");
    assert_eq!(r.rw[0].value, Path::new("/home/me/proj/cache"));
    assert_eq!(r.rw[0].source.to_string(), PRJ);
}

#[test]
fn project_tools_section_only_applies_to_that_tool() {
    let p = project("[tools.cargo]\nenv = { A = \"1\" }\n");
    let s = Sources {
        profile: Some(git()),
        project: Some(p),
        ..sources()
    };
    let r = resolve(Some("git"), None, s).unwrap();
    assert!(!r.env.contains_key("A"));
}

#[test]
fn moat_args_beat_project_and_flags_beat_moat_args() {
    let p = project("timeout = \"10m\"\nenv = { A = \"project\" }\n");
    let m = parse_moat_args("--timeout 1m --env A=moat --policy read-only").unwrap();
    let s = Sources {
        profile: Some(git()),
        project: Some(p.clone()),
        moat_args: Some(m.clone()),
        ..sources()
    };
    let r = resolve(Some("git"), None, s).unwrap();
    assert_eq!(r.timeout_ms.as_ref().unwrap().value, 60_000);
    assert_eq!(r.timeout_ms.as_ref().unwrap().source, Source::MoatArgs);
    assert_eq!(r.env["A"].source, Source::MoatArgs);
    assert_eq!(
        r.level,
        Sourced {
            value: Level::ReadOnly,
            source: Source::MoatArgs
        }
    );

    let f = flags("--timeout 2s --env A=flag --policy danger-full-access");
    let s = Sources {
        profile: Some(git()),
        project: Some(p),
        moat_args: Some(m),
        flags: Some(f),
        ..sources()
    };
    let r = resolve(Some("git"), None, s).unwrap();
    assert_eq!(r.timeout_ms.as_ref().unwrap().source, Source::Flag);
    assert_eq!(r.env["A"].value, "flag");
    assert_eq!(
        r.level,
        Sourced {
            value: Level::DangerFullAccess,
            source: Source::Flag
        }
    );
}

#[test]
fn every_grant_carries_its_source() {
    let c = config("[tools.git]\npass_env = [\"GIT_SSH_VARIANT\"]\n");
    let p = project("ro = [\"docs\"]\n");
    let f = flags("--rw /srv/data");
    let s = Sources {
        profile: Some(git()),
        user_config: Some(c),
        project: Some(p),
        flags: Some(f),
        ..sources()
    };
    let r = resolve(Some("git"), Some("fetch"), s).unwrap();
    let lines = r.grant_lines();
    let find = |grant: &str, value: &str| {
        lines
            .iter()
            .find(|l| l.grant == grant && l.value == value)
            .map(|l| l.source.clone())
            .unwrap_or_default()
    };
    assert_eq!(find("rw", "/srv/data"), "flag");
    assert_eq!(find("ro", "/home/me/proj/docs"), PRJ);
    assert_eq!(find("pass_env", "GIT_SSH_VARIANT"), CFG);
    assert_eq!(find("pass_env", "GIT_AUTHOR_NAME"), "profile:git");
    assert_eq!(find("ro", "~/.config/git/ignore"), "profile:git");
    assert_eq!(find("allow_domain", "github.com:443"), "profile:git");
    assert_eq!(find("level", "workspace-write"), "profile:git");
    assert_eq!(find("env", "GIT_TERMINAL_PROMPT=0"), "profile:git");
    let rendered = r.render();
    assert!(
        rendered.contains("profile:git") && rendered.contains(PRJ) && rendered.contains("flag")
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["level"]["source"], "profile:git");
}

#[test]
fn same_path_two_modes_names_both_sources_and_the_three_fixes() {
    let c = config("[tools.git]\nrw = [\"~/.config/git/ignore\"]\n");
    let s = Sources {
        profile: Some(git()),
        user_config: Some(c),
        ..sources()
    };
    let e = resolve(Some("git"), None, s).unwrap_err();
    assert!(matches!(e, ConfigError::Conflict { .. }));
    let msg = e.to_string();
    assert!(msg.contains(CFG) && msg.contains("profile:git"), "{msg}");
    assert!(msg.contains("rw in") && msg.contains("ro in"), "{msg}");
    assert!(
        msg.contains("MOAT_ARGS") && msg.contains(".moat.toml") && msg.contains("config.toml"),
        "{msg}"
    );

    // ~ and the absolute home spelling are the same path
    let f = flags("--rw /home/me/.config/git/ignore");
    let s = Sources {
        profile: Some(git()),
        flags: Some(f),
        ..sources()
    };
    let msg = resolve(Some("git"), None, s).unwrap_err().to_string();
    assert!(msg.contains("flag") && msg.contains("profile:git"), "{msg}");
}

#[test]
fn conflicts_after_canonicalization_are_caught_too() {
    let f = flags("--rw /srv/link");
    let p = project("ro = [\"data\"]\n");
    let r = resolve(
        None,
        None,
        Sources {
            flags: Some(f),
            project: Some(p),
            ..sources()
        },
    )
    .unwrap();
    let e = r
        .to_policy_request("/home/me/proj".into(), HOME.into(), |p| {
            Ok(Some(if p == Path::new("/srv/link") {
                PathBuf::from("/home/me/proj/data")
            } else {
                p.to_path_buf()
            }))
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("flag") && e.contains(PRJ), "{e}");
}

#[test]
fn protected_paths_need_an_opt_in() {
    // a user config mounting ~/.ssh without protected_opt_in
    let c = config("[tools.git]\nro = [\"~/.ssh\"]\n");
    let e = resolve(
        Some("git"),
        None,
        Sources {
            profile: Some(git()),
            user_config: Some(c),
            ..sources()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("protected_opt_in") && e.contains("~/.ssh"),
        "{e}"
    );
    let c = config("[tools.git]\nro = [\"~/.ssh\"]\nprotected_opt_in = [\"~/.ssh\"]\n");
    let r = resolve(
        Some("git"),
        None,
        Sources {
            profile: Some(git()),
            user_config: Some(c),
            ..sources()
        },
    )
    .unwrap();
    assert_eq!(r.protected_opt_in[0].source.to_string(), CFG);
    // a flag naming it opts it in, as with moat exec
    let r = resolve(
        None,
        None,
        Sources {
            flags: Some(flags("--ro /home/me/.ssh")),
            ..sources()
        },
    )
    .unwrap();
    assert_eq!(r.protected_opt_in[0].source, Source::Flag);
    let built = r
        .to_policy_request("/w".into(), HOME.into(), |p| Ok(Some(p.to_path_buf())))
        .unwrap();
    assert_eq!(built.request.ro, [PathBuf::from("/home/me/.ssh")]);
}

#[test]
fn claude_resolves_to_a_valid_policy() {
    let s = Sources {
        profile: Some(crate::catalogue::builtin("claude").unwrap()),
        ..sources()
    };
    let r = resolve(Some("claude"), None, s).unwrap();
    let (policy, skipped) = r
        .to_policy("/home/me/proj".into(), HOME.into(), |p| {
            Ok(Some(p.to_path_buf()))
        })
        .unwrap();
    assert!(skipped.is_empty());
    // Agent profiles are workspace-contained (issue 10): nothing else of yours.
    assert_eq!(policy.level, Level::WorkspaceContained);
    assert_eq!(policy.network.mode, NetworkMode::Proxy);
    assert_eq!(policy.protected_opt_in.len(), 2);
    assert!(policy.pass_env.contains(&"ANTHROPIC_API_KEY".to_string()));
}

#[test]
fn missing_profile_paths_are_skipped_missing_flag_paths_are_errors() {
    let s = Sources {
        profile: Some(crate::catalogue::builtin("cargo").unwrap()),
        ..sources()
    };
    let r = resolve(Some("cargo"), Some("build"), s).unwrap();
    let built = r
        .to_policy_request("/home/me/proj".into(), HOME.into(), |p| {
            Ok(if p.ends_with("registry") {
                Some(p.to_path_buf())
            } else {
                None
            })
        })
        .unwrap();
    assert_eq!(
        built.request.rw,
        [PathBuf::from("/home/me/.cargo/registry")]
    );
    assert_eq!(
        built.skipped_missing.len(),
        3,
        "~/.cargo/git, ~/.rustup and ~/.cargo/bin are missing"
    );
    assert_eq!(built.request.allow_domains.len(), 3);
    moat_policy::Policy::resolve(built.request).unwrap();

    let r = resolve(
        None,
        None,
        Sources {
            flags: Some(flags("--ro /nope")),
            ..sources()
        },
    )
    .unwrap();
    let e = r
        .to_policy_request("/w".into(), HOME.into(), |_| Ok(None))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nope") && e.contains("does not exist"), "{e}");
}

#[test]
fn domains_without_proxy_are_dropped_from_config_and_refused_from_flags() {
    let c = config("allow_domains = [\"@package-registries\"]\n");
    let rg = crate::catalogue::builtin("rg").unwrap();
    let r = resolve(
        Some("rg"),
        None,
        Sources {
            profile: Some(rg.clone()),
            user_config: Some(c),
            ..sources()
        },
    )
    .unwrap();
    assert!(r.allow_domains.is_empty());
    assert_eq!(r.notes.len(), 1);
    let built = r
        .to_policy_request("/w".into(), HOME.into(), |p| Ok(Some(p.to_path_buf())))
        .unwrap();
    moat_policy::Policy::resolve(built.request).unwrap();

    let e = resolve(
        Some("rg"),
        None,
        Sources {
            profile: Some(rg),
            flags: Some(flags("--allow-domain x.com")),
            ..sources()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("only applies with network proxy") && e.contains("profile:rg"),
        "{e}"
    );
}

// ---- MOAT_ARGS narrowing and widening ----

fn with_moat_args(
    profile_name: &str,
    argv1: Option<&str>,
    args: &str,
    cfg: Option<&str>,
) -> Result<Resolved, ConfigError> {
    let s = Sources {
        profile: Some(crate::catalogue::builtin(profile_name).unwrap()),
        moat_args: Some(parse_moat_args(args).unwrap()),
        user_config: cfg.map(config),
        ..sources()
    };
    resolve(Some(profile_name), argv1, s)
}

#[test]
fn moat_args_narrowing_is_accepted() {
    let r = with_moat_args(
        "git",
        Some("fetch"),
        "--policy read-only --network disabled --timeout 5s",
        None,
    )
    .unwrap();
    assert_eq!(r.level.value, Level::ReadOnly);
    assert_eq!(r.network.value, NetworkMode::Disabled);
    assert!(
        r.allow_domains.is_empty(),
        "domains do not apply once the network is disabled"
    );
    let r = with_moat_args("git", None, "--policy workspace-contained", None).unwrap();
    assert_eq!(r.level.value, Level::WorkspaceContained);
    // re-stating what is already granted is not a widening
    let r = with_moat_args(
        "git",
        Some("fetch"),
        "--allow-domain github.com:443 --ro ~/.config/git/ignore --pass-env GIT_AUTHOR_NAME",
        None,
    )
    .unwrap();
    assert_eq!(
        r.allow_domains
            .iter()
            .find(|d| d.value == "github.com:443")
            .unwrap()
            .source,
        Source::MoatArgs
    );
    // deny entries, env and a path inside a granted rw path narrow or add nothing
    with_moat_args(
        "cargo",
        Some("build"),
        "--deny-domain crates.io --env RUST_LOG=debug --rw ~/.cargo/registry/cache",
        None,
    )
    .unwrap();
    with_moat_args("cargo", None, "--ro /home/me/.cargo/registry/index", None).unwrap();
    // the same path with the other mode is a conflict, not a silent pick
    let e = with_moat_args("cargo", None, "--ro ~/.cargo/registry", None).unwrap_err();
    assert!(matches!(e, ConfigError::Conflict { .. }), "{e}");
}

#[test]
fn moat_args_widening_is_refused() {
    for (tool, argv1, args, needle) in [
        (
            "rg",
            None,
            "--policy workspace-write",
            "--policy workspace-write",
        ),
        (
            "git",
            None,
            "--policy danger-full-access",
            "danger-full-access",
        ),
        (
            "rg",
            None,
            "--policy workspace-contained",
            "workspace-contained",
        ),
        ("git", None, "--network proxy", "--network proxy"),
        ("git", Some("fetch"), "--network unmanaged", "unmanaged"),
        ("git", None, "--rw /etc", "--rw /etc"),
        (
            "git",
            None,
            "--rw ~/.config/git/ignore",
            "--rw ~/.config/git/ignore",
        ),
        ("git", None, "--ro ~/.ssh", "--ro ~/.ssh"),
        (
            "git",
            Some("fetch"),
            "--allow-domain evil.example",
            "evil.example",
        ),
        (
            "git",
            Some("fetch"),
            "--allow-domain *.github.com:443",
            "*.github.com:443",
        ),
        (
            "git",
            Some("fetch"),
            "--allow-domain github.com",
            "github.com",
        ),
        (
            "cargo",
            Some("build"),
            "--allow-domain @package-registries",
            "pypi.org:443",
        ),
        (
            "claude",
            None,
            "--pass-env OPENAI_API_KEY",
            "OPENAI_API_KEY",
        ),
    ] {
        let e = with_moat_args(tool, argv1, args, None).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, ConfigError::MoatArgsWidening { .. }),
            "{tool} {args}: {msg}"
        );
        assert!(msg.contains(needle), "{tool} {args}: {msg}");
        assert!(msg.contains("config.toml"), "{msg}");
    }
}

#[test]
fn moat_args_widening_is_allowed_when_the_user_config_grants_it() {
    let cfg = "[tools.git]\nrw = [\"/srv/shared\"]\npass_env = [\"GIT_SSH_COMMAND\"]\nallow_domains = [\"git.corp.example:443\"]\n";
    with_moat_args("git", None, "--rw /srv/shared", Some(cfg)).unwrap();
    with_moat_args("git", None, "--ro /srv/shared/sub", Some(cfg)).unwrap();
    with_moat_args("git", None, "--pass-env GIT_SSH_COMMAND", Some(cfg)).unwrap();
    with_moat_args(
        "git",
        Some("fetch"),
        "--allow-domain git.corp.example:443",
        Some(cfg),
    )
    .unwrap();
    // the level the config names is granted even where it is incomparable
    with_moat_args(
        "rg",
        None,
        "--policy workspace-contained",
        Some("[tools.rg]\nlevel = \"contained\"\n"),
    )
    .unwrap();
    with_moat_args(
        "rg",
        None,
        "--policy workspace-contained",
        Some("level = \"contained\"\n"),
    )
    .unwrap();
    with_moat_args(
        "rg",
        None,
        "--network unmanaged",
        Some("[tools.x]\nnetwork = \"unmanaged\"\n"),
    )
    .unwrap_err();
    with_moat_args("rg", None, "--network proxy", Some("network = \"proxy\"\n")).unwrap();
    // and a config entry for another tool grants nothing
    with_moat_args(
        "git",
        None,
        "--rw /srv/shared",
        Some("[tools.cargo]\nrw = [\"/srv/shared\"]\n"),
    )
    .unwrap_err();
}

#[test]
fn moat_args_widening_is_allowed_when_a_trusted_project_grants_it() {
    let p = project("[tools.git]\nrw = [\"out\"]\n");
    let s = Sources {
        profile: Some(git()),
        project: Some(p),
        moat_args: Some(parse_moat_args("--rw /home/me/proj/out").unwrap()),
        ..sources()
    };
    resolve(Some("git"), None, s).unwrap();
}

#[test]
fn a_flag_setting_the_same_scalar_skips_the_moat_args_check() {
    let s = Sources {
        profile: Some(crate::catalogue::builtin("rg").unwrap()),
        moat_args: Some(parse_moat_args("--policy workspace-write").unwrap()),
        flags: Some(flags("--policy read-only")),
        ..sources()
    };
    let r = resolve(Some("rg"), None, s).unwrap();
    assert_eq!(
        r.level,
        Sourced {
            value: Level::ReadOnly,
            source: Source::Flag
        }
    );
}

#[test]
fn level_order() {
    use Level::*;
    assert!(level_within(ReadOnly, WorkspaceWrite));
    assert!(level_within(WorkspaceContained, WorkspaceWrite));
    assert!(level_within(WorkspaceWrite, DangerFullAccess));
    assert!(!level_within(WorkspaceContained, ReadOnly));
    assert!(!level_within(ReadOnly, WorkspaceContained));
    assert!(!level_within(WorkspaceWrite, ReadOnly));
    assert!(!level_within(DangerFullAccess, WorkspaceWrite));
}

#[test]
fn profiles_with_protected_mounts_via_user_profile() {
    let ssh = profile("name = \"ssh\"\nprotected_opt_in = [\"~/.ssh\"]\n[[mounts]]\npath = \"~/.ssh\"\nmode = \"ro\"\n");
    let r = resolve(
        Some("ssh"),
        None,
        Sources {
            profile: Some(ssh),
            ..sources()
        },
    )
    .unwrap();
    let (policy, _) = r
        .to_policy("/w/p".into(), HOME.into(), |p| Ok(Some(p.to_path_buf())))
        .unwrap();
    assert_eq!(policy.protected_opt_in, [PathBuf::from("/home/me/.ssh")]);
}

#[test]
fn danger_from_a_flag_drops_the_profiles_net_class() {
    let s = Sources {
        profile: Some(git()),
        flags: Some(flags("--policy danger-full-access")),
        ..sources()
    };
    let r = resolve(Some("git"), None, s).unwrap();
    assert_eq!(
        r.net_class,
        Sourced {
            value: NetClass::Unconfined,
            source: Source::Flag
        }
    );
    assert!(
        r.notes.iter().any(|n| n.contains("net-denied")),
        "{:?}",
        r.notes
    );
    let (policy, _) = r
        .to_policy("/w/p".into(), HOME.into(), |p| Ok(Some(p.to_path_buf())))
        .unwrap();
    assert_eq!(policy.level, Level::DangerFullAccess);
    assert_eq!(
        r.network,
        Sourced {
            value: NetworkMode::Unmanaged,
            source: Source::Flag
        }
    );
    // danger with an explicit confining network from the same flags is still the policy's error
    let s = Sources {
        profile: Some(git()),
        flags: Some(flags("--policy danger-full-access --network disabled")),
        ..sources()
    };
    let r = resolve(Some("git"), None, s).unwrap();
    let e = r
        .to_policy("/w/p".into(), HOME.into(), |p| Ok(Some(p.to_path_buf())))
        .unwrap_err();
    assert!(matches!(e, ConfigError::Policy(_)), "{e}");
}

#[test]
fn net_class_reaches_the_policy() {
    let s = Sources {
        profile: Some(crate::catalogue::builtin("rg").unwrap()),
        ..sources()
    };
    let r = resolve(Some("rg"), None, s).unwrap();
    let (policy, _) = r
        .to_policy("/w/p".into(), HOME.into(), |p| Ok(Some(p.to_path_buf())))
        .unwrap();
    assert_eq!(policy.net_class, Some(NetClass::NetDenied));
}

#[test]
fn limits_resolve_per_limit_and_profile_defaults_are_best_effort() {
    let p = profile("name = \"agent\"\n[limits]\npids = 4096\ntmp_size = \"2G\"\n");
    let c = config("[tools.agent.limits]\npids = 256\nmode = \"strict\"\n");
    let s = Sources {
        profile: Some(p),
        user_config: Some(c),
        flags: Some(flags("--memory 1G")),
        ..sources()
    };
    let r = resolve(Some("agent"), None, s).unwrap();
    let l = r.policy_limits();
    assert_eq!(l.pids, Some(256));
    assert_eq!(l.tmp_size, Some(2 << 30));
    assert_eq!(l.memory, Some(1 << 30));
    assert_eq!(l.mode, moat_policy::LimitsMode::Strict);
    // Only what the profile alone set is best-effort.
    assert_eq!(l.best_effort, vec!["tmp_size".to_string()]);
}

#[test]
fn a_project_cannot_relax_how_limits_hold() {
    let e = parse_project(
        b"[limits]\nmode = \"best-effort\"\n",
        Path::new("/home/me/proj/.moat.toml"),
        Some(Path::new(HOME)),
        |_| None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("limits.mode"), "{e}");
    // Adding a limit is fine.
    let p = project("[limits]\npids = 64\n");
    assert_eq!(p.defaults.limits.pids, Some(64));
}
