//! Cutting long command output down to what the model should see: the head and the tail, with
//! a marker saying how much of the middle was left out.
//!
//! Two pieces: [`Capture`] collects a byte stream with bounded memory (a head buffer and a
//! rolling tail) while counting every byte and line; [`truncate_output`] renders it within
//! [`OutputLimits`] (by default 10 KiB and 256 lines, half for the head and half for the tail).
//! Only the model's copy is cut; callers that want the full output must keep it themselves.

use std::collections::VecDeque;

/// The budget for what the model sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputLimits {
    pub max_bytes: usize,
    pub max_lines: usize,
}

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            max_bytes: 10 * 1024,
            max_lines: 256,
        }
    }
}

/// How much of the stream a [`Capture`] keeps in memory at each end. Far more than any
/// [`OutputLimits`] shows, so the cut is made on whole lines of the real stream.
const KEEP_EACH_END: usize = 256 * 1024;

/// A byte stream seen once: the first and last [`KEEP_EACH_END`] bytes, plus exact totals.
#[derive(Debug, Default)]
pub struct Capture {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total_bytes: u64,
    newlines: u64,
    last_byte: Option<u8>,
}

impl Capture {
    pub fn push(&mut self, mut chunk: &[u8]) {
        self.total_bytes += chunk.len() as u64;
        self.newlines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
        if let Some(b) = chunk.last() {
            self.last_byte = Some(*b);
        }
        let room = KEEP_EACH_END.saturating_sub(self.head.len());
        let (to_head, rest) = chunk.split_at(room.min(chunk.len()));
        self.head.extend_from_slice(to_head);
        chunk = rest;
        if chunk.len() >= KEEP_EACH_END {
            chunk = &chunk[chunk.len() - KEEP_EACH_END..];
            self.tail.clear();
        }
        let overflow = (self.tail.len() + chunk.len()).saturating_sub(KEEP_EACH_END);
        self.tail.drain(..overflow);
        self.tail.extend(chunk);
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Lines as a reader counts them: a final line without `\n` still counts.
    pub fn total_lines(&self) -> u64 {
        match self.last_byte {
            None => 0,
            Some(b'\n') => self.newlines,
            Some(_) => self.newlines + 1,
        }
    }

    /// The model's view of everything pushed so far.
    pub fn render(&self, limits: OutputLimits) -> String {
        let head = String::from_utf8_lossy(&self.head);
        let tail_bytes: Vec<u8> = self.tail.iter().copied().collect();
        let tail = String::from_utf8_lossy(&tail_bytes);
        let (lines, bytes) = (self.total_lines(), self.total_bytes);
        let kept = (self.head.len() + self.tail.len()) as u64;
        if kept < bytes {
            return self.cut(&head, &tail, limits);
        }
        let all = format!("{head}{tail}");
        if bytes <= limits.max_bytes as u64 && lines <= limits.max_lines as u64 {
            return all;
        }
        self.cut(&all, &all, limits)
    }

    /// Keeps the first lines of `head_src` and the last lines of `tail_src` (each within half
    /// the budget) and marks the gap, counting the whole stream. The two may be the same string:
    /// the caller only cuts when the whole exceeds the budget, so the two halves never overlap.
    fn cut(&self, head_src: &str, tail_src: &str, limits: OutputLimits) -> String {
        let (lines, bytes) = (self.total_lines(), self.total_bytes);
        let half_bytes = limits.max_bytes / 2;
        let half_lines = limits.max_lines / 2;
        let head = take_head(head_src, half_lines, half_bytes);
        let tail = take_tail(tail_src, half_lines, half_bytes);
        let shown_lines = (head.lines().count() + tail.lines().count()) as u64;
        let omitted_bytes = bytes.saturating_sub((head.len() + tail.len()) as u64);
        let omitted_lines = lines.saturating_sub(shown_lines);
        let mut out =
            format!("[output: {lines} lines, {bytes} bytes; showing the head and tail]\n");
        out.push_str(&head);
        if !head.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&format!(
            "[... {omitted_lines} lines ({omitted_bytes} bytes) omitted ...]\n"
        ));
        out.push_str(&tail);
        out
    }
}

/// Truncates `text` for the model; unchanged when it fits.
pub fn truncate_output(text: &str, limits: OutputLimits) -> String {
    let mut c = Capture::default();
    c.push(text.as_bytes());
    c.render(limits)
}

fn take_head(s: &str, max_lines: usize, max_bytes: usize) -> String {
    let mut end = 0;
    for (n, line) in s.split_inclusive('\n').enumerate() {
        if n == max_lines || end + line.len() > max_bytes {
            if n == 0 {
                end = floor_char_boundary(s, max_bytes);
            }
            break;
        }
        end += line.len();
    }
    s[..end].to_string()
}

fn take_tail(s: &str, max_lines: usize, max_bytes: usize) -> String {
    let mut start = s.len();
    for (n, line) in s.split_inclusive('\n').rev().enumerate() {
        if n == max_lines || (s.len() - start) + line.len() > max_bytes {
            if n == 0 {
                start = ceil_char_boundary(s, s.len().saturating_sub(max_bytes));
            }
            break;
        }
        start -= line.len();
    }
    s[start..].to_string()
}

pub(crate) fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

pub(crate) fn ceil_char_boundary(s: &str, mut i: usize) -> usize {
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_larger_than_memory_keeps_exact_totals_and_both_ends() {
        let mut c = Capture::default();
        let mut expected_bytes = 0;
        for chunk in 0..1000 {
            let text: String = (0..1000)
                .map(|i| format!("line {}\n", chunk * 1000 + i + 1))
                .collect();
            expected_bytes += text.len() as u64;
            c.push(text.as_bytes());
        }
        assert_eq!(
            (c.total_lines(), c.total_bytes()),
            (1_000_000, expected_bytes)
        );
        let limits = OutputLimits {
            max_bytes: 10 * 1024,
            max_lines: 4,
        };
        assert_eq!(
            c.render(limits),
            format!(
                "[output: 1000000 lines, {expected_bytes} bytes; showing the head and tail]\n\
                 line 1\nline 2\n[... 999996 lines ({} bytes) omitted ...]\n\
                 line 999999\nline 1000000\n",
                expected_bytes - 14 - 25
            )
        );
    }
}
