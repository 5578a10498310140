//! A directory's names read with `getdents64(2)` on one fd: what the
//! probe needs from a listing (which names exist) without std's `ReadDir`
//! (an extra `fstat`, an allocation per entry and a shared handle).

use std::ffi::CStr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::sys;

/// Calls `each` with every name in directory `dir` (not `.` and `..`);
/// `false` when it cannot be opened or read to the end: a caller must then
/// not take a name's absence for its nonexistence.
pub(super) fn for_each_name(dir: &Path, mut each: impl FnMut(&[u8])) -> bool {
    names(dir, &mut each).is_some()
}

fn names(dir: &Path, each: &mut impl FnMut(&[u8])) -> Option<()> {
    let fd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NONBLOCK)
        .open(dir)
        .ok()?;
    let mut buf = [0u8; 32 * 1024];
    loop {
        let n = sys::getdents64(&fd, &mut buf).ok()?;
        if n == 0 {
            return Some(());
        }
        let bytes = &buf[..n];
        let mut at = 0;
        while at + 19 < bytes.len() {
            // struct linux_dirent64: ino u64, off i64, reclen u16, type u8, name.
            // The smallest record is its 19-byte header and a NUL name end.
            let reclen = usize::from(u16::from_ne_bytes([bytes[at + 16], bytes[at + 17]]));
            if reclen < 20 || at + reclen > bytes.len() {
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
