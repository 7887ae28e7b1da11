//! Where typed bytes ask the shell to run something. A line runs at Enter (`\r`), at Ctrl-J
//! (`\n`, once after a `\r`) and at Ctrl-O (readline's operate-and-get-next); inside a
//! bracketed paste (`ESC [200~` ... `ESC [201~`) line ends are part of the pasted text, each a
//! command that runs at the next line end outside it. So a meter counts what the shell is asked
//! to run, and an approval covers a whole line, pasted lines included.

/// Ctrl-O.
const OPERATE: u8 = 0x0f;
/// Ctrl-C: the line being typed is dropped.
pub(crate) const INTERRUPT: u8 = 0x03;

/// One piece of typed input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Its end in the chunk (exclusive).
    pub(crate) end: usize,
    /// It ends a line: the shell runs what it holds.
    pub(crate) runs: bool,
    /// Commands the shell is asked to run at its end (its line, and the lines pasted in it).
    pub(crate) commands: u64,
}

/// Reads typed input chunk by chunk (a marker or `\r\n` may be split between chunks).
#[derive(Debug, Default)]
pub(crate) struct LineScanner {
    in_paste: bool,
    prev_cr: bool,
    /// Bytes of `ESC [20` matched so far (0..=4), 5 once the `0`/`1` is in (`closing`).
    marker: u8,
    closing: bool,
    /// Lines pasted into the line being typed.
    pasted: u64,
}

impl LineScanner {
    /// Splits `data` after each line end: every piece but maybe the last ends a line; the last
    /// ends the chunk (`runs: false` when its line goes on in the next chunk).
    pub(crate) fn split(&mut self, data: &[u8]) -> Vec<Piece> {
        let mut out = Vec::new();
        for (i, &b) in data.iter().enumerate() {
            self.track_marker(b);
            let line_end = b == b'\r' || (b == b'\n' && !self.prev_cr);
            self.prev_cr = b == b'\r';
            if self.in_paste {
                if line_end {
                    self.pasted += 1;
                }
                continue;
            }
            if line_end || b == OPERATE {
                out.push(Piece {
                    end: i + 1,
                    runs: true,
                    commands: 1 + std::mem::take(&mut self.pasted),
                });
            } else if b == INTERRUPT {
                self.pasted = 0;
            }
        }
        if out.last().map_or(0, |p| p.end) < data.len() {
            out.push(Piece {
                end: data.len(),
                runs: false,
                commands: 0,
            });
        }
        out
    }

    /// Commands `data` asks the shell to run.
    pub(crate) fn commands(&mut self, data: &[u8]) -> u64 {
        self.split(data).iter().map(|p| p.commands).sum()
    }

    fn track_marker(&mut self, b: u8) {
        const LEAD: &[u8] = b"\x1b[20";
        self.marker = match (self.marker, b) {
            (m, _) if usize::from(m) < LEAD.len() && LEAD[usize::from(m)] == b => m + 1,
            (4, b'0') => {
                self.closing = false;
                5
            }
            (4, b'1') => {
                self.closing = true;
                5
            }
            (5, b'~') => {
                self.in_paste = !self.closing;
                0
            }
            (_, 0x1b) => 1,
            _ => 0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(chunks: &[&[u8]]) -> u64 {
        let mut s = LineScanner::default();
        chunks.iter().map(|c| s.commands(c)).sum()
    }

    #[test]
    fn every_way_a_line_runs_is_counted() {
        assert_eq!(count(&[b"ls\r"]), 1);
        assert_eq!(count(&[b"ls\n"]), 1);
        assert_eq!(count(&[b"ls\r\n"]), 1);
        assert_eq!(count(&[b"ls\r", b"\n"]), 1);
        assert_eq!(count(&[b"a\x0fb\x0f"]), 2, "Ctrl-O runs the line");
        assert_eq!(count(&[b"a\nb\nc\n"]), 3, "pasted lines without brackets");
        assert_eq!(count(&[b"half"]), 0);
    }

    #[test]
    fn a_bracketed_paste_runs_its_lines_at_the_next_enter() {
        assert_eq!(count(&[b"\x1b[200~a\nb\nc\x1b[201~\r"]), 3);
        assert_eq!(count(&[b"\x1b[200~a\rb", b"\x1b[201~"]), 0);
        // Markers split between chunks are still seen.
        assert_eq!(count(&[b"\x1b[2", b"00~x\ny\x1b[20", b"1~\r"]), 2);
        // Ctrl-C drops the pasted lines with the line.
        assert_eq!(count(&[b"\x1b[200~a\nb\x1b[201~\x03ls\r"]), 1);
    }

    #[test]
    fn pieces_end_after_each_line() {
        let mut s = LineScanner::default();
        let pieces = s.split(b"ls\rpwd\x0fec");
        let ends: Vec<_> = pieces.iter().map(|p| (p.end, p.runs)).collect();
        assert_eq!(ends, vec![(3, true), (7, true), (9, false)]);
    }
}
