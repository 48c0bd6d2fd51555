//! Planted bugs: deliberate mistakes the simulator makes at its seams, to prove that
//! its checker catches each kind of wrong implementation.
//!
//! Contract: the engine and the production crate have no bug switches. A run plants
//! bugs ([`crate::world::RunConfig::bugs`]) and the db host makes each mistake where
//! it stands between the workers and the ledger:
//! - **tokens**: it substitutes the command's current lease token for the one a
//!   request presented, so a stale request is applied as if it held the lease;
//! - **`now`**: it makes the ledger decide at another instant than its own clock;
//! - **limits**: it sets a limited target's limits without one of them just before
//!   a claim, and back just after it;
//! - **failover**: it builds the promoted replica without the last commit, although
//!   the replica is synchronous;
//! - **writes**: through the ledger's [`leasehold::ledger::WritesHook`], it rewrites
//!   the engine's [`leasehold_engine::Writes`] of one transition (or replaces its
//!   refusal, or decides it again under another policy) before they are applied,
//!   exactly as a wrong transition rule would have decided;
//!
//! and the workers make theirs in their own seams: their timers' clock, and the
//! executor's client of the target.
//!
//! Each bug names the invariant that must catch it ([`Bug::caught_by`]); the catch
//! tests in `sim/tests/planted_bugs.rs` run each one over the CI window on both
//! backends.

/// A deliberate mistake, planted at a seam of the simulated world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bug {
    /// `complete-step` applies without a token match (the db host substitutes the
    /// current token for a stale one).
    CompleteSkipsTokenCheck,
    /// `reconcile` requeues a command whose lease is still live (the db host decides
    /// it just after the lease's end).
    ReconcileStealsLiveLease,
    /// A `replay` takeover keeps the old sandbox's SUCCEEDED receipts (its writes
    /// lose their resets, as if the plan were `resume`).
    ReplayKeepsReceipts,
    /// `heartbeat` renews without a token match (the db host replaces the engine's
    /// refusal with the renewal, under a guard that asks only for the row as read).
    HeartbeatIgnoresToken,
    /// The semantic fingerprint keeps volatile identity: the stored evidence carries
    /// the sandbox id under a key (`sandbox_name`) that the fingerprint does not strip.
    FingerprintKeepsVolatile,
    /// Lease decisions use the requesting worker's clock (the db host decides with
    /// the clock reading the worker sent).
    LeaseOnWorkerClock,
    /// A `resume` takeover puts SUCCEEDED receipts back to PENDING (same keys, evidence
    /// dropped) and so redelivers finished work. The target deduplicates by key, so
    /// the effects and the fingerprints stay right: only the history shows it.
    ResumeRedeliversSucceeded,
    /// `abort` marks SUCCEEDED receipts ABORTED along with the open ones, erasing
    /// what was delivered (and what a compensation would undo).
    AbortRewritesSucceeded,
    /// `reconcile` requeues the command but leaves the receipts as they were: the
    /// ambiguous step stays RUNNING while nobody holds the lease.
    ReconcileKeepsRunning,
    /// The worker's heartbeat comes late: its timers are driven by a clock that runs
    /// at a tenth of true speed (the simulator), or a heartbeat wakes it a lease
    /// late (the model checker), so a healthy worker's lease expires and is taken
    /// over.
    LateHeartbeat,
    /// Claims read the clock half a second ahead (the db host decides every claim
    /// 500 ms past its own clock), so a command is claimed before its `available_at`:
    /// before a give-back's backoff or a scheduled start has passed.
    ClaimBeforeAvailable,
    /// The delivery cap is off by one: a claim or give-back that the engine finds
    /// exhausted by deliveries is decided again under a policy that allows one more
    /// delivery (the db host's writes seam, with the token the claim minted).
    DeliveryCapOffByOne,
    /// A give-back reads its delay in seconds: the db host stretches the command's
    /// `available_at` to a thousand times the backoff, so an attempt whose target is
    /// down waits minutes between deliveries instead of exhausting.
    BackoffInSeconds,
    /// The executor's HTTP client retries on its own: every call that got no
    /// success is sent again, detached from the driver, four seconds later, whatever
    /// has become of the attempt by then.
    ExecutorRetriesDetached,
    /// Claims ignore routing: the db host drops the worker's capabilities from its
    /// claims, so a worker without an executor is handed steps it cannot run.
    ClaimIgnoresRoute,
    /// Claims skip the in-flight gate: the db host sets every limited target's
    /// limits without `max_in_flight` just before a claim and restores them after
    /// it, so a claim leases a target's commands however many run there.
    LimitIgnored,
    /// Claims skip the rate: the db host sets every limited target's limits without
    /// `rate` around each claim, so a claim enters a target however many entries
    /// its window already holds.
    RateIgnored,
    /// Claims skip the circuit breaker: the db host sets every limited target's
    /// limits without `breaker` around each claim, so a claim enters a target whose
    /// breaker is open, or whose half-open probe is out.
    BreakerIgnored,
    /// Enqueues lose the caller's trace context: the db host forwards each enqueue
    /// without its `traceparent`, as a ledger that does not store it would, so the
    /// attempt starts a trace of its own.
    EnqueueDropsTrace,
    /// Enqueues lose their key: the db host forwards each enqueue without its enqueue
    /// key, as a ledger that does not keep keys would, so a client that sends a
    /// request again (its reply lost, or a second click) enqueues it again.
    EnqueueIgnoresKey,
    /// The db host drops every enqueue's order key, as a ledger that does not
    /// order keys would, so attempts with one key run side by side.
    OrderKeyIgnored,
    /// A failover loses the last committed transaction although replication is
    /// synchronous: the db host builds the promoted replica without it, so an
    /// acknowledged transition vanishes.
    FailoverLosesCommit,
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
        Bug::ResumeRedeliversSucceeded,
        Bug::AbortRewritesSucceeded,
        Bug::ReconcileKeepsRunning,
        Bug::LateHeartbeat,
        Bug::ClaimBeforeAvailable,
        Bug::DeliveryCapOffByOne,
        Bug::BackoffInSeconds,
        Bug::ExecutorRetriesDetached,
        Bug::ClaimIgnoresRoute,
        Bug::LimitIgnored,
        Bug::RateIgnored,
        Bug::BreakerIgnored,
        Bug::EnqueueDropsTrace,
        Bug::EnqueueIgnoresKey,
        Bug::OrderKeyIgnored,
        Bug::FailoverLosesCommit,
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
            Bug::ResumeRedeliversSucceeded => "resume-redelivers-succeeded",
            Bug::AbortRewritesSucceeded => "abort-rewrites-succeeded",
            Bug::ReconcileKeepsRunning => "reconcile-keeps-running",
            Bug::LateHeartbeat => "late-heartbeat",
            Bug::ClaimBeforeAvailable => "claim-before-available",
            Bug::DeliveryCapOffByOne => "delivery-cap-off-by-one",
            Bug::BackoffInSeconds => "backoff-in-seconds",
            Bug::ExecutorRetriesDetached => "executor-retries-detached",
            Bug::ClaimIgnoresRoute => "claim-ignores-route",
            Bug::LimitIgnored => "limit-ignored",
            Bug::RateIgnored => "rate-ignored",
            Bug::BreakerIgnored => "breaker-ignored",
            Bug::EnqueueDropsTrace => "enqueue-drops-trace",
            Bug::EnqueueIgnoresKey => "enqueue-ignores-key",
            Bug::OrderKeyIgnored => "order-key-ignored",
            Bug::FailoverLosesCommit => "failover-loses-commit",
        }
    }

    /// The bug with this name.
    pub fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.iter().copied().find(|b| b.name() == name)
    }

    /// The invariant that must catch it, and the fault profile that gives it the most
    /// chances.
    pub const fn caught_by(self) -> (u8, &'static str) {
        match self {
            Bug::CompleteSkipsTokenCheck | Bug::HeartbeatIgnoresToken => (1, "stale-tokens"),
            Bug::ReconcileStealsLiveLease => (2, "mixed"),
            Bug::LeaseOnWorkerClock => (2, "clock-skew"),
            Bug::ReplayKeepsReceipts => (9, "crash-storm"),
            Bug::FingerprintKeepsVolatile => (9, "mixed"),
            Bug::ResumeRedeliversSucceeded => (11, "crash-storm"),
            Bug::AbortRewritesSucceeded => (11, "mixed"),
            Bug::ReconcileKeepsRunning => (11, "mixed"),
            Bug::LateHeartbeat => (13, "lost-replies"),
            Bug::ClaimBeforeAvailable => (14, "flaky-targets"),
            Bug::DeliveryCapOffByOne => (15, "flaky-targets"),
            Bug::BackoffInSeconds => (16, "flaky-targets"),
            Bug::ExecutorRetriesDetached => (17, "flaky-targets"),
            Bug::ClaimIgnoresRoute => (19, "mixed"),
            Bug::LimitIgnored => (20, "limited-targets"),
            Bug::RateIgnored => (21, "limited-targets"),
            Bug::BreakerIgnored => (22, "limited-targets"),
            Bug::EnqueueDropsTrace => (23, "mixed"),
            Bug::EnqueueIgnoresKey => (24, "mixed"),
            Bug::OrderKeyIgnored => (25, "ordered-keys"),
            Bug::FailoverLosesCommit => (26, "failover"),
        }
    }
}

impl Bug {
    /// The invariant the model checker ([`crate::model`]) finds it by first, and the
    /// recovery mode of the configuration it is found in
    /// ([`crate::model::Config::finding`]). `None`: the model does not explore what
    /// it breaks (trace context is data an enqueue carries, not a step of the lease
    /// protocol; the simulator's invariant 23 checks it; the model's ledger has no
    /// replica to fail over to).
    pub const fn found_by_model(self) -> Option<(u8, leasehold_engine::Recovery)> {
        use leasehold_engine::Recovery::{Replay, Resume};
        Some(match self {
            Bug::EnqueueDropsTrace | Bug::EnqueueIgnoresKey | Bug::OrderKeyIgnored | Bug::FailoverLosesCommit => {
                return None
            }
            Bug::CompleteSkipsTokenCheck | Bug::HeartbeatIgnoresToken => (1, Resume),
            Bug::ReconcileStealsLiveLease | Bug::LeaseOnWorkerClock => (2, Resume),
            Bug::ReplayKeepsReceipts => (11, Replay),
            Bug::FingerprintKeepsVolatile => (9, Replay),
            Bug::ResumeRedeliversSucceeded | Bug::AbortRewritesSucceeded | Bug::ReconcileKeepsRunning => (11, Resume),
            Bug::LateHeartbeat => (13, Resume),
            Bug::ClaimBeforeAvailable => (14, Resume),
            Bug::DeliveryCapOffByOne => (11, Resume),
            Bug::BackoffInSeconds => (8, Resume),
            Bug::ExecutorRetriesDetached => (17, Resume),
            Bug::ClaimIgnoresRoute => (19, Resume),
            Bug::LimitIgnored => (20, Resume),
            Bug::RateIgnored => (21, Resume),
            Bug::BreakerIgnored => (22, Resume),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for b in Bug::ALL {
            assert_eq!(Bug::from_name(b.name()), Some(*b));
        }
        assert_eq!(Bug::from_name("no-such-bug"), None);
    }
}
