//! The edits that carry one side's change of a text into another side's copy: a three-way
//! merge at character granularity, in byte offsets ready for a `Y.Text`. The workspace sync
//! (`sandbox::filesync`) merges disk changes with it; a visit (`room::visit`) rewrites files
//! with it (base and document the same: a minimal diff), so cursors outside the changed text
//! stay where they were.
//!
//! Conflict rule (both sides changed the text since they last agreed): the change is applied as
//! a three-way merge against the text both sides last agreed on. Hunks of the change that touch
//! only text the other side left alone are applied; where both changed the same characters,
//! the document's text wins.

use std::time::Duration;

/// Time allowed for a character diff before a coarser one is used.
const DIFF_DEADLINE: Duration = Duration::from_millis(200);

/// One text edit in byte offsets of the text it applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Edit {
    pub at: usize,
    pub delete: usize,
    pub insert: String,
}

/// Byte offset of every char boundary of `s` (including the end).
fn boundaries(s: &str) -> Vec<usize> {
    let mut v: Vec<usize> = s.char_indices().map(|(i, _)| i).collect();
    v.push(s.len());
    v
}

/// A character diff of `old` and `new`, coarser past [`DIFF_DEADLINE`].
fn char_diff<'a>(old: &'a str, new: &'a str) -> similar::TextDiff<'a, 'a, 'a, str> {
    similar::TextDiff::configure()
        .algorithm(similar::Algorithm::Myers)
        .deadline(std::time::Instant::now() + DIFF_DEADLINE)
        .diff_chars(old, new)
}

/// Hunks turning `old` into `new`: (old char range, replacement text).
fn hunks(old: &str, new: &str) -> Vec<(std::ops::Range<usize>, String)> {
    let diff = char_diff(old, new);
    let new_chars: Vec<char> = new.chars().collect();
    let mut out = Vec::new();
    for op in diff.ops() {
        let (old_r, new_r) = (op.old_range(), op.new_range());
        if matches!(op, similar::DiffOp::Equal { .. }) {
            continue;
        }
        out.push((old_r, new_chars[new_r].iter().collect()));
    }
    out
}

/// The edits that carry the disk's change (`base` -> `disk`) into the document's text `doc`,
/// following the module's conflict rule. Returned last first, so each applies at its offsets.
pub(crate) fn merge(base: &str, doc: &str, disk: &str) -> Vec<Edit> {
    let base_b = boundaries(base);
    let doc_b = boundaries(doc);
    // Unchanged stretches of base in the document: (base chars, doc char start).
    let equal: Vec<(std::ops::Range<usize>, usize)> = if base == doc {
        vec![(0..base_b.len() - 1, 0)]
    } else {
        char_diff(base, doc)
            .ops()
            .iter()
            .filter(|op| matches!(op, similar::DiffOp::Equal { .. }))
            .map(|op| (op.old_range(), op.new_range().start))
            .collect()
    };
    let mut edits = Vec::new();
    for (range, text) in hunks(base, disk) {
        let within = equal
            .iter()
            .find(|(eq, _)| eq.start <= range.start && range.end <= eq.end);
        // Touches text the editors changed: their version wins.
        let Some((eq, doc_start)) = within else {
            continue;
        };
        let from = doc_start + (range.start - eq.start);
        let to = from + (range.end - range.start);
        edits.push(Edit {
            at: doc_b[from],
            delete: doc_b[to] - doc_b[from],
            insert: text,
        });
    }
    edits.reverse();
    edits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(text: &str, edits: &[Edit]) -> String {
        let mut s = text.to_owned();
        for e in edits {
            s.replace_range(e.at..e.at + e.delete, &e.insert);
        }
        s
    }

    #[test]
    fn a_disk_change_becomes_minimal_edits() {
        let base = "fn main() {\n    println!(\"hi\");\n}\n";
        let disk = "fn main() {\n    println!(\"hello\");\n}\n";
        let edits = merge(base, base, disk);
        assert_eq!(apply(base, &edits), disk);
        let touched: usize = edits.iter().map(|e| e.delete + e.insert.len()).sum();
        assert!(touched <= 6, "{edits:?}");
    }

    #[test]
    fn concurrent_changes_to_different_places_both_survive() {
        let base = "alpha\nbeta\ngamma\n";
        let doc = "ALPHA\nbeta\ngamma\n"; // an editor changed the first line
        let disk = "alpha\nbeta\ngamma!\n"; // a tool changed the last line
        assert_eq!(apply(doc, &merge(base, doc, disk)), "ALPHA\nbeta\ngamma!\n");
    }

    #[test]
    fn where_both_changed_the_same_text_the_editors_win() {
        let base = "let x = 1;\n";
        let doc = "let x = 2;\n";
        let disk = "let x = 3;\n";
        assert_eq!(apply(doc, &merge(base, doc, disk)), doc);
    }

    #[test]
    fn offsets_are_bytes_of_multibyte_text() {
        let base = "héllo wörld";
        let doc = "héllo wörld ☃";
        let disk = "HÉllo wörld";
        assert_eq!(apply(doc, &merge(base, doc, disk)), "HÉllo wörld ☃");
    }
}
