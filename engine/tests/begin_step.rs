//! Begin step: a PENDING receipt becomes RUNNING once every earlier one SUCCEEDED.

mod common;

use common::*;
use leasehold_engine::transition::{begin_step, Guard};
use leasehold_engine::{ReceiptStatus, Refusal};

#[test]
fn begin_step_marks_the_receipt_running_and_renews_the_lease() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, false);
    let now = at(begin_ms(2));
    let writes = allowed(begin_step(&record, 2, &token_a(), LEASE_MS, now));

    let mut receipt = record.receipts[1].clone();
    receipt.status = ReceiptStatus::Running;
    receipt.started_at = Some(now);
    let mut command = record.command.clone();
    command.lease_until = Some(now.plus_ms(LEASE_MS));
    command.last_heartbeat_at = Some(now);

    assert_eq!(writes.guard, Guard::Holds(token_a()));
    assert_eq!(writes.receipts, vec![receipt]);
    assert_eq!(writes.command, Some(command));
    assert_eq!(writes.attempt, None);
    assert_eq!(writes.receipts[0].idempotency_key, key(1, 2, "load"));
}

#[test]
fn begin_step_1_needs_nothing_before_it() {
    let plan = resume_plan();
    let record = claimed(&plan);
    let writes = allowed(begin_step(&record, 1, &token_a(), LEASE_MS, at(begin_ms(1))));
    assert_eq!(writes.receipts.len(), 1);
    assert_eq!(writes.receipts[0].status, ReceiptStatus::Running);
}

#[test]
fn begin_step_again_under_the_same_lease_only_renews() {
    // A retried request whose first reply was lost.
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let now = at(begin_ms(2) + 300);
    let writes = allowed(begin_step(&record, 2, &token_a(), LEASE_MS, now));
    assert!(writes.receipts.is_empty(), "the receipt keeps its first started_at");
    assert_eq!(writes.command.and_then(|c| c.lease_until), Some(now.plus_ms(LEASE_MS)));
}

#[test]
fn begin_step_2_before_step_1_succeeded_is_refused() {
    let plan = resume_plan();
    for (record, status) in [
        (claimed(&plan), ReceiptStatus::Pending),
        (in_progress(&plan, 0, true), ReceiptStatus::Running),
    ] {
        let refusal = refused(begin_step(&record, 2, &token_a(), LEASE_MS, at(begin_ms(2))));
        assert_eq!(
            refusal,
            Refusal::OutOfOrder {
                attempt: attempt_id(1),
                ordinal: 2,
                reason: format!("step 1 is {status}, not SUCCEEDED"),
            }
        );
    }
}

#[test]
fn begin_step_of_a_succeeded_step_is_refused() {
    let plan = resume_plan();
    let record = in_progress(&plan, 2, false);
    let refusal = refused(begin_step(&record, 2, &token_a(), LEASE_MS, at(begin_ms(3))));
    assert_eq!(
        refusal,
        Refusal::OutOfOrder {
            attempt: attempt_id(1),
            ordinal: 2,
            reason: "it is already SUCCEEDED".to_owned(),
        }
    );
}

#[test]
fn begin_step_of_a_step_the_attempt_does_not_have_is_refused() {
    let plan = resume_plan();
    let record = in_progress(&plan, 4, false);
    let refusal = refused(begin_step(&record, 5, &token_a(), LEASE_MS, at(begin_ms(5))));
    assert_eq!(refusal.to_string(), "attempt att-1 step 5: the attempt has 4 steps");
}

#[test]
fn begin_step_with_stale_token_is_refused() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, false);
    let taken_over = claimed_by(&record, &plan, OWNER_B, token_b(), expired_after(complete_ms(1)));
    let refusal = refused(begin_step(
        &taken_over,
        2,
        &token_a(),
        LEASE_MS,
        at(expired_after(complete_ms(1)) + 10),
    ));
    assert_eq!(refusal, Refusal::StaleToken { command: command_id(1) });
}
