//! The `moat` command line: parses flags into a policy request, and prints
//! results for humans or, with `--json`, for agent harnesses.

/// `println!` that does not panic when stdout is closed (`moat … | head`):
/// a reader that went away is not moat's error.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// `print!` that does not panic when stdout is closed.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($t)*);
    }};
}

mod audit_cmd;
mod exec;
mod export_cmd;
mod fastparse;
mod hook;
mod mcp;
mod nested;
mod pool;
mod serve;
mod service;
mod state;
mod tools;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use moat_config::{PolicyFlags, Resolved};
use moat_policy::{Policy, POLICY_VERSION};
use serde_json::json;

use crate::exec::print_json;

/// Version of the JSON protocol (result fields, capabilities keys).
const PROTOCOL_VERSION: &str = "1";
/// Captured output per stream with --json.
pub(crate) const CAPTURE_LIMIT: usize = 1 << 20;
/// Exit status when moat itself refuses or fails (the runtime's, as a status byte).
pub(crate) const EXIT_MOAT_FAILED: u8 = moat_runtime::result::EXIT_MOAT_FAILED as u8;
/// The command ran, but the post-run sweep could not neutralise something
/// it left at a write-protected path (still live on the host).
pub(crate) const EXIT_SWEEP_FAILED: u8 = moat_runtime::result::EXIT_SWEEP_FAILED as u8;

#[derive(Parser)]
#[command(
    name = "moat",
    version,
    about = "Run a command inside a kernel-enforced boundary (namespaces, Landlock, seccomp)",
    long_about = "moat runs one command inside a boundary the kernel enforces: the command sees the \
workspace and what its policy grants, and nothing else. No daemon, no container engine.\n\n\
Exit status of `moat exec`: the command's own code; 128+N if it was killed by signal N; \
122 when something the command left at a write-protected path could not be neutralised; \
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
    ExplainPolicy(PolicyFlags),
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
    /// Translate the policy for another target: an OCI bundle, Kubernetes manifests, a macOS Seatbelt profile
    #[command(subcommand)]
    Export(export_cmd::ExportCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Serve RunSeal's execution protocol (JSON-RPC 2.0, one message per line) on stdio or a unix socket;
    /// the policy flags are the ceiling every request runs within
    Serve(serve::ServeArgs),
    /// Serve MCP on stdio: the tools exec, capabilities and explain_policy, within the policy flags
    Mcp(mcp::McpArgs),
    /// Hooks for agent harnesses (Claude Code)
    #[command(subcommand)]
    Hook(hook::HookCommand),
    /// Used inside a proxy sandbox as ssh's ProxyCommand: connect HOST PORT through moat's SOCKS5 endpoint
    #[command(hide = true)]
    ProxyConnect { host: String, port: u16 },
}

/// How a run reports and records itself: shared by `moat exec` and `moat run`.
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReportArgs {
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
    /// Do not print refused accesses and network refusals on stderr
    #[arg(long)]
    pub(crate) quiet: bool,
    /// A JSON object recorded (redacted) in the run's policy.resolved event:
    /// how `moat serve` passes a request's metadata on
    #[arg(long, hide = true, value_name = "JSON")]
    pub(crate) metadata: Option<String>,
}

#[derive(Args)]
pub(crate) struct ExecArgs {
    #[command(flatten)]
    pub(crate) policy: PolicyFlags,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
    /// The program and its arguments (after --)
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub(crate) command: Vec<OsString>,
}

fn main() -> ExitCode {
    // A sandbox template of `serve`/`mcp` (internal): it must become one
    // while single-threaded, before anything else runs.
    if std::env::args_os().nth(1).as_deref()
        == Some(std::ffi::OsStr::new(moat_linux::template::SUBCOMMAND))
    {
        moat_linux::template::template_main();
    }
    moat_linux::timing::init();
    // Invoked under a tool's name: a shim.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.is_empty() && !name.starts_with("moat") && tools::is_shim_name(&name) {
        return tools::shim_main(&name, std::env::args_os().skip(1).collect());
    }
    let cli = match fastparse::parse(std::env::args_os().collect()) {
        Ok(c) => c,
        Err(e) => return bad_invocation(e),
    };
    moat_linux::timing::mark("parse arguments");
    match cli.command {
        Command::Exec(_) if nested::inside_sandbox() => {
            nested::request(std::env::args_os().skip(1).collect())
        }
        Command::Exec(args) => exec::exec(args),
        Command::Audit(args) => audit_cmd::run(args),
        Command::Serve(args) => serve::serve(args),
        Command::Mcp(args) => mcp::mcp(args),
        Command::Hook(cmd) => hook::hook(cmd),
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
        Command::Export(cmd) => export_cmd::run(cmd),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut cmd, "moat", &mut buf);
            out!("{}", String::from_utf8_lossy(&buf));
            ExitCode::SUCCESS
        }
        Command::Capabilities => {
            let mut report = moat_linux::capabilities::report(std::env::vars().collect());
            report["other_backends"] = export_cmd::backends();
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
                outln!("moat {v} (protocol {PROTOCOL_VERSION}, policy {POLICY_VERSION})");
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
                let mut facts = moat_linux::HostFacts::probe(&policy, env);
                if policy.level.is_sandboxed() {
                    let reads = moat_config::ConfigReads::default();
                    moat_runtime::redact_host_git_configs(&policy, &mut facts, &reads);
                    moat_runtime::redact_tool_configs(&policy, &mut facts, &reads);
                }
                let view = moat_linux::view::compute(&policy, &facts);
                // The workspace's own .git/config with credentials is shown
                // redacted (hidden on the Landlock backend): name what in it
                // is a credential, never the value.
                let found = moat_config::workspace_git_config_credentials(&policy.workspace);
                let notes: Vec<String> = if found.is_empty() || !policy.level.is_sandboxed() {
                    Vec::new()
                } else {
                    vec![format!(
                        "{} holds credentials ({}): the command sees a copy without them (the Landlock backend refuses reading it); --ro PATH shows it the raw file; a credential helper keeps them out of the file",
                        policy.workspace.join(".git/config").display(),
                        found.join(", ")
                    )]
                };
                print_json(
                    &json!({"policy": policy.canonical_value(), "policy_hash": policy.hash(), "view": view, "notes": notes}),
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

/// Reads the world (cwd, HOME, path existence) into a policy request
/// (the runtime's resolution: one rule for the CLI and the service).
pub(crate) fn resolve_policy(args: &PolicyFlags) -> Result<(Policy, Option<Duration>)> {
    Ok(moat_runtime::resolve_policy(args)?)
}

/// [`resolve_policy`] for a given current directory and HOME (a nested
/// request is resolved in the caller's directory, against the real home).
pub(crate) fn resolve_policy_in(
    args: &PolicyFlags,
    here: &Path,
    home_raw: &Path,
) -> Result<(Policy, Option<Duration>)> {
    Ok(moat_runtime::resolve_policy_in(args, here, home_raw)?)
}

/// The workspace `--cwd` names (default: `here`), canonical, a directory.
pub(crate) fn workspace_of(args: &PolicyFlags, here: &Path, home_raw: &Path) -> Result<PathBuf> {
    Ok(moat_runtime::resolve::workspace_of(args, here, home_raw)?)
}

/// The merged settings as a policy (see [`moat_runtime::resolve::finish_policy`]).
pub(crate) fn finish_policy(
    resolved: &Resolved,
    args: &PolicyFlags,
    workspace: PathBuf,
    home_raw: &Path,
) -> Result<Policy> {
    Ok(moat_runtime::resolve::finish_policy(
        resolved, args, workspace, home_raw,
    )?)
}

/// A command line clap could not parse: `--help` and `--version` print and
/// exit 0; anything else is a refusal, exit 125 like every other one.
fn bad_invocation(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let _ = e.print();
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
        _ => ExitCode::from(EXIT_MOAT_FAILED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// A valid value for each flag of the table; a new flag without one
    /// fails this test, so it cannot escape the comparison below.
    fn sample(long: &str) -> Option<&'static str> {
        Some(match long {
            "policy" => "ro",
            "network" => "proxy",
            "cwd" => "/tmp",
            "ro" => "/usr",
            "rw" => "/tmp",
            "env" => "GREETING=hi",
            "pass-env" => "CI",
            "timeout" => "2s",
            "allow-domain" => "example.com:443",
            "deny-domain" => "ads.example.com",
            "upstream-proxy" => "http://proxy.example:3128",
            "upstream-proxy-auth-file" => "/tmp/auth",
            "memory" => "2G",
            "pids" => "256",
            "cpu-time" => "10m",
            "file-size" => "1G",
            "open-files" => "1024",
            "tmp-size" => "512M",
            "output-limit" => "64M",
            "limits" => "best-effort",
            "backend" => "landlock",
            _ => return None,
        })
    }

    fn exec_flags(words: &[&str]) -> Result<PolicyFlags, clap::Error> {
        let argv = ["moat", "exec"].iter().chain(words).chain(&["--", "true"]);
        match Cli::try_parse_from(argv)?.command {
            Command::Exec(a) => Ok(a.policy),
            _ => unreachable!(),
        }
    }

    fn run_flags(words: &[&str]) -> Result<PolicyFlags, clap::Error> {
        let argv = ["moat", "run"]
            .iter()
            .chain(words)
            .chain(&["git", "status"]);
        match Cli::try_parse_from(argv)?.command {
            Command::Run(a) => Ok(a.policy),
            _ => unreachable!(),
        }
    }

    #[test]
    fn every_policy_flag_is_read_alike_by_exec_run_and_moat_args() {
        let table = moat_config::policy_flag_names();
        assert!(table.len() >= 12, "{table:?}");
        let moat_args = moat_config::moat_args_flag_names();
        for flag in &table {
            let long = flag.trim_start_matches("--");
            let value = sample(long).unwrap_or_else(|| panic!("no sample value for {flag}"));
            let words = [flag.as_str(), value];
            let exec = exec_flags(&words).unwrap_or_else(|e| panic!("exec {flag}: {e}"));
            let run = run_flags(&words).unwrap_or_else(|e| panic!("run {flag}: {e}"));
            assert_ne!(exec, PolicyFlags::default(), "{flag} was not read");
            assert_eq!(exec, run, "{flag}");
            let joined = format!("{flag}={value}");
            assert_eq!(exec_flags(&[&joined]).unwrap(), exec, "{joined}");
            let from_env = moat_config::parse_moat_args_words(&[flag.clone(), value.to_string()]);
            if moat_args.contains(flag) {
                assert_eq!(from_env.unwrap(), exec, "MOAT_ARGS {flag}");
            } else {
                assert!(from_env.is_err(), "MOAT_ARGS must refuse {flag}");
            }
        }
    }

    #[test]
    fn bad_values_are_refused_alike() {
        for words in [
            ["--policy", "yolo"],
            ["--network", "open"],
            ["--env", "NOVALUE"],
            ["--timeout", "soon"],
            ["--allow-domain", "*"],
            ["--memory", "lots"],
            ["--pids", "0"],
            ["--cpu-time", "forever"],
            ["--tmp-size", "-1M"],
            ["--limits", "maybe"],
        ] {
            assert!(exec_flags(&words).is_err(), "{words:?}");
            assert!(run_flags(&words).is_err(), "{words:?}");
            let w: Vec<String> = words.iter().map(|s| s.to_string()).collect();
            assert!(moat_config::parse_moat_args_words(&w).is_err(), "{words:?}");
        }
        // The run command line keeps its flags from the tool's arguments.
        assert!(Cli::command()
            .try_get_matches_from(["moat", "run", "--upstream-proxy", "http://p:1", "git"])
            .is_ok());
    }
}
