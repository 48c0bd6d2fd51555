//! Claim: first deliveries, takeovers under `resume` and `replay`, and every refusal.

mod common;

use common::*;
use leasehold_engine::transition::{claim, Guard};
use leasehold_engine::{AttemptStatus, CommandStatus, ReceiptStatus, Recovery, Refusal};

#[test]
fn claim_of_a_pending_command_leases_it_and_starts_the_attempt() {
    for plan in [resume_plan(), replay_plan()] {
        let record = enqueued(&plan);
        let now = at(CLAIMED_MS);
        let writes = allowed(claim(&record, plan.recovery, OWNER_A, token_a(), LEASE_MS, now));

        let mut attempt = record.attempt.clone();
        attempt.status = AttemptStatus::Running;
        attempt.started_at = Some(now);
        let mut command = record.command.clone();
        command.status = CommandStatus::Processing;
        command.lease_owner = Some(OWNER_A.to_owned());
        command.lease_token = Some(token_a());
        command.lease_until = Some(at(CLAIMED_MS + LEASE_MS as i64));
        command.last_heartbeat_at = Some(now);
        command.delivery_count = 1;

        assert_eq!(writes.guard, Guard::Claimable(now));
        assert_eq!(writes.attempt, Some(attempt));
        assert_eq!(writes.command, Some(command));
        assert!(writes.receipts.is_empty(), "a first delivery leaves its receipts alone");
    }
}

#[test]
fn claim_at_exactly_available_at_is_allowed() {
    let plan = resume_plan();
    let record = enqueued(&plan);
    allowed(claim(
        &record,
        plan.recovery,
        OWNER_A,
        token_a(),
        LEASE_MS,
        at(ENQUEUED_MS),
    ));
}

#[test]
fn claim_of_an_expired_lease_takes_the_command_over() {
    let plan = resume_plan();
    let record = claimed(&plan);
    let now = at(expired_after(CLAIMED_MS));
    let writes = allowed(claim(&record, plan.recovery, OWNER_B, token_b(), LEASE_MS, now));

    let mut command = record.command.clone();
    command.lease_owner = Some(OWNER_B.to_owned());
    command.lease_token = Some(token_b());
    command.lease_until = Some(now.plus_ms(LEASE_MS));
    command.last_heartbeat_at = Some(now);
    command.delivery_count = 2;
    command.last_error = Some("lease of worker-a expired; taken over by worker-b".to_owned());
    let mut attempt = record.attempt.clone();
    attempt.status = AttemptStatus::Running;

    assert_eq!(writes.guard, Guard::Claimable(now));
    assert_eq!(writes.command, Some(command));
    assert_eq!(writes.attempt, Some(attempt), "started_at keeps the first claim's time");
    assert!(writes.receipts.is_empty(), "no receipt had begun");
}

#[test]
fn claim_of_a_resume_plan_after_takeover_puts_the_running_receipt_back_to_pending() {
    let plan = resume_plan();
    let record = in_progress(&plan, 2, true);
    let now = at(expired_after(begin_ms(3)));
    let writes = allowed(claim(&record, Recovery::Resume, OWNER_B, token_b(), LEASE_MS, now));

    let mut reset = record.receipts[2].clone();
    assert_eq!(reset.status, ReceiptStatus::Running);
    reset.status = ReceiptStatus::Pending;
    reset.started_at = None;
    assert_eq!(writes.receipts, vec![reset], "only the ambiguous receipt changes");

    let after = applied(&record, &writes);
    assert_eq!(
        after.receipts[..2],
        record.receipts[..2],
        "SUCCEEDED receipts and evidence are kept"
    );
    assert!(after.receipts[..2]
        .iter()
        .all(|r| r.evidence.is_some() && r.evidence_sha256.is_some()));
    for (before, after) in record.receipts.iter().zip(&after.receipts) {
        assert_eq!(before.idempotency_key, after.idempotency_key);
    }
    assert_eq!(after.receipts[2].idempotency_key, key(1, 3, "migrate"));
    assert_eq!(after.command.delivery_count, 2);
    assert_eq!(after.command.lease_token, Some(token_b()));
}

#[test]
fn claim_of_a_replay_plan_on_takeover_resets_every_receipt_and_drops_evidence() {
    let plan = replay_plan();
    let record = in_progress(&plan, 2, true);
    let now = at(expired_after(begin_ms(3)));
    let writes = allowed(claim(&record, Recovery::Replay, OWNER_B, token_b(), LEASE_MS, now));

    let expected: Vec<_> = record.receipts[..3]
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.status = ReceiptStatus::Pending;
            r.evidence = None;
            r.evidence_sha256 = None;
            r.target_receipt = None;
            r.error = None;
            r.started_at = None;
            r.finished_at = None;
            r
        })
        .collect();
    assert_eq!(writes.receipts, expected, "the PENDING fourth receipt needs no write");

    let after = applied(&record, &writes);
    let blank = enqueued(&plan);
    assert_eq!(
        after.receipts, blank.receipts,
        "every receipt is as enqueued, keys included"
    );
    assert_eq!(after.command.delivery_count, 2);
}

#[test]
fn claim_of_a_replay_plan_after_reconcile_leaves_the_already_reset_receipts_alone() {
    let plan = replay_plan();
    let record = in_progress(&plan, 2, true);
    let (_, writes) = allowed(leasehold_engine::transition::reconcile(
        &record,
        Recovery::Replay,
        at(expired_after(begin_ms(3))),
    ));
    let requeued = applied(&record, &writes);
    let now = at(expired_after(begin_ms(3)) + 1_000);
    let writes = allowed(claim(&requeued, Recovery::Replay, OWNER_B, token_b(), LEASE_MS, now));
    assert!(writes.receipts.is_empty());
    let after = applied(&requeued, &writes);
    assert_eq!(after.command.delivery_count, 2);
    assert_eq!(after.command.status, CommandStatus::Processing);
    assert_eq!(
        after.command.last_error.as_deref(),
        Some("lease of worker-a expired; requeued by reconcile"),
        "a claim of a PENDING command is not a takeover and keeps the reconcile reason"
    );
}

#[test]
fn claim_of_a_live_lease_is_refused() {
    let plan = resume_plan();
    let record = claimed(&plan);
    let until = CLAIMED_MS + LEASE_MS as i64;
    for now in [CLAIMED_MS, until - 1, until] {
        let refusal = refused(claim(&record, plan.recovery, OWNER_B, token_b(), LEASE_MS, at(now)));
        assert_eq!(
            refusal,
            Refusal::LiveLease {
                command: command_id(1),
                owner: OWNER_A.to_owned(),
                until: at(until),
            },
            "a lease is live up to and including lease_until (now = {now})"
        );
    }
}

#[test]
fn claim_of_a_command_that_is_not_yet_available_is_refused() {
    let plan = resume_plan();
    let mut record = enqueued(&plan);
    record.command.available_at = at(10_000);
    let refusal = refused(claim(&record, plan.recovery, OWNER_A, token_a(), LEASE_MS, at(9_999)));
    assert!(
        matches!(&refusal, Refusal::NotClaimable { command, .. } if *command == command_id(1)),
        "{refusal:?}"
    );
    assert_eq!(
        refusal.to_string(),
        format!("command cmd-1 is not claimable: not available until {}", at(10_000))
    );
}

#[test]
fn claim_of_a_terminal_command_is_not_claimable() {
    // A terminal command under an attempt read as still open (the rows disagree)
    // must still never be claimed.
    let plan = resume_plan();
    for (label, terminal) in terminal_records(&plan) {
        let mut record = terminal.clone();
        record.attempt.status = AttemptStatus::Running;
        let refusal = refused(claim(&record, plan.recovery, OWNER_B, token_b(), LEASE_MS, at(900_000)));
        assert_eq!(
            refusal,
            Refusal::NotClaimable {
                command: command_id(1),
                reason: format!("it is {}", terminal.command.status),
            },
            "{label}"
        );
        assert!(!Guard::Claimable(at(900_000)).admits(Some(&record.command)), "{label}");
    }
}

#[test]
fn claim_of_a_terminal_attempt_is_refused() {
    let plan = resume_plan();
    for (label, record) in terminal_records(&plan) {
        let refusal = refused(claim(&record, plan.recovery, OWNER_B, token_b(), LEASE_MS, at(900_000)));
        assert_eq!(
            refusal,
            Refusal::Terminal {
                attempt: attempt_id(1),
                status: record.attempt.status,
            },
            "{label}"
        );
    }
}
