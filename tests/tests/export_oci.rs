//! `moat export oci`: the bundle, run by runc and crun, replays the
//! black-box cases that apply to it: secrets absent, writes outside the
//! writable part refused, no network, the process tree gone after exit.
//! runc runs as root and rootless; crun 1.8 refuses a hybrid cgroup layout,
//! so as root it runs in a private mount namespace with the cgroup2 mount
//! hidden (an unprivileged user cannot), and is skipped as non-root.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use moat_conformance::*;

fn which(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

/// A host with v1 controllers and a cgroup2 mount beside them (hybrid).
fn hybrid_cgroups() -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts.lines().any(|l| l.contains(" cgroup2 "))
        && mounts.lines().any(|l| l.contains(" cgroup "))
}

/// The command that runs `bundle` with `runtime`, or a reason it cannot here.
fn runtime_cmd(runtime: &str, bundle: &Path, state: &Path) -> Result<Command, String> {
    let Some(exe) = which(runtime) else {
        return Err(format!(
            "{runtime} is not installed (apt-get install {runtime}; .ci/run installs it)"
        ));
    };
    let id = unique("oci");
    let args = |c: &mut Command| {
        c.arg("--root").arg(state).args(["run", &id]);
        c.current_dir(bundle).stdin(std::process::Stdio::null());
    };
    if runtime == "crun" && hybrid_cgroups() {
        if euid() != 0 {
            return Err("crun 1.8 refuses this host's hybrid cgroup layout; as root the test hides the cgroup2 mount in a private mount namespace, which an unprivileged user cannot (rootless runc is exercised instead)".into());
        }
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"]).arg(
            "for m in $(awk '$3==\"cgroup2\"{print $2}' /proc/self/mounts); do umount \"$m\" || exit 99; done; exec \"$0\" \"$@\"",
        );
        c.arg(&exe).arg("--cgroup-manager=cgroupfs");
        args(&mut c);
        return Ok(c);
    }
    let mut c = Command::new(exe);
    args(&mut c);
    Ok(c)
}

fn export(fx: &Fixture, level: &str, bundle: &Path, script: &str) -> Out {
    let a: Vec<String> = vec![
        "export".into(),
        "oci".into(),
        "--policy".into(),
        level.into(),
        "--bundle".into(),
        bundle.to_string_lossy().into_owned(),
        "--".into(),
        BASH.into(),
        "-c".into(),
        script.into(),
    ];
    run(fx.moat(a))
}

/// The replay: one bundle per (runtime, level), its side effects checked.
fn replay(runtime: &str, level: &str) {
    let fx = Fixture::new();
    write(fx.w(".env"), &format!("TOKEN={}\n", fx.env_secret));
    let outside_write = fx.outside.join(unique("written"));
    let ws_write = fx.w("written-by-bundle");
    let bg = unique("ocibg");
    let _guard = MarkerGuard(bg.clone());
    let (listener, port) = Listener::tcp();
    let h = fx.home.display();
    let script = format!(
        r#"echo MARK-ran
cat {h}/.ssh/id_rsa {h}/.aws/credentials {h}/.netrc {h}/.config/gh/hosts.yml .env {o}/secret 2>&1
echo x > {ow} 2>/dev/null || echo MARK-outside-refused
if echo x > {ww} 2>/dev/null; then echo MARK-ws-written; else echo MARK-ws-refused; fi
{py} -c 'import socket; socket.create_connection(("127.0.0.1", {port}), timeout=3); print("MARK-connected")' 2>/dev/null || echo MARK-net-refused
if unshare -U true 2>/dev/null; then echo MARK-new-namespace; else echo MARK-unshare-refused; fi
(exec -a {bg} sleep 1000 &)
echo MARK-bg-started"#,
        o = fx.outside.display(),
        ow = outside_write.display(),
        ww = ws_write.display(),
        py = PY,
    );
    let bundle = fx.root.join("bundle");
    export(&fx, level, &bundle, &script).expect_code(0);
    let state = fx.root.join("state");
    let cmd = match runtime_cmd(runtime, &bundle, &state) {
        Ok(c) => c,
        Err(why) => return skip(&why),
    };
    let out = spawn(cmd).wait_limit(Duration::from_secs(60));
    out.expect_code(0)
        .expect_stdout_has("MARK-ran")
        .expect_stdout_has("MARK-outside-refused")
        .expect_stdout_has("MARK-net-refused")
        .expect_stdout_has("MARK-bg-started")
        // The seccomp floor's ABI guard: no new namespaces from inside.
        .expect_stdout_has("MARK-unshare-refused")
        .expect_absent(&fx.ssh_secret, "ssh key / gh token")
        .expect_absent(&fx.aws_secret, "aws credentials")
        .expect_absent(&fx.netrc_secret, ".netrc")
        .expect_absent(&fx.env_secret, "the workspace .env");
    if level == "workspace-contained" {
        out.expect_absent(&fx.outside_secret, "a file outside the workspace");
    }
    assert!(
        !exists(&outside_write),
        "a write outside the workspace reached the host\n{}",
        out.dump()
    );
    if level == "workspace-write" || level == "workspace-contained" {
        out.expect_stdout_has("MARK-ws-written");
        assert_eq!(read(&ws_write).as_deref(), Some("x\n"), "{}", out.dump());
    } else {
        out.expect_stdout_has("MARK-ws-refused");
        assert!(!exists(&ws_write), "{}", out.dump());
    }
    let (hits, _) = listener.finish();
    assert_eq!(
        hits,
        0,
        "the host listener saw a connection\n{}",
        out.dump()
    );
    let survivors = wait_gone(&bg, Duration::from_secs(20));
    assert!(
        survivors.is_empty(),
        "a background process outlived the bundle: {survivors:?}\n{}",
        out.dump()
    );
}

#[test]
fn runc_read_only() {
    replay("runc", "read-only");
}

#[test]
fn runc_workspace_write() {
    replay("runc", "workspace-write");
}

#[test]
fn runc_workspace_contained() {
    replay("runc", "workspace-contained");
}

#[test]
fn crun_read_only() {
    replay("crun", "read-only");
}

#[test]
fn crun_workspace_write() {
    replay("crun", "workspace-write");
}

#[test]
fn crun_workspace_contained() {
    replay("crun", "workspace-contained");
}

/// What the bundle says, independent of a runtime: the policy hash and
/// canonical policy as annotations, the Landlock note, the seccomp floor,
/// no capabilities, no_new_privs, masked /proc entries.
#[test]
fn bundle_config_contract() {
    let fx = Fixture::new();
    let bundle = fx.root.join("bundle");
    export(&fx, "workspace-write", &bundle, "true").expect_code(0);
    let text = read(bundle.join("config.json")).unwrap_or_default();
    let c: serde_json::Value = serde_json::from_str(&text).expect("config.json is JSON");
    let explained = run(fx.moat(["explain-policy", "--policy", "workspace-write"]));
    explained.expect_code(0);
    let hash = explained.json()["policy_hash"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(hash.starts_with("sha256:"), "{}", explained.dump());
    let ann = &c["annotations"];
    assert_eq!(ann["dev.moat.policy-hash"], hash.as_str());
    let policy: serde_json::Value =
        serde_json::from_str(ann["dev.moat.policy"].as_str().unwrap_or("null")).expect("policy");
    assert_eq!(policy, explained.json()["policy"]);
    assert!(ann["dev.moat.landlock"]
        .as_str()
        .unwrap_or_default()
        .contains("runtime-spec PR #1241"));
    assert_eq!(c["process"]["noNewPrivileges"], true);
    assert_eq!(
        c["process"]["capabilities"]["bounding"],
        serde_json::json!([])
    );
    let names: Vec<String> = c["linux"]["seccomp"]["syscalls"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["names"].as_array().cloned().unwrap_or_default())
        .filter_map(|n| n.as_str().map(String::from))
        .collect();
    for s in [
        "ptrace", "bpf", "mount", "setns", "clone3", "unshare", "ioctl", "socket",
    ] {
        assert!(
            names.iter().any(|n| n == s),
            "{s} not in the seccomp rules: {names:?}"
        );
    }
    assert!(c["linux"]["maskedPaths"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
    let mounts = c["mounts"].as_array().cloned().unwrap_or_default();
    let ssh = fx.home.join(".ssh");
    let standin = mounts
        .iter()
        .find(|m| m["destination"] == ssh.to_string_lossy().as_ref())
        .unwrap_or_else(|| panic!("no stand-in for {}: {text}", ssh.display()));
    assert_eq!(standin["type"], "tmpfs");
    assert!(standin["options"]
        .as_array()
        .is_some_and(|o| o.iter().any(|x| x == "ro")));
    let ws = mounts
        .iter()
        .find(|m| m["destination"] == fx.ws.to_string_lossy().as_ref())
        .unwrap_or_else(|| panic!("no workspace bind: {text}"));
    assert_eq!(
        ws["options"],
        serde_json::json!(["rbind", "nosuid", "nodev"])
    );
}

/// The OCI export has no proxy (it needs moat's supervisor on the host):
/// a refusal with exit 125 naming what to use instead, never a bundle
/// with less than the flags asked for.
#[test]
fn proxy_network_is_refused_contract() {
    let fx = Fixture::new();
    let bundle = fx.root.join("bundle");
    let out = run(fx.moat([
        "export",
        "oci",
        "--network",
        "proxy",
        "--bundle",
        &bundle.to_string_lossy(),
        "--",
        "true",
    ]));
    out.expect_code(125);
    assert!(out.stderr.contains("moat export k8s"), "{}", out.dump());
    assert!(!exists(bundle.join("config.json")));
}

/// A bundle the confined command could rewrite is refused: inside the
/// workspace at a writable level, the command could edit the config.json
/// that confines its next run. At read-only the same place is fine.
#[test]
fn bundle_in_a_writable_part_of_the_view_is_refused() {
    let fx = Fixture::new();
    let inside = fx.w("bundle");
    let out = run(fx.moat([
        "export",
        "oci",
        "--policy",
        "workspace-write",
        "--bundle",
        "bundle",
        "--",
        "true",
    ]));
    out.expect_code(125);
    assert!(
        out.stderr.contains("writable part of the view"),
        "{}",
        out.dump()
    );
    assert!(!exists(inside.join("config.json")), "{}", out.dump());
    // Through a symlink from outside, still inside.
    let link = fx.root.join("to-ws");
    std::os::unix::fs::symlink(&fx.ws, &link).expect("symlink");
    let via = link.join("b2");
    let out = run(fx.moat([
        "export",
        "oci",
        "--policy",
        "workspace-write",
        "--bundle",
        &via.to_string_lossy(),
        "--",
        "true",
    ]));
    out.expect_code(125);
    assert!(!exists(fx.w("b2/config.json")), "{}", out.dump());
    let ro = run(fx.moat([
        "export",
        "oci",
        "--policy",
        "read-only",
        "--bundle",
        "bundle",
        "--",
        "true",
    ]));
    ro.expect_code(0);
    assert!(exists(inside.join("config.json")), "{}", ro.dump());
}

/// Without --bundle the bundle goes to /var/tmp, outside every writable
/// part of the view; the path is printed.
#[test]
fn default_bundle_is_outside_the_workspace_contract() {
    let fx = Fixture::new();
    let out = run(fx.moat(["export", "oci", "--policy", "workspace-write", "--", "true"]));
    out.expect_code(0);
    let dir = PathBuf::from(out.stdout.trim());
    let _cleanup = RmOnDrop(dir.clone());
    assert!(dir.starts_with("/var/tmp"), "{}", out.dump());
    assert!(exists(dir.join("config.json")), "{}", out.dump());
}

const SOCKET_PROBE: &str = r#"
import socket
for name, fam, typ in [("unix", socket.AF_UNIX, socket.SOCK_STREAM), ("inet", socket.AF_INET, socket.SOCK_STREAM), ("inet6", socket.AF_INET6, socket.SOCK_STREAM), ("netlink", socket.AF_NETLINK, socket.SOCK_RAW), ("packet", 17, socket.SOCK_RAW)]:
    try:
        socket.socket(fam, typ)
        print("SOCK", name, "ok")
    except OSError as e:
        print("SOCK", name, e.errno)
"#;

/// The socket-family rules as a runtime's libseccomp reads them (it
/// compares an argument once per rule, so "none of" is written as several
/// rules): with `--network disabled` only unix sockets open; the proxy-mode
/// profile the Kubernetes export ships opens unix and inet, never netlink
/// or packet. Before the rules were split, the proxy profile refused inet.
#[test]
fn socket_family_rules_hold_under_runc() {
    let fx = Fixture::new();
    let bundle = fx.root.join("bundle");
    let a = ["export", "oci", "--policy", "workspace-write", "--bundle"];
    let mut args: Vec<String> = a.iter().map(|s| s.to_string()).collect();
    args.extend([
        bundle.to_string_lossy().into_owned(),
        "--".into(),
        PY.into(),
        "-c".into(),
        SOCKET_PROBE.into(),
    ]);
    run(fx.moat(&args)).expect_code(0);
    let state = fx.root.join("state");
    let expect = |out: &Out, want: &[(&str, &str)]| {
        for (name, v) in want {
            out.expect_stdout_has(&format!("SOCK {name} {v}\n"));
        }
    };
    let cmd = match runtime_cmd("runc", &bundle, &state) {
        Ok(c) => c,
        Err(why) => return skip(&why),
    };
    let out = spawn(cmd).wait_limit(Duration::from_secs(60));
    out.expect_code(0);
    expect(
        &out,
        &[
            ("unix", "ok"),
            ("inet", "1"),
            ("inet6", "1"),
            ("netlink", "1"),
            ("packet", "1"),
        ],
    );

    // The proxy-mode profile from the Kubernetes export, in the same bundle.
    let k8s = run(fx.moat(["export", "k8s", "--network", "proxy", "--", "true"]));
    k8s.expect_code(0);
    let profile = k8s
        .stdout
        .split("---\n")
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find(|d| d["kind"] == "ConfigMap")
        .and_then(|d| d["data"]["profile.json"].as_str().map(String::from))
        .expect("the seccomp ConfigMap");
    let path = bundle.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&read(&path).unwrap_or_default()).expect("config");
    c["linux"]["seccomp"] = serde_json::from_str(&profile).expect("profile JSON");
    write(&path, &c.to_string());
    let cmd = runtime_cmd("runc", &bundle, &state).expect("runc");
    let out = spawn(cmd).wait_limit(Duration::from_secs(60));
    out.expect_code(0);
    expect(
        &out,
        &[
            ("unix", "ok"),
            ("inet", "ok"),
            ("inet6", "ok"),
            ("netlink", "1"),
            ("packet", "1"),
        ],
    );
}
