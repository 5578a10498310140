//! Golden tests: every level × network mode, for Seatbelt and Kubernetes
//! (and the OCI config), on fixed host facts. `MOAT_UPDATE_GOLDEN=1`
//! rewrites the files under tests/golden; review the diff before committing.

use std::path::{Path, PathBuf};

use moat_linux::plan::Plan;
use moat_linux::probe::{HostFacts, Kind, RootEntry};
use moat_policy::{Level, NetworkMode, Policy, PolicyRequest};

use crate::sbpl_check;

fn root(name: &str, kind: Kind, link: Option<&str>) -> RootEntry {
    RootEntry {
        name: name.into(),
        kind,
        link: link.map(PathBuf::from),
    }
}

fn host() -> HostFacts {
    HostFacts {
        uid: 1000,
        gid: 1000,
        landlock_abi: 6,
        root_entries: vec![
            root("bin", Kind::Symlink, Some("usr/bin")),
            root("etc", Kind::Dir, None),
            root("home", Kind::Dir, None),
            root("usr", Kind::Dir, None),
            root("var", Kind::Dir, None),
        ],
        secrets: [
            (PathBuf::from("/home/u/.ssh"), Kind::Dir),
            (PathBuf::from("/home/u/.netrc"), Kind::File),
            (PathBuf::from("/etc/shadow"), Kind::File),
        ]
        .into_iter()
        .collect(),
        workspace_protected: [(PathBuf::from("/home/u/proj/.env"), Kind::File)]
            .into_iter()
            .collect(),
        workspace_write_protected: [
            (PathBuf::from("/home/u/proj/.git"), Kind::Dir),
            (PathBuf::from("/home/u/proj/.git/hooks"), Kind::Dir),
            (PathBuf::from("/home/u/proj/.vscode"), Kind::Dir),
        ]
        .into_iter()
        .collect(),
        workspace_missing: vec![PathBuf::from("/home/u/proj/.bashrc")],
        proc_entries: vec!["sys".into(), "kcore".into()],
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("SECRET_TOKEN".into(), "tok".into()),
        ],
        moat_exe: Some("/usr/local/bin/moat".into()),
        ..Default::default()
    }
}

fn policy(level: Level, network: NetworkMode) -> Policy {
    let allow = if network == NetworkMode::Proxy {
        vec!["example.com".to_string(), "*.crates.io".to_string()]
    } else {
        Vec::new()
    };
    let deny = if network == NetworkMode::Proxy {
        vec!["evil.example.com".to_string()]
    } else {
        Vec::new()
    };
    Policy::resolve(PolicyRequest {
        level: Some(level),
        network: Some(network),
        workspace: "/home/u/proj".into(),
        home: "/home/u".into(),
        allow_domains: allow,
        deny_domains: deny,
        ..Default::default()
    })
    .expect("policy")
}

fn plan(p: &Policy) -> Plan {
    moat_linux::build_plan(p, &host()).expect("plan")
}

const SANDBOXED: [Level; 3] = [
    Level::ReadOnly,
    Level::WorkspaceWrite,
    Level::WorkspaceContained,
];

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("MOAT_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "missing golden {}; run with MOAT_UPDATE_GOLDEN=1",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{} differs from the golden file; if intended, rerun with MOAT_UPDATE_GOLDEN=1\n--- actual ---\n{actual}",
        path.display()
    );
}

#[test]
fn seatbelt_profiles_golden_balanced_and_known() {
    for level in SANDBOXED {
        for net in NetworkMode::ALL {
            let p = policy(level, net);
            let view = moat_linux::view::compute(&p, &host());
            let profile = crate::seatbelt::profile(&p, &view);
            let first = profile.lines().next().unwrap_or_default();
            assert_eq!(first, format!(";; moat policy {}", p.hash()));
            if let Err(e) = sbpl_check::check(&profile) {
                panic!("{level} {net}: {e}\n{profile}");
            }
            golden(&format!("seatbelt-{level}-{net}.sbpl"), &profile);
        }
    }
}

/// The properties the goldens pin, stated so a reader need not diff files.
#[test]
fn seatbelt_profile_denies_stand_ins_and_protects_names() {
    let p = policy(Level::WorkspaceWrite, NetworkMode::Disabled);
    let sb = crate::seatbelt::profile(&p, &moat_linux::view::compute(&p, &host()));
    assert!(sb.contains("(deny default)"));
    let deny = sb
        .split("(deny file-read* file-write*")
        .nth(1)
        .unwrap_or_default();
    assert!(deny.contains("(subpath \"/home/u/.ssh\")"), "{sb}");
    assert!(sb.contains("(subpath \"/home/u/proj/.env\")"));
    // Missing today, write-protected all the same (by path rule).
    assert!(sb.contains("(require-not (subpath \"/home/u/proj/.bashrc\"))"));
    assert!(sb.contains("(require-not (subpath \"/home/u/proj/.git/config\"))"));
    assert!(sb.contains("(require-not (regex #\"^/home/u/proj/\\.moat\"))"));
    // Git, hg and jj config at any depth, as on Linux.
    assert!(
        sb.contains("(require-not (regex #\"^/home/u/proj/(.+/)?\\.hg/hgrc(/|$)\"))"),
        "{sb}"
    );
    assert!(
        sb.contains("(require-not (regex #\"^/home/u/proj/(.+/)?\\.git/hooks(/|$)\"))"),
        "{sb}"
    );
    assert!(
        !sb.contains("(allow network"),
        "disabled network allows nothing: {sb}"
    );
    let px = policy(Level::WorkspaceWrite, NetworkMode::Proxy);
    let sb = crate::seatbelt::profile(&px, &moat_linux::view::compute(&px, &host()));
    assert!(sb.contains("(remote ip \"localhost:3128\")"));
    assert!(!sb.contains("(allow network*)"));
    let ro = policy(Level::ReadOnly, NetworkMode::Disabled);
    let sb = crate::seatbelt::profile(&ro, &moat_linux::view::compute(&ro, &host()));
    assert!(
        !sb.contains("(subpath \"/home/u/proj\")\n"),
        "read-only: no workspace write rule: {sb}"
    );
}

#[test]
fn k8s_manifests_golden() {
    for level in SANDBOXED {
        for net in NetworkMode::ALL {
            let p = policy(level, net);
            let pl = plan(&p);
            let cmd = vec![
                "/bin/sh".to_string(),
                "-c".to_string(),
                "make test".to_string(),
            ];
            for kind in [crate::k8s::Kind::Pod, crate::k8s::Kind::SandboxTemplate] {
                let docs = crate::k8s::manifests(&crate::k8s::K8sInput {
                    policy: &p,
                    plan: &pl,
                    command: &cmd,
                    image: "example.org/agent:1",
                    proxy_image: "example.org/moat:1",
                    runtime_class: Some("gvisor"),
                    kind,
                })
                .expect("manifests");
                for d in &docs {
                    let ann = &d["metadata"]["annotations"];
                    assert_eq!(ann[crate::ANNOTATION_HASH], p.hash().as_str(), "{d}");
                }
                let k = if kind == crate::k8s::Kind::Pod {
                    "pod"
                } else {
                    "sandbox-template"
                };
                golden(
                    &format!("k8s-{k}-{level}-{net}.yaml"),
                    &crate::k8s::to_yaml(&docs),
                );
            }
        }
    }
}

#[test]
fn oci_config_golden() {
    for level in SANDBOXED {
        for net in [NetworkMode::Disabled, NetworkMode::Unmanaged] {
            let p = policy(level, net);
            let pl = plan(&p);
            let cmd = vec!["/bin/true".to_string()];
            let b = crate::oci::bundle(&crate::oci::OciInput {
                policy: &p,
                plan: &pl,
                command: &cmd,
                rlimits: &[crate::oci::Rlimit {
                    name: "RLIMIT_NOFILE",
                    soft: 1024,
                    hard: 4096,
                }],
            })
            .expect("bundle");
            assert_eq!(
                b.config["annotations"][crate::ANNOTATION_HASH],
                p.hash().as_str()
            );
            let text = serde_json::to_string_pretty(&b.config).expect("json") + "\n";
            golden(&format!("oci-{level}-{net}.json"), &text);
        }
    }
    let p = policy(Level::WorkspaceWrite, NetworkMode::Proxy);
    let r = crate::oci::bundle(&crate::oci::OciInput {
        policy: &p,
        plan: &plan(&p),
        command: &[],
        rlimits: &[],
    });
    assert!(matches!(r, Err(crate::ExportError::OciProxy)));
}

/// The ABI guard in OCI form: clone3 → ENOSYS, one masked rule per
/// CLONE_NEW* bit for clone and unshare, only the native architecture.
#[test]
fn oci_seccomp_carries_the_abi_guard() {
    let p = policy(Level::WorkspaceWrite, NetworkMode::Disabled);
    let s = crate::oci::seccomp(&plan(&p).seccomp);
    assert_eq!(s["architectures"].as_array().map(Vec::len), Some(1));
    let rules = s["syscalls"].as_array().cloned().unwrap_or_default();
    assert!(rules
        .iter()
        .any(|r| r["names"] == serde_json::json!(["clone3"]) && r["errnoRet"] == 38));
    let bits = moat_linux::process::NEW_NAMESPACE_FLAGS.count_ones() as usize;
    let guard = ["clone", "unshare"].map(|n| serde_json::json!([n]));
    let masked = rules
        .iter()
        .filter(|r| r["args"][0]["op"] == "SCMP_CMP_MASKED_EQ" && guard.contains(&r["names"]))
        .count();
    assert_eq!(masked, 2 * bits);
    // The set-id rules: three per mode-setting syscall, on its mode argument.
    let setid = moat_linux::confine::SETID_MODE_SYSCALLS;
    for (name, _, index) in setid {
        let on_mode = rules.iter().filter(|r| {
            r["names"] == serde_json::json!([name])
                && r["args"][0]["index"] == *index
                && r["args"][0]["value"] == 0o6000
        });
        assert_eq!(on_mode.count(), 3, "{name}");
    }
    let user = libc::CLONE_NEWUSER as u64;
    assert!(rules
        .iter()
        .any(|r| r["names"] == serde_json::json!(["unshare"]) && r["args"][0]["value"] == user));
}

/// The Seatbelt backend behind the seam: `sandbox-exec` by absolute path
/// with the private HOME/TMPDIR as profile parameters; off macOS, launch
/// refuses (it never runs the command unconfined).
#[test]
fn seatbelt_backend_argv_and_launch() {
    use crate::backend::{Backend, LaunchError, Seatbelt};
    let p = policy(Level::WorkspaceWrite, NetworkMode::Disabled);
    let view = moat_linux::view::compute(&p, &host());
    let b = Seatbelt {
        home: "/private/tmp/m/home".into(),
        tmp: "/private/tmp/m/tmp".into(),
    };
    let plan = b.plan(&p, &view);
    assert_eq!(b.explain(&plan), crate::seatbelt::profile(&p, &view));
    let argv: Vec<String> = b
        .argv(&plan, &["make".into(), "test".into()])
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        argv[..4],
        [
            "-D",
            "MOAT_HOME=/private/tmp/m/home",
            "-D",
            "MOAT_TMP=/private/tmp/m/tmp"
        ]
    );
    assert_eq!(argv[4], "-p");
    assert_eq!(argv[5], plan.profile);
    assert_eq!(argv[6..], ["--", "make", "test"]);
    assert_eq!(b.probe()["launcher"], "/usr/bin/sandbox-exec");
    if !cfg!(target_os = "macos") {
        assert!(matches!(
            b.launch(&plan, &["true".into()]),
            Err(LaunchError::Unsupported(_))
        ));
        assert_eq!(b.probe()["available"], false);
    }
}

/// Paths with quotes, backslashes and regex metacharacters stay inside
/// their string and regex literals.
#[test]
fn seatbelt_escapes_odd_paths() {
    let ws = "/home/u/we\"ird\\dir (1).x+y";
    let p = Policy::resolve(PolicyRequest {
        level: Some(Level::WorkspaceWrite),
        network: Some(NetworkMode::Disabled),
        workspace: ws.into(),
        home: "/home/u".into(),
        ..Default::default()
    })
    .expect("policy");
    let profile = crate::seatbelt::profile(&p, &moat_linux::view::compute(&p, &host()));
    if let Err(e) = sbpl_check::check(&profile) {
        panic!("{e}\n{profile}");
    }
    assert!(
        profile.contains(r#"(subpath "/home/u/we\"ird\\dir (1).x+y")"#),
        "{profile}"
    );
    assert!(
        profile.contains(r#"(regex #"^/home/u/we\"ird\\dir \(1\)\.x\+y/\.moat")"#),
        "{profile}"
    );
}

/// A newline in a path cannot end the header comment or a string and
/// smuggle a rule into the profile.
#[test]
fn seatbelt_newline_in_a_path_adds_no_rule() {
    let ws = "/home/u/x\n(allow default)\n;";
    let p = Policy::resolve(PolicyRequest {
        level: Some(Level::WorkspaceWrite),
        network: Some(NetworkMode::Disabled),
        workspace: ws.into(),
        home: "/home/u".into(),
        ..Default::default()
    })
    .expect("policy");
    let profile = crate::seatbelt::profile(&p, &moat_linux::view::compute(&p, &host()));
    if let Err(e) = sbpl_check::check(&profile) {
        panic!("{e}\n{profile}");
    }
    assert!(
        !profile
            .lines()
            .any(|l| l.trim_start().starts_with("(allow default)")),
        "{profile}"
    );
}

/// A bundle path that is a symlink (planted at the predictable default name
/// in /var/tmp) is refused, even when it leads to a private directory of
/// the caller's: moat would otherwise write the bundle wherever it points.
#[test]
fn bundle_dir_that_is_a_symlink_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let base = std::env::temp_dir().join(format!("moat-export-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let target = base.join("private");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = base.join("moat-bundle-x");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let refused = crate::oci::own_bundle_dir(&link);
    let fresh = crate::oci::own_bundle_dir(&base.join("fresh"));
    let _ = std::fs::remove_dir_all(&base);
    assert!(
        matches!(refused, Err(crate::ExportError::BundleDirUnsafe(..))),
        "{refused:?}"
    );
    assert!(fresh.is_ok(), "{fresh:?}");
}
