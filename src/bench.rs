//! The end-to-end delivery benchmark behind `leasehold bench` and the criterion
//! `throughput` bench.
//!
//! Contract: [`prepare`] registers one `dry-run:v1` plan of `steps` steps per attempt
//! (distinct names, because the `execute` guard allows one open attempt per plan) and
//! enqueues one attempt of each, before any worker runs. [`drive`] then runs
//! `workers` real [`Worker`]s (fused: claim-and-begin, complete-and-continue) in this
//! process until no attempt is open, and [`verify`] reads every attempt back: each
//! must be SUCCEEDED with its command DELIVERED, `delivery_count` 1 and every receipt
//! SUCCEEDED with evidence — delivered exactly once.
//!
//! Transactions are counted by [`CountingLedger`], which implements [`Ledger`] by
//! delegation and counts calls. For ledgers whose every call is one transaction
//! (memory, SQLite) a call count is a transaction count; a claim made after a worker
//! write ([`Ledger::worker_then_claim`]) is a transaction of its own unless the
//! ledger fuses it into the write's ([`Ledger::fuses_claims`]).
//!
//! The latency is the ledger clock's `finished_at - created_at` of each attempt.
//! Every attempt is enqueued before the workers start, so it measures how long a
//! backlog of `attempts` takes to drain, not the latency of a lone attempt.

#[cfg(feature = "postgres")]
pub mod history;
pub mod raw;
pub mod server;

use crate::clock::{Clock, SystemClock};
use crate::executor::Executors;
use crate::ledger::sqlite::{SqliteLedger, WriterStats};
use crate::ledger::{Claimed, EnqueueRequest, Enqueued, Ledger, LedgerError};
use crate::worker::{RunOptions, Worker, WorkerEvent, WorkerReport};
use leasehold_engine::driver::Outcome;
use leasehold_engine::lease::WorkerConfig;
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, AttemptStatus, ClaimRequest, CommandStatus, Lease, OperatorRequest, Plan, PlanId,
    PlanSpec, ReceiptStatus, Reply, Step, WorkerRequest,
};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// How many problems [`verify`] lists before it only counts them.
const PROBLEMS_LISTED_MAX: usize = 10;

/// Ledger calls counted by a [`CountingLedger`], by kind.
#[derive(Debug, Default)]
pub struct Counts {
    claims: AtomicU64,
    claims_after_writes: AtomicU64,
    claimed: AtomicU64,
    empty_claims: AtomicU64,
    step_writes: AtomicU64,
    heartbeats: AtomicU64,
    other_writes: AtomicU64,
    reads: AtomicU64,
}

/// A copy of [`Counts`] at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CountsSnapshot {
    /// Claim transactions (`claim` and `claim_and_begin` calls), empty ones included.
    pub claims: u64,
    /// Claims made right after a worker write ([`Ledger::worker_then_claim`]): in
    /// that write's transaction on a ledger that fuses them ([`Ledger::fuses_claims`]),
    /// a transaction of their own otherwise.
    pub claims_after_writes: u64,
    /// Commands those claims took.
    pub claimed: u64,
    /// Claims that took nothing (polls of an empty queue).
    pub empty_claims: u64,
    /// Worker writes after the claim: begin, complete, complete-and-continue,
    /// finish, fail and heartbeat.
    pub step_writes: u64,
    /// Of those, heartbeats.
    pub heartbeats: u64,
    /// Every other write: migrate, register, retire, enqueue, reconcile, abort.
    pub other_writes: u64,
    /// Reads (attempt, plan, history, open-attempt counts).
    pub reads: u64,
}

impl CountsSnapshot {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &CountsSnapshot) -> CountsSnapshot {
        CountsSnapshot {
            claims: self.claims - earlier.claims,
            claims_after_writes: self.claims_after_writes - earlier.claims_after_writes,
            claimed: self.claimed - earlier.claimed,
            empty_claims: self.empty_claims - earlier.empty_claims,
            step_writes: self.step_writes - earlier.step_writes,
            heartbeats: self.heartbeats - earlier.heartbeats,
            other_writes: self.other_writes - earlier.other_writes,
            reads: self.reads - earlier.reads,
        }
    }
}

impl Counts {
    /// The counts now.
    pub fn snapshot(&self) -> CountsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CountsSnapshot {
            claims: get(&self.claims),
            claims_after_writes: get(&self.claims_after_writes),
            claimed: get(&self.claimed),
            empty_claims: get(&self.empty_claims),
            step_writes: get(&self.step_writes),
            heartbeats: get(&self.heartbeats),
            other_writes: get(&self.other_writes),
            reads: get(&self.reads),
        }
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn claim<T>(&self, result: &Result<Vec<T>, LedgerError>) {
        Self::bump(&self.claims);
        if let Ok(claimed) = result {
            self.claimed.fetch_add(claimed.len() as u64, Ordering::Relaxed);
            if claimed.is_empty() {
                Self::bump(&self.empty_claims);
            }
        }
    }

    fn step_write(&self, request: &WorkerRequest) {
        Self::bump(&self.step_writes);
        if matches!(request, WorkerRequest::Heartbeat { .. }) {
            Self::bump(&self.heartbeats);
        }
    }

    fn claim_after_write<T>(&self, result: &Result<(Reply, Vec<T>), LedgerError>) {
        Self::bump(&self.claims_after_writes);
        if let Ok((_, claimed)) = result {
            self.claimed.fetch_add(claimed.len() as u64, Ordering::Relaxed);
        }
    }
}

/// A [`Ledger`] that delegates every call to `L` and counts it (see [`Counts`]).
pub struct CountingLedger<L> {
    inner: Arc<L>,
    counts: Arc<Counts>,
}

impl<L> std::fmt::Debug for CountingLedger<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingLedger")
            .field("counts", &self.counts.snapshot())
            .finish_non_exhaustive()
    }
}

impl<L: Ledger> CountingLedger<L> {
    /// Wraps `inner` with every count at zero.
    pub fn new(inner: Arc<L>) -> Self {
        Self {
            inner,
            counts: Arc::default(),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> CountsSnapshot {
        self.counts.snapshot()
    }
}

impl<L: Ledger> Ledger for CountingLedger<L> {
    async fn migrate(&self) -> Result<Vec<u32>, LedgerError> {
        Counts::bump(&self.counts.other_writes);
        self.inner.migrate().await
    }

    async fn register_plan(&self, spec: PlanSpec, known_executors: &[&str]) -> Result<Plan, LedgerError> {
        Counts::bump(&self.counts.other_writes);
        self.inner.register_plan(spec, known_executors).await
    }

    async fn enqueue_with(&self, plan: &PlanId, request: EnqueueRequest) -> Result<Enqueued, LedgerError> {
        Counts::bump(&self.counts.other_writes);
        self.inner.enqueue_with(plan, request).await
    }

    async fn plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        Counts::bump(&self.counts.reads);
        self.inner.plan(id).await
    }

    async fn list_plans(&self) -> Result<Vec<Plan>, LedgerError> {
        Counts::bump(&self.counts.reads);
        self.inner.list_plans().await
    }

    async fn plans_named(&self, name: &str) -> Result<Vec<Plan>, LedgerError> {
        Counts::bump(&self.counts.reads);
        self.inner.plans_named(name).await
    }

    async fn plans_newest_first(&self, before: Option<&PlanId>, limit: u32) -> Result<Vec<Plan>, LedgerError> {
        Counts::bump(&self.counts.reads);
        self.inner.plans_newest_first(before, limit).await
    }

    async fn retire_plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        Counts::bump(&self.counts.other_writes);
        self.inner.retire_plan(id).await
    }

    async fn claim_batch(&self, request: ClaimRequest) -> Result<Vec<Claimed>, LedgerError> {
        let result = self.inner.claim_batch(request).await;
        self.counts.claim(&result);
        result
    }

    fn fuses_claims(&self) -> bool {
        self.inner.fuses_claims()
    }

    async fn worker(&self, lease: &Lease, request: WorkerRequest) -> Result<Reply, LedgerError> {
        self.counts.step_write(&request);
        self.inner.worker(lease, request).await
    }

    async fn worker_then_claim(
        &self,
        lease: &Lease,
        request: WorkerRequest,
        claim: ClaimRequest,
    ) -> Result<(Reply, Vec<Claimed>), LedgerError> {
        self.counts.step_write(&request);
        let result = self.inner.worker_then_claim(lease, request, claim).await;
        self.counts.claim_after_write(&result);
        result
    }

    async fn operator(
        &self,
        attempt: &AttemptId,
        request: OperatorRequest,
    ) -> Result<(Reply, AttemptRecord), LedgerError> {
        Counts::bump(&self.counts.other_writes);
        self.inner.operator(attempt, request).await
    }

    async fn attempt(&self, attempt: &AttemptId) -> Result<AttemptRecord, LedgerError> {
        Counts::bump(&self.counts.reads);
        self.inner.attempt(attempt).await
    }

    async fn history(&self, plan: &PlanId) -> Result<Vec<AttemptRecord>, LedgerError> {
        Counts::bump(&self.counts.reads);
        self.inner.history(plan).await
    }

    async fn open_attempts(&self) -> Result<u64, LedgerError> {
        Counts::bump(&self.counts.reads);
        self.inner.open_attempts().await
    }

    async fn open_attempts_for(&self, capabilities: &leasehold_engine::Capabilities) -> Result<u64, LedgerError> {
        Counts::bump(&self.counts.reads);
        self.inner.open_attempts_for(capabilities).await
    }

    async fn report_worker(
        &self,
        id: &str,
        capabilities: &leasehold_engine::Capabilities,
        starting: bool,
    ) -> Result<(), LedgerError> {
        Counts::bump(&self.counts.other_writes);
        self.inner.report_worker(id, capabilities, starting).await
    }

    async fn workers(
        &self,
    ) -> Result<(Vec<crate::ledger::fleet::WorkerRow>, leasehold_engine::Timestamp), LedgerError> {
        Counts::bump(&self.counts.reads);
        self.inner.workers().await
    }

    async fn prune_keep(&self, plan: &PlanId) -> Result<crate::ledger::prune::Keep, LedgerError> {
        Counts::bump(&self.counts.reads);
        self.inner.prune_keep(plan).await
    }

    async fn prunable(&self, query: &crate::ledger::prune::PruneQuery) -> Result<Vec<AttemptRecord>, LedgerError> {
        Counts::bump(&self.counts.reads);
        self.inner.prunable(query).await
    }

    async fn delete_attempts(&self, ids: &[AttemptId]) -> Result<u64, LedgerError> {
        Counts::bump(&self.counts.other_writes);
        self.inner.delete_attempts(ids).await
    }
}

/// Live progress of a bench, for a progress line.
#[derive(Debug, Default)]
pub struct Progress {
    enqueued: AtomicU64,
    delivered: AtomicU64,
}

impl Progress {
    /// Attempts enqueued so far by [`prepare`].
    pub fn enqueued(&self) -> u64 {
        self.enqueued.load(Ordering::Relaxed)
    }

    /// Attempts delivered so far by [`drive`].
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }
}

/// The attempts a bench delivers, enqueued by [`prepare`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// Steps per attempt.
    pub steps: u32,
    /// Every attempt, in enqueue order per preparing task.
    pub attempts: Vec<AttemptId>,
}

/// The plan spec a bench registers: `steps` `dry-run:v1` steps without delay.
pub fn plan_spec(name: String, steps: u32) -> PlanSpec {
    PlanSpec {
        name,
        queue: None,
        input: None,
        on_failure: None,
        recovery: "resume".to_owned(),
        volatile_fields: Vec::new(),
        steps: (1..=steps.max(1))
            .map(|i| Step {
                code: format!("step-{i}"),
                executor: crate::executor::dry_run::NAME.to_owned(),
                target: None,
                payload: serde_json::json!({}),
                retry: None,
            })
            .collect(),
        retry: None,
    }
}

/// Registers `attempts` plans named `{tag}-{i}` of `steps` dry-run steps and enqueues
/// one `execute` attempt of each, `concurrency` at a time. `tag` must be new to the
/// ledger (registering content a READY plan has answers that plan).
pub async fn prepare<L: Ledger>(
    ledger: Arc<L>,
    tag: &str,
    attempts: u64,
    steps: u32,
    concurrency: u32,
    progress: Arc<Progress>,
) -> Result<Prepared, LedgerError> {
    let concurrency = u64::from(concurrency.max(1));
    let mut tasks = JoinSet::new();
    for lane in 0..concurrency {
        let (ledger, progress, tag) = (Arc::clone(&ledger), Arc::clone(&progress), tag.to_owned());
        tasks.spawn(async move {
            let mut ids = Vec::new();
            let mut i = lane;
            while i < attempts {
                let plan = ledger
                    .register_plan(plan_spec(format!("{tag}-{i}"), steps), &Executors::new().names())
                    .await?;
                ids.push(ledger.enqueue(&plan.id, Action::Execute).await?.attempt.id);
                progress.enqueued.fetch_add(1, Ordering::Relaxed);
                i += concurrency;
            }
            Ok::<_, LedgerError>(ids)
        });
    }
    let mut prepared = Prepared {
        steps: steps.max(1),
        attempts: Vec::new(),
    };
    while let Some(done) = tasks.join_next().await {
        let ids = done.map_err(|e| LedgerError::Internal(format!("bench preparation task failed: {e}")))??;
        prepared.attempts.extend(ids);
    }
    Ok(prepared)
}

/// What one [`drive`] measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// Workers run.
    pub workers: u32,
    /// Claim batch (and deliveries in flight) per worker.
    pub batch: u32,
    /// From the workers' start until the last one found nothing open.
    #[serde(rename = "elapsed_ms", serialize_with = "as_millis")]
    pub elapsed: Duration,
    /// The workers' reports, added up.
    #[serde(skip)]
    pub report: WorkerReport,
    /// Ledger calls during the run.
    pub counts: CountsSnapshot,
    /// Whether the ledger claims after a worker write in that write's transaction
    /// ([`Ledger::fuses_claims`]).
    pub fused_claims: bool,
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1_000.0)
}

/// Runs `workers` workers named `{tag}-worker-{n}` with claim batch `batch` until no
/// attempt is open. `ledger` counts the calls; `progress` counts deliveries.
pub async fn drive<L: Ledger>(
    ledger: Arc<CountingLedger<L>>,
    tag: &str,
    workers: u32,
    batch: u32,
    progress: Arc<Progress>,
) -> Measured {
    let workers = workers.max(1);
    let config = WorkerConfig::clamped(true, 10, batch, 60_000);
    let before = ledger.counts();
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    let executors = Arc::new(Executors::new());
    for n in 1..=workers {
        let progress = Arc::clone(&progress);
        let worker = Worker::new(
            format!("{tag}-worker-{n}"),
            Arc::clone(&ledger),
            Arc::clone(&executors),
            Arc::new(SystemClock),
            config,
        )
        .on_event(move |event| {
            if let WorkerEvent::Finished {
                outcome: Outcome::Delivered,
                ..
            } = event
            {
                progress.delivered.fetch_add(1, Ordering::Relaxed);
            }
        });
        let options = RunOptions {
            until_idle: true,
            grace_ms: 0,
        };
        tasks.spawn(async move { worker.run(std::future::pending(), options).await });
    }
    let mut report = WorkerReport::default();
    while let Some(done) = tasks.join_next().await {
        let r = done.unwrap_or_default();
        report.claimed += r.claimed;
        report.delivered += r.delivered;
        report.failed += r.failed;
        report.refused += r.refused;
        report.abandoned += r.abandoned;
    }
    Measured {
        workers,
        batch: config.batch_size,
        elapsed: started.elapsed(),
        report,
        counts: ledger.counts().since(&before),
        fused_claims: ledger.fuses_claims(),
    }
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verified {
    /// Attempts read back.
    pub attempts: u64,
    /// Attempts delivered exactly once.
    pub exactly_once: u64,
    /// Enqueue-to-delivered latency of each delivered attempt (ledger clock), sorted.
    #[serde(skip)]
    pub latencies_ms: Vec<u64>,
    /// The first problems found, one line each.
    pub problems: Vec<String>,
    /// Problems found in all.
    pub problem_count: u64,
}

impl Verified {
    /// Whether every attempt was delivered exactly once.
    pub fn ok(&self) -> bool {
        self.problem_count == 0 && self.exactly_once == self.attempts
    }
}

/// Why `record` was not delivered exactly once, if it was not.
pub fn exactly_once_problem(record: &AttemptRecord, steps: u32) -> Option<String> {
    let (a, c) = (&record.attempt, &record.command);
    let id = &a.id;
    if a.status != AttemptStatus::Succeeded {
        return Some(format!("attempt {id} is {}, not SUCCEEDED", a.status));
    }
    if c.status != CommandStatus::Delivered {
        return Some(format!("attempt {id}: command is {}, not DELIVERED", c.status));
    }
    if c.delivery_count != 1 {
        return Some(format!("attempt {id}: delivered {} times, not once", c.delivery_count));
    }
    if record.receipts.len() != steps as usize {
        return Some(format!(
            "attempt {id} has {} receipts, not {steps}",
            record.receipts.len()
        ));
    }
    if let Some(r) = record
        .receipts
        .iter()
        .find(|r| r.status != ReceiptStatus::Succeeded || r.evidence.is_none())
    {
        return Some(format!(
            "attempt {id} step {} is {} (evidence: {})",
            r.ordinal,
            r.status,
            r.evidence.is_some()
        ));
    }
    None
}

/// Reads every prepared attempt back, `concurrency` reads at a time, and checks that
/// each was delivered exactly once.
pub async fn verify<L: Ledger>(ledger: Arc<L>, prepared: &Prepared, concurrency: u32) -> Result<Verified, LedgerError> {
    let concurrency = concurrency.max(1) as usize;
    let mut tasks = JoinSet::new();
    for lane in 0..concurrency {
        let ledger = Arc::clone(&ledger);
        let ids: Vec<AttemptId> = prepared
            .attempts
            .iter()
            .skip(lane)
            .step_by(concurrency)
            .cloned()
            .collect();
        let steps = prepared.steps;
        tasks.spawn(async move {
            let mut found = Vec::with_capacity(ids.len());
            for id in ids {
                let record = ledger.attempt(&id).await?;
                let latency = record
                    .attempt
                    .finished_at
                    .map(|f| f.millis_since(record.attempt.created_at));
                found.push((exactly_once_problem(&record, steps), latency));
            }
            Ok::<_, LedgerError>(found)
        });
    }
    let mut verified = Verified {
        attempts: prepared.attempts.len() as u64,
        exactly_once: 0,
        latencies_ms: Vec::new(),
        problems: Vec::new(),
        problem_count: 0,
    };
    while let Some(done) = tasks.join_next().await {
        let found = done.map_err(|e| LedgerError::Internal(format!("bench verification task failed: {e}")))??;
        for (problem, latency) in found {
            match problem {
                None => verified.exactly_once += 1,
                Some(p) => {
                    verified.problem_count += 1;
                    if verified.problems.len() < PROBLEMS_LISTED_MAX {
                        verified.problems.push(p);
                    }
                }
            }
            verified.latencies_ms.extend(latency);
        }
    }
    verified.latencies_ms.sort_unstable();
    Ok(verified)
}

/// The nearest-rank `p`-th percentile (0–100) of sorted values.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The figures of one bench run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    /// Attempts enqueued.
    pub attempts: u64,
    /// Steps per attempt.
    pub steps: u32,
    /// The run.
    #[serde(flatten)]
    pub measured: Measured,
    /// Deliveries per second.
    pub deliveries_per_s: f64,
    /// Commands claimed per second.
    pub claims_per_s: f64,
    /// Steps completed per second.
    pub steps_per_s: f64,
    /// Write transactions that touched each attempt: its claim plus its step writes.
    pub transactions_per_attempt: f64,
    /// Every write transaction of the run (batched claims shared, empty polls
    /// included, a claim fused into a worker write not counted apart) per attempt.
    pub write_transactions_per_attempt: f64,
    /// Median enqueue-to-delivered latency.
    pub latency_p50_ms: Option<u64>,
    /// 99th percentile enqueue-to-delivered latency.
    pub latency_p99_ms: Option<u64>,
    /// The exactly-once check.
    pub verified: Verified,
    /// The raw baseline run beside it, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Baseline>,
    /// The database server's own figures over the deliveries (MySQL, MariaDB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<server::ServerFigures>,
    /// How the SQLite writer thread committed the deliveries (SQLite).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writer: Option<WriterFigures>,
}

/// What a SQLite ledger's writer thread did over a bench's deliveries: the
/// transactions it committed and the calls it ran in them (group commit; see
/// [`crate::ledger::sqlite::SqliteLedger::writer_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WriterFigures {
    /// Transactions the writer committed.
    pub commits: u64,
    /// Calls it ran in them.
    pub calls: u64,
    /// The CPU time the writer thread used over the deliveries, in microseconds
    /// (Linux only): the thread runs every write, so against the run's wall time it
    /// shows whether it is the bottleneck.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_us: Option<u64>,
}

impl WriterFigures {
    /// The figures between two readings of the writer's counters.
    pub fn between(before: WriterStats, after: WriterStats) -> Self {
        Self {
            commits: after.groups.saturating_sub(before.groups),
            calls: after.calls.saturating_sub(before.calls),
            cpu_us: match (before.cpu_ns, after.cpu_ns) {
                (Some(b), Some(a)) => Some(a.saturating_sub(b) / 1_000),
                _ => None,
            },
        }
    }

    /// Calls per committed transaction.
    pub fn calls_per_commit(&self) -> f64 {
        self.calls as f64 / self.commits.max(1) as f64
    }
}

/// A raw baseline run beside a bench: before and after it, so that a drift of the
/// machine during the run shows (see [`raw`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Baseline {
    /// The database kind.
    pub backend: &'static str,
    /// The run before the bench.
    pub before: raw::RawRun,
    /// The run after it.
    pub after: raw::RawRun,
    /// The bench's deliveries per second over the mean of the two runs' jobs per
    /// second.
    pub ratio: f64,
}

impl Baseline {
    /// The baseline of `report` from the raw runs before and after it.
    pub fn new(backend: &'static str, before: raw::RawRun, after: raw::RawRun, report: &BenchReport) -> Self {
        let mean = (before.per_s() + after.per_s()) / 2.0;
        Self {
            backend,
            ratio: report.deliveries_per_s / mean.max(f64::MIN_POSITIVE),
            before,
            after,
        }
    }
}

impl BenchReport {
    /// Computes the figures from a run and its verification.
    pub fn new(prepared: &Prepared, measured: Measured, verified: Verified) -> Self {
        let attempts = prepared.attempts.len() as u64;
        let secs = measured.elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        let per_attempt = |n: u64| if attempts == 0 { 0.0 } else { n as f64 / attempts as f64 };
        let c = measured.counts;
        let unfused = if measured.fused_claims {
            0
        } else {
            c.claims_after_writes
        };
        Self {
            attempts,
            steps: prepared.steps,
            deliveries_per_s: measured.report.delivered as f64 / secs,
            claims_per_s: c.claimed as f64 / secs,
            steps_per_s: (measured.report.delivered * u64::from(prepared.steps)) as f64 / secs,
            transactions_per_attempt: per_attempt(c.claimed + c.step_writes),
            write_transactions_per_attempt: per_attempt(c.claims + unfused + c.step_writes),
            latency_p50_ms: percentile(&verified.latencies_ms, 50.0),
            latency_p99_ms: percentile(&verified.latencies_ms, 99.0),
            measured,
            verified,
            baseline: None,
            server: None,
            writer: None,
        }
    }

    /// Whether the run delivered every attempt exactly once, and the workers agree.
    pub fn exactly_once(&self) -> bool {
        let r = &self.measured.report;
        self.verified.ok()
            && r.delivered == self.attempts
            && r.claimed == self.attempts
            && r.failed + r.refused + r.abandoned == 0
    }
}

/// How to run a whole bench with [`run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Attempts to enqueue and deliver.
    pub attempts: u64,
    /// In-process workers.
    pub workers: u32,
    /// Steps per attempt.
    pub steps: u32,
    /// Claim batch per worker.
    pub batch: u32,
    /// Names the plans (`{tag}-{i}`) and workers; must be new to the ledger.
    pub tag: String,
}

/// Migrates, prepares, drives and verifies: a whole bench on `ledger`, the one
/// definition `leasehold bench` and the criterion `deliveries/*` runs share
/// ([`setup`], then [`measure`]).
pub async fn run<L: Ledger>(
    ledger: Arc<L>,
    options: &BenchOptions,
    progress: Arc<Progress>,
) -> Result<BenchReport, LedgerError> {
    let (counting, prepared) = setup(ledger, options, Arc::clone(&progress)).await?;
    measure(counting, &prepared, options, progress).await
}

/// The untimed part of [`run`]: migrates `ledger`, wraps it in a [`CountingLedger`]
/// and prepares the attempts in it, two preparing tasks per worker.
pub async fn setup<L: Ledger>(
    ledger: Arc<L>,
    options: &BenchOptions,
    progress: Arc<Progress>,
) -> Result<(Arc<CountingLedger<L>>, Prepared), LedgerError> {
    ledger.migrate().await?;
    let counting = Arc::new(CountingLedger::new(ledger));
    let prepared = prepare(
        Arc::clone(&counting),
        &options.tag,
        options.attempts,
        options.steps,
        options.workers.max(1) * 2,
        progress,
    )
    .await?;
    Ok((counting, prepared))
}

/// The timed part of [`run`] on what [`setup`] answered: drives, then verifies. On a
/// server ledger the server's own counters are read just before and just after the
/// deliveries ([`server`]).
pub async fn measure<L: Ledger>(
    counting: Arc<CountingLedger<L>>,
    prepared: &Prepared,
    options: &BenchOptions,
    progress: Arc<Progress>,
) -> Result<BenchReport, LedgerError> {
    let probe = server::probe_for(counting.inner.as_ref() as &dyn std::any::Any);
    let sqlite = (counting.inner.as_ref() as &dyn std::any::Any).downcast_ref::<SqliteLedger>();
    let writer_before = sqlite.map(SqliteLedger::writer_stats);
    let before = match &probe {
        Some(probe) => Some(probe.snapshot().await?),
        None => None,
    };
    let measured = drive(
        Arc::clone(&counting),
        &options.tag,
        options.workers,
        options.batch,
        progress,
    )
    .await;
    let writer = match (sqlite, writer_before) {
        (Some(ledger), Some(before)) => Some(WriterFigures::between(before, ledger.writer_stats())),
        _ => None,
    };
    let figures = match (&probe, before) {
        (Some(probe), Some(before)) => Some(server::ServerFigures::between(&before, &probe.snapshot().await?)),
        _ => None,
    };
    let verified = verify(counting, prepared, options.workers.max(1) * 2).await?;
    let mut report = BenchReport::new(prepared, measured, verified);
    report.server = figures;
    report.writer = writer;
    Ok(report)
}

/// A tag no earlier bench on the same ledger used: `bench-` and the wall clock.
pub fn fresh_tag() -> String {
    format!("bench-{}", SystemClock.now().as_millis())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::entropy::SeededEntropy;
    use crate::ledger::memory::MemoryLedger;
    use leasehold_engine::Timestamp;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&[7], 99.0), Some(7));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_six_step_bench_on_the_memory_ledger_takes_seven_transactions_per_attempt() {
        let ledger = Arc::new(MemoryLedger::new(
            Arc::new(SystemClock),
            Arc::new(SeededEntropy::new(6)),
        ));
        let options = BenchOptions {
            attempts: 40,
            workers: 3,
            steps: 6,
            batch: 1,
            tag: "t".into(),
        };
        let report = run(ledger, &options, Arc::default()).await.unwrap();
        assert!(report.exactly_once(), "{report:?}");
        assert_eq!(report.verified.exactly_once, 40);
        assert_eq!(report.measured.counts.claimed, 40);
        assert_eq!(report.measured.counts.step_writes, 40 * 6);
        assert_eq!(report.transactions_per_attempt, 7.0);
        assert!(report.latency_p99_ms >= report.latency_p50_ms);
    }

    /// A steady worker polls twice (its first claim, and the one that finds the queue
    /// empty): every other attempt is claimed by the write that ends the one before.
    #[tokio::test]
    async fn a_steady_worker_claims_each_next_attempt_in_the_write_that_ends_the_last() {
        let ledger = Arc::new(MemoryLedger::new(
            Arc::new(SystemClock),
            Arc::new(SeededEntropy::new(7)),
        ));
        let options = BenchOptions {
            attempts: 5,
            workers: 1,
            steps: 2,
            batch: 1,
            tag: "steady".into(),
        };
        let report = run(ledger, &options, Arc::default()).await.unwrap();
        assert!(report.exactly_once(), "{report:?}");
        let c = report.measured.counts;
        assert_eq!((c.claims, c.empty_claims), (2, 1), "{c:?}");
        assert_eq!(c.claims_after_writes, 5, "{c:?}");
        assert_eq!(c.claimed, 5);
        assert_eq!(report.transactions_per_attempt, 3.0);
        // The memory ledger runs such a claim as a transaction of its own.
        assert!(!report.measured.fused_claims);
        assert_eq!(report.write_transactions_per_attempt, (2.0 + 5.0 + 10.0) / 5.0);
    }

    #[test]
    fn only_a_single_successful_delivery_passes_the_check() {
        use leasehold_engine::transition::{self, NewIds};
        use leasehold_engine::{CommandId, LeaseToken};
        let now = Timestamp::from_millis(1_000);
        let plan = plan_spec("p".into(), 1)
            .into_plan(&Executors::new().names(), PlanId::new("p"), now)
            .unwrap();
        let ids = NewIds {
            attempt: AttemptId::new("a"),
            command: CommandId::new("c"),
            trace: None,
        };
        let mut record = transition::enqueue(&plan, &[], Action::Execute, ids, now).unwrap();
        assert!(exactly_once_problem(&record, 1).unwrap().contains("is QUEUED"));
        let token = LeaseToken::new("t");
        transition::claim_and_begin(&record, plan.recovery, "w", token.clone(), 60_000, now)
            .unwrap()
            .apply_to(&mut record);
        let evidence = serde_json::json!({"ok": true});
        let (_, writes) =
            transition::complete_and_continue(&record, 1, &evidence, &evidence, &token, 60_000, now).unwrap();
        writes.apply_to(&mut record);
        assert_eq!(exactly_once_problem(&record, 1), None);
        record.command.delivery_count = 2;
        assert_eq!(
            exactly_once_problem(&record, 1).unwrap(),
            "attempt a: delivered 2 times, not once"
        );
    }
}
