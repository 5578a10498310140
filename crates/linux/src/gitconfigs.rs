//! The git config files a run may show at their host paths: the
//! workspace's own (`.git/config` and `config.worktree`, a linked
//! worktree's common dir's, submodules' `.git/modules/**/config`,
//! checkouts nested in the workspace), a granted directory's (the same,
//! for the checkout the grant is), and the host's own
//! ([`host_git_config`]: the system's, an XDG one outside HOME),
//! found and read without following a symlink the command could have
//! planted: each git dir is resolved once, opened with no symlink on its
//! path, and its `config` opened beneath it with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`. A `config` that is a
//! symlink or not a regular file is not read (moat never copies what it
//! points to into the view); one larger than a config file is reported
//! unread ([`GitConfigFile::too_large`]) so the caller hides it rather than
//! show it raw. The caller redacts what was read; the plan shows the copy
//! over the host file.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::sys;

/// Largest config read (a git config is small; a larger file is not one).
const MAX_SIZE: u64 = 256 * 1024;
/// How deep `.git/modules` is walked (`modules/a/modules/b`, names with
/// slashes such as `modules/lib/x`).
const MAX_MODULES_DEPTH: usize = 8;

/// The config files of one git dir.
pub const CONFIG_NAMES: &[&str] = &["config", "config.worktree"];

/// One git config file, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GitConfigFile {
    /// Its host path (no symlink on it).
    pub path: PathBuf,
    pub text: Vec<u8>,
    /// A regular file larger than [`MAX_SIZE`], not read (`text` empty):
    /// it may hold a credential past any cut, so it is not shown at all.
    pub too_large: bool,
}

/// The git config files of the repository at `workspace` (canonical) and
/// of the checkouts whose `.git` entries are `nested` (found by the
/// probe's walk), read safely. Missing or unreadable ones are left out.
pub fn workspace_git_configs(workspace: &Path, nested: &[PathBuf]) -> Vec<GitConfigFile> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    // `nested` holds `.git` entries and directories that are git dirs
    // themselves (bare repositories): those are read as they are.
    let (dot_gits, bare): (Vec<&PathBuf>, Vec<&PathBuf>) = nested
        .iter()
        .partition(|g| g.file_name() == Some(std::ffi::OsStr::new(".git")));
    for b in bare {
        if let Ok(d) = std::fs::canonicalize(b) {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    let checkouts = std::iter::once(workspace).chain(dot_gits.iter().filter_map(|g| g.parent()));
    for checkout in checkouts {
        for d in git_dirs(checkout) {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    let mut out = Vec::new();
    for dir in dirs {
        collect(&dir, &mut out);
    }
    // A submodule's checkout points into the module dir already walked.
    let mut seen: Vec<PathBuf> = Vec::new();
    out.retain(|f| {
        let new = !seen.contains(&f.path);
        seen.push(f.path.clone());
        new
    });
    out
}

/// Paths a git dir's own config files name that git reads or runs from
/// later: `core.hooksPath` (the hooks git runs instead of `hooks/`) and
/// the files `include.path`/`includeIf.*.path` pull in (each read like the
/// config itself, so a key there that runs a program runs). Resolved as
/// git resolves them: a hooks path relative to `worktree` (where hooks
/// run: the work tree's top, or the git dir of a bare repository), an
/// include relative to the file that includes it; includes are followed
/// (up to [`MAX_INCLUDE_DEPTH`] deep). Values starting with `~` are left
/// out (they name the home, not a repository's files).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamedPaths {
    pub hooks: Vec<PathBuf>,
    pub includes: Vec<PathBuf>,
}

/// How deep `include.path` chains are followed.
const MAX_INCLUDE_DEPTH: usize = 8;

/// The [`NamedPaths`] of the git dir `git_dir` (a canonical directory).
pub fn named_paths(git_dir: &Path, worktree: &Path) -> NamedPaths {
    let mut out = NamedPaths::default();
    let mut queue: Vec<(PathBuf, usize)> =
        CONFIG_NAMES.iter().map(|n| (git_dir.join(n), 0)).collect();
    while let Some((file, depth)) = queue.pop() {
        let (Some(dir), Some(name)) = (file.parent(), file.file_name()) else {
            continue;
        };
        let Some(text) = read_beneath(dir, Path::new(name)) else {
            continue;
        };
        let Ok(entries) = moat_policy::gitconfig::parse(&String::from_utf8_lossy(&text)) else {
            continue;
        };
        for e in entries {
            let Some(v) = e
                .value
                .as_deref()
                .filter(|v| !v.is_empty() && !v.starts_with('~'))
            else {
                continue;
            };
            let hooks = e.section == "core" && e.subsection.is_none() && e.key == "hookspath";
            let include = e.key == "path"
                && ((e.section == "include" && e.subsection.is_none()) || e.section == "includeif");
            if hooks {
                out.hooks.push(worktree.join(v));
            } else if include {
                let target = dir.join(v);
                if depth < MAX_INCLUDE_DEPTH && !out.includes.contains(&target) {
                    queue.push((target.clone(), depth + 1));
                }
                out.includes.push(target);
            }
        }
    }
    out
}

/// The git dirs whose configs git reads for `workspace`: its `.git` (a
/// directory, or where a gitfile or symlink points) and that dir's common
/// dir (a linked worktree's main `.git`), each canonical.
fn git_dirs(workspace: &Path) -> Vec<PathBuf> {
    let dot_git = workspace.join(".git");
    let Ok(meta) = std::fs::symlink_metadata(&dot_git) else {
        return Vec::new();
    };
    let git_dir = if meta.is_file() {
        // `gitdir: PATH` (a linked worktree, a submodule's checkout).
        let Some(text) = read_beneath(workspace, Path::new(".git")) else {
            return Vec::new();
        };
        let text = String::from_utf8_lossy(&text);
        let Some(target) = text.lines().next().and_then(|l| l.strip_prefix("gitdir:")) else {
            return Vec::new();
        };
        workspace.join(target.trim())
    } else {
        dot_git
    };
    let Ok(git_dir) = std::fs::canonicalize(git_dir) else {
        return Vec::new();
    };
    let mut dirs = vec![git_dir.clone()];
    if let Some(common) = read_beneath(&git_dir, Path::new("commondir")) {
        let common = String::from_utf8_lossy(&common);
        if let Ok(c) = std::fs::canonicalize(git_dir.join(common.trim())) {
            if !dirs.contains(&c) {
                dirs.push(c);
            }
        }
    }
    dirs
}

/// `dir/config` and every `config` beneath `dir/modules`.
fn collect(dir: &Path, out: &mut Vec<GitConfigFile>) {
    if !is_git_dir(dir) {
        return;
    }
    // `config.worktree`: read by git with `extensions.worktreeConfig`.
    for name in CONFIG_NAMES {
        match read_config(dir, Path::new(name)) {
            Some(Config::Read(text)) => out.push(GitConfigFile {
                path: dir.join(name),
                text,
                too_large: false,
            }),
            Some(Config::TooLarge) => out.push(GitConfigFile {
                path: dir.join(name),
                text: Vec::new(),
                too_large: true,
            }),
            None => {}
        }
    }
    modules(&dir.join("modules"), 0, out);
}

fn modules(dir: &Path, depth: usize, out: &mut Vec<GitConfigFile>) {
    if depth >= MAX_MODULES_DEPTH {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        // A symlinked entry is not followed (file_type does not follow).
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        collect_module(&e.path(), depth + 1, out);
    }
}

fn collect_module(dir: &Path, depth: usize, out: &mut Vec<GitConfigFile>) {
    if is_git_dir(dir) {
        // A module's git dir, and its own submodules.
        collect(dir, out);
    } else {
        // A part of a module name with slashes (`modules/lib/x`).
        modules(dir, depth, out);
    }
}

/// `dir` holds a `HEAD` file, as every git dir does: a directory a gitfile
/// or `commondir` names that is no git dir is not read.
fn is_git_dir(dir: &Path) -> bool {
    sys::open_dir_nofollow(dir)
        .and_then(|d| sys::openat_beneath(d.as_raw_fd(), Path::new("HEAD"), libc::O_PATH))
        .is_ok()
}

/// A config file found beneath a git dir.
enum Config {
    Read(Vec<u8>),
    /// A regular file larger than [`MAX_SIZE`] (or growing past it while read).
    TooLarge,
}

/// `name` beneath the directory `dir` (no symlink on `dir`'s path, none at
/// or under `name`), when it is a regular file: its bytes, or that it is
/// larger than [`MAX_SIZE`].
fn read_config(dir: &Path, name: &Path) -> Option<Config> {
    let dfd: OwnedFd = sys::open_dir_nofollow(dir).ok()?;
    let fd = sys::openat_beneath(dfd.as_raw_fd(), name, libc::O_RDONLY | libc::O_NONBLOCK).ok()?;
    read_open(File::from(fd))
}

/// An opened config file's bytes, when it is a regular file, or that it is
/// larger than [`MAX_SIZE`].
fn read_open(file: File) -> Option<Config> {
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    if meta.len() > MAX_SIZE {
        return Some(Config::TooLarge);
    }
    // Room for the whole file (and the read that finds its end): without
    // it `read_to_end` probes a small file in 32-byte reads.
    let mut text = Vec::with_capacity(meta.len() as usize + 1);
    file.take(MAX_SIZE + 1).read_to_end(&mut text).ok()?;
    Some(if text.len() as u64 <= MAX_SIZE {
        Config::Read(text)
    } else {
        Config::TooLarge
    })
}

/// `name` beneath `dir` as [`read_config`] reads it, when it is not too large.
fn read_beneath(dir: &Path, name: &Path) -> Option<Vec<u8>> {
    match read_config(dir, name)? {
        Config::Read(text) => Some(text),
        Config::TooLarge => None,
    }
}

/// A git config file at a host path the command could not have shaped
/// (`/etc/gitconfig`, `$XDG_CONFIG_HOME/git/config`): resolved once to its
/// canonical path (a symlinked system config is the file it points to,
/// which is what the view must cover), then read as a workspace config is.
/// None when missing or not a regular file.
pub fn host_git_config(path: &Path) -> Option<GitConfigFile> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = std::fs::canonicalize(path).ok()?;
    // Not beneath a directory fd: a system file may be a mount of its own
    // (a container's bind), which `openat_beneath` refuses to cross into.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .ok()?;
    match read_open(file)? {
        Config::Read(text) => Some(GitConfigFile {
            path,
            text,
            too_large: false,
        }),
        Config::TooLarge => Some(GitConfigFile {
            path,
            text: Vec::new(),
            too_large: true,
        }),
    }
}

/// The config files `names` (relative, one or more components) beneath
/// the directory `dir` (opened once), each found one with its name, read
/// as a git dir's `config` is: no symlink on `dir`'s path nor at or under
/// a name, a regular file, at most 256 KiB (larger is reported, unread).
/// For a tool's config in the workspace (`.npmrc`), which the command
/// could have replaced with a symlink to a key.
pub fn configs_beneath<'a>(dir: &Path, names: &[&'a str]) -> Vec<(&'a str, GitConfigFile)> {
    let Ok(dfd) = sys::open_dir_nofollow(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in names {
        let Ok(fd) = sys::openat_beneath(
            dfd.as_raw_fd(),
            Path::new(name),
            libc::O_RDONLY | libc::O_NONBLOCK,
        ) else {
            continue;
        };
        let (text, too_large) = match read_open(File::from(fd)) {
            Some(Config::Read(text)) => (text, false),
            Some(Config::TooLarge) => (Vec::new(), true),
            None => continue,
        };
        let path = dir.join(name);
        out.push((
            *name,
            GitConfigFile {
                path,
                text,
                too_large,
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "moat-gitconfigs-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::canonicalize(d).unwrap()
    }

    #[test]
    fn finds_repo_module_and_common_dir_configs() {
        let root = tmp();
        let main = root.join("main");
        std::fs::create_dir_all(main.join(".git/modules/lib/x")).unwrap();
        std::fs::create_dir_all(main.join(".git/worktrees/wt")).unwrap();
        std::fs::write(main.join(".git/config"), "[core]\n").unwrap();
        std::fs::write(main.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(main.join(".git/modules/lib/x/config"), "[core]\n").unwrap();
        std::fs::write(main.join(".git/modules/lib/x/HEAD"), "x\n").unwrap();
        std::fs::write(main.join(".git/worktrees/wt/HEAD"), "x\n").unwrap();
        std::fs::write(main.join(".git/worktrees/wt/commondir"), "../..\n").unwrap();
        let wt = root.join("wt");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::write(
            wt.join(".git"),
            format!("gitdir: {}\n", main.join(".git/worktrees/wt").display()),
        )
        .unwrap();
        let paths = |ws: &Path| -> Vec<PathBuf> {
            workspace_git_configs(ws, &[])
                .into_iter()
                .map(|f| f.path)
                .collect()
        };
        assert_eq!(
            paths(&main),
            vec![
                main.join(".git/config"),
                main.join(".git/modules/lib/x/config")
            ]
        );
        assert!(
            paths(&wt).contains(&main.join(".git/config")),
            "{:?}",
            paths(&wt)
        );
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_symlinked_config_is_not_read() {
        let root = tmp();
        std::fs::create_dir_all(root.join("ws/.git")).unwrap();
        std::fs::write(root.join("ws/.git/HEAD"), "x\n").unwrap();
        std::fs::write(root.join("secret"), "[core]\n\tx = SECRET\n").unwrap();
        std::os::unix::fs::symlink(root.join("secret"), root.join("ws/.git/config")).unwrap();
        assert!(workspace_git_configs(&root.join("ws"), &[]).is_empty());
        std::fs::remove_dir_all(root).unwrap();
    }
}
