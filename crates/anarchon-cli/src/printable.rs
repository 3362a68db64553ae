//! Text from a store or a command, made safe to print on a terminal.
//!
//! A run's recorded error holds the tail of a command's stderr, and anyone
//! who can write the store can plant any record. Printed raw, such text can
//! carry terminal escape sequences (a clipboard write, a hidden link, cursor
//! moves that paint a fake `succeeded` row) or bidi overrides that make a
//! line read differently from what it holds. Every control character and
//! every bidi control is shown as a `\u{..}` escape instead.

use std::fmt::Write as _;

/// Whether `c` changes the direction text is laid out in.
fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// `text` with every control character and bidi control escaped as
/// `\u{..}`; everything else as it was.
pub(crate) fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || is_bidi_control(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_sequences_and_bidi_controls() {
        let planted = "\u{1b}]52;c;ZXZpbA==\u{7}done\r\u{1b}[2K\u{202e}deliver\u{9b}31m";
        let shown = printable(planted);
        assert!(
            !shown.chars().any(|c| c.is_control() || is_bidi_control(c)),
            "{shown:?}"
        );
        assert_eq!(
            shown,
            "\\u{1b}]52;c;ZXZpbA==\\u{7}done\\u{d}\\u{1b}[2K\\u{202e}deliver\\u{9b}31m"
        );
    }

    #[test]
    fn leaves_ordinary_text_alone() {
        let text = "exit status 1; stderr: naïve café 東京 ✓";
        assert_eq!(printable(text), text);
    }
}
