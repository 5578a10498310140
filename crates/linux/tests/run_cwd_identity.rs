//! A one-shot run starts its command only in the directory its caller
//! checked (`RunOptions::cwd_identity`: what `moat exec` started in, which
//! `moat serve` enters by fd): a rename between the policy's resolution and
//! the view (another execution renaming the workspace and putting another
//! directory at its name) fails the run closed instead of starting the
//! command in whatever has the name now. The rename is stood for by
//! passing another directory's identity: the race itself has no hook to
//! hold it open. Without libtest's harness (`harness = false`), which runs
//! each test on a thread of its own: `run` clones the sandbox's init, which
//! needs a single-threaded caller (`sys::clone_process`; debug builds check it).
// A test without libtest's #[test] marker: what clippy allows in tests applies.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use moat_linux::{NoObserver, RunOptions};
use moat_policy::{Level, Policy, PolicyRequest};

fn dir(base: &Path, name: &str) -> PathBuf {
    let d = base.join(name);
    std::fs::create_dir_all(&d).expect("mkdir");
    std::fs::canonicalize(d).expect("canonicalize")
}

fn identity(p: &Path) -> (u64, u64) {
    let m = std::fs::metadata(p).expect("stat");
    (m.dev(), m.ino())
}

/// Prints libtest's lines for the one case, so the suite's counts include it.
fn main() {
    let name = "the_one_shot_command_starts_only_in_the_directory_the_caller_checked";
    println!("\nrunning 1 test");
    the_one_shot_command_starts_only_in_the_directory_the_caller_checked();
    println!("test {name} ... ok\n\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n");
}

fn the_one_shot_command_starts_only_in_the_directory_the_caller_checked() {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("run-cwd-identity-{}", std::process::id()));
    let (ws, other, home) = (dir(&base, "ws"), dir(&base, "other"), dir(&base, "home"));
    let policy = Policy::resolve(PolicyRequest {
        level: Some(Level::WorkspaceWrite),
        workspace: ws.clone(),
        home,
        ..Default::default()
    })
    .expect("policy");
    let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
    let facts = moat_linux::HostFacts::probe(&policy, env);
    let plan = moat_linux::build_plan(&policy, &facts).expect("plan");
    let run = |checked: &Path| {
        moat_linux::run(
            &plan,
            &RunOptions {
                argv: ["/bin/sh", "-c", "pwd; touch ./ran-here; echo CMD-RAN"]
                    .map(OsString::from)
                    .to_vec(),
                output: moat_linux::OutputMode::Capture { limit: 1 << 16 },
                timeout: Some(Duration::from_secs(60)),
                tag: "cwd-identity".into(),
                cwd_identity: Some(identity(checked)),
                ..Default::default()
            },
            &mut NoObserver,
        )
    };
    let stdout = |o: &moat_linux::RunOutcome| String::from_utf8_lossy(&o.stdout).into_owned();
    // The directory checked is the view's cwd: the command runs there.
    let ok = run(&ws);
    assert!(
        stdout(&ok).contains("CMD-RAN"),
        "{} {:?}",
        stdout(&ok),
        ok.error
    );
    assert!(
        ws.join("ran-here").exists(),
        "the command did not run in the workspace"
    );
    std::fs::remove_file(ws.join("ran-here")).expect("rm");
    // Another directory was checked than the one at the view's cwd now.
    let moved = run(&other);
    assert!(
        !stdout(&moved).contains("CMD-RAN"),
        "the command ran: {}",
        stdout(&moved)
    );
    assert!(
        !ws.join("ran-here").exists(),
        "the command ran in the workspace"
    );
    assert_eq!(moved.exit_code, 125, "{:?}", moved.error);
    let e = moved.error.clone().unwrap_or_default();
    assert!(e.contains("was moved"), "{e}");
    let _ = std::fs::remove_dir_all(&base);
}
