//! The one table of policy flags. `moat exec`, `moat run`, nested requests
//! and `MOAT_ARGS` all parse through [`PolicyFlags`] (a clap derive struct,
//! flattened into each command) and turn it into one [`Settings`] layer with
//! [`PolicyFlags::to_settings`]. A flag added here exists everywhere, with
//! the same spelling, aliases, value check and help text.

use std::path::{Component, Path, PathBuf};

use clap::{Args, CommandFactory, FromArgMatches, Parser};
use moat_policy::{Access, Level, Limits, LimitsMode, NetworkMode};

use crate::error::ConfigError;
use crate::settings::{
    check_env_name, is_tilde, normalize_lexically, parse_level, PathSpec, Settings,
};

/// The environment variable `--upstream-proxy` credentials are read from
/// (`USER:PASSWORD`). Never argv: a command line is visible in `ps` on the
/// host and in `/proc/*/cmdline` inside the sandbox.
pub const UPSTREAM_AUTH_ENV: &str = "MOAT_UPSTREAM_PROXY_AUTH";

/// Flags of the table that `MOAT_ARGS` may not carry (by clap id): the
/// workspace is where the user stands, and the upstream proxy decides where
/// traffic goes: neither may come from an inherited environment variable.
/// `--limits best-effort` and `--backend` neither: they would turn the
/// user's limits into wishes, or choose a weaker sandbox, from the environment.
pub const NOT_IN_MOAT_ARGS: &[&str] = &[
    "cwd",
    "upstream_proxy",
    "upstream_proxy_auth_file",
    "limits_mode",
    "backend",
];

/// Every policy flag, declared once.
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyFlags {
    /// Sandbox level: read-only, workspace-write, workspace-contained or
    /// danger-full-access (short forms ro, rw, contained, danger). Default:
    /// read-only for `moat exec`, the profile's for `moat run`
    #[arg(long, value_name = "LEVEL", value_parser = level_arg)]
    pub policy: Option<Level>,
    /// Network: disabled (default when sandboxed), proxy (only through moat's
    /// filtering proxy), unmanaged (host network)
    #[arg(long, value_name = "MODE", value_parser = network_arg)]
    pub network: Option<NetworkMode>,
    /// The workspace (default: current directory); the command starts there, at the same path
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Add a host path read-only (repeatable). Naming a protected path exactly opts it in
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<PathBuf>,
    /// Add a host path read-write (repeatable). Naming a protected path exactly opts it in
    #[arg(long = "rw", value_name = "PATH")]
    pub rw: Vec<PathBuf>,
    /// Set an environment variable for the command (repeatable)
    #[arg(long = "env", value_name = "K=V", value_parser = env_arg)]
    pub env: Vec<(String, String)>,
    /// Let a host environment variable through (repeatable); secret-looking names need this
    #[arg(long = "pass-env", value_name = "NAME", value_parser = env_name_arg)]
    pub pass_env: Vec<String>,
    /// Stop the whole process tree after this long: 500ms, 2s, 1m, or seconds
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub timeout: Option<u64>,
    /// With --network proxy: a host the command may reach (repeatable). PATTERN is
    /// example.com, *.example.com (subdomains only), either with :PORT, an IP
    /// literal ([::1]:8080), localhost[:PORT], or a preset: @package-registries =
    /// crates.io static.crates.io index.crates.io pypi.org files.pythonhosted.org
    /// registry.npmjs.org github.com codeload.github.com objects.githubusercontent.com
    /// raw.githubusercontent.com (all :443). No allow entries: nothing is reachable
    #[arg(long = "allow-domain", value_name = "PATTERN", value_parser = domain_arg)]
    pub allow_domain: Vec<String>,
    /// With --network proxy: a host the command may never reach; deny wins over allow (repeatable)
    #[arg(long = "deny-domain", value_name = "PATTERN", value_parser = domain_arg)]
    pub deny_domain: Vec<String>,
    /// With --network proxy: chain allowed connections through this HTTP proxy
    /// (http://host:port). Credentials never go on the command line: put
    /// USER:PASSWORD in $MOAT_UPSTREAM_PROXY_AUTH or in a file named by
    /// --upstream-proxy-auth-file
    #[arg(long = "upstream-proxy", value_name = "URL")]
    pub upstream_proxy: Option<String>,
    /// A file holding USER:PASSWORD for --upstream-proxy (one line)
    #[arg(long = "upstream-proxy-auth-file", value_name = "FILE")]
    pub upstream_proxy_auth_file: Option<PathBuf>,
    /// Confinement backend: namespaces (default), landlock (Landlock +
    /// seccomp only, for hosts without user namespaces; gives less, says
    /// what), auto (namespaces where available, else landlock)
    #[arg(long, value_name = "BACKEND", value_parser = backend_arg)]
    pub backend: Option<moat_policy::Backend>,
    #[command(flatten)]
    pub limits: LimitFlags,
}

fn backend_arg(s: &str) -> Result<moat_policy::Backend, String> {
    moat_policy::Backend::parse(s).ok_or_else(|| "use namespaces, landlock or auto".to_string())
}

/// The resource limits of the table (one group, so `--help` lists them together).
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitFlags {
    /// Memory of the whole run (SIZE: 512M, 2G); a per-run cgroup where the host
    /// gives one, else virtual memory per process (RLIMIT_AS)
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub memory: Option<u64>,
    /// Processes and threads of the run; reaching it ends the run (stops a fork bomb)
    #[arg(long, value_name = "N", value_parser = count_arg)]
    pub pids: Option<u64>,
    /// CPU time per process: 10s, 10m (RLIMIT_CPU; SIGXCPU when reached)
    #[arg(long = "cpu-time", value_name = "DURATION", value_parser = duration_arg)]
    pub cpu_time: Option<u64>,
    /// Largest file a process may write (RLIMIT_FSIZE; SIGXFSZ past it)
    #[arg(long = "file-size", value_name = "SIZE", value_parser = size_arg)]
    pub file_size: Option<u64>,
    /// Open file descriptors per process (RLIMIT_NOFILE)
    #[arg(long = "open-files", value_name = "N", value_parser = count_arg)]
    pub open_files: Option<u64>,
    /// Size of each private tmpfs (/tmp, HOME, /dev/shm); writes past it fail with ENOSPC
    #[arg(long = "tmp-size", value_name = "SIZE", value_parser = size_arg)]
    pub tmp_size: Option<u64>,
    /// stdout + stderr bytes; moat stops the run past it (the output then
    /// passes through moat, so the command gets no terminal)
    #[arg(long = "output-limit", value_name = "SIZE", value_parser = size_arg)]
    pub output_limit: Option<u64>,
    /// A limit this host cannot enforce: strict (default) refuses the run with
    /// exit 125; best-effort runs without it and the result says so
    #[arg(long = "limits", value_name = "MODE", value_parser = limits_mode_arg)]
    pub limits_mode: Option<LimitsMode>,
}

impl LimitFlags {
    /// The limits these flags set (the mode is kept apart: it layers on its own).
    pub fn to_limits(&self) -> Limits {
        Limits {
            memory: self.memory,
            pids: self.pids,
            cpu_time_ms: self.cpu_time,
            file_size: self.file_size,
            open_files: self.open_files,
            tmp_size: self.tmp_size,
            output: self.output_limit,
            ..Limits::default()
        }
    }
}

fn size_arg(s: &str) -> Result<u64, String> {
    moat_policy::parse_size(s).map_err(|e| e.to_string())
}

fn count_arg(s: &str) -> Result<u64, String> {
    moat_policy::parse_count(s).map_err(|e| e.to_string())
}

fn limits_mode_arg(s: &str) -> Result<LimitsMode, String> {
    LimitsMode::parse(s).ok_or_else(|| "use strict or best-effort".to_string())
}

fn level_arg(s: &str) -> Result<Level, String> {
    parse_level(s).ok_or_else(|| {
        "use read-only, workspace-write, workspace-contained or danger-full-access (or ro, rw, contained, danger)".to_string()
    })
}

fn network_arg(s: &str) -> Result<NetworkMode, String> {
    NetworkMode::parse(s).ok_or_else(|| "use disabled, proxy or unmanaged".to_string())
}

fn env_arg(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| "use --env NAME=VALUE".to_string())?;
    check_env_name(k)?;
    if v.contains('\0') {
        return Err("values cannot contain a NUL byte".into());
    }
    Ok((k.to_string(), v.to_string()))
}

fn env_name_arg(s: &str) -> Result<String, String> {
    check_env_name(s)?;
    Ok(s.to_string())
}

fn duration_arg(s: &str) -> Result<u64, String> {
    moat_policy::parse_duration(s).map_err(|e| e.to_string())
}

fn domain_arg(s: &str) -> Result<String, String> {
    moat_policy::net::expand_presets(&[s.to_string()]).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

/// Where a flag set was written: decides how relative paths are read and
/// how errors are labelled.
#[derive(Clone, Copy, Debug)]
pub enum FlagOrigin<'a> {
    /// The command line; relative paths are taken from this directory.
    CommandLine { here: &'a Path },
    /// The `MOAT_ARGS` environment variable: paths must be absolute or `~/…`.
    MoatArgs,
}

/// `scheme://[userinfo@]host…` has a userinfo part.
pub fn url_has_userinfo(url: &str) -> bool {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    authority.contains('@')
}

/// The URL with any userinfo replaced by `***`, for messages.
pub fn url_without_userinfo(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (format!("{s}://"), r),
        None => (String::new(), url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}***@{host}{tail}"),
        None => url.to_string(),
    }
}

impl PolicyFlags {
    /// The flags as one settings layer. Paths keep `~/` (the resolver
    /// expands it); relative command-line paths are joined to `here`.
    pub fn to_settings(&self, origin: FlagOrigin<'_>) -> Result<Settings, ConfigError> {
        let fail = |arg: String, why: &str| match origin {
            FlagOrigin::MoatArgs => ConfigError::MoatArgs {
                arg,
                why: why.to_string(),
            },
            FlagOrigin::CommandLine { .. } => ConfigError::Flag {
                arg,
                why: why.to_string(),
            },
        };
        let mut out = Settings {
            level: self.policy,
            network: self.network,
            timeout_ms: self.timeout,
            limits: self.limits.to_limits(),
            limits_mode: self.limits.limits_mode,
            backend: self.backend,
            ..Settings::default()
        };
        for (flag, list, access) in [
            ("--ro", &self.ro, Access::ReadOnly),
            ("--rw", &self.rw, Access::ReadWrite),
        ] {
            for p in list {
                let shown = format!("{flag} {}", p.display());
                let path = match origin {
                    FlagOrigin::MoatArgs => {
                        if !(p.is_absolute() || is_tilde(p)) {
                            return Err(fail(
                                shown,
                                "write an absolute path or one starting with ~/",
                            ));
                        }
                        if p.components().any(|c| c == Component::ParentDir) {
                            return Err(fail(shown, "write the path without '..'"));
                        }
                        normalize_lexically(p)
                    }
                    FlagOrigin::CommandLine { here } => {
                        if p.as_os_str().is_empty() {
                            return Err(fail(shown, "a path is non-empty"));
                        }
                        if p.is_absolute() || is_tilde(p) {
                            p.clone()
                        } else {
                            here.join(p)
                        }
                    }
                };
                let spec = PathSpec { path, access };
                if let Some(prev) = out.paths.iter().find(|s| s.path == spec.path) {
                    if prev.access != access {
                        return Err(fail(
                            shown,
                            "the same path is given both --ro and --rw; keep one",
                        ));
                    }
                    continue;
                }
                out.paths.push(spec);
            }
        }
        for (k, v) in &self.env {
            out.env.insert(k.clone(), v.clone());
        }
        for k in &self.pass_env {
            if !out.pass_env.contains(k) {
                out.pass_env.push(k.clone());
            }
        }
        for (list, from) in [
            (&mut out.allow_domains, &self.allow_domain),
            (&mut out.deny_domains, &self.deny_domain),
        ] {
            for d in from {
                if !list.contains(d) {
                    list.push(d.clone());
                }
            }
        }
        if let Some(u) = &self.upstream_proxy {
            if url_has_userinfo(u) {
                return Err(fail(
                    format!("--upstream-proxy {}", url_without_userinfo(u)),
                    &format!("credentials on the command line are visible to every process (ps, /proc/PID/cmdline); give the URL without them and put USER:PASSWORD in ${UPSTREAM_AUTH_ENV} or in a file named by --upstream-proxy-auth-file"),
                ));
            }
            out.upstream_proxy = Some(u.clone());
        }
        if self.upstream_proxy_auth_file.is_some() && self.upstream_proxy.is_none() {
            return Err(fail(
                "--upstream-proxy-auth-file".into(),
                "it only applies with --upstream-proxy URL",
            ));
        }
        Ok(out)
    }

    /// The upstream proxy URL with its credentials (from the auth file, else
    /// `env_auth`, the value of [`UPSTREAM_AUTH_ENV`]) put in as userinfo.
    /// `None` without `--upstream-proxy`. Error messages never carry the
    /// credentials.
    pub fn upstream_with_credentials(
        &self,
        env_auth: Option<String>,
    ) -> Result<Option<String>, ConfigError> {
        let Some(url) = &self.upstream_proxy else {
            return Ok(None);
        };
        let fail = |why: String| ConfigError::Flag {
            arg: "--upstream-proxy".into(),
            why,
        };
        let auth = match &self.upstream_proxy_auth_file {
            Some(f) => {
                let text = std::fs::read_to_string(f).map_err(|e| {
                    fail(format!(
                        "cannot read the credentials file {}: {e}",
                        f.display()
                    ))
                })?;
                Some(text.lines().next().unwrap_or("").trim().to_string())
            }
            None => env_auth.filter(|v| !v.is_empty()),
        };
        let Some(auth) = auth else {
            return Ok(Some(url.clone()));
        };
        let Some((user, pass)) = auth.split_once(':') else {
            return Err(fail(format!(
                "the credentials (from {}) must be USER:PASSWORD",
                match &self.upstream_proxy_auth_file {
                    Some(f) => f.display().to_string(),
                    None => format!("${UPSTREAM_AUTH_ENV}"),
                }
            )));
        };
        let (scheme, rest) = url.split_once("://").unwrap_or(("http", url.as_str()));
        Ok(Some(format!(
            "{scheme}://{}:{}@{rest}",
            percent_encode(user),
            percent_encode(pass)
        )))
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The `MOAT_ARGS` line: the flag table and nothing else.
#[derive(Parser, Debug)]
#[command(
    name = "MOAT_ARGS",
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true
)]
struct MoatArgsLine {
    #[command(flatten)]
    flags: PolicyFlags,
}

/// Parses already-split `MOAT_ARGS` words through the flag table.
pub fn parse_moat_args_words(words: &[String]) -> Result<PolicyFlags, ConfigError> {
    let err = |arg: &str, why: String| ConfigError::MoatArgs {
        arg: arg.to_string(),
        why,
    };
    let matches = MoatArgsLine::command()
        .try_get_matches_from(words)
        .map_err(|e| {
            let text = e.render().to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("bad arguments")
                .trim_start_matches("error: ")
                .to_string();
            err(
                &words.join(" "),
                format!("{first}; MOAT_ARGS takes only policy flags"),
            )
        })?;
    for id in NOT_IN_MOAT_ARGS {
        if matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
            let long = MoatArgsLine::command()
                .get_arguments()
                .find(|a| a.get_id() == *id)
                .and_then(|a| a.get_long().map(|l| format!("--{l}")))
                .unwrap_or_else(|| (*id).to_string());
            return Err(err(
                &long,
                "not a flag MOAT_ARGS may carry (the workspace and the upstream proxy come only from the command line)".into(),
            ));
        }
    }
    let line = MoatArgsLine::from_arg_matches(&matches)
        .map_err(|e| err(&words.join(" "), e.to_string()))?;
    Ok(line.flags)
}

/// The long names of every flag in the table (for tests and help).
pub fn policy_flag_names() -> Vec<String> {
    MoatArgsLine::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect()
}

/// The long names `MOAT_ARGS` may carry.
pub fn moat_args_flag_names() -> Vec<String> {
    MoatArgsLine::command()
        .get_arguments()
        .filter(|a| !NOT_IN_MOAT_ARGS.contains(&a.get_id().as_str()))
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_detected_and_hidden() {
        assert!(url_has_userinfo("http://u:pw@proxy:3128"));
        assert!(!url_has_userinfo("http://proxy:3128/a@b"));
        let shown = url_without_userinfo("http://u:hunter2@proxy:3128");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(shown, "http://***@proxy:3128");
    }

    #[test]
    fn credentials_are_refused_on_the_command_line_without_echo() {
        let f = PolicyFlags {
            upstream_proxy: Some("http://me:hunter2@proxy:3128".into()),
            ..Default::default()
        };
        let e = f
            .to_settings(FlagOrigin::CommandLine {
                here: Path::new("/"),
            })
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(e.contains(UPSTREAM_AUTH_ENV), "{e}");
    }

    #[test]
    fn credentials_come_from_the_environment_or_a_file() {
        let f = PolicyFlags {
            upstream_proxy: Some("http://proxy:3128".into()),
            ..Default::default()
        };
        assert_eq!(
            f.upstream_with_credentials(Some("me:p@ss".into())).unwrap(),
            Some("http://me:p%40ss@proxy:3128".into())
        );
        assert_eq!(
            f.upstream_with_credentials(None).unwrap(),
            Some("http://proxy:3128".into())
        );
        let e = f
            .upstream_with_credentials(Some("hunter2".into()))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("auth");
        std::fs::write(&file, "u:secret\n").unwrap();
        let f = PolicyFlags {
            upstream_proxy_auth_file: Some(file),
            ..f
        };
        assert_eq!(
            f.upstream_with_credentials(Some("x:y".into())).unwrap(),
            Some("http://u:secret@proxy:3128".into())
        );
    }

    /// Every flag MOAT_ARGS carries has the same meaning as its key in the
    /// user config and project files: generated from the table, so a new
    /// flag without a file key (or with a different value check) fails.
    #[test]
    fn files_and_flags_mean_the_same() {
        for flag in moat_args_flag_names() {
            let (value, toml) = match flag.as_str() {
                "--policy" => ("ro", "level = \"ro\""),
                "--network" => ("proxy", "network = \"proxy\""),
                "--ro" => ("/usr", "ro = [\"/usr\"]"),
                "--rw" => ("~/.cache/x", "rw = [\"~/.cache/x\"]"),
                "--env" => ("A=b c", "[env]\nA = \"b c\""),
                "--pass-env" => ("CI", "pass_env = [\"CI\"]"),
                "--timeout" => ("2s", "timeout = \"2s\""),
                "--allow-domain" => ("example.com:443", "allow_domains = [\"example.com:443\"]"),
                "--deny-domain" => ("ads.example.com", "deny_domains = [\"ads.example.com\"]"),
                "--memory" => ("2G", "[limits]\nmemory = \"2G\""),
                "--pids" => ("256", "[limits]\npids = 256"),
                "--cpu-time" => ("10m", "[limits]\ncpu_time = \"10m\""),
                "--file-size" => ("1G", "[limits]\nfile_size = \"1G\""),
                "--open-files" => ("1024", "[limits]\nopen_files = 1024"),
                "--tmp-size" => ("512M", "[limits]\ntmp_size = \"512M\""),
                "--output-limit" => ("64M", "[limits]\noutput = \"64M\""),
                "--backend" => ("landlock", "backend = \"landlock\""),
                other => panic!("{other}: give it a file key here (or exclude it from MOAT_ARGS)"),
            };
            let from_args = parse_moat_args_words(&[flag.clone(), value.to_string()])
                .unwrap()
                .to_settings(FlagOrigin::MoatArgs)
                .unwrap();
            let from_file = crate::load::parse_user_config(toml, Path::new("config.toml"))
                .unwrap_or_else(|e| panic!("{flag}: {e}"))
                .defaults;
            assert_eq!(from_args, from_file, "{flag}");
        }
    }

    #[test]
    fn moat_args_carry_every_flag_but_the_excluded() {
        let all = policy_flag_names();
        let carried = moat_args_flag_names();
        for f in &all {
            let excluded = [
                "--cwd",
                "--upstream-proxy",
                "--upstream-proxy-auth-file",
                "--limits",
                "--backend",
            ]
            .contains(&f.as_str());
            assert_eq!(carried.contains(f), !excluded, "{f}");
        }
    }
}
