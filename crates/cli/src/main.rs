//! The `moat` command line: parses flags into a policy request, and prints
//! results for humans or, with `--json`, for agent harnesses.

mod audit_cmd;
mod exec;
mod nested;
mod tools;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::{Args, Parser, Subcommand};
use moat_policy::{parse_duration, Level, NetworkMode, Policy, PolicyRequest, POLICY_VERSION};
use serde_json::json;

use crate::exec::print_json;

/// Version of the JSON protocol (result fields, capabilities keys).
const PROTOCOL_VERSION: &str = "1";
/// Captured output per stream with --json.
pub(crate) const CAPTURE_LIMIT: usize = 1 << 20;
/// Exit status when moat itself refuses or fails.
pub(crate) const EXIT_MOAT_FAILED: u8 = 125;

#[derive(Parser)]
#[command(
    name = "moat",
    version,
    about = "Run a command inside a kernel-enforced boundary (namespaces, Landlock, seccomp)",
    long_about = "moat runs one command inside a boundary the kernel enforces: the command sees the \
workspace and what its policy grants, and nothing else. No daemon, no container engine.\n\n\
Exit status of `moat exec`: the command's own code; 128+N if it was killed by signal N; \
124 on --timeout; 125 when moat refused or failed; 126 not executable; 127 not found."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run PROGRAM inside the sandbox chosen by the policy flags
    Exec(ExecArgs),
    /// Print, as JSON, what this host can guarantee (probed now, not assumed)
    Capabilities,
    /// Print moat's version, protocol version and policy version
    Version {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Print the resolved policy as canonical JSON, with its sha256 hash and
    /// the view it gives on this host (every path with its mode)
    ExplainPolicy(PolicyArgs),
    /// Read and verify the audit log
    Audit(audit_cmd::AuditArgs),
    /// Run a tool under its profile: its declared boundary, your config, a trusted .moat.toml, MOAT_ARGS and flags
    Run(tools::RunArgs),
    /// List, show or check tool profiles
    #[command(subcommand)]
    Profile(tools::ProfileCommand),
    /// Install, list or remove shims (symlinks that run a tool through moat by its own name)
    #[command(subcommand)]
    Shim(tools::ShimCommand),
    /// Review and trust the project's .moat.toml (found from DIR up to the repository root)
    Trust {
        dir: Option<PathBuf>,
        /// List trusted project files
        #[arg(long)]
        list: bool,
    },
    /// Forget the trust given to the project's .moat.toml
    Untrust { dir: Option<PathBuf> },
    /// Used inside a proxy sandbox as ssh's ProxyCommand: connect HOST PORT through moat's SOCKS5 endpoint
    #[command(hide = true)]
    ProxyConnect { host: String, port: u16 },
}

#[derive(Args, Clone)]
pub(crate) struct PolicyArgs {
    /// Sandbox level: read-only, workspace-write, workspace-contained, danger-full-access
    #[arg(long, value_name = "LEVEL", default_value = "read-only")]
    policy: String,
    /// Network: disabled (default when sandboxed), proxy (only through moat's filtering proxy), unmanaged (host network)
    #[arg(long, value_name = "MODE")]
    network: Option<String>,
    /// The workspace (default: current directory); the command starts there, at the same path
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,
    /// Add a host path read-only (repeatable). Naming a protected path exactly opts it in.
    #[arg(long = "ro", value_name = "PATH")]
    ro: Vec<PathBuf>,
    /// Add a host path read-write (repeatable). Naming a protected path exactly opts it in.
    #[arg(long = "rw", value_name = "PATH")]
    rw: Vec<PathBuf>,
    /// Set an environment variable for the command (repeatable)
    #[arg(long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// Let a host environment variable through (repeatable); secret-looking names need this
    #[arg(long = "pass-env", value_name = "NAME")]
    pass_env: Vec<String>,
    /// Stop the whole process tree after this long: 500ms, 2s, 1m, or seconds
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// With --network proxy: a host the command may reach (repeatable). PATTERN is
    /// example.com, *.example.com (subdomains only), either with :PORT, an IP
    /// literal ([::1]:8080), localhost[:PORT], or a preset: @package-registries =
    /// crates.io static.crates.io index.crates.io pypi.org files.pythonhosted.org
    /// registry.npmjs.org github.com codeload.github.com objects.githubusercontent.com
    /// raw.githubusercontent.com (all :443). No allow entries: nothing is reachable
    #[arg(long = "allow-domain", value_name = "PATTERN")]
    allow_domain: Vec<String>,
    /// With --network proxy: a host the command may never reach; deny wins over allow (repeatable)
    #[arg(long = "deny-domain", value_name = "PATTERN")]
    deny_domain: Vec<String>,
    /// With --network proxy: chain allowed connections through this HTTP proxy (http://[user:pass@]host:port)
    #[arg(long = "upstream-proxy", value_name = "URL")]
    upstream_proxy: Option<String>,
    #[command(flatten)]
    limits: LimitFlags,
}

/// Resource limits (kept together so they move as one into a shared flag table).
#[derive(Args, Clone, Debug, Default)]
pub(crate) struct LimitFlags {
    /// Memory of the whole run (SIZE: 512M, 2G); a per-run cgroup where the host
    /// gives one, else virtual memory per process (RLIMIT_AS)
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub(crate) memory: Option<u64>,
    /// Processes and threads of the run; reaching it ends the run (stops a fork bomb)
    #[arg(long, value_name = "N", value_parser = count_arg)]
    pub(crate) pids: Option<u64>,
    /// CPU time per process: 10s, 10m (RLIMIT_CPU; SIGXCPU when reached)
    #[arg(long = "cpu-time", value_name = "DURATION", value_parser = duration_arg)]
    pub(crate) cpu_time: Option<u64>,
    /// Largest file a process may write (RLIMIT_FSIZE; SIGXFSZ past it)
    #[arg(long = "file-size", value_name = "SIZE", value_parser = size_arg)]
    pub(crate) file_size: Option<u64>,
    /// Open file descriptors per process (RLIMIT_NOFILE)
    #[arg(long = "open-files", value_name = "N", value_parser = count_arg)]
    pub(crate) open_files: Option<u64>,
    /// Size of each private tmpfs (/tmp, HOME, /dev/shm); writes past it fail with ENOSPC
    #[arg(long = "tmp-size", value_name = "SIZE", value_parser = size_arg)]
    pub(crate) tmp_size: Option<u64>,
    /// stdout + stderr bytes; moat stops the run past it (output then passes through moat)
    #[arg(long = "output-limit", value_name = "SIZE", value_parser = size_arg)]
    pub(crate) output_limit: Option<u64>,
    /// A limit this host cannot enforce: strict (default) refuses the run with
    /// exit 125; best-effort runs without it and the result says so
    #[arg(long = "limits", value_name = "MODE", value_parser = limits_mode_arg)]
    pub(crate) limits_mode: Option<moat_policy::LimitsMode>,
}

impl LimitFlags {
    pub(crate) fn to_limits(&self) -> moat_policy::Limits {
        moat_policy::Limits {
            memory: self.memory,
            pids: self.pids,
            cpu_time_ms: self.cpu_time,
            file_size: self.file_size,
            open_files: self.open_files,
            tmp_size: self.tmp_size,
            output: self.output_limit,
            mode: self.limits_mode.unwrap_or_default(),
        }
    }
}

fn size_arg(s: &str) -> Result<u64, String> {
    moat_policy::parse_size(s).map_err(|e| e.to_string())
}

fn count_arg(s: &str) -> Result<u64, String> {
    moat_policy::parse_count(s).map_err(|e| e.to_string())
}

fn duration_arg(s: &str) -> Result<u64, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

fn limits_mode_arg(s: &str) -> Result<moat_policy::LimitsMode, String> {
    moat_policy::LimitsMode::parse(s).ok_or_else(|| "use strict or best-effort".to_string())
}

#[derive(Args)]
pub(crate) struct ExecArgs {
    #[command(flatten)]
    pub(crate) policy: PolicyArgs,
    /// Capture output and print one JSON result object on exit
    #[arg(long, conflicts_with = "events")]
    pub(crate) json: bool,
    /// Stream NDJSON lifecycle events on stdout as they happen (output chunks base64);
    /// the last line is execution.finished (or execution.failed)
    #[arg(long)]
    pub(crate) events: bool,
    /// Audit log to append to (default: $XDG_STATE_HOME/moat/audit.jsonl or ~/.local/state/moat/audit.jsonl)
    #[arg(long, value_name = "PATH")]
    pub(crate) audit_log: Option<PathBuf>,
    /// Do not record this run in the audit log
    #[arg(long, conflicts_with = "audit_log")]
    pub(crate) no_audit: bool,
    /// Do not print the end-of-run summary of refused accesses on stderr
    #[arg(long)]
    pub(crate) quiet: bool,
    /// The program and its arguments (after --)
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub(crate) command: Vec<OsString>,
}

fn main() -> ExitCode {
    // Invoked under a tool's name: a shim.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.is_empty() && !name.starts_with("moat") && tools::is_shim_name(&name) {
        return tools::shim_main(&name, std::env::args_os().skip(1).collect());
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Exec(_) if nested::inside_sandbox() => {
            nested::request(std::env::args_os().skip(1).collect())
        }
        Command::Exec(args) => exec::exec(args),
        Command::Audit(args) => audit_cmd::run(args),
        Command::ProxyConnect { host, port } => exec::proxy_connect(&host, port),
        Command::Run(args) if nested::inside_sandbox() => {
            let _ = args;
            nested::request(std::env::args_os().skip(1).collect())
        }
        Command::Run(args) => tools::run(args),
        Command::Profile(cmd) => tools::profile(cmd),
        Command::Shim(cmd) => tools::shim(cmd),
        Command::Trust { dir, list } => tools::trust(dir, list, false),
        Command::Untrust { dir } => tools::trust(dir, false, true),
        Command::Capabilities => {
            let report = moat_linux::capabilities::report(std::env::vars().collect());
            print_json(&report);
            ExitCode::SUCCESS
        }
        Command::Version { json } => {
            let v = env!("CARGO_PKG_VERSION");
            if json {
                print_json(
                    &json!({"version": v, "protocol_version": PROTOCOL_VERSION, "policy_version": POLICY_VERSION}),
                );
            } else {
                println!("moat {v} (protocol {PROTOCOL_VERSION}, policy {POLICY_VERSION})");
            }
            ExitCode::SUCCESS
        }
        Command::ExplainPolicy(args) => match resolve_policy(&args) {
            Ok((policy, _)) => {
                // What the sandbox would see on this host: the same view a
                // run builds its mounts from.
                let env = std::env::vars_os()
                    .map(|(k, v)| {
                        (
                            k.to_string_lossy().into_owned(),
                            v.to_string_lossy().into_owned(),
                        )
                    })
                    .collect();
                let view =
                    moat_linux::view::compute(&policy, &moat_linux::HostFacts::probe(&policy, env));
                print_json(
                    &json!({"policy": policy.canonical_value(), "policy_hash": policy.hash(), "view": view}),
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("moat: {e:#}");
                ExitCode::from(EXIT_MOAT_FAILED)
            }
        },
    }
}

/// Reads the world (cwd, HOME, path existence) into a policy request.
pub(crate) fn resolve_policy(args: &PolicyArgs) -> Result<(Policy, Option<Duration>)> {
    let here = std::env::current_dir().context("cannot read the current directory")?;
    let home_raw = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    resolve_policy_in(args, &here, &home_raw)
}

/// [`resolve_policy`] for a given current directory and HOME (a nested
/// request is resolved in the caller's directory, against the real home).
pub(crate) fn resolve_policy_in(
    args: &PolicyArgs,
    here: &Path,
    home_raw: &Path,
) -> Result<(Policy, Option<Duration>)> {
    let (here, home_raw) = (here.to_path_buf(), home_raw.to_path_buf());
    let level = Level::parse(&args.policy).ok_or_else(|| {
        anyhow!("unknown --policy {:?}; use read-only, workspace-write, workspace-contained or danger-full-access", args.policy)
    })?;
    let network =
        match &args.network {
            None => None,
            Some(m) => Some(NetworkMode::parse(m).ok_or_else(|| {
                anyhow!("unknown --network {m:?}; use disabled, proxy or unmanaged")
            })?),
        };
    let home = std::fs::canonicalize(&home_raw).unwrap_or(home_raw.clone());
    let ws_arg = args.cwd.clone().unwrap_or_else(|| here.clone());
    let workspace = std::fs::canonicalize(expand(&ws_arg, &home_raw, &here))
        .with_context(|| format!("the workspace {} does not exist", ws_arg.display()))?;
    if !workspace.is_dir() {
        return Err(anyhow!(
            "the workspace {} is not a directory",
            workspace.display()
        ));
    }
    let canon = |p: &PathBuf, flag: &str| {
        std::fs::canonicalize(expand(p, &home_raw, &here)).with_context(|| {
            format!(
                "{flag} {}: no such path on the host (moat does not skip missing paths)",
                p.display()
            )
        })
    };
    let ro = args
        .ro
        .iter()
        .map(|p| canon(p, "--ro"))
        .collect::<Result<Vec<_>>>()?;
    let rw = args
        .rw
        .iter()
        .map(|p| canon(p, "--rw"))
        .collect::<Result<Vec<_>>>()?;
    let env = args
        .env
        .iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => Err(anyhow!("--env {kv:?} must be K=V")),
        })
        .collect::<Result<Vec<_>>>()?;
    let timeout_ms = match &args.timeout {
        Some(t) => Some(parse_duration(t)?),
        None => None,
    };
    let policy = Policy::resolve(PolicyRequest {
        level: Some(level),
        network,
        workspace,
        home,
        ro,
        rw,
        env,
        pass_env: args.pass_env.clone(),
        timeout_ms,
        allow_domains: args.allow_domain.clone(),
        deny_domains: args.deny_domain.clone(),
        upstream_proxy: args.upstream_proxy.clone(),
        limits: args.limits.to_limits(),
        ..Default::default()
    })?;
    Ok((policy, timeout_ms.map(Duration::from_millis)))
}

/// `~/x` → HOME/x; relative → absolute from the current directory.
fn expand(p: &Path, home: &Path, here: &Path) -> PathBuf {
    if let Ok(rest) = p.strip_prefix("~") {
        return home.join(rest);
    }
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        here.join(p)
    }
}
