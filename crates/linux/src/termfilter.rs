//! What a sandboxed command writes to its terminal reaches the user's host
//! terminal through moat's relay, and some terminal control strings act on
//! the host outside the sandbox: OSC 52 sets (or reads) the host clipboard
//! (the sandbox has no X11/Wayland socket, so this is the only way in),
//! iTerm2's OSC 1337 transfers files, kitty's OSC 5113/5522 transfer files
//! and clipboard data, and DCS strings pass sequences through to an outer
//! tmux (`ESC P tmux;`) or drive kitty's remote control (`ESC P @kitty-cmd`).
//! [`TermFilter`] removes those from the stream and passes everything else
//! (colours, cursor movement, titles, hyperlinks, graphics) unchanged.
//!
//! It follows a VT parser's view of the stream (ESC begins a new sequence
//! from any state, CAN/SUB abort one, BEL or ESC \ end a string), so a
//! sequence the terminal would act on is never mistaken for text. 8-bit C1
//! controls are not interpreted: in a UTF-8 terminal they are not controls.

/// OSC numbers removed (compared numerically, so `052` is 52).
const DENIED_OSC: &[u32] = &[52, 1337, 5113, 5522];

/// DCS string prefixes removed.
const DENIED_DCS: &[&[u8]] = &[b"tmux;", b"@kitty-cmd"];

/// The longest prefix looked at before deciding (an OSC number, a DCS head).
const HEAD_MAX: usize = 16;

const ESC: u8 = 0x1b;
const BEL: u8 = 0x07;
const CAN: u8 = 0x18;
const SUB: u8 = 0x1a;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Ground,
    /// After ESC (held back until the next byte decides).
    Esc,
    /// After ESC ] or ESC P: the head is held back in `head`.
    Head {
        dcs: bool,
    },
    /// Inside a string that passes.
    Pass,
    /// Inside a string that is dropped; `esc` after an ESC in it.
    Drop {
        esc: bool,
        dcs: bool,
    },
}

/// A streaming filter for terminal output; keeps state across chunks.
#[derive(Debug)]
pub struct TermFilter {
    state: State,
    head: Vec<u8>,
}

impl Default for TermFilter {
    fn default() -> Self {
        TermFilter::new()
    }
}

impl TermFilter {
    pub fn new() -> TermFilter {
        TermFilter {
            state: State::Ground,
            head: Vec::new(),
        }
    }

    /// Filters one chunk, appending what may reach the terminal to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        for &b in input {
            self.byte(b, out);
        }
    }

    fn byte(&mut self, b: u8, out: &mut Vec<u8>) {
        match self.state {
            State::Ground | State::Pass => {
                if b == ESC {
                    self.state = State::Esc;
                } else {
                    if self.state == State::Pass && matches!(b, BEL | CAN | SUB) {
                        self.state = State::Ground;
                    }
                    out.push(b);
                }
            }
            State::Esc => match b {
                b']' | b'P' => {
                    self.head.clear();
                    self.state = State::Head { dcs: b == b'P' };
                }
                ESC => out.push(ESC),
                _ => {
                    out.extend_from_slice(&[ESC, b]);
                    self.state = State::Ground;
                }
            },
            State::Head { dcs } => {
                let ends = matches!(b, BEL | CAN | SUB | ESC);
                if !ends {
                    self.head.push(b);
                }
                let decided = ends
                    || (!dcs && b == b';')
                    || (!dcs && !b.is_ascii_digit())
                    || self.head.len() >= HEAD_MAX
                    || (dcs && DENIED_DCS.iter().any(|p| self.head.starts_with(p)));
                if !decided {
                    return;
                }
                if self.denied(dcs) {
                    self.head.clear();
                    self.state = match b {
                        ESC => State::Drop { esc: true, dcs },
                        BEL | CAN | SUB => State::Ground,
                        _ => State::Drop { esc: false, dcs },
                    };
                    return;
                }
                out.extend_from_slice(&[ESC, if dcs { b'P' } else { b']' }]);
                out.append(&mut self.head);
                self.state = State::Pass;
                if ends {
                    self.byte(b, out);
                }
            }
            State::Drop { esc, dcs } => {
                self.state = match (esc, b) {
                    (true, b'\\') => State::Ground,
                    // tmux doubles the ESCs of what it passes through.
                    (true, ESC) if dcs => State::Drop { esc: false, dcs },
                    (_, ESC) => State::Drop { esc: true, dcs },
                    (_, BEL) if !dcs => State::Ground,
                    (_, CAN | SUB) => State::Ground,
                    _ => State::Drop { esc: false, dcs },
                };
            }
        }
    }

    /// Whether the held head names a denied OSC or DCS.
    fn denied(&self, dcs: bool) -> bool {
        if dcs {
            return DENIED_DCS.iter().any(|p| self.head.starts_with(p));
        }
        let digits: Vec<u8> = self
            .head
            .iter()
            .copied()
            .take_while(u8::is_ascii_digit)
            .collect();
        let trimmed = digits
            .iter()
            .position(|d| *d != b'0')
            .map_or(&[][..], |i| &digits[i..]);
        if digits.is_empty() || trimmed.len() > 6 {
            return false;
        }
        let n = trimmed
            .iter()
            .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
        DENIED_OSC.contains(&n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&[u8]]) -> Vec<u8> {
        let mut f = TermFilter::new();
        let mut out = Vec::new();
        for c in chunks {
            f.push(c, &mut out);
        }
        out
    }

    #[test]
    fn host_acting_strings_are_removed() {
        for s in [
            &b"a\x1b]52;c;ZXZpbA==\x07b"[..],
            b"a\x1b]52;c;ZXZpbA==\x1b\\b",
            b"a\x1b]052;c;ZXZpbA==\x07b",
            b"a\x1b]1337;File=name=eA==:ZXZpbA==\x07b",
            b"a\x1b]5522;type=write\x1b\\b",
            b"a\x1bPtmux;\x1b\x1b]52;c;ZXZpbA==\x07\x1b\\b",
            b"a\x1bP@kitty-cmd{\"cmd\":\"launch\"}\x1b\\b",
        ] {
            removed(s, b"ab");
        }
        // An OSC that passes, aborted by ESC, then a denied one.
        removed(b"a\x1b]0;title\x1b]52;c;ZXZpbA==\x07b", b"a\x1b]0;titleb");
    }

    fn removed(s: &[u8], want: &[u8]) {
        assert_eq!(run(&[s]), want, "{}", String::from_utf8_lossy(s));
        // Split at every position: the same result.
        for i in 0..s.len() {
            assert_eq!(
                run(&[&s[..i], &s[i..]]),
                want,
                "{} split at {i}",
                String::from_utf8_lossy(s)
            );
        }
    }

    #[test]
    fn everything_else_passes_unchanged() {
        for s in [
            &b"plain text\r\n"[..],
            b"\x1b[31mred\x1b[0m \x1b[2J\x1b[H",
            b"\x1b]0;a title\x07",
            b"\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\",
            b"\x1b]4;1;rgb:ff/00/00\x07",
            b"\x1bP1$r0m\x1b\\",
            b"\x1b\x1b[A",
            "unicode \u{2603} \u{9d}".as_bytes(),
        ] {
            assert_eq!(run(&[s]), s, "{}", String::from_utf8_lossy(s));
        }
    }
}
