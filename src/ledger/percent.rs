//! Percent-encoding for the user, password and database parts of database URLs.
//!
//! Contract: [`percent_decode`] turns `%XX` escapes into bytes and answers `None`
//! when an escape is malformed or the result is not UTF-8; [`percent_encode`] escapes
//! every byte but RFC 3986's unreserved ones, so that decoding gives the input back.

/// Decodes `%XX` escapes; `None` when an escape is malformed or the result is not
/// UTF-8.
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Encodes every byte but the unreserved ones (RFC 3986) as `%XX`.
pub(crate) fn percent_encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_bad_escapes_are_refused() {
        for text in ["p@ss:w/rd", "a b", "plain-._~", "ünï"] {
            assert_eq!(percent_decode(&percent_encode(text.as_bytes())).as_deref(), Some(text));
        }
        assert_eq!(percent_encode(b"a/b"), "a%2Fb");
        for bad in ["%zz", "%4", "%ff%fe"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
    }
}
