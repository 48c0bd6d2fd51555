//! Heartbeat: a current token renews the lease; any other token is refused.

mod common;

use common::*;
use leasehold_engine::transition::{heartbeat, Guard};
use leasehold_engine::{LeaseToken, Refusal};

#[test]
fn heartbeat_renews_the_lease_and_nothing_else() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let now = at(begin_ms(2) + 200);
    let writes = allowed(heartbeat(&record.command, &token_a(), LEASE_MS, now));

    let mut command = record.command.clone();
    command.lease_until = Some(now.plus_ms(LEASE_MS));
    command.last_heartbeat_at = Some(now);
    assert_eq!(writes.guard, Guard::Holds(token_a()));
    assert_eq!(writes.command, Some(command));
    assert_eq!(writes.attempt, None);
    assert!(writes.receipts.is_empty());

    let after = applied(&record, &writes);
    assert_eq!(after.receipts, record.receipts);
    assert_eq!(after.command.delivery_count, 1);
}

#[test]
fn heartbeat_after_the_lease_expired_but_before_a_takeover_still_renews() {
    // Nobody else claimed it: the token is still current, so the lease is renewed.
    let plan = resume_plan();
    let record = claimed(&plan);
    let now = at(expired_after(CLAIMED_MS) + 5_000);
    let writes = allowed(heartbeat(&record.command, &token_a(), LEASE_MS, now));
    assert_eq!(writes.command.and_then(|c| c.lease_until), Some(now.plus_ms(LEASE_MS)));
}

#[test]
fn heartbeat_with_stale_token_is_refused() {
    let plan = resume_plan();
    let record = claimed(&plan);
    let taken_over = claimed_by(&record, &plan, OWNER_B, token_b(), expired_after(CLAIMED_MS));
    let refusal = refused(heartbeat(
        &taken_over.command,
        &token_a(),
        LEASE_MS,
        at(expired_after(CLAIMED_MS) + 10),
    ));
    assert_eq!(refusal, Refusal::StaleToken { command: command_id(1) });
    assert_eq!(refusal.to_string(), "command cmd-1 is not held by this lease");
}

#[test]
fn heartbeat_with_an_unknown_token_is_refused() {
    let plan = resume_plan();
    let record = claimed(&plan);
    let refusal = refused(heartbeat(
        &record.command,
        &LeaseToken::new("forged"),
        LEASE_MS,
        at(CLAIMED_MS + 10),
    ));
    assert_eq!(refusal, Refusal::StaleToken { command: command_id(1) });
}

#[test]
fn heartbeat_of_a_pending_command_is_refused() {
    let plan = resume_plan();
    let record = enqueued(&plan);
    let refusal = refused(heartbeat(&record.command, &token_a(), LEASE_MS, at(CLAIMED_MS)));
    assert_eq!(refusal, Refusal::StaleToken { command: command_id(1) });
}
