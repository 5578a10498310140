//! Runs `redact_corpus.txt`: every documented redaction form, its variants,
//! and false-positive controls (see the file's header for the format).

use moat_audit::{redact_arg, redact_argv};

const CORPUS: &str = include_str!("redact_corpus.txt");
const ARG_SEP: &str = " ¦ ";

fn split_argv(s: &str) -> Vec<String> {
    s.split(ARG_SEP).map(str::to_owned).collect()
}

#[test]
fn corpus() {
    let mut failures = Vec::new();
    let mut cases = 0;
    for (no, line) in CORPUS.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        cases += 1;
        let (got, want) = match kind {
            "arg" => {
                let (input, want) = rest.split_once(" => ").expect("arg line without =>");
                (redact_arg(input), want.to_owned())
            }
            "same" => (redact_arg(rest), rest.to_owned()),
            "argv" => {
                let (input, want) = rest.split_once(" => ").expect("argv line without =>");
                (
                    redact_argv(&split_argv(input)).join(ARG_SEP),
                    want.to_owned(),
                )
            }
            "same-argv" => (
                redact_argv(&split_argv(rest)).join(ARG_SEP),
                rest.to_owned(),
            ),
            other => panic!("line {}: unknown kind {other:?}", no + 1),
        };
        if got != want {
            failures.push(format!(
                "line {}: {line}\n    got:  {got}\n    want: {want}",
                no + 1
            ));
        }
    }
    assert!(cases > 100, "corpus too small: {cases}");
    assert!(
        failures.is_empty(),
        "{} of {cases} corpus cases fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
