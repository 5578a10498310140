//! `moat hook claude-code`: a Claude Code PreToolUse hook that rewrites a
//! Bash tool call to run under `moat run bash` (the user's config and the
//! trusted project file decide the policy), and denies the call when moat
//! cannot confine it here — never lets it run bare.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use clap::{Args, Subcommand};
use serde_json::{json, Value};

#[derive(Subcommand)]
pub(crate) enum HookCommand {
    /// PreToolUse hook for Claude Code's Bash tool: reads the hook JSON on stdin
    ClaudeCode(ClaudeCodeArgs),
}

#[derive(Args)]
pub(crate) struct ClaudeCodeArgs {
    /// Leave the approval to Claude Code's prompt ("ask") instead of approving
    /// the confined command ("allow"; your deny and ask rules still apply)
    #[arg(long)]
    pub(crate) ask: bool,
}

pub(crate) fn hook(cmd: HookCommand) -> ExitCode {
    match cmd {
        HookCommand::ClaudeCode(a) => claude_code(&a),
    }
}

/// The answer that stops the tool call, with the reason Claude is shown.
fn deny(reason: &str) -> ExitCode {
    outln!(
        "{}",
        json!({"hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": format!("moat: {reason}"),
        }})
    );
    ExitCode::SUCCESS
}

/// `s` as one single-quoted shell word.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn claude_code(args: &ClaudeCodeArgs) -> ExitCode {
    let mut raw = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut raw) {
        return deny(&format!("cannot read the hook input: {e}"));
    }
    let input: Value = match serde_json::from_str(&raw) {
        Ok(v) => v,
        Err(e) => {
            return deny(&format!(
                "the hook input is not JSON ({e}); the command was not run"
            ))
        }
    };
    if input["tool_name"] != "Bash" {
        // Not ours: no opinion, Claude Code decides as usual.
        return ExitCode::SUCCESS;
    }
    let Some(command) = input["tool_input"]["command"].as_str() else {
        return deny("the Bash tool call has no command string");
    };
    let moat = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return deny(&format!("cannot find moat's own executable: {e}")),
    };
    let cwd = input["cwd"]
        .as_str()
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .or_else(|| std::env::current_dir().ok());
    // Fail closed: prove here, now, that moat can build this boundary in
    // this directory before the agent's command is handed to it.
    if let Err(reason) = probe(&moat, cwd.as_deref()) {
        return deny(&format!(
            "cannot confine the command here, so it was not run: {reason}"
        ));
    }
    let mut updated = input["tool_input"].clone();
    updated["command"] = json!(format!(
        "{} run bash -c {}",
        shell_quote(&moat.to_string_lossy()),
        shell_quote(command)
    ));
    outln!(
        "{}",
        json!({"hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": if args.ask { "ask" } else { "allow" },
            "permissionDecisionReason": "moat: the command runs inside moat's sandbox (moat run bash)",
            "updatedInput": updated,
        }})
    );
    ExitCode::SUCCESS
}

/// Runs `true` under the same profile the rewritten command will use. It
/// runs without a controlling terminal: Claude Code's terminal is the hook's,
/// and a question asked there (an untrusted `.moat.toml`, which the agent
/// itself may have written in a subdirectory) would wait until Claude Code
/// cancels the hook — and a cancelled hook lets the call run unconfined.
fn probe(moat: &Path, cwd: Option<&Path>) -> Result<(), String> {
    let mut c = Command::new(moat);
    moat_linux::process::without_terminal(&mut c);
    c.args(["run", "--no-audit", "--quiet", "bash", "-c", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let out = c.output().map_err(|e| format!("cannot start moat: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let text = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(if text.is_empty() {
            format!("moat run bash exited with {}", out.status)
        } else {
            text
        })
    }
}
