//! What a name may hold: the one rule for every name a person gives leasehold — plan
//! names, step codes, volatile field names, API token names, executor names and
//! worker (lease owner) ids.
//!
//! Names are shown in terminals, logs, the console and reports, and compared
//! character for character. A control character can forge a line of output or drive
//! a terminal; a character that draws nothing, or draws like a plain space, makes two
//! different names look the same (`dry\u{200b}-run` shows as `dry-run`). So a name
//! may not hold:
//!
//! - control characters (general category `Cc`): C0 U+0000–U+001F, DEL U+007F and
//!   C1 U+0080–U+009F;
//! - format characters (`Cf`): the zero-width space and joiners U+200B–U+200D, the
//!   direction marks U+200E/U+200F, the bidirectional embeddings and overrides
//!   U+202A–U+202E and isolates U+2066–U+2069, the word joiner and invisible
//!   operators U+2060–U+2064, the byte order mark U+FEFF, the soft hyphen U+00AD,
//!   the tag characters U+E0001 and U+E0020–U+E007F, and every other `Cf`;
//! - the line and paragraph separators U+2028 (`Zl`) and U+2029 (`Zp`);
//! - every space separator (`Zs`) but the plain space U+0020: U+00A0, U+1680,
//!   U+2000–U+200A, U+202F, U+205F, U+3000;
//! - variation selectors (U+FE00–U+FE0F, U+E0100–U+E01EF and the Mongolian
//!   U+180B–U+180D, U+180F), the combining grapheme joiner U+034F, and the
//!   characters that draw as a blank: the Hangul fillers U+115F, U+1160, U+3164,
//!   U+FFA0 and the blank braille pattern U+2800.
//!
//! The plain space U+0020 stays allowed where a field allowed it before (a plan
//! name such as `nightly import`); fields with a narrower alphabet (token and
//! executor names) keep refusing it by their own rule. Letters, marks, digits,
//! punctuation and symbols of every script are allowed (`déploiement`, `部署`).
//! General categories come from the `unicode-properties` tables.

use std::fmt;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

/// A character a name may not hold, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forbidden {
    /// A control character (C0, DEL, C1).
    Control(char),
    /// A format, separator or otherwise invisible character.
    Invisible(char),
}

impl Forbidden {
    /// The character itself.
    pub fn char(self) -> char {
        match self {
            Forbidden::Control(c) | Forbidden::Invisible(c) => c,
        }
    }
}

impl fmt::Display for Forbidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Forbidden::Control(c) => write!(f, "must not contain control characters (found {})", c.escape_default()),
            Forbidden::Invisible(c) => write!(
                f,
                "must not contain invisible or separator characters (found {})",
                code_point(*c)
            ),
        }
    }
}

/// `c` as `U+` and at least four uppercase hex digits (`U+200B`, `U+E0100`).
pub fn code_point(c: char) -> String {
    format!("U+{:04X}", u32::from(c))
}

/// A name that holds a character it may not; shown as `field: reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {forbidden}")]
pub struct NameError {
    /// The field, e.g. `name`, `steps[2].code`, `token name`, `--id`.
    pub field: String,
    /// The first character at fault.
    pub forbidden: Forbidden,
}

/// Characters of other categories that draw nothing or a blank: variation
/// selectors, the combining grapheme joiner, Hangul fillers, the blank braille pattern.
const INVISIBLE_EXTRA: &[(char, char)] = &[
    ('\u{034f}', '\u{034f}'),
    ('\u{115f}', '\u{1160}'),
    ('\u{180b}', '\u{180d}'),
    ('\u{180f}', '\u{180f}'),
    ('\u{2800}', '\u{2800}'),
    ('\u{3164}', '\u{3164}'),
    ('\u{fe00}', '\u{fe0f}'),
    ('\u{ffa0}', '\u{ffa0}'),
    ('\u{e0100}', '\u{e01ef}'),
];

/// Whether a name may hold `c`, and if not, why.
pub fn forbidden(c: char) -> Option<Forbidden> {
    if matches!(c, ' '..='~') {
        return None;
    }
    match c.general_category() {
        GeneralCategory::Control => Some(Forbidden::Control(c)),
        GeneralCategory::Format | GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator => {
            Some(Forbidden::Invisible(c))
        }
        GeneralCategory::SpaceSeparator => Some(Forbidden::Invisible(c)),
        _ if INVISIBLE_EXTRA.iter().any(|&(lo, hi)| (lo..=hi).contains(&c)) => Some(Forbidden::Invisible(c)),
        _ => None,
    }
}

/// The first character of `text` a name may not hold.
pub fn first_forbidden(text: &str) -> Option<Forbidden> {
    text.chars().find_map(forbidden)
}

/// Refuses `text`, the value of `field`, when it holds a character a name may not.
/// Emptiness and length are each field's own rule.
pub fn check(field: &str, text: &str) -> Result<(), NameError> {
    match first_forbidden(text) {
        None => Ok(()),
        Some(forbidden) => Err(NameError {
            field: field.to_owned(),
            forbidden,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every code point the module documentation lists as refused.
    const LISTED: &[(u32, u32)] = &[
        (0x00, 0x1f),
        (0x7f, 0x9f),
        (0xad, 0xad),
        (0xa0, 0xa0),
        (0x034f, 0x034f),
        (0x115f, 0x1160),
        (0x1680, 0x1680),
        (0x180b, 0x180f),
        (0x2000, 0x200f),
        (0x2028, 0x202f),
        (0x205f, 0x2064),
        (0x2066, 0x2069),
        (0x2800, 0x2800),
        (0x3000, 0x3000),
        (0x3164, 0x3164),
        (0xfe00, 0xfe0f),
        (0xfeff, 0xfeff),
        (0xffa0, 0xffa0),
        (0xe0001, 0xe0001),
        (0xe0020, 0xe007f),
        (0xe0100, 0xe01ef),
    ];

    fn listed() -> impl Iterator<Item = char> {
        LISTED
            .iter()
            .flat_map(|&(lo, hi)| lo..=hi)
            .map(|n| char::from_u32(n).unwrap())
    }

    #[test]
    fn every_listed_code_point_is_refused_with_its_field_and_code_point() {
        for c in listed() {
            let name = format!("dry{c}-run");
            let e = check("name", &name).unwrap_err();
            assert_eq!(e.forbidden.char(), c);
            let text = e.to_string();
            assert!(text.starts_with("name: must not contain "), "{text}");
            if u32::from(c) > 0x9f {
                assert_eq!(
                    text,
                    format!(
                        "name: must not contain invisible or separator characters (found U+{:04X})",
                        u32::from(c)
                    )
                );
            } else {
                assert!(
                    text.starts_with("name: must not contain control characters (found \\"),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn the_messages_name_the_field_and_the_character() {
        let e = check("steps[3].code", "dry\u{200b}-run").unwrap_err();
        assert_eq!(
            e.to_string(),
            "steps[3].code: must not contain invisible or separator characters (found U+200B)"
        );
        let e = check("name", "p\n[w1] delivered").unwrap_err();
        assert_eq!(e.to_string(), "name: must not contain control characters (found \\n)");
        let e = check("--id", "w\u{e0041}").unwrap_err();
        assert_eq!(
            e.to_string(),
            "--id: must not contain invisible or separator characters (found U+E0041)"
        );
        assert_eq!(
            first_forbidden("a\u{feff}b\u{2028}"),
            Some(Forbidden::Invisible('\u{feff}'))
        );
    }

    #[test]
    fn names_of_every_script_with_plain_spaces_are_allowed() {
        for good in [
            "dry-run",
            "nightly import",
            "déploiement",
            "部署",
            "развёртывание",
            "نشر",
            "परिनियोजन",
            "step_2.v1:acme-crm",
            "naïve café ñ ß",
            "emoji ✓ ★",
            "",
        ] {
            assert_eq!(check("name", good), Ok(()), "{good:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        /// Splicing a refused character anywhere into any allowed name makes it refused,
        /// naming that character.
        #[test]
        fn a_spliced_invisible_character_is_always_found(
            base in "[a-zA-Z0-9 ._:éß部署ёन्-]{0,30}",
            at in any::<prop::sample::Index>(),
            pick in any::<prop::sample::Index>(),
        ) {
            prop_assert_eq!(first_forbidden(&base), None);
            let all: Vec<char> = listed().collect();
            let bad = all[pick.index(all.len())];
            let chars: Vec<char> = base.chars().collect();
            let cut = at.index(chars.len() + 1);
            let name: String = chars[..cut].iter().chain([bad].iter()).chain(chars[cut..].iter()).collect();
            let e = check("name", &name).unwrap_err();
            prop_assert_eq!(e.forbidden.char(), bad);
        }

        /// The rule is total: any text is allowed or refused by its first bad character.
        #[test]
        fn any_text_is_allowed_or_refused_at_its_first_bad_character(text in any::<String>()) {
            match check("f", &text) {
                Ok(()) => prop_assert!(text.chars().all(|c| forbidden(c).is_none())),
                Err(e) => {
                    let first = text.chars().find(|c| forbidden(*c).is_some());
                    prop_assert_eq!(Some(e.forbidden.char()), first);
                }
            }
        }
    }
}
