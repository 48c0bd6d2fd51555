//! Fused transitions: claim-and-begin and complete-and-continue write exactly what
//! the two transitions they chain write one after the other, under the first one's
//! guard, in one transaction.

mod common;

use common::*;
use leasehold_engine::driver::{Driver, DriverAction, Outcome};
use leasehold_engine::transition::{self, claim_and_begin, complete_and_continue, Continued, Guard};
use leasehold_engine::{AttemptStatus, CommandStatus, ReceiptStatus, Refusal};
use leasehold_engine::{Reply, WorkerRequest};

fn claim_then_begin(
    record: &leasehold_engine::AttemptRecord,
    plan: &leasehold_engine::Plan,
    now_ms: i64,
) -> leasehold_engine::AttemptRecord {
    let claimed = claimed_by(record, plan, OWNER_B, token_b(), now_ms);
    match transition::next_step(&claimed) {
        Some(o) => begun(&claimed, o, &token_b(), now_ms),
        None => claimed,
    }
}

#[test]
fn claim_and_begin_writes_what_claim_then_begin_write() {
    for plan in [resume_plan(), replay_plan()] {
        let record = enqueued(&plan);
        let writes = allowed(claim_and_begin(
            &record,
            plan.recovery,
            OWNER_B,
            token_b(),
            LEASE_MS,
            at(CLAIMED_MS),
        ));
        assert_eq!(writes.guard, Guard::Claimable(at(CLAIMED_MS)));
        let fused = applied(&record, &writes);
        assert_eq!(fused, claim_then_begin(&record, &plan, CLAIMED_MS));
        assert_eq!(fused.receipts[0].status, ReceiptStatus::Running);
        assert_eq!(fused.command.status, CommandStatus::Processing);
        assert_eq!(fused.attempt.status, AttemptStatus::Running);
    }
}

#[test]
fn claim_and_begin_on_a_resume_takeover_rebegins_the_ambiguous_step_with_its_key() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let now = expired_after(begin_ms(2));
    let writes = allowed(claim_and_begin(
        &record,
        plan.recovery,
        OWNER_B,
        token_b(),
        LEASE_MS,
        at(now),
    ));
    let fused = applied(&record, &writes);
    assert_eq!(fused, claim_then_begin(&record, &plan, now));
    assert_eq!(fused.receipts[0], record.receipts[0], "the succeeded step is kept");
    assert_eq!(fused.receipts[1].status, ReceiptStatus::Running);
    assert_eq!(fused.receipts[1].started_at, Some(at(now)));
    assert_eq!(fused.receipts[1].idempotency_key, record.receipts[1].idempotency_key);
    assert_eq!(fused.command.delivery_count, 2);
}

#[test]
fn claim_and_begin_on_a_replay_takeover_starts_over_at_step_1() {
    let plan = replay_plan();
    let record = in_progress(&plan, 2, true);
    let now = expired_after(begin_ms(3));
    let fused = applied(
        &record,
        &allowed(claim_and_begin(
            &record,
            plan.recovery,
            OWNER_B,
            token_b(),
            LEASE_MS,
            at(now),
        )),
    );
    assert_eq!(fused, claim_then_begin(&record, &plan, now));
    assert_eq!(fused.receipts[0].status, ReceiptStatus::Running);
    assert!(fused.receipts[1..]
        .iter()
        .all(|r| r.status == ReceiptStatus::Pending && r.evidence.is_none()));
}

#[test]
fn claim_and_begin_of_a_live_lease_is_refused_like_claim() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let refusal = refused(claim_and_begin(
        &record,
        plan.recovery,
        OWNER_B,
        token_b(),
        LEASE_MS,
        at(begin_ms(2) + 1),
    ));
    assert!(matches!(refusal, Refusal::LiveLease { .. }), "{refusal:?}");
}

#[test]
fn complete_and_continue_begins_the_next_step() {
    let plan = resume_plan();
    let record = in_progress(&plan, 0, true);
    let now = complete_ms(1);
    let (continued, writes) = allowed(complete_and_continue(
        &record,
        1,
        &evidence(1),
        &target_receipt(1),
        &token_a(),
        LEASE_MS,
        at(now),
    ));
    assert_eq!(continued, Continued::Began(2));
    assert_eq!(writes.guard, Guard::Holds(token_a()));
    let fused = applied(&record, &writes);
    let separate = begun(&completed(&record, 1, &token_a(), now), 2, &token_a(), now);
    assert_eq!(fused, separate);
}

#[test]
fn complete_and_continue_after_the_last_step_finishes_the_attempt() {
    let plan = resume_plan();
    let steps = plan.steps.len() as u32;
    let record = in_progress(&plan, steps - 1, true);
    let now = complete_ms(steps);
    let (continued, writes) = allowed(complete_and_continue(
        &record,
        steps,
        &evidence(steps),
        &target_receipt(steps),
        &token_a(),
        LEASE_MS,
        at(now),
    ));
    assert_eq!(continued, Continued::Finished);
    let fused = applied(&record, &writes);
    let done = completed(&record, steps, &token_a(), now);
    let separate = applied(&done, &allowed(transition::finish(&done, &token_a(), at(now))));
    assert_eq!(fused, separate);
    assert_eq!(fused.attempt.status, AttemptStatus::Succeeded);
    assert_eq!(fused.command.status, CommandStatus::Delivered);
    assert_eq!(fused.command.lease_token, None);
}

#[test]
fn complete_and_continue_with_stale_token_is_refused() {
    let plan = resume_plan();
    let record = in_progress(&plan, 0, true);
    let refusal = refused(complete_and_continue(
        &record,
        1,
        &evidence(1),
        &target_receipt(1),
        &token_b(),
        LEASE_MS,
        at(complete_ms(1)),
    ));
    assert!(matches!(refusal, Refusal::StaleToken { .. }), "{refusal:?}");
}

/// The claimed record with these receipt statuses.
fn claimed_with(statuses: &[ReceiptStatus]) -> leasehold_engine::AttemptRecord {
    let mut record = claimed(&resume_plan());
    for (r, status) in record.receipts.iter_mut().zip(statuses) {
        r.status = *status;
    }
    record
}

#[test]
fn a_fused_driver_delivers_n_steps_in_n_plus_one_transactions() {
    let plan = resume_plan();
    let steps = plan.steps.len() as u32;
    // The claim already began step 1.
    let record = applied(
        &enqueued(&plan),
        &allowed(claim_and_begin(
            &enqueued(&plan),
            plan.recovery,
            OWNER_A,
            token_a(),
            LEASE_MS,
            at(CLAIMED_MS),
        )),
    );
    let mut driver = Driver::fused(&record, LEASE_MS, at(CLAIMED_MS));
    let mut now = CLAIMED_MS;
    let mut transactions = 1; // the claim
    for ordinal in 1..=steps {
        assert_eq!(driver.poll_action(at(now)), Some(DriverAction::Execute { ordinal }));
        assert_eq!(driver.poll_action(at(now)), None);
        now += 10;
        driver.handle_executed(
            at(now),
            ordinal,
            leasehold_engine::driver::ExecutorResult::Done {
                evidence: evidence(ordinal),
                target_receipt: target_receipt(ordinal),
            },
        );
        match driver.poll_action(at(now)) {
            Some(DriverAction::Ledger(WorkerRequest::CompleteAndContinue { ordinal: o, .. })) => {
                assert_eq!(o, ordinal)
            }
            other => panic!("expected CompleteAndContinue for {ordinal}, got {other:?}"),
        }
        transactions += 1;
        let continued = if ordinal < steps {
            Continued::Began(ordinal + 1)
        } else {
            Continued::Finished
        };
        driver.handle_reply(at(now), Reply::Continued(continued));
    }
    assert_eq!(driver.outcome(), Some(&Outcome::Delivered));
    assert_eq!(transactions, steps + 1);
}

#[test]
fn a_fused_driver_begins_a_step_the_claim_left_pending() {
    let record = claimed_with(&[ReceiptStatus::Succeeded, ReceiptStatus::Pending]);
    let mut driver = Driver::fused(&record, LEASE_MS, at(CLAIMED_MS));
    assert_eq!(
        driver.poll_action(at(CLAIMED_MS)),
        Some(DriverAction::Ledger(WorkerRequest::BeginStep {
            ordinal: 2,
            lease_ms: LEASE_MS
        }))
    );
}
