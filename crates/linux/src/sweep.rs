//! After a run at a writable level: write-protected paths that did not exist
//! before (e.g. `.git/hooks` in a workspace without `.git`) cannot be covered
//! by a mount, so anything the command created there is moved aside, under a
//! name no tool will load, and reported.

use std::path::{Path, PathBuf};

/// Moves each existing path in `paths` to `<name>.moat-quarantine-<tag>` in the
/// same directory (a rename never crosses filesystems); returns what moved.
pub fn sweep(paths: &[PathBuf], tag: &str) -> Vec<(PathBuf, PathBuf)> {
    let mut moved = Vec::new();
    for p in paths {
        if p.symlink_metadata().is_err() {
            continue;
        }
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dest = p.with_file_name(format!("{name}.moat-quarantine-{tag}"));
        match std::fs::rename(p, &dest) {
            Ok(()) => moved.push((p.clone(), dest)),
            Err(_) => {
                // Renaming failed (e.g. a read-only parent): remove it instead,
                // never leave it in place.
                let _ = remove_any(p);
                moved.push((p.clone(), PathBuf::from("(deleted)")));
            }
        }
    }
    moved
}

/// Entries named `<prefix>*` in each guard's directory that were not there
/// before the run.
pub fn new_prefixed(guards: &[crate::probe::PrefixGuard]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for g in guards {
        let Ok(rd) = std::fs::read_dir(&g.dir) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&g.prefix) && !g.existing.contains(&name) {
                out.push(e.path());
            }
        }
    }
    out
}

fn remove_any(p: &Path) -> std::io::Result<()> {
    let meta = p.symlink_metadata()?;
    if meta.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
}
