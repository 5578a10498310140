//! The `moat` command line: parses flags into a policy request, and prints
//! results for humans or, with `--json`, for agent harnesses.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::{Args, Parser, Subcommand};
use moat_linux::{HostFacts, NoObserver, OutputMode, RunOptions, RunOutcome, RunStatus};
use moat_policy::{parse_duration, Level, NetworkMode, Policy, PolicyRequest, POLICY_VERSION};
use serde_json::{json, Value};

/// Version of the JSON protocol (result fields, capabilities keys).
const PROTOCOL_VERSION: &str = "1";
/// Captured output per stream with --json.
const CAPTURE_LIMIT: usize = 1 << 20;
/// Exit status when moat itself refuses or fails.
const EXIT_MOAT_FAILED: u8 = 125;

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
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    /// Print the resolved policy as canonical JSON, with its sha256 hash
    ExplainPolicy(PolicyArgs),
}

#[derive(Args, Clone)]
struct PolicyArgs {
    /// Sandbox level: read-only, workspace-write, workspace-contained, danger-full-access
    #[arg(long, value_name = "LEVEL", default_value = "read-only")]
    policy: String,
    /// Network: disabled (default when sandboxed), unmanaged (host network); proxy is not available yet
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
}

#[derive(Args)]
struct ExecArgs {
    #[command(flatten)]
    policy: PolicyArgs,
    /// Capture output and print one JSON result object on exit
    #[arg(long)]
    json: bool,
    /// The program and its arguments (after --)
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Exec(args) => exec(args),
        Command::Capabilities => {
            let report = moat_linux::capabilities::report(std::env::vars().collect());
            print_json(&report);
            ExitCode::SUCCESS
        }
        Command::Version { json } => {
            let v = env!("CARGO_PKG_VERSION");
            if json {
                print_json(&json!({"version": v, "protocol_version": PROTOCOL_VERSION, "policy_version": POLICY_VERSION}));
            } else {
                println!("moat {v} (protocol {PROTOCOL_VERSION}, policy {POLICY_VERSION})");
            }
            ExitCode::SUCCESS
        }
        Command::ExplainPolicy(args) => match resolve_policy(&args) {
            Ok((policy, _)) => {
                print_json(&json!({"policy": policy.canonical_value(), "policy_hash": policy.hash()}));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("moat: {e:#}");
                ExitCode::from(EXIT_MOAT_FAILED)
            }
        },
    }
}

fn print_json(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, v);
    let _ = writeln!(out);
}

/// Reads the world (cwd, HOME, path existence) into a policy request.
fn resolve_policy(args: &PolicyArgs) -> Result<(Policy, Option<Duration>)> {
    let level = Level::parse(&args.policy).ok_or_else(|| {
        anyhow!("unknown --policy {:?}; use read-only, workspace-write, workspace-contained or danger-full-access", args.policy)
    })?;
    let network = match &args.network {
        None => None,
        Some(m) => Some(NetworkMode::parse(m).ok_or_else(|| anyhow!("unknown --network {m:?}; use disabled or unmanaged"))?),
    };
    let here = std::env::current_dir().context("cannot read the current directory")?;
    let home_raw = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"));
    let home = std::fs::canonicalize(&home_raw).unwrap_or(home_raw.clone());
    let ws_arg = args.cwd.clone().unwrap_or_else(|| here.clone());
    let workspace = std::fs::canonicalize(expand(&ws_arg, &home_raw, &here))
        .with_context(|| format!("the workspace {} does not exist", ws_arg.display()))?;
    if !workspace.is_dir() {
        return Err(anyhow!("the workspace {} is not a directory", workspace.display()));
    }
    let canon = |p: &PathBuf, flag: &str| {
        std::fs::canonicalize(expand(p, &home_raw, &here))
            .with_context(|| format!("{flag} {}: no such path on the host (moat does not skip missing paths)", p.display()))
    };
    let ro = args.ro.iter().map(|p| canon(p, "--ro")).collect::<Result<Vec<_>>>()?;
    let rw = args.rw.iter().map(|p| canon(p, "--rw")).collect::<Result<Vec<_>>>()?;
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

fn execution_id() -> String {
    let mut bytes = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("exec_{hex}")
}

fn exec(args: ExecArgs) -> ExitCode {
    let id = execution_id();
    let (policy, timeout) = match resolve_policy(&args.policy) {
        Ok(p) => p,
        Err(e) => return refuse(args.json, &id, None, &format!("{e:#}")),
    };
    let facts = HostFacts::probe(&policy, std::env::vars_os().map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned())).collect());
    let plan = match moat_linux::build_plan(&policy, &facts) {
        Ok(p) => p,
        Err(e) => return refuse(args.json, &id, Some(&policy), &e.to_string()),
    };
    let opts = RunOptions {
        argv: args.command,
        output: if args.json { OutputMode::Capture { limit: CAPTURE_LIMIT } } else { OutputMode::Passthrough },
        timeout,
        tag: id.clone(),
    };
    let outcome = moat_linux::run(&plan, &opts, &mut NoObserver);
    if !args.json {
        report_plain(&outcome);
    } else {
        print_json(&result_json(&id, &policy, &outcome));
    }
    ExitCode::from(outcome.exit_code.clamp(0, 255) as u8)
}

fn report_plain(o: &RunOutcome) {
    if let Some(e) = &o.error {
        eprintln!("moat: {e}");
    }
    if o.timed_out {
        eprintln!("moat: timed out after {} ms; the process tree was stopped", o.duration.as_millis());
    }
    for (from, to) in &o.swept {
        eprintln!(
            "moat: the command created {} (a write-protected path that runs code later); moved it to {}",
            from.display(),
            to.display()
        );
    }
}

fn refuse(json_mode: bool, id: &str, policy: Option<&Policy>, msg: &str) -> ExitCode {
    if json_mode {
        print_json(&json!({
            "execution_id": id,
            "exit_code": EXIT_MOAT_FAILED,
            "signal": null,
            "timed_out": false,
            "status": "failed_to_start",
            "error": msg,
            "stdout": "",
            "stderr": "",
            "stdout_truncated": false,
            "stderr_truncated": false,
            "duration_ms": 0,
            "sandbox": {"enforced": false, "level": policy.map(|p| p.level.as_str())},
            "network": {"mode": policy.map(|p| p.network.mode.as_str())},
            "policy_hash": policy.map(|p| p.hash()),
        }));
    } else {
        eprintln!("moat: {msg}");
    }
    ExitCode::from(EXIT_MOAT_FAILED)
}

fn result_json(id: &str, policy: &Policy, o: &RunOutcome) -> Value {
    let status = match o.status {
        RunStatus::Finished => "finished",
        RunStatus::FailedToStart => "failed_to_start",
        RunStatus::TimedOut => "timed_out",
    };
    let enforced = policy.level.is_sandboxed() && o.status != RunStatus::FailedToStart;
    let mut v = json!({
        "execution_id": id,
        "exit_code": o.exit_code,
        "signal": o.signal,
        "timed_out": o.timed_out,
        "status": status,
        "stdout": String::from_utf8_lossy(&o.stdout),
        "stderr": String::from_utf8_lossy(&o.stderr),
        "stdout_truncated": o.stdout_truncated,
        "stderr_truncated": o.stderr_truncated,
        "duration_ms": o.duration.as_millis() as u64,
        "sandbox": {
            "enforced": enforced,
            "level": policy.level.as_str(),
            "layers": {
                "namespaces": o.layers.namespaces.as_str(),
                "landlock": o.layers.landlock.as_str(),
                "seccomp": o.layers.seccomp.as_str(),
            },
        },
        "network": {"mode": policy.network.mode.as_str()},
        "policy_hash": policy.hash(),
    });
    if let Some(e) = &o.error {
        v["error"] = json!(e);
    }
    if !o.swept.is_empty() {
        v["swept"] = json!(o.swept.iter().map(|(a, b)| json!({"path": a, "moved_to": b})).collect::<Vec<_>>());
    }
    v
}
