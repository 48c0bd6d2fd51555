//! Database failover: with a synchronous replica every invariant holds (the CI
//! window runs the `failover` profile with the others); with an asynchronous one
//! (`failover-async`, expected to fail) a failover loses acknowledged commits and
//! invariant 26 (durability) catches it within the CI window on both backends. The
//! test prints, per backend, how many runs broke each invariant.

use leasehold_sim::db::BackendKind;
use leasehold_sim::profile::Profile;
use leasehold_sim::runner::{self, Batch};
use std::collections::BTreeMap;

/// Seeds, each on both backends.
const SEEDS: u64 = 24;

#[test]
fn an_async_replica_loses_acknowledged_commits_and_invariant_26_catches_it() {
    let batch = Batch {
        profile: Profile::builtin("failover-async").expect("a shipped profile"),
        backends: BackendKind::ALL.to_vec(),
        seeds: 0..SEEDS,
        bugs: Vec::new(),
        threads: runner::default_threads(),
    };
    let summary = runner::run_batch(&batch, |_, _, _| {});
    assert!(summary.stats().commits_lost > 0, "the failovers lost no commit");
    for backend in BackendKind::ALL {
        let runs: Vec<_> = summary.reports.iter().filter(|r| r.backend == *backend).collect();
        let mut broke: BTreeMap<u8, usize> = BTreeMap::new();
        for r in &runs {
            let mut invariants: Vec<u8> = r.violations.iter().map(|v| v.invariant).collect();
            invariants.sort_unstable();
            invariants.dedup();
            for i in invariants {
                *broke.entry(i).or_default() += 1;
            }
        }
        let failed = runs.iter().filter(|r| !r.violations.is_empty()).count();
        println!(
            "failover-async {:<6}: {failed}/{} runs failed; runs per invariant: {broke:?}",
            backend.name(),
            runs.len()
        );
        assert!(
            broke.get(&26).copied().unwrap_or(0) > 0,
            "{}: no run broke invariant 26",
            backend.name()
        );
        assert!(
            !broke.contains_key(&0),
            "{}: a simulation failed: {broke:?}",
            backend.name()
        );
    }
}
