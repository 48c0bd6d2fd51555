//! Prometheus metrics (`prometheus-client`, OpenMetrics text), served at `/metrics`.
//!
//! Gauges are read at scrape time from the ledger's capped counts
//! ([`crate::ledger::Ledger::count_attempts`]): `leasehold_attempts{status}` and
//! `leasehold_commands{status}` (a QUEUED attempt's command is PENDING, RUNNING's
//! PROCESSING, SUCCEEDED's DELIVERED, FAILED's FAILED, ABORTED's ABORTED: every
//! transition moves both together), with `leasehold_attempts_capped{status}` 1 where
//! the count stopped at the cap. From the same read:
//!
//! - `leasehold_attempts_exhausted_total`: attempts that ended FAILED because
//!   their delivery policy ran out (deliveries or deadline), across the ledger (a
//!   counter: an exhausted attempt stays so; every server reports the ledger's
//!   number, capped like the others, with `leasehold_attempts_exhausted_capped`),
//! - `leasehold_oldest_queued_attempt_age_seconds`: how long the queued command
//!   that became claimable first has been waiting for a worker (0 when nothing is
//!   queued, or when every queued command waits for a later instant: a schedule or
//!   a backoff).
//! - `leasehold_oldest_expired_lease_age_seconds`: how long ago the lease that
//!   expired first, of those no worker has taken over or reconciled yet, expired
//!   (0 when every lease is live): a stuck lease, whose worker died and that no
//!   live worker picks up.
//!
//! From the ledger's limited targets ([`crate::ledger::Ledger::limits`]), one
//! sample per target that has limits (a cleared target's samples go):
//!
//! - `leasehold_target_in_flight{target}`: live leases whose next step targets it,
//! - `leasehold_target_breaker_state{target}`: its circuit breaker, 0 closed, 1
//!   open, 2 half-open ([`leasehold_engine::limits::BreakerState::gauge`]).
//!
//! From the ledger's fleet ([`crate::ledger::Ledger::workers`]):
//! `leasehold_workers_live`, the workers of every process whose last report is
//! recent ([`crate::ledger::fleet::WorkerRow::is_live`]): this one's, other
//! `serve`s', `leasehold worker`s', and an embedder's whose executor says what it
//! runs ([`crate::executor::Executor::reach`]; one that does not never reports).
//!
//! Counters and histograms come from this process's in-process workers
//! ([`crate::worker::WorkerEvent`]) and API calls:
//!
//! - `leasehold_claims_total{plan}`, `leasehold_takeovers_total{plan}` (a claim of a
//!   command delivered before),
//! - `leasehold_deliveries_total{plan,outcome}` (`delivered`, `failed`, `refused`,
//!   `abandoned`, `gave_back`: given back after a transient failure, to be delivered
//!   again after its backoff, `exhausted`: its policy ran out and the attempt
//!   FAILED),
//! - `leasehold_stale_writes_refused_total{plan}`: writes the ledger refused because
//!   this worker's lease was no longer the command's (fencing at work),
//! - `leasehold_lease_expirations_total{reason}`: leases this process left to expire
//!   (`abandoned` by a delivery, `shutdown` when the grace period ran out),
//! - `leasehold_heartbeat_failures_total{plan}`,
//! - `leasehold_reconciles_total{outcome}` (`requeued`, `unchanged`, `refused`),
//! - `leasehold_step_duration_seconds{plan}` (begin to commit of a successful step)
//!   and `leasehold_queue_wait_seconds{plan}` (enqueue to first claim) histograms.
//!
//! `plan` is the plan's name; past [`PLAN_LABELS_MAX`] distinct names, further
//! plans count under `plan="other"`, so that cardinality stays bounded.

use crate::ledger::fleet::WorkerRow;
use crate::ledger::limits::TargetRow;
use crate::ledger::listing::AttemptCounts;
use crate::worker::WorkerEvent;
use leasehold_engine::driver::Outcome;
use leasehold_engine::{AttemptId, AttemptStatus, Timestamp};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The most distinct plan names used as label values.
pub const PLAN_LABELS_MAX: usize = 64;

/// The media type of `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlanLabel {
    plan: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    plan: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabel {
    target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

type HistogramFamily = Family<PlanLabel, Histogram, fn() -> Histogram>;

fn seconds_histogram() -> Histogram {
    // 1 ms to about 9 hours.
    Histogram::new(exponential_buckets(0.001, 2.0, 25))
}

/// What a worker delivery is being tracked with between its events.
struct InFlight {
    plan: String,
    command: String,
    delivery: u32,
    step_began: Option<Instant>,
}

/// Every metric, and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    attempts: Family<StatusLabel, Gauge>,
    attempts_capped: Family<StatusLabel, Gauge>,
    commands: Family<StatusLabel, Gauge>,
    /// Raised to the ledger's count at each scrape (under `exhausted_raise`, so
    /// that two scrapes at once add it once).
    exhausted: Counter,
    exhausted_raise: Mutex<()>,
    exhausted_capped: Gauge,
    oldest_queued_age: Gauge<f64, AtomicU64>,
    oldest_expired_lease_age: Gauge<f64, AtomicU64>,
    target_in_flight: Family<TargetLabel, Gauge>,
    target_breaker_state: Family<TargetLabel, Gauge>,
    /// Held while the target gauges are replaced, so that two scrapes at once do
    /// not interleave their clear and their sets.
    targets_replace: Mutex<()>,
    workers_live: Gauge,
    claims: Family<PlanLabel, Counter>,
    takeovers: Family<PlanLabel, Counter>,
    deliveries: Family<DeliveryLabels, Counter>,
    stale_writes: Family<PlanLabel, Counter>,
    expirations: Family<ReasonLabel, Counter>,
    heartbeat_failures: Family<PlanLabel, Counter>,
    reconciles: Family<OutcomeLabel, Counter>,
    step_duration: HistogramFamily,
    queue_wait: HistogramFamily,
    in_flight: Mutex<HashMap<AttemptId, InFlight>>,
    plans_seen: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric at zero.
    pub fn new() -> Self {
        let mut metrics = Self {
            registry: Registry::default(),
            attempts: Family::<StatusLabel, Gauge>::default(),
            attempts_capped: Family::<StatusLabel, Gauge>::default(),
            commands: Family::<StatusLabel, Gauge>::default(),
            exhausted: Counter::default(),
            exhausted_raise: Mutex::default(),
            exhausted_capped: Gauge::default(),
            oldest_queued_age: Gauge::<f64, AtomicU64>::default(),
            oldest_expired_lease_age: Gauge::<f64, AtomicU64>::default(),
            target_in_flight: Family::<TargetLabel, Gauge>::default(),
            target_breaker_state: Family::<TargetLabel, Gauge>::default(),
            targets_replace: Mutex::default(),
            workers_live: Gauge::default(),
            claims: Family::<PlanLabel, Counter>::default(),
            takeovers: Family::<PlanLabel, Counter>::default(),
            deliveries: Family::<DeliveryLabels, Counter>::default(),
            stale_writes: Family::<PlanLabel, Counter>::default(),
            expirations: Family::<ReasonLabel, Counter>::default(),
            heartbeat_failures: Family::<PlanLabel, Counter>::default(),
            reconciles: Family::<OutcomeLabel, Counter>::default(),
            step_duration: Family::new_with_constructor(seconds_histogram),
            queue_wait: Family::new_with_constructor(seconds_histogram),
            in_flight: Mutex::default(),
            plans_seen: Mutex::default(),
        };
        metrics.register_ledger_gauges();
        metrics.register_worker_counters();
        metrics
    }

    /// Registers what is read from the ledger at each scrape.
    fn register_ledger_gauges(&mut self) {
        self.registry.register(
            "leasehold_attempts",
            "Attempts per status (capped count: see leasehold_attempts_capped)",
            self.attempts.clone(),
        );
        self.registry.register(
            "leasehold_attempts_capped",
            "1 where the attempt count stopped at the cap (there are at least that many)",
            self.attempts_capped.clone(),
        );
        self.registry.register(
            "leasehold_commands",
            "Outbox commands per status (capped like leasehold_attempts)",
            self.commands.clone(),
        );
        self.registry.register(
            "leasehold_attempts_exhausted",
            "Attempts that ended FAILED because their delivery policy ran out (deliveries or deadline), \
             across the ledger (capped like leasehold_attempts)",
            self.exhausted.clone(),
        );
        self.registry.register(
            "leasehold_attempts_exhausted_capped",
            "1 where the exhausted count stopped at the cap",
            self.exhausted_capped.clone(),
        );
        self.registry.register(
            "leasehold_oldest_queued_attempt_age_seconds",
            "How long the earliest claimable queued command has been claimable (0: none)",
            self.oldest_queued_age.clone(),
        );
        self.registry.register(
            "leasehold_oldest_expired_lease_age_seconds",
            "How long ago the earliest expired lease that no worker has taken over expired (0: none)",
            self.oldest_expired_lease_age.clone(),
        );
        self.registry.register(
            "leasehold_target_in_flight",
            "Live leases whose next step runs on the target (targets with limits only)",
            self.target_in_flight.clone(),
        );
        self.registry.register(
            "leasehold_target_breaker_state",
            "The target's circuit breaker: 0 closed, 1 open, 2 half-open (targets with limits only)",
            self.target_breaker_state.clone(),
        );
        self.registry.register(
            "leasehold_workers_live",
            format!(
                "Workers of every process that reported to the ledger within the last {} s",
                crate::ledger::fleet::LIVE_FOR_MS / 1000
            ),
            self.workers_live.clone(),
        );
    }

    /// Registers what this process's workers count.
    fn register_worker_counters(&mut self) {
        self.registry.register(
            "leasehold_claims",
            "Commands claimed by this process's workers",
            self.claims.clone(),
        );
        self.registry.register(
            "leasehold_takeovers",
            "Claims of a command that had been delivered before (its earlier lease expired)",
            self.takeovers.clone(),
        );
        self.registry.register(
            "leasehold_deliveries",
            "Deliveries ended, by outcome",
            self.deliveries.clone(),
        );
        self.registry.register(
            "leasehold_stale_writes_refused",
            "Worker writes the ledger refused because the lease was no longer theirs (fencing)",
            self.stale_writes.clone(),
        );
        self.registry.register(
            "leasehold_lease_expirations",
            "Leases this process's workers left to expire",
            self.expirations.clone(),
        );
        self.registry.register(
            "leasehold_heartbeat_failures",
            "Heartbeats that did not reach the ledger",
            self.heartbeat_failures.clone(),
        );
        self.registry.register(
            "leasehold_reconciles",
            "Reconcile requests, by outcome",
            self.reconciles.clone(),
        );
        self.registry.register(
            "leasehold_step_duration_seconds",
            "From a step's begin to its completion's commit",
            self.step_duration.clone(),
        );
        self.registry.register(
            "leasehold_queue_wait_seconds",
            "From an attempt's enqueue to its first claim",
            self.queue_wait.clone(),
        );
    }

    /// The label for plan `name`, bounded to [`PLAN_LABELS_MAX`] names.
    fn plan_label(&self, name: &str) -> PlanLabel {
        let mut seen = self.plans_seen.lock().unwrap_or_else(|e| e.into_inner());
        let plan = if seen.contains(name) {
            name.to_owned()
        } else if seen.len() < PLAN_LABELS_MAX {
            seen.insert(name.to_owned());
            name.to_owned()
        } else {
            "other".to_owned()
        };
        PlanLabel { plan }
    }

    /// Sets the gauges, and raises the exhausted counter, from capped counts read at
    /// `now`.
    pub fn set_counts(&self, counts: &AttemptCounts, now: Timestamp) {
        {
            let _one_at_a_time = self.exhausted_raise.lock().unwrap_or_else(|e| e.into_inner());
            let shown = self.exhausted.get();
            self.exhausted.inc_by(counts.exhausted.saturating_sub(shown));
        }
        self.exhausted_capped.set(i64::from(counts.exhausted_capped));
        let seconds_since = |at: Option<Timestamp>| at.map_or(0, |at| now.millis_since(at)) as f64 / 1000.0;
        self.oldest_queued_age.set(seconds_since(counts.oldest_queued_at));
        self.oldest_expired_lease_age
            .set(seconds_since(counts.oldest_lease_until));
        for c in &counts.states {
            let status = StatusLabel {
                status: c.status.as_str().to_owned(),
            };
            let command = match c.status {
                AttemptStatus::Queued => "PENDING",
                AttemptStatus::Running => "PROCESSING",
                AttemptStatus::Succeeded => "DELIVERED",
                AttemptStatus::Failed => "FAILED",
                AttemptStatus::Aborted => "ABORTED",
            };
            let n = i64::try_from(c.count).unwrap_or(i64::MAX);
            self.attempts.get_or_create(&status).set(n);
            self.attempts_capped.get_or_create(&status).set(i64::from(c.capped));
            self.commands
                .get_or_create(&StatusLabel {
                    status: command.to_owned(),
                })
                .set(n);
        }
    }

    /// Replaces the target gauges with the rows of every limited target, read at
    /// scrape time: a target no longer listed has no sample.
    pub fn set_targets(&self, rows: &[TargetRow]) {
        let _one_at_a_time = self.targets_replace.lock().unwrap_or_else(|e| e.into_inner());
        self.target_in_flight.clear();
        self.target_breaker_state.clear();
        for row in rows {
            let label = TargetLabel {
                target: row.limit.target.clone(),
            };
            self.target_in_flight
                .get_or_create(&label)
                .set(i64::from(row.in_flight));
            self.target_breaker_state
                .get_or_create(&label)
                .set(row.breaker_state.gauge());
        }
    }

    /// Sets the live-worker gauge from the ledger's fleet rows, read at `now` (the
    /// ledger's clock, which their reports were stamped with).
    pub fn set_workers(&self, rows: &[WorkerRow], now: Timestamp) {
        let live = rows.iter().filter(|w| w.is_live(now)).count();
        self.workers_live.set(i64::try_from(live).unwrap_or(i64::MAX));
    }

    /// Counts a reconcile request's outcome (`requeued`, `unchanged`, `refused`).
    pub fn reconciled(&self, outcome: &str) {
        self.reconciles
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// The metrics as OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Records one worker event and logs it ([`log_event`]), with the command and
    /// delivery of its attempt.
    pub fn observe(&self, worker: &str, event: &WorkerEvent) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let attempt = match event {
            WorkerEvent::StepBegun { attempt, .. }
            | WorkerEvent::StepSucceeded { attempt, .. }
            | WorkerEvent::HeartbeatFailed { attempt, .. }
            | WorkerEvent::WriteUnconfirmed { attempt, .. }
            | WorkerEvent::Finished { attempt, .. } => Some(attempt),
            _ => None,
        };
        let context = attempt
            .and_then(|a| in_flight.get(a))
            .map(|f| (f.command.as_str(), f.delivery));
        log_event(worker, event, context);
        match event {
            WorkerEvent::Claimed {
                attempt,
                plan,
                command,
                delivery,
                queued_ms,
                ..
            } => {
                let label = self.plan_label(plan);
                self.claims.get_or_create(&label).inc();
                if *delivery > 1 {
                    self.takeovers.get_or_create(&label).inc();
                }
                if let Some(ms) = queued_ms {
                    self.queue_wait.get_or_create(&label).observe(*ms as f64 / 1000.0);
                }
                in_flight.insert(
                    attempt.clone(),
                    InFlight {
                        plan: label.plan,
                        command: command.as_str().to_owned(),
                        delivery: *delivery,
                        step_began: None,
                    },
                );
            }
            WorkerEvent::StepBegun { attempt, .. } => {
                if let Some(f) = in_flight.get_mut(attempt) {
                    f.step_began = Some(Instant::now());
                }
            }
            WorkerEvent::StepSucceeded { attempt, .. } => {
                if let Some(f) = in_flight.get_mut(attempt) {
                    if let Some(began) = f.step_began.take() {
                        let label = PlanLabel { plan: f.plan.clone() };
                        self.step_duration
                            .get_or_create(&label)
                            .observe(began.elapsed().as_secs_f64());
                    }
                }
            }
            WorkerEvent::HeartbeatFailed { attempt, .. } => {
                let plan = in_flight
                    .get(attempt)
                    .map_or_else(|| "other".to_owned(), |f| f.plan.clone());
                self.heartbeat_failures.get_or_create(&PlanLabel { plan }).inc();
            }
            WorkerEvent::Finished { attempt, outcome } => {
                let plan = in_flight.remove(attempt).map_or_else(|| "other".to_owned(), |f| f.plan);
                let name = outcome_name(outcome);
                self.deliveries
                    .get_or_create(&DeliveryLabels {
                        plan: plan.clone(),
                        outcome: name.to_owned(),
                    })
                    .inc();
                match outcome {
                    Outcome::Refused(_) => {
                        self.stale_writes.get_or_create(&PlanLabel { plan }).inc();
                    }
                    Outcome::Abandoned(_) => {
                        self.expirations
                            .get_or_create(&ReasonLabel {
                                reason: "abandoned".into(),
                            })
                            .inc();
                    }
                    Outcome::Delivered
                    | Outcome::Failed(_)
                    | Outcome::GaveBack { .. }
                    | Outcome::Exhausted { .. }
                    | Outcome::Yielded { .. } => {}
                }
            }
            WorkerEvent::GraceExpired { dropped } => {
                self.expirations
                    .get_or_create(&ReasonLabel {
                        reason: "shutdown".into(),
                    })
                    .inc_by(*dropped as u64);
            }
            _ => {}
        }
    }

    /// An observer for [`crate::worker::Worker::on_event`] that records into these
    /// metrics, as worker `worker`.
    pub fn observer(self: &Arc<Self>, worker: &str) -> impl Fn(&WorkerEvent) + Send + Sync + 'static {
        let (metrics, worker) = (Arc::clone(self), worker.to_owned());
        move |event: &WorkerEvent| metrics.observe(&worker, event)
    }
}

fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Delivered => "delivered",
        Outcome::Failed(_) => "failed",
        Outcome::Refused(_) => "refused",
        Outcome::Abandoned(_) => "abandoned",
        Outcome::GaveBack { .. } => "gave_back",
        Outcome::Exhausted { .. } => "exhausted",
        Outcome::Yielded { .. } => "yielded",
    }
}

/// Logs a worker event as one structured `tracing` event: `event` names it, with
/// `worker`, `attempt`, `command`, `delivery`, `plan`, `step`, `ordinal` and
/// `outcome` where they apply (`context`: the command and delivery of the event's
/// attempt, known from its claim). Texts are terminal-safe and redacted.
pub fn log_event(worker: &str, event: &WorkerEvent, context: Option<(&str, u32)>) {
    let clean = |s: &str| crate::text::clean(&super::logs::redacted(s)).into_owned();
    let (command, delivery) = context.unwrap_or(("", 0));
    match event {
        WorkerEvent::Claimed {
            attempt,
            plan,
            command,
            delivery,
            steps,
            skipped,
            queued_ms,
        } => tracing::info!(
            event = "claimed", worker, attempt = %attempt, command = %command, delivery, plan = %clean(plan), steps, skipped,
            queued_ms = queued_ms.unwrap_or(0), takeover = *delivery > 1,
            "claimed attempt"
        ),
        WorkerEvent::StepBegun {
            attempt, ordinal, step, ..
        } => {
            tracing::info!(event = "step_begun", worker, attempt = %attempt, command, delivery, ordinal, step = %clean(step), "step begun")
        }
        WorkerEvent::StepSucceeded {
            attempt, ordinal, step, ..
        } => {
            tracing::info!(event = "step_succeeded", worker, attempt = %attempt, command, delivery, ordinal, step = %clean(step), "step succeeded")
        }
        WorkerEvent::Finished { attempt, outcome } => {
            let detail = match outcome {
                Outcome::Delivered => String::new(),
                Outcome::Failed(e) | Outcome::Abandoned(e) => clean(e),
                Outcome::GaveBack { until, error } => format!("{}; next delivery at {until}", clean(error)),
                Outcome::Exhausted { why, error } => format!("{}; {}", why.as_str(), clean(error)),
                Outcome::Refused(r) => clean(&r.to_string()),
                Outcome::Yielded { until } => {
                    format!("its next step's target is at its limit; next delivery at {until}")
                }
            };
            tracing::info!(event = "finished", worker, attempt = %attempt, command, delivery, outcome = outcome_name(outcome), detail = %detail, "delivery ended");
        }
        WorkerEvent::HeartbeatFailed { attempt, error } => {
            tracing::warn!(event = "heartbeat_failed", worker, attempt = %attempt, command, delivery, error = %clean(error), "heartbeat failed")
        }
        WorkerEvent::WriteUnconfirmed { attempt, write, error } => {
            tracing::warn!(event = "write_unconfirmed", worker, attempt = %attempt, command, delivery, write, error = %clean(error), "write not confirmed; sending it again")
        }
        WorkerEvent::LedgerUnavailable { error, retry_in_ms } => {
            tracing::warn!(event = "ledger_unavailable", worker, error = %clean(error), retry_in_ms, "ledger unavailable")
        }
        WorkerEvent::Stopping { in_flight, grace_ms } => {
            tracing::info!(event = "stopping", worker, in_flight, grace_ms, "worker stopping")
        }
        WorkerEvent::GraceExpired { dropped } => {
            tracing::warn!(
                event = "grace_expired",
                worker,
                dropped,
                "grace period over; leases left to expire"
            )
        }
        WorkerEvent::RunsNothing { reason } => {
            tracing::warn!(event = "runs_nothing", worker, reason = %clean(reason), "worker can run nothing; it claims nothing")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, name: &str) -> &'a str {
        text.lines()
            .find(|l| l.split(' ').next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    }

    fn counts(exhausted: u64, oldest: Option<Timestamp>) -> AttemptCounts {
        AttemptCounts::capped(10, |_| 0).with_delivery(exhausted, oldest)
    }

    #[test]
    fn the_oldest_queued_age_is_from_now_and_never_negative() {
        let metrics = Metrics::new();
        let now = Timestamp::from_millis(1_000_000);
        let age = "leasehold_oldest_queued_attempt_age_seconds";
        metrics.set_counts(&counts(0, Some(Timestamp::from_millis(1_000_000 - 2_500))), now);
        assert_eq!(line(&metrics.encode(), age), format!("{age} 2.5"));
        metrics.set_counts(&counts(0, Some(now.plus_ms(60_000))), now);
        assert_eq!(line(&metrics.encode(), age), format!("{age} 0.0"));
        metrics.set_counts(&counts(0, Some(Timestamp::from_millis(1))), now);
        metrics.set_counts(&counts(0, None), now);
        assert_eq!(line(&metrics.encode(), age), format!("{age} 0.0"));
    }

    #[test]
    fn the_oldest_expired_lease_age_counts_only_expired_leases() {
        let metrics = Metrics::new();
        let now = Timestamp::from_millis(1_000_000);
        let age = "leasehold_oldest_expired_lease_age_seconds";
        let leased = |until: Option<Timestamp>| counts(0, None).with_oldest_lease(until);
        metrics.set_counts(&leased(Some(Timestamp::from_millis(1_000_000 - 90_000))), now);
        assert_eq!(line(&metrics.encode(), age), format!("{age} 90.0"));
        metrics.set_counts(&leased(Some(now.plus_ms(30_000))), now);
        assert_eq!(
            line(&metrics.encode(), age),
            format!("{age} 0.0"),
            "a live lease is not stuck"
        );
        metrics.set_counts(&leased(None), now);
        assert_eq!(line(&metrics.encode(), age), format!("{age} 0.0"));
    }

    #[test]
    fn the_exhausted_counter_follows_the_ledger_and_never_falls() {
        let metrics = Metrics::new();
        let now = Timestamp::from_millis(0);
        let total = "leasehold_attempts_exhausted_total";
        let capped = "leasehold_attempts_exhausted_capped";
        metrics.set_counts(&counts(3, None), now);
        metrics.set_counts(&counts(3, None), now);
        assert_eq!(line(&metrics.encode(), total), format!("{total} 3"));
        assert_eq!(line(&metrics.encode(), capped), format!("{capped} 0"));
        // A scrape that read an older count does not lower it.
        metrics.set_counts(&counts(2, None), now);
        assert_eq!(line(&metrics.encode(), total), format!("{total} 3"));
        // Past the cap (10): the cap, flagged.
        metrics.set_counts(&counts(25, None), now);
        assert_eq!(line(&metrics.encode(), total), format!("{total} 10"));
        assert_eq!(line(&metrics.encode(), capped), format!("{capped} 1"));
        assert!(metrics.encode().contains("# TYPE leasehold_attempts_exhausted counter"));
    }

    #[test]
    fn target_gauges_follow_the_limited_targets_of_each_scrape() {
        use leasehold_engine::limits::{Breaker, Load, TargetLimit};
        let now = Timestamp::from_millis(1_000_000);
        let limit = |target: &str| TargetLimit {
            target: target.to_owned(),
            max_in_flight: Some(4),
            rate: None,
            breaker: Some(Breaker {
                failures: 2,
                cooldown_ms: 1_000,
            }),
        };
        let open = Load {
            in_flight: 3,
            failures: 2,
            open_until: Some(now.plus_ms(500)),
            ..Load::default()
        };
        let metrics = Metrics::new();
        metrics.set_targets(&[
            TargetRow::of(limit("crm"), &open, now),
            TargetRow::of(limit("mail"), &Load::default(), now),
        ]);
        let text = metrics.encode();
        assert_eq!(
            line(&text, "leasehold_target_in_flight{target=\"crm\"}"),
            "leasehold_target_in_flight{target=\"crm\"} 3"
        );
        assert_eq!(
            line(&text, "leasehold_target_breaker_state{target=\"crm\"}"),
            "leasehold_target_breaker_state{target=\"crm\"} 1"
        );
        assert_eq!(
            line(&text, "leasehold_target_breaker_state{target=\"mail\"}"),
            "leasehold_target_breaker_state{target=\"mail\"} 0"
        );
        // The breaker half-open at the end of its cool-down; "mail" cleared.
        metrics.set_targets(&[TargetRow::of(limit("crm"), &open, now.plus_ms(500))]);
        let text = metrics.encode();
        assert_eq!(
            line(&text, "leasehold_target_breaker_state{target=\"crm\"}"),
            "leasehold_target_breaker_state{target=\"crm\"} 2"
        );
        assert!(!text.contains("target=\"mail\""), "{text}");
    }

    #[test]
    fn the_live_worker_gauge_counts_the_rows_reported_recently_on_the_ledger_clock() {
        use crate::ledger::fleet::LIVE_FOR_MS;
        use leasehold_engine::Capabilities;
        let now = Timestamp::from_millis(10_000_000);
        let row = |id: &str, last_seen_at: Timestamp| WorkerRow {
            id: id.to_owned(),
            capabilities: Capabilities::default(),
            started_at: Timestamp::from_millis(0),
            last_seen_at,
        };
        let rows = [
            row("fresh", now),
            row("at-the-edge", Timestamp::from_millis(10_000_000 - LIVE_FOR_MS as i64)),
            row("gone", Timestamp::from_millis(10_000_000 - LIVE_FOR_MS as i64 - 1)),
        ];
        let metrics = Metrics::new();
        let gauge = "leasehold_workers_live";
        assert_eq!(line(&metrics.encode(), gauge), format!("{gauge} 0"));
        metrics.set_workers(&rows, now);
        assert_eq!(line(&metrics.encode(), gauge), format!("{gauge} 2"));
        // The same rows a minute later: nobody reported since.
        metrics.set_workers(&rows, now.plus_ms(60_000));
        assert_eq!(line(&metrics.encode(), gauge), format!("{gauge} 0"));
    }

    #[test]
    fn scrapes_at_once_raise_the_exhausted_counter_once() {
        let metrics = Arc::new(Metrics::new());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let metrics = Arc::clone(&metrics);
                std::thread::spawn(move || {
                    for n in 0..=5 {
                        metrics.set_counts(&counts(n, None), Timestamp::from_millis(0));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a scraping thread");
        }
        let text = metrics.encode();
        assert_eq!(
            line(&text, "leasehold_attempts_exhausted_total"),
            "leasehold_attempts_exhausted_total 5"
        );
    }
}
