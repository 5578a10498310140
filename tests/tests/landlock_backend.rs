//! The Landlock-only backend (`--backend landlock|auto`), run where user
//! namespaces are taken away: moat is started under a seccomp filter that
//! refuses CLONE_NEWUSER (a container's default profile does that), and
//! once inside a child user namespace whose `user.max_user_namespaces` is 0,
//! as root and as an unprivileged user alike. The escape cases
//! that still apply must hold; what the backend cannot give is refused.

use std::ffi::OsString;
use std::process::Command;
use std::time::Duration;

use moat_conformance::*;
use serde_json::Value;

/// A seccomp filter refusing new user namespaces (`unshare`/`clone` with
/// CLONE_NEWUSER: EPERM; `clone3`: ENOSYS so libc falls back to `clone`),
/// like a container's default profile; installed by a tiny Python wrapper
/// that then execs its arguments.
const NO_USERNS_PY: &str = r#"import ctypes, os, struct, sys
def ins(code, jt, jf, k): return struct.pack("HBBI", code, jt, jf, k)
LD, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06
ALLOW, ERRNO = 0x7fff0000, 0x00050000
prog = b"".join([
    ins(LD, 0, 0, 0),                    # syscall number
    ins(JEQ, 3, 0, 272),                 # unshare
    ins(JEQ, 2, 0, 56),                  # clone
    ins(JEQ, 5, 0, 435),                 # clone3
    ins(RET, 0, 0, ALLOW),
    ins(LD, 0, 0, 16),                   # flags (args[0], low word)
    ins(JSET, 0, 1, 0x10000000),         # CLONE_NEWUSER
    ins(RET, 0, 0, ERRNO | 1),
    ins(RET, 0, 0, ALLOW),
    ins(RET, 0, 0, ERRNO | 38),
])
buf = ctypes.create_string_buffer(prog)
class FProg(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fp = FProg(len(prog) // 8, ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fp), 0, 0) != 0:
    sys.exit("seccomp: errno %d" % ctypes.get_errno())
os.execvp(sys.argv[1], sys.argv[1:])
"#;

fn rewrap(cmd: Command, mut w: Command) -> Command {
    w.arg(cmd.get_program())
        .args(cmd.get_args())
        .env_clear()
        .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(std::process::Stdio::null());
    if let Some(d) = cmd.get_current_dir() {
        w.current_dir(d);
    }
    w
}

/// `cmd` under a seccomp filter that refuses new user namespaces.
fn without_userns(fx: &Fixture, cmd: Command) -> Command {
    let script = fx.root.join("no-userns.py");
    if !exists(&script) {
        write(&script, NO_USERNS_PY);
    }
    let mut w = Command::new(PY);
    w.arg(&script);
    rewrap(cmd, w)
}

/// `cmd` inside a child user namespace whose `user.max_user_namespaces` is
/// 0 (moat runs as that namespace's root; host-owned files show as nobody).
fn in_userns_without_more(cmd: Command) -> Command {
    let mut w = Command::new("unshare");
    w.args([
        "-Ur",
        "sh",
        "-c",
        "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"",
        "sh",
    ]);
    rewrap(cmd, w)
}

fn ll_sh(fx: &Fixture, level: &str, extra: &[&str], script: &str) -> Out {
    let mut args = vec!["--backend", "landlock"];
    args.extend_from_slice(extra);
    run(without_userns(fx, fx.sh(level, &args, script)))
}

#[test]
fn namespaces_are_really_gone_in_the_wrappers_positive_control() {
    let fx = Fixture::new();
    let unshare = || {
        let mut c = Command::new("unshare");
        c.args(["-U", "true"]);
        c
    };
    assert_eq!(
        run(unshare()).code,
        Some(0),
        "user namespaces exist on this host"
    );
    let out = run(without_userns(&fx, unshare()));
    assert_ne!(out.code, Some(0), "the seccomp wrapper must take them away");
    let out = run(in_userns_without_more(unshare()));
    assert_ne!(out.code, Some(0), "the sysctl wrapper must take them away");
}

#[test]
fn default_backend_refuses_and_names_the_landlock_option_contract() {
    let fx = Fixture::new();
    let out = run(without_userns(&fx, fx.sh("read-only", &[], "echo RAN")));
    out.expect_code(125)
        .expect_absent("RAN", "a refused run's output");
    assert!(out.stderr.contains("--backend landlock"), "{}", out.dump());
    assert!(out.stderr.contains("seccomp"), "{}", out.dump());
    let out = run(in_userns_without_more(fx.sh(
        "read-only",
        &["--no-audit"],
        "echo RAN",
    )));
    out.expect_code(125)
        .expect_absent("RAN", "a refused run's output");
    assert!(out.stderr.contains("--backend landlock"), "{}", out.dump());
    assert!(out.stderr.contains("max_user_namespaces"), "{}", out.dump());
}

#[test]
fn the_sysctl_way_gets_the_same_backend() {
    // moat is root of a child user namespace here (as root or moat-ci on the
    // host): the audit log's ownership checks see host dirs as nobody, so
    // this run is not audited; the secrets must stay unreadable all the same.
    let fx = Fixture::new();
    let h = fx.home.display();
    let script = format!("echo PROBE-RAN; cat {h}/.ssh/id_rsa; cat {h}/.aws/credentials");
    let out = run(in_userns_without_more(fx.sh(
        "workspace-write",
        &["--no-audit", "--json", "--backend", "auto"],
        &script,
    )));
    let v = out.json();
    assert_eq!(v["sandbox"]["backend"], "landlock", "{}", out.dump());
    let stdout = v["stdout"].as_str().unwrap_or_default();
    assert!(stdout.contains("PROBE-RAN"), "{}", out.dump());
    for s in [&fx.ssh_secret, &fx.aws_secret] {
        assert!(
            !stdout.contains(s.as_str()),
            "a secret leaked\n{}",
            out.dump()
        );
    }
}

#[test]
fn secrets_stay_unreadable_at_every_level() {
    let fx = Fixture::new();
    let tmp_secret = unique("TMPSECRET");
    let host_tmp = std::path::PathBuf::from(format!("/tmp/{}", unique("host-tmp")));
    let _rm = RmOnDrop(host_tmp.clone());
    write(&host_tmp, &tmp_secret);
    write(fx.ws.join(".env"), &fx.env_secret);
    let h = fx.home.display();
    for level in SANDBOXED {
        let script = format!(
            "echo PROBE-RAN; cat {h}/.ssh/id_rsa; cat {h}/.aws/credentials; cat {h}/.config/gh/hosts.yml; \
             cat .env; cat {o}; echo; cat {t}; cat /etc/shadow; echo README=$(cat README)",
            o = fx.outside.join("secret").display(),
            t = host_tmp.display()
        );
        let out = ll_sh(&fx, level, &[], &script);
        out.expect_code(0).expect_stdout_has("PROBE-RAN");
        for s in [&fx.ssh_secret, &fx.aws_secret, &fx.env_secret, &tmp_secret] {
            out.expect_absent(s, &format!("a secret at {level}"));
        }
        assert!(
            out.stderr.contains("Permission denied"),
            "{level}: {}",
            out.dump()
        );
        assert_eq!(
            out.field("README").as_deref(),
            Some("workspace readme"),
            "{level}: the workspace is readable\n{}",
            out.dump()
        );
        if level == "workspace-contained" {
            out.expect_absent(&fx.outside_secret, "outside the workspace at contained");
        }
    }
}

#[test]
fn writes_follow_the_level() {
    let fx = Fixture::new();
    let outside = fx.outside.join("secret");
    for level in SANDBOXED {
        let marker = fx.w(&format!("made-{level}"));
        let script = format!(
            "echo PROBE-RAN; echo x > {m}; echo pwned > {o}; echo tmp > $TMPDIR/t && echo TMP=ok; echo home > $HOME/h && echo HOME=ok",
            m = marker.display(),
            o = outside.display()
        );
        let out = ll_sh(&fx, level, &[], &script);
        out.expect_stdout_has("PROBE-RAN");
        let writable = level != "read-only";
        assert_eq!(
            exists(&marker),
            writable,
            "{level}: workspace write\n{}",
            out.dump()
        );
        assert_eq!(
            read(&outside).as_deref(),
            Some(fx.outside_secret.as_str()),
            "{level}: a host file outside the workspace changed"
        );
        assert_eq!(
            out.field("TMP").as_deref(),
            Some("ok"),
            "{level}: {}",
            out.dump()
        );
        assert_eq!(
            out.field("HOME").as_deref(),
            Some("ok"),
            "{level}: {}",
            out.dump()
        );
    }
}

/// Runs `moat LEAD… -c CODE PORT SOCK` without user namespaces, where PORT
/// is a host TCP listener's and SOCK a host unix socket's path; the
/// output, then how many connections each listener saw.
fn socket_probe(fx: &Fixture, lead: &[&str], code: &str) -> (Out, usize, usize) {
    let (tcp, port) = Listener::tcp();
    let sock = fx.root.join("host.sock");
    let unix = Listener::unix(&sock);
    let mut args: Vec<OsString> = lead.iter().map(OsString::from).collect();
    args.extend([
        "-c".into(),
        code.into(),
        port.to_string().into(),
        sock.into(),
    ]);
    let out = run(without_userns(fx, fx.moat(args)));
    (out, tcp.finish().0, unix.finish().0)
}

#[test]
fn the_network_is_refused_outright() {
    let fx = Fixture::new();
    let code = "import socket, sys\nprint('PROBE-RAN', flush=True)\nfor fam, addr in ((socket.AF_INET, ('127.0.0.1', int(sys.argv[1]))), (socket.AF_UNIX, sys.argv[2])):\n    try:\n        s = socket.socket(fam, socket.SOCK_STREAM)\n        s.connect(addr)\n        print('CONNECTED', fam)\n    except OSError as e:\n        print('REFUSED', fam, e.errno)\n";
    let lead = ["exec", "--backend", "landlock", "--", PY];
    let (out, tcp_seen, unix_seen) = socket_probe(&fx, &lead, code);
    out.expect_stdout_has("PROBE-RAN")
        .expect_absent("CONNECTED", "a connection");
    assert_eq!(out.tagged("REFUSED").len(), 2, "{}", out.dump());
    assert!(
        out.stdout.contains(" 1\n") || out.stdout.contains(" 1"),
        "EPERM\n{}",
        out.dump()
    );
    assert_eq!(tcp_seen, 0, "the TCP listener saw a connection");
    assert_eq!(unix_seen, 0, "the host unix socket saw a connection");
    // What cannot be made sound without a network namespace is refused.
    for extra in [
        &["--network", "proxy", "--allow-domain", "example.com"][..],
        &["--network", "unmanaged"][..],
    ] {
        let out = ll_sh(&fx, "workspace-write", extra, "echo RAN");
        out.expect_code(125)
            .expect_absent("RAN", "a refused run's output");
        assert!(out.stderr.contains("Landlock backend"), "{}", out.dump());
    }
}

/// A tool's network class narrows the backend's refusal, never reopens it:
/// `moat run python3` (its profile has the network disabled, so the
/// `net-denied` class: inet, inet6 and packet refused) on the Landlock
/// backend once refused only those three families, and a unix socket on
/// the host (docker.sock, a session bus) was reachable.
#[test]
fn a_tools_network_class_does_not_reopen_sockets() {
    let fx = Fixture::new();
    let code = "import socket, sys\nprint('PROBE-RAN', flush=True)\nfor fam, addr in ((socket.AF_INET, ('127.0.0.1', int(sys.argv[1]))), (socket.AF_UNIX, sys.argv[2]), (socket.AF_NETLINK, None)):\n    try:\n        s = socket.socket(fam, socket.SOCK_STREAM if fam != socket.AF_NETLINK else socket.SOCK_RAW)\n        if addr is not None:\n            s.connect(addr)\n        print('CONNECTED', fam)\n    except OSError as e:\n        print('REFUSED', fam, e.errno)\n";
    let lead = ["run", "--backend", "landlock", "python3"];
    let (out, tcp_seen, unix_seen) = socket_probe(&fx, &lead, code);
    out.expect_stdout_has("PROBE-RAN")
        .expect_absent("CONNECTED", "a socket opened or connected");
    assert_eq!(out.tagged("REFUSED").len(), 3, "{}", out.dump());
    for line in out.tagged("REFUSED") {
        assert!(line.ends_with(" 1"), "not EPERM: {line}\n{}", out.dump());
    }
    assert_eq!(tcp_seen, 0, "the TCP listener saw a connection");
    assert_eq!(unix_seen, 0, "the host unix socket saw a connection");
}

#[test]
fn host_processes_cannot_be_signalled() {
    let fx = Fixture::new();
    let marker = unique("llvictim");
    let _g = MarkerGuard(marker.clone());
    let mut victim = std::process::Command::new(BASH)
        .args(["-c", &format!("exec -a {marker} sleep 60")])
        .spawn()
        .unwrap();
    assert!(wait_for_proc(&marker, Duration::from_secs(5)));
    // The wrapper's user namespace shows host pids unchanged (no pid namespace).
    let script = format!("echo PROBE-RAN; kill -9 {} && echo KILLED", victim.id());
    let out = ll_sh(&fx, "workspace-write", &[], &script);
    out.expect_stdout_has("PROBE-RAN")
        .expect_absent("KILLED", "a kill");
    assert!(
        matches!(victim.try_wait(), Ok(None)),
        "the host process died: {}",
        out.dump()
    );
    let _ = victim.kill();
    let _ = victim.wait();
}

#[test]
fn results_events_and_audit_say_which_backend_ran() {
    let fx = Fixture::new();
    let log = fx.root.join("audit.jsonl");
    let out = ll_sh(
        &fx,
        "read-only",
        &["--json", "--audit-log", log.to_str().unwrap_or_default()],
        "echo HI",
    );
    out.expect_code(0);
    let v = out.json();
    assert_eq!(v["sandbox"]["backend"], "landlock", "{}", out.dump());
    assert_eq!(v["sandbox"]["layers"]["namespaces"], "none");
    assert_eq!(v["sandbox"]["layers"]["landlock"], "full");
    assert_eq!(v["sandbox"]["layers"]["seccomp"], "full");
    assert!(v["sandbox"]["not_given"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
    let rec: Value = read(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "execution.finished")
        .unwrap_or_default();
    assert_eq!(rec["backend"], "landlock", "audit record: {rec}");
    assert_eq!(rec["layers"]["namespaces"], "none");
    // auto: landlock here, namespaces where they exist.
    let out = run(without_userns(
        &fx,
        fx.sh("read-only", &["--json", "--backend", "auto"], "true"),
    ));
    assert_eq!(
        out.json()["sandbox"]["backend"],
        "landlock",
        "{}",
        out.dump()
    );
    let out = run(fx.sh("read-only", &["--json", "--backend", "auto"], "true"));
    assert_eq!(
        out.json()["sandbox"]["backend"],
        "namespaces",
        "{}",
        out.dump()
    );
    // The scratch directory is gone after the run.
    let scratch = std::env::temp_dir().join(format!(
        "moat-run-{}",
        v["execution_id"].as_str().unwrap_or("x").replace('_', "-")
    ));
    assert!(!exists(&scratch), "{} left behind", scratch.display());
}

#[test]
fn capabilities_report_which_backend_gives_what_contract() {
    let fx = Fixture::new();
    let out = run(without_userns(&fx, fx.moat(["capabilities"])));
    out.expect_code(0);
    let v = out.json();
    for level in SANDBOXED {
        let cell = &v["backends"][level]["disabled"];
        assert_eq!(cell["landlock"], "supported", "{level}: {cell}");
        assert!(
            cell["namespaces"]
                .as_str()
                .unwrap_or("")
                .starts_with("unsupported"),
            "{level}: {cell}"
        );
        for mode in ["proxy", "unmanaged"] {
            let cell = &v["backends"][level][mode];
            assert!(
                cell["landlock"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("unsupported"),
                "{level} {mode}: {cell}"
            );
        }
    }
    assert!(v["landlock_backend_cannot_give"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
}
