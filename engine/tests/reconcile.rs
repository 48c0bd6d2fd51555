//! Reconcile: expired leases go back to PENDING; live leases are never stolen; PENDING
//! and terminal commands are returned unchanged.

mod common;

use common::*;
use leasehold_engine::transition::{reconcile, Guard, ReconcileOutcome};
use leasehold_engine::{AttemptStatus, CommandStatus, ReceiptStatus, Recovery, Refusal};

#[test]
fn reconcile_of_a_pending_command_changes_nothing() {
    let plan = resume_plan();
    let record = enqueued(&plan);
    let (outcome, writes) = allowed(reconcile(&record, plan.recovery, at(CLAIMED_MS)));
    assert_eq!(outcome, ReconcileOutcome::Unchanged);
    assert!(writes.is_empty());
    assert_eq!(
        writes.guard,
        Guard::Unchanged {
            status: CommandStatus::Pending,
            lease_token: None
        }
    );
}

#[test]
fn reconcile_of_a_live_lease_is_refused() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let until = begin_ms(2) + LEASE_MS as i64;
    for now in [begin_ms(2) + 1, until] {
        let refusal = refused(reconcile(&record, plan.recovery, at(now)));
        assert_eq!(
            refusal,
            Refusal::LiveLease {
                command: command_id(1),
                owner: OWNER_A.to_owned(),
                until: at(until),
            }
        );
    }
}

#[test]
fn reconcile_of_an_expired_lease_requeues_the_command_and_resets_the_ambiguous_receipt() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let now = at(expired_after(begin_ms(2)));
    let (outcome, writes) = allowed(reconcile(&record, Recovery::Resume, now));
    assert_eq!(outcome, ReconcileOutcome::Requeued);

    let mut attempt = record.attempt.clone();
    attempt.status = AttemptStatus::Queued;
    let mut command = record.command.clone();
    command.status = CommandStatus::Pending;
    command.lease_owner = None;
    command.lease_token = None;
    command.lease_until = None;
    command.available_at = now;
    command.last_error = Some("lease of worker-a expired; requeued by reconcile".to_owned());
    let mut receipt = record.receipts[1].clone();
    receipt.status = ReceiptStatus::Pending;
    receipt.started_at = None;

    assert_eq!(
        writes.guard,
        Guard::Unchanged {
            status: CommandStatus::Processing,
            lease_token: Some(token_a())
        }
    );
    assert_eq!(writes.attempt, Some(attempt));
    assert_eq!(writes.command, Some(command), "delivery_count is kept");
    assert_eq!(
        writes.receipts,
        vec![receipt],
        "the SUCCEEDED step 1 keeps its evidence"
    );
}

#[test]
fn reconcile_of_an_expired_replay_lease_resets_every_receipt_as_a_takeover_would() {
    let plan = replay_plan();
    let record = in_progress(&plan, 2, true);
    let now = at(expired_after(begin_ms(3)));
    let (outcome, writes) = allowed(reconcile(&record, Recovery::Replay, now));
    assert_eq!(outcome, ReconcileOutcome::Requeued);
    let after = applied(&record, &writes);
    assert_eq!(after.receipts, enqueued(&plan).receipts);
    assert_eq!(after.attempt.status, AttemptStatus::Queued);
    assert_eq!(after.command.status, CommandStatus::Pending);
}

#[test]
fn a_requeued_command_fences_its_old_worker_and_can_be_claimed_again() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let now = expired_after(begin_ms(2));
    let (_, writes) = allowed(reconcile(&record, Recovery::Resume, at(now)));
    let requeued = applied(&record, &writes);
    assert!(matches!(
        refused(leasehold_engine::transition::heartbeat(
            &requeued.command,
            &token_a(),
            LEASE_MS,
            at(now + 1)
        )),
        Refusal::StaleToken { .. }
    ));
    let reclaimed = claimed_by(&requeued, &plan, OWNER_B, token_b(), now + 1);
    assert_eq!(reclaimed.command.delivery_count, 2);
    assert_eq!(reclaimed.attempt.status, AttemptStatus::Running);
    assert_eq!(reclaimed.receipts[1].status, ReceiptStatus::Pending);
}

#[test]
fn reconcile_of_a_terminal_command_changes_nothing() {
    let plan = resume_plan();
    for (label, record) in terminal_records(&plan) {
        let (outcome, writes) = allowed(reconcile(&record, plan.recovery, at(900_000)));
        assert_eq!(outcome, ReconcileOutcome::Unchanged, "{label}");
        assert!(writes.is_empty(), "{label}");
    }
}
