//! Terminal attempts never change: every transition on a SUCCEEDED, FAILED or ABORTED
//! attempt is refused or writes nothing, whatever token is presented.

mod common;

use common::*;
use leasehold_engine::transition::{
    abort, begin_step, claim, complete_step, enqueue, fail, finish, heartbeat, reconcile, ReconcileOutcome,
};
use leasehold_engine::{Action, LeaseToken, Recovery, Refusal};

#[test]
fn terminal_attempts_never_change() {
    for plan in [resume_plan(), replay_plan()] {
        for (label, record) in terminal_records(&plan) {
            let now = at(900_000);
            // The old worker's token, a forged one, and none of them matches: a
            // terminal command holds no token.
            assert_eq!(record.command.lease_token, None, "{label}");
            for token in [token_a(), token_b(), LeaseToken::new("")] {
                let stale = Refusal::StaleToken { command: command_id(1) };
                assert_eq!(
                    refused(heartbeat(&record.command, &token, LEASE_MS, now)),
                    stale,
                    "{label}"
                );
                for ordinal in 1..=4 {
                    assert_eq!(
                        refused(begin_step(&record, ordinal, &token, LEASE_MS, now)),
                        stale,
                        "{label}"
                    );
                    assert_eq!(
                        refused(complete_step(
                            &record,
                            ordinal,
                            &evidence(ordinal),
                            &target_receipt(ordinal),
                            &token,
                            LEASE_MS,
                            now
                        )),
                        stale,
                        "{label}"
                    );
                    assert_eq!(
                        refused(fail(&record, Some(ordinal), "boom", &token, now)),
                        stale,
                        "{label}"
                    );
                }
                assert_eq!(refused(fail(&record, None, "boom", &token, now)), stale, "{label}");
                assert_eq!(refused(finish(&record, &token, now)), stale, "{label}");
            }
            let terminal = Refusal::Terminal {
                attempt: attempt_id(1),
                status: record.attempt.status,
            };
            for recovery in [Recovery::Resume, Recovery::Replay] {
                assert_eq!(
                    refused(claim(&record, recovery, OWNER_B, token_b(), LEASE_MS, now)),
                    terminal,
                    "{label}"
                );
                let (outcome, writes) = allowed(reconcile(&record, recovery, now));
                assert_eq!(outcome, ReconcileOutcome::Unchanged, "{label}");
                assert!(writes.is_empty(), "{label}");
            }
            assert_eq!(refused(abort(&record, "again", now)), terminal, "{label}");
        }
    }
}

#[test]
fn enqueueing_a_new_attempt_leaves_the_terminal_ones_as_they_were() {
    let plan = resume_plan();
    let history = [failed_at(&plan, 3)];
    let before = history.clone();
    let next = allowed(enqueue(&plan, &history, Action::Retry, ids(2), at(900_000)));
    assert_eq!(history, before);
    assert_ne!(next.attempt.id, history[0].attempt.id);
    assert!(next.receipts.iter().all(|r| r.attempt_id == attempt_id(2)));
}
