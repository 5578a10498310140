//! Golden tests of plan building: exact mount lists and filters, no syscalls.

use std::path::{Path, PathBuf};

use moat_policy::{Level, NetworkMode, Policy, PolicyRequest};

use super::*;
use crate::probe::{HostFacts, Kind, RootEntry};

fn entry(name: &str, kind: Kind, link: Option<&str>) -> RootEntry {
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
        landlock_abi: 7,
        root_entries: vec![
            entry("bin", Kind::Symlink, Some("usr/bin")),
            entry("dev", Kind::Dir, None),
            entry("etc", Kind::Dir, None),
            entry("home", Kind::Dir, None),
            entry("proc", Kind::Dir, None),
            entry("root", Kind::Dir, None),
            entry("run", Kind::Dir, None),
            entry("tmp", Kind::Dir, None),
            entry("usr", Kind::Dir, None),
            entry("var", Kind::Dir, None),
        ],
        secrets: [
            (PathBuf::from("/home/u/.ssh"), Kind::Dir),
            (PathBuf::from("/home/u/.aws"), Kind::Dir),
            (PathBuf::from("/etc/shadow"), Kind::File),
            (PathBuf::from("/root/.ssh"), Kind::Dir),
        ]
        .into_iter()
        .collect(),
        home_protected: [(PathBuf::from("/home/u/.ssh"), PathBuf::from("/home/u/.ssh"))]
            .into_iter()
            .collect(),
        sockets: [
            (PathBuf::from("/run/user/1000"), Kind::Dir),
            (PathBuf::from("/var/tmp/agent.sock"), Kind::File),
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
        sweep: vec![crate::sweep::SweepRoot {
            root: PathBuf::from("/home/u/proj"),
            missing: vec![PathBuf::from(".bashrc")],
            gitdirs: vec![PathBuf::from(".git")],
            ..Default::default()
        }],
        proc_entries: vec!["sys".into(), "kcore".into()],
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("SECRET_TOKEN".into(), "tok".into()),
            ("LC_ALL".into(), "C".into()),
            ("EDITOR".into(), "vi".into()),
        ],
        ..Default::default()
    }
}

fn policy(level: Level, network: Option<NetworkMode>) -> Policy {
    Policy::resolve(PolicyRequest {
        level: Some(level),
        network,
        workspace: "/home/u/proj".into(),
        home: "/home/u".into(),
        ..Default::default()
    })
    .unwrap()
}

fn targets(plan: &Plan) -> Vec<String> {
    plan.mounts
        .iter()
        .map(|op| {
            let kind = match op {
                MountOp::Tmpfs { .. } => "tmpfs",
                MountOp::Bind { readonly: true, .. } => "ro",
                MountOp::Bind {
                    readonly: false, ..
                } => "rw",
                MountOp::Symlink { .. } => "link",
                MountOp::Proc { .. } => "proc",
                MountOp::Devpts { .. } => "devpts",
                MountOp::ReadOnlyAgain { .. } => "ro-again",
                MountOp::StandIn { .. } => "stand-in",
                MountOp::Redacted { .. } => "redacted",
                MountOp::File { .. } => "file",
            };
            format!("{kind} {}", op.target().display())
        })
        .collect()
}

#[test]
fn workspace_write_golden() {
    let plan = build(&policy(Level::WorkspaceWrite, None), &host()).unwrap();
    let t = targets(&plan);
    let expected = [
        // The view's start (ViewStart: the policy alone decides it).
        "tmpfs /tmp",
        "tmpfs /run",
        "tmpfs /dev",
        "rw /dev/null",
        "rw /dev/zero",
        "rw /dev/full",
        "rw /dev/random",
        "rw /dev/urandom",
        "rw /dev/tty",
        "devpts /dev/pts",
        "link /dev/ptmx",
        "tmpfs /dev/shm",
        "link /dev/fd",
        "link /dev/stdin",
        "link /dev/stdout",
        "link /dev/stderr",
        "proc /proc",
        "link /bin",
        "ro /etc",
        "ro /home",
        "ro /root",
        "ro /usr",
        "ro /var",
        "ro /sys",
        "tmpfs /moat/home",
        "ro-again /proc/sys",
        "stand-in /proc/kcore",
        "stand-in /etc/shadow",
        "stand-in /root/.ssh",
        "rw /home/u/proj",
        "stand-in /home/u/.aws",
        "stand-in /home/u/.ssh",
        "stand-in /var/tmp/agent.sock",
        "rw /home/u/proj/.git",
        "ro /home/u/proj/.vscode",
        "stand-in /home/u/proj/.env",
        "ro /home/u/proj/.git/hooks",
    ];
    assert_eq!(t, expected, "{t:#?}");
    assert_eq!(plan.sweep, host().sweep);
    assert!(plan.new_netns);
    assert_eq!(plan.seccomp.socket_families, Some(vec![libc::AF_UNIX]));
    assert_eq!(plan.landlock.read, vec![PathBuf::from("/")]);
    assert!(plan.landlock.write.contains(&PathBuf::from("/home/u/proj")));
    assert!(plan.landlock.scoped);
}

#[test]
fn sockets_outside_hidden_dirs_get_stand_ins() {
    let plan = build(&policy(Level::ReadOnly, None), &host()).unwrap();
    let t = targets(&plan);
    assert!(
        t.contains(&"stand-in /var/tmp/agent.sock".to_string()),
        "{t:#?}"
    );
    // /run is moat's own empty tmpfs: nothing under it needs a stand-in.
    assert!(!t.iter().any(|s| s.contains("/run/user")), "{t:#?}");
}

#[test]
fn read_only_workspace_is_read_only_and_nothing_is_swept() {
    let plan = build(&policy(Level::ReadOnly, None), &host()).unwrap();
    assert!(targets(&plan).contains(&"ro /home/u/proj".to_string()));
    assert!(plan.sweep.is_empty());
    assert!(!plan.landlock.write.contains(&PathBuf::from("/home/u/proj")));
}

#[test]
fn contained_shows_only_the_runtime_and_workspace() {
    let plan = build(&policy(Level::WorkspaceContained, None), &host()).unwrap();
    let t = targets(&plan);
    for absent in [
        "ro /home",
        "ro /root",
        "ro /var",
        "ro /sys",
        "tmpfs /run",
        "stand-in /home/u/.ssh",
        "stand-in /root/.ssh",
    ] {
        assert!(!t.contains(&absent.to_string()), "{absent} in {t:#?}");
    }
    for present in [
        "ro /etc",
        "ro /usr",
        "link /bin",
        "rw /home/u/proj",
        "stand-in /etc/shadow",
        "stand-in /home/u/proj/.env",
    ] {
        assert!(
            t.contains(&present.to_string()),
            "{present} missing from {t:#?}"
        );
    }
    assert!(plan.landlock.read.contains(&PathBuf::from("/usr")));
    assert!(!plan.landlock.read.contains(&PathBuf::from("/")));
    assert_eq!(plan.landlock.list_only, vec![PathBuf::from("/")]);
}

#[test]
fn opted_in_protected_path_is_bound_not_hidden() {
    let p = Policy::resolve(PolicyRequest {
        level: Some(Level::WorkspaceContained),
        workspace: "/home/u/proj".into(),
        home: "/home/u".into(),
        ro: vec!["/home/u/.ssh".into()],
        ..Default::default()
    })
    .unwrap();
    let mut h = host();
    h.grant_kinds.insert("/home/u/.ssh".into(), Kind::Dir);
    let t = targets(&build(&p, &h).unwrap());
    assert!(t.contains(&"ro /home/u/.ssh".to_string()));
    assert!(!t.contains(&"stand-in /home/u/.ssh".to_string()));
}

#[test]
fn parents_are_mounted_before_children() {
    let plan = build(&policy(Level::WorkspaceWrite, None), &host()).unwrap();
    for (i, a) in plan.mounts.iter().enumerate() {
        for b in &plan.mounts[..i] {
            assert!(
                !(b.target() != a.target()
                    && b.target().starts_with(a.target())
                    && !matches!(a, MountOp::Symlink { .. })),
                "{} is mounted after its child {}",
                a.target().display(),
                b.target().display()
            );
        }
    }
}

#[test]
fn danger_builds_no_sandbox() {
    let plan = build(&policy(Level::DangerFullAccess, None), &host()).unwrap();
    assert!(!plan.sandboxed && plan.mounts.is_empty() && !plan.new_netns);
    assert!(plan.env.contains(&("HOME".into(), "/home/u".into())));
}

#[test]
fn environment_is_a_safe_base() {
    let plan = build(&policy(Level::ReadOnly, None), &host()).unwrap();
    let names: Vec<&str> = plan.env.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["HOME", "LC_ALL", "PATH", "TMPDIR"]);
    assert!(plan.env.contains(&("HOME".into(), SANDBOX_HOME.into())));
    let p = Policy::resolve(PolicyRequest {
        workspace: "/home/u/proj".into(),
        home: "/home/u".into(),
        pass_env: vec!["SECRET_TOKEN".into()],
        env: vec![("A".into(), "1".into())],
        ..Default::default()
    })
    .unwrap();
    let plan = build(&p, &host()).unwrap();
    assert!(plan.env.contains(&("SECRET_TOKEN".into(), "tok".into())));
    assert!(plan.env.contains(&("A".into(), "1".into())));
}

#[test]
fn kernel_without_landlock_or_scoping_is_refused() {
    let mut h = host();
    h.landlock_abi = 0;
    assert_eq!(
        build(&policy(Level::ReadOnly, None), &h).unwrap_err(),
        PlanError::NoLandlock(Level::ReadOnly)
    );
    h.landlock_abi = 5;
    assert!(
        build(&policy(Level::ReadOnly, None), &h).is_ok(),
        "disabled network isolates abstract sockets by netns"
    );
    assert_eq!(
        build(&policy(Level::ReadOnly, Some(NetworkMode::Unmanaged)), &h).unwrap_err(),
        PlanError::NoAbstractScoping(5)
    );
    h.landlock_abi = 0;
    assert!(build(&policy(Level::DangerFullAccess, None), &h).is_ok());
}

#[test]
fn missing_grant_is_an_error() {
    let p = Policy::resolve(PolicyRequest {
        workspace: "/home/u/proj".into(),
        home: "/home/u".into(),
        ro: vec!["/data".into()],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        build(&p, &host()).unwrap_err(),
        PlanError::MissingGrant("/data".into())
    );
}

#[test]
fn directories_above_protected_mounts_in_writable_binds_are_pinned() {
    // Workspace = HOME: ~/.config/gh is a stand-in; ~/.config must become a
    // mount point so `mv ~/.config x` cannot carry the stand-in away.
    let p = Policy::resolve(PolicyRequest {
        level: Some(Level::WorkspaceWrite),
        workspace: "/home/u".into(),
        home: "/home/u".into(),
        ..Default::default()
    })
    .unwrap();
    let mut h = host();
    h.secrets.insert("/home/u/.config/gh".into(), Kind::Dir);
    h.moat_hidden
        .insert("/home/u/.local/state/moat".into(), Kind::Dir);
    let t = targets(&build(&p, &h).unwrap());
    for pin in [
        "rw /home/u/.config",
        "rw /home/u/.local",
        "rw /home/u/.local/state",
    ] {
        assert!(t.contains(&pin.to_string()), "{pin} missing from {t:#?}");
    }
    let pos = |s: &str| t.iter().position(|x| x == s).unwrap();
    assert!(pos("rw /home/u/.config") < pos("stand-in /home/u/.config/gh"));
    assert!(pos("rw /home/u/.local/state") < pos("stand-in /home/u/.local/state/moat"));
    // Nothing is pinned at the read-only level: nothing there is writable.
    let ro = Policy::resolve(PolicyRequest {
        workspace: "/home/u".into(),
        home: "/home/u".into(),
        ..Default::default()
    })
    .unwrap();
    let t = targets(&build(&ro, &h).unwrap());
    assert!(!t.contains(&"rw /home/u/.config".to_string()), "{t:#?}");
}

/// The seccomp floor is data in the plan: this pins it. A syscall added to
/// (or dropped from) the floor changes this list on purpose.
#[test]
fn seccomp_floor_golden() {
    let plan = build(&policy(Level::WorkspaceWrite, None), &host()).unwrap();
    let names: Vec<&str> = plan.seccomp.floor.iter().map(|(n, _)| *n).collect();
    let expected = [
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "keyctl",
        "add_key",
        "request_key",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "mount",
        "umount2",
        "pivot_root",
        "move_mount",
        "open_tree",
        "open_tree_attr",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "mount_setattr",
        "setns",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "open_by_handle_at",
        "name_to_handle_at",
        "chroot",
        "acct",
        "swapon",
        "swapoff",
        "reboot",
        "quotactl",
        "syslog",
        "personality",
        "landlock_create_ruleset",
        "landlock_add_rule",
        "landlock_restrict_self",
        "pidfd_getfd",
        "kcmp",
        "lookup_dcookie",
        "fanotify_init",
        "vhangup",
    ];
    assert_eq!(names, expected, "{names:#?}");
    let ioctls: Vec<&str> = plan.seccomp.denied_ioctls.iter().map(|(n, _)| *n).collect();
    assert_eq!(ioctls, ["TIOCSTI", "TIOCLINUX", "TIOCSETD"]);
    // Numbers match the names (no list was copied by hand).
    assert!(plan.seccomp.floor.contains(&("ptrace", libc::SYS_ptrace)));
    // The same floor at every sandboxed level and network mode.
    for (level, net) in [
        (Level::ReadOnly, Some(NetworkMode::Proxy)),
        (Level::WorkspaceContained, None),
    ] {
        let mut h = host();
        h.moat_exe = Some("/usr/bin/moat".into());
        let p = build(&policy(level, net), &h).unwrap();
        assert_eq!(p.seccomp.floor, plan.seccomp.floor);
    }
    // The filter builds from the data.
    assert!(crate::confine::seccomp_filter(&plan.seccomp).is_ok());
}

fn with_grants(level: Level, ro: &[&str], rw: &[&str]) -> Policy {
    Policy::resolve(PolicyRequest {
        level: Some(level),
        workspace: "/home/u/proj".into(),
        home: "/home/u".into(),
        ro: ro.iter().map(PathBuf::from).collect(),
        rw: rw.iter().map(PathBuf::from).collect(),
        ..Default::default()
    })
    .unwrap()
}

fn host_with_home_state() -> HostFacts {
    let mut h = host();
    h.secrets.insert("/home/u/.config/gh".into(), Kind::Dir);
    h.secrets
        .insert("/home/u/.cargo/credentials.toml".into(), Kind::File);
    h.moat_hidden
        .insert("/home/u/.local/state/moat".into(), Kind::Dir);
    h.moat_readonly.push("/home/u/.config/moat".into());
    for g in ["/home/u/.config", "/home/u/.cargo", "/home/u/.local"] {
        h.grant_kinds.insert(g.into(), Kind::Dir);
    }
    h
}

/// A grant under the real home also shows under /moat/home; every stand-in
/// and read-only bind of the host path is repeated there (issue 8 §3).
#[test]
fn mirrored_grants_carry_the_same_stand_ins_golden() {
    let h = host_with_home_state();
    for level in [Level::ReadOnly, Level::WorkspaceContained] {
        let p = with_grants(level, &["/home/u/.config", "/home/u/.cargo"], &[]);
        let t = targets(&build(&p, &h).unwrap());
        let mine: Vec<&String> = t
            .iter()
            .filter(|s| s.contains(".config") || s.contains(".cargo"))
            .collect();
        assert_eq!(
            mine,
            [
                "ro /home/u/.cargo",
                "ro /home/u/.config",
                "ro /moat/home/.cargo",
                "ro /moat/home/.config",
                "stand-in /home/u/.cargo/credentials.toml",
                "stand-in /home/u/.config/gh",
                "stand-in /moat/home/.cargo/credentials.toml",
                "stand-in /moat/home/.config/gh",
            ],
            "{level}: {t:#?}"
        );
    }
}

/// `--rw ~/.config` and `--rw ~/.local`: moat's config stays read-only and
/// its state hidden, at the host path and under /moat/home, and the
/// directories above them are pinned in both places.
#[test]
fn moat_config_and_state_survive_mirrored_rw_grants_golden() {
    let h = host_with_home_state();
    let p = with_grants(
        Level::WorkspaceWrite,
        &[],
        &["/home/u/.config", "/home/u/.local"],
    );
    let plan = build(&p, &h).unwrap();
    let t = targets(&plan);
    for want in [
        "rw /home/u/.config",
        "rw /moat/home/.config",
        "ro /home/u/.config/moat",
        "ro /moat/home/.config/moat",
        "stand-in /home/u/.config/gh",
        "stand-in /moat/home/.config/gh",
        "rw /home/u/.local/state",
        "rw /moat/home/.local/state",
        "stand-in /home/u/.local/state/moat",
        "stand-in /moat/home/.local/state/moat",
    ] {
        assert!(t.contains(&want.to_string()), "{want} missing: {t:#?}");
    }
    // Pins under a mirror bind the host directory it shows.
    let pin = plan
        .mounts
        .iter()
        .find(|m| m.target() == Path::new("/moat/home/.local/state"));
    assert!(
        matches!(pin, Some(MountOp::Bind { source, .. }) if source == Path::new("/home/u/.local/state")),
        "{pin:?}"
    );
    // Explaining a refusal there asks the view.
    let why = crate::explain::explain(
        &plan,
        "/moat/home/.config/moat/config.toml",
        "EROFS",
        |_| true,
    );
    assert_eq!(why, Some(crate::explain::DenyReason::MoatState));
}

/// moat's own directory missing, uncreatable, and inside a writable part:
/// the run is refused rather than left open to a planted config.
#[test]
fn missing_moat_dir_in_a_writable_part_is_refused() {
    let mut h = host();
    h.moat_missing.push("/home/u/proj/xdg/moat".into());
    let err = build(&policy(Level::WorkspaceWrite, None), &h).unwrap_err();
    assert_eq!(
        err,
        PlanError::MoatDirUnprotected("/home/u/proj/xdg/moat".into())
    );
    // Read-only: nothing could create it.
    assert!(build(&policy(Level::ReadOnly, None), &h).is_ok());
}

/// The view of workspace-write, entry by entry (path, mode, why).
#[test]
fn workspace_write_view_golden() {
    let plan = build(&policy(Level::WorkspaceWrite, None), &host()).unwrap();
    let got: Vec<String> = plan
        .view
        .entries
        .iter()
        .map(|e| format!("{:?} {:?} {}", e.mode, e.why, e.path.display()))
        .collect();
    let expected = [
        "Read System /",
        "Built Sandbox /proc",
        "Built Sandbox /dev",
        "Built Sandbox /sys",
        "Built Sandbox /tmp",
        "Built Sandbox /run",
        "Built Sandbox /moat",
        "Built Sandbox /moat/home",
        "Write Workspace /home/u/proj",
        "Write GitDir /home/u/proj/.git",
        "WriteProtected RunsCode /home/u/proj/.git/hooks",
        "WriteProtected RunsCode /home/u/proj/.vscode",
        "Hidden Secret /etc/shadow",
        "Hidden Secret /home/u/.aws",
        "Hidden Secret /home/u/.ssh",
        "Hidden Secret /home/u/proj/.env",
        "Hidden Secret /root/.ssh",
        "Hidden Socket /var/tmp/agent.sock",
    ];
    assert_eq!(got, expected, "{got:#?}");
    // The view's swept paths are the sweep's, made absolute.
    let derived: Vec<PathBuf> = plan
        .sweep
        .iter()
        .flat_map(|r| r.missing.iter().map(|m| r.root.join(m)).collect::<Vec<_>>())
        .collect();
    assert_eq!(plan.view.swept, derived);
}

#[test]
fn toolchains_mirror_read_only_under_the_sandbox_home_never_over_a_secret() {
    let mut h = host();
    h.home_toolchains = vec![
        (".rustup".into(), "/home/u/.rustup".into(), Kind::Dir),
        (".cargo/bin".into(), "/home/u/.cargo/bin".into(), Kind::Dir),
        // A planted ~/.pyenv -> ~ would carry the whole home, ~/.ssh included.
        (".pyenv".into(), "/home/u".into(), Kind::Dir),
    ];
    let ww = build(&policy(Level::WorkspaceWrite, None), &h).unwrap();
    let t = targets(&ww);
    assert!(t.contains(&"ro /moat/home/.rustup".to_string()), "{t:#?}");
    assert!(
        t.contains(&"ro /moat/home/.cargo/bin".to_string()),
        "{t:#?}"
    );
    assert!(!t.iter().any(|x| x.contains("/moat/home/.pyenv")), "{t:#?}");
    // Contained reads no host beyond its grants: no mirrors.
    let wc = build(&policy(Level::WorkspaceContained, None), &h).unwrap();
    assert!(!targets(&wc).iter().any(|x| x.contains(".rustup")));
}

#[test]
fn a_private_home_replaces_the_home_tmpfs_and_needs_no_pins() {
    let mut h = host();
    h.home_toolchains = vec![(".cargo/bin".into(), "/home/u/.cargo/bin".into(), Kind::Dir)];
    let mut p = policy(Level::WorkspaceWrite, None);
    p.private_home = Some("/home/u/.local/state/moat/sync/run-1".into());
    let plan = build(&p, &h).unwrap();
    let t = targets(&plan);
    assert!(t.contains(&"rw /moat/home".to_string()), "{t:#?}");
    assert!(!t.contains(&"tmpfs /moat/home".to_string()), "{t:#?}");
    // /moat/home/.cargo would be a host path that does not exist: no pin.
    assert!(!t.contains(&"rw /moat/home/.cargo".to_string()), "{t:#?}");
    // The same policy without it keeps the tmpfs.
    let plain = build(&policy(Level::WorkspaceWrite, None), &h).unwrap();
    assert!(targets(&plain).contains(&"tmpfs /moat/home".to_string()));
}
