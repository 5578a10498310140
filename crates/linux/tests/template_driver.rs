//! Drives `moat_linux::template` directly (the service's launcher is built
//! on it): needs the moat binary (MOAT_BIN, else target/debug/moat) to
//! start template processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use moat_linux::run::{OutputMode, RunOptions};
use moat_linux::template::Templates;
use moat_policy::{Level, NetworkMode, Policy, PolicyRequest};

fn moat_bin() -> PathBuf {
    std::env::var_os("MOAT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/moat"))
}

fn plan(ws: &Path, home: &Path) -> moat_linux::Plan {
    let policy = Policy::resolve(PolicyRequest {
        level: Some(Level::WorkspaceContained),
        network: Some(NetworkMode::Disabled),
        workspace: std::fs::canonicalize(ws).unwrap(),
        home: std::fs::canonicalize(home).unwrap(),
        ..Default::default()
    })
    .unwrap();
    let facts =
        moat_linux::HostFacts::probe(&policy, vec![("PATH".into(), "/usr/bin:/bin".into())]);
    moat_linux::build_plan(&policy, &facts).unwrap()
}

fn opts(script: &str) -> RunOptions {
    RunOptions {
        argv: vec!["/bin/sh".into(), "-c".into(), OsString::from(script)],
        output: OutputMode::Capture { limit: 1 << 20 },
        timeout: Some(std::time::Duration::from_secs(30)),
        tag: "t".into(),
        stdio_from_outer_sandbox: false,
    }
}

#[test]
fn template_runs_and_isolates_consecutive_executions() {
    let ws = tempdir("ws");
    let home = tempdir("home");
    let p = plan(&ws, &home);
    let templates = Templates::new(moat_bin());
    let t = templates.get(&p).expect("template");
    let mut obs = moat_linux::NoObserver;
    let first = t
        .run(
            &p,
            &opts("echo left > /tmp/x; echo left > $HOME/y; sleep 1000 & echo bg=$!; echo ran1"),
            &mut obs,
            None,
            None,
        )
        .unwrap();
    eprintln!(
        "{:?} {:?}",
        first.error,
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(first.exit_code, 0, "{:?}", first.error);
    assert!(String::from_utf8_lossy(&first.stdout).contains("ran1"));
    let second = t
        .run(
            &p,
            &opts("ls -a /tmp $HOME; ps ax 2>/dev/null || ls /proc; echo ran2"),
            &mut obs,
            None,
            None,
        )
        .unwrap();
    let o = String::from_utf8_lossy(&second.stdout);
    eprintln!("{o}");
    assert!(o.contains("ran2"));
    assert!(!o.contains(" x\n") && !o.contains("\nx\n"), "{o}");
    assert!(!o.contains("\ny\n"), "{o}");
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moat-tpl-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
