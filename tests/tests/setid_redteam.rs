//! Red-team of what a run leaves for the host to execute: set-user-ID and
//! set-group-ID files. The command runs as the caller's uid (root as root),
//! owns what it writes, and may set the mode of its own files; a set-uid
//! program left in the workspace or a writable grant runs as the caller for
//! whoever on the host executes it (as root, when root ran moat). Each case
//! tries every syscall that sets a mode, then looks at the host's files.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use moat_conformance::*;

/// Every mode-setting syscall, raw (so libc cannot pick another one), on
/// files in the current directory: a copy of `true` chmodded by path, by
/// fd, through `fchmodat` and `fchmodat2`, and new files made with the bits
/// by `creat`, `open`, `openat` (also `O_TMPFILE`), `mknod` and `mknodat`.
/// Prints `NAME errno` for each, then `probe-ran`.
const TRY_SETID: &str = r#"
import ctypes, os, platform, shutil, sys
libc = ctypes.CDLL(None, use_errno=True)
nr = {"x86_64": dict(open=2, creat=85, chmod=90, fchmod=91, mknod=133, openat=257, mknodat=259, fchmodat=268, fchmodat2=452),
      "aarch64": dict(openat=56, mknodat=33, fchmod=52, fchmodat=53, fchmodat2=452)}[platform.machine()]
AT = -100
def sc(name, *args):
    if name not in nr:
        return
    r = libc.syscall(nr[name], *args)
    print(name, 0 if r >= 0 else ctypes.get_errno(), flush=True)
    return r
for bits, tag in ((0o4755, "u"), (0o2755, "g"), (0o6755, "ug")):
    for how in ("chmod", "fchmod", "fchmodat", "fchmodat2"):
        p = f"{how}-{tag}"
        shutil.copy("/bin/true", p)
        os.chmod(p, 0o755)
        b = p.encode()
        if how == "chmod":
            sc(how, b, bits)
        elif how == "fchmod":
            fd = os.open(p, os.O_RDONLY)
            sc(how, fd, bits)
            os.close(fd)
        else:
            sc(how, AT, b, bits, 0)
    sc("creat", f"creat-{tag}".encode(), bits)
    sc("open", f"open-{tag}".encode(), os.O_CREAT | os.O_WRONLY, bits)
    sc("openat", AT, f"openat-{tag}".encode(), os.O_CREAT | os.O_WRONLY, bits)
    fd = sc("openat", AT, b".", os.O_TMPFILE | os.O_WRONLY, bits)
    if fd is not None and fd >= 0:
        try:
            os.link(f"/proc/self/fd/{fd}", f"tmpfile-{tag}")
        except OSError:
            pass  # EXDEV through a bind mount: the file stays unnamed
    sc("mknod", f"mknod-{tag}".encode(), 0o100000 | bits, 0)
    sc("mknodat", AT, f"mknodat-{tag}".encode(), 0o100000 | bits, 0)
# Ordinary modes still work.
shutil.copy("/bin/true", "plain")
os.chmod("plain", 0o750)
print("plain", oct(os.stat("plain").st_mode & 0o7777))
print("probe-ran")
"#;

/// Files under `dir` (not following links) whose mode has S_ISUID or
/// S_ISGID, with their modes.
fn setid_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        if m.is_file() && m.permissions().mode() & 0o6000 != 0 {
            found.push(format!(
                "{} {:o}",
                e.file_name().to_string_lossy(),
                m.permissions().mode()
            ));
        }
    }
    found.sort();
    found
}

fn check(out: &Out, dir: &Path, what: &str) {
    assert!(
        out.stdout.contains("probe-ran"),
        "{what}: the probe did not run: {out:?}"
    );
    assert!(
        out.stdout.contains("plain 0o750"),
        "{what}: an ordinary chmod failed: {out:?}"
    );
    let left = setid_files(dir);
    assert!(
        left.is_empty(),
        "{what}: the run left set-id files on the host: {left:?}\n{out:?}"
    );
    // Every attempt was refused with EPERM (none quietly made a plain file).
    for line in out.stdout.lines() {
        let mut f = line.split_whitespace();
        if let (Some(name), Some(errno), None) = (f.next(), f.next(), f.next()) {
            if name != "plain" {
                assert_eq!(
                    errno, "1",
                    "{what}: {name} was not refused with EPERM\n{out:?}"
                );
            }
        }
    }
}

#[test]
fn a_run_leaves_no_set_id_file_in_the_workspace() {
    for level in ["workspace-write", "workspace-contained"] {
        let fx = Fixture::new();
        let out = run(fx.py(level, &[], TRY_SETID, &[]));
        check(&out, &fx.ws, level);
    }
}

#[test]
fn a_run_leaves_no_set_id_file_in_a_writable_grant() {
    let fx = Fixture::new();
    let grant = fx.outside.join("cache");
    std::fs::create_dir(&grant).unwrap();
    let script = format!(
        "import os; os.chdir({:?})\n{TRY_SETID}",
        grant.to_str().unwrap()
    );
    let g = grant.to_str().unwrap();
    let out = run(fx.py("read-only", &["--rw", g], &script, &[]));
    check(&out, &grant, "--rw grant at read-only");
}

/// The refusal is explained: `--json` names the file with reason
/// `setid_mode` (an agent that only sees EPERM retries), and the mode is
/// unchanged on the host.
#[test]
fn a_refused_set_id_mode_is_explained() {
    let fx = Fixture::new();
    let prog = fx.w("prog");
    std::fs::copy("/bin/true", &prog).unwrap();
    let out = run(fx.sh(
        "workspace-write",
        &["--json"],
        "chmod u+s prog; echo chmod=$?",
    ));
    let v: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("--json output did not parse ({e}): {out:?}"));
    assert!(
        v["stdout"].as_str().is_some_and(|s| s.contains("chmod=1")),
        "chmod u+s was not refused: {out:?}"
    );
    let denials = v["denials"].as_array().cloned().unwrap_or_default();
    let want = prog.to_string_lossy();
    assert!(
        denials
            .iter()
            .any(|d| d["reason"] == "setid_mode" && d["path"] == *want),
        "no setid_mode denial for {want}: {denials:?}"
    );
    let mode = std::fs::metadata(&prog).unwrap().permissions().mode();
    assert_eq!(mode & 0o6000, 0, "mode {mode:o}");
}
