//! What a tampered receipt's report says: both fingerprints, shortened to their first
//! 16 hex digits, and never the evidence itself.

use leasehold_engine::canonical::sha256_hex;
use leasehold_engine::evidence::{verify_receipt, TamperProblem};
use leasehold_engine::{AttemptId, Receipt, ReceiptStatus};

fn receipt(evidence: &str, sha: &str) -> Receipt {
    Receipt {
        payload: None,
        attempt_id: AttemptId::new("att-1"),
        ordinal: 1,
        step_code: "a".into(),
        idempotency_key: "ik-1".into(),
        executor: String::new(),
        target: String::new(),
        status: ReceiptStatus::Succeeded,
        evidence: Some(evidence.into()),
        evidence_sha256: Some(sha.into()),
        target_receipt: None,
        error: None,
        started_at: None,
        finished_at: None,
    }
}

#[test]
fn a_sha_mismatch_names_both_fingerprints_by_their_first_16_hex_digits() {
    let evidence = r#"{"secret":"s3cr3t-value"}"#;
    let computed = sha256_hex(evidence.as_bytes());
    let recorded = sha256_hex(b"something else");
    let err = verify_receipt(&receipt(evidence, &recorded)).expect_err("tampered");
    assert!(matches!(err.problem, TamperProblem::ShaMismatch { .. }));
    let message = err.problem.to_string();
    assert_eq!(
        message,
        format!(
            "evidence hashes to {}… but its recorded SHA-256 is {}…",
            &computed[..16],
            &recorded[..16]
        )
    );
    assert!(!message.contains(&computed[16..]), "the full fingerprint is shortened");
    assert!(!message.contains("s3cr3t"), "the evidence is never shown");
}

#[test]
fn a_recorded_fingerprint_of_16_digits_or_fewer_is_shown_whole() {
    let evidence = r#"{"a":1}"#;
    let err = verify_receipt(&receipt(evidence, "0123456789abcdef")).expect_err("tampered");
    let message = err.problem.to_string();
    assert!(
        message.ends_with("its recorded SHA-256 is 0123456789abcdef"),
        "{message}"
    );
}
