//! Process family: pid namespace view, process-tree cleanup (daemons,
//! grandchildren at timeout), seccomp refusal of ptrace & co, TIOCSTI, and
//! kernel sysctl writes.

use std::time::Duration;

use moat_conformance::*;

fn marker_cmd(marker: &str) -> String {
    format!("bash -c 'exec -a {marker} sleep 300'")
}

/// Shell that waits (on events, not a fixed sleep) until a process whose
/// argv[0] is `marker` runs in the sandbox's pid namespace (then prints
/// STARTED) and until the host has seen it too (the test creates
/// `host-saw` in the workspace, see `host_saw`).
fn wait_started(marker: &str) -> String {
    format!(
        "until cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -qx {marker}; do sleep 0.01; done; echo STARTED; \
         until [ -e host-saw ]; do sleep 0.01; done"
    )
}

/// Wait (hang guard only) for the marker process on the host, then release
/// the script waiting in `wait_started`. Returns whether it was seen.
fn host_saw(fx: &Fixture, marker: &str) -> bool {
    let seen = wait_for_proc(marker, Duration::from_secs(30));
    write(fx.w("host-saw"), "");
    seen
}

#[test]
fn command_is_pid_2_in_own_pid_namespace() {
    let fx = Fixture::new();
    // A host process with a unique argv[0]: it must not be visible in the
    // sandbox's /proc (positive control: it is under danger-full-access).
    let marker = unique("hostproc");
    let _g = MarkerGuard(marker.clone());
    let mut host = std::process::Command::new(BASH)
        .args(["-c", &format!("exec -a {marker} sleep 60")])
        .spawn()
        .unwrap();
    assert!(
        wait_for_proc(&marker, Duration::from_secs(30)),
        "host marker process not started"
    );
    let script = format!(
        "echo PID=$$; echo PPID=$PPID; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -c '^{marker} ' | sed 's/^/SEEN=/'"
    );
    for level in SANDBOXED {
        let out = run(fx.sh(level, &[], &script));
        assert_eq!(
            out.field("PID").as_deref(),
            Some("2"),
            "command should be pid 2 at {level}\n{}",
            out.dump()
        );
        assert_eq!(
            out.field("PPID").as_deref(),
            Some("1"),
            "moat init should be pid 1 at {level}\n{}",
            out.dump()
        );
        assert_eq!(
            out.field("SEEN").as_deref(),
            Some("0"),
            "host process visible in /proc at {level}\n{}",
            out.dump()
        );
    }
    let out = run(fx.sh("danger-full-access", &[], &script));
    assert_eq!(
        out.field("SEEN").as_deref(),
        Some("1"),
        "control: host process should be visible under danger-full-access\n{}",
        out.dump()
    );
    let _ = host.kill();
    let _ = host.wait();
}

#[test]
fn daemon_is_gone_after_exit_at_every_level() {
    for level in ALL_LEVELS {
        let fx = Fixture::new();
        let marker = unique("daemon");
        let _g = MarkerGuard(marker.clone());
        let script = format!(
            "setsid nohup {} >/dev/null 2>&1 </dev/null & disown; {}; echo LAUNCHED",
            marker_cmd(&marker),
            wait_started(&marker)
        );
        let r = spawn(fx.sh(level, &[], &script));
        // Positive control: the daemon is visible from the host while moat runs.
        let seen = host_saw(&fx, &marker);
        let out = r.wait();
        out.expect_code(0)
            .expect_stdout_has("STARTED")
            .expect_stdout_has("LAUNCHED");
        assert!(
            seen,
            "daemon never observed running at {level} (harness cannot see it)\n{}",
            out.dump()
        );
        let left = wait_gone(&marker, Duration::from_secs(10));
        assert!(
            left.is_empty(),
            "daemon survived moat exit at {level}: pids {left:?}\n{}",
            out.dump()
        );
    }
}

#[test]
fn timeout_kills_grandchildren_at_every_level_contract() {
    for level in ALL_LEVELS {
        let fx = Fixture::new();
        let marker = unique("grandchild");
        let _g = MarkerGuard(marker.clone());
        // The grandchild is orphaned (subshell exits) and holds stdout/stderr.
        // The script waits until the host has seen it; the timeout only has
        // to outlast that handshake (it is no timing claim).
        let script = format!(
            "( {} & ); {}; sleep 300",
            marker_cmd(&marker),
            wait_started(&marker)
        );
        let r = spawn(fx.sh(level, &["--timeout", "5s"], &script));
        let seen = host_saw(&fx, &marker);
        let out = r.wait_limit(Duration::from_secs(60));
        assert!(seen, "grandchild never observed at {level}\n{}", out.dump());
        out.expect_code(124).expect_stdout_has("STARTED");
        assert!(
            out.pipes_closed,
            "stdout/stderr still held open after moat exited at {level}\n{}",
            out.dump()
        );
        let left = wait_gone(&marker, Duration::from_secs(10));
        assert!(
            left.is_empty(),
            "grandchild survived --timeout at {level}: pids {left:?}\n{}",
            out.dump()
        );
    }
}

#[test]
fn timeout_json_reports_timed_out() {
    let fx = Fixture::new();
    let marker = unique("jsontimeout");
    let _g = MarkerGuard(marker.clone());
    let out = spawn(fx.sh(
        "workspace-write",
        &["--timeout", "1s", "--json"],
        &format!("( {} & ); sleep 300", marker_cmd(&marker)),
    ))
    .wait_limit(Duration::from_secs(40));
    out.expect_code(124);
    let j = out.json();
    assert_eq!(j["timed_out"], serde_json::json!(true), "{}", out.dump());
    assert_eq!(
        j["status"],
        serde_json::json!("timed_out"),
        "{}",
        out.dump()
    );
    assert!(
        wait_gone(&marker, Duration::from_secs(10)).is_empty(),
        "grandchild survived"
    );
}

#[test]
fn background_children_killed_on_normal_exit() {
    // A plain `&` child (not setsid) left behind when the command exits.
    for level in ALL_LEVELS {
        let fx = Fixture::new();
        let marker = unique("bgchild");
        let _g = MarkerGuard(marker.clone());
        let r = spawn(fx.sh(
            level,
            &[],
            &format!(
                "{} >/dev/null 2>&1 & {}; exit 3",
                marker_cmd(&marker),
                wait_started(&marker)
            ),
        ));
        let seen = host_saw(&fx, &marker);
        let out = r.wait();
        out.expect_code(3).expect_stdout_has("STARTED");
        assert!(seen, "child never observed at {level}");
        let left = wait_gone(&marker, Duration::from_secs(10));
        assert!(
            left.is_empty(),
            "background child survived at {level}: {left:?}\n{}",
            out.dump()
        );
    }
}

const SECCOMP_PROBE: &str = r#"
import ctypes, os, sys, time, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def rep(name, r):
    e = ctypes.get_errno()
    print("PROBE", name, ("OK %d" % r) if r >= 0 else ("ERRNO %d" % e), flush=True)
def sc(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    rep(name, r)
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
ctypes.set_errno(0)
rep("ptrace_attach_child", libc.ptrace(16, child, None, None))
host = int(sys.argv[1])
ctypes.set_errno(0)
rep("ptrace_attach_host", libc.ptrace(16, host, None, None))
sc("process_vm_readv", 310, child, 0, 0, 0, 0, 0)
sc("process_vm_writev", 311, child, 0, 0, 0, 0, 0)
sc("perf_event_open", 298, 0, 0, -1, -1, 0)
sc("bpf", 321, 0, 0, 0)
sc("userfaultfd", 323, 0o2000000 | 1)
sc("keyctl", 250, 0, -2, 1)
sc("add_key", 248, 0, 0, 0, 0, 0)
sc("io_uring_setup", 425, 1, 0)
sc("mount", 165, 0, 0, 0, 0, 0)
sc("umount2", 166, 0, 0)
sc("unshare_user", 272, 0x10000000)
sc("unshare_ns", 272, 0x00020000)
sc("setns", 308, -1, 0)
sc("pivot_root", 155, 0, 0)
sc("open_tree", 428, -100, 0, 0)
sc("fsopen", 430, 0, 0)
os.kill(child, 9)
os.waitpid(child, 0)
"#;

#[test]
fn seccomp_refuses_ptrace_and_friends() {
    if std::env::consts::ARCH != "x86_64" {
        skip("seccomp probe uses x86_64 syscall numbers");
        return;
    }
    // Positive control: without moat, attaching to an own child works here
    // (no Yama), so an EPERM below comes from the sandbox.
    let host = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let hpid = host.id() as i32;
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _reap = Reap(host);
    let mut ctl = std::process::Command::new(PY);
    ctl.args(["-c", SECCOMP_PROBE, "1"]).env_clear();
    let ctl = run(ctl);
    let ctl_res = probe_results(&ctl);
    let attach = ctl_res
        .iter()
        .find(|(n, _)| n == "ptrace_attach_child")
        .map(|(_, r)| r.clone());
    assert!(
        attach.as_deref().is_some_and(|r| r.starts_with("OK")),
        "control: ptrace of own child should work outside\n{}",
        ctl.dump()
    );

    let fx = Fixture::new();
    for level in SANDBOXED {
        let out = run(fx.py(level, &[], SECCOMP_PROBE, &[&hpid.to_string()]));
        expect_probe_errno(
            &out,
            &[
                "ptrace_attach_child",
                "ptrace_attach_host",
                "process_vm_readv",
                "process_vm_writev",
                "perf_event_open",
                "bpf",
                "userfaultfd",
                "keyctl",
                "add_key",
                "io_uring_setup",
                "mount",
                "umount2",
                "unshare_user",
                "unshare_ns",
                "setns",
                "pivot_root",
                "open_tree",
                "fsopen",
            ],
            libc::EPERM,
        );
        let status = std::fs::read_to_string(format!("/proc/{hpid}/status")).unwrap();
        let tracer = status
            .lines()
            .find(|l| l.starts_with("TracerPid:"))
            .unwrap_or("");
        assert_eq!(
            tracer.split_whitespace().nth(1),
            Some("0"),
            "host process got traced at {level}: {tracer}"
        );
    }
}

#[test]
fn nested_user_namespace_tools_fail() {
    let fx = Fixture::new();
    for level in SANDBOXED {
        let out = run(fx.sh(
            level,
            &[],
            "unshare -U true && echo UNSHARE_OK; unshare -r id -u && echo UNSHARE_R_OK; echo END",
        ));
        out.expect_stdout_has("END");
        assert!(
            !out.stdout.contains("UNSHARE_OK") && !out.stdout.contains("UNSHARE_R_OK"),
            "nested unshare worked at {level}\n{}",
            out.dump()
        );
    }
}

const TIOCSTI_PROBE: &str = r#"
import fcntl, termios, os, sys
def t(name, req, arg):
    try:
        fcntl.ioctl(0, req, arg)
        print("PROBE", name, "OK", flush=True)
    except OSError as e:
        print("PROBE", name, "ERRNO", e.errno, flush=True)
print("ISATTY", os.isatty(0), flush=True)
t("tiocsti", termios.TIOCSTI, b"Q")
t("tiocsti2", termios.TIOCSTI, b"Z")
t("tioclinux", 0x541C, bytes([2]) + bytes(31))
"#;

#[test]
fn tiocsti_is_refused_on_a_real_pty() {
    // Positive control: outside moat, as session leader with the pty as its
    // controlling terminal, TIOCSTI injects (when the kernel allows legacy
    // TIOCSTI or we are root).
    let legacy = read("/proc/sys/dev/tty/legacy_tiocsti")
        .map(|s| s.trim() == "1")
        .unwrap_or(true);
    {
        let pty = Pty::open();
        let mut c = std::process::Command::new(PY);
        c.args(["-c", TIOCSTI_PROBE]).env_clear();
        pty.attach(&mut c);
        let ctl = run(c);
        let (m, s) = pty.pending();
        let injected = m.contains(&b'Q') || s.contains(&b'Q');
        if legacy || euid() == 0 {
            assert!(
                ctl.stdout.contains("PROBE tiocsti OK") && injected,
                "control: TIOCSTI should work outside\n{}",
                ctl.dump()
            );
        } else {
            println!("note: legacy TIOCSTI disabled for non-root; control not applicable");
        }
    }
    let fx = Fixture::new();
    for level in SANDBOXED {
        let pty = Pty::open();
        let mut c = fx.py(level, &[], TIOCSTI_PROBE, &[]);
        pty.attach(&mut c);
        let out = run(c);
        let (m, s) = pty.pending();
        assert!(
            out.stdout.contains("ISATTY True"),
            "stdin should be the pty at {level}\n{}",
            out.dump()
        );
        expect_probe_errno(&out, &["tiocsti", "tiocsti2", "tioclinux"], libc::EPERM);
        assert!(
            !m.contains(&b'Q') && !s.contains(&b'Q') && !m.contains(&b'Z') && !s.contains(&b'Z'),
            "TIOCSTI injected bytes at {level}: master={m:?} slave={s:?}\n{}",
            out.dump()
        );
    }
}

struct SysctlRestore(Vec<(String, String)>);
impl Drop for SysctlRestore {
    fn drop(&mut self) {
        for (p, v) in &self.0 {
            if read(p).as_deref().map(str::trim) != Some(v.trim()) {
                let _ = std::fs::write(p, v);
            }
        }
    }
}

#[test]
fn proc_sys_writes_fail_and_host_unchanged() {
    let files = [
        "/proc/sys/kernel/hostname",
        "/proc/sys/kernel/domainname",
        "/proc/sys/kernel/printk_ratelimit_burst",
        "/proc/sys/vm/max_map_count",
    ];
    let before: Vec<(String, String)> = files
        .iter()
        .map(|p| (p.to_string(), read(p).unwrap_or_default()))
        .collect();
    let _restore = SysctlRestore(before.clone());
    let fx = Fixture::new();
    let script = "for f in kernel/hostname kernel/domainname; do { echo moatevil > /proc/sys/$f; } 2>/dev/null && echo WROTE:$f; done; \
                  { echo 123 > /proc/sys/kernel/printk_ratelimit_burst; } 2>/dev/null && echo WROTE:kernel/printk_ratelimit_burst; \
                  { echo 65531 > /proc/sys/vm/max_map_count; } 2>/dev/null && echo WROTE:vm/max_map_count; \
                  { echo h > /proc/sysrq-trigger; } 2>/dev/null && echo WROTE:sysrq; echo END";
    for level in SANDBOXED {
        let out = run(fx.sh(level, &[], script));
        out.expect_stdout_has("END");
        let after: Vec<(String, String)> = files
            .iter()
            .map(|p| (p.to_string(), read(p).unwrap_or_default()))
            .collect();
        assert_eq!(
            before,
            after,
            "host sysctls changed by a {level} sandbox (uid {})\n{}",
            euid(),
            out.dump()
        );
        let wrote = out.tagged("WROTE:");
        assert!(
            wrote.is_empty(),
            "sysctl writes succeeded inside {level}: {wrote:?}\n{}",
            out.dump()
        );
    }
}
