//! The safe descriptor helpers other crates use: opening a path without
//! following symlinks, a socket peer's pidfd, receiving descriptors. Thin
//! re-exports of [`crate::sys`], whose unsafe layer stays private.

pub use crate::sys::{open_path_nofollow, peer_pidfd, recv_with_fds};
