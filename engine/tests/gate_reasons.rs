//! The matches-baseline check's reason: short fingerprints and at most
//! `REASON_DIFFERENCES_MAX` differing paths, the rest counted.

mod common;

use common::*;
use leasehold_engine::gate::{gate, CheckName, GateReport, REASON_DIFFERENCES_MAX};
use leasehold_engine::{transition, Action, AttemptRecord, Plan, Recovery};
use serde_json::{json, Value};

/// Attempt `n` of `plan`, delivered by worker A, step `o` recording `evidence(o)`.
fn delivered_with(plan: &Plan, history: &[AttemptRecord], n: u32, evidence: impl Fn(u32) -> Value) -> AttemptRecord {
    let start = 100_000 * i64::from(n);
    let mut record = allowed(transition::enqueue(plan, history, Action::Execute, ids(n), at(start)));
    record = claimed_by(&record, plan, OWNER_A, token_a(), start + 10);
    for o in 1..=plan.steps.len() as u32 {
        let began = start + 100 * i64::from(o);
        record = begun(&record, o, &token_a(), began);
        let writes = allowed(transition::complete_step(
            &record,
            o,
            &evidence(o),
            &target_receipt(o),
            &token_a(),
            LEASE_MS,
            at(began + 50),
        ));
        record = applied(&record, &writes);
    }
    applied(
        &record,
        &allowed(transition::finish(&record, &token_a(), at(start + 99_000))),
    )
}

/// The gate over a baseline and a latest attempt whose step 1 recorded `fields`
/// differing fields.
fn gate_with_drift(fields: usize) -> GateReport {
    let plan = plan(Recovery::Resume, &["one"]);
    let base = |_: u32| json!({"a": 0, "b": 0, "c": 0, "d": 0, "e": 0});
    let first = delivered_with(&plan, &[], 1, base);
    let latest = delivered_with(&plan, std::slice::from_ref(&first), 2, |_| {
        let mut v = base(1);
        for key in ["a", "b", "c", "d", "e"].iter().take(fields) {
            v[*key] = json!(1);
        }
        v
    });
    gate(&plan, &[first, latest])
}

fn check_reason(report: &GateReport, name: CheckName) -> &str {
    &report
        .checks
        .iter()
        .find(|c| c.name == name)
        .expect("every check is always there")
        .reason
}

fn reason(report: &GateReport) -> &str {
    check_reason(report, CheckName::MatchesBaseline)
}

fn short(fingerprint: &Option<String>) -> &str {
    &fingerprint.as_deref().expect("both were fingerprinted")[..16]
}

#[test]
fn drift_past_the_listed_maximum_names_the_first_paths_and_counts_the_rest() {
    let report = gate_with_drift(REASON_DIFFERENCES_MAX + 1);
    assert_eq!(report.drift.len(), REASON_DIFFERENCES_MAX + 1);
    let paths: Vec<&str> = report.drift.iter().map(|d| d.path.as_str()).collect();
    let expected = format!(
        "semantic fingerprint {} differs from {} of baseline {}: 4 fields differ: {}, {}, {} and 1 more",
        short(&report.semantic_fingerprint),
        short(&report.baseline_semantic_fingerprint),
        report.baseline.as_ref().unwrap(),
        paths[0],
        paths[1],
        paths[2],
    );
    assert_eq!(reason(&report), expected);
}

#[test]
fn drift_up_to_the_maximum_names_every_path() {
    let report = gate_with_drift(REASON_DIFFERENCES_MAX);
    let text = reason(&report);
    assert!(text.ends_with(&format!("3 fields differ: {}", {
        let paths: Vec<&str> = report.drift.iter().map(|d| d.path.as_str()).collect();
        paths.join(", ")
    })));
    assert!(!text.contains("more"), "{text}");
}

#[test]
fn an_equal_latest_shows_its_fingerprint_cut_to_sixteen_digits() {
    let report = gate_with_drift(0);
    let full = report.semantic_fingerprint.clone().unwrap();
    assert_eq!(full.len(), 64);
    assert_eq!(
        reason(&report),
        format!(
            "semantic fingerprint {} equals that of baseline {}",
            &full[..16],
            report.baseline.as_ref().unwrap()
        )
    );
}

fn evidence_reason(report: &GateReport) -> &str {
    check_reason(report, CheckName::EvidenceIntact)
}

#[test]
fn the_receipts_without_evidence_are_the_unfinished_ones_each_named() {
    let plan = plan(Recovery::Resume, &["a", "b", "c", "d"]);
    let failed = failed_at(&plan, 3);
    let report = gate(&plan, std::slice::from_ref(&failed));
    assert_eq!(
        evidence_reason(&report),
        format!(
            "2 of 4 receipts of attempt {} have no evidence: receipt 3 (c) is FAILED, receipt 4 (d) is ABORTED",
            failed.attempt.id
        )
    );
    // A receipt that is not SUCCEEDED but carries intact evidence is not missing any.
    let mut with_evidence = failed.clone();
    let text = leasehold_engine::canonical::canonical_json(&json!({"partial": true}));
    with_evidence.receipts[2].evidence_sha256 = Some(leasehold_engine::canonical::sha256_hex(text.as_bytes()));
    with_evidence.receipts[2].evidence = Some(text);
    let report = gate(&plan, std::slice::from_ref(&with_evidence));
    assert_eq!(
        evidence_reason(&report),
        format!(
            "1 of 4 receipts of attempt {} have no evidence: receipt 4 (d) is ABORTED",
            failed.attempt.id
        )
    );
}

#[test]
fn a_latest_attempt_with_tampered_evidence_is_not_compared_with_the_baseline() {
    let plan = plan(Recovery::Resume, &["one"]);
    let evidence = |_: u32| json!({"a": 0});
    let first = delivered_with(&plan, &[], 1, evidence);
    let mut latest = delivered_with(&plan, std::slice::from_ref(&first), 2, evidence);
    // The same evidence in the latest attempt, but its text no longer matches its digest.
    latest.receipts[0].evidence = Some(r#"{"a":1}"#.to_owned());
    let report = gate(&plan, &[first, latest.clone()]);
    assert_eq!(report.tampered.len(), 1);
    assert_eq!(
        reason(&report),
        format!(
            "latest {} was not compared with baseline {}: it is not a complete, SUCCEEDED attempt with intact \
             evidence",
            report.latest.as_ref().unwrap(),
            report.baseline.as_ref().unwrap()
        )
    );
    assert!(report.drift.is_empty());
}
