//! Terminal-safe text: every value a plan author, an executor or a damaged ledger
//! controls goes through [`clean`] before it is printed for a human, so that no
//! newline, carriage return, escape sequence or other control character in a plan
//! name, step code, error message, id or evidence value can forge a line of output
//! or drive the terminal. JSON output needs none of this: its encoder escapes them.

use std::borrow::Cow;

/// `text` with every control character (C0, DEL, C1) and every bidirectional
/// override escaped as `\n`, `\r`, `\t` or `\u{…}`; a backslash stays as it is.
/// Answers the text itself, unallocated, when it holds none.
pub fn clean(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Whether `c` must not reach a terminal as it is.
pub fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
}

/// The first 16 characters of a SHA-256 hex digest, or `<not a sha-256>` when the
/// stored value is not 64 hex digits (a damaged row is shown as damaged, never
/// sliced blindly).
pub fn short_sha(value: &str) -> &str {
    if value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        &value[..16]
    } else {
        "<not a sha-256>"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(clean("plain – text ✓"), Cow::Borrowed(_)));
        assert_eq!(
            clean("a\nb\r\x1b[31m\u{7f}\u{85}\u{202e}z"),
            "a\\nb\\r\\u{1b}[31m\\u{7f}\\u{85}\\u{202e}z"
        );
        assert_eq!(
            clean("[w1] x\n[w1] attempt y: delivered"),
            "[w1] x\\n[w1] attempt y: delivered"
        );
    }

    #[test]
    fn short_sha_shows_damage_instead_of_slicing() {
        let good = "0123456789abcdef".repeat(4);
        assert_eq!(short_sha(&good), "0123456789abcdef");
        for bad in ["bad", "", "é".repeat(32).as_str(), &"g".repeat(64)] {
            assert_eq!(short_sha(bad), "<not a sha-256>");
        }
    }
}
