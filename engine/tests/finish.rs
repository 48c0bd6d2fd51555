//! Finish: once every receipt SUCCEEDED, the attempt SUCCEEDS and the command is DELIVERED.

mod common;

use common::*;
use leasehold_engine::transition::{finish, Guard};
use leasehold_engine::{AttemptStatus, CommandStatus, ReceiptStatus, Refusal};

#[test]
fn finish_succeeds_the_attempt_delivers_the_command_and_clears_the_token() {
    let plan = resume_plan();
    let record = in_progress(&plan, 4, false);
    let now = at(complete_ms(4) + 100);
    let writes = allowed(finish(&record, &token_a(), now));

    let mut attempt = record.attempt.clone();
    attempt.status = AttemptStatus::Succeeded;
    attempt.finished_at = Some(now);
    let mut command = record.command.clone();
    command.status = CommandStatus::Delivered;
    command.lease_token = None;
    command.lease_until = None;
    command.finished_at = Some(now);

    assert_eq!(writes.guard, Guard::Holds(token_a()));
    assert_eq!(writes.attempt, Some(attempt));
    assert_eq!(writes.command, Some(command));
    assert!(writes.receipts.is_empty(), "receipts keep their evidence as completed");
    let after = applied(&record, &writes);
    assert_eq!(after.command.last_error, None);
    assert_eq!(after.attempt.error, None);
}

#[test]
fn finish_with_an_open_step_is_refused() {
    let plan = resume_plan();
    for (record, status) in [
        (in_progress(&plan, 3, true), ReceiptStatus::Running),
        (in_progress(&plan, 3, false), ReceiptStatus::Pending),
    ] {
        let refusal = refused(finish(&record, &token_a(), at(complete_ms(4))));
        assert_eq!(
            refusal,
            Refusal::OutOfOrder {
                attempt: attempt_id(1),
                ordinal: 4,
                reason: format!("it is {status}, not SUCCEEDED"),
            }
        );
    }
}

#[test]
fn finish_with_stale_token_is_refused() {
    let plan = resume_plan();
    let record = in_progress(&plan, 4, false);
    let taken_over = claimed_by(&record, &plan, OWNER_B, token_b(), expired_after(complete_ms(4)));
    let refusal = refused(finish(&taken_over, &token_a(), at(expired_after(complete_ms(4)) + 10)));
    assert_eq!(refusal, Refusal::StaleToken { command: command_id(1) });
}
