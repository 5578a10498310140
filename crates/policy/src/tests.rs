use super::*;

fn req() -> PolicyRequest {
    PolicyRequest {
        workspace: "/home/u/proj".into(),
        home: "/home/u".into(),
        ..Default::default()
    }
}

#[test]
fn defaults_are_read_only_and_disabled() {
    let p = Policy::resolve(req()).unwrap();
    assert_eq!(p.level, Level::ReadOnly);
    assert_eq!(p.network.mode, NetworkMode::Disabled);
    assert!(p.write_protected.is_empty());
}

#[test]
fn danger_defaults_to_host_network_and_refuses_disabled() {
    let mut r = req();
    r.level = Some(Level::DangerFullAccess);
    assert_eq!(
        Policy::resolve(r.clone()).unwrap().network.mode,
        NetworkMode::Unmanaged
    );
    r.network = Some(NetworkMode::Disabled);
    assert_eq!(
        Policy::resolve(r).unwrap_err(),
        PolicyError::DangerNetwork(NetworkMode::Disabled)
    );
}

#[test]
fn proxy_rules_are_validated_and_canonical() {
    let mut r = req();
    r.network = Some(NetworkMode::Proxy);
    r.allow_domains = vec!["Example.COM:443".into(), "@package-registries".into()];
    r.deny_domains = vec!["evil.example.com".into()];
    r.upstream_proxy = Some("http://user:hunter2@Proxy.Corp:3128".into());
    let p = Policy::resolve(r.clone()).unwrap();
    let json = p.canonical_json();
    assert!(
        json.contains("example.com:443") && json.contains("registry.npmjs.org:443"),
        "{json}"
    );
    assert!(json.contains("http://proxy.corp:3128"));
    assert!(
        !json.contains("hunter2"),
        "credentials never reach the canonical policy"
    );
    r.allow_domains = vec!["*".into()];
    assert!(matches!(
        Policy::resolve(r).unwrap_err(),
        PolicyError::Pattern(_)
    ));
}

#[test]
fn proxy_flags_need_proxy_mode() {
    let mut r = req();
    r.allow_domains = vec!["example.com".into()];
    assert_eq!(
        Policy::resolve(r).unwrap_err(),
        PolicyError::NeedsProxyMode("--allow-domain")
    );
    let mut r = req();
    r.network = Some(NetworkMode::Proxy);
    r.upstream_proxy = Some("socks5://x:1".into());
    assert!(matches!(
        Policy::resolve(r).unwrap_err(),
        PolicyError::BadUpstream(_)
    ));
}

#[test]
fn same_path_with_two_modes_is_a_conflict_naming_both() {
    let mut r = req();
    r.ro = vec!["/data".into()];
    r.rw = vec!["/data".into()];
    let e = Policy::resolve(r).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("--ro /data") && msg.contains("--rw /data"),
        "{msg}"
    );
}

#[test]
fn same_path_same_mode_is_deduplicated() {
    let mut r = req();
    r.ro = vec!["/data".into(), "/data".into(), "/a".into()];
    let p = Policy::resolve(r).unwrap();
    assert_eq!(p.paths.len(), 2);
    assert_eq!(p.paths[0].path, PathBuf::from("/a"), "sorted by path");
}

#[test]
fn rw_workspace_at_read_only_level_is_a_conflict() {
    let mut r = req();
    r.rw = vec!["/home/u/proj".into()];
    assert!(matches!(
        Policy::resolve(r).unwrap_err(),
        PolicyError::WorkspaceConflict { .. }
    ));
    let mut r = req();
    r.level = Some(Level::WorkspaceWrite);
    r.ro = vec!["/home/u/proj".into()];
    assert!(matches!(
        Policy::resolve(r).unwrap_err(),
        PolicyError::WorkspaceConflict { .. }
    ));
}

#[test]
fn grant_inside_protected_path_needs_opt_in() {
    let mut r = req();
    r.rw = vec!["/home/u/.ssh/known_hosts".into()];
    assert!(matches!(
        Policy::resolve(r.clone()).unwrap_err(),
        PolicyError::InsideProtected { .. }
    ));
    r.ro = vec!["/home/u/.ssh".into()];
    let p = Policy::resolve(r).unwrap();
    assert_eq!(p.protected_opt_in, vec![PathBuf::from("/home/u/.ssh")]);
    assert!(!p.protected_paths().contains(&PathBuf::from("/home/u/.ssh")));
    assert!(p.protected_paths().contains(&PathBuf::from("/home/u/.aws")));
}

#[test]
fn broad_workspaces_are_refused() {
    for ws in ["/", "/proc/self", "/sys", "/dev"] {
        let mut r = req();
        r.workspace = ws.into();
        assert!(
            matches!(
                Policy::resolve(r).unwrap_err(),
                PolicyError::WorkspaceTooBroad(_)
            ),
            "{ws}"
        );
    }
    let mut r = req();
    r.workspace = "/".into();
    r.level = Some(Level::DangerFullAccess);
    assert!(
        Policy::resolve(r).is_ok(),
        "danger-full-access confines nothing, so / is fine"
    );
}

#[test]
fn relative_paths_are_refused() {
    let mut r = req();
    r.ro = vec!["data".into()];
    assert!(matches!(
        Policy::resolve(r).unwrap_err(),
        PolicyError::RelativePath(_)
    ));
}

#[test]
fn hash_is_stable_and_sensitive() {
    let a = Policy::resolve(req()).unwrap();
    let b = Policy::resolve(req()).unwrap();
    assert_eq!(a.hash(), b.hash());
    assert!(a.hash().starts_with("sha256:") && a.hash().len() == 7 + 64);
    let mut r = req();
    r.level = Some(Level::WorkspaceWrite);
    assert_ne!(Policy::resolve(r).unwrap().hash(), a.hash());
    let mut r = req();
    r.ro = vec!["/b".into(), "/a".into()];
    let mut r2 = req();
    r2.ro = vec!["/a".into(), "/b".into()];
    assert_eq!(
        Policy::resolve(r).unwrap().hash(),
        Policy::resolve(r2).unwrap().hash(),
        "order-independent"
    );
}

#[test]
fn canonical_json_has_sorted_keys_and_no_env_values() {
    let mut r = req();
    r.env = vec![("API_TOKEN".into(), "s3cr3t-value".into())];
    let p = Policy::resolve(r).unwrap();
    let json = p.canonical_json();
    assert!(!json.contains("s3cr3t-value"));
    assert!(json.contains("API_TOKEN"));
    let keys: Vec<String> =
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&json)
            .unwrap()
            .keys()
            .cloned()
            .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    assert!(json.starts_with("{\"env_names\""), "{json}");
}

#[test]
fn env_names_are_validated() {
    let mut r = req();
    r.env = vec![("A=B".into(), "x".into())];
    assert!(matches!(
        Policy::resolve(r).unwrap_err(),
        PolicyError::BadEnvName(_)
    ));
    let mut r = req();
    r.pass_env = vec!["".into()];
    assert!(matches!(
        Policy::resolve(r).unwrap_err(),
        PolicyError::BadEnvName(_)
    ));
}

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms").unwrap(), 500);
    assert_eq!(parse_duration("2s").unwrap(), 2000);
    assert_eq!(parse_duration("1m").unwrap(), 60_000);
    assert_eq!(parse_duration("3").unwrap(), 3000);
    assert_eq!(parse_duration("1.5").unwrap(), 1500);
    for bad in ["", "0", "-1s", "abc", "1x", "ms", "0ms"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn secret_env_names() {
    for n in [
        "SECRET_TOKEN",
        "GITHUB_TOKEN",
        "AWS_REGION",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "DB_PASSWORD",
        "x_secret",
        "SESSION_COOKIE",
        "MOAT_UPSTREAM_PROXY_AUTH",
        "SMTP_PASS",
        "GITLAB_PAT",
    ] {
        assert!(is_secret_env_name(n), "{n}");
    }
    for n in [
        "PATH",
        "HOME",
        "LANG",
        "TERM",
        "CARGO_HOME",
        "KEYBOARD",
        "OLDPWD",
        "PWD",
    ] {
        assert!(!is_secret_env_name(n), "{n}");
    }
}

#[test]
fn protected_names() {
    assert!(is_protected_workspace_name(".env"));
    assert!(is_protected_workspace_name(".env.local"));
    assert!(is_protected_workspace_name(".envrc"));
    assert!(!is_protected_workspace_name(".environment"));
    assert!(is_write_protected_name(".moatrc"));
    assert!(is_write_protected_name(".vscode"));
    assert!(!is_write_protected_name("src"));
}

#[test]
fn workspace_inside_protected_path_is_refused_unless_opted_in() {
    let mut r = req();
    r.workspace = "/home/u/.ssh".into();
    assert!(matches!(
        Policy::resolve(r.clone()).unwrap_err(),
        PolicyError::WorkspaceProtected { .. }
    ));
    r.workspace = "/home/u/.aws/sub".into();
    assert!(matches!(
        Policy::resolve(r.clone()).unwrap_err(),
        PolicyError::WorkspaceProtected { .. }
    ));
    r.ro = vec!["/home/u/.aws".into()];
    assert!(Policy::resolve(r).is_ok());
}

fn non_utf8(prefix: &str, byte: u8) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let mut bytes = prefix.as_bytes().to_vec();
    bytes.push(byte);
    std::path::PathBuf::from(std::ffi::OsString::from_vec(bytes))
}

#[test]
fn non_utf8_paths_hash_differently() {
    let with_ws = |ws: std::path::PathBuf| {
        let mut r = req();
        r.workspace = ws;
        Policy::resolve(r).unwrap()
    };
    let a = with_ws(non_utf8("/home/u/proj-", 0xff));
    let b = with_ws(non_utf8("/home/u/proj-", 0xfe));
    assert_ne!(a.canonical_value(), serde_json::Value::Null);
    assert_ne!(a.hash(), b.hash(), "{}", a.canonical_json());
    // The path is in the canonical form, losslessly.
    assert_eq!(
        a.canonical_value()["workspace"],
        serde_json::json!({"bytes_hex": "2f686f6d652f752f70726f6a2dff"})
    );
    // A UTF-8 path keeps its plain string form.
    let plain = Policy::resolve(req()).unwrap();
    assert_eq!(plain.canonical_value()["workspace"], "/home/u/proj");

    // Grants and opted-in protected paths too.
    let with_ro = |p: std::path::PathBuf| {
        let mut r = req();
        r.ro = vec![p];
        Policy::resolve(r).unwrap()
    };
    let c = with_ro(non_utf8("/data/x-", 0x80));
    let d = with_ro(non_utf8("/data/x-", 0x81));
    assert_ne!(c.hash(), d.hash());
    assert_ne!(c.hash(), plain.hash());
}

#[test]
fn a_string_path_never_collides_with_an_encoded_one() {
    let mut r = req();
    // A UTF-8 path that spells what a non-UTF-8 one is encoded as.
    r.workspace = "/home/u/{\"bytes_hex\":\"ff\"}".into();
    let text = Policy::resolve(r).unwrap();
    let mut r = req();
    r.workspace = non_utf8("/home/u/", 0xff);
    let bytes = Policy::resolve(r).unwrap();
    assert_ne!(text.hash(), bytes.hash());
}

#[test]
fn digest_is_the_hash_and_the_canonical_value() {
    let mut r = req();
    r.workspace = non_utf8("/home/u/proj-", 0xff);
    let p = Policy::resolve(r).unwrap();
    assert_eq!(p.digest(), (p.hash(), p.canonical_value()));
    assert_eq!(p.hash().len(), 7 + 64);
}

/// The workspace check compares components after the home: a name that
/// only starts like a protected one, or a sibling home, is not inside it.
#[test]
fn workspace_protection_compares_components_under_the_home() {
    let refused = |ws: &str| {
        let mut r = req();
        r.workspace = ws.into();
        matches!(
            Policy::resolve(r),
            Err(PolicyError::WorkspaceProtected { .. })
        )
    };
    assert!(refused("/home/u/.config/gh"));
    assert!(refused("/home/u/.config/gh/sub/dir"));
    assert!(!refused("/home/u/.sshd"));
    assert!(!refused("/home/u/.config"));
    assert!(!refused("/home/u"));
    assert!(!refused("/home/u2/.ssh"));
    assert!(!refused("/home/.ssh"));
}
