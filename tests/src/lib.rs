//! Black-box conformance harness for `moat`: builds host fixtures, runs the
//! binary with a controlled environment, and offers probes that observe side
//! effects from outside the sandbox (files, listeners, processes).
//!
//! Nothing here assumes uid 0: the suite runs as root and as an unprivileged
//! user. Fixtures live under `/var/tmp`, never `/tmp`, because the host `/tmp`
//! is hidden inside the sandbox.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The sandboxed levels (everything but danger-full-access).
pub const SANDBOXED: [&str; 3] = ["read-only", "workspace-write", "workspace-contained"];
/// Every level.
pub const ALL_LEVELS: [&str; 4] = [
    "read-only",
    "workspace-write",
    "workspace-contained",
    "danger-full-access",
];
/// Python used inside the sandbox: Debian's, visible at every level.
pub const PY: &str = "/usr/bin/python3";
/// Bash used inside the sandbox.
pub const BASH: &str = "/bin/bash";
/// Safety net: a hung moat makes the test fail instead of hanging CI.
pub const SAFETY_TIMEOUT: Duration = Duration::from_secs(90);
/// PATH given to moat (and so, normally, to the sandboxed command).
pub const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub mod runc_bundle;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A string unique to this process and call, for secrets and markers.
pub fn unique(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "moatconf-{tag}-{}-{n}-{:x}",
        std::process::id(),
        nanos & 0xffff_ffff
    )
}

/// Path of the moat binary under test: `$MOAT_BIN`, else
/// `<workspace>/target/debug/moat`. A binary older than any source file it
/// was built from (cargo's dep-info file `<binary>.d`, next to it) is
/// refused: the run would test old code. The first call panics with the
/// fix, and so does every later one.
pub fn moat_bin() -> PathBuf {
    static CHECKED: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    match CHECKED.get_or_init(checked_moat_bin) {
        Ok(p) => p.clone(),
        Err(e) => panic!("{e}"),
    }
}

fn checked_moat_bin() -> Result<PathBuf, String> {
    let (bin, how) = match std::env::var_os("MOAT_BIN") {
        Some(p) => (PathBuf::from(p), "MOAT_BIN"),
        None => (
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
                .join("debug")
                .join("moat"),
            "the default, MOAT_BIN unset",
        ),
    };
    let fix = "run `cargo build --bins` and set MOAT_BIN=$PWD/target/debug/moat";
    let meta = fs::metadata(&bin)
        .map_err(|e| format!("no moat binary at {} ({how}): {e}; {fix}", bin.display()))?;
    let built = meta
        .modified()
        .map_err(|e| format!("mtime of {}: {e}", bin.display()))?;
    // A copy without its dep-info (scripts/test-all copies the fresh build
    // for the unprivileged phase) has nothing to compare against.
    let mut dep_info = bin.clone().into_os_string();
    dep_info.push(".d");
    let Ok(deps) = fs::read_to_string(&dep_info) else {
        return Ok(bin);
    };
    for src in dep_info_sources(&deps) {
        let newer = fs::metadata(&src)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > built);
        if newer {
            return Err(format!(
                "stale moat binary: {} ({how}) is older than its source {}; {fix}",
                bin.display(),
                src.display()
            ));
        }
    }
    Ok(bin)
}

/// The prerequisites listed in a make-style dep-info file (`target: a b`),
/// with `\ ` unescaped.
fn dep_info_sources(deps: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for line in deps.lines() {
        let Some((_, rest)) = line.split_once(": ") else {
            continue;
        };
        let mut cur = String::new();
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => {
                    cur.push(' ');
                    chars.next();
                }
                ' ' => {
                    if !cur.is_empty() {
                        out.push(PathBuf::from(std::mem::take(&mut cur)));
                    }
                }
                c => cur.push(c),
            }
        }
        if !cur.is_empty() {
            out.push(PathBuf::from(cur));
        }
    }
    out
}

/// Current effective uid (for messages only; nothing may depend on it being 0).
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Print a skip line for a case the host cannot run. One line on stdout:
/// `scripts/test-all` runs the tests with `--show-output`, counts these
/// lines per phase, and in CI fails on any not listed in
/// `tests/skips-allowed.txt`.
pub fn skip(reason: &str) {
    println!("SKIP: {reason}");
}

/// The host fixture: a temp root under /var/tmp with a fake HOME full of
/// secrets, a workspace, and a neighbouring directory with a secret.
pub struct Fixture {
    pub root: PathBuf,
    /// Fake HOME of the invoking user (passed to moat as HOME).
    pub home: PathBuf,
    /// The workspace (moat's cwd).
    pub ws: PathBuf,
    /// Neighbour of the workspace holding `secret`.
    pub outside: PathBuf,
    pub ssh_secret: String,
    pub aws_secret: String,
    pub outside_secret: String,
    pub env_secret: String,
    pub netrc_secret: String,
    /// Content of a non-protected file in the fake HOME (positive control).
    pub home_public: String,
}

impl Fixture {
    pub fn new() -> Fixture {
        let base = Path::new("/var/tmp");
        let root = base.join(unique("fx"));
        fs::create_dir(&root).expect("create fixture root");
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).expect("chmod root");
        let root = root.canonicalize().expect("canonicalize root");
        let home = root.join("home");
        let ws = root.join("ws");
        let outside = root.join("outside");
        for d in [&home, &ws, &outside] {
            fs::create_dir(d).expect("mkdir");
        }
        let fx = Fixture {
            ssh_secret: unique("SSHSECRET"),
            aws_secret: unique("AWSSECRET"),
            outside_secret: unique("OUTSIDESECRET"),
            env_secret: unique("ENVSECRET"),
            netrc_secret: unique("NETRCSECRET"),
            home_public: unique("HOMEPUBLIC"),
            root,
            home,
            ws,
            outside,
        };
        let h = &fx.home;
        write(
            h.join(".ssh/id_rsa"),
            &format!("-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n", fx.ssh_secret),
        );
        write(h.join(".ssh/config"), &format!("# {}\n", fx.ssh_secret));
        write(
            h.join(".aws/credentials"),
            &format!("[default]\naws_secret_access_key={}\n", fx.aws_secret),
        );
        write(h.join(".gnupg/private-keys-v1.d/key"), &fx.ssh_secret);
        write(
            h.join(".config/gh/hosts.yml"),
            &format!("oauth_token: {}\n", fx.ssh_secret),
        );
        write(
            h.join(".netrc"),
            &format!("machine x login y password {}\n", fx.netrc_secret),
        );
        write(
            h.join(".git-credentials"),
            &format!("https://u:{}@example.invalid\n", fx.netrc_secret),
        );
        write(
            h.join(".npmrc"),
            &format!("//r/:_authToken={}\n", fx.netrc_secret),
        );
        write(
            h.join(".cargo/credentials.toml"),
            &format!("[registry]\ntoken = \"{}\"\n", fx.netrc_secret),
        );
        write(
            h.join(".claude.json"),
            &format!("{{\"k\":\"{}\"}}\n", fx.netrc_secret),
        );
        write(h.join(".kube/config"), &fx.netrc_secret);
        write(h.join("notes.txt"), &fx.home_public);
        write(fx.outside.join("secret"), &fx.outside_secret);
        write(fx.ws.join("README"), "workspace readme\n");
        fx
    }

    /// A fixture whose workspace is the fake HOME itself.
    pub fn home_as_workspace() -> Fixture {
        let mut fx = Fixture::new();
        fx.ws = fx.home.clone();
        fx
    }

    /// Path to a file in the workspace.
    pub fn w(&self, rel: &str) -> PathBuf {
        self.ws.join(rel)
    }

    /// A `moat` command with a clean, controlled environment: HOME is the
    /// fake home, cwd the workspace, stdin /dev/null.
    pub fn moat<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = Command::new(moat_bin());
        c.args(args)
            .env_clear()
            .env("PATH", HOST_PATH)
            .env("HOME", &self.home)
            .env("LANG", "C.UTF-8")
            .env("USER", user_name())
            .current_dir(&self.ws)
            .stdin(Stdio::null());
        c
    }

    /// `moat exec --policy LEVEL [extra...] -- bash -c SCRIPT`
    pub fn sh(&self, level: &str, extra: &[&str], script: &str) -> Command {
        let mut a: Vec<OsString> = vec!["exec".into(), "--policy".into(), level.into()];
        a.extend(extra.iter().map(OsString::from));
        a.extend(["--".into(), BASH.into(), "-c".into(), script.into()]);
        self.moat(a)
    }

    /// `moat exec --policy LEVEL [extra...] -- python3 -c CODE ARGS...`
    pub fn py(&self, level: &str, extra: &[&str], code: &str, args: &[&str]) -> Command {
        let mut a: Vec<OsString> = vec!["exec".into(), "--policy".into(), level.into()];
        a.extend(extra.iter().map(OsString::from));
        a.extend(["--".into(), PY.into(), "-c".into(), code.into()]);
        a.extend(args.iter().map(OsString::from));
        self.moat(a)
    }
}

impl Default for Fixture {
    fn default() -> Self {
        Fixture::new()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Make everything removable even if a test chmodded something.
        let _ = Command::new("chmod")
            .args(["-R", "u+rwX"])
            .arg(&self.root)
            .status();
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn user_name() -> String {
    std::env::var("USER").unwrap_or_else(|_| {
        if euid() == 0 {
            "root".into()
        } else {
            "user".into()
        }
    })
}

/// Write a file, creating parent directories.
pub fn write(p: impl AsRef<Path>, content: &str) {
    let p = p.as_ref();
    if let Some(d) = p.parent() {
        fs::create_dir_all(d).expect("mkdir -p");
    }
    fs::write(p, content).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

/// Read a file to a string, or None if it does not exist / is unreadable.
pub fn read(p: impl AsRef<Path>) -> Option<String> {
    fs::read(p.as_ref())
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Whether a path exists on the host (not following a final symlink).
pub fn exists(p: impl AsRef<Path>) -> bool {
    fs::symlink_metadata(p.as_ref()).is_ok()
}

/// Removes a host path when dropped (cleanup that survives a failed assert).
pub struct RmOnDrop(pub PathBuf);
impl Drop for RmOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Kills and reaps a spawned process (a `moat serve`) when dropped, so a
/// test that fails halfway leaves no server running.
pub struct ChildGuard(pub std::process::Child);
impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Result of one moat run.
#[derive(Debug)]
pub struct Out {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// False if stdout/stderr were still held open by a survivor 5 s after
    /// moat exited.
    pub pipes_closed: bool,
    pub label: String,
}

impl Out {
    pub fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
    /// Pretty dump for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "[{}]\n  exit code: {:?} signal: {:?} elapsed: {:?} pipes_closed: {}\n  --- stdout ---\n{}\n  --- stderr ---\n{}",
            self.label,
            self.code,
            self.signal,
            self.elapsed,
            self.pipes_closed,
            truncate(&self.stdout, 4000),
            truncate(&self.stderr, 4000)
        )
    }
    /// Assert an exact exit code.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "expected exit {code}\n{}",
            self.dump()
        );
        self
    }
    /// Assert that `needle` occurs nowhere in stdout or stderr.
    pub fn expect_absent(&self, needle: &str, what: &str) -> &Self {
        assert!(
            !self.all().contains(needle),
            "LEAK: {what} ({needle}) visible\n{}",
            self.dump()
        );
        self
    }
    pub fn expect_stdout_has(&self, needle: &str) -> &Self {
        assert!(
            self.stdout.contains(needle),
            "stdout lacks {needle:?}\n{}",
            self.dump()
        );
        self
    }
    /// Lines of stdout starting with `prefix`, prefix stripped.
    pub fn tagged(&self, prefix: &str) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix(prefix).map(|s| s.trim().to_string()))
            .collect()
    }
    /// The value of the first `KEY=value` / `KEY value` line.
    pub fn field(&self, key: &str) -> Option<String> {
        for l in self.stdout.lines() {
            if let Some(rest) = l.strip_prefix(key) {
                if let Some(v) = rest.strip_prefix('=').or_else(|| rest.strip_prefix(' ')) {
                    return Some(v.trim().to_string());
                }
            }
        }
        None
    }
    /// Parse stdout as one JSON value.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not one JSON value: {e}\n{}", self.dump()))
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        let mut end = n;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…[{} bytes more]", &s[..end], s.len() - end)
    }
}

/// A moat process running in the background.
pub struct Running {
    pub child: Child,
    out_rx: mpsc::Receiver<Vec<u8>>,
    err_rx: mpsc::Receiver<Vec<u8>>,
    start: Instant,
    label: String,
}

fn reader(mut r: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

fn label_of(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        let a = a.to_string_lossy();
        if a.contains(' ') || a.contains('\n') {
            s.push_str(&format!("{:?}", truncate(&a, 300)));
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// Spawn a command with piped stdout/stderr.
pub fn spawn(mut cmd: Command) -> Running {
    let label = label_of(&cmd);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!(
            "cannot spawn {label}: {e} (is MOAT_BIN={} built?)",
            moat_bin().display()
        )
    });
    let out_rx = reader(child.stdout.take().expect("stdout"));
    let err_rx = reader(child.stderr.take().expect("stderr"));
    Running {
        child,
        out_rx,
        err_rx,
        start,
        label,
    }
}

impl Running {
    /// Whether moat has exited.
    pub fn finished(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Wait for exit (killing moat and failing the test after `limit`).
    pub fn wait_limit(mut self, limit: Duration) -> Out {
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) => {}
                Err(e) => panic!("wait {}: {e}", self.label),
            }
            if self.start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let so = self
                    .out_rx
                    .recv_timeout(Duration::from_secs(2))
                    .unwrap_or_default();
                let se = self
                    .err_rx
                    .recv_timeout(Duration::from_secs(2))
                    .unwrap_or_default();
                panic!(
                    "HUNG: moat did not exit within {limit:?}: {}\nstdout: {}\nstderr: {}",
                    self.label,
                    String::from_utf8_lossy(&so),
                    String::from_utf8_lossy(&se)
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.start.elapsed();
        let grace = Duration::from_secs(5);
        let so = self.out_rx.recv_timeout(grace);
        let se = self.err_rx.recv_timeout(grace);
        let pipes_closed = so.is_ok() && se.is_ok();
        Out {
            code: status.code(),
            signal: status.signal(),
            stdout: String::from_utf8_lossy(&so.unwrap_or_default()).into_owned(),
            stderr: String::from_utf8_lossy(&se.unwrap_or_default()).into_owned(),
            elapsed,
            pipes_closed,
            label: self.label,
        }
    }

    pub fn wait(self) -> Out {
        self.wait_limit(SAFETY_TIMEOUT)
    }
}

/// Run to completion with the safety timeout.
pub fn run(cmd: Command) -> Out {
    spawn(cmd).wait()
}

// ---------------------------------------------------------------- processes

/// Host pids whose cmdline contains `marker`.
pub fn procs_with(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut v = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return v;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Ok(c) = fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&c).contains(marker) {
                // Ignore zombies: they are dead, only not yet reaped.
                let st = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                let state = st.rsplit(')').next().unwrap_or("").trim().chars().next();
                if state != Some('Z') {
                    v.push(pid);
                }
            }
        }
    }
    v
}

/// Host pids whose argv[0] is exactly `marker` (e.g. `exec -a MARKER sleep`).
pub fn procs_argv0(marker: &str) -> Vec<i32> {
    procs_with(marker)
        .into_iter()
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| c.split(|b| *b == 0).next() == Some(marker.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// Poll until a process whose argv[0] is `marker` exists, up to `limit`.
pub fn wait_for_proc(marker: &str, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if !procs_argv0(marker).is_empty() {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Poll until no process with `marker` exists; returns the survivors.
pub fn wait_gone(marker: &str, limit: Duration) -> Vec<i32> {
    let t = Instant::now();
    loop {
        let v = procs_with(marker);
        if v.is_empty() || t.elapsed() > limit {
            return v;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILL every process with `marker` (cleanup after a failed assertion).
pub fn kill_marker(marker: &str) {
    for pid in procs_with(marker) {
        // SAFETY: plain kill(2) on a pid we found; failure is harmless.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Kills marker processes on drop so a failing test leaves nothing behind.
pub struct MarkerGuard(pub String);
impl Drop for MarkerGuard {
    fn drop(&mut self) {
        kill_marker(&self.0);
    }
}

// ---------------------------------------------------------------- listeners

/// A host listener that counts connections / datagrams in a thread.
pub struct Listener {
    pub hits: Arc<AtomicUsize>,
    pub data: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    cleanup: Option<PathBuf>,
}

impl Listener {
    fn start<F>(cleanup: Option<PathBuf>, mut poll: F) -> Listener
    where
        F: FnMut(&AtomicUsize, &Mutex<Vec<u8>>) + Send + 'static,
    {
        let hits = Arc::new(AtomicUsize::new(0));
        let data = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, d, s) = (hits.clone(), data.clone(), stop.clone());
        let handle = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !s.load(Ordering::SeqCst) && Instant::now() < deadline {
                poll(&h, &d);
                thread::sleep(Duration::from_millis(5));
            }
            // one last sweep
            poll(&h, &d);
        });
        Listener {
            hits,
            data,
            stop,
            handle: Some(handle),
            cleanup,
        }
    }

    /// A unix stream listener at `path`.
    pub fn unix(path: &Path) -> Listener {
        let _ = fs::remove_file(path);
        let l = std::os::unix::net::UnixListener::bind(path)
            .unwrap_or_else(|e| panic!("bind {}: {e}", path.display()));
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o777));
        l.set_nonblocking(true).expect("nonblocking");
        Listener::start(Some(path.to_path_buf()), move |h, d| {
            while let Ok((mut s, _)) = l.accept() {
                h.fetch_add(1, Ordering::SeqCst);
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
                let mut b = [0u8; 256];
                if let Ok(n) = s.read(&mut b) {
                    d.lock().expect("lock").extend_from_slice(&b[..n]);
                }
            }
        })
    }

    /// An abstract unix stream listener (`@name`).
    pub fn unix_abstract(name: &str) -> Listener {
        use std::os::linux::net::SocketAddrExt;
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract");
        let l = std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind abstract");
        l.set_nonblocking(true).expect("nonblocking");
        Listener::start(None, move |h, _d| {
            while l.accept().is_ok() {
                h.fetch_add(1, Ordering::SeqCst);
            }
        })
    }

    /// A TCP listener on 127.0.0.1 (random port).
    pub fn tcp() -> (Listener, u16) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind tcp");
        let port = l.local_addr().expect("addr").port();
        l.set_nonblocking(true).expect("nonblocking");
        let li = Listener::start(None, move |h, d| {
            while let Ok((mut s, _)) = l.accept() {
                h.fetch_add(1, Ordering::SeqCst);
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
                let mut b = [0u8; 256];
                if let Ok(n) = s.read(&mut b) {
                    d.lock().expect("lock").extend_from_slice(&b[..n]);
                }
            }
        });
        (li, port)
    }

    /// A UDP socket on 127.0.0.1 (random port) counting datagrams.
    pub fn udp() -> (Listener, u16) {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp");
        let port = s.local_addr().expect("addr").port();
        s.set_nonblocking(true).expect("nonblocking");
        let li = Listener::start(None, move |h, d| {
            let mut b = [0u8; 512];
            while let Ok(n) = s.recv(&mut b) {
                h.fetch_add(1, Ordering::SeqCst);
                d.lock().expect("lock").extend_from_slice(&b[..n]);
            }
        });
        (li, port)
    }

    /// Stop after a short settle period and return (hits, data).
    pub fn finish(mut self) -> (usize, Vec<u8>) {
        thread::sleep(Duration::from_millis(300));
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        let d = self.data.lock().expect("lock").clone();
        (self.hits.load(Ordering::SeqCst), d)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(p) = &self.cleanup {
            let _ = fs::remove_file(p);
        }
    }
}

// ---------------------------------------------------------------- fds / ptys

/// Duplicate `fd` to a CLOEXEC fd numbered >= 200, so that several
/// `inherit_fd` calls cannot clobber each other's sources.
pub fn high_fd(fd: i32) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: F_DUPFD_CLOEXEC returns a new fd that we then own.
    let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 200) };
    assert!(
        n >= 0,
        "F_DUPFD_CLOEXEC: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `n` is a freshly created fd owned by nobody else.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(n) }
}

/// Make `cmd` inherit `src` as fd `target` (without CLOEXEC).
pub fn inherit_fd(cmd: &mut Command, src: i32, target: i32) {
    // SAFETY: the closure only calls dup2/fcntl, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if src == target {
                // dup2(x, x) would keep FD_CLOEXEC set.
                if libc::fcntl(src, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(src, target) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A pseudo-terminal pair (master, slave) with ICANON off and ECHO on.
pub struct Pty {
    pub master: i32,
    pub slave: i32,
}

impl Pty {
    pub fn open() -> Pty {
        let mut m = 0;
        let mut s = 0;
        // SAFETY: openpty writes two fds into the provided ints; null name/termios/winsize are allowed.
        let r = unsafe {
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "openpty failed: {}", std::io::Error::last_os_error());
        // SAFETY: tcgetattr/tcsetattr on a valid fd with a zeroed termios we own.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            libc::tcgetattr(s, &mut t);
            t.c_lflag &= !libc::ICANON;
            t.c_lflag |= libc::ECHO;
            t.c_cc[libc::VMIN] = 0;
            t.c_cc[libc::VTIME] = 0;
            libc::tcsetattr(s, libc::TCSANOW, &t);
            libc::fcntl(m, libc::F_SETFD, libc::FD_CLOEXEC);
            libc::fcntl(s, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        Pty {
            master: m,
            slave: s,
        }
    }

    /// Configure `cmd` to start a new session with the slave as controlling
    /// terminal and as stdin.
    pub fn attach(&self, cmd: &mut Command) {
        let s = self.slave;
        // SAFETY: setsid/ioctl/dup2 are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                libc::setsid();
                libc::ioctl(s, libc::TIOCSCTTY, 0);
                if libc::dup2(s, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// What is queued on `fd`. A write to one side of a pty reaches the
    /// other through the kernel's flush work, which a loaded machine runs
    /// late: a bare non-blocking read right after the writer exited can
    /// find nothing yet. So wait for data (a hang guard, not a timing
    /// assertion), then read until the line has stayed quiet a while.
    fn drain(fd: i32) -> Vec<u8> {
        let mut out = Vec::new();
        // SAFETY: poll and non-blocking reads into a local buffer from an fd we own.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            let mut b = [0u8; 256];
            loop {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                let wait_ms = if out.is_empty() { 1000 } else { 200 };
                if libc::poll(&mut p, 1, wait_ms) <= 0 || p.revents & libc::POLLIN == 0 {
                    break;
                }
                let n = libc::read(fd, b.as_mut_ptr().cast(), b.len());
                if n <= 0 {
                    break;
                }
                out.extend_from_slice(&b[..n as usize]);
            }
        }
        out
    }

    /// What the master has shown once `needle` arrived (then until the line
    /// stays quiet): for output the test knows is coming. A loaded machine
    /// may run the pty's flush work well after the writer exited, so the
    /// wait is a 60 s hang guard, not a timing assertion; without the needle
    /// by then, whatever did arrive is returned for the assertion to show.
    pub fn output_through(&self, needle: &str) -> Vec<u8> {
        let guard = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut out = Vec::new();
        while std::time::Instant::now() < guard {
            out.extend(Pty::drain(self.master));
            if out.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                out.extend(Pty::drain(self.master));
                break;
            }
        }
        out
    }

    /// Bytes pending on the master (echo output) and slave (input queue).
    pub fn pending(&self) -> (Vec<u8>, Vec<u8>) {
        (Pty::drain(self.master), Pty::drain(self.slave))
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        // SAFETY: closing fds we opened.
        unsafe {
            libc::close(self.master);
            libc::close(self.slave);
        }
    }
}

/// Parse lines like `name ERRNO 1` / `name OK` from a probe into (name, result).
pub fn probe_results(out: &Out) -> Vec<(String, String)> {
    out.stdout
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("PROBE ")?;
            let (n, r) = l.split_once(' ')?;
            Some((n.to_string(), r.trim().to_string()))
        })
        .collect()
}

/// Expect every probe line named in `names` to say `ERRNO <errno>`.
pub fn expect_probe_errno(out: &Out, names: &[&str], errno: i32) {
    let res = probe_results(out);
    let mut bad = Vec::new();
    for n in names {
        match res.iter().find(|(k, _)| k == n) {
            Some((_, r)) if *r == format!("ERRNO {errno}") => {}
            Some((_, r)) => bad.push(format!("{n}: {r}")),
            None => bad.push(format!("{n}: no result line")),
        }
    }
    assert!(
        bad.is_empty(),
        "expected errno {errno} for: {bad:?}\n{}",
        out.dump()
    );
}

// ---------------------------------------------------------------- HTTP servers

/// A tiny HTTP/1.x server on 127.0.0.1 (random port), run in threads, that
/// records every accepted connection and request line. It serves either one
/// fixed body for every path or the files of a directory (GET and HEAD;
/// `Connection: close` on every response). Used as the "remote" host behind
/// moat's proxy: its counters are the side effect the proxy tests assert.
pub struct HttpServer {
    pub port: u16,
    conns: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

enum Served {
    Fixed(String),
    Dir(PathBuf),
}

impl HttpServer {
    /// Answer every GET with 200 and `body`.
    pub fn fixed(body: &str) -> HttpServer {
        HttpServer::start(Served::Fixed(body.to_string()))
    }

    /// Serve the files under `dir` (`/a/` serves `a/index.html`).
    pub fn dir(dir: &Path) -> HttpServer {
        HttpServer::start(Served::Dir(dir.to_path_buf()))
    }

    fn start(what: Served) -> HttpServer {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind http");
        let port = l.local_addr().expect("addr").port();
        l.set_nonblocking(true).expect("nonblocking");
        let conns = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let what = Arc::new(what);
        let (c, r, s) = (conns.clone(), requests.clone(), stop.clone());
        let handle = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(300);
            while !s.load(Ordering::SeqCst) && Instant::now() < deadline {
                match l.accept() {
                    Ok((stream, _)) => {
                        c.fetch_add(1, Ordering::SeqCst);
                        let (r, what) = (r.clone(), what.clone());
                        thread::spawn(move || http_serve_one(stream, &what, &r));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        HttpServer {
            port,
            conns,
            requests,
            stop,
            handle: Some(handle),
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.conns.load(Ordering::SeqCst)
    }

    /// Request lines (`GET /path HTTP/1.1`) received so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("lock").clone()
    }

    /// Connections after a short settle period (late arrivals count).
    pub fn settled_connections(&self) -> usize {
        thread::sleep(Duration::from_millis(300));
        self.connections()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn http_serve_one(mut s: std::net::TcpStream, what: &Served, reqs: &Mutex<Vec<String>>) {
    use std::io::Write;
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut b = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let line = head.lines().next().unwrap_or("").to_string();
    if line.is_empty() {
        return;
    }
    reqs.lock().expect("lock").push(line.clone());
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("/");
    // Absolute-form (a client talking to us as if we were a proxy): keep the path.
    let path = match target.find("://") {
        Some(i) => {
            let rest = &target[i + 3..];
            rest.find('/').map(|j| &rest[j..]).unwrap_or("/")
        }
        None => target,
    };
    let path = path.split(['?', '#']).next().unwrap_or("/");
    let (status, ctype, body): (&str, &str, Vec<u8>) = match what {
        Served::Fixed(body) => ("200 OK", "text/plain", body.as_bytes().to_vec()),
        Served::Dir(root) => {
            let rel = path.trim_start_matches('/');
            if rel.split('/').any(|c| c == "..") {
                ("403 Forbidden", "text/plain", b"no\n".to_vec())
            } else {
                let mut p = root.join(rel);
                if p.is_dir() {
                    p = p.join("index.html");
                }
                match fs::read(&p) {
                    Ok(data) => {
                        let html = p.extension().is_some_and(|e| e == "html");
                        (
                            "200 OK",
                            if html {
                                "text/html"
                            } else {
                                "application/octet-stream"
                            },
                            data,
                        )
                    }
                    Err(_) => ("404 Not Found", "text/plain", b"not found\n".to_vec()),
                }
            }
        }
    };
    let mut resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        resp.extend_from_slice(&body);
    }
    let _ = s.write_all(&resp);
    let _ = s.flush();
}

/// A non-loopback IPv4 address of this host (for "direct connection to a
/// host address" probes), if it has one.
pub fn host_ipv4() -> Option<std::net::Ipv4Addr> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut it = l.split_whitespace();
        while let Some(w) = it.next() {
            if w == "inet" {
                return it.next()?.split('/').next()?.parse().ok();
            }
        }
        None
    })
}

/// A `moat serve --stdio` session in the fixture's workspace, as a harness
/// drives it (the template tests' client).
pub struct ServeSession {
    child: Child,
    stdin: std::process::ChildStdin,
    out: std::io::BufReader<std::process::ChildStdout>,
    next: u64,
}

impl ServeSession {
    /// Starts `moat serve --stdio --no-audit ARGS` in the fixture.
    pub fn start(fx: &Fixture, args: &[&str]) -> ServeSession {
        let mut a = vec!["serve", "--stdio", "--no-audit"];
        a.extend_from_slice(args);
        let mut child = fx
            .moat(a)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moat serve");
        let stdin = child.stdin.take().expect("stdin");
        let out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        ServeSession {
            child,
            stdin,
            out,
            next: 0,
        }
    }

    /// The service's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next message the service sends.
    pub fn read(&mut self) -> serde_json::Value {
        let mut line = String::new();
        assert!(
            std::io::BufRead::read_line(&mut self.out, &mut line).unwrap_or(0) > 0,
            "moat serve ended"
        );
        serde_json::from_str(&line).expect("a JSON line")
    }

    /// A request and its answer (notifications in between are skipped).
    pub fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next += 1;
        let id = self.next;
        let msg =
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        std::io::Write::write_all(&mut self.stdin, format!("{msg}\n").as_bytes())
            .expect("write a request");
        loop {
            let m = self.read();
            if m["id"] == serde_json::json!(id) && m.get("method").is_none() {
                return m;
            }
        }
    }

    /// Runs `script` under `sh -c` to its end: (its stdout, its result).
    pub fn run(&mut self, script: &str) -> (String, serde_json::Value) {
        use base64::Engine as _;
        self.next += 1;
        let id = self.next;
        let msg = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "execute",
                         "params": {"command": ["sh", "-c", script]}});
        std::io::Write::write_all(&mut self.stdin, format!("{msg}\n").as_bytes())
            .expect("write a request");
        let mut stdout = Vec::new();
        let mut eid = None;
        loop {
            let m = self.read();
            if m["id"] == serde_json::json!(id) {
                assert!(m.get("result").is_some(), "execute refused: {m}");
                eid = Some(m["result"]["execution_id"].clone());
                continue;
            }
            let p = &m["params"];
            match p["type"].as_str() {
                Some("execution.stdout") => stdout.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(p["data"].as_str().unwrap_or(""))
                        .unwrap_or_default(),
                ),
                Some("execution.finished") | Some("execution.failed") => break,
                _ => {}
            }
        }
        let eid = eid.expect("the execute answer came before the end");
        let result =
            self.call("getExecution", serde_json::json!({"execution_id": eid}))["result"].clone();
        (String::from_utf8_lossy(&stdout).into_owned(), result)
    }
}

impl Drop for ServeSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each process's parent, from /proc.
pub fn parents() -> std::collections::HashMap<u32, u32> {
    let mut out = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            out.insert(pid, ppid);
        }
    }
    out
}

/// Waits until a process three levels below the service exists (service →
/// template → the next execution's init → its command): the command is
/// forked only once its init laid the whole view, detached the host root
/// and so on. No execution runs meanwhile, so it is the waiting one.
pub fn wait_until_the_next_view_is_laid(s: &ServeSession) {
    let service = s.pid();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let p = parents();
        let depth = |mut pid: u32| {
            for d in 1..=3 {
                match p.get(&pid) {
                    Some(&pp) if pp == service => return Some(d),
                    Some(&pp) => pid = pp,
                    None => return None,
                }
            }
            None
        };
        if p.keys().any(|&pid| depth(pid) == Some(3)) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no execution's command waits below the service after 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
