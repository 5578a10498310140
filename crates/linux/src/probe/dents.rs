//! A directory's names read with `getdents64(2)` on one fd: what the
//! probe needs from a listing (which names exist) without std's `ReadDir`
//! (an extra `fstat`, an allocation per entry and a shared handle).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Calls `each` with every name in directory `dir` (not `.` and `..`);
/// `false` when it cannot be opened or read to the end: a caller must then
/// not take a name's absence for its nonexistence.
pub(super) fn for_each_name(dir: &Path, mut each: impl FnMut(&[u8])) -> bool {
    names(dir, &mut each).is_some()
}

fn names(dir: &Path, each: &mut impl FnMut(&[u8])) -> Option<()> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: a valid C string; the fd returned is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // u64s: the kernel writes 8-byte aligned records.
    // Not zeroed (32 KiB per listing): only what the kernel wrote is read.
    const LEN: usize = 32 * 1024;
    let mut buf = std::mem::MaybeUninit::<[u64; LEN / 8]>::uninit();
    loop {
        // SAFETY: the buffer is writable for its whole length.
        let n =
            unsafe { libc::syscall(libc::SYS_getdents64, fd.as_raw_fd(), buf.as_mut_ptr(), LEN) };
        if n < 0 {
            return None;
        }
        if n == 0 {
            return Some(());
        }
        let n = usize::try_from(n).ok().filter(|n| *n <= LEN)?;
        // SAFETY: the kernel wrote the first `n` bytes (n <= LEN); u8 has
        // no alignment or validity requirements.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
        let mut at = 0;
        while at + 19 < bytes.len() {
            // struct linux_dirent64: ino u64, off i64, reclen u16, type u8, name.
            let reclen = usize::from(u16::from_ne_bytes([bytes[at + 16], bytes[at + 17]]));
            if reclen == 0 || at + reclen > bytes.len() {
                return None;
            }
            let name = CStr::from_bytes_until_nul(&bytes[at + 19..at + reclen]).ok()?;
            let name = name.to_bytes();
            if name != b"." && name != b".." {
                each(name);
            }
            at += reclen;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    fn listed(dir: &str) -> Option<HashSet<OsString>> {
        let mut out = HashSet::new();
        for_each_name(Path::new(dir), |n| {
            out.insert(OsString::from_vec(n.to_vec()));
        })
        .then_some(out)
    }

    #[test]
    fn names_are_std_read_dirs() {
        // `/usr/bin` is longer than one buffer on most systems.
        for dir in ["/", "/etc", "/usr/bin"] {
            let std: HashSet<OsString> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(listed(dir).unwrap(), std, "{dir}");
        }
        assert!(listed("/nonexistent-moat-dents").is_none());
        assert!(listed("/etc/passwd").is_none());
    }
}
