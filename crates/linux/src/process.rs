//! The safe process-starting helpers other crates use (the service, the
//! hook, the nested-run launcher): thin re-exports of [`crate::sys`], whose
//! unsafe layer stays private to this crate.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

pub use crate::sys::{die_with_parent, start_in, without_terminal, NEW_NAMESPACE_FLAGS};

/// Takes ownership of the fd a parent process left open for this one and
/// named (a nested run's handoff pipe). Once per process: a second call
/// fails (EBUSY), so no two owners of the number can exist through here.
pub fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    static TAKEN: AtomicBool = AtomicBool::new(false);
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    // SAFETY: the fd was inherited (open before this process's own code
    // ran), moat opens nothing by number, and the guard above lets this
    // run once: nothing else in the process owns `fd`.
    unsafe { crate::sys::take_inherited_fd(fd) }
}
