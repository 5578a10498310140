//! The secrets probe's answer kept between executions of a long-lived
//! process (`moat serve`/`mcp`, opted in by [`enable`]) and reused only
//! while every directory it depends on is provably unchanged.
//!
//! Sound because the probe's answer is a function of directory contents
//! (which names exist in the homes, in /etc, /etc/ssh …) and of the
//! policy, the uid and /etc/passwd: adding, removing or renaming an entry
//! changes its directory's mtime and ctime, and a component replaced by a
//! symlink is such a change in its parent. So the signature (device,
//! inode, mtime, ctime) of every directory the probe consulted, and of
//! every ancestor of each, decides. Never cached (the full probe runs):
//! an answer that followed a symlink (its target's directories are not
//! signed), or one where a directory it read is itself a symlink; a
//! directory changed within the last [`UNSTABLE`] (a second
//! change in the same timestamp tick would leave its times unchanged); a
//! directory on a filesystem not known to keep directory times exactly
//! (NFS caches them, FUSE may not set them).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use moat_policy::Policy;

use super::Kind;

/// A directory changed more recently than this before the answer was
/// recorded makes it uncacheable: timestamps come from a coarse clock
/// (one tick is 1-10 ms), and two changes within one tick look like one.
const UNSTABLE: std::time::Duration = std::time::Duration::from_millis(100);

/// Filesystems whose directory mtime/ctime the kernel itself sets on every
/// entry change (`statfs` magic numbers: ext2/3/4, tmpfs, xfs, btrfs).
const EXACT_DIR_TIMES: &[i64] = &[0xEF53, 0x0102_1994, 0x5846_5342, 0x9123_683E];

static ON: AtomicBool = AtomicBool::new(false);
static CACHE: Mutex<Option<Entry>> = Mutex::new(None);

/// Keeps the secrets probe's answer in this process from now on (a
/// service; a one-shot run probes once and gains nothing).
pub fn enable() {
    ON.store(true, Ordering::Relaxed);
}

/// Whether [`enable`] was called.
pub(super) fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// What the answer depends on besides the directories.
#[derive(PartialEq)]
pub(super) struct Inputs {
    pub policy: Policy,
    pub uid: u32,
    pub passwd: Vec<(u32, PathBuf)>,
}

/// The probe's answer: (home path, canonical) pairs of the policy's home
/// and every secret (canonical) with its kind.
#[derive(Clone, Default)]
pub(super) struct Answer {
    pub home_protected: Vec<(PathBuf, PathBuf)>,
    pub secrets: Vec<(PathBuf, Kind)>,
}

type Sig = Option<(u64, u64, i64, i64, i64, i64)>;

struct Entry {
    inputs: Inputs,
    dirs: Vec<(PathBuf, Sig)>,
    answer: Answer,
}

/// A filesystem's `statfs` magic number (its C type's width varies by
/// architecture).
#[allow(clippy::unnecessary_cast)]
fn fs_magic(f: &nix::sys::statfs::Statfs) -> i64 {
    f.filesystem_type().0 as i64
}

fn sig(dir: &Path) -> Sig {
    let st = nix::sys::stat::lstat(dir).ok()?;
    Some((
        st.st_dev,
        st.st_ino,
        st.st_mtime,
        st.st_mtime_nsec,
        st.st_ctime,
        st.st_ctime_nsec,
    ))
}

/// The cached answer for `inputs`, when caching is on and every signed
/// directory is as it was.
pub(super) fn lookup(inputs: &Inputs) -> Option<Answer> {
    if !ON.load(Ordering::Relaxed) {
        return None;
    }
    let cache = CACHE.lock().ok()?;
    let e = cache.as_ref()?;
    if e.inputs != *inputs || e.dirs.iter().any(|(d, s)| sig(d) != *s) {
        return None;
    }
    Some(e.answer.clone())
}

/// Records `answer` for `inputs`, computed from the directories
/// `consulted` (their ancestors are added) by a probe that began at
/// `started`. The signatures are taken now, after the probe: a directory
/// changed while the probe ran (after it was read, before it was signed)
/// has times after `started`, so it is unstable and nothing is recorded.
/// `cacheable`: the probe followed no symlink.
pub(super) fn store(
    inputs: Inputs,
    consulted: Vec<PathBuf>,
    cacheable: bool,
    answer: &Answer,
    started: std::time::SystemTime,
) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    for d in consulted {
        for a in d.ancestors() {
            dirs.push(a.to_path_buf());
        }
    }
    dirs.sort();
    dirs.dedup();
    let stable_before = started
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_sub(UNSTABLE);
    let mut signed = Vec::with_capacity(dirs.len());
    let mut ok = cacheable;
    for d in dirs {
        // A signed path that is a symlink stands for its target, whose
        // changes its own times do not show (a HOME that is a symlink).
        if super::lstat_kind(&d) == Some(Kind::Symlink) {
            ok = false;
        }
        let s = sig(&d);
        if let Some((_, _, ms, mns, cs, cns)) = s {
            let t = |s: i64, ns: i64| {
                std::time::Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32)
            };
            let exact = nix::sys::statfs::statfs(&d)
                .map(|f| EXACT_DIR_TIMES.contains(&fs_magic(&f)))
                .unwrap_or(false);
            if !exact || t(ms, mns) >= stable_before || t(cs, cns) >= stable_before {
                ok = false;
            }
        }
        signed.push((d, s));
    }
    let mut cache = match CACHE.lock() {
        Ok(c) => c,
        Err(p) => p.into_inner(),
    };
    *cache = ok.then(|| Entry {
        inputs,
        dirs: signed,
        answer: answer.clone(),
    });
}
