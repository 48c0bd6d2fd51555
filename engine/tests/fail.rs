//! Fail: the failing receipt FAILED, the open ones ABORTED, attempt and command FAILED.

mod common;

use common::*;
use leasehold_engine::transition::{fail, Guard};
use leasehold_engine::{AttemptStatus, CommandStatus, ReceiptStatus, Refusal};

#[test]
fn fail_marks_the_step_failed_later_steps_aborted_and_fails_the_command() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let now = at(begin_ms(2) + 400);
    let writes = allowed(fail(&record, Some(2), "step 2: target said no", &token_a(), now));

    let mut failed = record.receipts[1].clone();
    failed.status = ReceiptStatus::Failed;
    failed.error = Some("step 2: target said no".to_owned());
    failed.finished_at = Some(now);
    let aborted: Vec<_> = record.receipts[2..]
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.status = ReceiptStatus::Aborted;
            r.error = Some("not run: step 2 failed".to_owned());
            r.finished_at = Some(now);
            r
        })
        .collect();
    let mut attempt = record.attempt.clone();
    attempt.status = AttemptStatus::Failed;
    attempt.finished_at = Some(now);
    attempt.error = Some("step 2: target said no".to_owned());
    let mut command = record.command.clone();
    command.status = CommandStatus::Failed;
    command.lease_token = None;
    command.lease_until = None;
    command.finished_at = Some(now);
    command.last_error = Some("step 2: target said no".to_owned());

    assert_eq!(writes.guard, Guard::Holds(token_a()));
    assert_eq!(
        writes.receipts,
        [vec![failed], aborted].concat(),
        "the SUCCEEDED step 1 is not written"
    );
    assert_eq!(writes.attempt, Some(attempt));
    assert_eq!(writes.command, Some(command));

    let after = applied(&record, &writes);
    assert_eq!(after.receipts[0], record.receipts[0]);
    assert_eq!(
        after.command.lease_owner.as_deref(),
        Some(OWNER_A),
        "the owner stays for the record"
    );
    assert_eq!(after.command.delivery_count, 1);
    for (before, after) in record.receipts.iter().zip(&after.receipts) {
        assert_eq!(before.idempotency_key, after.idempotency_key);
    }
}

#[test]
fn fail_without_a_step_aborts_every_open_receipt() {
    let plan = resume_plan();
    let record = in_progress(&plan, 2, false);
    let now = at(complete_ms(2) + 10);
    let writes = allowed(fail(&record, None, "plan cannot run here", &token_a(), now));
    let statuses: Vec<_> = writes.receipts.iter().map(|r| (r.ordinal, r.status)).collect();
    assert_eq!(statuses, [(3, ReceiptStatus::Aborted), (4, ReceiptStatus::Aborted)]);
    assert!(writes
        .receipts
        .iter()
        .all(|r| r.error.as_deref() == Some("not run: the attempt failed")));
    let after = applied(&record, &writes);
    assert_eq!(after.attempt.status, AttemptStatus::Failed);
    assert_eq!(after.command.status, CommandStatus::Failed);
    assert_eq!(after.command.lease_token, None);
}

#[test]
fn fail_of_a_step_the_attempt_does_not_have_is_refused() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let refusal = refused(fail(&record, Some(9), "boom", &token_a(), at(begin_ms(2) + 10)));
    assert!(matches!(refusal, Refusal::OutOfOrder { ordinal: 9, .. }), "{refusal:?}");
}

#[test]
fn fail_with_stale_token_is_refused() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let taken_over = claimed_by(&record, &plan, OWNER_B, token_b(), expired_after(begin_ms(2)));
    let refusal = refused(fail(
        &taken_over,
        Some(2),
        "boom",
        &token_a(),
        at(expired_after(begin_ms(2)) + 10),
    ));
    assert_eq!(refusal, Refusal::StaleToken { command: command_id(1) });
}
