//! The model checker explores every interleaving of the small configurations, the
//! delivery policy's, the mixed fleet's and the limited target's with the engine's
//! own code: with no bug planted every invariant holds in every reachable state,
//! and each planted bug is found, in every run, by its invariant with a shortest
//! counterexample.

use leasehold_sim::bugs::Bug;
use leasehold_sim::model::{self, Config};

/// Every invariant holds in every state of the configurations `name`, each of
/// more than `at_least` states.
fn holds_every_invariant(name: &str, at_least: usize) {
    for config in Config::named(name).expect("a shipped configuration") {
        let report = model::check(&config);
        print!("{report}");
        assert!(!report.truncated, "{} was explored to the end", config.name);
        assert!(
            report.counterexample.is_none(),
            "{} breaks an invariant:\n{report}",
            config.name
        );
        assert!(
            report.states > at_least,
            "{} explored {} states",
            config.name,
            report.states
        );
    }
}

#[test]
fn the_small_configurations_hold_every_invariant() {
    holds_every_invariant("small", 10_000);
}

#[test]
fn the_delivery_policy_configurations_hold_every_invariant() {
    holds_every_invariant("policy", 10_000);
}

#[test]
fn the_mixed_fleet_configurations_hold_every_invariant() {
    holds_every_invariant("routed", 5_000);
}

#[test]
fn the_limited_target_configurations_hold_every_invariant() {
    holds_every_invariant("limited", 5_000);
}

#[test]
fn every_planted_bug_is_found_with_a_shortest_counterexample() {
    let mut missed = Vec::new();
    for bug in Bug::ALL {
        let Some((invariant, recovery)) = bug.found_by_model() else {
            continue;
        };
        let config = Config::finding(*bug, recovery);
        let report = model::check(&config);
        println!("{}: found by invariant {invariant}", bug.name());
        print!("{report}");
        match &report.counterexample {
            Some(c) if c.breaks(invariant) => {
                let again = model::check(&config);
                let steps = again.counterexample.map(|c| c.steps);
                assert_eq!(
                    steps.as_ref(),
                    Some(&c.steps),
                    "{}: the search is deterministic",
                    bug.name()
                );
            }
            _ => missed.push(bug.name()),
        }
    }
    assert!(missed.is_empty(), "planted bugs the model checker missed: {missed:?}");
}
