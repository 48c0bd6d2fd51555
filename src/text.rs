//! Terminal-safe text: every value a plan author, an executor or a damaged ledger
//! controls goes through [`clean`] before it is printed for a human, so that no
//! newline, carriage return, escape sequence or other control character in a plan
//! name, step code, error message, id or evidence value can forge a line of output
//! or drive the terminal, and no invisible or separator character (a zero-width
//! space, a bidirectional override, a no-break space…) can make one stored name look
//! like another: each is shown as its `\u{…}` escape. The characters escaped are
//! exactly those no name may hold ([`leasehold_engine::names`]), so names stored
//! before that rule show their hidden characters. JSON output needs none of this:
//! its reader sees every character as it is.

use leasehold_engine::names::forbidden;
use std::borrow::Cow;

/// `text` with every character no name may hold — control characters (C0, DEL, C1),
/// format characters (zero-width, bidirectional, BOM…), separators other than the
/// plain space, variation selectors and blanks — escaped as `\n`, `\r`, `\t` or
/// `\u{…}`; a backslash stays as it is. Answers the text itself, unallocated, when
/// it holds none.
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

/// Whether `c` must not reach a terminal as it is: whether a name may not hold it
/// ([`leasehold_engine::names::forbidden`]).
pub fn needs_escape(c: char) -> bool {
    forbidden(c).is_some()
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
    fn invisible_and_separator_characters_are_escaped_and_letters_are_not() {
        assert_eq!(clean("dry\u{200b}-run"), "dry\\u{200b}-run");
        assert_eq!(
            clean("a\u{2028}b\u{2029}c\u{feff}d\u{a0}e\u{3000}f\u{ad}g\u{fe0f}h\u{e0041}"),
            "a\\u{2028}b\\u{2029}c\\u{feff}d\\u{a0}e\\u{3000}f\\u{ad}g\\u{fe0f}h\\u{e0041}"
        );
        for plain in ["déploiement", "部署", "two words", "naïve ✓"] {
            assert!(matches!(clean(plain), Cow::Borrowed(_)), "{plain}");
        }
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
