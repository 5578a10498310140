//! moat's own conformance executables run inside runc (issue 12 §2): the
//! bundle (`moat_conformance::runc_bundle`) binds the host's `/usr` and
//! `/etc`, moat at /moat, the sibling test executables at /suite, and gives
//! tmpfs at /tmp and /var/tmp for the harness's fixtures. Inside, each
//! executable runs with `MOAT_BIN=/moat/moat` and its libtest summary must
//! say `test result: ok` with at least one case passed and none failed.
//!
//! - user namespaces allowed, /proc unmasked: a security-relevant subset on
//!   moat's full (namespaces) backend;
//! - the Docker-like seccomp profile refusing CLONE_NEWUSER: the
//!   `--backend landlock` executables.
//!
//! The executables are found next to this one (cargo's target/debug/deps,
//! or the flat directory `scripts/test-all` copies them into for the
//! unprivileged phase), newest build first. None of them is a container test,
//! so nothing recurses.

use std::path::PathBuf;
use std::time::Duration;

use moat_conformance::runc_bundle::*;
use moat_conformance::*;

/// Run with user namespaces allowed: the filesystem levels, fd/env hygiene
/// and the red-team cases. Not yet: `process` passes inside (9/9 as root)
/// but the container's shell (pid 1) then never finishes.
const WITH_USERNS: [&str; 3] = ["filesystem", "env_fds", "redteam"];
/// Run under the profile refusing user namespaces: the Landlock backend.
const WITHOUT_USERNS: [&str; 2] = ["landlock_backend", "landlock_tty"];

/// Cases not run inside, each with why: they compare the host's user
/// namespaces with the wrappers that take them away (`unshare -Ur` and a
/// seccomp filter), and inside the no-userns container there are none to
/// take away (the container itself is that comparison's "without" side).
const NOT_INSIDE: [(&str, &str, &str); 4] = [
    (
        "landlock_backend",
        "namespaces_are_really_gone_in_the_wrappers_positive_control",
        "asserts the host has user namespaces",
    ),
    (
        "landlock_backend",
        "default_backend_refuses_and_names_the_landlock_option_contract",
        "its second half runs `unshare -Ur`, which the container refuses",
    ),
    (
        "landlock_backend",
        "the_sysctl_way_gets_the_same_backend",
        "runs `unshare -Ur`, which the container refuses",
    ),
    (
        "landlock_backend",
        "results_events_and_audit_say_which_backend_ran",
        "asserts `--backend auto` picks namespaces without the wrapper",
    ),
];

/// The newest built executable named `<name>-<hash>` next to this test.
fn sibling(name: &str) -> PathBuf {
    let me = std::env::current_exe().unwrap();
    let dir = me.parent().unwrap();
    let prefix = format!("{name}-");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix(&prefix)
                .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p).unwrap_or_else(|| {
        panic!(
            "no built `{name}` test executable next to {}: build it with \
             `cargo test -p moat-conformance --no-run`",
            me.display()
        )
    })
}

/// Copies the named executables into a directory of the fixture (bound at
/// /suite inside) and returns it with their names inside.
fn suite_dir(fx: &Fixture, names: &[&str]) -> (PathBuf, Vec<String>) {
    let dir = fx.root.join("suite");
    std::fs::create_dir_all(&dir).unwrap();
    let mut inside = Vec::new();
    for n in names {
        std::fs::copy(sibling(n), dir.join(n)).unwrap();
        inside.push(format!("/suite/{n}"));
    }
    (dir, inside)
}

/// One libtest summary: passed and failed counts of `test result: ok.`.
fn summary(section: &str) -> Option<(u32, u32)> {
    let line = section
        .lines()
        .rev()
        .find(|l| l.starts_with("test result: "))?;
    let ok = line.starts_with("test result: ok.");
    let count = |what: &str| -> Option<u32> {
        let before = line
            .split(&format!(" {what}"))
            .next()?
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()?;
        before.parse().ok()
    };
    let (passed, failed) = (count("passed")?, count("failed")?);
    ok.then_some((passed, failed))
}

/// The nested suite's output, each line behind `  | `: dumped in this
/// case's failure, its `test X ... ok` lines must not read as this run's
/// own (scripts/testlog.py counts the cases that pass against the no-op
/// stand-in from libtest's lines at the start of a line).
fn nested(text: &str) -> String {
    text.lines().map(|l| format!("  | {l}\n")).collect()
}

/// Runs each executable inside the container and asserts its summary.
fn run_inside(fx: &Fixture, tag: &str, names: &[&str], seccomp: Option<serde_json::Value>) {
    let (dir, exes) = suite_dir(fx, names);
    // Each executable's section starts with a marker line naming it.
    let script = exes
        .iter()
        .zip(names)
        .map(|(e, n)| {
            let skips: String = NOT_INSIDE
                .iter()
                .filter(|(exe, _, _)| exe == n)
                .map(|(_, t, _)| format!(" --skip {t}"))
                .collect();
            // Its own session: a case signalling its process group must not
            // stop the container's shell.
            format!("echo '=== SUITE {e}'; setsid -w {e} --exact{skips} --test-threads=2 --show-output 2>&1; echo \"=== EXIT $?\"")
        })
        .collect::<Vec<_>>()
        .join("; ");
    // The shell is the container's pid 1: a job-control signal the tty layer
    // sends its process group (it is forced, even to an init) stopped it
    // after `process`; ignored signals are never delivered.
    let script = format!("trap '' TSTP TTIN TTOU; {script}");
    let extra = Extra {
        ro_binds: vec![("/suite".into(), dir)],
        env: vec!["MOAT_BIN=/moat/moat".into(), "USER=ctr".into()],
    };
    let bundle = bundle_with(fx, tag, &["sh", "-c", &script], seccomp, false, &extra);
    let Some(out) = run_bundle_limit(fx, &bundle, Duration::from_secs(900)) else {
        return;
    };
    let mut sections = out.stdout.split("=== SUITE ").skip(1).collect::<Vec<_>>();
    assert_eq!(sections.len(), names.len(), "{}", nested(&out.dump()));
    for (exe, test, why) in NOT_INSIDE.iter().filter(|(e, _, _)| names.contains(e)) {
        println!("{tag}: not run inside: {exe} {test}: {why}");
    }
    for (name, section) in names.iter().zip(sections.drain(..)) {
        let skips: Vec<&str> = section
            .lines()
            .filter(|l| l.starts_with("SKIP: "))
            .collect();
        let result = summary(section);
        println!(
            "{tag}: {name}: {result:?} (passed, failed); {} skip(s){}",
            skips.len(),
            skips.iter().map(|s| format!("\n  {s}")).collect::<String>()
        );
        let Some((passed, failed)) = result else {
            panic!(
                "{name} inside the container did not pass:\n{}\n{}",
                nested(section),
                nested(&out.stderr)
            );
        };
        assert!(passed > 0 && failed == 0, "{name}: {}", nested(section));
        assert!(
            section.contains("=== EXIT 0"),
            "{name}: {}",
            nested(section)
        );
    }
}

#[test]
fn conformance_executables_pass_inside_a_container_with_user_namespaces() {
    let fx = Fixture::new();
    prepare_ws(&fx);
    run_inside(&fx, "userns", &WITH_USERNS, None);
}

#[test]
fn landlock_executables_pass_inside_a_container_without_user_namespaces() {
    let fx = Fixture::new();
    prepare_ws(&fx);
    run_inside(&fx, "nouserns", &WITHOUT_USERNS, Some(no_userns_seccomp()));
}
