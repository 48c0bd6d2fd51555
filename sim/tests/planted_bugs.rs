//! The checker can fail: each planted bug, switched on in the engine (or the db
//! host) through the `planted-bugs` feature, is caught within the CI seed window.
//! The test prints, for each bug, the fraction of runs that caught it.

use leasehold_engine::bugs::Bug;
use leasehold_sim::db::BackendKind;
use leasehold_sim::profile::Profile;
use leasehold_sim::runner::{self, Batch};

/// Seeds per bug, each on both backends.
const SEEDS: u64 = 24;

/// Each bug with the profile whose faults give it the most chances, and the
/// invariant that must catch it.
const CASES: &[(Bug, &str, u8)] = &[
    (Bug::CompleteSkipsTokenCheck, "stale-tokens", 1),
    (Bug::ReconcileStealsLiveLease, "mixed", 2),
    (Bug::ReplayKeepsReceipts, "crash-storm", 9),
    (Bug::HeartbeatIgnoresToken, "stale-tokens", 1),
    (Bug::FingerprintKeepsVolatile, "mixed", 9),
    (Bug::LeaseOnWorkerClock, "clock-skew", 2),
];

#[test]
fn every_planted_bug_is_caught_within_the_ci_window() {
    let mut missed = Vec::new();
    for (bug, profile, invariant) in CASES {
        let batch = Batch {
            profile: Profile::builtin(profile).expect("a shipped profile"),
            backends: BackendKind::ALL.to_vec(),
            seeds: 0..SEEDS,
            bugs: vec![*bug],
            threads: runner::default_threads(),
        };
        let summary = runner::run_batch(&batch, |_, _, _| {});
        let caught = summary
            .reports
            .iter()
            .filter(|r| r.violations.iter().any(|v| v.invariant == *invariant))
            .count();
        println!(
            "{:<28} profile {:<13} caught by invariant {invariant} in {caught}/{} runs ({:.0}%)",
            bug.name(),
            profile,
            summary.reports.len(),
            100.0 * caught as f64 / summary.reports.len() as f64
        );
        if caught == 0 {
            missed.push(bug.name());
        }
    }
    assert!(missed.is_empty(), "planted bugs the checker missed: {missed:?}");
}

#[test]
fn switches_are_off_unless_a_run_plants_them() {
    assert!(Bug::ALL.iter().all(|b| !leasehold_engine::bugs::enabled(*b)));
}
