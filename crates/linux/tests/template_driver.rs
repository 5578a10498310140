//! Drives `moat_linux::template` directly, as the service's Template
//! launcher does: isolation between executions forked from one template,
//! stop (cancel), and staleness. Needs the moat binary (MOAT_BIN, else
//! target/debug/moat) to start template processes. Runs as root and as an
//! unprivileged user.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use moat_linux::control::{channel, Control, ControlReceiver, Request};
use moat_linux::run::{OutputMode, RunObserver, RunOptions, Stream};
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
        timeout: Some(std::time::Duration::from_secs(60)),
        tag: "t".into(),
        stdio_from_outer_sandbox: false,
        cwd_identity: None,
    }
}

struct Dirs {
    ws: PathBuf,
    home: PathBuf,
}

fn dirs(tag: &str) -> Dirs {
    let base = std::env::temp_dir().join(format!("moat-tpl-{tag}-{}", std::process::id()));
    let ws = base.join("ws");
    let home = base.join("home");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    Dirs { ws, home }
}

fn stdout(o: &moat_linux::RunOutcome) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn host_has_process_with(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains(marker))
            .unwrap_or(false)
    })
}

#[test]
fn files_processes_env_and_fds_of_one_execution_are_invisible_to_the_next() {
    let d = dirs("iso");
    let p = plan(&d.ws, &d.home);
    // The service's own environment must reach no execution.
    std::env::set_var("MOAT_TPL_SERVICE_SECRET", "s3cr3t-service-env");
    let templates = Templates::new(moat_bin());
    let t = templates.get(&p).unwrap();
    let mut obs = moat_linux::NoObserver;
    let marker = format!("tplbg{}", std::process::id());
    let first = t
        .run(
            &p,
            &opts(&format!(
                "echo left > /tmp/tmpleft; echo left > $HOME/homeleft; echo left > /dev/shm/shmleft; \
                 exec 7>/tmp/fd7; sh -c 'sleep 1000' {marker} & echo FIRST-RAN"
            )),
            &mut obs,
            &mut None,
            None,
            Control::Channel(&idle()),
        )
        .unwrap();
    assert_eq!(first.exit_code, 0, "{:?}", first.error);
    assert!(stdout(&first).contains("FIRST-RAN"));
    // The background process died with the first execution's pid namespace.
    assert!(
        !host_has_process_with(&marker),
        "the background process outlived its execution"
    );
    let second = t
        .run(
            &p,
            &opts(
                "ls -a /tmp $HOME /dev/shm; echo PIDS; ls /proc | grep '^[0-9]'; echo FDS; ls /proc/self/fd; \
                 echo ENV; env; cat /proc/1/environ; echo; echo SECOND-RAN",
            ),
            &mut obs,
            &mut None,
            None,
            Control::Channel(&idle()),
        )
        .unwrap();
    let o = stdout(&second);
    assert!(o.contains("SECOND-RAN"), "{o} {:?}", second.error);
    for left in ["tmpleft", "homeleft", "shmleft", "fd7"] {
        assert!(
            !o.contains(left),
            "{left} of the first execution is visible: {o}"
        );
    }
    assert!(!o.contains(&marker), "{o}");
    assert!(!o.contains("s3cr3t-service-env"), "{o}");
    // Only this execution's own processes: its init (1), sh, ls/grep.
    let pids: Vec<u32> = o
        .split("PIDS\n")
        .nth(1)
        .unwrap()
        .split("FDS")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert!(pids.iter().all(|p| *p < 10), "{pids:?}");
    // Only stdio and the fd ls opens for the listing.
    let fds: Vec<u32> = o
        .split("FDS\n")
        .nth(1)
        .unwrap()
        .split("ENV")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert!(fds.iter().all(|f| *f <= 3), "{fds:?}");
}

/// Signals a channel when a line appears in the streamed stdout.
struct Watch {
    want: &'static str,
    tx: mpsc::Sender<()>,
    seen: String,
}

impl RunObserver for Watch {
    fn output(&mut self, stream: Stream, _offset: u64, data: &[u8]) {
        if stream == Stream::Stdout {
            self.seen.push_str(&String::from_utf8_lossy(data));
            if self.seen.contains(self.want) {
                let _ = self.tx.send(());
                self.seen.clear();
            }
        }
    }
}

fn streamed(script: &str) -> RunOptions {
    RunOptions {
        output: OutputMode::Stream,
        ..opts(script)
    }
}

#[test]
fn an_abstract_socket_of_a_running_execution_cannot_be_reached_from_the_next() {
    let d = dirs("abs");
    let p = plan(&d.ws, &d.home);
    let templates = Templates::new(moat_bin());
    let t = templates.get(&p).unwrap();
    let name = format!("moat-tpl-abs-{}", std::process::id());
    let (stop_w, stop_r) = channel().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        let t1 = t.clone();
        let p1 = p.clone();
        let name1 = name.clone();
        let first = s.spawn(move || {
            let mut w = Watch {
                want: "BOUND",
                tx,
                seen: String::new(),
            };
            t1.run(
                &p1,
                &streamed(&format!(
                    "python3 -c \"import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.bind('\\0{name1}'); s.listen(1); print('BOUND', flush=True); time.sleep(1000)\""
                )),
                &mut w,
                &mut None,
                None,
                Control::Channel(&stop_r),
            )
            .unwrap()
        });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the first execution bound its socket");
        let mut obs = moat_linux::NoObserver;
        let second = t
            .run(
                &p,
                &opts(&format!(
                    "python3 -c \"
import socket
s=socket.socket(socket.AF_UNIX)
try:
    s.connect('\\0{name}'); print('CONNECTED')
except OSError as e:
    print('REFUSED', e.errno)
\""
                )),
                &mut obs,
                &mut None,
                None,
                Control::Channel(&idle()),
            )
            .unwrap();
        let o = stdout(&second);
        stop_w.send(Request::Stop).unwrap();
        let first = first.join().unwrap();
        assert!(o.contains("REFUSED"), "{o} {:?}", second.error);
        assert!(!o.contains("CONNECTED"), "{o}");
        assert_ne!(first.exit_code, 0);
    });
}

#[test]
fn stop_kills_a_setsid_grandchild() {
    let d = dirs("stop");
    let p = plan(&d.ws, &d.home);
    let templates = Templates::new(moat_bin());
    let t = templates.get(&p).unwrap();
    let marker = format!("tplstop{}", std::process::id());
    let (stop_w, stop_r) = channel().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        let t1 = t.clone();
        let p1 = p.clone();
        let marker1 = marker.clone();
        let run = s.spawn(move || {
            let mut w = Watch {
                want: "STARTED",
                tx,
                seen: String::new(),
            };
            t1.run(
                &p1,
                &streamed(&format!(
                    "setsid sh -c 'sleep 1000' {marker1} & echo STARTED; wait"
                )),
                &mut w,
                &mut None,
                None,
                Control::Channel(&stop_r),
            )
            .unwrap()
        });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("started");
        assert!(host_has_process_with(&marker), "the grandchild never ran");
        stop_w.send(Request::Stop).unwrap();
        let out = run.join().unwrap();
        assert_ne!(out.exit_code, 0);
        assert!(!out.timed_out, "the stop did not stop it; the timeout did");
        assert!(
            !host_has_process_with(&marker),
            "the setsid grandchild survived the stop"
        );
    });
}

#[test]
fn a_secret_created_after_the_template_was_built_is_covered() {
    let d = dirs("stale");
    let p = plan(&d.ws, &d.home);
    let templates = Templates::new(moat_bin());
    let t = templates.get(&p).unwrap();
    let mut obs = moat_linux::NoObserver;
    let first = t
        .run(
            &p,
            &opts("echo BUILT"),
            &mut obs,
            &mut None,
            None,
            Control::Channel(&idle()),
        )
        .unwrap();
    assert!(stdout(&first).contains("BUILT"));
    // The host changes after the template was built.
    std::fs::write(d.ws.join(".env"), "TOKEN=tpl-secret-bytes\n").unwrap();
    let fresh = plan(&d.ws, &d.home);
    // The old template refuses a plan that is not its own…
    assert!(t
        .run(
            &fresh,
            &opts("cat .env"),
            &mut obs,
            &mut None,
            None,
            Control::Channel(&idle())
        )
        .is_err());
    // …and the pool builds a new one for it.
    let t2 = templates.get(&fresh).unwrap();
    let out = t2
        .run(
            &fresh,
            &opts("cat .env; echo CAT-RAN"),
            &mut obs,
            &mut None,
            None,
            Control::Channel(&idle()),
        )
        .unwrap();
    let o = stdout(&out);
    assert!(o.contains("CAT-RAN"), "{o} {:?}", out.error);
    assert!(
        !o.contains("tpl-secret-bytes"),
        "the secret is visible: {o}"
    );
    assert_eq!(templates.len(), 1, "the stale template was not retired");
}

/// The (device, inode) of `p`, as the service takes it from the directory
/// it checked against its roots.
fn identity(p: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).unwrap();
    (m.dev(), m.ino())
}

#[test]
fn the_command_starts_only_in_the_directory_the_caller_checked() {
    let d = dirs("cwd");
    let p = plan(&d.ws, &d.home);
    let templates = Templates::new(moat_bin());
    let t = templates.get(&p).unwrap();
    let mut obs = moat_linux::NoObserver;
    let script = "pwd; touch ./ran-here; echo CMD-RAN";
    // The caller checked the workspace: the command runs there.
    let ok = t
        .run(
            &p,
            &opts(script),
            &mut obs,
            &mut None,
            Some(identity(&d.ws)),
            Control::Channel(&idle()),
        )
        .unwrap();
    let o = stdout(&ok);
    assert!(o.contains("CMD-RAN"), "{o} {:?}", ok.error);
    let ws = std::fs::canonicalize(&d.ws).unwrap();
    assert!(o.contains(&*ws.to_string_lossy()), "{o}");
    std::fs::remove_file(d.ws.join("ran-here")).unwrap();
    // The caller checked another directory than the one the view's cwd is
    // now (a rename in between): the command must not start.
    let moved = t
        .run(
            &p,
            &opts(script),
            &mut obs,
            &mut None,
            Some(identity(&d.home)),
            Control::Channel(&idle()),
        )
        .unwrap();
    let o = stdout(&moved);
    assert!(!o.contains("CMD-RAN"), "the command ran: {o}");
    assert!(
        !d.ws.join("ran-here").exists(),
        "the command ran in the workspace"
    );
    assert_eq!(moved.exit_code, 125, "{o} {:?}", moved.error);
    let e = moved.error.clone().unwrap_or_default();
    assert!(e.contains("was moved"), "{e}");
}

/// The run's end of a channel nobody sends on (no stop request).
fn idle() -> ControlReceiver {
    channel().unwrap().1
}

/// Not a test: `cargo test -p moat-linux --test template_driver -- --ignored
/// --nocapture timing` prints the p50 of a template execution of /bin/true.
#[test]
#[ignore]
fn timing() {
    let d = dirs("timing");
    let p = plan(&d.ws, &d.home);
    let templates = Templates::new(moat_bin());
    let t = templates.get(&p).unwrap();
    let mut obs = moat_linux::NoObserver;
    let o = RunOptions {
        argv: vec!["/bin/true".into()],
        ..opts("")
    };
    let mut xs = Vec::new();
    for _ in 0..200 {
        let s = std::time::Instant::now();
        let out = t
            .run(&p, &o, &mut obs, &mut None, None, Control::Channel(&idle()))
            .unwrap();
        assert_eq!(out.exit_code, 0);
        xs.push(s.elapsed().as_secs_f64() * 1e3);
    }
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "template /bin/true p50 {:.3} ms p99 {:.3} ms",
        xs[100], xs[198]
    );
}
