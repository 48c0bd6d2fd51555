//! Abort: an open attempt, its open receipts and its command ABORTED, the worker fenced.

mod common;

use common::*;
use leasehold_engine::transition::{abort, heartbeat, Guard};
use leasehold_engine::{AttemptStatus, CommandStatus, ReceiptStatus, Refusal};

#[test]
fn abort_of_a_queued_attempt_aborts_every_receipt_and_the_command() {
    let plan = resume_plan();
    let record = enqueued(&plan);
    let now = at(CLAIMED_MS);
    let writes = allowed(abort(&record, "operator stop", now));

    let mut attempt = record.attempt.clone();
    attempt.status = AttemptStatus::Aborted;
    attempt.finished_at = Some(now);
    attempt.error = Some("operator stop".to_owned());
    let mut command = record.command.clone();
    command.status = CommandStatus::Aborted;
    command.finished_at = Some(now);
    command.last_error = Some("operator stop".to_owned());
    let receipts: Vec<_> = record
        .receipts
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.status = ReceiptStatus::Aborted;
            r.error = Some("operator stop".to_owned());
            r.finished_at = Some(now);
            r
        })
        .collect();

    assert_eq!(
        writes.guard,
        Guard::Unchanged {
            status: CommandStatus::Pending,
            lease_token: None
        }
    );
    assert_eq!(writes.attempt, Some(attempt));
    assert_eq!(writes.command, Some(command));
    assert_eq!(writes.receipts, receipts);
}

#[test]
fn abort_of_a_running_attempt_keeps_succeeded_steps_and_fences_the_worker() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let now = at(begin_ms(2) + 100);
    let writes = allowed(abort(&record, "operator stop", now));
    assert_eq!(
        writes.guard,
        Guard::Unchanged {
            status: CommandStatus::Processing,
            lease_token: Some(token_a())
        }
    );
    let ordinals: Vec<u32> = writes.receipts.iter().map(|r| r.ordinal).collect();
    assert_eq!(ordinals, [2, 3, 4], "the SUCCEEDED step 1 is not written");

    let after = applied(&record, &writes);
    assert_eq!(after.receipts[0], record.receipts[0]);
    assert!(after.receipts[1..].iter().all(|r| r.status == ReceiptStatus::Aborted));
    assert_eq!(after.attempt.status, AttemptStatus::Aborted);
    assert_eq!(after.command.status, CommandStatus::Aborted);
    assert_eq!(after.command.lease_token, None);
    assert_eq!(after.command.lease_until, None);
    assert_eq!(after.command.lease_owner.as_deref(), Some(OWNER_A));
    assert_eq!(after.command.finished_at, Some(now));
    let refusal = refused(heartbeat(&after.command, &token_a(), LEASE_MS, at(begin_ms(2) + 200)));
    assert_eq!(refusal, Refusal::StaleToken { command: command_id(1) });
}

#[test]
fn abort_of_a_terminal_attempt_is_refused() {
    let plan = resume_plan();
    for (label, record) in terminal_records(&plan) {
        let refusal = refused(abort(&record, "too late", at(900_000)));
        assert_eq!(
            refusal,
            Refusal::Terminal {
                attempt: attempt_id(1),
                status: record.attempt.status,
            },
            "{label}"
        );
        assert_eq!(
            refusal.to_string(),
            format!("attempt att-1 is already {}", record.attempt.status)
        );
    }
}
