//! Process-tree cleanup without a pid namespace (danger-full-access): find
//! every descendant of this process through /proc and signal it. The caller
//! is a subreaper, so orphans reparent to it and stay findable.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;

use crate::sys;

/// Every descendant of the calling process, found by walking /proc.
pub fn descendants() -> BTreeSet<libc::pid_t> {
    let me = std::process::id() as libc::pid_t;
    let mut children: BTreeMap<libc::pid_t, Vec<libc::pid_t>> = BTreeMap::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<libc::pid_t>().ok()) else { continue };
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            // The command name may hold spaces and ')': parse after the last ')'.
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
            let ppid = rest.split_whitespace().nth(1).and_then(|s| s.parse::<libc::pid_t>().ok());
            if let Some(ppid) = ppid {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = BTreeSet::new();
    let mut stack = vec![me];
    while let Some(p) = stack.pop() {
        for c in children.get(&p).into_iter().flatten() {
            if out.insert(*c) {
                stack.push(*c);
            }
        }
    }
    out
}

/// Sends `sig` to every descendant. SIGKILL is preceded by SIGSTOP so that
/// nothing forks new children while the walk is under way.
pub fn signal_descendants(sig: libc::c_int) {
    let pids = descendants();
    if sig == libc::SIGKILL {
        for p in &pids {
            let _ = sys::kill(*p, libc::SIGSTOP);
        }
    }
    for p in descendants().union(&pids) {
        let _ = sys::kill(*p, sig);
    }
}

/// Kills descendants until none is left (bounded, reaping as it goes).
pub fn kill_descendants_until_gone() {
    for _ in 0..200 {
        let pids = descendants();
        if pids.is_empty() {
            return;
        }
        signal_descendants(libc::SIGKILL);
        while let Ok(status) = nix::sys::wait::waitpid(None::<nix::unistd::Pid>, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
            if status == nix::sys::wait::WaitStatus::StillAlive {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}
