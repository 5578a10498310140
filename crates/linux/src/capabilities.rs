//! `moat capabilities`: what THIS host can guarantee, found by trying each
//! primitive (and then each level end to end) in a throwaway child, never
//! by assuming.

use std::ffi::OsString;
use std::path::Path;

use moat_policy::{Level, NetworkMode, Policy, PolicyRequest};
use serde_json::{json, Map, Value};

use crate::sys;

/// One probe's result.
fn probe_result(name: &str, ok: bool, detail: String) -> Value {
    json!({"name": name, "status": if ok { "ok" } else { "failed" }, "detail": detail})
}

/// Runs `f` in a forked child; Ok(()) when it exited 0, else the errno it exited with.
fn in_child(f: impl FnOnce() -> Result<(), i32>) -> Result<(), String> {
    // SAFETY: glibc's fork runs its atfork handlers, so the allocator is
    // usable in the child even when this process has other threads (`moat
    // serve`, `moat mcp`); the probes take no other lock (no stdio, no
    // environment) before they `_exit`.
    match unsafe { sys::fork_glibc() } {
        Ok(0) => {
            let code = match f() {
                Ok(()) => 0,
                Err(e) => e.clamp(1, 255),
            };
            sys::exit_now(code);
        }
        Ok(pid) => match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
            Ok(nix::sys::wait::WaitStatus::Exited(_, e)) => {
                Err(std::io::Error::from_raw_os_error(e).to_string())
            }
            Ok(other) => Err(format!("{other:?}")),
            Err(e) => Err(e.to_string()),
        },
        Err(e) => Err(e.to_string()),
    }
}

fn errno_of(e: nix::errno::Errno) -> i32 {
    e as i32
}

const NS: moat_policy::Backend = moat_policy::Backend::Namespaces;
const LL: moat_policy::Backend = moat_policy::Backend::Landlock;

/// The full report printed by `moat capabilities`.
pub fn report(moat_env: Vec<(String, String)>) -> Value {
    let mut probes = Vec::new();
    let userns =
        in_child(|| nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(errno_of));
    probes.push(probe_result(
        "user_namespace",
        userns.is_ok(),
        userns
            .clone()
            .err()
            .unwrap_or_else(|| "unshare(CLONE_NEWUSER) succeeded".into()),
    ));
    let kinds = [
        ("mount_namespace", nix::sched::CloneFlags::CLONE_NEWNS),
        ("pid_namespace", nix::sched::CloneFlags::CLONE_NEWPID),
        ("ipc_namespace", nix::sched::CloneFlags::CLONE_NEWIPC),
        ("uts_namespace", nix::sched::CloneFlags::CLONE_NEWUTS),
        ("net_namespace", nix::sched::CloneFlags::CLONE_NEWNET),
        ("cgroup_namespace", nix::sched::CloneFlags::CLONE_NEWCGROUP),
    ];
    let mut ns_ok = Map::new();
    for (name, flag) in kinds {
        let r = in_child(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(errno_of)?;
            nix::sched::unshare(flag).map_err(errno_of)
        });
        ns_ok.insert(name.into(), Value::Bool(r.is_ok()));
        probes.push(probe_result(
            name,
            r.is_ok(),
            r.err()
                .unwrap_or_else(|| "created inside a new user namespace".into()),
        ));
    }
    let abi = sys::landlock_abi();
    probes.push(probe_result(
        "landlock",
        abi > 0,
        if abi > 0 {
            format!("ABI {abi}")
        } else {
            "landlock_create_ruleset failed: Landlock not enabled".into()
        },
    ));
    let seccomp = in_child(|| {
        sys::set_no_new_privs().map_err(|e| e.raw_os_error().unwrap_or(1))?;
        // The real floor, so the probe also proves it compiles and loads.
        let prog = crate::confine::seccomp_filter(&crate::plan::SeccompSpec {
            floor: crate::confine::SECCOMP_FLOOR.to_vec(),
            denied_ioctls: crate::confine::DENIED_IOCTLS.to_vec(),
            socket_families: Some(vec![libc::AF_UNIX]),
            ..Default::default()
        })
        .map_err(|_| 22)?;
        crate::confine::apply_seccomp(&prog).map_err(|_| 1)?;
        // The filter must actually refuse: an AF_INET socket has to fail with EPERM.
        match nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Inet,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::empty(),
            None,
        ) {
            Err(nix::errno::Errno::EPERM) => Ok(()),
            _ => Err(libc::EINVAL),
        }
    });
    probes.push(probe_result(
        "seccomp_filter",
        seccomp.is_ok(),
        seccomp
            .clone()
            .err()
            .unwrap_or_else(|| "filter installed and refused socket(AF_INET) with EPERM".into()),
    ));

    // Each level end to end: build its real plan and run `true` in it, in a
    // directory of our own (the shared temp dir itself is refused as a
    // workspace: other programs' sockets live there, and other users'
    // directories the complete `.env` walk must refuse).
    let own_ws = private_temp_dir();
    let ws = own_ws.clone().unwrap_or_else(std::env::temp_dir);
    let home = moat_env
        .iter()
        .find(|(k, _)| k == "HOME")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| "/".into());
    let true_bin = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("/bin/true");
    let mut levels = Map::new();
    let mut level_ok = Map::new();
    for level in Level::ALL {
        let network = if level.is_sandboxed() {
            NetworkMode::Disabled
        } else {
            NetworkMode::Unmanaged
        };
        let r = end_to_end(level, network, NS, &ws, &home, true_bin, &moat_env);
        level_ok.insert(level.as_str().into(), Value::Bool(r.is_ok()));
        levels.insert(level.as_str().into(), status_value(&r));
        probes.push(probe_result(
            &format!("sandbox_level:{level}"),
            r.is_ok(),
            r.err().unwrap_or_else(|| "ran `true` at this level".into()),
        ));
    }
    let mut modes = Map::new();
    let disabled_ok = level_ok
        .get("workspace-contained")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    modes.insert(
        "disabled".into(),
        status_value(&if disabled_ok {
            Ok(())
        } else {
            Err("sandbox levels unavailable".to_string())
        }),
    );
    let unmanaged = end_to_end(
        Level::WorkspaceContained,
        NetworkMode::Unmanaged,
        NS,
        &ws,
        &home,
        true_bin,
        &moat_env,
    );
    probes.push(probe_result(
        "network_mode:unmanaged",
        unmanaged.is_ok(),
        unmanaged.clone().err().unwrap_or_else(|| {
            "ran `true` on the host network with abstract-socket scoping".into()
        }),
    ));
    modes.insert("unmanaged".into(), status_value(&unmanaged));
    let proxy = end_to_end(
        Level::WorkspaceContained,
        NetworkMode::Proxy,
        NS,
        &ws,
        &home,
        true_bin,
        &moat_env,
    );
    probes.push(probe_result(
        "network_mode:proxy",
        proxy.is_ok(),
        proxy.clone().err().unwrap_or_else(|| {
            "ran `true` in a loopback-only namespace with the proxy endpoints handed out".into()
        }),
    ));
    modes.insert("proxy".into(), status_value(&proxy));

    // Which backend can give each level with each network mode, probed:
    // namespaces from the runs above, the Landlock backend by its own runs
    // (a mode it refuses is refused by the plan, before anything runs).
    let mut backends = Map::new();
    for level in Level::ALL.into_iter().filter(|l| l.is_sandboxed()) {
        let mut per_mode = Map::new();
        for mode in [
            NetworkMode::Disabled,
            NetworkMode::Proxy,
            NetworkMode::Unmanaged,
        ] {
            let level_ok = level_ok
                .get(level.as_str())
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let mode_ok = match mode {
                NetworkMode::Disabled => Ok(()),
                NetworkMode::Proxy => proxy.clone(),
                NetworkMode::Unmanaged => unmanaged.clone(),
            };
            let ns = match (level_ok, mode_ok) {
                (true, Ok(())) => Ok(()),
                (false, _) => Err("the level did not run with namespaces here".to_string()),
                (_, Err(e)) => Err(e),
            };
            let ll = end_to_end(level, mode, LL, &ws, &home, true_bin, &moat_env);
            probes.push(probe_result(
                &format!("backend:landlock:{level}:{mode}"),
                ll.is_ok(),
                ll.clone()
                    .err()
                    .unwrap_or_else(|| "ran `true` with Landlock and seccomp only".into()),
            ));
            per_mode.insert(
                mode.as_str().into(),
                json!({"namespaces": status_value(&ns), "landlock": status_value(&ll)}),
            );
        }
        backends.insert(level.as_str().into(), Value::Object(per_mode));
    }
    if let Some(d) = &own_ws {
        let _ = std::fs::remove_dir(d);
    }

    json!({
        "platform": "linux",
        "backends": backends,
        "landlock_backend_cannot_give": crate::backend::NOT_GIVEN,
        "sandbox_levels": levels,
        "network_modes": modes,
        "features": {
            "namespaces": ns_ok,
            "landlock": {"available": abi > 0, "abi": abi, "scoping": abi >= 6},
            "seccomp": seccomp.is_ok(),
            "pivot_root": level_ok.get("workspace-contained").cloned().unwrap_or(Value::Bool(false)),
            "uid": nix::unistd::getuid().as_raw(),
        },
        "capability_probes": probes,
        "limits": crate::limits::capabilities(&crate::limits::LimitFacts::probe()),
    })
}

/// A fresh directory of this process's own under the temp dir (mode 0700;
/// never one that already exists, which another user could have planted).
fn private_temp_dir() -> Option<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    (0..16).find_map(|i| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let d = base.join(format!(
            "moat-capabilities-{}-{nanos}-{i}",
            std::process::id()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&d)
            .ok()
            .map(|()| d)
    })
}

fn status_value(r: &Result<(), String>) -> Value {
    match r {
        Ok(()) => json!("supported"),
        Err(e) => json!(format!("unsupported: {e}")),
    }
}

fn end_to_end(
    level: Level,
    network: NetworkMode,
    backend: moat_policy::Backend,
    ws: &Path,
    home: &str,
    true_bin: &str,
    env: &[(String, String)],
) -> Result<(), String> {
    let policy = Policy::resolve(PolicyRequest {
        level: Some(level),
        network: Some(network),
        workspace: std::fs::canonicalize(ws).map_err(|e| e.to_string())?,
        home: std::fs::canonicalize(home).unwrap_or_else(|_| home.into()),
        backend,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let facts = crate::probe::HostFacts::probe(&policy, env.to_vec());
    let plan = crate::plan::build(&policy, &facts).map_err(|e| e.to_string())?;
    in_single_threaded_child(|| {
        let out = crate::run::run(
            &plan,
            &crate::run::RunOptions {
                argv: vec![OsString::from(true_bin)],
                output: crate::run::OutputMode::Capture { limit: 4096 },
                timeout: Some(std::time::Duration::from_secs(10)),
                tag: "probe".into(),
                stdio_from_outer_sandbox: false,
                cwd_identity: None,
            },
            &mut crate::run::NoObserver,
        );
        match (out.exit_code, out.error) {
            (0, _) => Ok(()),
            (_, Some(e)) => Err(e),
            (c, None) => Err(format!("`true` exited {c}")),
        }
    })
}

/// Runs `f` in a child made by glibc's fork, which has one thread, and
/// returns its result (the message through a pipe). `run` raw-clones the
/// sandbox's init, which is sound only from a single-threaded process, and
/// this report is also made by `moat serve` and `moat mcp`, which have
/// threads. The child's run is its own, too: its subreaper bit and
/// descendant sweep never touch the caller's other children.
fn in_single_threaded_child(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("create a pipe: {e}"))?;
    // SAFETY: glibc's fork runs its atfork handlers, so the allocator is
    // usable in the child, which has this one thread; the child runs the
    // probe and leaves with `_exit`. (A lock of std's another thread held at
    // the fork, such as stderr's, would block it: `run` writes to stderr
    // only when it cannot leave a cgroup, which the probe runs without.)
    match unsafe { sys::fork_glibc() } {
        Ok(0) => {
            drop(r);
            let code = match f() {
                Ok(()) => 0,
                Err(msg) => {
                    sys::write_all_fd(w.as_raw_fd(), msg.as_bytes());
                    1
                }
            };
            sys::exit_now(code);
        }
        Ok(pid) => {
            drop(w);
            let mut msg = String::new();
            let _ = std::fs::File::from(r).read_to_string(&mut msg);
            match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None) {
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
                Ok(_) if !msg.is_empty() => Err(msg),
                Ok(other) => Err(format!("the probe's process ended: {other:?}")),
                Err(e) => Err(format!("wait for the probe's process: {e}")),
            }
        }
        Err(e) => Err(format!("fork the probe's process: {e}")),
    }
}
