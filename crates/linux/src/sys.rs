//! Every raw syscall moat makes that std, nix and the landlock/seccompiler
//! crates do not wrap. ALL `unsafe` operations of the Linux backend live
//! here, each block with the reason it is sound.
//!
//! The module is `pub(crate)`: other crates reach the few safe entry points
//! they need through [`crate::process`] and [`crate::fd`]. A function here
//! whose soundness depends on its caller (the process is single-threaded, a
//! raw fd is not owned elsewhere, pointers are valid) is an `unsafe fn`,
//! with the precondition under `# Safety`; its callers state in a
//! `// SAFETY:` comment why it holds.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

fn cstr(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Result of [`clone_process`]: which side of the fork we are on.
pub enum Forked {
    Parent(libc::pid_t),
    Child,
}

/// fork(2) with namespace flags: `clone(flags | SIGCHLD)` with no new stack,
/// so the child continues on a copy of our stack exactly like fork.
///
/// # Safety
/// The calling process must be single-threaded (moat's one-shot supervisor
/// is: the proxy's threads start only after the clone), so the child may
/// allocate and run ordinary Rust until it execs. In a multi-threaded
/// process the child may only make async-signal-safe calls: another
/// thread may have held the allocator's lock at the clone.
pub unsafe fn clone_process(ns_flags: libc::c_int) -> io::Result<Forked> {
    let flags = (ns_flags | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: raw clone without CLONE_VM and with a NULL stack behaves like
    // fork(2): the child gets a private copy of the address space. No pointer
    // arguments are passed (ptid/ctid/tls are 0).
    let ret = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    match check(ret)? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid as libc::pid_t)),
    }
}

/// This process's thread count (`Threads:` of /proc/self/status), for the
/// debug-build check that [`clone_process`]'s caller is single-threaded.
pub fn thread_count() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

pub const OPEN_TREE_CLONE: libc::c_uint = 1;
pub const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
pub const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// open_tree(OPEN_TREE_CLONE): a detached copy of the mount at `path`
/// (recursively with submounts when `recursive`), relative to `dirfd`.
pub fn open_tree_clone(dirfd: Option<RawFd>, path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let p = cstr(path)?;
    let mut flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    let dfd = dirfd.unwrap_or(libc::AT_FDCWD);
    // SAFETY: `p` is a valid NUL-terminated string that outlives the call;
    // the kernel returns a new fd that we take ownership of below.
    let fd = check(unsafe { libc::syscall(libc::SYS_open_tree, dfd, p.as_ptr(), flags) })?;
    // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// An O_PATH handle to `path` (relative to `dirfd`) that refuses to follow
/// any symlink on the way: bind sources are canonical paths, so a symlink
/// there means someone swapped a component after moat resolved it.
pub fn open_path_nofollow(dirfd: RawFd, path: &Path) -> io::Result<OwnedFd> {
    openat2(
        dirfd,
        path,
        OpenHow {
            flags: (libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64,
            mode: 0,
            resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        },
    )
}

/// The id of the mount whose root `path` (absolute; its last component not
/// followed) is, or None when `path` is not the root of a mount (a mount
/// laid there was detached since, or never there): the 64-bit id never
/// reused while the system runs where the kernel has it (Linux 6.8), else
/// the classic one (unique among the mounts alive at once). Used to see
/// that a mount is still in place.
pub fn mount_root_id(path: &Path) -> io::Result<Option<u64>> {
    mount_root_id_at(libc::AT_FDCWD, path)
}

/// [`mount_root_id`] of `name` relative to the directory `dirfd` (the
/// last component not followed).
pub fn mount_root_id_at(dirfd: RawFd, name: &Path) -> io::Result<Option<u64>> {
    let p = cstr(name)?;
    for mask in [libc::STATX_MNT_ID_UNIQUE, libc::STATX_MNT_ID] {
        // SAFETY: statx is plain data, so zeroed is a valid value.
        let mut buf: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: `p` is a NUL-terminated string and `buf` a valid
        // out-pointer, both outliving the call.
        let r =
            unsafe { libc::statx(dirfd, p.as_ptr(), libc::AT_SYMLINK_NOFOLLOW, mask, &mut buf) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
        if buf.stx_attributes_mask & root == 0 {
            // Before Linux 5.8: whether it is a mount root is unknown.
            return Err(io::Error::from_raw_os_error(libc::ENOSYS));
        }
        if buf.stx_mask & mask != 0 {
            return Ok((buf.stx_attributes & root != 0).then_some(buf.stx_mnt_id));
        }
    }
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// An O_PATH handle to the directory `path` that follows no symlink on the
/// way (`fchdir` takes it).
pub fn open_dir_nofollow(path: &Path) -> io::Result<OwnedFd> {
    openat2(
        libc::AT_FDCWD,
        path,
        OpenHow {
            flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64,
            mode: 0,
            resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        },
    )
}

/// An O_PATH handle to the directory `path` relative to `dirfd`, never
/// above it and through no symlink (mount points may be crossed): how the
/// init reaches a view path the command could have shaped.
pub fn open_dir_beneath(dirfd: RawFd, path: &Path) -> io::Result<OwnedFd> {
    openat2(
        dirfd,
        path,
        OpenHow {
            flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64,
            mode: 0,
            resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        },
    )
}

/// A new inotify instance, non-blocking and close-on-exec, that raises
/// SIGIO in this process when an event is queued (O_ASYNC, F_SETOWN).
pub fn inotify_async() -> io::Result<OwnedFd> {
    // SAFETY: plain syscalls on a fresh fd we own.
    unsafe {
        let fd = check(libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) as libc::c_long)?;
        let fd = OwnedFd::from_raw_fd(fd as RawFd);
        check(libc::fcntl(fd.as_raw_fd(), libc::F_SETOWN, libc::getpid()) as libc::c_long)?;
        let fl = check(libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) as libc::c_long)?;
        check(libc::fcntl(
            fd.as_raw_fd(),
            libc::F_SETFL,
            fl as libc::c_int | libc::O_ASYNC,
        ) as libc::c_long)?;
        Ok(fd)
    }
}

/// inotify_add_watch(2) of the directory `dir` (an fd: the watch is on that
/// inode, whatever its path is now) for `mask`; returns the watch
/// descriptor. Reaches the inode through `/proc/self/fd`.
pub fn inotify_watch_dir(fd: &OwnedFd, dir: &OwnedFd, mask: u32) -> io::Result<i32> {
    let p = cstr(Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())))?;
    // SAFETY: `p` is NUL-terminated and outlives the call.
    let wd =
        unsafe { libc::inotify_add_watch(fd.as_raw_fd(), p.as_ptr(), mask | libc::IN_ONLYDIR) };
    check(wd as libc::c_long).map(|w| w as i32)
}

/// One read(2) of the inotify `fd` into `buf`: the bytes read, 0 when
/// nothing is queued.
pub fn read_nonblocking(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(0),
            _ => return Err(e),
        }
    }
}

/// openat2(2): the one place moat calls it; the wrappers choose `how`.
fn openat2(dirfd: RawFd, path: &Path, how: OpenHow) -> io::Result<OwnedFd> {
    let p = cstr(path)?;
    // SAFETY: `p` and `how` are valid for the call and `how`'s size is
    // passed; the kernel returns a new fd that we own.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            p.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    })?;
    // SAFETY: fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// open_tree(OPEN_TREE_CLONE) of the object `fd` refers to.
pub fn open_tree_clone_fd(fd: &OwnedFd, recursive: bool) -> io::Result<OwnedFd> {
    let empty = c"";
    let mut flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: valid C string; the kernel returns a new fd that we own.
    let t = check(unsafe {
        libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), empty.as_ptr(), flags)
    })?;
    // SAFETY: fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(t as RawFd) })
}

/// mount_setattr on a (detached) mount fd: adds `attr_set`, recursively if asked.
pub fn mount_setattr_fd(fd: &OwnedFd, attr_set: u64, recursive: bool) -> io::Result<()> {
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let empty = c"";
    // SAFETY: `attr` is a properly laid out struct mount_attr that lives across
    // the call and its size is passed; `empty` is a valid C string.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            empty.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// mount_setattr on an attached path (used to make the new root read-only).
pub fn mount_setattr_path(path: &Path, attr_set: u64) -> io::Result<()> {
    let p = cstr(path)?;
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: as in `mount_setattr_fd`; `p` outlives the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            p.as_ptr(),
            0 as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// move_mount a detached mount fd onto `target` (not following a final symlink).
pub fn move_mount_to(fd: &OwnedFd, target: &Path) -> io::Result<()> {
    let t = cstr(target)?;
    let empty = c"";
    // SAFETY: both strings are valid and outlive the call; fd is a live mount fd.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;

/// A tmpfs that is mounted nowhere: a private scratch area whose files can be
/// cloned as bind sources without ever being visible in the sandbox.
pub fn detached_tmpfs(mode: &CStr) -> io::Result<OwnedFd> {
    let fstype = c"tmpfs";
    // SAFETY: valid C string; returns a new fd that we own.
    let fsfd = check(unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) })?;
    // SAFETY: fresh fd from the kernel, owned by nobody else.
    let fsfd = unsafe { OwnedFd::from_raw_fd(fsfd as RawFd) };
    let key = c"mode";
    // SAFETY: key/value are valid C strings living across the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fsfd.as_raw_fd(),
            FSCONFIG_SET_STRING,
            key.as_ptr(),
            mode.as_ptr(),
            0,
        )
    })?;
    // SAFETY: no pointer arguments are dereferenced for CMD_CREATE.
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fsfd.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            0usize,
            0usize,
            0,
        )
    })?;
    // SAFETY: fsmount takes only integers; the returned fd is new and ours.
    let mfd = check(unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fsfd.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            0 as libc::c_uint,
        )
    })?;
    // SAFETY: fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(mfd as RawFd) })
}

const FSPICK_CLOEXEC: libc::c_uint = 1;
const FSPICK_EMPTY_PATH: libc::c_uint = 8;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_CMD_RECONFIGURE: libc::c_uint = 7;

/// Makes the superblock behind a (detached) mount read-only. Unlike a
/// read-only mount, a read-only superblock answers a write open of an
/// existing file with EROFS before checking its mode bits.
pub fn make_superblock_readonly(mount_fd: &OwnedFd) -> io::Result<()> {
    let empty = c"";
    // SAFETY: valid C string; returns a new fs-context fd that we own.
    let fc = check(unsafe {
        libc::syscall(
            libc::SYS_fspick,
            mount_fd.as_raw_fd(),
            empty.as_ptr(),
            FSPICK_CLOEXEC | FSPICK_EMPTY_PATH,
        )
    })?;
    // SAFETY: fresh fd from the kernel.
    let fc = unsafe { OwnedFd::from_raw_fd(fc as RawFd) };
    let ro = c"ro";
    // SAFETY: key is a valid C string; SET_FLAG takes no value.
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fc.as_raw_fd(),
            FSCONFIG_SET_FLAG,
            ro.as_ptr(),
            0usize,
            0,
        )
    })?;
    // SAFETY: no pointer arguments are dereferenced for CMD_RECONFIGURE.
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fc.as_raw_fd(),
            FSCONFIG_CMD_RECONFIGURE,
            0usize,
            0usize,
            0,
        )
    })?;
    Ok(())
}

/// close_range(first, last, 0): closes every fd in the range.
///
/// # Safety
/// No live `OwnedFd`, `File` or other owner in this process may hold an fd
/// in the range (it would later close or use a number that is reused):
/// call it only in a forked child about to exec, where the owners are
/// never dropped.
pub unsafe fn close_range(first: u32, last: u32) -> io::Result<()> {
    if first > last {
        return Ok(());
    }
    // SAFETY: integer-only syscall; the fds' owners are the caller's contract.
    check(unsafe { libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) })?;
    Ok(())
}

/// close_range(first, ~0, CLOSE_RANGE_CLOEXEC): every fd from `first` on
/// closes at the next exec (none is closed now, so no owner is affected).
pub fn cloexec_from(first: u32) -> io::Result<()> {
    // SAFETY: integer-only syscall that only sets the close-on-exec flag.
    check(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    })?;
    Ok(())
}

/// pidfd_open(pid): a pollable handle that becomes readable when pid exits.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: integer-only syscall returning a new fd that we own.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) })?;
    // SAFETY: fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The Landlock ABI version the running kernel offers (0: none).
pub fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with the VERSION flag the kernel ignores the (NULL, 0) attr.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        0
    } else {
        ret as i32
    }
}

/// Drops every capability: effective/permitted/inheritable, ambient, and the
/// bounding set, so not even an exec of a uid-0 binary gains one back.
/// `last` is the highest capability the kernel knows ([`last_cap`], read
/// before: this runs where nothing may be allocated).
pub fn drop_all_capabilities(last: libc::c_ulong) -> io::Result<()> {
    // SAFETY: integer-only prctls.
    check(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } as libc::c_long)?;
    for cap in 0..=last {
        // SAFETY: integer-only prctl; EINVAL for caps unknown to the kernel is
        // impossible since we stop at cap_last_cap.
        match check(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } as libc::c_long) {
            Ok(_) => {}
            // Without CAP_SETPCAP (an unprivileged process outside a user
            // namespace: the Landlock backend) the bounding set cannot be
            // lowered. It only bounds what exec could grant, and the caller
            // sets no_new_privs next, so exec grants nothing.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => break,
            Err(e) => return Err(e),
        }
    }
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    }; // _LINUX_CAPABILITY_VERSION_3
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and two data structs as capset(2) v3 requires, alive across the call.
    check(unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) })?;
    Ok(())
}

/// The highest capability number of the running kernel.
pub fn last_cap() -> libc::c_ulong {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// prctl(PR_SET_NO_NEW_PRIVS, 1).
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: integer-only prctl.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } as libc::c_long)?;
    Ok(())
}

/// prctl(PR_SET_DUMPABLE, 0): /proc/PID of this process becomes unreadable
/// to the command, and it cannot be ptraced even by its own uid.
pub fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: integer-only prctl.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } as libc::c_long)?;
    Ok(())
}

/// Overwrites this process's original environment and argument blocks
/// (what /proc/self/environ and /proc/self/cmdline show) with zeros. The
/// supervisor's environment is copied into every forked child, and its
/// command line (`--env K=V`, an upstream proxy URL…) too: the sandboxed
/// command must read neither from /proc/1. One read of /proc/self/stat
/// serves both (each read costs tens of µs on the launch path).
///
/// # Safety
/// The process is single-threaded, and nothing reads the environment or
/// the arguments through libc or std (`getenv`, `std::env`) while the
/// blocks are overwritten.
pub unsafe fn wipe_environ_and_argv_blocks() -> io::Result<()> {
    // proc(5)'s stat fields 50/51: env_start, env_end; 48/49: arg_start, arg_end.
    // SAFETY: the caller's contract is this function's.
    unsafe { wipe_stat_blocks(&[(50, 51, "env_start/env_end"), (48, 49, "arg_start/arg_end")]) }
}

/// Overwrites this process's original argument block (what
/// /proc/self/cmdline shows) with zeros (a sandbox template's: each
/// execution's pid 1 is a fork of it).
///
/// # Safety
/// As [`wipe_environ_and_argv_blocks`], for the arguments.
pub unsafe fn wipe_argv_block() -> io::Result<()> {
    // SAFETY: the caller's contract is this function's.
    unsafe { wipe_stat_blocks(&[(48, 49, "arg_start/arg_end")]) }
}

/// Zeroes the memory between the addresses in /proc/self/stat fields
/// `start_field` and `end_field` (numbered from 1 as in proc(5)), for each
/// `(start_field, end_field, what)`, from one read of the file.
///
/// # Safety
/// As [`wipe_environ_and_argv_blocks`].
unsafe fn wipe_stat_blocks(blocks: &[(usize, usize, &str)]) -> io::Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after = stat.rfind(')').map(|i| &stat[i + 2..]).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields are numbered from 1 in proc(5); `after` starts at field 3.
    let field = |n: usize| fields.get(n - 3).and_then(|s| s.parse::<usize>().ok());
    for &(start_field, end_field, what) in blocks {
        let (Some(start), Some(end)) = (field(start_field), field(end_field)) else {
            return Err(io::Error::other(format!("no {what} in /proc/self/stat")));
        };
        if end > start && end - start < (1 << 24) {
            // SAFETY: [start, end) is this process's own initial argument or
            // environment block on the main stack (the kernel's arg_start..
            // arg_end / env_start..env_end), mapped writable. After this the
            // libc `environ` and saved argv strings read as empty; nothing in
            // the init reads them (the command's argv and environment are
            // prepared before the fork).
            unsafe { std::ptr::write_bytes(start as *mut u8, 0, end - start) };
        }
    }
    Ok(())
}

/// Whether the running kernel implements syscall `nr` (anything but
/// ENOSYS). Called with every argument all-ones — an invalid fd, pointer and
/// flag set — so a syscall that exists refuses the call (EBADF, EFAULT,
/// EINVAL…) rather than doing something. Only for syscalls above the
/// floor's review, in a test.
///
/// # Safety
/// `nr` must be a syscall that, with every argument -1, fails or does no
/// harm (true of syscalls whose first argument is an fd or a pointer; not
/// of e.g. `exit` or `munmap`): the call is really made.
#[cfg(test)]
pub unsafe fn kernel_knows_syscall(nr: i64) -> io::Result<bool> {
    let all = -1i64;
    // SAFETY: integer arguments only; every pointer argument is the invalid
    // address -1, which the kernel checks and refuses with EFAULT; which
    // syscall is called is the caller's contract.
    let ret = unsafe { libc::syscall(nr, all, all, all, all, all, all) };
    if ret >= 0 {
        return Ok(true);
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::ENOSYS) => Ok(false),
        _ => Ok(true),
    }
}

/// Block or unblock `signals` for the calling thread; returns the old mask.
pub fn set_sigmask(how: libc::c_int, signals: &[libc::c_int]) -> io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it and
    // pthread_sigmask writes the old mask into `old`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        let r = libc::pthread_sigmask(how, &set, &mut old);
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(old)
    }
}

/// Wait for one of the blocked `signals`; returns (signo, sender pid).
pub fn sigwait(signals: &[libc::c_int]) -> io::Result<(libc::c_int, libc::pid_t)> {
    // SAFETY: set is initialised before use; info is written by the kernel.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let r = libc::sigwaitinfo(&set, &mut info);
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((r, info.si_pid()))
    }
}

/// Restores every signal to its default action and unblocks all of them, so
/// the command starts as if launched from a clean shell (Rust ignores
/// SIGPIPE, and the supervisor blocks signals it reads through a signalfd).
pub fn reset_signals() {
    for sig in 1..libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL has no memory-safety implications.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    // SAFETY: an empty, initialised set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// execve that returns only on failure.
///
/// # Safety
/// `argv` and `envp` are NULL-terminated arrays of pointers to C strings
/// that stay alive for the call (prepared by the caller before the fork).
pub unsafe fn execve(
    path: &CStr,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> io::Error {
    // SAFETY: argv/envp are NULL-terminated arrays of pointers to valid C
    // strings owned by the caller for the duration of the call.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    io::Error::last_os_error()
}

/// _exit(2): leave a forked child without running atexit handlers or
/// flushing buffers shared with the parent.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no Rust state.
    unsafe { libc::_exit(code) }
}

/// Write all of `buf` to a raw fd (used from forked children). A
/// non-blocking description (a terminal another program, node for one, left
/// `O_NONBLOCK`: the flag is shared with every dup of it) is waited on until
/// it takes more, rather than losing the rest of the output.
pub fn write_all_fd(fd: RawFd, mut buf: &[u8]) {
    while !buf.is_empty() {
        // SAFETY: buf is a valid slice for its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => {
                    let mut p = libc::pollfd {
                        fd,
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: one pollfd on the stack.
                    if unsafe { libc::poll(&mut p, 1, -1) } < 0
                        && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)
                    {
                        return;
                    }
                    if p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                        return;
                    }
                    continue;
                }
                _ => return,
            }
        }
        buf = &buf[n as usize..];
    }
}

/// dup2 wrapper for forked children.
///
/// # Safety
/// `to` (closed and replaced) is not owned by a live `OwnedFd`/`File` that
/// would later use or close it: a stdio number in a child about to exec.
pub unsafe fn dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: integer-only syscall.
    if unsafe { libc::dup2(from, to) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Clear FD_CLOEXEC so `fd` survives exec (not used for the command).
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: integer-only syscall.
    if unsafe { libc::kill(pid, sig) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Every CLONE_NEW* flag, CLONE_NEWTIME included.
pub const NEW_NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP
    | 0x80) as u32;

/// A small hand-written seccomp program, the head of every session's
/// filter (`confine::seccomp_filter` puts it before the floor's decision
/// tree), for what seccompiler's rule model cannot say compactly: it
/// refuses foreign and x32 syscall ABIs (whose numbers the main filter would
/// not match), makes clone3 fail with ENOSYS so libc falls back to clone(2)
/// (whose flags a filter can inspect, unlike clone3's struct), and refuses
/// clone/unshare that ask for a new namespace (one JSET test instead of a
/// rule per flag). Every path it does not refuse falls off its end, which
/// is where the floor begins.
pub const SYSCALL_ABI_GUARD: [seccompiler::sock_filter; 13] = {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x15;
    const BPF_JGE_K: u16 = 0x35;
    const BPF_RET_K: u16 = 0x06;
    const BPF_JSET_K: u16 = 0x45;
    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    #[cfg(target_arch = "x86_64")]
    const ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    #[cfg(target_arch = "aarch64")]
    const ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;
    const X32_BIT: u32 = 0x4000_0000;
    const fn ins(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
        sock_filter { code, jt, jf, k }
    }
    [
        ins(BPF_LD_W_ABS, 0, 0, 4),             // arch
        ins(BPF_JEQ_K, 1, 0, ARCH),             // native arch?
        ins(BPF_RET_K, 0, 0, RET_KILL_PROCESS), // foreign ABI: kill
        ins(BPF_LD_W_ABS, 0, 0, 0),             // syscall nr
        ins(BPF_JGE_K, 0, 1, X32_BIT),          // x32 numbering?
        ins(BPF_RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32),
        ins(BPF_JEQ_K, 0, 1, libc::SYS_clone3 as u32),
        ins(BPF_RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32),
        // clone/unshare with any CLONE_NEW* flag (flags are the first
        // argument of both; the namespace bits all sit in the low word).
        ins(BPF_JEQ_K, 1, 0, libc::SYS_clone as u32),
        ins(BPF_JEQ_K, 0, 3, libc::SYS_unshare as u32),
        ins(BPF_LD_W_ABS, 0, 0, 16), // args[0], low 32 bits (little endian)
        ins(BPF_JSET_K, 0, 1, NEW_NAMESPACE_FLAGS),
        ins(BPF_RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32),
        // (falls through: the floor, or the allow below)
    ]
};

/// Sets no_new_privs and installs `prog` for the calling task (seccompiler's
/// `apply_filter`), with its failure as the errno behind it: nothing is
/// allocated, so the command's process may call it before exec.
pub fn install_seccomp_filter(prog: &[seccompiler::sock_filter]) -> io::Result<()> {
    seccompiler::apply_filter(prog).map_err(|e| match e {
        seccompiler::Error::Prctl(e) | seccompiler::Error::Seccomp(e) => e,
        _ => io::Error::from_raw_os_error(libc::EINVAL),
    })
}

/// glibc's fork(): unlike a raw clone it also fixes up libc's per-thread
/// state in the child. Returns 0 in the child and the pid in the parent.
///
/// # Safety
/// As [`clone_process`]: the caller is single-threaded, or the child makes
/// only async-signal-safe calls before it execs or `_exit`s.
pub unsafe fn fork_glibc() -> io::Result<libc::pid_t> {
    // SAFETY: fork itself has no memory-safety preconditions; what the
    // child may do afterwards is this function's caller's contract.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(pid)
}

/// The stack of a [`spawn_shared_vm`] child: anonymous memory with a
/// `PROT_NONE` guard page below it, so an overflow faults instead of
/// writing into whatever lies below.
pub struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

impl ChildStack {
    /// Maps `size` bytes of stack (rounded up to pages) plus the guard page.
    pub fn new(size: usize) -> io::Result<ChildStack> {
        let page = 4096usize;
        let len = size.div_ceil(page) * page + page;
        // SAFETY: an anonymous private mapping at an address the kernel
        // chooses; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = ChildStack { base, len };
        // SAFETY: the first page of the mapping just made, owned by `stack`.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used: the child that
        // ran on it has exec'd or exited before `spawn_shared_vm` returned.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// What the trampoline of [`spawn_shared_vm`] calls, on the parent's stack.
struct SharedVmCall<'a, T> {
    entry: fn(&T) -> !,
    arg: &'a T,
}

extern "C" fn shared_vm_trampoline<T>(call: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `call` is the `SharedVmCall<T>` in `spawn_shared_vm`'s frame,
    // which stays alive: the parent is suspended in clone(2) (CLONE_VFORK)
    // until this child has exec'd or exited. Read only.
    let call = unsafe { &*(call as *const SharedVmCall<'_, T>) };
    (call.entry)(call.arg)
}

/// Starts `entry(arg)` in a child that shares this process's memory
/// (`clone(CLONE_VM | CLONE_VFORK | SIGCHLD)` on `stack`, what glibc's
/// `posix_spawn` does): no page tables are copied, and this process is
/// suspended until the child has exec'd or exited. Returns the child's pid.
/// The child has its own fd table, signal handlers, credentials, rlimits,
/// seccomp filter and Landlock domain (none of `CLONE_FILES`,
/// `CLONE_SIGHAND`, `CLONE_THREAD`), so what it sets for itself there
/// stays its own.
///
/// # Safety
/// The caller is single-threaded (nothing else can hold a lock the child
/// might take, or change memory while the child reads it). `entry` must end
/// in `execve` or `_exit`, and until then touch only its own stack and
/// read `arg`: no allocation, no locks, no writes to memory the caller can
/// see (memory is shared: a heap or global changed by the child is changed
/// for the caller), and no unwinding. Only async-signal-safe calls.
pub unsafe fn spawn_shared_vm<T>(
    stack: &ChildStack,
    entry: fn(&T) -> !,
    arg: &T,
) -> io::Result<libc::pid_t> {
    let call = SharedVmCall { entry, arg };
    // The stack grows down: the child starts at the top of the mapping.
    // SAFETY: `base + len` is one past the end of the mapping `stack` owns.
    let top = unsafe { (stack.base as *mut u8).add(stack.len) } as *mut libc::c_void;
    // SAFETY: the trampoline and `call` are valid for the child's whole
    // life (this frame outlives it, see CLONE_VFORK); `top` is the top of a
    // writable mapping no one else uses; the child's contract is the
    // caller's (see # Safety).
    let pid = unsafe {
        libc::clone(
            shared_vm_trampoline::<T>,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &call as *const SharedVmCall<'_, T> as *mut libc::c_void,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(pid)
}

/// Restores a signal mask saved by [`set_sigmask`].
pub fn restore_sigmask(old: &libc::sigset_t) {
    // SAFETY: `old` is an initialised sigset_t returned by pthread_sigmask.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

/// Receives one message with up to `MAX_FDS` descriptors (SCM_RIGHTS,
/// close-on-exec) from a unix socket: the bytes read into `buf` (0 at end
/// of stream) and the descriptors, owned.
pub fn recv_with_fds<const MAX_FDS: usize>(
    sock: std::os::fd::BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    let mut fds = Vec::new();
    for c in msg
        .cmsgs()
        .map_err(|e| io::Error::from_raw_os_error(e as i32))?
    {
        if let ControlMessageOwned::ScmRights(r) = c {
            // SAFETY: recvmsg just installed each fd in our table for this
            // call alone; nothing else refers to it.
            fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    Ok((msg.bytes, fds))
}

/// Sets IFF_UP on `lo` in the current network namespace.
pub fn bring_loopback_up() -> io::Result<()> {
    // SAFETY: a plain socket() call; the fd is owned right after.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd from the kernel.
    let sock = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifreq is plain data; zeroed is a valid initial value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads into `req`, which lives across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union's flags member was just filled by the kernel.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads `req`, which lives across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Borrows one of the standard descriptors (0, 1, 2) if it is open.
pub fn borrow_stdio(fd: RawFd) -> Option<std::os::fd::BorrowedFd<'static>> {
    if !(0..=2).contains(&fd) {
        return None;
    }
    // SAFETY: F_GETFD only queries the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: fds 0-2 stay open for the life of the process (nothing in the
    // command's setup closes them), so a 'static borrow is sound.
    Some(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
}

/// `openat2` resolution flags for paths a command could have shaped.
pub const RESOLVE_BENEATH: u64 = 0x08;
pub const RESOLVE_NO_XDEV: u64 = 0x01;
/// What every path the command could have shaped is opened with.
const BENEATH_NO_LINKS: u64 =
    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;

/// openat2(2) of `name` relative to `dirfd`, confined: never above `dirfd`
/// (RESOLVE_BENEATH), through no symlink (RESOLVE_NO_SYMLINKS, which also
/// refuses a symlink as the last component) and on the same mount
/// (RESOLVE_NO_XDEV). `flags` are open(2) flags; O_CLOEXEC and O_NOFOLLOW
/// are always added.
pub fn openat_beneath(dirfd: RawFd, name: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    openat2(
        dirfd,
        name,
        OpenHow {
            flags: (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64,
            mode: 0,
            resolve: BENEATH_NO_LINKS,
        },
    )
}

/// Creates `name` in `dirfd` as a new regular file (O_EXCL: never through an
/// existing entry or symlink) with `mode`, write-only.
pub fn create_excl_at(dirfd: RawFd, name: &Path, mode: libc::mode_t) -> io::Result<OwnedFd> {
    openat2(
        dirfd,
        name,
        OpenHow {
            flags: (libc::O_WRONLY
                | libc::O_CREAT
                | libc::O_EXCL
                | libc::O_CLOEXEC
                | libc::O_NOFOLLOW) as u64,
            mode: mode as u64,
            resolve: BENEATH_NO_LINKS,
        },
    )
}

/// TIOCGWINSZ: the window size of the terminal at `fd`.
pub fn get_winsize(fd: RawFd) -> io::Result<libc::winsize> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct we own.
    if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ws)
}

/// TIOCSWINSZ: sets the window size of the terminal at `fd` (the kernel
/// sends SIGWINCH to its foreground process group).
pub fn set_winsize(fd: RawFd, ws: &libc::winsize) -> io::Result<()> {
    // SAFETY: TIOCSWINSZ reads one `winsize` from a struct we own.
    if unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, ws as *const libc::winsize) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// TIOCSCTTY: makes the terminal at `fd` this session's controlling terminal.
pub fn set_controlling_tty(fd: RawFd) -> io::Result<()> {
    // SAFETY: integer-only ioctl.
    if unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Takes ownership of fd `fd`, which the parent process left open for us and
/// named (a nested run's pipe from the broker). Fails if it is not open.
///
/// # Safety
/// Nothing else in this process owns or will take `fd` (see
/// [`crate::process::take_inherited_fd`], which guards that).
pub unsafe fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 3 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: fcntl(F_GETFD) only queries the descriptor table.
    check(unsafe { libc::fcntl(fd, libc::F_GETFD) } as libc::c_long)?;
    // SAFETY: the fd is open (checked above) and was handed to this process
    // by its parent for this single use; the caller reads the number once
    // at startup, so nothing else in the process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pidfd for the process at the other end of a connected unix socket
/// (`SO_PEERPIDFD`, Linux >= 6.5): unlike the pid of `SO_PEERCRED`, it
/// cannot come to name another process if the peer exits.
pub fn peer_pidfd(sock: std::os::fd::BorrowedFd<'_>) -> io::Result<OwnedFd> {
    /// `SO_PEERPIDFD` (asm-generic; x86_64 and aarch64).
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`, a c_int we
    // own, and updates `len`; the socket fd is borrowed for the call.
    check(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    } as libc::c_long)?;
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: the kernel just installed `fd` in our table for us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Starts `cmd` in the directory `dir` refers to (fchdir before exec), not
/// by path: a path checked earlier may lead elsewhere by the time a child
/// would chdir to it.
pub fn start_in(cmd: &mut std::process::Command, dir: OwnedFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls fchdir on an fd it owns, which is async-signal-safe; it neither
    // allocates nor takes locks.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fchdir(dir.as_raw_fd()) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Starts `cmd` in a new session: it has no controlling terminal, so
/// nothing it runs can open `/dev/tty` and wait there for an answer.
pub fn without_terminal(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setsid, which is async-signal-safe; it neither allocates nor
    // takes locks.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes the process `cmd` starts receive `sig` when the thread spawning it
/// exits (a service killed without a chance to clean up), and refuses to
/// start it when this process is already gone by then (the fork/prctl race).
pub fn die_with_parent(cmd: &mut std::process::Command, sig: libc::c_int) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls prctl and getppid, which are async-signal-safe; it neither
    // allocates nor takes locks.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Starts `cmd` with the soft open-file limit `soft` (at most its hard
/// limit, which stays): a service that raised its own soft limit for the
/// descriptors of many executions starts its helpers with the limit the
/// user started it with.
pub fn with_open_files_soft(cmd: &mut std::process::Command, soft: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls getrlimit and setrlimit on a stack value, which are
    // async-signal-safe; it neither allocates nor takes locks.
    unsafe {
        cmd.pre_exec(move || {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return Err(io::Error::last_os_error());
            }
            lim.rlim_cur = soft.min(lim.rlim_max);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// fork(2) with namespace flags and `CLONE_PIDFD`: the parent also gets a
/// pidfd for the child, made atomically with it (no window in which the
/// child could exit, be reaped and its pid be reused). For the sandbox
/// template, which forks every execution.
///
/// # Safety
/// As [`clone_process`]: the caller must be single-threaded (the template
/// process is), so the child may allocate and run ordinary Rust until it
/// execs.
pub unsafe fn clone_with_pidfd(ns_flags: libc::c_int) -> io::Result<(Forked, Option<OwnedFd>)> {
    let flags = (ns_flags | libc::CLONE_PIDFD | libc::SIGCHLD) as libc::c_ulong;
    let mut pidfd: libc::c_int = -1;
    // SAFETY: raw clone without CLONE_VM and with a NULL stack behaves like
    // fork(2). With CLONE_PIDFD the kernel writes the new pidfd to the
    // parent_tid argument (x86_64/aarch64 order: flags, stack, parent_tid,
    // child_tid, tls), which points at `pidfd`, a c_int we own.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            0usize,
            &mut pidfd as *mut libc::c_int,
            0usize,
            0usize,
        )
    };
    match check(ret)? {
        0 => Ok((Forked::Child, None)),
        pid => {
            // SAFETY: the kernel installed `pidfd` in our table for us alone.
            let fd = unsafe { OwnedFd::from_raw_fd(pidfd) };
            Ok((Forked::Parent(pid as libc::pid_t), Some(fd)))
        }
    }
}

/// pidfd_send_signal(pidfd, sig): signals exactly the process the pidfd
/// names, never a process that reused its pid.
pub fn pidfd_send_signal(pidfd: std::os::fd::BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: integer-only syscall on a borrowed, open pidfd; no siginfo.
    check(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_uint,
        )
    })?;
    Ok(())
}

/// Makes `fd` the child's descriptor `target` (>= 3) when `cmd` starts,
/// without close-on-exec: a control socket handed to a helper process.
pub fn pass_fd_as(cmd: &mut std::process::Command, fd: OwnedFd, target: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls dup2/fcntl on fds it owns, which are async-signal-safe; it
    // neither allocates nor takes locks.
    unsafe {
        cmd.pre_exec(move || {
            let raw = fd.as_raw_fd();
            if raw == target {
                // dup2 onto itself keeps close-on-exec: clear it instead.
                if libc::fcntl(raw, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(raw, target) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Restores the default action of `sig` (an execution's init takes SIGCHLD
/// back from its template, which ignores it).
pub fn default_signal(sig: libc::c_int) {
    // SAFETY: installing SIG_DFL has no memory-safety implications.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}

/// Ignores `sig` in this process (a sandbox template ignores SIGCHLD, so
/// the kernel reaps the executions it forks).
pub fn ignore_signal(sig: libc::c_int) {
    // SAFETY: installing SIG_IGN has no memory-safety implications.
    unsafe { libc::signal(sig, libc::SIG_IGN) };
}

/// unshare(flags): new namespaces for this process alone.
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: integer-only syscall.
    check(unsafe { libc::syscall(libc::SYS_unshare, flags as libc::c_ulong) }).map(|_| ())
}

/// The count of runnable tasks on the machine (the first half of the 4th
/// field of /proc/loadavg, "runnable/total"), the caller itself included.
pub fn runnable_tasks() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// The cpu this thread runs on now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: no arguments; returns -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// `getdents64(2)` on the directory `dir` into `buf`: how many bytes of
/// whole `linux_dirent64` records it wrote (0: the end of the listing).
pub fn getdents64(dir: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its whole length, which bounds the
    // kernel's writes; the fd is borrowed for the call.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            dir.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    usize::try_from(n)
        .ok()
        .filter(|n| *n <= buf.len())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))
}

#[cfg(test)]
mod shared_vm_tests {
    use super::*;

    fn leave_with(code: &i32) -> ! {
        exit_now(*code)
    }

    /// The child runs `entry` with the argument on its own stack and has
    /// released the shared memory when the call returns (CLONE_VFORK; its
    /// exit status may come a moment later). The child only calls `_exit`,
    /// which keeps the contract even in the test harness's threaded process.
    #[test]
    fn the_child_runs_entry_with_its_argument_and_is_done_on_return() {
        let stack = ChildStack::new(64 * 1024).expect("map a stack");
        let code = 7;
        // SAFETY: `leave_with` only reads its argument and calls _exit.
        let pid = unsafe { spawn_shared_vm(&stack, leave_with, &code) }.expect("spawn");
        let status =
            nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).expect("waitpid");
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 7)
        );
    }
}
