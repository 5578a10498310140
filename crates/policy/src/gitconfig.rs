//! Git config files a command created: keep the keys that only describe the
//! repository, drop every key that could make a later host `git` run a
//! program or look elsewhere for config, hooks or objects.
//!
//! An allow-list, not a deny-list: git grows new program-running keys
//! (`core.fsmonitor`, `core.hooksPath`, `filter.*`, `diff.*.textconv`,
//! `credential.*`, `include.*`, `alias.*`, `uploadpack.*`, …) faster than a
//! deny-list could follow. The sanitized file is written by
//! [`render`] from what [`parse`] understood, never copied line by line: a
//! line this parser reads differently from git cannot reach the output.

/// Keys kept in a config the command created, `section.key` or
/// `section.*.key` (lower case; subsections match any name). Each one only
/// describes the repository or its refs; none names a program, a path git
/// would load code or config from, or a transport helper (URLs are checked
/// separately by [`inert_value`]).
pub const GIT_CONFIG_ALLOWED_KEYS: &[&str] = &[
    "core.repositoryformatversion",
    "core.filemode",
    "core.bare",
    "core.logallrefupdates",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.symlinks",
    "core.autocrlf",
    "core.eol",
    "core.safecrlf",
    "core.quotepath",
    "core.sparsecheckout",
    "core.sparsecheckoutcone",
    "core.abbrev",
    "extensions.objectformat",
    "extensions.refstorage",
    "extensions.worktreeconfig",
    "init.defaultbranch",
    "user.name",
    "user.email",
    "remote.*.url",
    "remote.*.pushurl",
    "remote.*.fetch",
    "remote.*.push",
    "remote.*.mirror",
    "remote.*.tagopt",
    "remote.*.prune",
    "remote.*.prunetags",
    // Partial clones (`git clone --filter=…`): which remote promises the
    // missing objects, and the filter. Fetching from a remote is already
    // what `remote.*.url` allows.
    "remote.*.promisor",
    "remote.*.partialclonefilter",
    "extensions.partialclone",
    "branch.*.remote",
    "branch.*.pushremote",
    "branch.*.merge",
    "branch.*.rebase",
    "branch.*.description",
    "submodule.*.url",
    "submodule.*.active",
    "submodule.*.branch",
    "pull.rebase",
    "pull.ff",
    "push.default",
    "fetch.prune",
    "lfs.repositoryformatversion",
];

/// Also kept inside a submodule's git dir (`.git/modules/…/config`), where
/// `git submodule add` writes it: where the submodule's work tree is. It
/// redirects no config, hooks or programs, but it does say where a checkout
/// writes files: the sweep keeps it only when it names a directory inside
/// the root it sweeps (`moat_linux::sweep`).
pub const GIT_CONFIG_ALLOWED_IN_MODULES: &[&str] = &["core.worktree"];

/// One `section[.subsection].key = value` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GitConfigEntry {
    /// Lower-cased section name.
    pub section: String,
    /// Subsection, case kept (None for `[core]`).
    pub subsection: Option<String>,
    /// Lower-cased key name.
    pub key: String,
    /// None for a bare `key` (boolean true).
    pub value: Option<String>,
}

impl GitConfigEntry {
    /// `section.sub.key`, as git prints it.
    pub fn name(&self) -> String {
        match &self.subsection {
            Some(s) => format!("{}.{}.{}", self.section, s, self.key),
            None => format!("{}.{}", self.section, self.key),
        }
    }
}

/// Why a config file cannot be read as git config.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}: {what}")]
pub struct GitConfigError {
    pub line: usize,
    pub what: &'static str,
}

fn err(line: usize, what: &'static str) -> GitConfigError {
    GitConfigError { line, what }
}

/// Parses git config text (sections, `[a "b"]` and `[a.b]` subsections,
/// quoted values, escapes, comments, continuation lines).
pub fn parse(text: &str) -> Result<Vec<GitConfigEntry>, GitConfigError> {
    let mut out = Vec::new();
    let mut section: Option<(String, Option<String>)> = None;
    // git reads a CR before a newline as part of the newline (a backslash
    // before CRLF continues the value).
    let text = text.replace("\r\n", "\n");
    let lines: Vec<&str> = text.split('\n').collect();
    let mut i = 0;
    while i < lines.len() {
        let lineno = i + 1;
        let mut rest: String = lines[i].trim_start().to_string();
        i += 1;
        if rest.starts_with('[') {
            let close = header_end(&rest).ok_or_else(|| err(lineno, "unclosed ["))?;
            let header = &rest[1..close];
            section = Some(parse_header(header).ok_or_else(|| err(lineno, "bad section"))?);
            // git reads a key on the same line after the header.
            rest = rest[close + 1..].trim_start().to_string();
        }
        if rest.is_empty() || rest.starts_with('#') || rest.starts_with(';') || rest == "\r" {
            continue;
        }
        let Some((sec, sub)) = section.clone() else {
            return Err(err(lineno, "key outside any section"));
        };
        let key_end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or(rest.len());
        let key = rest[..key_end].to_ascii_lowercase();
        if key.is_empty() || !key.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Err(err(lineno, "bad key"));
        }
        let after = rest[key_end..].trim_start();
        let value = if after.is_empty()
            || after.starts_with('#')
            || after.starts_with(';')
            || after == "\r"
        {
            None
        } else if let Some(v) = after.strip_prefix('=') {
            // Value, possibly continued onto following lines.
            let mut raw = v.to_string();
            while continues(&raw) {
                // Kept as the escape `\` + newline, which `parse_value`
                // skips (inside quotes too, as git does); at the end of the
                // file (no newline) git reads the same.
                raw.push('\n');
                if let Some(next) = lines.get(i) {
                    raw.push_str(next);
                    i += 1;
                } else {
                    break;
                }
            }
            Some(parse_value(&raw).ok_or_else(|| err(lineno, "bad value"))?)
        } else {
            return Err(err(lineno, "expected ="));
        };
        out.push(GitConfigEntry {
            section: sec,
            subsection: sub,
            key,
            value,
        });
    }
    Ok(out)
}

/// Whether a value's text so far continues on the next line, as git reads
/// it: it ends in a backslash that escapes the newline. A backslash inside
/// a comment (`name = x ; note \`) is the comment's: git ends the value at
/// the newline and reads the next line as a line of its own (a
/// `[credential]` header), so joining it here would read that section's
/// keys as the previous section's.
fn continues(raw: &str) -> bool {
    let mut quoted = false;
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.next().is_none() => return true,
            '"' => quoted = !quoted,
            '#' | ';' if !quoted => return false,
            _ => {}
        }
    }
    false
}

/// Where the header that `line` starts with ends (its `]`): the first one
/// outside the quoted subsection, as git reads it (`[url
/// "https://[fd00::1]/"]`: an IPv6 host's brackets are the subsection's).
fn header_end(line: &str) -> Option<usize> {
    let mut quoted = false;
    let mut chars = line.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if quoted => {
                chars.next()?;
            }
            '"' => quoted = !quoted,
            ']' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

fn parse_header(h: &str) -> Option<(String, Option<String>)> {
    let h = h.trim();
    if let Some(q) = h.find('"') {
        let name = h[..q].trim();
        let rest = &h[q + 1..];
        if !rest.ends_with('"') {
            return None;
        }
        let mut sub = String::new();
        let mut chars = rest[..rest.len() - 1].chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => sub.push(chars.next()?),
                '"' | '\n' => return None,
                c => sub.push(c),
            }
        }
        valid_section(name).then(|| (name.to_ascii_lowercase(), Some(sub)))
    } else if let Some((name, sub)) = h.split_once('.') {
        // Deprecated `[section.sub]`: the subsection is lower-cased.
        (valid_section(name) && valid_section(sub))
            .then(|| (name.to_ascii_lowercase(), Some(sub.to_ascii_lowercase())))
    } else {
        valid_section(h).then(|| (h.to_ascii_lowercase(), None))
    }
}

fn valid_section(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
}

fn parse_value(raw: &str) -> Option<String> {
    let mut out = String::new();
    let mut quoted = false;
    // As git: whitespace outside quotes (space, tab, CR) is dropped before
    // the value and at its end, and kept as it is between words.
    let mut pending_space = String::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                out.push_str(&pending_space);
                pending_space.clear();
                quoted = !quoted;
            }
            '\\' => {
                out.push_str(&pending_space);
                pending_space.clear();
                match chars.next()? {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    // git adds a backspace character (it erases nothing).
                    'b' => out.push('\u{8}'),
                    '\\' => out.push('\\'),
                    '"' => out.push('"'),
                    '\n' => {}
                    _ => return None,
                }
            }
            '#' | ';' if !quoted => break,
            ' ' | '\t' | '\r' | '\n' if !quoted => {
                if !out.is_empty() {
                    pending_space.push(c);
                }
            }
            c => {
                out.push_str(&pending_space);
                pending_space.clear();
                out.push(c);
            }
        }
    }
    (!quoted).then_some(out)
}

/// Whether `entry` may stay in a config the command created.
pub fn is_allowed(entry: &GitConfigEntry, in_modules: bool) -> bool {
    let pattern = match &entry.subsection {
        Some(_) => format!("{}.*.{}", entry.section, entry.key),
        None => format!("{}.{}", entry.section, entry.key),
    };
    let listed = GIT_CONFIG_ALLOWED_KEYS.contains(&pattern.as_str())
        || (in_modules && GIT_CONFIG_ALLOWED_IN_MODULES.contains(&pattern.as_str()));
    listed && inert_value(entry)
}

/// URL values must not select a transport helper (`ext::sh -c …`, `fd::`,
/// any `helper::address`), which runs a program on fetch or push.
fn inert_value(entry: &GitConfigEntry) -> bool {
    let Some(v) = &entry.value else {
        return true;
    };
    if v.contains('\n') {
        return false;
    }
    if entry.key == "url" || entry.key == "pushurl" {
        let scheme_end = v
            .find(|c: char| !(c.is_ascii_alphanumeric() || "+.-".contains(c)))
            .unwrap_or(0);
        return !(v[scheme_end..].starts_with("::") || v.starts_with('-'));
    }
    true
}

/// Writes `entries` as a config file git reads back exactly: every value
/// quoted and escaped, one section header per (section, subsection) run.
pub fn render(entries: &[GitConfigEntry]) -> String {
    let mut out = String::new();
    let mut current: Option<(&str, Option<&str>)> = None;
    for e in entries {
        let here = (e.section.as_str(), e.subsection.as_deref());
        if current != Some(here) {
            match &e.subsection {
                Some(s) => out.push_str(&format!("[{} \"{}\"]\n", e.section, escape(s))),
                None => out.push_str(&format!("[{}]\n", e.section)),
            }
            current = Some(here);
        }
        match &e.value {
            Some(v) => out.push_str(&format!("\t{} = \"{}\"\n", e.key, escape(v))),
            None => out.push_str(&format!("\t{}\n", e.key)),
        }
    }
    out
}

fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            c => o.push(c),
        }
    }
    o
}

/// Splits `text` into the sanitized config (the allowed entries) and the
/// names of the dropped ones; an unparseable file is an error (the caller
/// moves the whole file aside).
pub fn sanitize(text: &str, in_modules: bool) -> Result<(String, Vec<String>), GitConfigError> {
    let entries = parse(text)?;
    let (kept, dropped): (Vec<_>, Vec<_>) =
        entries.into_iter().partition(|e| is_allowed(e, in_modules));
    Ok((render(&kept), dropped.iter().map(|e| e.name()).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_init_config_is_kept_whole() {
        let text = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n";
        let (out, dropped) = sanitize(text, false).unwrap();
        assert!(dropped.is_empty());
        let again = parse(&out).unwrap();
        assert_eq!(again, parse(text).unwrap());
    }

    #[test]
    fn clone_and_submodule_configs_are_kept_whole() {
        let text = "[core]\n\trepositoryformatversion = 1\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n\
                    [remote \"origin\"]\n\turl = https://github.com/x/y.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n\
                    \tpromisor = true\n\tpartialclonefilter = blob:none\n[extensions]\n\tpartialclone = origin\n\
                    [branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n\
                    [submodule \"lib/x\"]\n\turl = ../x.git\n\tactive = true\n";
        let (out, dropped) = sanitize(text, false).unwrap();
        assert!(dropped.is_empty(), "{dropped:?}");
        assert_eq!(parse(&out).unwrap(), parse(text).unwrap());
    }

    #[test]
    fn program_running_keys_are_dropped() {
        let text = "[core]\n\tbare = false\n\tfsmonitor = touch /tmp/x\n\thooksPath = /tmp\n[core] sshCommand = evil\n\
                    [filter \"a\"]\n\tclean = evil\n[diff \"x\"]\n\ttextconv = evil\n[include]\n\tpath = /x\n\
                    [alias]\n\tst = !evil\n[credential]\n\thelper = evil\n[remote \"o\"]\n\turl = ext::sh -c evil\n\tfetch = +refs/heads/*:refs/remotes/o/*\n\
                    [remote \"p\"]\n\turl = https://example.com/r.git\n\tuploadpack = evil\n[CORE]\n\tFSMONITOR = evil\n[core.x]\n\teditor = e\n";
        let (out, dropped) = sanitize(text, false).unwrap();
        for k in [
            "core.fsmonitor",
            "core.hookspath",
            "core.sshcommand",
            "filter.a.clean",
            "diff.x.textconv",
            "include.path",
            "alias.st",
            "credential.helper",
            "remote.o.url",
            "remote.p.uploadpack",
            "core.x.editor",
        ] {
            assert!(dropped.contains(&k.to_string()), "{k} kept: {dropped:?}");
        }
        assert!(!out.to_ascii_lowercase().contains("evil"), "{out}");
        assert!(out.contains("https://example.com/r.git"));
        assert!(out.contains("+refs/heads/*:refs/remotes/o/*"));
    }

    #[test]
    fn a_backslash_in_a_comment_continues_nothing() {
        // git: user.name = "me", then a [credential] section; the
        // backslash belongs to the comment.
        let text = "[user]\n\tname = me ; note \\\n[credential \"https://h\"]\n\tusername = u\n";
        let entries = parse(text).unwrap();
        assert_eq!(entries.len(), 2, "{entries:?}");
        assert_eq!(entries[1].name(), "credential.https://h.username");
        // A backslash before the newline, quoted or not, continues the
        // value and adds nothing (as git).
        let text = "[user]\n\tname = \"a\\\nb\" c\\\n d\n";
        assert_eq!(parse(text).unwrap()[0].value.as_deref(), Some("ab c d"));
    }

    #[test]
    fn a_bracket_in_a_quoted_subsection_is_the_subsections() {
        let text = "[url \"https://[fd00::1]:8443/\"]\n\tinsteadOf = x\n[include] path = y\n";
        let names: Vec<_> = parse(text).unwrap().iter().map(|e| e.name()).collect();
        assert_eq!(
            names,
            ["url.https://[fd00::1]:8443/.insteadof", "include.path"]
        );
    }

    #[test]
    fn a_backslash_before_crlf_or_the_end_of_the_file_continues() {
        let text = "[user]\r\n\tname = a\\\r\n b\r\n\temail = c\\";
        let values: Vec<_> = parse(text).unwrap().into_iter().map(|e| e.value).collect();
        assert_eq!(values, [Some("a b".to_string()), Some("c".to_string())]);
    }

    #[test]
    fn values_read_as_git_reads_them() {
        // Checked against git 2.47 (`git config --list`): a backspace
        // escape is a character, whitespace between words is kept as it is
        // (a tab stays a tab), leading and trailing whitespace goes.
        let text = "[user]\n\tname = ab\\bc\n\temail =\t a\tb \r\n\tx = \\\n\ty\n";
        let values: Vec<_> = parse(text)
            .unwrap()
            .into_iter()
            .map(|e| e.value.unwrap_or_default())
            .collect();
        assert_eq!(values, ["ab\u{8}c", "a\tb", "y"]);
    }

    #[test]
    fn values_round_trip_through_render() {
        let text = "[user]\n\tname = \"A \\\"quoted\\\" name\" ; comment\n\temail = a@b # c\n[branch \"we\\\"ird\"]\n\tremote = origin\n";
        let (out, dropped) = sanitize(text, false).unwrap();
        assert!(dropped.is_empty());
        assert_eq!(parse(&out).unwrap(), parse(text).unwrap());
        assert_eq!(
            parse(text).unwrap()[0].value.as_deref(),
            Some("A \"quoted\" name")
        );
    }

    #[test]
    fn worktree_key_only_in_modules() {
        let text = "[core]\n\tworktree = ../../../sub\n";
        assert_eq!(sanitize(text, false).unwrap().1, vec!["core.worktree"]);
        assert!(sanitize(text, true).unwrap().1.is_empty());
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse("EVIL-PAYLOAD\n").is_err());
        assert!(parse("[core\nx=1").is_err());
        assert!(parse("[core]\n\tx = \"unterminated\n").is_err());
    }
}
