//! The seccomp floor as a classic-BPF decision tree: a binary search over
//! the syscall numbers that have rules, instead of seccompiler's chain (one
//! comparison per listed syscall). Same verdict for every syscall, argument
//! and architecture; the kernel loads the shorter program faster (it runs
//! the filter once per syscall number to precompute its action cache), and
//! a syscall meets ≈ 6 comparisons instead of up to ≈ 55. A unit test runs
//! both programs through an interpreter and compares every verdict.

use std::collections::BTreeMap;

use seccompiler::sock_filter;

/// One argument comparison, on the argument's low 32 bits (seccompiler's
/// `SeccompCmpArgLen::Dword`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cond {
    pub arg: u8,
    pub op: Op,
    pub value: u32,
}

/// How a [`Cond`] compares its argument with `value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Eq,
    Ne,
    /// Any bit of `value` is set in the argument (one `JSET`; seccompiler
    /// says it as one `MaskedEq` rule per nonzero combination of the bits).
    AnyBits,
}

/// Syscall number → its rules. No rule: the syscall is refused outright;
/// otherwise it is refused when every condition of some rule holds.
pub(crate) type Rules = BTreeMap<i64, Vec<Vec<Cond>>>;

const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JSET_K: u16 = 0x45;
const JGE_K: u16 = 0x35;
const JA: u16 = 0x05;
const RET_K: u16 = 0x06;
pub(crate) const RET_ALLOW: u32 = 0x7fff_0000;
pub(crate) const RET_KILL_PROCESS: u32 = 0x8000_0000;
pub(crate) const RET_ERRNO_EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
#[cfg(target_arch = "x86_64")]
pub(crate) const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
#[cfg(target_arch = "aarch64")]
pub(crate) const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARGS: u32 = 16;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The whole program: a foreign architecture kills the process (as
/// seccompiler's header does), then the tree over the syscall number;
/// a number with no rules is allowed.
pub(crate) fn compile(rules: &Rules) -> Result<Vec<sock_filter>, String> {
    let mut nrs = Vec::with_capacity(rules.len());
    for (&nr, r) in rules {
        let nr = u32::try_from(nr).map_err(|_| format!("syscall number {nr} out of range"))?;
        nrs.push((nr, r.as_slice()));
    }
    let mut prog = vec![
        ins(LD_W_ABS, 0, 0, OFF_ARCH),
        ins(JEQ_K, 1, 0, AUDIT_ARCH),
        ins(RET_K, 0, 0, RET_KILL_PROCESS),
        ins(LD_W_ABS, 0, 0, OFF_NR),
    ];
    prog.extend(subtree(&nrs)?);
    if prog.len() > 4096 {
        return Err(format!(
            "{} instructions (BPF_MAXINSNS is 4096)",
            prog.len()
        ));
    }
    Ok(prog)
}

/// The search over `nrs` (sorted), with the syscall number in A on entry.
fn subtree(nrs: &[(u32, &[Vec<Cond>])]) -> Result<Vec<sock_filter>, String> {
    match nrs {
        [] => Ok(vec![ins(RET_K, 0, 0, RET_ALLOW)]),
        [(nr, rules)] => {
            // A leaf: its syscall's rules, anything else allowed.
            let mut out = vec![ins(JEQ_K, 1, 0, *nr), ins(RET_K, 0, 0, RET_ALLOW)];
            out.extend(leaf(rules)?);
            Ok(out)
        }
        _ => {
            let mid = nrs.len() / 2;
            let left = subtree(&nrs[..mid])?;
            let right = subtree(&nrs[mid..])?;
            // A >= the right half's first number: the right half.
            let mut out = Vec::with_capacity(left.len() + right.len() + 2);
            match u8::try_from(left.len()) {
                Ok(skip) => out.push(ins(JGE_K, skip, 0, nrs[mid].0)),
                Err(_) => {
                    // Too far for a conditional jump: below, skip the JA
                    // into the left half; at or above, take it.
                    let skip = u32::try_from(left.len()).map_err(|e| e.to_string())?;
                    out.push(ins(JGE_K, 0, 1, nrs[mid].0));
                    out.push(ins(JA, 0, 0, skip));
                }
            }
            out.extend(left);
            out.extend(right);
            Ok(out)
        }
    }
}

/// A listed syscall's verdict: refused outright without rules, else refused
/// when all conditions of a rule hold, allowed when no rule does. Each
/// condition loads its argument's low word (A no longer holds the number,
/// but nothing after a leaf's entry reads it).
fn leaf(rules: &[Vec<Cond>]) -> Result<Vec<sock_filter>, String> {
    if rules.is_empty() {
        return Ok(vec![ins(RET_K, 0, 0, RET_ERRNO_EPERM)]);
    }
    let mut out = Vec::new();
    for conds in rules {
        let len = 2 * conds.len() + 1;
        for (j, c) in conds.iter().enumerate() {
            // From this comparison to the next rule's first instruction.
            let to_next = u8::try_from(len - (2 * j + 1) - 1)
                .map_err(|_| "a rule with too many conditions".to_string())?;
            if c.arg > 5 {
                return Err(format!("argument {} out of range", c.arg));
            }
            out.push(ins(LD_W_ABS, 0, 0, OFF_ARGS + 8 * u32::from(c.arg)));
            out.push(match c.op {
                Op::Eq => ins(JEQ_K, 0, to_next, c.value),
                Op::Ne => ins(JEQ_K, to_next, 0, c.value),
                Op::AnyBits => ins(JSET_K, 0, to_next, c.value),
            });
        }
        out.push(ins(RET_K, 0, 0, RET_ERRNO_EPERM));
    }
    out.push(ins(RET_K, 0, 0, RET_ALLOW));
    Ok(out)
}

#[cfg(test)]
mod tests {
    const GUARD: [sock_filter; 13] = crate::sys::SYSCALL_ABI_GUARD;
    use super::*;
    use crate::plan::SeccompSpec;
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };

    /// The same rules compiled by seccompiler (the chain moat loaded before):
    /// the reference the tree must agree with. An `AnyBits` condition
    /// becomes one rule per nonzero combination of its bits, each a
    /// `MaskedEq` (seccompiler has no "any bit set").
    fn chain(rules: &Rules) -> Vec<sock_filter> {
        let dword = |c: &Cond, op, value: u32| {
            SeccompCondition::new(c.arg, SeccompCmpArgLen::Dword, op, u64::from(value)).unwrap()
        };
        let rules = rules
            .iter()
            .map(|(nr, rules)| {
                let mut out = Vec::new();
                for conds in rules {
                    // Every choice of one alternative per condition.
                    let mut expanded: Vec<Vec<SeccompCondition>> = vec![Vec::new()];
                    for c in conds {
                        let alternatives: Vec<SeccompCondition> = match c.op {
                            Op::Eq => vec![dword(c, SeccompCmpOp::Eq, c.value)],
                            Op::Ne => vec![dword(c, SeccompCmpOp::Ne, c.value)],
                            Op::AnyBits => (1..=c.value)
                                .filter(|s| s & !c.value == 0)
                                .map(|s| dword(c, SeccompCmpOp::MaskedEq(u64::from(c.value)), s))
                                .collect(),
                        };
                        expanded = expanded
                            .iter()
                            .flat_map(|pre| {
                                alternatives.iter().map(move |a| {
                                    let mut r = pre.clone();
                                    r.push(a.clone());
                                    r
                                })
                            })
                            .collect();
                    }
                    out.extend(expanded.into_iter().map(|c| SeccompRule::new(c).unwrap()));
                }
                (*nr, out)
            })
            .collect();
        #[cfg(target_arch = "x86_64")]
        let arch = TargetArch::x86_64;
        #[cfg(target_arch = "aarch64")]
        let arch = TargetArch::aarch64;
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )
        .unwrap();
        seccompiler::BpfProgram::try_from(filter).unwrap()
    }

    /// A classic-BPF interpreter for what seccomp programs here use, over a
    /// `seccomp_data` (nr, arch, args; little endian). Panics on anything
    /// else, on a jump out of the program, or on falling off its end.
    fn run(prog: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let word = |off: u32| -> u32 {
            match off {
                0 => nr,
                4 => arch,
                o if (16..64).contains(&o) && o % 4 == 0 => {
                    let a = args[((o - 16) / 8) as usize];
                    if (o - 16) % 8 == 0 {
                        a as u32
                    } else {
                        (a >> 32) as u32
                    }
                }
                o => panic!("load at {o}"),
            }
        };
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let i = prog.get(pc).expect("pc past the end");
            pc += 1;
            let cond = |taken: bool| usize::from(if taken { i.jt } else { i.jf });
            match i.code {
                0x20 => acc = word(i.k),
                0x05 => pc += i.k as usize,
                0x15 => pc += cond(acc == i.k),
                0x25 => pc += cond(acc > i.k),
                0x35 => pc += cond(acc >= i.k),
                0x45 => pc += cond(acc & i.k != 0),
                0x54 => acc &= i.k, // seccompiler's MaskedEq
                0x06 => return i.k,
                c => panic!("opcode {c:#x}"),
            }
        }
    }

    fn specs() -> Vec<SeccompSpec> {
        let floor = crate::confine::SECCOMP_FLOOR.to_vec();
        let ioctls = crate::confine::DENIED_IOCTLS.to_vec();
        vec![
            // a sandboxed run with its network off or through the proxy
            SeccompSpec {
                floor: floor.clone(),
                denied_ioctls: ioctls.clone(),
                socket_families: Some(vec![libc::AF_UNIX]),
                deny_setid: true,
                ..Default::default()
            },
            // the set-id rules alone
            SeccompSpec {
                deny_setid: true,
                ..Default::default()
            },
            SeccompSpec {
                floor: floor.clone(),
                denied_ioctls: ioctls.clone(),
                socket_families: Some(vec![libc::AF_UNIX, libc::AF_INET, libc::AF_INET6]),
                ..Default::default()
            },
            // the Landlock backend: no socket at all
            SeccompSpec {
                floor: floor.clone(),
                denied_ioctls: ioctls.clone(),
                socket_families: Some(vec![]),
                ..Default::default()
            },
            // the Landlock backend under a tool's net class (`moat run`)
            SeccompSpec {
                floor: floor.clone(),
                denied_ioctls: ioctls.clone(),
                socket_families: Some(vec![]),
                denied_families: vec![libc::AF_INET, libc::AF_INET6, libc::AF_PACKET],
                deny_listen: true,
                deny_setid: true,
            },
            // the net classes' filters
            SeccompSpec {
                denied_families: vec![libc::AF_INET, libc::AF_INET6],
                ..Default::default()
            },
            SeccompSpec {
                denied_families: vec![libc::AF_PACKET],
                ..Default::default()
            },
            SeccompSpec {
                deny_listen: true,
                ..Default::default()
            },
            SeccompSpec::default(),
            // Wide enough that a half is out of a conditional jump's reach.
            SeccompSpec {
                floor: (0..400).step_by(3).map(|n| ("x", n)).collect(),
                denied_ioctls: vec![("TIOCSTI", libc::TIOCSTI)],
                socket_families: Some(vec![libc::AF_UNIX]),
                ..Default::default()
            },
        ]
    }

    /// Argument vectors that hit and miss every condition: each denied
    /// ioctl request and family, neighbours, and high words set (only the
    /// low word is compared).
    fn arg_cases() -> Vec<[u64; 6]> {
        let mut values: Vec<u64> = vec![0, 1, 2, 3, 10, 16, 17, u64::MAX];
        for (_, cmd) in crate::confine::DENIED_IOCTLS {
            values.extend([*cmd, cmd + 1, cmd - 1, cmd | 1 << 40]);
        }
        for f in [
            libc::AF_UNIX,
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_PACKET,
        ] {
            values.extend([f as u64, f as u64 | 1 << 33]);
        }
        // Modes: each set-id bit, both, neither, with the others around.
        for m in [
            0o4755u64, 0o2755, 0o6000, 0o4000, 0o2000, 0o755, 0o1777, 0o104755,
        ] {
            values.extend([m, m | 1 << 35]);
        }
        let mut cases = Vec::new();
        for v in &values {
            cases.push([*v, 0, 0, 0, 0, 0]);
            cases.push([0, *v, 0, 0, 0, 0]);
            cases.push([0, 0, *v, 0, 0, 0]);
            cases.push([0, 0, 0, *v, 0, 0]);
            cases.push([*v, *v, *v, *v, *v, *v]);
        }
        cases
    }

    #[test]
    fn the_tree_gives_seccompilers_verdict_for_every_syscall() {
        let args = arg_cases();
        for spec in specs() {
            let rules = crate::confine::seccomp_rules(&spec).unwrap();
            let (tree, reference) = (compile(&rules).unwrap(), chain(&rules));
            assert_eq!(
                crate::confine::seccomp_filter(&spec).unwrap()[GUARD.len()..],
                tree[..],
                "moat loads the tree after the guard"
            );
            let mut refused = 0;
            for nr in (0..=600u32).chain([0x4000_0000, 0x4000_0001, u32::MAX]) {
                for arch in [AUDIT_ARCH, 0x4000_0003, AUDIT_ARCH & !0x4000_0000] {
                    for a in &args {
                        let want = run(&reference, nr, arch, *a);
                        let got = run(&tree, nr, arch, *a);
                        assert_eq!(got, want, "nr {nr} arch {arch:#x} args {a:x?} {spec:?}");
                        refused += usize::from(got == RET_ERRNO_EPERM);
                    }
                }
            }
            // The comparison saw refusals, not only allows.
            assert_eq!(refused > 0, !rules.is_empty(), "{spec:?}");
            if spec.floor.len() > 100 {
                assert!(
                    tree.iter().any(|i| i.code == JA),
                    "the wide case takes the JA"
                );
            } else if rules.len() > 1 {
                assert!(
                    tree.len() < reference.len(),
                    "{} vs {}",
                    tree.len(),
                    reference.len()
                );
            }
        }
    }

    /// The ABI guard as it was installed alone, a filter of its own: its
    /// instructions, then an allow.
    fn guard_alone() -> Vec<sock_filter> {
        let mut g = GUARD.to_vec();
        g.push(ins(RET_K, 0, 0, RET_ALLOW));
        g
    }

    /// What the kernel answers under two stacked filters: the most
    /// restrictive action; on a tie, the data (errno) of the filter
    /// installed last (the floor, installed after the guard).
    fn stacked(guard: u32, floor: u32) -> u32 {
        let rank = |v: u32| match v & 0xffff_0000 {
            0x8000_0000 => 0, // kill process
            0x0000_0000 => 1, // kill thread
            0x0003_0000 => 2, // trap
            0x0005_0000 => 3, // errno
            0x7fff_0000 => 9, // allow
            other => panic!("action {other:#x}"),
        };
        if rank(guard) < rank(floor) {
            guard
        } else {
            floor
        }
    }

    #[test]
    fn the_one_session_filter_answers_as_the_guard_and_the_floor_stacked() {
        // The guard and the floor were two filters; they are one program
        // now (the guard's refusals first, then the tree). For every
        // syscall, architecture and argument vector, the one program's
        // verdict is the kernel's verdict for the two stacked.
        let mut args = arg_cases();
        for flag in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWNET,
            0x80,
        ] {
            args.push([flag as u64, 0, 0, 0, 0, 0]);
            args.push([(flag | libc::SIGCHLD) as u64, 0, 0, 0, 0, 0]);
        }
        let (guard, mut refused_by_guard) = (guard_alone(), 0);
        for spec in specs() {
            let one = crate::confine::seccomp_filter(&spec).unwrap();
            let floor = compile(&crate::confine::seccomp_rules(&spec).unwrap()).unwrap();
            for nr in (0..=600u32).chain([0x4000_0000, 0x4000_0001, 0x4000_0000 | 272, u32::MAX]) {
                for arch in [AUDIT_ARCH, 0x4000_0003, AUDIT_ARCH & !0x4000_0000] {
                    for a in &args {
                        let g = run(&guard, nr, arch, *a);
                        let want = stacked(g, run(&floor, nr, arch, *a));
                        let got = run(&one, nr, arch, *a);
                        assert_eq!(got, want, "nr {nr} arch {arch:#x} args {a:x?} {spec:?}");
                        refused_by_guard += usize::from(g != RET_ALLOW);
                    }
                }
            }
        }
        // The comparison saw the guard refuse, not only allow.
        assert!(refused_by_guard > 0);
    }

    /// A net class narrows what a backend allows; it never reopens what the
    /// backend refuses outright. On the Landlock backend `socket` is
    /// refused for every family; a tool's class (`net-denied`: inet, inet6,
    /// packet) once turned that into "refused for those three", so a
    /// `moat run` there could open unix and netlink sockets (docker.sock).
    #[test]
    fn a_net_class_never_reopens_a_family_the_backend_refuses() {
        let landlock = |denied_families: Vec<i32>| SeccompSpec {
            socket_families: Some(vec![]),
            denied_families,
            ..Default::default()
        };
        let unix_only = |denied_families: Vec<i32>| SeccompSpec {
            socket_families: Some(vec![libc::AF_UNIX]),
            denied_families,
            ..Default::default()
        };
        let socket = |spec: &SeccompSpec, family: i32| {
            let prog = crate::confine::seccomp_filter(spec).unwrap();
            run(
                &prog,
                libc::SYS_socket as u32,
                AUDIT_ARCH,
                [family as u64, 1, 0, 0, 0, 0],
            )
        };
        let classes = [
            vec![],
            vec![libc::AF_INET, libc::AF_INET6, libc::AF_PACKET],
            vec![libc::AF_UNIX],
        ];
        for class in classes {
            for family in [
                libc::AF_UNIX,
                libc::AF_INET,
                libc::AF_INET6,
                libc::AF_NETLINK,
                libc::AF_PACKET,
            ] {
                assert_eq!(
                    socket(&landlock(class.clone()), family),
                    RET_ERRNO_EPERM,
                    "Landlock backend, class {class:?}, family {family}"
                );
                if family != libc::AF_UNIX {
                    assert_eq!(
                        socket(&unix_only(class.clone()), family),
                        RET_ERRNO_EPERM,
                        "unix only, class {class:?}, family {family}"
                    );
                }
            }
            // What the backend allows, the class may still refuse.
            let want = if class.contains(&libc::AF_UNIX) {
                RET_ERRNO_EPERM
            } else {
                RET_ALLOW
            };
            assert_eq!(
                socket(&unix_only(class.clone()), libc::AF_UNIX),
                want,
                "{class:?}"
            );
        }
    }
}
