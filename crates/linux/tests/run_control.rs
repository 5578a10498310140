//! A run stopped through the caller's own control channel, not through the
//! process's signals: what a service running several executions needs.
//! Without libtest's harness (`harness = false`), which runs each test on a
//! thread of its own: `run` clones the sandbox's init, which needs a
//! single-threaded caller (`sys::clone_process`; debug builds check it).
// A test without libtest's #[test] marker: what clippy allows in tests applies.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use moat_linux::control::{self, Control, Request};
use moat_linux::{RunObserver, RunOptions, RunStatus};
use moat_policy::{Level, Policy, PolicyRequest};

/// Sends Stop the moment the command is confined and about to exec.
struct StopWhenStarted {
    sender: control::ControlSender,
    sent: bool,
}

impl RunObserver for StopWhenStarted {
    fn started(&mut self, _pid: Option<i32>) {
        self.sent = self.sender.send(Request::Stop).is_ok();
    }
}

fn workspace() -> std::io::Result<PathBuf> {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("run-control-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::canonicalize(dir)
}

/// Prints libtest's lines for the one case, so the suite's counts include it.
fn main() {
    let name = "a_stop_on_the_callers_channel_ends_the_run_and_its_tree";
    println!("\nrunning 1 test");
    a_stop_on_the_callers_channel_ends_the_run_and_its_tree();
    println!("test {name} ... ok\n\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n");
}

fn a_stop_on_the_callers_channel_ends_the_run_and_its_tree() {
    let ws = workspace().expect("workspace");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let policy = Policy::resolve(PolicyRequest {
        level: Some(Level::WorkspaceWrite),
        workspace: ws.clone(),
        home: std::fs::canonicalize(&home).unwrap_or_else(|_| home.clone().into()),
        ..Default::default()
    })
    .expect("policy");
    let env: Vec<(String, String)> = std::env::vars().collect();
    let facts = moat_linux::HostFacts::probe(&policy, env);
    let plan = moat_linux::build_plan(&policy, &facts).expect("plan");
    let (sender, receiver) = control::channel().expect("channel");
    let mut observer = StopWhenStarted {
        sender,
        sent: false,
    };
    // A command that never ends on its own. The timeout is a hang guard
    // only: a run it ends (the stop ignored) is a failure below.
    let script = "echo STARTED; sleep 600";
    let out = moat_linux::run_with(
        &plan,
        &RunOptions {
            argv: ["sh", "-c", script].map(OsString::from).to_vec(),
            output: moat_linux::OutputMode::Capture { limit: 4096 },
            timeout: Some(Duration::from_secs(30)),
            tag: "run-control-test".into(),
            ..Default::default()
        },
        &mut observer,
        Control::Channel(&receiver),
    );
    assert!(observer.sent, "the observer never saw the command start");
    // (The stop may land before the shell prints anything: it is sent the
    // moment the command is confined, before exec.)
    assert!(!out.timed_out, "the stop did not end the run: {out:?}");
    assert_eq!(out.status, RunStatus::Finished, "{out:?}");
    assert_eq!(out.signal, Some(libc::SIGTERM), "{out:?}");
    let _ = std::fs::remove_dir_all(&ws);
}
