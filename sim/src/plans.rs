//! The plans the simulation delivers, and the evidence their steps record.
//!
//! Contract: two executors stand for two kinds of target. `sim-target:v1` is a
//! durable, idempotent service (for `resume` plans): an effect per idempotency key.
//! `sim-sandbox:v1` is an ephemeral sandbox per delivery (for `replay` plans): a
//! takeover starts a fresh sandbox, so every step must be replayed in it. A step's
//! payload may make the target misbehave for it ([`crate::protocol::TargetMode`]):
//! the retry plans ([`RETRY_PLANS`]) have flaky, throttled and dead steps and the
//! small delivery policy [`small_policy`], so that their attempts give back, back
//! off and exhaust within a run; the classic plans have a roomier one
//! ([`classic_policy`]) that still keeps every backoff within a run. A step's
//! evidence is a pure function of the step, what the target reports as applied
//! before and including it, and volatile identity (execution id, sandbox id, the
//! worker, which every plan declares volatile). So a correct run's successful
//! attempts of one plan share one semantic fingerprint ([`reference_fingerprint`]),
//! the same on every seed, while their raw fingerprints differ.

use crate::protocol::TargetMode;
use leasehold_engine::canonical::{canonical_json, fingerprint, sha256_hex};
use leasehold_engine::evidence::semantic_fingerprint;
use leasehold_engine::plan::idempotency_key;
use leasehold_engine::{AttemptId, Plan, PlanSpec, Receipt, ReceiptStatus, RetrySpec, Step};
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
        target: None,
        payload,
        retry: None,
    }
}

/// The template whose attempts carry input and order keys ([`template_input`]).
pub const TEMPLATE_PLAN: &str = "grants";

/// The input and order key of a change to user `user` (one of a few, so that
/// changes to one user queue behind each other), the `n`th enqueued.
pub fn template_input(user: u64, n: u64) -> (Value, String) {
    (
        json!({"user": format!("u{user}"), "change": format!("c{n}")}),
        format!("u{user}"),
    )
}

/// The plans the classic fault profiles deliver: [`specs`] by name.
pub const CLASSIC_PLANS: &[&str] = &["ledger-sync", "rehearsal", "flaky-sync"];

/// The plans whose targets misbehave: flaky then healthy (resume and replay),
/// throttled, down (exhausted by deliveries) and down past a deadline.
pub const RETRY_PLANS: &[&str] = &["flaky-target", "flaky-sandbox", "dead-target", "dead-deadline"];

/// The classic plans' delivery policy: the default tries, twelve deliveries and
/// backoffs of at most two seconds (the default's hour would outlast a run).
pub fn classic_policy() -> RetrySpec {
    RetrySpec {
        max_deliveries: Some(12),
        backoff_base_ms: Some(100),
        backoff_max_ms: Some(2_000),
        ..RetrySpec::default()
    }
}

/// The retry plans' delivery policy: four deliveries, two calls of a step per
/// delivery, backoffs from 50 ms up to 400 ms.
pub fn small_policy() -> RetrySpec {
    RetrySpec {
        max_deliveries: Some(4),
        backoff_base_ms: Some(50),
        backoff_max_ms: Some(400),
        step_max_tries: Some(2),
        deadline_secs: None,
    }
}

fn spec(name: &str, recovery: &str, steps: Vec<Step>, retry: RetrySpec) -> PlanSpec {
    PlanSpec {
        input: None,
        on_failure: None,
        name: name.into(),
        queue: None,
        recovery: recovery.into(),
        volatile_fields: vec!["worker".into()],
        steps,
        retry: Some(retry),
    }
}

/// Every plan the simulation knows, classic plans first.
pub fn specs() -> Vec<PlanSpec> {
    let none = || json!({});
    let classic = classic_policy;
    vec![
        spec(
            "ledger-sync",
            "resume",
            vec![
                step("reserve", DURABLE, 300, none()),
                step("charge", DURABLE, 500, none()),
                step("ship", DURABLE, 400, none()),
                step("notify", DURABLE, 200, none()),
            ],
            classic(),
        ),
        spec(
            "rehearsal",
            "replay",
            vec![
                step("create-schema", SANDBOX, 250, none()),
                step("load-fixtures", SANDBOX, 400, none()),
                step("migrate", SANDBOX, 450, none()),
                step("verify", SANDBOX, 300, none()),
                step("report", SANDBOX, 150, none()),
            ],
            classic(),
        ),
        spec(
            "flaky-sync",
            "resume",
            vec![
                step("prepare", DURABLE, 200, none()),
                step("commit", DURABLE, 350, json!({ "fail_on": "execute" })),
                step("confirm", DURABLE, 250, none()),
            ],
            classic(),
        ),
        spec(
            "flaky-target",
            "resume",
            vec![
                step("quote", DURABLE, 150, none()),
                step("book", DURABLE, 250, json!({ "flaky_calls": 3 })),
                step(
                    "pay",
                    DURABLE,
                    200,
                    json!({ "throttle_calls": 1, "retry_after_ms": 300 }),
                ),
                step("confirm", DURABLE, 100, none()),
            ],
            small_policy(),
        ),
        spec(
            "flaky-sandbox",
            "replay",
            vec![
                step("provision", SANDBOX, 150, none()),
                step("seed", SANDBOX, 200, json!({ "flaky_calls": 3 })),
                step("check", SANDBOX, 150, none()),
            ],
            small_policy(),
        ),
        spec(
            "dead-target",
            "resume",
            vec![
                step("reserve", DURABLE, 150, none()),
                step("charge", DURABLE, 200, json!({ "down": true })),
            ],
            small_policy(),
        ),
        grants(),
        spec(
            "dead-deadline",
            "resume",
            vec![step("probe", DURABLE, 100, json!({ "down": true }))],
            RetrySpec {
                max_deliveries: Some(50),
                deadline_secs: Some(3),
                ..small_policy()
            },
        ),
    ]
}

/// The template: a grant of a change to a user, then its record, on the durable
/// target; each attempt's input names the user and the change.
fn grants() -> PlanSpec {
    let who = json!({"who": {"$input": "/user"}, "change": {"$input": "/change"}});
    let mut spec = spec(
        TEMPLATE_PLAN,
        "resume",
        vec![
            step("grant", DURABLE, 200, who),
            step("record", DURABLE, 150, json!({})),
        ],
        classic_policy(),
    );
    spec.input = Some(
        serde_json::from_value(json!({
            "user": {"type": "string", "required": true},
            "change": {"type": "string", "required": true},
        }))
        .expect("an [input] table"),
    );
    spec
}

/// `plan` as `record` runs it: a template's steps with the payloads its receipts
/// froze (and a fingerprint of the plan and the input together, so that the
/// reference of each input is its own); any other plan as it is.
pub fn as_run(plan: &Plan, record: &leasehold_engine::AttemptRecord) -> Plan {
    let Some(input) = record.attempt.input_sha256.as_deref().filter(|_| plan.is_template()) else {
        return plan.clone();
    };
    let mut run = plan.clone();
    run.steps = record
        .receipts
        .iter()
        .filter_map(|r| leasehold_engine::AttemptRecord::step_of(plan, r))
        .collect();
    run.fingerprint = format!("{}:{input}", plan.fingerprint);
    run
}

/// The plans named, in the order named, or the first name no plan has.
pub fn named(names: &[String]) -> Result<Vec<PlanSpec>, String> {
    let all = specs();
    names
        .iter()
        .map(|n| {
            all.iter().find(|s| s.name == *n).cloned().ok_or_else(|| {
                let known: Vec<String> = all.iter().map(|s| s.name.clone()).collect();
                format!("unknown plan {n:?} (known: {})", known.join(", "))
            })
        })
        .collect()
}

/// Whether a step's target never serves it (an attempt through it must exhaust).
pub fn is_down(step: &Step) -> bool {
    TargetMode::of(&step.payload) == TargetMode::Down
}

/// Whether a step's target refuses its first calls and then serves it.
pub fn recovers(step: &Step) -> bool {
    matches!(
        TargetMode::of(&step.payload),
        TargetMode::Flaky { .. } | TargetMode::Throttled { .. }
    )
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

thread_local! {
    /// [`reference_fingerprint`] of each plan content (its fingerprint) met on this
    /// thread: the checker asks for it on every transition, and it depends on the
    /// plan's steps alone.
    static REFERENCES: std::cell::RefCell<std::collections::BTreeMap<String, String>> =
        const { std::cell::RefCell::new(std::collections::BTreeMap::new()) };
}

/// The semantic fingerprint of a clean, single-delivery success of `plan`'s
/// forward steps: what every successful forward attempt must match (computed once
/// per plan content and thread).
pub fn reference_fingerprint(plan: &Plan) -> String {
    if let Some(known) = REFERENCES.with_borrow(|r| r.get(&plan.fingerprint).cloned()) {
        return known;
    }
    let reference = compute_reference(plan);
    REFERENCES.with_borrow_mut(|r| r.insert(plan.fingerprint.clone(), reference.clone()));
    reference
}

fn compute_reference(plan: &Plan) -> String {
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
                payload: None,
                attempt_id: attempt.clone(),
                ordinal,
                step_code: s.code.clone(),
                idempotency_key: key,
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
        .collect();
    semantic_fingerprint(plan, &receipts)
}
