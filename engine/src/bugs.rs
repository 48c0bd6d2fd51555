//! Planted bugs: switches that only the simulator can turn on, to prove that its
//! checker catches each kind of mistake.
//!
//! Contract: without the `planted-bugs` cargo feature, [`enabled`] is a `const fn`
//! that answers `false` and there is no way to turn a bug on, so the hooks compile
//! away. With the feature (enabled only by `leasehold-sim`'s dependency on the
//! engine), the switches are per thread and start off: a simulation runs every host
//! of one seed on one thread and turns on, with [`set`], only the bugs it plants.
//! Other threads — other seeds, other tests in the same binary — are unaffected.

/// A deliberate mistake that a hook in the engine (or the simulator) can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bug {
    /// `complete_step` skips the token check (and weakens its guard to match).
    CompleteSkipsTokenCheck,
    /// `reconcile` requeues a command whose lease is still live.
    ReconcileStealsLiveLease,
    /// A `replay` takeover keeps the old sandbox's succeeded receipts.
    ReplayKeepsReceipts,
    /// `heartbeat` renews without a token match (and weakens its guard to match).
    HeartbeatIgnoresToken,
    /// The semantic fingerprint keeps the volatile `sandbox_id` field.
    FingerprintKeepsVolatile,
    /// Lease decisions use the requesting worker's clock (planted in the simulator's
    /// database host, which decides with the clock reading the worker sent).
    LeaseOnWorkerClock,
}

impl Bug {
    /// Every planted bug, in declaration order.
    pub const ALL: &'static [Bug] = &[
        Bug::CompleteSkipsTokenCheck,
        Bug::ReconcileStealsLiveLease,
        Bug::ReplayKeepsReceipts,
        Bug::HeartbeatIgnoresToken,
        Bug::FingerprintKeepsVolatile,
        Bug::LeaseOnWorkerClock,
    ];

    /// The bug's kebab-case name, as the simulator's `--bug` option spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Bug::CompleteSkipsTokenCheck => "complete-skips-token-check",
            Bug::ReconcileStealsLiveLease => "reconcile-steals-live-lease",
            Bug::ReplayKeepsReceipts => "replay-keeps-receipts",
            Bug::HeartbeatIgnoresToken => "heartbeat-ignores-token",
            Bug::FingerprintKeepsVolatile => "fingerprint-keeps-volatile",
            Bug::LeaseOnWorkerClock => "lease-on-worker-clock",
        }
    }

    /// The bug with this name.
    pub fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.iter().copied().find(|b| b.name() == name)
    }

    #[cfg(feature = "planted-bugs")]
    const fn bit(self) -> u32 {
        1 << self as u32
    }
}

#[cfg(feature = "planted-bugs")]
thread_local! {
    static ENABLED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether `bug` is planted on this thread. Always `false` without the feature.
#[cfg(not(feature = "planted-bugs"))]
pub const fn enabled(_bug: Bug) -> bool {
    false
}

/// Whether `bug` is planted on this thread.
#[cfg(feature = "planted-bugs")]
pub fn enabled(bug: Bug) -> bool {
    ENABLED.with(|e| e.get() & bug.bit() != 0)
}

/// Plants exactly `bugs` on this thread (an empty slice turns every one off).
#[cfg(feature = "planted-bugs")]
pub fn set(bugs: &[Bug]) {
    ENABLED.with(|e| e.set(bugs.iter().fold(0, |acc, b| acc | b.bit())));
}

#[cfg(all(test, feature = "planted-bugs"))]
mod tests {
    use super::*;

    #[test]
    fn switches_start_off_and_are_per_thread() {
        assert!(Bug::ALL.iter().all(|b| !enabled(*b)));
        set(&[Bug::ReplayKeepsReceipts]);
        assert!(enabled(Bug::ReplayKeepsReceipts) && !enabled(Bug::CompleteSkipsTokenCheck));
        std::thread::spawn(|| assert!(!enabled(Bug::ReplayKeepsReceipts)))
            .join()
            .unwrap();
        set(&[]);
        assert!(!enabled(Bug::ReplayKeepsReceipts));
    }

    #[test]
    fn names_round_trip() {
        for b in Bug::ALL {
            assert_eq!(Bug::from_name(b.name()), Some(*b));
        }
    }
}
