//! moat inside a container: runc runs a bundle whose root is the host's
//! `/usr` and `/etc` bound read-only (no image registry), with moat's binary
//! and the workspace bound in. Under a seccomp profile that refuses
//! CLONE_NEWUSER (what Docker's default profile does) the default backend
//! refuses, naming `--backend landlock`, and `--backend auto` gets the
//! Landlock backend with its guarantees. As root the container runs its
//! process as an unprivileged uid (root in a container without CAP_SETFCAP
//! may not map itself into a new user namespace); as an unprivileged user
//! runc runs rootless (its own user namespace).
//!
//! With user namespaces allowed and an unmasked /proc, moat gives its full
//! namespaces backend inside the container. With the default masked /proc
//! the kernel refuses moat a fresh procfs (a procfs may only be mounted
//! where one is already fully visible), and moat says so and how to fix it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use moat_conformance::*;
use serde_json::{json, Value};

fn runc() -> Option<PathBuf> {
    ["/usr/sbin/runc", "/usr/bin/runc", "/sbin/runc"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Builds a bundle under the fixture that runs `args` in the workspace
/// (bound at /ws) with moat's directory at /moat; `seccomp` is the profile, if any.
fn bundle(
    fx: &Fixture,
    name: &str,
    args: &[&str],
    seccomp: Option<Value>,
    masked_proc: bool,
) -> PathBuf {
    let dir = fx.root.join(name);
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/sys", "type": "none", "source": "/sys", "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["mode=1777"]}),
    ];
    for d in [
        "usr", "etc", "lib", "lib64", "bin", "sbin", "moat", "ws", "tmp", "proc", "dev", "sys",
    ] {
        let host = Path::new("/").join(d);
        let inside = rootfs.join(d);
        match std::fs::read_link(&host) {
            Ok(to) => std::os::unix::fs::symlink(to, &inside).unwrap(),
            Err(_) => std::fs::create_dir_all(&inside).unwrap(),
        }
        if ["usr", "etc"].contains(&d)
            || (host.is_dir() && !host.is_symlink() && ["lib", "lib64", "bin", "sbin"].contains(&d))
        {
            mounts.push(json!({"destination": host, "type": "bind", "source": host, "options": ["rbind", "ro"]}));
        }
    }
    std::fs::set_permissions(
        rootfs.join("tmp"),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    // moat's binary, copied into a directory of its own (bound at /moat).
    let bin = dir.join("moatbin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(moat_bin(), bin.join("moat")).unwrap();
    mounts.push(
        json!({"destination": "/moat", "type": "bind", "source": bin, "options": ["rbind", "ro"]}),
    );
    mounts.push(
        json!({"destination": "/ws", "type": "bind", "source": fx.ws, "options": ["rbind", "rw"]}),
    );
    let root = euid() == 0;
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
    ];
    let mut linux = json!({});
    if masked_proc {
        // runc's and Docker's defaults cover parts of /proc.
        linux["maskedPaths"] = json!([
            "/proc/kcore",
            "/proc/keys",
            "/proc/timer_list",
            "/sys/firmware"
        ]);
        linux["readonlyPaths"] = json!([
            "/proc/bus",
            "/proc/fs",
            "/proc/irq",
            "/proc/sys",
            "/proc/sysrq-trigger"
        ]);
    }
    let user = if root {
        namespaces.push(json!({"type": "network"}));
        json!({"uid": 65534, "gid": 65534})
    } else {
        // Rootless: the container's own user namespace maps the caller to 0.
        namespaces.push(json!({"type": "user"}));
        let (u, g) = (euid(), nix_getgid());
        linux["uidMappings"] = json!([{"containerID": 0, "hostID": u, "size": 1}]);
        linux["gidMappings"] = json!([{"containerID": 0, "hostID": g, "size": 1}]);
        json!({"uid": 0, "gid": 0})
    };
    linux["namespaces"] = Value::Array(namespaces);
    // Root inside the container (rootless) maps itself into moat's user
    // namespace, which takes CAP_SETFCAP (Docker's default set has it).
    let caps = if root {
        json!({"bounding": [], "effective": [], "permitted": [], "ambient": []})
    } else {
        let c = json!(["CAP_SETFCAP"]);
        json!({"bounding": c, "effective": c, "permitted": c, "ambient": []})
    };
    if let Some(s) = seccomp {
        linux["seccomp"] = s;
    }
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": user,
            "args": args,
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"],
            "cwd": "/ws",
            "noNewPrivileges": true,
            "capabilities": caps,
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "ctr",
        "mounts": mounts,
        "linux": linux,
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(&config).unwrap(),
    )
    .unwrap();
    dir
}

fn nix_getgid() -> u32 {
    let out = Command::new("id").arg("-g").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Docker's default profile refuses new user namespaces; this is that part.
fn no_userns_seccomp() -> Value {
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [
            {"names": ["unshare", "clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
             "args": [{"index": 0, "value": 0x1000_0000u64, "valueTwo": 0x1000_0000u64, "op": "SCMP_CMP_MASKED_EQ"}]},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
        ],
    })
}

fn run_bundle(fx: &Fixture, dir: &Path) -> Option<Out> {
    let Some(runc) = runc() else {
        skip("runc is not installed (apt-get install runc; .ci/run installs it)");
        return None;
    };
    let state = fx.root.join("runc-state");
    let mut c = Command::new(runc);
    c.arg("--root")
        .arg(&state)
        .args(["run", &unique("ctr")])
        .current_dir(dir)
        .stdin(std::process::Stdio::null());
    Some(spawn(c).wait_limit(Duration::from_secs(60)))
}

fn prepare_ws(fx: &Fixture) {
    // The container's user writes the workspace (nobody as root, or the
    // caller itself when rootless).
    std::fs::set_permissions(&fx.ws, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    write(fx.w(".env"), &fx.env_secret);
    std::fs::create_dir_all(fx.w("sub")).unwrap();
    std::fs::set_permissions(
        fx.w("sub"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    std::fs::set_permissions(
        fx.w(".env"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
}

// Writes go to a subdirectory: on the Landlock backend a directory holding a
// protected entry (the workspace root with its .env) is list-only.
const PROBE: &str = "echo PROBE-RAN; cat /ws/.env; echo written > /ws/sub/made && echo WROTE; python3 -c 'import socket; socket.socket()' 2>/dev/null && echo SOCKET-OPENED; true";

#[test]
fn default_seccomp_of_a_container_gets_the_landlock_backend() {
    let fx = Fixture::new();
    prepare_ws(&fx);
    let script = format!(
        "/moat/moat exec --no-audit --policy workspace-write -- echo RAN; echo DEFAULT-EXIT=$?; \
         /moat/moat exec --no-audit --json --backend auto --policy workspace-write -- sh -c \"{PROBE}\""
    );
    let dir = bundle(
        &fx,
        "seccomp",
        &["sh", "-c", &script],
        Some(no_userns_seccomp()),
        true,
    );
    let Some(out) = run_bundle(&fx, &dir) else {
        return;
    };
    // The default backend refuses, naming the option.
    assert!(out.stdout.contains("DEFAULT-EXIT=125"), "{}", out.dump());
    assert!(!out.stdout.lines().any(|l| l == "RAN"), "{}", out.dump());
    assert!(out.stderr.contains("--backend landlock"), "{}", out.dump());
    let json_start = out.stdout.find('{').unwrap_or(0);
    let v: Value = serde_json::from_str(out.stdout[json_start..].trim())
        .unwrap_or_else(|e| panic!("{e}\n{}", out.dump()));
    assert_eq!(v["sandbox"]["backend"], "landlock", "{}", out.dump());
    let stdout = v["stdout"].as_str().unwrap_or_default();
    assert!(
        stdout.contains("PROBE-RAN") && stdout.contains("WROTE"),
        "{}",
        out.dump()
    );
    assert!(
        !stdout.contains(&fx.env_secret),
        "the .env leaked\n{}",
        out.dump()
    );
    assert!(!stdout.contains("SOCKET-OPENED"), "{}", out.dump());
    assert_eq!(read(fx.w("sub/made")).as_deref(), Some("written\n"));
}

#[test]
fn full_backend_inside_a_container_with_user_namespaces_and_unmasked_proc() {
    let fx = Fixture::new();
    prepare_ws(&fx);
    let args = [
        "/moat/moat",
        "exec",
        "--no-audit",
        "--json",
        "--policy",
        "workspace-write",
        "--",
        "sh",
        "-c",
        PROBE,
    ];
    let dir = bundle(&fx, "ns", &args, None, false);
    let Some(out) = run_bundle(&fx, &dir) else {
        return;
    };
    let v = out.json();
    assert_eq!(v["sandbox"]["backend"], "namespaces", "{}", out.dump());
    assert_eq!(v["sandbox"]["layers"]["namespaces"], "full");
    let stdout = v["stdout"].as_str().unwrap_or_default();
    assert!(
        stdout.contains("PROBE-RAN") && stdout.contains("WROTE"),
        "{}",
        out.dump()
    );
    assert!(
        !stdout.contains(&fx.env_secret),
        "the .env leaked\n{}",
        out.dump()
    );
    assert!(!stdout.contains("SOCKET-OPENED"), "{}", out.dump());
    assert_eq!(read(fx.w("sub/made")).as_deref(), Some("written\n"));
    // The default masked /proc: refused, with the reason and the fixes.
    let args = ["/moat/moat", "exec", "--no-audit", "--", "echo", "RAN"];
    let dir = bundle(&fx, "masked", &args, None, true);
    let Some(out) = run_bundle(&fx, &dir) else {
        return;
    };
    out.expect_code(125)
        .expect_absent("RAN", "a refused run's output");
    assert!(out.stderr.contains("procMount: Unmasked"), "{}", out.dump());
    assert!(out.stderr.contains("--backend landlock"), "{}", out.dump());
}
