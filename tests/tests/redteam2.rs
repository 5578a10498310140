//! Red-team pass over the issue-10 surfaces (the user's tool configuration
//! copied in redacted, tool-configuration environment passthrough, the
//! proxy's credential injection, the command's terminal). Each test asserts
//! the side effect: the secret's bytes absent inside, what a local server
//! received, what a host terminal's reader got.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moat_conformance::*;

/// A unique secret made of ASCII letters only (a shape the redaction's
/// "bare boolean key" rule would keep).
fn letters_secret(tag: &str) -> String {
    let digits = unique("");
    let tail: String = digits
        .chars()
        .filter(|c| c.is_ascii_digit())
        .map(|c| (b'a' + (c as u8 - b'0')) as char)
        .rev()
        .take(14)
        .collect();
    format!("{tag}{tail}")
}

/// Credentials in the user's configuration files written in forms other
/// than the documented examples, and tool-configuration variables whose
/// URL carries a token in its query, never reach the sandbox; the settings
/// around them do.
#[test]
fn config_copies_and_tool_env_drop_credentials_in_every_form() {
    let fx = Fixture::new();
    let h = &fx.home;
    let smtp = unique("SMTPSECRET");
    let apikey = unique("APIKEYSECRET");
    let continued = letters_secret("CONTINUEDSECRET");
    let pip_query = unique("PIPQUERYSECRET");
    let npm_query = unique("NPMQUERYSECRET");
    let env_query = unique("ENVQUERYSECRET");
    let uv_query = unique("UVQUERYSECRET");
    let cargo_query = unique("CARGOQUERYSECRET");
    let commented = unique("COMMENTEDSECRET");
    write(
        h.join(".gitconfig"),
        &format!(
            "[user]\n\tname = Ada Lovelace\n\
             [sendemail]\n\tsmtpServer = smtp.example.com\n\tsmtpPass = {smtp}\n\
             [hub]\n\tapiKey = {apikey}\n\
             [http]\n\textraHeader = Authorization: Bearer \\\n{continued}\n"
        ),
    );
    write(
        h.join(".config/pip/pip.conf"),
        &format!(
            "[global]\nindex-url = https://pypi.corp.example/simple/?token={pip_query}\ntimeout = 30\n"
        ),
    );
    write(
        h.join(".npmrc"),
        &format!(
            "registry=https://npm.corp.example/?access_token={npm_query}\nfund=false\n\
             #//npm.corp.example/:_authToken={commented}\n"
        ),
    );
    let script = "cat ~/.gitconfig ~/.config/pip/pip.conf ~/.npmrc; env; \
                  echo \"GIT_NAME=$(git config user.name)\"; echo PROBE_DONE";
    for level in ["read-only", "workspace-contained"] {
        let mut c = fx.sh(level, &[], script);
        c.env(
            "PIP_EXTRA_INDEX_URL",
            format!("https://pypi.corp.example/simple?private_token={env_query}"),
        )
        .env(
            "UV_INDEX",
            format!("corp=https://uv.corp.example/simple?sig={uv_query}&x=1"),
        )
        .env(
            "CARGO_REGISTRIES_CORP_INDEX",
            format!("sparse+https://cargo.corp.example/index/?auth={cargo_query}"),
        );
        let out = run(c);
        out.expect_stdout_has("PROBE_DONE");
        // The settings around the credentials still arrive (this fails
        // against a redaction that drops whole files).
        for kept in [
            "GIT_NAME=Ada Lovelace",
            "smtpserver = \"smtp.example.com\"",
            "timeout = 30",
            "fund = false",
            "index-url = https://pypi.corp.example/simple/",
            "PIP_EXTRA_INDEX_URL=https://pypi.corp.example/simple",
            "CARGO_REGISTRIES_CORP_INDEX=sparse+https://cargo.corp.example/index/",
        ] {
            assert!(
                out.stdout.contains(kept),
                "{level}: {kept} missing\n{}",
                out.dump()
            );
        }
        for secret in [
            &smtp,
            &apikey,
            &continued,
            &pip_query,
            &npm_query,
            &env_query,
            &uv_query,
            &cargo_query,
            &commented,
        ] {
            out.expect_absent(secret, level);
        }
    }
}

/// A local HTTP server that answers each request by echoing its head
/// (the way `TRACE` does on servers that allow it).
fn echo_server() -> (u16, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
            let mut buf = Vec::new();
            let mut b = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&b[..n]),
                }
            }
            let head = String::from_utf8_lossy(&buf).into_owned();
            s2.lock().unwrap().push(head.clone());
            let _ = c.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: message/http\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{head}",
                    head.len()
                )
                .as_bytes(),
            );
        }
    });
    (port, seen)
}

/// The proxy adds the user's registry credential so the command can use it
/// without reading it: a method whose response echoes the request (TRACE)
/// must not carry it, while a GET still does (positive side).
#[test]
fn injected_registry_credential_is_not_echoed_back_by_trace() {
    let fx = Fixture::new();
    let secret = unique("TRACESECRET");
    let (port, seen) = echo_server();
    write(
        fx.home.join(".config/pip/pip.conf"),
        &format!("[global]\nindex-url = http://me:{secret}@127.0.0.1:{port}/simple\n"),
    );
    let allow = format!("127.0.0.1:{port}");
    let script = format!(
        "/usr/bin/curl -sS -m 20 -X TRACE http://127.0.0.1:{port}/simple/; \
         /usr/bin/curl -sS -m 20 -o /dev/null http://127.0.0.1:{port}/simple/x/; \
         echo PROBE_DONE"
    );
    let out = run(fx.sh(
        "workspace-write",
        &["--network", "proxy", "--allow-domain", &allow],
        &script,
    ));
    out.expect_stdout_has("PROBE_DONE");
    let heads = seen.lock().unwrap().clone();
    let b64 = {
        use std::process::Command;
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s 'me:{secret}' | base64 -w0"))
            .output()
            .unwrap();
        String::from_utf8(o.stdout).unwrap()
    };
    assert!(
        heads
            .iter()
            .any(|h| h.starts_with("GET /simple/x/") && h.contains(&b64)),
        "the GET did not carry the credential (test setup): {heads:?}\n{}",
        out.dump()
    );
    out.expect_absent(&b64, "the injected credential echoed into the sandbox");
    assert!(
        !heads
            .iter()
            .any(|h| h.starts_with("TRACE") && h.contains(&b64)),
        "TRACE carried the credential: {heads:?}"
    );
}

/// When a host terminal is among moat's stdio but the command gets no
/// relayed terminal input (stdin is not a terminal, or moat is not in the
/// terminal's foreground), the host terminal must not enter the sandbox:
/// through it the command could read what the user types into that
/// terminal for other programs (a terminal fd is open for reading and
/// writing, and a process outside the terminal's session is not stopped by
/// job control when it reads).
fn host_terminal_cannot_be_read_from_inside(on_stdin: bool, extra: &[&str]) {
    let fx = Fixture::new();
    let typed = unique("TYPEDBYUSER");
    let stolen = fx.w("stolen");
    let ready = fx.w("ready");
    let done = fx.w("done");
    let pty = Pty::open();
    // The probe says it is ready (a marker file), reads every stdio fd for
    // a line, writes what it got, then marks itself done.
    let code = format!(
        "import os, select, sys, time\n\
         open({ready:?}, 'w').close()\n\
         got = b''\n\
         end = time.time() + 8\n\
         while time.time() < end and b'\\n' not in got:\n\
         \x20   for fd in (0, 1, 2):\n\
         \x20       try:\n\
         \x20           r, _, _ = select.select([fd], [], [], 0.05)\n\
         \x20           if r: got += os.read(fd, 100)\n\
         \x20       except OSError: pass\n\
         open({stolen:?}, 'wb').write(got)\n\
         open({done:?}, 'w').close()\n",
        ready = ready.display().to_string(),
        stolen = stolen.display().to_string(),
        done = done.display().to_string(),
    );
    let mut c = fx.py("workspace-write", extra, &code, &[]);
    use std::os::fd::FromRawFd;
    // SAFETY: fresh fds from dup, each handed to exactly one Stdio.
    unsafe {
        let (a, b) = (libc::dup(pty.slave), libc::dup(pty.slave));
        assert!(a >= 0 && b >= 0);
        if on_stdin {
            // stdin only (not moat's controlling terminal: never foreground).
            libc::close(b);
            c.stdin(std::process::Stdio::from_raw_fd(a))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
        } else {
            c.stdout(std::process::Stdio::from_raw_fd(a))
                .stderr(std::process::Stdio::from_raw_fd(b));
        }
    }
    let mut child = c.spawn().expect("spawn moat");
    // Wait for the probe's marker, then "type" a line on the terminal.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !exists(&ready) {
        assert!(
            std::time::Instant::now() < deadline && child.try_wait().ok().flatten().is_none(),
            "the probe never became ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let line = format!("{typed}\n");
    // SAFETY: writing a local buffer to the master fd the Pty owns.
    let n = unsafe { libc::write(pty.master, line.as_ptr().cast(), line.len()) };
    assert_eq!(n as usize, line.len());
    let status = child.wait().expect("wait moat");
    let shown = String::from_utf8_lossy(&pty.pending().0).into_owned();
    assert!(status.success(), "moat failed: {status:?}\n{shown}");
    assert!(exists(&done), "the probe did not finish:\n{shown}");
    let got = read(&stolen).unwrap_or_default();
    assert!(
        !got.contains(&typed),
        "LEAK: the command read what was typed into the host terminal: {got:?}"
    );
}

#[test]
fn host_terminal_on_stdout_cannot_be_read_from_inside() {
    host_terminal_cannot_be_read_from_inside(false, &[]);
}

#[test]
fn host_terminal_on_stdin_outside_the_foreground_cannot_be_read_from_inside() {
    host_terminal_cannot_be_read_from_inside(true, &[]);
}

#[test]
fn host_terminal_on_stdin_of_a_json_run_cannot_be_read_from_inside() {
    host_terminal_cannot_be_read_from_inside(true, &["--json"]);
}

/// Well-known credential stores beside the listed ones: git's own XDG
/// credential store (the twin of `~/.git-credentials`), PostgreSQL's
/// `.pgpass`, MySQL's `.my.cnf`, Vault's token, Terraform's and RubyGems'
/// API tokens, uv's stored index credentials, Hugging Face's token, hub/glab
/// tokens and s3cmd's keys are hidden wherever the host home is readable.
#[test]
fn other_well_known_credential_stores_are_hidden() {
    let fx = Fixture::new();
    let stores = [
        ".config/git/credentials",
        ".pgpass",
        ".my.cnf",
        ".vault-token",
        ".terraform.d/credentials.tfrc.json",
        ".gem/credentials",
        ".local/share/uv/credentials/credentials.toml",
        ".cache/huggingface/token",
        ".config/hub",
        ".config/glab-cli/config.yml",
        ".s3cfg",
    ];
    let secrets: Vec<(String, String)> = stores
        .iter()
        .map(|rel| {
            let s = unique("STORESECRET");
            write(fx.home.join(rel), &format!("{s}\n"));
            (rel.to_string(), s)
        })
        .collect();
    write(fx.home.join(".config/git/config"), "[user]\n\tname = Ada\n");
    let script = format!(
        "cd {h} && cat {list} 2>&1; cat ~/.config/git/config; echo PROBE_DONE",
        h = fx.home.display(),
        list = stores.join(" ")
    );
    for level in ["read-only", "workspace-write"] {
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("PROBE_DONE");
        // The git configuration beside the store reaches the command (as
        // the sanitized copy under the sandbox HOME).
        out.expect_stdout_has("name = \"Ada\"");
        for (rel, s) in &secrets {
            out.expect_absent(s, &format!("{level}: ~/{rel}"));
        }
    }
}

/// A nested run's moat runs on the host, unsandboxed, and its messages go
/// back into the outer sandbox: its refusal hints must not tell the
/// command whether a path the outer view hides exists on the host (file
/// names outside the view, programs on a PATH the command chose).
#[test]
fn nested_refusal_hints_are_no_host_existence_oracle() {
    let fx = Fixture::new();
    let there = fx.outside.join("secret");
    let absent = fx.outside.join("no-such-file");
    write(fx.outside.join("bin/hidden-tool"), "#!/bin/sh\necho hi\n");
    let seen = fx.w("seen");
    let script = format!(
        "/moat/bin/moat exec --policy workspace-contained -- cat {there} {absent} > {seen} 2>&1; \
         /moat/bin/moat exec --policy workspace-contained --json -- cat {there} {absent} >> {seen} 2>&1; \
         PATH={bin}:/usr/bin:/bin /moat/bin/moat exec --policy workspace-contained -- hidden-tool >> {seen} 2>&1; \
         /moat/bin/moat exec --policy workspace-contained -- {bin}/hidden-tool >> {seen} 2>&1; \
         echo PROBE_DONE",
        there = there.display(),
        absent = absent.display(),
        seen = seen.display(),
        bin = fx.outside.join("bin").display(),
    );
    let out = run(fx.sh("workspace-contained", &["--no-audit"], &script));
    out.expect_stdout_has("PROBE_DONE");
    let inside = read(&seen).unwrap_or_default();
    // The nested runs ran (their commands' own errors are there).
    assert!(
        inside.contains(&format!("cat: {}: No such file", absent.display())),
        "{inside}\n{}",
        out.dump()
    );
    // Nothing tells the existing file from the missing one.
    let outside = fx.outside.display().to_string();
    assert!(
        !inside.contains(&format!("{outside}/secret ("))
            && !inside.contains(&format!("{outside}/secret\\\"")),
        "LEAK: the nested moat named the hidden existing file:\n{inside}"
    );
    let named = |p: &str| inside.matches(p).count();
    assert_eq!(
        named(&format!("{outside}/secret")),
        named(&format!("{outside}/no-such-file")),
        "LEAK: the existing file is reported differently from the missing one:\n{inside}"
    );
    assert!(
        !inside.contains(&format!("it is {outside}/bin/hidden-tool on the host")),
        "LEAK: the nested moat said where the hidden program is on the host:\n{inside}"
    );
}

/// A trusted project file may not pull a credential into the sandbox with
/// `pass_env` (secret-looking names are refused there): moat's own
/// upstream-proxy credential variable and `*_AUTH`/`*_PASS` names included.
#[test]
fn project_file_cannot_pass_credential_variables() {
    let fx = Fixture::new();
    let cfg = fx.root.join("xdg-config");
    let state = fx.root.join("xdg-state");
    std::fs::create_dir_all(cfg.join("moat")).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    let secret = unique("PROXYAUTHSECRET");
    let with_xdg = |mut c: std::process::Command| {
        c.env("XDG_CONFIG_HOME", &cfg).env("XDG_STATE_HOME", &state);
        c
    };
    for name in ["MOAT_UPSTREAM_PROXY_AUTH", "REGISTRY_AUTH", "SMTP_PASS"] {
        write(fx.w(".moat.toml"), &format!("pass_env = [\"{name}\"]\n"));
        let trust = run(with_xdg(
            fx.moat([std::ffi::OsStr::new("trust"), fx.ws.as_os_str()]),
        ));
        let mut c = with_xdg(fx.moat(["run", "sh", "-c", "env; echo PROBE_DONE"]));
        c.env(name, format!("user:{secret}"));
        let out = run(c);
        out.expect_absent(&secret, &format!("project pass_env {name}"));
        if out.code == Some(0) {
            out.expect_stdout_has("PROBE_DONE");
        }
        // Refused (125 naming it), at trust time or at run time.
        let refused = |o: &Out| o.code == Some(125) && o.stderr.contains(name);
        assert!(
            refused(&trust) || (trust.code == Some(0) && refused(&out)),
            "{name}: the project file was not refused\n{}\n{}",
            trust.dump(),
            out.dump()
        );
    }
}

/// A nested run's flags are resolved by a moat on the host: its answer to
/// `--ro PATH`/`--cwd PATH` must not differ between a hidden path that
/// exists and one that does not (also behind a symlink the caller planted
/// in the workspace), nor name where a symlink leads outside the view.
#[test]
fn nested_flags_are_no_host_existence_oracle() {
    let fx = Fixture::new();
    write(fx.outside.join("dir/file"), "x\n");
    let o = fx.outside.display().to_string();
    std::os::unix::fs::symlink(fx.outside.join("dir"), fx.w("to-there")).unwrap();
    std::os::unix::fs::symlink(fx.outside.join("nodir"), fx.w("to-nowhere")).unwrap();
    let pairs = [
        (format!("--ro {o}/dir/file"), format!("--ro {o}/dir/nofile")),
        (format!("--ro {o}/dir"), format!("--ro {o}/nodir")),
        (format!("--cwd {o}/dir"), format!("--cwd {o}/nodir")),
        ("--ro to-there".to_string(), "--ro to-nowhere".to_string()),
        (
            "--ro to-there/file".to_string(),
            "--ro to-there/nofile".to_string(),
        ),
    ];
    let mut script = String::from("cd ");
    script.push_str(&fx.ws.display().to_string());
    for (i, (a, b)) in pairs.iter().enumerate() {
        script.push_str(&format!(
            "; echo 'A{i}<'$(/moat/bin/moat exec --policy workspace-contained {a} -- true 2>&1; echo rc=$?)'>'\
             ; echo 'B{i}<'$(/moat/bin/moat exec --policy workspace-contained {b} -- true 2>&1; echo rc=$?)'>'"
        ));
    }
    script.push_str("; echo PROBE_DONE");
    let out = run(fx.sh("workspace-contained", &["--no-audit"], &script));
    out.expect_stdout_has("PROBE_DONE");
    let answer = |tag: &str| {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{tag}<")))
            .unwrap_or_else(|| panic!("no {tag}\n{}", out.dump()))
            .to_string();
        // The names given differ; everything else must not.
        line[tag.len()..]
            .replace("dir/nofile", "dir/file")
            .replace("nodir", "dir")
            .replace("to-nowhere", "to-there")
            .replace("to-there/nofile", "to-there/file")
    };
    for (i, pair) in pairs.iter().enumerate() {
        let (a, b) = (answer(&format!("A{i}")), answer(&format!("B{i}")));
        assert!(a.contains("rc=125"), "{}: not refused: {a}", pair.0);
        assert_eq!(
            a, b,
            "LEAK: the nested moat answers differently for an existing and a missing hidden path ({} / {})",
            pair.0, pair.1
        );
    }
}

/// The broker takes the caller's directory from the request: a request
/// naming a workspace symlink that leads outside the outer view is refused
/// with the same answer whether its target exists on the host or not.
#[test]
fn nested_request_cwd_symlink_is_no_host_existence_oracle() {
    let fx = Fixture::new();
    write(fx.outside.join("dir/file"), "x\n");
    std::os::unix::fs::symlink(fx.outside.join("dir"), fx.w("to-there")).unwrap();
    std::os::unix::fs::symlink(fx.outside.join("nodir"), fx.w("to-nowhere")).unwrap();
    // A hand-made request (the client sends its getcwd; a forged one can
    // send anything): the same JSON the in-sandbox moat sends.
    let code = r#"
import json, socket, array, sys, os
def ask(cwd):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("/moat/broker.sock")
    req = json.dumps({"args": ["exec", "--policy", "workspace-contained", "--", "true"], "cwd": cwd, "env": []}).encode()
    fds = array.array("i", [0, 1, 2])
    s.sendmsg([len(req).to_bytes(4, "big") + req], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    out = b""
    while True:
        b = s.recv(4096)
        if not b: break
        out += b
    return out.decode(errors="replace")
ws = sys.argv[1]
a = ask(ws + "/to-there").replace("to-there", "LINK")
b = ask(ws + "/to-nowhere").replace("to-nowhere", "LINK")
print("A<" + a + ">")
print("B<" + b + ">")
print("SAME" if a == b else "DIFFERENT")
print("PROBE_DONE")
"#;
    let ws = fx.ws.display().to_string();
    let out = run(fx.py("workspace-contained", &["--no-audit"], code, &[&ws]));
    out.expect_stdout_has("PROBE_DONE");
    assert!(
        out.stdout.contains("SAME"),
        "LEAK: the broker answers differently for a symlinked cwd whose target exists\n{}",
        out.dump()
    );
    out.expect_absent(
        &format!("{}/dir", fx.outside.display()),
        "the symlink target named by the broker",
    );
}

/// `/tmp` as the workspace (or granted whole) showed the host's shared
/// /tmp, where tmux, X11 and ssh-agent keep their sockets: connect() needs
/// no write access to the mount, so even `workspace-contained` reached a
/// host service. moat refuses the shared temporary directories themselves
/// (a directory inside them stays usable).
#[test]
fn shared_tmp_as_workspace_or_grant_exposes_no_host_socket() {
    let dir = std::path::PathBuf::from(format!("/tmp/{}", unique("rt2sock")));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let _rm = RmOnDrop(dir.clone());
    let sock = dir.join("s");
    let listener = Listener::unix(&sock);
    let fx = Fixture::new();
    let code = format!(
        "import socket\nprint('PROBE_RAN')\ns = socket.socket(socket.AF_UNIX)\n\
         try:\n    s.connect({:?}); print('CONNECTED')\nexcept OSError as e: print('refused', e)\n",
        sock.display().to_string()
    );
    let mut runs = Vec::new();
    for level in ["read-only", "workspace-write", "workspace-contained"] {
        for extra in [
            vec!["--cwd", "/tmp"],
            vec!["--ro", "/tmp"],
            vec!["--rw", "/tmp"],
            vec!["--cwd", "/var/tmp"],
        ] {
            let out = run(fx.py(level, &extra, &code, &[]));
            out.expect_absent("CONNECTED", &format!("{level} {extra:?}"));
            // Refused up front, naming the directory (not a silent downgrade).
            out.expect_code(125);
            assert!(out.stderr.contains("shares it"), "{}", out.dump());
            runs.push(out);
        }
    }
    // A directory inside /tmp is still a workspace (positive side).
    let inside = run({
        let mut c = fx.py("workspace-contained", &[], "print('PROBE_RAN')", &[]);
        c.current_dir(&dir);
        c
    });
    inside.expect_code(0);
    inside.expect_stdout_has("PROBE_RAN");
    let (hits, _) = listener.finish();
    assert_eq!(
        hits, 0,
        "LEAK: a sandboxed command connected to a host socket in /tmp"
    );
}

/// A nested request naming `--upstream-proxy-auth-file` made the host-side
/// moat read that file (any file the user can read) and answer "cannot
/// read", "must be USER:PASSWORD" or "is a directory": an oracle on
/// existence and content. Refused before any file is touched, one answer.
#[test]
fn nested_upstream_auth_file_is_never_read() {
    let fx = Fixture::new();
    write(fx.outside.join("nocolon"), "justaword\n");
    write(fx.outside.join("colon"), "user:pw\n");
    let o = fx.outside.display().to_string();
    let files = [
        format!("{o}/nocolon"),
        format!("{o}/colon"),
        format!("{o}/missing"),
        o.clone(),
    ];
    let mut script = String::new();
    for (i, f) in files.iter().enumerate() {
        script.push_str(&format!(
            "echo 'R{i}<'$(/moat/bin/moat exec --policy workspace-contained --network proxy \
             --upstream-proxy http://127.0.0.1:9 --upstream-proxy-auth-file {f} -- true 2>&1; echo rc=$?)'>'; "
        ));
    }
    script.push_str("echo PROBE_DONE");
    let out = run(fx.sh("workspace-contained", &["--no-audit"], &script));
    out.expect_stdout_has("PROBE_DONE");
    let answers: Vec<String> = (0..files.len())
        .map(|i| {
            let tag = format!("R{i}<");
            let line = out
                .stdout
                .lines()
                .find(|l| l.starts_with(&tag))
                .unwrap_or_else(|| panic!("no {tag}\n{}", out.dump()));
            line.replace(&files[i], "FILE")
        })
        .collect();
    for a in &answers {
        assert!(a.contains("rc=125"), "not refused: {a}");
        assert_eq!(
            a.replace("R1<", "R0<")
                .replace("R2<", "R0<")
                .replace("R3<", "R0<"),
            answers[0],
            "LEAK: the nested moat's answer depends on the file"
        );
        assert!(
            !a.contains("USER:PASSWORD") && !a.contains("cannot read"),
            "{a}"
        );
    }
}

/// What the command writes to its terminal reaches the user's terminal:
/// control strings that act on the host through it (OSC 52 sets the host
/// clipboard, which the sandbox otherwise cannot reach; iTerm2's OSC 1337
/// and kitty's transfers write files; tmux passthrough) must not arrive,
/// while ordinary output and a window title do.
#[test]
fn terminal_output_cannot_set_the_host_clipboard() {
    let fx = Fixture::new();
    let pty = Pty::open();
    let script = "printf 'VISIBLE_START\\033]0;a title\\007\\033]52;c;Q0xJUEJPQVJE\\007\
                  \\033]1337;File=name=eA==;inline=0:RklMRUJPRFk=\\007\
                  \\033Ptmux;\\033\\033]52;c;VE1VWENMSVA=\\007\\033\\\\VISIBLE_END\\n'";
    let mut c = fx.sh("workspace-write", &[], script);
    use std::os::fd::FromRawFd;
    // SAFETY: fresh fds from dup, each handed to exactly one Stdio.
    unsafe {
        let (a, b) = (libc::dup(pty.slave), libc::dup(pty.slave));
        assert!(a >= 0 && b >= 0);
        c.stdout(std::process::Stdio::from_raw_fd(a))
            .stderr(std::process::Stdio::from_raw_fd(b));
    }
    let status = c.status().expect("run moat");
    let shown = String::from_utf8_lossy(&pty.output_through("VISIBLE_END")).into_owned();
    assert!(status.success(), "{status:?}\n{shown:?}");
    assert!(
        shown.contains("VISIBLE_START") && shown.contains("VISIBLE_END"),
        "the output did not arrive: {shown:?}"
    );
    assert!(
        shown.contains("\x1b]0;a title"),
        "the title was dropped: {shown:?}"
    );
    for bad in [
        "Q0xJUEJPQVJE",
        "RklMRUJPRFk=",
        "VE1VWENMSVA=",
        "]52;",
        "]1337;",
    ] {
        assert!(
            !shown.contains(bad),
            "LEAK: {bad} reached the host terminal: {shown:?}"
        );
    }
}

/// A terminal another program left non-blocking (node does; the flag
/// belongs to the open file description, so moat's stdout shares it) still
/// gets all of the command's output: moat waits for room on EAGAIN instead
/// of dropping what did not fit. The reader starts late, so the terminal
/// fills up first.
#[test]
fn output_to_a_non_blocking_terminal_arrives_whole() {
    let fx = Fixture::new();
    let pty = Pty::open();
    let script = "i=0; while [ $i -lt 2000 ]; do printf 'L%04d-%0100d\\n' $i 0; i=$((i+1)); done; echo ALL_DONE";
    let mut c = fx.sh("workspace-write", &[], script);
    use std::os::fd::FromRawFd;
    // SAFETY: fcntl on our fd; fresh fds from dup, each handed to exactly one Stdio.
    unsafe {
        let fl = libc::fcntl(pty.slave, libc::F_GETFL);
        assert!(libc::fcntl(pty.slave, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0);
        let (a, b) = (libc::dup(pty.slave), libc::dup(pty.slave));
        assert!(a >= 0 && b >= 0);
        c.stdout(std::process::Stdio::from_raw_fd(a))
            .stderr(std::process::Stdio::from_raw_fd(b));
    }
    let mut child = c.spawn().expect("run moat");
    std::thread::sleep(Duration::from_secs(1));
    let shown = String::from_utf8_lossy(&pty.output_through("ALL_DONE")).into_owned();
    let status = child.wait().expect("wait for moat");
    assert!(status.success(), "{status:?}");
    let missing: Vec<String> = (0..2000)
        .map(|i| format!("L{i:04}-"))
        .filter(|l| !shown.contains(l.as_str()))
        .collect();
    assert!(
        missing.is_empty() && shown.contains("ALL_DONE"),
        "LOST: {} of 2000 lines never reached the terminal (first: {:?})",
        missing.len(),
        missing.first()
    );
}

/// moat's own refusal lines name paths the command chose and are not part
/// of the command's (filtered) terminal output; a file name carrying a
/// control string must arrive escaped in them (here on a pipe, where moat
/// reads the command's stderr to explain refusals).
#[test]
fn refusal_lines_cannot_carry_terminal_control_strings() {
    let fx = Fixture::new();
    let script = "f=$(printf '/usr/x\\033]52;c;UkVGVVNBTA==\\007'); echo > \"$f\"; echo PROBE_DONE";
    let out = run(fx.sh("workspace-write", &[], script));
    out.expect_stdout_has("PROBE_DONE");
    let line = out
        .stderr
        .lines()
        .find(|l| l.starts_with("moat: denied write /usr/x"))
        .unwrap_or_else(|| panic!("no refusal line\n{}", out.dump()));
    assert!(
        !line.contains('\x1b') && !line.contains('\x07'),
        "LEAK: moat's refusal line carries raw control characters: {line:?}"
    );
    assert!(line.contains("\\u{1b}]52;"), "{line:?}");
}

/// Every run with a terminal now has a pty; switching its line discipline
/// (TIOCSETD, the way into n_gsm/n_hdlc kernel bugs) is refused. N_NULL is
/// a discipline the kernel has built in, so outside moat the call works.
#[test]
fn line_discipline_of_the_sandbox_pty_cannot_be_changed() {
    const PROBE: &str = "import fcntl, os, pty, struct, termios\n\
        m, s = pty.openpty()\n\
        try:\n    fcntl.ioctl(s, termios.TIOCSETD, struct.pack('i', 27)); print('PROBE tiocsetd OK')\n\
        except OSError as e: print('PROBE tiocsetd ERRNO', e.errno)\n";
    // Positive control: outside moat the built-in N_NULL can be set.
    let ctl = run({
        let mut c = std::process::Command::new("/usr/bin/python3");
        c.args(["-c", PROBE]);
        c
    });
    let fx = Fixture::new();
    for level in ["read-only", "workspace-write", "workspace-contained"] {
        let out = run(fx.py(level, &[], PROBE, &[]));
        out.expect_stdout_has("PROBE tiocsetd");
        if ctl.stdout.contains("PROBE tiocsetd OK") {
            expect_probe_errno(&out, &["tiocsetd"], libc::EPERM);
        } else {
            // The host has no N_NULL: the call fails either way, but never works.
            out.expect_absent("PROBE tiocsetd OK", level);
        }
    }
}

/// The injected registry credential goes to that host and port only: not
/// to another port of the same host when the request names the registry in
/// its Host header, and a spoofed Host header on a request to the registry
/// is replaced (the credential never travels under another virtual host).
#[test]
fn injected_registry_credential_follows_the_target_not_the_host_header() {
    let fx = Fixture::new();
    let secret = unique("HOSTSECRET");
    let (port, seen) = echo_server();
    let (other, seen_other) = echo_server();
    write(
        fx.home.join(".config/pip/pip.conf"),
        &format!("[global]\nindex-url = http://me:{secret}@127.0.0.1:{port}/simple\n"),
    );
    let script = format!(
        "/usr/bin/curl -sS -m 20 -o /dev/null -H 'Host: 127.0.0.1:{port}' http://127.0.0.1:{other}/a; \
         /usr/bin/curl -sS -m 20 -o /dev/null -H 'Host: attacker.example' http://127.0.0.1:{port}/b; \
         echo PROBE_DONE"
    );
    let out = run(fx.sh(
        "workspace-write",
        &[
            "--network",
            "proxy",
            "--allow-domain",
            &format!("127.0.0.1:{port}"),
            "--allow-domain",
            &format!("127.0.0.1:{other}"),
        ],
        &script,
    ));
    out.expect_stdout_has("PROBE_DONE");
    let b64 = {
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s 'me:{secret}' | base64 -w0"))
            .output()
            .unwrap();
        String::from_utf8(o.stdout).unwrap()
    };
    let other_heads = seen_other.lock().unwrap().clone();
    assert!(
        other_heads.iter().any(|h| h.starts_with("GET /a")),
        "the other port got no request: {other_heads:?}\n{}",
        out.dump()
    );
    assert!(
        !other_heads.iter().any(|h| h.contains(&b64)),
        "LEAK: the credential went to another port: {other_heads:?}"
    );
    let heads = seen.lock().unwrap().clone();
    let b = heads
        .iter()
        .find(|h| h.starts_with("GET /b"))
        .unwrap_or_else(|| panic!("no /b request: {heads:?}"));
    assert!(b.contains(&b64), "the registry lost its credential: {b}");
    assert!(
        !b.to_ascii_lowercase().contains("host: attacker.example"),
        "LEAK: the credential travelled under a spoofed Host: {b}"
    );
}

/// The children of every thread of `pid` (`/proc/PID/task/*/children`).
fn children_of(pid: i32) -> Vec<i32> {
    let mut kids = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return kids;
    };
    for t in tasks.flatten() {
        let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        kids.extend(
            list.split_whitespace()
                .filter_map(|k| k.parse::<i32>().ok()),
        );
    }
    kids
}

/// Whether `pid` has exited and waits to be reaped (state Z).
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// A command that ends at once still shows its output on the terminal.
/// The init hands the supervisor the broker's socket and then the pty
/// master over one socket; made deterministic here, the command's whole
/// life passes while moat is stopped right after it sent the plan, so when
/// moat goes on, the init's exit, the broker's socket and the pty master
/// are all there at once. The output must still arrive on the terminal.
#[test]
fn output_of_a_command_that_ended_before_moat_looked_reaches_the_terminal_contract() {
    use std::io::BufRead;
    use std::os::fd::FromRawFd;
    for round in 0..3 {
        let fx = Fixture::new();
        let pty = Pty::open();
        let wrote = fx.w("wrote");
        let needle = unique("QUICKOUT");
        let script = format!("echo {needle}; : > {}", wrote.display());
        let mut c = fx.sh("workspace-write", &[], &script);
        c.env("MOAT_TRACE_TIMING", "1")
            .stderr(std::process::Stdio::piped());
        // SAFETY: a fresh fd from dup, handed to exactly one Stdio.
        unsafe {
            let a = libc::dup(pty.slave);
            assert!(a >= 0);
            c.stdout(std::process::Stdio::from_raw_fd(a));
        }
        let mut child = c.spawn().expect("spawn moat");
        let pid = child.id() as i32;
        let stderr = child.stderr.take().expect("stderr");
        let (tx, stopped) = std::sync::mpsc::channel();
        // moat is not reaped before this thread is done (the main thread
        // waits for it first), so the pid it stops is moat's.
        let reader = std::thread::spawn(move || {
            let own = format!("moat-timing: {pid} ");
            let mut all = String::new();
            let mut sent = false;
            // The plan is sent to an init cloned ahead (then "clone the
            // init" came before the pipes), or the init is cloned with it.
            let mut pipes = false;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let mine = line.starts_with(&own);
                pipes |= mine && line.contains("seccomp filter, pipes, signal mask");
                if !sent
                    && mine
                    && (line.contains("the plan sent to the early init")
                        || (pipes && line.contains("clone the init (new namespaces)")))
                {
                    // SAFETY: kill(2) on our own unreaped child.
                    unsafe { libc::kill(pid, libc::SIGSTOP) };
                    sent = true;
                    let _ = tx.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        // Err: stderr ended without the mark (a moat without the trace).
        let was_stopped = stopped.recv().is_ok();
        if was_stopped {
            // A hang guard, not a timing assertion.
            let guard = std::time::Instant::now() + Duration::from_secs(120);
            loop {
                let kids = children_of(pid);
                if exists(&wrote) && !kids.is_empty() && kids.iter().all(|k| is_zombie(*k)) {
                    break;
                }
                if std::time::Instant::now() > guard {
                    // SAFETY: as above.
                    unsafe { libc::kill(pid, libc::SIGCONT) };
                    panic!("round {round}: the command never ended while moat was stopped");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
        let status = child.wait().expect("wait for moat");
        let err = reader.join().expect("the stderr reader");
        let shown = String::from_utf8_lossy(&pty.output_through(&needle)).into_owned();
        assert!(status.success(), "round {round}: {status:?}\n{err}");
        assert!(
            shown.contains(&needle),
            "LOST (round {round}, moat stopped: {was_stopped}): the command's output never reached the terminal: {shown:?}\n{err}"
        );
    }
}
