//! The hand-written seccomp ABI guard (`SYSCALL_ABI_GUARD` in
//! crates/linux/src/sys.rs) and the seccomp floor (`SECCOMP_FLOOR`,
//! `DENIED_IOCTLS` in crates/linux/src/confine.rs), probed from inside the
//! sandbox at every sandboxed level: x32 syscalls refused with EPERM, a
//! foreign-ABI syscall (i386 `int $0x80`) kills the process with SIGSYS,
//! `clone`/`unshare` with each `CLONE_NEW*` bit refused while plain fork and
//! clone work, `clone3` answered ENOSYS, and every floor entry answered
//! EPERM where the kernel itself would answer something else. Also the
//! sweep's quarantine name (`NAME.moat-quarantine-<execution id>`) and its
//! `swept` report in `--json`.
//!
//! Each probe prints `PROBE name RESULT` per attempt (with the errno), and
//! every expected refusal is one the kernel would not give by itself (the
//! arguments are chosen so, and an unsandboxed control run of the same probe
//! checks it), so each case fails against a moat that confines nothing.

use moat_conformance::*;

/// Prints `PROBE name OK n` / `PROBE name ERRNO e` for raw syscalls.
const PRELUDE: &str = r#"
import ctypes, os, sys, mmap
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def rep(name, r):
    e = ctypes.get_errno()
    print("PROBE", name, ("OK %d" % r) if r >= 0 else ("ERRNO %d" % e), flush=True)
def sc(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    rep(name, r)
    return r
"#;

/// x32 and i386 syscall ABIs, with native positive controls.
const ABI_PROBE: &str = r#"
sc("getpid", 39)
sc("x32_getpid", 0x40000000 | 39)
sc("x32_getuid", 0x40000000 | 102)
sc("x32_unshare_user", 0x40000000 | 272, 0x10000000)
# i386 getpid (20) through int $0x80, in a child: the guard kills the
# process that makes it, so what follows the call must never print.
child = os.fork()
if child == 0:
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")  # mov eax,20; int 0x80; ret
    f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
    print("PROBE int80_ready OK 0", flush=True)
    r = f()
    print("PROBE int80_getpid OK %d" % r, flush=True)
    os._exit(0)
_, st = os.waitpid(child, 0)
if os.WIFSIGNALED(st):
    print("PROBE int80_child SIGNAL %d" % os.WTERMSIG(st), flush=True)
else:
    print("PROBE int80_child EXIT %d" % os.WEXITSTATUS(st), flush=True)
print("PROBE abi_end OK 0", flush=True)
"#;

/// The CLONE_NEW* bits (CLONE_NEWTIME is 0x80, which clone(2) reads as part
/// of the exit signal, so it is tried with unshare only).
const NS_FLAGS: [(&str, u64); 8] = [
    ("newns", 0x0002_0000),
    ("newcgroup", 0x0200_0000),
    ("newuts", 0x0400_0000),
    ("newipc", 0x0800_0000),
    ("newuser", 0x1000_0000),
    ("newpid", 0x2000_0000),
    ("newnet", 0x4000_0000),
    ("newtime", 0x80),
];

/// `unshare` and raw `clone` with each namespace bit, each bit together
/// with CLONE_NEWUSER (which gives the caller every capability in the new
/// namespace, so the kernel itself would not refuse the other bit), and
/// the positive controls: fork, clone without namespace bits, unshare of
/// non-namespace state. Attempts run in forked children so that a success
/// (no sandbox) changes nothing for the next one.
const NS_PROBE: &str = r#"
import json
flags = json.loads(sys.argv[1])
SIGCHLD = 17
def attempt(name, nr, arg):
    pid = os.fork()
    if pid == 0:
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(nr), ctypes.c_long(arg), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
        if r == 0 and nr == 56:
            os._exit(0)          # the clone child
        rep(name, r)
        if r > 0:
            os.waitpid(r, 0)
        os._exit(0)
    os.waitpid(pid, 0)
for name, bit in flags:
    attempt("unshare_" + name, 272, bit)
    attempt("unshare_user_" + name, 272, bit | 0x10000000)
    if bit != 0x80:
        attempt("clone_" + name, 56, bit | SIGCHLD)
        attempt("clone_user_" + name, 56, bit | 0x10000000 | SIGCHLD)
attempt("clone_plain", 56, SIGCHLD)
attempt("unshare_files", 272, 0x400)
pid = os.fork()
if pid == 0:
    os._exit(7)
_, st = os.waitpid(pid, 0)
print("PROBE fork", "OK %d" % os.WEXITSTATUS(st), flush=True)
# clone3 with a zero size: the kernel says EINVAL, the guard ENOSYS first.
sc("clone3", 435, 0, 0)
print("PROBE ns_end OK 0", flush=True)
"#;

/// Every floor entry and denied ioctl, with arguments the kernel would
/// reject with something other than EPERM when it may (bad fds, NULL
/// pointers, invalid flags, a bad reboot magic: harmless even when run
/// unsandboxed as root). Runs in a new session so vhangup has no terminal.
const FLOOR_PROBE: &str = r#"
import fcntl, termios
child = os.fork()
if child:
    os.waitpid(child, 0)
    print("PROBE floor_end OK 0", flush=True)
    sys.exit(0)
os.setsid()
root = ctypes.c_char_p(b"/")
slash = ctypes.cast(root, ctypes.c_void_p).value
nope = ctypes.c_char_p(b"/nonexistent-moat-probe/x")
nope_p = ctypes.cast(nope, ctypes.c_void_p).value
sib = os.fork()
if sib == 0:
    import time
    time.sleep(60)
    os._exit(0)
sc("ptrace", 101, 16, sib, 0, 0)                   # PTRACE_ATTACH own child
sc("process_vm_readv", 310, sib, 0, 0, 0, 0, 0)
sc("process_vm_writev", 311, sib, 0, 0, 0, 0, 0)
sc("bpf", 321, 0xffff, 0, 0)
sc("perf_event_open", 298, 0, 0, -1, -1, 0)
sc("userfaultfd", 323, 0o2000000 | 1)
sc("keyctl", 250, 0, -2, 1)
sc("add_key", 248, 0, 0, 0, 0, 0)
sc("request_key", 249, 0, 0, 0, 0)
sc("io_uring_setup", 425, 1, 0)
sc("io_uring_enter", 426, -1, 0, 0, 0, 0, 0)
sc("io_uring_register", 427, -1, 0, 0, 0)
sc("mount", 165, 0, 0, 0, 0, 0)
sc("umount2", 166, 0, 0)
sc("pivot_root", 155, 0, 0)
sc("move_mount", 429, -1, 0, -1, 0, 0xffffffff)
sc("open_tree", 428, -1, 0, 0xffffffff)
sc("open_tree_attr", 467, -1, 0, 0xffffffff, 0, 0)
sc("fsopen", 430, 0, 0)
sc("fsconfig", 431, -1, 0xff, 0, 0, 0)
sc("fsmount", 432, -1, 0xffffffff, 0)
sc("fspick", 433, -1, 0, 0xffffffff)
sc("mount_setattr", 442, -1, 0, 0xffffffff, 0, 0)
sc("setns", 308, -1, 0)
sc("kexec_load", 246, 0, 0xffff, 0, 0xffff0000)
sc("kexec_file_load", 320, -1, -1, 0, 0, 0xffffffff)
sc("init_module", 175, 0, 0, 0)
sc("finit_module", 313, -1, 0, 0)
sc("delete_module", 176, 0, 0)
sc("open_by_handle_at", 304, -1, 0, 0)
sc("name_to_handle_at", 303, -100, slash, 0, 0, 0)
sc("chroot", 161, 0)
sc("acct", 163, nope_p)
sc("swapon", 167, 0, 0)
sc("swapoff", 168, 0)
sc("reboot", 169, 0, 0, 0, 0)                     # bad magic: EINVAL even as root
sc("quotactl", 179, 0, 0, 0, 0)
sc("syslog", 103, 10, 0, 0)                       # SYSLOG_ACTION_SIZE_BUFFER
sc("personality", 135, 0xffffffff)                # query only
sc("landlock_create_ruleset", 444, 0, 0, 1)       # ABI version query
sc("landlock_add_rule", 445, -1, 1, 0, 0)
sc("landlock_restrict_self", 446, -1, 0)
sc("pidfd_getfd", 438, -1, 0, 0)
sc("kcmp", 312, os.getpid(), os.getpid(), 0, 0, 0)
sc("lookup_dcookie", 212, 0, 0, 0)
sc("fanotify_init", 300, 0xffffffff, 0)
sc("vhangup", 153)
null = os.open("/dev/null", os.O_RDWR)
buf = ctypes.create_string_buffer(8)
for name, req in (("TIOCSTI", termios.TIOCSTI), ("TIOCLINUX", 0x541C), ("TIOCSETD", termios.TIOCSETD)):
    ctypes.set_errno(0)
    libc.ioctl.restype = ctypes.c_int
    rep("ioctl_" + name, libc.ioctl(ctypes.c_int(null), ctypes.c_ulong(req), buf))
os.kill(sib, 9)
os.waitpid(sib, 0)
os._exit(0)
"#;

/// Every name the floor probe tries: the whole of `SECCOMP_FLOOR` and
/// `DENIED_IOCTLS` (a review adding an entry there adds it here).
const FLOOR_NAMES: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
    "name_to_handle_at",
    "chroot",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "quotactl",
    "syslog",
    "personality",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
    "pidfd_getfd",
    "kcmp",
    "lookup_dcookie",
    "fanotify_init",
    "vhangup",
    "ioctl_TIOCSTI",
    "ioctl_TIOCLINUX",
    "ioctl_TIOCSETD",
];

fn x86_64_only() -> bool {
    if std::env::consts::ARCH != "x86_64" {
        skip("the guard probes use x86_64 syscall numbers and machine code");
        return false;
    }
    true
}

fn result<'a>(res: &'a [(String, String)], name: &str) -> Option<&'a str> {
    res.iter().find(|(n, _)| n == name).map(|(_, r)| r.as_str())
}

/// Runs `code` (after the prelude) directly, without moat: the control.
fn unsandboxed(code: &str, args: &[&str]) -> Out {
    let mut c = std::process::Command::new(PY);
    c.arg("-c")
        .arg(format!("{PRELUDE}{code}"))
        .args(args)
        .env_clear()
        .stdin(std::process::Stdio::null());
    run(c)
}

#[test]
fn x32_and_foreign_abi_syscalls_are_refused() {
    if !x86_64_only() {
        return;
    }
    // Control: outside, x32 numbers get the kernel's own answer (ENOSYS
    // when x32 is off, a result when on; never EPERM), and i386 getpid via
    // int $0x80 returns the pid (IA32 emulation on).
    let ctl = unsandboxed(ABI_PROBE, &[]);
    let cres = probe_results(&ctl);
    assert_ne!(
        result(&cres, "x32_getpid"),
        Some("ERRNO 1"),
        "control: the kernel itself answers x32 with EPERM; the probe cannot tell\n{}",
        ctl.dump()
    );
    let int80_on_host = result(&cres, "int80_getpid").is_some_and(|r| r.starts_with("OK"));
    if !int80_on_host {
        skip("this kernel has no IA32 emulation: int $0x80 fails outside moat too");
    }
    let fx = Fixture::new();
    for level in SANDBOXED {
        let out = run(fx.py(level, &[], &format!("{PRELUDE}{ABI_PROBE}"), &[]));
        let res = probe_results(&out);
        // The positive control in the same probe: the native ABI works.
        assert!(
            result(&res, "getpid").is_some_and(|r| r.starts_with("OK")),
            "native getpid failed at {level}\n{}",
            out.dump()
        );
        expect_probe_errno(
            &out,
            &["x32_getpid", "x32_getuid", "x32_unshare_user"],
            libc::EPERM,
        );
        if int80_on_host {
            assert_eq!(
                result(&res, "int80_ready"),
                Some("OK 0"),
                "the int $0x80 child never got to the call at {level}\n{}",
                out.dump()
            );
            assert_eq!(
                result(&res, "int80_child"),
                Some(format!("SIGNAL {}", libc::SIGSYS).as_str()),
                "an i386 syscall did not kill the process with SIGSYS at {level}\n{}",
                out.dump()
            );
            assert_eq!(
                result(&res, "int80_getpid"),
                None,
                "code after an i386 syscall ran at {level}\n{}",
                out.dump()
            );
        }
        assert_eq!(result(&res, "abi_end"), Some("OK 0"), "{}", out.dump());
    }
}

#[test]
fn namespace_clone_and_unshare_are_refused_and_clone3_is_enosys() {
    if !x86_64_only() {
        return;
    }
    let flags = serde_json::to_string(&NS_FLAGS.to_vec()).unwrap();
    // Control: outside, CLONE_NEWUSER together with any other bit works
    // (unprivileged user namespaces are on here) and clone3 with size 0 is
    // EINVAL: so an EPERM/ENOSYS below comes from the guard.
    let ctl = unsandboxed(NS_PROBE, &[&flags]);
    let cres = probe_results(&ctl);
    let combined_ok: Vec<&str> = NS_FLAGS
        .iter()
        .map(|(n, _)| n)
        .filter(|n| {
            result(&cres, &format!("unshare_user_{n}")).is_some_and(|r| r.starts_with("OK"))
        })
        .copied()
        .collect();
    assert_eq!(
        result(&cres, "clone3"),
        Some(format!("ERRNO {}", libc::EINVAL).as_str()),
        "control: clone3 with size 0\n{}",
        ctl.dump()
    );
    if combined_ok.len() != NS_FLAGS.len() {
        // The kernel refuses user namespaces to this user by itself: the
        // EPERMs below are still required, but cannot tell the guard apart.
        skip("unprivileged user namespaces are off on this host (control)");
    }
    let fx = Fixture::new();
    for level in SANDBOXED {
        let out = run(fx.py(level, &[], &format!("{PRELUDE}{NS_PROBE}"), &[&flags]));
        let res = probe_results(&out);
        let mut names = Vec::new();
        for (n, bit) in NS_FLAGS {
            names.push(format!("unshare_{n}"));
            names.push(format!("unshare_user_{n}"));
            if bit != 0x80 {
                names.push(format!("clone_{n}"));
                names.push(format!("clone_user_{n}"));
            }
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        expect_probe_errno(&out, &names, libc::EPERM);
        expect_probe_errno(&out, &["clone3"], libc::ENOSYS);
        // Positive controls in the same probe: process creation without
        // namespace bits still works.
        for ok in ["clone_plain", "unshare_files"] {
            assert!(
                result(&res, ok).is_some_and(|r| r.starts_with("OK")),
                "{ok} failed at {level}\n{}",
                out.dump()
            );
        }
        assert_eq!(result(&res, "fork"), Some("OK 7"), "{}", out.dump());
        assert_eq!(result(&res, "ns_end"), Some("OK 0"), "{}", out.dump());
    }
}

#[test]
fn every_floor_entry_is_refused_with_eperm() {
    if !x86_64_only() {
        return;
    }
    // Control: the same probe without moat. Each name the kernel answers
    // with something other than EPERM here is one only the floor can turn
    // into EPERM inside; these must be (for any uid) at least the ones
    // whose arguments fail before any privilege check.
    let ctl = unsandboxed(FLOOR_PROBE, &[]);
    let cres = probe_results(&ctl);
    assert_eq!(result(&cres, "floor_end"), Some("OK 0"), "{}", ctl.dump());
    for n in [
        "ptrace",
        "request_key",
        "io_uring_enter",
        "io_uring_register",
        "name_to_handle_at",
        "chroot",
        "quotactl",
        "personality",
        "landlock_create_ruleset",
        "pidfd_getfd",
        "kcmp",
        "ioctl_TIOCSTI",
        "ioctl_TIOCLINUX",
        "ioctl_TIOCSETD",
    ] {
        let r = result(&cres, n);
        assert!(
            r.is_some() && r != Some("ERRNO 1"),
            "control: {n} is {r:?} outside moat; the probe cannot tell the floor from the kernel\n{}",
            ctl.dump()
        );
    }
    let kernel_says_eperm: Vec<&str> = FLOOR_NAMES
        .iter()
        .filter(|n| result(&cres, n) == Some("ERRNO 1"))
        .copied()
        .collect();
    eprintln!(
        "names the kernel itself answers EPERM for uid {}: {kernel_says_eperm:?}",
        euid()
    );
    let fx = Fixture::new();
    for level in SANDBOXED {
        let out = run(fx.py(level, &[], &format!("{PRELUDE}{FLOOR_PROBE}"), &[]));
        expect_probe_errno(&out, FLOOR_NAMES, libc::EPERM);
        assert_eq!(
            result(&probe_results(&out), "floor_end"),
            Some("OK 0"),
            "{}",
            out.dump()
        );
    }
}

// ------------------------------------------- the sweep's quarantine name

/// A hook the command plants in a repository it creates is moved to
/// `NAME.moat-quarantine-<execution id>` (the id `--json` reports), and the
/// `swept` entry names the path and that destination.
#[test]
fn planted_hook_is_quarantined_under_the_execution_id() {
    let fx = Fixture::new();
    // A repository the command creates survives; its hook does not.
    let hooks = fx.w("sub/.git/hooks");
    let hook = hooks.join("pre-commit");
    let mut c = fx.sh(
        "workspace-write",
        &["--json"],
        "git init -q sub && printf '#!/bin/sh\\ntouch /tmp/owned\\n' > sub/.git/hooks/pre-commit \\
         && chmod +x sub/.git/hooks/pre-commit && echo PLANTED",
    );
    c.env("GIT_CONFIG_NOSYSTEM", "1");
    let out = run(c);
    let v = out.json();
    assert!(
        v["stdout"].as_str().unwrap_or("").contains("PLANTED"),
        "the command did not plant the hook\n{}",
        out.dump()
    );
    let id = v["execution_id"].as_str().unwrap_or_default().to_string();
    assert!(!id.is_empty(), "no execution_id\n{}", out.dump());
    assert!(
        !exists(&hook),
        "the planted hook is still live\n{}",
        out.dump()
    );
    let quarantined = hooks.join(format!("pre-commit.moat-quarantine-{id}"));
    assert_eq!(
        read(&quarantined).as_deref(),
        Some("#!/bin/sh\ntouch /tmp/owned\n"),
        "the hook is not at {}\n{}",
        quarantined.display(),
        out.dump()
    );
    let swept = v["swept"].as_array().cloned().unwrap_or_default();
    let entry = swept
        .iter()
        .find(|s| s["path"].as_str() == Some(hook.to_string_lossy().as_ref()))
        .unwrap_or_else(|| panic!("no swept entry for {}\n{}", hook.display(), out.dump()));
    assert_eq!(
        entry["moved_to"].as_str(),
        Some(quarantined.to_string_lossy().as_ref()),
        "{}",
        out.dump()
    );
    assert!(
        !entry["detail"].as_str().unwrap_or_default().is_empty(),
        "{}",
        out.dump()
    );
}

/// The floor probe tries every entry of `SECCOMP_FLOOR` and `DENIED_IOCTLS`:
/// an entry added to the floor fails this until the probe tries it too.
/// (Reads the source, not the binary: it passes against any stand-in.)
#[test]
fn the_floor_probe_names_every_floor_entry_contract() {
    let src = include_str!("../../crates/linux/src/confine.rs");
    let names_in = |start: &str, prefix: &str| -> Vec<String> {
        let from = src
            .find(start)
            .unwrap_or_else(|| panic!("{start} not in confine.rs"));
        let body = &src[from..from + src[from..].find("];").unwrap()];
        body.split("(\"")
            .skip(1)
            .filter_map(|s| s.split_once('"').map(|(n, _)| format!("{prefix}{n}")))
            .collect()
    };
    let mut listed = names_in("pub const SECCOMP_FLOOR", "");
    listed.extend(names_in("pub const DENIED_IOCTLS", "ioctl_"));
    assert!(
        listed.len() > 40,
        "parsed too few floor entries: {listed:?}"
    );
    let mut probed: Vec<String> = FLOOR_NAMES.iter().map(|s| s.to_string()).collect();
    listed.sort();
    probed.sort();
    assert_eq!(listed, probed, "the floor and the probe differ");
    for n in FLOOR_NAMES {
        assert!(
            FLOOR_PROBE.contains(&format!("\"{}\"", n.trim_start_matches("ioctl_"))),
            "the floor probe never tries {n}"
        );
    }
}

/// `Seccomp_filters` of the calling process, from /proc/self/status.
const FILTER_COUNT_PROBE: &str = r#"
for line in open("/proc/self/status"):
    if line.startswith("Seccomp_filters:"):
        print("PROBE filters OK %d" % int(line.split()[1]), flush=True)
"#;

/// The sandbox adds exactly one seccomp filter (the ABI guard and the floor
/// in one program) to what the caller already runs under. The nested-run
/// broker reads a caller's network class from this count
/// (`confine::net_class_of_filters`, `SESSION_FILTERS`): a session that
/// stacked another filter would read a net-connect tool as unclassed
/// (wider). Fails against a moat that installs no filter (the count stays
/// the caller's).
#[test]
fn the_session_adds_exactly_one_seccomp_filter() {
    let ctl = probe_results(&unsandboxed(FILTER_COUNT_PROBE, &[]));
    let Some(own) = result(&ctl, "filters").and_then(|r| r.strip_prefix("OK ")) else {
        panic!("control: no Seccomp_filters line in /proc/self/status: {ctl:?}");
    };
    let own: u32 = own.parse().expect("a count");
    let fx = Fixture::new();
    for level in SANDBOXED {
        let out = run(fx.py(level, &[], FILTER_COUNT_PROBE, &[]));
        let res = probe_results(&out);
        assert_eq!(
            result(&res, "filters"),
            Some(format!("OK {}", own + 1).as_str()),
            "at {level} the command runs under {own} + 1 filters expected (SESSION_FILTERS)\n{}",
            out.dump()
        );
    }
}
