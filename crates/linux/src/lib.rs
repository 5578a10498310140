//! moat's Linux backend: probe the host, build a plan (pure), and apply it:
//! namespaces, a pivot_root'ed view, Landlock and seccomp, under a
//! supervisor that stays in the host namespaces.
//!
//! # Security notes
//! - All `unsafe` is in [`sys`]; every block says why it is sound.
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
pub mod explain;
mod init;
pub mod limits;
pub mod mounts;
pub mod netns;
pub mod plan;
pub mod probe;
pub mod pty;
pub mod run;
pub mod sweep;
pub mod sys;
pub mod template;
pub mod termfilter;
pub mod tree;
pub mod view;

pub use confine::Enforcement;
pub use plan::{build as build_plan, Plan, PlanError};
pub use probe::HostFacts;
pub use run::{
    run, Layers, NoObserver, OutputMode, RunObserver, RunOptions, RunOutcome, RunStatus, Stream,
};
