//! The backend seam: probe / plan / launch / explain. moat's Linux backend
//! lives in moat-linux; Seatbelt implements the seam here so the same
//! policy and view drive it. Launching is cfg-gated to macOS; everything
//! else compiles (and is tested) on every platform.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use moat_linux::view::View;
use moat_policy::Policy;
use serde_json::{json, Value};

/// Why a backend cannot launch.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("the Seatbelt backend runs only on macOS ({0} not found); use moat exec on Linux")]
    Unsupported(&'static str),
    #[error("cannot start {0}: {1}")]
    Spawn(&'static str, std::io::Error),
}

/// One enforcement backend.
pub trait Backend {
    /// What the backend builds from a policy and its view.
    type Plan;
    /// What this host can enforce with this backend (for `capabilities`).
    fn probe(&self) -> Value;
    /// The backend's plan. Pure.
    fn plan(&self, policy: &Policy, view: &View) -> Self::Plan;
    /// Runs `command` under `plan`; returns its exit code.
    fn launch(&self, plan: &Self::Plan, command: &[OsString]) -> Result<i32, LaunchError>;
    /// The plan as a human-readable artifact (the profile, a config).
    fn explain(&self, plan: &Self::Plan) -> String;
}

/// macOS Seatbelt via `/usr/bin/sandbox-exec`.
pub struct Seatbelt {
    /// Private directories for the sandbox HOME and TMPDIR.
    pub home: PathBuf,
    pub tmp: PathBuf,
}

/// A Seatbelt plan: the SBPL profile and the run's directories.
pub struct SeatbeltPlan {
    pub profile: String,
    pub workspace: PathBuf,
}

impl Seatbelt {
    /// The `sandbox-exec` argument list (without the program name).
    pub fn argv(&self, plan: &SeatbeltPlan, command: &[OsString]) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "-D".into(),
            format!("{}={}", crate::seatbelt::PARAM_HOME, self.home.display()).into(),
            "-D".into(),
            format!("{}={}", crate::seatbelt::PARAM_TMP, self.tmp.display()).into(),
            "-p".into(),
            plan.profile.clone().into(),
            "--".into(),
        ];
        a.extend(command.iter().cloned());
        a
    }
}

impl Backend for Seatbelt {
    type Plan = SeatbeltPlan;

    fn probe(&self) -> Value {
        let present = Path::new(crate::seatbelt::SANDBOX_EXEC).exists();
        json!({
            "backend": "seatbelt",
            "available": cfg!(target_os = "macos") && present,
            "launcher": crate::seatbelt::SANDBOX_EXEC,
            "differences": crate::seatbelt::differences(),
        })
    }

    fn plan(&self, policy: &Policy, view: &View) -> SeatbeltPlan {
        SeatbeltPlan {
            profile: crate::seatbelt::profile(policy, view),
            workspace: view.workspace.clone(),
        }
    }

    #[cfg(target_os = "macos")]
    fn launch(&self, plan: &SeatbeltPlan, command: &[OsString]) -> Result<i32, LaunchError> {
        let exe = crate::seatbelt::SANDBOX_EXEC;
        for d in [&self.home, &self.tmp] {
            std::fs::create_dir_all(d).map_err(|e| LaunchError::Spawn(exe, e))?;
        }
        let status = std::process::Command::new(exe)
            .args(self.argv(plan, command))
            .current_dir(&plan.workspace)
            .env("HOME", &self.home)
            .env("TMPDIR", &self.tmp)
            .status()
            .map_err(|e| LaunchError::Spawn(exe, e))?;
        Ok(status.code().unwrap_or(125))
    }

    #[cfg(not(target_os = "macos"))]
    fn launch(&self, _plan: &SeatbeltPlan, _command: &[OsString]) -> Result<i32, LaunchError> {
        Err(LaunchError::Unsupported(crate::seatbelt::SANDBOX_EXEC))
    }

    fn explain(&self, plan: &SeatbeltPlan) -> String {
        plan.profile.clone()
    }
}
