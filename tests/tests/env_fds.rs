//! Environment and file-descriptor family: env scrubbing, secret-looking
//! names, --env / --pass-env, moat's own init environ, inherited fds.

use std::os::fd::AsRawFd;

use moat_conformance::*;

struct Secrets {
    token: String,
    aws: String,
    key: String,
    password: String,
    hostvar: String,
}

fn with_secret_env(cmd: &mut std::process::Command) -> Secrets {
    let s = Secrets {
        token: unique("TOKENVAL"),
        aws: unique("AWSVAL"),
        key: unique("KEYVAL"),
        password: unique("PASSVAL"),
        hostvar: unique("HOSTVARVAL"),
    };
    cmd.env("SECRET_TOKEN", &s.token)
        .env("AWS_SECRET_ACCESS_KEY", &s.aws)
        .env("MY_API_KEY", &s.key)
        .env("DB_PASSWORD", &s.password)
        .env("HOSTVAR", &s.hostvar)
        .env("TERM", "xterm-moat")
        .env("LC_MESSAGES", "C");
    s
}

const ENV_SCRIPT: &str = "env; echo ----; tr '\\0' '\\n' < /proc/1/environ; echo ----; \
                          for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done; echo ----; \
                          tr '\\0' '\\n' < /proc/self/environ; echo END";

#[test]
fn environment_is_scrubbed_at_sandboxed_levels() {
    let fx = Fixture::new();
    for level in SANDBOXED {
        let mut c = fx.sh(level, &["--env", "EXPLICIT=yes-explicit"], ENV_SCRIPT);
        let s = with_secret_env(&mut c);
        let out = run(c);
        out.expect_code(0).expect_stdout_has("END");
        out.expect_absent(&s.token, "SECRET_TOKEN")
            .expect_absent(&s.aws, "AWS_SECRET_ACCESS_KEY")
            .expect_absent(&s.key, "MY_API_KEY")
            .expect_absent(&s.password, "DB_PASSWORD")
            .expect_absent(&s.hostvar, "HOSTVAR (not in the allow list)")
            .expect_absent(
                fx.home.to_str().unwrap(),
                "caller's HOME path (in /proc/*/environ)",
            );
        let env: Vec<&str> = out.stdout.split("----").next().unwrap().lines().collect();
        for want in [
            "HOME=/moat/home",
            "TMPDIR=/tmp",
            "EXPLICIT=yes-explicit",
            "TERM=xterm-moat",
            "LC_MESSAGES=C",
        ] {
            assert!(
                env.contains(&want),
                "missing {want} at {level}\n{}",
                out.dump()
            );
        }
        assert!(
            env.iter().any(|l| l.starts_with("PATH=")),
            "PATH missing at {level}"
        );
        let allowed = [
            "PATH", "LANG", "TERM", "HOME", "TMPDIR", "USER", "EXPLICIT", "PWD", "SHLVL", "_",
            "OLDPWD",
        ];
        let extra: Vec<&&str> = env
            .iter()
            .filter(|l| {
                let k = l.split('=').next().unwrap_or("");
                !(allowed.contains(&k) || k.starts_with("LC_") || k.starts_with("MOAT_"))
            })
            .collect();
        assert!(
            extra.is_empty(),
            "unexpected variables at {level}: {extra:?}\n{}",
            out.dump()
        );
    }
}

#[test]
fn pass_env_passes_only_named_vars() {
    let fx = Fixture::new();
    for level in SANDBOXED {
        let mut c = fx.sh(
            level,
            &["--pass-env", "SECRET_TOKEN", "--pass-env", "HOSTVAR"],
            "env; echo END",
        );
        let s = with_secret_env(&mut c);
        let out = run(c);
        out.expect_code(0);
        out.expect_stdout_has(&format!("SECRET_TOKEN={}", s.token))
            .expect_stdout_has(&format!("HOSTVAR={}", s.hostvar));
        out.expect_absent(&s.aws, "AWS_SECRET_ACCESS_KEY")
            .expect_absent(&s.password, "DB_PASSWORD");
    }
}

#[test]
fn secret_names_not_passed_under_danger_full_access_either() {
    let fx = Fixture::new();
    let mut c = fx.sh("danger-full-access", &[], "env; echo END");
    let s = with_secret_env(&mut c);
    let out = run(c);
    out.expect_code(0).expect_stdout_has("END");
    out.expect_absent(&s.token, "SECRET_TOKEN")
        .expect_absent(&s.aws, "AWS_*")
        .expect_absent(&s.password, "*_PASSWORD");
}

#[test]
fn env_flag_value_with_equals_and_spaces_contract() {
    let fx = Fixture::new();
    let out = run(fx.sh(
        "read-only",
        &["--env", "K=a=b c"],
        "printf 'K=[%s]\\n' \"$K\"",
    ));
    out.expect_code(0).expect_stdout_has("K=[a=b c]");
}

fn open_secret(fx: &Fixture, content: &str) -> std::fs::File {
    let p = fx.root.join("fd-secret");
    write(&p, content);
    std::fs::File::open(&p).unwrap()
}

// Scans fds with fstat (opens nothing itself), then tries to read fd 5 and 7.
const FD_PROBE: &str = r#"
import os
open_fds = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        open_fds.append(fd)
    except OSError:
        pass
print("OPEN_FDS", ",".join(map(str, open_fds)), flush=True)
for fd in (5, 7):
    try:
        os.set_blocking(fd, False)
        print("READ", fd, os.read(fd, 4096), flush=True)
    except OSError as e:
        print("READ", fd, "ERRNO", e.errno, flush=True)
for p in ("/proc/self/fd/5", "/dev/fd/5"):
    try:
        print("PATH", p, open(p).read(), flush=True)
    except OSError as e:
        print("PATH", p, "ERRNO", e.errno, flush=True)
"#;

#[test]
fn inherited_fds_are_closed() {
    let fx = Fixture::new();
    let secret = unique("FDSECRET");
    let f = high_fd(open_secret(&fx, &secret).as_raw_fd());
    let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
    let w = high_fd(w.as_raw_fd());
    // Positive control: python run directly sees fds 5 and 7.
    let mut ctl = std::process::Command::new(PY);
    ctl.args(["-c", FD_PROBE]).env_clear();
    inherit_fd(&mut ctl, f.as_raw_fd(), 5);
    inherit_fd(&mut ctl, w.as_raw_fd(), 7);
    let ctl = run(ctl);
    assert!(
        ctl.stdout.contains(&secret),
        "control: fd 5 not readable directly\n{}",
        ctl.dump()
    );
    // (The runner may leak more fds, e.g. cargo's jobserver pipe: moat must close those too.)
    let ctl_fds: Vec<String> = ctl
        .field("OPEN_FDS")
        .unwrap_or_default()
        .split(',')
        .map(str::to_string)
        .collect();
    assert!(
        ctl_fds.contains(&"5".into()) && ctl_fds.contains(&"7".into()),
        "control: probe misses fds\n{}",
        ctl.dump()
    );

    for level in ALL_LEVELS {
        let mut c = fx.py(level, &[], FD_PROBE, &[]);
        inherit_fd(&mut c, f.as_raw_fd(), 5);
        inherit_fd(&mut c, w.as_raw_fd(), 7);
        let out = run(c);
        out.expect_code(0);
        out.expect_absent(&secret, &format!("inherited fd 5 at {level}"));
        assert_eq!(
            out.field("OPEN_FDS").as_deref(),
            Some(""),
            "fds > 2 open inside at {level}\n{}",
            out.dump()
        );
    }
    drop(r);
}

#[test]
fn stdio_passes_through_contract() {
    let fx = Fixture::new();
    let mut c = fx.sh(
        "read-only",
        &[],
        "read line; echo got:$line; echo to-stderr >&2",
    );
    let (r, mut w) = std::os::unix::net::UnixStream::pair().unwrap();
    use std::io::Write;
    w.write_all(b"hello-stdin\n").unwrap();
    drop(w);
    c.stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(r)));
    let out = run(c);
    out.expect_code(0).expect_stdout_has("got:hello-stdin");
    assert!(
        out.stderr.contains("to-stderr"),
        "command stderr must not be dropped\n{}",
        out.dump()
    );
}
