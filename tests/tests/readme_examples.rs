//! The README's examples run as shown: every ```console block's `$ ` lines
//! run in a fixture, and the output the README shows is the output moat gives.
//!
//! Conventions (documented in tests/README.md):
//! - a block is its `$ ` lines, each followed by the output it shows (none
//!   shown: the line must exit 0); each block runs in a fresh fixture whose
//!   HOME stands for `/home/me` (a planted `~/.ssh/id_ed25519`) and whose
//!   workspace, the cwd, is `/home/me/project` (a git repo with a tiny cargo
//!   crate and a `package.json`);
//! - `<!-- example: skip N[,M]|all: REASON -->` right above a block's fence
//!   leaves those `$ ` lines (1-based) unrun, the reason in the README;
//! - outputs are compared line by line after normalising: runs of blanks
//!   are one space, blank lines are dropped, timestamps, hex ids and hashes
//!   (6+ hex digits with a digit among them) and `N ms` are placeholders;
//!   `…` in a shown line matches anything, a shown line that is only `…`
//!   matches any number of lines; stdout and stderr may interleave in any
//!   order that keeps each stream's own order;
//! - an 8-hex-digit word in a command (an execution id a previous line's
//!   output showed) is replaced by the fixture's latest execution id.

use moat_conformance::{moat_bin, skip, spawn, unique, write, HOST_PATH};
use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The README's console blocks, in order; a new block needs a case below.
const BLOCKS: usize = 5;
const ME: &str = "/home/me";

struct Line {
    cmd: String,
    shown: Vec<String>,
    skip: Option<String>,
}

fn readme() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Every ```console block of `text`, with its skip markers applied.
fn blocks(text: &str) -> Vec<Vec<Line>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() != "```console" {
            i += 1;
            continue;
        }
        let mut skips: HashMap<usize, String> = HashMap::new();
        let mut skip_all = None;
        let mut m = i;
        while m > 0 && lines[m - 1].starts_with("<!-- example:") {
            m -= 1;
            let body = lines[m]
                .trim_start_matches("<!-- example:")
                .trim_end_matches("-->")
                .trim();
            let rest = body
                .strip_prefix("skip ")
                .unwrap_or_else(|| panic!("unknown example marker: {}", lines[m]));
            let (which, reason) = rest
                .split_once(':')
                .unwrap_or_else(|| panic!("marker without a reason: {}", lines[m]));
            let reason = reason.trim().to_string();
            assert!(!reason.is_empty(), "marker without a reason: {}", lines[m]);
            if which.trim() == "all" {
                skip_all = Some(reason);
            } else {
                for n in which.split(',') {
                    let n: usize = n.trim().parse().unwrap_or_else(|_| {
                        panic!("marker line numbers are 1-based integers: {}", lines[m])
                    });
                    skips.insert(n, reason.clone());
                }
            }
        }
        let mut block: Vec<Line> = Vec::new();
        i += 1;
        while i < lines.len() && lines[i].trim_end() != "```" {
            if let Some(cmd) = lines[i].strip_prefix("$ ") {
                let n = block.len() + 1;
                block.push(Line {
                    cmd: cmd.to_string(),
                    shown: Vec::new(),
                    skip: skips.remove(&n).or_else(|| skip_all.clone()),
                });
            } else if let Some(last) = block.last_mut() {
                last.shown.push(lines[i].to_string());
            } else {
                panic!("console block output before any `$ ` line: {}", lines[i]);
            }
            i += 1;
        }
        assert!(
            skips.is_empty(),
            "skip marker names lines the block does not have: {skips:?}"
        );
        out.push(block);
        i += 1;
    }
    out
}

fn is_hex_id(w: &str) -> bool {
    w.len() >= 6
        && w.chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        && w.chars().any(|c| c.is_ascii_digit())
}

/// Normalise one line (see the module doc).
fn norm(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut out: Vec<String> = Vec::new();
    let mut k = 0;
    while k < words.len() {
        let w = words[k];
        let is_date = w.len() == 10 && w.as_bytes()[4] == b'-' && w.as_bytes()[7] == b'-';
        let next_is_time = words
            .get(k + 1)
            .is_some_and(|t| t.len() == 8 && t.as_bytes()[2] == b':' && t.as_bytes()[5] == b':');
        if is_date && next_is_time {
            out.push("<time>".into());
            k += 2;
            continue;
        }
        if w.chars().all(|c| c.is_ascii_digit()) && words.get(k + 1) == Some(&"ms") {
            out.push("<n>".into());
            k += 1;
            continue;
        }
        // Hex runs anywhere in the word (`sha256:3a1e…`, `exec_4f94…`).
        let mut word = String::new();
        let mut run = String::new();
        for c in w.chars().chain(std::iter::once(' ')) {
            if c.is_ascii_hexdigit() && !c.is_ascii_uppercase() {
                run.push(c);
                continue;
            }
            if is_hex_id(&run) {
                word.push_str("<hex>");
            } else {
                word.push_str(&run);
            }
            run.clear();
            if c != ' ' {
                word.push(c);
            }
        }
        out.push(word);
        k += 1;
    }
    out.join(" ")
}

/// Whether actual line `got` matches shown line `shown` (both normalised).
fn line_matches(shown: &str, got: &str) -> bool {
    let parts: Vec<&str> = shown.split('…').collect();
    if parts.len() == 1 {
        return shown == got;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !got.starts_with(first) || !got[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &got[first.len()..got.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(at) => rest = &rest[at + p.len()..],
            None => return false,
        }
    }
    true
}

/// Whether `shown` is an interleaving of `out` and `err` (each in order).
fn interleaves(shown: &[String], out: &[String], err: &[String]) -> bool {
    let mut memo = HashMap::new();
    fn go(
        i: usize,
        j: usize,
        k: usize,
        s: &[String],
        o: &[String],
        e: &[String],
        memo: &mut HashMap<(usize, usize, usize), bool>,
    ) -> bool {
        if let Some(&r) = memo.get(&(i, j, k)) {
            return r;
        }
        let r = if i == s.len() {
            j == o.len() && k == e.len()
        } else if s[i] == "…" {
            go(i + 1, j, k, s, o, e, memo)
                || (j < o.len() && go(i, j + 1, k, s, o, e, memo))
                || (k < e.len() && go(i, j, k + 1, s, o, e, memo))
        } else {
            (j < o.len() && line_matches(&s[i], &o[j]) && go(i + 1, j + 1, k, s, o, e, memo))
                || (k < e.len() && line_matches(&s[i], &e[k]) && go(i + 1, j, k + 1, s, o, e, memo))
        };
        memo.insert((i, j, k), r);
        r
    }
    go(0, 0, 0, shown, out, err, &mut memo)
}

/// The fixture: HOME stands for /home/me, the workspace for ~/project.
struct Home {
    root: PathBuf,
    home: PathBuf,
    ws: PathBuf,
    bin: PathBuf,
    key: String,
    /// The caller's rustup install, linked into the fixture HOME, if readable.
    rustup: bool,
}

impl Home {
    fn new() -> Home {
        let root = Path::new("/var/tmp").join(unique("readme"));
        fs::create_dir(&root).expect("mkdir fixture");
        let root = root.canonicalize().expect("canonicalize");
        let home = root.join("me");
        let ws = home.join("project");
        let bin = root.join("bin");
        let key = unique("READMEKEY");
        write(
            home.join(".ssh/id_ed25519"),
            &format!("-----BEGIN OPENSSH PRIVATE KEY-----\n{key}\n"),
        );
        write(
            ws.join("Cargo.toml"),
            "[package]\nname = \"demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
        );
        write(
            ws.join("src/lib.rs"),
            "#[test]\nfn adds() {\n    assert_eq!(1 + 1, 2);\n}\n",
        );
        write(
            ws.join("package.json"),
            "{\"name\": \"demo\", \"version\": \"1.0.0\"}\n",
        );
        let git = Command::new("git")
            .args(["init", "-q"])
            .current_dir(&ws)
            .status()
            .expect("git init");
        assert!(git.success(), "git init in the fixture failed");
        fs::create_dir(&bin).expect("mkdir bin");
        symlink(moat_bin(), bin.join("moat")).expect("link moat");
        // rustup's toolchains live in the caller's real home; link them
        // where the fixture HOME would have them (moat mirrors them).
        let real = PathBuf::from(std::env::var("HOME").unwrap_or_default());
        let rustup =
            fs::read_dir(real.join(".rustup")).is_ok() && real.join(".cargo/bin/cargo").exists();
        if rustup {
            fs::create_dir_all(home.join(".cargo")).expect("mkdir .cargo");
            symlink(real.join(".rustup"), home.join(".rustup")).expect("link rustup");
            symlink(real.join(".cargo/bin"), home.join(".cargo/bin")).expect("link cargo bin");
        }
        Home {
            root,
            home,
            ws,
            bin,
            key,
            rustup,
        }
    }

    fn shell(&self, cmd: &str) -> Command {
        let path = format!(
            "{}:{}:{HOST_PATH}",
            self.bin.display(),
            self.home.join(".cargo/bin").display()
        );
        let mut c = Command::new("/bin/sh");
        c.arg("-c")
            .arg(cmd)
            .env_clear()
            .env("PATH", path)
            .env("HOME", &self.home)
            .env("LANG", "C.UTF-8")
            .env(
                "USER",
                std::env::var("USER").unwrap_or_else(|_| "user".into()),
            )
            .current_dir(&self.ws)
            .stdin(Stdio::null());
        c
    }

    /// The short id of the fixture's latest execution, as `audit tail` shows it.
    fn latest_execution(&self) -> Option<String> {
        let out = spawn(self.shell("moat audit tail -n 1 --json")).wait();
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).ok()?;
        let id = v["execution_id"].as_str()?.trim_start_matches("exec_");
        Some(id.get(..8)?.to_string())
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = Command::new("chmod")
            .args(["-R", "u+rwX"])
            .arg(&self.root)
            .status();
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn lines_of(text: &str, home: &Path) -> Vec<String> {
    let home = home.to_string_lossy();
    text.lines()
        .map(|l| norm(&l.replace(home.as_ref(), ME)))
        .filter(|l| !l.is_empty())
        .collect()
}

/// Run README console block `n` (0-based) as shown.
fn run_block(n: usize) {
    let all = blocks(&readme());
    assert_eq!(
        all.len(),
        BLOCKS,
        "the README's console blocks changed: give each a case here"
    );
    let fx = Home::new();
    for (at, line) in all[n].iter().enumerate() {
        let label = format!(
            "README console block {}, line {}: $ {}",
            n + 1,
            at + 1,
            line.cmd
        );
        if let Some(reason) = &line.skip {
            println!("not run (README marker): {label}: {reason}");
            continue;
        }
        if line.cmd.contains("moat run cargo ") && !fx.rustup {
            skip(&format!(
                "{label}: no rustup install readable in this user's home (root's is not readable by moat-ci)"
            ));
            continue;
        }
        let mut cmd = line.cmd.replace(ME, &fx.home.to_string_lossy());
        let ids: Vec<String> = cmd
            .split_whitespace()
            .filter(|w| w.len() == 8 && is_hex_id(w))
            .map(String::from)
            .collect();
        for id in ids {
            let latest = fx
                .latest_execution()
                .unwrap_or_else(|| panic!("{label}: no execution in the fixture's audit log"));
            cmd = cmd.replace(&id, &latest);
        }
        let out = spawn(fx.shell(&cmd)).wait_limit(Duration::from_secs(300));
        let dump = format!("{label}\n{}", out.dump());
        assert!(
            !out.all().contains(&fx.key),
            "{dump}\nthe planted key's bytes reached the output"
        );
        if line.shown.is_empty() {
            assert_eq!(
                out.code,
                Some(0),
                "{dump}\nthe README shows no output: the line must succeed"
            );
            continue;
        }
        assert_ne!(out.code, Some(125), "{dump}\nmoat refused a README example");
        let shown: Vec<String> = line
            .shown
            .iter()
            .map(|l| norm(l))
            .filter(|l| !l.is_empty())
            .collect();
        let got_out = lines_of(&out.stdout, &fx.home);
        let got_err = lines_of(&out.stderr, &fx.home);
        assert!(
            interleaves(&shown, &got_out, &got_err),
            "{dump}\nthe output differs from the README's.\n--- shown (normalised) ---\n{}\n--- stdout (normalised) ---\n{}\n--- stderr (normalised) ---\n{}",
            shown.join("\n"),
            got_out.join("\n"),
            got_err.join("\n")
        );
    }
}

#[test]
fn readme_intro_examples_run_as_shown() {
    run_block(0);
}

#[test]
fn readme_install_examples_run_as_shown() {
    run_block(1);
}

#[test]
fn readme_proxy_examples_run_as_shown() {
    run_block(2);
}

#[test]
fn readme_profile_examples_run_as_shown() {
    run_block(3);
}

#[test]
fn readme_audit_examples_run_as_shown() {
    run_block(4);
}

#[test]
fn normalising_keeps_what_the_readme_states_contract() {
    // The comparison itself: placeholders only for what varies by run.
    assert_eq!(
        norm("2026-11-30 09:04:15  6b2eb747  execution.finished  exit 1, finished, 8 ms"),
        "<time> <hex> execution.finished exit 1, finished, <n> ms"
    );
    assert_eq!(
        norm("policy_hash  sha256:2354f1…"),
        "policy_hash sha256:<hex>…"
    );
    assert!(line_matches(
        "policy_hash sha256:<hex>…",
        "policy_hash sha256:<hex>"
    ));
    assert!(!line_matches("exit 1, finished", "exit 2, finished"));
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert!(interleaves(
        &s(&["a", "b", "c"]),
        &s(&["b"]),
        &s(&["a", "c"])
    ));
    assert!(!interleaves(&s(&["a", "b"]), &s(&["b", "a"]), &s(&[])));
    assert!(interleaves(
        &s(&["a", "…", "z"]),
        &s(&["a", "x", "y", "z"]),
        &s(&[])
    ));
    assert!(!interleaves(&s(&["a"]), &s(&["a", "extra"]), &s(&[])));
}
