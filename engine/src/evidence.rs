//! Evidence integrity, fingerprints of an attempt's evidence, and the comparison of
//! two attempts.
//!
//! Contract:
//! - **Integrity.** A receipt's evidence is stored as canonical JSON text with its
//!   SHA-256 ([`crate::transition::complete_step`] writes both). [`verify_receipt`]
//!   recomputes the hash of the stored text and also refuses text that is not valid
//!   canonical JSON, so an edit made behind leasehold's back is caught even when the
//!   editor recomputed nothing. A receipt that has not succeeded may have no
//!   evidence; a SUCCEEDED one must have both evidence and hash.
//! - **Raw fingerprint** ([`raw_fingerprint`]): SHA-256 of the canonical JSON of the
//!   ordered `[ordinal, step code, status, evidence SHA-256]` list. It changes
//!   whenever any byte of any evidence changes, volatile identity included, so two
//!   deliveries of the same plan almost always differ in it.
//! - **Semantic fingerprint** ([`semantic_fingerprint`]): SHA-256 of the canonical
//!   JSON of the ordered `[ordinal, step code, status, evidence]` list, where every
//!   object key named in [`VOLATILE_KEYS`] or in the plan's `volatile_fields` is
//!   removed from the evidence at any depth (see [`VolatileKeys`]). Target receipts
//!   are not part of it. It is computed, never stored.
//! - **Comparison** ([`compare`]): both attempts must belong to the plan and be
//!   complete (attempt SUCCEEDED, command DELIVERED, every receipt SUCCEEDED, evidence
//!   intact); then steps and semantic fingerprints are compared and every differing
//!   field is listed as an RFC 6901 JSON pointer into the *semantic view*
//!   ([`semantic_view`]): `{"receipts": [{"ordinal", "step_code", "status",
//!   "evidence"}, …]}`, with receipts in ordinal order and array indices 0-based, so
//!   `/receipts/1/evidence/checks/accounts/0/1` is a field of the receipt with
//!   ordinal 2. Volatile keys are stripped before the diff, so they never appear.
//!
//! Evidence text that does not parse as JSON takes part in the semantic view as
//! `{"$unparseable": TEXT}`; [`verify_receipt`] reports it as tampered anyway.

use crate::canonical::{canonical_json, fingerprint, sha256_hex};
use crate::ids::{AttemptId, CommandId, PlanId};
use crate::model::{Action, AttemptRecord, AttemptStatus, CommandStatus, Plan, Receipt, ReceiptStatus};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::fmt;

/// Object keys that carry volatile identity and are stripped, at any depth, from
/// evidence before the semantic fingerprint is taken: sandbox and execution ids,
/// attempt/receipt/approval ids, idempotency and step keys, and target receipts.
/// A plan's own `volatile_fields` are stripped as well.
pub const VOLATILE_KEYS: &[&str] = &[
    "sandbox_id",
    "sandbox",
    "execution_id",
    "attempt_id",
    "receipt_id",
    "approval_id",
    "idempotency_key",
    "step_key",
    "target_receipt",
];

/// The key under which evidence text that is not JSON enters the semantic view.
pub const UNPARSEABLE_KEY: &str = "$unparseable";

/// Names one receipt: its attempt, ordinal and step code.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReceiptRef {
    /// The attempt it belongs to.
    pub attempt_id: AttemptId,
    /// Its 1-based position.
    pub ordinal: u32,
    /// The step it ran.
    pub step_code: String,
}

impl ReceiptRef {
    /// The reference of a receipt.
    pub fn of(receipt: &Receipt) -> Self {
        Self {
            attempt_id: receipt.attempt_id.clone(),
            ordinal: receipt.ordinal,
            step_code: receipt.step_code.clone(),
        }
    }
}

impl fmt::Display for ReceiptRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "receipt {} ({}) of attempt {}",
            self.ordinal, self.step_code, self.attempt_id
        )
    }
}

/// A receipt whose stored evidence fails verification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{receipt}: {problem}")]
pub struct TamperError {
    /// The receipt at fault.
    pub receipt: ReceiptRef,
    /// What is wrong with it.
    pub problem: TamperProblem,
}

/// What is wrong with a receipt's stored evidence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TamperProblem {
    /// The stored text does not hash to the stored SHA-256.
    #[error("evidence hashes to {} but its recorded SHA-256 is {}", short(.computed), short(.recorded))]
    ShaMismatch {
        /// SHA-256 of the stored text.
        computed: String,
        /// The SHA-256 on record.
        recorded: String,
    },
    /// The stored text is not JSON.
    #[error("evidence is not valid JSON")]
    NotJson,
    /// The stored text is JSON but not in canonical form.
    #[error("evidence is not canonical JSON")]
    NotCanonical,
    /// A SUCCEEDED receipt has no evidence.
    #[error("it is SUCCEEDED but has no evidence")]
    MissingEvidence,
    /// Evidence without a recorded SHA-256.
    #[error("its evidence has no recorded SHA-256")]
    MissingSha,
    /// A recorded SHA-256 without evidence.
    #[error("it records a SHA-256 but has no evidence")]
    ShaWithoutEvidence,
}

/// The first 16 hex digits of a fingerprint, for messages.
fn short(hash: &str) -> String {
    match hash.get(..16) {
        Some(prefix) if hash.len() > 16 => format!("{prefix}…"),
        _ => hash.to_owned(),
    }
}

/// Verifies one receipt's stored evidence: its SHA-256 matches the stored text and
/// the text is canonical JSON. A receipt with neither evidence nor hash passes
/// unless it is SUCCEEDED.
pub fn verify_receipt(receipt: &Receipt) -> Result<(), TamperError> {
    let fail = |problem| {
        Err(TamperError {
            receipt: ReceiptRef::of(receipt),
            problem,
        })
    };
    match (&receipt.evidence, &receipt.evidence_sha256) {
        (None, None) if receipt.status == ReceiptStatus::Succeeded => fail(TamperProblem::MissingEvidence),
        (None, None) => Ok(()),
        (None, Some(_)) => fail(TamperProblem::ShaWithoutEvidence),
        (Some(_), None) => fail(TamperProblem::MissingSha),
        (Some(text), Some(recorded)) => {
            let computed = sha256_hex(text.as_bytes());
            if &computed != recorded {
                return fail(TamperProblem::ShaMismatch {
                    computed,
                    recorded: recorded.clone(),
                });
            }
            match serde_json::from_str::<Value>(text) {
                Err(_) => fail(TamperProblem::NotJson),
                Ok(value) if canonical_json(&value) != *text => fail(TamperProblem::NotCanonical),
                Ok(_) => Ok(()),
            }
        }
    }
}

/// Every receipt of a list that fails [`verify_receipt`], in list order.
pub fn verify_receipts(receipts: &[Receipt]) -> Vec<TamperError> {
    receipts.iter().filter_map(|r| verify_receipt(r).err()).collect()
}

/// The set of object keys stripped from evidence for one plan: [`VOLATILE_KEYS`]
/// plus the plan's `volatile_fields`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolatileKeys(BTreeSet<String>);

impl VolatileKeys {
    /// The keys stripped for `plan`.
    pub fn for_plan(plan: &Plan) -> Self {
        Self::with_extra(&plan.volatile_fields)
    }

    /// [`VOLATILE_KEYS`] plus `extra`.
    pub fn with_extra(extra: &[String]) -> Self {
        let mut keys: BTreeSet<String> = VOLATILE_KEYS.iter().map(|k| (*k).to_owned()).collect();
        keys.extend(extra.iter().cloned());
        Self(keys)
    }

    /// Whether an object key is stripped.
    pub fn contains(&self, key: &str) -> bool {
        self.0.contains(key)
    }

    /// Every stripped key, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// A copy of `value` with every volatile key removed from every object, at any
    /// depth (inside arrays too).
    pub fn strip(&self, value: &Value) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .filter(|(k, _)| !self.contains(k))
                    .map(|(k, v)| (k.clone(), self.strip(v)))
                    .collect::<Map<String, Value>>(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.strip(v)).collect()),
            other => other.clone(),
        }
    }
}

/// Receipts in ordinal order (they normally are already).
fn by_ordinal(receipts: &[Receipt]) -> Vec<&Receipt> {
    let mut ordered: Vec<&Receipt> = receipts.iter().collect();
    ordered.sort_by_key(|r| r.ordinal);
    ordered
}

/// A receipt's evidence with volatile keys stripped; `null` when it has none.
fn semantic_evidence(receipt: &Receipt, keys: &VolatileKeys) -> Value {
    match &receipt.evidence {
        None => Value::Null,
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(value) => keys.strip(&value),
            Err(_) => json!({ UNPARSEABLE_KEY: text }),
        },
    }
}

/// The raw evidence fingerprint: SHA-256 of the canonical JSON of the ordered
/// `[ordinal, step code, status, evidence SHA-256]` list.
pub fn raw_fingerprint(receipts: &[Receipt]) -> String {
    let items: Vec<Value> = by_ordinal(receipts)
        .into_iter()
        .map(|r| json!([r.ordinal, r.step_code, r.status.as_str(), r.evidence_sha256]))
        .collect();
    fingerprint(&Value::Array(items))
}

/// The semantic fingerprint: SHA-256 of the canonical JSON of the ordered
/// `[ordinal, step code, status, evidence]` list, evidence stripped of the plan's
/// [`VolatileKeys`]. Target receipts are not part of it.
pub fn semantic_fingerprint(plan: &Plan, receipts: &[Receipt]) -> String {
    let keys = VolatileKeys::for_plan(plan);
    let items: Vec<Value> = by_ordinal(receipts)
        .into_iter()
        .map(|r| json!([r.ordinal, r.step_code, r.status.as_str(), semantic_evidence(r, &keys)]))
        .collect();
    fingerprint(&Value::Array(items))
}

/// The document that comparisons diff: `{"receipts": [{"ordinal", "step_code",
/// "status", "evidence"}, …]}` in ordinal order, evidence stripped of the plan's
/// [`VolatileKeys`]. It holds exactly what the semantic fingerprint hashes.
pub fn semantic_view(plan: &Plan, receipts: &[Receipt]) -> Value {
    let keys = VolatileKeys::for_plan(plan);
    let items: Vec<Value> = by_ordinal(receipts)
        .into_iter()
        .map(|r| {
            json!({
                "ordinal": r.ordinal,
                "step_code": r.step_code,
                "status": r.status.as_str(),
                "evidence": semantic_evidence(r, &keys),
            })
        })
        .collect();
    json!({ "receipts": items })
}

/// One field that differs between two attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// RFC 6901 JSON pointer into the [`semantic_view`], e.g.
    /// `/receipts/1/evidence/checks/accounts/0/1`.
    pub path: String,
    /// The ordinal of the receipt the field belongs to (from the left side when it
    /// has that receipt), if the path is inside a receipt.
    pub ordinal: Option<u32>,
    /// That receipt's step code.
    pub step_code: Option<String>,
    /// The left value; `None` when the field is absent on the left.
    pub left: Option<Value>,
    /// The right value; `None` when the field is absent on the right.
    pub right: Option<Value>,
}

/// Every field that differs between the semantic views of two receipt lists, in
/// document order (receipts by ordinal, object keys sorted). Volatile keys are
/// stripped first, so they never differ.
pub fn differences(plan: &Plan, left: &[Receipt], right: &[Receipt]) -> Vec<Difference> {
    let (lv, rv) = (semantic_view(plan, left), semantic_view(plan, right));
    let mut raw = Vec::new();
    diff_values(String::new(), Some(&lv), Some(&rv), &mut raw);
    let (lo, ro) = (by_ordinal(left), by_ordinal(right));
    raw.into_iter()
        .map(|(path, l, r)| {
            let receipt = receipt_index(&path).and_then(|i| lo.get(i).or_else(|| ro.get(i)));
            Difference {
                path,
                ordinal: receipt.map(|r| r.ordinal),
                step_code: receipt.map(|r| r.step_code.clone()),
                left: l,
                right: r,
            }
        })
        .collect()
}

/// The receipt index of a pointer `/receipts/N/…`.
fn receipt_index(path: &str) -> Option<usize> {
    path.strip_prefix("/receipts/")?.split('/').next()?.parse().ok()
}

/// Escapes one reference token of a JSON pointer (RFC 6901: `~` → `~0`, `/` → `~1`).
pub fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

type RawDiff = (String, Option<Value>, Option<Value>);

fn diff_values(path: String, left: Option<&Value>, right: Option<&Value>, out: &mut Vec<RawDiff>) {
    match (left, right) {
        (Some(Value::Object(l)), Some(Value::Object(r))) => {
            let keys: BTreeSet<&String> = l.keys().chain(r.keys()).collect();
            let mut keys: Vec<&String> = keys.into_iter().collect();
            // Canonical order: by UTF-8 bytes.
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            for key in keys {
                diff_values(format!("{path}/{}", pointer_token(key)), l.get(key), r.get(key), out);
            }
        }
        (Some(Value::Array(l)), Some(Value::Array(r))) => {
            for i in 0..l.len().max(r.len()) {
                diff_values(format!("{path}/{i}"), l.get(i), r.get(i), out);
            }
        }
        (Some(l), Some(r)) if canonical_json(l) == canonical_json(r) => {}
        (None, None) => {}
        (l, r) => out.push((path, l.cloned(), r.cloned())),
    }
}

/// One side of a comparison: the attempt and its fingerprints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptSide {
    /// The attempt.
    pub attempt_id: AttemptId,
    /// Its number within the plan.
    pub number: u32,
    /// execute, retry or compensate.
    pub action: Action,
    /// Its status.
    pub status: AttemptStatus,
    /// Its command.
    pub command_id: CommandId,
    /// The command's status.
    pub command_status: CommandStatus,
    /// [`raw_fingerprint`] of its receipts.
    pub raw_fingerprint: String,
    /// [`semantic_fingerprint`] of its receipts.
    pub semantic_fingerprint: String,
}

impl AttemptSide {
    /// The side for a record under a plan.
    pub fn of(plan: &Plan, record: &AttemptRecord) -> Self {
        Self {
            attempt_id: record.attempt.id.clone(),
            number: record.attempt.number,
            action: record.attempt.action,
            status: record.attempt.status,
            command_id: record.command.id.clone(),
            command_status: record.command.status,
            raw_fingerprint: raw_fingerprint(&record.receipts),
            semantic_fingerprint: semantic_fingerprint(plan, &record.receipts),
        }
    }
}

/// The outcome of a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ComparisonVerdict {
    /// Both complete; same steps and same semantic fingerprint.
    Equal,
    /// Both complete; steps or semantic evidence differ.
    Drift,
    /// At least one side is not complete, not SUCCEEDED, not intact or not of the
    /// plan; see [`Comparison::problems`].
    Incomparable,
}

impl ComparisonVerdict {
    /// `EQUAL`, `DRIFT` or `INCOMPARABLE`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Equal => "EQUAL",
            Self::Drift => "DRIFT",
            Self::Incomparable => "INCOMPARABLE",
        }
    }
}

impl fmt::Display for ComparisonVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The comparison of two attempts of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The plan.
    pub plan_id: PlanId,
    /// The left (usually older) attempt.
    pub left: AttemptSide,
    /// The right (usually newer) attempt.
    pub right: AttemptSide,
    /// EQUAL, DRIFT or INCOMPARABLE.
    pub verdict: ComparisonVerdict,
    /// Why the attempts cannot be compared, each naming its side; empty when they can.
    pub problems: Vec<String>,
    /// Same receipts, in the same order, with the same step codes and statuses.
    pub steps_equal: bool,
    /// Same semantic fingerprint.
    pub semantic_equal: bool,
    /// Every differing field (computed even when incomparable, to help diagnose).
    pub differences: Vec<Difference>,
}

/// Why one side of a comparison is not complete, SUCCEEDED and intact.
fn completeness_problems(side: &str, plan: &Plan, record: &AttemptRecord) -> Vec<String> {
    let a = &record.attempt;
    let name = format!("{side} attempt {} (#{})", a.id, a.number);
    let mut problems = Vec::new();
    if a.plan_id != plan.id {
        problems.push(format!("{name} belongs to plan {}, not {}", a.plan_id, plan.id));
    }
    if a.status != AttemptStatus::Succeeded {
        problems.push(format!("{name} is {}, not SUCCEEDED", a.status));
    }
    if record.command.status != CommandStatus::Delivered {
        problems.push(format!(
            "{name}: its command {} is {}, not DELIVERED",
            record.command.id, record.command.status
        ));
    }
    if record.receipts.is_empty() {
        problems.push(format!("{name} has no receipts"));
    }
    if let Some(open) = record.receipts.iter().find(|r| r.status != ReceiptStatus::Succeeded) {
        problems.push(format!(
            "{name} is incomplete: receipt {} ({}) is {}",
            open.ordinal, open.step_code, open.status
        ));
    }
    problems.extend(
        verify_receipts(&record.receipts)
            .into_iter()
            .map(|e| format!("{side}: {e}")),
    );
    problems
}

/// Compares two attempts of `plan`: both must be complete (attempt SUCCEEDED,
/// command DELIVERED, every receipt SUCCEEDED, evidence intact); then their steps and
/// semantic fingerprints are compared, and every differing field is listed.
pub fn compare(plan: &Plan, left: &AttemptRecord, right: &AttemptRecord) -> Comparison {
    let mut problems = completeness_problems("left", plan, left);
    problems.extend(completeness_problems("right", plan, right));
    if left.attempt.input_sha256 != right.attempt.input_sha256 {
        problems.push(format!(
            "attempts {} and {} ran different inputs: only attempts of the same input rehearse the same change",
            left.attempt.id, right.attempt.id
        ));
    }
    let steps = |r: &AttemptRecord| -> Vec<(u32, String, ReceiptStatus)> {
        by_ordinal(&r.receipts)
            .into_iter()
            .map(|x| (x.ordinal, x.step_code.clone(), x.status))
            .collect()
    };
    let steps_equal = steps(left) == steps(right);
    let (l, r) = (AttemptSide::of(plan, left), AttemptSide::of(plan, right));
    let semantic_equal = l.semantic_fingerprint == r.semantic_fingerprint;
    let verdict = if !problems.is_empty() {
        ComparisonVerdict::Incomparable
    } else if steps_equal && semantic_equal {
        ComparisonVerdict::Equal
    } else {
        ComparisonVerdict::Drift
    };
    Comparison {
        plan_id: plan.id.clone(),
        left: l,
        right: r,
        verdict,
        problems,
        steps_equal,
        semantic_equal,
        differences: differences(plan, &left.receipts, &right.receipts),
    }
}

/// The default pair to compare: the two highest-numbered SUCCEEDED forward
/// (execute or retry) attempts of `plan` in `history` with the newest one's input,
/// older first. `None` when there are fewer than two.
pub fn latest_successful_pair<'a>(
    plan: &Plan,
    history: &'a [AttemptRecord],
) -> Option<(&'a AttemptRecord, &'a AttemptRecord)> {
    let mut succeeded: Vec<&AttemptRecord> = history
        .iter()
        .filter(|r| {
            r.attempt.plan_id == plan.id
                && r.attempt.action.is_forward()
                && r.attempt.status == AttemptStatus::Succeeded
        })
        .collect();
    succeeded.sort_by_key(|r| r.attempt.number);
    if let Some(newest) = succeeded.last().map(|r| r.attempt.input_sha256.clone()) {
        succeeded.retain(|r| r.attempt.input_sha256 == newest);
    }
    match succeeded.as_slice() {
        [.., older, newer] => Some((older, newer)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Timestamp;
    use crate::model::PlanStatus;
    use crate::plan::PlanSpec;

    fn plan() -> Plan {
        let spec: PlanSpec = serde_json::from_value(json!({
            "name": "p",
            "recovery": "replay",
            "volatile_fields": ["run_id"],
            "steps": [
                {"code": "a", "executor": "dry-run:v1"},
                {"code": "b", "executor": "dry-run:v1"},
            ],
        }))
        .unwrap();
        spec.into_plan(&["dry-run:v1"], PlanId::new("pln-1"), Timestamp::from_millis(0))
            .unwrap()
    }

    fn receipt(attempt: &str, ordinal: u32, code: &str, evidence: Value) -> Receipt {
        let text = canonical_json(&evidence);
        Receipt {
            payload: None,
            attempt_id: AttemptId::new(attempt),
            ordinal,
            step_code: code.into(),
            idempotency_key: format!("ik-{attempt}-{ordinal}"),
            executor: String::new(),
            target: String::new(),
            status: ReceiptStatus::Succeeded,
            evidence_sha256: Some(sha256_hex(text.as_bytes())),
            evidence: Some(text),
            target_receipt: Some(format!("{{\"sandbox\":\"{attempt}\"}}")),
            error: None,
            started_at: None,
            finished_at: None,
        }
    }

    #[test]
    fn intact_evidence_verifies() {
        verify_receipt(&receipt("att-1", 1, "a", json!({"x": [1, {"y": null}]}))).unwrap();
        let mut pending = receipt("att-1", 2, "b", json!({}));
        pending.status = ReceiptStatus::Pending;
        pending.evidence = None;
        pending.evidence_sha256 = None;
        verify_receipt(&pending).unwrap();
    }

    #[test]
    fn edited_evidence_is_named_with_its_receipt() {
        let mut r = receipt("att-1", 2, "b", json!({"rows": 3}));
        r.evidence = Some(r#"{"rows":4}"#.into());
        let e = verify_receipt(&r).unwrap_err();
        assert!(matches!(e.problem, TamperProblem::ShaMismatch { .. }));
        assert!(
            e.to_string()
                .starts_with("receipt 2 (b) of attempt att-1: evidence hashes to "),
            "{e}"
        );
    }

    #[test]
    fn non_canonical_or_non_json_evidence_is_refused_even_with_a_matching_hash() {
        let mut r = receipt("att-1", 1, "a", json!({}));
        for (text, problem) in [
            (r#"{"b":1, "a":2}"#, TamperProblem::NotCanonical),
            (r#"{"n":1.0}"#, TamperProblem::NotCanonical),
            ("not json", TamperProblem::NotJson),
        ] {
            r.evidence = Some(text.into());
            r.evidence_sha256 = Some(sha256_hex(text.as_bytes()));
            assert_eq!(verify_receipt(&r).unwrap_err().problem, problem, "{text}");
        }
    }

    #[test]
    fn missing_halves_are_refused() {
        let mut r = receipt("att-1", 1, "a", json!({}));
        r.evidence_sha256 = None;
        assert_eq!(verify_receipt(&r).unwrap_err().problem, TamperProblem::MissingSha);
        r.evidence = None;
        assert_eq!(verify_receipt(&r).unwrap_err().problem, TamperProblem::MissingEvidence);
        r.evidence_sha256 = Some("00".into());
        assert_eq!(
            verify_receipt(&r).unwrap_err().problem,
            TamperProblem::ShaWithoutEvidence
        );
    }

    #[test]
    fn volatile_identity_is_stripped_at_any_depth() {
        let keys = VolatileKeys::for_plan(&plan());
        let v = json!({"sandbox_id": 1, "run_id": 2, "keep": [{"attempt_id": 3, "k": {"step_key": 4, "v": 5}}]});
        assert_eq!(keys.strip(&v), json!({"keep": [{"k": {"v": 5}}]}));
    }

    #[test]
    fn semantic_fingerprint_ignores_volatile_identity_but_raw_does_not() {
        let p = plan();
        let one = [
            receipt("att-1", 1, "a", json!({"sandbox_id": "s1", "n": 1})),
            receipt("att-1", 2, "b", json!({"run_id": "r1"})),
        ];
        let two = [
            receipt("att-2", 1, "a", json!({"sandbox_id": "s2", "n": 1.0})),
            receipt("att-2", 2, "b", json!({"run_id": "r2"})),
        ];
        assert_eq!(semantic_fingerprint(&p, &one), semantic_fingerprint(&p, &two));
        assert_ne!(raw_fingerprint(&one), raw_fingerprint(&two));
        assert!(differences(&p, &one, &two).is_empty());
        // Receipt order in the slice does not matter; ordinals do.
        let reversed = [two[1].clone(), two[0].clone()];
        assert_eq!(semantic_fingerprint(&p, &one), semantic_fingerprint(&p, &reversed));
    }

    #[test]
    fn differences_are_json_pointers_with_both_values() {
        let p = plan();
        let left = [
            receipt("att-1", 1, "a", json!({"rows": [[1, "ada"]], "a/b": 1})),
            receipt("att-1", 2, "b", json!({"gone": true})),
        ];
        let right = [
            receipt("att-2", 1, "a", json!({"rows": [[1, "bob"]], "a/b": 1, "new": 2})),
            receipt("att-2", 2, "b", json!({})),
        ];
        let d = differences(&p, &left, &right);
        type Row<'a> = (&'a str, Option<u32>, Option<&'a Value>, Option<&'a Value>);
        let summary: Vec<Row<'_>> = d
            .iter()
            .map(|d| (d.path.as_str(), d.ordinal, d.left.as_ref(), d.right.as_ref()))
            .collect();
        assert_eq!(
            summary,
            [
                ("/receipts/0/evidence/new", Some(1), None, Some(&json!(2))),
                (
                    "/receipts/0/evidence/rows/0/1",
                    Some(1),
                    Some(&json!("ada")),
                    Some(&json!("bob"))
                ),
                ("/receipts/1/evidence/gone", Some(2), Some(&json!(true)), None),
            ]
        );
        assert_eq!(pointer_token("a~b/c"), "a~0b~1c");
    }

    fn record(p: &Plan, id: &str, number: u32, receipts: Vec<Receipt>) -> AttemptRecord {
        AttemptRecord {
            attempt: crate::model::Attempt {
                input: None,
                input_sha256: None,
                order_key: None,
                id: AttemptId::new(id),
                plan_id: p.id.clone(),
                number,
                action: Action::Execute,
                status: AttemptStatus::Succeeded,
                created_at: Timestamp::from_millis(0),
                started_at: None,
                finished_at: None,
                error: None,
                trace: None,
                enqueue_key: None,
                request_sha256: None,
            },
            command: crate::model::Command {
                id: CommandId::new(format!("cmd-{id}")),
                attempt_id: AttemptId::new(id),
                status: CommandStatus::Delivered,
                available_at: Timestamp::from_millis(0),
                lease_owner: None,
                lease_token: None,
                lease_until: None,
                last_heartbeat_at: None,
                delivery_count: 1,
                last_error: None,
                finished_at: None,
                queue: String::new(),
                executor: String::new(),
                target: String::new(),
            },
            receipts,
        }
    }

    #[test]
    fn compare_reports_equal_drift_and_incomparable() {
        let p = plan();
        let a = record(&p, "att-1", 1, vec![receipt("att-1", 1, "a", json!({"n": 1}))]);
        let b = record(
            &p,
            "att-2",
            2,
            vec![receipt("att-2", 1, "a", json!({"n": 1, "sandbox": "x"}))],
        );
        let c = record(&p, "att-3", 3, vec![receipt("att-3", 1, "a", json!({"n": 2}))]);
        let eq = compare(&p, &a, &b);
        assert_eq!(
            (eq.verdict, eq.steps_equal, eq.semantic_equal),
            (ComparisonVerdict::Equal, true, true)
        );
        let drift = compare(&p, &a, &c);
        assert_eq!(drift.verdict, ComparisonVerdict::Drift);
        assert_eq!(drift.differences.len(), 1);
        let mut running = c.clone();
        running.attempt.status = AttemptStatus::Running;
        running.command.status = CommandStatus::Processing;
        let inc = compare(&p, &a, &running);
        assert_eq!(inc.verdict, ComparisonVerdict::Incomparable);
        assert_eq!(
            inc.problems,
            [
                "right attempt att-3 (#3) is RUNNING, not SUCCEEDED",
                "right attempt att-3 (#3): its command cmd-att-3 is PROCESSING, not DELIVERED",
            ]
        );
        let mut retired = p.clone();
        retired.status = PlanStatus::Retired;
        assert_eq!(compare(&retired, &a, &b).verdict, ComparisonVerdict::Equal);
    }

    #[test]
    fn the_default_pair_is_the_two_latest_successful_forward_attempts() {
        let p = plan();
        let mk = |n: u32, status: AttemptStatus, action: Action| {
            let mut r = record(&p, &format!("att-{n}"), n, Vec::new());
            r.attempt.status = status;
            r.attempt.action = action;
            r
        };
        let history = vec![
            mk(1, AttemptStatus::Succeeded, Action::Execute),
            mk(2, AttemptStatus::Failed, Action::Execute),
            mk(3, AttemptStatus::Succeeded, Action::Retry),
            mk(4, AttemptStatus::Succeeded, Action::Compensate),
            mk(5, AttemptStatus::Running, Action::Execute),
        ];
        let (l, r) = latest_successful_pair(&p, &history).unwrap();
        assert_eq!((l.attempt.number, r.attempt.number), (1, 3));
        assert!(latest_successful_pair(&p, &history[..2]).is_none());
    }
}
