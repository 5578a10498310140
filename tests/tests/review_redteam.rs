//! Red team of the grown protected home list and the sanitized git config
//! copy: a `~/.gitconfig` line git reads differently from moat's parser
//! must not carry a credential into the copy, and the Landlock backend and
//! grants of a parent directory must hide the nested protected paths. Each
//! probe prints a marker proving it ran and the secret's bytes are checked
//! absent from everything it printed.

use moat_conformance::*;

/// A comment after a value that ends in a backslash: git ends the value at
/// the comment and ignores the backslash (no continuation inside a
/// comment), so the next line is a `[credential]` header to git. A parser
/// that joins the next line into the comment reads the credential's keys as
/// keys of `[user]` and keeps them, and misses an `[include]` header the
/// same way, so the included file (where users keep a token) is not hidden.
#[test]
fn gitconfig_backslash_in_a_comment_does_not_hide_a_credential_section() {
    let fx = Fixture::new();
    let user = unique("GITCOMMENTUSER");
    let helper = unique("GITCOMMENTHELPER");
    let local = unique("GITINCLUDEDTOKEN");
    write(
        fx.home.join(".gitconfig"),
        &format!(
            "[user]\n\tname = Ada Lovelace ; work identity \\\n\
             [credential \"https://git.corp.example\"]\n\tusername = {user}\n\
             \thelper = \"!echo {helper}\"\n\
             [user]\n\temail = ada@example.com ; personal \\\n\
             [include]\n\tpath = ~/.gitconfig.local\n[core]\n\teditor = vim\n"
        ),
    );
    write(
        fx.home.join(".gitconfig.local"),
        &format!("[github]\n\ttoken = {local}\n"),
    );
    // Host git agrees: a credential section and an include.
    let listed = std::process::Command::new("git")
        .args(["config", "--no-includes", "--file"])
        .arg(fx.home.join(".gitconfig"))
        .args(["--list"])
        .output()
        .expect("host git");
    let listed = String::from_utf8_lossy(&listed.stdout);
    for entry in [
        format!("credential.https://git.corp.example.username={user}"),
        "include.path=~/.gitconfig.local".to_string(),
    ] {
        assert!(listed.contains(&entry), "{entry}: {listed}");
    }
    let script = format!(
        "cat ~/.gitconfig {}/.gitconfig.local 2>&1; git config --list 2>&1; \
         echo \"NAME=$(git config user.name)\"; echo PROBE_DONE",
        fx.home.display()
    );
    for level in ["read-only", "workspace-write"] {
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("PROBE_DONE");
        // The copy is still there: the identity reaches git.
        out.expect_stdout_has("NAME=Ada Lovelace");
        out.expect_absent(&user, "the credential section's username");
        out.expect_absent(&helper, "the credential section's helper");
        out.expect_absent(&local, "the file an [include] names");
    }
}

/// The protected paths the list grew by are nested (`.local/share/keyrings`,
/// `.var/app`) or reached through a dotfiles symlink (`.config/gh` →
/// `dotfiles/gh`); both backends hide them, and so does a grant of the
/// directory above them (`--rw ~/.config`, `--ro ~/.local`), while a
/// sibling stays readable.
#[test]
fn nested_and_symlinked_protected_paths_stay_hidden_on_both_backends_and_under_parent_grants() {
    let fx = Fixture::new();
    let h = &fx.home;
    let keyring = unique("KEYRINGSECRET");
    let flatpak = unique("FLATPAKSECRET");
    let gh = unique("GHLINKSECRET");
    let sibling = unique("SIBLINGPUBLIC");
    write(h.join(".local/share/keyrings/login.keyring"), &keyring);
    write(h.join(".var/app/org.signal.Signal/config/db"), &flatpak);
    std::fs::remove_dir_all(h.join(".config/gh")).expect("rm fixture gh");
    write(
        h.join("dotfiles/gh/hosts.yml"),
        &format!("oauth_token: {gh}\n"),
    );
    std::os::unix::fs::symlink("../dotfiles/gh", h.join(".config/gh")).expect("symlink");
    write(h.join(".config/tool/settings"), &sibling);
    let home = h.display().to_string();
    let script = format!(
        "for f in .local/share/keyrings/login.keyring .var/app/org.signal.Signal/config/db \
         .config/gh/hosts.yml dotfiles/gh/hosts.yml .config/tool/settings; do \
         cat {home}/$f 2>/dev/null; echo; done; grep -r '' {home} 2>/dev/null; echo PROBE_DONE"
    );
    let grant_config = format!("{home}/.config");
    let grant_local = format!("{home}/.local");
    let grants: [&[&str]; 3] = [&[], &["--rw", &grant_config], &["--ro", &grant_local]];
    for backend in ["namespaces", "landlock"] {
        for grant in grants {
            let mut extra = vec!["--backend", backend];
            extra.extend_from_slice(grant);
            let out = run(fx.sh("read-only", &extra, &script));
            out.expect_stdout_has("PROBE_DONE");
            out.expect_stdout_has(&sibling);
            for (s, what) in [
                (&keyring, "~/.local/share/keyrings"),
                (&flatpak, "~/.var/app"),
                (&gh, "~/.config/gh through its symlink"),
            ] {
                out.expect_absent(s, &format!("{what} ({backend} {grant:?})"));
            }
        }
    }
}

/// The same comment-backslash line in the workspace's own `.git/config`:
/// a copy replaces the file only when the redactor found something to
/// remove, so a `[credential]` section read as the remote's keys left the
/// raw file (and its credential) in the view.
#[test]
fn workspace_git_config_backslash_in_a_comment_does_not_show_a_credential_section() {
    let fx = Fixture::new();
    let user = unique("WSGITCOMMENTUSER");
    let init = std::process::Command::new("git")
        .args(["init", "-q", "."])
        .current_dir(&fx.ws)
        .env("HOME", &fx.home)
        .status()
        .expect("host git init");
    assert!(init.success());
    write(
        fx.w(".git/config"),
        &format!(
            "[core]\n\trepositoryformatversion = 0\n\
             [remote \"origin\"]\n\turl = https://git.corp.example/r.git ; mirror \\\n\
             [credential \"https://git.corp.example\"]\n\tusername = {user}\n"
        ),
    );
    let script = "cat .git/config 2>&1; git config --list 2>&1; \
                  echo \"URL=$(git config remote.origin.url)\"; echo PROBE_DONE";
    for level in ["read-only", "workspace-write"] {
        let out = run(fx.sh(level, &[], script));
        out.expect_stdout_has("PROBE_DONE");
        out.expect_stdout_has("URL=https://git.corp.example/r.git");
        out.expect_absent(&user, "the workspace config's credential section");
    }
}

/// A `]` inside a quoted subsection (an IPv6 host: `[url
/// "https://[fd00::1]/"]`) is part of the subsection to git. A parser that
/// ends the header at the first `]` cannot read the file, so it neither
/// copies it nor learns what it includes: the included file (where the
/// token is kept) was left readable.
#[test]
fn gitconfig_with_a_bracket_in_a_subsection_still_hides_what_it_includes() {
    let fx = Fixture::new();
    let token = unique("GITIPV6INCLUDEDTOKEN");
    write(
        fx.home.join(".gitconfig"),
        "[user]\n\tname = Ada Lovelace\n\
         [url \"https://[fd00::1]:8443/\"]\n\tinsteadOf = https://git.lab/\n\
         [include]\n\tpath = ~/.gitconfig.local\n",
    );
    write(
        fx.home.join(".gitconfig.local"),
        &format!("[github]\n\ttoken = {token}\n"),
    );
    let script = format!(
        "cat {}/.gitconfig.local 2>&1; echo \"NAME=$(git config user.name)\"; \
         echo \"URL=$(git config --get-regexp '^url\\.' 2>&1)\"; echo PROBE_DONE",
        fx.home.display()
    );
    for level in ["read-only", "workspace-write"] {
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("PROBE_DONE");
        out.expect_absent(&token, "the file an [include] names");
        // The copy is made: the identity and the IPv6 rewrite reach git.
        out.expect_stdout_has("NAME=Ada Lovelace");
        out.expect_stdout_has("https://[fd00::1]:8443/");
    }
}

/// A `~/.gitconfig` that is not UTF-8 (a Latin-1 name, which git reads as
/// bytes) is not copied; what it includes must still be hidden.
#[test]
fn gitconfig_not_in_utf8_still_hides_what_it_includes() {
    let fx = Fixture::new();
    let token = unique("GITLATIN1INCLUDEDTOKEN");
    std::fs::write(
        fx.home.join(".gitconfig"),
        b"[user]\n\tname = Jos\xe9\n[include]\n\tpath = ~/.gitconfig.local\n",
    )
    .expect("write .gitconfig");
    write(
        fx.home.join(".gitconfig.local"),
        &format!("[github]\n\ttoken = {token}\n"),
    );
    let script = format!(
        "cat {}/.gitconfig.local 2>&1; echo PROBE_DONE",
        fx.home.display()
    );
    for level in ["read-only", "workspace-write"] {
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("PROBE_DONE");
        out.expect_absent(&token, "the file a non-UTF-8 ~/.gitconfig includes");
    }
}

/// A `~/.gitconfig` larger than the copy's limit (256 KiB: a long generated
/// alias list) is not copied; what it includes must still be hidden.
#[test]
fn gitconfig_too_large_to_copy_still_hides_what_it_includes() {
    let fx = Fixture::new();
    let token = unique("GITLARGEINCLUDEDTOKEN");
    let mut text = String::from("[include]\n\tpath = ~/.gitconfig.local\n[alias]\n");
    for i in 0..12_000 {
        text.push_str(&format!("\ta{i} = log --oneline -n {i}\n"));
    }
    assert!(text.len() > 256 * 1024);
    write(fx.home.join(".gitconfig"), &text);
    write(
        fx.home.join(".gitconfig.local"),
        &format!("[github]\n\ttoken = {token}\n"),
    );
    let script = format!(
        "cat {}/.gitconfig.local 2>&1; echo PROBE_DONE",
        fx.home.display()
    );
    for level in ["read-only", "workspace-write"] {
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("PROBE_DONE");
        out.expect_absent(&token, "the file a large ~/.gitconfig includes");
    }
}

/// A home whose `~/.local` and `~/.config` are symlinks into a dotfiles
/// directory (a common setup), granted writable whole (`--rw ~`): the run
/// starts (it failed closed on a bind source with a symlink in it), and
/// what the host runs later — `~/.local/bin/…` on PATH, `~/.config/autostart`
/// — cannot be planted through the links, nor moat's own audit state changed.
#[test]
fn a_writable_home_with_symlinked_dotfile_dirs_runs_and_stays_write_protected() {
    let fx = Fixture::new();
    let h = &fx.home;
    for (link, target) in [(".local", "dotfiles/local"), (".config", "dotfiles/config")] {
        let _ = std::fs::remove_dir_all(h.join(link));
        let _ = std::fs::remove_file(h.join(link));
        std::fs::create_dir_all(h.join(target)).expect("mkdir dotfiles");
        std::os::unix::fs::symlink(target, h.join(link)).expect("symlink");
    }
    let home = h.display().to_string();
    let script = format!(
        "mkdir -p {home}/.local/bin && echo 'echo pwned' > {home}/.local/bin/ls; \
         mkdir -p {home}/.config/autostart && echo '[Desktop Entry]' > {home}/.config/autostart/x.desktop; \
         echo ok > {home}/allowed; echo PROBE_DONE"
    );
    let out = run(fx.sh("workspace-write", &["--rw", &home], &script));
    out.expect_stdout_has("PROBE_DONE");
    assert!(
        h.join("allowed").exists(),
        "the grant is writable: {}",
        out.stderr
    );
    for planted in [
        "dotfiles/local/bin/ls",
        "dotfiles/config/autostart/x.desktop",
    ] {
        assert!(
            !h.join(planted).exists(),
            "{planted} was planted through a symlinked dotfiles dir"
        );
    }
}
