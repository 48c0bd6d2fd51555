//! The delivery policy on every ledger: the stored policy, the give-back, exhaustion
//! at a give-back and at a claim, the scheduled start, the counts, and the bulk
//! recovery built on the ledger's own transitions.

use super::{assert_nothing_claimable, assert_stale, claim_one, record, Harness, KNOWN, LEASE_MS};
use leasehold::engine::transition::Start;
use leasehold::engine::{
    Action, AttemptId, AttemptStatus, CommandStatus, Exhaustion, PlanId, PlanSpec, ReceiptStatus, Reply, Timestamp,
    WorkerRequest,
};
use leasehold::ledger::bulk::{abort_open, retry_failed, BulkFilter};
use leasehold::ledger::{Claimed, Ledger, LedgerError};
use serde_json::{json, Value};

/// Registers a two-step plan named `name` with the `[retry]` table `retry` (its
/// second step sets `step_max_tries` of its own).
async fn register_with<L: Ledger>(l: &L, name: &str, retry: Value) -> PlanId {
    let spec: PlanSpec = serde_json::from_value(json!({
        "name": name,
        "recovery": "resume",
        "retry": retry,
        "steps": [
            {"code": "one", "executor": "dry-run:v1"},
            {"code": "two", "executor": "dry-run:v1", "retry": {"step_max_tries": 5}},
        ],
    }))
    .expect("a well-formed spec");
    l.register_plan(spec, KNOWN).await.expect("register").id
}

/// Claims the only claimable command, beginning its next step.
async fn claim_begun<L: Ledger>(l: &L, owner: &str) -> Claimed {
    let mut claimed = l.claim_and_begin(owner, 10, LEASE_MS).await.expect("claim");
    assert_eq!(claimed.len(), 1, "one claimable command");
    claimed.remove(0)
}

async fn give_back<L: Ledger>(l: &L, c: &Claimed, delay_ms: u64) -> Result<Reply, LedgerError> {
    let request = WorkerRequest::GiveBack {
        error: "HTTP 503 from the target".into(),
        delay_ms,
    };
    l.worker(&c.lease, request).await
}

fn at(h_now: Timestamp, plus_ms: u64) -> Timestamp {
    h_now.plus_ms(plus_ms)
}

pub async fn a_plans_delivery_policy_is_stored_and_read_back<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register_with(l, "policy", json!({"max_deliveries": 4, "deadline_secs": 600})).await;
    let plan = l.plan(&id).await.expect("plan");
    let retry = plan.retry.clone().expect("the plan's [retry]");
    assert_eq!((retry.max_deliveries, retry.deadline_secs), (Some(4), Some(600)));
    assert_eq!(plan.steps[1].retry.as_ref().and_then(|r| r.step_max_tries), Some(5));
    assert_eq!(plan.policy("one").max_deliveries, 4);
    assert_eq!(plan.policy("two").step_max_tries, 5);
    leasehold::engine::plan::verify_fingerprint(&plan).expect("the stored policy fingerprints as registered");
    let again = register_with(l, "policy", json!({"max_deliveries": 4, "deadline_secs": 600})).await;
    assert_eq!(again, id, "the same content, the same plan");
    let other = register_with(l, "policy", json!({"max_deliveries": 5, "deadline_secs": 600})).await;
    assert_ne!(other, id, "another policy is another plan");
}

pub async fn a_give_back_requeues_after_its_delay_on_the_ledger_clock_and_keeps_the_error<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register_with(l, "give-back", json!({"backoff_max_ms": 60_000})).await;
    let attempt = l.enqueue(&id, Action::Execute).await.expect("enqueue").attempt.id;
    let c = claim_begun(l, "w1").await;
    h.advance_ms(10);
    let until = at(h.now(), 5_000);
    assert_eq!(
        give_back(l, &c, 5_000).await.expect("give back"),
        Reply::GaveBack { until }
    );
    let r = record(l, &attempt).await;
    assert_eq!(r.attempt.status, AttemptStatus::Queued);
    assert_eq!(r.command.status, CommandStatus::Pending);
    assert_eq!(r.command.available_at, until);
    assert_eq!(r.command.last_error.as_deref(), Some("HTTP 503 from the target"));
    assert_eq!(r.command.lease_until, None);
    assert_eq!(
        r.receipts[0].status,
        ReceiptStatus::Pending,
        "the step is redelivered with its key"
    );
    assert_stale(give_back(l, &c, 0).await, &c.lease.command_id, "a second give-back");
    h.advance_ms(4_999);
    assert_nothing_claimable(l).await;
    h.advance_ms(1);
    let again = claim_one(l, "w2").await;
    assert_eq!(again.record.command.delivery_count, 2);
    assert_eq!(
        again.record.command.last_error.as_deref(),
        Some("HTTP 503 from the target"),
        "the error stays visible"
    );
}

pub async fn the_delivery_cap_ends_an_attempt_exhausted_at_a_give_back_and_at_a_claim<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register_with(l, "capped", json!({"max_deliveries": 2})).await;
    let first = l.enqueue(&id, Action::Execute).await.expect("enqueue").attempt.id;
    let c = claim_begun(l, "w1").await;
    assert!(matches!(give_back(l, &c, 0).await, Ok(Reply::GaveBack { .. })));
    let c = claim_begun(l, "w2").await;
    let reply = give_back(l, &c, 0).await.expect("give back");
    assert_eq!(reply, Reply::Exhausted(Exhaustion::Deliveries));
    let r = record(l, &first).await;
    assert_eq!(
        (r.attempt.status, r.command.status),
        (AttemptStatus::Failed, CommandStatus::Failed)
    );
    assert_eq!(r.command.delivery_count, 2);
    let error = r.attempt.error.unwrap_or_default();
    assert!(
        error.starts_with("exhausted: deliveries: step 1 (one) after 2 deliveries; last error: HTTP 503"),
        "{error}"
    );
    assert_nothing_claimable(l).await;
    // A takeover that finds the cap reached ends the attempt the same way.
    let other = register_with(l, "capped-takeover", json!({"max_deliveries": 2})).await;
    let second = l.enqueue(&other, Action::Execute).await.expect("enqueue").attempt.id;
    for _ in 0..2 {
        claim_begun(l, "crashing").await;
        h.advance_ms(LEASE_MS + 1);
    }
    let claimed = l.claim_and_begin("w3", 10, LEASE_MS).await.expect("claim");
    assert!(claimed.is_empty(), "a command at its cap is never claimed again");
    let r = record(l, &second).await;
    assert_eq!((r.attempt.status, r.command.delivery_count), (AttemptStatus::Failed, 2));
    assert!(r.attempt.error.unwrap_or_default().starts_with("exhausted: deliveries"));
    assert_eq!(r.command.lease_token, None);
    let counts = l.count_attempts(100).await.expect("counts");
    assert_eq!((counts.exhausted, counts.exhausted_capped), (2, false));
}

pub async fn the_deadline_ends_an_attempt_exhausted_at_a_claim<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register_with(l, "deadline", json!({"deadline_secs": 10})).await;
    let attempt = l.enqueue(&id, Action::Execute).await.expect("enqueue").attempt.id;
    h.advance_ms(10_000);
    let claimed = l.claim_and_begin("w1", 10, LEASE_MS).await.expect("claim");
    assert!(claimed.is_empty());
    let r = record(l, &attempt).await;
    assert_eq!(r.attempt.status, AttemptStatus::Failed);
    assert!(r
        .attempt
        .error
        .unwrap_or_default()
        .starts_with("exhausted: deadline: step 1 (one) after 0 deliveries"));
}

pub async fn a_scheduled_enqueue_is_claimable_from_its_start_and_never_before<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register_with(l, "scheduled", json!({})).await;
    let later = l
        .enqueue_at(&id, Action::Execute, Start::After(60_000))
        .await
        .expect("enqueue");
    assert_eq!(later.command.available_at, at(h.now(), 60_000));
    let counts = l.count_attempts(100).await.expect("counts");
    assert_eq!(counts.oldest_queued_at, Some(at(h.now(), 60_000)));
    h.advance_ms(59_999);
    assert_nothing_claimable(l).await;
    h.advance_ms(1);
    let c = claim_one(l, "w1").await;
    l.finish(&c.lease).await.expect_err("nothing ran yet: refused");
    l.abort(&c.lease.attempt_id, "done with it").await.expect("abort");
    let past = l
        .enqueue_at(&id, Action::Retry, Start::At(Timestamp::from_millis(0)))
        .await
        .expect("enqueue");
    assert_eq!(past.command.available_at, h.now(), "a start in the past means now");
    claim_one(l, "w1").await;
}

async fn failed_attempt<L: Ledger>(h: &Harness<L>, name: &str) -> (PlanId, AttemptId) {
    let l = &h.ledger;
    let id = register_with(l, name, json!({"max_deliveries": 1})).await;
    let attempt = l.enqueue(&id, Action::Execute).await.expect("enqueue").attempt.id;
    let c = claim_begun(l, "w1").await;
    assert!(matches!(give_back(l, &c, 0).await, Ok(Reply::Exhausted(_))));
    (id, attempt)
}

pub async fn bulk_recovery_retries_and_aborts_through_the_ledgers_transitions<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let (a, _) = failed_attempt(&h, "bulk-a").await;
    let (b, _) = failed_attempt(&h, "bulk-b").await;
    let none = retry_failed(l, &BulkFilter::default(), true).await;
    assert!(
        matches!(none, Err(LedgerError::BadInput(ref m)) if m.contains("needs a filter")),
        "{none:?}"
    );
    let exhausted = BulkFilter {
        reason: Some("exhausted".into()),
        limit: 1,
        ..BulkFilter::default()
    };
    let dry = retry_failed(l, &exhausted, true).await.expect("dry run");
    assert_eq!(
        (dry.count, dry.more, dry.attempts.len()),
        (1, true, 0),
        "bounded, and nothing written"
    );
    let only_a = BulkFilter {
        plan: Some(a.clone()),
        limit: 10,
        ..BulkFilter::default()
    };
    let done = retry_failed(l, &only_a, false).await.expect("retry");
    assert_eq!(done.count, 1);
    let retry = record(l, &done.attempts[0]).await;
    assert_eq!(
        (retry.attempt.action, retry.attempt.status),
        (Action::Retry, AttemptStatus::Queued)
    );
    let again = retry_failed(l, &only_a, true).await.expect("dry run");
    assert_eq!(
        again.count, 0,
        "a plan whose latest attempt is open has nothing to retry"
    );
    l.enqueue(&b, Action::Retry).await.expect("retry b");
    let open = BulkFilter {
        since: Some(Timestamp::from_millis(0)),
        limit: 10,
        ..BulkFilter::default()
    };
    assert_eq!(abort_open(l, &open, "ops", true).await.expect("dry run").count, 2);
    let aborted = abort_open(l, &open, "ops", false).await.expect("abort");
    assert_eq!(aborted.count, 2);
    for id in &aborted.attempts {
        let r = record(l, id).await;
        assert_eq!(r.attempt.status, AttemptStatus::Aborted);
        assert_eq!(r.attempt.error.as_deref(), Some("aborted in bulk by ops"));
    }
}
