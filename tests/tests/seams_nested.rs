//! Issue 8 §2 and §3: what crosses a run's edges. A nested run gets at most
//! the outer run's own view (stand-ins, write-protected paths, hidden
//! sockets, deny list, upstream proxy, net class); grants mirrored under the
//! sandbox HOME carry the same stand-ins and read-only binds; moat's own
//! config and state are never writable from inside. Each test asserts the
//! side effect (secret bytes absent, host file unchanged, listener silent)
//! and a marker proving the probe ran.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use moat_conformance::*;

/// Waits (as a hang guard only) until `p` exists.
fn wait_for_file(p: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if exists(p) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// `cd $WS/sub` inside the outer run and ask for a nested run there.
fn ws_with_env(fx: &Fixture) -> PathBuf {
    write(fx.w(".env"), &format!("TOKEN={}\n", fx.env_secret));
    let sub = fx.w("sub");
    std::fs::create_dir_all(&sub).unwrap();
    sub
}

// ------------------------------------------------- §2 nested runs narrow only

/// `moat exec --policy read-only --cwd $WS/sub -- cat $WS/.env` from inside
/// printed the `.env` the outer run hides: the inner plan re-applies it.
#[test]
fn nested_run_keeps_the_outer_workspace_env_hidden() {
    let fx = Fixture::new();
    ws_with_env(&fx);
    for level in ["workspace-write", "read-only", "workspace-contained"] {
        let script = format!(
            "echo outer-marker; cd sub && /moat/bin/moat exec --policy {inner} --cwd {ws}/sub -- sh -c 'echo inner-marker; cat {ws}/.env'; echo rc=$?",
            inner = if level == "workspace-contained" { "workspace-contained" } else { "read-only" },
            ws = fx.ws.display()
        );
        let out = run(fx.sh(level, &["--no-audit"], &script));
        assert!(
            out.stdout.contains("outer-marker"),
            "{level}: outer ran\n{}",
            out.dump()
        );
        out.expect_absent(&fx.env_secret, "the outer run's hidden .env");
        // Either the inner run ran with the stand-in, or it was refused;
        // read-only inside read-only/workspace-write must still run.
        if level != "workspace-contained" {
            assert!(
                out.stdout.contains("inner-marker"),
                "{level}: a narrower nested run must still work\n{}",
                out.dump()
            );
        }
    }
}

/// `--ro $WS` or `--ro $WS/.env` from inside a run is refused (125, naming
/// what the outer hides), and the bytes never appear.
#[test]
fn nested_grant_over_a_hidden_path_is_refused() {
    let fx = Fixture::new();
    ws_with_env(&fx);
    let ws = fx.ws.display().to_string();
    for level in ["workspace-contained", "read-only"] {
        for grant in [format!("{ws}/.env"), ws.clone()] {
            let script = format!(
                "echo outer-marker; cd sub && /moat/bin/moat exec --policy workspace-contained --cwd {ws}/sub --ro {grant} -- cat {ws}/.env; echo rc=$?"
            );
            let out = run(fx.sh(level, &["--no-audit"], &script));
            assert!(out.stdout.contains("outer-marker"), "{}", out.dump());
            out.expect_absent(&fx.env_secret, "the outer run's hidden .env");
            assert!(
                out.stdout.contains("rc=125"),
                "{level}: --ro {grant} from inside must be refused\n{}",
                out.dump()
            );
            assert!(
                out.stderr.contains(".env"),
                "the refusal names the hidden path\n{}",
                out.dump()
            );
        }
    }
}

/// A protected home path the outer run hides (the fixture's ~/.ssh) cannot
/// be granted from inside: refused, and the key's bytes stay absent.
#[test]
fn nested_grant_of_a_hidden_home_secret_is_refused() {
    let fx = Fixture::new();
    let ssh = fx.home.join(".ssh");
    let script = format!(
        "echo outer-marker; /moat/bin/moat exec --ro {s} -- cat {s}/id_rsa; echo rc=$?; /moat/bin/moat exec --ro {h} -- cat {s}/id_rsa; echo rc2=$?",
        s = ssh.display(),
        h = fx.home.display()
    );
    let out = run(fx.sh("read-only", &["--no-audit"], &script));
    assert!(out.stdout.contains("outer-marker"), "{}", out.dump());
    out.expect_absent(&fx.ssh_secret, "the outer run's hidden ~/.ssh");
    assert!(
        out.stdout.contains("rc=125") && out.stdout.contains("rc2=125"),
        "{}",
        out.dump()
    );
}

/// As root, `--ro /etc/shadow` and `--ro /home/OTHER/.ssh` from inside printed
/// them. Root only: an unprivileged caller's kernel already keeps it out.
#[test]
fn nested_root_cannot_grant_etc_shadow_or_another_users_ssh() {
    if euid() != 0 {
        return skip(
            "needs root: /etc/shadow and other users' homes are the kernel's to refuse otherwise",
        );
    }
    let fx = Fixture::new();
    // Another user's existing home (a directory that disappears while other
    // tests run as root would make their runs fail to mount its stand-in):
    // only our key file comes and goes.
    let Some(other) = std::fs::read_dir("/home").ok().and_then(|d| {
        d.flatten()
            .map(|e| e.path())
            .find(|p| p.is_dir() && !p.starts_with(&fx.root))
    }) else {
        return skip("no other home under /home to protect");
    };
    let ssh = other.join(".ssh");
    if !exists(&ssh) {
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::metadata(&other).unwrap();
        std::fs::create_dir(&ssh).unwrap();
        std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&ssh, Some(owner.uid()), Some(owner.gid())).unwrap();
    }
    let key = unique("OTHERKEY");
    let key_file = ssh.join(unique("id_test"));
    let _rm = RmOnDrop(key_file.clone());
    write(&key_file, &key);
    let shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    let root_line = shadow
        .lines()
        .find(|l| l.starts_with("root:"))
        .unwrap_or("")
        .to_string();
    let script = format!(
        "echo outer-marker; /moat/bin/moat exec --ro /etc/shadow -- cat /etc/shadow; echo rc=$?; \
         /moat/bin/moat exec --ro {o}/.ssh -- cat {k}; echo rc2=$?",
        o = other.display(),
        k = key_file.display()
    );
    let out = run(fx.sh("read-only", &["--no-audit"], &script));
    assert!(out.stdout.contains("outer-marker"), "{}", out.dump());
    out.expect_absent(&key, "another user's ssh key");
    if !root_line.is_empty() {
        out.expect_absent(&root_line, "/etc/shadow");
    }
    assert!(
        out.stdout.contains("rc=125") && out.stdout.contains("rc2=125"),
        "{}",
        out.dump()
    );
}

/// `--rw $WS/.git/hooks --rw $WS/.git/config` from inside planted a hook and
/// an fsmonitor a later host `git status` runs: refused, host files unchanged.
#[test]
fn nested_grant_of_write_protected_git_paths_is_refused() {
    let fx = Fixture::new();
    let hooks = fx.w(".git/hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    write(fx.w(".git/config"), "[core]\n\tbare = false\n");
    write(fx.w(".git/HEAD"), "ref: refs/heads/main\n");
    let marker = unique("HOOKRAN");
    let script = format!(
        "echo outer-marker; /moat/bin/moat exec --policy workspace-write --rw {ws}/.git/hooks --rw {ws}/.git/config -- sh -c 'echo inner-ran; echo \"echo {marker}\" > {ws}/.git/hooks/pre-commit; printf \"[core]\\n\\tfsmonitor = echo {marker}\\n\" >> {ws}/.git/config'; echo rc=$?",
        ws = fx.ws.display()
    );
    let out = run(fx.sh("workspace-write", &["--no-audit"], &script));
    assert!(out.stdout.contains("outer-marker"), "{}", out.dump());
    assert!(out.stdout.contains("rc=125"), "{}", out.dump());
    assert!(!out.stdout.contains("inner-ran"), "{}", out.dump());
    assert!(
        !exists(fx.w(".git/hooks/pre-commit")),
        "a hook was planted\n{}",
        out.dump()
    );
    assert_eq!(
        read(fx.w(".git/config")).as_deref(),
        Some("[core]\n\tbare = false\n"),
        "{}",
        out.dump()
    );
}

/// `$SSH_AUTH_SOCK` outside /run and /tmp: the outer run hides it, and so
/// must a nested run, although the host-side moat that launches it never
/// sees the outer environment. The listener sees no connection.
#[test]
fn nested_run_keeps_the_agent_socket_hidden() {
    let fx = Fixture::new();
    let sock = fx.root.join("agent.sock");
    let listener = Listener::unix(&sock);
    let probe = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({:?})\n    print('PROBE agent OK')\nexcept OSError as e:\n    print('PROBE agent ERRNO', e.errno)\n",
        sock.display().to_string()
    );
    write(fx.w("probe.py"), &probe);
    let script = "echo outer-marker; python3 probe.py | sed 's/^PROBE /PROBE outer_/'; /moat/bin/moat exec -- python3 probe.py | sed 's/^PROBE /PROBE inner_/'";
    let mut cmd = fx.sh("read-only", &["--no-audit"], script);
    cmd.env("SSH_AUTH_SOCK", &sock);
    let out = run(cmd);
    assert!(out.stdout.contains("outer-marker"), "{}", out.dump());
    let res = probe_results(&out);
    for n in ["outer_agent", "inner_agent"] {
        match res.iter().find(|(k, _)| k == n) {
            Some((_, r)) if r.starts_with("ERRNO") => {}
            other => panic!("{n}: {other:?}\n{}", out.dump()),
        }
    }
    let (conns, _) = listener.finish();
    assert_eq!(
        conns,
        0,
        "the agent socket saw a connection\n{}",
        out.dump()
    );
}

/// `--upstream-proxy http://HOST:PORT` from inside made the host-side proxy
/// tunnel anywhere (host loopback included): refused, the listener is silent.
#[test]
fn nested_run_cannot_choose_an_upstream_proxy() {
    let fx = Fixture::new();
    let (listener, port) = Listener::tcp();
    let script = format!(
        "echo outer-marker; /moat/bin/moat exec --network proxy --allow-domain example.com --upstream-proxy http://127.0.0.1:{port} -- python3 -c \"import urllib.request; print('inner-ran'); urllib.request.urlopen('http://example.com/', timeout=5)\"; echo rc=$?"
    );
    let out = run(fx.sh(
        "read-only",
        &[
            "--no-audit",
            "--network",
            "proxy",
            "--allow-domain",
            "example.com",
        ],
        &script,
    ));
    assert!(out.stdout.contains("outer-marker"), "{}", out.dump());
    assert!(out.stdout.contains("rc=125"), "{}", out.dump());
    assert!(
        out.stderr.contains("--upstream-proxy"),
        "the refusal names the flag\n{}",
        out.dump()
    );
    let (conns, _) = listener.finish();
    assert_eq!(
        conns,
        0,
        "the chosen upstream saw a connection\n{}",
        out.dump()
    );
}

/// A nested run inherits the outer deny list and upstream proxy: a denied
/// host is refused even if the inner run allows it, and allowed traffic
/// still goes through the outer upstream (the positive control).
#[test]
fn nested_run_inherits_the_deny_list_and_the_upstream() {
    let fx = Fixture::new();
    let upstream = HttpServer::fixed("via-upstream");
    let py = "import sys, urllib.request\nprint('inner-ran')\nfor h in sys.argv[1:]:\n    try:\n        urllib.request.urlopen('https://%s/' % h, timeout=10)\n        print('PROBE', h.split('.')[0], 'OK')\n    except Exception as e:\n        print('PROBE', h.split('.')[0], 'ERR', type(e).__name__)\n";
    write(fx.w("fetch.py"), py);
    let script = "echo outer-marker; /moat/bin/moat exec --network proxy --allow-domain '*.example.com' -- python3 fetch.py good.example.com bad.example.com; echo rc=$?";
    let up = format!("http://127.0.0.1:{}", upstream.port);
    let out = run(fx.sh(
        "read-only",
        &[
            "--no-audit",
            "--network",
            "proxy",
            "--allow-domain",
            "*.example.com",
            "--deny-domain",
            "bad.example.com",
            "--upstream-proxy",
            &up,
        ],
        script,
    ));
    assert!(out.stdout.contains("inner-ran"), "{}", out.dump());
    let reqs = upstream.requests();
    assert!(
        reqs.iter().any(|r| r.contains("good.example.com")),
        "control: the nested run's allowed request goes through the outer upstream: {reqs:?}\n{}",
        out.dump()
    );
    assert!(
        !reqs.iter().any(|r| r.contains("bad.example.com")),
        "the outer --deny-domain was not inherited: {reqs:?}\n{}",
        out.dump()
    );
}

/// A tool's net class survives `exec /moat/bin/moat exec --network proxy …`
/// from a net-denied tool: the nested command cannot open an inet socket.
#[test]
fn nested_run_keeps_the_callers_net_class() {
    let fx = Fixture::new();
    let cfg = fx.root.join("xdg-config");
    let state = fx.root.join("xdg-state");
    let pd = cfg.join("moat/profiles");
    write(
        pd.join("agentsh.toml"),
        "name = \"agentsh\"\nprogram = \"bash\"\nlevel = \"rw\"\nnetwork = \"proxy\"\nnet_class = \"unconfined\"\n",
    );
    write(
        pd.join("python3.toml"),
        "name = \"python3\"\nprogram = \"python3\"\nlevel = \"rw\"\nnetwork = \"proxy\"\nnet_class = \"net-denied\"\n",
    );
    std::fs::create_dir_all(&state).unwrap();
    let inet = "import socket\ntry:\n    socket.socket(socket.AF_INET).close()\n    print('PROBE inet OK')\nexcept OSError as e:\n    print('PROBE inet ERRNO', e.errno)\n";
    write(fx.w("inet.py"), inet);
    // python3 resolves to the net-denied shim; from there, exec a nested
    // run of the real interpreter.
    let hop = "import os\nos.execv('/moat/bin/moat', ['moat', 'exec', '--network', 'proxy', '--', '/usr/bin/python3', 'inet.py'])\n";
    write(fx.w("hop.py"), hop);
    let script = "echo outer-marker; /usr/bin/python3 inet.py | sed 's/^PROBE /PROBE plain_/'; python3 hop.py | sed 's/^PROBE /PROBE hop_/'";
    let mut cmd = fx.moat(["run", "--no-audit", "agentsh", "-c", script]);
    cmd.env("XDG_CONFIG_HOME", &cfg)
        .env("XDG_STATE_HOME", &state);
    let out = run(cmd);
    assert!(out.stdout.contains("outer-marker"), "{}", out.dump());
    let res = probe_results(&out);
    assert_eq!(
        res.iter()
            .find(|(k, _)| k == "plain_inet")
            .map(|(_, r)| r.as_str()),
        Some("OK"),
        "control: an unclassed process opens inet sockets\n{}",
        out.dump()
    );
    match res.iter().find(|(k, _)| k == "hop_inet") {
        Some((_, r)) if r.starts_with("ERRNO 1") => {}
        other => panic!(
            "a net-denied tool's nested run opened an inet socket: {other:?}\n{}",
            out.dump()
        ),
    }
}

/// `--pass-env` values of a nested request never appear on a command line
/// (`ps` showed them): checked on every process while the inner run waits.
#[test]
fn nested_pass_env_values_stay_off_command_lines() {
    let fx = Fixture::new();
    let value = unique("PASSVAL");
    let started = fx.w("started");
    let go = fx.w("go");
    // The value comes from a file, so no command line the test starts holds it.
    write(fx.w("val"), &value);
    let script = format!(
        "echo outer-marker; export PASSME=$(cat val); /moat/bin/moat exec --policy workspace-write --pass-env PASSME -- sh -c 'echo inner=$PASSME; touch {s}; while [ ! -e {g} ]; do sleep 0.05; done'; echo rc=$?",
        s = started.display(),
        g = go.display()
    );
    let running = spawn(fx.sh("workspace-write", &["--no-audit"], &script));
    let up = wait_for_file(&started, Duration::from_secs(60));
    let mut seen = Vec::new();
    if up {
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            if let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) {
                if String::from_utf8_lossy(&cmdline).contains(&value) {
                    seen.push(e.file_name().to_string_lossy().into_owned());
                }
            }
        }
    }
    write(&go, "");
    let out = running.wait();
    assert!(up, "the inner run never started\n{}", out.dump());
    assert!(
        out.stdout.contains(&format!("inner={value}")),
        "control: --pass-env still passes the value\n{}",
        out.dump()
    );
    assert!(
        seen.is_empty(),
        "value on the command line of pids {seen:?}"
    );
}

/// Idle connections to the broker must not each cost a host thread.
#[test]
fn idle_broker_connections_are_bounded() {
    let fx = Fixture::new();
    let opened = fx.w("opened");
    let go = fx.w("go");
    let code = format!(
        "import socket, os, time\nconns = []\nfor i in range(200):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect('/moat/broker.sock')\n    conns.append(s)\nprint('opened', len(conns), flush=True)\nopen({o:?}, 'w').close()\nwhile not os.path.exists({g:?}):\n    time.sleep(0.05)\n",
        o = opened.display().to_string(),
        g = go.display().to_string()
    );
    let running = spawn(fx.py("workspace-write", &["--no-audit"], &code, &[]));
    let pid = running.child.id();
    let up = wait_for_file(&opened, Duration::from_secs(60));
    // Let the broker take every pending connection (it accepts them as they
    // arrive; a few more rounds of its loop) before counting.
    let mut threads = 0;
    if up {
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(50));
            threads = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|d| d.count())
                .unwrap_or(0)
                .max(threads);
        }
    }
    write(&go, "");
    let out = running.wait();
    assert!(
        up,
        "the command never opened its connections\n{}",
        out.dump()
    );
    assert!(out.stdout.contains("opened 200"), "{}", out.dump());
    assert!(
        threads > 0 && threads < 64,
        "200 idle broker connections made {threads} host threads"
    );
}

// ------------------------------------ §3 grants mirrored under the sandbox HOME

/// `--ro ~/.config` showed `$HOME/.config/gh/hosts.yml`; `--ro ~/.cargo`
/// showed `credentials.toml`: the mirror under /moat/home gets the stand-ins.
#[test]
fn mirrored_grants_keep_their_stand_ins() {
    let fx = Fixture::new();
    for level in ["read-only", "workspace-write", "workspace-contained"] {
        let cfg = format!("{}/.config", fx.home.display());
        let cargo = format!("{}/.cargo", fx.home.display());
        let out = run(fx.sh(
            level,
            &["--no-audit", "--ro", &cfg, "--ro", &cargo],
            "echo marker-ran; ls \"$HOME/.config\" \"$HOME/.cargo\"; cat \"$HOME/.config/gh/hosts.yml\" \"$HOME/.cargo/credentials.toml\"; true",
        ));
        assert!(out.stdout.contains("marker-ran"), "{level}\n{}", out.dump());
        assert!(
            out.stdout.contains("credentials.toml") || out.stdout.contains("gh"),
            "{level}: control: the mirrors are there\n{}",
            out.dump()
        );
        out.expect_absent(&fx.ssh_secret, "gh token via the mirrored ~/.config");
        out.expect_absent(&fx.netrc_secret, "cargo token via the mirrored ~/.cargo");
    }
}

/// `--rw ~/.local` let the command read and append to moat's audit log via
/// the mirror; `--rw ~/.config` let it rewrite moat's config.toml.
#[test]
fn mirrored_grants_never_expose_moat_state_or_config() {
    let fx = Fixture::new();
    let log = fx.home.join(".local/state/moat/audit.jsonl");
    let config = fx.home.join(".config/moat/config.toml");
    write(&config, "# user config\n");
    // One recorded run first, so the log has content to leak.
    run(fx.sh("read-only", &[], "true")).expect_code(0);
    let before_log = read(&log).unwrap_or_default();
    assert!(!before_log.is_empty(), "control: the audit log was written");
    let evil = unique("EVIL");
    let local = format!("{}/.local", fx.home.display());
    let cfgdir = format!("{}/.config", fx.home.display());
    let script = format!(
        "echo marker-ran; cat \"$HOME/.local/state/moat/audit.jsonl\" | head -c 200; echo; echo {evil} >> \"$HOME/.local/state/moat/audit.jsonl\"; \
         echo '{evil}' > \"$HOME/.config/moat/config.toml\"; echo '{evil}' >> {c}; mkdir -p \"$HOME/.config/moat/profiles\" && echo '{evil}' > \"$HOME/.config/moat/profiles/x.toml\"; true",
        c = config.display()
    );
    let out = run(fx.sh(
        "workspace-write",
        &["--no-audit", "--rw", &local, "--rw", &cfgdir],
        &script,
    ));
    assert!(out.stdout.contains("marker-ran"), "{}", out.dump());
    out.expect_absent("execution.started", "the audit log's records");
    let after_log = read(&log).unwrap_or_default();
    assert!(!after_log.contains(&evil), "the audit log was appended to");
    assert_eq!(read(&config).as_deref(), Some("# user config\n"));
    assert!(!exists(fx.home.join(".config/moat/profiles/x.toml")));
}

/// XDG_CONFIG_HOME / XDG_STATE_HOME inside a writable workspace: a planted
/// `moat/config.toml` or `trust.json` must never appear there (the next run
/// would obey it), whether the directories existed or not.
#[test]
fn moat_dirs_inside_a_writable_workspace_cannot_be_planted() {
    let fx = Fixture::new();
    let cfg = fx.w("xdg/config");
    let state = fx.w("xdg/state");
    let evil = unique("PLANT");
    let script = format!(
        "echo marker-ran; mkdir -p {c}/moat {s}/moat; echo '# {evil}' > {c}/moat/config.toml; echo '{{\"{evil}\":1}}' > {s}/moat/trust.json; \
         mv {c}/moat {c}/moat.old; mkdir -p {c}/moat && echo '# {evil}' > {c}/moat/config.toml; mv {c} {c}.old; true",
        c = cfg.display(),
        s = state.display()
    );
    let mut cmd = fx.sh("workspace-write", &["--no-audit"], &script);
    cmd.env("XDG_CONFIG_HOME", &cfg)
        .env("XDG_STATE_HOME", &state);
    let out = run(cmd);
    assert!(out.stdout.contains("marker-ran"), "{}", out.dump());
    for p in [
        cfg.join("moat/config.toml"),
        state.join("moat/trust.json"),
        cfg.join("moat.old/config.toml"),
        fx.w("xdg/config.old/moat/config.toml"),
    ] {
        assert!(
            !read(&p).unwrap_or_default().contains(&evil),
            "{} was planted\n{}",
            p.display(),
            out.dump()
        );
    }
    // moat's own directories exist and stay private to their owner.
    let mode = std::fs::metadata(cfg.join("moat"))
        .map(|m| m.permissions().mode() & 0o777)
        .unwrap_or(0);
    assert_eq!(mode, 0o700, "{}", out.dump());
}

/// `--rw ~/.config` opts in `~/.config`, not the paths in it that the host
/// runs later or takes credentials from: `~/.config/systemd` stays
/// read-only and a new `~/.config/autostart` does not survive the run,
/// through the host path and through the mirror under /moat/home alike.
#[test]
fn a_writable_home_grant_keeps_its_code_running_children() {
    let fx = Fixture::new();
    let unit = fx.home.join(".config/systemd/user/a.service");
    write(&unit, "[Service]\nExecStart=/bin/true\n");
    let evil = unique("EVIL");
    let cfg = fx.home.join(".config");
    let script = format!(
        "echo marker-ran; echo ok > {c}/other.txt; echo ExecStart={evil} >> {c}/systemd/user/a.service; echo ExecStart={evil} >> \"$HOME/.config/systemd/user/a.service\"; \
         mkdir -p \"$HOME/.config/autostart\" && echo 'Exec={evil}' > \"$HOME/.config/autostart/x.desktop\"; echo 'Exec={evil}' > {c}/autostart/y.desktop; true",
        c = cfg.display()
    );
    let out = run(fx.sh(
        "read-only",
        &["--no-audit", "--rw", &cfg.display().to_string()],
        &script,
    ));
    assert!(out.stdout.contains("marker-ran"), "{}", out.dump());
    assert_eq!(
        read(cfg.join("other.txt")).as_deref(),
        Some("ok\n"),
        "control: the grant is writable\n{}",
        out.dump()
    );
    assert_eq!(
        read(&unit).as_deref(),
        Some("[Service]\nExecStart=/bin/true\n"),
        "{}",
        out.dump()
    );
    for f in ["x.desktop", "y.desktop"] {
        assert!(
            !exists(cfg.join("autostart").join(f)),
            "~/.config/autostart/{f} survived the run\n{}",
            out.dump()
        );
    }
}
