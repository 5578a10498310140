//! A normal agent day (issue 10): the tools agents actually run work under
//! moat the first time, with the user's own setup. Launchers as package
//! managers install them (`#!/usr/bin/env node`, `#!/usr/bin/env bash`),
//! first-use agent state, toolchains under `~`, and real tools from the
//! registries (`.ci/run` installs them) through `moat run`.
//!
//! Each case checks the effect: the request in moat's proxy log (`--json`
//! network records, which a moat that confines nothing does not produce),
//! the package on disk, the state file on the host after the run.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use moat_conformance::*;

/// A fixture with per-test XDG config/state directories and a bin dir of
/// the fixture's own "installed" tools, first on PATH.
struct Wf {
    fx: Fixture,
    cfg: PathBuf,
    state: PathBuf,
    bin: PathBuf,
}

impl Wf {
    fn new() -> Wf {
        let fx = Fixture::new();
        let cfg = fx.root.join("xdg-config");
        let state = fx.root.join("xdg-state");
        let bin = fx.root.join("prefix/bin");
        for d in [&cfg, &state, &bin] {
            std::fs::create_dir_all(d).unwrap();
        }
        Wf {
            fx,
            cfg,
            state,
            bin,
        }
    }

    fn path_var(&self) -> String {
        format!("{}:{HOST_PATH}", self.bin.display())
    }

    /// `moat ARGS` in the workspace, the fixture's bin dir first on PATH.
    fn moat<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.fx.moat(args);
        c.env("XDG_CONFIG_HOME", &self.cfg)
            .env("XDG_STATE_HOME", &self.state)
            .env("PATH", self.path_var());
        c
    }

    fn profile(&self, name: &str, text: &str) {
        write(
            self.cfg.join("moat/profiles").join(format!("{name}.toml")),
            text,
        );
    }

    /// An executable script at `rel` under the prefix.
    fn script(&self, rel: &str, text: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.fx.root.join("prefix").join(rel);
        write(&p, text);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }
}

/// The `host:port`s moat's proxy saw in a `--json` result, with their decision.
fn proxy_requests(v: &Value) -> Vec<(String, String)> {
    v["network"]["requests"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    (
                        format!("{}:{}", r["host"].as_str().unwrap_or(""), r["port"]),
                        r["decision"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A leaf tool with the network, allowed to reach `allow`.
fn leaf_profile(name: &str, allow: &str) -> String {
    format!(
        "name = \"{name}\"\nprogram = \"{name}\"\nlevel = \"rw\"\nnetwork = \"proxy\"\n\
         allow_domains = [\"{allow}\"]\nnet_class = \"net-connect\"\n"
    )
}

/// Node: one GET through the proxy named in HTTP_PROXY (node's http does
/// not read it itself; npm's own agent does the same).
const NODE_GET: &str = r#"
const net = require('net');
const proxy = new URL(process.env.HTTP_PROXY || process.env.http_proxy);
const target = process.argv[2];
const s = net.connect(Number(proxy.port), proxy.hostname, () => {
  s.write(`GET ${target} HTTP/1.1\r\nHost: ${new URL(target).host}\r\nConnection: close\r\n\r\n`);
});
let buf = '';
s.on('data', d => buf += d);
s.on('end', () => { console.log('NODE_BODY=' + buf.split('\r\n\r\n').slice(1).join('')); });
s.on('error', e => { console.log('NODE_ERR=' + e.code); process.exit(3); });
"#;

/// Python: one GET through the proxy (urllib reads http_proxy).
const PY_GET: &str = "import sys, urllib.request\n\
try:\n    print('PY_BODY=' + urllib.request.urlopen(sys.argv[1], timeout=20).read().decode())\n\
except Exception as e:\n    print('PY_ERR=' + repr(e)); sys.exit(3)\n";

/// `moat run TOOL` where TOOL is installed the way npm and pyenv install
/// tools: a `#!/usr/bin/env node` script behind a bin symlink, and a
/// `#!/usr/bin/env bash` wrapper that runs python3. The launcher (node,
/// bash, python3) inherits the tool's network; before the fix its shim
/// narrowed the session to net-denied (EPERM, the proxy never asked).
#[test]
fn launchers_keep_the_network_of_the_tool_they_start() {
    let w = Wf::new();
    let body = unique("launchbody");
    let srv = HttpServer::fixed(&body);
    let allow = format!("127.0.0.1:{}", srv.port);

    // npm-style: bin/nodetool -> ../lib/node_modules/nodetool/cli.js
    w.script(
        "lib/node_modules/nodetool/cli.js",
        &format!("#!/usr/bin/env node\n{NODE_GET}"),
    );
    std::os::unix::fs::symlink(
        "../lib/node_modules/nodetool/cli.js",
        w.bin.join("nodetool"),
    )
    .unwrap();
    w.profile("nodetool", &leaf_profile("nodetool", &allow));
    // pyenv/asdf-style: a bash wrapper that execs the interpreter.
    w.script("lib/pytool.py", PY_GET);
    w.script(
        "bin/pytool",
        &format!(
            "#!/usr/bin/env bash\nexec python3 {}/lib/pytool.py \"$@\"\n",
            w.fx.root.join("prefix").display()
        ),
    );
    w.profile("pytool", &leaf_profile("pytool", &allow));

    let url = format!("http://127.0.0.1:{}/launched", srv.port);
    let mut bad = Vec::new();
    for (tool, tag) in [("nodetool", "NODE"), ("pytool", "PY")] {
        let out = run(w.moat(["run", "--json", tool, &url]));
        let v = out.json();
        let stdout = v["stdout"].as_str().unwrap_or("").to_string();
        if !stdout.contains(&format!("{tag}_BODY={body}")) {
            bad.push(format!(
                "{tool}: its launcher lost the tool's network: {stdout}\n{}",
                out.dump()
            ));
        }
        if !proxy_requests(&v).contains(&(allow.clone(), "allow".into())) {
            bad.push(format!(
                "{tool}: moat's proxy did not carry the request\n{}",
                out.dump()
            ));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// An agent session granted a host: `bash -c 'curl …'` (the way agents run
/// nearly everything) reaches it through the proxy; `sh -c` and a python
/// started by bash keep the session's network too. A host not granted stays
/// refused (the proxy's decision).
#[test]
fn agent_bash_c_reaches_an_allowed_host_and_nothing_else() {
    let w = Wf::new();
    let body = unique("agentbody");
    let srv = HttpServer::fixed(&body);
    let other = HttpServer::fixed("OTHER");
    let allow = format!("127.0.0.1:{}", srv.port);
    w.profile(
        "agentx",
        "name = \"agentx\"\nprogram = \"bash\"\nlevel = \"rw\"\nnetwork = \"proxy\"\nnet_class = \"net-connect\"\n",
    );
    write(w.fx.w("get.py"), PY_GET);
    let script = format!(
        "echo \"BASH_IS=$(command -v bash)\"\n\
         bash -c 'curl -sS http://127.0.0.1:{p}/via-bash; echo' | sed 's/^/CURL=/'\n\
         sh -c 'python3 get.py http://127.0.0.1:{p}/via-sh'\n\
         bash -c 'curl -sS -o /dev/null -w \"%{{http_code}}\" http://127.0.0.1:{o}/not-granted; echo' | sed 's/^/DENIED=/'\n",
        p = srv.port,
        o = other.port
    );
    let out = run(w.moat([
        "run",
        "--json",
        "--allow-domain",
        &allow,
        "agentx",
        "-c",
        &script,
    ]));
    let v = out.json();
    let stdout = v["stdout"].as_str().unwrap_or("");
    assert!(
        !stdout.contains("BASH_IS=/moat/shims/"),
        "bash is a launcher: no shim narrows it\n{}",
        out.dump()
    );
    assert!(
        stdout.contains(&format!("CURL={body}")),
        "bash -c curl in an agent session granted the host\n{}",
        out.dump()
    );
    assert!(
        stdout.contains(&format!("PY_BODY={body}")),
        "sh -c python3 in the same session\n{}",
        out.dump()
    );
    let reqs = srv.requests();
    assert!(
        reqs.iter().any(|r| r.contains("/via-bash")) && reqs.iter().any(|r| r.contains("/via-sh")),
        "the server saw both requests: {reqs:?}\n{}",
        out.dump()
    );
    assert_eq!(
        other.settled_connections(),
        0,
        "a host the session was not granted stays unreachable\n{}",
        out.dump()
    );
    let got = proxy_requests(&v);
    assert!(
        got.contains(&(allow.clone(), "allow".into()))
            && got
                .iter()
                .any(|(a, d)| a.ends_with(&format!(":{}", other.port)) && d == "deny"),
        "proxy log: {got:?}\n{}",
        out.dump()
    );
}

/// Builds a rustup-like and a pyenv-like install in the fixture's home: a
/// proxy on PATH that finds the real tool through `$HOME` (as rustup's
/// `cargo` finds `~/.rustup`, pyenv's shims `~/.pyenv`).
fn fake_toolchains(w: &Wf) {
    use std::os::unix::fs::PermissionsExt;
    let h = &w.fx.home;
    let exe = |p: PathBuf, text: &str| {
        write(&p, text);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write(
        h.join(".rustup/settings.toml"),
        "default_toolchain = \"stable\"\n",
    );
    exe(
        h.join(".rustup/toolchains/stable/bin/rtool"),
        "#!/bin/sh\necho RTOOL_RAN\n",
    );
    exe(
        h.join(".cargo/bin/rtool"),
        "#!/bin/sh\nr=\"${RUSTUP_HOME:-$HOME/.rustup}\"\n\
         d=$(sed -n 's/^default_toolchain = \"\\(.*\\)\"/\\1/p' \"$r/settings.toml\" 2>/dev/null)\n\
         [ -n \"$d\" ] || { echo 'error: no default is configured'; exit 1; }\n\
         exec \"$r/toolchains/$d/bin/rtool\"\n",
    );
    write(h.join(".pyenv/version"), "3.99\n");
    exe(
        h.join(".pyenv/versions/3.99/bin/ptool"),
        "#!/bin/sh\necho PTOOL_RAN\n",
    );
    exe(
        h.join(".pyenv/shims/ptool"),
        "#!/bin/sh\nexec \"$HOME/.pyenv/versions/$(cat \"$HOME/.pyenv/version\")/bin/ptool\"\n",
    );
}

/// Toolchains under `~` (rustup, pyenv…) are found under plain `moat exec`
/// although HOME is the sandbox's own, at every level that reads the host;
/// they are read-only there, and `~/.cargo/credentials.toml` next to
/// `~/.cargo/bin` stays hidden. Before the fix the proxies said "no default
/// is configured".
#[test]
fn toolchains_under_home_are_found_at_every_readable_level() {
    let w = Wf::new();
    fake_toolchains(&w);
    let h = w.fx.home.display().to_string();
    let path = format!("{h}/.cargo/bin:{h}/.pyenv/shims:{HOST_PATH}");
    let script = "echo \"R=$(rtool 2>&1)\"; echo \"P=$(ptool 2>&1)\"\n\
                  cat \"$HOME/.cargo/credentials.toml\" 2>/dev/null; \
                  if touch \"$HOME/.rustup/planted\" 2>/dev/null; then echo WROTE; fi; echo DONE\n";
    let mut bad = Vec::new();
    for level in ["read-only", "workspace-write"] {
        let mut c = w.fx.sh(level, &[], script);
        c.env("PATH", &path);
        let out = run(c);
        if out.field("R").as_deref() != Some("RTOOL_RAN")
            || out.field("P").as_deref() != Some("PTOOL_RAN")
        {
            bad.push(format!("{level}: toolchain not found\n{}", out.dump()));
        }
        if out.all().contains(&w.fx.netrc_secret) || out.stdout.contains("WROTE") {
            bad.push(format!(
                "{level}: credentials shown or toolchain writable\n{}",
                out.dump()
            ));
        }
        if !out.stdout.contains("DONE") {
            bad.push(format!("{level}: probe did not finish\n{}", out.dump()));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(!exists(w.fx.home.join(".rustup/planted")));
    // workspace-contained hides the host, toolchains included (plain exec).
    let mut c = w.fx.sh("workspace-contained", &[], script);
    c.env("PATH", &path);
    let out = run(c);
    assert_ne!(
        out.field("R").as_deref(),
        Some("RTOOL_RAN"),
        "{}",
        out.dump()
    );
}

/// The real thing on this host: rustup's `cargo` and pyenv's `python3` as
/// the invoking user, with the real HOME (the issue's reproduction).
#[test]
fn real_rustup_and_pyenv_run_under_moat_exec() {
    let home = PathBuf::from(std::env::var("HOME").unwrap_or_default());
    let cargo = home.join(".cargo/bin/cargo");
    if !home.join(".rustup").is_dir() || !cargo.exists() {
        skip("no rustup install in this user's home");
        return;
    }
    let ws = Fixture::new();
    let path = format!("{}:{HOST_PATH}", home.join(".cargo/bin").display());
    let out = run({
        let mut c = ws.moat(["exec", "--", "cargo", "--version"]);
        c.env("HOME", &home).env("PATH", &path);
        c
    });
    out.expect_code(0);
    out.expect_stdout_has("cargo ");
    let pyenv = home.join(".pyenv/shims");
    if pyenv.join("python3").exists() {
        let out = run({
            let mut c = ws.moat(["exec", "--", "python3", "--version"]);
            c.env("HOME", &home)
                .env("PATH", format!("{}:{HOST_PATH}", pyenv.display()));
            c
        });
        out.expect_code(0);
        assert!(out.all().contains("Python 3"), "{}", out.dump());
    }
}
