//! What the launch-path cuts of issue 11 §5 must keep: the stand-ins are
//! mounts with every restricting flag (they now take them from the scratch
//! tmpfs's mount, set once), and the command's process — started sharing
//! the init's memory until exec — is confined on its own, the init
//! (pid 1 of the sandbox) untouched by the command's filters.

use moat_conformance::*;

/// The mount options (field 6 of /proc/self/mountinfo) of the mount at `target`.
fn mount_options<'a>(mountinfo: &'a str, target: &str) -> Option<&'a str> {
    mountinfo.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(4) == Some(&target))
            .then(|| f.get(5).copied())
            .flatten()
    })
}

#[test]
fn stand_ins_are_read_only_nosuid_nodev_noexec_mounts() {
    let fx = Fixture::new();
    for level in ["workspace-contained", "read-only", "workspace-write"] {
        let out = run(fx.sh(level, &[], "cat /proc/self/mountinfo; echo MOUNTINFO_RAN"));
        out.expect_code(0).expect_stdout_has("MOUNTINFO_RAN");
        // /proc/keys and /proc/kallsyms are hidden behind a stand-in at
        // every sandboxed level (the golden sequences show them).
        for target in ["/proc/keys", "/proc/kallsyms"] {
            let opts = mount_options(&out.stdout, target).unwrap_or_else(|| {
                panic!(
                    "{level}: {target} is no mount (no stand-in)\n{}",
                    out.dump()
                )
            });
            let opts: Vec<&str> = opts.split(',').collect();
            for flag in ["ro", "nosuid", "nodev", "noexec"] {
                assert!(
                    opts.contains(&flag),
                    "{level}: the stand-in at {target} lacks {flag}: {opts:?}\n{}",
                    out.dump()
                );
            }
        }
    }
}

/// One `Name:\tvalue` field of a /proc/PID/status text.
fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

#[test]
fn the_command_process_is_confined_and_the_init_is_not_its_filter() {
    let fx = Fixture::new();
    for level in ["workspace-contained", "read-only"] {
        let out = run(fx.sh(
            level,
            &[],
            "cat /proc/self/status; echo SPLIT_HERE; cat /proc/1/status; echo STATUS_RAN",
        ));
        out.expect_code(0).expect_stdout_has("STATUS_RAN");
        let (own, init) = out
            .stdout
            .split_once("SPLIT_HERE")
            .unwrap_or_else(|| panic!("{level}: no split marker\n{}", out.dump()));
        // The command: every layer, set in its own process before exec.
        assert_eq!(
            status_field(own, "Seccomp"),
            Some("2"),
            "{level}\n{}",
            out.dump()
        );
        assert_eq!(
            status_field(own, "NoNewPrivs"),
            Some("1"),
            "{level}\n{}",
            out.dump()
        );
        for caps in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
            assert_eq!(
                status_field(own, caps),
                Some("0000000000000000"),
                "{level}: {caps}\n{}",
                out.dump()
            );
        }
        // pid 1 is moat's init (the command's pid namespace), and what the
        // command's process set for itself stayed its own: the init has
        // no seccomp filter and keeps its capabilities.
        assert_eq!(
            status_field(init, "Name"),
            Some("moat"),
            "{level}\n{}",
            out.dump()
        );
        assert_eq!(
            status_field(init, "Seccomp"),
            Some("0"),
            "{level}\n{}",
            out.dump()
        );
        assert_ne!(
            status_field(init, "CapEff"),
            Some("0000000000000000"),
            "{level}\n{}",
            out.dump()
        );
    }
}
