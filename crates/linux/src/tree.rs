//! Process-tree cleanup without a pid namespace (danger-full-access): find
//! every descendant of this process and signal it. The caller is a
//! subreaper, so orphans reparent to it and stay findable.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;

use crate::sys;

fn pids_in(text: &str) -> impl Iterator<Item = libc::pid_t> + '_ {
    text.split_whitespace().filter_map(|s| s.parse().ok())
}

/// Children of `pid` via /proc/PID/task/*/children (CONFIG_PROC_CHILDREN);
/// None when the kernel does not offer that file.
fn children_of(pid: libc::pid_t) -> Option<Vec<libc::pid_t>> {
    let mut out = Vec::new();
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    for t in tasks.flatten() {
        let text = fs::read_to_string(t.path().join("children")).ok()?;
        out.extend(pids_in(&text));
    }
    Some(out)
}

/// Fallback: parent links of every process, from /proc/*/stat.
fn parent_map() -> BTreeMap<libc::pid_t, Vec<libc::pid_t>> {
    let mut children: BTreeMap<libc::pid_t, Vec<libc::pid_t>> = BTreeMap::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The command name may hold spaces and ')': parse after the last ')'.
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            if let Some(ppid) = rest
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse::<libc::pid_t>().ok())
            {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    children
}

/// Every descendant of the calling process.
pub fn descendants() -> BTreeSet<libc::pid_t> {
    descendants_of(std::process::id() as libc::pid_t)
}

/// Every descendant of `root`.
pub fn descendants_of(root: libc::pid_t) -> BTreeSet<libc::pid_t> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root];
    let mut fallback: Option<BTreeMap<libc::pid_t, Vec<libc::pid_t>>> = None;
    while let Some(p) = stack.pop() {
        let kids = match (&fallback, children_of(p)) {
            (None, Some(k)) => k,
            _ => fallback
                .get_or_insert_with(parent_map)
                .get(&p)
                .cloned()
                .unwrap_or_default(),
        };
        for c in kids {
            if out.insert(c) {
                stack.push(c);
            }
        }
    }
    out
}

/// Sends `sig` to every descendant. SIGKILL is preceded by SIGSTOP so that
/// nothing forks new children while the walk is under way.
pub fn signal_descendants(sig: libc::c_int) {
    let pids = descendants();
    if pids.is_empty() {
        return;
    }
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
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    for _ in 0..200 {
        // Orphans reparent to us, so "no children at all" means no descendants.
        match waitpid(None::<nix::unistd::Pid>, Some(WaitPidFlag::WNOHANG)) {
            Err(nix::errno::Errno::ECHILD) => return,
            Ok(WaitStatus::StillAlive) => {}
            _ => continue,
        }
        signal_descendants(libc::SIGKILL);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
