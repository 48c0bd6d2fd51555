//! Small builders for records in every state the transition table can reach.
//!
//! Records are built by running the engine's own transitions (enqueue, claim, begin,
//! complete, fail, finish, abort) and applying their writes, so a test starts from a
//! state the engine can really produce. Every application first checks that the
//! writes' guard admits the row they were computed from.

// Each integration test file compiles its own copy of this module and uses only
// some of the builders.
#![allow(dead_code)]

use leasehold_engine::plan::idempotency_key;
use leasehold_engine::transition::{self, NewIds};
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, CommandId, LeaseToken, Plan, PlanId, PlanSpec, Recovery, Refusal, Timestamp,
    Writes,
};
use serde_json::{json, Value};

/// The only executor the test plans use.
pub const EXECUTOR: &str = "dry-run:v1";
/// Lease length every claim and renewal grants.
pub const LEASE_MS: u64 = 30_000;
/// When the plan was registered.
pub const REGISTERED_MS: i64 = 1_000;
/// When the first attempt is enqueued.
pub const ENQUEUED_MS: i64 = 2_000;
/// When worker A claims it.
pub const CLAIMED_MS: i64 = 3_000;
/// The first worker.
pub const OWNER_A: &str = "worker-a";
/// The worker that takes over.
pub const OWNER_B: &str = "worker-b";

/// A ledger-clock instant.
pub fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

/// Worker A's lease token.
pub fn token_a() -> LeaseToken {
    LeaseToken::new("tok-a")
}

/// Worker B's lease token.
pub fn token_b() -> LeaseToken {
    LeaseToken::new("tok-b")
}

/// A READY plan with one step per code, built through validation (so its
/// fingerprint matches).
pub fn plan(recovery: Recovery, codes: &[&str]) -> Plan {
    let steps: Vec<Value> = codes
        .iter()
        .enumerate()
        .map(|(i, code)| json!({"code": code, "executor": EXECUTOR, "payload": {"n": i + 1}}))
        .collect();
    let spec: PlanSpec = serde_json::from_value(json!({
        "name": "rehearsal",
        "recovery": recovery.as_str(),
        "steps": steps,
    }))
    .expect("the spec is well formed");
    spec.into_plan(&[EXECUTOR], PlanId::new("plan-1"), at(REGISTERED_MS))
        .expect("the spec is valid")
}

/// The four-step resume plan most tests use.
pub fn resume_plan() -> Plan {
    plan(Recovery::Resume, &["create-schema", "load", "migrate", "notify"])
}

/// The same four steps under replay recovery.
pub fn replay_plan() -> Plan {
    plan(Recovery::Replay, &["create-schema", "load", "migrate", "notify"])
}

/// Ids for the `n`th attempt of the plan.
pub fn ids(n: u32) -> NewIds {
    NewIds {
        attempt: attempt_id(n),
        command: command_id(n),
        trace: None,
    }
}

/// The `n`th attempt's id.
pub fn attempt_id(n: u32) -> AttemptId {
    AttemptId::new(format!("att-{n}"))
}

/// The `n`th attempt's command id.
pub fn command_id(n: u32) -> CommandId {
    CommandId::new(format!("cmd-{n}"))
}

/// The idempotency key the `n`th attempt sends for a step.
pub fn key(n: u32, ordinal: u32, code: &str) -> String {
    idempotency_key(&attempt_id(n), ordinal, code)
}

/// The evidence the executor answers for a step.
pub fn evidence(ordinal: u32) -> Value {
    json!({"step": ordinal, "tables": ["app_user"], "rows": ordinal * 10})
}

/// What the target answers for a step.
pub fn target_receipt(ordinal: u32) -> Value {
    json!({"target": "sandbox", "ack": ordinal})
}

/// Applies writes to a copy of the record they were computed from, after checking
/// that their guard admits that record's command row.
pub fn applied(record: &AttemptRecord, writes: &Writes) -> AttemptRecord {
    assert!(
        writes.guard.admits(Some(&record.command)),
        "the guard {:?} must admit the row the transition read",
        writes.guard
    );
    let mut next = record.clone();
    writes.apply_to(&mut next);
    next
}

/// Unwraps a transition that must be allowed.
pub fn allowed<T>(result: Result<T, Refusal>) -> T {
    match result {
        Ok(value) => value,
        Err(refusal) => panic!("the transition was refused: {refusal}"),
    }
}

/// Unwraps a transition that must be refused.
pub fn refused<T: std::fmt::Debug>(result: Result<T, Refusal>) -> Refusal {
    match result {
        Ok(value) => panic!("the transition was allowed: {value:?}"),
        Err(refusal) => refusal,
    }
}

/// The first attempt (`execute`) of the plan, enqueued at [`ENQUEUED_MS`].
pub fn enqueued(plan: &Plan) -> AttemptRecord {
    allowed(transition::enqueue(plan, &[], Action::Execute, ids(1), at(ENQUEUED_MS)))
}

/// Claims the record for `owner` with `token` at `now_ms`.
pub fn claimed_by(record: &AttemptRecord, plan: &Plan, owner: &str, token: LeaseToken, now_ms: i64) -> AttemptRecord {
    let writes = allowed(transition::claim(
        record,
        plan.recovery,
        owner,
        token,
        LEASE_MS,
        at(now_ms),
    ));
    applied(record, &writes)
}

/// The first attempt, claimed by worker A at [`CLAIMED_MS`].
pub fn claimed(plan: &Plan) -> AttemptRecord {
    claimed_by(&enqueued(plan), plan, OWNER_A, token_a(), CLAIMED_MS)
}

/// Begins a step under `token` at `now_ms`.
pub fn begun(record: &AttemptRecord, ordinal: u32, token: &LeaseToken, now_ms: i64) -> AttemptRecord {
    applied(
        record,
        &allowed(transition::begin_step(record, ordinal, token, LEASE_MS, at(now_ms))),
    )
}

/// Completes a RUNNING step with [`evidence`] under `token` at `now_ms`.
pub fn completed(record: &AttemptRecord, ordinal: u32, token: &LeaseToken, now_ms: i64) -> AttemptRecord {
    let writes = allowed(transition::complete_step(
        record,
        ordinal,
        &evidence(ordinal),
        &target_receipt(ordinal),
        token,
        LEASE_MS,
        at(now_ms),
    ));
    applied(record, &writes)
}

/// When step `ordinal` of worker A's run begins: one second apart per step,
/// after the claim.
pub fn begin_ms(ordinal: u32) -> i64 {
    CLAIMED_MS + 1_000 * i64::from(ordinal)
}

/// When step `ordinal` of worker A's run completes: half a second after it began.
pub fn complete_ms(ordinal: u32) -> i64 {
    begin_ms(ordinal) + 500
}

/// The first attempt claimed by worker A, whose first `succeeded` steps SUCCEEDED
/// and, if `running`, whose next step is RUNNING (its outcome ambiguous).
pub fn in_progress(plan: &Plan, succeeded: u32, running: bool) -> AttemptRecord {
    let mut record = claimed(plan);
    for ordinal in 1..=succeeded {
        record = begun(&record, ordinal, &token_a(), begin_ms(ordinal));
        record = completed(&record, ordinal, &token_a(), complete_ms(ordinal));
    }
    if running {
        record = begun(&record, succeeded + 1, &token_a(), begin_ms(succeeded + 1));
    }
    record
}

/// When worker A's lease on a record last renewed at `renewed_ms` has expired.
pub fn expired_after(renewed_ms: i64) -> i64 {
    renewed_ms + LEASE_MS as i64 + 1
}

/// The first attempt with every step SUCCEEDED, finished: SUCCEEDED / DELIVERED.
pub fn delivered(plan: &Plan) -> AttemptRecord {
    let steps = plan.steps.len() as u32;
    let record = in_progress(plan, steps, false);
    applied(
        &record,
        &allowed(transition::finish(&record, &token_a(), at(complete_ms(steps) + 100))),
    )
}

/// The first attempt failed at step `failed_at` (earlier steps SUCCEEDED): FAILED.
pub fn failed_at(plan: &Plan, failed_at: u32) -> AttemptRecord {
    let record = in_progress(plan, failed_at - 1, true);
    let writes = allowed(transition::fail(
        &record,
        Some(failed_at),
        "target said no",
        &token_a(),
        at(begin_ms(failed_at) + 100),
    ));
    applied(&record, &writes)
}

/// The first attempt aborted by an operator while step `running` ran: ABORTED.
pub fn aborted_while_running(plan: &Plan, running: u32) -> AttemptRecord {
    let record = in_progress(plan, running - 1, true);
    applied(
        &record,
        &allowed(transition::abort(&record, "operator stop", at(begin_ms(running) + 100))),
    )
}

/// One record per terminal attempt status, with a label for failure messages.
pub fn terminal_records(plan: &Plan) -> Vec<(&'static str, AttemptRecord)> {
    vec![
        ("delivered", delivered(plan)),
        ("failed", failed_at(plan, 3)),
        ("aborted", aborted_while_running(plan, 2)),
    ]
}

/// Runs every step of a record held by `token` from its first non-SUCCEEDED
/// receipt and finishes it, starting at `now_ms`.
pub fn run_to_delivery(record: &AttemptRecord, token: &LeaseToken, now_ms: i64) -> AttemptRecord {
    let mut record = record.clone();
    let mut now = now_ms;
    let ordinals: Vec<u32> = record
        .receipts
        .iter()
        .filter(|r| r.status != leasehold_engine::ReceiptStatus::Succeeded)
        .map(|r| r.ordinal)
        .collect();
    for ordinal in ordinals {
        record = begun(&record, ordinal, token, now);
        now += 10;
        record = completed(&record, ordinal, token, now);
        now += 10;
    }
    applied(&record, &allowed(transition::finish(&record, token, at(now))))
}
