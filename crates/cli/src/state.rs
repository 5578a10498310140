//! First-use agent state. A profile grant for a path that does not exist yet
//! (`~/.claude`, `~/.cache/pip`) is created before the run — mode 0700 or
//! 0600, from the home directory's fd with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, so a planted symlink cannot redirect it — instead
//! of being dropped with the login the tool just made.
//!
//! Files the tool replaces by an atomic rename (`~/.claude.json`: write a
//! temporary, rename it over) cannot be bind-mounted: rename onto a mount
//! point fails with EBUSY. Such a file gets a private copy in a per-run host
//! directory that backs the sandbox HOME, and after the run the copy is
//! merged back under a lock with compare-and-swap: unchanged on the host
//! since the run started → replaced; changed by another run meanwhile → a
//! three-way merge of the JSON (each side's changes kept), or, for a file
//! that is not JSON, the host copy kept and ours saved beside it. Two runs
//! writing at once lose no data.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use moat_config::{FirstUseKind, Profile, Resolved};
use nix::errno::Errno;
use nix::fcntl::{openat2, renameat, Flock, FlockArg, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, mkdirat, Mode, SFlag};

/// One synced file: where it lives under the home, and its bytes when the
/// run started (None: it did not exist).
struct Synced {
    rel: PathBuf,
    snapshot: Option<Vec<u8>>,
    /// The profile's `host_executed_keys`: the host's values of these win.
    pinned: Vec<String>,
}

/// State prepared for one run; [`StateRun::finish`] merges and cleans up.
#[derive(Default)]
pub struct StateRun {
    home: PathBuf,
    /// The per-run directory backing the sandbox HOME (only with synced files).
    pub private_home: Option<PathBuf>,
    synced: Vec<Synced>,
    lock_dir: Option<PathBuf>,
}

impl StateRun {
    /// Home-relative names of the synced files (for the policy).
    pub fn synced_files(&self) -> Vec<PathBuf> {
        self.synced.iter().map(|s| s.rel.clone()).collect()
    }
}

fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

fn open_dir(path: &Path) -> Result<OwnedFd, Errno> {
    openat2(
        nix::fcntl::AT_FDCWD,
        path,
        OpenHow::new()
            .flags(OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )
}

/// Opens directory `name` beneath `dir` without following any symlink.
fn open_dir_at(dir: &OwnedFd, name: &Path) -> Result<OwnedFd, Errno> {
    openat2(
        dir.as_fd(),
        name,
        OpenHow::new()
            .flags(OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .resolve(beneath()),
    )
}

/// The plain components of a home-relative path (no `..`, no root).
fn parts(rel: &Path) -> Option<Vec<&std::ffi::OsStr>> {
    rel.components()
        .map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect()
}

/// Opens (creating with 0700 when missing) each directory of `dirs` in turn
/// beneath `base`. Refuses a symlink anywhere on the way.
fn walk_create(base: OwnedFd, dirs: &[&std::ffi::OsStr]) -> Result<OwnedFd, String> {
    let mut cur = base;
    for d in dirs {
        let next = match open_dir_at(&cur, Path::new(d)) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                match mkdirat(cur.as_fd(), Path::new(d), Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(format!("mkdir {}: {e}", Path::new(d).display())),
                }
                open_dir_at(&cur, Path::new(d))
                    .map_err(|e| format!("{}: {e}", Path::new(d).display()))?
            }
            Err(Errno::ELOOP) | Err(Errno::EXDEV) => {
                return Err(format!(
                    "{} is a symlink; moat does not create state through one",
                    Path::new(d).display()
                ))
            }
            Err(e) => return Err(format!("{}: {e}", Path::new(d).display())),
        };
        cur = next;
    }
    Ok(cur)
}

/// Creates `~/rel` as `kind` unless something exists there. Ok(true) when it
/// created it (and verified what it created).
fn create_missing(home: &Path, rel: &Path, kind: FirstUseKind) -> Result<bool, String> {
    let comps = parts(rel)
        .filter(|c| !c.is_empty())
        .ok_or("not a plain home-relative path")?;
    let Some((last, dirs)) = comps.split_last() else {
        return Err("an empty path".into());
    };
    let home_fd = open_dir(home).map_err(|e| format!("{}: {e}", home.display()))?;
    let parent = walk_create(home_fd, dirs)?;
    let uid = nix::unistd::getuid().as_raw();
    let last = Path::new(last);
    let (fd, created) = match kind {
        FirstUseKind::Dir => {
            let created = match mkdirat(parent.as_fd(), last, Mode::from_bits_truncate(0o700)) {
                Ok(()) => true,
                Err(Errno::EEXIST) => false,
                Err(e) => return Err(format!("mkdir: {e}")),
            };
            if !created {
                return Ok(false);
            }
            (open_dir_at(&parent, last).map_err(|e| e.to_string())?, true)
        }
        FirstUseKind::File => match openat2(
            parent.as_fd(),
            last,
            OpenHow::new()
                .flags(
                    OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_WRONLY
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                )
                .mode(Mode::from_bits_truncate(0o600))
                .resolve(beneath()),
        ) {
            Ok(fd) => (fd, true),
            Err(Errno::EEXIST) => return Ok(false),
            Err(e) => return Err(format!("create: {e}")),
        },
    };
    // Verify what now exists is what we made: our own, of the right type.
    let st = fstat(fd.as_fd()).map_err(|e| format!("fstat: {e}"))?;
    let want = match kind {
        FirstUseKind::Dir => SFlag::S_IFDIR,
        FirstUseKind::File => SFlag::S_IFREG,
    };
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != want || st.st_uid != uid {
        return Err("what was created is not ours".into());
    }
    Ok(created)
}

/// The largest state file moat reads (the run's copy is the command's to
/// shape: a sparse file of gigabytes must not land in moat's memory).
const MAX_STATE_FILE: u64 = 64 << 20;

/// Reads regular file `rel` beneath `base` (no symlinks). None when missing.
fn read_beneath(base: &Path, rel: &Path) -> Result<Option<Vec<u8>>, String> {
    let dir = open_dir(base).map_err(|e| format!("{}: {e}", base.display()))?;
    // O_NONBLOCK: a FIFO put in the file's place must not block the open
    // (it is then refused as not a regular file).
    let fd = match openat2(
        dir.as_fd(),
        rel,
        OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .resolve(beneath()),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", base.join(rel).display())),
    };
    let st = fstat(fd.as_fd()).map_err(|e| e.to_string())?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(format!(
            "{} is not a regular file",
            base.join(rel).display()
        ));
    }
    let too_big = || {
        format!(
            "{} is larger than {} MiB",
            base.join(rel).display(),
            MAX_STATE_FILE >> 20
        )
    };
    if u64::try_from(st.st_size).unwrap_or(u64::MAX) > MAX_STATE_FILE {
        return Err(too_big());
    }
    let mut buf = Vec::new();
    File::from(fd)
        .take(MAX_STATE_FILE + 1)
        .read_to_end(&mut buf)
        .map_err(|e| e.to_string())?;
    if buf.len() as u64 > MAX_STATE_FILE {
        return Err(too_big());
    }
    Ok(Some(buf))
}

/// Atomically replaces `rel` beneath `base` with `data` (mode 0600): a
/// temporary in the same directory, fsynced, renamed over.
fn replace_beneath(base: &Path, rel: &Path, data: &[u8]) -> Result<(), String> {
    let comps = parts(rel).ok_or("not a plain relative path")?;
    let Some((last, dirs)) = comps.split_last() else {
        return Err("an empty path".into());
    };
    let dir = walk_create(
        open_dir(base).map_err(|e| format!("{}: {e}", base.display()))?,
        dirs,
    )?;
    let tmp = PathBuf::from(format!(
        ".{}.moat-{}-{}",
        Path::new(last).display(),
        std::process::id(),
        nanos()
    ));
    let fd = openat2(
        dir.as_fd(),
        &tmp,
        OpenHow::new()
            .flags(
                OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_WRONLY
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
            )
            .mode(Mode::from_bits_truncate(0o600))
            .resolve(beneath()),
    )
    .map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut f = File::from(fd);
    let written = f.write_all(data).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = nix::unistd::unlinkat(dir.as_fd(), &tmp, nix::unistd::UnlinkatFlags::NoRemoveDir);
        return Err(e.to_string());
    }
    renameat(dir.as_fd(), &tmp, dir.as_fd(), Path::new(last)).map_err(|e| {
        let _ = nix::unistd::unlinkat(dir.as_fd(), &tmp, nix::unistd::UnlinkatFlags::NoRemoveDir);
        format!("rename into place: {e}")
    })
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Whether `value` (a grant as written) names `path`.
fn names(value: &Path, path: &Path) -> bool {
    moat_config::normalize_lexically(value) == path
}

/// Creates the profile's missing first-use grants and prepares the synced
/// copies. Grants a later layer removed or re-moded are left alone; a grant
/// that cannot be created is reported, never dropped silently. With `act`
/// false (`--dry-run`, `moat profile show`) only the grants change, the same
/// way, so the policy hash shown is the one a run gets; nothing is touched.
pub fn prepare(
    profile: &Profile,
    resolved: &mut Resolved,
    home: &Path,
    state_dir: Option<&Path>,
    act: bool,
) -> Result<StateRun, String> {
    let mut run = StateRun::default();
    run.home = home.to_path_buf();
    for fu in &profile.first_use {
        if !resolved.rw.iter().any(|g| names(&g.value, &fu.path)) {
            continue;
        }
        let Ok(rel) = fu.path.strip_prefix("~") else {
            continue;
        };
        let host = home.join(rel);
        let is_link = host
            .symlink_metadata()
            .map(|m| m.file_type().is_symlink())
            .unwrap_or(false);
        if fu.replaced_by_rename && !is_link {
            let snapshot = if act {
                read_beneath(home, rel)
                    .map_err(|e| format!("cannot read {}: {e}", fu.path.display()))?
            } else {
                None
            };
            resolved.rw.retain(|g| !names(&g.value, &fu.path));
            resolved
                .protected_opt_in
                .retain(|g| !names(&g.value, &fu.path));
            resolved.notes.push(format!(
                "{}: the tool replaces it by rename, so the run gets a private copy in its HOME, merged back afterwards",
                fu.path.display()
            ));
            run.synced.push(Synced {
                rel: rel.to_path_buf(),
                snapshot,
                pinned: fu.host_executed_keys.clone(),
            });
            continue;
        }
        if !act {
            continue;
        }
        if let Err(e) = create_missing(home, rel, fu.kind) {
            return Err(format!(
                "cannot create {} for the {} profile's first run: {e}; create it yourself or remove the grant",
                fu.path.display(),
                profile.name
            ));
        }
    }
    if run.synced.is_empty() || !act {
        return Ok(run);
    }
    let state = state_dir.ok_or("cannot locate moat's state directory (set HOME or XDG_STATE_HOME); it holds the private copy of the tool's state file")?;
    let sync = state.join("sync");
    std::fs::create_dir_all(&sync).map_err(|e| format!("{}: {e}", sync.display()))?;
    remove_stale(&sync);
    let dir = sync.join(format!("run-{}-{}", std::process::id(), nanos()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let dir = std::fs::canonicalize(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for s in &run.synced {
        if let Some(data) = &s.snapshot {
            replace_beneath(&dir, &s.rel, data)?;
        }
    }
    run.lock_dir = Some(sync);
    run.private_home = Some(dir);
    Ok(run)
}

use std::os::unix::fs::DirBuilderExt;

/// Removes the private HOMEs of runs whose moat is gone (SIGKILLed before it
/// could clean up): `run-PID-…` with no process PID. Their changes are lost,
/// as a tmpfs HOME's would be.
fn remove_stale(sync: &Path) {
    let Ok(rd) = std::fs::read_dir(sync) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("run-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl StateRun {
    /// After the run: merges each synced copy back into the host home and
    /// removes the per-run directory. Problems are reported on stderr; the
    /// host file is never left half-written.
    pub fn finish(self) {
        let Some(dir) = &self.private_home else {
            return;
        };
        for s in &self.synced {
            if let Err(e) = self.merge_back(dir, s) {
                eprintln!(
                    "moat: ~/{}: the run's changes were not saved: {e}",
                    s.rel.display()
                );
            }
        }
        // Drop removes the directory.
    }

    fn merge_back(&self, dir: &Path, s: &Synced) -> Result<(), String> {
        let ours = read_beneath(dir, &s.rel)?;
        let Some(ours) = ours else {
            return Ok(()); // the tool removed or never made it: keep the host's
        };
        if Some(&ours) == s.snapshot.as_ref() {
            return Ok(());
        }
        let lock_dir = self.lock_dir.as_deref().ok_or("no lock directory")?;
        let lock_name = s.rel.to_string_lossy().replace('/', "%");
        let lock_file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_dir.join(format!("{lock_name}.lock")))
            .map_err(|e| format!("lock: {e}"))?;
        let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
            .map_err(|(_, e)| format!("lock: {e}"))?;
        let theirs = read_beneath(&self.home, &s.rel)?;
        let merged = if theirs == s.snapshot {
            ours.clone()
        } else {
            match merge_json(s.snapshot.as_deref(), &ours, theirs.as_deref()) {
                Some(m) => m,
                None => {
                    // Not JSON: keep the host's, save ours beside it.
                    return self.save_beside(s, &ours, "changed on the host during the run");
                }
            }
        };
        if s.pinned.is_empty() {
            return replace_beneath(&self.home, &s.rel, &merged);
        }
        // The host tool trusts some keys to run commands: what the run
        // wrote there never reaches the host file.
        let Some((merged, reverted)) = pin_host_keys(&merged, theirs.as_deref(), &s.pinned) else {
            return self.save_beside(s, &ours, "is not JSON after the run");
        };
        if !reverted.is_empty() {
            eprintln!(
                "moat: ~/{}: the run's changes to {} were not saved (the tool on the host would trust them to run commands); the host's values stay",
                s.rel.display(),
                reverted.join(", ")
            );
        }
        replace_beneath(&self.home, &s.rel, &merged)
    }

    /// Keeps the host's file and saves the run's version beside it, inert
    /// (`NAME.moat-conflict-…` is not a file the tool reads).
    fn save_beside(&self, s: &Synced, ours: &[u8], why: &str) -> Result<(), String> {
        let side = PathBuf::from(format!("{}.moat-conflict-{}", s.rel.display(), nanos()));
        replace_beneath(&self.home, &side, ours)?;
        eprintln!(
            "moat: ~/{} {why}; the host copy is kept and this run's version is in ~/{}",
            s.rel.display(),
            side.display()
        );
        Ok(())
    }
}

impl Drop for StateRun {
    /// The per-run directory goes in every case: after the merge, and when
    /// the run never started (a refusal after `prepare`).
    fn drop(&mut self) {
        if let Some(dir) = self.private_home.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Three-way merge of JSON documents: for every key, the side that changed
/// it from `base` wins; objects changed on both sides merge recursively; a
/// value changed on both sides keeps ours. None when a side is not JSON.
fn merge_json(base: Option<&[u8]>, ours: &[u8], theirs: Option<&[u8]>) -> Option<Vec<u8>> {
    use serde_json::Value;
    let parse = |b: Option<&[u8]>| -> Option<Value> {
        match b {
            None => Some(Value::Null),
            Some(b) if b.iter().all(u8::is_ascii_whitespace) => Some(Value::Null),
            Some(b) => serde_json::from_slice(b).ok(),
        }
    };
    let base = parse(base)?;
    let ours = parse(Some(ours))?;
    let theirs = parse(theirs)?;
    let merged = merge_value(Some(&base), Some(ours), Some(theirs)).unwrap_or(Value::Null);
    let mut out = serde_json::to_vec_pretty(&merged).ok()?;
    out.push(b'\n');
    Some(out)
}

/// Sets every key path of `keys` (dotted, `*` any one key) in the JSON
/// document `merged` to its value in `host` (removed where the host has
/// none). Returns the document, re-serialized so the bytes written are the
/// ones checked, and the paths that changed; None when `merged` is not JSON.
fn pin_host_keys(
    merged: &[u8],
    host: Option<&[u8]>,
    keys: &[String],
) -> Option<(Vec<u8>, Vec<String>)> {
    use serde_json::Value;
    let mut doc: Value = serde_json::from_slice(merged).ok()?;
    let host: Value = host
        .and_then(|h| serde_json::from_slice(h).ok())
        .unwrap_or(Value::Null);
    let mut reverted = Vec::new();
    for k in keys {
        let segs: Vec<&str> = k.split('.').collect();
        pin_value(&mut doc, Some(&host), &segs, String::new(), &mut reverted);
    }
    let mut out = serde_json::to_vec_pretty(&doc).ok()?;
    out.push(b'\n');
    Some((out, reverted))
}

fn pin_value(
    doc: &mut serde_json::Value,
    host: Option<&serde_json::Value>,
    segs: &[&str],
    path: String,
    reverted: &mut Vec<String>,
) {
    let (Some((first, rest)), Some(obj)) = (segs.split_first(), doc.as_object_mut()) else {
        return;
    };
    let host = host.and_then(serde_json::Value::as_object);
    let names: Vec<String> = if *first == "*" {
        let mut n: Vec<String> = obj
            .keys()
            .chain(host.into_iter().flat_map(|h| h.keys()))
            .cloned()
            .collect();
        n.sort();
        n.dedup();
        n
    } else {
        vec![(*first).to_string()]
    };
    for name in names {
        let here = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let hv = host.and_then(|h| h.get(&name));
        if rest.is_empty() {
            if obj.get(&name) != hv {
                match hv {
                    Some(v) => obj.insert(name, v.clone()),
                    None => obj.remove(&name),
                };
                reverted.push(here);
            }
        } else if let Some(child) = obj.get_mut(&name) {
            pin_value(child, hv, rest, here, reverted);
        }
    }
}

/// One key's three-way merge; None is "absent".
fn merge_value(
    base: Option<&serde_json::Value>,
    ours: Option<serde_json::Value>,
    theirs: Option<serde_json::Value>,
) -> Option<serde_json::Value> {
    use serde_json::Value;
    if ours.as_ref() == base {
        return theirs;
    }
    if theirs.as_ref() == base || ours == theirs {
        return ours;
    }
    match (ours, theirs) {
        (Some(Value::Object(mut o)), Some(Value::Object(mut t))) => {
            let b = base.and_then(Value::as_object);
            let mut keys: Vec<String> = o.keys().chain(t.keys()).cloned().collect();
            keys.sort();
            keys.dedup();
            let mut out = serde_json::Map::new();
            for k in keys {
                let bv = b.and_then(|b| b.get(&k));
                if let Some(v) = merge_value(bv, o.remove(&k), t.remove(&k)) {
                    out.insert(k, v);
                }
            }
            Some(Value::Object(out))
        }
        (o, _) => o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(base: &str, ours: &str, theirs: &str) -> serde_json::Value {
        let b = merge_json(
            Some(base.as_bytes()),
            ours.as_bytes(),
            Some(theirs.as_bytes()),
        )
        .unwrap();
        serde_json::from_slice(&b).unwrap()
    }

    #[test]
    fn both_sides_changes_survive() {
        let v = m(
            r#"{"a":1,"projects":{"/x":{"n":1}}}"#,
            r#"{"a":1,"projects":{"/x":{"n":2}},"login":"ours"}"#,
            r#"{"a":5,"projects":{"/x":{"n":1},"/y":{"n":9}}}"#,
        );
        assert_eq!(
            v,
            serde_json::json!({"a":5,"login":"ours","projects":{"/x":{"n":2},"/y":{"n":9}}})
        );
    }

    #[test]
    fn pinned_keys_keep_the_host_values() {
        let keys = [
            "mcpServers".to_string(),
            "projects.*.allowedTools".to_string(),
        ];
        let (out, reverted) = pin_host_keys(
            br#"{"a":2,"mcpServers":{"x":1},"projects":{"/p":{"allowedTools":["Bash"],"k":1},"/q":{"allowedTools":[]}}}"#,
            Some(br#"{"a":1,"projects":{"/q":{"allowedTools":["Read"]}}}"#),
            &keys,
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a":2,"projects":{"/p":{"k":1},"/q":{"allowedTools":["Read"]}}})
        );
        assert_eq!(
            reverted,
            [
                "mcpServers",
                "projects./p.allowedTools",
                "projects./q.allowedTools"
            ]
        );
        assert!(pin_host_keys(b"not json", None, &keys).is_none());
    }

    #[test]
    fn deletions_on_one_side_apply_and_non_json_is_refused() {
        let v = m(r#"{"a":1,"b":2}"#, r#"{"a":1}"#, r#"{"a":1,"b":2,"c":3}"#);
        assert_eq!(v, serde_json::json!({"a":1,"c":3}));
        assert!(merge_json(Some(b"x=1"), b"x=2", Some(b"x=3")).is_none());
    }

    #[test]
    fn created_on_first_use_without_following_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path();
        assert!(create_missing(home, Path::new(".cache/pip"), FirstUseKind::Dir).unwrap());
        assert!(!create_missing(home, Path::new(".cache/pip"), FirstUseKind::Dir).unwrap());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(home.join(".cache/pip"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        assert!(create_missing(home, Path::new(".x.json"), FirstUseKind::File).unwrap());
        let mode = std::fs::metadata(home.join(".x.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0);
        // A planted symlink on the way is refused, nothing lands at its target.
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), home.join(".codexlink")).unwrap();
        assert!(create_missing(home, Path::new(".codexlink/state"), FirstUseKind::Dir).is_err());
        assert!(std::fs::read_dir(elsewhere.path())
            .unwrap()
            .next()
            .is_none());
    }
}
