//! The trust store (`<state_dir>/trust.json`): which project files, at which sha256, the user said yes to; and the prompt text.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::project::ProjectFile;
use crate::settings::{access_str, Settings};

/// The trust store's file name inside the state directory.
pub const TRUST_FILE_NAME: &str = "trust.json";

/// One trusted project file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustEntry {
    /// [`crate::project_digest`] of the file the user reviewed.
    pub sha256: String,
    /// When, as RFC 3339 UTC (`2025-01-31T12:00:00Z`).
    pub trusted_at: String,
}

/// The trust store's content: canonical project-file path → entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustMap {
    pub version: u32,
    pub projects: BTreeMap<PathBuf, TrustEntry>,
}

impl Default for TrustMap {
    fn default() -> Self {
        TrustMap {
            version: 1,
            projects: BTreeMap::new(),
        }
    }
}

/// True when `path` is trusted at exactly `digest`: a changed file is untrusted.
pub fn is_trusted(store: &TrustMap, path: &Path, digest: &str) -> bool {
    store.projects.get(path).is_some_and(|e| e.sha256 == digest)
}

impl TrustMap {
    /// Records `path` as trusted at `digest` (replacing an older digest).
    pub fn trust(&mut self, path: &Path, digest: &str, now_unix: u64) {
        self.projects.insert(
            path.to_path_buf(),
            TrustEntry {
                sha256: digest.to_string(),
                trusted_at: rfc3339_utc(now_unix),
            },
        );
    }

    /// Forgets `path`; true when it was there.
    pub fn untrust(&mut self, path: &Path) -> bool {
        self.projects.remove(path).is_some()
    }

    /// Every trusted file, sorted by path.
    pub fn list(&self) -> Vec<(PathBuf, TrustEntry)> {
        self.projects
            .iter()
            .map(|(p, e)| (p.clone(), e.clone()))
            .collect()
    }

    /// Parses the store's JSON; `path` names it in errors.
    pub fn from_json(bytes: &[u8], path: &Path) -> Result<TrustMap, ConfigError> {
        let map: TrustMap =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::TrustStoreCorrupt {
                path: path.to_path_buf(),
                why: e.to_string(),
            })?;
        if map.version != 1 {
            return Err(ConfigError::TrustStoreCorrupt {
                path: path.to_path_buf(),
                why: format!("version {} is not one this moat knows", map.version),
            });
        }
        Ok(map)
    }

    /// The store's JSON form (pretty, newline-terminated).
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".to_string());
        s.push('\n');
        s
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch.
pub fn rfc3339_utc(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let rem = unix % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian), by 400-year eras.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The trust store on disk. Every change happens under an exclusive `flock`
/// of the sibling `trust.json.lock`, and replaces `trust.json` atomically
/// (write a temporary file, fsync, rename, fsync the directory), so a reader
/// sees the old or the new store, never half of one. The file is 0600 and
/// the directory 0700.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustStore {
    dir: PathBuf,
}

impl TrustStore {
    /// The store in `state_dir` (`$XDG_STATE_HOME/moat` or `~/.local/state/moat`).
    pub fn new(state_dir: &Path) -> TrustStore {
        TrustStore {
            dir: state_dir.to_path_buf(),
        }
    }

    /// The store in [`crate::state_dir_from_env`].
    pub fn from_env() -> Option<TrustStore> {
        crate::load::state_dir_from_env().map(|d| TrustStore::new(&d))
    }

    /// `<state_dir>/trust.json`.
    pub fn path(&self) -> PathBuf {
        self.dir.join(TRUST_FILE_NAME)
    }

    fn lock_path(&self) -> PathBuf {
        self.dir.join(format!("{TRUST_FILE_NAME}.lock"))
    }

    /// Reads the store; a missing file is an empty store.
    pub fn load(&self) -> Result<TrustMap, ConfigError> {
        let path = self.path();
        match std::fs::read(&path) {
            Ok(bytes) => TrustMap::from_json(&bytes, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TrustMap::default()),
            Err(e) => Err(ConfigError::io("cannot read", path, e)),
        }
    }

    /// Whether the project file at `path` (canonical) is trusted at `digest`.
    pub fn is_trusted(&self, path: &Path, digest: &str) -> Result<bool, ConfigError> {
        Ok(is_trusted(&self.load()?, path, digest))
    }

    /// Trusts the project file at `path` (canonical) at `digest`, now.
    pub fn trust(&self, path: &Path, digest: &str) -> Result<(), ConfigError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.update(|m| m.trust(path, digest, now))
    }

    /// Forgets the project file at `path`; true when it was trusted.
    pub fn untrust(&self, path: &Path) -> Result<bool, ConfigError> {
        self.update(|m| m.untrust(path))
    }

    /// Every trusted project file.
    pub fn list(&self) -> Result<Vec<(PathBuf, TrustEntry)>, ConfigError> {
        Ok(self.load()?.list())
    }

    /// Lock, read, change, write atomically, unlock.
    fn update<R>(&self, change: impl FnOnce(&mut TrustMap) -> R) -> Result<R, ConfigError> {
        self.ensure_dir()?;
        let lock_path = self.lock_path();
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| ConfigError::io("cannot open", &lock_path, e))?;
        lock.lock()
            .map_err(|e| ConfigError::io("cannot lock", &lock_path, e))?;
        let mut map = self.load()?;
        let out = change(&mut map);
        self.write_atomic(&map.to_json())?;
        drop(lock); // closing the descriptor releases the flock
        Ok(out)
    }

    fn ensure_dir(&self) -> Result<(), ConfigError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| ConfigError::io("cannot create", &self.dir, e))?;
        let meta = std::fs::metadata(&self.dir)
            .map_err(|e| ConfigError::io("cannot inspect", &self.dir, e))?;
        if meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| ConfigError::io("cannot chmod 0700", &self.dir, e))?;
        }
        Ok(())
    }

    fn write_atomic(&self, text: &str) -> Result<(), ConfigError> {
        let path = self.path();
        let tmp = self
            .dir
            .join(format!(".{TRUST_FILE_NAME}.tmp-{}", std::process::id()));
        let result = (|| -> std::io::Result<()> {
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)?;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            File::open(&self.dir)?.sync_all()
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(ConfigError::io("cannot write", path, e));
        }
        Ok(())
    }
}

/// Escapes control characters (escape sequences, newlines) so a project
/// file cannot redraw or hide lines of the prompt.
fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn domain_line(d: &str) -> String {
    match d.strip_prefix('@') {
        Some(name) => match moat_policy::net::PRESETS.iter().find(|(n, _)| *n == name) {
            Some((_, hosts)) => format!("{} ({})", clean(d), hosts.join(", ")),
            None => clean(d),
        },
        None => clean(d),
    }
}

fn settings_lines(prefix: &str, s: &Settings, out: &mut Vec<(String, String)>) {
    let key = |k: &str| format!("{prefix}{k}");
    for p in &s.paths {
        out.push((
            key(access_str(p.access)),
            clean(&p.path.display().to_string()),
        ));
    }
    // Top-level scalars are defaults that yield to a tool's profile; say so.
    let dflt = if prefix.is_empty() {
        "  (default where the tool's profile says nothing)"
    } else {
        ""
    };
    if let Some(l) = s.level {
        out.push((key("level"), format!("{l}{dflt}")));
    }
    if let Some(n) = s.network {
        out.push((key("network"), format!("{n}{dflt}")));
    }
    for d in &s.allow_domains {
        out.push((key("allow_domains"), domain_line(d)));
    }
    for d in &s.deny_domains {
        out.push((key("deny_domains"), domain_line(d)));
    }
    for (k, v) in &s.env {
        out.push((key("env"), format!("{}={}", clean(k), clean(v))));
    }
    for k in &s.pass_env {
        out.push((key("pass_env"), clean(k)));
    }
    if let Some(c) = s.net_class {
        out.push((key("net_class"), format!("{}{dflt}", c.as_str())));
    }
    if let Some(t) = s.timeout_ms {
        out.push((key("timeout"), format!("{t}ms{dflt}")));
    }
    for (name, v) in s.limits.by_name() {
        if let Some(v) = v {
            out.push((key(&format!("limits.{name}")), format!("{v}{dflt}")));
        }
    }
}

/// The text the trust prompt shows: a header naming the file and its
/// sha256 (like an SSH host key), every grant one per line, and the question.
pub fn render_grants(project: &ProjectFile) -> String {
    let mut lines = Vec::new();
    settings_lines("", &project.defaults, &mut lines);
    for (tool, s) in &project.tools {
        settings_lines(&format!("tools.{}.", clean(tool)), s, &mut lines);
    }
    let width = lines
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    out.push_str(&format!(
        "The project file {} is new, or has changed since you last trusted it.\n",
        clean(&project.path.display().to_string())
    ));
    out.push_str(&format!("Its fingerprint is {}.\n", project.digest));
    if lines.is_empty() {
        out.push_str("It grants nothing beyond your own configuration.\n");
    } else {
        out.push_str(&format!(
            "Runs in {} will get these grants:\n",
            clean(&project.root.display().to_string())
        ));
        for (k, v) in &lines {
            out.push_str(&format!("  {k:<width$}  {v}\n"));
        }
    }
    out.push_str("Trust this project file? [y/N] ");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::parse_project;

    #[test]
    fn rfc3339() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_735_689_599), "2024-12-31T23:59:59Z");
    }

    #[test]
    fn pure_map_round_trip() {
        let mut m = TrustMap::default();
        let p = Path::new("/p/.moat.toml");
        assert!(!is_trusted(&m, p, "sha256:a"));
        m.trust(p, "sha256:a", 0);
        assert!(is_trusted(&m, p, "sha256:a"));
        assert!(
            !is_trusted(&m, p, "sha256:b"),
            "a changed file is untrusted"
        );
        let back = TrustMap::from_json(m.to_json().as_bytes(), Path::new("t")).unwrap();
        assert_eq!(back, m);
        assert!(m.untrust(p));
        assert!(!m.untrust(p));
    }

    fn assert_store_file_ok(store: &TrustStore) -> TrustMap {
        let path = store.path();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let dir = std::fs::metadata(path.parent().unwrap()).unwrap();
        assert_eq!(dir.permissions().mode() & 0o777, 0o700);
        // no temporary file left behind
        for e in std::fs::read_dir(path.parent().unwrap()).unwrap() {
            let name = e.unwrap().file_name();
            assert!(!name.to_string_lossy().contains(".tmp-"), "{name:?}");
        }
        TrustMap::from_json(&std::fs::read(&path).unwrap(), &path).unwrap()
    }

    #[test]
    fn store_round_trip_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = TrustStore::new(&dir.path().join("state/moat"));
        let p = Path::new("/work/proj/.moat.toml");
        let q = Path::new("/work/other/.moat.toml");
        assert!(!store.is_trusted(p, "sha256:1").unwrap());
        assert!(store.list().unwrap().is_empty());

        store.trust(p, "sha256:1").unwrap();
        let m = assert_store_file_ok(&store);
        assert!(is_trusted(&m, p, "sha256:1"));
        assert!(store.is_trusted(p, "sha256:1").unwrap());
        assert!(
            !store.is_trusted(p, "sha256:2").unwrap(),
            "changed file → untrusted"
        );

        store.trust(q, "sha256:9").unwrap();
        assert_store_file_ok(&store);
        let list = store.list().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].0, q.parent().unwrap().join(".moat.toml"));
        assert!(list[0].1.trusted_at.ends_with('Z'));

        store.trust(p, "sha256:2").unwrap();
        assert!(store.is_trusted(p, "sha256:2").unwrap());
        assert!(!store.is_trusted(p, "sha256:1").unwrap());
        assert_store_file_ok(&store);

        assert!(store.untrust(p).unwrap());
        assert!(!store.untrust(p).unwrap());
        let m = assert_store_file_ok(&store);
        assert_eq!(m.projects.len(), 1);
        assert!(store.lock_path().exists());
    }

    #[test]
    fn store_tightens_a_loose_directory_and_refuses_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("moat");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        let store = TrustStore::new(&state);
        store.trust(Path::new("/p/.moat.toml"), "sha256:1").unwrap();
        assert_store_file_ok(&store);
        std::fs::write(store.path(), "not json").unwrap();
        let e = store
            .is_trusted(Path::new("/p/.moat.toml"), "sha256:1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("move it aside"), "{e}");
    }

    #[test]
    fn concurrent_updates_are_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let store = TrustStore::new(dir.path());
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let s = store.clone();
                std::thread::spawn(move || {
                    s.trust(&PathBuf::from(format!("/p{i}/.moat.toml")), "sha256:x")
                        .unwrap()
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(store.list().unwrap().len(), 8);
    }

    #[test]
    fn render_grants_lists_every_grant() {
        let text = br#"
rw = ["cache"]
ro = ["docs"]
level = "rw"
network = "proxy"
net_class = "net-connect"
timeout = "10m"
allow_domains = ["api.example.com:443", "@package-registries"]
deny_domains = ["tracker.example.com"]
env = { RUST_LOG = "debug", EVIL = "\u001b[2K" }
pass_env = ["CI"]
[tools.cargo]
allow_domains = ["github.com:443"]
env = { CARGO_TERM_COLOR = "always" }
"#;
        let p = parse_project(text, Path::new("/w/proj/.moat.toml"), None, |_| None).unwrap();
        let r = render_grants(&p);
        assert!(r.contains("/w/proj/.moat.toml"), "{r}");
        assert!(r.contains(&p.digest), "{r}");
        for needle in [
            "rw ",
            "/w/proj/cache",
            "ro ",
            "/w/proj/docs",
            "level",
            "workspace-write",
            "network",
            "proxy",
            "net_class",
            "net-connect",
            "timeout",
            "600000ms",
            "allow_domains",
            "api.example.com:443",
            "@package-registries (crates.io:443",
            "deny_domains",
            "tracker.example.com",
            "RUST_LOG=debug",
            "pass_env",
            "CI",
            "tools.cargo.allow_domains",
            "github.com:443",
            "tools.cargo.env",
            "CARGO_TERM_COLOR=always",
        ] {
            assert!(r.contains(needle), "missing {needle:?} in\n{r}");
        }
        assert!(
            !r.contains('\u{1b}'),
            "escape sequences must be neutralized:\n{r}"
        );
        assert!(r.contains("EVIL=\\u{1b}[2K"), "{r}");
        assert!(r.ends_with("Trust this project file? [y/N] "));
        // one grant per line
        let grant_lines = r.lines().filter(|l| l.starts_with("  ")).count();
        assert_eq!(grant_lines, 2 + 4 + 3 + 2 + 1 + 2, "{r}");

        let empty = parse_project(b"", Path::new("/w/p/.moat.toml"), None, |_| None).unwrap();
        assert!(render_grants(&empty).contains("grants nothing"));
    }
}
