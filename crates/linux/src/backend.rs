//! The Landlock-only backend, for hosts where user namespaces are not
//! available (AppArmor's unprivileged-userns restriction, a container's
//! default seccomp profile, `user.max_user_namespaces = 0`).
//!
//! Without a mount namespace there are no stand-ins: the View is translated
//! into Landlock allow-rules on host paths. A part of the view that is
//! readable or writable as a whole becomes one rule; a directory with
//! something less visible beneath it (a protected path, a write-protected
//! `.git/hooks`) is split: it gets a list-only rule and each of its entries
//! gets its own, recursively, except the hidden ones, which get none and so
//! are refused with EACCES. moat's private /tmp and HOME become one per-run
//! scratch directory on the host (`TMPDIR`, `HOME`); the network is refused
//! outright (no `socket()` at all); what this backend cannot give is listed
//! in [`NOT_GIVEN`] and reported with every run.

use std::fs;
use std::path::{Path, PathBuf};

use moat_policy::Level;

use crate::plan::{LandlockSpec, DEV_NODES};
use crate::probe::Kind;
use crate::view::{Mode, View};

/// What the Landlock backend cannot give, reported with every run on it.
pub const NOT_GIVEN: &[&str] = &[
    "a private pid namespace: the command sees host processes in /proc (Landlock's scoping still refuses signals and ptrace to them)",
    "a private /tmp and HOME: the command gets a per-run scratch directory on the host as TMPDIR and HOME instead",
    "hiding host processes, SysV IPC and POSIX message queues of other processes",
    "stand-ins: a protected path is refused (EACCES) instead of shown empty, and its name stays visible in listings",
    "new entries directly in a directory that holds a protected or write-protected entry (such a directory is list-only)",
    "the network: no socket() at all (--network proxy and unmanaged are refused)",
    "nested moat runs",
];

/// Host user namespaces can be created (tried in a throwaway child).
pub fn userns_available() -> bool {
    // SAFETY: the child makes only async-signal-safe calls (unshare, _exit).
    match unsafe { crate::sys::fork_glibc() } {
        Ok(0) => {
            let ok = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
            crate::sys::exit_now(if ok { 0 } else { 1 });
        }
        Ok(pid) => matches!(
            nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None),
            Ok(nix::sys::wait::WaitStatus::Exited(_, 0))
        ),
        Err(_) => false,
    }
}

/// 0: nothing, 1: read, 2: write.
fn reach(m: Mode) -> u8 {
    match m {
        Mode::Hidden | Mode::Built => 0,
        Mode::Read | Mode::WriteProtected => 1,
        Mode::Write => 2,
    }
}

/// What each host path of the view should allow on this backend.
fn desired(view: &View, scratch: &Path) -> Vec<(PathBuf, u8)> {
    let whole_host = view.level != Level::WorkspaceContained;
    let mut out: Vec<(PathBuf, u8)> = Vec::new();
    for e in &view.entries {
        if e.relocated {
            continue;
        }
        let r = match (e.mode, e.host.as_ref()) {
            (Mode::Built, _) => match e.path.to_str() {
                // The host's own: no private instance without namespaces.
                Some("/proc") => 1,
                Some("/sys") if whole_host => 1,
                _ => 0,
            },
            (m, Some(h)) if *h == e.path => reach(m),
            _ => continue,
        };
        out.push((e.path.clone(), r));
    }
    // Two entries at one path (a write-protected `.git/config` that is
    // also hidden, holding credentials): the later one decides, as in the
    // view; only it gets a rule.
    let mut seen: Vec<PathBuf> = Vec::new();
    out.reverse();
    out.retain(|(p, _)| {
        let first = !seen.contains(p);
        seen.push(p.clone());
        first
    });
    out.reverse();
    // /dev is the host's: only the plain device nodes, below.
    out.push(("/dev".into(), 0));
    out.push((scratch.to_path_buf(), 2));
    out
}

/// The Landlock rules giving `view` on host paths, with `scratch` as the
/// run's writable TMPDIR and HOME. `list` lists a directory (name, kind);
/// symlinks get no rule of their own (Landlock checks where they lead).
pub fn landlock_spec(
    view: &View,
    scratch: &Path,
    abi: i32,
    list: &dyn Fn(&Path) -> Vec<(String, Kind)>,
) -> LandlockSpec {
    let want = desired(view, scratch);
    let mut spec = LandlockSpec {
        scoped: abi >= 6,
        host_paths: true,
        ..Default::default()
    };
    for (p, r) in &want {
        if *r > 0 {
            split(p, *r, &want, list, &mut spec, 0);
        }
    }
    for n in DEV_NODES {
        let p = Path::new("/dev").join(n);
        if *n != "tty" {
            spec.devices.push(p);
        }
    }
    for v in [&mut spec.read, &mut spec.write, &mut spec.list_only] {
        v.sort();
        v.dedup();
    }
    spec
}

/// Whether this backend keeps the writable directory `dir` list-only
/// (the test [`split`] makes): something less reachable than writable
/// (hidden, read-only, write-protected) lies beneath it. A refusal to
/// create an entry directly in it is explained by this.
pub fn list_only(view: &View, dir: &Path) -> bool {
    desired(view, Path::new("/"))
        .iter()
        .any(|(p, r)| *r < 2 && p != dir && p.starts_with(dir) && p != Path::new("/dev"))
}

/// Depth guard: a view never needs more than this many levels of splitting.
const MAX_SPLIT_DEPTH: usize = 64;

fn split(
    path: &Path,
    r: u8,
    want: &[(PathBuf, u8)],
    list: &dyn Fn(&Path) -> Vec<(String, Kind)>,
    spec: &mut LandlockSpec,
    depth: usize,
) {
    let less_beneath = want
        .iter()
        .any(|(p, pr)| *pr < r && p != path && p.starts_with(path));
    if !less_beneath || depth > MAX_SPLIT_DEPTH {
        // At the depth guard nothing is granted below (fail closed).
        if !less_beneath {
            match r {
                2 => spec.write.push(path.to_path_buf()),
                _ => spec.read.push(path.to_path_buf()),
            }
        }
        return;
    }
    spec.list_only.push(path.to_path_buf());
    for (name, kind) in list(path) {
        if kind == Kind::Symlink {
            continue;
        }
        let child = path.join(&name);
        let own = want.iter().find(|(p, _)| *p == child).map(|(_, x)| *x);
        match own {
            Some(0) => {}
            Some(x) if x < r => split(&child, x, want, list, spec, depth + 1),
            _ => split(&child, r, want, list, spec, depth + 1),
        }
    }
}

/// The plan of a Landlock-backend run, completed on this host: a fresh
/// per-run scratch directory (0700, under moat's TMPDIR) holding the
/// command's HOME and TMPDIR, and the Landlock rules from the view. Returns
/// the plan and the scratch directory (removed by the caller after the run).
/// `own_tty`: the command gets a pty of its own (its controlling terminal),
/// so `/dev/tty` names that pty and is granted; otherwise it would name the
/// host terminal moat runs under and is not.
pub fn prepare(
    plan: &crate::plan::Plan,
    tag: &str,
    own_tty: bool,
) -> Result<(crate::plan::Plan, PathBuf), String> {
    use std::os::unix::fs::DirBuilderExt;
    let safe: String = tag
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let dir = std::env::temp_dir().join(format!("moat-run-{safe}"));
    // create, never reuse: an existing path is someone else's.
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("create the run's scratch directory {}: {e}", dir.display()))?;
    let dir = fs::canonicalize(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for sub in ["home", "tmp"] {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.join(sub))
            .map_err(|e| format!("create {}: {e}", dir.join(sub).display()))?;
    }
    let mut p = plan.clone();
    p.landlock = landlock_spec(&plan.view, &dir, plan.landlock_abi, &list_host_dir);
    if own_tty {
        p.landlock.devices.push("/dev/tty".into());
    }
    for (k, v) in p.env.iter_mut() {
        match k.as_str() {
            "HOME" => *v = dir.join("home").to_string_lossy().into_owned(),
            "TMPDIR" => *v = dir.join("tmp").to_string_lossy().into_owned(),
            _ => {}
        }
    }
    Ok((p, dir))
}

/// Lists a host directory (no symlink followed; unreadable: empty).
pub fn list_host_dir(dir: &Path) -> Vec<(String, Kind)> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let ft = e.file_type().ok()?;
            let kind = if ft.is_symlink() {
                Kind::Symlink
            } else if ft.is_dir() {
                Kind::Dir
            } else {
                Kind::File
            };
            Some((name, kind))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{Entry, Why};

    fn entry(path: &str, mode: Mode) -> Entry {
        Entry {
            path: path.into(),
            host: (mode != Mode::Built).then(|| path.into()),
            mode,
            kind: Kind::Dir,
            why: Why::System,
            relocated: false,
        }
    }

    fn fake_fs(dir: &Path) -> Vec<(String, Kind)> {
        let names: &[&str] = match dir.to_str().unwrap_or("") {
            "/" => &["etc", "home", "tmp", "usr", "dev", "proc", "bin"],
            "/etc" => &["passwd", "shadow", "ssl"],
            "/home" => &["me"],
            "/home/me" => &[".ssh", ".bashrc", "proj"],
            "/home/me/proj" => &[".env", "src", ".git"],
            _ => &[],
        };
        names
            .iter()
            .map(|n| {
                let k = if *n == "bin" {
                    Kind::Symlink
                } else if n.contains('.') && *n != ".ssh" && *n != ".git" {
                    Kind::File
                } else {
                    Kind::Dir
                };
                (n.to_string(), k)
            })
            .collect()
    }

    #[test]
    fn hidden_paths_get_no_rule_and_their_parents_are_split() {
        let view = View {
            level: Level::WorkspaceWrite,
            entries: vec![
                entry("/", Mode::Read),
                entry("/proc", Mode::Built),
                entry("/tmp", Mode::Built),
                entry("/etc/shadow", Mode::Hidden),
                entry("/home/me/.ssh", Mode::Hidden),
                entry("/home/me/proj", Mode::Write),
                entry("/home/me/proj/.env", Mode::Hidden),
                entry("/home/me/proj/.git", Mode::WriteProtected),
            ],
            workspace: "/home/me/proj".into(),
            home: "/home/me".into(),
            swept: Vec::new(),
            network: Default::default(),
            net_class: None,
        };
        let spec = landlock_spec(&view, Path::new("/var/tmp/run"), 6, &fake_fs);
        let has = |v: &[PathBuf], p: &str| v.iter().any(|x| x == Path::new(p));
        // Split directories are list-only; secrets and /tmp get nothing.
        for p in ["/", "/etc", "/home", "/home/me", "/home/me/proj"] {
            assert!(has(&spec.list_only, p), "{p} list-only: {spec:?}");
            assert!(!has(&spec.read, p) && !has(&spec.write, p), "{p}: {spec:?}");
        }
        for p in [
            "/etc/shadow",
            "/home/me/.ssh",
            "/home/me/proj/.env",
            "/tmp",
            "/dev",
        ] {
            let all = [&spec.read, &spec.write, &spec.list_only];
            assert!(
                all.iter().all(|v| !has(v, p)),
                "{p} must get no rule: {spec:?}"
            );
        }
        assert!(has(&spec.read, "/etc/passwd") && has(&spec.read, "/usr"));
        assert!(has(&spec.read, "/home/me/.bashrc") && has(&spec.read, "/proc"));
        assert!(has(&spec.write, "/home/me/proj/src"));
        assert!(
            has(&spec.read, "/home/me/proj/.git"),
            "write-protected is read"
        );
        assert!(!has(&spec.write, "/home/me/proj/.git"));
        assert!(has(&spec.write, "/var/tmp/run"));
        assert!(
            !has(&spec.read, "/bin"),
            "symlinks get no rule of their own"
        );
        assert!(has(&spec.devices, "/dev/null"));
    }
}
