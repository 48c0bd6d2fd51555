//! Complete step: a RUNNING receipt SUCCEEDS with canonical evidence and its SHA-256.

mod common;

use common::*;
use leasehold_engine::transition::{complete_step, Guard};
use leasehold_engine::{ReceiptStatus, Refusal};
use serde_json::json;
use sha2::{Digest, Sha256};

#[test]
fn complete_step_stores_canonical_evidence_its_sha256_and_the_target_receipt() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let now = at(complete_ms(2));
    // Written out of order and with an integral float: stored canonically.
    let evidence = json!({"tables": ["app_user"], "rows": 20.0, "step": 2});
    let target = json!({"ack": 2, "target": "sandbox"});
    let writes = allowed(complete_step(&record, 2, &evidence, &target, &token_a(), LEASE_MS, now));

    let canonical = r#"{"rows":20,"step":2,"tables":["app_user"]}"#;
    let mut receipt = record.receipts[1].clone();
    receipt.status = ReceiptStatus::Succeeded;
    receipt.evidence = Some(canonical.to_owned());
    receipt.evidence_sha256 = Some(hex::encode(Sha256::digest(canonical.as_bytes())));
    receipt.target_receipt = Some(r#"{"ack":2,"target":"sandbox"}"#.to_owned());
    receipt.finished_at = Some(now);
    let mut command = record.command.clone();
    command.lease_until = Some(now.plus_ms(LEASE_MS));
    command.last_heartbeat_at = Some(now);

    assert_eq!(writes.guard, Guard::Holds(token_a()));
    assert_eq!(writes.receipts, vec![receipt]);
    assert_eq!(writes.command, Some(command));
    assert_eq!(writes.attempt, None);
    let after = applied(&record, &writes);
    assert_eq!(after.receipts[1].idempotency_key, record.receipts[1].idempotency_key);
    assert_eq!(after.receipts[1].started_at, Some(at(begin_ms(2))));
}

#[test]
fn complete_step_again_with_the_same_evidence_only_renews() {
    let plan = resume_plan();
    let record = in_progress(&plan, 2, false);
    let now = at(complete_ms(2) + 50);
    let writes = allowed(complete_step(
        &record,
        2,
        &evidence(2),
        &target_receipt(2),
        &token_a(),
        LEASE_MS,
        now,
    ));
    assert!(writes.receipts.is_empty());
    assert_eq!(writes.command.and_then(|c| c.lease_until), Some(now.plus_ms(LEASE_MS)));
}

#[test]
fn complete_step_again_with_different_evidence_is_refused() {
    let plan = resume_plan();
    let record = in_progress(&plan, 2, false);
    let refusal = refused(complete_step(
        &record,
        2,
        &json!({"other": true}),
        &target_receipt(2),
        &token_a(),
        LEASE_MS,
        at(complete_ms(2) + 50),
    ));
    assert_eq!(
        refusal,
        Refusal::OutOfOrder {
            attempt: attempt_id(1),
            ordinal: 2,
            reason: "it is SUCCEEDED, not RUNNING".to_owned(),
        }
    );
}

#[test]
fn complete_step_of_a_pending_step_is_refused() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, false);
    let refusal = refused(complete_step(
        &record,
        2,
        &evidence(2),
        &target_receipt(2),
        &token_a(),
        LEASE_MS,
        at(complete_ms(2)),
    ));
    assert_eq!(
        refusal,
        Refusal::OutOfOrder {
            attempt: attempt_id(1),
            ordinal: 2,
            reason: "it is PENDING, not RUNNING".to_owned(),
        }
    );
}

#[test]
fn complete_step_with_stale_token_is_refused() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let taken_over = claimed_by(&record, &plan, OWNER_B, token_b(), expired_after(begin_ms(2)));
    let refusal = refused(complete_step(
        &taken_over,
        2,
        &evidence(2),
        &target_receipt(2),
        &token_a(),
        LEASE_MS,
        at(expired_after(begin_ms(2)) + 10),
    ));
    assert_eq!(refusal, Refusal::StaleToken { command: command_id(1) });
}
