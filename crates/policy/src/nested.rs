//! Nested runs: a `moat exec` started inside a sandbox may only narrow. This
//! decides, without I/O, whether an inner policy fits inside the outer one
//! and names the first grant that would widen it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::net::DomainPattern;
use crate::{Access, Level, NetworkMode, PathGrant, Policy, PROTECTED_HOME_PATHS};

/// What a nested run is checked against: the outer run's reach, as data
/// that can travel to the process that launches the nested run (which
/// checks again after its own resolution, closing any race with the first
/// check).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounds {
    pub level: Level,
    #[serde(with = "crate::pathser")]
    pub workspace: PathBuf,
    #[serde(with = "crate::pathser")]
    pub home: PathBuf,
    pub paths: Vec<PathGrant>,
    #[serde(with = "crate::pathser::vec")]
    pub protected_opt_in: Vec<PathBuf>,
    pub network: NetworkMode,
    pub allow: Vec<String>,
}

/// Directories a sandboxed view builds itself (private tmpfs, moat's own
/// /proc, /dev, /run…): the host's content there is not part of the outer
/// view, unless the workspace or a grant puts it back.
const SANDBOX_BUILT: &[&str] = &["/tmp", "/run", "/var/run", "/proc", "/dev", "/sys", "/moat"];

/// Host directories a workspace-contained view shows besides its grants.
const CONTAINED_RUNTIME: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// Why a nested request was refused: the grant, and what the outer run allows.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("nested run refused: {grant} would widen the outer sandbox ({why})")]
pub struct Widening {
    pub grant: String,
    pub why: String,
}

fn widening(grant: impl Into<String>, why: impl Into<String>) -> Widening {
    Widening {
        grant: grant.into(),
        why: why.into(),
    }
}

fn network_rank(m: NetworkMode) -> u8 {
    match m {
        NetworkMode::Disabled => 0,
        NetworkMode::Proxy => 1,
        NetworkMode::Unmanaged => 2,
    }
}

impl Bounds {
    /// Whether `path` shows host content in the outer view at all.
    fn shows_host(&self, path: &Path) -> bool {
        if !self.level.is_sandboxed() {
            return true;
        }
        let granted = path.starts_with(&self.workspace)
            || self.paths.iter().any(|g| path.starts_with(&g.path));
        granted || !SANDBOX_BUILT.iter().any(|d| path.starts_with(d))
    }

    /// Whether `path` can be read inside the outer view.
    pub fn can_read(&self, path: &Path) -> bool {
        if self.hides(path) || !self.shows_host(path) {
            return false;
        }
        match self.level {
            Level::DangerFullAccess | Level::ReadOnly | Level::WorkspaceWrite => true,
            Level::WorkspaceContained => {
                path.starts_with(&self.workspace)
                    || self.paths.iter().any(|g| path.starts_with(&g.path))
                    || CONTAINED_RUNTIME.iter().any(|r| path.starts_with(r))
            }
        }
    }

    /// Whether `path` can be written inside the outer view.
    pub fn can_write(&self, path: &Path) -> bool {
        if self.level == Level::DangerFullAccess {
            return true;
        }
        if self.hides(path) || !self.shows_host(path) {
            return false;
        }
        (self.level.workspace_writable() && path.starts_with(&self.workspace))
            || self
                .paths
                .iter()
                .any(|g| g.access == Access::ReadWrite && path.starts_with(&g.path))
    }

    /// Protected paths (not opted in) that the outer view shows as stand-ins.
    fn hides(&self, path: &Path) -> bool {
        self.level.is_sandboxed()
            && PROTECTED_HOME_PATHS
                .iter()
                .map(|rel| self.home.join(rel))
                .any(|p| path.starts_with(&p) && !self.protected_opt_in.contains(&p))
    }
}

impl Policy {
    /// This policy's reach, for checking nested runs against it.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            level: self.level,
            workspace: self.workspace.clone(),
            home: self.home.clone(),
            paths: self.paths.clone(),
            protected_opt_in: self.protected_opt_in.clone(),
            network: self.network.mode,
            allow: self
                .network
                .rules
                .allow
                .iter()
                .map(|p| p.as_str().to_string())
                .collect(),
        }
    }

    /// Checks that `self` (an inner run) fits inside `outer`.
    pub fn within(&self, outer: &Bounds) -> Result<(), Widening> {
        if outer.level == Level::DangerFullAccess {
            return Ok(());
        }
        if self.level == Level::DangerFullAccess {
            return Err(widening(
                "--policy danger-full-access",
                format!("the outer run is {}", outer.level),
            ));
        }
        let whole_host = |l: Level| matches!(l, Level::ReadOnly | Level::WorkspaceWrite);
        if whole_host(self.level) && !whole_host(outer.level) {
            return Err(widening(
                format!("--policy {}", self.level),
                format!(
                    "it reads the whole host and the outer run is {}",
                    outer.level
                ),
            ));
        }
        let mut reads: Vec<(String, PathBuf)> =
            vec![("the workspace".into(), self.workspace.clone())];
        let mut writes: Vec<(String, PathBuf)> = Vec::new();
        if self.level.workspace_writable() {
            writes.push((
                format!(
                    "the workspace {} at --policy {}",
                    self.workspace.display(),
                    self.level
                ),
                self.workspace.clone(),
            ));
        }
        for g in &self.paths {
            let flag = if g.access == Access::ReadWrite {
                "--rw"
            } else {
                "--ro"
            };
            reads.push((format!("{flag} {}", g.path.display()), g.path.clone()));
            if g.access == Access::ReadWrite {
                writes.push((format!("--rw {}", g.path.display()), g.path.clone()));
            }
        }
        for (grant, p) in &reads {
            if !outer.can_read(p) {
                return Err(widening(
                    grant.clone(),
                    format!("the outer run cannot read {}", p.display()),
                ));
            }
        }
        for (grant, p) in &writes {
            if !outer.can_write(p) {
                return Err(widening(
                    grant.clone(),
                    format!("the outer run cannot write {}", p.display()),
                ));
            }
        }
        for o in &self.protected_opt_in {
            if !outer.protected_opt_in.contains(o) {
                return Err(widening(
                    format!("opting in {}", o.display()),
                    "the outer run keeps it protected",
                ));
            }
        }
        let (im, om) = (self.network.mode, outer.network);
        if network_rank(im) > network_rank(om) {
            return Err(widening(
                format!("--network {im}"),
                format!("the outer run has --network {om}"),
            ));
        }
        if im == NetworkMode::Proxy && om == NetworkMode::Proxy {
            let outer_allow: Vec<DomainPattern> = outer
                .allow
                .iter()
                .filter_map(|a| DomainPattern::parse(a).ok())
                .collect();
            for p in &self.network.rules.allow {
                if !outer_allow.iter().any(|o| covers(o, p)) {
                    return Err(widening(
                        format!("--allow-domain {}", p.as_str()),
                        "the outer allow list does not include it",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether outer pattern `o` admits everything inner pattern `i` admits.
fn covers(o: &DomainPattern, i: &DomainPattern) -> bool {
    if o == i {
        return true;
    }
    let (ohost, oport) = split(o.as_str());
    let (ihost, iport) = split(i.as_str());
    let port_ok = oport.is_none() || oport == iport;
    if !port_ok {
        return false;
    }
    if let Some(suffix) = ohost.strip_prefix("*.") {
        // *.d covers x.d and *.x.d
        let ih = ihost.strip_prefix("*.").unwrap_or(ihost);
        return ih.ends_with(&format!(".{suffix}"));
    }
    ohost == ihost
}

fn split(p: &str) -> (&str, Option<&str>) {
    if let Some(rest) = p.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((h, tail)) => (h, tail.strip_prefix(':')),
            None => (p, None),
        };
    }
    match p.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => (h, Some(port)),
        _ => (p, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Policy, PolicyRequest};

    fn pol(level: Level, f: impl FnOnce(&mut PolicyRequest)) -> Policy {
        let mut r = PolicyRequest {
            level: Some(level),
            workspace: "/home/u/proj".into(),
            home: "/home/u".into(),
            ..Default::default()
        };
        f(&mut r);
        Policy::resolve(r).unwrap()
    }

    #[test]
    fn same_or_narrower_fits() {
        let outer = pol(Level::WorkspaceWrite, |_| {});
        assert!(pol(Level::WorkspaceWrite, |_| {})
            .within(&outer.bounds())
            .is_ok());
        assert!(pol(Level::ReadOnly, |_| {}).within(&outer.bounds()).is_ok());
        assert!(pol(Level::WorkspaceContained, |_| {})
            .within(&outer.bounds())
            .is_ok());
        assert!(pol(Level::WorkspaceContained, |r| r.workspace =
            "/home/u/proj/sub".into())
        .within(&outer.bounds())
        .is_ok());
    }

    #[test]
    fn widenings_are_named() {
        let outer = pol(Level::ReadOnly, |_| {});
        let e = pol(Level::WorkspaceWrite, |_| {})
            .within(&outer.bounds())
            .unwrap_err();
        assert!(e.grant.contains("workspace"), "{e}");
        let outer = pol(Level::WorkspaceContained, |_| {});
        assert!(pol(Level::ReadOnly, |_| {})
            .within(&outer.bounds())
            .unwrap_err()
            .grant
            .contains("read-only"));
        let e = pol(Level::WorkspaceContained, |r| r.ro = vec!["/opt".into()])
            .within(&outer.bounds())
            .unwrap_err();
        assert_eq!(e.grant, "--ro /opt");
        let outer = pol(Level::WorkspaceWrite, |_| {});
        let e = pol(Level::WorkspaceWrite, |r| r.rw = vec!["/etc".into()])
            .within(&outer.bounds())
            .unwrap_err();
        assert_eq!(e.grant, "--rw /etc");
        assert!(pol(Level::DangerFullAccess, |_| {})
            .within(&outer.bounds())
            .is_err());
        let e = pol(Level::WorkspaceWrite, |r| {
            r.ro = vec!["/home/u/.ssh".into()]
        })
        .within(&outer.bounds())
        .unwrap_err();
        assert!(e.grant.contains(".ssh"), "{e}");
    }

    #[test]
    fn directories_the_sandbox_builds_are_not_host_content() {
        let outer = pol(Level::ReadOnly, |_| {});
        for p in [
            "/tmp",
            "/run",
            "/run/postgresql",
            "/var/run",
            "/proc",
            "/dev",
            "/sys/fs",
            "/moat",
        ] {
            let e = pol(Level::ReadOnly, |r| r.ro = vec![p.into()])
                .within(&outer.bounds())
                .unwrap_err();
            assert_eq!(e.grant, format!("--ro {p}"));
        }
        // …unless the outer workspace is there.
        let outer = pol(Level::WorkspaceWrite, |r| r.workspace = "/tmp/proj".into());
        assert!(
            pol(Level::WorkspaceWrite, |r| r.workspace = "/tmp/proj".into())
                .within(&outer.bounds())
                .is_ok()
        );
    }

    #[test]
    fn network_only_narrows() {
        let outer = pol(Level::WorkspaceWrite, |r| {
            r.network = Some(NetworkMode::Proxy);
            r.allow_domains = vec!["*.example.com".into(), "pypi.org:443".into()];
        });
        let ok = pol(Level::WorkspaceWrite, |r| {
            r.network = Some(NetworkMode::Proxy);
            r.allow_domains = vec!["api.example.com:443".into(), "pypi.org:443".into()];
        });
        assert!(ok.within(&outer.bounds()).is_ok());
        assert!(
            pol(Level::WorkspaceWrite, |_| {})
                .within(&outer.bounds())
                .is_ok(),
            "disabled is narrower"
        );
        let e = pol(Level::WorkspaceWrite, |r| {
            r.network = Some(NetworkMode::Proxy);
            r.allow_domains = vec!["evil.org".into()];
        })
        .within(&outer.bounds())
        .unwrap_err();
        assert_eq!(e.grant, "--allow-domain evil.org");
        let e = pol(Level::WorkspaceWrite, |r| {
            r.network = Some(NetworkMode::Unmanaged)
        })
        .within(&outer.bounds())
        .unwrap_err();
        assert!(e.grant.contains("unmanaged"));
        let e = pol(Level::WorkspaceWrite, |r| {
            r.network = Some(NetworkMode::Proxy);
            r.allow_domains = vec!["pypi.org".into()];
        })
        .within(&outer.bounds())
        .unwrap_err();
        assert!(e.grant.contains("pypi.org"), "any port is wider than :443");
    }
}
