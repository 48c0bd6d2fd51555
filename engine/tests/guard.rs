//! `Guard::admits` agrees with every transition: it admits the row the transition read,
//! and no longer admits it once another claim changed the token.

mod common;

use common::*;
use leasehold_engine::transition::{
    abort, begin_step, claim, complete_step, fail, finish, heartbeat, reconcile, Guard,
};
use leasehold_engine::{AttemptRecord, Command, Writes};

/// The writes of worker A's transitions (under `token_a`) and of abort, all computed
/// from one snapshot of a record whose step is RUNNING.
fn computed_from(record: &AttemptRecord, now_ms: i64) -> Vec<(&'static str, Writes)> {
    let now = at(now_ms);
    let ordinal = record
        .receipts
        .iter()
        .find(|r| r.status == leasehold_engine::ReceiptStatus::Running)
        .map_or(1, |r| r.ordinal);
    vec![
        (
            "heartbeat",
            allowed(heartbeat(&record.command, &token_a(), LEASE_MS, now)),
        ),
        (
            "begin step",
            allowed(begin_step(record, ordinal, &token_a(), LEASE_MS, now)),
        ),
        (
            "complete step",
            allowed(complete_step(
                record,
                ordinal,
                &evidence(ordinal),
                &target_receipt(ordinal),
                &token_a(),
                LEASE_MS,
                now,
            )),
        ),
        ("fail", allowed(fail(record, Some(ordinal), "boom", &token_a(), now))),
        ("abort", allowed(abort(record, "operator stop", now))),
    ]
}

fn admitted(writes: &Writes, command: &Command) -> bool {
    writes.guard.admits(Some(command))
}

#[test]
fn the_guard_of_each_worker_and_operator_transition_admits_the_row_it_read() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    for (name, writes) in computed_from(&record, begin_ms(2) + 100) {
        assert!(admitted(&writes, &record.command), "{name}");
    }
    let done = in_progress(&plan, 4, false);
    let writes = allowed(finish(&done, &token_a(), at(complete_ms(4) + 1)));
    assert!(admitted(&writes, &done.command), "finish");
}

#[test]
fn the_claim_guard_admits_the_row_claim_read() {
    let plan = resume_plan();
    let pending = enqueued(&plan);
    let writes = allowed(claim(
        &pending,
        plan.recovery,
        OWNER_A,
        token_a(),
        LEASE_MS,
        at(CLAIMED_MS),
    ));
    assert!(admitted(&writes, &pending.command));

    let expired = in_progress(&plan, 1, true);
    let now = at(expired_after(begin_ms(2)));
    let writes = allowed(claim(&expired, plan.recovery, OWNER_B, token_b(), LEASE_MS, now));
    assert!(admitted(&writes, &expired.command));
    let (_, writes) = allowed(reconcile(&expired, plan.recovery, now));
    assert!(admitted(&writes, &expired.command));
}

#[test]
fn no_guard_admits_the_row_after_another_claim_changed_the_token() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let expiry = expired_after(begin_ms(2));

    // Computed from the snapshot before the takeover (worker A still thinks it
    // holds the lease; an operator and a second claimant read the expired row).
    let mut stale = computed_from(&record, expiry);
    stale.push((
        "finish",
        allowed(finish(&in_progress(&plan, 4, false), &token_a(), at(expiry))),
    ));
    stale.push(("reconcile", allowed(reconcile(&record, plan.recovery, at(expiry))).1));
    stale.push((
        "claim",
        allowed(claim(
            &record,
            plan.recovery,
            "worker-c",
            leasehold_engine::LeaseToken::new("tok-c"),
            LEASE_MS,
            at(expiry),
        )),
    ));

    let taken_over = claimed_by(&record, &plan, OWNER_B, token_b(), expiry);
    for (name, writes) in &stale {
        assert!(
            !admitted(writes, &taken_over.command),
            "{name} must not apply after the takeover"
        );
    }
}

#[test]
fn the_reconcile_and_abort_guards_do_not_admit_a_row_whose_status_changed() {
    let plan = resume_plan();
    let record = enqueued(&plan);
    let (_, reconciled) = allowed(reconcile(&record, plan.recovery, at(CLAIMED_MS)));
    let aborted = allowed(abort(&record, "stop", at(CLAIMED_MS)));
    let after_claim = claimed(&plan);
    assert!(!admitted(&reconciled, &after_claim.command));
    assert!(!admitted(&aborted, &after_claim.command));
}

#[test]
fn the_claim_guard_does_not_admit_a_row_before_it_is_available() {
    let plan = resume_plan();
    let record = enqueued(&plan);
    assert!(!Guard::Claimable(at(ENQUEUED_MS - 1)).admits(Some(&record.command)));
    assert!(Guard::Claimable(at(ENQUEUED_MS)).admits(Some(&record.command)));
    let held = claimed(&plan);
    let until = CLAIMED_MS + LEASE_MS as i64;
    assert!(!Guard::Claimable(at(until)).admits(Some(&held.command)));
    assert!(Guard::Claimable(at(until + 1)).admits(Some(&held.command)));
}

#[test]
fn only_the_absent_guard_admits_a_missing_row() {
    let plan = resume_plan();
    let record = claimed(&plan);
    assert!(Guard::Absent.admits(None));
    assert!(!Guard::Absent.admits(Some(&record.command)));
    for guard in [
        Guard::Holds(token_a()),
        Guard::Claimable(at(CLAIMED_MS)),
        Guard::Unchanged {
            status: record.command.status,
            lease_token: record.command.lease_token.clone(),
        },
    ] {
        assert!(!guard.admits(None), "{guard:?}");
    }
}
