//! Language toolchains users install under their home (rustup, nvm, pyenv…):
//! the one list of where they live, so the sandbox's own HOME can show them.
//!
//! Inside every sandboxed level HOME is `/moat/home`, and these managers find
//! their installs through `$HOME` (rustup's default `RUSTUP_HOME` is
//! `~/.rustup`, pyenv's `PYENV_ROOT` `~/.pyenv`). Where the host filesystem
//! is readable anyway, moat mirrors each existing entry read-only at the same
//! place under `/moat/home`. Only install trees are listed, never a whole
//! tool home: `~/.cargo/bin` but not `~/.cargo` (whose `credentials.toml`
//! holds a registry token), so nothing secret rides along.

/// One toolchain manager and the home-relative entries of its install.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HomeToolchain {
    pub name: &'static str,
    /// Home-relative directories (or files) it reads through `$HOME`.
    pub entries: &'static [&'static str],
}

/// Every toolchain manager moat knows. Writable caches (`~/.cargo/registry`,
/// `~/go/pkg/mod`) are not here: profiles grant those read-write.
pub const HOME_TOOLCHAINS: &[HomeToolchain] = &[
    HomeToolchain {
        name: "rustup",
        entries: &[".rustup", ".cargo/bin"],
    },
    HomeToolchain {
        name: "nvm",
        entries: &[".nvm"],
    },
    HomeToolchain {
        name: "pyenv",
        entries: &[".pyenv"],
    },
    HomeToolchain {
        name: "volta",
        entries: &[".volta"],
    },
    HomeToolchain {
        name: "asdf",
        entries: &[".asdf", ".tool-versions"],
    },
    HomeToolchain {
        name: "sdkman",
        entries: &[".sdkman"],
    },
    HomeToolchain {
        name: "go",
        entries: &["sdk", "go/bin"],
    },
    HomeToolchain {
        name: "uv",
        entries: &[
            ".local/share/uv/python",
            ".local/share/uv/tools",
            ".local/bin",
        ],
    },
    HomeToolchain {
        name: "pipx",
        entries: &[".local/share/pipx", ".local/bin"],
    },
    HomeToolchain {
        name: "bun",
        entries: &[".bun/bin"],
    },
    HomeToolchain {
        name: "deno",
        entries: &[".deno/bin"],
    },
];

/// Every home-relative toolchain entry, each once, in list order.
pub fn toolchain_entries() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for t in HOME_TOOLCHAINS {
        for e in t.entries {
            if !v.contains(e) {
                v.push(e);
            }
        }
    }
    v
}

/// The toolchain whose install holds the home-relative path `rel`.
pub fn toolchain_containing(rel: &std::path::Path) -> Option<&'static HomeToolchain> {
    HOME_TOOLCHAINS
        .iter()
        .find(|t| t.entries.iter().any(|e| rel.starts_with(e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PROTECTED_HOME_PATHS;
    use std::path::Path;

    #[test]
    fn no_entry_holds_or_is_a_protected_path() {
        for e in toolchain_entries() {
            for p in PROTECTED_HOME_PATHS {
                assert!(
                    !Path::new(p).starts_with(e) && !Path::new(e).starts_with(p),
                    "{e} overlaps the protected {p}"
                );
            }
        }
    }

    #[test]
    fn lookup_by_contained_path() {
        let t = toolchain_containing(Path::new(".cargo/bin/cargo")).unwrap();
        assert_eq!(t.name, "rustup");
        assert!(t.entries.contains(&".rustup"));
        assert!(toolchain_containing(Path::new(".cargo/credentials.toml")).is_none());
        assert_eq!(
            toolchain_containing(Path::new(".pyenv/shims/python3")).map(|t| t.name),
            Some("pyenv")
        );
    }
}
