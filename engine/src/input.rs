//! Template input: a plan's `[input]` table, the check of an attempt's input
//! against it, and the step payloads that input resolves.
//!
//! A plan that declares `[input]` is a template: each attempt carries input of its
//! own, and a step payload refers to it with `{"$input": "/pointer"}` (a JSON
//! pointer into the input, RFC 6901). Registration checks every reference against
//! the declared fields ([`check_references`]); an enqueue checks the input
//! ([`check_input`]) and freezes the resolved payloads on the attempt's receipts
//! ([`resolve`]), so a receipt never changes with the template or the input.

use crate::canonical::canonical_json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The key of a reference: `{"$input": "/order/id"}`.
pub const INPUT_REF: &str = "$input";
/// The largest input an attempt may carry, as canonical JSON.
pub const MAX_INPUT_BYTES: usize = 64 * 1024;
/// The most fields an `[input]` table may declare.
pub const MAX_INPUT_FIELDS: usize = 100;

/// The JSON types an input field may have.
pub const TYPES: &[&str] = &["string", "integer", "number", "boolean", "object", "array"];

/// One field of a plan's `[input]` table, e.g.
/// `order = { type = "integer", required = true }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputField {
    /// Its JSON type, one of [`TYPES`] (text, so that a bad value names the field).
    #[serde(rename = "type")]
    pub kind: String,
    /// Whether every attempt must give it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub required: bool,
    /// The largest canonical JSON it may take, in bytes (at most [`MAX_INPUT_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A plan's `[input]` table: field name to field.
pub type InputSchema = BTreeMap<String, InputField>;

/// Why a schema, a reference or an input is refused; the text names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InputError {
    /// The field at fault, e.g. `input.order` or `steps[1].payload.body`.
    pub field: String,
    /// Why.
    pub reason: String,
}

fn error(field: impl Into<String>, reason: impl Into<String>) -> InputError {
    InputError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Checks an `[input]` table: names are valid names, types known, limits in range.
pub fn check_schema(schema: &InputSchema) -> Result<(), InputError> {
    if schema.len() > MAX_INPUT_FIELDS {
        return Err(error(
            "input",
            format!("{} fields exceeds the limit of {MAX_INPUT_FIELDS}", schema.len()),
        ));
    }
    for (name, field) in schema {
        let at = format!("input.{name}");
        if name.is_empty() || name.contains('/') || name.contains('~') {
            return Err(error(at, "a field name must not be empty nor hold '/' or '~'"));
        }
        crate::names::check(&at, name).map_err(|e| error(&at, e.to_string()))?;
        if !TYPES.contains(&field.kind.as_str()) {
            let expected = TYPES.join(", ");
            return Err(error(
                format!("{at}.type"),
                format!("{:?} is not a type (expected one of: {expected})", field.kind),
            ));
        }
        match field.max_bytes {
            Some(0) => return Err(error(format!("{at}.max_bytes"), "must be at least 1")),
            Some(n) if n > MAX_INPUT_BYTES as u64 => {
                return Err(error(
                    format!("{at}.max_bytes"),
                    format!("{n} exceeds the limit of {MAX_INPUT_BYTES}"),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks every `{"$input": …}` reference in the steps' payloads against `schema`
/// (`None`: the plan declares no input, so no payload may refer to it). `steps` are
/// (index, payload) pairs.
pub fn check_references<'a>(
    schema: Option<&InputSchema>,
    steps: impl IntoIterator<Item = (usize, &'a Value)>,
) -> Result<(), InputError> {
    for (index, payload) in steps {
        let mut refs = Vec::new();
        references(payload, &format!("steps[{index}].payload"), &mut refs)?;
        for (at, pointer) in refs {
            let Some(schema) = schema else {
                return Err(error(at, "refers to $input, but the plan declares no [input]"));
            };
            check_pointer(schema, &at, pointer)?;
        }
    }
    Ok(())
}

/// Collects the references in `value` (found at `at`) with where each is.
fn references<'v>(value: &'v Value, at: &str, out: &mut Vec<(String, &'v str)>) -> Result<(), InputError> {
    match value {
        Value::Object(map) if map.contains_key(INPUT_REF) => out.push((at.to_owned(), reference(map, at)?)),
        Value::Object(map) => {
            for (k, v) in map {
                references(v, &format!("{at}.{k}"), out)?;
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                references(v, &format!("{at}[{i}]"), out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The pointer of a reference object: it must be the object's only key, and text.
fn reference<'v>(map: &'v Map<String, Value>, at: &str) -> Result<&'v str, InputError> {
    match (map.len(), map.get(INPUT_REF)) {
        (1, Some(Value::String(pointer))) => Ok(pointer),
        _ => Err(error(
            at,
            "a {\"$input\": …} reference is an object with that one key, whose value is a JSON pointer",
        )),
    }
}

/// A pointer names a declared field (`/field…`) or the whole input (``), and goes
/// below a field only when the field is an object or an array.
fn check_pointer(schema: &InputSchema, at: &str, pointer: &str) -> Result<(), InputError> {
    if pointer.is_empty() {
        return Ok(());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(error(
            at,
            format!("{pointer:?} is not a JSON pointer (it must start with '/')"),
        ));
    };
    let (name, below) = match rest.split_once('/') {
        Some((name, below)) => (name, Some(below)),
        None => (rest, None),
    };
    let name = name.replace("~1", "/").replace("~0", "~");
    let Some(field) = schema.get(&name) else {
        let known: Vec<&str> = schema.keys().map(String::as_str).collect();
        return Err(error(
            at,
            format!("{pointer:?} names no field of [input] (fields: {})", known.join(", ")),
        ));
    };
    if below.is_some() && !matches!(field.kind.as_str(), "object" | "array") {
        return Err(error(
            at,
            format!("{pointer:?} goes below field {name:?}, which is of type {}", field.kind),
        ));
    }
    Ok(())
}

/// Checks an attempt's input against `schema`: a JSON object of declared fields,
/// each of its type and within its limit, every required one present, the whole
/// within [`MAX_INPUT_BYTES`]. Answers its canonical JSON.
pub fn check_input(schema: &InputSchema, input: &Value) -> Result<String, InputError> {
    let Value::Object(fields) = input else {
        return Err(error("input", format!("must be a JSON object, not {}", type_of(input))));
    };
    let text = canonical_json(input);
    if text.len() > MAX_INPUT_BYTES {
        return Err(error(
            "input",
            format!("{} bytes exceeds the limit of {MAX_INPUT_BYTES} bytes", text.len()),
        ));
    }
    for (name, value) in fields {
        let Some(field) = schema.get(name) else {
            let known: Vec<&str> = schema.keys().map(String::as_str).collect();
            return Err(error(
                format!("input.{name}"),
                format!("is not a field of the plan's [input] (fields: {})", known.join(", ")),
            ));
        };
        check_field(name, field, value)?;
    }
    if let Some((name, _)) = schema.iter().find(|(n, f)| f.required && !fields.contains_key(*n)) {
        return Err(error(format!("input.{name}"), "is required"));
    }
    Ok(text)
}

fn check_field(name: &str, field: &InputField, value: &Value) -> Result<(), InputError> {
    let at = format!("input.{name}");
    if !has_type(value, &field.kind) {
        return Err(error(at, format!("expected {}, found {}", field.kind, type_of(value))));
    }
    let bytes = canonical_json(value).len();
    match field.max_bytes {
        Some(max) if bytes as u64 > max => Err(error(at, format!("{bytes} bytes exceeds its max_bytes of {max}"))),
        _ => Ok(()),
    }
}

fn has_type(value: &Value, kind: &str) -> bool {
    match kind {
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        _ => false,
    }
}

/// The JSON type of a value, as a message names it.
fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `payload` with every reference replaced by what its pointer names in `input`
/// (checked by [`check_input`]): an optional field the input leaves out resolves to
/// `null`; a pointer below a field that names nothing is refused, naming both.
pub fn resolve(payload: &Value, input: &Value, at: &str) -> Result<Value, InputError> {
    match payload {
        Value::Object(map) if map.contains_key(INPUT_REF) => {
            let pointer = reference(map, at)?;
            lookup(input, pointer, at)
        }
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                out.insert(k.clone(), resolve(v, input, &format!("{at}.{k}"))?);
            }
            Ok(Value::Object(out))
        }
        Value::Array(items) => {
            let at = |i: usize| format!("{at}[{i}]");
            let resolved: Result<Vec<Value>, InputError> = items
                .iter()
                .enumerate()
                .map(|(i, v)| resolve(v, input, &at(i)))
                .collect();
            Ok(Value::Array(resolved?))
        }
        other => Ok(other.clone()),
    }
}

fn lookup(input: &Value, pointer: &str, at: &str) -> Result<Value, InputError> {
    if let Some(found) = input.pointer(pointer) {
        return Ok(found.clone());
    }
    let field = pointer.trim_start_matches('/').split('/').next().unwrap_or_default();
    let field = field.replace("~1", "/").replace("~0", "~");
    match input.get(&field) {
        None => Ok(Value::Null),
        Some(_) => Err(error(
            format!("input.{field}"),
            format!("{pointer:?} names nothing in it, and {at} refers to it"),
        )),
    }
}

/// An attempt's input, checked against its template, with the payloads it
/// resolves: what an enqueue freezes on the attempt and its receipts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The input's canonical JSON.
    pub text: String,
    /// Its SHA-256: the attempt's input fingerprint.
    pub sha256: String,
    /// Each plan step's resolved payload (canonical JSON), by step code.
    pub payloads: BTreeMap<String, String>,
}

/// Checks `input` against `plan`'s `[input]` table and resolves every step's
/// payload; a resolved payload is held to [`crate::plan::MAX_PAYLOAD_BYTES`] as a
/// plan's is. A plan without `[input]` takes no input.
pub fn prepare(plan: &crate::model::Plan, input: &Value) -> Result<Prepared, InputError> {
    let Some(schema) = &plan.input else {
        return Err(error("input", format!("plan {} declares no [input]", plan.id)));
    };
    let text = check_input(schema, input)?;
    let mut payloads = BTreeMap::new();
    for (index, step) in plan.steps.iter().enumerate() {
        let at = format!("steps[{index}].payload");
        let resolved = canonical_json(&resolve(&step.payload, input, &at)?);
        let max = crate::plan::MAX_PAYLOAD_BYTES;
        if resolved.len() > max {
            let why = format!(
                "{} bytes once resolved from the input exceeds the limit of {max} bytes",
                resolved.len()
            );
            return Err(error(at, why));
        }
        payloads.insert(step.code.clone(), resolved);
    }
    Ok(Prepared {
        sha256: crate::canonical::sha256_hex(text.as_bytes()),
        text,
        payloads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> InputSchema {
        serde_json::from_value(json!({
            "order": {"type": "object", "required": true},
            "note": {"type": "string", "max_bytes": 10},
            "count": {"type": "integer"},
        }))
        .unwrap()
    }

    #[test]
    fn references_must_name_declared_fields() {
        let s = schema();
        let ok = json!({"id": {"$input": "/order/id"}, "all": {"$input": ""}, "n": [{"$input": "/count"}]});
        check_references(Some(&s), [(0, &ok)]).unwrap();
        let unknown = json!({"id": {"$input": "/customer"}});
        let e = check_references(Some(&s), [(2, &unknown)]).unwrap_err();
        assert_eq!(e.field, "steps[2].payload.id");
        assert!(e.reason.contains("names no field"), "{e}");
        let below = json!({"x": {"$input": "/count/low"}});
        assert!(check_references(Some(&s), [(0, &below)])
            .unwrap_err()
            .reason
            .contains("integer"));
        let not_pointer = json!({"x": {"$input": "order"}});
        assert!(check_references(Some(&s), [(0, &not_pointer)]).is_err());
        let extra_key = json!({"x": {"$input": "/order", "y": 1}});
        assert!(check_references(Some(&s), [(0, &extra_key)]).is_err());
        let e = check_references(None, [(1, &ok)]).unwrap_err();
        assert!(e.reason.contains("declares no [input]"), "{e}");
    }

    #[test]
    fn schemas_name_bad_types_and_limits() {
        let bad: InputSchema = serde_json::from_value(json!({"a": {"type": "int"}})).unwrap();
        assert_eq!(check_schema(&bad).unwrap_err().field, "input.a.type");
        let zero: InputSchema = serde_json::from_value(json!({"a": {"type": "string", "max_bytes": 0}})).unwrap();
        assert_eq!(check_schema(&zero).unwrap_err().field, "input.a.max_bytes");
        let slash: InputSchema = serde_json::from_value(json!({"a/b": {"type": "string"}})).unwrap();
        assert_eq!(check_schema(&slash).unwrap_err().field, "input.a/b");
        check_schema(&schema()).unwrap();
    }

    #[test]
    fn input_is_checked_field_by_field() {
        let s = schema();
        let text = check_input(&s, &json!({"order": {"id": 7}, "count": 2})).unwrap();
        assert_eq!(text, r#"{"count":2,"order":{"id":7}}"#);
        let cases = [
            (json!({"count": 2}), "input.order", "is required"),
            (
                json!({"order": {}, "count": "2"}),
                "input.count",
                "expected integer, found string",
            ),
            (json!({"order": {}, "count": 2.5}), "input.count", "found number"),
            (
                json!({"order": {}, "note": "far too long"}),
                "input.note",
                "max_bytes of 10",
            ),
            (json!({"order": {}, "who": 1}), "input.who", "is not a field"),
            (json!([1]), "input", "JSON object"),
        ];
        for (input, field, why) in cases {
            let e = check_input(&s, &input).unwrap_err();
            assert_eq!(e.field, field, "{input}");
            assert!(e.reason.contains(why), "{e}");
        }
        let big = json!({"order": {"blob": "x".repeat(MAX_INPUT_BYTES)}});
        assert!(check_input(&s, &big).unwrap_err().reason.contains("exceeds the limit"));
    }

    #[test]
    fn payloads_resolve_from_the_input() {
        let input = json!({"order": {"id": 7, "lines": [1, 2]}, "count": 3});
        let payload = json!({"body": {"id": {"$input": "/order/id"}, "n": {"$input": "/count"}},
                             "lines": [{"$input": "/order/lines"}], "note": {"$input": "/note"}, "url": "u"});
        let resolved = resolve(&payload, &input, "steps[0].payload").unwrap();
        assert_eq!(
            resolved,
            json!({"body": {"id": 7, "n": 3}, "lines": [[1, 2]], "note": null, "url": "u"})
        );
        let missing = json!({"x": {"$input": "/order/customer"}});
        let e = resolve(&missing, &input, "steps[1].payload").unwrap_err();
        assert_eq!(e.field, "input.order");
        assert!(e.reason.contains("steps[1].payload.x"), "{e}");
    }
}
