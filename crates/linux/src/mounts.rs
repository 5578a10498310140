//! Replays a plan's identity and mount steps inside the new user+mount
//! namespace: maps the ids, builds a tmpfs root, pivots into it, lays the
//! view out, detaches the old root. Runs in the sandbox's init before
//! anything untrusted exists. Every call goes through the [`Syscall`] seam,
//! so the sequence a plan produces is golden-tested (`seam_tests.rs`).

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use crate::plan::{MountOp, Plan};
use crate::probe::Kind;
use crate::sys::{MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};
use crate::syscall::Syscall;

/// Where the host's root is reachable while the view is built.
const OLD_ROOT: &str = "/.moat-oldroot";
/// Where the new root is assembled before pivot_root (a tmpfs over it).
const STAGING: &str = "/tmp";

/// A failed setup step, with the path it was working on.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}: {source}")]
pub struct MountError {
    pub step: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn err<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> MountError + 'a {
    move |source| MountError {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// The step named when a fresh procfs is refused: what it means and the fix.
const PROC_REFUSED: &str = "mount a fresh procfs (refused: the /proc moat runs under has masked or read-only parts, as a container's default /proc does; run the container with an unmasked /proc, e.g. Docker --security-opt systempaths=unconfined, Kubernetes securityContext.procMount: Unmasked, or use --backend landlock) at";

/// The new user namespace's identity: the caller's uid and gid mapped to
/// themselves, setgroups denied, the process made non-dumpable, the
/// hostname `moat`. Errors are the messages the user sees.
pub(crate) fn set_identity<S: Syscall>(sys: &S, plan: &Plan) -> Result<(), String> {
    set_identity_ids(sys, plan.uid, plan.gid)
}

/// [`set_identity`] from the ids alone (the early init has no plan yet;
/// its caller read them before the clone: inside the new user namespace
/// `getuid` gives the overflow id until the map exists).
pub(crate) fn set_identity_ids<S: Syscall>(sys: &S, uid: u32, gid: u32) -> Result<(), String> {
    sys.write_file(Path::new("/proc/self/setgroups"), b"deny")
        .map_err(|e| format!("write /proc/self/setgroups: {e}"))?;
    sys.write_file(
        Path::new("/proc/self/uid_map"),
        format!("{0} {0} 1\n", uid).as_bytes(),
    )
    .map_err(|e| {
        if uid == 0 && e.raw_os_error() == Some(libc::EPERM) {
            // Linux >= 5.12: mapping root needs CAP_SETFCAP where moat runs.
            format!("write uid_map: {e}; root may map itself into a user namespace only with CAP_SETFCAP (a container that drops it: add it, e.g. docker --cap-add SETFCAP, run moat as a non-root user, or use --backend landlock)")
        } else {
            format!("write uid_map: {e}")
        }
    })?;
    sys.write_file(
        Path::new("/proc/self/gid_map"),
        format!("{0} {0} 1\n", gid).as_bytes(),
    )
    .map_err(|e| format!("write gid_map: {e}"))?;
    // After the id maps: a non-dumpable process's /proc files belong to root.
    sys.set_not_dumpable()
        .map_err(|e| format!("set non-dumpable: {e}"))?;
    sys.sethostname("moat")
        .map_err(|e| format!("set hostname: {e}"))
}

/// The empty directory and file every stand-in is bound from, in the
/// detached scratch tmpfs.
const SCRATCH_DIR: &str = "d";
const SCRATCH_FILE: &str = "f";

/// The mount flags of every stand-in.
const STAND_IN_ATTRS: u64 =
    MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;

/// The scratch file a [`MountOp::Redacted`] at `target` is bound from: one
/// name per target (the plan has one such op per target).
fn redacted_name(target: &Path) -> PathBuf {
    use std::hash::{Hash, Hasher};
    // DefaultHasher::new() is deterministic (fixed keys): the name is the
    // same when the scratch is filled and when the op is laid.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    target.hash(&mut h);
    PathBuf::from(format!("r{:016x}", h.finish()))
}

/// The start of a sandbox root, laid by [`stage_root`] before the rest:
/// the process is in a fresh tmpfs as `/` (the host's root under
/// `OLD_ROOT`), holds the detached scratch tmpfs, still writable, with the
/// empty directory and file stand-ins are bound from, and the first ops of
/// the view are laid (`laid`: `ViewStart::staged_ops`, which only the
/// policy and the host's top-level entries decide). The early init lays it while moat probes (ARCHITECTURE.md,
/// "Launch performance"); the serial init right before the rest, so both
/// launches make the same calls in the same order.
pub(crate) struct Staged<H> {
    scratch: H,
    laid: Vec<MountOp>,
}

impl<H> Staged<H> {
    /// The scratch tmpfs's handle (the init keeps its fd open across its
    /// fd cleanup).
    pub(crate) fn scratch(&self) -> &H {
        &self.scratch
    }
}

/// Lays the start of a sandbox root (see [`Staged`]): mounts made private,
/// a fresh tmpfs pivoted to as `/`, the scratch tmpfs with its empty
/// directory and file, then `start`, the first ops of the plan (none may be
/// a stand-in: the scratch is not sealed yet). [`build_staged_root`]
/// refuses a plan whose ops do not begin with `start`.
pub(crate) fn stage_root<S: Syscall>(
    sys: &S,
    start: &[MountOp],
) -> Result<Staged<S::Handle>, MountError> {
    // Our mount events must never propagate to the host (and host events
    // should not trickle into the sandbox mid-run).
    sys.mount(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )
    .map_err(err("make mounts private", Path::new("/")))?;
    let staging = Path::new(STAGING);
    sys.mount(
        Some("tmpfs"),
        staging,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755,size=16m"),
    )
    .map_err(err("mount root tmpfs", staging))?;
    let old = staging.join(OLD_ROOT.trim_start_matches('/'));
    sys.mkdir(&old, 0o700).map_err(err("mkdir", &old))?;
    sys.pivot_root(staging, &old)
        .map_err(err("pivot_root", staging))?;
    sys.chdir(Path::new("/"))
        .map_err(err("chdir", Path::new("/")))?;
    let scratch = sys
        .detached_tmpfs(c"0555")
        .map_err(err("create scratch tmpfs", Path::new("(detached)")))?;
    sys.mkdir_at(&scratch, Path::new(SCRATCH_DIR), 0o555)
        .and_then(|()| sys.create_at(&scratch, Path::new(SCRATCH_FILE), 0o444, b""))
        .map_err(err("fill scratch tmpfs", Path::new("(detached)")))?;
    for op in start {
        if matches!(op, MountOp::StandIn { .. } | MountOp::Redacted { .. }) {
            return Err(MountError {
                step: "stage a stand-in before the scratch tmpfs is sealed (internal error)",
                path: op.target().to_path_buf(),
                source: io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        apply_op(
            sys,
            op,
            &scratch,
            Path::new(SCRATCH_DIR),
            Path::new(SCRATCH_FILE),
        )?;
    }
    Ok(Staged {
        scratch,
        laid: start.to_vec(),
    })
}

/// What every sandbox root starts with, one-shot or template, from a
/// [`stage_root`]: the scratch tmpfs gets the contents of `ops`' redacted
/// copies, then becomes read-only with the stand-ins' mount flags.
/// Returns the scratch tmpfs.
fn finish_staging<S: Syscall>(
    sys: &S,
    staged: Staged<S::Handle>,
    ops: &[MountOp],
) -> Result<S::Handle, MountError> {
    let Staged { scratch, .. } = staged;
    for op in ops {
        if let MountOp::Redacted { target, contents } = op {
            sys.create_at(&scratch, &redacted_name(target), 0o444, contents.as_bytes())
                .map_err(err("fill scratch tmpfs", target))?;
        }
    }
    sys.make_superblock_readonly(&scratch)
        .map_err(err("make scratch tmpfs read-only", Path::new("(detached)")))?;
    // The stand-ins' mount flags, set once here: a clone of a mount
    // carries its flags, so each stand-in bound from this tmpfs has them
    // without a mount_setattr of its own.
    sys.set_tree_attrs(&scratch, STAND_IN_ATTRS, false)
        .map_err(err(
            "set the scratch tmpfs's mount attributes",
            Path::new("(detached)"),
        ))?;
    Ok(scratch)
}

/// Builds the whole view and leaves the process inside it, at `/`. With
/// `broker`, also binds the nested-run socket at [`crate::netns::BROKER_SOCKET`]
/// (before the root becomes read-only) and returns its listener.
/// `ops[..start_len]` are staged first ([`stage_root`]; the plan's
/// `staged_len`).
pub(crate) fn build_root<S: Syscall>(
    sys: &S,
    ops: &[MountOp],
    start_len: usize,
    broker: bool,
) -> Result<Option<S::Listener>, MountError> {
    let start = ops.get(..start_len).unwrap_or_default();
    build_staged_root(sys, stage_root(sys, start)?, ops, broker)
}

/// [`build_root`] on a root already staged by [`stage_root`] (the early
/// init's, laid before its plan came). Refuses `ops` that do not begin
/// with what was staged: the view would not be the plan's.
pub(crate) fn build_staged_root<S: Syscall>(
    sys: &S,
    staged: Staged<S::Handle>,
    ops: &[MountOp],
    broker: bool,
) -> Result<Option<S::Listener>, MountError> {
    if !ops.starts_with(&staged.laid) {
        return Err(MountError {
            // The early init's listing of `/` and `/proc` and the probe's
            // are taken a moment apart: a top-level entry made or removed
            // in between is the usual cause, and a second run succeeds.
            step: "check the plan against the view staged before it came (they differ: \
                   the host's / or /proc changed while moat started; nothing ran, run it again)",
            path: PathBuf::from("/"),
            source: io::Error::from_raw_os_error(libc::EINVAL),
        });
    }
    let rest = &ops[staged.laid.len()..];
    let scratch = finish_staging(sys, staged, ops)?;
    let (empty_dir, empty_file) = (Path::new(SCRATCH_DIR), Path::new(SCRATCH_FILE));

    for op in rest {
        apply_op(sys, op, &scratch, empty_dir, empty_file)?;
    }

    let listener = if broker {
        let p = Path::new(crate::netns::BROKER_SOCKET);
        if let Some(parent) = p.parent() {
            mkdir_p(sys, parent)?;
        }
        Some(sys.bind_unix(p).map_err(err("bind the broker socket", p))?)
    } else {
        None
    };
    let old = Path::new(OLD_ROOT);
    sys.umount_detach(old)
        .map_err(err("detach old root", old))?;
    sys.rmdir(old).map_err(err("rmdir", old))?;
    // Nothing may be created at the top level of the view.
    sys.set_path_attrs(
        Path::new("/"),
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
    )
    .map_err(err("make root read-only", Path::new("/")))?;
    Ok(listener)
}

fn host_path(p: &Path) -> PathBuf {
    Path::new(OLD_ROOT).join(p.strip_prefix("/").unwrap_or(p))
}

fn apply_op<S: Syscall>(
    sys: &S,
    op: &MountOp,
    scratch: &S::Handle,
    empty_dir: &Path,
    empty_file: &Path,
) -> Result<(), MountError> {
    match op {
        MountOp::Tmpfs { target, mode, size } => {
            ensure_mountpoint(sys, target, Kind::Dir)?;
            let opts = match size {
                Some(bytes) => format!("mode={mode:o},size={bytes}"),
                None => format!("mode={mode:o}"),
            };
            sys.mount(
                Some("tmpfs"),
                target,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(opts.as_str()),
            )
            .map_err(err("mount tmpfs", target))?;
        }
        MountOp::Bind {
            source,
            target,
            kind,
            recursive,
            readonly,
            device,
        } => {
            ensure_mountpoint(sys, target, *kind)?;
            // Resolved again here without following any symlink: the plan's
            // sources are canonical, so a symlink now means a component was
            // swapped since the probe (by a concurrent run, or a nested
            // request racing its own check) — refuse instead of binding
            // wherever it points.
            let handle = sys
                .open_path_nofollow(&host_path(source))
                .map_err(err("open bind source", source))?;
            let tree = sys
                .clone_tree_of(&handle, *recursive)
                .map_err(err("clone mount", source))?;
            let mut attrs = MOUNT_ATTR_NOSUID;
            if *device {
                attrs |= MOUNT_ATTR_NOEXEC;
            } else {
                attrs |= MOUNT_ATTR_NODEV;
            }
            if *readonly {
                attrs |= MOUNT_ATTR_RDONLY;
            }
            sys.set_tree_attrs(&tree, attrs, *recursive)
                .map_err(err("set mount attributes", source))?;
            sys.move_mount(&tree, target).map_err(err("bind", target))?;
        }
        MountOp::File { target, contents } => {
            if let Some(parent) = target.parent() {
                mkdir_p(sys, parent)?;
            }
            sys.create_file(target, 0o444, contents.as_bytes())
                .map_err(err("write", target))?;
        }
        MountOp::Symlink { target, points_to } => {
            if let Some(parent) = target.parent() {
                mkdir_p(sys, parent)?;
            }
            sys.symlink(points_to, target)
                .map_err(err("symlink", target))?;
        }
        MountOp::Proc { target } => {
            ensure_mountpoint(sys, target, Kind::Dir)?;
            sys.mount(
                Some("proc"),
                target,
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None,
            )
            .map_err(|e| {
                // The kernel refuses a new procfs when every procfs moat
                // could see has parts covered (a container's masked /proc).
                let step = if e.raw_os_error() == Some(libc::EPERM) {
                    PROC_REFUSED
                } else {
                    "mount proc"
                };
                err(step, target)(e)
            })?;
        }
        MountOp::Devpts { target } => {
            ensure_mountpoint(sys, target, Kind::Dir)?;
            sys.mount(
                Some("devpts"),
                target,
                Some("devpts"),
                MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
                Some("newinstance,ptmxmode=0666,mode=620"),
            )
            .map_err(err("mount devpts", target))?;
        }
        MountOp::ReadOnlyAgain { target } => {
            let tree = sys
                .clone_tree_at(None, target, true)
                .map_err(err("clone mount", target))?;
            sys.set_tree_attrs(
                &tree,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                true,
            )
            .map_err(err("set mount attributes", target))?;
            sys.move_mount(&tree, target)
                .map_err(err("remount read-only", target))?;
        }
        MountOp::StandIn { .. } | MountOp::Redacted { .. } => {
            // The target exists in the view (the plan only hides what it shows).
            let named;
            let (target, src) = match op {
                MountOp::StandIn { target, kind } if *kind == Kind::Dir => (target, empty_dir),
                MountOp::StandIn { target, .. } => (target, empty_file),
                MountOp::Redacted { target, .. } => {
                    named = redacted_name(target);
                    (target, named.as_path())
                }
                _ => return Ok(()),
            };
            // Read-only, nosuid, nodev, noexec: carried from the scratch
            // tmpfs's own mount (see `finish_staging`).
            let tree = sys
                .clone_tree_at(Some(scratch), src, false)
                .map_err(err("clone stand-in", target))?;
            sys.move_mount(&tree, target)
                .map_err(err("mount stand-in", target))?;
        }
    }
    Ok(())
}

/// Makes sure `target` exists as a mount point of the right kind, creating it
/// (and its parents) in moat's own tmpfs layers when the view lacks it.
fn ensure_mountpoint<S: Syscall>(sys: &S, target: &Path, kind: Kind) -> Result<(), MountError> {
    // Create first and treat "exists" as success: most targets already exist
    // in the host binds, and a failed create costs no more than a stat.
    let create = |t: &Path| match kind {
        Kind::Dir => sys.mkdir(t, 0o755),
        _ => sys.create_file(t, 0o644, b""),
    };
    match create(target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = target.parent() {
                mkdir_p(sys, parent)?;
            }
            create(target).map_err(err("create mount point", target))
        }
        Err(e) => Err(MountError {
            step: "create mount point",
            path: target.to_path_buf(),
            source: e,
        }),
    }
}

fn mkdir_p<S: Syscall>(sys: &S, dir: &Path) -> Result<(), MountError> {
    sys.mkdir_all(dir, 0o755).map_err(err("mkdir", dir))
}

/// Which of `ops` an execution forked from a sandbox template lays again in
/// its own mount namespace: every fresh filesystem (tmpfs, proc, devpts —
/// the places an execution can write to or that show its own processes),
/// every mount that narrows what lies beneath it ([`narrows`]: a stand-in, a
/// read-only remount, a read-only bind inside a writable one), everything
/// beneath one of these, and anything that covers one. Laying these in plan
/// order after the shared ops gives the same stacking as [`build_root`]: a
/// shared op never sits on or under a per-execution one.
pub(crate) fn per_execution(ops: &[MountOp]) -> Vec<bool> {
    let mut roots: Vec<&Path> = Vec::new();
    let mut out = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let target = op.target();
        let fresh = matches!(
            op,
            MountOp::Tmpfs { .. } | MountOp::Proc { .. } | MountOp::Devpts { .. }
        ) || narrows(ops, i);
        let overlaps = roots
            .iter()
            .any(|r| target.starts_with(r) || r.starts_with(target));
        if fresh {
            roots.push(target);
        }
        out.push(fresh || overlaps);
    }
    out
}

/// `ops[i]` narrows what a host bind shows beneath it: a stand-in on a
/// path of a bind, or a read-only bind or remount inside a writable bind.
/// Such a mount sits on a host dentry, and the host unlinking or renaming
/// over that dentry (an editor's atomic save, `git config`, `rm` and
/// re-create) detaches it in every mount namespace but the caller's, while
/// the plan stays the same: in a template's shared view (or a warm init
/// laid before its request) the new file would show through. So these are
/// laid per execution, after its request ([`deferred`]). A stand-in on
/// moat's own filesystems (a fresh /proc, a tmpfs) cannot be detached so.
fn narrows(ops: &[MountOp], i: usize) -> bool {
    let target = ops[i].target();
    // The mount the op sits in: the deepest earlier op at or above it (a
    // read-only remount is the same mount again: look beneath it).
    let below = ops[..i]
        .iter()
        .filter(|o| !matches!(o, MountOp::ReadOnlyAgain { .. }))
        .filter(|o| target.starts_with(o.target()))
        .max_by_key(|o| o.target().components().count());
    let Some(MountOp::Bind {
        readonly: below_ro, ..
    }) = below
    else {
        return false;
    };
    match &ops[i] {
        MountOp::StandIn { .. } | MountOp::Redacted { .. } => true,
        MountOp::ReadOnlyAgain { .. } | MountOp::Bind { readonly: true, .. } => !below_ro,
        _ => false,
    }
}

/// The targets of the mounts in `ops` that narrow a host path
/// ([`narrows`]), each once, in plan order: what a one-shot run's init
/// watches for the host replacing ([`crate::watch`]).
pub(crate) fn narrowing_targets(ops: &[MountOp]) -> Vec<&Path> {
    let mut out: Vec<&Path> = Vec::new();
    for i in 0..ops.len() {
        let t = ops[i].target();
        if narrows(ops, i) && !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// Which of the per-execution `ops` wait for the execution's request: the
/// narrowing ones ([`narrows`]) and every later one that overlaps one of
/// them (so plan order holds). The rest are laid ahead, in a warm init.
pub(crate) fn deferred(ops: &[MountOp], per_exec: &[bool]) -> Vec<bool> {
    let mut roots: Vec<&Path> = Vec::new();
    let mut out = Vec::with_capacity(ops.len());
    for (i, (op, own)) in ops.iter().zip(per_exec).enumerate() {
        let target = op.target();
        let late = *own
            && (narrows(ops, i)
                || roots
                    .iter()
                    .any(|r| target.starts_with(r) || r.starts_with(target)));
        if late {
            roots.push(target);
        }
        out.push(late);
    }
    out
}

/// The shared part of a sandbox template's view: the root tmpfs pivoted
/// into, with every op that [`per_execution`] does not mark laid out. The
/// host's root stays attached (an execution's fresh procfs needs a fully
/// visible one in its mount namespace, and its binds beneath fresh
/// filesystems come from there) and the root stays writable; each
/// execution finishes both with [`finish_execution_root`]. Returns the
/// detached scratch tmpfs the stand-ins come from.
pub(crate) fn build_template_root<S: Syscall>(
    sys: &S,
    ops: &[MountOp],
    per_exec: &[bool],
) -> Result<S::Handle, MountError> {
    let scratch = finish_staging(sys, stage_root(sys, &[])?, ops)?;
    for (op, own) in ops.iter().zip(per_exec) {
        if !own {
            apply_op(
                sys,
                op,
                &scratch,
                Path::new(SCRATCH_DIR),
                Path::new(SCRATCH_FILE),
            )?;
        } else if matches!(
            op,
            MountOp::Tmpfs { .. } | MountOp::Proc { .. } | MountOp::Devpts { .. }
        ) && op.target().parent() == Some(Path::new("/"))
        {
            // Mount points in the shared root exist before any execution,
            // so concurrent executions never race to create them.
            ensure_mountpoint(sys, op.target(), Kind::Dir)?;
        }
    }
    Ok(scratch)
}

/// Starts an execution's own copy of a template's view (in its own mount
/// and pid namespaces, ahead of its request): lays the per-execution ops
/// that do not wait for the request (see [`deferred`]), in plan order.
pub(crate) fn prepare_execution_root<S: Syscall>(
    sys: &S,
    ops: &[MountOp],
    per_exec: &[bool],
    late: &[bool],
    scratch: &S::Handle,
) -> Result<(), MountError> {
    for ((op, own), late) in ops.iter().zip(per_exec).zip(late) {
        if *own && !late {
            apply_op(
                sys,
                op,
                scratch,
                Path::new(SCRATCH_DIR),
                Path::new(SCRATCH_FILE),
            )?;
        }
    }
    Ok(())
}

/// Finishes an execution's own copy of a template's view once its request
/// came (the plan it was checked against is current): lays the deferred
/// ops, detaches the host's root and makes the root read-only, as
/// [`build_root`] ends. The old root's empty directory stays (the
/// template's mount sits on it).
pub(crate) fn finish_execution_root<S: Syscall>(
    sys: &S,
    ops: &[MountOp],
    late: &[bool],
    scratch: &S::Handle,
) -> Result<(), MountError> {
    for (op, late) in ops.iter().zip(late) {
        if *late {
            apply_op(
                sys,
                op,
                scratch,
                Path::new(SCRATCH_DIR),
                Path::new(SCRATCH_FILE),
            )?;
        }
    }
    let old = Path::new(OLD_ROOT);
    sys.umount_detach(old)
        .map_err(err("detach old root", old))?;
    sys.set_path_attrs(
        Path::new("/"),
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
    )
    .map_err(err("make root read-only", Path::new("/")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(path: &str, readonly: bool) -> MountOp {
        MountOp::Bind {
            source: path.into(),
            target: path.into(),
            kind: Kind::Dir,
            recursive: true,
            readonly,
            device: false,
        }
    }

    #[test]
    fn narrowing_mounts_on_host_binds_are_per_execution_and_wait_for_the_request() {
        let ops = vec![
            bind("/", true),
            bind("/ws", false),
            MountOp::StandIn {
                target: "/ws/.env".into(),
                kind: Kind::File,
            },
            bind("/ws/.git/config", true),
            MountOp::StandIn {
                target: "/etc/shadow".into(),
                kind: Kind::File,
            },
            bind("/opt/tool", true),
            MountOp::Tmpfs {
                target: "/tmp".into(),
                mode: 0o1777,
                size: None,
            },
            MountOp::Proc {
                target: "/proc".into(),
            },
            MountOp::ReadOnlyAgain {
                target: "/proc/sys".into(),
            },
        ];
        let per_exec = per_execution(&ops);
        let late = deferred(&ops, &per_exec);
        // The host binds are shared; what narrows them is laid per execution,
        // after its request; moat's own filesystems ahead of it.
        assert_eq!(
            per_exec,
            [false, false, true, true, true, false, true, true, true]
        );
        assert_eq!(
            late,
            [false, false, true, true, true, false, false, false, false]
        );
        // The same mounts are what a one-shot run's init watches.
        assert_eq!(
            narrowing_targets(&ops),
            [
                Path::new("/ws/.env"),
                Path::new("/ws/.git/config"),
                Path::new("/etc/shadow")
            ]
        );
    }
}
