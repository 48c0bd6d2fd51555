//! The plans the simulation delivers, and the evidence their steps record.
//!
//! Contract: two executors stand for two kinds of target. `sim-target:v1` is a
//! durable, idempotent service (for `resume` plans): an effect per idempotency key.
//! `sim-sandbox:v1` is an ephemeral sandbox per delivery (for `replay` plans): a
//! takeover starts a fresh sandbox, so every step must be replayed in it. A step's
//! evidence is a pure function of the step, what the target reports as applied
//! before and including it, and volatile identity (execution id, sandbox id, the
//! worker, which every plan declares volatile). So a correct run's successful
//! attempts of one plan share one semantic fingerprint ([`reference_fingerprint`]),
//! the same on every seed, while their raw fingerprints differ.

use leasehold_engine::canonical::{canonical_json, fingerprint, sha256_hex};
use leasehold_engine::evidence::semantic_fingerprint;
use leasehold_engine::plan::idempotency_key;
use leasehold_engine::{AttemptId, Plan, PlanSpec, Receipt, ReceiptStatus, Step};
use serde_json::{json, Value};

/// The durable target's executor name.
pub const DURABLE: &str = "sim-target:v1";
/// The sandbox target's executor name.
pub const SANDBOX: &str = "sim-sandbox:v1";
/// The executors plan validation accepts in the simulation.
pub const KNOWN: &[&str] = &[DURABLE, SANDBOX];

fn step(code: &str, executor: &str, delay_ms: u64, extra: Value) -> Step {
    let mut payload = json!({ "delay_ms": delay_ms, "op": code });
    if let (Value::Object(p), Value::Object(e)) = (&mut payload, extra) {
        p.extend(e);
    }
    Step {
        code: code.to_owned(),
        executor: executor.to_owned(),
        payload,
        retry: None,
    }
}

/// The plans every run registers.
pub fn specs() -> Vec<PlanSpec> {
    let none = || json!({});
    vec![
        PlanSpec {
            name: "ledger-sync".into(),
            recovery: "resume".into(),
            volatile_fields: vec!["worker".into()],
            steps: vec![
                step("reserve", DURABLE, 300, none()),
                step("charge", DURABLE, 500, none()),
                step("ship", DURABLE, 400, none()),
                step("notify", DURABLE, 200, none()),
            ],
            retry: None,
        },
        PlanSpec {
            name: "rehearsal".into(),
            recovery: "replay".into(),
            volatile_fields: vec!["worker".into()],
            steps: vec![
                step("create-schema", SANDBOX, 250, none()),
                step("load-fixtures", SANDBOX, 400, none()),
                step("migrate", SANDBOX, 450, none()),
                step("verify", SANDBOX, 300, none()),
                step("report", SANDBOX, 150, none()),
            ],
            retry: None,
        },
        PlanSpec {
            name: "flaky-sync".into(),
            recovery: "resume".into(),
            volatile_fields: vec!["worker".into()],
            steps: vec![
                step("prepare", DURABLE, 200, none()),
                step("commit", DURABLE, 350, json!({ "fail_on": "execute" })),
                step("confirm", DURABLE, 250, none()),
            ],
            retry: None,
        },
    ]
}

/// The evidence a step records, given what the target reported.
pub fn evidence(step: &Step, key: &str, sandbox: Option<&str>, worker: &str, applied: &[String]) -> Value {
    let mut e = json!({
        "executor": step.executor,
        "step": step.code,
        "payload_sha256": fingerprint(&step.payload),
        "execution_id": format!("exe-{}", key.trim_start_matches("ik-")),
        "worker": worker,
        "applied": applied,
    });
    if let (Some(s), Value::Object(m)) = (sandbox, &mut e) {
        m.insert("sandbox_id".into(), json!(s));
    }
    e
}

/// The sandbox a delivery of an attempt works in.
pub fn sandbox_id(attempt: &AttemptId, delivery: u32) -> String {
    format!("sbx-{attempt}-d{delivery}")
}

/// The semantic fingerprint of a clean, single-delivery success of `plan`'s
/// forward steps: what every successful forward attempt must match.
pub fn reference_fingerprint(plan: &Plan) -> String {
    let attempt = AttemptId::new("att-reference");
    let sandbox = sandbox_id(&attempt, 1);
    let mut applied = Vec::new();
    let receipts: Vec<Receipt> = plan
        .steps
        .iter()
        .zip(1u32..)
        .map(|(s, ordinal)| {
            applied.push(s.code.clone());
            let key = idempotency_key(&attempt, ordinal, &s.code);
            let sbx = (s.executor == SANDBOX).then_some(sandbox.as_str());
            let text = canonical_json(&evidence(s, &key, sbx, "reference", &applied));
            Receipt {
                attempt_id: attempt.clone(),
                ordinal,
                step_code: s.code.clone(),
                idempotency_key: key,
                status: ReceiptStatus::Succeeded,
                evidence_sha256: Some(sha256_hex(text.as_bytes())),
                evidence: Some(text),
                target_receipt: None,
                error: None,
                started_at: None,
                finished_at: None,
            }
        })
        .collect();
    semantic_fingerprint(plan, &receipts)
}
