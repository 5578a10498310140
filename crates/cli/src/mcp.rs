//! `moat mcp`: an MCP server on stdio, built on the official Rust SDK
//! (`rmcp`), with the tools `exec`, `capabilities` and `explain_policy`, under the
//! same ceiling and roots rule as `moat serve`.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use clap::Args;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};

use crate::service::{ProtocolRequest, RpcError, ServerArgs, Service};

#[derive(Args)]
pub(crate) struct McpArgs {
    #[command(flatten)]
    pub(crate) server: ServerArgs,
    /// Run another stdio MCP server (the command after --) under the policy
    /// flags instead of serving moat's own tools
    #[arg(long, requires = "command", conflicts_with = "roots")]
    pub(crate) wrap: bool,
    /// With --wrap: the MCP server to run and its arguments
    #[arg(last = true, value_name = "COMMAND")]
    pub(crate) command: Vec<std::ffi::OsString>,
}

pub(crate) fn mcp(args: McpArgs) -> ExitCode {
    if args.wrap {
        return wrap(args);
    }
    if !args.command.is_empty() {
        eprintln!("moat mcp: a command after -- needs --wrap");
        return ExitCode::from(crate::EXIT_MOAT_FAILED);
    }
    // As `moat serve` (see there).
    moat_linux::limits::raise_open_files();
    let service = match Service::new(&args.server) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("moat mcp: {e:#}");
            return ExitCode::from(crate::EXIT_MOAT_FAILED);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("moat mcp: cannot start the async runtime: {e}");
            return ExitCode::from(crate::EXIT_MOAT_FAILED);
        }
    };
    let handler = Tools {
        service: service.clone(),
    };
    let served = runtime.block_on(async move {
        let running = handler.serve(rmcp::transport::stdio()).await?;
        running
            .waiting()
            .await
            .map(|_| ())
            .map_err(anyhow::Error::from)
    });
    // The client went away: stop whatever it started, trees included.
    service.stop_owned(0);
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat mcp: {e:#}");
            ExitCode::from(crate::EXIT_MOAT_FAILED)
        }
    }
}

/// moat's MCP tools, served by the official Rust SDK.
struct Tools {
    service: Arc<Service>,
}

fn mcp_error(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(e.to_string(), None)
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("moat", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Run commands with the exec tool: each runs inside moat's kernel-enforced sandbox \
                 under this server's policy. Pass command as an argv array.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        serde_json::from_value(json!({ "tools": tools() })).map_err(mcp_error)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let params = json!({"name": request.name, "arguments": request.arguments});
        let service = self.service.clone();
        // A call the client abandons (notifications/cancelled, sent when
        // its own timeout fires) cancels its execution: otherwise the
        // command would run on for the rest of the session, and each retry
        // start another. The watcher outlives this future, which the SDK
        // drops on cancellation.
        let abandon = Arc::new(Abandon::default());
        let watcher = {
            let (ct, abandon, service) = (context.ct.clone(), abandon.clone(), service.clone());
            tokio::spawn(async move {
                ct.cancelled().await;
                abandon.abandon(&service);
            })
        };
        // An execution blocks until its command ends: off the async workers.
        let result =
            tokio::task::spawn_blocking(move || call_tool(&service, &params, &abandon)).await;
        watcher.abort();
        let result = result
            .map_err(mcp_error)?
            .map_err(|e| ErrorData::invalid_params(e.message, Some(e.data)))?;
        let result: CallToolResult = serde_json::from_value(result).map_err(mcp_error)?;
        Ok(result.into())
    }
}

/// `--wrap`: the wrapped server is a `moat exec` of its own, its stdin and
/// stdout the MCP client's; moat's messages go to stderr (MCP's log channel).
fn wrap(args: McpArgs) -> ExitCode {
    crate::exec::exec(crate::ExecArgs {
        policy: args.server.policy,
        report: crate::ReportArgs {
            audit_log: args.server.audit_log,
            no_audit: args.server.no_audit,
            ..crate::ReportArgs::default()
        },
        command: args.command,
    })
}

fn tools() -> Value {
    json!([
        {
            "name": "exec",
            "description": "Run a command inside moat's sandbox under the server's policy. `command` is an argv array (no shell: to use one, pass [\"bash\",\"-c\",\"...\"] explicitly). The result reports stdout, stderr, the exit code, and each access the sandbox refused with the flag that would grant it.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "command": {"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "argv: program and arguments"},
                    "cwd": {"type": "string", "description": "working directory; must lie inside one of the server's roots"},
                    "timeout_ms": {"type": "integer", "minimum": 1, "description": "stop the whole process tree after this many milliseconds"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "stdin": {"type": "string", "description": "text given to the command on stdin"},
                    "policy": {"description": "a narrower policy than the server's: a level name (read-only, workspace-write, ...) optionally with -disabled/-proxy, or {level, network}"}
                },
                "required": ["command"]
            }
        },
        {
            "name": "capabilities",
            "description": "What this host's kernel lets moat guarantee (probed now).",
            "inputSchema": {"type": "object", "properties": {}}
        },
        {
            "name": "explain_policy",
            "description": "The policy an exec with these parameters would run under, its hash, and the filesystem view it gives.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "cwd": {"type": "string"},
                    "policy": {}
                }
            }
        }
    ])
}

/// A tool result: a text block for a model, the structured value, and
/// whether it is an error.
fn tool_result(text: String, structured: Value, is_error: bool) -> Value {
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": is_error,
    })
}

fn refused(reason: &str, code: &str) -> Value {
    tool_result(
        format!("moat refused to run the command: {reason}"),
        moat_runtime::ExecutionResult::refused_request(reason, code).to_value(),
        true,
    )
}

/// A call's execution, for cancelling it when the client abandons the call
/// (before or after it started).
#[derive(Default)]
struct Abandon {
    id: Mutex<Option<String>>,
    gone: AtomicBool,
}

impl Abandon {
    /// The client gave up: cancel the execution if it started.
    fn abandon(&self, service: &Service) {
        self.gone.store(true, Ordering::SeqCst);
        let id = self.id.lock().ok().and_then(|g| g.clone());
        if let Some(id) = id {
            let _ = service.cancel(&id, 0);
        }
    }

    /// The execution `id` started: cancel it at once if the client already gave up.
    fn started(&self, id: &str, service: &Service) {
        if let Ok(mut g) = self.id.lock() {
            *g = Some(id.to_string());
        }
        if self.gone.load(Ordering::SeqCst) {
            let _ = service.cancel(id, 0);
        }
    }
}

fn call_tool(service: &Arc<Service>, params: &Value, abandon: &Abandon) -> Result<Value, RpcError> {
    let args = &params["arguments"];
    match params["name"].as_str() {
        Some("capabilities") => {
            let caps = crate::serve::capabilities();
            Ok(tool_result(caps.to_string(), caps, false))
        }
        Some("explain_policy") => Ok(match service.explain(args) {
            Ok(v) => tool_result(v.to_string(), v, false),
            Err(e) => refused(&e.message, e.data["code"].as_str().unwrap_or_default()),
        }),
        Some("exec") => Ok(exec_tool(service, args, abandon)),
        other => Err(RpcError::invalid_params(
            "METHOD_NOT_FOUND",
            format!("unknown tool {other:?}: use exec, capabilities or explain_policy"),
        )),
    }
}

fn exec_tool(service: &Arc<Service>, args: &Value, abandon: &Abandon) -> Value {
    let command: Vec<String> = match &args["command"] {
        Value::String(s) => {
            return refused(
                &format!(
                    "command is a shell string ({s:?}); pass an argv array, e.g. [\"ls\", \"-l\"], or to use a shell say so explicitly: [\"bash\", \"-c\", {s:?}]"
                ),
                "INVALID_REQUEST",
            )
        }
        Value::Array(a) => match a.iter().map(|x| x.as_str().map(str::to_string)).collect() {
            Some(c) => c,
            None => return refused("command must be an array of strings", "INVALID_REQUEST"),
        },
        _ => return refused("command (an argv array) is required", "INVALID_REQUEST"),
    };
    let timeout_ms = match crate::service::timeout_ms(args.get("timeout_ms")) {
        Ok(t) => t,
        Err(e) => return refused(&e.message, "INVALID_REQUEST"),
    };
    let env = match crate::serve::env_map(&args["env"]) {
        Ok(e) => e,
        Err(e) => return refused(&e.message, "INVALID_REQUEST"),
    };
    let req = ProtocolRequest {
        command,
        cwd: args["cwd"].as_str().map(str::to_string),
        policy: args.get("policy").cloned(),
        env,
        stdin: match args["stdin"].as_str().unwrap_or_default() {
            "" => moat_runtime::subprocess::StdinSource::Empty,
            s => moat_runtime::subprocess::StdinSource::Bytes(s.as_bytes().to_vec()),
        },
        metadata: None,
        timeout_ms,
        keep_output: true,
    };
    let started: Arc<Mutex<Option<Result<String, RpcError>>>> = Arc::new(Mutex::new(None));
    {
        let started = started.clone();
        service.execute(
            req,
            0,
            |r| {
                let r = r.map(|v| v["execution_id"].as_str().unwrap_or_default().to_string());
                if let Ok(id) = &r {
                    abandon.started(id, service);
                }
                if let Ok(mut s) = started.lock() {
                    *s = Some(r);
                }
            },
            None,
            None,
        );
    }
    // `execute` follows the run to its end on this thread.
    let outcome = started.lock().ok().and_then(|mut s| s.take());
    let id = match outcome {
        Some(Ok(id)) => id,
        Some(Err(e)) => return refused(&e.message, e.data["code"].as_str().unwrap_or_default()),
        None => return refused("the execution did not start", "INTERNAL_ERROR"),
    };
    service.wait(&id);
    // Taken, not read: the call returns the output, no one can ask for it
    // again, and a session of calls kept up to 2 MiB of output each.
    let result = service.take_finished(&id, 0).map(|r| {
        let mut v = r.result();
        v.stdout = Some(String::from_utf8_lossy(&r.stdout).into_owned());
        v.stderr = Some(String::from_utf8_lossy(&r.stderr).into_owned());
        v
    });
    match result {
        Ok(v) => {
            let text = model_text(&v);
            let is_error = v.exit_code != Some(0);
            tool_result(text, v.to_value(), is_error)
        }
        Err(e) => refused(&e.message, "INTERNAL_ERROR"),
    }
}

/// The result written for a model: output, exit code, and each refusal
/// with what would grant it.
fn model_text(v: &moat_runtime::ExecutionResult) -> String {
    let mut t = String::new();
    let stdout = v.stdout.as_deref().unwrap_or_default();
    let stderr = v.stderr.as_deref().unwrap_or_default();
    if !stdout.is_empty() {
        t.push_str(&format!("stdout:\n{stdout}\n"));
    }
    if !stderr.is_empty() {
        t.push_str(&format!("stderr:\n{stderr}\n"));
    }
    if v.timed_out {
        t.push_str("the command was stopped: it ran past its timeout\n");
    }
    match v.exit_code {
        Some(c) => t.push_str(&format!("exit code: {c}\n")),
        None => t.push_str("exit code: none\n"),
    }
    if let Some(Some(reason)) = &v.reason {
        t.push_str(&format!("moat: {reason}\n"));
    }
    for d in v.denials.iter().flatten() {
        t.push_str(&format!("refused by the sandbox: {}\n", d.line_for_model()));
    }
    t
}
