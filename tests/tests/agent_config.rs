//! moat for a normal agent day, configuration side (issue 10 items 2, 5, 9,
//! the one flag table; issue 8 §6 upstream-proxy credentials, MOAT_ARGS
//! coverage on resolved paths, the exit-code contract).
//!
//! Each fixture has its own XDG_CONFIG_HOME / XDG_STATE_HOME. Assertions are
//! on side effects: host files unchanged, secrets' bytes absent, what a
//! local listener received, exit codes.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moat_conformance::*;

/// A fixture with per-test XDG config/state directories.
struct Cx {
    fx: Fixture,
    cfg: PathBuf,
    state: PathBuf,
}

impl Cx {
    fn new() -> Cx {
        let fx = Fixture::new();
        let cfg = fx.root.join("xdg-config");
        let state = fx.root.join("xdg-state");
        std::fs::create_dir_all(cfg.join("moat")).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        Cx { fx, cfg, state }
    }

    fn moat<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.fx.moat(args);
        c.env("XDG_CONFIG_HOME", &self.cfg)
            .env("XDG_STATE_HOME", &self.state);
        c
    }
}

fn assert_has(out: &Out, needle: &str, what: &str) {
    assert!(
        out.all().contains(needle),
        "{what}: {needle:?} missing\n{}",
        out.dump()
    );
}

// ------------------------------------------------- item 2: moat-built paths

#[test]
fn moat_built_paths_are_readable_at_workspace_contained() {
    let cx = Cx::new();
    let out = run(cx.moat([
        "run",
        "--policy",
        "workspace-contained",
        "sh",
        "-c",
        "head -c 1 /moat/shims.json >/dev/null && echo SHIMS_READ; \
         test -r /moat/bin/moat && echo BIN_READ; \
         git --version; echo x > /moat/shims.json || echo WRITE_REFUSED",
    ]));
    out.expect_code(0);
    out.expect_stdout_has("SHIMS_READ");
    out.expect_stdout_has("BIN_READ");
    // The git shim ran the real git, not moat's own command line.
    out.expect_stdout_has("git version");
    out.expect_stdout_has("WRITE_REFUSED");
    out.expect_absent("unrecognized subcommand", "a shim ran moat's CLI");
    // The hint for a moat-built path names no flag that would not help.
    let hint = out
        .stderr
        .lines()
        .find(|l| l.contains("/moat/shims.json") && l.starts_with("moat: denied"))
        .unwrap_or_else(|| panic!("no hint for /moat/shims.json\n{}", out.dump()));
    assert!(!hint.contains("--rw"), "{hint}");
    assert!(hint.contains("built by moat"), "{hint}");
}

// ------------------------------------------------- item 9: workspace under /tmp

/// A workspace directly under the host's /tmp, with a sibling holding a
/// secret and a program; removed on drop.
struct TmpWs {
    root: PathBuf,
    ws: PathBuf,
    sib: PathBuf,
}

impl TmpWs {
    fn new() -> TmpWs {
        let root = PathBuf::from("/tmp").join(unique("agentcfg"));
        let ws = root.join("ws");
        let sib = root.join("sib");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&sib).unwrap();
        TmpWs { root, ws, sib }
    }
}

impl Drop for TmpWs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[test]
fn tmp_workspace_keeps_hints_nested_runs_and_names_missing_programs() {
    let cx = Cx::new();
    let t = TmpWs::new();
    let secret = unique("TMPSIBSECRET");
    write(t.sib.join("f"), &secret);
    write(t.sib.join("prog"), "#!/bin/sh\necho PROG_RAN\n");
    std::fs::set_permissions(
        t.sib.join("prog"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    for level in ["read-only", "workspace-write", "workspace-contained"] {
        let script =
            format!("cat ../sib/f; echo PROBE_DONE; moat exec --policy {level} -- echo NESTED_OK");
        let mut c = cx.moat(["exec", "--policy", level, "--", BASH, "-c", &script]);
        c.current_dir(&t.ws);
        let out = run(c);
        out.expect_stdout_has("PROBE_DONE");
        out.expect_absent(&secret, "the host's /tmp sibling");
        // A nested run from the workspace is not "private to the outer sandbox".
        out.expect_stdout_has("NESTED_OK");
        out.expect_absent("private to the outer sandbox", "nested run refused");
        // The refusal is explained, with the flag that shows the path.
        let f = t.sib.join("f");
        assert_has(&out, &format!("denied access {}", f.display()), level);
        assert_has(&out, &format!("--ro {}", f.display()), level);

        // A program under the host's /tmp: named, with where it is and why.
        let mut c = cx.moat(["exec", "--policy", level, "--", "../sib/prog"]);
        c.current_dir(&t.ws);
        let out = run(c);
        out.expect_code(127);
        out.expect_absent("PROG_RAN", "the program is outside the view");
        assert_has(&out, "../sib/prog: not found in the sandbox's view", level);
        assert_has(&out, &format!("--ro {}", t.sib.display()), level);
    }
    // A write into a read-only workspace under /tmp is explained like any
    // other (the sandbox's own /tmp is writable; the workspace bound there
    // is not), and the file is not created on the host.
    let mut c = cx.moat(["exec", "--policy", "read-only", "--", BASH, "-c"]);
    c.arg("touch notes.txt; echo TOUCH_RC=$?");
    c.current_dir(&t.ws);
    let out = run(c);
    assert_eq!(
        out.field("TOUCH_RC").as_deref(),
        Some("1"),
        "{}",
        out.dump()
    );
    assert!(!t.ws.join("notes.txt").exists(), "{}", out.dump());
    let notes = t.ws.join("notes.txt");
    assert_has(
        &out,
        &format!("denied write {}", notes.display()),
        "read-only",
    );
}

// ------------------------------------------------- one flag table, exit codes

#[test]
fn bad_invocations_exit_125_help_exits_0_contract() {
    let cx = Cx::new();
    for args in [
        vec!["exec", "--bogus", "--", "true"],
        vec!["exec", "--policy", "yolo", "--", "true"],
        vec!["exec", "--network", "open", "--", "true"],
        vec!["exec", "--timeout", "soon", "--", "true"],
        vec![
            "exec",
            "--allow-domain",
            "*",
            "--network",
            "proxy",
            "--",
            "true",
        ],
        vec!["exec", "--", "true", "--json-not-here"],
        vec!["exec"],
        vec!["run", "--bogus", "git", "status"],
        vec!["run", "--policy", "yolo", "git", "status"],
        vec!["explain-policy", "--network", "open"],
        vec!["frobnicate"],
        vec![],
    ] {
        let out = run(cx.moat(&args));
        if args == ["exec", "--", "true", "--json-not-here"] {
            // After `--` everything is the command's: it runs.
            out.expect_code(0);
            continue;
        }
        assert_eq!(out.code, Some(125), "{args:?}\n{}", out.dump());
    }
    for args in [
        vec!["--help"],
        vec!["exec", "--help"],
        vec!["run", "--help"],
        vec!["--version"],
    ] {
        run(cx.moat(&args)).expect_code(0);
    }
}

#[test]
fn run_help_describes_every_flag_contract() {
    let cx = Cx::new();
    let out = run(cx.moat(["run", "--help"]));
    out.expect_code(0);
    for (flag, words) in [
        ("--ro <PATH>", "read-only"),
        ("--rw <PATH>", "read-write"),
        ("--env <K=V>", "environment variable"),
        ("--pass-env <NAME>", "host environment variable"),
        ("--timeout <DURATION>", "process tree"),
        ("--allow-domain <PATTERN>", "may reach"),
        ("--upstream-proxy <URL>", "HTTP proxy"),
        ("--audit-log <PATH>", "Audit log"),
        ("--dry-run", "resolved grants"),
    ] {
        let line_idx = out
            .stdout
            .lines()
            .position(|l| l.trim_start().starts_with(flag))
            .unwrap_or_else(|| panic!("{flag} missing\n{}", out.stdout));
        let text: String = out
            .stdout
            .lines()
            .skip(line_idx)
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(text.contains(words), "{flag} has no help: {text}");
    }
}

#[test]
fn short_level_names_mean_the_same_in_exec_run_and_explain_contract() {
    let cx = Cx::new();
    let hash = |args: &[&str]| {
        let out = run(cx.moat(args));
        out.expect_code(0);
        out.json()["policy_hash"].as_str().unwrap().to_string()
    };
    assert_eq!(
        hash(&["explain-policy", "--policy", "ro"]),
        hash(&["explain-policy", "--policy", "read-only"])
    );
    assert_eq!(
        hash(&["explain-policy", "--policy", "rw"]),
        hash(&["explain-policy", "--policy", "workspace-write"])
    );
    run(cx.moat(["exec", "--policy", "ro", "--", "true"])).expect_code(0);
    run(cx.moat(["exec", "--policy", "contained", "--", "true"])).expect_code(0);
    let out = run(cx.moat(["run", "--policy", "ro", "--dry-run", "git", "status"]));
    out.expect_code(0);
    assert_has(&out, "read-only", "run --policy ro");
    // --upstream-proxy is a flag of `moat run`, not a tool name.
    let out = run(cx.moat([
        "run",
        "--network",
        "proxy",
        "--upstream-proxy",
        "http://127.0.0.1:9",
        "--dry-run",
        "git",
        "status",
    ]));
    out.expect_code(0);
    assert_has(&out, "upstream_proxy", "the resolved grants show it");
}

// ------------------------------------------------- MOAT_ARGS on resolved paths

#[test]
fn moat_args_symlink_inside_a_grant_cannot_widen_it() {
    let cx = Cx::new();
    let proj = cx.fx.home.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    let bashrc = cx.fx.home.join(".bashrc");
    write(&bashrc, "# host rc\n");
    std::os::unix::fs::symlink(&bashrc, proj.join("link")).unwrap();
    write(
        cx.cfg.join("moat/config.toml"),
        "[tools.sh]\nrw = [\"~/proj\"]\n",
    );
    let script = format!("echo PWNED >> {}; echo RAN", bashrc.display());
    let mut c = cx.moat(["run", "sh", "-c", &script]);
    c.env("MOAT_ARGS", "--rw ~/proj/link");
    let out = run(c);
    out.expect_code(125);
    out.expect_absent("RAN\n", "the command ran");
    assert_has(&out, "resolves to", "the refusal names the resolved path");
    assert_eq!(
        read(&bashrc).as_deref(),
        Some("# host rc\n"),
        "{}",
        out.dump()
    );

    // Control: a real subdirectory of the grant is accepted.
    std::fs::create_dir_all(proj.join("sub")).unwrap();
    let mut c = cx.moat(["run", "sh", "-c", "echo RAN"]);
    c.env("MOAT_ARGS", "--rw ~/proj/sub");
    run(c).expect_code(0).expect_stdout_has("RAN");
}

// ------------------------------------------------- upstream proxy credentials

/// A fake upstream proxy: records each request head, answers 502.
fn fake_upstream() -> (u16, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { break };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            let mut head = Vec::new();
            let mut b = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&b[..n]),
                }
            }
            s2.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&head).into_owned());
            let _ = conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n");
        }
    });
    (port, seen)
}

fn basic(user_pass: &str) -> String {
    // Base64 without a dependency: the test's alphabet is small.
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = user_pass.as_bytes();
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn upstream_proxy_credentials_never_reach_argv_or_the_sandbox() {
    let cx = Cx::new();
    let secret = unique("PROXYPW");
    // On the command line: refused, and the refusal does not echo it.
    let url = format!("http://me:{secret}@127.0.0.1:9");
    let out = run(cx.moat([
        "exec",
        "--network",
        "proxy",
        "--upstream-proxy",
        &url,
        "--",
        "true",
    ]));
    out.expect_code(125);
    out.expect_absent(&secret, "the refusal echoed the credentials");
    assert_has(&out, "MOAT_UPSTREAM_PROXY_AUTH", "it says where they go");

    // From the environment and from a file: used for the upstream, and
    // absent from everything the command can read.
    let auth_file = cx.fx.root.join("proxy-auth");
    let file_secret = unique("FILEPW");
    write(&auth_file, &format!("fileuser:{file_secret}\n"));
    for via_file in [false, true] {
        let (port, seen) = fake_upstream();
        let upstream = format!("http://127.0.0.1:{port}");
        let mut args = vec![
            "exec",
            "--policy",
            "workspace-write",
            "--network",
            "proxy",
            "--allow-domain",
            "example.com:443",
            "--upstream-proxy",
            &upstream,
        ];
        let file_arg = auth_file.to_string_lossy().into_owned();
        if via_file {
            args.extend(["--upstream-proxy-auth-file", &file_arg]);
        }
        let script = "tr '\\0' ' ' < /proc/1/cmdline && echo CMDLINE_READ; cat /proc/1/environ 2>/dev/null | tr '\\0' ' '; echo; \
                      env; echo PROBE_DONE; curl -sS -m 20 -o /dev/null https://example.com/ ; echo CURL_DONE";
        args.extend(["--", BASH, "-c", script]);
        let mut c = cx.moat(&args);
        c.env("MOAT_UPSTREAM_PROXY_AUTH", format!("envuser:{secret}"));
        let out = run(c);
        out.expect_stdout_has("PROBE_DONE");
        out.expect_stdout_has("CURL_DONE");
        // The init's command line was read, without secrets.
        out.expect_stdout_has("CMDLINE_READ");
        out.expect_absent(&secret, "env credentials inside the sandbox");
        out.expect_absent(&file_secret, "file credentials inside the sandbox");
        let heads = seen.lock().unwrap().clone();
        let want = if via_file {
            basic(&format!("fileuser:{file_secret}"))
        } else {
            basic(&format!("envuser:{secret}"))
        };
        assert!(
            heads
                .iter()
                .any(|h| h.starts_with("CONNECT example.com:443") && h.contains(&want)),
            "the upstream saw no authenticated CONNECT: {heads:?}\n{}",
            out.dump()
        );
    }
}

// ------------------------------------------------- item 5: the user's own configuration

#[test]
fn user_tool_configuration_arrives_without_its_credentials() {
    let cx = Cx::new();
    let h = &cx.fx.home;
    let npm_secret = &cx.fx.netrc_secret;
    let pip_secret = unique("PIPSECRET");
    let env_secret = unique("ENVSECRET");
    let git_secret = unique("GITSECRET");
    write(
        h.join(".npmrc"),
        &format!(
            "registry=https://npm.corp.example/\nfund=false\ninit-author-name=Ada\n\
             //npm.corp.example/:_authToken={npm_secret}\n_password={npm_secret}\n"
        ),
    );
    write(
        h.join(".config/pip/pip.conf"),
        &format!("[global]\nindex-url = https://me:{pip_secret}@pypi.corp.example/simple\n"),
    );
    write(
        h.join(".gitconfig"),
        &format!(
            "[user]\n\tname = Ada Lovelace\n\temail = ada@example.com\n\
             [http]\n\textraHeader = Authorization: Bearer {git_secret}\n"
        ),
    );
    let script = format!(
        "cat ~/.npmrc ~/.config/pip/pip.conf ~/.gitconfig; \
         echo \"GIT_NAME=$(git config user.name)\"; env; \
         cat {h}/.npmrc {h}/.config/pip/pip.conf 2>&1; echo PROBE_DONE",
        h = h.display()
    );
    for level in ["read-only", "workspace-write", "workspace-contained"] {
        let mut c = cx.fx.sh(level, &[], &script);
        c.env(
            "PIP_INDEX_URL",
            format!("https://u:{env_secret}@pypi.corp.example/simple"),
        )
        .env("NPM_CONFIG_FUND", "false")
        .env("NPM_CONFIG__AUTH", &env_secret)
        .env("GIT_AUTHOR_NAME", "Ada Lovelace");
        let out = run(c);
        out.expect_stdout_has("PROBE_DONE");
        // Where code comes from and who commits reach the tool…
        for kept in [
            "registry = https://npm.corp.example/",
            "fund = false",
            "init-author-name = Ada",
            "index-url = https://pypi.corp.example/simple",
            "GIT_NAME=Ada Lovelace",
            "PIP_INDEX_URL=https://pypi.corp.example/simple",
            "NPM_CONFIG_FUND=false",
            "GIT_AUTHOR_NAME=Ada Lovelace",
        ] {
            assert!(
                out.stdout.contains(kept),
                "{level}: {kept} missing\n{}",
                out.dump()
            );
        }
        // …the credentials in it do not, from the files or the environment.
        for secret in [npm_secret.as_str(), &pip_secret, &env_secret, &git_secret] {
            out.expect_absent(secret, level);
        }
    }
    // `moat run --dry-run` says what reaches the tool and what was kept out.
    let out = run(cx.moat(["run", "--dry-run", "sh", "-c", "true"]));
    out.expect_code(0);
    out.expect_stdout_has(
        "user_config: ~/.npmrc (removed: //npm.corp.example/:_authToken, _password)",
    );
    out.expect_stdout_has("user_config: ~/.config/pip/pip.conf (removed: userinfo of index-url)");
    out.expect_absent(npm_secret, "dry-run");
    out.expect_absent(&pip_secret, "dry-run");
}

/// Every npm auth form in `~/.npmrc` (per-path `_authToken`, `_auth`,
/// `username` + `_password`, `email`, `certfile`/`keyfile` and the key file
/// they name), the project's own `.npmrc` and `.yarnrc.yml`
/// (`npmAuthToken`) in the workspace, and the
/// registry tokens cargo and uv read from their TOML configs (`~/.cargo/
/// config.toml`, the workspace's `.cargo/config.toml` and `uv.toml`, uv's
/// `~/.config/uv/uv.toml`): absent inside, at every level, while the
/// registry settings the tools need stay.
#[test]
fn every_registry_auth_form_is_kept_out_while_registry_settings_stay() {
    let cx = Cx::new();
    let (h, w) = (&cx.fx.home, &cx.fx.ws);
    let t: Vec<String> = (0..12).map(|i| unique(&format!("REG{i}x"))).collect();
    write(
        h.join(".npmrc"),
        &format!(
            "registry=https://npm.corp.example/\n@corp:registry=https://npm.corp.example/path/\n\
             //npm.corp.example/path/:_authToken={}\n//npm.corp.example/:_auth={}\n\
             //npm.corp.example/:username={}\n//npm.corp.example/:_password={}\n\
             //npm.corp.example/:email={}@corp.example\n\
             //npm.corp.example/:certfile=~/.npmcerts/c.pem\n//npm.corp.example/:keyfile=~/.npmcerts/k.pem\n",
            t[0], t[1], t[2], t[3], t[4]
        ),
    );
    write(
        h.join(".npmcerts/k.pem"),
        &format!("-----BEGIN PRIVATE KEY-----\n{}\n", t[5]),
    );
    write(
        w.join(".npmrc"),
        &format!(
            "save-exact=true\n//registry.npmjs.org/:_authToken={}\n",
            t[6]
        ),
    );
    write(
        h.join(".cargo/config.toml"),
        &format!(
            "[build]\njobs = 2\n[registries.corp]\nindex = \"sparse+https://u:{}@cargo.corp.example/\"\ntoken = \"{}\"\n",
            t[7], t[8]
        ),
    );
    write(
        w.join(".cargo/config.toml"),
        &format!("[net]\nretry = 3\n[registry]\ntoken = \"{}\"\n", t[9]),
    );
    write(
        w.join("uv.toml"),
        &format!(
            "native-tls = true\n[[index]]\nurl = \"https://x:{}@pypi.corp.example/simple\"\n",
            t[10]
        ),
    );
    write(
        w.join(".yarnrc.yml"),
        &format!(
            "nodeLinker: node-modules\nnpmScopes:\n  corp:\n    npmRegistryServer: \"https://npm.corp.example\"\n    npmAuthToken: {}\n",
            t[11]
        ),
    );
    let script = format!(
        "echo PROBE_RAN; cat ~/.npmrc {h}/.npmrc {h}/.npmcerts/k.pem .npmrc {h}/.cargo/config.toml \
         .cargo/config.toml uv.toml .yarnrc.yml 2>&1; echo PROBE_DONE",
        h = h.display()
    );
    for level in ["read-only", "workspace-write", "workspace-contained"] {
        let out = run(cx.fx.sh(level, &[], &script));
        out.expect_stdout_has("PROBE_DONE");
        for kept in [
            "registry = https://npm.corp.example/",
            "@corp:registry = https://npm.corp.example/path/",
            "save-exact = true",
            "retry = 3",
            "native-tls = true",
            "url = \"https://pypi.corp.example/simple\"",
            "nodeLinker: node-modules",
            "    npmRegistryServer: \"https://npm.corp.example\"",
        ] {
            assert!(
                out.stdout.contains(kept),
                "{level}: {kept} missing\n{}",
                out.dump()
            );
        }
        if level != "workspace-contained" {
            out.expect_stdout_has("index = \"sparse+https://cargo.corp.example/\"");
        }
        for (i, secret) in t.iter().enumerate() {
            out.expect_absent(secret, &format!("{level}: registry credential #{i}"));
        }
    }
}

/// npm's per-path auth (`//host/PATH/:_authToken`) is npm's scope for the
/// token: the proxy adds it only to requests below that path, never to the
/// rest of the host (another tenant's registry on a shared host, an
/// endpoint that echoes headers back). A second token scoped to a deeper
/// path wins there, as npm picks the longest match.
#[test]
fn npm_per_path_registry_auth_stays_scoped_to_its_path() {
    let cx = Cx::new();
    let (port, seen) = fake_upstream();
    let (outer, inner) = (unique("NPMOUTER"), unique("NPMINNER"));
    write(
        cx.fx.home.join(".npmrc"),
        &format!(
            "registry=http://127.0.0.1:{port}/npm/
             //127.0.0.1:{port}/npm/:_authToken={outer}
             //127.0.0.1:{port}/npm/team/:_authToken={inner}
"
        ),
    );
    let allow = format!("127.0.0.1:{port}");
    let script = format!(
        "cat ~/.npmrc; for p in npm/left-pad npm/team/x npmish/y other/z; do \
         {curl} -sS -m 20 -o /dev/null http://127.0.0.1:{port}/$p; done; echo PROBE_DONE",
        curl = "/usr/bin/curl"
    );
    let out = run(cx.fx.sh(
        "workspace-write",
        &["--network", "proxy", "--allow-domain", &allow],
        &script,
    ));
    out.expect_stdout_has("PROBE_DONE");
    out.expect_absent(&outer, "the npm token inside the sandbox");
    out.expect_absent(&inner, "the npm token inside the sandbox");
    let heads = seen.lock().unwrap().clone();
    let head = |p: &str| {
        heads
            .iter()
            .find(|h| h.starts_with(&format!("GET /{p} ")))
            .cloned()
            .unwrap_or_else(|| panic!("no /{p} request: {heads:?}\n{}", out.dump()))
    };
    assert!(
        head("npm/left-pad").contains(&format!("Bearer {outer}")),
        "{heads:?}"
    );
    let team = head("npm/team/x");
    assert!(
        team.contains(&format!("Bearer {inner}")) && !team.contains(&outer),
        "{team}"
    );
    for p in ["npmish/y", "other/z"] {
        let h = head(p);
        assert!(
            !h.contains(&outer) && !h.contains(&inner),
            "a token scoped to /npm/ went to /{p}: {h}"
        );
    }
}

// ------------------------------------------------- smaller: a closed pipe is no panic

#[test]
fn output_into_a_closed_pipe_is_not_a_panic_contract() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let cx = Cx::new();
    for args in [
        vec!["profile", "show", "git"],
        vec!["run", "--dry-run", "git", "status"],
        vec!["profile", "list"],
        vec!["explain-policy"],
    ] {
        let mut fds = [0i32; 2];
        // SAFETY: pipe writes two fds into the array we own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both fds are fresh and owned here; the read end is closed
        // at once, so every write to the other end fails with EPIPE.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(read_end);
        let mut c = cx.moat(&args);
        c.stdout(write_end).stderr(std::process::Stdio::piped());
        let out = c.output().expect("run moat");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_ne!(out.status.code(), Some(101), "{args:?}: {stderr}");
    }
}

#[test]
fn plain_http_registry_credentials_are_added_by_the_proxy_not_shown() {
    let cx = Cx::new();
    let secret = unique("REGSECRET");
    let token = unique("NPMTOKEN");
    let (port, seen) = fake_upstream();
    write(
        cx.fx.home.join(".config/pip/pip.conf"),
        &format!("[global]\nindex-url = http://me:{secret}@127.0.0.1:{port}/simple\n"),
    );
    let allow = format!("127.0.0.1:{port}");
    let script = format!(
        "cat ~/.config/pip/pip.conf; env; \
         {curl} -sS -m 20 -o /dev/null http://127.0.0.1:{port}/simple/left-pad/; \
         {curl} -sS -m 20 -o /dev/null -H 'Authorization: Bearer {token}' http://127.0.0.1:{port}/own/; \
         echo PROBE_DONE",
        curl = "/usr/bin/curl"
    );
    let out = run(cx.fx.sh(
        "workspace-write",
        &["--network", "proxy", "--allow-domain", &allow],
        &script,
    ));
    out.expect_stdout_has("PROBE_DONE");
    out.expect_stdout_has(&format!("index-url = http://127.0.0.1:{port}/simple"));
    out.expect_absent(&secret, "the registry password inside the sandbox");
    let heads = seen.lock().unwrap().clone();
    let want = format!("Authorization: Basic {}", basic(&format!("me:{secret}")));
    assert!(
        heads
            .iter()
            .any(|h| h.starts_with("GET /simple/left-pad/") && h.contains(&want)),
        "the registry did not get the user's credential: {heads:?}\n{}",
        out.dump()
    );
    // A request that brings its own Authorization keeps it, alone.
    let own = heads
        .iter()
        .find(|h| h.starts_with("GET /own/"))
        .unwrap_or_else(|| panic!("no /own/ request: {heads:?}"));
    assert!(own.contains(&token) && !own.contains(&want), "{own}");
}
