//! Tool profiles from the command line: `moat run TOOL`, shims (moat
//! invoked under a tool's name), `moat profile`, `moat shim`, and project
//! trust (`moat trust`). Resolution lives in `moat-config`; this module
//! reads the world (PATH, HOME, the terminal) and hands a policy to the
//! same run path as `moat exec`.

use std::ffi::OsString;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use moat_config::{
    find_project_file, load_catalogue, load_project, load_user_config, moat_args_from_env,
    render_grants, resolve, resolve_program, session_shims, shimmable_names, user_config_path,
    Catalogue, FlagOrigin, PolicyFlags, ProfileOrigin, ProjectFile, Sources, TrustStore,
};
use moat_policy::Policy;

use crate::exec::{refuse_early, run_resolved, Reporting};
use crate::{ReportArgs, EXIT_MOAT_FAILED};

/// `moat run` flags: the same policy flags as `moat exec` (one table,
/// [`PolicyFlags`]); an absent flag lets the profile decide.
#[derive(Args, Clone, Default)]
pub struct RunArgs {
    #[command(flatten)]
    pub policy: PolicyFlags,
    #[command(flatten)]
    pub report: ReportArgs,
    /// Print the resolved grants and where each came from, and do not run
    #[arg(long)]
    pub dry_run: bool,
    /// The tool (a profile name) and its arguments
    #[arg(required = true, trailing_var_arg = true, value_name = "TOOL")]
    pub tool_and_args: Vec<OsString>,
}

#[derive(Subcommand)]
pub enum ProfileCommand {
    /// List the profiles (built in, and yours in ~/.config/moat/profiles)
    List,
    /// Show a tool's resolved grants, where each came from, and the policy hash
    Show {
        tool: String,
        /// The subcommand to resolve for (e.g. `fetch` for git)
        subcommand: Option<String>,
    },
    /// Validate a profile file without running anything
    Check { file: PathBuf },
}

#[derive(Subcommand)]
pub enum ShimCommand {
    /// Put a symlink named TOOL pointing at moat in the shim directory (default ~/.local/bin)
    Install {
        #[arg(required = true)]
        tools: Vec<String>,
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// List installed shims
    List {
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Remove shims
    Remove {
        #[arg(required = true)]
        tools: Vec<String>,
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"))
}

fn config_dir() -> Option<PathBuf> {
    moat_config::config_dir_from_env()
}

fn catalogue() -> Result<Catalogue, String> {
    match config_dir() {
        Some(d) => load_catalogue(&d).map_err(|e| e.to_string()),
        None => Catalogue::builtin().map_err(|e| e.to_string()),
    }
}

fn moat_exe() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|p| std::fs::canonicalize(p).ok())
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn shim_dir(explicit: Option<&Path>) -> PathBuf {
    if let Some(d) = explicit {
        return d.to_path_buf();
    }
    let h = home();
    let cfg = config_dir().and_then(|d| load_user_config(&user_config_path(&d)).ok().flatten());
    match cfg {
        Some(c) => c.shim_dir(&h),
        None => moat_config::default_or_shim_dir(None, &h),
    }
}

/// Loads the project file for `workspace` and makes sure it is trusted:
/// asks on the terminal, or fails closed without one.
fn trusted_project(workspace: &Path) -> Result<Option<ProjectFile>, String> {
    let h = home();
    let Some(path) = find_project_file(workspace, Some(&h)) else {
        return Ok(None);
    };
    let project = load_project(&path, Some(&h)).map_err(|e| e.to_string())?;
    let store = TrustStore::from_env()
        .ok_or("cannot locate the trust store: set HOME or XDG_STATE_HOME")?;
    if store
        .is_trusted(&project.path, &project.digest)
        .map_err(|e| e.to_string())?
    {
        return Ok(Some(project));
    }
    match ask_tty(&render_grants(&project)) {
        Some(true) => {
            store.trust(&project.path, &project.digest).map_err(|e| e.to_string())?;
            Ok(Some(project))
        }
        Some(false) => Err(format!("{} is not trusted; nothing ran", project.path.display())),
        None => Err(format!(
            "{} is not trusted and there is no terminal to ask on; review it and run `moat trust {}`",
            project.path.display(),
            project.root.display()
        )),
    }
}

/// Shows `prompt` on the controlling terminal and reads y/N from it. None
/// when there is no terminal (CI, an agent): the caller fails closed.
fn ask_tty(prompt: &str) -> Option<bool> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()?;
    if !tty.is_terminal() {
        return None;
    }
    let mut w = &tty;
    let _ = w.write_all(prompt.as_bytes());
    let _ = w.flush();
    let mut line = String::new();
    std::io::BufReader::new(&tty).read_line(&mut line).ok()?;
    Some(matches!(line.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

/// Resolves a tool's policy: profile, user config, trusted project file,
/// MOAT_ARGS, flags. Returns the policy, timeout, the real program path and
/// the resolved grants.
fn resolve_tool(
    tool: &str,
    argv1: Option<&str>,
    a: &RunArgs,
    prepare_state: bool,
) -> Result<
    (
        Policy,
        Option<Duration>,
        PathBuf,
        moat_config::Resolved,
        crate::state::StateRun,
    ),
    String,
> {
    let cat = catalogue()?;
    let profile = cat.get(tool).cloned().ok_or_else(|| {
        format!("no profile for {tool:?}; `moat profile list` shows them, or add ~/.config/moat/profiles/{tool}.toml")
    })?;
    let h = home();
    let here =
        std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    let workspace = crate::workspace_of(&a.policy, &here, &h).map_err(|e| format!("{e:#}"))?;
    let shim = shim_dir(None);
    let exe = moat_exe();
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let program = resolve_program(
        &profile.program,
        &path_var,
        Some(&shim),
        is_executable,
        |p| {
            std::fs::canonicalize(p)
                .ok()
                .is_some_and(|c| Some(c) == exe)
        },
    )
    .ok_or_else(|| format!("{} is not on PATH (outside moat's shims)", profile.program))?;
    let user_config = match config_dir() {
        Some(d) => load_user_config(&user_config_path(&d)).map_err(|e| e.to_string())?,
        None => None,
    };
    let sources = Sources {
        flags: Some(
            a.policy
                .to_settings(FlagOrigin::CommandLine { here: &here })
                .map_err(|e| e.to_string())?,
        ),
        moat_args: moat_args_from_env().map_err(|e| e.to_string())?,
        project: trusted_project(&workspace)?,
        user_config,
        profile: Some(profile.clone()),
        defaults: None,
        home: Some(h.clone()),
    };
    let mut resolved = resolve(Some(tool), argv1, sources).map_err(|e| e.to_string())?;
    let home_canon = std::fs::canonicalize(&h).unwrap_or(h.clone());
    // At workspace-contained the view has only the system runtime: a tool
    // installed elsewhere (an npm prefix, ~/.local, rustup under ~) needs its
    // own install tree, read-only, to start at all.
    if resolved.level.value == moat_policy::Level::WorkspaceContained {
        for p in install_tree(&program, &path_var, &home_canon, &shim) {
            let listed = |l: &[moat_config::Sourced<PathBuf>]| l.iter().any(|g| g.value == p);
            if !listed(&resolved.ro) && !listed(&resolved.rw) {
                resolved.ro.push(moat_config::Sourced {
                    value: p,
                    source: moat_config::Source::InstallTree,
                });
            }
        }
    }
    // First-use state: create what the profile declares before the grants
    // are resolved on the host (a missing grant would be dropped), and give
    // files the tool replaces by rename a synced private copy. Only for a
    // real run: `--dry-run` and `profile show` change nothing.
    let state = if resolved.level.value.is_sandboxed() {
        crate::state::prepare(
            &profile,
            &mut resolved,
            &home_canon,
            moat_config::state_dir_from_env().as_deref(),
            prepare_state,
        )?
    } else {
        crate::state::StateRun::default()
    };
    let mut policy =
        crate::finish_policy(&resolved, &a.policy, workspace, &h).map_err(|e| format!("{e:#}"))?;
    // Leaf tools composed inside the session keep their own net class;
    // launchers (shells, interpreters) inherit the session's. The rule
    // lives in `session_shims`.
    let shims = session_shims(&cat, tool);
    policy = with_shims(policy, shims)?;
    policy.synced_home_files = state.synced_files();
    policy.private_home = state.private_home.clone();
    let timeout = policy.timeout_ms.map(Duration::from_millis);
    Ok((policy, timeout, program, resolved, state))
}

/// The install tree of `program` (as found on PATH): what a contained view
/// must show, read-only, for it to start. A toolchain under the home
/// (`moat_policy::HOME_TOOLCHAINS`: rustup's `~/.cargo/bin` needs
/// `~/.rustup` too) as a whole; an npm package from its package root
/// (`…/node_modules/[@scope/]name`, its dependencies included); anything
/// else by its directory. A symlinked program brings its bin directory, and
/// a script its interpreter's tree (`#!/usr/bin/env node` → node's).
fn install_tree(
    program: &Path,
    path_var: &std::ffi::OsStr,
    home: &Path,
    shim: &Path,
) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let add = |p: PathBuf, out: &mut Vec<PathBuf>| {
        let too_broad = p.components().count() < 3 || home.starts_with(&p);
        // Visible at workspace-contained anyway: the system runtime.
        let system = moat_linux::view::SYSTEM_RUNTIME
            .iter()
            .any(|r| p.starts_with(Path::new("/").join(r)));
        if !too_broad && !system && p.exists() && !out.contains(&p) {
            out.push(p);
        }
    };
    let tree_of = |file: &Path, out: &mut Vec<PathBuf>| {
        let Ok(canon) = std::fs::canonicalize(file) else {
            return;
        };
        if let Ok(rel) = canon.strip_prefix(home) {
            if let Some(t) = moat_policy::toolchain_containing(rel) {
                for e in t.entries {
                    add(home.join(e), out);
                }
                return;
            }
        }
        add(moat_linux::explain::program_dir(&canon), out);
    };
    // The program itself, and the bin directory of a symlinked one.
    if program
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        if let Some(bin) = program.parent() {
            add(bin.to_path_buf(), &mut out);
        }
    }
    tree_of(program, &mut out);
    // A script's interpreter.
    let head = std::fs::File::open(program).ok().and_then(|f| {
        use std::io::Read;
        let mut b = [0u8; 256];
        let n = f.take(256).read(&mut b).ok()?;
        let line = String::from_utf8_lossy(&b[..n]).lines().next()?.to_string();
        line.strip_prefix("#!").map(str::to_string)
    });
    if let Some(line) = head {
        let mut words = line.split_whitespace();
        let interp = words.next().map(PathBuf::from);
        let interp = match (interp, words.next()) {
            (Some(e), Some(name)) if e.file_name().is_some_and(|n| n == "env") => {
                std::env::split_paths(path_var)
                    .filter(|d| d.is_absolute() && d != shim)
                    .map(|d| d.join(name))
                    .find(|c| is_executable(c))
            }
            (Some(i), _) => Some(i),
            _ => None,
        };
        if let Some(i) = interp {
            tree_of(&i, &mut out);
        }
    }
    out
}

/// Adds the in-sandbox shims to `policy` (they are part of its hash).
fn with_shims(policy: Policy, shims: Vec<moat_policy::ShimSpec>) -> Result<Policy, String> {
    if !policy.level.is_sandboxed() {
        return Ok(policy);
    }
    let mut p = policy;
    p.shims = {
        let mut s: Vec<moat_policy::ShimSpec> = shims
            .into_iter()
            .filter(|s| !s.name.contains('/') && !s.program.contains('/') && s.name != "moat")
            .collect();
        s.sort();
        s.dedup_by(|a, b| a.name == b.name);
        s
    };
    Ok(p)
}

/// `moat run TOOL [ARGS...]`.
pub fn run(a: RunArgs) -> ExitCode {
    let reporting = Reporting::from(&a.report);
    let mut it = a.tool_and_args.iter();
    let Some(tool) = it.next().map(|t| t.to_string_lossy().into_owned()) else {
        return refuse_early(&reporting, "name a tool: moat run TOOL [ARGS...]");
    };
    let args: Vec<OsString> = it.cloned().collect();
    let argv1 = args.first().map(|s| s.to_string_lossy().into_owned());
    match resolve_tool(&tool, argv1.as_deref(), &a, !a.dry_run) {
        Ok((policy, timeout, program, resolved, state)) => {
            if a.dry_run {
                outln!("{}", resolved.render());
                outln!("program: {}", program.display());
                outln!("policy_hash: {}", policy.hash());
                if policy.level.is_sandboxed() {
                    // Which of the user's own settings the tool will see,
                    // and what was kept out (names only, never values).
                    for c in moat_config::redacted_user_configs(&policy.home) {
                        let removed = if c.removed.is_empty() {
                            String::new()
                        } else {
                            format!(" (removed: {})", c.removed.join(", "))
                        };
                        outln!("user_config: ~/{}{removed}", c.rel.display());
                    }
                }
                return ExitCode::SUCCESS;
            }
            let mut command = vec![program.into_os_string()];
            command.extend(args);
            let code = run_resolved(Ok((policy, timeout)), &reporting, &command, None);
            state.finish();
            code
        }
        Err(e) => refuse_early(&reporting, &e),
    }
}

/// Whether moat, started under `name`, is acting as that tool's shim: a
/// profile of that name exists (or, inside a sandbox, the session's shim
/// table has it). Any other name runs the normal command line.
pub fn is_shim_name(name: &str) -> bool {
    if crate::nested::inside_sandbox() {
        // Inside a sandbox moat only runs under another name through a
        // symlink to it: the session's shims, or shims installed on the host
        // (`moat shim install node`) that a readable host shows. Every such
        // name dispatches; one the table lacks (a launcher) passes through.
        return true;
    }
    names_a_profile(name, config_dir().as_deref())
}

/// Whether `name` is a profile's, from names alone: a built-in, or a user
/// profile file `<config_dir>/profiles/NAME.toml` (a user profile's name
/// must be its file's stem, so no other file can hold it). Parsing the
/// whole catalogue to answer this cost ≈ 2.4 ms of every launch under
/// another name; a shim parses it once, in `run`, which also reports a
/// broken profile file instead of falling through to moat's own command line.
fn names_a_profile(name: &str, config_dir: Option<&Path>) -> bool {
    moat_config::builtin_names().contains(&name)
        || config_dir.is_some_and(|d| {
            moat_config::user_profiles_dir(d)
                .join(format!("{name}.toml"))
                .exists()
        })
}

/// moat invoked under a tool's name (a shim). On the host: `moat run NAME`
/// with MOAT_ARGS. Inside a sandbox: add the tool's net class and exec the
/// real program.
pub fn shim_main(name: &str, args: Vec<OsString>) -> ExitCode {
    if crate::nested::inside_sandbox() {
        return in_sandbox_shim(name, args);
    }
    let mut tool_and_args = vec![OsString::from(name)];
    tool_and_args.extend(args);
    run(RunArgs {
        tool_and_args,
        ..Default::default()
    })
}

fn in_sandbox_shim(name: &str, args: Vec<OsString>) -> ExitCode {
    use std::os::unix::fs::MetadataExt;
    // The table the host wrote into the view when it resolved the session:
    // which program each shim runs and with which class (the user's own
    // profiles included — their files are not visible in here).
    // A session without shims (`moat exec`) has no table: every name passes
    // through. A table that exists but cannot be read or parsed fails closed:
    // running a leaf tool without its class would be a quiet downgrade.
    let table: Vec<moat_policy::ShimSpec> = match std::fs::read_to_string(
        moat_linux::plan::SANDBOX_SHIM_TABLE,
    ) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            eprintln!(
                    "moat: {name}: cannot read the session's shim table {}: {e}; not running {name} without its network class",
                    moat_linux::plan::SANDBOX_SHIM_TABLE
                );
            return ExitCode::from(126);
        }
        Ok(t) => match serde_json::from_str(&t) {
            Ok(v) => v,
            Err(e) => {
                eprintln!(
                    "moat: {name}: the session's shim table {} does not parse: {e}",
                    moat_linux::plan::SANDBOX_SHIM_TABLE
                );
                return ExitCode::from(126);
            }
        },
    };
    // No entry: a launcher (or a name without a profile) reached through a
    // host-installed shim. It passes through with the caller's class, as if
    // the shim were not there.
    let spec = table.into_iter().find(|s| s.name == name);
    let argv1 = args.first().map(|s| s.to_string_lossy().into_owned());
    let class = spec.as_ref().and_then(|s| s.class_for(argv1.as_deref()));
    let wanted = spec.as_ref().map_or(name, |s| s.program.as_str());
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let skip: Vec<PathBuf> = vec![moat_linux::plan::SANDBOX_SHIMS.into(), "/moat/bin".into()];
    // moat itself, by inode: a host shim dir on PATH holds symlinks to the
    // same binary that is bound at /moat/bin/moat; exec'ing one of those
    // would loop back here.
    let me = std::fs::metadata("/proc/self/exe")
        .ok()
        .map(|m| (m.dev(), m.ino()));
    let is_moat = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .is_some_and(|m| Some((m.dev(), m.ino())) == me)
    };
    let program = std::env::split_paths(&path_var)
        .filter(|d| d.is_absolute() && !skip.contains(d))
        .map(|d| d.join(wanted))
        .find(|c| is_executable(c) && !is_moat(c));
    let Some(program) = program else {
        eprintln!("moat: {name}: {wanted} not found in the sandbox's view");
        return ExitCode::from(127);
    };
    if let Some(c) = class {
        if let Err(e) = moat_linux::confine::apply_net_class(c) {
            eprintln!(
                "moat: {name}: cannot apply its network class {}: {e}",
                c.as_str()
            );
            return ExitCode::from(EXIT_MOAT_FAILED);
        }
    }
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(&program)
        .arg0(name)
        .args(args)
        .exec();
    eprintln!("moat: {}: {err}", program.display());
    ExitCode::from(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

pub fn profile(cmd: ProfileCommand) -> ExitCode {
    match cmd {
        ProfileCommand::List => match catalogue() {
            Ok(cat) => {
                for n in cat.names() {
                    let origin = match cat.origin(n) {
                        Some(ProfileOrigin::User(p)) => format!("user {}", p.display()),
                        _ => "built-in".into(),
                    };
                    let desc = cat
                        .get(n)
                        .and_then(|p| p.description.clone())
                        .unwrap_or_default();
                    outln!("{n:<8} {origin:<10} {desc}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        ProfileCommand::Show { tool, subcommand } => {
            let a = RunArgs::default();
            match resolve_tool(&tool, subcommand.as_deref(), &a, false) {
                Ok((policy, _, program, resolved, _)) => {
                    outln!("{}", resolved.render());
                    outln!("program      {}", program.display());
                    outln!("policy_hash  {}", policy.hash());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        ProfileCommand::Check { file } => {
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => return fail(&format!("{}: {e}", file.display())),
            };
            match moat_config::parse_profile(&text, &file.to_string_lossy()) {
                Ok(p) => {
                    for w in &p.warnings {
                        eprintln!("warning: {w}");
                    }
                    outln!("ok: profile {} for program {}", p.name, p.program);
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e.to_string()),
            }
        }
    }
}

pub fn shim(cmd: ShimCommand) -> ExitCode {
    let exe = match moat_exe() {
        Some(e) => e,
        None => return fail("cannot find moat's own binary"),
    };
    match cmd {
        ShimCommand::Install { tools, dir } => {
            let dir = shim_dir(dir.as_deref());
            let cat = match catalogue() {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            let names = shimmable_names(&cat);
            for t in &tools {
                if t == "moat" || t.contains('/') {
                    return fail(&format!("refusing to shim {t:?}: it would shadow moat itself or is not a plain name"));
                }
                if !names.contains(&t.as_str()) {
                    return fail(&format!(
                        "no profile for {t:?}; refusing to shim a tool without a declared boundary"
                    ));
                }
            }
            if let Err(e) = std::fs::create_dir_all(&dir) {
                return fail(&format!("{}: {e}", dir.display()));
            }
            for t in &tools {
                let link = dir.join(t);
                if let Ok(target) = std::fs::read_link(&link) {
                    if std::fs::canonicalize(&target).ok() == Some(exe.clone()) {
                        outln!("{} already shimmed", link.display());
                        continue;
                    }
                }
                if link.symlink_metadata().is_ok() {
                    return fail(&format!(
                        "{} exists and is not a moat shim; remove it first",
                        link.display()
                    ));
                }
                if let Err(e) = std::os::unix::fs::symlink(&exe, &link) {
                    return fail(&format!("{}: {e}", link.display()));
                }
                outln!("{} -> {}", link.display(), exe.display());
            }
            let on_path = std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).any(|d| d == dir))
                .unwrap_or(false);
            if !on_path {
                eprintln!(
                    "note: {} is not on PATH; add it before the real tools' directories",
                    dir.display()
                );
            }
            ExitCode::SUCCESS
        }
        ShimCommand::List { dir } => {
            let dir = shim_dir(dir.as_deref());
            if let Ok(rd) = std::fs::read_dir(&dir) {
                let mut names: Vec<String> = rd
                    .flatten()
                    .filter(|e| {
                        std::fs::read_link(e.path())
                            .ok()
                            .and_then(|t| std::fs::canonicalize(dir.join(t)).ok())
                            == Some(exe.clone())
                    })
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                for n in names {
                    outln!("{}", dir.join(n).display());
                }
            }
            ExitCode::SUCCESS
        }
        ShimCommand::Remove { tools, dir } => {
            let dir = shim_dir(dir.as_deref());
            for t in &tools {
                let link = dir.join(t);
                let ours = std::fs::read_link(&link)
                    .ok()
                    .and_then(|x| std::fs::canonicalize(dir.join(x)).ok())
                    == Some(exe.clone());
                if !ours {
                    return fail(&format!("{} is not a moat shim", link.display()));
                }
                if let Err(e) = std::fs::remove_file(&link) {
                    return fail(&format!("{}: {e}", link.display()));
                }
                outln!("removed {}", link.display());
            }
            ExitCode::SUCCESS
        }
    }
}

/// `moat trust [DIR]`, `moat trust --list`, `moat untrust [DIR]`.
pub fn trust(dir: Option<PathBuf>, list: bool, untrust: bool) -> ExitCode {
    let Some(store) = TrustStore::from_env() else {
        return fail("cannot locate the trust store: set HOME or XDG_STATE_HOME");
    };
    if list {
        return match store.list() {
            Ok(entries) => {
                for (p, e) in entries {
                    outln!("{}  {}  {}", e.trusted_at, e.sha256, p.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e.to_string()),
        };
    }
    let here =
        dir.unwrap_or_else(|| std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")));
    let start = std::fs::canonicalize(&here).unwrap_or(here);
    let Some(path) = find_project_file(&start, Some(&home())) else {
        return fail(&format!(
            "no {} found from {} up to the repository root",
            moat_config::PROJECT_FILE_NAME,
            start.display()
        ));
    };
    if untrust {
        return match store.untrust(&path) {
            Ok(true) => {
                outln!("untrusted {}", path.display());
                ExitCode::SUCCESS
            }
            Ok(false) => {
                outln!("{} was not trusted", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e.to_string()),
        };
    }
    let project = match load_project(&path, Some(&home())) {
        Ok(p) => p,
        Err(e) => return fail(&e.to_string()),
    };
    out!(
        "{}",
        render_grants(&project).trim_end_matches("Trust this project file? [y/N] ")
    );
    outln!();
    match store.trust(&project.path, &project.digest) {
        Ok(()) => {
            outln!("trusted {} at {}", project.path.display(), project.digest);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e.to_string()),
    }
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("moat: {msg}");
    ExitCode::from(EXIT_MOAT_FAILED)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names-only check gives the parsed catalogue's answer: every
    /// built-in and a user's own profile dispatch as a shim, anything else
    /// (moat installed under another name, a tool without a profile) runs
    /// moat's own command line.
    #[test]
    fn a_profile_name_is_found_without_parsing_the_catalogue() {
        let dir = tempfile::tempdir().unwrap();
        let profiles = moat_config::user_profiles_dir(dir.path());
        std::fs::create_dir_all(&profiles).unwrap();
        std::fs::write(
            profiles.join("mytool.toml"),
            "name = \"mytool\"\nlevel = \"read-only\"\n",
        )
        .unwrap();
        let cat = moat_config::load_catalogue(dir.path()).unwrap();
        assert!(cat.get("mytool").is_some(), "the fixture profile parses");
        let mut names: Vec<&str> = cat.names();
        names.extend(["moat-1.2", "my-moat", "notatool", "mytool.toml", "toml"]);
        for name in names {
            assert_eq!(
                names_a_profile(name, Some(dir.path())),
                cat.get(name).is_some(),
                "{name}"
            );
        }
        assert!(
            names_a_profile("git", None),
            "a built-in without a config dir"
        );
        assert!(!names_a_profile("mytool", None));
    }
}
