//! "Can a bad turn of the model read my keys": credentials where developers'
//! tools keep them in a home directory, planted with random bytes in the
//! fixture's HOME, probed at `read-only` and `workspace-write` (the levels
//! that show the whole host). Each probe reads every planted path at its
//! host path and then dumps every readable byte under the real HOME
//! (`grep -r`), so a stand-in missing anywhere shows as the secret in the
//! output; each prints a marker proving it ran. Git's own config files are
//! served as a sanitized copy: the positive controls check git still works
//! (identity, aliases, a commit in the workspace).

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use moat_conformance::*;

/// The levels where the command sees the user's home (minus protected paths).
const LEVELS: &[&str] = &["read-only", "workspace-write"];

/// Files (relative to HOME) where tools keep a credential; `{S}` is the
/// secret. Chosen from the tools' own documentation, one per format.
const CREDENTIAL_FILES: &[(&str, &str)] = &[
    (".yarnrc.yml", "npmAuthToken: \"{S}\"\n"),
    (".bunfig.toml", "[install.scopes]\nco = { token = \"{S}\" }\n"),
    (
        ".m2/settings.xml",
        "<settings><servers><server><id>c</id><password>{S}</password></server></servers></settings>\n",
    ),
    (".m2/settings-security.xml", "<settingsSecurity><master>{S}</master></settingsSecurity>\n"),
    (".gradle/gradle.properties", "mavenPassword={S}\n"),
    (".config/composer/auth.json", "{\"github-oauth\":{\"github.com\":\"{S}\"}}\n"),
    (".composer/auth.json", "{\"http-basic\":{\"r\":{\"password\":\"{S}\"}}}\n"),
    (
        ".nuget/NuGet/NuGet.Config",
        "<configuration><packageSourceCredentials><c><add key=\"ClearTextPassword\" value=\"{S}\"/></c></packageSourceCredentials></configuration>\n",
    ),
    (".config/helm/repositories.yaml", "repositories:\n- name: c\n  password: {S}\n"),
    (".config/helm/registry/config.json", "{\"auths\":{\"r\":{\"auth\":\"{S}\"}}}\n"),
    (".config/rclone/rclone.conf", "[s3]\nsecret_access_key = {S}\n"),
    (".terraformrc", "credentials \"app.terraform.io\" { token = \"{S}\" }\n"),
    (".boto", "[Credentials]\ngs_secret_access_key = {S}\n"),
    (".bundle/config", "BUNDLE_GEMS__CONTRIBSYS__COM: \"u:{S}\"\n"),
    (".config/hcloud/cli.toml", "[[contexts]]\ntoken = \"{S}\"\n"),
    (".config/doctl/config.yaml", "access-token: {S}\n"),
    (".oci/config", "[DEFAULT]\nkey_file=~/.oci/k.pem\npass_phrase={S}\n"),
    (".databrickscfg", "[DEFAULT]\ntoken = {S}\n"),
    (".dbt/profiles.yml", "p:\n  outputs:\n    dev:\n      password: {S}\n"),
    (".pulumi/credentials.json", "{\"accessTokens\":{\"x\":\"{S}\"}}\n"),
    (".minikube/profiles/minikube/client.key", "{S}\n"),
    (".local/share/keyrings/login.keyring", "{S}\n"),
    (".mozilla/firefox/abc.default/cookies.sqlite", "session={S}\n"),
    (".config/google-chrome/Default/Cookies", "session={S}\n"),
    (".config/chromium/Default/Login Data", "{S}\n"),
    (".thunderbird/abc.default/logins.json", "{S}\n"),
    (".config/Code/User/globalStorage/state.vscdb", "token {S}\n"),
    (".wrangler/config/default.toml", "oauth_token = \"{S}\"\n"),
    (".config/.wrangler/config/default.toml", "oauth_token = \"{S}\"\n"),
    (".config/configstore/update-notifier-x.json", "{\"token\":\"{S}\"}\n"),
    (".config/stripe/config.toml", "[default]\ntest_mode_api_key = \"{S}\"\n"),
    (".fly/config.yml", "access_token: {S}\n"),
    (".railway/config.json", "{\"user\":{\"token\":\"{S}\"}}\n"),
    (".vercel/auth.json", "{\"token\":\"{S}\"}\n"),
    (".local/share/com.vercel.cli/auth.json", "{\"token\":\"{S}\"}\n"),
    (".netlify/config.json", "{\"users\":{\"u\":{\"auth\":{\"token\":\"{S}\"}}}}\n"),
    (".heroku/credentials", "{S}\n"),
    (".config/heroku/config.json", "{S}\n"),
    (".expo/state.json", "{\"auth\":{\"sessionSecret\":\"{S}\"}}\n"),
    (".supabase/access-token", "{S}\n"),
    (".sentryclirc", "[auth]\ntoken={S}\n"),
    (".config/op/config", "{\"accounts\":[{\"accountKey\":\"{S}\"}]}\n"),
    (".putty/sessions/host", "PublicKeyFile={S}\n"),
    (".config/sops/age/keys.txt", "AGE-SECRET-KEY-{S}\n"),
    (".age/key.txt", "AGE-SECRET-KEY-{S}\n"),
    (".kube/config", "token: {S}\n"),
    (".mylogin.cnf", "{S}\n"),
    (".config/github-copilot/hosts.json", "{\"github.com\":{\"oauth_token\":\"{S}\"}}\n"),
    (".gemini/oauth_creds.json", "{\"refresh_token\":\"{S}\"}\n"),
    (".aider.conf.yml", "openai-api-key: {S}\n"),
    (
        ".cursor/mcp.json",
        "{\"mcpServers\":{\"gh\":{\"env\":{\"GITHUB_PERSONAL_ACCESS_TOKEN\":\"{S}\"}}}}\n",
    ),
    (".mc/config.json", "{\"aliases\":{\"s3\":{\"secretKey\":\"{S}\"}}}\n"),
    (".kaggle/kaggle.json", "{\"key\":\"{S}\"}\n"),
    // Kaggle's XDG location (kaggle >= 1.5.13 looks here first).
    (".config/kaggle/kaggle.json", "{\"key\":\"{S}\"}\n"),
    // huggingface_hub >= 0.25 keeps every token `login()` saved, by name.
    (".cache/huggingface/stored_tokens", "[ada]\nhf_token = hf_{S}\n"),
    (
        ".config/openstack/clouds.yaml",
        "clouds:\n  c:\n    auth:\n      password: {S}\n",
    ),
    (".config/tea/config.yml", "logins:\n- name: g\n  token: {S}\n"),
    (".config/cachix/cachix.dhall", "{ authToken = \"{S}\", hostname = \"c\" }\n"),
    (".config/neonctl/credentials.json", "{\"access_token\":\"{S}\"}\n"),
    (".bluemix/config.json", "{\"IAMToken\":\"Bearer {S}\"}\n"),
    // AI tools' API keys: Continue, Simon Willison's `llm`, aichat,
    // shell_gpt, Qwen Code's OAuth, ollama's signing key, Bitwarden's CLI.
    (".continue/config.yaml", "models:\n  - name: m\n    apiKey: {S}\n"),
    (".config/io.datasette.llm/keys.json", "{\"openai\": \"{S}\"}\n"),
    (".config/aichat/config.yaml", "clients:\n- type: openai\n  api_key: {S}\n"),
    (".config/shell_gpt/.sgptrc", "OPENAI_API_KEY={S}\n"),
    (".qwen/oauth_creds.json", "{\"refresh_token\":\"{S}\"}\n"),
    (".ollama/id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----\n{S}\n"),
    (".config/Bitwarden CLI/data.json", "{\"accessToken\":\"{S}\"}\n"),
    (".snowsql/config", "[connections]\npassword = {S}\n"),
    (".tsh/keys/proxy/ada", "{S}\n"),
    (".local/share/atuin/history.db", "export TOKEN={S}\n"),
    (".authinfo", "machine h login u password {S}\n"),
    (".Xauthority", "{S}\n"),
    (".config/solana/id.json", "[{S}]\n"),
    (".config/Postman/environments.json", "{\"token\":\"{S}\"}\n"),
    (".local/share/Trash/files/.env", "API_KEY={S}\n"),
    (".pki/nssdb/key4.db", "{S}\n"),
    (".muttrc", "set imap_pass = \"{S}\"\n"),
    (".msmtprc", "account default\npassword {S}\n"),
    (".smbcredentials", "username=ada\npassword={S}\n"),
    (".local/share/TelegramDesktop/tdata/key_datas", "{S}\n"),
    (".config/weechat/sec.conf", "[data]\n__passphrase__ = on\nkey = \"{S}\"\n"),
    // Histories: pasted tokens.
    (".bash_history", "export GITHUB_TOKEN={S}\n"),
    (".zsh_history", ": 1700000000:0;export OPENAI_API_KEY={S}\n"),
    (".local/share/fish/fish_history", "- cmd: set -x TOKEN {S}\n"),
    (".python_history", "openai.api_key = '{S}'\n"),
    (".node_repl_history", "process.env.TOKEN = '{S}'\n"),
    (".psql_history", "ALTER USER app PASSWORD '{S}';\n"),
    (".mysql_history", "SET PASSWORD = '{S}';\n"),
];

/// Plants every credential file with a secret of its own; returns the
/// secrets in the order of [`CREDENTIAL_FILES`].
fn plant_credentials(fx: &Fixture) -> Vec<String> {
    CREDENTIAL_FILES
        .iter()
        .map(|(rel, template)| {
            let secret = unique("CREDSECRET");
            write(fx.home.join(rel), &template.replace("{S}", &secret));
            secret
        })
        .collect()
}

/// Reads each path at its host path, then every readable byte under the
/// real HOME, then the marker.
fn read_everything_script(fx: &Fixture, rels: &[&str]) -> String {
    let h = fx.home.display();
    let mut s = String::new();
    for rel in rels {
        s.push_str(&format!("cat '{h}/{rel}' 2>&1; "));
    }
    s.push_str(&format!(
        "grep -rha --binary-files=text . '{h}' 2>/dev/null; echo PROBE_DONE"
    ));
    s
}

fn assert_none_leaked(out: &Out, level: &str, secrets: &[String], names: &[&str]) {
    out.expect_stdout_has("PROBE_DONE");
    for (secret, name) in secrets.iter().zip(names) {
        out.expect_absent(secret, &format!("{level}: ~/{name}"));
    }
}

#[test]
fn tool_credential_files_and_histories_are_unreadable() {
    let fx = Fixture::new();
    let secrets = plant_credentials(&fx);
    let rels: Vec<&str> = CREDENTIAL_FILES.iter().map(|(r, _)| *r).collect();
    let script = read_everything_script(&fx, &rels);
    for level in LEVELS {
        let out = run(fx.sh(level, &[], &script));
        // The dump did read the home: a public file in it shows.
        out.expect_stdout_has(&fx.home_public);
        assert_none_leaked(&out, level, &secrets, &rels);
    }
}

/// A ~/.gitconfig holding a credential in each form git accepts one.
fn gitconfig_with_secrets(secrets: &[String]) -> String {
    format!(
        "[user]\n\tname = Ada Lovelace\n\temail = ada@example.com\n\
         [alias]\n\tst = status -sb\n\
         \tapi = !curl -H 'Authorization: token {s0}' https://api.example\n\
         [http]\n\textraHeader = Authorization: Bearer {s1}\n\
         [http \"https://git.corp.example/\"]\n\textraheader = AUTHORIZATION: basic {s2}\n\
         [url \"https://x-access-token:{s3}@github.com/\"]\n\tinsteadOf = https://github.com/\n\
         [credential]\n\thelper = \"!f() {{ echo username=ada; echo password={s4}; }}; f\"\n\
         [credential \"https://git.corp.example\"]\n\tusername = {s5}\n\
         [include]\n\tpath = ~/.gitconfig-{s6}\n\
         [remote \"mirror\"]\n\turl = https://ada:{s7}@git.corp.example/r.git\n\
         [github]\n\ttoken = {s8}\n\
         [sendemail]\n\tsmtpPass = {s9}\n",
        s0 = secrets[0],
        s1 = secrets[1],
        s2 = secrets[2],
        s3 = secrets[3],
        s4 = secrets[4],
        s5 = secrets[5],
        s6 = secrets[6],
        s7 = secrets[7],
        s8 = secrets[8],
        s9 = secrets[9],
    )
}

#[test]
fn gitconfig_credentials_are_unreadable_in_every_form() {
    let fx = Fixture::new();
    let secrets: Vec<String> = (0..10).map(|_| unique("GITSECRET")).collect();
    let xdg: Vec<String> = (0..10).map(|_| unique("XDGGITSECRET")).collect();
    write(
        fx.home.join(".gitconfig"),
        &gitconfig_with_secrets(&secrets),
    );
    write(
        fx.home.join(".config/git/config"),
        &gitconfig_with_secrets(&xdg),
    );
    let script = format!(
        "cat ~/.gitconfig ~/.config/git/config 2>&1; git config --list --show-origin 2>&1; \
         {} ",
        read_everything_script(&fx, &[".gitconfig", ".config/git/config"])
    );
    let names: Vec<String> = (0..10).map(|i| format!(".gitconfig form {i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for level in LEVELS {
        let out = run(fx.sh(level, &[], &script));
        assert_none_leaked(&out, level, &secrets, &names);
        assert_none_leaked(&out, level, &xdg, &names);
        // The copy says what it left out, by name.
        out.expect_stdout_has("# moat: removed:");
        out.expect_stdout_has("section credential");
    }
}

fn git(fx: &Fixture, args: &[&str]) {
    let st = Command::new("git")
        .args(args)
        .current_dir(&fx.ws)
        .env_clear()
        .env("HOME", &fx.home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .status()
        .expect("host git");
    assert!(st.success(), "host git {args:?} failed");
}

#[test]
fn git_works_with_a_sanitized_gitconfig_positive_control() {
    let fx = Fixture::new();
    let secrets: Vec<String> = (0..10).map(|_| unique("GITSECRET")).collect();
    git(&fx, &["init", "-q", "."]);
    write(
        fx.home.join(".gitconfig"),
        &gitconfig_with_secrets(&secrets),
    );
    write(fx.w("hello.txt"), "hello\n");
    let script = "echo \"NAME=$(git config user.name)\"; echo \"EMAIL=$(git config user.email)\"; \
                  echo \"ALIAS=$(git config alias.st)\"; \
                  git add hello.txt && git commit -q -m 'from the sandbox' && \
                  echo \"AUTHOR=$(git log -1 --format='%an <%ae>')\"; echo PROBE_DONE";
    let out = run(fx.sh("workspace-write", &[], script));
    out.expect_stdout_has("PROBE_DONE");
    out.expect_stdout_has("NAME=Ada Lovelace");
    out.expect_stdout_has("EMAIL=ada@example.com");
    out.expect_stdout_has("ALIAS=status -sb");
    out.expect_stdout_has("AUTHOR=Ada Lovelace <ada@example.com>");
    // The commit is really in the workspace's repository.
    let log = Command::new("git")
        .args(["log", "-1", "--format=%s"])
        .current_dir(&fx.ws)
        .env("HOME", &fx.home)
        .output()
        .expect("host git log");
    assert_eq!(
        String::from_utf8_lossy(&log.stdout).trim(),
        "from the sandbox",
        "{}",
        out.dump()
    );
    let out = run(fx.sh(
        "read-only",
        &[],
        "echo \"NAME=$(git config user.name)\"; echo PROBE_DONE",
    ));
    out.expect_stdout_has("PROBE_DONE");
    out.expect_stdout_has("NAME=Ada Lovelace");
}

/// Credential daemons listening under HOME: git's credential cache (either
/// place git picks), the 1Password and Bitwarden SSH agents. A connection is
/// a credential read (`git credential-cache get`), so none may reach them.
const CREDENTIAL_SOCKETS: &[&str] = &[
    ".cache/git/credential/socket",
    ".git-credential-cache/socket",
    ".1password/agent.sock",
    ".bitwarden-ssh-agent.sock",
];

#[test]
fn credential_daemon_sockets_under_home_are_unreachable() {
    let fx = Fixture::new();
    let listeners: Vec<(&str, Listener)> = CREDENTIAL_SOCKETS
        .iter()
        .map(|rel| {
            let p = fx.home.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            (*rel, Listener::unix(&p))
        })
        .collect();
    let code = "import socket,sys\n\
                for p in sys.argv[1:]:\n\
                \x20   s=socket.socket(socket.AF_UNIX)\n\
                \x20   try:\n\
                \x20       s.connect(p); s.sendall(b'protocol=https\\nhost=github.com\\n\\n'); print('CONNECTED', p)\n\
                \x20   except OSError as e:\n\
                \x20       print('REFUSED', p, e.errno)\n\
                print('PROBE_DONE')\n";
    let paths: Vec<String> = CREDENTIAL_SOCKETS
        .iter()
        .map(|r| fx.home.join(r).display().to_string())
        .collect();
    let args: Vec<&str> = paths.iter().map(String::as_str).collect();
    for level in LEVELS {
        let out = run(fx.py(level, &[], code, &args));
        out.expect_stdout_has("PROBE_DONE");
        assert!(!out.stdout.contains("CONNECTED"), "{level}\n{}", out.dump());
        assert_eq!(
            out.tagged("REFUSED").len(),
            CREDENTIAL_SOCKETS.len(),
            "{level}\n{}",
            out.dump()
        );
    }
    for (rel, l) in listeners {
        let (hits, data) = l.finish();
        assert_eq!(hits, 0, "~/{rel} was reached: {data:?}");
    }
}

/// Dotfile managers keep `~/.gitconfig` as a symlink into a dotfiles
/// checkout and the token in a file it includes (`~/.gitconfig.local`, a
/// relative include beside the target). Neither the target nor an include
/// may be readable; the identity still reaches git.
#[test]
fn gitconfig_includes_and_symlinked_configs_are_unreadable() {
    let fx = Fixture::new();
    let in_main = unique("MAINSECRET");
    let in_local = unique("LOCALSECRET");
    let in_relative = unique("RELSECRET");
    write(
        fx.home.join("dotfiles/git/gitconfig"),
        &format!(
            "[user]\n\tname = Ada Lovelace\n[include]\n\tpath = ~/.gitconfig.local\n\
             [includeIf \"gitdir:~/\"]\n\tpath = corp.inc\n\
             [http]\n\textraHeader = Authorization: Bearer {in_main}\n"
        ),
    );
    std::os::unix::fs::symlink(
        fx.home.join("dotfiles/git/gitconfig"),
        fx.home.join(".gitconfig"),
    )
    .expect("symlink");
    write(
        fx.home.join(".gitconfig.local"),
        &format!("[github]\n\tuser = ada\n\tpassword = {in_local}\n"),
    );
    write(
        fx.home.join("dotfiles/git/corp.inc"),
        &format!("[url \"https://{in_relative}@git.corp.example/\"]\n\tinsteadOf = corp:\n"),
    );
    let script = format!(
        "echo \"NAME=$(git config user.name)\"; git config --list 2>&1; \
         cat ~/.gitconfig 2>&1; {}",
        read_everything_script(
            &fx,
            &[
                ".gitconfig",
                ".gitconfig.local",
                "dotfiles/git/corp.inc",
                "dotfiles/git/gitconfig"
            ]
        )
    );
    for level in LEVELS {
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("PROBE_DONE");
        out.expect_stdout_has("NAME=Ada Lovelace");
        out.expect_stdout_has(&fx.home_public);
        out.expect_absent(&in_main, &format!("{level}: the symlinked ~/.gitconfig"));
        out.expect_absent(
            &in_local,
            &format!("{level}: ~/.gitconfig.local (included)"),
        );
        out.expect_absent(
            &in_relative,
            &format!("{level}: dotfiles/git/corp.inc (included, relative)"),
        );
    }
}

/// An agent started in HOME (`cd ~ && agent`): the workspace is the home
/// itself, writable, and every credential in it must still be a stand-in.
#[test]
fn credentials_stay_hidden_when_home_is_the_workspace() {
    let fx = Fixture::home_as_workspace();
    let secrets = plant_credentials(&fx);
    let git_secrets: Vec<String> = (0..10).map(|_| unique("GITSECRET")).collect();
    write(
        fx.home.join(".gitconfig"),
        &gitconfig_with_secrets(&git_secrets),
    );
    let mut rels: Vec<&str> = CREDENTIAL_FILES.iter().map(|(r, _)| *r).collect();
    rels.push(".gitconfig");
    let script = format!(
        "echo \"NAME=$(git config user.name)\"; {}",
        read_everything_script(&fx, &rels)
    );
    let out = run(fx.sh("workspace-write", &[], &script));
    out.expect_stdout_has(&fx.home_public);
    out.expect_stdout_has("NAME=Ada Lovelace");
    assert_none_leaked(&out, "workspace-write, HOME as workspace", &secrets, &rels);
    for s in &git_secrets {
        out.expect_absent(s, "workspace-write, HOME as workspace: ~/.gitconfig");
    }
}

/// The workspace's own `.git/config` is shown as it is (the project's file;
/// git inside needs it). `explain-policy` names what in it is a credential
/// the command can read (a token in a remote URL, a CI checkout's persisted
/// `extraheader`), and never prints the value.
#[test]
fn explain_policy_names_credentials_in_the_workspace_git_config() {
    let fx = Fixture::new();
    git(&fx, &["init", "-q", "."]);
    let url_secret = unique("WSURLSECRET");
    let header_secret = unique("WSHEADERSECRET");
    git(
        &fx,
        &[
            "remote",
            "add",
            "origin",
            &format!("https://x-access-token:{url_secret}@github.com/o/r.git"),
        ],
    );
    git(
        &fx,
        &[
            "config",
            "http.https://github.com/.extraheader",
            &format!("AUTHORIZATION: basic {header_secret}"),
        ],
    );
    for level in LEVELS {
        let out = run(fx.moat(["explain-policy", "--policy", level]));
        out.expect_code(0);
        let notes = out.json()["notes"].to_string();
        assert!(
            notes.contains("userinfo of remote.*.url") && notes.contains("http.*.extraheader"),
            "{level}: {notes}\n{}",
            out.dump()
        );
        out.expect_absent(&url_secret, "explain-policy: the remote URL's token")
            .expect_absent(&header_secret, "explain-policy: the extraheader");
    }
}

/// Nix's `access-tokens` (GitHub and GitLab tokens for fetching flakes) in
/// the user's `nix.conf`: read at its host path, the file shows without the
/// token and keeps the settings nix needs (`experimental-features`).
#[test]
fn nix_access_tokens_are_removed_from_nix_conf() {
    let fx = Fixture::new();
    let secret = unique("ghp_NIXSECRET");
    let conf = fx.home.join(".config/nix/nix.conf");
    write(
        &conf,
        &format!(
            "experimental-features = nix-command flakes\naccess-tokens = github.com={secret}\n"
        ),
    );
    let script = format!("cat '{}'; echo PROBE_DONE", conf.display());
    for level in LEVELS {
        let out = run(fx.sh(level, &[], &script));
        out.expect_stdout_has("PROBE_DONE");
        out.expect_stdout_has("experimental-features = nix-command flakes");
        out.expect_absent(&secret, &format!("{level}: ~/.config/nix/nix.conf"));
    }
}

/// Root-only credentials under /etc that a server or a dev box running its
/// agent as root keeps: WireGuard and NetworkManager keys, IPsec secrets,
/// TLS private keys (certbot), Kubernetes' and k3s' admin kubeconfigs, a
/// GitLab runner's token, nix's netrc. Planted in a private mount namespace
/// (an overlay of a fixture directory on /etc; the host's /etc is never
/// edited), read at every level that shows /etc. Root only: an
/// unprivileged caller's kernel already refuses these 0600 root files.
#[test]
fn root_only_system_credentials_are_hidden() {
    let probe = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .status();
    if euid() != 0 || !probe.is_ok_and(|s| s.success()) {
        skip("planting files under /etc needs a private mount namespace (root)");
        return;
    }
    let fx = Fixture::new();
    let upper = fx.outside.join("etc");
    let files = [
        "wireguard/wg0.conf",
        "NetworkManager/system-connections/wifi.nmconnection",
        "ipsec.secrets",
        "letsencrypt/live/example.org/privkey.pem",
        "kubernetes/admin.conf",
        "rancher/k3s/k3s.yaml",
        "gitlab-runner/config.toml",
        "nix/netrc",
    ];
    let secrets: Vec<String> = files
        .iter()
        .map(|rel| {
            let s = unique("ETCSECRET");
            let p = upper.join(rel);
            write(&p, &format!("{s}\n"));
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
            s
        })
        .collect();
    let list: Vec<String> = files.iter().map(|r| format!("/etc/{r}")).collect();
    for level in ["read-only", "workspace-write", "workspace-contained"] {
        let inner = fx.sh(
            level,
            &[],
            &format!(
                "cat {} 2>&1; grep -rha --binary-files=text . /etc/wireguard /etc/NetworkManager /etc/letsencrypt /etc/kubernetes /etc/rancher /etc/gitlab-runner /etc/nix 2>/dev/null; echo PROBE_DONE",
                list.join(" ")
            ),
        );
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount -t overlay overlay -o \"lowerdir=$0:/etc\" /etc && exec \"$@\"")
            .arg(&upper)
            .arg(inner.get_program())
            .args(inner.get_args())
            .env_clear()
            .current_dir(inner.get_current_dir().unwrap())
            .stdin(std::process::Stdio::null());
        for (k, v) in inner.get_envs() {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        let out = run(cmd);
        out.expect_stdout_has("PROBE_DONE");
        for (s, rel) in secrets.iter().zip(files) {
            out.expect_absent(s, &format!("{level}: /etc/{rel}"));
        }
    }
}
