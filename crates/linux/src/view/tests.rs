//! Unit tests of the view's nested-run check: an inner run gets at most the
//! outer run's view, and inherits what it hides, denies and is bound by.

use std::path::PathBuf;

use moat_policy::{Level, NetClass, NetworkMode, Policy, PolicyRequest};

use super::*;
use crate::probe::{HostFacts, Kind, RootEntry};

fn host() -> HostFacts {
    let root = |name: &str| RootEntry {
        name: name.into(),
        kind: Kind::Dir,
        link: None,
    };
    let mut h = HostFacts {
        uid: 1000,
        gid: 1000,
        landlock_abi: 7,
        root_entries: ["etc", "home", "opt", "usr", "var"]
            .into_iter()
            .map(root)
            .collect(),
        ..Default::default()
    };
    h.secrets.insert("/home/u/.ssh".into(), Kind::Dir);
    h.secrets.insert("/etc/shadow".into(), Kind::File);
    h.workspace_protected
        .insert("/home/u/proj/.env".into(), Kind::File);
    h.workspace_write_protected
        .insert("/home/u/proj/.git".into(), Kind::Dir);
    h.workspace_write_protected
        .insert("/home/u/proj/.git/hooks".into(), Kind::Dir);
    h.sockets.insert("/var/tmp/agent.sock".into(), Kind::File);
    h.moat_readonly.push("/home/u/.config/moat".into());
    for g in [
        "/opt",
        "/etc",
        "/home/u",
        "/home/u/.ssh",
        "/home/u/proj",
        "/home/u/proj/.env",
        "/home/u/proj/.git/hooks",
        "/home/u/proj/sub",
        "/home/u/.config",
        "/tmp",
        "/run/x",
        "/sys/fs",
    ] {
        h.grant_kinds.insert(g.into(), Kind::Dir);
    }
    h
}

fn pol(level: Level, f: impl FnOnce(&mut PolicyRequest)) -> Policy {
    let mut r = PolicyRequest {
        level: Some(level),
        workspace: "/home/u/proj".into(),
        home: "/home/u".into(),
        ..Default::default()
    };
    f(&mut r);
    Policy::resolve(r).unwrap()
}

/// Runs the whole nested path as the launched moat does: inherit the
/// policy, inherit the facts, compute the inner view, check it.
fn nested(outer: &Policy, inner: Policy) -> Result<View, Widening> {
    let outer_view = compute(outer, &host());
    let mut inner = inner;
    inherit_policy(&outer_view, &mut inner, None)?;
    let mut facts = host();
    // The host-side process that runs the request never saw the outer env.
    facts.sockets.clear();
    inherit_facts(&outer_view, &mut facts);
    let v = compute(&inner, &facts);
    check_nested(&outer_view, &inner, &v)?;
    Ok(v)
}

#[test]
fn same_or_narrower_fits() {
    let outer = pol(Level::WorkspaceWrite, |_| {});
    assert!(nested(&outer, pol(Level::WorkspaceWrite, |_| {})).is_ok());
    assert!(nested(&outer, pol(Level::ReadOnly, |_| {})).is_ok());
    assert!(nested(&outer, pol(Level::WorkspaceContained, |_| {})).is_ok());
    assert!(nested(
        &outer,
        pol(Level::WorkspaceContained, |r| r.workspace =
            "/home/u/proj/sub".into())
    )
    .is_ok());
}

#[test]
fn the_inner_view_re_applies_the_outer_stand_ins() {
    let outer = pol(Level::WorkspaceWrite, |_| {});
    let v = nested(
        &outer,
        pol(Level::ReadOnly, |r| r.workspace = "/home/u/proj/sub".into()),
    )
    .unwrap();
    for hidden in ["/home/u/proj/.env", "/var/tmp/agent.sock", "/home/u/.ssh"] {
        assert_eq!(
            v.mode_at(Path::new(hidden)).map(|e| e.mode),
            Some(Mode::Hidden),
            "{hidden}"
        );
    }
}

#[test]
fn widenings_are_named() {
    let outer = pol(Level::ReadOnly, |_| {});
    let e = nested(&outer, pol(Level::WorkspaceWrite, |_| {})).unwrap_err();
    assert!(e.grant.contains("workspace"), "{e}");
    let outer = pol(Level::WorkspaceContained, |_| {});
    let e = nested(&outer, pol(Level::ReadOnly, |_| {})).unwrap_err();
    assert!(e.grant.contains("read-only"), "{e}");
    let e = nested(
        &outer,
        pol(Level::WorkspaceContained, |r| r.ro = vec!["/opt".into()]),
    )
    .unwrap_err();
    assert_eq!(e.grant, "--ro /opt");
    let outer = pol(Level::WorkspaceWrite, |_| {});
    let e = nested(
        &outer,
        pol(Level::WorkspaceWrite, |r| r.rw = vec!["/etc".into()]),
    )
    .unwrap_err();
    assert_eq!(e.grant, "--rw /etc");
    assert!(nested(&outer, pol(Level::DangerFullAccess, |_| {})).is_err());
}

/// The outer run granted `--rw ~/.config`, with moat's config read-only
/// inside it: the same grant from inside is refused, naming moat's config.
#[test]
fn moat_config_inside_an_outer_grant_cannot_be_granted() {
    let outer = pol(Level::WorkspaceWrite, |r| {
        r.rw = vec!["/home/u/.config".into()]
    });
    let e = nested(
        &outer,
        pol(Level::WorkspaceWrite, |r| {
            r.rw = vec!["/home/u/.config".into()]
        }),
    )
    .unwrap_err();
    assert!(e.to_string().contains("/home/u/.config/moat"), "{e}");
}

/// A grant that equals, contains or lies under what the outer view hides or
/// keeps read-only is refused, naming it.
#[test]
fn grants_touching_hidden_or_protected_paths_are_refused() {
    let outer = pol(Level::WorkspaceWrite, |_| {});
    // --ro of the workspace itself, from a subdirectory.
    let e = nested(
        &outer,
        pol(Level::ReadOnly, |r| {
            r.workspace = "/home/u/proj/sub".into();
            r.ro = vec!["/home/u/proj".into()];
        }),
    )
    .unwrap_err();
    assert!(e.to_string().contains("/home/u/proj/."), "{e}");
    for (ro, rw, names) in [
        (Some("/home/u/.ssh"), None, "/home/u/.ssh"),
        (Some("/home/u"), None, "/home/u"),
        (Some("/home/u/proj/.env"), None, ".env"),
        (Some("/etc"), None, "/etc/shadow"),
        (None, Some("/home/u/proj/.git/hooks"), ".git/hooks"),
    ] {
        let e = nested(
            &outer,
            pol(Level::WorkspaceWrite, |r| {
                r.ro = ro.map(PathBuf::from).into_iter().collect();
                r.rw = rw.map(PathBuf::from).into_iter().collect();
            }),
        )
        .unwrap_err();
        assert!(e.to_string().contains(names), "{ro:?} {rw:?}: {e}");
    }
}

#[test]
fn directories_the_sandbox_builds_are_not_host_content() {
    let outer = pol(Level::ReadOnly, |_| {});
    for p in ["/tmp/x", "/run/x", "/sys/fs"] {
        let e = nested(&outer, pol(Level::ReadOnly, |r| r.ro = vec![p.into()])).unwrap_err();
        assert_eq!(e.grant, format!("--ro {p}"));
    }
}

#[test]
fn network_only_narrows_and_inherits_deny_upstream_and_class() {
    let outer = pol(Level::WorkspaceWrite, |r| {
        r.network = Some(NetworkMode::Proxy);
        r.allow_domains = vec!["*.example.com".into(), "pypi.org:443".into()];
        r.deny_domains = vec!["bad.example.com".into()];
        r.upstream_proxy = Some("http://proxy.corp:3128".into());
        r.net_class = Some(NetClass::NetConnect);
    });
    let outer_view = compute(&outer, &host());
    let mut ok = pol(Level::WorkspaceWrite, |r| {
        r.network = Some(NetworkMode::Proxy);
        r.allow_domains = vec!["api.example.com:443".into(), "pypi.org:443".into()];
    });
    inherit_policy(&outer_view, &mut ok, Some(NetClass::NetDenied)).unwrap();
    assert!(ok
        .network
        .rules
        .deny
        .iter()
        .any(|d| d.as_str() == "bad.example.com"));
    assert_eq!(
        ok.network.upstream.as_deref(),
        Some("http://proxy.corp:3128")
    );
    assert_eq!(
        ok.net_class,
        Some(NetClass::NetDenied),
        "the caller's stricter class"
    );
    let mut plain = pol(Level::WorkspaceWrite, |_| {});
    inherit_policy(&outer_view, &mut plain, None).unwrap();
    assert_eq!(
        plain.net_class,
        Some(NetClass::NetConnect),
        "the outer class"
    );

    let refuse = |f: &dyn Fn(&mut PolicyRequest)| {
        let mut p = pol(Level::WorkspaceWrite, f);
        inherit_policy(&outer_view, &mut p, None).unwrap_err()
    };
    let e = refuse(&|r| {
        r.network = Some(NetworkMode::Proxy);
        r.allow_domains = vec!["evil.org".into()];
    });
    assert_eq!(e.grant, "--allow-domain evil.org");
    let e = refuse(&|r| r.network = Some(NetworkMode::Unmanaged));
    assert!(e.grant.contains("unmanaged"));
    let e = refuse(&|r| {
        r.network = Some(NetworkMode::Proxy);
        r.allow_domains = vec!["pypi.org".into()];
    });
    assert!(e.grant.contains("pypi.org"), "any port is wider than :443");
    let e = refuse(&|r| {
        r.network = Some(NetworkMode::Proxy);
        r.allow_domains = vec!["api.example.com".into()];
        r.upstream_proxy = Some("http://127.0.0.1:9".into());
    });
    assert_eq!(e.grant, "--upstream-proxy");
}

/// The outer view travels as JSON to the moat process that runs the request.
#[test]
fn the_view_round_trips_through_json() {
    let outer = pol(Level::WorkspaceWrite, |r| {
        r.ro = vec!["/home/u/.config".into()];
    });
    let v = compute(&outer, &host());
    let back: View = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
    assert_eq!(back, v);
}

/// A nested read-only run over the outer workspace inherits the outer
/// `.git` entry; it must stay read-only there (the outer pins it writable).
#[test]
fn an_inherited_git_dir_is_read_only_in_a_read_only_inner_run() {
    let outer = pol(Level::WorkspaceWrite, |_| {});
    let v = nested(&outer, pol(Level::ReadOnly, |_| {})).unwrap();
    let git = v.mode_at(Path::new("/home/u/proj/.git/objects")).unwrap();
    assert_ne!(git.mode, Mode::Write, "{git:?}");
}

/// A non-UTF-8 workspace survives the trip (paths are encoded losslessly).
#[test]
fn non_utf8_paths_round_trip() {
    use std::os::unix::ffi::OsStrExt;
    let ws = PathBuf::from(std::ffi::OsStr::from_bytes(b"/home/u/pr\xffj"));
    let outer = pol(Level::WorkspaceWrite, |r| r.workspace = ws.clone());
    let v = compute(&outer, &host());
    let back: View = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
    assert_eq!(back, v);
    assert_eq!(back.workspace, ws);
}
