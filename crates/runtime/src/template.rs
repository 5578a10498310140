//! The service's fast launcher: each execution is forked from a pre-built
//! sandbox template of its plan (`moat_linux::template`) and supervised in
//! this process by pidfd. The outcome has the one-shot supervisor's
//! contract, so prepare → run → denials → record are the one-shot path's.
//! A policy the template cannot give every guarantee of
//! ([`policy_eligible`]) takes the subprocess path instead.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use moat_linux::control::{Control, ControlReceiver};
use moat_linux::template::{TemplateError, Templates};
use moat_linux::{Plan, RunObserver, RunOptions, RunOutcome};
use moat_policy::{Backend, NetworkMode, Policy};

use crate::Launcher;

/// Whether executions under `policy` may be forked from a template. The
/// plan is checked again at launch (`moat_linux::template::ineligible`);
/// this is what can be known before the run is on record.
pub fn policy_eligible(policy: &Policy) -> Result<(), &'static str> {
    if !policy.level.is_sandboxed() {
        return Err("an unsandboxed level");
    }
    if policy.backend == Backend::Landlock {
        return Err("the Landlock backend");
    }
    if policy.network.mode == NetworkMode::Proxy {
        return Err("proxy network mode");
    }
    if !policy.limits.is_unset() {
        return Err("resource limits");
    }
    if policy.private_home.is_some() {
        return Err("a private HOME synced per run");
    }
    if let Some(why) = moat_linux::template::kernel_ineligible() {
        return Err(why);
    }
    Ok(())
}

/// Launches one execution from the service's templates.
pub struct TemplateLauncher {
    templates: Arc<Templates>,
    stdin: Option<OwnedFd>,
    /// The (device, inode) of the working directory the caller checked.
    cwd: Option<(u64, u64)>,
    control: ControlReceiver,
}

impl TemplateLauncher {
    /// `stdin`: the command's input (empty: /dev/null); `cwd`: the
    /// (device, inode) of the working directory the caller checked against
    /// its roots (the command starts only in that directory); `control`:
    /// the run's end of its stop (cancel) channel.
    pub fn new(
        templates: Arc<Templates>,
        stdin: Vec<u8>,
        cwd: Option<(u64, u64)>,
        control: ControlReceiver,
    ) -> std::io::Result<TemplateLauncher> {
        let stdin = if stdin.is_empty() {
            None
        } else {
            let (r, w) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
            std::thread::spawn(move || {
                let _ = std::fs::File::from(w).write_all(&stdin);
            });
            Some(r)
        };
        Ok(TemplateLauncher {
            templates,
            stdin,
            cwd,
            control,
        })
    }
}

impl Launcher for TemplateLauncher {
    fn launch(
        &mut self,
        plan: &Plan,
        opts: &RunOptions,
        observer: &mut dyn RunObserver,
    ) -> RunOutcome {
        // A template found gone before it took the execution is replaced
        // once; anything else is this execution's failure.
        // A plan without a key is served by no template.
        let (mut run, plan_key, tries) = match moat_linux::template::key(plan) {
            Ok(k) => (Err(String::new()), k, 2),
            Err(e) => (Err(e), String::new(), 0),
        };
        for _ in 0..tries {
            let t = match self.templates.get_keyed(plan, &plan_key) {
                Ok(t) => t,
                Err(e) => {
                    run = Err(e);
                    break;
                }
            };
            match t.run_keyed(
                plan,
                &plan_key,
                opts,
                observer,
                &mut self.stdin,
                self.cwd,
                Control::Channel(&self.control),
            ) {
                Ok(out) => {
                    run = Ok(out);
                    break;
                }
                Err(e) => {
                    self.templates.discard(&t);
                    let again = matches!(e, TemplateError::Gone(_));
                    run = Err(e.to_string());
                    if !again {
                        break;
                    }
                }
            }
        }
        match run {
            Ok(out) => out,
            Err(e) => {
                let mut out =
                    RunOutcome::refused(format!("the sandbox template could not run it: {e}"));
                out.backend = "namespaces";
                out.launch = "template";
                out
            }
        }
    }
}
