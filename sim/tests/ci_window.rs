//! The CI seed window: every shipped fault profile, both db backends, and not one
//! violation. `LEASEHOLD_SIM_SEEDS=N` widens (or narrows) the window per profile.

use leasehold_sim::db::BackendKind;
use leasehold_sim::profile::Profile;
use leasehold_sim::runner::{self, Batch};

/// Seeds per profile: 10 profiles × 84 seeds = 840 seeds, each on both backends.
const SEEDS_PER_PROFILE: u64 = 84;

fn window() -> u64 {
    std::env::var("LEASEHOLD_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEEDS_PER_PROFILE)
}

#[test]
fn every_profile_passes_the_ci_seed_window_on_both_backends() {
    let started = runner::wall_clock();
    let mut failures = Vec::new();
    let mut runs = 0;
    for profile in Profile::all_builtin() {
        let batch = Batch {
            profile,
            backends: BackendKind::ALL.to_vec(),
            seeds: 0..window(),
            bugs: Vec::new(),
            threads: runner::default_threads(),
        };
        let summary = runner::run_batch(&batch, |_, _, _| {});
        print!("{}", summary.render());
        runs += summary.reports.len();
        failures.extend(
            summary
                .failures()
                .map(|r| format!("seed {} ({}): {}", r.seed, r.backend.name(), summary.reproduce(r))),
        );
    }
    println!("ci window: {runs} runs in {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "violations on a clean build:\n{}",
        failures.join("\n")
    );
}
