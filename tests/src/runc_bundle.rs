//! OCI bundles for runc built from bind mounts of the host's `/usr` and
//! `/etc` (no image registry): shared by the container tests
//! (`tests/tests/containers.rs`, `tests/tests/containers_suite.rs`).
//!
//! As root the container runs its process as an unprivileged uid (root in a
//! container without CAP_SETFCAP may not map itself into a new user
//! namespace); as an unprivileged user runc runs rootless (its own user
//! namespace, the caller mapped to 0).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::{euid, moat_bin, skip, spawn, unique, Fixture, Out};

/// The runc binary, if installed.
pub fn runc() -> Option<PathBuf> {
    ["/usr/sbin/runc", "/usr/bin/runc", "/sbin/runc"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// What a bundle adds to the base one.
#[derive(Default)]
pub struct Extra {
    /// Host directories bound read-only: (destination inside, host source).
    pub ro_binds: Vec<(String, PathBuf)>,
    /// More `NAME=value` entries for the process environment.
    pub env: Vec<String>,
}

/// Builds a bundle under the fixture that runs `args` in the workspace
/// (bound at /ws) with moat's directory at /moat; `seccomp` is the profile, if any.
pub fn bundle(
    fx: &Fixture,
    name: &str,
    args: &[&str],
    seccomp: Option<Value>,
    masked_proc: bool,
) -> PathBuf {
    bundle_with(fx, name, args, seccomp, masked_proc, &Extra::default())
}

/// [`bundle`] with extra read-only binds and environment. /tmp and /var/tmp
/// are tmpfs (the conformance harness puts its fixtures under /var/tmp).
pub fn bundle_with(
    fx: &Fixture,
    name: &str,
    args: &[&str],
    seccomp: Option<Value>,
    masked_proc: bool,
    extra: &Extra,
) -> PathBuf {
    let dir = fx.root.join(name);
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(rootfs.join("var/tmp")).unwrap();
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/sys", "type": "none", "source": "/sys", "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["mode=1777"]}),
        json!({"destination": "/var/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["mode=1777"]}),
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
    for (dest, _) in &extra.ro_binds {
        std::fs::create_dir_all(rootfs.join(dest.trim_start_matches('/'))).unwrap();
    }
    // runc gives a tmpfs the mode of the directory it covers.
    for t in ["tmp", "var/tmp"] {
        std::fs::set_permissions(rootfs.join(t), PermissionsExt::from_mode(0o1777)).unwrap();
    }
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
    for (dest, src) in &extra.ro_binds {
        mounts.push(
            json!({"destination": dest, "type": "bind", "source": src, "options": ["rbind", "ro"]}),
        );
    }
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
        let (u, g) = (euid(), getgid());
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
    let mut env = vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".to_string(),
        "HOME=/tmp".to_string(),
        "LANG=C.UTF-8".to_string(),
    ];
    env.extend(extra.env.iter().cloned());
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": user,
            "args": args,
            "env": env,
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

fn getgid() -> u32 {
    let out = Command::new("id").arg("-g").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Docker's default profile refuses new user namespaces; this is that part.
pub fn no_userns_seccomp() -> Value {
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

/// Runs the bundle with runc (60 s hang guard), or prints a skip line and
/// returns None when runc is not installed.
pub fn run_bundle(fx: &Fixture, dir: &Path) -> Option<Out> {
    run_bundle_limit(fx, dir, Duration::from_secs(60))
}

/// [`run_bundle`] with another hang guard.
pub fn run_bundle_limit(fx: &Fixture, dir: &Path, limit: Duration) -> Option<Out> {
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
        .stdin(Stdio::null());
    Some(spawn(c).wait_limit(limit))
}

/// Makes the workspace writable by the container's user (nobody as root,
/// or the caller itself when rootless), with a `.env` secret and a `sub/`.
pub fn prepare_ws(fx: &Fixture) {
    std::fs::set_permissions(&fx.ws, PermissionsExt::from_mode(0o777)).unwrap();
    crate::write(fx.w(".env"), &fx.env_secret);
    std::fs::create_dir_all(fx.w("sub")).unwrap();
    std::fs::set_permissions(fx.w("sub"), PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::set_permissions(fx.w(".env"), PermissionsExt::from_mode(0o644)).unwrap();
}
