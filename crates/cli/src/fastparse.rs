//! The command line, parsed for the launch path: `moat exec …` has clap
//! build only the `exec` subcommand. Building the whole tree (every
//! subcommand's arguments, `PolicyFlags` five times over) cost ≈ 0.25 ms of
//! every launch, a fifth of moat's own work before the clone.
//!
//! The flags stay one source (`ExecArgs`'s derive): the same arguments are
//! added to a lone `exec` command. Whatever that parser does not accept
//! cleanly (`--help`, an error, anything else) goes to the full parser,
//! so help, errors and everything but the successful parse are the full
//! tree's own; a test checks both parsers agree.

use std::ffi::OsString;

use clap::{Args, FromArgMatches, Parser};

use crate::{Cli, Command, ExecArgs};

/// Parses moat's command line (`args` includes argv[0]).
pub(crate) fn parse(args: Vec<OsString>) -> Result<Cli, clap::Error> {
    if let Some(exec) = parse_exec(&args) {
        return Ok(Cli {
            command: Command::Exec(exec),
        });
    }
    Cli::try_parse_from(args)
}

/// `moat exec …` through the `exec` subcommand alone; None when the line
/// is something else or this parser does not accept it.
fn parse_exec(args: &[OsString]) -> Option<ExecArgs> {
    if args.get(1).is_none_or(|a| a != "exec") {
        return None;
    }
    // The tree's `exec` subcommand is named "exec" and adds no settings of
    // its own beyond ExecArgs'; argv[1] stands as its binary name.
    let cmd = ExecArgs::augment_args(clap::Command::new("exec"));
    let matches = cmd.try_get_matches_from(&args[1..]).ok()?;
    ExecArgs::from_arg_matches(&matches).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    fn full(words: &[&str]) -> Option<ExecArgs> {
        match Cli::try_parse_from(argv(words)).ok()?.command {
            Command::Exec(a) => Some(a),
            _ => None,
        }
    }

    /// Both parsers accept the same `exec` lines and read them alike, and
    /// what the lone parser refuses the full one refuses too (so the
    /// fallback only ever changes who prints the error or the help).
    #[test]
    fn the_lone_exec_parser_agrees_with_the_full_tree() {
        let cases: &[&[&str]] = &[
            &["moat", "exec", "--", "true"],
            &["moat", "exec", "--policy", "ro", "--", "true", "-x"],
            &["moat", "exec", "--policy=workspace-contained", "--", "true"],
            &[
                "moat",
                "exec",
                "--json",
                "--network",
                "proxy",
                "--allow-domain",
                "example.com",
                "--rw",
                "/tmp",
                "--env",
                "A=b",
                "--",
                "sh",
                "-c",
                "echo hi",
            ],
            &[
                "moat",
                "exec",
                "--events",
                "--no-audit",
                "--quiet",
                "--",
                "x",
            ],
            &["moat", "exec", "--memory", "1G", "--pids", "64", "--", "x"],
            &["moat", "exec", "--audit-log", "/tmp/a", "--", "x"],
            // Refused by both: no command, unknown flag, conflicts, bad values.
            &["moat", "exec"],
            &["moat", "exec", "--bogus", "--", "true"],
            &["moat", "exec", "--json", "--events", "--", "true"],
            &["moat", "exec", "--audit-log", "/a", "--no-audit", "--", "x"],
            &["moat", "exec", "--policy", "yolo", "--", "true"],
            &["moat", "exec", "--version"],
            &["moat", "exec", "--help"],
            &["moat", "exec", "-h"],
            &["moat", "exec", "true"],
        ];
        for words in cases {
            let lone = parse_exec(&argv(words));
            let tree = full(words);
            assert_eq!(lone.is_some(), tree.is_some(), "{words:?}");
            if let (Some(l), Some(t)) = (lone, tree) {
                assert_eq!(l.policy, t.policy, "{words:?}");
                assert_eq!(l.report, t.report, "{words:?}");
                assert_eq!(l.command, t.command, "{words:?}");
            }
        }
        // Not `exec`: the lone parser stays out of it.
        assert!(parse_exec(&argv(&["moat", "run", "git"])).is_none());
        assert!(parse_exec(&argv(&["moat"])).is_none());
    }
}
