//! The fixed lists of protected paths: secrets hidden behind empty stand-ins,
//! and workspace files that run code later and so stay read-only.

/// Home-relative paths that hold credentials or agent state.
pub const PROTECTED_HOME_PATHS: &[&str] = &[
    ".ssh",
    ".aws",
    ".gnupg",
    ".config/gh",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    // pip's index URLs carry credentials; a redacted copy is what the
    // sandbox sees (under its own HOME).
    ".config/pip",
    ".pip",
    ".config/gcloud",
    ".azure",
    ".password-store",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".claude",
    ".claude.json",
    ".codex",
    ".omp",
    ".config/opencode",
    ".local/share/opencode",
    // Other tools' credential stores: git's XDG twin of .git-credentials,
    // database passwords, API tokens.
    ".config/git/credentials",
    ".pgpass",
    ".my.cnf",
    ".vault-token",
    ".terraform.d/credentials.tfrc.json",
    ".gem/credentials",
    ".local/share/uv/credentials",
    ".cache/huggingface/token",
    ".config/hub",
    ".config/glab-cli",
    ".s3cfg",
    // git's own config files: `http.extraHeader` (Authorization),
    // `url."https://TOKEN@host/".insteadOf`, `credential.helper = !echo
    // password=…`, includes of a secret file, remote URLs with userinfo.
    // A sanitized copy is what the sandbox sees under its own HOME
    // (`moat_config::userconf`), so identity, aliases and settings work.
    ".gitconfig",
    ".config/git/config",
    // Package managers' and build tools' credential files. Only the file
    // that holds the token, never the tool's cache beside it.
    ".yarnrc.yml",
    ".bunfig.toml",
    ".m2/settings.xml",
    ".m2/settings-security.xml",
    ".gradle/gradle.properties",
    ".config/composer/auth.json",
    ".composer/auth.json",
    ".nuget/NuGet/NuGet.Config",
    ".config/NuGet/NuGet.Config",
    ".bundle/config",
    ".config/pypoetry/auth.toml",
    ".config/containers/auth.json",
    ".jfrog",
    // Cloud, infrastructure and deployment CLIs' logins.
    ".config/helm/repositories.yaml",
    ".config/helm/registry",
    ".config/rclone",
    ".terraformrc",
    ".boto",
    ".config/hcloud",
    ".config/doctl",
    ".oci",
    ".databrickscfg",
    ".dbt/profiles.yml",
    ".pulumi/credentials.json",
    ".minikube",
    ".wrangler",
    ".config/.wrangler",
    ".config/configstore",
    ".config/stripe",
    ".fly",
    ".railway",
    ".vercel",
    ".local/share/com.vercel.cli",
    ".netlify",
    ".config/netlify",
    ".heroku",
    ".config/heroku",
    ".expo",
    ".supabase",
    ".sentryclirc",
    ".config/ngrok",
    ".ngrok2",
    ".cloudflared",
    ".circleci/cli.yml",
    ".travis",
    ".cf",
    ".config/scw",
    ".config/linode-cli",
    ".tsh",
    ".mc",
    ".snowsql",
    ".snowflake",
    ".kaggle",
    // Kaggle's XDG location (kaggle >= 1.5.13 reads it first).
    ".config/kaggle",
    ".huggingface/token",
    // huggingface_hub >= 0.25: every token `login()` saved, by name, beside
    // `token` (the model cache around them stays readable).
    ".cache/huggingface/stored_tokens",
    // OpenStack's clouds.yaml / secure.yaml: passwords, application
    // credential secrets.
    ".config/openstack",
    // Gitea's `tea` (logins with tokens), Cachix (`authToken`), Neon's
    // neonctl (OAuth tokens), IBM Cloud's CLI (IAM and refresh tokens).
    ".config/tea",
    ".config/cachix",
    ".config/neonctl",
    ".bluemix",
    // AI tools' API keys in plain files: Continue (`apiKey` in its
    // config), `llm` (keys.json; its logs.db beside it stays), aichat,
    // shell_gpt, Qwen Code's OAuth tokens, ollama's ollama.com signing key
    // (its models beside it stay), Bitwarden CLI's access token.
    ".continue",
    ".config/io.datasette.llm/keys.json",
    ".config/aichat",
    ".config/shell_gpt",
    ".qwen",
    ".ollama/id_ed25519",
    ".config/Bitwarden CLI",
    ".continuum",
    ".wakatime.cfg",
    ".mylogin.cnf",
    // Coding assistants' logins and user-level MCP server configs, whose
    // `env` blocks carry API tokens (`GITHUB_PERSONAL_ACCESS_TOKEN`).
    ".config/github-copilot",
    ".gemini",
    ".aider.conf.yml",
    ".cursor/mcp.json",
    ".codeium",
    // Credential daemons' sockets: a connection is a credential read
    // (`git credential-cache get`, an SSH agent signing). git's cache
    // listens in either directory; 1Password's and Bitwarden's SSH agents.
    ".cache/git/credential",
    ".git-credential-cache",
    ".1password",
    ".bitwarden-ssh-agent.sock",
    // Password managers, key rings, other private keys.
    ".authinfo",
    ".authinfo.gpg",
    ".pki",
    ".passwd-s3fs",
    // X11 session cookies: with the host network (`--network unmanaged`)
    // the display's abstract socket is reachable, and the cookie is what
    // lets a client read keystrokes.
    ".Xauthority",
    ".ICEauthority",
    // Wallets' keys.
    ".electrum",
    ".ethereum/keystore",
    ".config/solana",
    // API clients' and database GUIs' saved connections and environments.
    ".config/Postman",
    ".config/Insomnia",
    ".local/share/DBeaverData",
    ".config/JetBrains",
    ".config/remmina",
    ".config/filezilla",
    // Deleted files keep their content (an old key, a `.env`).
    ".local/share/Trash",
    ".config/op",
    ".local/share/keyrings",
    ".local/share/kwalletd",
    ".putty",
    ".age",
    ".config/age",
    ".config/sops",
    // Browser, mail and chat profiles (cookies, saved passwords, session
    // tokens), editors' extension state (tokens in plain sqlite), Flatpak
    // and snap apps' private homes (their browser profiles included).
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".config/microsoft-edge",
    ".config/vivaldi",
    ".thunderbird",
    ".config/Slack",
    ".config/discord",
    ".config/Signal",
    ".config/Element",
    ".config/Mattermost",
    ".config/teams-for-linux",
    ".local/share/TelegramDesktop",
    // Mail and chat clients' own configs, which hold account passwords in
    // plain text (`set imap_pass`, `password`, `remotepass`, `PassCmd`).
    ".muttrc",
    ".mutt",
    ".config/mutt",
    ".neomuttrc",
    ".config/neomutt",
    ".msmtprc",
    ".config/msmtp",
    ".mbsyncrc",
    ".offlineimaprc",
    ".fetchmailrc",
    ".config/aerc/accounts.conf",
    ".weechat",
    ".config/weechat",
    ".irssi",
    ".config/hexchat",
    // Network share and remote desktop passwords.
    ".smbcredentials",
    ".vnc",
    ".config/Code/User/globalStorage",
    ".config/Cursor/User/globalStorage",
    ".config/VSCodium/User/globalStorage",
    ".var/app",
    "snap/firefox",
    "snap/chromium",
    // Shell and REPL histories: pasted tokens (`export GITHUB_TOKEN=…`,
    // `mysql -pSECRET`, a key typed into a REPL). A shell inside writes its
    // history under the sandbox HOME; nothing needs the host's.
    ".bash_history",
    ".zsh_history",
    ".zhistory",
    ".histfile",
    ".local/share/fish/fish_history",
    ".python_history",
    ".node_repl_history",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
    ".rediscli_history",
    ".irb_history",
    ".lesshst",
    ".viminfo",
    ".local/share/atuin",
    ".mycli-history",
    ".dbshell",
    ".mongosh",
    ".pry_history",
    ".julia/logs/repl_history.jl",
    ".local/state/nvim/shada",
    ".config/pgcli",
];

/// Workspace entries (by name, at the workspace root) that run code later.
/// `.moat*` is matched by prefix, see [`is_write_protected_name`].
pub const WRITE_PROTECTED_WORKSPACE_NAMES: &[&str] = &[
    ".gitconfig",
    ".gitmodules",
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".vscode",
    ".idea",
    ".mcp.json",
    ".envrc",
    ".moat*",
    // Coding agents' project-level configuration: each can make the agent,
    // when it next starts on the host outside moat, run a command the file
    // names (hooks, MCP stdio servers, lint/test commands, container hooks).
    // Claude Code: `.claude/settings.json` and `settings.local.json` hooks
    // run shell commands; `.claude/commands`, `agents`, `skills` can
    // pre-approve tools (`allowed-tools: Bash(…)`).
    ".claude",
    // Cursor: `.cursor/mcp.json` stdio servers are commands; `hooks.json`.
    ".cursor",
    // Codex CLI: `.codex/config.toml` `[mcp_servers.*] command` (trusted projects).
    ".codex",
    // Gemini CLI: `.gemini/settings.json` `mcpServers.*.command`, tool discovery commands.
    ".gemini",
    // Aider: `lint-cmd`, `test-cmd` in the project's `.aider.conf.yml`.
    ".aider.conf.yml",
    // Continue: `.continue/` config and `mcpServers` blocks with commands.
    ".continue",
    // Dev containers: `initializeCommand` runs on the HOST when the editor
    // (re)opens the folder in a container; the others run in the container.
    ".devcontainer",
    ".devcontainer.json",
    // Windsurf: `.windsurf/` workflows and hooks.
    ".windsurf",
    // Roo Code: `.roo/mcp.json` project MCP servers.
    ".roo",
    // Kiro: `.kiro/settings/mcp.json` and agent hooks.
    ".kiro",
    // Zed: `.zed/tasks.json` and `.zed/settings.json` context servers.
    ".zed",
    // Helix: `.helix/languages.toml` names each language server's and
    // formatter's `command`, which Helix starts when the user opens a file
    // of the project; `.helix/config.toml` (shell, keymaps running `:sh`).
    ".helix",
    // Neovim's and Vim's `exrc`: the editor sources `.nvim.lua`, `.nvimrc`,
    // `.exrc` (Vim: `.vimrc`, `_vimrc`, `.gvimrc`, `_exrc`) from the
    // directory it starts in (Neovim once the user trusted the file: a
    // changed one asks again, but the prompt shows no diff).
    ".nvim.lua",
    ".nvimrc",
    ".exrc",
    ".vimrc",
    "_vimrc",
    ".gvimrc",
    "_exrc",
    // Amazon Q Developer: `.amazonq/mcp.json`.
    ".amazonq",
    // opencode: project `opencode.json(c)` `mcp.*.command`, `.opencode/` plugins (JS it loads).
    "opencode.json",
    "opencode.jsonc",
    ".opencode",
    // mise: `[hooks] enter`/`[env] _.source` run on `cd` under `mise activate`,
    // from every file it reads in a project directory (a trusted
    // `mise.toml`'s directory, or a `trusted_config_paths` prefix, makes the
    // others live too).
    "mise.toml",
    ".mise.toml",
    "mise.local.toml",
    ".mise.local.toml",
    ".mise",
    "mise/config.toml",
    "mise/config.local.toml",
    ".config/mise",
    ".config/mise.toml",
    ".config/mise.local.toml",
    // Git hook managers: the commands the host's next `git commit` or
    // `git push` runs, once their hook is installed in `.git/hooks` (or
    // `core.hooksPath` points at `.husky/_`). husky: `.husky/pre-commit`…
    // are the scripts; pre-commit: `repo: local` hooks with any `entry`;
    // lefthook: `run:` commands (every config name it reads at the root,
    // `-local` overrides included, and its `.lefthook/` scripts);
    // overcommit: custom hooks.
    ".husky",
    ".pre-commit-config.yaml",
    "lefthook.yml",
    "lefthook.yaml",
    "lefthook.json",
    "lefthook.toml",
    ".lefthook.yml",
    ".lefthook.yaml",
    ".lefthook.json",
    ".lefthook.toml",
    "lefthook-local.yml",
    "lefthook-local.yaml",
    ".lefthook-local.yml",
    ".lefthook-local.yaml",
    ".lefthook",
    ".overcommit.yml",
];

/// Home-relative paths that also run code later (login sessions, PATH
/// entries, per-user git config); write-protected wherever a home directory
/// lies inside a writable workspace.
pub const WRITE_PROTECTED_HOME_PATHS: &[&str] = &[
    ".config/moat",
    ".local/state/moat",
    ".config/git",
    ".config/autostart",
    ".config/systemd",
    ".config/fish",
    ".config/environment.d",
    ".local/bin",
    ".cargo/bin",
    ".cargo/config",
    ".cargo/config.toml",
    ".pam_environment",
    ".xprofile",
    ".xinitrc",
    ".xsession",
    ".xsessionrc",
    ".inputrc",
    ".pythonrc",
    ".npmrc",
    "bin",
    ".bash_aliases",
    ".vimrc",
    ".gvimrc",
    ".exrc",
    ".vim",
    ".emacs",
    ".emacs.d",
    ".config/nvim",
    ".config/emacs",
    ".tmux.conf",
    ".config/tmux",
    ".ipython",
    ".config/pip",
    ".pip",
    ".curlrc",
    ".wgetrc",
    ".hgrc",
    // Mercurial's XDG config and Jujutsu's user config: hooks, pagers,
    // `fix.tools`; `~/.config/jj/repos/*` also holds every repository's
    // out-of-repo config (jj's "secure config").
    ".config/hg",
    ".jjconfig.toml",
    ".config/jj",
    ".mailcap",
    ".lesskey",
    ".direnvrc",
    ".config/direnv",
    ".Xresources",
    ".xsessionrc",
    ".config/fontconfig",
    ".config/user-dirs.dirs",
    // Coding agents' user-level configuration that runs commands on the
    // host the next time the agent starts outside moat. Their state dir
    // (`~/.claude`, `~/.codex`) is opted in read-write by the agent's
    // profile; these parts of it stay read-only all the same.
    // Claude Code: settings hooks, slash commands/agents/skills with
    // `allowed-tools`, plugins (hooks, MCP servers), its own install
    // (`local/`, the program itself with the local installer) and the shell
    // snapshots its Bash tool sources before each command (a session on the
    // host running at the same time would source a changed one).
    ".claude/settings.json",
    ".claude/local",
    ".claude/shell-snapshots",
    ".claude/settings.local.json",
    ".claude/commands",
    ".claude/agents",
    ".claude/skills",
    ".claude/plugins",
    ".claude/hooks",
    // Codex CLI: `[mcp_servers.*] command`, `notify` in its config; the
    // exec-policy rules that pre-approve commands.
    ".codex/config.toml",
    ".codex/rules",
];

/// Paths inside every git dir (`.git`, `.git/modules/**`) that run code
/// later, or redirect git to a config or hooks directory elsewhere
/// (`commondir`, per-worktree config).
pub const WRITE_PROTECTED_GIT_PATHS: &[&str] = &["hooks", "config", "commondir", "config.worktree"];

/// Other version control systems' config that their host tool runs code
/// from or is redirected by, relative to the directory holding the VCS's
/// admin dir: Mercurial's `.hg/hgrc` (`[hooks]`, `[extensions]`,
/// `%include`), its share-safe `hgrc-not-shared`, and `sharedpath` (a
/// share reads the source repository's `hgrc`); Jujutsu's repo and
/// workspace config (`fix.tools`, `ui.pager`, `merge-tools`…: still read
/// from the repository and migrated to jj's out-of-repo store when no
/// `config-id` is there yet) and the `config-id`s that pick a stored
/// config. Write-protected in every such admin dir at any depth of a
/// writable root, like a git dir's [`WRITE_PROTECTED_GIT_PATHS`]; the
/// admin dirs are the first components ([`is_vcs_dir_name`]).
pub const WRITE_PROTECTED_VCS_PATHS: &[&str] = &[
    ".hg/hgrc",
    ".hg/hgrc-not-shared",
    ".hg/sharedpath",
    ".jj/repo/config.toml",
    ".jj/repo/config-id",
    ".jj/workspace-config.toml",
    ".jj/workspace-config-id",
];

/// True for the name of an admin dir [`WRITE_PROTECTED_VCS_PATHS`] covers
/// (`.hg`, `.jj`).
pub fn is_vcs_dir_name(name: &str) -> bool {
    WRITE_PROTECTED_VCS_PATHS
        .iter()
        .any(|p| p.split('/').next() == Some(name))
}

/// The parts of [`WRITE_PROTECTED_VCS_PATHS`] inside the admin dir `name`
/// (`hgrc`, `repo/config.toml`…).
pub fn vcs_parts(name: &str) -> impl Iterator<Item = &'static str> + '_ {
    WRITE_PROTECTED_VCS_PATHS
        .iter()
        .filter_map(move |p| p.strip_prefix(name).and_then(|r| r.strip_prefix('/')))
}

/// Paths inside each linked worktree's admin dir (`.git/worktrees/NAME/`):
/// `commondir` and `gitdir` redirect git, `config.worktree` is config.
pub const WRITE_PROTECTED_GIT_WORKTREE_PATHS: &[&str] = &["commondir", "config.worktree", "gitdir"];

/// The only entries of a git `hooks` dir a command may create: samples,
/// which git never runs.
pub fn is_inert_hook_name(name: &str) -> bool {
    name.ends_with(".sample")
}

/// True for a workspace-root name that must stay read-only.
pub fn is_write_protected_name(name: &str) -> bool {
    name.starts_with(".moat") || WRITE_PROTECTED_WORKSPACE_NAMES.contains(&name)
}

/// True for a workspace-root name whose content is hidden (`.env`, `.env.*`, `.envrc`).
pub fn is_protected_workspace_name(name: &str) -> bool {
    name == ".env" || name == ".envrc" || name.starts_with(".env.")
}
