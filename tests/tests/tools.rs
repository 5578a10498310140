//! Tool profiles family (issue 5): `moat run TOOL`, `moat profile`, shims
//! (moat under a tool's name), `MOAT_ARGS`, project trust through a real
//! pseudo-terminal, refused project grants, mount conflicts, in-session net
//! classes and nested runs through the outer supervisor.
//!
//! Every fixture gets its own XDG_CONFIG_HOME / XDG_STATE_HOME, so user
//! profiles, the user config, the trust store and the audit log are per
//! test. Assertions are on side effects: files in the workspace and outside
//! it, the trust store's bytes, connection counts of a 127.0.0.1 server,
//! errno texts printed by the sandboxed program, audit log lines.

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use moat_conformance::*;

/// The built-in profiles: the 20 the issue requires, and python3 (issue 10).
const BUILTINS: [&str; 21] = [
    "aider", "bash", "cargo", "claude", "codex", "curl", "git", "go", "jq", "make", "node", "npm",
    "npx", "pip", "pnpm", "python", "python3", "rg", "sh", "uv", "yarn",
];

/// A fixture with per-test XDG config/state directories.
struct Tx {
    fx: Fixture,
    cfg: PathBuf,
    state: PathBuf,
}

impl Tx {
    fn new() -> Tx {
        let fx = Fixture::new();
        let cfg = fx.root.join("xdg-config");
        let state = fx.root.join("xdg-state");
        std::fs::create_dir_all(&cfg).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        Tx { fx, cfg, state }
    }

    fn env(&self, c: &mut Command) {
        c.env("XDG_CONFIG_HOME", &self.cfg)
            .env("XDG_STATE_HOME", &self.state);
    }

    /// `moat ARGS` in the workspace with the clean fixture environment.
    fn moat<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.fx.moat(args);
        self.env(&mut c);
        c
    }

    /// A program (e.g. a shim) run like moat: same env, cwd, stdin, with `path_var` as PATH.
    fn prog<I, S>(&self, program: &Path, path_var: &str, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.fx.moat(args);
        let mut p = Command::new(program);
        p.args(c.get_args())
            .env_clear()
            .envs(c.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .env("PATH", path_var)
            .current_dir(&self.fx.ws)
            .stdin(std::process::Stdio::null());
        self.env(&mut p);
        c = p;
        c
    }

    fn profiles_dir(&self) -> PathBuf {
        self.cfg.join("moat/profiles")
    }

    fn user_config(&self) -> PathBuf {
        self.cfg.join("moat/config.toml")
    }

    fn trust_json(&self) -> PathBuf {
        self.state.join("moat/trust.json")
    }

    fn audit_log(&self) -> PathBuf {
        self.state.join("moat/audit.jsonl")
    }

    fn git_init_ws(&self) {
        let st = Command::new(git_bin())
            .args(["init", "-q"])
            .arg(&self.fx.ws)
            .env_clear()
            .env("HOME", &self.fx.home)
            .env("PATH", HOST_PATH)
            .status()
            .expect("git init");
        assert!(st.success(), "host git init failed");
    }
}

fn git_bin() -> &'static str {
    if Path::new("/usr/bin/git").exists() {
        "/usr/bin/git"
    } else {
        "/usr/local/bin/git"
    }
}

/// No controlling terminal: a new session, stdin /dev/null (as set by the harness).
fn no_tty(mut c: Command) -> Command {
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    c
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn assert_has(out: &Out, needle: &str, what: &str) {
    assert!(
        out.all().contains(needle),
        "{what}: output lacks {needle:?}\n{}",
        out.dump()
    );
}

// ------------------------------------------------------------------ tty

/// A run whose stdin and controlling terminal is a canonical-mode pty (as a
/// real terminal): everything moat writes to the terminal is in `transcript`.
struct TtyRun {
    out: Out,
    transcript: String,
    asked: bool,
}

/// Runs `cmd` on a fresh pty; when the y/N prompt appears, types `answer`
/// (or "n" when `answer` is None, recording that it asked unexpectedly).
fn run_on_tty(mut cmd: Command, answer: Option<&str>) -> TtyRun {
    let mut m = 0;
    let mut s = 0;
    // SAFETY: openpty writes two fds; null name/termios/winsize give the
    // kernel defaults (canonical mode, echo on), like a real terminal.
    let r = unsafe {
        libc::openpty(
            &mut m,
            &mut s,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: fcntl on fds we own.
    unsafe {
        libc::fcntl(m, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(s, libc::F_SETFD, libc::FD_CLOEXEC);
        let fl = libc::fcntl(m, libc::F_GETFL);
        libc::fcntl(m, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    let pty = Pty {
        master: m,
        slave: s,
    };
    pty.attach(&mut cmd);
    let mut running = spawn(cmd);
    let mut transcript = Vec::new();
    let mut asked = false;
    let mut answered = false;
    let start = Instant::now();
    let read_master = |buf: &mut Vec<u8>| {
        let mut b = [0u8; 4096];
        loop {
            // SAFETY: non-blocking read into a local buffer.
            let n = unsafe { libc::read(m, b.as_mut_ptr().cast(), b.len()) };
            if n <= 0 {
                break;
            }
            buf.extend_from_slice(&b[..n as usize]);
        }
    };
    loop {
        read_master(&mut transcript);
        if !answered && String::from_utf8_lossy(&transcript).contains("[y/N]") {
            asked = true;
            answered = true;
            let a = format!("{}\n", answer.unwrap_or("n"));
            // SAFETY: write to the master fd we own.
            let n = unsafe { libc::write(m, a.as_ptr().cast(), a.len()) };
            assert_eq!(n as usize, a.len(), "write answer to pty");
        }
        if running.finished() {
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            break; // wait_limit below reports the hang
        }
        thread::sleep(Duration::from_millis(10));
    }
    let out = running.wait_limit(Duration::from_secs(30));
    read_master(&mut transcript);
    drop(pty);
    let transcript = String::from_utf8_lossy(&transcript).into_owned();
    if answer.is_none() {
        assert!(
            !asked,
            "moat asked on the terminal although it should not have\n--- terminal ---\n{transcript}\n{}",
            out.dump()
        );
    }
    TtyRun {
        out,
        transcript,
        asked,
    }
}

// ------------------------------------------------------------------ 1. profiles

#[test]
fn profile_list_check_and_show() {
    let t = Tx::new();
    let out = run(t.moat(["profile", "list"]));
    out.expect_code(0);
    let names: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for b in BUILTINS {
        let line = out
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(b))
            .unwrap_or_else(|| panic!("profile list lacks {b}\n{}", out.dump()));
        assert!(
            line.contains("built-in"),
            "{b} is not listed as built-in: {line}\n{}",
            out.dump()
        );
    }
    assert_eq!(
        names.len(),
        BUILTINS.len(),
        "with no user profiles, exactly the built-ins are listed\n{}",
        out.dump()
    );

    // profile check: a valid file is accepted, an unknown key rejected
    // naming the key and the file.
    let good = t.fx.root.join("good.toml");
    write(
        &good,
        "name = \"pyok\"\nprogram = \"python3\"\nlevel = \"rw\"\nnetwork = \"proxy\"\nallow_domains = [\"example.com:443\"]\nnet_class = \"net-connect\"\n",
    );
    let out = run(t.moat([OsStr::new("profile"), OsStr::new("check"), good.as_os_str()]));
    out.expect_code(0);
    out.expect_stdout_has("pyok");
    let bad = t.fx.root.join("bad-profile.toml");
    write(
        &bad,
        "name = \"pybad\"\nprogram = \"python3\"\nlevel = \"rw\"\nbogus_grant = true\n",
    );
    let out = run(t.moat([OsStr::new("profile"), OsStr::new("check"), bad.as_os_str()]));
    out.expect_code(125);
    assert_has(&out, "bogus_grant", "unknown key named");
    assert_has(&out, "bad-profile.toml", "file named");

    // profile show git fetch: proxy to the forges, with sources and a hash.
    let out = run(t.moat(["profile", "show", "git", "fetch"]));
    out.expect_code(0);
    let has_line = |o: &Out, a: &str, b: &str| {
        o.stdout.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.first() == Some(&a) && w.get(1) == Some(&b)
        })
    };
    assert!(
        has_line(&out, "network", "proxy"),
        "fetch: network proxy\n{}",
        out.dump()
    );
    assert!(
        has_line(&out, "allow_domain", "github.com:443"),
        "fetch: github.com:443 allowed\n{}",
        out.dump()
    );
    assert!(
        out.stdout.contains("profile:git"),
        "grants name their source\n{}",
        out.dump()
    );
    let hash_fetch = out
        .field("policy_hash")
        .unwrap_or_else(|| panic!("no policy_hash line\n{}", out.dump()));
    assert!(
        hash_fetch.starts_with("sha256:") && hash_fetch.len() == 7 + 64,
        "policy_hash format: {hash_fetch}\n{}",
        out.dump()
    );
    // Control: `git status` resolves to a different (local, no network) policy.
    let st = run(t.moat(["profile", "show", "git", "status"]));
    st.expect_code(0);
    assert!(
        has_line(&st, "network", "disabled"),
        "status: no network\n{}",
        st.dump()
    );
    assert!(
        !st.stdout.contains("github.com"),
        "status allows no forge\n{}",
        st.dump()
    );
    let hash_status = st.field("policy_hash").expect("policy_hash for status");
    assert_ne!(hash_fetch, hash_status, "fetch and status policies differ");
    // The same hash as `moat run --dry-run` for the same resolution.
    let dry = run(t.moat(["run", "--dry-run", "git", "fetch"]));
    dry.expect_code(0);
    let dry_hash = dry
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("policy_hash:"))
        .map(|s| s.trim().to_string());
    assert_eq!(
        dry_hash.as_deref(),
        Some(hash_fetch.as_str()),
        "profile show and run --dry-run agree on the policy hash\n{}",
        dry.dump()
    );
}

// ------------------------------------------------------------------ 2. moat run

#[test]
fn run_git_sh_bash_under_their_profiles() {
    let t = Tx::new();
    t.git_init_ws();
    let untracked = unique("untracked");
    write(t.fx.w(&untracked), "x\n");
    let out = run(t.moat(["run", "git", "status", "--porcelain"]));
    out.expect_code(0);
    assert!(
        out.stdout.lines().any(|l| l == format!("?? {untracked}")),
        "git status lists the untracked file\n{}",
        out.dump()
    );

    // sh: level rw writes the workspace.
    let marker = unique("shout");
    let out = run(t.moat(["run", "sh", "-c", &format!("echo {marker} > out.txt")]));
    out.expect_code(0);
    assert_eq!(
        read(t.fx.w("out.txt")).as_deref(),
        Some(format!("{marker}\n").as_str()),
        "sh wrote the workspace\n{}",
        out.dump()
    );

    // bash: the ssh key is not readable (both via the real path and ~),
    // while a public file of the same HOME is (positive control).
    let home = t.fx.home.display().to_string();
    let out = run(t.moat([
        "run",
        "bash",
        "-c",
        &format!("cat {home}/.ssh/id_rsa; cat ~/.ssh/id_rsa; cat {home}/notes.txt; echo"),
    ]));
    out.expect_absent(&t.fx.ssh_secret, "ssh key through moat run bash");
    out.expect_stdout_has(&t.fx.home_public);
}

// ------------------------------------------------------------------ 3. net classes

const SOCK_PROBE: &str = r#"
import socket, sys
def rep(name, f):
    try:
        f()
        print("PROBE", name, "OK", flush=True)
    except OSError as e:
        print("PROBE", name, "ERRNO", e.errno, e.strerror, flush=True)
def inet():
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
def listen():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.listen(1)
def bind():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
def accept_roundtrip():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0)); s.listen(1)
    c = socket.create_connection(s.getsockname(), timeout=5)
    a, _ = s.accept(); a.close(); c.close()
for n in sys.argv[1:]:
    rep(n, globals()[n])
"#;

fn probe_line(out: &Out, name: &str) -> String {
    probe_results(out)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("no PROBE {name} line\n{}", out.dump()))
}

#[test]
fn net_class_curl_connects_through_the_proxy() {
    let t = Tx::new();
    let body = unique("curlbody");
    let srv = HttpServer::fixed(&body);
    let allow = format!("127.0.0.1:{}", srv.port);
    let url = format!("http://127.0.0.1:{}/curl", srv.port);
    let out = run(t.moat([
        "run",
        "--network",
        "proxy",
        "--allow-domain",
        &allow,
        "curl",
        "-sS",
        &url,
    ]));
    out.expect_code(0);
    out.expect_stdout_has(&body);
    assert!(
        srv.connections() >= 1 && srv.requests().iter().any(|r| r.contains("/curl")),
        "the server saw curl's request: {:?}\n{}",
        srv.requests(),
        out.dump()
    );
}

#[test]
fn net_class_in_a_proxy_session_denied_and_connect_tools() {
    let t = Tx::new();
    // An unconfined agent shell with network proxy: the leaf tools it calls
    // keep their own class (curl: net-connect); launchers (sh) have no shim
    // and inherit the session's (issue 10).
    write(
        t.profiles_dir().join("agentsh.toml"),
        "name = \"agentsh\"\nprogram = \"bash\"\nlevel = \"rw\"\nnetwork = \"proxy\"\nnet_class = \"unconfined\"\n",
    );
    let body = unique("sessbody");
    let srv = HttpServer::fixed(&body);
    let allow = format!("127.0.0.1:{}", srv.port);
    let probe = t.fx.w("probe.py");
    write(&probe, SOCK_PROBE);
    let script = format!(
        "echo \"SHIM_SH=$(command -v sh)\"; echo \"SHIM_CURL=$(command -v curl)\"\n\
         /usr/bin/python3 probe.py inet | sed 's/^PROBE inet/PROBE agent_inet/'\n\
         sh -c '/usr/bin/python3 probe.py inet' | sed 's/^PROBE inet/PROBE sh_inet/'\n\
         echo \"CURL_BEFORE=done\"\n\
         curl -sS http://127.0.0.1:{port}/from-session; echo\n",
        port = srv.port
    );
    let out = run(t.moat(["run", "--allow-domain", &allow, "agentsh", "-c", &script]));
    out.expect_code(0);
    assert!(
        out.field("SHIM_SH")
            .is_some_and(|p| !p.is_empty() && !p.starts_with("/moat/shims/")),
        "sh is a launcher: the real sh, no shim\n{}",
        out.dump()
    );
    assert_eq!(
        out.field("SHIM_CURL").as_deref(),
        Some("/moat/shims/curl"),
        "{}",
        out.dump()
    );
    // Positive control: the unconfined session itself may open an inet socket.
    assert_eq!(probe_line(&out, "agent_inet"), "OK", "{}", out.dump());
    // sh inherits the session's class: python started by it may connect.
    let sh = probe_line(&out, "sh_inet");
    assert_eq!(
        sh,
        "OK",
        "python under sh inherits the session\n{}",
        out.dump()
    );
    // curl (net-connect) from the same session reaches the server.
    out.expect_stdout_has(&body);
    assert!(
        srv.requests().iter().any(|r| r.contains("/from-session")),
        "server saw the request of curl from the session: {:?}\n{}",
        srv.requests(),
        out.dump()
    );

    // A net-denied session (built-in bash) stays net-denied for what it
    // starts: a class narrows, never widens, so curl from it cannot connect.
    let before = srv.connections();
    let out = run(t.moat([
        "run",
        "--network",
        "proxy",
        "--allow-domain",
        &allow,
        "bash",
        "-c",
        &format!(
            "/usr/bin/python3 probe.py inet; curl -sS http://127.0.0.1:{}/from-bash; echo curl_rc=$?",
            srv.port
        ),
    ]));
    let b = probe_line(&out, "inet");
    assert!(
        b.starts_with("ERRNO 1 "),
        "bash is net-denied: {b}\n{}",
        out.dump()
    );
    assert!(
        !out.stdout.contains(&body),
        "curl from a net-denied bash must not reach the server\n{}",
        out.dump()
    );
    assert_eq!(
        srv.settled_connections(),
        before,
        "no connection from a net-denied session: {:?}\n{}",
        srv.requests(),
        out.dump()
    );
}

#[test]
fn net_connect_cannot_listen_net_listen_can() {
    let t = Tx::new();
    let pd = t.profiles_dir();
    write(
        pd.join("pyconnect.toml"),
        "name = \"pyconnect\"\nprogram = \"python3\"\nlevel = \"rw\"\nnetwork = \"proxy\"\nnet_class = \"net-connect\"\n",
    );
    write(
        pd.join("pylisten.toml"),
        "name = \"pylisten\"\nprogram = \"python3\"\nlevel = \"rw\"\nnetwork = \"proxy\"\nnet_class = \"net-listen\"\n",
    );
    let probe = t.fx.w("probe.py");
    write(&probe, SOCK_PROBE);
    let body = unique("pcbody");
    let srv = HttpServer::fixed(&body);
    let allow = format!("127.0.0.1:{}", srv.port);
    // net-connect: listen refused (EPERM), bind refused; connecting out
    // through the proxy works (positive control in the same process).
    let code = format!(
        "{SOCK_PROBE}\nimport urllib.request\nprint('BODY', urllib.request.urlopen('http://127.0.0.1:{}/pyconnect', timeout=10).read().decode())\n",
        srv.port
    );
    let out = run(t.moat([
        "run",
        "--allow-domain",
        &allow,
        "pyconnect",
        "-c",
        &code,
        "inet",
        "listen",
        "bind",
    ]));
    assert_eq!(probe_line(&out, "inet"), "OK", "{}", out.dump());
    let l = probe_line(&out, "listen");
    assert!(
        l.starts_with("ERRNO 1 ") && l.contains("Operation not permitted"),
        "net-connect listen must be EPERM, got {l}\n{}",
        out.dump()
    );
    let b = probe_line(&out, "bind");
    assert!(
        b.starts_with("ERRNO "),
        "net-connect bind must be refused, got {b}\n{}",
        out.dump()
    );
    out.expect_stdout_has(&format!("BODY {body}"));
    assert!(
        srv.requests().iter().any(|r| r.contains("/pyconnect")),
        "net-connect reached the server through the proxy\n{}",
        out.dump()
    );
    // net-listen: listen, bind and accept work (positive control).
    let out = run(t.moat([
        "run",
        "pylisten",
        "probe.py",
        "listen",
        "bind",
        "accept_roundtrip",
    ]));
    out.expect_code(0);
    for n in ["listen", "bind", "accept_roundtrip"] {
        assert_eq!(probe_line(&out, n), "OK", "net-listen {n}\n{}", out.dump());
    }
}

/// Writes PROBE lines for an inet socket and a listen() to the file argv[1]
/// (its stdout belongs to git when it runs as an ext:: remote helper).
const FILE_PROBE: &str = r#"
import socket, sys
out = open(sys.argv[1], "w")
def rep(name, f):
    try:
        f()
        out.write("PROBE %s OK\n" % name)
    except OSError as e:
        out.write("PROBE %s ERRNO %d %s\n" % (name, e.errno, e.strerror))
rep("inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
def listen():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.listen(1)
rep("listen", listen)
out.close()
"#;

fn file_probe(p: &Path, name: &str) -> String {
    let text = read(p).unwrap_or_else(|| panic!("probe wrote nothing to {}", p.display()));
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("PROBE {name} ")))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no PROBE {name} in {}: {text}", p.display()))
}

/// Inside an unconfined session, `git fetch` goes through the in-sandbox git
/// shim, which applies its subcommand's class (net-connect): a program git
/// starts (an ext:: remote helper) may open inet sockets but not listen.
#[test]
fn net_connect_shim_inside_a_session_refuses_listen() {
    let t = Tx::new();
    t.git_init_ws();
    write(
        t.profiles_dir().join("agentsh.toml"),
        "name = \"agentsh\"\nprogram = \"bash\"\nlevel = \"rw\"\nnetwork = \"proxy\"\nnet_class = \"unconfined\"\n",
    );
    write(t.fx.w("probe.py"), FILE_PROBE);
    let script = "echo \"GIT=$(command -v git)\"\n\
                  export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=protocol.ext.allow GIT_CONFIG_VALUE_0=always\n\
                  git fetch \"ext::/usr/bin/python3 $PWD/probe.py $PWD/fetch.txt\" >/dev/null 2>&1\n\
                  /usr/bin/python3 probe.py direct.txt\n";
    let out = run(t.moat(["run", "agentsh", "-c", script]));
    out.expect_code(0);
    assert_eq!(
        out.field("GIT").as_deref(),
        Some("/moat/shims/git"),
        "{}",
        out.dump()
    );
    let f = t.fx.w("fetch.txt");
    assert_eq!(
        file_probe(&f, "inet"),
        "OK",
        "git fetch is net-connect: inet sockets allowed\n{}",
        out.dump()
    );
    let l = file_probe(&f, "listen");
    assert!(
        l.starts_with("ERRNO 1 ") && l.contains("Operation not permitted"),
        "listen under the net-connect git fetch must be EPERM, got {l}\n{}",
        out.dump()
    );
    // Control: the same probe straight from the unconfined session.
    let d = t.fx.w("direct.txt");
    assert_eq!(file_probe(&d, "inet"), "OK", "{}", out.dump());
    assert_eq!(file_probe(&d, "listen"), "OK", "{}", out.dump());
}

/// Inside a session, shims for the user's own profiles must behave as on
/// the host: the profile's `program` runs, under the profile's net class.
#[test]
fn in_session_shim_honours_user_profiles() {
    let t = Tx::new();
    let pd = t.profiles_dir();
    write(
        pd.join("agentsh.toml"),
        "name = \"agentsh\"\nprogram = \"bash\"\nlevel = \"rw\"\nnetwork = \"proxy\"\nnet_class = \"unconfined\"\n",
    );
    write(
        pd.join("pyconnect.toml"),
        "name = \"pyconnect\"\nprogram = \"python3\"\nlevel = \"rw\"\nnetwork = \"proxy\"\nnet_class = \"net-connect\"\n",
    );
    write(
        pd.join("python3.toml"),
        "name = \"python3\"\nprogram = \"python3\"\nlevel = \"rw\"\nnetwork = \"proxy\"\nnet_class = \"net-denied\"\n",
    );
    write(t.fx.w("probe.py"), SOCK_PROBE);
    // Control: on the host, both profiles apply their class.
    let host = run(t.moat(["run", "pyconnect", "probe.py", "inet", "listen"]));
    assert_eq!(probe_line(&host, "inet"), "OK", "{}", host.dump());
    assert!(
        probe_line(&host, "listen").starts_with("ERRNO 1 "),
        "{}",
        host.dump()
    );
    let host = run(t.moat(["run", "python3", "probe.py", "inet"]));
    assert!(
        probe_line(&host, "inet").starts_with("ERRNO 1 "),
        "{}",
        host.dump()
    );

    let script = "echo \"PYC=$(command -v pyconnect)\"; echo \"PY3=$(command -v python3)\"\n\
                  pyconnect probe.py inet listen | sed 's/^PROBE /PROBE pyc_/'\n\
                  python3 probe.py inet | sed 's/^PROBE /PROBE py3_/'\n";
    let out = run(t.moat(["run", "agentsh", "-c", script]));
    assert_eq!(
        out.field("PYC").as_deref(),
        Some("/moat/shims/pyconnect"),
        "{}",
        out.dump()
    );
    assert_eq!(
        out.field("PY3").as_deref(),
        Some("/moat/shims/python3"),
        "{}",
        out.dump()
    );
    let res = probe_results(&out);
    let mut bad = Vec::new();
    match res.iter().find(|(n, _)| n == "pyc_listen") {
        Some((_, r)) if r.starts_with("ERRNO 1 ") => {}
        other => bad.push(format!(
            "pyconnect (program python3, net-connect) inside the session: listen gave {other:?}, expected EPERM"
        )),
    }
    match res.iter().find(|(n, _)| n == "py3_inet") {
        Some((_, r)) if r.starts_with("ERRNO 1 ") => {}
        other => bad.push(format!(
            "python3 (user profile, net-denied) inside the session: AF_INET socket gave {other:?}, expected EPERM"
        )),
    }
    assert!(bad.is_empty(), "{bad:#?}\n{}", out.dump());
}

// ------------------------------------------------------------------ 4. shims

#[test]
fn shim_install_dispatch_list_remove() {
    let t = Tx::new();
    t.git_init_ws();
    let untracked = unique("shimfile");
    write(t.fx.w(&untracked), "x\n");
    let d = t.fx.root.join("shims");
    let d2 = t.fx.root.join("shims2");
    let moat_canon = std::fs::canonicalize(moat_bin()).unwrap();

    let out = run(t.moat([
        OsStr::new("shim"),
        OsStr::new("install"),
        OsStr::new("git"),
        OsStr::new("--dir"),
        d.as_os_str(),
    ]));
    out.expect_code(0);
    let link = d.join("git");
    assert_eq!(
        std::fs::read_link(&link)
            .ok()
            .and_then(|p| std::fs::canonicalize(d.join(p)).ok()),
        Some(moat_canon.clone()),
        "D/git is a symlink to moat\n{}",
        out.dump()
    );
    // A second shim dir too: PATH=D:D2:real. Neither may be picked as "the real git".
    run(t.moat([
        OsStr::new("shim"),
        OsStr::new("install"),
        OsStr::new("git"),
        OsStr::new("--dir"),
        d2.as_os_str(),
    ]))
    .expect_code(0);
    let path_var = format!("{}:{}:{HOST_PATH}", d.display(), d2.display());
    let c = t.prog(&link, &path_var, ["status", "--porcelain"]);
    let out = spawn(c).wait_limit(Duration::from_secs(30));
    out.expect_code(0);
    assert!(
        out.stdout.lines().any(|l| l == format!("?? {untracked}")),
        "the shim ran the real git status\n{}",
        out.dump()
    );
    // It really ran sandboxed under the git profile: a write outside the
    // workspace fails (git init of a neighbour), control: inside works.
    let outside_repo = t.fx.outside.join("r");
    let out = run(t.prog(
        &link,
        &path_var,
        [
            OsStr::new("init"),
            OsStr::new("-q"),
            outside_repo.as_os_str(),
        ],
    ));
    assert_ne!(out.code, Some(0), "{}", out.dump());
    assert!(
        !exists(outside_repo.join(".git")),
        "shimmed git wrote outside the workspace\n{}",
        out.dump()
    );

    // Refusals: moat itself, a name without a profile.
    for bad in ["moat", "nosuchtool"] {
        let out = run(t.moat([
            OsStr::new("shim"),
            OsStr::new("install"),
            OsStr::new(bad),
            OsStr::new("--dir"),
            d.as_os_str(),
        ]));
        out.expect_code(125);
        assert_has(&out, bad, "refusal names the tool");
        assert!(
            !exists(d.join(bad)),
            "{bad} shim must not be created\n{}",
            out.dump()
        );
    }
    // A foreign file of a tool's name is neither overwritten nor removed.
    write(d.join("curl"), "#!/bin/sh\necho foreign\n");
    let out = run(t.moat([
        OsStr::new("shim"),
        OsStr::new("install"),
        OsStr::new("curl"),
        OsStr::new("--dir"),
        d.as_os_str(),
    ]));
    out.expect_code(125);
    assert_eq!(
        read(d.join("curl")).as_deref(),
        Some("#!/bin/sh\necho foreign\n")
    );
    let out = run(t.moat([
        OsStr::new("shim"),
        OsStr::new("remove"),
        OsStr::new("curl"),
        OsStr::new("--dir"),
        d.as_os_str(),
    ]));
    out.expect_code(125);
    assert!(
        exists(d.join("curl")),
        "a foreign file must not be removed\n{}",
        out.dump()
    );

    // list shows git only (not the foreign curl).
    let out = run(t.moat([
        OsStr::new("shim"),
        OsStr::new("list"),
        OsStr::new("--dir"),
        d.as_os_str(),
    ]));
    out.expect_code(0);
    let listed: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(listed, vec![link.to_str().unwrap()], "{}", out.dump());

    // remove
    let out = run(t.moat([
        OsStr::new("shim"),
        OsStr::new("remove"),
        OsStr::new("git"),
        OsStr::new("--dir"),
        d.as_os_str(),
    ]));
    out.expect_code(0);
    assert!(!exists(&link), "shim removed\n{}", out.dump());
    let out = run(t.moat([
        OsStr::new("shim"),
        OsStr::new("list"),
        OsStr::new("--dir"),
        d.as_os_str(),
    ]));
    out.expect_code(0);
    assert_eq!(out.stdout.trim(), "", "{}", out.dump());

    // Default directory: ~/.local/bin of the (fake) HOME.
    let out = run(t.moat(["shim", "install", "jq"]));
    out.expect_code(0);
    let jq = t.fx.home.join(".local/bin/jq");
    assert_eq!(
        std::fs::canonicalize(&jq).ok(),
        Some(moat_canon),
        "default shim dir is ~/.local/bin\n{}",
        out.dump()
    );
}

// ------------------------------------------------------------------ 5. MOAT_ARGS

#[test]
fn moat_args_narrow_freely_widen_only_when_granted() {
    let t = Tx::new();
    t.git_init_ws();
    let f = unique("tracked");
    write(t.fx.w(&f), "x\n");
    let d = t.fx.root.join("shims");
    run(t.moat([
        OsStr::new("shim"),
        OsStr::new("install"),
        OsStr::new("git"),
        OsStr::new("--dir"),
        d.as_os_str(),
    ]))
    .expect_code(0);
    let link = d.join("git");
    let path_var = format!("{}:{HOST_PATH}", d.display());
    let index = t.fx.w(".git/index");

    // Narrowing: read-only; `git add` cannot write the index.
    let mut c = t.prog(&link, &path_var, ["add", f.as_str()]);
    c.env("MOAT_ARGS", "--policy read-only");
    let out = run(c);
    assert_ne!(out.code, Some(0), "{}", out.dump());
    assert_has(&out, "Read-only file system", "narrowed to read-only");
    assert!(
        !exists(&index),
        "read-only git add wrote the index\n{}",
        out.dump()
    );
    // Narrowing to read-only still runs read commands.
    let mut c = t.prog(&link, &path_var, ["status", "--porcelain"]);
    c.env("MOAT_ARGS", "--policy read-only");
    let out = run(c);
    out.expect_code(0);
    assert!(out.stdout.contains(&f), "{}", out.dump());

    // Widening: --rw /etc refused; nothing ran.
    let mut c = t.prog(&link, &path_var, ["add", f.as_str()]);
    c.env("MOAT_ARGS", "--rw /etc");
    let out = run(c);
    out.expect_code(125);
    assert_has(&out, "--rw /etc", "the refused grant is named");
    assert_has(&out, "widen", "it says why");
    assert!(
        !exists(&index),
        "git ran despite the refused MOAT_ARGS\n{}",
        out.dump()
    );

    // Control: without MOAT_ARGS, git add writes the index.
    let out = run(t.prog(&link, &path_var, ["add", f.as_str()]));
    out.expect_code(0);
    assert!(exists(&index), "git add wrote the index\n{}", out.dump());

    // Widening to a neighbour dir: refused, then accepted once the user
    // config grants the same path for git.
    let repo = t.fx.outside.join("r1");
    let moat_args = format!("--rw {}", t.fx.outside.display());
    let mut c = t.prog(
        &link,
        &path_var,
        [OsStr::new("init"), OsStr::new("-q"), repo.as_os_str()],
    );
    c.env("MOAT_ARGS", &moat_args);
    let out = run(c);
    out.expect_code(125);
    assert_has(&out, &t.fx.outside.display().to_string(), "names the path");
    assert!(!exists(&repo), "{}", out.dump());
    write(
        t.user_config(),
        &format!("[tools.git]\nrw = [\"{}\"]\n", t.fx.outside.display()),
    );
    let mut c = t.prog(
        &link,
        &path_var,
        [OsStr::new("init"), OsStr::new("-q"), repo.as_os_str()],
    );
    c.env("MOAT_ARGS", &moat_args);
    let out = run(c);
    out.expect_code(0);
    assert!(
        exists(repo.join(".git/HEAD")),
        "granted widening ran\n{}",
        out.dump()
    );
    // Still refused: a widening the config does not grant.
    let mut c = t.prog(&link, &path_var, ["status"]);
    c.env("MOAT_ARGS", "--policy danger-full-access");
    let out = run(c);
    out.expect_code(125);
    assert_has(&out, "danger-full-access", "the refused level is named");
}

#[test]
fn moat_args_domains_and_explicit_flags_win() {
    let t = Tx::new();
    let body = unique("mabody");
    let srv = HttpServer::fixed(&body);
    let allow = format!("127.0.0.1:{}", srv.port);
    let url = format!("http://127.0.0.1:{}/ma", srv.port);
    // Widening curl's (empty) allowlist from MOAT_ARGS: refused, no connection.
    let mut c = t.moat(["run", "curl", "-sS", &url]);
    c.env("MOAT_ARGS", format!("--allow-domain {allow}"));
    let out = run(c);
    out.expect_code(125);
    assert_has(&out, &allow, "the refused domain is named");
    assert_eq!(srv.settled_connections(), 0, "{}", out.dump());
    // The user config grants that host for curl: the same MOAT_ARGS is accepted.
    write(
        t.user_config(),
        &format!("[tools.curl]\nallow_domains = [\"{allow}\"]\n"),
    );
    let mut c = t.moat(["run", "curl", "-sS", &url]);
    c.env("MOAT_ARGS", format!("--allow-domain {allow}"));
    let out = run(c);
    out.expect_code(0);
    out.expect_stdout_has(&body);
    assert!(
        srv.requests().iter().any(|r| r.contains("/ma")),
        "{}",
        out.dump()
    );
    // Narrowing the network from MOAT_ARGS: the granted host is out of reach.
    let before = srv.connections();
    let mut c = t.moat(["run", "curl", "-sS", &url]);
    c.env("MOAT_ARGS", "--network disabled");
    let out = run(c);
    assert_ne!(out.code, Some(0), "{}", out.dump());
    assert_eq!(srv.settled_connections(), before, "{}", out.dump());

    // Explicit flags win over MOAT_ARGS.
    let mut c = t.moat([
        "run",
        "--policy",
        "workspace-write",
        "sh",
        "-c",
        "echo flag > flagwins.txt",
    ]);
    c.env("MOAT_ARGS", "--policy read-only");
    let out = run(c);
    out.expect_code(0);
    assert_eq!(
        read(t.fx.w("flagwins.txt")).as_deref(),
        Some("flag\n"),
        "{}",
        out.dump()
    );
    // ...and MOAT_ARGS alone narrows sh to read-only (control).
    let mut c = t.moat(["run", "sh", "-c", "echo ma > mawins.txt"]);
    c.env("MOAT_ARGS", "--policy read-only");
    let out = run(c);
    assert_ne!(out.code, Some(0), "{}", out.dump());
    assert!(!exists(t.fx.w("mawins.txt")), "{}", out.dump());
}

/// A tool running at level rw in a workspace that contains moat's config and
/// state directories cannot add a profile, edit the user config or the trust
/// store, or plant trust for a project file.
#[test]
fn sandboxed_tool_cannot_edit_profiles_config_or_trust_store() {
    let t = Tx::new();
    write(t.user_config(), "# mine\n");
    std::fs::create_dir_all(t.profiles_dir()).unwrap();
    // A trusted project file, so the trust store exists.
    write(t.fx.w(".moat.toml"), "rw = [\"build\"]\n");
    std::fs::create_dir(t.fx.w("build")).unwrap();
    run(no_tty(t.moat([OsStr::new("trust"), t.fx.ws.as_os_str()]))).expect_code(0);
    let trust_before = read(t.trust_json()).expect("trust.json");
    let script = format!(
        "printf 'name=\"evil\"\\nprogram=\"sh\"\\nlevel=\"rw\"\\n' > {pd}/evil.toml\n\
         echo 'rw = [\"/etc\"]' >> {cfg}\n\
         echo '{{\"version\":1,\"projects\":{{}}}}' > {trust}\n\
         echo 'network = \"proxy\"' >> {pf}\n\
         touch {ran}\n",
        ran = t.fx.w("build/ran").display(),
        pd = t.profiles_dir().display(),
        cfg = t.user_config().display(),
        trust = t.trust_json().display(),
        pf = t.fx.w(".moat.toml").display(),
    );
    // At the workspace root the project file is write-protected.
    let out = run(no_tty(t.moat([
        "run",
        "sh",
        "-c",
        "echo 'network = \"proxy\"' >> .moat.toml; touch build/first",
    ])));
    assert!(
        exists(t.fx.w("build/first")),
        "control: the trusted run ran\n{}",
        out.dump()
    );
    assert_eq!(
        read(t.fx.w(".moat.toml")).as_deref(),
        Some("rw = [\"build\"]\n"),
        "the sandboxed tool edited the workspace's .moat.toml\n{}",
        out.dump()
    );
    // Workspace = the fixture root, which holds the XDG dirs and the project.
    let mut c = t.moat(["run", "sh", "-c", &script]);
    c.current_dir(&t.fx.root);
    let out = run(no_tty(c));
    // (The fixture root has no .moat.toml of its own; the run itself happens.)
    out.expect_code(0);
    assert!(
        exists(t.fx.w("build/ran")),
        "control: the run wrote the workspace\n{}",
        out.dump()
    );
    assert!(
        !exists(t.profiles_dir().join("evil.toml")),
        "{}",
        out.dump()
    );
    assert_eq!(
        read(t.user_config()).as_deref(),
        Some("# mine\n"),
        "{}",
        out.dump()
    );
    assert_eq!(read(t.trust_json()), Some(trust_before), "{}", out.dump());
    let list = run(t.moat(["profile", "list"]));
    assert!(!list.stdout.contains("evil"), "{}", list.dump());
    // The project file below this workspace's root is not write-protected
    // (documented: only at the workspace root), but an edited file is no
    // longer trusted: the next run in that project fails closed.
    if read(t.fx.w(".moat.toml")).as_deref() != Some("rw = [\"build\"]\n") {
        let out = run(no_tty(t.moat(["run", "sh", "-c", "touch build/after"])));
        out.expect_code(125);
        assert!(!exists(t.fx.w("build/after")), "{}", out.dump());
    }
}

// ------------------------------------------------------------------ 6. trust

fn trust_entry(t: &Tx, file: &Path) -> Option<String> {
    let j: Value = serde_json::from_str(&read(t.trust_json())?).expect("trust.json is JSON");
    j["projects"][file.to_str().unwrap()]["sha256"]
        .as_str()
        .map(String::from)
}

#[test]
fn project_trust_prompt_on_a_real_terminal() {
    let t = Tx::new();
    t.git_init_ws();
    std::fs::create_dir(t.fx.w("build")).unwrap();
    let pf = t.fx.w(".moat.toml");
    write(&pf, "rw = [\"build\"]\n");
    let digest1 = sha256_hex(&std::fs::read(&pf).unwrap());
    let sh = |file: &str| t.moat(["run", "sh", "-c", &format!("touch build/{file}")]);

    // 1. answer n: the grants were shown, nothing ran.
    let r = run_on_tty(sh("x"), Some("n"));
    assert!(
        r.asked,
        "moat did not ask\n{}\n{}",
        r.transcript,
        r.out.dump()
    );
    r.out.expect_code(125);
    let build = t.fx.w("build").display().to_string();
    assert!(
        r.transcript.contains(&build) && r.transcript.contains("rw"),
        "the prompt shows the grant (rw {build})\n--- terminal ---\n{}",
        r.transcript
    );
    assert!(
        r.transcript.contains(&digest1),
        "the prompt shows the fingerprint\n{}",
        r.transcript
    );
    assert!(
        !exists(t.fx.w("build/x")),
        "answered n but the command ran\n{}",
        r.out.dump()
    );
    assert_eq!(trust_entry(&t, &pf), None, "n must not be stored");

    // 2. answer y: it ran, and the store records the file's sha256.
    let r = run_on_tty(sh("x"), Some("y"));
    assert!(r.asked, "{}", r.transcript);
    r.out.expect_code(0);
    assert!(
        exists(t.fx.w("build/x")),
        "answered y but nothing ran\n{}",
        r.out.dump()
    );
    assert_eq!(
        trust_entry(&t, &pf).as_deref(),
        Some(format!("sha256:{digest1}").as_str()),
        "trust.json records the digest: {:?}",
        read(t.trust_json())
    );

    // 3. trusted: no question.
    let r = run_on_tty(sh("y"), None);
    r.out.expect_code(0);
    assert!(exists(t.fx.w("build/y")), "{}", r.out.dump());

    // 4. the file changes: asked again (answer n: nothing ran).
    write(&pf, "rw = [\"build\"]\n# changed\n");
    let digest2 = sha256_hex(&std::fs::read(&pf).unwrap());
    let r = run_on_tty(sh("z"), Some("n"));
    assert!(
        r.asked,
        "a changed file must be asked about again\n{}",
        r.out.dump()
    );
    assert!(r.transcript.contains(&digest2), "{}", r.transcript);
    r.out.expect_code(125);
    assert!(!exists(t.fx.w("build/z")), "{}", r.out.dump());

    // 5. no terminal: fail closed, naming `moat trust`.
    let out = run(no_tty(sh("w")));
    out.expect_code(125);
    assert_has(&out, "moat trust", "the fix is named");
    assert!(!exists(t.fx.w("build/w")), "{}", out.dump());

    // 6. moat trust DIR without a terminal, then runs work without one.
    let out = run(no_tty(t.moat([OsStr::new("trust"), t.fx.ws.as_os_str()])));
    out.expect_code(0);
    assert_eq!(
        trust_entry(&t, &pf).as_deref(),
        Some(format!("sha256:{digest2}").as_str()),
        "{}",
        out.dump()
    );
    let out = run(no_tty(sh("w")));
    out.expect_code(0);
    assert!(exists(t.fx.w("build/w")), "{}", out.dump());
    let out = run(t.moat(["trust", "--list"]));
    out.expect_code(0);
    assert!(
        out.stdout.contains(pf.to_str().unwrap()) && out.stdout.contains(&digest2),
        "{}",
        out.dump()
    );

    // 7. moat untrust: gone from the store; runs without a terminal fail again.
    let out = run(t.moat([OsStr::new("untrust"), t.fx.ws.as_os_str()]));
    out.expect_code(0);
    assert_eq!(trust_entry(&t, &pf), None, "{:?}", read(t.trust_json()));
    let out = run(no_tty(sh("v")));
    out.expect_code(125);
    assert!(!exists(t.fx.w("build/v")), "{}", out.dump());
}

// ------------------------------------------------------------------ 7. refused project grants

#[test]
fn project_file_cannot_grant_what_only_the_user_may() {
    let t = Tx::new();
    t.git_init_ws();
    std::fs::create_dir(t.fx.w("build")).unwrap();
    let pf = t.fx.w(".moat.toml");
    let cases: &[(&str, &[&str])] = &[
        ("rw = [\"~/.ssh\"]\n", &["rw", ".ssh"]),
        ("ro = [\"~/.ssh\"]\n", &["ro", ".ssh"]),
        (
            "protected_opt_in = [\"~/.ssh\"]\n",
            &["protected_opt_in", ".ssh"],
        ),
        ("rw = [\"/etc\"]\n", &["rw", "/etc"]),
        ("ro = [\"/etc\"]\n", &["ro", "/etc"]),
        ("rw = [\"../outside\"]\n", &["rw", "outside"]),
        (
            "level = \"danger-full-access\"\n",
            &["level", "danger-full-access"],
        ),
        ("network = \"unmanaged\"\n", &["network", "unmanaged"]),
        ("[tools.sh]\nrw = [\"/etc\"]\n", &["tools.sh.rw", "/etc"]),
        (
            "[tools.sh]\nlevel = \"danger-full-access\"\n",
            &["tools.sh.level", "danger-full-access"],
        ),
    ];
    for (content, names) in cases {
        write(&pf, content);
        let out = run(no_tty(t.moat([OsStr::new("trust"), t.fx.ws.as_os_str()])));
        out.expect_code(125);
        for n in *names {
            assert!(
                out.stderr.contains(n),
                "refusal of {content:?} should name {n:?}\n{}",
                out.dump()
            );
        }
        assert_eq!(
            trust_entry(&t, &pf),
            None,
            "{content:?} was stored as trusted"
        );
        // And a run (on a terminal that would answer y) refuses before asking.
        let marker = unique("m");
        let r = run_on_tty(
            t.moat(["run", "sh", "-c", &format!("touch build/{marker}")]),
            Some("y"),
        );
        r.out.expect_code(125);
        assert!(
            !r.asked,
            "{content:?}: moat offered to trust a refused file\n{}",
            r.transcript
        );
        assert!(
            !exists(t.fx.w(&format!("build/{marker}"))),
            "{content:?}: ran\n{}",
            r.out.dump()
        );
    }
    // Positive control: a grant inside the project is accepted.
    write(&pf, "rw = [\"build\"]\n");
    let out = run(no_tty(t.moat([OsStr::new("trust"), t.fx.ws.as_os_str()])));
    out.expect_code(0);
    assert!(trust_entry(&t, &pf).is_some(), "{}", out.dump());
}

// ------------------------------------------------------------------ 8. mount conflicts

#[test]
fn mount_conflict_names_both_sources() {
    let t = Tx::new();
    t.git_init_ws();
    write(t.fx.home.join(".config/git/ignore"), "[user]\n\tname = x\n");
    // Control: the git profile's ~/.config/git/ignore (ro) alone is fine.
    let out = run(t.moat(["run", "git", "status", "--porcelain"]));
    out.expect_code(0);
    // Profile ro vs flag rw.
    let gc = t.fx.home.join(".config/git/ignore");
    let out = run(t.moat([
        OsStr::new("run"),
        OsStr::new("--rw"),
        gc.as_os_str(),
        OsStr::new("git"),
        OsStr::new("config"),
        OsStr::new("--global"),
        OsStr::new("user.name"),
        OsStr::new("evil"),
    ]));
    out.expect_code(125);
    assert_has(&out, "profile:git", "profile source named");
    assert_has(&out, "flag", "flag source named");
    assert_eq!(
        read(&gc).as_deref(),
        Some("[user]\n\tname = x\n"),
        "{}",
        out.dump()
    );

    // User config ro vs flag rw.
    let shared = t.fx.root.join("shared");
    std::fs::create_dir(&shared).unwrap();
    let touch = format!("touch {}/f", shared.display());
    // Control: the flag alone grants the write.
    let out = run(t.moat([
        OsStr::new("run"),
        OsStr::new("--rw"),
        shared.as_os_str(),
        OsStr::new("sh"),
        OsStr::new("-c"),
        OsStr::new(&touch),
    ]));
    out.expect_code(0);
    assert!(exists(shared.join("f")), "{}", out.dump());
    std::fs::remove_file(shared.join("f")).unwrap();
    write(
        t.user_config(),
        &format!("[tools.sh]\nro = [\"{}\"]\n", shared.display()),
    );
    let out = run(t.moat([
        OsStr::new("run"),
        OsStr::new("--rw"),
        shared.as_os_str(),
        OsStr::new("sh"),
        OsStr::new("-c"),
        OsStr::new(&touch),
    ]));
    out.expect_code(125);
    assert_has(&out, "flag", "flag source named");
    assert_has(
        &out,
        &t.user_config().display().to_string(),
        "config source named",
    );
    assert!(!exists(shared.join("f")), "{}", out.dump());
    std::fs::remove_file(t.user_config()).unwrap();

    // Project file ro vs flag rw.
    std::fs::create_dir(t.fx.w("data")).unwrap();
    let pf = t.fx.w(".moat.toml");
    write(&pf, "ro = [\"data\"]\n");
    run(no_tty(t.moat([OsStr::new("trust"), t.fx.ws.as_os_str()]))).expect_code(0);
    let data = t.fx.w("data");
    let out = run(no_tty(t.moat([
        OsStr::new("run"),
        OsStr::new("--rw"),
        data.as_os_str(),
        OsStr::new("sh"),
        OsStr::new("-c"),
        OsStr::new("touch data/f"),
    ])));
    out.expect_code(125);
    assert_has(&out, "flag", "flag source named");
    assert_has(&out, pf.to_str().unwrap(), "project source named");
    assert!(!exists(t.fx.w("data/f")), "{}", out.dump());
}

// ------------------------------------------------------------------ 9. nested runs

#[test]
fn nested_run_narrows_and_propagates() {
    let t = Tx::new();
    std::fs::create_dir(t.fx.w("sub")).unwrap();
    let ws = t.fx.ws.display().to_string();
    let outside = t.fx.outside.display().to_string();
    let script = format!(
        "/moat/bin/moat exec --policy workspace-contained --cwd sub -- sh -c 'echo nestedx > f; echo inner-out; echo inner-err >&2; exit 4'; echo inner_rc=$?\n\
         moat exec --rw /etc -- true; echo etc_rc=$?\n\
         moat exec --policy workspace-write --rw {outside} -- sh -c 'echo w > {outside}/widened'; echo out_rc=$?\n\
         moat exec --policy workspace-write --no-audit -- sh -c 'echo n > noaudit'; echo noaudit_rc=$?\n\
         (cd /tmp && moat exec --policy workspace-write --cwd {ws} -- sh -c 'echo t > {ws}/fromtmp'); echo tmp_rc=$?\n"
    );
    let out = run(t.moat([
        "exec",
        "--policy",
        "workspace-write",
        "--json",
        "--",
        BASH,
        "-c",
        &script,
    ]));
    out.expect_code(0);
    let j = out.json();
    let so = j["stdout"].as_str().unwrap_or("").to_string();
    let se = j["stderr"].as_str().unwrap_or("").to_string();
    let field = |k: &str| {
        so.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(str::to_string)
    };
    assert_eq!(
        read(t.fx.w("sub/f")).as_deref(),
        Some("nestedx\n"),
        "nested run wrote sub/f on the host\n{}",
        out.dump()
    );
    assert_eq!(
        field("inner_rc").as_deref(),
        Some("4"),
        "exit code propagates\n{}",
        out.dump()
    );
    assert!(
        so.contains("inner-out\n"),
        "nested stdout reaches the outer stdout\n{}",
        out.dump()
    );
    assert!(
        se.contains("inner-err\n"),
        "nested stderr reaches the outer stderr\n{}",
        out.dump()
    );
    assert_eq!(field("etc_rc").as_deref(), Some("125"), "{}", out.dump());
    assert!(
        se.contains("would widen") && se.contains("/etc"),
        "{}",
        out.dump()
    );
    assert_eq!(field("out_rc").as_deref(), Some("125"), "{}", out.dump());
    assert!(
        !exists(t.fx.outside.join("widened")),
        "widening nested run wrote outside\n{}",
        out.dump()
    );
    assert_eq!(
        field("noaudit_rc").as_deref(),
        Some("125"),
        "{}",
        out.dump()
    );
    assert!(!exists(t.fx.w("noaudit")), "{}", out.dump());
    assert_eq!(field("tmp_rc").as_deref(), Some("125"), "{}", out.dump());
    assert!(!exists(t.fx.w("fromtmp")), "{}", out.dump());

    // The nested run is in the audit log with the outer session id.
    let outer_id = j["execution_id"]
        .as_str()
        .expect("execution_id")
        .to_string();
    let log = read(t.audit_log())
        .unwrap_or_else(|| panic!("no audit log at {}", t.audit_log().display()));
    let events: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let outer_session = events
        .iter()
        .find(|e| e["execution_id"] == outer_id.as_str())
        .and_then(|e| e["session_id"].as_str())
        .expect("outer run in the audit log")
        .to_string();
    let nested = events
        .iter()
        .find(|e| {
            e["type"] == "execution.started"
                && e["execution_id"] != outer_id.as_str()
                && e["argv"].to_string().contains("inner-out")
        })
        .unwrap_or_else(|| panic!("nested execution.started not in the audit log\n{log}"));
    assert_eq!(
        nested["session_id"].as_str(),
        Some(outer_session.as_str()),
        "{nested}"
    );
    let nested_id = nested["execution_id"].as_str().unwrap();
    let fin = events
        .iter()
        .find(|e| e["type"] == "execution.finished" && e["execution_id"] == nested_id)
        .unwrap_or_else(|| panic!("nested execution.finished missing\n{log}"));
    assert_eq!(fin["exit_code"], 4, "{fin}");
    let v = run(t.moat([
        OsStr::new("audit"),
        OsStr::new("verify"),
        OsStr::new("--log"),
        t.audit_log().as_os_str(),
    ]));
    v.expect_code(0);
}

#[test]
fn nested_run_cannot_widen_level_or_network() {
    let t = Tx::new();
    // Inside read-only: a nested workspace-write is refused; nested read-only runs.
    let script = "moat exec --policy workspace-write -- sh -c 'echo y > nested_w'; echo ww_rc=$?\n\
                  moat exec --policy read-only -- cat README; echo ro_rc=$?\n";
    let out = run(t.moat(["exec", "--policy", "read-only", "--", BASH, "-c", script]));
    out.expect_code(0);
    assert_eq!(out.field("ww_rc").as_deref(), Some("125"), "{}", out.dump());
    assert!(!exists(t.fx.w("nested_w")), "{}", out.dump());
    assert_has(&out, "would widen", "refusal reason");
    assert_eq!(out.field("ro_rc").as_deref(), Some("0"), "{}", out.dump());
    out.expect_stdout_has("workspace readme");

    // Inside --network disabled: nested unmanaged refused; disabled runs.
    let script = "moat exec --policy workspace-write --network unmanaged -- sh -c 'echo u > nested_u'; echo un_rc=$?\n\
                  moat exec --policy workspace-write --network disabled -- sh -c 'echo d > nested_d'; echo dis_rc=$?\n";
    let out = run(t.moat([
        "exec",
        "--policy",
        "workspace-write",
        "--network",
        "disabled",
        "--",
        BASH,
        "-c",
        script,
    ]));
    out.expect_code(0);
    assert_eq!(out.field("un_rc").as_deref(), Some("125"), "{}", out.dump());
    assert!(!exists(t.fx.w("nested_u")), "{}", out.dump());
    assert_has(&out, "unmanaged", "the refused grant is named");
    assert_eq!(out.field("dis_rc").as_deref(), Some("0"), "{}", out.dump());
    assert_eq!(
        read(t.fx.w("nested_d")).as_deref(),
        Some("d\n"),
        "{}",
        out.dump()
    );

    // Inside workspace-contained: a nested whole-host read is refused.
    let secret_path = t.fx.outside.join("secret").display().to_string();
    let script = format!(
        "moat exec --policy read-only -- cat {secret_path}; echo rd_rc=$?\n\
         moat exec --policy workspace-contained --ro {outside} -- cat {secret_path}; echo ro_rc=$?\n",
        outside = t.fx.outside.display()
    );
    let out = run(t.moat([
        "exec",
        "--policy",
        "workspace-contained",
        "--",
        BASH,
        "-c",
        &script,
    ]));
    out.expect_code(0);
    out.expect_absent(&t.fx.outside_secret, "outside secret via a nested run");
    assert_eq!(out.field("rd_rc").as_deref(), Some("125"), "{}", out.dump());
    assert_eq!(out.field("ro_rc").as_deref(), Some("125"), "{}", out.dump());
}

/// The profiles the issue names by example: python and cargo run in a
/// fixture workspace under their own boundary.
#[test]
fn run_python_and_cargo_under_their_profiles() {
    let t = Tx::new();
    let marker = unique("py");
    let out = run(t.moat([
        "run",
        "python",
        "-c",
        &format!("open('py.txt', 'w').write('{marker}')"),
    ]));
    out.expect_code(0);
    assert_eq!(
        read(t.fx.w("py.txt")).as_deref(),
        Some(marker.as_str()),
        "python wrote the workspace\n{}",
        out.dump()
    );
    // The python profile is net-denied: no inet socket, whatever the session.
    let out = run(t.moat([
        "run",
        "--network",
        "proxy",
        "python",
        "-c",
        "import socket\ntry:\n socket.socket(socket.AF_INET)\n print('SOCKET-OPENED')\nexcept OSError as e:\n print('ERRNO', e.errno)",
    ]));
    assert!(
        out.stdout.contains("ERRNO 1") && !out.stdout.contains("SOCKET-OPENED"),
        "net-denied python opened an inet socket\n{}",
        out.dump()
    );

    // cargo needs the caller's own toolchain; root's rustup is not readable
    // by the unprivileged run, which says so instead of passing vacuously.
    let cargo = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("cargo"))
        .find(|c| {
            std::process::Command::new(c)
                .arg("--version")
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        });
    let Some(cargo) = cargo else {
        println!("SKIP: cargo: no working cargo on this user's PATH");
        return;
    };
    let real_home = std::env::var("HOME").unwrap_or_default();
    let rustup_home =
        std::env::var("RUSTUP_HOME").unwrap_or_else(|_| format!("{real_home}/.rustup"));
    let path_var = format!("{}:{HOST_PATH}", cargo.parent().unwrap().display());
    let mut c = t.moat([
        "run",
        "--env",
        &format!("RUSTUP_HOME={rustup_home}"),
        "cargo",
        "--version",
    ]);
    c.env("PATH", &path_var);
    let out = run(c);
    out.expect_code(0);
    assert!(
        out.stdout.starts_with("cargo "),
        "cargo --version under its profile\n{}",
        out.dump()
    );
}
