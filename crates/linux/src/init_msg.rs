//! The init's report pipe: what the sandbox's init (and the command's
//! process, between fork and exec) tells the supervisor, as one typed
//! [`InitMessage`] per length-prefixed frame; and the other way, the
//! [`PlanMessage`] an early init gets in place of the clone.
//!
//! A frame is `[body length: u16 LE][tag: u8][body]`, at most
//! [`MAX_FRAME`] bytes (PIPE_BUF, so each frame is one atomic pipe write
//! even when the init and the command's process both write). The writer
//! encodes into a stack buffer: nothing is allocated on the init's side
//! after the clone. The reader borrows text fields from its buffer. A frame
//! that is malformed, of an unknown tag, or cut short at end of file is an
//! error the supervisor reports (exit 125), never skipped.

use crate::confine::Enforcement;

/// Largest frame, header included: PIPE_BUF, so a frame is written atomically.
pub const MAX_FRAME: usize = 4096;
/// Length prefix and tag.
const HEADER: usize = 3;

const TAG_SETUP_FAILED: u8 = 1;
const TAG_CONFINED: u8 = 2;
const TAG_EXEC_FAILED: u8 = 3;
const TAG_EXITED: u8 = 4;
const TAG_HOST_REPLACED: u8 = 5;
const TAG_WATCH_FAILED: u8 = 6;

/// Where, in the init's work, a setup step failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetupStage {
    /// Namespaces, identity, the view, the handoffs (in the init).
    Sandbox,
    /// Forking the command's process.
    Fork,
    /// Resource limits in the command's process.
    Limits,
    /// Attaching the command's terminal.
    Terminal,
    /// Capabilities, Landlock, seccomp in the command's process.
    Confine,
}

impl SetupStage {
    /// The stages of the command's own process, whose `detail` is a bare
    /// step: the reader adds the text of a non-zero errno.
    pub fn from_command_process(self) -> bool {
        matches!(
            self,
            SetupStage::Limits | SetupStage::Terminal | SetupStage::Confine
        )
    }
    const ALL: [SetupStage; 5] = [
        SetupStage::Sandbox,
        SetupStage::Fork,
        SetupStage::Limits,
        SetupStage::Terminal,
        SetupStage::Confine,
    ];
    fn code(self) -> u8 {
        match self {
            SetupStage::Sandbox => 1,
            SetupStage::Fork => 2,
            SetupStage::Limits => 3,
            SetupStage::Terminal => 4,
            SetupStage::Confine => 5,
        }
    }
    fn from_code(c: u8) -> Option<SetupStage> {
        SetupStage::ALL.into_iter().find(|s| s.code() == c)
    }
}

/// One report from the init to the supervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitMessage<'a> {
    /// A step before exec failed; the command never ran (moat's failure,
    /// exit 125). `detail` is the message for the user, naming the step,
    /// the path and the fix; `errno` is 0 when the failure had none.
    SetupFailed {
        stage: SetupStage,
        errno: i32,
        detail: &'a str,
    },
    /// The command's process is confined and about to exec; the layers as
    /// the kernel enforced them.
    Confined {
        landlock: Enforcement,
        seccomp: Enforcement,
    },
    /// Every exec candidate failed; `errno` is the one that decides the exit
    /// code (ENOENT: 127, anything else: 126).
    ExecFailed { errno: i32 },
    /// The command exited (`code` as a shell reports it, `signal` 0 unless
    /// it was killed) and every process of the run has been reaped, with
    /// what they used.
    Exited {
        code: i32,
        signal: i32,
        max_rss_kb: i64,
        cpu_ms: i64,
    },
    /// The host replaced `path` (a view path) while the command ran: the
    /// mount that narrowed it was detached, and the init killed every
    /// process of the run (`crate::watch`). Sent in place of `Exited`.
    HostReplaced { path: &'a str },
    /// The init could not arm the watch over the narrowing mounts once the
    /// command had started (`detail`: what is missing and what to do), and
    /// killed every process of the run. Sent in place of `Exited`: the
    /// command ran, so this is a stopped run, never a failed setup.
    WatchFailed { detail: &'a str },
}

/// Why bytes on the report pipe are not a valid message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("a frame announces {0} bytes, more than a frame may hold")]
    TooLong(usize),
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    #[error("message tag {tag} with a body of {len} bytes")]
    BadLength { tag: u8, len: usize },
    #[error("message tag {tag}: invalid field value {value}")]
    BadField { tag: u8, value: u8 },
    #[error("message text is not UTF-8")]
    BadText,
    #[error("the pipe ended inside a frame ({0} bytes left over)")]
    Truncated(usize),
}

fn enforcement_from(tag: u8, c: u8) -> Result<Enforcement, DecodeError> {
    match c {
        b'F' => Ok(Enforcement::Full),
        b'P' => Ok(Enforcement::Partial),
        b'N' => Ok(Enforcement::None),
        value => Err(DecodeError::BadField { tag, value }),
    }
}

/// The longest prefix of `s` that fits in `max` bytes, cut at a char boundary.
fn fit(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl<'a> InitMessage<'a> {
    /// Writes the message as one frame into `buf`; returns its length. A
    /// `detail` longer than a frame holds is cut (at a char boundary).
    pub fn encode(&self, buf: &mut [u8; MAX_FRAME]) -> usize {
        let mut body = [0u8; MAX_FRAME];
        let (tag, len) = match *self {
            InitMessage::SetupFailed {
                stage,
                errno,
                detail,
            } => {
                let text = fit(detail, MAX_FRAME - HEADER - 7);
                body[0] = stage.code();
                body[1..5].copy_from_slice(&errno.to_le_bytes());
                body[5..7].copy_from_slice(&(text.len() as u16).to_le_bytes());
                body[7..7 + text.len()].copy_from_slice(text.as_bytes());
                (TAG_SETUP_FAILED, 7 + text.len())
            }
            InitMessage::Confined { landlock, seccomp } => {
                body[0] = landlock.code();
                body[1] = seccomp.code();
                (TAG_CONFINED, 2)
            }
            InitMessage::ExecFailed { errno } => {
                body[..4].copy_from_slice(&errno.to_le_bytes());
                (TAG_EXEC_FAILED, 4)
            }
            InitMessage::Exited {
                code,
                signal,
                max_rss_kb,
                cpu_ms,
            } => {
                body[..4].copy_from_slice(&code.to_le_bytes());
                body[4..8].copy_from_slice(&signal.to_le_bytes());
                body[8..16].copy_from_slice(&max_rss_kb.to_le_bytes());
                body[16..24].copy_from_slice(&cpu_ms.to_le_bytes());
                (TAG_EXITED, 24)
            }
            InitMessage::HostReplaced { path } => {
                let text = fit(path, MAX_FRAME - HEADER);
                body[..text.len()].copy_from_slice(text.as_bytes());
                (TAG_HOST_REPLACED, text.len())
            }
            InitMessage::WatchFailed { detail } => {
                let text = fit(detail, MAX_FRAME - HEADER);
                body[..text.len()].copy_from_slice(text.as_bytes());
                (TAG_WATCH_FAILED, text.len())
            }
        };
        buf[..2].copy_from_slice(&(len as u16).to_le_bytes());
        buf[2] = tag;
        buf[HEADER..HEADER + len].copy_from_slice(&body[..len]);
        HEADER + len
    }

    /// Decodes the first frame of `buf`: the message and the bytes it took,
    /// or `None` when the frame is not complete yet.
    pub fn decode(buf: &'a [u8]) -> Result<Option<(InitMessage<'a>, usize)>, DecodeError> {
        let Some(head) = buf.get(..HEADER) else {
            return Ok(None);
        };
        let len = u16::from_le_bytes([head[0], head[1]]) as usize;
        let tag = head[2];
        if len > MAX_FRAME - HEADER {
            return Err(DecodeError::TooLong(len));
        }
        let Some(body) = buf.get(HEADER..HEADER + len) else {
            return Ok(None);
        };
        let bad_len = DecodeError::BadLength { tag, len };
        let i32_at = |i: usize| -> Result<i32, DecodeError> {
            let b = body.get(i..i + 4).ok_or(bad_len)?;
            Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let i64_at = |i: usize| -> Result<i64, DecodeError> {
            let b = body.get(i..i + 8).ok_or(bad_len)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Ok(i64::from_le_bytes(a))
        };
        let msg = match tag {
            TAG_SETUP_FAILED => {
                let stage_code = *body.first().ok_or(bad_len)?;
                let stage = SetupStage::from_code(stage_code).ok_or(DecodeError::BadField {
                    tag,
                    value: stage_code,
                })?;
                let errno = i32_at(1)?;
                let n = body.get(5..7).ok_or(bad_len)?;
                let n = u16::from_le_bytes([n[0], n[1]]) as usize;
                if body.len() != 7 + n {
                    return Err(bad_len);
                }
                let detail = std::str::from_utf8(&body[7..]).map_err(|_| DecodeError::BadText)?;
                InitMessage::SetupFailed {
                    stage,
                    errno,
                    detail,
                }
            }
            TAG_CONFINED => {
                if len != 2 {
                    return Err(bad_len);
                }
                InitMessage::Confined {
                    landlock: enforcement_from(tag, body[0])?,
                    seccomp: enforcement_from(tag, body[1])?,
                }
            }
            TAG_EXEC_FAILED => {
                if len != 4 {
                    return Err(bad_len);
                }
                InitMessage::ExecFailed { errno: i32_at(0)? }
            }
            TAG_EXITED => {
                if len != 24 {
                    return Err(bad_len);
                }
                InitMessage::Exited {
                    code: i32_at(0)?,
                    signal: i32_at(4)?,
                    max_rss_kb: i64_at(8)?,
                    cpu_ms: i64_at(16)?,
                }
            }
            TAG_HOST_REPLACED => InitMessage::HostReplaced {
                path: std::str::from_utf8(body).map_err(|_| DecodeError::BadText)?,
            },
            TAG_WATCH_FAILED => InitMessage::WatchFailed {
                detail: std::str::from_utf8(body).map_err(|_| DecodeError::BadText)?,
            },
            other => return Err(DecodeError::UnknownTag(other)),
        };
        Ok(Some((msg, HEADER + len)))
    }
}

/// Every complete message in `buf`, in order. With `at_eof` (the pipe is
/// closed, nothing more will come), a partial frame left over is an error;
/// without it, the partial frame is left for the next read.
pub fn decode_all(buf: &[u8], at_eof: bool) -> Result<Vec<InitMessage<'_>>, DecodeError> {
    let mut out = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        match InitMessage::decode(rest)? {
            Some((msg, used)) => {
                out.push(msg);
                rest = &rest[used..];
            }
            None if at_eof => return Err(DecodeError::Truncated(rest.len())),
            None => break,
        }
    }
    Ok(out)
}

/// Writes `msg` to the report pipe as one frame (from the init or the
/// command's process: no allocation).
/// The message for the user of a `SetupFailed` report. The command's
/// process cannot format (it allocates nothing): its steps come bare, with
/// the errno, whose text is added here; the init's own details are whole.
pub fn setup_failure_text(stage: SetupStage, errno: i32, detail: &str) -> String {
    if errno != 0 && stage.from_command_process() {
        format!("{detail}: {}", std::io::Error::from_raw_os_error(errno))
    } else {
        detail.to_string()
    }
}

pub(crate) fn send(fd: std::os::fd::RawFd, msg: &InitMessage<'_>) {
    let mut frame = [0u8; MAX_FRAME];
    let n = msg.encode(&mut frame);
    crate::sys::write_all_fd(fd, &frame[..n]);
}

/// What the supervisor sends an early init (`run::EarlyInit`) in place of
/// the clone: the plan and everything else [`crate::init::InitArgs`]
/// holds, as one frame (`template::send_frame`: JSON with the run's fds as
/// `SCM_RIGHTS`). The fds come in this order: the report pipe, then the
/// stdout and stderr capture ends and the handoff socket, each when its
/// flag says so. `P` is the plan: the supervisor sends a borrowed one
/// (`&Plan`: no copy), the init reads a `Plan` back. Byte strings travel
/// as hex ([`hex_bytes`]): a JSON array of numbers is about twice as long
/// and its numbers are parsed one by one.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct PlanMessage<P = crate::plan::Plan> {
    pub plan: P,
    #[serde(with = "hex_bytes::list")]
    pub argv: Vec<Vec<u8>>,
    #[serde(with = "hex_bytes::list")]
    pub envp: Vec<Vec<u8>>,
    /// The compiled seccomp program, each `sock_filter` as its 8 bytes
    /// (code, jt, jf, k; native order); None: not sandboxed.
    #[serde(with = "hex_bytes::option")]
    pub seccomp: Option<Vec<u8>>,
    /// (resource, soft, hard), the resource as [`rlimit_code`] gives it.
    pub rlimits: Vec<(u8, u64, u64)>,
    /// The command's pty: which of stdin, stdout, stderr it becomes.
    pub pty: Option<(bool, bool, bool)>,
    pub cwd_identity: Option<(u64, u64)>,
    pub stdout: bool,
    pub stderr: bool,
    pub handoff: bool,
}

/// The init's end of the hand-off: the plan message and its fds, the wait
/// and the decoding timed apart. A frame that does not decode runs
/// nothing: when it brought the report pipe (its first fd), the init says
/// so there (the supervisor reports it, exit 125), and it exits 125.
pub(crate) fn recv_plan(
    sock: std::os::fd::BorrowedFd<'_>,
) -> Option<(PlanMessage, Vec<std::os::fd::OwnedFd>)> {
    use std::os::fd::AsRawFd;
    let (body, fds) = crate::template::recv_frame_bytes(sock).ok()?;
    crate::timing::mark("early init: the plan's bytes received");
    match serde_json::from_slice::<PlanMessage>(&body) {
        Ok(msg) => {
            crate::timing::mark("early init: the plan decoded");
            Some((msg, fds))
        }
        Err(e) => {
            if let Some(report) = fds.first() {
                send(
                    report.as_raw_fd(),
                    &InitMessage::SetupFailed {
                        stage: SetupStage::Sandbox,
                        errno: 0,
                        detail: &format!(
                            "the plan sent to the sandbox's init does not decode: {e}"
                        ),
                    },
                );
            }
            None
        }
    }
}

/// Byte strings as lowercase hex in JSON: two characters a byte, decoded
/// without a parse per number. Anything else than an even run of hex
/// digits is an error (the message then runs nothing).
pub(crate) mod hex_bytes {
    use serde::de::Error;

    const DIGITS: &[u8; 16] = b"0123456789abcdef";

    pub fn encode(bytes: &[u8]) -> String {
        let mut s = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            s.push(DIGITS[(b >> 4) as usize] as char);
            s.push(DIGITS[(b & 15) as usize] as char);
        }
        s
    }

    pub fn decode(s: &str) -> Option<Vec<u8>> {
        fn digit(c: u8) -> Option<u8> {
            match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            }
        }
        let s = s.as_bytes();
        if s.len() % 2 != 0 {
            return None;
        }
        s.chunks_exact(2)
            .map(|p| Some((digit(p[0])? << 4) | digit(p[1])?))
            .collect()
    }

    fn decoded<E: Error>(s: &str) -> Result<Vec<u8>, E> {
        decode(s).ok_or_else(|| E::custom("a byte string that is not hex"))
    }

    /// `Vec<Vec<u8>>` as a list of hex strings.
    pub mod list {
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(v: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(v.iter().map(|b| super::encode(b)))
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
            let v = Vec::<String>::deserialize(d)?;
            v.iter().map(|s| super::decoded(s)).collect()
        }
    }

    /// `Option<Vec<u8>>` as null or a hex string.
    pub mod option {
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(b) => s.serialize_some(&super::encode(b)),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|s| super::decoded(&s))
                .transpose()
        }
    }
}

/// The rlimits a plan message can carry (every one `limits` sets).
const RLIMITS: [nix::sys::resource::Resource; 5] = [
    nix::sys::resource::Resource::RLIMIT_AS,
    nix::sys::resource::Resource::RLIMIT_NPROC,
    nix::sys::resource::Resource::RLIMIT_CPU,
    nix::sys::resource::Resource::RLIMIT_FSIZE,
    nix::sys::resource::Resource::RLIMIT_NOFILE,
];

/// `r`'s code in a [`PlanMessage`]; None: it cannot be sent (the caller
/// launches the serial way).
pub(crate) fn rlimit_code(r: nix::sys::resource::Resource) -> Option<u8> {
    RLIMITS.iter().position(|x| *x == r).map(|i| i as u8)
}

/// The resource behind a code of [`rlimit_code`].
pub(crate) fn rlimit_of(code: u8) -> Option<nix::sys::resource::Resource> {
    RLIMITS.get(code as usize).copied()
}

/// A seccomp program as the bytes a [`PlanMessage`] carries.
pub(crate) fn program_bytes(p: &seccompiler::BpfProgram) -> Vec<u8> {
    let mut out = Vec::with_capacity(p.len() * 8);
    for f in p {
        out.extend_from_slice(&f.code.to_ne_bytes());
        out.push(f.jt);
        out.push(f.jf);
        out.extend_from_slice(&f.k.to_ne_bytes());
    }
    out
}

/// The program back from [`program_bytes`]; None when the length is not
/// a whole number of instructions.
pub(crate) fn program_of(bytes: &[u8]) -> Option<seccompiler::BpfProgram> {
    if bytes.len() % 8 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8)
            .map(|c| seccompiler::sock_filter {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_process_steps_get_their_errno_text_and_init_details_stay_whole() {
        assert_eq!(
            setup_failure_text(SetupStage::Confine, libc::EPERM, "drop capabilities"),
            format!(
                "drop capabilities: {}",
                std::io::Error::from_raw_os_error(libc::EPERM)
            )
        );
        assert_eq!(
            setup_failure_text(SetupStage::Limits, libc::EINVAL, "set the limit RLIMIT_AS"),
            format!(
                "set the limit RLIMIT_AS: {}",
                std::io::Error::from_raw_os_error(libc::EINVAL)
            )
        );
        // The init formats its own (the errno is already in the text).
        let whole = "build the sandbox view: mount proc /proc: Operation not permitted";
        assert_eq!(
            setup_failure_text(SetupStage::Sandbox, libc::EPERM, whole),
            whole
        );
        // No errno: the step alone (Landlock not enforced, a ruleset error).
        assert_eq!(
            setup_failure_text(SetupStage::Confine, 0, "Landlock: x"),
            "Landlock: x"
        );
    }

    fn samples() -> Vec<InitMessage<'static>> {
        vec![
            InitMessage::SetupFailed {
                stage: SetupStage::Sandbox,
                errno: libc::EPERM,
                detail: "build the sandbox view: mount proc /proc: Operation not permitted",
            },
            InitMessage::SetupFailed {
                stage: SetupStage::Confine,
                errno: 0,
                detail: "",
            },
            InitMessage::Confined {
                landlock: Enforcement::Full,
                seccomp: Enforcement::Partial,
            },
            InitMessage::Confined {
                landlock: Enforcement::None,
                seccomp: Enforcement::None,
            },
            InitMessage::ExecFailed {
                errno: libc::ENOENT,
            },
            InitMessage::Exited {
                code: 137,
                signal: 9,
                max_rss_kb: 123_456,
                cpu_ms: i64::MAX,
            },
            InitMessage::Exited {
                code: -1,
                signal: 0,
                max_rss_kb: -5,
                cpu_ms: 0,
            },
            InitMessage::HostReplaced {
                path: "/ws/.git/config",
            },
            InitMessage::HostReplaced { path: "" },
            InitMessage::WatchFailed {
                detail: "moat cannot watch /ws: no inotify instance left",
            },
            InitMessage::WatchFailed { detail: "" },
        ]
    }

    fn encoded(msg: &InitMessage<'_>) -> Vec<u8> {
        let mut f = [0u8; MAX_FRAME];
        let n = msg.encode(&mut f);
        f[..n].to_vec()
    }

    #[test]
    fn every_message_round_trips_alone_and_in_a_stream() {
        let mut stream = Vec::new();
        for m in samples() {
            let bytes = encoded(&m);
            assert_eq!(
                InitMessage::decode(&bytes).unwrap(),
                Some((m, bytes.len())),
                "{m:?}"
            );
            stream.extend_from_slice(&bytes);
        }
        assert_eq!(decode_all(&stream, true).unwrap(), samples());
    }

    #[test]
    fn a_long_detail_is_cut_at_a_char_boundary_within_one_frame() {
        let long = "é".repeat(MAX_FRAME);
        let m = InitMessage::SetupFailed {
            stage: SetupStage::Fork,
            errno: 12,
            detail: &long,
        };
        let bytes = encoded(&m);
        assert!(bytes.len() <= MAX_FRAME);
        match InitMessage::decode(&bytes).unwrap() {
            Some((
                InitMessage::SetupFailed {
                    stage,
                    errno,
                    detail,
                },
                n,
            )) => {
                assert_eq!((stage, errno, n), (SetupStage::Fork, 12, bytes.len()));
                assert!(long.starts_with(detail) && detail.len() > MAX_FRAME - 16);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_truncation_waits_for_more_and_fails_at_eof() {
        for m in samples() {
            let bytes = encoded(&m);
            for cut in 1..bytes.len() {
                let part = &bytes[..cut];
                assert_eq!(InitMessage::decode(part).unwrap(), None, "{m:?} cut {cut}");
                assert_eq!(decode_all(part, false).unwrap(), vec![]);
                assert_eq!(decode_all(part, true), Err(DecodeError::Truncated(cut)));
            }
        }
    }

    #[test]
    fn garbage_is_an_error_never_skipped() {
        // The old text protocol's lines are not frames.
        assert!(decode_all(b"S 0 0 10 10\n", true).is_err());
        // Unknown tag.
        assert_eq!(
            InitMessage::decode(&[0, 0, 99]),
            Err(DecodeError::UnknownTag(99))
        );
        // A length no frame may have.
        assert_eq!(
            InitMessage::decode(&[0xff, 0xff, TAG_EXITED]),
            Err(DecodeError::TooLong(0xffff))
        );
        // A known tag with the wrong body length (too short and too long).
        assert!(matches!(
            InitMessage::decode(&[1, 0, TAG_CONFINED, b'F']),
            Err(DecodeError::BadLength { .. })
        ));
        assert!(matches!(
            InitMessage::decode(&[5, 0, TAG_EXEC_FAILED, 0, 0, 0, 0, 0]),
            Err(DecodeError::BadLength { .. })
        ));
        // A text length that disagrees with the frame's.
        assert!(matches!(
            InitMessage::decode(&[8, 0, TAG_SETUP_FAILED, 1, 0, 0, 0, 0, 2, 0, b'x']),
            Err(DecodeError::BadLength { .. })
        ));
        // Field values outside their range.
        assert_eq!(
            InitMessage::decode(&[2, 0, TAG_CONFINED, b'F', b'?']),
            Err(DecodeError::BadField {
                tag: TAG_CONFINED,
                value: b'?'
            })
        );
        assert!(matches!(
            InitMessage::decode(&[7, 0, TAG_SETUP_FAILED, 42, 0, 0, 0, 0, 0, 0]),
            Err(DecodeError::BadField { value: 42, .. })
        ));
        // Text that is not UTF-8.
        assert_eq!(
            InitMessage::decode(&[8, 0, TAG_SETUP_FAILED, 1, 0, 0, 0, 0, 1, 0, 0xff]),
            Err(DecodeError::BadText)
        );
        // A good frame followed by garbage: the garbage fails the stream.
        let mut s = encoded(&InitMessage::ExecFailed { errno: 2 });
        s.extend_from_slice(&[0, 0, 0]);
        assert_eq!(decode_all(&s, true), Err(DecodeError::UnknownTag(0)));
    }

    #[test]
    fn the_plan_message_carries_the_seccomp_program_and_rlimits_unchanged() {
        let prog: seccompiler::BpfProgram = vec![
            seccompiler::sock_filter {
                code: 0x20,
                jt: 0,
                jf: 0,
                k: 4,
            },
            seccompiler::sock_filter {
                code: 0x15,
                jt: 1,
                jf: 7,
                k: 0xc000_003e,
            },
        ];
        assert_eq!(program_of(&program_bytes(&prog)), Some(prog));
        assert_eq!(program_of(&[0; 7]), None);
        for r in RLIMITS {
            assert_eq!(rlimit_code(r).and_then(rlimit_of), Some(r));
        }
        assert_eq!(
            rlimit_code(nix::sys::resource::Resource::RLIMIT_STACK),
            None
        );
    }

    #[test]
    fn byte_strings_cross_as_hex_and_anything_else_is_refused() {
        let all: Vec<u8> = (0..=255).collect();
        let hex = hex_bytes::encode(&all);
        assert_eq!(hex.len(), 512);
        assert_eq!(hex_bytes::decode(&hex), Some(all));
        assert_eq!(hex_bytes::decode(""), Some(vec![]));
        for bad in ["0", "0g", "AB", " 00", "00 ", "\u{e9}0"] {
            assert_eq!(hex_bytes::decode(bad), None, "{bad:?}");
        }
    }

    /// The supervisor's borrowed message reads back whole; a frame that
    /// does not decode, or whose bytes are not hex, runs nothing.
    #[test]
    fn the_plan_message_reads_back_and_a_bad_one_is_refused() {
        let msg = PlanMessage {
            plan: &7u32,
            argv: vec![b"true".to_vec(), vec![0xff, b'\n']],
            envp: vec![b"PATH=/usr/bin".to_vec()],
            seccomp: Some(vec![0x20, 0, 0, 0, 4, 0, 0, 0]),
            rlimits: vec![(2, 1, 2)],
            pty: Some((true, false, true)),
            cwd_identity: Some((3, 4)),
            stdout: true,
            stderr: false,
            handoff: true,
        };
        let body = serde_json::to_vec(&msg).unwrap();
        let back: PlanMessage<u32> = serde_json::from_slice(&body).unwrap();
        assert_eq!(back.plan, 7);
        assert_eq!(back.argv, msg.argv);
        assert_eq!(back.envp, msg.envp);
        assert_eq!(back.seccomp, msg.seccomp);
        assert_eq!(back.rlimits, msg.rlimits);
        assert_eq!(back.pty, msg.pty);
        assert_eq!(back.cwd_identity, msg.cwd_identity);
        assert_eq!(
            (back.stdout, back.stderr, back.handoff),
            (true, false, true)
        );
        let text = String::from_utf8(body).unwrap();
        let odd = text.replace("\"74727565\"", "\"7472756\"");
        assert_ne!(odd, text);
        assert!(serde_json::from_str::<PlanMessage<u32>>(&odd).is_err());
        let numbers = text.replace("\"74727565\"", "[116,114,117,101]");
        assert!(serde_json::from_str::<PlanMessage<u32>>(&numbers).is_err());
    }

    /// An undecodable plan frame: `recv_plan` gives nothing to run, and
    /// the report pipe it came with says why.
    #[test]
    fn an_undecodable_plan_is_reported_on_the_pipe_it_brought() {
        use std::os::fd::{AsFd, AsRawFd};
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let (report_r, report_w) = nix::unistd::pipe().unwrap();
        crate::template::send_frame(ours.as_fd(), b"{\"plan\":", &[report_w.as_raw_fd()]).unwrap();
        drop(report_w);
        assert!(recv_plan(theirs.as_fd()).is_none());
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(report_r), &mut got).unwrap();
        match decode_all(&got, true).unwrap().as_slice() {
            [InitMessage::SetupFailed { stage, detail, .. }] => {
                assert_eq!(*stage, SetupStage::Sandbox);
                assert!(detail.contains("does not decode"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
    }
}
