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
use std::path::{Path, PathBuf};
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
    // ... but `moat run` of a tool installed by a toolchain brings that
    // toolchain's install tree, read-only: the proxy in ~/.cargo/bin and
    // the toolchain in ~/.rustup it finds through $HOME.
    for (tool, ran) in [("rtool", "RTOOL_RAN"), ("ptool", "PTOOL_RAN")] {
        w.profile(
            tool,
            &format!("name = \"{tool}\"\nlevel = \"contained\"\nnetwork = \"disabled\"\n"),
        );
        let mut c = w.moat(["run", tool]);
        c.env("PATH", &path);
        let out = run(c);
        out.expect_code(0);
        out.expect_stdout_has(ran);
    }
}

/// The real thing on this host: rustup's `cargo` and pyenv's `python3` as
/// the invoking user, with the real HOME (the issue's reproduction).
#[test]
fn real_rustup_and_pyenv_run_under_moat_exec_positive_control() {
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

// ------------------------------------------------------- first-use agent state

/// A fake agent as npm would install it: `#!/usr/bin/env python3` in a
/// prefix outside the home. It writes its state dir and replaces its JSON
/// state file by rename (write a temporary, `os.replace` over), the way
/// Claude Code writes `~/.claude.json`. With `WAIT_FOR`, it adds its key,
/// then waits for the other run's marker, so two runs overlap.
const FAKE_AGENT: &str = r#"#!/usr/bin/env python3
import json, os, sys, time
home = os.environ["HOME"]
key = sys.argv[1]
os.makedirs(os.path.join(home, ".fakeagent", "sessions"), exist_ok=True)
with open(os.path.join(home, ".fakeagent", "sessions", key), "w") as f:
    f.write("session " + key)
p = os.path.join(home, ".fakeagent.json")
try:
    with open(p) as f:
        text = f.read()
    state = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    state = {}
state[key] = "login-" + key
tmp = p + ".tmp.%d" % os.getpid()
with open(tmp, "w") as f:
    json.dump(state, f)
try:
    os.replace(tmp, p)
    print("RENAME_OK")
except OSError as e:
    print("RENAME_FAILED", e)
ws = os.getcwd()
open(os.path.join(ws, "started-" + key), "w").close()
other = os.environ.get("WAIT_FOR")
if other:
    for _ in range(600):
        if os.path.exists(os.path.join(ws, "started-" + other)):
            break
        time.sleep(0.05)
    else:
        print("NEVER_SAW", other)
"#;

const FAKE_AGENT_PROFILE: &str = "name = \"fakeagent\"\nprogram = \"fakeagent\"\nlevel = \"contained\"\n\
network = \"disabled\"\npass_env = [\"WAIT_FOR\"]\n\
[[mounts]]\npath = \"~/.fakeagent\"\nmode = \"rw\"\ncreate = \"dir\"\n\
[[mounts]]\npath = \"~/.fakeagent.json\"\nmode = \"rw\"\ncreate = \"file\"\nreplaced_by_rename = true\n";

fn install_fake_agent(w: &Wf) {
    w.script("lib/node_modules/fakeagent/cli.py", FAKE_AGENT);
    std::os::unix::fs::symlink(
        "../lib/node_modules/fakeagent/cli.py",
        w.bin.join("fakeagent"),
    )
    .unwrap();
    w.profile("fakeagent", FAKE_AGENT_PROFILE);
}

/// The first `moat run` of an agent keeps its state: the profile's missing
/// `~/.fakeagent` (dir, 0700) and `~/.fakeagent.json` (file, 0600) are
/// created, and the file the agent replaces by rename works and is on the
/// host afterwards. Before the fix both grants were dropped (the state
/// vanished with the sandbox's HOME) and the rename failed with EBUSY.
#[test]
fn first_run_of_an_agent_keeps_its_state_on_the_host() {
    use std::os::unix::fs::PermissionsExt;
    let w = Wf::new();
    install_fake_agent(&w);
    // A private HOME left by a moat that was SIGKILLed (no such pid) goes.
    write(
        w.state.join("moat/sync/run-4000000000-1/.fakeagent.json"),
        "{}",
    );
    let out = run(w.moat(["run", "fakeagent", "first"]));
    out.expect_code(0);
    out.expect_stdout_has("RENAME_OK");
    let dir = w.fx.home.join(".fakeagent");
    let file = w.fx.home.join(".fakeagent.json");
    assert_eq!(
        read(dir.join("sessions/first")).as_deref(),
        Some("session first"),
        "the state dir's content is on the host\n{}",
        out.dump()
    );
    let state: Value = serde_json::from_str(&read(&file).unwrap_or_default())
        .unwrap_or_else(|e| panic!("state file: {e}\n{}", out.dump()));
    assert_eq!(state["first"], "login-first", "{}", out.dump());
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir) & 0o077, 0, "state dir private: {:o}", mode(&dir));
    assert_eq!(
        mode(&file) & 0o077,
        0,
        "state file private: {:o}",
        mode(&file)
    );
    // The run's private copy is gone, and the stale one (only the lock stays).
    let leftovers: Vec<String> = std::fs::read_dir(w.state.join("moat/sync"))
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "per-run copies left: {leftovers:?}");
    // The second run sees the first run's state and adds to it.
    let out = run(w.moat(["run", "fakeagent", "second"]));
    out.expect_code(0);
    let state: Value = serde_json::from_str(&read(&file).unwrap_or_default()).unwrap();
    assert_eq!(
        (state["first"].as_str(), state["second"].as_str()),
        (Some("login-first"), Some("login-second")),
        "{}",
        out.dump()
    );
}

/// Two runs writing the renamed state file at once lose nothing: each
/// run's key is on the host afterwards (compare-and-swap and a three-way
/// merge when the host copy changed during the run).
#[test]
fn two_concurrent_runs_lose_no_state() {
    let w = Wf::new();
    install_fake_agent(&w);
    let mut a = w.moat(["run", "fakeagent", "alpha"]);
    a.env("WAIT_FOR", "beta");
    let mut b = w.moat(["run", "fakeagent", "beta"]);
    b.env("WAIT_FOR", "alpha");
    let (ra, rb) = (spawn(a), spawn(b));
    let (oa, ob) = (ra.wait(), rb.wait());
    oa.expect_code(0);
    ob.expect_code(0);
    assert!(
        !oa.stdout.contains("NEVER_SAW") && !ob.stdout.contains("NEVER_SAW"),
        "the runs overlapped\n{}\n{}",
        oa.dump(),
        ob.dump()
    );
    let state: Value =
        serde_json::from_str(&read(w.fx.home.join(".fakeagent.json")).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}\n{}\n{}", oa.dump(), ob.dump()));
    assert_eq!(
        (state["alpha"].as_str(), state["beta"].as_str()),
        (Some("login-alpha"), Some("login-beta")),
        "both runs' state survives: {state}\n{}\n{}",
        oa.dump(),
        ob.dump()
    );
}

/// moat never creates first-use state through a symlink: a planted
/// `~/.cachex -> elsewhere` makes the run refuse (125, naming the path)
/// and nothing appears at the symlink's target.
#[test]
fn first_use_state_is_never_created_through_a_symlink() {
    let w = Wf::new();
    let target = w.fx.outside.join("redirected");
    std::fs::create_dir_all(&target).unwrap();
    std::os::unix::fs::symlink(&target, w.fx.home.join(".cachex")).unwrap();
    w.profile(
        "cachetool",
        "name = \"cachetool\"\nprogram = \"true\"\nlevel = \"rw\"\nnetwork = \"disabled\"\n\
         [[mounts]]\npath = \"~/.cachex/tool\"\nmode = \"rw\"\ncreate = \"dir\"\n",
    );
    let out = run(w.moat(["run", "cachetool"]));
    out.expect_code(125);
    assert!(out.stderr.contains(".cachex"), "{}", out.dump());
    assert!(
        std::fs::read_dir(&target).unwrap().next().is_none(),
        "nothing created through the symlink\n{}",
        out.dump()
    );
}

// ------------------------------------------------------------ agent profiles

/// The built-in agent profiles are workspace-contained: an agent (here a
/// stand-in `claude`/`codex` on PATH, run under the real built-in profile)
/// reads the workspace and its own state, and nothing else of yours: not a
/// file in your home, not a neighbouring project, not your shell rc.
#[test]
fn agent_profiles_see_nothing_else_of_yours() {
    let w = Wf::new();
    write(
        w.fx.home.join(".bashrc"),
        &format!("# {}\n", w.fx.home_public),
    );
    let probe = format!(
        "#!/bin/bash\n\
         echo \"WS=$(cat README 2>&1)\"\n\
         cat {home}/notes.txt {home}/.bashrc {outside}/secret 2>/dev/null\n\
         ls {root} {home} 2>/dev/null | sed 's/^/LS=/'\n\
         echo \"STATE=$(ls -d $HOME/.claude $HOME/.codex 2>/dev/null | wc -l)\"\n",
        home = w.fx.home.display(),
        outside = w.fx.outside.display(),
        root = w.fx.root.display()
    );
    let mut bad = Vec::new();
    for agent in ["claude", "codex", "aider"] {
        w.script(&format!("bin/{agent}"), &probe);
        let out = run(w.moat(["run", agent]));
        if out.field("WS").as_deref() != Some("workspace readme") {
            bad.push(format!(
                "{agent}: cannot read the workspace\n{}",
                out.dump()
            ));
        }
        for secret in [&w.fx.home_public, &w.fx.outside_secret] {
            if out.all().contains(secret.as_str()) {
                bad.push(format!("{agent}: read {secret}\n{}", out.dump()));
            }
        }
        // Parents of what is mounted show as bare directories; nothing else.
        if out.stdout.contains("LS=outside") || out.stdout.contains("LS=notes.txt") {
            bad.push(format!(
                "{agent}: listed other projects or home files\n{}",
                out.dump()
            ));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

// ------------------------------------------------- real tools from registries

/// Where `.ci/run` installs the agent CLIs from the npm registry
/// (`npm install -g --prefix`), readable by every user.
const AGENT_PREFIX: &str = "/opt/moat-ci-agents";

fn hosts_of(v: &Value) -> Vec<String> {
    proxy_requests(v).into_iter().map(|(h, _)| h).collect()
}

/// A real tool is needed: fail loudly in CI (`.ci/run` installs it), skip
/// with the reason elsewhere.
fn need(what: &str, present: bool) -> bool {
    if !present {
        if std::env::var_os("CI").is_some() {
            panic!("{what} is missing; .ci/run installs it");
        }
        skip(&format!(
            "{what} is not installed here (.ci/run installs it)"
        ));
    }
    present
}

/// `moat run npm install is-number`: the real registry through the proxy,
/// npm starting through its `#!/usr/bin/env node` launcher, its cache
/// `~/.npm` created on first use. The package lands in node_modules.
#[test]
fn npm_install_from_the_registry() {
    let on_path = HOST_PATH
        .split(':')
        .any(|d| Path::new(d).join("npm").exists());
    if !need("npm", on_path) {
        return;
    }
    let w = Wf::new();
    write(
        w.fx.w("package.json"),
        "{\"name\":\"wf\",\"version\":\"1.0.0\"}\n",
    );
    let out = run(w.moat(["run", "--json", "npm", "install", "is-number"]));
    let v = out.json();
    assert_eq!(v["exit_code"], 0, "{}", out.dump());
    assert!(
        exists(w.fx.w("node_modules/is-number/package.json")),
        "the package is on disk\n{}",
        out.dump()
    );
    let hosts = hosts_of(&v);
    assert!(
        hosts.iter().any(|h| h == "registry.npmjs.org:443")
            && hosts.iter().all(|h| h == "registry.npmjs.org:443"),
        "only the registry, through moat's proxy: {hosts:?}\n{}",
        out.dump()
    );
    assert!(
        w.fx.home.join(".npm").is_dir(),
        "npm's cache was kept (created on first use)\n{}",
        out.dump()
    );
}

/// pip in a workspace virtualenv, and through a `#!/usr/bin/env bash`
/// launcher script the way pyenv and asdf install `pip`: `six` from PyPI
/// through the proxy lands in the venv's site-packages.
#[test]
fn pip_in_a_venv_and_through_a_bash_launcher() {
    let w = Wf::new();
    let venv = w.fx.w(".venv");
    let made = Command::new("/usr/bin/python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !need("python3-venv", made) {
        return;
    }
    let site = |venv: &Path| {
        std::fs::read_dir(venv.join("lib"))
            .ok()
            .and_then(|mut r| r.next())
            .and_then(|e| e.ok())
            .map(|e| e.path().join("site-packages"))
            .unwrap_or_default()
    };
    // 1. The venv's own pip, first on PATH.
    let mut c = w.moat(["run", "--json", "pip", "install", "six"]);
    c.env(
        "PATH",
        format!("{}:{}", venv.join("bin").display(), w.path_var()),
    );
    let out = run(c);
    let v = out.json();
    assert_eq!(v["exit_code"], 0, "{}", out.dump());
    assert!(
        site(&venv).join("six.py").exists(),
        "six in the venv\n{}",
        out.dump()
    );
    assert!(
        w.fx.home.join(".cache/pip").is_dir(),
        "pip's cache was kept (created on first use)\n{}",
        out.dump()
    );
    let hosts = hosts_of(&v);
    assert!(
        hosts.iter().any(|h| h == "pypi.org:443")
            && hosts
                .iter()
                .all(|h| h == "pypi.org:443" || h == "files.pythonhosted.org:443"),
        "PyPI only: {hosts:?}\n{}",
        out.dump()
    );
    // 2. pip behind a bash launcher (pyenv-style) into a second venv.
    let venv2 = w.fx.w(".venv2");
    assert!(Command::new("/usr/bin/python3")
        .args(["-m", "venv"])
        .arg(&venv2)
        .status()
        .unwrap()
        .success());
    w.script(
        "bin/pip",
        &format!(
            "#!/usr/bin/env bash\nexec {}/bin/python3 -m pip \"$@\"\n",
            venv2.display()
        ),
    );
    let out = run(w.moat(["run", "--json", "pip", "install", "six"]));
    let v = out.json();
    assert_eq!(v["exit_code"], 0, "{}", out.dump());
    assert!(
        site(&venv2).join("six.py").exists(),
        "six installed through the bash launcher\n{}",
        out.dump()
    );
    assert!(
        hosts_of(&v).iter().any(|h| h == "pypi.org:443"),
        "{}",
        out.dump()
    );
}

/// `git init` under git's profile: the new repository is still there after
/// the run (the sweep neutralises what the host would execute in it, and
/// keeps the rest), and the host's git can use it.
#[test]
fn git_init_survives() {
    let w = Wf::new();
    let out = run(w.moat(["run", "git", "init", "-q"]));
    out.expect_code(0);
    assert!(
        w.fx.w(".git/HEAD").exists(),
        "the new repository survives the run\n{}",
        out.dump()
    );
    let st = Command::new("git")
        .arg("-C")
        .arg(&w.fx.ws)
        .args(["rev-parse", "--git-dir"])
        .env("HOME", &w.fx.home)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "the host's git accepts the new repository: {}",
        String::from_utf8_lossy(&st.stderr)
    );
}

/// `git add` and `git commit` under git's profile in an existing
/// repository: the commit is there afterwards, with the author the host
/// environment named.
#[test]
fn git_commit_keeps_the_commit_and_its_author() {
    let w = Wf::new();
    let st = Command::new("git")
        .args(["init", "-q"])
        .arg(&w.fx.ws)
        .env("HOME", &w.fx.home)
        .status()
        .unwrap();
    assert!(st.success());
    write(w.fx.w("a.txt"), "a\n");
    let git = |args: &[&str]| {
        let mut c = w.moat(["run", "git"].iter().chain(args));
        for (k, val) in [
            ("GIT_AUTHOR_NAME", "Wf Author"),
            ("GIT_AUTHOR_EMAIL", "wf@example.invalid"),
            ("GIT_COMMITTER_NAME", "Wf Author"),
            ("GIT_COMMITTER_EMAIL", "wf@example.invalid"),
        ] {
            c.env(k, val);
        }
        run(c)
    };
    git(&["add", "a.txt"]).expect_code(0);
    let out = git(&["commit", "-q", "-m", "first"]);
    out.expect_code(0);
    let log = Command::new("git")
        .arg("-C")
        .arg(&w.fx.ws)
        .args(["log", "-1", "--format=%an %s"])
        .env("HOME", &w.fx.home)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&log.stdout).trim(),
        "Wf Author first",
        "{}",
        out.dump()
    );
}

/// cargo with a one-dependency crate (`itoa`) fetched from crates.io through
/// the proxy, by rustup's `cargo` found through the sandbox HOME.
#[test]
fn cargo_fetches_a_dependency_through_the_proxy() {
    let real = PathBuf::from(std::env::var("HOME").unwrap_or_default());
    let have = real.join(".cargo/bin/cargo").exists() && real.join(".rustup").is_dir();
    if !have {
        // No toolchain host is reachable from CI, so only the machine's own
        // rustup (root's) exists; this case runs in the root phase.
        skip("no rustup toolchain in this user's home (the machine's rustup is root's)");
        return;
    }
    let w = Wf::new();
    std::os::unix::fs::symlink(real.join(".rustup"), w.fx.home.join(".rustup")).unwrap();
    std::os::unix::fs::symlink(real.join(".cargo/bin"), w.fx.home.join(".cargo/bin")).unwrap();
    write(
        w.fx.w("Cargo.toml"),
        "[package]\nname = \"wf\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nitoa = \"1\"\n",
    );
    write(w.fx.w("src/main.rs"), "fn main() {}\n");
    let mut c = w.moat(["run", "--json", "cargo", "fetch"]);
    c.env(
        "PATH",
        format!("{}:{HOST_PATH}", real.join(".cargo/bin").display()),
    );
    let out = run(c);
    let v = out.json();
    assert_eq!(v["exit_code"], 0, "{}", out.dump());
    let lock = read(w.fx.w("Cargo.lock")).unwrap_or_default();
    assert!(lock.contains("name = \"itoa\""), "{}", out.dump());
    let cached = walk_has(&w.fx.home.join(".cargo/registry"), "itoa-");
    assert!(cached, "itoa in the kept registry cache\n{}", out.dump());
    let hosts = hosts_of(&v);
    assert!(
        hosts.iter().any(|h| h == "index.crates.io:443")
            && hosts.iter().all(|h| [
                "index.crates.io:443",
                "static.crates.io:443",
                "crates.io:443"
            ]
            .contains(&h.as_str())),
        "crates.io only: {hosts:?}\n{}",
        out.dump()
    );
}

fn walk_has(dir: &Path, prefix: &str) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().any(|e| {
        e.file_name().to_string_lossy().starts_with(prefix)
            || (e.file_type().is_ok_and(|t| t.is_dir()) && walk_has(&e.path(), prefix))
    })
}

/// The agent CLIs from the npm registry, under their built-in profiles:
/// they start (workspace-contained, with their install tree), ask moat's
/// proxy for their own API hosts, which the policy passes, and anything
/// else they try (codex asks GitHub for its plugin list) is refused (they
/// cannot reach the APIs from CI; the proxy's log shows what they asked
/// for), and their first-run state is on the host afterwards.
#[test]
fn claude_and_codex_start_reach_only_their_hosts_and_keep_state() {
    let bin = Path::new(AGENT_PREFIX).join("bin");
    if !need(
        "the Claude Code and Codex CLIs",
        bin.join("claude").exists() && bin.join("codex").exists(),
    ) {
        return;
    }
    /// (agent, its arguments, a fake API key, its hosts, a state file it writes)
    type Case<'a> = (
        &'a str,
        &'a [&'a str],
        (&'a str, &'a str),
        &'a [&'a str],
        &'a str,
    );
    let cases: [Case; 2] = [
        (
            "claude",
            &["-p", "say hi"],
            ("ANTHROPIC_API_KEY", "sk-ant-moat-workflow-fake"),
            &[
                "api.anthropic.com:443",
                "platform.claude.com:443",
                "claude.ai:443",
            ],
            ".claude.json",
        ),
        (
            "codex",
            &["exec", "--skip-git-repo-check", "say hi"],
            ("OPENAI_API_KEY", "sk-moat-workflow-fake"),
            &[
                "api.openai.com:443",
                "chatgpt.com:443",
                "auth.openai.com:443",
            ],
            ".codex/installation_id",
        ),
    ];
    let mut bad = Vec::new();
    for (agent, args, (key, val), allowed, state) in cases {
        let w = Wf::new();
        // A new user: no state of this agent yet.
        let _ = std::fs::remove_file(w.fx.home.join(".claude.json"));
        let mut argv = vec!["run", "--json", "--timeout", "15s", agent];
        argv.extend(args);
        let mut c = w.moat(argv);
        c.env("PATH", format!("{}:{HOST_PATH}", bin.display()))
            .env(key, val);
        let out = run(c);
        let v = out.json();
        let reqs: Vec<(String, String)> = v["network"]["requests"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| {
                        (
                            format!("{}:{}", r["host"].as_str().unwrap_or(""), r["port"]),
                            r["reason"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        // It asked moat's proxy for its model API.
        if !reqs.iter().any(|(h, _)| h == allowed[0]) {
            bad.push(format!(
                "{agent}: never asked the proxy for {}\n{}",
                allowed[0],
                out.dump()
            ));
        }
        // Its own hosts pass the policy (CI cannot reach them: upstream
        // fails); every other host it tried was refused by the policy.
        for (h, reason) in &reqs {
            let mine = allowed.contains(&h.as_str());
            if mine == (reason == "not_allowed") {
                bad.push(format!("{agent}: {h} got {reason:?}\n{}", out.dump()));
            }
        }
        if !w.fx.home.join(state).exists() {
            bad.push(format!(
                "{agent}: its first-run state ~/{state} is not on the host\n{}",
                out.dump()
            ));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Shims installed on the host (`moat shim install node git` puts symlinks
/// to moat first on PATH) are visible inside a session at the levels that
/// read the host. A launcher's (node) must pass through to the real program
/// with the session's class, and a leaf's (git) must find the real git, not
/// itself again.
#[test]
fn host_installed_shims_inside_a_session_pass_through_to_the_real_tool() {
    let w = Wf::new();
    let shims = w.fx.root.join("hostshims");
    std::fs::create_dir_all(&shims).unwrap();
    for n in ["node", "git"] {
        std::os::unix::fs::symlink(moat_bin(), shims.join(n)).unwrap();
    }
    let body = unique("hostshimbody");
    let srv = HttpServer::fixed(&body);
    let allow = format!("127.0.0.1:{}", srv.port);
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
    let path = format!("{}:{}", shims.display(), w.path_var());
    let url = format!("http://127.0.0.1:{}/through-host-shim", srv.port);
    let mut c = w.moat(["run", "--timeout", "30s", "nodetool", &url]);
    c.env("PATH", &path);
    let out = run(c);
    out.expect_code(0);
    out.expect_stdout_has(&format!("NODE_BODY={body}"));
    let mut c = w.moat([
        "run",
        "--timeout",
        "30s",
        "--network",
        "disabled",
        "bash",
        "-c",
        "echo \"GIT=$(command -v git)\"; git --version",
    ]);
    c.env("PATH", &path);
    let out = run(c);
    out.expect_code(0);
    out.expect_stdout_has("git version");
}

/// Debian has no `python`: the `python3` profile runs the interpreter under
/// its own name, with no network, like `python`.
#[test]
fn python3_has_a_profile() {
    let w = Wf::new();
    let out = run(w.moat([
        "run",
        "python3",
        "-c",
        "import socket\nprint('PY3_RAN')\ntry:\n    socket.socket()\n    print('NET=open')\nexcept OSError as e:\n    print('NET=refused', e.errno)",
    ]));
    out.expect_code(0);
    out.expect_stdout_has("PY3_RAN");
    assert_eq!(
        out.field("NET").as_deref(),
        Some("refused 1"),
        "{}",
        out.dump()
    );
}

/// Inside a workspace-contained agent session (the built-in claude profile)
/// a leaf tool reached through its in-session shim runs under its own class:
/// the session's shim table is readable at workspace-contained, so `git
/// status` works (before, the shim fell back to moat's own CLI, and with the
/// table unreadable a shim now refuses rather than run a leaf unnarrowed).
#[test]
fn leaf_tools_work_inside_a_contained_agent_session() {
    let w = Wf::new();
    let st = Command::new("git")
        .args(["init", "-q"])
        .arg(&w.fx.ws)
        .env("HOME", &w.fx.home)
        .status()
        .unwrap();
    assert!(st.success());
    write(w.fx.w("new.txt"), "x\n");
    w.script(
        "bin/claude",
        "#!/bin/bash\necho \"GIT=$(command -v git)\"\ngit status --short | sed 's/^/ST=/'\n",
    );
    let out = run(w.moat(["run", "claude"]));
    out.expect_code(0);
    assert_eq!(
        out.field("GIT").as_deref(),
        Some("/moat/shims/git"),
        "{}",
        out.dump()
    );
    out.expect_stdout_has("ST=?? new.txt");
}
