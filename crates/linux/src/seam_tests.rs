//! Golden tests of applying a plan through the [`Syscall`] seam: for a few
//! representative plans (fixed host facts), the identity and view the init
//! would build are replayed against the recording fake, and the call
//! sequence is compared with `tests/golden/apply-*.txt`. `MOAT_UPDATE_GOLDEN=1`
//! rewrites the files; review the diff before committing: every line is a
//! kernel call the sandbox's init makes.

use std::path::{Path, PathBuf};

use moat_policy::{Level, NetworkMode, Policy, PolicyRequest};

use crate::mounts;
use crate::plan::{MountOp, NamespaceSet, Plan};
use crate::probe::{HostFacts, Kind, RootEntry};
use crate::syscall::Recorder;

fn host() -> HostFacts {
    let root = |name: &str, kind: Kind, link: Option<&str>| RootEntry {
        name: name.into(),
        kind,
        link: link.map(PathBuf::from),
    };
    let mut h = HostFacts {
        uid: 1000,
        gid: 1000,
        landlock_abi: 6,
        root_entries: vec![
            root("bin", Kind::Symlink, Some("usr/bin")),
            root("etc", Kind::Dir, None),
            root("home", Kind::Dir, None),
            root("opt", Kind::Dir, None),
            root("usr", Kind::Dir, None),
            root("var", Kind::Dir, None),
        ],
        proc_entries: vec!["kcore".into(), "sys".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        moat_exe: Some("/usr/local/bin/moat".into()),
        ..Default::default()
    };
    h.secrets.insert("/home/u/.ssh".into(), Kind::Dir);
    h.secrets.insert("/home/u/.netrc".into(), Kind::File);
    h.secrets.insert("/etc/shadow".into(), Kind::File);
    h.workspace_protected
        .insert("/home/u/proj/.env".into(), Kind::File);
    h.workspace_write_protected
        .insert("/home/u/proj/.git".into(), Kind::Dir);
    h.workspace_write_protected
        .insert("/home/u/proj/.git/hooks".into(), Kind::Dir);
    h.workspace_write_protected
        .insert("/home/u/proj/.vscode".into(), Kind::Dir);
    for g in ["/opt/tools", "/home/u/data", "/home/u/cache"] {
        h.grant_kinds.insert(g.into(), Kind::Dir);
    }
    h
}

fn policy(level: Level, f: impl FnOnce(&mut PolicyRequest)) -> Policy {
    let mut r = PolicyRequest {
        level: Some(level),
        network: Some(NetworkMode::Disabled),
        workspace: "/home/u/proj".into(),
        home: "/home/u".into(),
        ..Default::default()
    };
    f(&mut r);
    Policy::resolve(r).expect("policy")
}

fn plan(p: &Policy, facts: &HostFacts) -> Plan {
    crate::plan::build(p, facts).expect("plan")
}

/// What the init asks of the kernel for `plan`: identity, then the view.
fn replay(plan: &Plan) -> String {
    let fake = Recorder::default();
    mounts::set_identity(&fake, plan).expect("identity");
    mounts::build_root(&fake, &plan.mounts, plan.staged_len(), plan.broker).expect("view");
    fake.log()
}

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("MOAT_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir golden");
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

/// Every stand-in and read-only remount of the plan shows in the replay as
/// a mount onto its target: the golden cannot lose one silently.
fn assert_every_op_lands(plan: &Plan, log: &str) {
    for op in &plan.mounts {
        let t = op.target().display().to_string();
        let landed = match op {
            MountOp::Bind { .. }
            | MountOp::ReadOnlyAgain { .. }
            | MountOp::StandIn { .. }
            | MountOp::Redacted { .. } => log
                .lines()
                .any(|l| l.starts_with("move_mount ") && l.ends_with(&format!(" {t}"))),
            MountOp::Tmpfs { .. } | MountOp::Proc { .. } | MountOp::Devpts { .. } => log
                .lines()
                .any(|l| l.starts_with("mount ") && l.contains(&format!(" {t} type="))),
            MountOp::File { .. } => log.contains(&format!("create_file {t} 444")),
            MountOp::Symlink { .. } => log.contains(&format!("symlink {t} -> ")),
        };
        assert!(landed, "{op:?} left no call in the replay:\n{log}");
    }
}

#[test]
fn apply_read_only_golden() {
    let p = plan(&policy(Level::ReadOnly, |_| {}), &host());
    let log = replay(&p);
    assert_every_op_lands(&p, &log);
    golden("apply-read-only.txt", &log);
}

#[test]
fn apply_workspace_write_stand_ins_and_git_golden() {
    let p = plan(&policy(Level::WorkspaceWrite, |_| {}), &host());
    let log = replay(&p);
    assert_every_op_lands(&p, &log);
    // The secrets are covered by stand-ins cloned from the detached scratch
    // tmpfs, and .git is bound back read-only inside the writable workspace.
    for secret in ["/home/u/.ssh", "/home/u/.netrc", "/etc/shadow"] {
        assert!(
            log.lines()
                .any(|l| l.starts_with("move_mount ") && l.ends_with(secret)),
            "{secret} not covered:\n{log}"
        );
    }
    golden("apply-workspace-write.txt", &log);
}

#[test]
fn apply_workspace_contained_with_grants_golden() {
    let p = plan(
        &policy(Level::WorkspaceContained, |r| {
            r.ro = vec!["/opt/tools".into(), "/home/u/data".into()];
            r.rw = vec!["/home/u/cache".into()];
        }),
        &host(),
    );
    let log = replay(&p);
    assert_every_op_lands(&p, &log);
    golden("apply-workspace-contained-grants.txt", &log);
}

#[test]
fn apply_nested_run_view_golden() {
    // The outer run is workspace-write; the nested request asks read-only
    // and inherits what the outer view hides and protects.
    let outer = policy(Level::WorkspaceWrite, |_| {});
    let outer_view = crate::view::compute(&outer, &host());
    let mut inner = policy(Level::ReadOnly, |_| {});
    crate::view::inherit_policy(&outer_view, &mut inner, None).expect("inherit policy");
    let mut facts = host();
    crate::view::inherit_facts(&outer_view, &mut facts);
    let p = plan(&inner, &facts);
    let log = replay(&p);
    assert_every_op_lands(&p, &log);
    golden("apply-nested-read-only.txt", &log);
}

#[test]
fn the_early_init_makes_the_serial_inits_calls_in_the_same_order() {
    // The early init writes its id maps and stages the root and the view's
    // start (from the policy alone) before its plan comes, then builds the
    // rest on that staging: one code path, so for every plan the kernel
    // sees exactly what the serial init asks.
    let policies = [
        policy(Level::ReadOnly, |_| {}),
        policy(Level::WorkspaceWrite, |_| {}),
        policy(Level::WorkspaceContained, |r| {
            r.ro = vec!["/opt/tools".into()];
        }),
    ];
    for pol in &policies {
        let p = plan(pol, &host());
        let set = NamespaceSet::for_policy(pol).expect("namespaces");
        assert_eq!(NamespaceSet::of_plan(&p), Some(set));
        let start = set
            .view_start
            .staged_ops(&host().root_entries, &host().proc_entries);
        assert!(p.view_start_len() == set.view_start.ops().len() && p.view_start_len() > 1);
        assert!(p.staged_len() == start.len() && start.len() > p.view_start_len());
        let fake = Recorder::default();
        mounts::set_identity_ids(&fake, p.uid, p.gid).expect("identity");
        let staged = mounts::stage_root(&fake, &start).expect("stage");
        let staged_log = fake.log();
        assert!(staged_log.contains("pivot_root") && staged_log.contains("mount proc /proc"));
        // The host's top level, HOME and /proc's read-only parts are laid
        // before the plan; no stand-in (the scratch is not sealed yet).
        assert!(staged_log.contains("/.moat-oldroot/usr"), "{staged_log}");
        assert!(staged_log.contains("/moat/home"), "{staged_log}");
        assert!(
            staged_log
                .lines()
                .any(|l| l.starts_with("move_mount ") && l.ends_with(" /proc/sys")),
            "{staged_log}"
        );
        assert!(!staged_log.contains("/proc/kcore"), "{staged_log}");
        assert!(
            !staged_log.contains("make_superblock_readonly"),
            "{staged_log}"
        );
        mounts::build_staged_root(&fake, staged, &p.mounts, p.broker).expect("view");
        assert_eq!(fake.log(), replay(&p), "the early init's calls differ");
    }
}

#[test]
fn a_private_home_ends_the_staged_ops_on_both_launches() {
    // A private HOME is a bind of a per-run host directory, which only the
    // plan names: neither it nor the /proc binds after it are staged, and
    // the serial init stages exactly as many ops as the early one.
    let mut pol = policy(Level::WorkspaceWrite, |_| {});
    pol.private_home = Some("/home/u/.local/state/moat/sync/run-1".into());
    let p = plan(&pol, &host());
    let set = NamespaceSet::for_policy(&pol).expect("namespaces");
    assert_eq!(NamespaceSet::of_plan(&p), Some(set));
    let start = set
        .view_start
        .staged_ops(&host().root_entries, &host().proc_entries);
    assert_eq!(p.staged_len(), start.len());
    assert!(
        !start.iter().any(|op| op.target().starts_with("/moat")
            || op.target().parent() == Some(Path::new("/proc"))),
        "{start:?}"
    );
    let fake = Recorder::default();
    mounts::set_identity_ids(&fake, p.uid, p.gid).expect("identity");
    let staged = mounts::stage_root(&fake, &start).expect("stage");
    mounts::build_staged_root(&fake, staged, &p.mounts, p.broker).expect("view");
    assert_eq!(fake.log(), replay(&p), "the early init's calls differ");
}

#[test]
fn a_plan_that_does_not_begin_with_the_staged_view_is_refused() {
    // Staged for a policy with a /tmp size limit, handed a plan without
    // one: the init must not build on the wrong start.
    let limited = policy(Level::WorkspaceContained, |r| {
        r.limits.tmp_size = Some(1 << 20);
    });
    let start = NamespaceSet::for_policy(&limited)
        .expect("namespaces")
        .view_start
        .staged_ops(&host().root_entries, &host().proc_entries);
    let p = plan(&policy(Level::WorkspaceContained, |_| {}), &host());
    assert_refused_with_nothing_laid(&start, &p, "tmp size");
}

/// Stages `start` on a recording fake, hands the init `p`, and checks the
/// init refuses to build on that start ("differ") and lays nothing after.
fn assert_refused_with_nothing_laid(start: &[MountOp], p: &Plan, case: &str) {
    let fake = Recorder::default();
    let staged = mounts::stage_root(&fake, start).expect("stage");
    let before = fake.log();
    let e = mounts::build_staged_root(&fake, staged, &p.mounts, p.broker).expect_err("refused");
    assert!(e.step.contains("differ"), "{case}: {e}");
    assert_eq!(
        fake.log(),
        before,
        "{case}: nothing is laid after the refusal"
    );
}

#[test]
fn a_plan_from_another_listing_of_the_root_than_the_staged_one_is_refused() {
    // The early init lays the host's top level from its own listing of `/`
    // (and `/proc`'s read-only parts from its own listing of `/proc`) before
    // moat's probe lists them for the plan. If they changed between the two
    // (an entry added, removed, or turned into a symlink), the staged view
    // is not the plan's: the init must refuse to build on it.
    let at = |level: Level| policy(level, |_| {});
    let root = |name: &str, kind: Kind, link: Option<&str>| RootEntry {
        name: name.into(),
        kind,
        link: link.map(PathBuf::from),
    };
    let listing = |edit: &dyn Fn(&mut Vec<RootEntry>)| {
        let mut v = host().root_entries;
        edit(&mut v);
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    };
    let same = listing(&|_| {});
    let proc = host().proc_entries;
    let changes = [
        // Staged: a directory the plan's listing does not have (read-only
        // level: the whole top level is bound).
        (
            Level::ReadOnly,
            listing(&|v| v.push(root("srv", Kind::Dir, None))),
            same.clone(),
            proc.clone(),
        ),
        // Staged: a system directory the plan's listing does not have.
        (
            Level::WorkspaceContained,
            same.clone(),
            listing(&|v| v.retain(|e| e.name != "etc")),
            proc.clone(),
        ),
        // Staged: a top-level symlink that points elsewhere in the plan's.
        (
            Level::WorkspaceContained,
            listing(&|v| {
                v.retain(|e| e.name != "bin");
                v.push(root("bin", Kind::Symlink, Some("/opt/evil")));
            }),
            same.clone(),
            proc.clone(),
        ),
        // Staged: a read-only part of /proc the plan's listing does not have.
        (
            Level::WorkspaceContained,
            same.clone(),
            same.clone(),
            vec!["sys".into(), "irq".into(), "kcore".into()],
        ),
    ];
    for (level, staged_root, planned_root, staged_proc) in changes {
        let mut facts = host();
        facts.root_entries = planned_root;
        let pol = at(level);
        let start = NamespaceSet::for_policy(&pol)
            .expect("namespaces")
            .view_start
            .staged_ops(&staged_root, &staged_proc);
        let p = plan(&pol, &facts);
        assert_ne!(p.mounts.get(..start.len()), Some(&start[..]));
        assert_refused_with_nothing_laid(&start, &p, &format!("{level:?}"));
    }
}

#[test]
fn a_failing_call_stops_the_replay_with_its_step_and_path() {
    // The seam also carries errors: the first refused call ends the build
    // with the step and path the user sees.
    let p = plan(&policy(Level::ReadOnly, |_| {}), &host());
    let fake = Recorder::failing_at("pivot_root");
    let e = mounts::build_root(&fake, &p.mounts, p.staged_len(), p.broker).expect_err("must fail");
    assert_eq!(e.step, "pivot_root");
    assert_eq!(e.path, Path::new("/tmp"));
    assert!(
        !fake.log().contains("move_mount"),
        "nothing is mounted after a failed step:\n{}",
        fake.log()
    );
}

#[test]
fn a_redacted_git_config_is_written_to_the_sealed_scratch_and_bound_over_the_file() {
    let mut facts = host();
    let cfg = PathBuf::from("/home/u/proj/.git/config");
    facts
        .workspace_write_protected
        .insert(cfg.clone(), Kind::File);
    facts.secrets.insert(cfg.clone(), Kind::File);
    let copy = "# moat: removed: userinfo of remote.*.url\n[core]\n\tbare = \"false\"\n";
    facts.redacted_files.insert(cfg.clone(), copy.to_string());
    for level in [
        Level::ReadOnly,
        Level::WorkspaceWrite,
        Level::WorkspaceContained,
    ] {
        let p = plan(&policy(level, |_| {}), &facts);
        let ops: Vec<&MountOp> = p.mounts.iter().filter(|o| o.target() == cfg).collect();
        // The copy is the last (topmost) op at the file, with its content.
        assert!(
            matches!(ops.last(), Some(MountOp::Redacted { contents, .. }) if contents == copy),
            "{level:?}: {ops:?}"
        );
        let log = replay(&p);
        assert_every_op_lands(&p, &log);
        let lines: Vec<&str> = log.lines().collect();
        let written = lines
            .iter()
            .position(|l| {
                l.starts_with("create_at ") && l.ends_with(&format!("444 ({} bytes)", copy.len()))
            })
            .unwrap_or_else(|| panic!("the copy is not written to the scratch:\n{log}"));
        let sealed = lines
            .iter()
            .position(|l| l.starts_with("make_superblock_readonly"))
            .expect("scratch sealed");
        assert!(
            written < sealed,
            "written after the scratch was sealed:\n{log}"
        );
    }
}
