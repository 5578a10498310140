//! `moat export oci|k8s|seatbelt`: the same policy (and its view and
//! Linux plan) as an OCI bundle, Kubernetes manifests or a Seatbelt
//! profile, each carrying the `explain-policy` hash; and `proxy-serve`,
//! the filtering proxy the Kubernetes export runs as its own pod.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context, Result};
use clap::Subcommand;
use moat_export::backend::{Backend, Seatbelt};
use moat_linux::HostFacts;
use moat_policy::Policy;

use moat_config::PolicyFlags;

use crate::{resolve_policy, EXIT_MOAT_FAILED};

#[derive(Subcommand)]
pub(crate) enum ExportCommand {
    /// Write an OCI runtime-spec bundle (config.json + a rootfs of bind mounts) equivalent to `moat exec`
    Oci {
        #[command(flatten)]
        policy: PolicyFlags,
        /// Where to write the bundle, outside the writable paths (default: /var/tmp/moat-bundle-HASH-PID)
        #[arg(long, value_name = "DIR")]
        bundle: Option<PathBuf>,
        /// The program and its arguments (after --)
        #[arg(last = true, required = true, value_name = "PROGRAM")]
        command: Vec<OsString>,
    },
    /// Print Kubernetes manifests (multi-document YAML; each document is JSON, which is YAML 1.2)
    K8s {
        #[command(flatten)]
        policy: PolicyFlags,
        /// RuntimeClass of the pod (e.g. gvisor)
        #[arg(long, value_name = "NAME")]
        runtime_class: Option<String>,
        /// Container image that has the program (and moat, for the proxy pod)
        #[arg(long, value_name = "IMAGE", default_value = moat_export::k8s::DEFAULT_IMAGE)]
        image: String,
        /// Image of the proxy pod (--network proxy); it must have moat on its PATH (default: --image)
        #[arg(long, value_name = "IMAGE")]
        proxy_image: Option<String>,
        /// pod, or sandbox-template (kubernetes-sigs/agent-sandbox)
        #[arg(long, value_name = "KIND", default_value = "pod")]
        kind: String,
        /// The program and its arguments (after --)
        #[arg(last = true, required = true, value_name = "PROGRAM")]
        command: Vec<OsString>,
    },
    /// Print the macOS Seatbelt (SBPL) profile for the policy
    Seatbelt {
        #[command(flatten)]
        policy: PolicyFlags,
    },
    /// Serve moat's filtering proxy (the Kubernetes export's proxy pod); decisions as NDJSON on stdout
    ProxyServe {
        #[command(flatten)]
        policy: PolicyFlags,
        /// HTTP(S) proxy listen address
        #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:3128")]
        http: String,
        /// SOCKS5 listen address
        #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:1080")]
        socks: String,
    },
}

/// Runs one export subcommand; moat's refusals exit 125.
pub(crate) fn run(cmd: ExportCommand) -> ExitCode {
    match run_inner(cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat: {e:#}");
            ExitCode::from(EXIT_MOAT_FAILED)
        }
    }
}

fn host_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect()
}

/// The Linux plan the exports translate. The targets bring their own
/// confinement (none of them is Landlock), so the plan is built as if this
/// kernel had Landlock: its Landlock part is not exported.
fn linux_plan(policy: &Policy) -> Result<moat_linux::Plan> {
    if policy.backend != moat_policy::Backend::Namespaces {
        // The targets are containers and Seatbelt, translated from the
        // namespaces plan; the Landlock backend has no mounts to export.
        return Err(anyhow!(
            "--backend {} does not apply to exports; drop it",
            policy.backend.as_str()
        ));
    }
    let mut facts = HostFacts::probe(policy, host_env());
    facts.landlock_abi = facts.landlock_abi.max(moat_export::ASSUMED_LANDLOCK_ABI);
    moat_linux::build_plan(policy, &facts).map_err(|e| anyhow!("{e}"))
}

fn args_strings(command: &[OsString]) -> Vec<String> {
    command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

fn run_inner(cmd: ExportCommand) -> Result<()> {
    match cmd {
        ExportCommand::Oci {
            policy,
            bundle,
            command,
        } => {
            let (policy, _) = resolve_policy(&policy)?;
            let plan = linux_plan(&policy)?;
            let rlimits = [nofile_limit()];
            let command = args_strings(&command);
            let b = moat_export::oci::bundle(&moat_export::oci::OciInput {
                policy: &policy,
                plan: &plan,
                command: &command,
                rlimits: &rlimits,
            })?;
            let dir = match bundle {
                Some(d) => moat_export::oci::resolve_dir(&d)
                    .with_context(|| format!("cannot resolve --bundle {}", d.display()))?,
                None => {
                    // Only the parent is resolved: the name itself, in a
                    // shared /var/tmp, must be made new here, never followed.
                    let d = default_bundle_dir(&policy);
                    let parent = d.parent().unwrap_or(Path::new("/"));
                    let parent = moat_export::oci::resolve_dir(parent)
                        .with_context(|| format!("cannot resolve {}", parent.display()))?;
                    parent.join(d.file_name().unwrap_or_default())
                }
            };
            moat_export::oci::check_bundle_dir(&plan, &dir)?;
            moat_export::oci::write_bundle(&dir, &b)?;
            outln!("{}", dir.display());
            Ok(())
        }
        ExportCommand::K8s {
            policy,
            runtime_class,
            image,
            proxy_image,
            kind,
            command,
        } => {
            let kind = moat_export::k8s::Kind::parse(&kind)
                .ok_or_else(|| anyhow!("unknown --kind {kind:?}; use pod or sandbox-template"))?;
            let (policy, _) = resolve_policy(&policy)?;
            let plan = linux_plan(&policy)?;
            let command = args_strings(&command);
            let docs = moat_export::k8s::manifests(&moat_export::k8s::K8sInput {
                policy: &policy,
                plan: &plan,
                command: &command,
                image: &image,
                proxy_image: proxy_image.as_deref().unwrap_or(&image),
                runtime_class: runtime_class.as_deref(),
                kind,
            })?;
            out!("{}", moat_export::k8s::to_yaml(&docs));
            Ok(())
        }
        ExportCommand::Seatbelt { policy } => {
            let (policy, _) = resolve_policy(&policy)?;
            if !policy.level.is_sandboxed() {
                return Err(moat_export::ExportError::Unsandboxed.into());
            }
            let facts = HostFacts::probe(&policy, host_env());
            let view = moat_linux::view::compute(&policy, &facts);
            let backend = Seatbelt {
                home: PathBuf::new(),
                tmp: PathBuf::new(),
            };
            out!("{}", backend.explain(&backend.plan(&policy, &view)));
            Ok(())
        }
        ExportCommand::ProxyServe {
            policy,
            http,
            socks,
        } => proxy_serve(&policy, &http, &socks),
    }
}

/// What the other targets can enforce here and how they differ (for
/// `moat capabilities`): Seatbelt's probe, and the exports' own notes.
pub(crate) fn backends() -> serde_json::Value {
    let seatbelt = Seatbelt {
        home: PathBuf::new(),
        tmp: PathBuf::new(),
    };
    serde_json::json!({
        "seatbelt": seatbelt.probe(),
        "oci": {"landlock": moat_export::LANDLOCK_NOTE, "network_proxy": "not exported (exit 125); use moat export k8s"},
    })
}

/// Where a bundle goes without --bundle: /var/tmp, which no sandboxed view
/// shows writable (the workspace would be, at the writable levels).
fn default_bundle_dir(policy: &Policy) -> PathBuf {
    let hash = policy.hash();
    let short: String = hash
        .trim_start_matches("sha256:")
        .chars()
        .take(12)
        .collect();
    PathBuf::from(format!(
        "/var/tmp/moat-bundle-{short}-{}",
        std::process::id()
    ))
}

/// The caller's open-file limit, which `moat exec` passes on unchanged.
fn nofile_limit() -> moat_export::oci::Rlimit {
    let (soft, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .unwrap_or((1024, 1024));
    moat_export::oci::Rlimit {
        name: "RLIMIT_NOFILE",
        soft,
        hard,
    }
}

fn proxy_serve(args: &PolicyFlags, http: &str, socks: &str) -> Result<()> {
    let (policy, _) = resolve_policy(args)?;
    let mut config = moat_proxy::ProxyConfig::new(policy.network.rules.clone());
    if let Some(url) = &policy.network.upstream_url {
        config.upstream = Some(moat_proxy::parse_upstream(url).map_err(|e| anyhow!("{e}"))?);
    }
    let bind =
        |a: &str| std::net::TcpListener::bind(a).with_context(|| format!("cannot listen on {a}"));
    let (h, s) = (bind(http)?, bind(socks)?);
    eprintln!(
        "moat proxy-serve: http {http}, socks5 {socks}, policy {}",
        policy.hash()
    );
    let on_decision: moat_proxy::OnDecision = Box::new(|rec| {
        if let Ok(line) = serde_json::to_string(&rec) {
            outln!("{line}");
        }
    });
    let _handle = moat_proxy::start(h, s, config, on_decision)?;
    loop {
        std::thread::park();
    }
}
