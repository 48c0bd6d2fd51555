//! Canonical JSON and SHA-256 fingerprints.
//!
//! Canonical form: object keys sorted by their UTF-8 bytes, no insignificant
//! whitespace, and one number form (integers as integers, a float with no fractional
//! part as the integer it equals, any other float in its shortest round-trip form).
//! Every fingerprint leasehold takes is the SHA-256 of canonical JSON, so the same
//! value hashes the same however it was written.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The canonical JSON text of a value.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

/// The lowercase hex SHA-256 of the canonical JSON of a value.
pub fn fingerprint(value: &Value) -> String {
    sha256_hex(canonical_json(value).as_bytes())
}

/// The lowercase hex SHA-256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
    }
}

fn write_number(n: &serde_json::Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(f) = n.as_f64() {
        // Up to 2^53 every integer is a float, so an integral float there and the
        // integer of the same value are one number and take one (the integer) form.
        if f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0 {
            out.push_str(&(f as i64).to_string());
        } else {
            out.push_str(&serde_json::Number::from_f64(f).map_or_else(|| "null".to_owned(), |n| n.to_string()));
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    // serde_json's string escaping is already minimal and deterministic.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_sorted_and_whitespace_removed() {
        let v: Value = serde_json::from_str(r#"{ "b": [1, 2], "a": {"d": null, "c": true} }"#).unwrap();
        assert_eq!(canonical_json(&v), r#"{"a":{"c":true,"d":null},"b":[1,2]}"#);
    }

    #[test]
    fn integral_floats_take_the_integer_form() {
        assert_eq!(canonical_json(&json!(1.0)), "1");
        assert_eq!(canonical_json(&json!(-3.0)), "-3");
        assert_eq!(canonical_json(&json!(1.5)), "1.5");
        assert_eq!(fingerprint(&json!({"n": 2.0})), fingerprint(&json!({"n": 2})));
    }

    #[test]
    fn the_integer_form_reaches_two_to_the_53rd_and_stops_there() {
        let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        // 2^53 spelled as a float and as an integer: the same number, one form.
        assert_eq!(canonical_json(&parse("9007199254740992.0")), "9007199254740992");
        assert_eq!(canonical_json(&parse("-9007199254740992.0")), "-9007199254740992");
        // Past 2^53 not every integer is a float: floats keep the float form.
        assert_eq!(canonical_json(&parse("18014398509481984.0")), "1.8014398509481984e+16");
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(canonical_json(&json!("a\"b\n")), r#""a\"b\n""#);
    }

    #[test]
    fn fingerprint_is_sha256_of_canonical_text() {
        assert_eq!(
            fingerprint(&json!({})),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }
}
