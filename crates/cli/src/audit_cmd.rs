//! `moat audit tail|show|verify`: read, follow and check the audit log.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::Value;

/// How often `tail --follow` looks for new lines.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

#[derive(Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub command: AuditCommand,
}

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Print the last events of the audit log as a table (--json: the raw lines)
    Tail(TailArgs),
    /// Print every event of one execution, in order, as a pretty JSON array
    Show(ShowArgs),
    /// Check the log's hash chain: exit 0 if intact, 1 naming the first broken line
    Verify(LogArg),
}

#[derive(Args)]
pub struct LogArg {
    /// The audit log [default: $XDG_STATE_HOME/moat/audit.jsonl, else ~/.local/state/moat/audit.jsonl]
    #[arg(long, alias = "audit-log", value_name = "PATH")]
    pub log: Option<PathBuf>,
}

#[derive(Args)]
pub struct TailArgs {
    /// How many of the last events to print
    #[arg(short = 'n', long = "lines", value_name = "N", default_value_t = 20)]
    pub lines: usize,
    /// Keep printing events as they are appended (until interrupted)
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Print the raw JSON lines instead of a table
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub log: LogArg,
}

#[derive(Args)]
pub struct ShowArgs {
    /// The execution id (`exec_…`), or a unique prefix of it as `tail` shows it
    #[arg(value_name = "EXECUTION_ID")]
    pub execution_id: String,
    #[command(flatten)]
    pub log: LogArg,
}

/// Runs `moat audit …`. Exit status: 0 done (verify: chain intact); 1 the
/// chain is broken, no such execution, no log, or it cannot be read.
pub fn run(args: AuditArgs) -> ExitCode {
    let result = match args.command {
        AuditCommand::Tail(a) => log_path(&a.log).and_then(|p| tail(&p, &a)),
        AuditCommand::Show(a) => log_path(&a.log).and_then(|p| show(&p, &a.execution_id)),
        AuditCommand::Verify(a) => log_path(&a).and_then(|p| verify(&p)),
    };
    match result {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("moat: {msg}");
            ExitCode::from(1)
        }
    }
}

fn log_path(arg: &LogArg) -> Result<PathBuf, String> {
    if let Some(p) = &arg.log {
        return Ok(p.clone());
    }
    let env: Vec<(String, String)> = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    moat_audit::default_log_path(&env).ok_or_else(|| {
        "cannot locate the audit log: neither XDG_STATE_HOME nor HOME is set; pass --log PATH"
            .into()
    })
}

fn missing(path: &Path) -> String {
    format!(
        "no audit log at {} (nothing has been recorded there yet)",
        path.display()
    )
}

/// Writes to stdout; `false` once the reader has gone (a closed pipe ends
/// the command quietly).
fn emit(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}

fn tail(path: &Path, args: &TailArgs) -> Result<ExitCode, String> {
    let mut header_shown = false;
    let mut offset = if path.exists() {
        let (lines, end) = moat_audit::tail_lines(path, args.lines).map_err(|e| e.to_string())?;
        header_shown = true;
        if !emit(&render(&lines, args.json, true)) {
            return Ok(ExitCode::SUCCESS);
        }
        end
    } else if args.follow {
        eprintln!("moat: {}; waiting for it", missing(path));
        0
    } else {
        return Err(missing(path));
    };
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    loop {
        std::thread::sleep(FOLLOW_POLL);
        if !path.exists() {
            continue;
        }
        let (lines, end) = moat_audit::lines_from(path, offset).map_err(|e| e.to_string())?;
        offset = end;
        if !lines.is_empty() {
            if !emit(&render(&lines, args.json, !header_shown)) {
                return Ok(ExitCode::SUCCESS);
            }
            header_shown = true;
        }
    }
}

/// Raw lines, or table rows (with the header row when `header`).
fn render(lines: &[String], json: bool, header: bool) -> String {
    if json {
        return lines.iter().fold(String::new(), |mut s, l| {
            s.push_str(l);
            s.push('\n');
            s
        });
    }
    let events: Vec<Value> = lines
        .iter()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|_| serde_json::json!({"type": "(not JSON)"}))
        })
        .collect();
    let table = moat_audit::format_table(&events);
    if header {
        table
    } else {
        table
            .split_once('\n')
            .map(|(_, rows)| rows.to_owned())
            .unwrap_or_default()
    }
}

fn show(path: &Path, query: &str) -> Result<ExitCode, String> {
    if !path.exists() {
        return Err(missing(path));
    }
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut events: Vec<Value> = Vec::new();
    for line in BufReader::with_capacity(1 << 20, file).lines() {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        // Cheap filter first: only lines mentioning the id are parsed.
        if !line.contains(query) {
            continue;
        }
        let Ok(ev) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if ev
            .get("execution_id")
            .and_then(Value::as_str)
            .is_some_and(|id| id_matches(id, query))
        {
            events.push(ev);
        }
    }
    let mut ids: Vec<&str> = events
        .iter()
        .filter_map(|e| e["execution_id"].as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Err(format!(
            "no events of execution {query} in {}",
            path.display()
        ));
    }
    let exact = ids.contains(&query);
    if ids.len() > 1 && !exact {
        let shown = ids.iter().take(5).copied().collect::<Vec<_>>().join(", ");
        let more = if ids.len() > 5 { ", …" } else { "" };
        return Err(format!(
            "{query} matches {} executions ({shown}{more}); give more of the id",
            ids.len()
        ));
    }
    if exact {
        events.retain(|e| e["execution_id"].as_str() == Some(query));
    }
    let text = serde_json::to_string_pretty(&events).map_err(|e| e.to_string())?;
    emit(&format!("{text}\n"));
    Ok(ExitCode::SUCCESS)
}

/// The full id, or a prefix of it with or without the `exec_` prefix.
fn id_matches(id: &str, query: &str) -> bool {
    !query.is_empty()
        && (id.starts_with(query)
            || id
                .strip_prefix("exec_")
                .is_some_and(|rest| rest.starts_with(query)))
}

fn verify(path: &Path) -> Result<ExitCode, String> {
    if !path.exists() {
        return Err(missing(path));
    }
    match moat_audit::verify(path) {
        Ok(r) => {
            let plural =
                |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
            emit(&format!(
                "ok: {}, {}, chain intact\n",
                plural(r.lines, "line", "lines"),
                plural(r.executions, "execution", "executions")
            ));
            Ok(ExitCode::SUCCESS)
        }
        Err(moat_audit::VerifyError::Broken { line, reason }) => {
            emit(&format!("broken at line {line}: {reason}\n"));
            Ok(ExitCode::from(1))
        }
        Err(e) => Err(e.to_string()),
    }
}
