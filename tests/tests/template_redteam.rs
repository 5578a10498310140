//! Red-team cases for `moat serve` executions forked from a sandbox
//! template (issue 11 §5), driven through `moat serve --stdio`: a mount
//! that narrows a host path (a stand-in, a read-only bind in the
//! workspace) sits on a host dentry, and the host unlinking or renaming
//! over it detaches it in every mount namespace but the caller's while the
//! plan (so the template key) stays the same. A later execution must still
//! get the view the one-shot path would lay now. (More cases, including
//! one-shot parity, are in tests/python/test_template_redteam.py.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use base64::Engine;
use moat_conformance::*;
use serde_json::{json, Value};

/// A `moat serve --stdio` session in the fixture's workspace (the same
/// client as tests/tests/template.rs's, reduced to `execute`).
struct Serve {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    next: u64,
}

impl Serve {
    fn start(fx: &Fixture) -> Serve {
        let mut child = fx
            .moat([
                "serve",
                "--stdio",
                "--no-audit",
                "--policy",
                "workspace-write",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moat serve");
        let stdin = child.stdin.take().expect("stdin");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Serve {
            child,
            stdin,
            out,
            next: 0,
        }
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        assert!(
            self.out.read_line(&mut line).unwrap_or(0) > 0,
            "moat serve ended"
        );
        serde_json::from_str(&line).expect("a JSON line")
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next += 1;
        let msg = json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params});
        writeln!(self.stdin, "{msg}").expect("write a request");
        self.next
    }

    /// Runs `script` under `sh -c` to its end: (its stdout, its result).
    fn run(&mut self, script: &str) -> (String, Value) {
        let id = self.send("execute", json!({"command": ["sh", "-c", script]}));
        let mut stdout = Vec::new();
        let mut eid = None;
        loop {
            let m = self.read();
            if m["id"] == json!(id) {
                assert!(m.get("result").is_some(), "execute refused: {m}");
                eid = Some(m["result"]["execution_id"].clone());
                continue;
            }
            let p = &m["params"];
            match p["type"].as_str() {
                Some("execution.stdout") => stdout.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(p["data"].as_str().unwrap_or(""))
                        .unwrap_or_default(),
                ),
                Some("execution.finished") | Some("execution.failed") => break,
                _ => {}
            }
        }
        let eid = eid.expect("the execute answer came before the end");
        let id = self.send("getExecution", json!({"execution_id": eid}));
        let result = loop {
            let m = self.read();
            if m["id"] == json!(id) && m.get("method").is_none() {
                break m["result"].clone();
            }
        };
        (String::from_utf8_lossy(&stdout).into_owned(), result)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn template_env_file_replaced_on_the_host_stays_hidden() {
    // The fixture's workspace is under /var/tmp: its stand-ins would be
    // mounts of the template's shared view.
    let fx = Fixture::new();
    write(fx.w(".env"), "TOKEN=old\n");
    let mut s = Serve::start(&fx);
    let (out, r) = s.run("cat .env; echo FIRST-RAN");
    assert!(out.contains("FIRST-RAN"), "{out} {r}");
    // An editor's atomic save: a new file renamed over the old one.
    write(fx.w(".env.tmp"), &format!("TOKEN={}\n", fx.env_secret));
    std::fs::rename(fx.w(".env.tmp"), fx.w(".env")).expect("rename over .env");
    let (out, r) = s.run("cat .env; echo SECOND-RAN");
    assert!(out.contains("SECOND-RAN"), "{out} {r}");
    assert!(
        !out.contains(&fx.env_secret),
        "the .env saved on the host after the template was built is visible:\n{out}"
    );
    assert_eq!(r["launch"], "template", "{r}");
}

#[test]
fn template_git_config_rewritten_on_the_host_stays_write_protected() {
    let fx = Fixture::new();
    write(fx.w(".git/config"), "[core]\n");
    write(fx.w(".git/HEAD"), "ref: refs/heads/main\n");
    let mut s = Serve::start(&fx);
    let (out, r) = s.run("echo FIRST-RAN");
    assert!(out.contains("FIRST-RAN"), "{out} {r}");
    // `git config` writes config.lock and renames it over config.
    write(fx.w(".git/config.lock"), "[core]\n\tbare = false\n");
    std::fs::rename(fx.w(".git/config.lock"), fx.w(".git/config")).expect("rename");
    let t = unique("HOOKS");
    let (out, r) = s.run(&format!(
        "printf '[core]\\n\\thooksPath = /x/{t}\\n' >> .git/config; echo SECOND-RAN"
    ));
    assert!(out.contains("SECOND-RAN"), "{out} {r}");
    let config = read(fx.w(".git/config")).unwrap_or_default();
    assert!(
        !config.contains(&t),
        "a template execution wrote the host's .git/config:\n{config}"
    );
    assert_eq!(r["launch"], "template", "{r}");
}
