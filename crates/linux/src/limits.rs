//! Resource limits on Linux: for each limit the run asks for, the strongest
//! mechanism this host gives is chosen (probed, never assumed), set up before
//! the command starts, read back to say which limit ended the run, and torn
//! down after it.
//!
//! Mechanisms, strongest first:
//! - a per-run cgroup v1 (`memory`, `pids`) under moat's own cgroup, when the
//!   host mounts those controllers as v1 and moat may create a child there
//!   (root on this kind of host). Memory counts the whole run (RSS + page
//!   cache, no swap); pids counts every task of the run.
//! - rlimits, set in the command just before exec and only ever lowered
//!   (moat has no CAP_SYS_RESOURCE to raise one): `RLIMIT_AS` as the memory
//!   fallback (virtual memory, per process), `RLIMIT_NPROC` for pids inside
//!   the run's own user namespace (the kernel charges it per user namespace
//!   and uid since Linux 5.14, so only this run's tasks count; root on the
//!   host is exempt from it, so it is never offered to root), `RLIMIT_CPU`,
//!   `RLIMIT_FSIZE`, `RLIMIT_NOFILE` (all per process).
//! - the tmpfs `size=` of the sandbox's private /tmp, HOME and /dev/shm.
//! - moat's supervisor for the output (it counts the bytes it relays).
//!
//! A delegated cgroup v2 subtree is not used yet (it is reported as missing).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use moat_policy::{Limits, LimitsMode};
use nix::sys::resource::Resource;
use serde::Serialize;

/// How one limit is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// A per-run cgroup v1 controller (memory or pids).
    CgroupV1,
    /// A per-process rlimit, set before exec (lowered only).
    Rlimit,
    /// `RLIMIT_AS`: virtual memory per process (the memory fallback).
    RlimitAs,
    /// `RLIMIT_NPROC`, counted inside the run's own user namespace.
    RlimitNproc,
    /// The size of each private tmpfs (/tmp, HOME, /dev/shm).
    TmpfsSize,
    /// moat's supervisor counts the bytes and stops the run.
    Supervisor,
}

/// One limit as this run gets it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Applied {
    pub limit: &'static str,
    /// Bytes, a count, or milliseconds (cpu_time).
    pub value: u64,
    /// None: not enforced on this host (only with `--limits best-effort`).
    pub mechanism: Option<Mechanism>,
    pub enforced: bool,
    /// What the mechanism counts, or why the limit is not enforced.
    pub detail: String,
}

/// Which limit ended a run, or how else it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminationReason {
    Memory,
    Pids,
    Cpu,
    FileSize,
    Output,
    Timeout,
    Signal,
    Exit,
}

impl TerminationReason {
    pub fn as_str(self) -> &'static str {
        match self {
            TerminationReason::Memory => "memory",
            TerminationReason::Pids => "pids",
            TerminationReason::Cpu => "cpu",
            TerminationReason::FileSize => "file_size",
            TerminationReason::Output => "output",
            TerminationReason::Timeout => "timeout",
            TerminationReason::Signal => "signal",
            TerminationReason::Exit => "exit",
        }
    }
}

/// What a run used. `None` where moat could not measure it (the init was
/// killed before it could report).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ResourceUsage {
    /// The largest resident set of any one process of the run.
    pub max_rss_bytes: Option<u64>,
    /// User + system CPU time of every process of the run.
    pub cpu_ms: Option<u64>,
    pub duration_ms: u64,
}

/// What this host offers for limits, probed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitFacts {
    /// moat's own cgroup directory of the v1 `memory` controller, if moat may create a child there.
    pub cgroup_v1_memory: Option<PathBuf>,
    /// The same for the v1 `pids` controller.
    pub cgroup_v1_pids: Option<PathBuf>,
    /// Why no cgroup is usable (for messages).
    pub cgroup_missing: String,
    /// The caller's uid (host root is exempt from RLIMIT_NPROC).
    pub uid: u32,
    /// RLIMIT_NPROC is charged per user namespace (Linux >= 5.14).
    pub nproc_per_userns: bool,
}

impl LimitFacts {
    /// Reads /proc/self/mountinfo and /proc/self/cgroup, and checks write access.
    pub fn probe() -> LimitFacts {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let cgroups = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mut missing = Vec::new();
        let mut find = |controller: &str| {
            let dir = v1_dir(&mountinfo, &cgroups, controller);
            match &dir {
                None => missing.push(format!("no cgroup v1 {controller} controller is mounted")),
                Some(d) if !writable(d) => missing.push(format!(
                    "moat may not create a cgroup under {} (run as root, or use a host where moat gets a delegated cgroup)",
                    d.display()
                )),
                Some(_) => return dir,
            }
            None
        };
        let memory = find("memory");
        let pids = find("pids");
        LimitFacts {
            cgroup_v1_memory: memory,
            cgroup_v1_pids: pids,
            cgroup_missing: missing.join("; "),
            uid: nix::unistd::getuid().as_raw(),
            nproc_per_userns: kernel_at_least(5, 14),
        }
    }
}

/// moat may create (and remove) a child cgroup in `dir`: tried, not assumed.
fn writable(dir: &Path) -> bool {
    let probe = dir.join(format!("moat-probe-{}", std::process::id()));
    let made = fs::create_dir(&probe).is_ok();
    made && fs::remove_dir(&probe).is_ok()
}

fn kernel_at_least(major: u32, minor: u32) -> bool {
    let Ok(u) = nix::sys::utsname::uname() else {
        return false;
    };
    let release = u.release().to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let ma: u32 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let mi: u32 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    (ma, mi) >= (major, minor)
}

/// moat's own directory in the v1 hierarchy of `controller`: the mount point
/// (from mountinfo: fstype `cgroup` with the controller in its super options)
/// joined with moat's path in that hierarchy (from /proc/self/cgroup).
fn v1_dir(mountinfo: &str, cgroups: &str, controller: &str) -> Option<PathBuf> {
    let mount = mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mut post = post.split_whitespace();
        let (fstype, _src, opts) = (post.next()?, post.next()?, post.next()?);
        if fstype != "cgroup" || !opts.split(',').any(|o| o == controller) {
            return None;
        }
        // Only a mount of the hierarchy's root gives moat's own path.
        let mut f = pre.split_whitespace();
        let root = f.nth(3)?;
        let point = f.next()?;
        (root == "/").then(|| PathBuf::from(point))
    })?;
    let own = cgroups.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        ctrls.split(',').any(|c| c == controller).then_some(path)
    })?;
    let own = own.trim_start_matches('/');
    Some(if own.is_empty() {
        mount
    } else {
        mount.join(own)
    })
}

/// Why a limit cannot be enforced on this host.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--{flag} cannot be enforced here: {why}. Run where that is available, drop --{flag}, or pass --limits best-effort to run without it (the result then says it was not enforced)")]
pub struct LimitError {
    pub flag: &'static str,
    pub why: String,
}

/// The per-run cgroup (one directory per v1 controller).
#[derive(Debug)]
pub struct RunCgroup {
    /// (controller, the run's directory, moat's own directory).
    dirs: Vec<(&'static str, PathBuf, PathBuf)>,
}

/// Everything the supervisor needs to enforce and read back the limits.
#[derive(Debug, Default)]
pub struct Enforcer {
    pub applied: Vec<Applied>,
    /// (resource, soft, hard) set in the command before exec (lowered only).
    pub rlimits: Vec<(Resource, u64, u64)>,
    pub cgroup: Option<RunCgroup>,
    /// pids through RLIMIT_NPROC: the supervisor watches the run's count to
    /// tell that the limit was reached (the kernel keeps no counter of
    /// refused forks for rlimits).
    pub nproc_limit: Option<u64>,
    pub output: Option<u64>,
}

/// Decides the mechanism of every limit (pure: facts in, decisions out).
pub fn choose(
    limits: &Limits,
    sandboxed: bool,
    facts: &LimitFacts,
) -> Result<Vec<Applied>, LimitError> {
    let mut out = Vec::new();
    let mut put = |limit: &'static str,
                   value: Option<u64>,
                   got: Result<(Mechanism, String), String>|
     -> Result<(), LimitError> {
        let Some(value) = value else { return Ok(()) };
        match got {
            Ok((m, detail)) => out.push(Applied {
                limit,
                value,
                mechanism: Some(m),
                enforced: true,
                detail,
            }),
            Err(why)
                if limits.mode == LimitsMode::BestEffort
                    || limits.best_effort.iter().any(|b| b == limit) =>
            {
                out.push(Applied {
                    limit,
                    value,
                    mechanism: None,
                    enforced: false,
                    detail: why,
                })
            }
            Err(why) => {
                return Err(LimitError {
                    flag: flag_of(limit),
                    why,
                })
            }
        }
        Ok(())
    };
    let rlimit = |what: &str| Ok((Mechanism::Rlimit, format!("{what}, per process")));
    put(
        "memory",
        limits.memory,
        Ok(match facts.cgroup_v1_memory {
            Some(_) => (
                Mechanism::CgroupV1,
                "the whole run's memory (cgroup v1 memory controller; the kernel's OOM killer ends the largest process)".into(),
            ),
            None => (
                Mechanism::RlimitAs,
                format!("virtual memory (address space) per process, RLIMIT_AS: no per-run cgroup here ({})", facts.cgroup_missing),
            ),
        }),
    )?;
    let pids = if facts.cgroup_v1_pids.is_some() {
        Ok((
            Mechanism::CgroupV1,
            "every process and thread of the run (cgroup v1 pids controller)".into(),
        ))
    } else if !sandboxed {
        Err(format!("this run has no user namespace of its own (danger-full-access, or the Landlock backend), so RLIMIT_NPROC would count every process of the user, and no per-run cgroup is usable ({})", facts.cgroup_missing))
    } else if facts.uid == 0 {
        Err(format!(
            "host root is exempt from RLIMIT_NPROC, and no per-run cgroup is usable ({})",
            facts.cgroup_missing
        ))
    } else if !facts.nproc_per_userns {
        Err("this kernel (< 5.14) charges RLIMIT_NPROC to the user across the host, not to the run's user namespace".into())
    } else {
        Ok((
            Mechanism::RlimitNproc,
            "processes and threads of the run, moat's init included (RLIMIT_NPROC in the run's own user namespace)".into(),
        ))
    };
    put("pids", limits.pids, pids)?;
    put(
        "cpu_time",
        limits.cpu_time_ms,
        rlimit("CPU time (RLIMIT_CPU, SIGXCPU when reached)"),
    )?;
    put(
        "file_size",
        limits.file_size,
        rlimit("largest file written (RLIMIT_FSIZE, SIGXFSZ when exceeded)"),
    )?;
    put(
        "open_files",
        limits.open_files,
        rlimit("open file descriptors (RLIMIT_NOFILE, EMFILE when reached)"),
    )?;
    put(
        "tmp_size",
        limits.tmp_size,
        if sandboxed {
            Ok((
                Mechanism::TmpfsSize,
                "each private tmpfs (/tmp, HOME, /dev/shm); writes past it fail with ENOSPC".into(),
            ))
        } else {
            Err("this run has no private /tmp or HOME (danger-full-access, or the Landlock backend)".into())
        },
    )?;
    put(
        "output",
        limits.output,
        Ok((
            Mechanism::Supervisor,
            "stdout + stderr bytes; moat stops the run when it is exceeded".into(),
        )),
    )?;
    Ok(out)
}

/// The CLI flag that sets `limit` (for messages).
pub fn flag_of(limit: &str) -> &'static str {
    match limit {
        "memory" => "memory",
        "pids" => "pids",
        "cpu_time" => "cpu-time",
        "file_size" => "file-size",
        "open_files" => "open-files",
        "tmp_size" => "tmp-size",
        _ => "output-limit",
    }
}

/// Chooses the mechanisms and prepares them (creates the run's cgroup).
/// `tag` names the cgroup (the execution id).
pub fn prepare(
    limits: &Limits,
    sandboxed: bool,
    facts: &LimitFacts,
    tag: &str,
) -> Result<Enforcer, String> {
    let applied = choose(limits, sandboxed, facts).map_err(|e| e.to_string())?;
    let mut e = Enforcer {
        output: limits.output,
        ..Default::default()
    };
    let mut cg = RunCgroup { dirs: Vec::new() };
    let name = format!("moat-{}", sanitize(tag));
    for a in &applied {
        let lowered = |v: u64| (v, v);
        match (a.limit, a.mechanism) {
            ("memory", Some(Mechanism::CgroupV1)) => {
                if let Some(own) = &facts.cgroup_v1_memory {
                    let dir = cg.create("memory", own, &name)?;
                    write_knob(&dir, "memory.limit_in_bytes", a.value)?;
                    // With swap accounting, memory+swap gets the same limit
                    // (no swapping out past it).
                    if dir.join("memory.memsw.limit_in_bytes").exists() {
                        write_knob(&dir, "memory.memsw.limit_in_bytes", a.value)?;
                    }
                }
            }
            ("memory", Some(Mechanism::RlimitAs)) => {
                let (s, h) = lowered(a.value);
                e.rlimits.push((Resource::RLIMIT_AS, s, h));
            }
            ("pids", Some(Mechanism::CgroupV1)) => {
                if let Some(own) = &facts.cgroup_v1_pids {
                    let dir = cg.create("pids", own, &name)?;
                    write_knob(&dir, "pids.max", a.value)?;
                }
            }
            ("pids", Some(Mechanism::RlimitNproc)) => {
                e.rlimits.push((Resource::RLIMIT_NPROC, a.value, a.value));
                e.nproc_limit = Some(a.value);
            }
            ("cpu_time", Some(_)) => {
                // Whole seconds, rounded up; SIGXCPU at the soft limit, and
                // SIGKILL a second later if the process ignores it.
                let secs = a.value.div_ceil(1000).max(1);
                e.rlimits.push((Resource::RLIMIT_CPU, secs, secs + 1));
            }
            ("file_size", Some(_)) => {
                let (s, h) = lowered(a.value);
                e.rlimits.push((Resource::RLIMIT_FSIZE, s, h));
            }
            ("open_files", Some(_)) => {
                let (s, h) = lowered(a.value);
                e.rlimits.push((Resource::RLIMIT_NOFILE, s, h));
            }
            _ => {}
        }
    }
    if !cg.dirs.is_empty() {
        e.cgroup = Some(cg);
    }
    e.applied = applied;
    Ok(e)
}

fn sanitize(tag: &str) -> String {
    tag.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

fn write_knob(dir: &Path, knob: &str, value: u64) -> Result<(), String> {
    fs::write(dir.join(knob), value.to_string())
        .map_err(|e| format!("set {} in the run's cgroup: {e}", knob))
}

/// How old an empty `moat-*` cgroup must be before another run removes it:
/// far longer than a run holds its new cgroup empty while it sets it up.
const STALE_CGROUP_AGE: Duration = Duration::from_secs(10 * 60);

/// Removes the empty `moat-*` cgroups under `own` that a moat killed
/// outright (SIGKILL, OOM) left behind: nobody else would. A cgroup with a
/// process in it is never touched (rmdir refuses it anyway), and a young
/// one may be a run being set up.
fn sweep_stale(own: &Path) {
    let Ok(rd) = fs::read_dir(own) else {
        return;
    };
    for e in rd.flatten() {
        if !e.file_name().to_string_lossy().starts_with("moat-") {
            continue;
        }
        let old = e
            .metadata()
            .ok()
            .filter(|m| m.is_dir())
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_CGROUP_AGE);
        let empty =
            fs::read_to_string(e.path().join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty());
        if old && empty {
            let _ = fs::remove_dir(e.path());
        }
    }
}

impl RunCgroup {
    fn create(
        &mut self,
        controller: &'static str,
        own: &Path,
        name: &str,
    ) -> Result<PathBuf, String> {
        sweep_stale(own);
        let dir = own.join(name);
        fs::create_dir(&dir).map_err(|e| {
            format!(
                "create the run's cgroup {}: {e}; pass --limits best-effort to run without it",
                dir.display()
            )
        })?;
        self.dirs.push((controller, dir.clone(), own.to_path_buf()));
        Ok(dir)
    }

    /// Moves the calling process (the supervisor) into the run's cgroups, so
    /// the init cloned next starts inside them with nothing to race.
    pub fn enter(&self) -> Result<(), String> {
        let me = std::process::id().to_string();
        for (c, dir, _) in &self.dirs {
            fs::write(dir.join("cgroup.procs"), &me)
                .map_err(|e| format!("enter the run's {c} cgroup: {e}"))?;
        }
        Ok(())
    }

    /// Moves the supervisor back to where it was.
    pub fn leave(&self) -> Result<(), String> {
        let me = std::process::id().to_string();
        for (c, _, own) in &self.dirs {
            fs::write(own.join("cgroup.procs"), &me)
                .map_err(|e| format!("leave the run's {c} cgroup: {e}"))?;
        }
        Ok(())
    }

    fn knob(&self, controller: &str, file: &str) -> Option<String> {
        let (_, dir, _) = self.dirs.iter().find(|(c, _, _)| *c == controller)?;
        fs::read_to_string(dir.join(file)).ok()
    }

    /// The kernel's OOM killer ended a process of the run.
    pub fn oom_killed(&self) -> bool {
        self.knob("memory", "memory.oom_control")
            .and_then(|t| field(&t, "oom_kill"))
            .is_some_and(|n| n > 0)
    }

    /// A fork was refused because the run reached its pids limit.
    pub fn pids_reached(&self) -> bool {
        self.knob("pids", "pids.events")
            .and_then(|t| field(&t, "max"))
            .is_some_and(|n| n > 0)
    }

    /// The run's peak memory (whole cgroup).
    pub fn memory_peak(&self) -> Option<u64> {
        self.knob("memory", "memory.max_usage_in_bytes")
            .and_then(|t| t.trim().parse().ok())
    }

    /// Kills whatever is still in the run's cgroups (nothing, normally: the
    /// init kills its tree first) and removes them. Retries while the kernel
    /// still holds exiting tasks.
    pub fn remove(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut errors = Vec::new();
        for (c, dir, _) in &self.dirs {
            loop {
                for pid in fs::read_to_string(dir.join("cgroup.procs"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|p| p.parse::<libc::pid_t>().ok())
                {
                    let _ = crate::sys::kill(pid, libc::SIGKILL);
                }
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => {
                        errors.push(format!(
                            "remove the run's {c} cgroup {}: {e}",
                            dir.display()
                        ));
                        break;
                    }
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

/// `name N` in a flat key-value cgroup file.
fn field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Sets the rlimits in the calling process (the command, just before exec).
/// Only lowers: a value above the current hard limit becomes that limit.
pub fn apply_rlimits(rlimits: &[(Resource, u64, u64)]) -> Result<(), String> {
    for (r, soft, hard) in rlimits {
        let (_, cur_hard) =
            nix::sys::resource::getrlimit(*r).map_err(|e| format!("read the limit {r:?}: {e}"))?;
        let hard = (*hard).min(cur_hard);
        let soft = (*soft).min(hard);
        nix::sys::resource::setrlimit(*r, soft, hard)
            .map_err(|e| format!("set the limit {r:?}: {e}"))?;
    }
    Ok(())
}

/// The per-limit report of `moat capabilities`: which mechanism this host
/// gives each limit, for sandboxed runs and for danger-full-access.
pub fn capabilities(facts: &LimitFacts) -> serde_json::Value {
    let all = Limits {
        memory: Some(1),
        pids: Some(1),
        cpu_time_ms: Some(1),
        file_size: Some(1),
        open_files: Some(1),
        tmp_size: Some(1),
        output: Some(1),
        mode: LimitsMode::BestEffort,
        best_effort: Vec::new(),
    };
    let per = |sandboxed: bool| {
        let mut m = serde_json::Map::new();
        for a in choose(&all, sandboxed, facts).unwrap_or_default() {
            m.insert(
                a.limit.into(),
                serde_json::json!({"mechanism": a.mechanism, "enforced": a.enforced, "detail": a.detail}),
            );
        }
        serde_json::Value::Object(m)
    };
    serde_json::json!({
        "cgroup_v1_memory": facts.cgroup_v1_memory,
        "cgroup_v1_pids": facts.cgroup_v1_pids,
        "cgroup_v2_delegated": {"used": false, "detail": "moat does not use a delegated cgroup v2 subtree yet"},
        "sandboxed": per(true),
        "danger_full_access": per(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 30 0:34 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const CGROUP: &str = "8:pids:/\n4:memory:/process_api/abc\n0::/\n";

    #[test]
    fn v1_dirs_join_mount_point_and_own_path() {
        assert_eq!(
            v1_dir(MOUNTINFO, CGROUP, "memory"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(
            v1_dir(MOUNTINFO, CGROUP, "pids"),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
        assert_eq!(v1_dir(MOUNTINFO, CGROUP, "cpu"), None);
    }

    fn facts(cgroups: bool, uid: u32) -> LimitFacts {
        LimitFacts {
            cgroup_v1_memory: cgroups.then(|| "/m".into()),
            cgroup_v1_pids: cgroups.then(|| "/p".into()),
            cgroup_missing: "none".into(),
            uid,
            nproc_per_userns: true,
        }
    }

    fn mech(a: &[Applied], limit: &str) -> Option<Mechanism> {
        a.iter()
            .find(|x| x.limit == limit)
            .and_then(|x| x.mechanism)
    }

    #[test]
    fn strongest_mechanism_per_host() {
        let l = Limits {
            memory: Some(1 << 28),
            pids: Some(64),
            ..Default::default()
        };
        let root = choose(&l, true, &facts(true, 0)).unwrap();
        assert_eq!(mech(&root, "memory"), Some(Mechanism::CgroupV1));
        assert_eq!(mech(&root, "pids"), Some(Mechanism::CgroupV1));
        let user = choose(&l, true, &facts(false, 1000)).unwrap();
        assert_eq!(mech(&user, "memory"), Some(Mechanism::RlimitAs));
        assert_eq!(mech(&user, "pids"), Some(Mechanism::RlimitNproc));
    }

    #[test]
    fn unenforceable_is_refused_unless_best_effort() {
        let mut l = Limits {
            pids: Some(64),
            ..Default::default()
        };
        // Root without cgroups: exempt from RLIMIT_NPROC.
        let e = choose(&l, true, &facts(false, 0)).unwrap_err();
        assert_eq!(e.flag, "pids");
        assert!(e.to_string().contains("--limits best-effort"), "{e}");
        // danger-full-access: no private /tmp.
        let t = Limits {
            tmp_size: Some(1 << 20),
            ..Default::default()
        };
        assert!(choose(&t, false, &facts(true, 0)).is_err());
        l.mode = LimitsMode::BestEffort;
        let a = choose(&l, true, &facts(false, 0)).unwrap();
        assert_eq!(a.len(), 1);
        assert!(!a[0].enforced);
        assert_eq!(a[0].mechanism, None);
    }

    #[test]
    fn flat_keyed_files_parse() {
        assert_eq!(
            field("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", "oom_kill"),
            Some(2)
        );
        assert_eq!(field("max 0\n", "max"), Some(0));
        assert_eq!(field("", "max"), None);
    }
}
