//! The project file `.moat.toml`: finding it, parsing it, and refusing what only the user may grant.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::ConfigError;
use crate::load::check_tool_name;
use crate::settings::{
    access_str, protected_containing, protected_exact, raw_file_struct, Ctx, Kind, PathSpec,
    RawOverrides, Settings,
};

/// The project file's name, at the workspace root.
pub const PROJECT_FILE_NAME: &str = ".moat.toml";

/// A parsed, checked project file.
///
/// As in the user config, top-level scalar keys (`level`, `network`,
/// `net_class`, `timeout`) are defaults that yield to a tool's profile;
/// grant lists and `[tools.NAME]` rank above the profile and the user config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectFile {
    /// The file's canonical path (the trust store's key).
    pub path: PathBuf,
    /// The directory holding it: every path grant must lie inside.
    pub root: PathBuf,
    /// [`project_digest`] of the bytes that were parsed.
    pub digest: String,
    pub defaults: Settings,
    pub tools: BTreeMap<String, Settings>,
}

raw_file_struct!(RawProject {
    tools: BTreeMap<String, RawOverrides>,
});

/// `sha256:` and the lowercase hex SHA-256 of the file's bytes.
pub fn project_digest(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Walks up from `cwd` looking for `.moat.toml`, and stops after the first
/// directory containing `.git` (the repository root). HOME itself and `/`
/// are never a project root (a dotfiles repository in HOME must not make the
/// whole home a project). Outside any repository only `cwd/.moat.toml`
/// counts, so a file in some parent directory (`/tmp/.moat.toml`) is never
/// picked up by accident. `exists` is the caller's file-system probe.
pub fn find_project_file_with(
    cwd: &Path,
    home: Option<&Path>,
    exists: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    let mut first: Option<PathBuf> = None;
    for dir in cwd.ancestors() {
        if dir.parent().is_none() || home.is_some_and(|h| h == dir) {
            break;
        }
        let candidate = dir.join(PROJECT_FILE_NAME);
        if exists(&candidate) {
            if first.is_none() && dir == cwd {
                first = Some(candidate.clone());
            }
            if git_root_at_or_above(dir, home, &exists) {
                return Some(candidate);
            }
            return first;
        }
        if exists(&dir.join(".git")) {
            return first;
        }
    }
    first
}

/// True when `dir` or one of its ancestors (below HOME and `/`) holds `.git`.
fn git_root_at_or_above(dir: &Path, home: Option<&Path>, exists: &impl Fn(&Path) -> bool) -> bool {
    for d in dir.ancestors() {
        if d.parent().is_none() || home.is_some_and(|h| h == d) {
            return false;
        }
        if exists(&d.join(".git")) {
            return true;
        }
    }
    false
}

/// [`find_project_file_with`] against the real file system.
pub fn find_project_file(cwd: &Path, home: Option<&Path>) -> Option<PathBuf> {
    find_project_file_with(cwd, home, |p| p.symlink_metadata().is_ok())
}

/// Parses and checks a project file. `path` must be canonical; `home` is the
/// invoking user's canonical home. `canonicalize` resolves symlinks of a
/// path that exists (`None` when it does not): every path grant must still
/// lie inside the project after it.
pub fn parse_project(
    bytes: &[u8],
    path: &Path,
    home: Option<&Path>,
    canonicalize: impl Fn(&Path) -> Option<PathBuf>,
) -> Result<ProjectFile, ConfigError> {
    let label = path.display().to_string();
    let root = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    let text = std::str::from_utf8(bytes).map_err(|_| ConfigError::Parse {
        file: label.clone(),
        problem: "the file is not UTF-8".to_string(),
        fix: "save it as UTF-8 TOML".to_string(),
    })?;
    let raw: RawProject =
        toml::from_str(text).map_err(|e| ConfigError::from_toml(&label, text, &e))?;
    let (top, tools_raw) = raw.into_parts();
    let kind = Kind::Project { root: &root, home };
    let (defaults, _) = top.into_settings(&Ctx {
        file: &label,
        prefix: String::new(),
        kind,
    })?;
    check_paths(&label, "", &defaults.paths, &root, home, &canonicalize)?;
    let mut tools = BTreeMap::new();
    for (name, over) in tools_raw {
        check_tool_name(&label, &name)?;
        let prefix = format!("tools.{name}.");
        let (s, _) = over.into_settings(&Ctx {
            file: &label,
            prefix: prefix.clone(),
            kind,
        })?;
        check_paths(&label, &prefix, &s.paths, &root, home, &canonicalize)?;
        tools.insert(name, s);
    }
    Ok(ProjectFile {
        path: path.to_path_buf(),
        root,
        digest: project_digest(bytes),
        defaults,
        tools,
    })
}

/// Reads, canonicalizes and parses the project file at `path`.
pub fn load_project(path: &Path, home: Option<&Path>) -> Result<ProjectFile, ConfigError> {
    // A symlinked project file would borrow another project's trust (trust
    // is keyed by the canonical path): a command could plant
    // `sub/.moat.toml -> ../../other/.moat.toml` and get its grants unasked.
    let meta =
        std::fs::symlink_metadata(path).map_err(|e| ConfigError::io("cannot read", path, e))?;
    if meta.file_type().is_symlink() || !meta.is_file() {
        return Err(ConfigError::io(
            "refusing a project file that is not a regular file (a symlink borrows another project's trust)",
            path,
            std::io::Error::from(std::io::ErrorKind::InvalidData),
        ));
    }
    let canonical =
        std::fs::canonicalize(path).map_err(|e| ConfigError::io("cannot resolve", path, e))?;

    let bytes =
        std::fs::read(&canonical).map_err(|e| ConfigError::io("cannot read", &canonical, e))?;
    let home = home.map(|h| std::fs::canonicalize(h).unwrap_or_else(|_| h.to_path_buf()));
    parse_project(&bytes, &canonical, home.as_deref(), |p| {
        std::fs::canonicalize(p).ok()
    })
}

/// Resolves symlinks in the longest existing prefix of `p` and re-appends
/// the rest (which does not exist yet, so holds no symlink).
fn resolve_existing_prefix(p: &Path, canonicalize: &impl Fn(&Path) -> Option<PathBuf>) -> PathBuf {
    let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
    let mut cur = p;
    loop {
        if let Some(c) = canonicalize(cur) {
            let mut out = c;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                cur = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}

fn check_paths(
    label: &str,
    prefix: &str,
    paths: &[PathSpec],
    root: &Path,
    home: Option<&Path>,
    canonicalize: &impl Fn(&Path) -> Option<PathBuf>,
) -> Result<(), ConfigError> {
    let refuse = |spec: &PathSpec, why: String| ConfigError::ProjectRefused {
        file: label.to_string(),
        key: format!("{prefix}{}", access_str(spec.access)),
        value: format!("{:?}", spec.path.display().to_string()),
        why,
    };
    for spec in paths {
        let lexical = &spec.path; // already joined to the root and normalized
        if !lexical.starts_with(root) {
            return Err(refuse(
                spec,
                format!("it lies outside the project {}", root.display()),
            ));
        }
        let resolved = resolve_existing_prefix(lexical, canonicalize);
        if !resolved.starts_with(root) {
            return Err(refuse(
                spec,
                format!(
                    "it resolves through a symlink to {}, outside the project {}",
                    resolved.display(),
                    root.display()
                ),
            ));
        }
        for p in [lexical, &resolved] {
            if let Some(h) = home {
                if let Some(prot) =
                    protected_exact(p, Some(h)).or_else(|| protected_containing(p, Some(h)))
                {
                    return Err(refuse(
                        spec,
                        format!("~/{prot} is a protected path (credentials or agent state)"),
                    ));
                }
                if h.starts_with(p) {
                    return Err(refuse(spec, "it contains your home directory".to_string()));
                }
            }
            let rel = p.strip_prefix(root).unwrap_or(p);
            for c in rel.components() {
                let name = c.as_os_str().to_string_lossy();
                if moat_policy::is_protected_workspace_name(&name) {
                    return Err(refuse(
                        spec,
                        format!("{name} files hold secrets and stay hidden"),
                    ));
                }
            }
            if spec.access == moat_policy::Access::ReadWrite {
                if let Some(first) = rel.components().next() {
                    let name = first.as_os_str().to_string_lossy();
                    if name == ".git" || moat_policy::is_write_protected_name(&name) {
                        return Err(refuse(
                            spec,
                            format!("{name} runs code later and stays read-only"),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use moat_policy::{Access, Level};
    use std::collections::BTreeSet;

    fn parse(text: &str) -> Result<ProjectFile, ConfigError> {
        parse_project(
            text.as_bytes(),
            Path::new("/home/me/proj/.moat.toml"),
            Some(Path::new("/home/me")),
            |_| None,
        )
    }

    #[test]
    fn digest_is_sha256_hex() {
        assert_eq!(
            project_digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn accepts_grants_inside_the_project() {
        let p = parse(
            r#"
rw = ["build-cache", "./out/../dist"]
ro = ["/home/me/proj/docs"]
allow_domains = ["api.example.com:443", "@package-registries"]
deny_domains = ["tracker.example.com"]
env = { RUST_LOG = "debug" }
pass_env = ["CI"]
level = "rw"
[tools.cargo]
allow_domains = ["github.com:443"]
"#,
        )
        .unwrap();
        assert_eq!(p.root, Path::new("/home/me/proj"));
        let paths: BTreeSet<_> = p
            .defaults
            .paths
            .iter()
            .map(|s| (s.path.clone(), s.access))
            .collect();
        assert!(paths.contains(&(
            PathBuf::from("/home/me/proj/build-cache"),
            Access::ReadWrite
        )));
        assert!(paths.contains(&(PathBuf::from("/home/me/proj/dist"), Access::ReadWrite)));
        assert!(paths.contains(&(PathBuf::from("/home/me/proj/docs"), Access::ReadOnly)));
        assert_eq!(p.defaults.level, Some(Level::WorkspaceWrite));
        assert_eq!(p.tools["cargo"].allow_domains, ["github.com:443"]);
        assert!(p.digest.starts_with("sha256:"));
    }

    #[test]
    fn refuses_what_only_the_user_may_grant() {
        let cases = [
            ("ro = [\"~/.ssh\"]", "ro", "outside the project"),
            ("ro = [\"/etc\"]", "ro", "outside the project"),
            ("rw = [\"../other\"]", "rw", "outside the project"),
            ("rw = [\"sub/../../other\"]", "rw", "outside the project"),
            (
                "level = \"danger-full-access\"",
                "level",
                "turns the sandbox off",
            ),
            ("level = \"danger\"", "level", "turns the sandbox off"),
            ("network = \"unmanaged\"", "network", "host network"),
            ("net_class = \"unconfined\"", "net_class", "socket filter"),
            ("pass_env = [\"GITHUB_TOKEN\"]", "pass_env", "secret"),
            ("pass_env = [\"AWS_PROFILE\"]", "pass_env", "secret"),
            (
                "protected_opt_in = [\"~/.ssh\"]",
                "protected_opt_in",
                "protected",
            ),
            ("ro = [\".env\"]", "ro", "secrets"),
            ("ro = [\"config/.env.local\"]", "ro", "secrets"),
            ("rw = [\".git/hooks\"]", "rw", "read-only"),
            ("rw = [\".moat.toml\"]", "rw", "read-only"),
            (
                "[tools.git]\nrw = [\"/home/me/.ssh\"]",
                "tools.git.rw",
                "outside the project",
            ),
            (
                "[tools.git]\nnetwork = \"unmanaged\"",
                "tools.git.network",
                "host network",
            ),
        ];
        for (text, key, why) in cases {
            let e = parse(text).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(e, ConfigError::ProjectRefused { .. }),
                "{text}: {msg}"
            );
            assert!(msg.contains("/home/me/proj/.moat.toml"), "{text}: {msg}");
            assert!(msg.contains(key), "{text}: {msg}");
            assert!(msg.contains(why), "{text}: {msg}");
            assert!(msg.contains("your own config"), "{text}: {msg}");
        }
        // a mount with ro/rw spelled as [[mounts]] gets the same treatment
        let e = parse("[[mounts]]\npath = \"/etc\"\nmode = \"ro\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside the project"), "{e}");
    }

    #[test]
    fn project_inside_home_cannot_reach_protected_paths_through_the_project() {
        // A project rooted at an ancestor of HOME could name HOME's secrets as "inside".
        let p = parse_project(
            b"ro = [\"me/.ssh\"]",
            Path::new("/home/.moat.toml"),
            Some(Path::new("/home/me")),
            |_| None,
        )
        .unwrap_err()
        .to_string();
        assert!(p.contains("protected"), "{p}");
        let p = parse_project(
            b"rw = [\"me\"]",
            Path::new("/home/.moat.toml"),
            Some(Path::new("/home/me")),
            |_| None,
        )
        .unwrap_err()
        .to_string();
        assert!(p.contains("home directory"), "{p}");
    }

    #[test]
    fn symlinks_leading_out_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap().join("proj");
        let other = root.parent().unwrap().join("other");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::os::unix::fs::symlink(&other, root.join("link")).unwrap();
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::fs::write(root.join(PROJECT_FILE_NAME), "rw = [\"link/sub\"]\n").unwrap();
        let e = load_project(&root.join(PROJECT_FILE_NAME), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("symlink"), "{e}");
        std::fs::write(
            root.join(PROJECT_FILE_NAME),
            "rw = [\"real\", \"not-yet/created\"]\n",
        )
        .unwrap();
        let p = load_project(&root.join(PROJECT_FILE_NAME), None).unwrap();
        assert_eq!(p.defaults.paths.len(), 2);
        assert_eq!(p.path, root.join(PROJECT_FILE_NAME));
    }

    #[test]
    fn unknown_keys_name_the_file_and_key() {
        let e = parse("rw = []\nallow = [\"x\"]\n").unwrap_err().to_string();
        assert!(
            e.contains("/home/me/proj/.moat.toml") && e.contains("`allow`") && e.contains("line 2"),
            "{e}"
        );
    }

    #[test]
    fn finding_the_project_file() {
        let files =
            |set: &'static [&'static str]| move |p: &Path| set.contains(&p.to_str().unwrap());
        let home = Some(Path::new("/home/me"));
        // at the repository root, found from a subdirectory
        let f = files(&["/home/me/proj/.git", "/home/me/proj/.moat.toml"]);
        assert_eq!(
            find_project_file_with(Path::new("/home/me/proj/src/a"), home, f),
            Some(PathBuf::from("/home/me/proj/.moat.toml"))
        );
        // not above the repository root
        let f = files(&[
            "/home/me/proj/.git",
            "/home/me/.moat.toml",
            "/home/.moat.toml",
        ]);
        assert_eq!(
            find_project_file_with(Path::new("/home/me/proj/src"), home, f),
            None
        );
        // a nested one below the root wins (nearest first)
        let f = files(&[
            "/home/me/proj/.git",
            "/home/me/proj/.moat.toml",
            "/home/me/proj/sub/.moat.toml",
        ]);
        assert_eq!(
            find_project_file_with(Path::new("/home/me/proj/sub/x"), home, f),
            Some(PathBuf::from("/home/me/proj/sub/.moat.toml"))
        );
        // HOME is never a project root, even with a dotfiles repo
        let f = files(&["/home/me/.git", "/home/me/.moat.toml"]);
        assert_eq!(
            find_project_file_with(Path::new("/home/me/x"), home, f),
            None
        );
        assert_eq!(find_project_file_with(Path::new("/home/me"), home, f), None);
        // outside any repository: only the cwd's own file
        let f = files(&["/tmp/.moat.toml"]);
        assert_eq!(find_project_file_with(Path::new("/tmp/x"), home, f), None);
        assert_eq!(
            find_project_file_with(Path::new("/tmp"), home, f),
            Some(PathBuf::from("/tmp/.moat.toml"))
        );
    }
}
