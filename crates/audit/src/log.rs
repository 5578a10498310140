//! The append-only, hash-chained JSONL log: locked appends, verification,
//! and reading lines back.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::{DirBuilder, File};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// `prev` of the first line.
pub const GENESIS: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// First window read from the end of the log to find its last line; doubled
/// until the line fits.
const TAIL_WINDOW: u64 = 8 * 1024;

/// Errors of opening, appending to and reading the log.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("audit log {path}: cannot take the lock: {errno}")]
    Lock { path: PathBuf, errno: Errno },
    #[error("audit log {path}: {reason}; moat does not extend a damaged log (that would hide the damage): run `moat audit verify --log {path}` to see where it breaks, then move the file aside (keep it as evidence) and moat starts a new log")]
    Corrupt { path: PathBuf, reason: String },
    #[error("audit log {path} {reason}")]
    Unsafe { path: PathBuf, reason: String },
    #[error("audit log {path}: the append could not be verified: {reason}")]
    NotRecorded { path: PathBuf, reason: String },
    #[error("audit log {path}, line {line}: not a JSON event: {source}")]
    BadLine {
        path: PathBuf,
        line: u64,
        source: serde_json::Error,
    },
    #[error("an audit event must be a JSON object")]
    NotAnObject,
    #[error("cannot serialize an audit event: {0}")]
    Serialize(serde_json::Error),
}

/// Why [`verify`] failed: the first broken line (1-based) and what is wrong
/// with it, or the log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("broken at line {line}: {reason}")]
    Broken { line: u64, reason: String },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What an intact log holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyReport {
    pub lines: u64,
    pub executions: u64,
}

/// The log, open for appending. Appends from many processes (and threads
/// sharing one `AuditLog`) are serialized; none interleave or get lost.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    /// `path` with every symbolic link on the way resolved, as
    /// [`AuditLog::open`] resolved and checked it: the file it opened.
    resolved: PathBuf,
    file: File,
    /// `flock` excludes other open file descriptions, not threads sharing
    /// this one, so threads of one process also queue here. It holds the
    /// chain's head after this log's last append.
    in_process: Mutex<Option<Head>>,
}

/// The chain's state after an append of this [`AuditLog`], and the file as
/// it was right after it: while the file is unchanged since (the same
/// inode, length, mtime and ctime under the lock), the next append of this
/// log continues from here instead of reading the last line back. Any other
/// appender (another process, another `AuditLog`) grows the file, so the
/// next append reads the tail again. A head kept across an edit that left
/// all four alike (the same length within one tick of the clock the file
/// times come from) cannot hide it: the next lines would chain onto the
/// line the edit replaced, so [`verify`] still breaks at the edit.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Head {
    file: FileSig,
    prev: String,
    seq: u64,
}

/// What an append sees of the file under its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileSig {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileSig {
    fn of(meta: &std::fs::Metadata) -> FileSig {
        FileSig {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

impl AuditLog {
    /// Opens (creating it 0600, and missing parent directories 0700) the log
    /// at `path` for appending — only if no other user could have shaped it,
    /// in the spirit of ssh's `StrictModes`:
    ///
    /// - every directory on the way to it (resolved) belongs to this user or
    ///   root and is not writable by group or others, unless sticky (`/tmp`):
    ///   nobody else can swap a directory or plant the file;
    /// - the last component is opened with `O_NOFOLLOW` from its directory:
    ///   a symlink there is refused, never followed;
    /// - the file is a regular file of this user, not writable by group or
    ///   others (`/dev/full`, `/dev/null`, a FIFO are not logs).
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        let io = |source| AuditError::Io {
            path: path.to_path_buf(),
            source,
        };
        let unsafe_log = |reason: String| AuditError::Unsafe {
            path: path.to_path_buf(),
            reason,
        };
        let name = path
            .file_name()
            .ok_or_else(|| unsafe_log("names no file".into()))?;
        // Missing directories are created (0700) by the checked walk below,
        // one step at a time, never through a symlink it refused.
        let parent = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) => parent.to_path_buf(),
            None => PathBuf::from("."),
        };
        let parent = if parent.is_absolute() {
            parent
        } else {
            std::env::current_dir().map_err(io)?.join(parent)
        };
        let uid = nix::unistd::geteuid().as_raw();
        let parent = resolve_checked(&parent, uid).map_err(|e| match e {
            Checked::Io(source) => io(source),
            Checked::Unsafe(reason) => unsafe_log(reason),
        })?;
        let dir = File::open(&parent).map_err(io)?;
        // The directory actually opened passes too (it was not swapped).
        if let Some(reason) = unsafe_dir(&dir.metadata().map_err(io)?, uid) {
            return Err(unsafe_log(format!("{}: {reason}", parent.display())));
        }
        let flags = OFlag::O_RDWR
            | OFlag::O_APPEND
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        // Look before opening: opening a device or FIFO can have effects.
        match nix::sys::stat::fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFREG => {
                return Err(unsafe_log(not_regular(st.st_mode)));
            }
            Ok(_) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(io(e.into())),
        }
        let fd = nix::fcntl::openat(&dir, name, flags, Mode::from_bits_truncate(0o600))
            .map_err(|e| match e {
                Errno::ELOOP => unsafe_log(
                    "is a symbolic link; moat never follows one for its audit log (pass the real path)"
                        .into(),
                ),
                e => io(e.into()),
            })?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(io)?;
        if !meta.file_type().is_file() {
            return Err(unsafe_log(not_regular(meta.mode())));
        }
        if meta.uid() != uid {
            return Err(unsafe_log(format!(
                "belongs to uid {}, not to uid {uid} who runs moat",
                meta.uid()
            )));
        }
        if others_may_write(&meta, uid) {
            return Err(unsafe_log(format!(
                "is writable by group or others (mode {:o}); chmod 600 it",
                meta.mode() & 0o7777
            )));
        }
        Ok(AuditLog {
            path: path.to_path_buf(),
            resolved: parent.join(name),
            file,
            in_process: Mutex::new(None),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of the file opened, symbolic links resolved (the open
    /// walked and checked each directory on the way, and the file itself
    /// is never a link): what `realpath` would give, without walking it
    /// again.
    pub fn resolved_path(&self) -> &Path {
        &self.resolved
    }

    /// Whether this log's path still names the file it opened, and that
    /// file still passes [`AuditLog::open`]'s checks of the file itself (a
    /// regular file of this user that no one else may write): a caller
    /// that keeps the log open across runs (a service) opens it again when
    /// it was moved away (rotated), removed or replaced.
    pub fn still_at_its_path(&self) -> bool {
        let (Ok(named), Ok(held)) = (std::fs::symlink_metadata(&self.path), self.file.metadata())
        else {
            return false;
        };
        let uid = nix::unistd::geteuid().as_raw();
        named.file_type().is_file()
            && (named.dev(), named.ino()) == (held.dev(), held.ino())
            && held.uid() == uid
            && !others_may_write(&held, uid)
    }

    /// Appends `events` (JSON objects) in order as one locked write:
    /// `flock(LOCK_EX)`, read the last line from the file's tail for its
    /// hash and `seq`, give each event `seq` (previous + 1, from 1) and
    /// `prev` (`sha256:` of the previous line without its newline, or
    /// [`GENESIS`]), write all lines with one `write(2)`, unlock. The tail
    /// is not read when the file is exactly as this log's own last append
    /// left it (same inode, length, mtime and ctime: see [`Head`]); a
    /// long-lived service appends twice per execution.
    ///
    /// A log whose last line is incomplete or not an event is refused
    /// ([`AuditError::Corrupt`]) rather than extended. A failed write is
    /// rolled back (the file is cut back to its old length) so no partial
    /// line stays behind. A written batch is read back (the file's length,
    /// and the bytes written compared with the batch) before this returns
    /// `Ok`. There is no fsync: an event survives a crash of
    /// moat, not necessarily one of the machine.
    pub fn append(&self, events: &[Value]) -> Result<(), AuditError> {
        if events.is_empty() {
            return Ok(());
        }
        let io = |source| AuditError::Io {
            path: self.path.clone(),
            source,
        };
        let mut head = self
            .in_process
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let locked = lock_exclusive(self.file.try_clone().map_err(io)?, &self.path)?;
        let before = FileSig::of(&locked.metadata().map_err(io)?);
        let len = before.len;
        let (mut prev, mut seq) = match head.take() {
            Some(h) if h.file == before => (h.prev, h.seq),
            _ => last_line_state(&locked, len, &self.path)?,
        };

        let mut buf = Vec::with_capacity(events.len() * 512);
        for ev in events {
            let Value::Object(fields) = ev else {
                return Err(AuditError::NotAnObject);
            };
            seq += 1;
            let start = buf.len();
            let line = Chained {
                fields,
                seq,
                prev: &prev,
            };
            serde_json::to_writer(&mut buf, &line).map_err(AuditError::Serialize)?;
            prev = chain_hash(&buf[start..]);
            buf.push(b'\n');
        }

        if let Err(e) = write_all(&locked, &buf) {
            // Never leave half a line: cut back to where this append began.
            let _ = locked.set_len(len);
            return Err(io(e));
        }
        // Read it back: the file grew by exactly this batch and holds it
        // where it was written (a file that swallows writes records
        // nothing). The bytes are compared, not parsed: they are the
        // lines whose hashes were just computed.
        let not_recorded = |reason: String| AuditError::NotRecorded {
            path: self.path.clone(),
            reason,
        };
        let after = FileSig::of(&locked.metadata().map_err(io)?);
        let grown = after.len;
        if grown != len + buf.len() as u64 {
            return Err(not_recorded(format!(
                "the file is {grown} bytes after appending {} bytes to {len}",
                buf.len()
            )));
        }
        let mut back = vec![0u8; buf.len()];
        locked.read_exact_at(&mut back, len).map_err(io)?;
        if back != buf {
            return Err(not_recorded(format!(
                "the {} bytes read back at offset {len} are not the lines just written (seq {} to {seq})",
                buf.len(),
                seq + 1 - events.len() as u64
            )));
        }
        *head = Some(Head {
            file: after,
            prev,
            seq,
        });
        // Dropping `locked` unlocks (and closes the duplicate descriptor).
        Ok(())
    }
}

/// An event's line: its fields with `seq` and `prev` set (replacing any
/// the event had), keys in order — the bytes of the event's map with the
/// two inserted, without copying the event (a run's start holds the whole
/// policy).
struct Chained<'a> {
    fields: &'a serde_json::Map<String, Value>,
    seq: u64,
    prev: &'a str,
}

impl serde::Serialize for Chained<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let extra = |k: &str| k == "prev" || k == "seq";
        let len = self.fields.keys().filter(|k| !extra(k)).count() + 2;
        let mut map = s.serialize_map(Some(len))?;
        // "prev" < "seq": each goes before the first key greater than it.
        let mut pending: [Option<(&str, Value)>; 2] = [
            Some(("prev", Value::from(self.prev))),
            Some(("seq", Value::from(self.seq))),
        ];
        for (k, v) in self.fields.iter().filter(|(k, _)| !extra(k)) {
            for slot in pending.iter_mut() {
                if slot.as_ref().is_some_and(|(name, _)| *name < k.as_str()) {
                    if let Some((name, value)) = slot.take() {
                        map.serialize_entry(name, &value)?;
                    }
                }
            }
            map.serialize_entry(k, v)?;
        }
        for (name, value) in pending.into_iter().flatten() {
            map.serialize_entry(name, &value)?;
        }
        map.end()
    }
}

/// Why a directory on the way to the log could let someone else shape it.
fn unsafe_dir(meta: &std::fs::Metadata, uid: u32) -> Option<String> {
    if meta.uid() != uid && meta.uid() != 0 {
        return Some(format!(
            "belongs to uid {}, neither to uid {uid} who runs moat nor to root; keep the audit log in a directory of your own",
            meta.uid()
        ));
    }
    let sticky = meta.mode() & 0o1000 != 0;
    if others_may_write(meta, uid) && !sticky {
        return Some(format!(
            "is writable by others, or by a group shared with other users, without the sticky bit (mode {:o}); chmod go-w it or keep the log elsewhere",
            meta.mode() & 0o7777
        ));
    }
    None
}

/// Whether anyone but `uid` (and root) may write `meta`'s object: it is
/// world-writable, or group-writable by a group that is not `uid`'s private
/// group (as Debian's ssh allows: with the user-private-group umask 002,
/// `~/.local` is 0775 and only its owner is in its group).
fn others_may_write(meta: &std::fs::Metadata, uid: u32) -> bool {
    meta.mode() & 0o002 != 0 || (meta.mode() & 0o020 != 0 && !group_is_private(meta.gid(), uid))
}

/// `gid` is the primary group of `uid` alone and lists no other member.
fn group_is_private(gid: u32, uid: u32) -> bool {
    let (Ok(passwd), Ok(group)) = (
        std::fs::read_to_string("/etc/passwd"),
        std::fs::read_to_string("/etc/group"),
    ) else {
        return false;
    };
    let mut name = None;
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        let (Some(u), Some(g)) = (
            f.get(2).and_then(|v| v.parse::<u32>().ok()),
            f.get(3).and_then(|v| v.parse::<u32>().ok()),
        ) else {
            continue;
        };
        if u == uid {
            name = f.first().copied();
        }
        if g == gid && u != uid {
            return false; // another account's primary group
        }
    }
    let Some(name) = name else { return false };
    group.lines().any(|line| {
        let f: Vec<&str> = line.split(':').collect();
        f.get(2).and_then(|v| v.parse::<u32>().ok()) == Some(gid)
            && f.first() == Some(&name)
            && f.get(3)
                .is_none_or(|m| m.split(',').all(|m| m.is_empty() || m == name))
    })
}

enum Checked {
    Io(std::io::Error),
    Unsafe(String),
}

/// Most symlinks followed while resolving the log's directory (as the
/// kernel's own limit).
const MAX_SYMLINKS: usize = 40;

/// Resolves the absolute directory `dir` like realpath(3), creating missing
/// directories (0700) on the way, and checking every step: each directory passed through must pass [`unsafe_dir`], and each
/// symlink followed must belong to `uid` or root — a symlink another user
/// planted (`/tmp/logs -> /etc/cron.d`) is refused, not followed.
fn resolve_checked(dir: &Path, uid: u32) -> Result<PathBuf, Checked> {
    use std::ffi::OsString;
    use std::path::Component;
    let push_all = |todo: &mut Vec<OsString>, p: &Path| {
        for c in p.components().rev() {
            match c {
                Component::Normal(n) => todo.push(n.to_os_string()),
                Component::ParentDir => todo.push("..".into()),
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
    };
    let check = |path: &Path, meta: &std::fs::Metadata| match unsafe_dir(meta, uid) {
        Some(reason) => Err(Checked::Unsafe(format!("{}: {reason}", path.display()))),
        None => Ok(()),
    };
    let mut cur = PathBuf::from("/");
    check(&cur, &std::fs::metadata(&cur).map_err(Checked::Io)?)?;
    let mut todo = Vec::new();
    push_all(&mut todo, dir);
    let mut hops = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&name);
        let meta = match std::fs::symlink_metadata(&next) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Create it here, in a directory already checked.
                match DirBuilder::new().mode(0o700).create(&next) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(Checked::Io(e)),
                }
                std::fs::symlink_metadata(&next).map_err(Checked::Io)?
            }
            other => other.map_err(Checked::Io)?,
        };
        if meta.file_type().is_symlink() {
            if meta.uid() != uid && meta.uid() != 0 {
                return Err(Checked::Unsafe(format!(
                    "{}: a symlink of uid {}, neither of uid {uid} who runs moat nor of root; moat does not follow it",
                    next.display(),
                    meta.uid()
                )));
            }
            hops += 1;
            if hops > MAX_SYMLINKS {
                return Err(Checked::Io(std::io::Error::from_raw_os_error(
                    Errno::ELOOP as i32,
                )));
            }
            let target = std::fs::read_link(&next).map_err(Checked::Io)?;
            if target.is_absolute() {
                cur = PathBuf::from("/");
            }
            push_all(&mut todo, &target);
            continue;
        }
        if !meta.is_dir() {
            return Err(Checked::Io(std::io::Error::from_raw_os_error(
                Errno::ENOTDIR as i32,
            )));
        }
        check(&next, &meta)?;
        cur = next;
    }
    Ok(cur)
}

fn not_regular(mode: u32) -> String {
    let kind = match mode & nix::libc::S_IFMT {
        0o020000 => "a character device",
        0o060000 => "a block device",
        0o010000 => "a FIFO",
        0o140000 => "a socket",
        0o040000 => "a directory",
        0o120000 => {
            "a symbolic link; moat never follows one for its audit log (pass the real path)"
        }
        _ => "not a regular file",
    };
    format!("is {kind}, not a regular file: a run must be recorded in a file that keeps it")
}

fn lock_exclusive(file: File, path: &Path) -> Result<Flock<File>, AuditError> {
    let mut file = file;
    loop {
        match Flock::lock(file, FlockArg::LockExclusive) {
            Ok(locked) => return Ok(locked),
            Err((back, Errno::EINTR)) => file = back,
            Err((_, errno)) => {
                return Err(AuditError::Lock {
                    path: path.to_path_buf(),
                    errno,
                })
            }
        }
    }
}

/// One `write(2)` for the whole batch in practice; loops only on a short
/// write (a full disk), still under the lock.
fn write_all(mut file: &File, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match file.write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `sha256:<hex>` of one line's bytes (without its newline).
pub(crate) fn chain_hash(line: &[u8]) -> String {
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    s.push_str(&hex(&Sha256::digest(line)));
    s
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

#[derive(Deserialize)]
struct SeqOnly {
    seq: u64,
}

/// The chain state after the log's last line: its hash and `seq`, read from
/// the end of the file only.
fn last_line_state(file: &File, len: u64, path: &Path) -> Result<(String, u64), AuditError> {
    if len == 0 {
        return Ok((GENESIS.to_owned(), 0));
    }
    let corrupt = |reason: String| AuditError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let mut window = TAIL_WINDOW.min(len);
    loop {
        let start = len - window;
        let mut buf = vec![0u8; usize::try_from(window).unwrap_or(usize::MAX)];
        file.read_exact_at(&mut buf, start)
            .map_err(|source| AuditError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        if buf.last() != Some(&b'\n') {
            return Err(corrupt(
                "its last line is incomplete (no trailing newline)".into(),
            ));
        }
        let body = &buf[..buf.len() - 1];
        let line = match body.iter().rposition(|&b| b == b'\n') {
            Some(i) => &body[i + 1..],
            None if start == 0 => body,
            None => {
                window = (window * 4).min(len);
                continue;
            }
        };
        let seq = serde_json::from_slice::<SeqOnly>(line)
            .map_err(|e| corrupt(format!("its last line is not an event with a seq: {e}")))?
            .seq;
        return Ok((chain_hash(line), seq));
    }
}

#[derive(Deserialize)]
struct ChainFields<'a> {
    seq: u64,
    #[serde(borrow)]
    prev: Cow<'a, str>,
    #[serde(borrow, default)]
    execution_id: Option<Cow<'a, str>>,
}

/// Checks that every line is a JSON event, that `seq` runs 1, 2, 3, … and
/// that each `prev` is the sha256 of the line before (the first: [`GENESIS`]).
///
/// Which line is named: an edit inside a line that keeps it valid JSON and
/// leaves its `seq`/`prev` alone is reported at the NEXT line (whose `prev`
/// no longer matches); an edit that breaks the JSON or touches `seq`/`prev`
/// is reported at the edited line itself. A deleted or moved line is
/// reported where `seq` first skips or goes back. A cut-off last line is
/// reported as truncated. Removing whole lines from the END cannot be told
/// from a shorter log by a chain alone (compare `lines` with a count kept
/// elsewhere), nor can a rewrite that recomputes every later hash.
pub fn verify(path: &Path) -> Result<VerifyReport, VerifyError> {
    let io = |source| VerifyError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut raw = Vec::with_capacity(4096);
    let mut expected_prev = GENESIS.to_owned();
    let mut executions: HashSet<String> = HashSet::new();
    let mut line_no: u64 = 0;
    loop {
        raw.clear();
        if reader.read_until(b'\n', &mut raw).map_err(io)? == 0 {
            break;
        }
        line_no += 1;
        let broken = |reason: String| VerifyError::Broken {
            line: line_no,
            reason,
        };
        let Some(body) = raw.strip_suffix(b"\n") else {
            return Err(broken(if serde_json::from_slice::<Value>(&raw).is_ok() {
                "the last line has no newline (the file was truncated)".into()
            } else {
                "the last line is cut off (the file was truncated)".into()
            }));
        };
        if body.is_empty() {
            return Err(broken(
                "empty line (a line was blanked or a newline inserted)".into(),
            ));
        }
        let fields: ChainFields = serde_json::from_slice(body)
            .map_err(|e| broken(format!("not a valid JSON event (edited or damaged): {e}")))?;
        if fields.seq != line_no {
            let previous = line_no - 1;
            let reason = if fields.seq > line_no {
                format!("seq {} follows seq {previous}: a line is missing (deleted) or lines are out of order", fields.seq)
            } else {
                format!(
                    "seq {} follows seq {previous}: lines were reordered, duplicated or edited",
                    fields.seq
                )
            };
            return Err(broken(reason));
        }
        if fields.prev != expected_prev {
            return Err(broken(if line_no == 1 {
                "prev of the first line is not the genesis hash (lines were removed from the start or it was edited)"
                    .into()
            } else {
                format!(
                    "prev does not match the sha256 of line {}: line {} was edited (or this line's prev was)",
                    line_no - 1,
                    line_no - 1
                )
            }));
        }
        if let Some(id) = fields.execution_id {
            if !executions.contains(id.as_ref()) {
                executions.insert(id.into_owned());
            }
        }
        expected_prev = chain_hash(body);
    }
    Ok(VerifyReport {
        lines: line_no,
        executions: executions.len() as u64,
    })
}

/// Every event of the log, in order. A line that is not JSON is an error
/// naming it.
pub fn read_events(path: &Path) -> Result<Vec<Value>, AuditError> {
    let io = |source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    };
    let reader = BufReader::with_capacity(1 << 20, File::open(path).map_err(io)?);
    let mut events = Vec::new();
    for (i, line) in reader.split(b'\n').enumerate() {
        let line = line.map_err(io)?;
        if line.is_empty() {
            continue;
        }
        let value = serde_json::from_slice(&line).map_err(|source| AuditError::BadLine {
            path: path.to_path_buf(),
            line: i as u64 + 1,
            source,
        })?;
        events.push(value);
    }
    Ok(events)
}

/// The last `n` complete lines of the log (without newlines), read from its
/// end, and the byte offset just after the last complete line (where
/// [`lines_from`] continues for `--follow`).
pub fn tail_lines(path: &Path, n: usize) -> Result<(Vec<String>, u64), AuditError> {
    let io = |source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut window = TAIL_WINDOW.min(len);
    loop {
        let start = len - window;
        let mut buf = vec![0u8; usize::try_from(window).unwrap_or(usize::MAX)];
        file.read_exact_at(&mut buf, start).map_err(io)?;
        // Only complete lines count; a fragment being written is left for later.
        let complete = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let end = start + complete as u64;
        let body = &buf[..complete];
        let newlines = body.iter().filter(|&&b| b == b'\n').count();
        // Enough lines when the window holds n + 1 newlines (the first line may
        // be partial) or reaches the start of the file.
        if newlines > n || start == 0 {
            let mut lines: Vec<String> = body
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| String::from_utf8_lossy(l).into_owned())
                .collect();
            if start > 0 && !lines.is_empty() {
                lines.remove(0); // partial first line of the window
            }
            let skip = lines.len().saturating_sub(n);
            return Ok((lines.split_off(skip), end));
        }
        window = (window * 4).min(len);
    }
}

/// Complete lines written at or after byte `offset`, and the offset after
/// the last of them. If the file became shorter than `offset` (replaced or
/// truncated), reading restarts at 0.
pub fn lines_from(path: &Path, offset: u64) -> Result<(Vec<String>, u64), AuditError> {
    let io = |source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let offset = if len < offset { 0 } else { offset };
    file.seek(SeekFrom::Start(offset)).map_err(io)?;
    let mut buf = Vec::new();
    file.take(len - offset).read_to_end(&mut buf).map_err(io)?;
    let complete = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let lines = buf[..complete]
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect();
    Ok((lines, offset + complete as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line is byte for byte the event's map with `seq` and `prev`
    /// inserted, wherever the two sort among the keys and when the event
    /// already has them.
    #[test]
    fn a_chained_line_is_the_map_with_seq_and_prev_inserted() {
        let events = [
            serde_json::json!({}),
            serde_json::json!({"a": 1}),
            serde_json::json!({"z": [1, {"b": null}]}),
            serde_json::json!({"prev": "forged", "seq": 99, "q": "x"}),
            serde_json::json!({"p": 1, "pz": 2, "prev0": 3, "r": 4, "sa": 5, "seq0": 6, "t": 7}),
            serde_json::json!({"execution_id": "e", "policy": {"paths": ["/a", "/b"]}, "type": "policy.resolved"}),
        ];
        for ev in events {
            let Value::Object(fields) = &ev else {
                unreachable!()
            };
            let mut old = fields.clone();
            old.insert("seq".into(), Value::from(7u64));
            old.insert("prev".into(), Value::String(GENESIS.into()));
            let want = serde_json::to_vec(&old).unwrap();
            let got = serde_json::to_vec(&Chained {
                fields,
                seq: 7,
                prev: GENESIS,
            })
            .unwrap();
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap()
            );
        }
    }

    #[test]
    fn hex_and_hash() {
        assert_eq!(hex(&[0, 15, 255]), "000fff");
        assert_eq!(
            chain_hash(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(GENESIS.len(), chain_hash(b"x").len());
    }

    /// The path the open resolved is the file's canonical path (the probe
    /// hides the log from the command by it), through a symlinked
    /// directory and a `..`.
    #[test]
    fn the_resolved_path_is_the_canonical_one() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let real = tmp.path().join("real");
        std::fs::create_dir_all(real.join("sub")).expect("mkdir");
        std::os::unix::fs::symlink(&real, tmp.path().join("via")).expect("symlink");
        let named = tmp.path().join("via/sub/../a.jsonl");
        let log = AuditLog::open(&named).expect("open");
        assert_eq!(log.path(), named);
        let canonical = std::fs::canonicalize(&named).expect("canonicalize");
        assert_eq!(
            canonical,
            std::fs::canonicalize(real.join("a.jsonl")).unwrap()
        );
        assert_eq!(log.resolved_path(), canonical);
    }

    #[test]
    fn open_refuses_what_others_could_shape() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let target = tmp.path().join("victim");
        std::fs::write(&target, "x\n").expect("write");
        let link = tmp.path().join("link.jsonl");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let err = AuditLog::open(&link).expect_err("a symlink is refused");
        assert!(err.to_string().contains("symbolic link"), "{err}");

        let open = tmp.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = AuditLog::open(&open.join("a.jsonl")).expect_err("world-writable dir");
        assert!(err.to_string().contains("sticky"), "{err}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        AuditLog::open(&open.join("a.jsonl")).expect("sticky dir is fine");

        let loose = tmp.path().join("loose.jsonl");
        std::fs::write(&loose, "").expect("write");
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let err = AuditLog::open(&loose).expect_err("world-writable log");
        assert!(err.to_string().contains("chmod 600"), "{err}");

        for dev in ["/dev/null", "/dev/full"] {
            let err = AuditLog::open(Path::new(dev)).expect_err("device");
            assert!(err.to_string().contains("character device"), "{err}");
        }
        assert_eq!(
            std::fs::read_to_string(&target).ok().as_deref(),
            Some("x\n")
        );
    }

    #[test]
    fn append_refuses_a_log_without_final_newline() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("audit.jsonl");
        let log = AuditLog::open(&path).expect("open");
        log.append(&[serde_json::json!({"type": "a"})])
            .expect("append");
        let text = std::fs::read_to_string(&path).expect("read");
        std::fs::write(&path, text.trim_end()).expect("cut newline");
        let err = log
            .append(&[serde_json::json!({"type": "b"})])
            .expect_err("refused");
        let msg = err.to_string();
        assert!(
            msg.contains("moat audit verify") && msg.contains("move the file aside"),
            "{msg}"
        );
        assert_eq!(
            std::fs::read_to_string(&path).ok().as_deref(),
            Some(text.trim_end())
        );
    }
}
