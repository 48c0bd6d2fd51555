//! W3C trace context (`traceparent`) of an attempt and of the spans of its deliveries.
//!
//! An attempt is enqueued under a trace: the caller's (`traceparent` given to the
//! enqueue) or a new one. The attempt's own context — its trace id and the span id of
//! the enqueue — is stored with it and never changes; every delivery's spans are its
//! children, and every `http:v1` request carries the `traceparent` of the step that
//! sent it.
//!
//! Span ids are derived, not drawn: the attempt's from its id, a delivery's spans from
//! the attempt's context, the delivery number and what the span covers. The same
//! attempt yields the same ids in every run (the simulator replays them), and no
//! random source is needed; ids stay unique because attempt ids and delivery numbers
//! are. A trace id is the parent's, or, for an attempt enqueued without one, derived
//! from the attempt's id (which carries 64 random bits).

use crate::ids::AttemptId;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// Why a `traceparent` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("traceparent {value:?} is invalid: {reason} (expected 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>)")]
pub struct TraceError {
    /// The value as given (at most its first 80 characters).
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// A W3C trace context: trace id, span id, flags, kept as its version-00 text
/// (`00-{trace}-{span}-{flags}`, 55 characters).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    text: [u8; 55],
}

/// The flags of a context this crate starts: sampled.
const SAMPLED: u8 = 0x01;

/// What a span of a delivery covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanRole {
    /// The whole delivery, from its claim to its ending write.
    Delivery,
    /// The claim that leased the attempt.
    Claim,
    /// One call of a step's executor: the step's ordinal, and the call's number in
    /// the delivery (1, 2, …: a step retried within the delivery is called again).
    Step(u32, u32),
    /// An ending write of the delivery (1, 2, …: a write whose reply was lost is
    /// sent again).
    End(u32),
}

impl TraceContext {
    /// The context of an attempt with id `attempt`: a child of `parent`, or the root
    /// of a new trace derived from the id.
    pub fn for_attempt(parent: Option<&TraceContext>, attempt: &AttemptId) -> TraceContext {
        let digest = Sha256::digest(format!("leasehold attempt trace\0{}", attempt.as_str()));
        let span_id = nonzero(digest[16..24].try_into().expect("8 bytes"));
        match parent {
            Some(p) => TraceContext::new(p.trace_id_bytes(), span_id, p.flags()),
            None => TraceContext::new(nonzero(digest[..16].try_into().expect("16 bytes")), span_id, SAMPLED),
        }
    }

    /// The context of a span of delivery `delivery` of the attempt whose context this
    /// is: same trace and flags, a span id of its own.
    pub fn span(&self, delivery: u32, role: SpanRole) -> TraceContext {
        let (kind, a, b) = match role {
            SpanRole::Delivery => (0u8, 0, 0),
            SpanRole::Claim => (1, 0, 0),
            SpanRole::Step(ordinal, call) => (2, ordinal, call),
            SpanRole::End(n) => (3, n, 0),
        };
        let mut h = Sha256::new();
        h.update(b"leasehold span\0");
        h.update(self.text);
        h.update(delivery.to_be_bytes());
        h.update([kind]);
        h.update(a.to_be_bytes());
        h.update(b.to_be_bytes());
        let digest = h.finalize();
        let span_id = nonzero(digest[..8].try_into().expect("8 bytes"));
        TraceContext::new(self.trace_id_bytes(), span_id, self.flags())
    }

    fn new(trace_id: [u8; 16], span_id: [u8; 8], flags: u8) -> TraceContext {
        let mut text = *b"00-00000000000000000000000000000000-0000000000000000-00";
        hex::encode_to_slice(trace_id, &mut text[3..35]).expect("32 digits");
        hex::encode_to_slice(span_id, &mut text[36..52]).expect("16 digits");
        hex::encode_to_slice([flags], &mut text[53..55]).expect("2 digits");
        TraceContext { text }
    }

    /// Its `traceparent` text (version 00).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.text).expect("ASCII hex digits and dashes")
    }

    /// The trace id, 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.as_str()[3..35]
    }

    /// The span id, 16 lowercase hex digits.
    pub fn span_id(&self) -> &str {
        &self.as_str()[36..52]
    }

    /// The trace id's bytes.
    pub fn trace_id_bytes(&self) -> [u8; 16] {
        lower_hex(self.trace_id()).expect("checked when made")
    }

    /// The span id's bytes.
    pub fn span_id_bytes(&self) -> [u8; 8] {
        lower_hex(self.span_id()).expect("checked when made")
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        lower_hex::<1>(&self.as_str()[53..55]).expect("checked when made")[0]
    }

    /// Parses a `traceparent` header value. Version `00` is exactly 55 characters; a
    /// later version (not `ff`) may append `-…` fields, which are dropped.
    pub fn parse(value: &str) -> Result<TraceContext, TraceError> {
        let refuse = |reason| TraceError {
            value: value.chars().take(80).collect(),
            reason,
        };
        let bytes = value.as_bytes();
        if !value.is_ascii() {
            return Err(refuse("it is not ASCII"));
        }
        if bytes.len() < 55 {
            return Err(refuse("too short"));
        }
        let version = lower_hex::<1>(&value[..2]).ok_or_else(|| refuse("the version is not 2 lowercase hex digits"))?;
        match (version[0], bytes.len()) {
            (0xff, _) => return Err(refuse("version ff is invalid")),
            (0x00, 55) => {}
            (0x00, _) => return Err(refuse("version 00 is exactly 55 characters")),
            (_, 55) => {}
            (_, _) if bytes[55] == b'-' => {}
            _ => return Err(refuse("a later version's fields must follow a '-'")),
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return Err(refuse("its fields are not separated by '-'"));
        }
        let hex_field = |range: std::ops::Range<usize>, reason| {
            let field = &bytes[range];
            match field.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)) {
                true => Ok(field.iter().any(|&b| b != b'0')),
                false => Err(refuse(reason)),
            }
        };
        if !hex_field(3..35, "the trace id is not 32 lowercase hex digits")? {
            return Err(refuse("the trace id is all zeros"));
        }
        if !hex_field(36..52, "the parent id is not 16 lowercase hex digits")? {
            return Err(refuse("the parent id is all zeros"));
        }
        hex_field(53..55, "the flags are not 2 lowercase hex digits")?;
        // Version 00's fields, as they are: a later version's are read as version 00.
        let mut text = [0u8; 55];
        text.copy_from_slice(&bytes[..55]);
        text[..2].copy_from_slice(b"00");
        Ok(TraceContext { text })
    }
}

/// `N` bytes from exactly `2N` lowercase hex digits.
fn lower_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let lower = text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let mut out = [0u8; N];
    (lower && text.len() == 2 * N && hex::decode_to_slice(text, &mut out).is_ok()).then_some(out)
}

/// The bytes, or (for the one all-zero value in 2^64 or 2^128) the same width ending
/// in 1: an all-zero id is invalid.
fn nonzero<const N: usize>(mut bytes: [u8; N]) -> [u8; N] {
    if bytes.iter().all(|&b| b == 0) {
        bytes[N - 1] = 1;
    }
    bytes
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceContext({self})")
    }
}

impl FromStr for TraceContext {
    type Err = TraceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TraceContext::parse(s)
    }
}

impl Serialize for TraceContext {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TraceContext {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        TraceContext::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_w3c_example_round_trips() {
        let t = TraceContext::parse(EXAMPLE).unwrap();
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.span_id(), "00f067aa0ba902b7");
        assert_eq!(t.flags(), 1);
        assert_eq!(t.to_string(), EXAMPLE);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<TraceContext>(&json).unwrap(), t);
    }

    #[test]
    fn malformed_values_are_refused_with_the_reason() {
        let cases = [
            ("", "too short"),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "trace id is not",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "trace id is all zeros",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "parent id is all zeros",
            ),
            ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version ff"),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                "exactly 55",
            ),
            ("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "separated"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", "flags"),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
                "later version",
            ),
            ("0é-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "not ASCII"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-é", "not ASCII"),
        ];
        for (value, reason) in cases {
            let e = TraceContext::parse(value).unwrap_err();
            assert!(e.to_string().contains(reason), "{value:?}: {e}");
        }
    }

    proptest::proptest! {
        /// Parsing is total: any text is a context or a refusal, never a panic, and a
        /// context prints back as a value that parses to itself.
        #[test]
        fn parsing_any_text_answers_and_round_trips(text in "(0[0-9a-f]-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2})|\\PC{0,70}") {
            if let Ok(t) = TraceContext::parse(&text) {
                proptest::prop_assert_eq!(TraceContext::parse(t.as_str()).unwrap(), t);
                proptest::prop_assert_eq!(t.as_str().len(), 55);
            }
        }
    }

    #[test]
    fn a_later_version_keeps_its_known_fields() {
        let t = TraceContext::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra").unwrap();
        assert_eq!(t.to_string(), EXAMPLE);
    }

    #[test]
    fn an_attempt_joins_its_parents_trace_with_a_span_of_its_own() {
        let parent = TraceContext::parse(EXAMPLE).unwrap();
        let a = TraceContext::for_attempt(Some(&parent), &AttemptId::new("att-1"));
        assert_eq!(a.trace_id(), parent.trace_id());
        assert_eq!(a.flags(), parent.flags());
        assert_ne!(a.span_id(), parent.span_id());
        assert_eq!(a, TraceContext::for_attempt(Some(&parent), &AttemptId::new("att-1")));
    }

    #[test]
    fn attempts_without_a_parent_start_traces_of_their_own() {
        let a = TraceContext::for_attempt(None, &AttemptId::new("att-1"));
        let b = TraceContext::for_attempt(None, &AttemptId::new("att-2"));
        assert_ne!(a.trace_id(), b.trace_id());
        assert_eq!(a.flags(), SAMPLED);
        assert_eq!(TraceContext::parse(&a.to_string()).unwrap(), a);
    }

    #[test]
    fn each_span_of_each_delivery_has_its_own_id() {
        let a = TraceContext::for_attempt(None, &AttemptId::new("att-1"));
        let roles = [
            SpanRole::Delivery,
            SpanRole::Claim,
            SpanRole::Step(1, 1),
            SpanRole::Step(2, 2),
            SpanRole::Step(2, 3),
            SpanRole::End(1),
            SpanRole::End(2),
        ];
        let mut ids: Vec<String> = (1..=3)
            .flat_map(|d| roles.iter().map(move |r| a.span(d, *r).span_id().to_owned()))
            .collect();
        ids.push(a.span_id().to_owned());
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n);
        assert!(roles.iter().all(|r| a.span(1, *r).trace_id() == a.trace_id()));
    }
}
