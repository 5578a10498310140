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
    ".mailcap",
    ".lesskey",
    ".direnvrc",
    ".config/direnv",
    ".Xresources",
    ".xsessionrc",
    ".config/fontconfig",
    ".config/user-dirs.dirs",
];

/// Paths inside `.git` that run code later, or redirect git to a config or
/// hooks directory elsewhere (`commondir`, per-worktree config).
pub const WRITE_PROTECTED_GIT_PATHS: &[&str] = &["hooks", "config", "commondir", "config.worktree"];

/// True for a workspace-root name that must stay read-only.
pub fn is_write_protected_name(name: &str) -> bool {
    name.starts_with(".moat") || WRITE_PROTECTED_WORKSPACE_NAMES.contains(&name)
}

/// True for a workspace-root name whose content is hidden (`.env`, `.env.*`, `.envrc`).
pub fn is_protected_workspace_name(name: &str) -> bool {
    name == ".env" || name == ".envrc" || name.starts_with(".env.")
}
