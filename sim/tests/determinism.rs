//! Same seed, same trace: a sample of seeds, run twice, must print the same hashes.

use leasehold_sim::db::BackendKind;
use leasehold_sim::profile::Profile;
use leasehold_sim::runner::{self, Batch};
use leasehold_sim::trace::trace_hash;
use leasehold_sim::world::{self, RunConfig};
use std::collections::BTreeSet;

fn hashes(profile: &str, seeds: std::ops::Range<u64>) -> Vec<(u64, BackendKind, String)> {
    let batch = Batch {
        profile: Profile::builtin(profile).expect("a shipped profile"),
        backends: BackendKind::ALL.to_vec(),
        seeds,
        bugs: Vec::new(),
        threads: runner::default_threads(),
    };
    let summary = runner::run_batch(&batch, |_, _, _| {});
    summary
        .reports
        .into_iter()
        .map(|r| (r.seed, r.backend, r.trace_hash))
        .collect()
}

#[test]
fn a_sample_of_seeds_run_twice_gives_the_same_trace_hashes() {
    for profile in ["mixed", "stale-tokens", "flaky-targets", "limited-targets", "failover"] {
        let first = hashes(profile, 1000..1010);
        let second = hashes(profile, 1000..1010);
        assert_eq!(
            first, second,
            "profile {profile}: a seed's trace changed between two runs"
        );
        let distinct: BTreeSet<&String> = first.iter().map(|(_, _, h)| h).collect();
        assert!(
            distinct.len() > first.len() / 4,
            "profile {profile}: different seeds should give different traces"
        );
    }
}

#[test]
fn the_printed_hash_is_the_hash_of_the_printed_trace() {
    let config = RunConfig {
        seed: 7,
        profile: Profile::builtin("crash-storm").expect("a shipped profile"),
        backend: BackendKind::Sqlite,
        bugs: Vec::new(),
        keep_trace: true,
    };
    let report = world::run(&config);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert!(report.trace.len() > 50);
    assert_eq!(trace_hash(&report.trace), report.trace_hash);
    assert!(
        report.trace.iter().any(|l| l.contains("token#")),
        "the trace names tokens by ordinal"
    );
}
