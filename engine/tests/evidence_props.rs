//! Properties of canonical JSON and of the semantic fingerprint.
//!
//! - The semantic fingerprint is unchanged by any edit (insert, replace, remove) of a
//!   volatile key at any depth of any receipt's evidence, and changed by any edit
//!   elsewhere that changes the stripped evidence; the comparison's difference list
//!   agrees (empty exactly when the fingerprints are equal).
//! - Canonical JSON is stable under key order, whitespace, number spelling (`2`,
//!   `2.0`, `2e0`) and string escapes: parse → print with shuffled keys and random
//!   whitespace → parse gives the same canonical text, and canonicalising is
//!   idempotent.

use leasehold_engine::canonical::{canonical_json, fingerprint, sha256_hex};
use leasehold_engine::evidence::{differences, semantic_fingerprint, VolatileKeys, VOLATILE_KEYS};
use leasehold_engine::{AttemptId, Plan, PlanId, PlanSpec, Receipt, ReceiptStatus, Timestamp};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Map, Number, Value};

/// The plan's own volatile field, stripped in addition to [`VOLATILE_KEYS`].
const PLAN_VOLATILE: &str = "run_id";

/// Keys the generated evidence uses: ordinary ones, awkward ones, and volatile ones.
const KEYS: &[&str] = &[
    "a",
    "b",
    "rows",
    "checks",
    "name",
    "x/y",
    "t~0",
    "é",
    "sandbox_id",
    "attempt_id",
    "target_receipt",
    "idempotency_key",
    PLAN_VOLATILE,
];

fn plan() -> Plan {
    let spec: PlanSpec = serde_json::from_value(json!({
        "name": "props",
        "recovery": "replay",
        "volatile_fields": [PLAN_VOLATILE],
        "steps": [
            {"code": "one", "executor": "dry-run:v1"},
            {"code": "two", "executor": "dry-run:v1"},
            {"code": "three", "executor": "dry-run:v1"},
        ],
    }))
    .expect("the spec is well formed");
    spec.into_plan(&["dry-run:v1"], PlanId::new("pln-props"), Timestamp::from_millis(0))
        .expect("the spec is valid")
}

fn volatile_keys() -> Vec<String> {
    VolatileKeys::for_plan(&plan()).iter().map(str::to_owned).collect()
}

fn is_volatile(key: &str) -> bool {
    key == PLAN_VOLATILE || VOLATILE_KEYS.contains(&key)
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(1i64 << 40)..(1i64 << 40)).prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        // Binary fractions are exact in every spelling, so a round trip cannot blur them.
        (-4096i32..4096).prop_map(|n| json!(f64::from(n) / 8.0)),
        "[a-z \"\\\\/\n\té~😀]{0,6}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect::<Map<_, _>>())),
        ]
    })
}

fn evidence() -> impl Strategy<Value = Value> {
    prop::collection::vec((prop::sample::select(KEYS), value()), 0..5)
        .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect::<Map<_, _>>()))
}

fn receipts(evidence: &[Value]) -> Vec<Receipt> {
    let codes = ["one", "two", "three"];
    evidence
        .iter()
        .zip(1u32..)
        .map(|(ev, ordinal)| {
            let text = canonical_json(ev);
            Receipt {
                payload: None,
                attempt_id: AttemptId::new("att-props"),
                ordinal,
                step_code: codes[(ordinal - 1) as usize].to_owned(),
                idempotency_key: format!("ik-{ordinal}"),
                executor: String::new(),
                target: String::new(),
                status: ReceiptStatus::Succeeded,
                evidence_sha256: Some(sha256_hex(text.as_bytes())),
                evidence: Some(text),
                target_receipt: None,
                error: None,
                started_at: None,
                finished_at: None,
            }
        })
        .collect()
}

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// Paths to every node of `v`, and whether each passes through a volatile key.
fn nodes(v: &Value, path: &mut Vec<Step>, under_volatile: bool, out: &mut Vec<(Vec<Step>, bool)>) {
    out.push((path.clone(), under_volatile));
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                path.push(Step::Key(k.clone()));
                nodes(child, path, under_volatile || is_volatile(k), out);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                path.push(Step::Index(i));
                nodes(child, path, under_volatile, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn all_nodes(v: &Value) -> Vec<(Vec<Step>, bool)> {
    let mut out = Vec::new();
    nodes(v, &mut Vec::new(), false, &mut out);
    out
}

fn node_mut<'a>(v: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(v, |node, step| match step {
        Step::Key(k) => node.get_mut(k.as_str()).expect("the path was taken from this value"),
        Step::Index(i) => node.get_mut(*i).expect("the path was taken from this value"),
    })
}

fn node<'a>(v: &'a Value, path: &[Step]) -> &'a Value {
    path.iter().fold(v, |node, step| match step {
        Step::Key(k) => &node[k.as_str()],
        Step::Index(i) => &node[*i],
    })
}

/// A receipt list of 1–3 receipts and the index of the one to edit.
fn attempt() -> impl Strategy<Value = (Vec<Value>, Index)> {
    (prop::collection::vec(evidence(), 1..=3), any::<Index>())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn editing_a_volatile_key_anywhere_never_changes_the_semantic_fingerprint(
        (evidence, which) in attempt(),
        target in any::<Index>(),
        key in any::<Index>(),
        replacement in value(),
        remove in any::<bool>(),
    ) {
        let plan = plan();
        let before = semantic_fingerprint(&plan, &receipts(&evidence));
        let mut edited = evidence.clone();
        let slot = which.index(edited.len());
        // Any object at any depth, inside volatile values too.
        let objects: Vec<Vec<Step>> = all_nodes(&edited[slot])
            .into_iter()
            .filter(|(p, _)| node(&edited[slot], p).is_object())
            .map(|(p, _)| p)
            .collect();
        let path = &objects[target.index(objects.len())];
        let keys = volatile_keys();
        let key = &keys[key.index(keys.len())];
        let object = node_mut(&mut edited[slot], path).as_object_mut().expect("an object node");
        if remove {
            object.remove(key);
        } else {
            object.insert(key.clone(), replacement);
        }
        let after = receipts(&edited);
        prop_assert_eq!(&before, &semantic_fingerprint(&plan, &after));
        prop_assert!(differences(&plan, &receipts(&evidence), &after).is_empty());
    }

    #[test]
    fn editing_anything_else_changes_the_semantic_fingerprint(
        (evidence, which) in attempt(),
        target in any::<Index>(),
        replacement in value(),
    ) {
        let plan = plan();
        let keys = VolatileKeys::for_plan(&plan);
        let before = semantic_fingerprint(&plan, &receipts(&evidence));
        let mut edited = evidence.clone();
        let slot = which.index(edited.len());
        let visible: Vec<Vec<Step>> = all_nodes(&edited[slot])
            .into_iter()
            .filter(|(_, under_volatile)| !under_volatile)
            .map(|(p, _)| p)
            .collect();
        let path = &visible[target.index(visible.len())];
        let node = node_mut(&mut edited[slot], path);
        prop_assume!(canonical_json(&keys.strip(node)) != canonical_json(&keys.strip(&replacement)));
        *node = replacement;
        let after = receipts(&edited);
        prop_assert_ne!(&before, &semantic_fingerprint(&plan, &after));
        prop_assert!(!differences(&plan, &receipts(&evidence), &after).is_empty());
    }

    #[test]
    fn adding_a_non_volatile_key_anywhere_changes_the_semantic_fingerprint(
        (evidence, which) in attempt(),
        target in any::<Index>(),
        added in value(),
    ) {
        let plan = plan();
        let before = semantic_fingerprint(&plan, &receipts(&evidence));
        let mut edited = evidence.clone();
        let slot = which.index(edited.len());
        let objects: Vec<Vec<Step>> = all_nodes(&edited[slot])
            .into_iter()
            .filter(|(p, under_volatile)| !under_volatile && node(&edited[slot], p).is_object())
            .map(|(p, _)| p)
            .collect();
        let path = &objects[target.index(objects.len())];
        node_mut(&mut edited[slot], path)
            .as_object_mut()
            .expect("an object node")
            .insert("fresh".to_owned(), added);
        let after = receipts(&edited);
        prop_assert_ne!(&before, &semantic_fingerprint(&plan, &after));
        let d = differences(&plan, &receipts(&evidence), &after);
        prop_assert_eq!(d.len(), 1);
        prop_assert!(d[0].path.ends_with("/fresh"), "{}", d[0].path);
    }

    #[test]
    fn canonical_json_is_stable_under_key_order_whitespace_and_spelling(v in value(), seed in any::<u64>()) {
        let canonical = canonical_json(&v);
        let mut rng = Rng(seed);
        let mut text = String::new();
        print_scrambled(&v, &mut rng, &mut text);
        let reparsed: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(&canonical, &canonical_json(&reparsed), "scrambled text: {}", text);
        prop_assert_eq!(fingerprint(&v), fingerprint(&reparsed));
        let again: Value = serde_json::from_str(&canonical).expect("canonical text is JSON");
        prop_assert_eq!(&canonical, &canonical_json(&again));
    }
}

/// splitmix64: the scrambling choices of one test case.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn whitespace(rng: &mut Rng, out: &mut String) {
    for _ in 0..rng.below(3) {
        out.push([' ', '\n', '\t', '\r'][rng.below(4)]);
    }
}

/// Prints `v` as valid JSON with shuffled keys, random whitespace, and randomly
/// chosen (but equal) spellings of numbers and strings.
fn print_scrambled(v: &Value, rng: &mut Rng, out: &mut String) {
    whitespace(rng, out);
    match v {
        Value::Null | Value::Bool(_) => out.push_str(&v.to_string()),
        Value::Number(n) => print_number(n, rng, out),
        Value::String(s) => print_string(s, rng, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    whitespace(rng, out);
                    out.push(',');
                }
                print_scrambled(item, rng, out);
                whitespace(rng, out);
            }
            whitespace(rng, out);
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            for i in (1..entries.len()).rev() {
                entries.swap(i, rng.below(i + 1));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                whitespace(rng, out);
                print_string(k, rng, out);
                whitespace(rng, out);
                out.push(':');
                print_scrambled(item, rng, out);
                whitespace(rng, out);
            }
            whitespace(rng, out);
            out.push('}');
        }
    }
    whitespace(rng, out);
}

fn print_number(n: &Number, rng: &mut Rng, out: &mut String) {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() < (1 << 53)) {
        match rng.below(3) {
            0 => out.push_str(&i.to_string()),
            1 => out.push_str(&format!("{i}.0")),
            _ => out.push_str(&format!("{i}e0")),
        }
    } else if let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.abs() < EXACT) {
        match rng.below(3) {
            0 => out.push_str(&format!("{f:?}")),
            1 => out.push_str(&format!("{f:e}")),
            _ => out.push_str(&format!("{:.3}", f)),
        }
    } else {
        out.push_str(&n.to_string());
    }
}

fn print_string(s: &str, rng: &mut Rng, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let must_escape = c == '"' || c == '\\' || (c as u32) < 0x20;
        if must_escape || rng.below(4) == 0 {
            if !must_escape && c == '/' && rng.below(2) == 0 {
                out.push_str("\\/");
                continue;
            }
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out.push('"');
}

#[test]
fn scrambled_printing_really_scrambles() {
    let v = json!({"b": [1, 2.5, "é/"], "a": {"d": null, "c": true}});
    let texts: std::collections::BTreeSet<String> = (0..16)
        .map(|seed| {
            let mut out = String::new();
            print_scrambled(&v, &mut Rng(seed), &mut out);
            out
        })
        .collect();
    assert!(texts.len() > 8, "{texts:?}");
    for text in &texts {
        assert_eq!(
            canonical_json(&serde_json::from_str(text).unwrap()),
            r#"{"a":{"c":true,"d":null},"b":[1,2.5,"é/"]}"#
        );
    }
}
