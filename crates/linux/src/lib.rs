//! moat's Linux backend: probe the host, build a plan (pure), and apply it:
//! namespaces, a pivot_root'ed view, Landlock and seccomp, under a
//! supervisor that stays in the host namespaces.
//!
//! # Security notes
//! - All `unsafe` operations are in `sys` (crate-private); every block says
//!   why it is sound. Other crates use the safe [`process`] and [`fd`].
//! - A layer the plan needs that cannot be set up is an error before exec:
//!   the command never runs with less than the policy promised.
//!
//! # Limitations
//! See the README's Limitations section; in short: host unix sockets outside
//! /run, /tmp, $XDG_RUNTIME_DIR and the agent sockets stay connectable at
//! the whole-host levels, and UDP/TCP under `unmanaged` are the host's.

pub mod backend;
pub mod capabilities;
pub mod confine;
pub mod control;
pub mod explain;
pub mod fd;
pub mod gitconfigs;
mod init;
pub mod init_msg;
pub mod limits;
pub mod mounts;
pub mod netns;
pub mod plan;
pub mod probe;
pub mod process;
pub mod pty;
pub mod run;
#[cfg(test)]
mod seam_tests;
pub mod sweep;
pub(crate) mod sys;
mod syscall;
pub mod template;
pub mod termfilter;
pub mod timing;
pub mod tree;
pub mod view;
mod watch;

pub use confine::Enforcement;
pub use plan::{build as build_plan, Plan, PlanError};
pub use probe::HostFacts;
pub use run::{
    run, run_early, run_with, EarlyInit, Layers, NoObserver, OutputMode, RunObserver, RunOptions,
    RunOutcome, RunStatus, Stream,
};
