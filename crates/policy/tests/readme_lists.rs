//! The README's exact protected lists equal the code's: one source of truth
//! (crates/policy/src/protected.rs), and a README that says what it does.
//! Each list in the README follows a `<!-- moat:list NAME -->` marker as
//! backticked entries up to the next blank line.

use std::collections::BTreeSet;
use std::path::Path;

use moat_policy::{
    gitconfig::GIT_CONFIG_ALLOWED_KEYS, PROTECTED_HOME_PATHS, WRITE_PROTECTED_GIT_PATHS,
    WRITE_PROTECTED_GIT_WORKTREE_PATHS, WRITE_PROTECTED_HOME_PATHS, WRITE_PROTECTED_VCS_PATHS,
    WRITE_PROTECTED_WORKSPACE_NAMES,
};

fn readme() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// The backticked entries after the marker, with `prefix` stripped.
fn readme_list(text: &str, name: &str, prefix: &str) -> BTreeSet<String> {
    let marker = format!("<!-- moat:list {name} -->");
    let start = text
        .find(&marker)
        .unwrap_or_else(|| panic!("README has no {marker}"))
        + marker.len();
    let body: String = text[start..]
        .trim_start_matches('\n')
        .split("\n\n")
        .next()
        .unwrap_or("")
        .to_string();
    body.split('`')
        .skip(1)
        .step_by(2)
        .map(|e| {
            e.strip_prefix(prefix)
                .unwrap_or_else(|| panic!("{name}: README entry {e:?} lacks {prefix:?}"))
                .to_string()
        })
        .collect()
}

fn code(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn readme_protected_lists_equal_the_code() {
    let text = readme();
    for (name, prefix, list) in [
        ("protected-home", "~/", PROTECTED_HOME_PATHS),
        (
            "write-protected-workspace",
            "",
            WRITE_PROTECTED_WORKSPACE_NAMES,
        ),
        ("write-protected-home", "~/", WRITE_PROTECTED_HOME_PATHS),
        ("write-protected-git", ".git/", WRITE_PROTECTED_GIT_PATHS),
        ("write-protected-vcs", "", WRITE_PROTECTED_VCS_PATHS),
        (
            "write-protected-git-worktree",
            ".git/worktrees/*/",
            WRITE_PROTECTED_GIT_WORKTREE_PATHS,
        ),
        ("git-config-allowed", "", GIT_CONFIG_ALLOWED_KEYS),
    ] {
        let readme = readme_list(&text, name, prefix);
        let code = code(list);
        assert_eq!(
            readme,
            code,
            "README list {name} differs from the code\nonly in README: {:?}\nonly in code: {:?}",
            readme.difference(&code).collect::<Vec<_>>(),
            code.difference(&readme).collect::<Vec<_>>()
        );
    }
}
