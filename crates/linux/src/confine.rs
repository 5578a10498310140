//! The last steps before exec, in the command's own process: drop every
//! capability, set no_new_privs, enter the Landlock domain, install the
//! seccomp floor. Order matters and is fixed here:
//! caps first (nothing after needs them), no_new_privs before Landlock and
//! seccomp (both require it for an unprivileged caller), seccomp last (it
//! forbids syscalls the earlier steps make). What needs memory — the
//! Landlock ruleset with its rules, the seccomp program, the highest
//! capability number — is prepared by the init before it starts the
//! command's process, which shares the init's memory until exec and so
//! only makes syscalls ([`drop_privileges`], [`enter_landlock`],
//! [`enter_seccomp`] allocate nothing and report a [`StepFailed`]).

use std::collections::BTreeMap;
use std::io;

use landlock::{
    Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use serde::Serialize;

use crate::plan::{LandlockSpec, SeccompSpec};
use crate::sys;

mod tree;

/// How much of a layer the kernel enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    Full,
    Partial,
    None,
}

impl Enforcement {
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Full => "full",
            Enforcement::Partial => "partial",
            Enforcement::None => "none",
        }
    }
    pub fn code(self) -> u8 {
        match self {
            Enforcement::Full => b'F',
            Enforcement::Partial => b'P',
            Enforcement::None => b'N',
        }
    }
    pub fn from_code(c: u8) -> Enforcement {
        match c {
            b'F' => Enforcement::Full,
            b'P' => Enforcement::Partial,
            _ => Enforcement::None,
        }
    }
}

/// A confinement step that failed; the command never runs after one.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("drop capabilities: {0}")]
    Capabilities(io::Error),
    #[error("set no_new_privs: {0}")]
    NoNewPrivs(io::Error),
    #[error("Landlock: {0}")]
    Landlock(String),
    #[error("{}", LANDLOCK_NOT_ENFORCED)]
    LandlockNotEnforced,
    #[error("seccomp: {0}")]
    Seccomp(String),
    /// A step of [`StepFailed`], with its errno's text.
    #[error("{0}")]
    Step(String),
}

/// The newest Landlock ABI moat has been tested with; newer kernels are used
/// at this level (the compatibility contract keeps it meaningful).
const TESTED_ABI: ABI = ABI::V6;

fn abi_of(n: i32) -> ABI {
    if n >= 6 {
        TESTED_ABI
    } else {
        ABI::from(n)
    }
}

const LANDLOCK_NOT_ENFORCED: &str =
    "Landlock is not enforced by this kernel; refusing to run with less than the policy promised";

/// A step of the command's confinement that failed, said without
/// allocating (the command's process shares the init's memory): the step,
/// and the errno behind it (0: none), which the supervisor renders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepFailed {
    pub step: &'static str,
    pub errno: i32,
}

impl StepFailed {
    fn io(step: &'static str, e: &io::Error) -> StepFailed {
        StepFailed {
            step,
            errno: e.raw_os_error().unwrap_or(0),
        }
    }
}

impl From<StepFailed> for ConfineError {
    fn from(f: StepFailed) -> ConfineError {
        ConfineError::Step(crate::init_msg::setup_failure_text(
            crate::init_msg::SetupStage::Confine,
            f.errno,
            f.step,
        ))
    }
}

/// Drops capabilities (up to `last_cap`, [`sys::last_cap`]) and sets
/// no_new_privs. Allocates nothing.
pub fn drop_privileges(last_cap: libc::c_ulong) -> Result<(), StepFailed> {
    sys::drop_all_capabilities(last_cap).map_err(|e| StepFailed::io("drop capabilities", &e))?;
    sys::set_no_new_privs().map_err(|e| StepFailed::io("set no_new_privs", &e))
}

/// Enters the Landlock domain of `ruleset` ([`landlock_ruleset`]); returns
/// how fully it is enforced. Allocates nothing: the domain is entered
/// through a duplicate of the ruleset's fd, so `ruleset` stays the init's.
pub fn enter_landlock(ruleset: &landlock::RulesetCreated) -> Result<Enforcement, StepFailed> {
    let own = ruleset
        .try_clone()
        .map_err(|e| StepFailed::io("Landlock: duplicate the ruleset", &e))?;
    let status = own.restrict_self().map_err(|e| StepFailed {
        step: "Landlock: enter the domain",
        errno: os_errno_of(&e),
    })?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(Enforcement::Full),
        RulesetStatus::PartiallyEnforced => Ok(Enforcement::Partial),
        RulesetStatus::NotEnforced => Err(StepFailed {
            step: LANDLOCK_NOT_ENFORCED,
            errno: 0,
        }),
    }
}

/// The errno at the root of an error chain (0: none), found without allocating.
fn os_errno_of(e: &(dyn std::error::Error + 'static)) -> i32 {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(code) = err
            .downcast_ref::<io::Error>()
            .and_then(|i| i.raw_os_error())
        {
            return code;
        }
        cur = err.source();
    }
    0
}

/// Enters a Landlock domain matching `spec` in a process that may allocate
/// ([`landlock_ruleset`] for its own stdio, then [`enter_landlock`]);
/// returns how fully it is enforced.
pub fn apply_landlock(spec: &LandlockSpec, kernel_abi: i32) -> Result<Enforcement, ConfineError> {
    let ruleset = landlock_ruleset(spec, kernel_abi, [0, 1, 2])?;
    enter_landlock(&ruleset).map_err(|f| match f.errno {
        0 if f.step == LANDLOCK_NOT_ENFORCED => ConfineError::LandlockNotEnforced,
        _ => ConfineError::from(f),
    })
}

/// The Landlock ruleset matching `spec`, created but not entered.
/// `stdio[i]` is the fd the command will have as its fd `i` (the pty's
/// slave where it gets one): the files behind those are granted as opened
/// (see [`stdio_reopen_rights`]).
pub fn landlock_ruleset(
    spec: &LandlockSpec,
    kernel_abi: i32,
    stdio: [std::os::fd::RawFd; 3],
) -> Result<landlock::RulesetCreated, ConfineError> {
    let abi = abi_of(kernel_abi);
    let ll = |e: landlock::RulesetError| ConfineError::Landlock(e.to_string());
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let dev = AccessFs::ReadFile
        | AccessFs::WriteFile
        | AccessFs::Truncate
        | AccessFs::IoctlDev
        | AccessFs::ReadDir;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(ll)?;
    if spec.scoped {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(ll)?;
    }
    if spec.deny_tcp_bind {
        // Handled with no rule: every TCP bind is refused.
        ruleset = ruleset
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(landlock::AccessNet::BindTcp)
            .map_err(ll)?
            .set_compatibility(CompatLevel::BestEffort);
    }
    let mut created = ruleset.create().map_err(ll)?;
    // Merge rights per path: Landlock ORs rules on the same inode anyway, but
    // one rule per path keeps failures attributable.
    let mut rules: BTreeMap<&std::path::Path, landlock::BitFlags<AccessFs>> = BTreeMap::new();
    for p in &spec.list_only {
        *rules.entry(p).or_default() |= AccessFs::ReadDir;
    }
    for p in &spec.read {
        *rules.entry(p).or_default() |= read;
    }
    for p in &spec.write {
        *rules.entry(p).or_default() |= all;
    }
    for p in &spec.devices {
        *rules.entry(p).or_default() |= dev & all;
    }
    for (path, access) in rules {
        // A rule on a file (a bound binary, a --ro file) may only carry
        // file rights; directory rights there would make the kernel refuse
        // the rule and the crate report the ruleset as partial.
        let access = if path.is_dir() {
            access
        } else {
            access & AccessFs::from_file(abi)
        };
        if spec.host_paths {
            // No symlink anywhere on the way (the paths are canonical; a
            // symlink now was swapped in since they were listed).
            match sys::open_path_nofollow(libc::AT_FDCWD, path) {
                Ok(fd) if fd_is_symlink(&fd) => continue,
                Ok(fd) => {
                    // Whether it is a directory, from what was opened.
                    let is_dir = nix::sys::stat::fstat(&fd)
                        .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
                        .unwrap_or(false);
                    let access = if is_dir {
                        access
                    } else {
                        access & AccessFs::from_file(abi)
                    };
                    created = created.add_rule(PathBeneath::new(fd, access)).map_err(ll)?;
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR | libc::EXDEV)
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(ConfineError::Landlock(format!("{}: {e}", path.display()))),
            }
            continue;
        }
        let fd = PathFd::new(path)
            .map_err(|e| ConfineError::Landlock(format!("{}: {e}", path.display())))?;
        created = created.add_rule(PathBeneath::new(fd, access)).map_err(ll)?;
    }
    // The command's own stdin/stdout/stderr may be host files (a redirect
    // by the caller) that lie outside every rule above; `cat /dev/stdin`
    // and `echo > /dev/stderr` reopen them by path. Grant exactly those
    // files, with the access the caller opened them with — no more.
    for (fd, access) in stdio_reopen_rights(abi, stdio) {
        created = created.add_rule(PathBeneath::new(fd, access)).map_err(ll)?;
    }
    Ok(created)
}

/// The O_PATH handle refers to a symlink itself (O_NOFOLLOW on the last component).
fn fd_is_symlink(fd: &std::os::fd::OwnedFd) -> bool {
    nix::sys::stat::fstat(fd)
        .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
        .unwrap_or(true)
}

/// For each of the command's fds 0–2 (`stdio[i]` is the fd here that will
/// be its fd `i`) that is a file or device (not a pipe or socket, which
/// Landlock does not govern): an O_PATH handle to it and the rights
/// matching its open mode.
fn stdio_reopen_rights(
    abi: ABI,
    stdio: [std::os::fd::RawFd; 3],
) -> Vec<(PathFd, landlock::BitFlags<AccessFs>)> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    use nix::sys::stat::{fstat, SFlag};
    let mut out = Vec::new();
    for fd in stdio {
        let Some(b) = sys::borrow_stdio(fd) else {
            continue;
        };
        let Ok(st) = fstat(b) else { continue };
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        let is_dev = kind == SFlag::S_IFCHR || kind == SFlag::S_IFBLK;
        if kind != SFlag::S_IFREG && !is_dev {
            continue;
        }
        let Ok(flags) = fcntl(b, FcntlArg::F_GETFL) else {
            continue;
        };
        let mode = OFlag::from_bits_truncate(flags) & OFlag::O_ACCMODE;
        let mut access = landlock::BitFlags::<AccessFs>::empty();
        if mode == OFlag::O_RDONLY || mode == OFlag::O_RDWR {
            access |= AccessFs::ReadFile;
        }
        if mode == OFlag::O_WRONLY || mode == OFlag::O_RDWR {
            access |= AccessFs::WriteFile;
            // A file given in append mode (`>> log`) must not be truncated.
            if !OFlag::from_bits_truncate(flags).contains(OFlag::O_APPEND) {
                access |= AccessFs::Truncate;
            }
        }
        if is_dev {
            access |= AccessFs::IoctlDev;
        }
        access &= AccessFs::from_all(abi);
        if let Ok(p) = PathFd::new(format!("/proc/self/fd/{fd}")) {
            out.push((p, access));
        }
    }
    out
}

/// open_tree_attr(2), Linux 6.15: open_tree with new mount attributes (the
/// libc crate has no constant yet). Syscalls added since 424 share one
/// number on every architecture.
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// The highest syscall number of the kernel's table (x86_64; the numbers
/// from 424 on are common to all architectures) whose syscalls were
/// reviewed for the floor: Linux 6.18 ends at 469 (file_setattr). A test
/// probes the running kernel above this number and fails when it finds a
/// syscall nobody reviewed; review it (add it to the floor or decide it is
/// harmless), then raise this number.
///
/// Reviewed and allowed since 424: pidfd_*, clone3 (the ABI guard refuses
/// namespace flags), close_range, openat2, faccessat2, process_madvise (own
/// processes only), epoll_pwait2, quotactl_fd, memfd_secret,
/// process_mrelease, futex_*, set_mempolicy_home_node, cachestat,
/// fchmodat2 (a set-id mode refused, as chmod's: [`SETID_MODE_SYSCALLS`]),
/// map_shadow_stack, statmount/listmount (mounts of the
/// sandbox's own namespace), lsm_*_self_attr, lsm_list_modules, mseal,
/// {set,get,list,remove}xattrat (same rights as *xattr), file_getattr /
/// file_setattr (same rights as the FS_IOC_FS[GS]ETXATTR ioctls).
/// Refused: the mount API (open_tree, move_mount, fs*, mount_setattr,
/// open_tree_attr), landlock_* (the domain is final), pidfd_getfd.
pub const FLOOR_REVIEWED_UP_TO: i64 = 469;
const _: () = assert!(FLOOR_REVIEWED_UP_TO >= SYS_OPEN_TREE_ATTR);

/// The seccomp floor: syscalls every sandboxed command is refused (EPERM).
/// The plan carries it as data (golden tests pin it); [`seccomp_filter`]
/// builds the filter from the plan.
pub const SECCOMP_FLOOR: &[(&str, i64)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("open_tree_attr", SYS_OPEN_TREE_ATTR),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("setns", libc::SYS_setns),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("chroot", libc::SYS_chroot),
    ("acct", libc::SYS_acct),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("quotactl", libc::SYS_quotactl),
    ("syslog", libc::SYS_syslog),
    ("personality", libc::SYS_personality),
    ("landlock_create_ruleset", libc::SYS_landlock_create_ruleset),
    ("landlock_add_rule", libc::SYS_landlock_add_rule),
    ("landlock_restrict_self", libc::SYS_landlock_restrict_self),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("kcmp", libc::SYS_kcmp),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("fanotify_init", libc::SYS_fanotify_init),
    ("vhangup", libc::SYS_vhangup),
];

/// ioctl requests refused: terminal injection (TIOCSTI pushes bytes into the
/// host terminal's input; TIOCLINUX can read/paste the console selection),
/// and TIOCSETD, which switches a terminal's line discipline: every run
/// with a terminal now has a pty, and exotic disciplines (n_gsm, n_hdlc,
/// autoloaded as modules) are a record of kernel exploits; only modem and
/// serial-line tools use it.
pub const DENIED_IOCTLS: &[(&str, u64)] = &[
    ("TIOCSTI", libc::TIOCSTI),
    ("TIOCLINUX", libc::TIOCLINUX),
    ("TIOCSETD", libc::TIOCSETD),
];

/// Set-user-ID and set-group-ID mode bits. The command owns what it writes
/// and may set its own files' modes; a set-id program left in the workspace
/// or a writable grant would run as the caller (root, when root ran moat)
/// for whoever on the host executes it. So every syscall that sets a mode
/// is refused (EPERM) when its mode carries either bit. Without
/// `CAP_FSETID` (the command has no capability) writing, truncating or
/// extending a file clears the bits, so what `openat2` (whose mode is
/// behind a pointer seccomp cannot read) could still make is an empty file.
pub const SETID_BITS: u32 = libc::S_ISUID | libc::S_ISGID;

/// The syscalls refused a mode carrying [`SETID_BITS`]: name, number, and
/// which argument is the mode.
pub const SETID_MODE_SYSCALLS: &[(&str, i64, u8)] = &[
    #[cfg(target_arch = "x86_64")]
    ("chmod", libc::SYS_chmod, 1),
    ("fchmod", libc::SYS_fchmod, 1),
    ("fchmodat", libc::SYS_fchmodat, 2),
    ("fchmodat2", SYS_FCHMODAT2, 2),
    #[cfg(target_arch = "x86_64")]
    ("creat", libc::SYS_creat, 1),
    #[cfg(target_arch = "x86_64")]
    ("open", libc::SYS_open, 2),
    ("openat", libc::SYS_openat, 3),
    #[cfg(target_arch = "x86_64")]
    ("mknod", libc::SYS_mknod, 1),
    ("mknodat", libc::SYS_mknodat, 2),
];
const SYS_FCHMODAT2: i64 = 452;

/// Refuses `nr` always, whatever conditions it had.
fn refuse_always(rules: &mut tree::Rules, nr: i64) {
    rules.insert(nr, Vec::new());
}

/// Refuses `nr` also when `conds` all hold. An empty list means "always
/// refused": adding a rule to it would narrow the refusal to that rule
/// (a net class's families once opened every other family on the
/// Landlock backend, where `socket` is refused outright), so a syscall
/// refused always stays so.
fn refuse_when(rules: &mut tree::Rules, nr: i64, conds: Vec<tree::Cond>) {
    match rules.entry(nr) {
        std::collections::btree_map::Entry::Occupied(e) if e.get().is_empty() => {}
        std::collections::btree_map::Entry::Occupied(mut e) => e.get_mut().push(conds),
        std::collections::btree_map::Entry::Vacant(e) => {
            e.insert(vec![conds]);
        }
    }
}

/// The seccomp floor's rules: syscall number → the argument conditions
/// under which it is refused (none: always). One source for the program
/// moat loads ([`seccomp_filter`]) and the test's reference chain. Every
/// rule is added through [`refuse_always`] or [`refuse_when`], so a later
/// rule only ever widens what an earlier one refuses.
fn seccomp_rules(spec: &SeccompSpec) -> Result<tree::Rules, ConfineError> {
    let dword = |v: u64| {
        u32::try_from(v).map_err(|_| ConfineError::Seccomp(format!("{v:#x} is wider than 32 bits")))
    };
    let cond = |arg: u8, eq: bool, value: u32| tree::Cond {
        arg,
        op: if eq { tree::Op::Eq } else { tree::Op::Ne },
        value,
    };
    let mut rules = tree::Rules::new();
    for (_, nr) in &spec.floor {
        refuse_always(&mut rules, *nr);
    }
    // clone/unshare with CLONE_NEW* flags are refused by the ABI guard in sys.
    for (_, cmd) in &spec.denied_ioctls {
        refuse_when(
            &mut rules,
            libc::SYS_ioctl,
            vec![cond(1, true, dword(*cmd)?)],
        );
    }
    if spec.socket_families.as_ref().is_some_and(|f| f.is_empty()) {
        // No family at all (the Landlock backend): socket() is refused
        // unconditionally; socketpair() stays (its ends reach nothing else).
        refuse_always(&mut rules, libc::SYS_socket);
    } else if let Some(families) = &spec.socket_families {
        // One rule whose conditions are ANDed: the family is none of the allowed.
        let conditions = families
            .iter()
            .map(|f| Ok(cond(0, false, dword(*f as u64)?)))
            .collect::<Result<Vec<_>, ConfineError>>()?;
        refuse_when(&mut rules, libc::SYS_socket, conditions);
    }
    // A tool's net class narrows further: families it may not open at all.
    for f in &spec.denied_families {
        refuse_when(
            &mut rules,
            libc::SYS_socket,
            vec![cond(0, true, dword(*f as u64)?)],
        );
    }
    if spec.deny_setid {
        for (_, nr, arg) in SETID_MODE_SYSCALLS {
            let c = tree::Cond {
                arg: *arg,
                op: tree::Op::AnyBits,
                value: SETID_BITS,
            };
            refuse_when(&mut rules, *nr, vec![c]);
        }
    }
    if spec.deny_listen {
        // listen() on an unbound TCP socket binds implicitly, past Landlock's
        // bind rule, so net-connect refuses listen/accept outright.
        for nr in [libc::SYS_listen, libc::SYS_accept, libc::SYS_accept4] {
            refuse_always(&mut rules, nr);
        }
    }
    Ok(rules)
}

/// The seccomp floor as a BPF program: listed syscalls fail with EPERM, a
/// foreign architecture is killed. A binary search over the syscall number
/// (`confine/tree.rs`): the kernel loads it ≈ twice as fast as
/// seccompiler's chain of the same rules, with the same verdicts.
pub fn seccomp_filter(spec: &SeccompSpec) -> Result<seccompiler::BpfProgram, ConfineError> {
    let floor = tree::compile(&seccomp_rules(spec)?).map_err(ConfineError::Seccomp)?;
    // One program, not two stacked filters: the kernel's cost of loading a
    // filter (checking, JIT, the action cache it precomputes) is paid per
    // filter, on the command's way to exec. The guard's refusals return
    // first; what it lets through falls into the floor. The verdict equals
    // the two filters stacked (the most restrictive action, the floor's
    // errno on a tie), which a unit test checks for every syscall.
    let mut prog = Vec::with_capacity(sys::SYSCALL_ABI_GUARD.len() + floor.len());
    prog.extend_from_slice(&sys::SYSCALL_ABI_GUARD);
    prog.extend(floor);
    Ok(prog)
}

/// Installs the session's filter (the ABI guard and the floor, one program:
/// [`seccomp_filter`]). Must be the last step before exec.
pub fn apply_seccomp(program: &seccompiler::BpfProgram) -> Result<Enforcement, ConfineError> {
    enter_seccomp(program).map_err(ConfineError::from)
}

/// [`apply_seccomp`] without allocating (the command's process).
pub fn enter_seccomp(program: &seccompiler::BpfProgram) -> Result<Enforcement, StepFailed> {
    sys::install_seccomp_filter(program).map_err(|e| StepFailed::io("seccomp: the floor", &e))?;
    Ok(Enforcement::Full)
}

/// Adds a tool's network class to the calling process (a shim inside a
/// sandbox, before it execs the tool): seccomp only, since the session's
/// own floor forbids new Landlock domains. net-denied refuses inet/packet
/// sockets; net-connect refuses listen/accept (which also covers TCP binds
/// that would serve). Stacks on the session's filters: it only narrows.
pub fn apply_net_class(class: moat_policy::NetClass) -> Result<(), ConfineError> {
    use moat_policy::NetClass;
    let spec = |denied_families: Vec<i32>, deny_listen: bool| SeccompSpec {
        denied_families,
        deny_listen,
        ..Default::default()
    };
    // The number of filters stacked on the session's own tells a nested
    // run's broker which class its caller runs under (a process can add
    // filters, never remove one): net-connect adds one, net-denied two.
    let filters = match class {
        NetClass::NetDenied => vec![
            spec(vec![libc::AF_INET, libc::AF_INET6], false),
            spec(vec![libc::AF_PACKET], false),
        ],
        NetClass::NetConnect => vec![spec(Vec::new(), true)],
        NetClass::NetListen | NetClass::Unconfined => return Ok(()),
    };
    sys::set_no_new_privs().map_err(ConfineError::NoNewPrivs)?;
    for f in filters {
        // The floor's tree alone: the session's filter has the guard.
        let prog = tree::compile(&seccomp_rules(&f)?).map_err(ConfineError::Seccomp)?;
        seccompiler::apply_filter(&prog).map_err(|e| ConfineError::Seccomp(e.to_string()))?;
    }
    Ok(())
}

/// Filters every sandboxed command runs under: one, the ABI guard and the
/// floor in one program ([`seccomp_filter`]).
pub const SESSION_FILTERS: u32 = 1;

/// The net class a process inside a sandbox runs under, read from the number
/// of seccomp filters stacked on the session's (see [`apply_net_class`]).
/// A process may add filters of its own; that only ever reads as stricter.
pub fn net_class_of_filters(filters: u32) -> Option<moat_policy::NetClass> {
    match filters.saturating_sub(SESSION_FILTERS) {
        0 => None,
        1 => Some(moat_policy::NetClass::NetConnect),
        _ => Some(moat_policy::NetClass::NetDenied),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails when the running kernel has a syscall newer than the floor's
    /// review: someone must decide whether the floor refuses it.
    #[test]
    fn floor_review_covers_the_running_kernels_syscalls() {
        if crate::probe::under_seccomp() {
            // A filter above us may answer EPERM for syscalls it does not
            // know, which would read as "implemented".
            eprintln!("SKIP: running under a seccomp filter; cannot probe the syscall table");
            return;
        }
        let unreviewed: Vec<i64> = (FLOOR_REVIEWED_UP_TO + 1..=FLOOR_REVIEWED_UP_TO + 64)
            // SAFETY: the numbers above the reviewed floor are new syscalls
            // taking fds and pointers; with all-ones arguments they fail.
            .filter(|nr| unsafe { sys::kernel_knows_syscall(*nr) }.unwrap_or(true))
            .collect();
        assert!(
            unreviewed.is_empty(),
            "the kernel implements syscalls {unreviewed:?}, newer than the seccomp floor's \
             review (FLOOR_REVIEWED_UP_TO = {FLOOR_REVIEWED_UP_TO}): review each (refuse it in \
             the floor or note why it is harmless), then raise FLOOR_REVIEWED_UP_TO"
        );
    }
}
