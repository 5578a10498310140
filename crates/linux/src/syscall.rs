//! The seam between applying a plan and the kernel (youki's pattern): every
//! call [`crate::mounts`] makes to build the sandbox's identity and view goes
//! through the [`Syscall`] trait. [`Kernel`] makes the calls (through `sys`,
//! nix and std); the test-only `Recorder` logs each call with its arguments,
//! so the whole sequence a plan produces is compared with a golden file
//! (`src/seam_tests.rs`) without a namespace, root or a kernel.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};

use crate::sys;

fn nix_err(e: nix::errno::Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// What applying a plan asks of the kernel. Paths are as the calling
/// process sees them at that moment (before and after pivot_root).
pub(crate) trait Syscall {
    /// A descriptor the calls pass along: an O_PATH handle, a detached mount
    /// tree, a detached tmpfs (an fd for the kernel, a number for a fake).
    type Handle;
    /// A bound unix socket (the nested-run broker's).
    type Listener;

    /// mount(2).
    fn mount(
        &self,
        source: Option<&str>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> io::Result<()>;
    /// pivot_root(2).
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> io::Result<()>;
    /// chdir(2).
    fn chdir(&self, path: &Path) -> io::Result<()>;
    /// umount2(path, MNT_DETACH).
    fn umount_detach(&self, path: &Path) -> io::Result<()>;
    /// mkdir(2) of one directory (AlreadyExists / NotFound as the kernel says).
    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()>;
    /// mkdir -p.
    fn mkdir_all(&self, path: &Path, mode: u32) -> io::Result<()>;
    /// rmdir(2).
    fn rmdir(&self, path: &Path) -> io::Result<()>;
    /// Creates a new file (O_EXCL) with `mode` and writes `contents`.
    fn create_file(&self, path: &Path, mode: u32, contents: &[u8]) -> io::Result<()>;
    /// Writes `contents` to an existing file (the id maps in /proc/self).
    fn write_file(&self, path: &Path, contents: &[u8]) -> io::Result<()>;
    /// symlink(2): `path` pointing at `points_to`.
    fn symlink(&self, points_to: &Path, path: &Path) -> io::Result<()>;
    /// sethostname(2).
    fn sethostname(&self, name: &str) -> io::Result<()>;
    /// prctl(PR_SET_DUMPABLE, 0).
    fn set_not_dumpable(&self) -> io::Result<()>;
    /// A tmpfs mounted nowhere (fsopen/fsconfig/fsmount).
    fn detached_tmpfs(&self, mode: &CStr) -> io::Result<Self::Handle>;
    /// mkdirat(2) in `dir`.
    fn mkdir_at(&self, dir: &Self::Handle, name: &Path, mode: u32) -> io::Result<()>;
    /// A new file in `dir` (openat O_CREAT) holding `contents`.
    fn create_at(
        &self,
        dir: &Self::Handle,
        name: &Path,
        mode: u32,
        contents: &[u8],
    ) -> io::Result<()>;
    /// Makes the superblock behind a detached mount read-only.
    fn make_superblock_readonly(&self, mount: &Self::Handle) -> io::Result<()>;
    /// openat2(O_PATH, RESOLVE_NO_SYMLINKS) of an absolute path.
    fn open_path_nofollow(&self, path: &Path) -> io::Result<Self::Handle>;
    /// open_tree(OPEN_TREE_CLONE) of what `handle` refers to.
    fn clone_tree_of(&self, handle: &Self::Handle, recursive: bool) -> io::Result<Self::Handle>;
    /// open_tree(OPEN_TREE_CLONE) of `path`, relative to `dir` (None: cwd).
    fn clone_tree_at(
        &self,
        dir: Option<&Self::Handle>,
        path: &Path,
        recursive: bool,
    ) -> io::Result<Self::Handle>;
    /// mount_setattr(2) on a detached tree: sets `attrs` (MOUNT_ATTR_*).
    fn set_tree_attrs(&self, tree: &Self::Handle, attrs: u64, recursive: bool) -> io::Result<()>;
    /// mount_setattr(2) on an attached path.
    fn set_path_attrs(&self, path: &Path, attrs: u64) -> io::Result<()>;
    /// move_mount(2) of a detached tree onto `target`.
    fn move_mount(&self, tree: &Self::Handle, target: &Path) -> io::Result<()>;
    /// bind(2) of a listening unix socket at `path`.
    fn bind_unix(&self, path: &Path) -> io::Result<Self::Listener>;
}

/// The real calls.
pub(crate) struct Kernel;

impl Syscall for Kernel {
    type Handle = OwnedFd;
    type Listener = UnixListener;

    fn mount(
        &self,
        source: Option<&str>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> io::Result<()> {
        nix::mount::mount(source, target, fstype, flags, data).map_err(nix_err)
    }
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> io::Result<()> {
        nix::unistd::pivot_root(new_root, put_old).map_err(nix_err)
    }
    fn chdir(&self, path: &Path) -> io::Result<()> {
        nix::unistd::chdir(path).map_err(nix_err)
    }
    fn umount_detach(&self, path: &Path) -> io::Result<()> {
        nix::mount::umount2(path, MntFlags::MNT_DETACH).map_err(nix_err)
    }
    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(mode).create(path)
    }
    fn mkdir_all(&self, path: &Path, mode: u32) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path)
    }
    fn rmdir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }
    fn create_file(&self, path: &Path, mode: u32, contents: &[u8]) -> io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)?;
        if !contents.is_empty() {
            f.write_all(contents)?;
        }
        Ok(())
    }
    fn write_file(&self, path: &Path, contents: &[u8]) -> io::Result<()> {
        std::fs::write(path, contents)
    }
    fn symlink(&self, points_to: &Path, path: &Path) -> io::Result<()> {
        std::os::unix::fs::symlink(points_to, path)
    }
    fn sethostname(&self, name: &str) -> io::Result<()> {
        nix::unistd::sethostname(name).map_err(nix_err)
    }
    fn set_not_dumpable(&self) -> io::Result<()> {
        sys::set_not_dumpable()
    }
    fn detached_tmpfs(&self, mode: &CStr) -> io::Result<OwnedFd> {
        sys::detached_tmpfs(mode)
    }
    fn mkdir_at(&self, dir: &OwnedFd, name: &Path, mode: u32) -> io::Result<()> {
        nix::sys::stat::mkdirat(
            dir,
            name,
            nix::sys::stat::Mode::from_bits_truncate(mode as libc::mode_t),
        )
        .map_err(nix_err)
    }
    fn create_at(&self, dir: &OwnedFd, name: &Path, mode: u32, contents: &[u8]) -> io::Result<()> {
        use nix::fcntl::OFlag;
        use std::io::Write;
        let fd = nix::fcntl::openat(
            dir,
            name,
            OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::from_bits_truncate(mode as libc::mode_t),
        )
        .map_err(nix_err)?;
        if contents.is_empty() {
            return Ok(());
        }
        std::fs::File::from(fd).write_all(contents)
    }
    fn make_superblock_readonly(&self, mount: &OwnedFd) -> io::Result<()> {
        sys::make_superblock_readonly(mount)
    }
    fn open_path_nofollow(&self, path: &Path) -> io::Result<OwnedFd> {
        sys::open_path_nofollow(libc::AT_FDCWD, path)
    }
    fn clone_tree_of(&self, handle: &OwnedFd, recursive: bool) -> io::Result<OwnedFd> {
        sys::open_tree_clone_fd(handle, recursive)
    }
    fn clone_tree_at(
        &self,
        dir: Option<&OwnedFd>,
        path: &Path,
        recursive: bool,
    ) -> io::Result<OwnedFd> {
        sys::open_tree_clone(dir.map(|d| d.as_raw_fd()), path, recursive)
    }
    fn set_tree_attrs(&self, tree: &OwnedFd, attrs: u64, recursive: bool) -> io::Result<()> {
        sys::mount_setattr_fd(tree, attrs, recursive)
    }
    fn set_path_attrs(&self, path: &Path, attrs: u64) -> io::Result<()> {
        sys::mount_setattr_path(path, attrs)
    }
    fn move_mount(&self, tree: &OwnedFd, target: &Path) -> io::Result<()> {
        sys::move_mount_to(tree, target)
    }
    fn bind_unix(&self, path: &Path) -> io::Result<UnixListener> {
        UnixListener::bind(path)
    }
}

#[cfg(test)]
pub(crate) use recorder::Recorder;

#[cfg(test)]
mod recorder {
    use super::*;
    use std::cell::RefCell;
    use std::fmt::Write;

    /// A fake kernel: every call succeeds and is logged, one line each, with
    /// its arguments; handles are numbered `#1`, `#2`… in creation order.
    #[derive(Default)]
    pub(crate) struct Recorder {
        log: RefCell<String>,
        next: RefCell<u32>,
        /// The call (first word of its line) that fails with EPERM.
        fail_at: Option<&'static str>,
    }

    fn ms_names(flags: MsFlags) -> String {
        let names = [
            (MsFlags::MS_RDONLY, "RDONLY"),
            (MsFlags::MS_NOSUID, "NOSUID"),
            (MsFlags::MS_NODEV, "NODEV"),
            (MsFlags::MS_NOEXEC, "NOEXEC"),
            (MsFlags::MS_BIND, "BIND"),
            (MsFlags::MS_REC, "REC"),
            (MsFlags::MS_PRIVATE, "PRIVATE"),
            (MsFlags::MS_REMOUNT, "REMOUNT"),
        ];
        let mut left = flags;
        let mut out: Vec<String> = Vec::new();
        for (f, n) in names {
            if flags.contains(f) {
                out.push(n.into());
                left.remove(f);
            }
        }
        if !left.is_empty() {
            out.push(format!("{:#x}", left.bits()));
        }
        if out.is_empty() {
            "0".into()
        } else {
            out.join("|")
        }
    }

    fn attr_names(attrs: u64) -> String {
        let names = [
            (sys::MOUNT_ATTR_RDONLY, "RDONLY"),
            (sys::MOUNT_ATTR_NOSUID, "NOSUID"),
            (sys::MOUNT_ATTR_NODEV, "NODEV"),
            (sys::MOUNT_ATTR_NOEXEC, "NOEXEC"),
        ];
        let mut out: Vec<String> = names
            .iter()
            .filter(|(b, _)| attrs & b != 0)
            .map(|(_, n)| n.to_string())
            .collect();
        let known = names.iter().fold(0, |a, (b, _)| a | b);
        if attrs & !known != 0 {
            out.push(format!("{:#x}", attrs & !known));
        }
        if out.is_empty() {
            "0".into()
        } else {
            out.join("|")
        }
    }

    fn rec(recursive: bool) -> &'static str {
        if recursive {
            " recursive"
        } else {
            ""
        }
    }

    impl Recorder {
        /// The log so far, one call per line.
        pub(crate) fn log(&self) -> String {
            self.log.borrow().clone()
        }
        /// A recorder whose first call named `call` fails (EPERM).
        pub(crate) fn failing_at(call: &'static str) -> Recorder {
            Recorder {
                fail_at: Some(call),
                ..Recorder::default()
            }
        }
        /// Logs one call; fails it when it is the one to fail.
        fn line(&self, text: std::fmt::Arguments<'_>) -> io::Result<()> {
            let mut log = self.log.borrow_mut();
            let start = log.len();
            let _ = log.write_fmt(text);
            let name = log[start..].split(' ').next().unwrap_or_default();
            let fail = self.fail_at == Some(name);
            log.push('\n');
            if fail {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
            Ok(())
        }
        fn handle(&self) -> u32 {
            let mut n = self.next.borrow_mut();
            *n += 1;
            *n
        }
    }

    impl Syscall for Recorder {
        type Handle = u32;
        type Listener = ();

        fn mount(
            &self,
            source: Option<&str>,
            target: &Path,
            fstype: Option<&str>,
            flags: MsFlags,
            data: Option<&str>,
        ) -> io::Result<()> {
            self.line(format_args!(
                "mount {} {} type={} flags={} data={}",
                source.unwrap_or("-"),
                target.display(),
                fstype.unwrap_or("-"),
                ms_names(flags),
                data.unwrap_or("-")
            ))
        }
        fn pivot_root(&self, new_root: &Path, put_old: &Path) -> io::Result<()> {
            self.line(format_args!(
                "pivot_root {} {}",
                new_root.display(),
                put_old.display()
            ))
        }
        fn chdir(&self, path: &Path) -> io::Result<()> {
            self.line(format_args!("chdir {}", path.display()))
        }
        fn umount_detach(&self, path: &Path) -> io::Result<()> {
            self.line(format_args!("umount_detach {}", path.display()))
        }
        fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()> {
            self.line(format_args!("mkdir {} {mode:o}", path.display()))
        }
        fn mkdir_all(&self, path: &Path, mode: u32) -> io::Result<()> {
            self.line(format_args!("mkdir_all {} {mode:o}", path.display()))
        }
        fn rmdir(&self, path: &Path) -> io::Result<()> {
            self.line(format_args!("rmdir {}", path.display()))
        }
        fn create_file(&self, path: &Path, mode: u32, contents: &[u8]) -> io::Result<()> {
            self.line(format_args!(
                "create_file {} {mode:o} {:?}",
                path.display(),
                String::from_utf8_lossy(contents)
            ))
        }
        fn write_file(&self, path: &Path, contents: &[u8]) -> io::Result<()> {
            self.line(format_args!(
                "write_file {} {:?}",
                path.display(),
                String::from_utf8_lossy(contents)
            ))
        }
        fn symlink(&self, points_to: &Path, path: &Path) -> io::Result<()> {
            self.line(format_args!(
                "symlink {} -> {}",
                path.display(),
                points_to.display()
            ))
        }
        fn sethostname(&self, name: &str) -> io::Result<()> {
            self.line(format_args!("sethostname {name}"))
        }
        fn set_not_dumpable(&self) -> io::Result<()> {
            self.line(format_args!("set_not_dumpable"))
        }
        fn detached_tmpfs(&self, mode: &CStr) -> io::Result<u32> {
            let h = self.handle();
            self.line(format_args!(
                "detached_tmpfs mode={} -> #{h}",
                mode.to_string_lossy()
            ))?;
            Ok(h)
        }
        fn mkdir_at(&self, dir: &u32, name: &Path, mode: u32) -> io::Result<()> {
            self.line(format_args!("mkdir_at #{dir} {} {mode:o}", name.display()))
        }
        fn create_at(&self, dir: &u32, name: &Path, mode: u32, contents: &[u8]) -> io::Result<()> {
            if contents.is_empty() {
                self.line(format_args!("create_at #{dir} {} {mode:o}", name.display()))
            } else {
                self.line(format_args!(
                    "create_at #{dir} {} {mode:o} ({} bytes)",
                    name.display(),
                    contents.len()
                ))
            }
        }
        fn make_superblock_readonly(&self, mount: &u32) -> io::Result<()> {
            self.line(format_args!("make_superblock_readonly #{mount}"))
        }
        fn open_path_nofollow(&self, path: &Path) -> io::Result<u32> {
            let h = self.handle();
            self.line(format_args!(
                "open_path_nofollow {} -> #{h}",
                path.display()
            ))?;
            Ok(h)
        }
        fn clone_tree_of(&self, handle: &u32, recursive: bool) -> io::Result<u32> {
            let h = self.handle();
            self.line(format_args!(
                "clone_tree #{handle}{} -> #{h}",
                rec(recursive)
            ))?;
            Ok(h)
        }
        fn clone_tree_at(
            &self,
            dir: Option<&u32>,
            path: &Path,
            recursive: bool,
        ) -> io::Result<u32> {
            let h = self.handle();
            let at = dir.map(|d| format!("#{d}/")).unwrap_or_default();
            self.line(format_args!(
                "clone_tree {at}{}{} -> #{h}",
                path.display(),
                rec(recursive)
            ))?;
            Ok(h)
        }
        fn set_tree_attrs(&self, tree: &u32, attrs: u64, recursive: bool) -> io::Result<()> {
            self.line(format_args!(
                "set_attrs #{tree} {}{}",
                attr_names(attrs),
                rec(recursive)
            ))
        }
        fn set_path_attrs(&self, path: &Path, attrs: u64) -> io::Result<()> {
            self.line(format_args!(
                "set_attrs {} {}",
                path.display(),
                attr_names(attrs)
            ))
        }
        fn move_mount(&self, tree: &u32, target: &Path) -> io::Result<()> {
            self.line(format_args!("move_mount #{tree} {}", target.display()))
        }
        fn bind_unix(&self, path: &Path) -> io::Result<()> {
            self.line(format_args!("bind_unix {}", path.display()))
        }
    }
}
