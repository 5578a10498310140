//! The user's own tool configuration, redacted for the sandbox: where code
//! comes from (pip's index, npm's registry and settings) and who commits
//! (git's identity) reach the tool; credentials in those files do not.
//!
//! Redaction keeps structure, not text: only section headers, comments and
//! `key = value` lines survive, a key that names a credential is dropped
//! (with git's whole `[credential]` sections and includes moat cannot
//! follow), and every URL loses its userinfo. A line moat cannot read as one
//! of those is dropped, so a file that is not a configuration file (a key
//! behind a symlink) yields nothing secret.

use std::path::{Path, PathBuf};

/// The files copied, relative to HOME.
pub const USER_TOOL_CONFIGS: &[&str] = &[
    ".config/pip/pip.conf",
    ".pip/pip.conf",
    ".npmrc",
    ".gitconfig",
    ".config/git/config",
];

/// The git config files among [`USER_TOOL_CONFIGS`]: read with git's own
/// syntax ([`moat_policy::gitconfig::parse`]) and rewritten from what was
/// understood, see [`redact_git_config`].
const GIT_CONFIGS: &[&str] = &[".gitconfig", ".config/git/config"];

/// Sections of a git config dropped whole: credential helpers (`!echo
/// password=…`, `store --file`), usernames per URL, and includes, which
/// point at files moat does not follow (a secret kept beside the config).
/// The include sections come last ([`git_include_targets`] reads them).
const GIT_DROPPED_SECTIONS: &[&str] = &["credential", "include", "includeif"];

/// Largest file copied (a configuration file is small).
const MAX_SIZE: u64 = 256 * 1024;

/// How much of a git config file is read for its includes (one too large to
/// copy still has its includes hidden).
const MAX_INCLUDE_SCAN: u64 = 16 * 1024 * 1024;

/// Words in a key (lowercased) that mark a credential.
const SECRET_KEY_WORDS: &[&str] = &[
    "password",
    "passwd",
    "token",
    "secret",
    "_auth",
    "extraheader",
    "cookie",
    "keyfile",
    "privatekey",
    "private-key",
    "client-key",
    "credential",
    "apikey",
    "api-key",
    "api_key",
    "oauth",
    "bearer",
    "session",
    // yarn's `npmAuthIdent` (`user:password`).
    "authident",
];

/// Endings of a key's last part that mark a credential (`smtpPass`,
/// `accessKey`, `dbPwd`) where the word itself is too short to look for
/// anywhere in the key.
const SECRET_KEY_ENDINGS: &[&str] = &["pass", "pwd", "key"];

/// One redacted copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedactedConfig {
    /// Relative to HOME (the same place under the sandbox HOME).
    pub rel: PathBuf,
    pub contents: String,
    /// What was removed: key names and "userinfo of KEY", never values.
    pub removed: Vec<String>,
}

/// The tool config files one launch reads, each read once: the redacted
/// copies ([`redacted_user_configs_in`]), the git includes
/// ([`git_include_targets_in`]) and the client keys
/// ([`tool_config_key_files_in`]) read the same files (`~/.gitconfig`,
/// `~/.npmrc`, `/etc/gitconfig`). Kept for one launch's preparation only,
/// never across launches: a file changed later is read again by the next.
#[derive(Default)]
pub struct ConfigReads {
    files: std::cell::RefCell<std::collections::HashMap<PathBuf, Option<std::rc::Rc<ConfigRead>>>>,
}

/// One file as read: its size when looked up (symlinks followed) and its
/// first [`MAX_INCLUDE_SCAN`] bytes.
struct ConfigRead {
    len: u64,
    bytes: Vec<u8>,
}

impl ConfigReads {
    /// `path` read (once), or None when it is not a regular file or cannot
    /// be read.
    fn get(&self, path: &Path) -> Option<std::rc::Rc<ConfigRead>> {
        if let Some(r) = self.files.borrow().get(path) {
            return r.clone();
        }
        let read = (|| {
            let meta = std::fs::metadata(path).ok()?;
            if !meta.is_file() {
                return None;
            }
            // Room for the whole file (and the read that finds its end):
            // without it `read_to_end` probes in 32-byte reads.
            let mut bytes = Vec::with_capacity(meta.len().min(MAX_INCLUDE_SCAN) as usize + 1);
            std::fs::File::open(path)
                .and_then(|f| {
                    std::io::Read::read_to_end(
                        &mut std::io::Read::take(f, MAX_INCLUDE_SCAN),
                        &mut bytes,
                    )
                })
                .ok()?;
            Some(std::rc::Rc::new(ConfigRead {
                len: meta.len(),
                bytes,
            }))
        })();
        self.files
            .borrow_mut()
            .insert(path.to_path_buf(), read.clone());
        read
    }
}

/// Reads and redacts the user's tool configuration files under `home`.
/// Missing, unreadable, oversized or non-UTF-8 files are skipped.
pub fn redacted_user_configs(home: &Path) -> Vec<RedactedConfig> {
    redacted_user_configs_in(&ConfigReads::default(), home)
}

/// [`redacted_user_configs`], the files read through `reads`.
pub fn redacted_user_configs_in(reads: &ConfigReads, home: &Path) -> Vec<RedactedConfig> {
    USER_TOOL_CONFIGS
        .iter()
        .filter_map(|rel| {
            let path = home.join(rel);
            let read = reads.get(&path)?;
            if read.len > MAX_SIZE {
                return None;
            }
            let text = std::str::from_utf8(&read.bytes).ok()?;
            let (contents, removed) = if GIT_CONFIGS.contains(rel) {
                redact_git_config(text)?
            } else {
                // pip reads its files with Python's configparser, where an
                // indented line continues the value above it.
                let syntax = if rel.ends_with("pip.conf") {
                    Continuation::IndentOrBackslash
                } else {
                    Continuation::Backslash
                };
                redact_config(text, syntax)?
            };
            // Nothing but credentials (or nothing at all): no copy.
            let settings = contents.lines().any(|l| {
                let l = l.trim();
                !l.is_empty() && !l.starts_with(['#', ';', '['])
            });
            if !settings {
                return None;
            }
            // The command (and an agent reading the file) learns what is
            // missing by name, never by value.
            let mut header = format!(
                "# moat: a copy of ~/{rel} with credentials removed; the original stays on the host\n"
            );
            if !removed.is_empty() {
                header.push_str(&format!("# moat: removed: {}\n", removed.join(", ")));
            }
            Some(RedactedConfig {
                rel: PathBuf::from(rel),
                contents: header + &contents,
                removed,
            })
        })
        .collect()
}

/// Whether a key names a credential (`//host/:_authToken`, `password`,
/// `http.extraHeader`, …).
fn secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    let last = k.rsplit([':', '.', '/']).next().unwrap_or(&k);
    SECRET_KEY_WORDS.iter().any(|w| k.contains(w))
        || last == "auth"
        || last == "_auth"
        || SECRET_KEY_ENDINGS.iter().any(|e| last.ends_with(e))
        // npm's per-registry login (`//host/path/:username` with its
        // `_password`, `:email`) and client certificate (`:certfile`,
        // `:keyfile`): each is part of how npm authenticates to that
        // registry, none is needed to fetch from it.
        || (k.starts_with("//") && NPM_REGISTRY_AUTH_KEYS.contains(&last))
        || KEY_FILE_KEYS.contains(&last)
}

/// The last parts of npm's `//registry/path/:KEY` entries that belong to
/// its login (see [`secret_key`]).
const NPM_REGISTRY_AUTH_KEYS: &[&str] = &["username", "email", "certfile", "keyfile"];

/// Keys whose value names a file holding a client key (npm's `keyfile`
/// and `certfile`, pip's `client-cert`: a PEM with the key in it): the
/// copies drop the key, and the file it names is hidden like a protected
/// path ([`tool_config_key_files`]).
const KEY_FILE_KEYS: &[&str] = &["keyfile", "certfile", "client-cert", "client_cert"];

/// Configuration files a tool reads from the workspace root (npm's project
/// `.npmrc`, next to `package.json`; cargo's and uv's project configs) or
/// from HOME at their host paths (cargo's `$CARGO_HOME` is `~/.cargo`, uv's
/// `~/.config/uv/uv.toml`), which may hold a registry credential: each is
/// shown at its own path as a redacted copy when the redaction removes
/// something ([`tool_config_view`]), as it is otherwise. HOME's `.npmrc`
/// and `pip.conf` are not here: they are protected paths with a copy under
/// the sandbox HOME ([`USER_TOOL_CONFIGS`]).
pub const WORKSPACE_TOOL_CONFIGS: &[&str] = &[
    ".npmrc",
    ".yarnrc.yml",
    ".cargo/config.toml",
    ".cargo/config",
    "uv.toml",
];
pub const HOME_TOOL_CONFIGS: &[&str] = &[
    ".cargo/config.toml",
    ".cargo/config",
    ".config/uv/uv.toml",
    // Nix's `access-tokens` (GitHub/GitLab tokens for fetching flakes).
    ".config/nix/nix.conf",
];
/// The system-wide twins (relative to `/`): pip's and npm's global configs
/// (npm's under the usual prefixes), uv's, nix's.
pub const SYSTEM_TOOL_CONFIGS: &[&str] = &[
    "etc/pip.conf",
    "etc/xdg/pip/pip.conf",
    "etc/npmrc",
    "usr/etc/npmrc",
    "usr/local/etc/npmrc",
    "etc/uv/uv.toml",
    "etc/nix/nix.conf",
];

/// What the command sees of a tool config shown at its host path (see
/// [`WORKSPACE_TOOL_CONFIGS`]; `rel` is its name there, which says its
/// syntax: TOML for `*.toml` and cargo's `config`, yarn's YAML for `*.yml`,
/// pip's INI for `pip.conf`, npm's INI otherwise):
/// None when the redaction removes nothing; otherwise the redacted copy
/// headed by a comment naming what went (names only). A file that does
/// not read in its syntax is shown as that comment alone when it might
/// hold a credential (a key naming one appears in it), as it is otherwise.
pub fn tool_config_view(rel: &str, text: &[u8]) -> Option<String> {
    let toml = rel.ends_with(".toml") || rel.ends_with(".cargo/config");
    let parsed = std::str::from_utf8(text).ok().and_then(|t| {
        if toml {
            redact_toml(t)
        } else if rel.ends_with(".yml") {
            redact_yaml_lines(t)
        } else if rel.ends_with("pip.conf") {
            redact_config(t, Continuation::IndentOrBackslash)
        } else {
            redact_config(t, Continuation::Backslash)
        }
    });
    let Some((contents, removed)) = parsed else {
        let lossy = String::from_utf8_lossy(text);
        let maybe_secret = lossy
            .split(|c: char| !(c.is_ascii_alphanumeric() || "_-.:/".contains(c)))
            .any(secret_key)
            || moat_audit::redact_arg(&lossy) != lossy;
        return maybe_secret.then(|| {
            format!(
                "{WORKSPACE_GIT_CONFIG_MARK} this file is not shown: moat could not read it to remove its credentials; opt in with --ro PATH to see it\n"
            )
        });
    };
    let removed: Vec<String> = removed.into_iter().filter(|r| r != "comments").collect();
    if removed.is_empty() {
        return None;
    }
    Some(format!(
        "{WORKSPACE_GIT_CONFIG_MARK} a copy with credentials removed; the original stays on the host (opt in with --ro PATH to see it)\n{WORKSPACE_GIT_CONFIG_MARK} removed: {}\n{contents}",
        removed.join(", ")
    ))
}

/// Redacts yarn's `.yarnrc.yml` line by line, as far as its YAML is the
/// plain `key: value` kind yarn writes: a line whose key names a credential
/// (`npmAuthToken`, `npmAuthIdent`, `npmPassword`: [`secret_key`]) goes,
/// with every more-indented line after it (a block value); URL userinfo
/// and queries go from every value; a value that still reads as a
/// credential to the audit log's redaction goes with its key. None (the
/// file is then not shown) for YAML this does not follow: flow mappings,
/// anchors, tags, a key on a `- ` item, a multi-document file.
fn redact_yaml_lines(text: &str) -> Option<(String, Vec<String>)> {
    let mut out = String::new();
    let mut removed = Vec::new();
    // Lines more indented than this belong to a dropped key.
    let mut dropping: Option<usize> = None;
    for full in text.lines() {
        let indent = full.len() - full.trim_start().len();
        let t = full.trim();
        let line = full;
        if let Some(d) = dropping {
            if t.is_empty() || indent > d {
                continue;
            }
            dropping = None;
        }
        if t.is_empty() || t.starts_with('#') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        if t.starts_with("---") || t.starts_with("...") {
            return None;
        }
        // A list item (`- path: …`, `- value`): its dash is indentation.
        let item = t.len() - t.trim_start_matches(['-', ' ']).len();
        let (indent, t) = (indent + item, &t[item..]);
        let line = &line[..indent];
        if t.starts_with(['{', '[', '&', '*', '!', '|', '>', '%', '-']) {
            return None;
        }
        let Some((key, value)) = yaml_key_value(t) else {
            if item == 0 {
                return None;
            }
            // A plain list value.
            let (clean, had) = url_credentials_removed(t);
            if moat_audit::redact_arg(&clean) != clean {
                removed.push("a list value (it looks like a credential)".into());
                continue;
            }
            removed.extend(
                had.into_iter()
                    .map(|what| format!("{what} of a list value")),
            );
            out.push_str(&text_line_prefix(line, indent));
            out.push_str(&clean);
            out.push('\n');
            continue;
        };
        let name = key.trim_matches(['"', '\'']);
        if secret_key(name) {
            removed.push(name.to_string());
            dropping = Some(indent);
            continue;
        }
        let (clean, had) = url_credentials_removed(value);
        if moat_audit::redact_arg(&clean) != clean {
            removed.push(format!("{name} (its value looks like a credential)"));
            dropping = Some(indent);
            continue;
        }
        removed.extend(had.into_iter().map(|what| format!("{what} of {name}")));
        out.push_str(&text_line_prefix(line, indent));
        out.push_str(key);
        out.push(':');
        if !clean.is_empty() {
            out.push(' ');
            out.push_str(&clean);
        }
        out.push('\n');
    }
    Some((out, removed))
}

/// A YAML line's `key: value` (the key as written, quotes kept; the value
/// trimmed, possibly empty), or None when the line is not one.
fn yaml_key_value(t: &str) -> Option<(&str, &str)> {
    let key_end = match t.as_bytes().first() {
        Some(&q @ (b'"' | b'\'')) => t[1..].find(q as char)? + 2,
        _ => t.find(':')?,
    };
    let (key, rest) = t.split_at(key_end);
    let value = rest.strip_prefix(':')?;
    (value.is_empty() || value.starts_with(' ')).then(|| (key, value.trim()))
}

/// The prefix a kept line is written with: the original's leading part
/// (spaces, and a list item's dash), `indent` bytes of it.
fn text_line_prefix(line: &str, indent: usize) -> String {
    line.get(..indent).unwrap_or("").to_string()
}

/// Redacts a TOML config (cargo's `[registries.x] token`, uv's
/// `[[index]] url` with userinfo): parsed as TOML and rendered from the
/// parsed table, every key naming a credential ([`secret_key`]) dropped,
/// URL userinfo and query strings removed from every string, and a string
/// that still reads as a credential to the audit log's redaction dropped.
/// None when the text is not TOML.
fn redact_toml(text: &str) -> Option<(String, Vec<String>)> {
    let mut table: toml::Table = text.parse().ok()?;
    let mut removed = Vec::new();
    redact_toml_table(&mut table, "", &mut removed);
    Some((toml::to_string(&table).ok()?, removed))
}

fn redact_toml_table(table: &mut toml::Table, prefix: &str, removed: &mut Vec<String>) {
    let keys: Vec<String> = table.keys().cloned().collect();
    for key in keys {
        let name = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        if secret_key(&key) {
            table.remove(&key);
            removed.push(name);
            continue;
        }
        if let Some(v) = table.get_mut(&key) {
            if !redact_toml_value(v, &name, removed) {
                table.remove(&key);
            }
        }
    }
}

/// False when the value must go whole.
fn redact_toml_value(v: &mut toml::Value, name: &str, removed: &mut Vec<String>) -> bool {
    match v {
        toml::Value::String(s) => {
            let (clean, had) = url_credentials_removed(s);
            if moat_audit::redact_arg(&clean) != clean {
                removed.push(format!("{name} (its value looks like a credential)"));
                return false;
            }
            removed.extend(had.into_iter().map(|what| format!("{what} of {name}")));
            *s = clean;
            true
        }
        toml::Value::Table(t) => {
            redact_toml_table(t, name, removed);
            true
        }
        toml::Value::Array(a) => {
            let mut i = 0;
            while i < a.len() {
                if redact_toml_value(&mut a[i], name, removed) {
                    i += 1;
                } else {
                    a.remove(i);
                }
            }
            true
        }
        _ => true,
    }
}

/// The files the user's and the project's tool configs name as a client
/// key ([`KEY_FILE_KEYS`]: npm's `keyfile`/`certfile`, pip's
/// `client-cert`), `~/` expanded from `home`, relative ones from the
/// config's directory: the caller hides each existing one like a
/// protected path (the copies drop the key naming it).
pub fn tool_config_key_files(home: &Path, workspace: &Path) -> Vec<PathBuf> {
    tool_config_key_files_in(&ConfigReads::default(), home, workspace)
}

/// [`tool_config_key_files`], the files read through `reads`.
pub fn tool_config_key_files_in(
    reads: &ConfigReads,
    home: &Path,
    workspace: &Path,
) -> Vec<PathBuf> {
    let configs = USER_TOOL_CONFIGS
        .iter()
        .filter(|rel| !GIT_CONFIGS.contains(rel))
        .map(|rel| home.join(rel))
        .chain(std::iter::once(workspace.join(".npmrc")));
    let mut out: Vec<PathBuf> = Vec::new();
    for path in configs {
        let Some(read) = reads.get(&path) else {
            continue;
        };
        if read.len > MAX_INCLUDE_SCAN {
            continue;
        }
        let text = String::from_utf8_lossy(&read.bytes);
        for line in logical_lines(&text, Continuation::IndentOrBackslash) {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let key = key.trim().to_ascii_lowercase();
            let last = key.rsplit([':', '.', '/']).next().unwrap_or(&key);
            if !KEY_FILE_KEYS.contains(&last) {
                continue;
            }
            let v = value.trim().trim_matches('"');
            if v.is_empty() {
                continue;
            }
            let target = match v.strip_prefix("~/") {
                Some(r) => home.join(r),
                None => path.parent().unwrap_or(home).join(v),
            };
            if !out.contains(&target) {
                out.push(target);
            }
        }
    }
    out
}

/// How a value continues on the next physical line.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Continuation {
    /// git (and, conservatively, npm): a line ending in a backslash.
    Backslash,
    /// configparser (pip): that, or an indented line after a `key = value`.
    IndentOrBackslash,
}

/// Joins physical lines into logical ones, so a value's continuation is
/// judged (and dropped) with its key, never read as a line of its own.
fn logical_lines(text: &str, syntax: Continuation) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut backslash = false;
    let mut after_key = false;
    for raw in text.lines() {
        let indented = raw.starts_with([' ', '\t']) && !raw.trim().is_empty();
        match out.last_mut() {
            Some(last) if backslash => {
                last.pop();
                last.push_str(raw.trim_start());
            }
            Some(last) if syntax == Continuation::IndentOrBackslash && after_key && indented => {
                last.push(' ');
                last.push_str(raw.trim());
            }
            _ => out.push(raw.to_string()),
        }
        let last = out.last().map(String::as_str).unwrap_or("");
        let trailing = last.len() - last.trim_end_matches('\\').len();
        backslash = trailing % 2 == 1;
        let t = last.trim();
        after_key = !t.is_empty() && !t.starts_with(['#', ';', '[']);
    }
    out
}

/// A key as configuration files write them (`index-url`, `user.name`,
/// `//host/path/:always-auth`, `@scope:registry`).
fn plain_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 100
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:@/".contains(c))
}

/// Redacts INI-like text (pip.conf, .npmrc, git config). Returns the kept
/// text and what was removed, or None when the text does not read as a
/// configuration file (a PEM block, a line that is neither a section, a
/// comment nor `key = value`): then nothing of it is copied.
pub fn redact_config_text(text: &str) -> Option<(String, Vec<String>)> {
    redact_config(text, Continuation::Backslash)
}

/// [`redact_config_text`] for a given continuation syntax. Comments are
/// not copied: they change nothing for the tool, and an old credential
/// commented out (`#//host/:_authToken=…`) is still a credential.
pub fn redact_config(text: &str, syntax: Continuation) -> Option<(String, Vec<String>)> {
    if text.contains("-----BEGIN") {
        return None;
    }
    let mut out = String::new();
    let mut removed = Vec::new();
    // Inside a section dropped whole ([credential], [include], [includeIf]).
    let mut skipping = false;
    let mut comments = false;
    for raw in logical_lines(text, syntax) {
        let line = raw.trim();
        if line.starts_with('#') || line.starts_with(';') {
            comments = true;
            continue;
        }
        if line.is_empty() {
            if !skipping {
                out.push('\n');
            }
            continue;
        }
        if line.starts_with('[') {
            let end = line.find(']')?;
            let header = &line[..=end];
            // `[credential "url"]`, and git's older `[credential.url]`.
            let name = header[1..end]
                .split([' ', '\t', '"', '.'])
                .next()
                .unwrap_or("")
                .to_ascii_lowercase();
            skipping = matches!(name.as_str(), "credential" | "include" | "includeif");
            if skipping {
                removed.push(format!("section {name}"));
                continue;
            }
            let (clean, had) = url_credentials_removed(header);
            removed.extend(
                had.into_iter()
                    .map(|what| format!("{what} of section {name}")),
            );
            out.push_str(&clean);
            out.push('\n');
            continue;
        }
        if skipping {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            // git allows a bare boolean key (`[core] bare`).
            if line.len() <= 32 && line.chars().all(|c| c.is_ascii_alphabetic() || c == '-') {
                out.push_str(line);
                out.push('\n');
                continue;
            }
            return None;
        };
        let key = key.trim();
        if !plain_key(key) {
            return None;
        }
        if secret_key(key) {
            removed.push(key.to_string());
            continue;
        }
        let (value, had) = url_credentials_removed(value.trim());
        // A value that still reads as a credential to the audit log's
        // redaction (a `ghp_…` token, `password=…` in a command line) under
        // an innocent key.
        if moat_audit::redact_arg(&value) != value {
            removed.push(format!("{key} (its value looks like a credential)"));
            continue;
        }
        removed.extend(had.into_iter().map(|what| format!("{what} of {key}")));
        out.push_str(&format!("{key} = {value}\n"));
    }
    if comments {
        removed.push("comments".into());
    }
    Some((out, removed))
}

/// Redacts a git config file (`~/.gitconfig`, `~/.config/git/config`).
/// It is parsed as git parses it and the copy is rendered from the parsed
/// entries, so nothing git would read differently from this redactor (a
/// quoted value spanning lines, a `[section.sub]` header, a key after a
/// header on its line) can carry bytes into the copy. Dropped: the sections
/// in [`GIT_DROPPED_SECTIONS`], keys naming a credential (`http.extraHeader`,
/// `*.password`, `github.token`, `sendemail.smtpPass`…), and any entry whose
/// value or subsection still looks like a credential to the audit log's
/// redaction (`moat_audit::redact_arg`: an `Authorization:` header in an
/// alias, `password=…`, a `ghp_…` token) after URL userinfo and query
/// strings are removed from both (`url."https://TOKEN@host/".insteadOf`
/// keeps working as `url."https://host/".insteadOf`). None when git itself
/// could not read the file.
pub fn redact_git_config(text: &str) -> Option<(String, Vec<String>)> {
    use moat_policy::gitconfig;
    let entries = gitconfig::parse(text).ok()?;
    let mut kept = Vec::new();
    let mut removed: Vec<String> = Vec::new();
    let mut note = |what: String| {
        if !removed.contains(&what) {
            removed.push(what);
        }
    };
    for mut e in entries {
        // A name that never shows a subsection: it may be the secret.
        let name = match e.subsection {
            Some(_) => format!("{}.*.{}", e.section, e.key),
            None => format!("{}.{}", e.section, e.key),
        };
        if GIT_DROPPED_SECTIONS.contains(&e.section.as_str()) {
            note(format!("section {}", e.section));
            continue;
        }
        if secret_key(&format!("{}.{}", e.section, e.key)) {
            note(name);
            continue;
        }
        if let Some(sub) = &e.subsection {
            let (clean, had) = url_credentials_removed(sub);
            if moat_audit::redact_arg(&clean) != clean {
                note(format!("{name} (its subsection looks like a credential)"));
                continue;
            }
            for what in had {
                note(format!("{what} of {}.*", e.section));
            }
            e.subsection = Some(clean);
        }
        if let Some(v) = &e.value {
            let (clean, had) = url_credentials_removed(v);
            if moat_audit::redact_arg(&clean) != clean {
                note(format!("{name} (its value looks like a credential)"));
                continue;
            }
            for what in had {
                note(format!("{what} of {name}"));
            }
            e.value = Some(clean);
        }
        kept.push(e);
    }
    Some((gitconfig::render(&kept), removed))
}

/// The files the user's git config files include (`[include] path`,
/// `[includeIf "…"] path`), as git would resolve them: `~/` from `home`,
/// `~user/` from that user's home in `/etc/passwd`, a relative path from
/// the including file's directory. The config files read are HOME's
/// ([`GIT_CONFIGS`]) and `others` (the system's `/etc/gitconfig`, an
/// `$XDG_CONFIG_HOME/git/config` outside HOME). The sanitized copies drop
/// the includes; the files themselves are where users keep what they did
/// not want in their main config (a token, a signing key's passphrase
/// helper), so the caller hides each existing one like a protected path.
/// An included file's own includes are followed too, as deep as git goes
/// ([`GIT_MAX_INCLUDE_DEPTH`]).
pub fn git_include_targets(home: &Path, others: &[PathBuf]) -> Vec<PathBuf> {
    git_include_targets_in(&ConfigReads::default(), home, others)
}

/// [`git_include_targets`], the files read through `reads`.
pub fn git_include_targets_in(
    reads: &ConfigReads,
    home: &Path,
    others: &[PathBuf],
) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut queue: Vec<(PathBuf, usize)> = GIT_CONFIGS
        .iter()
        .map(|rel| home.join(rel))
        .chain(others.iter().cloned())
        .map(|p| (p, 0))
        .collect();
    let mut next = 0;
    while let Some((path, depth)) = queue.get(next).cloned() {
        next += 1;
        if depth >= GIT_MAX_INCLUDE_DEPTH {
            continue;
        }
        for target in includes_of(reads, home, &path) {
            if !out.contains(&target) && !queue.iter().any(|(q, _)| *q == target) {
                out.push(target.clone());
                queue.push((target, depth + 1));
            }
        }
    }
    out
}

/// How deep git follows includes (its `MAX_INCLUDE_DEPTH`).
const GIT_MAX_INCLUDE_DEPTH: usize = 10;

/// The files one git config file includes, resolved (see
/// [`git_include_targets`]); none when it is not a readable regular file.
fn includes_of(reads: &ConfigReads, home: &Path, path: &Path) -> Vec<PathBuf> {
    // Bytes, not UTF-8 only: git reads a Latin-1 name as bytes, and the
    // copy is skipped for such a file, so its includes must be found
    // here or nowhere (a path itself in another encoding is mangled,
    // and then not found either way). Likewise a file too large to copy
    // is still read for its includes, up to a bound.
    let Some(read) = reads.get(path) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&read.bytes);
    let paths: Vec<String> = match moat_policy::gitconfig::parse(&text) {
        Ok(entries) => entries
            .into_iter()
            .filter(|e| GIT_DROPPED_SECTIONS[1..].contains(&e.section.as_str()))
            .filter(|e| e.key == "path")
            .filter_map(|e| e.value)
            .collect(),
        // A file git may read but moat cannot (a form the parser does
        // not know yet): every `path = …` line, in any section, is
        // taken for an include. Hiding too much is harmless; missing
        // the file where the token is kept is not.
        Err(_) => loose_path_values(&text),
    };
    // A relative include is relative to the including file; for a
    // symlinked config (dotfile managers) both its directory and the
    // target's are candidates, whichever git version resolves which.
    let mut dirs = vec![path.parent().unwrap_or(home).to_path_buf()];
    if let Some(d) = std::fs::canonicalize(path)
        .ok()
        .and_then(|c| c.parent().map(Path::to_path_buf))
    {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for v in paths {
        if v.is_empty() {
            continue;
        }
        let targets = match expand_user_path(home, &v) {
            Some(p) => vec![p],
            // `~name/…` of a user /etc/passwd does not know: git fails on
            // it too.
            None if v.starts_with('~') => Vec::new(),
            None => dirs.iter().map(|d| d.join(&v)).collect(),
        };
        for target in targets {
            if !out.contains(&target) {
                out.push(target);
            }
        }
    }
    out
}

/// `~/rest` (from `home`) and `~name/rest` (from `name`'s home in
/// `/etc/passwd`), as git expands an include path; None for anything else.
fn expand_user_path(home: &Path, value: &str) -> Option<PathBuf> {
    let rest = value.strip_prefix('~')?;
    let (name, tail) = rest.split_once('/')?;
    if name.is_empty() {
        return Some(home.join(tail));
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        (f.next() == Some(name))
            .then(|| f.nth(4))
            .flatten()
            .filter(|h| h.starts_with('/'))
            .map(|h| Path::new(h).join(tail))
    })
}

/// The values of every line that reads `path = VALUE` (after an optional
/// `[header]`), quotes removed: the includes of a file the parser could not
/// read, over-approximated.
fn loose_path_values(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let line = match line.strip_prefix('[') {
                Some(_) => line.rfind(']').map_or("", |i| &line[i + 1..]).trim_start(),
                None => line,
            };
            let rest = line
                .get(..4)?
                .eq_ignore_ascii_case("path")
                .then(|| &line[4..])?;
            let value = rest.trim_start().strip_prefix('=')?.trim();
            Some(value.trim_matches('"').to_string())
        })
        .collect()
}

/// What in the workspace's own `.git/config` the git-config redaction
/// would remove (names only, never values): a token in a remote URL, a
/// persisted `http.*.extraheader` (CI checkouts). The command sees the
/// redacted copy ([`workspace_git_config_view`]); `explain-policy` names
/// these so the user knows why a push inside would not authenticate.
pub fn workspace_git_config_credentials(workspace: &Path) -> Vec<String> {
    let path = workspace.join(".git/config");
    let Ok(meta) = std::fs::symlink_metadata(&path) else {
        return Vec::new();
    };
    if !meta.is_file() || meta.len() > MAX_SIZE {
        return Vec::new();
    }
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Vec::new();
    };
    match redact_git_config(&text) {
        Some((_, removed)) => removed,
        None => vec!["an unreadable git config (not checked)".into()],
    }
}

/// What the command sees of one of the workspace's own git config files
/// (`.git/config`, a common dir's or a submodule's `config`): None when
/// the git-config redaction removes nothing (the file is shown as it is);
/// otherwise the redacted file (rendered from what git's syntax parsed:
/// URL userinfo and query strings, `[credential]`, `[include]`,
/// `*.extraheader` and every entry `moat_audit::redact_arg` flags gone),
/// headed by a comment naming what was removed (names only). A file that
/// does not read as git config (not UTF-8, a parse error) is shown as that
/// comment alone: moat cannot tell what in it is secret.
pub fn workspace_git_config_view(text: &[u8]) -> Option<String> {
    let parsed = std::str::from_utf8(text).ok().and_then(redact_git_config);
    let Some((contents, removed)) = parsed else {
        return Some(format!(
            "{WORKSPACE_GIT_CONFIG_MARK} this git config is not shown: moat could not read it as git config; opt in with --ro PATH to see the file\n"
        ));
    };
    if removed.is_empty() {
        return None;
    }
    Some(format!(
        "{WORKSPACE_GIT_CONFIG_MARK} a copy with credentials removed; the original stays on the host (opt in with --ro PATH to see it)\n{WORKSPACE_GIT_CONFIG_MARK} removed: {}\n{contents}",
        removed.join(", ")
    ))
}

/// What the sandbox sees for a workspace git config too large to read
/// (and so to redact): a comment saying so, never the raw file.
pub fn workspace_git_config_too_large() -> String {
    format!(
        "{WORKSPACE_GIT_CONFIG_MARK} this git config is not shown: it is larger than a git config moat reads (256 KiB); opt in with --ro PATH to see the file\n"
    )
}

/// How the first line of a redacted workspace git config starts.
pub const WORKSPACE_GIT_CONFIG_MARK: &str = "# moat:";

/// `text` without URL userinfo and query strings, and what went: the names
/// ("userinfo", "query") of what was removed, never values.
fn url_credentials_removed(text: &str) -> (String, Vec<&'static str>) {
    let (no_userinfo, userinfo) = moat_policy::strip_url_userinfo(text);
    let (clean, any) = moat_policy::strip_url_credentials(text);
    let query = any && moat_policy::strip_url_credentials(&no_userinfo).1;
    let what = [(userinfo, "userinfo"), (query, "query")]
        .into_iter()
        .filter_map(|(had, name)| had.then_some(name))
        .collect();
    (clean, what)
}

/// How a registry credential is presented.
#[derive(Clone, PartialEq, Eq)]
pub enum CredentialKind {
    /// `Basic base64(user:password)`.
    Basic { user: String, password: String },
    /// `Basic VALUE`, already encoded (npm's `_auth`).
    BasicEncoded(String),
    /// `Bearer TOKEN` (npm's `_authToken`).
    Bearer(String),
}

/// A credential from the user's own configuration for a registry the same
/// configuration names with `http://` (plain HTTP, where a proxy can add a
/// header). Debug never prints the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpCredential {
    pub host: String,
    pub port: u16,
    /// The request paths the credential is for: `/` for a whole host (an
    /// index URL's userinfo), npm's `//host/PATH/:_authToken` scope
    /// otherwise (npm itself sends it only below that path).
    pub path_prefix: String,
    pub kind: CredentialKind,
}

impl std::fmt::Debug for HttpCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HttpCredential({}:{}, ***)", self.host, self.port)
    }
}

/// A URL's host, port and (user, password), percent-decoded.
type HttpUrl = (String, u16, Option<(String, String)>);

/// `http://[user[:pw]@]host[:port]/…` → (host, port, userinfo).
fn http_url(url: &str) -> Option<HttpUrl> {
    let rest = url.trim().strip_prefix("http://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) = v6.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => 80,
        };
        (h.to_string(), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None => (hostport.to_string(), 80),
        }
    };
    if host.is_empty() {
        return None;
    }
    let creds = userinfo.map(|u| {
        let (user, pw) = u.split_once(':').unwrap_or((u, ""));
        (percent_decode(user), percent_decode(pw))
    });
    Some((host.to_ascii_lowercase(), port, creds))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `key = value` pairs of INI-like text (sections ignored).
fn pairs(text: &str) -> impl Iterator<Item = (String, String)> + '_ {
    text.lines().filter_map(|l| {
        let l = l.trim();
        if l.starts_with(['#', ';', '[']) {
            return None;
        }
        let (k, v) = l.split_once('=')?;
        Some((k.trim().to_string(), v.trim().to_string()))
    })
}

/// Credentials for plain-HTTP registries in the user's pip and npm
/// configuration and in `PIP_INDEX_URL`/`PIP_EXTRA_INDEX_URL`: an index
/// URL's userinfo, and npm's `//host/:_authToken`/`:_auth` for a host that
/// a `registry` setting names with `http://`. HTTPS registries are left
/// out: a proxy cannot add a header inside TLS without intercepting it.
pub fn http_registry_credentials(home: &Path, env: &[(String, String)]) -> Vec<HttpCredential> {
    let read = |rel: &str| {
        let p = home.join(rel);
        let m = std::fs::metadata(&p).ok()?;
        (m.is_file() && m.len() <= MAX_SIZE)
            .then(|| std::fs::read_to_string(&p).ok())
            .flatten()
    };
    let mut out: Vec<HttpCredential> = Vec::new();
    let mut push = |c: HttpCredential| {
        if !out
            .iter()
            .any(|o| o.host == c.host && o.port == c.port && o.path_prefix == c.path_prefix)
        {
            out.push(c);
        }
    };
    let index_keys = [
        "index-url",
        "extra-index-url",
        "index_url",
        "extra_index_url",
    ];
    let mut urls: Vec<String> = Vec::new();
    for rel in [".config/pip/pip.conf", ".pip/pip.conf"] {
        if let Some(text) = read(rel) {
            for (k, v) in pairs(&text) {
                if index_keys.contains(&k.to_ascii_lowercase().as_str()) {
                    urls.extend(v.split_whitespace().map(str::to_string));
                }
            }
        }
    }
    for (k, v) in env {
        if k == "PIP_INDEX_URL" || k == "PIP_EXTRA_INDEX_URL" {
            urls.extend(v.split_whitespace().map(str::to_string));
        }
    }
    for u in &urls {
        if let Some((host, port, Some((user, password)))) = http_url(u) {
            push(HttpCredential {
                host,
                port,
                path_prefix: "/".into(),
                kind: CredentialKind::Basic { user, password },
            });
        }
    }
    if let Some(text) = read(".npmrc") {
        let all: Vec<(String, String)> = pairs(&text).collect();
        let http_registries: Vec<(String, u16)> = all
            .iter()
            .filter(|(k, _)| k == "registry" || k.ends_with(":registry"))
            .filter_map(|(_, v)| http_url(v).map(|(h, p, _)| (h, p)))
            .collect();
        for (k, v) in &all {
            let Some(rest) = k.strip_prefix("//") else {
                continue;
            };
            let Some((hostpath, key)) = rest.rsplit_once(':') else {
                continue;
            };
            let Some((host, port, _)) = http_url(&format!("http://{hostpath}")) else {
                continue;
            };
            if !http_registries.contains(&(host.clone(), port)) {
                continue;
            }
            let kind = match key {
                "_authToken" => CredentialKind::Bearer(v.clone()),
                "_auth" => CredentialKind::BasicEncoded(v.clone()),
                _ => continue,
            };
            // `//host:port/path/` → `/path/` (npm's nerf-dart scope).
            let path_prefix = match hostpath.find('/') {
                Some(i) => hostpath[i..].to_string(),
                None => "/".into(),
            };
            push(HttpCredential {
                host,
                port,
                path_prefix,
                kind,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npmrc_keeps_settings_and_drops_credentials() {
        let (out, removed) = redact_config_text(
            "registry=https://npm.corp.example/\nfund=false\ninit-author-name=Ada\n\
             init-author-url=ghp_ABCDEFGHIJKLMNOPQRSTUVWX\n\
             //npm.corp.example/:_authToken=NPMSECRET\n_auth=QUJDU0VDUkVU\n\
             //npm.corp.example/:_password=PWSECRET\nemail=ada@example.com\n\
             @corp:registry=https://user:URLSECRET@npm.corp.example/\n",
        )
        .unwrap();
        for kept in [
            "registry = https://npm.corp.example/",
            "fund = false",
            "init-author-name = Ada",
            "@corp:registry = https://npm.corp.example/",
        ] {
            assert!(out.contains(kept), "{kept}: {out}");
        }
        for secret in [
            "NPMSECRET",
            "QUJDU0VDUkVU",
            "PWSECRET",
            "URLSECRET",
            "ghp_ABCDEFGHIJKLMNOPQRSTUVWX",
        ] {
            assert!(!out.contains(secret), "{secret}: {out}");
            assert!(!removed.iter().any(|r| r.contains(secret)));
        }
        assert!(removed.iter().any(|r| r.ends_with(":_authToken")));
    }

    #[test]
    fn pip_and_git_keep_index_and_identity() {
        let (out, _) = redact_config_text(
            "[global]\nindex-url = https://me:PIPSECRET@pypi.corp.example/simple\ntimeout = 30\n",
        )
        .unwrap();
        assert!(
            out.contains("index-url = https://pypi.corp.example/simple"),
            "{out}"
        );
        assert!(!out.contains("PIPSECRET"));
        let (out, _) = redact_config_text(
            "[user]\n\tname = Ada Lovelace\n\temail = ada@example.com\n[credential]\n\thelper = store\n\
             [http \"https://x\"]\n\textraHeader = Authorization: Bearer GITSECRET\n\
             [url \"https://tok:URLSECRET@github.com/\"]\n\tinsteadOf = https://github.com/\n\
             [include]\n\tpath = ~/.gitconfig.local\n[core]\n\tbare\n",
        )
        .unwrap();
        assert!(out.contains("name = Ada Lovelace"), "{out}");
        assert!(out.contains("email = ada@example.com"), "{out}");
        assert!(out.contains("[url \"https://github.com/\"]"), "{out}");
        for secret in ["GITSECRET", "URLSECRET", "helper", "gitconfig.local"] {
            assert!(!out.contains(secret), "{secret}: {out}");
        }
        assert!(out.contains("bare"), "{out}");
    }

    #[test]
    fn git_config_keeps_identity_aliases_and_settings() {
        let text = "[user]\n\tname = Ada Lovelace\n\temail = ada@example.com\n\
                    [alias]\n\tst = status -sb\n\tlg = log --graph --pretty=format:'%h %s'\n\
                    [core]\n\teditor = vim\n\tautocrlf = input\n\
                    [remote \"origin\"]\n\turl = git@github.com:ada/engine.git\n\
                    [init]\n\tdefaultBranch = main\n[pull]\n\trebase\n\
                    [url \"git@github.com:\"]\n\tinsteadOf = https://github.com/\n\
                    [filter \"lfs\"]\n\tclean = git-lfs clean -- %f\n\trequired = true\n\
                    [core]\n\tpager = delta\n\tsshCommand = ssh -i ~/.ssh/work -o IdentitiesOnly=yes\n\
                    [alias]\n\tpushf = push --force-with-lease\n\tamend = commit --amend --no-edit\n\
                    \tl = log --pretty=format:\\\"%C(yellow)%h %an\\\"\n\
                    [commit]\n\tgpgsign = true\n";
        let (out, removed) = redact_git_config(text).unwrap();
        assert!(removed.is_empty(), "{removed:?}");
        assert_eq!(
            moat_policy::gitconfig::parse(&out).unwrap(),
            moat_policy::gitconfig::parse(text).unwrap()
        );
    }

    #[test]
    fn git_config_credentials_are_removed() {
        let text = "[user]\n\tname = Ada\n\
            [http]\n\textraHeader = Authorization: Bearer S1SECRET\n\
            [http \"https://h.example/\"]\n\textraheader = AUTHORIZATION: basic S2SECRET\n\
            [url \"https://x-access-token:S3SECRET@github.com/\"]\n\tinsteadOf = https://github.com/\n\
            [credential]\n\thelper = \"!f() { echo password=S4SECRET; }; f\"\n\
            [credential \"https://h.example\"]\n\tusername = S5SECRET\n\
            [Credential.h]\n\thelper = S6SECRET\n\
            [include]\n\tpath = ~/.S7SECRET\n[includeIf \"gitdir:~/w/\"]\n\tpath = S8SECRET\n\
            [remote \"o\"]\n\turl = https://ada:S9SECRET@git.example/r.git\n\
            [alias]\n\tapi = !curl -H 'Authorization: token S10SECRET' https://api.example\n\
            \tpub = !twine upload --password S11SECRET dist/*\n\
            [github]\n\ttoken = S12SECRET\n[sendemail]\n\tsmtpPass = S13SECRET\n\
            [hub]\n\tx = ghp_ABCDEFGHIJKLMNOPQRSTUV\n\
            [lfs]\n\turl = https://h.example/lfs?private_token=S14SECRET\n\
            [core] askpass = x\n[http] proxy = http://u:S15SECRET@proxy:3128\n";
        let (out, removed) = redact_git_config(text).unwrap();
        for n in 1..=15 {
            let secret = format!("S{n}SECRET");
            assert!(!out.contains(&secret), "{secret}: {out}");
            assert!(!removed.iter().any(|r| r.contains(&secret)), "{removed:?}");
        }
        assert!(!out.contains("ghp_"), "{out}");
        assert!(out.contains("name = \"Ada\""), "{out}");
        assert!(out.contains("[url \"https://github.com/\"]"), "{out}");
        assert!(out.contains("https://git.example/r.git"), "{out}");
        assert!(out.contains("https://h.example/lfs"), "{out}");
        for r in ["section credential", "section include", "http.extraheader"] {
            assert!(removed.iter().any(|x| x == r), "{r}: {removed:?}");
        }
    }

    #[test]
    fn git_include_targets_resolve_like_git() {
        let dir = tempfile::tempdir().unwrap();
        let h = dir.path();
        std::fs::write(
            h.join(".gitconfig"),
            "[include]\n\tpath = ~/.gitconfig.local\n\tpath = rel.inc\n\
             [includeIf \"gitdir:~/work/\"]\n\tpath = /etc/corp.gitconfig\n[user]\n\tname = A\n",
        )
        .unwrap();
        std::fs::create_dir_all(h.join(".config/git")).unwrap();
        std::fs::write(h.join(".config/git/config"), "[include]\n\tpath = tok\n").unwrap();
        assert_eq!(
            git_include_targets(h, &[]),
            vec![
                h.join(".gitconfig.local"),
                h.join("rel.inc"),
                PathBuf::from("/etc/corp.gitconfig"),
                h.join(".config/git/tok"),
            ]
        );
    }

    #[test]
    fn git_include_targets_follow_nested_includes_user_homes_and_other_configs() {
        let dir = tempfile::tempdir().unwrap();
        let h = dir.path();
        // ~/.gitconfig → ~/.a → ~/.b (a token kept two includes away), and
        // another user's home by name (root's is in every /etc/passwd).
        std::fs::write(
            h.join(".gitconfig"),
            "[include]\n\tpath = ~/.a\n\tpath = ~root/.moat-test-tok\n\tpath = ~nosuchuser-moat/x\n",
        )
        .unwrap();
        std::fs::write(h.join(".a"), "[include]\n\tpath = .b\n").unwrap();
        std::fs::write(h.join(".b"), "[include]\n\tpath = ~/.a\n").unwrap();
        // A system config (passed in) with its own include.
        std::fs::write(h.join("sys"), "[include]\n\tpath = sys.inc\n").unwrap();
        let root_home = std::fs::read_to_string("/etc/passwd")
            .unwrap()
            .lines()
            .find(|l| l.starts_with("root:"))
            .and_then(|l| l.split(':').nth(5).map(PathBuf::from))
            .unwrap();
        assert_eq!(
            git_include_targets(h, &[h.join("sys")]),
            vec![
                h.join(".a"),
                root_home.join(".moat-test-tok"),
                h.join("sys.inc"),
                h.join(".b"),
            ]
        );
    }

    #[test]
    fn tool_configs_lose_registry_credentials_and_keep_settings() {
        let yarn = "nodeLinker: node-modules\nyarnPath: .yarn/releases/yarn-4.1.0.cjs\n\
                    npmRegistryServer: \"https://u:Y1SECRET@npm.corp.example\"\n\
                    npmAuthToken: Y2SECRET\n\
                    npmScopes:\n  corp:\n    npmAlwaysAuth: true\n    npmAuthIdent: \"bob:Y3SECRET\"\n\
                    npmRegistries:\n  \"https://npm.corp.example\":\n    npmAuthToken: |\n      Y4SECRET\n\
                    plugins:\n  - path: .yarn/plugins/x.cjs\n    spec: \"https://x.example/p.js\"\n";
        let out = tool_config_view(".yarnrc.yml", yarn.as_bytes()).expect("redacted");
        for n in 1..=4 {
            assert!(!out.contains(&format!("Y{n}SECRET")), "{out}");
        }
        for kept in [
            "nodeLinker: node-modules",
            "yarnPath: .yarn/releases/yarn-4.1.0.cjs",
            "npmRegistryServer: \"https://npm.corp.example\"",
            "    npmAlwaysAuth: true",
            "  \"https://npm.corp.example\":",
            "  - path: .yarn/plugins/x.cjs",
            "    spec: \"https://x.example/p.js\"",
        ] {
            assert!(out.contains(kept), "{kept}: {out}");
        }
        assert!(tool_config_view(".yarnrc.yml", b"nodeLinker: pnp\n").is_none());
        let pip = "[global]\nindex-url = https://u:P1SECRET@pypi.corp.example/simple\n\
                   extra-index-url =\n    https://a:P2SECRET@x.example/simple\n";
        let out = tool_config_view("etc/pip.conf", pip.as_bytes()).expect("redacted");
        assert!(
            !out.contains("P1SECRET") && !out.contains("P2SECRET"),
            "{out}"
        );
        assert!(
            out.contains("index-url = https://pypi.corp.example/simple"),
            "{out}"
        );
    }

    #[test]
    fn one_launchs_reads_answer_as_separate_reads_do() {
        let dir = tempfile::tempdir().unwrap();
        let h = dir.path();
        std::fs::write(
            h.join(".gitconfig"),
            "[include]\n\tpath = ~/.tok\n[user]\n\tname = A\n\tpassword = p\n",
        )
        .unwrap();
        std::fs::write(
            h.join(".npmrc"),
            "registry=https://r.example/\n//r.example/:_authToken=t\nkeyfile=~/k.pem\n",
        )
        .unwrap();
        // Larger than a copy may be: no copy, its key file still found.
        let mut big = "x=y\n".repeat(MAX_SIZE as usize / 4 + 1);
        big.push_str("client-cert = /etc/c.pem\n");
        std::fs::create_dir_all(h.join(".pip")).unwrap();
        std::fs::write(h.join(".pip/pip.conf"), big).unwrap();
        let reads = ConfigReads::default();
        assert_eq!(
            redacted_user_configs_in(&reads, h),
            redacted_user_configs(h)
        );
        assert_eq!(redacted_user_configs(h).len(), 2);
        assert_eq!(
            git_include_targets_in(&reads, h, &[]),
            git_include_targets(h, &[])
        );
        assert_eq!(
            tool_config_key_files_in(&reads, h, h),
            tool_config_key_files(h, h)
        );
        assert_eq!(
            tool_config_key_files(h, h),
            vec![PathBuf::from("/etc/c.pem"), h.join("k.pem")]
        );
        // Each file was read once, by the first step that asked: kept
        // for the launch (a later launch reads afresh).
        std::fs::remove_file(h.join(".npmrc")).unwrap();
        assert_eq!(
            tool_config_key_files_in(&reads, h, h),
            vec![PathBuf::from("/etc/c.pem"), h.join("k.pem")]
        );
        assert_eq!(
            tool_config_key_files(h, h),
            vec![PathBuf::from("/etc/c.pem")]
        );
    }

    #[test]
    fn includes_of_a_config_not_in_utf8_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let h = dir.path();
        std::fs::write(
            h.join(".gitconfig"),
            b"[user]\n\tname = Jos\xe9\n[include]\n\tpath = ~/.tok\n",
        )
        .unwrap();
        assert_eq!(git_include_targets(h, &[]), vec![h.join(".tok")]);
    }

    #[test]
    fn includes_of_a_config_moat_cannot_parse_are_still_found() {
        let dir = tempfile::tempdir().unwrap();
        let h = dir.path();
        // Not git config moat can read (an unclosed header), yet it names
        // two files.
        std::fs::write(
            h.join(".gitconfig"),
            "[include\n\tpath = ~/.tok\n[includeIf \"x\"] PATH = \"rel.inc\"\n",
        )
        .unwrap();
        assert_eq!(
            git_include_targets(h, &[]),
            vec![h.join(".tok"), h.join("rel.inc")]
        );
    }

    #[test]
    fn workspace_git_config_credentials_are_named_not_shown() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        assert!(workspace_git_config_credentials(ws).is_empty());
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        std::fs::write(
            ws.join(".git/config"),
            "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://x:WSSECRET@h.example/r\n\
             [http \"https://h.example/\"]\n\textraheader = AUTHORIZATION: basic WSSECRET2\n",
        )
        .unwrap();
        let found = workspace_git_config_credentials(ws);
        assert_eq!(
            found,
            vec!["userinfo of remote.*.url", "http.*.extraheader"],
            "{found:?}"
        );
    }

    #[test]
    fn workspace_git_config_view_redacts_only_what_holds_credentials() {
        let clean =
            b"[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://github.com/o/r\n";
        assert_eq!(workspace_git_config_view(clean), None);
        let secret = b"[remote \"origin\"]\n\turl = https://x:TOK1@github.com/o/r\n\
                       [http \"https://github.com/\"]\n\textraheader = AUTHORIZATION: basic TOK2\n\
                       [credential]\n\thelper = !echo password=TOK3\n\
                       [url \"https://TOK4@github.com/\"]\n\tinsteadOf = https://m/\n";
        let shown = workspace_git_config_view(secret).unwrap();
        for t in ["TOK1", "TOK2", "TOK3", "TOK4"] {
            assert!(!shown.contains(t), "{t} in {shown}");
        }
        assert!(shown.starts_with(WORKSPACE_GIT_CONFIG_MARK), "{shown}");
        assert!(shown.contains("http.*.extraheader") && shown.contains("section credential"));
        assert!(shown.contains("https://github.com/o/r"), "{shown}");
        // Not git config (or not UTF-8): nothing of it is shown.
        for bad in [
            &b"-----BEGIN KEY-----\nTOK5\n"[..],
            &b"[core]\n\tx = \xff TOK6\n"[..],
        ] {
            let shown = workspace_git_config_view(bad).unwrap();
            assert!(!shown.contains("TOK"), "{shown}");
        }
    }

    #[test]
    fn git_config_git_cannot_read_is_not_copied() {
        assert_eq!(redact_git_config("[core\nx = 1\n"), None);
        assert_eq!(redact_git_config("-----BEGIN X-----\nabc\n"), None);
    }

    #[test]
    fn credentials_for_plain_http_registries_only() {
        let dir = tempfile::tempdir().unwrap();
        let h = dir.path();
        std::fs::create_dir_all(h.join(".config/pip")).unwrap();
        std::fs::write(
            h.join(".config/pip/pip.conf"),
            "[global]\nindex-url = http://me:p%40ss@pypi.corp.example:8080/simple\n\
             extra-index-url = https://u:tls@secure.example/simple\n",
        )
        .unwrap();
        std::fs::write(
            h.join(".npmrc"),
            "registry=http://npm.corp.example/\n//npm.corp.example/:_authToken=TOK\n\
             //registry.npmjs.org/:_authToken=PUBLIC\n",
        )
        .unwrap();
        let c = http_registry_credentials(h, &[]);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!((c[0].host.as_str(), c[0].port), ("pypi.corp.example", 8080));
        assert!(
            c[0].kind
                == CredentialKind::Basic {
                    user: "me".into(),
                    password: "p@ss".into()
                }
        );
        assert_eq!((c[1].host.as_str(), c[1].port), ("npm.corp.example", 80));
        assert!(c[1].kind == CredentialKind::Bearer("TOK".into()));
        assert!(!format!("{c:?}").contains("TOK"));
    }

    #[test]
    fn a_file_that_is_not_configuration_yields_nothing() {
        for text in [
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n",
            "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7+xyz/abc=\n",
            "AKIAABCDEFGHIJKLMNOP\nwJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY\n",
        ] {
            assert_eq!(redact_config_text(text), None, "{text}");
        }
    }
}
