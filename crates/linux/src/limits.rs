//! Resource limits on Linux: for each limit the run asks for, the strongest
//! mechanism this host gives is chosen (probed, never assumed), set up before
//! the command starts, read back to say which limit ended the run, and torn
//! down after it.
//!
//! Mechanisms, strongest first:
//! - a per-run cgroup v2 leaf in the subtree delegated to moat (a systemd
//!   user scope with `Delegate=yes`, a container's own cgroup namespace),
//!   when that subtree offers the `memory`/`pids` controllers and moat may
//!   write it: `memory.max` + `memory.swap.max = 0`, `pids.max`. See
//!   [`V2Facts`] for the protocol (cgroup v2's no-internal-processes rule).
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
    /// A per-run leaf in a delegated cgroup v2 subtree (memory or pids).
    CgroupV2,
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
    /// The host replaced a protected path while the command ran; moat
    /// stopped the run (`InitMessage::HostReplaced`).
    HostReplaced,
    /// The init could not arm the watch over the narrowing mounts once the
    /// command had started; moat stopped the run
    /// (`InitMessage::WatchFailed`).
    WatchFailed,
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
            TerminationReason::HostReplaced => "host_replaced",
            TerminationReason::WatchFailed => "watch_failed",
        }
    }

    /// The reasons the init stops a started run for, moat's failure rather
    /// than the command's (exit 125): the service reports them `failed`.
    const STOPPED_BY_MOAT: [TerminationReason; 2] = [
        TerminationReason::HostReplaced,
        TerminationReason::WatchFailed,
    ];

    /// Whether moat stopped the run for this reason (see `STOPPED_BY_MOAT`).
    pub fn stopped_by_moat(self) -> bool {
        Self::STOPPED_BY_MOAT.contains(&self)
    }

    /// The reason named `name` (`as_str`) when it is one moat stopped a
    /// run for: what the service reads back from a finish event.
    pub fn stopped_by_moat_named(name: &str) -> Option<TerminationReason> {
        Self::STOPPED_BY_MOAT
            .into_iter()
            .find(|r| r.as_str() == name)
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
    /// The delegated cgroup v2 subtree moat may use, if any.
    pub cgroup_v2: Option<V2Facts>,
    /// Why no cgroup v2 subtree is usable (empty when one is).
    pub cgroup_v2_missing: String,
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
        let (cgroup_v2, cgroup_v2_missing) =
            match V2Facts::probe(&mountinfo, &cgroups, &HostFs, std::process::id()) {
                Ok(f) => (Some(f), String::new()),
                Err(why) => (None, why),
            };
        LimitFacts {
            cgroup_v2,
            cgroup_v2_missing,
            cgroup_v1_memory: memory,
            cgroup_v1_pids: pids,
            cgroup_missing: missing.join("; "),
            uid: nix::unistd::getuid().as_raw(),
            nproc_per_userns: kernel_at_least(5, 14),
        }
    }

    /// The delegated v2 subtree, when it can give `controller`; else why not.
    pub fn v2_for(&self, controller: &str) -> Result<&V2Facts, String> {
        let Some(f) = &self.cgroup_v2 else {
            return Err(self.cgroup_v2_missing.clone());
        };
        f.usable_for(controller).map(|()| f)
    }

    /// Why no per-run cgroup gives `controller` here: the v2 reason, then
    /// the v1 ones (for messages).
    fn no_cgroup(&self, controller: &str) -> String {
        let v2 = self.v2_for(controller).err().unwrap_or_default();
        [v2.as_str(), self.cgroup_missing.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("; ")
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

/// What a user does to give moat a delegated cgroup v2 subtree of its own.
pub const V2_FIX: &str = "start moat in a cgroup of its own delegated to you, e.g. `systemd-run --user --scope -p Delegate=yes moat …` (the user manager must itself have memory and pids: see `cat /sys/fs/cgroup/user.slice/user-$(id -u).slice/user@$(id -u).service/cgroup.controllers`)";

/// The leaf moat moves itself into so that its own cgroup may enable
/// controllers for the runs' leaves (cgroup v2's no-internal-processes rule).
pub const SUPERVISOR_LEAF: &str = "moat-supervisor";

/// File operations on a cgroup filesystem: the host's, or a simulated one in
/// tests (so the protocol can be checked where no delegated v2 subtree with
/// controllers exists, as on this project's hybrid test machine).
pub trait CgroupFs: std::fmt::Debug + Send + Sync {
    fn read(&self, p: &Path) -> io::Result<String>;
    /// One write of `data` to an existing file (cgroupfs creates none).
    fn write(&self, p: &Path, data: &str) -> io::Result<()>;
    fn mkdir(&self, p: &Path) -> io::Result<()>;
    fn rmdir(&self, p: &Path) -> io::Result<()>;
    fn exists(&self, p: &Path) -> bool;
    /// This process may write `p` (access(2), W_OK).
    fn writable(&self, p: &Path) -> bool;
    /// The host's cgroupfs (stale leaves are swept there only).
    fn is_host(&self) -> bool {
        false
    }
}

/// The host's cgroup filesystem.
#[derive(Debug)]
pub struct HostFs;

impl CgroupFs for HostFs {
    fn read(&self, p: &Path) -> io::Result<String> {
        fs::read_to_string(p)
    }
    fn write(&self, p: &Path, data: &str) -> io::Result<()> {
        use std::io::Write;
        fs::OpenOptions::new()
            .write(true)
            .open(p)?
            .write_all(data.as_bytes())
    }
    fn mkdir(&self, p: &Path) -> io::Result<()> {
        fs::create_dir(p)
    }
    fn rmdir(&self, p: &Path) -> io::Result<()> {
        fs::remove_dir(p)
    }
    fn exists(&self, p: &Path) -> bool {
        p.symlink_metadata().is_ok()
    }
    fn writable(&self, p: &Path) -> bool {
        nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok()
    }
    fn is_host(&self) -> bool {
        true
    }
}

/// The cgroup v2 subtree moat may use, probed.
///
/// The protocol (cgroup v2 lets a cgroup enable controllers for its children
/// only while it holds no process itself, the root excepted):
/// 1. moat's own cgroup is the `0::` line of /proc/self/cgroup under the
///    cgroup2 mount (`/sys/fs/cgroup` on a v2 host, `/sys/fs/cgroup/unified`
///    on a hybrid one). That is the *base*, unless moat already sits in
///    `BASE/moat-supervisor` (an earlier run of this process, or of the moat
///    that started it), whose parent is then the base.
/// 2. The base must offer the controllers (`cgroup.controllers`) and be
///    delegated to moat: the directory, `cgroup.procs` and
///    `cgroup.subtree_control` writable.
/// 3. If the base does not enable them for its children yet
///    (`cgroup.subtree_control`), moat moves itself into
///    `BASE/moat-supervisor` and enables them: possible only when moat is
///    the only process in the base, else refused naming the fix. moat stays
///    in that leaf for the rest of its life (going back would mean disabling
///    the controllers under any concurrent run); systemd removes the scope,
///    leaf included, when moat exits.
/// 4. Each run gets a leaf `BASE/moat-<execution id>`, its limits set before
///    anything enters it; the supervisor steps in for the clone and back into
///    its own leaf; after the run the leaf is killed (`cgroup.kill`),
///    removed, and checked gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V2Facts {
    /// Where the runs' leaves are made.
    pub base: PathBuf,
    /// Where moat is now.
    pub own: PathBuf,
    /// The base's `cgroup.controllers`.
    pub controllers: Vec<String>,
    /// The base's `cgroup.subtree_control`.
    pub enabled: Vec<String>,
    /// Processes other than moat in the base (they block step 3).
    pub others_inside: usize,
}

/// The mount point of the cgroup2 hierarchy (a mount of its root).
fn v2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mut f = pre.split_whitespace();
        let root = f.nth(3)?;
        let point = f.next()?;
        (root == "/").then(|| PathBuf::from(point))
    })
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

impl V2Facts {
    /// Finds moat's v2 subtree from `mountinfo` and `cgroups` (the texts of
    /// /proc/self/mountinfo and /proc/self/cgroup) and reads it through
    /// `cgfs`; `pid` is moat's own. Err: why none is usable.
    pub fn probe(
        mountinfo: &str,
        cgroups: &str,
        cgfs: &dyn CgroupFs,
        pid: u32,
    ) -> Result<V2Facts, String> {
        let mount = v2_mount(mountinfo).ok_or("no cgroup2 filesystem is mounted")?;
        let path = cgroups
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or("moat is in no cgroup v2 (no `0::` line in /proc/self/cgroup)")?
            .trim();
        if path.split('/').any(|c| c == "..") {
            return Err(format!(
                "moat's cgroup v2 ({path}) is outside the hierarchy mounted at {}",
                mount.display()
            ));
        }
        let rel = path.trim_start_matches('/');
        let own = if rel.is_empty() {
            mount.clone()
        } else {
            mount.join(rel)
        };
        let base = match (own.file_name(), own.parent()) {
            (Some(n), Some(parent)) if n == SUPERVISOR_LEAF && own != mount => parent.to_path_buf(),
            _ => own.clone(),
        };
        let read = |f: &str| {
            cgfs.read(&base.join(f))
                .map_err(|e| format!("read {}: {e}", base.join(f).display()))
        };
        let controllers = words(&read("cgroup.controllers")?);
        let enabled = words(&read("cgroup.subtree_control")?);
        let others_inside = read("cgroup.procs")?
            .split_whitespace()
            .filter(|p| *p != pid.to_string())
            .count();
        let delegated = ["", "cgroup.procs", "cgroup.subtree_control"]
            .iter()
            .all(|f| cgfs.writable(&base.join(f)));
        if !delegated {
            return Err(format!(
                "moat's cgroup v2 {} is not delegated to it (not writable); {V2_FIX}",
                base.display()
            ));
        }
        Ok(V2Facts {
            base,
            own,
            controllers,
            enabled,
            others_inside,
        })
    }

    /// Whether this subtree can give a run's leaf `controller`; else why not.
    pub fn usable_for(&self, controller: &str) -> Result<(), String> {
        if !self.controllers.iter().any(|c| c == controller) {
            let hybrid = if self.base.starts_with("/sys/fs/cgroup/unified") {
                "; on this hybrid host it is bound to cgroup v1"
            } else {
                ""
            };
            return Err(format!(
                "moat's cgroup v2 {} does not offer the {controller} controller (cgroup.controllers: {:?}{hybrid}); {V2_FIX}",
                self.base.display(),
                self.controllers.join(" ")
            ));
        }
        // moat itself moves out first; anything else in the base blocks it.
        if !self.enabled.iter().any(|c| c == controller) && self.others_inside > 0 {
            return Err(format!(
                "{} other process(es) share moat's cgroup v2 {}, and cgroup v2 enables {controller} for a child only in a cgroup without processes of its own; {V2_FIX}",
                self.others_inside,
                self.base.display()
            ));
        }
        Ok(())
    }
}

/// The controller that enforces `limit` (memory or pids).
fn controller_of(limit: &str) -> &'static str {
    if limit == "memory" {
        "memory"
    } else {
        "pids"
    }
}

/// One run's leaf in the delegated cgroup v2 subtree.
#[derive(Debug)]
struct V2Run {
    cgfs: std::sync::Arc<dyn CgroupFs>,
    leaf: PathBuf,
    /// Where the supervisor goes back to after the clone.
    home: PathBuf,
    pid: u32,
}

impl V2Run {
    /// Steps 3 and 4 of [`V2Facts`]: enables the controllers if needed (moat
    /// into its supervisor leaf first), makes the run's leaf `name` and sets
    /// `knobs` (limit, value) in it.
    fn create(
        cgfs: std::sync::Arc<dyn CgroupFs>,
        f: &V2Facts,
        name: &str,
        knobs: &[(&'static str, u64)],
        pid: u32,
    ) -> Result<V2Run, String> {
        let needed: Vec<&str> = knobs.iter().map(|(l, _)| controller_of(l)).collect();
        for c in &needed {
            f.usable_for(c)?;
        }
        let mut home = f.own.clone();
        let missing: Vec<&str> = needed
            .iter()
            .filter(|c| !f.enabled.iter().any(|e| e == *c))
            .copied()
            .collect();
        if !missing.is_empty() {
            if f.own == f.base {
                let sup = f.base.join(SUPERVISOR_LEAF);
                match cgfs.mkdir(&sup) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("create {}: {e}; {V2_FIX}", sup.display())),
                }
                cgfs.write(&sup.join("cgroup.procs"), &pid.to_string())
                    .map_err(|e| format!("move moat into {}: {e}; {V2_FIX}", sup.display()))?;
                home = sup;
            }
            let line = missing
                .iter()
                .map(|c| format!("+{c}"))
                .collect::<Vec<_>>()
                .join(" ");
            let knob = f.base.join("cgroup.subtree_control");
            cgfs.write(&knob, &line).map_err(|e| {
                format!(
                    "enable {line} in {} for the run's cgroup: {e}; {V2_FIX}",
                    knob.display()
                )
            })?;
        }
        let leaf = f.base.join(name);
        cgfs.mkdir(&leaf).map_err(|e| {
            format!(
                "create the run's cgroup {}: {e}; pass --limits best-effort to run without it",
                leaf.display()
            )
        })?;
        let run = V2Run {
            cgfs,
            leaf,
            home,
            pid,
        };
        if let Err(e) = run.set(&needed, knobs) {
            let _ = run.cgfs.rmdir(&run.leaf);
            return Err(e);
        }
        Ok(run)
    }

    fn set(&self, needed: &[&str], knobs: &[(&'static str, u64)]) -> Result<(), String> {
        let have = words(&self.read("cgroup.controllers").unwrap_or_default());
        if let Some(c) = needed.iter().find(|c| !have.iter().any(|h| h == *c)) {
            return Err(format!(
                "the run's cgroup {} did not get the {c} controller; {V2_FIX}",
                self.leaf.display()
            ));
        }
        let write = |knob: &str, v: u64| {
            self.cgfs
                .write(&self.leaf.join(knob), &v.to_string())
                .map_err(|e| format!("set {knob} in the run's cgroup: {e}"))
        };
        for (limit, value) in knobs {
            if *limit == "memory" {
                write("memory.max", *value)?;
                // No swapping out past the limit (v1's memsw did the same).
                if self.cgfs.exists(&self.leaf.join("memory.swap.max")) {
                    write("memory.swap.max", 0)?;
                }
            } else {
                write("pids.max", *value)?;
            }
        }
        Ok(())
    }

    fn read(&self, file: &str) -> Option<String> {
        self.cgfs.read(&self.leaf.join(file)).ok()
    }

    fn enter(&self) -> Result<(), String> {
        self.cgfs
            .write(&self.leaf.join("cgroup.procs"), &self.pid.to_string())
            .map_err(|e| format!("enter the run's cgroup {}: {e}", self.leaf.display()))
    }

    fn leave(&self) -> Result<(), String> {
        self.cgfs
            .write(&self.home.join("cgroup.procs"), &self.pid.to_string())
            .map_err(|e| format!("leave the run's cgroup for {}: {e}", self.home.display()))
    }

    fn oom_killed(&self) -> bool {
        self.read("memory.events")
            .and_then(|t| field(&t, "oom_kill"))
            .is_some_and(|n| n > 0)
    }

    fn pids_reached(&self) -> bool {
        self.read("pids.events")
            .and_then(|t| field(&t, "max"))
            .is_some_and(|n| n > 0)
    }

    fn memory_peak(&self) -> Option<u64> {
        self.read("memory.peak").and_then(|t| t.trim().parse().ok())
    }

    /// Kills what is left in the leaf, removes it (retrying until
    /// `deadline` while the kernel finishes exiting tasks) and checks it is
    /// gone.
    fn remove(&self, deadline: Instant) -> Result<(), String> {
        let kill = self.leaf.join("cgroup.kill");
        loop {
            if self.cgfs.exists(&kill) {
                let _ = self.cgfs.write(&kill, "1");
            } else {
                for pid in self
                    .read("cgroup.procs")
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|p| p.parse::<libc::pid_t>().ok())
                {
                    let _ = crate::sys::kill(pid, libc::SIGKILL);
                }
            }
            match self.cgfs.rmdir(&self.leaf) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => {
                    return Err(format!(
                        "remove the run's cgroup {}: {e}",
                        self.leaf.display()
                    ))
                }
            }
        }
        if self.cgfs.exists(&self.leaf) {
            return Err(format!(
                "the run's cgroup {} is still there after its removal",
                self.leaf.display()
            ));
        }
        Ok(())
    }
}

/// Why a limit cannot be enforced on this host.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--{flag} cannot be enforced here: {why}. Run where that is available, drop --{flag}, or pass --limits best-effort to run without it (the result then says it was not enforced)")]
pub struct LimitError {
    pub flag: &'static str,
    pub why: String,
}

/// The per-run cgroup: one directory per v1 controller, and/or one v2 leaf.
#[derive(Debug)]
pub struct RunCgroup {
    /// (controller, the run's directory, moat's own directory).
    dirs: Vec<(&'static str, PathBuf, PathBuf)>,
    v2: Option<V2Run>,
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
        Ok(if facts.v2_for("memory").is_ok() {
            (
                Mechanism::CgroupV2,
                "the whole run's memory, no swap (cgroup v2 memory.max, memory.swap.max 0; the kernel's OOM killer ends the largest process)".into(),
            )
        } else if facts.cgroup_v1_memory.is_some() {
            (
                Mechanism::CgroupV1,
                "the whole run's memory (cgroup v1 memory controller; the kernel's OOM killer ends the largest process)".into(),
            )
        } else {
            (
                Mechanism::RlimitAs,
                format!("virtual memory (address space) per process, RLIMIT_AS: no per-run cgroup here ({})", facts.no_cgroup("memory")),
            )
        }),
    )?;
    let pids = if facts.v2_for("pids").is_ok() {
        Ok((
            Mechanism::CgroupV2,
            "every process and thread of the run (cgroup v2 pids.max)".into(),
        ))
    } else if facts.cgroup_v1_pids.is_some() {
        Ok((
            Mechanism::CgroupV1,
            "every process and thread of the run (cgroup v1 pids controller)".into(),
        ))
    } else if !sandboxed {
        Err(format!("this run has no user namespace of its own (danger-full-access, or the Landlock backend), so RLIMIT_NPROC would count every process of the user, and no per-run cgroup is usable ({})", facts.no_cgroup("pids")))
    } else if facts.uid == 0 {
        Err(format!(
            "host root is exempt from RLIMIT_NPROC, and no per-run cgroup is usable ({})",
            facts.no_cgroup("pids")
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
    prepare_with(
        limits,
        sandboxed,
        facts,
        tag,
        std::sync::Arc::new(HostFs),
        std::process::id(),
    )
}

/// [`prepare`] on the cgroup filesystem `cgfs` (the host's, or a simulated
/// one in tests) for the supervisor whose pid is `pid`. Only the cgroup v2
/// steps go through `cgfs`.
pub fn prepare_with(
    limits: &Limits,
    sandboxed: bool,
    facts: &LimitFacts,
    tag: &str,
    cgfs: std::sync::Arc<dyn CgroupFs>,
    pid: u32,
) -> Result<Enforcer, String> {
    let applied = choose(limits, sandboxed, facts).map_err(|e| e.to_string())?;
    let mut e = Enforcer {
        output: limits.output,
        ..Default::default()
    };
    let mut cg = RunCgroup {
        dirs: Vec::new(),
        v2: None,
    };
    let name = format!("moat-{}", sanitize(tag));
    // The v2 leaf first: one leaf for every v2 controller of the run.
    let v2_knobs: Vec<(&'static str, u64)> = applied
        .iter()
        .filter(|a| a.mechanism == Some(Mechanism::CgroupV2))
        .map(|a| (a.limit, a.value))
        .collect();
    if let (false, Some(f)) = (v2_knobs.is_empty(), &facts.cgroup_v2) {
        if cgfs.is_host() {
            sweep_stale(&f.base);
        }
        cg.v2 = Some(V2Run::create(cgfs, f, &name, &v2_knobs, pid)?);
    }
    // A cgroup made before a later step failed is not left behind.
    if let Err(err) = rlimits_and_v1(&applied, facts, &name, &mut e, &mut cg) {
        let _ = cg.remove();
        return Err(err);
    }
    if !cg.dirs.is_empty() || cg.v2.is_some() {
        e.cgroup = Some(cg);
    }
    e.applied = applied;
    Ok(e)
}

/// The rlimits and the cgroup v1 directories of `applied`.
fn rlimits_and_v1(
    applied: &[Applied],
    facts: &LimitFacts,
    name: &str,
    e: &mut Enforcer,
    cg: &mut RunCgroup,
) -> Result<(), String> {
    for a in applied {
        let lowered = |v: u64| (v, v);
        match (a.limit, a.mechanism) {
            ("memory", Some(Mechanism::CgroupV1)) => {
                if let Some(own) = &facts.cgroup_v1_memory {
                    let dir = cg.create("memory", own, name)?;
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
                    let dir = cg.create("pids", own, name)?;
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
    Ok(())
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
        if let Some(v2) = &self.v2 {
            v2.enter()?;
        }
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
        match &self.v2 {
            Some(v2) => v2.leave(),
            None => Ok(()),
        }
    }

    fn knob(&self, controller: &str, file: &str) -> Option<String> {
        let (_, dir, _) = self.dirs.iter().find(|(c, _, _)| *c == controller)?;
        fs::read_to_string(dir.join(file)).ok()
    }

    /// The kernel's OOM killer ended a process of the run.
    pub fn oom_killed(&self) -> bool {
        self.v2.as_ref().is_some_and(|v| v.oom_killed())
            || self
                .knob("memory", "memory.oom_control")
                .and_then(|t| field(&t, "oom_kill"))
                .is_some_and(|n| n > 0)
    }

    /// A fork was refused because the run reached its pids limit.
    pub fn pids_reached(&self) -> bool {
        self.v2.as_ref().is_some_and(|v| v.pids_reached())
            || self
                .knob("pids", "pids.events")
                .and_then(|t| field(&t, "max"))
                .is_some_and(|n| n > 0)
    }

    /// The run's peak memory (whole cgroup).
    pub fn memory_peak(&self) -> Option<u64> {
        self.v2.as_ref().and_then(|v| v.memory_peak()).or_else(|| {
            self.knob("memory", "memory.max_usage_in_bytes")
                .and_then(|t| t.trim().parse().ok())
        })
    }

    /// Kills whatever is still in the run's cgroups (nothing, normally: the
    /// init kills its tree first) and removes them. Retries while the kernel
    /// still holds exiting tasks.
    pub fn remove(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut errors = Vec::new();
        if let Some(v2) = &self.v2 {
            if let Err(e) = v2.remove(deadline) {
                errors.push(e);
            }
        }
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

/// The soft open-file limit this process was started with, once
/// [`raise_open_files`] raised it (0: not raised).
static STARTING_OPEN_FILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Raises this process's soft open-file limit to its hard limit, for a
/// long-lived process that holds descriptors for many executions at once
/// (`moat serve`, `moat mcp`, a sandbox template); hosts commonly start
/// programs with a soft limit of 1024. The soft limit it was started with
/// is remembered: the commands it starts get that one back
/// ([`starting_open_files`]), never the raised one. Call it once, first.
pub fn raise_open_files() {
    let Ok((soft, hard)) = nix::sys::resource::getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if nix::sys::resource::setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() && soft < hard {
        STARTING_OPEN_FILES.store(soft, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The soft open-file limit the user started this process with, when
/// [`raise_open_files`] raised it since; None when it was not raised.
pub fn starting_open_files() -> Option<u64> {
    match STARTING_OPEN_FILES.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        soft => Some(soft),
    }
}

/// Starts `cmd` (a helper moat process: a `moat exec` child, a sandbox
/// template) with the soft open-file limit the user started this process
/// with, when it raised its own.
pub fn start_with_starting_open_files(cmd: &mut std::process::Command) {
    if let Some(soft) = starting_open_files() {
        crate::sys::with_open_files_soft(cmd, soft);
    }
}

/// Gives the calling process (a command about to exec) back the soft
/// open-file limit the user started moat with, when moat raised its own.
pub fn restore_open_files() -> Result<(), String> {
    let Some(soft) = starting_open_files() else {
        return Ok(());
    };
    let (_, hard) = nix::sys::resource::getrlimit(Resource::RLIMIT_NOFILE)
        .map_err(|e| format!("read the open-file limit: {e}"))?;
    nix::sys::resource::setrlimit(Resource::RLIMIT_NOFILE, soft.min(hard), hard)
        .map_err(|e| format!("restore the open-file limit: {e}"))
}

/// Sets the rlimits in the calling process (the command, just before exec).
/// Only lowers: a value above the current hard limit becomes that limit.
pub fn apply_rlimits(rlimits: &[(Resource, u64, u64)]) -> Result<(), String> {
    for (r, soft, hard) in rlimits {
        lower_rlimit(*r, *soft, *hard).map_err(|e| format!("{}: {e}", rlimit_step(*r)))?;
    }
    Ok(())
}

/// Sets one limit of the calling process to (soft, hard), never above its
/// current hard limit. Allocates nothing (the command's process calls it).
pub fn lower_rlimit(r: Resource, soft: u64, hard: u64) -> nix::Result<()> {
    let (_, cur_hard) = nix::sys::resource::getrlimit(r)?;
    let hard = hard.min(cur_hard);
    nix::sys::resource::setrlimit(r, soft.min(hard), hard)
}

/// The step that sets limit `r`, for a failure report.
pub fn rlimit_step(r: Resource) -> &'static str {
    match r {
        Resource::RLIMIT_AS => "set the limit RLIMIT_AS",
        Resource::RLIMIT_NPROC => "set the limit RLIMIT_NPROC",
        Resource::RLIMIT_CPU => "set the limit RLIMIT_CPU",
        Resource::RLIMIT_FSIZE => "set the limit RLIMIT_FSIZE",
        Resource::RLIMIT_NOFILE => "set the limit RLIMIT_NOFILE",
        _ => "set a resource limit",
    }
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
        "cgroup_v2_delegated": match &facts.cgroup_v2 {
            Some(f) => serde_json::json!({
                "dir": f.base,
                "controllers": f.controllers,
                "memory": f.usable_for("memory").err().unwrap_or_else(|| "usable".into()),
                "pids": f.usable_for("pids").err().unwrap_or_else(|| "usable".into()),
            }),
            None => serde_json::json!({"dir": null, "detail": facts.cgroup_v2_missing}),
        },
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
    fn the_reasons_moat_stops_a_run_for_read_back_by_name() {
        for r in [
            TerminationReason::HostReplaced,
            TerminationReason::WatchFailed,
        ] {
            assert_eq!(
                TerminationReason::stopped_by_moat_named(r.as_str()),
                Some(r)
            );
        }
        for name in ["exit", "signal", "timeout", "memory", "failed_to_start"] {
            assert_eq!(
                TerminationReason::stopped_by_moat_named(name),
                None,
                "{name}"
            );
        }
    }

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
            cgroup_v2: None,
            cgroup_v2_missing: "no v2".into(),
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

    // ------------------------------------------------ cgroup v2 delegation

    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    /// One simulated cgroup.
    #[derive(Debug, Default)]
    struct Node {
        controllers: Vec<String>,
        subtree: Vec<String>,
        procs: Vec<u32>,
        files: BTreeMap<String, String>,
    }

    /// An in-memory cgroup2 filesystem with the kernel's rules that matter
    /// to the protocol: a new cgroup gets the controllers its parent
    /// enables, and their knob files; a non-root cgroup with processes
    /// cannot enable controllers for children, nor take processes once it
    /// does; a cgroup with processes or children cannot be removed; writes
    /// go to existing files only. Every mkdir/write/rmdir is logged.
    #[derive(Debug)]
    struct SimFs {
        root: PathBuf,
        nodes: Mutex<BTreeMap<PathBuf, Node>>,
        log: Mutex<Vec<String>>,
        readonly: Mutex<Vec<PathBuf>>,
    }

    fn errno(e: i32) -> io::Error {
        io::Error::from_raw_os_error(e)
    }

    impl SimFs {
        fn new(root: &str) -> Arc<SimFs> {
            let fs = SimFs {
                root: root.into(),
                nodes: Mutex::new(BTreeMap::new()),
                log: Mutex::new(Vec::new()),
                readonly: Mutex::new(Vec::new()),
            };
            fs.nodes.lock().unwrap().insert(
                root.into(),
                Node {
                    controllers: words("memory pids cpu"),
                    subtree: words("memory pids"),
                    ..Default::default()
                },
            );
            Arc::new(fs)
        }

        /// A cgroup `rel` under the root with `controllers`, `enabled` and `procs`.
        fn add(&self, rel: &str, controllers: &str, enabled: &str, procs: &[u32]) -> PathBuf {
            let p = self.root.join(rel);
            let mut n = Node {
                controllers: words(controllers),
                subtree: words(enabled),
                procs: procs.to_vec(),
                ..Default::default()
            };
            Self::knobs(&mut n);
            self.nodes.lock().unwrap().insert(p.clone(), n);
            p
        }

        fn knobs(n: &mut Node) {
            n.files.insert("cgroup.kill".into(), String::new());
            if n.controllers.iter().any(|c| c == "memory") {
                for (k, v) in [
                    ("memory.max", "max"),
                    ("memory.swap.max", "max"),
                    ("memory.events", "oom 0\noom_kill 0\n"),
                    ("memory.peak", "0"),
                ] {
                    n.files.insert(k.into(), v.into());
                }
            }
            if n.controllers.iter().any(|c| c == "pids") {
                n.files.insert("pids.max".into(), "max".into());
                n.files.insert("pids.events".into(), "max 0\n".into());
            }
        }

        fn rel(&self, p: &Path) -> String {
            p.strip_prefix(&self.root)
                .unwrap_or(p)
                .display()
                .to_string()
        }

        fn logged(&self) -> Vec<String> {
            std::mem::take(&mut *self.log.lock().unwrap())
        }

        fn set_file(&self, dir: &Path, file: &str, text: &str) {
            let mut nodes = self.nodes.lock().unwrap();
            nodes
                .get_mut(dir)
                .unwrap()
                .files
                .insert(file.into(), text.into());
        }

        fn where_is(&self, pid: u32) -> Option<PathBuf> {
            let nodes = self.nodes.lock().unwrap();
            nodes
                .iter()
                .find(|(_, n)| n.procs.contains(&pid))
                .map(|(p, _)| p.clone())
        }

        fn split(p: &Path) -> (PathBuf, String) {
            let dir = p.parent().unwrap_or(p).to_path_buf();
            let file = p
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            (dir, file)
        }
    }

    impl CgroupFs for SimFs {
        fn read(&self, p: &Path) -> io::Result<String> {
            let (dir, file) = Self::split(p);
            let nodes = self.nodes.lock().unwrap();
            let n = nodes.get(&dir).ok_or_else(|| errno(libc::ENOENT))?;
            Ok(match file.as_str() {
                "cgroup.controllers" => n.controllers.join(" ") + "\n",
                "cgroup.subtree_control" => n.subtree.join(" ") + "\n",
                "cgroup.procs" => n.procs.iter().map(|p| format!("{p}\n")).collect(),
                f => n.files.get(f).cloned().ok_or_else(|| errno(libc::ENOENT))?,
            })
        }

        fn write(&self, p: &Path, data: &str) -> io::Result<()> {
            self.log
                .lock()
                .unwrap()
                .push(format!("write {} {data}", self.rel(p)));
            if self.readonly.lock().unwrap().iter().any(|r| p == r) {
                return Err(errno(libc::EACCES));
            }
            let (dir, file) = Self::split(p);
            let is_root = dir == self.root;
            let mut nodes = self.nodes.lock().unwrap();
            if !nodes.contains_key(&dir) {
                return Err(errno(libc::ENOENT));
            }
            match file.as_str() {
                "cgroup.procs" => {
                    let pid: u32 = data.trim().parse().map_err(|_| errno(libc::EINVAL))?;
                    if !is_root && !nodes[&dir].subtree.is_empty() {
                        return Err(errno(libc::EBUSY));
                    }
                    for n in nodes.values_mut() {
                        n.procs.retain(|x| *x != pid);
                    }
                    nodes.get_mut(&dir).unwrap().procs.push(pid);
                }
                "cgroup.subtree_control" => {
                    let n = nodes.get_mut(&dir).unwrap();
                    for tok in data.split_whitespace() {
                        let (on, c) = tok.split_at(1);
                        if on == "+" {
                            if !n.controllers.iter().any(|x| x == c) {
                                return Err(errno(libc::ENOENT));
                            }
                            if !is_root && !n.procs.is_empty() {
                                return Err(errno(libc::EBUSY));
                            }
                            if !n.subtree.iter().any(|x| x == c) {
                                n.subtree.push(c.into());
                            }
                        } else {
                            n.subtree.retain(|x| x != c);
                        }
                    }
                }
                "cgroup.kill" => nodes.get_mut(&dir).unwrap().procs.clear(),
                f => {
                    let n = nodes.get_mut(&dir).unwrap();
                    match n.files.get_mut(f) {
                        Some(v) => *v = data.into(),
                        None => return Err(errno(libc::ENOENT)),
                    }
                }
            }
            Ok(())
        }

        fn mkdir(&self, p: &Path) -> io::Result<()> {
            self.log
                .lock()
                .unwrap()
                .push(format!("mkdir {}", self.rel(p)));
            let mut nodes = self.nodes.lock().unwrap();
            if nodes.contains_key(p) {
                return Err(errno(libc::EEXIST));
            }
            let parent = nodes
                .get(p.parent().unwrap_or(p))
                .ok_or_else(|| errno(libc::ENOENT))?;
            let mut n = Node {
                controllers: parent.subtree.clone(),
                ..Default::default()
            };
            Self::knobs(&mut n);
            nodes.insert(p.to_path_buf(), n);
            Ok(())
        }

        fn rmdir(&self, p: &Path) -> io::Result<()> {
            self.log
                .lock()
                .unwrap()
                .push(format!("rmdir {}", self.rel(p)));
            let mut nodes = self.nodes.lock().unwrap();
            let n = nodes.get(p).ok_or_else(|| errno(libc::ENOENT))?;
            let children = nodes.keys().any(|k| k.parent() == Some(p));
            if !n.procs.is_empty() || children {
                return Err(errno(libc::EBUSY));
            }
            nodes.remove(p);
            Ok(())
        }

        fn exists(&self, p: &Path) -> bool {
            let nodes = self.nodes.lock().unwrap();
            let (dir, file) = Self::split(p);
            nodes.contains_key(p) || nodes.get(&dir).is_some_and(|n| n.files.contains_key(&file))
        }

        fn writable(&self, p: &Path) -> bool {
            !self
                .readonly
                .lock()
                .unwrap()
                .iter()
                .any(|r| p.starts_with(r))
        }
    }

    const SIM_MOUNTINFO: &str = "40 30 0:36 / /sim/cg rw,relatime - cgroup2 cgroup2 rw\n";
    const MOAT: u32 = 4242;

    fn v2_facts(sim: &SimFs, cgroup_line: &str, uid: u32) -> LimitFacts {
        let (cgroup_v2, cgroup_v2_missing) =
            match V2Facts::probe(SIM_MOUNTINFO, cgroup_line, sim, MOAT) {
                Ok(f) => (Some(f), String::new()),
                Err(e) => (None, e),
            };
        LimitFacts {
            cgroup_v2,
            cgroup_v2_missing,
            cgroup_missing: "no cgroup v1 memory controller is mounted".into(),
            uid,
            nproc_per_userns: true,
            ..Default::default()
        }
    }

    fn mem_and_pids() -> Limits {
        Limits {
            memory: Some(256 << 20),
            pids: Some(64),
            ..Default::default()
        }
    }

    #[test]
    fn v2_probe_reads_a_real_directory_tree_like_cgroupfs() {
        // The host file reads against a directory tree shaped like cgroupfs.
        let root = std::env::temp_dir().join(format!("moat-cgtest-{}", std::process::id()));
        let scope = root.join("user.slice/run.scope");
        fs::create_dir_all(scope.join(SUPERVISOR_LEAF)).unwrap();
        fs::write(scope.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        fs::write(scope.join("cgroup.subtree_control"), "\n").unwrap();
        fs::write(scope.join("cgroup.procs"), format!("{MOAT}\n")).unwrap();
        let mountinfo = format!(
            "40 30 0:36 / {} rw,relatime - cgroup2 cgroup2 rw\n",
            root.display()
        );
        let f = V2Facts::probe(&mountinfo, "0::/user.slice/run.scope\n", &HostFs, MOAT);
        let again = V2Facts::probe(
            &mountinfo,
            "0::/user.slice/run.scope/moat-supervisor\n",
            &HostFs,
            MOAT,
        );
        let _ = fs::remove_dir_all(&root);
        let f = f.unwrap();
        assert_eq!(f.base, scope);
        assert_eq!(f.own, scope);
        assert_eq!(f.controllers, words("cpu memory pids"));
        assert!(f.enabled.is_empty());
        assert_eq!(f.others_inside, 0);
        assert!(f.usable_for("memory").is_ok() && f.usable_for("pids").is_ok());
        // Already in its supervisor leaf: the base is the scope.
        let again = again.unwrap();
        assert_eq!(again.base, scope);
        assert_eq!(again.own, scope.join(SUPERVISOR_LEAF));
    }

    #[test]
    fn v2_protocol_moves_moat_out_then_enables_then_fills_a_leaf_and_removes_it() {
        let sim = SimFs::new("/sim/cg");
        let scope = sim.add("app.scope", "memory pids", "", &[MOAT]);
        let facts = v2_facts(&sim, "0::/app.scope\n", 1000);
        let e = prepare_with(&mem_and_pids(), true, &facts, "exec_1", sim.clone(), MOAT).unwrap();
        assert_eq!(mech(&e.applied, "memory"), Some(Mechanism::CgroupV2));
        assert_eq!(mech(&e.applied, "pids"), Some(Mechanism::CgroupV2));
        // Order matters: moat leaves the scope before the scope enables the
        // controllers (the no-internal-processes rule), and the limits are
        // in the leaf before anything enters it.
        assert_eq!(
            sim.logged(),
            [
                "mkdir app.scope/moat-supervisor",
                "write app.scope/moat-supervisor/cgroup.procs 4242",
                "write app.scope/cgroup.subtree_control +memory +pids",
                "mkdir app.scope/moat-exec-1",
                "write app.scope/moat-exec-1/memory.max 268435456",
                "write app.scope/moat-exec-1/memory.swap.max 0",
                "write app.scope/moat-exec-1/pids.max 64",
            ]
        );
        let cg = e.cgroup.as_ref().unwrap();
        let leaf = scope.join("moat-exec-1");
        cg.enter().unwrap();
        assert_eq!(sim.where_is(MOAT), Some(leaf.clone()));
        cg.leave().unwrap();
        assert_eq!(sim.where_is(MOAT), Some(scope.join(SUPERVISOR_LEAF)));
        // What ended the run is read from the leaf's event counters.
        assert!(!cg.oom_killed() && !cg.pids_reached());
        sim.set_file(&leaf, "memory.events", "oom 1\noom_kill 1\n");
        sim.set_file(&leaf, "pids.events", "max 3\n");
        sim.set_file(&leaf, "memory.peak", "268000000\n");
        assert!(cg.oom_killed() && cg.pids_reached());
        assert_eq!(cg.memory_peak(), Some(268_000_000));
        // A process left in the leaf is killed; the leaf is removed and gone.
        sim.nodes.lock().unwrap().get_mut(&leaf).unwrap().procs = vec![77];
        sim.logged();
        cg.remove().unwrap();
        assert_eq!(
            sim.logged(),
            [
                "write app.scope/moat-exec-1/cgroup.kill 1",
                "rmdir app.scope/moat-exec-1",
            ]
        );
        assert!(!sim.exists(&leaf));
        // The next run of the same moat: already in its leaf, controllers on.
        let facts = v2_facts(&sim, "0::/app.scope/moat-supervisor\n", 1000);
        let e = prepare_with(&mem_and_pids(), true, &facts, "exec_2", sim.clone(), MOAT).unwrap();
        assert_eq!(
            sim.logged(),
            [
                "mkdir app.scope/moat-exec-2",
                "write app.scope/moat-exec-2/memory.max 268435456",
                "write app.scope/moat-exec-2/memory.swap.max 0",
                "write app.scope/moat-exec-2/pids.max 64",
            ]
        );
        e.cgroup.unwrap().remove().unwrap();
    }

    #[test]
    fn v2_in_a_root_that_already_enables_the_controllers_needs_no_move() {
        let sim = SimFs::new("/sim/cg");
        sim.nodes
            .lock()
            .unwrap()
            .get_mut(Path::new("/sim/cg"))
            .unwrap()
            .procs = vec![1, MOAT];
        let facts = v2_facts(&sim, "0::/\n", 0);
        let l = Limits {
            pids: Some(64),
            ..Default::default()
        };
        let e = prepare_with(&l, true, &facts, "x", sim.clone(), MOAT).unwrap();
        assert_eq!(sim.logged(), ["mkdir moat-x", "write moat-x/pids.max 64"]);
        let cg = e.cgroup.unwrap();
        cg.enter().unwrap();
        cg.leave().unwrap();
        assert_eq!(sim.where_is(MOAT), Some(PathBuf::from("/sim/cg")));
        cg.remove().unwrap();
    }

    #[test]
    fn v2_refusals_name_the_missing_piece_and_the_fix() {
        let fix = "systemd-run --user --scope -p Delegate=yes moat";
        // A missing controller: memory falls back to RLIMIT_AS and says why;
        // pids as root (exempt from RLIMIT_NPROC) is refused.
        let sim = SimFs::new("/sim/cg");
        sim.add("s.scope", "pids", "", &[MOAT]);
        let f = v2_facts(&sim, "0::/s.scope\n", 0);
        let a = choose(&mem_and_pids(), true, &f).unwrap();
        assert_eq!(mech(&a, "memory"), Some(Mechanism::RlimitAs));
        assert_eq!(mech(&a, "pids"), Some(Mechanism::CgroupV2));
        let d = &a.iter().find(|x| x.limit == "memory").unwrap().detail;
        assert!(
            d.contains("does not offer the memory controller") && d.contains(fix),
            "{d}"
        );
        // Other processes share moat's cgroup: nothing can be enabled.
        let sim = SimFs::new("/sim/cg");
        sim.add("shell.scope", "memory pids", "", &[MOAT, 99]);
        let f = v2_facts(&sim, "0::/shell.scope\n", 0);
        let l = Limits {
            pids: Some(64),
            ..Default::default()
        };
        let err = choose(&l, true, &f).unwrap_err().to_string();
        assert!(
            err.contains("1 other process(es)") && err.contains(fix),
            "{err}"
        );
        // The same when moat already sits in its leaf but the controllers
        // were turned off and someone else joined the base.
        let sim2 = SimFs::new("/sim/cg");
        sim2.add("shell.scope", "memory pids", "", &[99]);
        sim2.add("shell.scope/moat-supervisor", "", "", &[MOAT]);
        let f2 = v2_facts(&sim2, "0::/shell.scope/moat-supervisor\n", 0);
        assert!(choose(&l, true, &f2).is_err());
        // …and prepare itself refuses before touching anything.
        let facts_forced = LimitFacts {
            cgroup_v2: f.cgroup_v2.clone(),
            ..f.clone()
        };
        assert!(prepare_with(&l, true, &facts_forced, "y", sim.clone(), MOAT).is_err());
        assert!(sim.logged().is_empty());
        // Not delegated (not writable): no v2 at all, said so.
        let sim = SimFs::new("/sim/cg");
        let scope = sim.add("root.scope", "memory pids", "", &[MOAT]);
        sim.readonly.lock().unwrap().push(scope);
        let f = v2_facts(&sim, "0::/root.scope\n", 1000);
        assert!(f.cgroup_v2.is_none());
        assert!(
            f.cgroup_v2_missing.contains("not delegated") && f.cgroup_v2_missing.contains(fix),
            "{}",
            f.cgroup_v2_missing
        );
        // A hybrid host's v2 hierarchy (this project's test machine).
        let hybrid = V2Facts {
            base: "/sys/fs/cgroup/unified".into(),
            own: "/sys/fs/cgroup/unified".into(),
            controllers: words("hugetlb"),
            enabled: Vec::new(),
            others_inside: 3,
        };
        let why = hybrid.usable_for("memory").unwrap_err();
        assert!(
            why.contains("bound to cgroup v1") && why.contains(fix),
            "{why}"
        );
        // No cgroup2 mount, no 0:: line.
        assert!(V2Facts::probe("", "0::/\n", &*sim, MOAT).is_err());
        assert!(V2Facts::probe(SIM_MOUNTINFO, "4:memory:/\n", &*sim, MOAT).is_err());
        assert!(V2Facts::probe(SIM_MOUNTINFO, "0::/../x\n", &*sim, MOAT).is_err());
    }

    #[test]
    fn v2_leaf_is_removed_when_a_limit_cannot_be_set() {
        let sim = SimFs::new("/sim/cg");
        let scope = sim.add("app.scope", "memory pids", "memory pids", &[]);
        sim.add("app.scope/moat-supervisor", "memory pids", "", &[MOAT]);
        sim.readonly
            .lock()
            .unwrap()
            .push(scope.join("moat-z/pids.max"));
        let facts = v2_facts(&sim, "0::/app.scope/moat-supervisor\n", 1000);
        let err = prepare_with(&mem_and_pids(), true, &facts, "z", sim.clone(), MOAT).unwrap_err();
        assert!(err.contains("pids.max"), "{err}");
        assert_eq!(
            sim.logged().last().map(String::as_str),
            Some("rmdir app.scope/moat-z")
        );
        assert!(!sim.exists(&scope.join("moat-z")));
    }
}
