//! The delivery policy's transitions: give-back, exhaustion (at a give-back and at a
//! claim) and the scheduled start of an enqueue.

mod common;

use common::*;
use leasehold_engine::transition::{self, GaveBack, NewIds, Start};
use leasehold_engine::{
    decide, Action, AttemptRecord, AttemptStatus, ClaimRequest, CommandStatus, Exhaustion, Plan, PlanId, PlanSpec,
    ReceiptStatus, Refusal, Reply, Request, WorkerRequest,
};
use serde_json::{json, Value};

/// A two-step resume plan with the `[retry]` table `retry`.
fn policy_plan(retry: Value) -> Plan {
    let spec: PlanSpec = serde_json::from_value(json!({
        "name": "policy",
        "recovery": "resume",
        "retry": retry,
        "steps": [{"code": "a", "executor": EXECUTOR}, {"code": "b", "executor": EXECUTOR, "retry": {"max_deliveries": 7}}],
    }))
    .expect("the spec is well formed");
    spec.into_plan(&[EXECUTOR], PlanId::new("plan-1"), at(REGISTERED_MS))
        .expect("the spec is valid")
}

/// Step 1 begun under worker A's first lease.
fn running(plan: &Plan) -> AttemptRecord {
    begun(&claimed(plan), 1, &token_a(), CLAIMED_MS + 10)
}

fn give_back(record: &AttemptRecord, plan: &Plan, delay_ms: u64, now_ms: i64) -> (GaveBack, AttemptRecord) {
    let (gave, writes) = allowed(transition::give_back(
        record,
        plan,
        "HTTP 503",
        delay_ms,
        &token_a(),
        at(now_ms),
    ));
    (gave, applied(record, &writes))
}

#[test]
fn a_give_back_requeues_the_command_after_its_delay_and_keeps_the_error() {
    let plan = policy_plan(json!({"backoff_max_ms": 60_000}));
    let (gave, after) = give_back(&running(&plan), &plan, 5_000, 4_000);
    assert_eq!(gave, GaveBack::Until(at(9_000)));
    let c = &after.command;
    assert_eq!(c.status, CommandStatus::Pending);
    assert_eq!((c.lease_token.as_ref(), c.lease_until), (None, None));
    assert_eq!(c.lease_owner.as_deref(), Some(OWNER_A), "the last holder is kept");
    assert_eq!(c.available_at, at(9_000));
    assert_eq!(c.last_error.as_deref(), Some("HTTP 503"));
    assert_eq!(c.delivery_count, 1);
    assert_eq!(after.attempt.status, AttemptStatus::Queued);
    let r = after.receipt(1).unwrap();
    assert_eq!(
        (r.status, r.started_at),
        (ReceiptStatus::Pending, None),
        "the same key again"
    );
    // Not claimable before its delay, claimable at it.
    let claim = |ms| transition::claim(&after, plan.recovery, OWNER_B, token_b(), LEASE_MS, at(ms));
    assert!(matches!(refused(claim(8_999)), Refusal::NotClaimable { .. }));
    assert_eq!(allowed(claim(9_000)).command.unwrap().delivery_count, 2);
}

#[test]
fn a_give_back_delay_is_capped_at_the_policys_maximum() {
    let plan = policy_plan(json!({"backoff_base_ms": 10, "backoff_max_ms": 2_000}));
    let (gave, _) = give_back(&running(&plan), &plan, u64::MAX, 4_000);
    assert_eq!(gave, GaveBack::Until(at(6_000)));
}

#[test]
fn a_give_back_of_a_stale_lease_is_refused() {
    let plan = policy_plan(json!({}));
    let refusal = refused(transition::give_back(
        &running(&plan),
        &plan,
        "x",
        0,
        &token_b(),
        at(4_000),
    ));
    assert!(matches!(refusal, Refusal::StaleToken { .. }), "{refusal:?}");
}

#[test]
fn a_give_back_at_the_delivery_cap_ends_the_attempt_exhausted() {
    let plan = policy_plan(json!({"max_deliveries": 1}));
    let (gave, after) = give_back(&running(&plan), &plan, 100, 4_000);
    assert_eq!(gave, GaveBack::Exhausted(Exhaustion::Deliveries));
    assert_eq!(after.attempt.status, AttemptStatus::Failed);
    assert_eq!(after.command.status, CommandStatus::Failed);
    assert_eq!(after.command.lease_token, None);
    let error = after.attempt.error.as_deref().unwrap();
    assert_eq!(
        error,
        "exhausted: deliveries: step 1 (a) after 1 delivery; last error: HTTP 503"
    );
    assert_eq!(after.receipt(1).unwrap().status, ReceiptStatus::Failed);
    assert_eq!(after.receipt(2).unwrap().status, ReceiptStatus::Aborted);
}

#[test]
fn a_give_back_whose_next_delivery_would_pass_the_deadline_ends_the_attempt_exhausted() {
    // Enqueued at 2 s with a 10 s deadline: due by 12 s.
    let plan = policy_plan(json!({"deadline_secs": 10}));
    let (gave, _) = give_back(&running(&plan), &plan, 7_999, 4_000);
    assert_eq!(gave, GaveBack::Until(at(11_999)));
    let (gave, after) = give_back(&running(&plan), &plan, 8_000, 4_000);
    assert_eq!(gave, GaveBack::Exhausted(Exhaustion::Deadline));
    assert!(after
        .attempt
        .error
        .unwrap()
        .starts_with("exhausted: deadline: step 1 (a)"));
}

#[test]
fn a_claim_that_finds_the_cap_reached_ends_the_attempt_instead_of_claiming() {
    let plan = policy_plan(json!({"max_deliveries": 2}));
    let mut record = running(&plan);
    // Two deliveries, the second lease expired mid-step.
    record.command.delivery_count = 2;
    let now = at(expired_after(CLAIMED_MS + 10));
    let request = ClaimRequest {
        owner: OWNER_B.into(),
        batch: 1,
        lease_ms: LEASE_MS,
        begin: true,
        capabilities: None,
    };
    let (writes, reply) = allowed(decide(&record, Request::Claim(&request, &token_b(), &plan), now));
    assert_eq!(reply, Reply::Exhausted(Exhaustion::Deliveries));
    let after = applied(&record, &writes);
    assert_eq!(after.command.status, CommandStatus::Failed);
    assert_eq!(after.command.delivery_count, 2, "no delivery beyond the cap");
    assert_eq!(after.command.lease_token, None);
    assert!(
        writes.guard.admits(Some(&record.command)),
        "under the claim's own guard"
    );
    assert!(after
        .attempt
        .error
        .unwrap()
        .starts_with("exhausted: deliveries: step 1 (a) after 2 deliveries"));
}

#[test]
fn a_step_policy_overrides_the_plans_for_that_step() {
    let plan = policy_plan(json!({"max_deliveries": 2}));
    // Step 1 done: step b (max_deliveries 7) rules now.
    let mut record = running(&plan);
    record = completed(&record, 1, &token_a(), CLAIMED_MS + 20);
    record.command.delivery_count = 2;
    record.command.lease_until = Some(at(CLAIMED_MS));
    let request = ClaimRequest {
        owner: OWNER_B.into(),
        batch: 1,
        lease_ms: LEASE_MS,
        begin: false,
        capabilities: None,
    };
    let (_, reply) = allowed(decide(
        &record,
        Request::Claim(&request, &token_b(), &plan),
        at(CLAIMED_MS + 60_000),
    ));
    assert_eq!(reply, Reply::Applied);
}

#[test]
fn the_give_back_request_is_decided_with_the_plan_and_refused_without_it() {
    let plan = policy_plan(json!({}));
    let record = running(&plan);
    let request = WorkerRequest::GiveBack {
        error: "busy".into(),
        delay_ms: 1_000,
    };
    let (_, reply) = allowed(decide(
        &record,
        Request::Worker(&request, &token_a(), Some(&plan)),
        at(4_000),
    ));
    assert_eq!(reply, Reply::GaveBack { until: at(5_000) });
    assert!(decide(&record, Request::Worker(&request, &token_a(), None), at(4_000)).is_err());
}

#[test]
fn an_enqueue_starts_now_at_a_later_instant_or_after_a_delay_never_in_the_past() {
    let plan = resume_plan();
    let ids = |n| NewIds {
        attempt: attempt_id(n),
        command: command_id(n),
        trace: None,
    };
    let now = at(ENQUEUED_MS);
    let start = |s| {
        allowed(transition::enqueue_at(&plan, &[], Action::Execute, ids(1), now, s))
            .command
            .available_at
    };
    assert_eq!(start(Start::Now), now);
    assert_eq!(start(Start::At(at(90_000))), at(90_000));
    assert_eq!(start(Start::At(at(0))), now, "a past instant means now");
    assert_eq!(start(Start::After(600_000)), at(ENQUEUED_MS + 600_000));
}
