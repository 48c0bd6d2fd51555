//! The checker can fail: each planted bug, made at one of the simulated world's seams
//! (see `leasehold_sim::bugs`), is caught within the CI seed window on both
//! backends. The test prints, for each bug, the fraction of runs that caught it.

use leasehold_sim::bugs::Bug;
use leasehold_sim::db::BackendKind;
use leasehold_sim::profile::Profile;
use leasehold_sim::runner::{self, Batch};
use leasehold_sim::world::{self, RunConfig};

/// Seeds per bug, each on both backends.
const SEEDS: u64 = 24;

#[test]
fn every_planted_bug_is_caught_within_the_ci_window() {
    let mut missed = Vec::new();
    for bug in Bug::ALL {
        let (invariant, profile) = bug.caught_by();
        let batch = Batch {
            profile: Profile::builtin(profile).expect("a shipped profile"),
            backends: BackendKind::ALL.to_vec(),
            seeds: 0..SEEDS,
            bugs: vec![*bug],
            threads: runner::default_threads(),
        };
        let summary = runner::run_batch(&batch, |_, _, _| {});
        for backend in BackendKind::ALL {
            let runs: Vec<_> = summary.reports.iter().filter(|r| r.backend == *backend).collect();
            let caught = runs
                .iter()
                .filter(|r| r.violations.iter().any(|v| v.invariant == invariant))
                .count();
            println!(
                "{:<28} profile {:<13} backend {:<6} caught by invariant {invariant} in {caught}/{} runs ({:.0}%)",
                bug.name(),
                profile,
                backend.name(),
                runs.len(),
                100.0 * caught as f64 / runs.len().max(1) as f64
            );
            if caught == 0 {
                missed.push(format!("{} on {}", bug.name(), backend.name()));
            }
        }
    }
    assert!(missed.is_empty(), "planted bugs the checker missed: {missed:?}");
}

#[test]
fn a_bug_is_planted_only_in_the_run_that_asks_for_it() {
    let config = |bugs: Vec<Bug>| RunConfig {
        seed: 3,
        profile: Profile::builtin("crash-storm").expect("a shipped profile"),
        backend: BackendKind::Memory,
        bugs,
        keep_trace: false,
    };
    let clean = world::run(&config(Vec::new()));
    let planted = world::run(&config(vec![Bug::ResumeRedeliversSucceeded, Bug::ReplayKeepsReceipts]));
    let clean_again = world::run(&config(Vec::new()));
    assert!(clean.violations.is_empty(), "{:?}", clean.violations);
    assert!(!planted.violations.is_empty(), "the planted run was caught");
    assert_ne!(planted.trace_hash, clean.trace_hash);
    assert_eq!(clean_again.trace_hash, clean.trace_hash, "planting left nothing behind");
}
