//! Smaller holes at moat's seams (issue 8, §6): homes outside /home, an
//! audit log that fails open or follows a planted symlink, an audit log a
//! command can grow without bound, the supervisor's argv readable from the
//! sandbox's /proc/1/cmdline, and the seccomp floor's newest mount syscall.
//! Each test asserts the side effect (bytes absent, marker never created,
//! host file unchanged).

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{RwLock, RwLockReadGuard};

use moat_conformance::*;

/// The passwd test adds and removes a home while it runs; a run probing
/// the host at that moment sees it vanish between probe and mount and
/// (rightly) refuses. Tests in this file hold this lock shared; that one
/// holds it exclusively.
static HOST_HOMES: RwLock<()> = RwLock::new(());

fn shared_host() -> RwLockReadGuard<'static, ()> {
    HOST_HOMES.read().unwrap_or_else(|e| e.into_inner())
}

// ------------------------------------------------- 1. homes from passwd

/// A passwd entry (and its home) that `userdel` removes again on drop.
struct TempUser {
    name: String,
    home: PathBuf,
}

impl TempUser {
    /// A system user whose home is `/var/lib/<name>` (not under /home).
    fn create() -> Option<TempUser> {
        let name = format!("moatt{}", std::process::id() % 100_000);
        let home = PathBuf::from(format!("/var/lib/{name}"));
        let ok = Command::new("useradd")
            .args(["-M", "-r", "-s", "/usr/sbin/nologin", "-d"])
            .arg(&home)
            .arg(&name)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return None;
        }
        let user = TempUser { name, home };
        fs::create_dir_all(user.home.join(".ssh")).ok()?;
        Some(user)
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
        let _ = fs::remove_dir_all(&self.home);
    }
}

#[test]
fn passwd_home_outside_slash_home_is_protected() {
    let _hosts = HOST_HOMES.write().unwrap_or_else(|e| e.into_inner());
    if euid() != 0 {
        // An unprivileged user cannot add a passwd entry; the unprivileged
        // path through the same code is the fixture's own HOME (every test).
        skip("needs root to add a passwd entry with a home outside /home");
        return;
    }
    let Some(user) = TempUser::create() else {
        skip("useradd is not available");
        return;
    };
    let secret = unique("PASSWDHOMESECRET");
    write(
        user.home.join(".ssh/id_ed25519"),
        &format!("-----BEGIN OPENSSH PRIVATE KEY-----\n{secret}\n"),
    );
    write(
        user.home.join(".aws/credentials"),
        &format!("[default]\naws_secret_access_key={secret}\n"),
    );
    let public = unique("PASSWDHOMEPUBLIC");
    write(user.home.join("public.txt"), &public);
    let fx = Fixture::new();
    let h = user.home.display();
    let script = format!(
        "cat {h}/.ssh/id_ed25519 {h}/public.txt; cat {h}/.aws/credentials 2>/dev/null; echo MARK-passwd-home"
    );
    for level in ["read-only", "workspace-write"] {
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("MARK-passwd-home");
        out.expect_stdout_has(&public); // the home itself is visible
        out.expect_absent(&secret, &format!("{h}/.ssh key at {level}"));
    }
    // workspace-contained shows the home only when granted; then the
    // stand-ins apply there too.
    let grant = user.home.to_string_lossy().into_owned();
    let out = run(fx.sh("workspace-contained", &["--ro", &grant], &script));
    out.expect_stdout_has("MARK-passwd-home");
    out.expect_stdout_has(&public);
    out.expect_absent(&secret, "granted passwd home's .ssh at workspace-contained");
}

// ----------------------------------------- 2. the audit log fails closed

fn marker_script(marker: &Path) -> String {
    format!("touch {}; echo MARK-ran", marker.display())
}

fn expect_refused_not_run(out: &Out, marker: &Path, what: &str) {
    out.expect_code(125);
    assert!(
        !exists(marker),
        "{what}: the command ran although its run could not be recorded\n{}",
        out.dump()
    );
    assert!(
        !out.stdout.contains("MARK-ran"),
        "{what}: command output seen\n{}",
        out.dump()
    );
}

#[test]
fn audit_log_dev_full_refuses_the_run() {
    let _hosts = shared_host();
    let fx = Fixture::new();
    let marker = fx.w(&unique("ran"));
    for log in ["/dev/full", "/dev/null"] {
        let out = run(fx.sh(
            "workspace-write",
            &["--audit-log", log],
            &marker_script(&marker),
        ));
        expect_refused_not_run(&out, &marker, log);
        assert!(out.stderr.contains(log), "names the log\n{}", out.dump());
    }
}

#[test]
fn audit_log_on_a_full_disk_refuses_the_run() {
    let _hosts = shared_host();
    if euid() != 0 {
        // /dev/full (above) is the unprivileged form of the same failure.
        skip("needs root to mount a tiny tmpfs");
        return;
    }
    let fx = Fixture::new();
    let mnt = fx.root.join("tiny");
    fs::create_dir(&mnt).expect("mkdir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4k,mode=0755", "tmpfs"])
        .arg(&mnt)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        skip("cannot mount tmpfs");
        return;
    }
    struct Umount(PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Umount(mnt.clone());
    // Fill it up, leaving no room for a log line.
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1k", "count=64"])
        .arg(format!("of={}", mnt.join("filler").display()))
        .stderr(std::process::Stdio::null())
        .status();
    let log = mnt.join("audit.jsonl");
    let marker = fx.w(&unique("ran"));
    let out = run(fx.sh(
        "workspace-write",
        &["--audit-log", &log.to_string_lossy()],
        &marker_script(&marker),
    ));
    expect_refused_not_run(&out, &marker, "full disk");
}

#[test]
fn audit_log_without_final_newline_refuses_the_run() {
    let _hosts = shared_host();
    let fx = Fixture::new();
    let log = fx.root.join("state/audit.jsonl");
    // One good run first, then cut the trailing newline.
    run(fx.sh(
        "read-only",
        &["--audit-log", &log.to_string_lossy()],
        "true",
    ))
    .expect_code(0);
    let mut text = read(&log).expect("log written");
    assert!(text.ends_with('\n'));
    text.pop();
    fs::write(&log, &text).expect("rewrite log");
    let marker = fx.w(&unique("ran"));
    let out = run(fx.sh(
        "workspace-write",
        &["--audit-log", &log.to_string_lossy()],
        &marker_script(&marker),
    ));
    expect_refused_not_run(&out, &marker, "log without final newline");
    assert!(
        out.stderr.contains("moat audit verify"),
        "the refusal names `moat audit verify`\n{}",
        out.dump()
    );
    assert_eq!(read(&log).as_deref(), Some(text.as_str()), "log untouched");
}

#[test]
fn audit_log_in_a_directory_others_can_write_is_refused() {
    let _hosts = shared_host();
    let fx = Fixture::new();
    // World-writable without the sticky bit: anyone could plant the log
    // file (or a symlink) there.
    let dir = fx.root.join("open");
    fs::create_dir(&dir).expect("mkdir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).expect("chmod");
    let target = fx.root.join("victim");
    write(&target, "victim\n");
    symlink(&target, dir.join("audit.jsonl")).expect("symlink");
    let marker = fx.w(&unique("ran"));
    let out = run(fx.sh(
        "workspace-write",
        &["--audit-log", &dir.join("audit.jsonl").to_string_lossy()],
        &marker_script(&marker),
    ));
    expect_refused_not_run(&out, &marker, "world-writable log directory");
    assert_eq!(read(&target).as_deref(), Some("victim\n"), "target changed");

    if euid() == 0 {
        // Group-writable by a group other users are in (`users`).
        let shared = fx.root.join("shared-group");
        fs::create_dir(&shared).expect("mkdir");
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o775)).expect("chmod");
        let grouped = Command::new("chgrp")
            .arg("users")
            .arg(&shared)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if grouped {
            let out = run(fx.sh(
                "workspace-write",
                &["--audit-log", &shared.join("audit.jsonl").to_string_lossy()],
                &marker_script(&marker),
            ));
            expect_refused_not_run(&out, &marker, "log directory writable by group users");
        }
    }
}

#[test]
fn audit_log_symlink_is_not_followed() {
    let _hosts = shared_host();
    let fx = Fixture::new();
    let dir = fx.root.join("logs");
    fs::create_dir(&dir).expect("mkdir");
    let target = fx.root.join("victim");
    write(&target, "victim\n");
    let link = dir.join("audit.jsonl");
    symlink(&target, &link).expect("symlink");
    if euid() == 0 {
        // As root: the directory belongs to another user, who planted the
        // link (the victim file is root's).
        let _ = Command::new("chown")
            .args(["-h", "moat-ci:moat-ci"])
            .arg(&dir)
            .arg(&link)
            .status();
    }
    let marker = fx.w(&unique("ran"));
    let out = run(fx.sh(
        "workspace-write",
        &["--audit-log", &link.to_string_lossy()],
        &marker_script(&marker),
    ));
    expect_refused_not_run(&out, &marker, "symlinked log");
    assert_eq!(read(&target).as_deref(), Some("victim\n"), "target changed");

    if euid() == 0 {
        // A directory symlink another user planted in a sticky, shared
        // directory (`/tmp/logs -> /etc/cron.d`): root must not create its
        // log where the link points.
        let shared = fx.root.join("shared");
        fs::create_dir(&shared).expect("mkdir");
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).expect("chmod");
        let victim_dir = fx.root.join("rootdir");
        fs::create_dir(&victim_dir).expect("mkdir");
        let planted = shared.join("logs");
        symlink(&victim_dir, &planted).expect("symlink");
        let _ = Command::new("chown")
            .args(["-h", "moat-ci:moat-ci"])
            .arg(&planted)
            .status();
        let log = planted.join("sub/audit.jsonl");
        let out = run(fx.sh(
            "workspace-write",
            &["--audit-log", &log.to_string_lossy()],
            &marker_script(&marker),
        ));
        expect_refused_not_run(&out, &marker, "log under a planted directory symlink");
        assert!(
            !exists(victim_dir.join("sub")),
            "root created its log directory through another user's symlink\n{}",
            out.dump()
        );
    }
}

#[test]
fn repeated_socks_refusals_are_aggregated_in_the_log() {
    let _hosts = shared_host();
    let fx = Fixture::new();
    let log = fx.root.join("state/audit.jsonl");
    let n = 400;
    // Raw SOCKS5 CONNECTs to a host no rule allows, all refused.
    let code = format!(
        r#"
import socket
refused = 0
for i in range({n}):
    s = socket.create_connection(("127.0.0.1", 1080))
    s.sendall(b"\x05\x01\x00")
    s.recv(2)
    host = b"blocked.invalid"
    s.sendall(b"\x05\x01\x00\x03" + bytes([len(host)]) + host + (443).to_bytes(2, "big"))
    r = s.recv(10)
    if len(r) >= 2 and r[1] != 0:
        refused += 1
    s.close()
print("MARK-socks refused", refused)
"#
    );
    let out = run(fx.py(
        "workspace-write",
        &[
            "--network",
            "proxy",
            "--allow-domain",
            "example.com",
            "--audit-log",
            &log.to_string_lossy(),
        ],
        &code,
        &[],
    ));
    out.expect_code(0);
    out.expect_stdout_has(&format!("MARK-socks refused {n}"));
    let text = read(&log).expect("log");
    let decisions: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .filter(|v: &serde_json::Value| v["type"] == "network.decision")
        .collect();
    assert_eq!(
        decisions.len(),
        1,
        "{n} identical refusals must be one aggregated record, got {} ({} bytes of log)",
        decisions.len(),
        text.len()
    );
    let d = &decisions[0];
    assert_eq!(d["count"], n, "{d}");
    assert_eq!(d["host"], "blocked.invalid", "{d}");
    assert_eq!(d["decision"], "deny", "{d}");
    assert!(
        d["first_time"].is_string() && d["last_time"].is_string(),
        "{d}"
    );
    assert!(text.len() < 16 * 1024, "log grew to {} bytes", text.len());
    let verify = run(fx.moat(["audit", "verify", "--log", &log.to_string_lossy()]));
    verify.expect_code(0);
}

// ---------------------------------------- 6. /proc/1/cmdline in the sandbox

#[test]
fn supervisor_argv_is_not_readable_inside() {
    let _hosts = shared_host();
    let fx = Fixture::new();
    let secret = unique("ARGVSECRET");
    // The probe gets the secret reversed, so its own argv does not hold it.
    let reversed: String = secret.chars().rev().collect();
    let code = r#"
import os, sys
want = sys.argv[1][::-1].encode()
leaks, read = [], 0
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        data = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        continue
    read += 1
    if want in data:
        leaks.append(pid)
one = open("/proc/1/cmdline", "rb").read()
print("MARK-cmdline read", read, "pid1-bytes", len(one), "leaks", leaks)
"#;
    for level in SANDBOXED {
        let out = run(fx.py(
            level,
            &["--env", &format!("FOO={secret}")],
            code,
            &[&reversed],
        ));
        out.expect_code(0);
        out.expect_stdout_has("MARK-cmdline read");
        out.expect_stdout_has("leaks []");
        out.expect_absent(&secret, "moat's argv via /proc/*/cmdline");
    }
}

// ------------------------------------------ 5. the seccomp floor is current

#[test]
fn open_tree_attr_is_refused_by_the_floor() {
    let _hosts = shared_host();
    // open_tree_attr(2) (467, Linux 6.15) clones a mount tree with new
    // attributes. With invalid arguments the kernel answers EINVAL/EBADF;
    // the floor answers EPERM before the kernel looks at them.
    let code = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(ctypes.c_long(467), ctypes.c_long(-1), ctypes.c_char_p(b"/"), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
print("PROBE open_tree_attr", "OK" if r >= 0 else "ERRNO %d" % ctypes.get_errno())
"#;
    let fx = Fixture::new();
    for level in SANDBOXED {
        let out = run(fx.py(level, &[], code, &[]));
        expect_probe_errno(&out, &["open_tree_attr"], libc::EPERM);
    }
}

// ------------------------------------ 3. non-UTF-8 paths in the policy hash

#[test]
fn explain_policy_hashes_non_utf8_workspaces_apart_contract() {
    let _hosts = shared_host();
    use std::os::unix::ffi::OsStringExt;
    let fx = Fixture::new();
    let mut hashes = Vec::new();
    for byte in [0xffu8, 0xfe] {
        let mut name = b"ws-".to_vec();
        name.push(byte);
        let dir = fx.root.join(std::ffi::OsString::from_vec(name));
        fs::create_dir(&dir).expect("mkdir");
        let mut cmd = fx.moat(["explain-policy", "--cwd"]);
        cmd.arg(&dir);
        let out = run(cmd);
        out.expect_code(0);
        let j = out.json();
        let hash = j["policy_hash"].as_str().unwrap_or_default().to_string();
        assert!(hash.starts_with("sha256:"), "{}", out.dump());
        assert!(
            !out.stdout.contains("\"policy\": null"),
            "canonical policy is null\n{}",
            out.dump()
        );
        hashes.push(hash);
    }
    assert_ne!(hashes[0], hashes[1], "two workspaces, one policy hash");
}

#[test]
fn audit_log_in_a_group_writable_private_group_directory_positive_control() {
    let _hosts = shared_host();
    // With the user-private-group umask (002), ~/.local is 0775 and its
    // group holds only its owner: that is not someone else's directory.
    let fx = Fixture::new();
    let dir = fx.root.join("ug");
    fs::create_dir(&dir).expect("mkdir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o775)).expect("chmod");
    let marker = fx.w(&unique("ran"));
    let log = dir.join("audit.jsonl");
    let out = run(fx.sh(
        "workspace-write",
        &["--audit-log", &log.to_string_lossy()],
        &marker_script(&marker),
    ));
    out.expect_code(0);
    assert!(exists(&marker), "{}", out.dump());
    assert!(read(&log).is_some_and(|t| t.contains("policy.resolved")));
}

// ------------------------- 3. a secret the kernel already keeps from the caller

/// A secret the kernel itself keeps from an unprivileged caller (here
/// root's 0600 `.netrc` in the caller's home; on a host, /etc/shadow
/// 0640 root:shadow) gets no stand-in, so nothing watches it: root
/// renaming a new file over it mid-run (as `useradd`/`passwd` do with
/// /etc/shadow) must not stop the caller's unrelated run, the secret stays
/// unreadable, and the kernel's own EACCES is not reported as moat's
/// refusal ("moat: denied … add --rw"). Root only (it adds a passwd entry).
#[test]
fn a_secret_the_kernel_keeps_from_the_caller_is_left_to_the_kernel_positive_control() {
    use std::os::unix::process::CommandExt;
    let _hosts = HOST_HOMES.write().unwrap_or_else(|e| e.into_inner());
    if euid() != 0 {
        skip("needs root to add a passwd entry and a root-owned file in its home");
        return;
    }
    let Some(user) = TempUser::create() else {
        skip("useradd is not available");
        return;
    };
    let id = |flag: &str| -> u32 {
        let o = Command::new("id")
            .arg(flag)
            .arg(&user.name)
            .output()
            .expect("id");
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    let (uid, gid) = (id("-u"), id("-g"));
    let h = &user.home;
    let ws = h.join("ws");
    fs::create_dir_all(&ws).expect("mkdir ws");
    for d in [h.clone(), ws.clone(), h.join(".ssh")] {
        std::os::unix::fs::chown(&d, Some(uid), Some(gid)).expect("chown");
    }
    let secret = unique("KERNELKEPTSECRET");
    let netrc = h.join(".netrc");
    write(&netrc, &format!("machine example.com password {secret}\n"));
    fs::set_permissions(&netrc, fs::Permissions::from_mode(0o600)).expect("chmod");
    let (started, replaced) = (ws.join("started"), ws.join("replaced"));
    let n = netrc.display();
    // Reads the file until told it was replaced, then a while longer (for
    // a watch to have noticed), then reports.
    let script = format!(
        "touch started; while [ ! -e replaced ]; do cat {n}; sleep 0.05; done; \
         i=0; while [ $i -lt 20 ]; do cat {n}; sleep 0.05; i=$((i+1)); done; echo LOOP_DONE"
    );
    let mut c = Command::new(moat_bin());
    c.args([
        "exec",
        "--policy",
        "workspace-write",
        "--",
        "/bin/bash",
        "-c",
        &script,
    ])
    .env_clear()
    .env("PATH", "/usr/local/bin:/usr/bin:/bin")
    .env("HOME", h)
    .env("USER", &user.name)
    .env("LANG", "C.UTF-8")
    .current_dir(&ws)
    .uid(uid)
    .gid(gid)
    .stdin(std::process::Stdio::null());
    let pending = spawn(c);
    // A hang guard, not a timing assertion.
    let guard = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !exists(&started) && std::time::Instant::now() < guard {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let secret2 = unique("KERNELKEPTNEW");
    let new = h.join(".netrc.new");
    write(&new, &format!("machine example.com password {secret2}\n"));
    fs::set_permissions(&new, fs::Permissions::from_mode(0o600)).expect("chmod");
    fs::rename(&new, &netrc).expect("rename over .netrc");
    write(&replaced, "");
    let out = pending.wait();
    out.expect_code(0).expect_stdout_has("LOOP_DONE");
    out.expect_absent(&secret, "root's .netrc");
    out.expect_absent(&secret2, "root's new .netrc");
    assert!(
        out.stderr.contains("Permission denied"),
        "the probe never met the kernel's refusal\n{}",
        out.dump()
    );
    out.expect_absent(
        "moat: denied",
        "the kernel's own EACCES explained as moat's refusal",
    );
}
