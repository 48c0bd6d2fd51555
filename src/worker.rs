//! The tokio worker runtime: a thin loop around the engine's [`Driver`].
//!
//! A [`Worker`] polls its ledger for up to `batch_size` commands at a time, drives
//! one [`Driver`] per claimed command in its own task, sends heartbeats on the
//! driver's deadlines, and calls the executor between two ledger requests, never
//! inside a transaction.
//!
//! A steady worker rarely polls: the write that ends an attempt (its last step's
//! completion, a finish or a fail) also claims the worker's next command
//! ([`Ledger::worker_then_claim`], in the same transaction on a ledger that fuses
//! them), and the delivery hands what it claimed back to be delivered in the slot it
//! frees. Polling fills the slots nothing was claimed for.
//!
//! Each delivery only performs its driver's actions as they are and reports how they
//! ended: the ledger's own [`Reply`] or attempt record, or its error as a [`Failure`]
//! by a fixed mapping (a refusal, not found, unavailable, and every other error
//! ambiguous), and nothing here judges it. Lost
//! replies, refusals, the ledger's continuation and the lease estimate are the
//! driver's delivery rules ([`leasehold_engine::driver`]), tested there on a virtual
//! clock. When the ledger is unreachable it backs off (doubling up to
//! the poll interval). When told to stop it claims nothing more and lets in-flight
//! deliveries finish within a grace period; deliveries still running then are
//! dropped, and their leases expire for another worker to take over.
//!
//! Every executor call has a time budget, the worker's step timeout
//! ([`DEFAULT_STEP_TIMEOUT`] unless [`Worker::with_step_timeout`] says otherwise):
//! a call still running when it runs out is dropped (an executor that runs SQL on a
//! blocking thread stops it then) and the step fails permanently, with a message
//! naming the step and the limit. The budget is on the tokio clock.
//!
//! Every step's evidence, whatever its executor, is held to the worker's evidence
//! cap ([`WorkerConfig::max_evidence_bytes`], 256 KiB unless configured): a step
//! whose evidence and target receipt take more fails permanently, naming the size
//! and the limit, and nothing of it is written (the driver's rule).
//!
//! The worker is generic over its ledger, executor and clock, so the simulator runs
//! this same code with an RPC ledger client, a simulated target and skewed clocks.
//! Its clock only schedules heartbeats and polls; leases are decided by the ledger.

use crate::clock::Clock;
use crate::executor::{ExecRequest, Executor, ExecutorResult};
use crate::ledger::fleet::REPORT_EVERY_MS;
use crate::ledger::{Claimed, Ledger, LedgerError};
use crate::trace::{self, ClaimWindow, DeliveryTrace};
use leasehold_engine::driver::{Driver, DriverAction, Outcome};
use leasehold_engine::lease::WorkerConfig;
use leasehold_engine::route::DEFAULT_QUEUE;
use leasehold_engine::transition::Continued;
use leasehold_engine::{
    AttemptId, AttemptRecord, Capabilities, ClaimRequest, Failure, LeaseToken, Reply, Timestamp, WorkerOp,
    WorkerRequest,
};
use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tracing::Instrument;

/// Something a worker did, for logs and progress displays. Never carries a token.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum WorkerEvent {
    /// A command was claimed.
    Claimed {
        /// The attempt.
        attempt: AttemptId,
        /// The plan's name.
        plan: String,
        /// The attempt's outbox command.
        command: leasehold_engine::CommandId,
        /// The command's delivery count (2 or more after a takeover).
        delivery: u32,
        /// Steps in the attempt.
        steps: u32,
        /// Steps already SUCCEEDED (skipped by a resume takeover).
        skipped: u32,
        /// On a first delivery, how long the attempt waited from its enqueue to this
        /// claim (ledger's `created_at` to the worker clock's claim); `None` after a
        /// takeover.
        queued_ms: Option<u64>,
    },
    /// A step was begun in the ledger.
    StepBegun {
        /// The attempt.
        attempt: AttemptId,
        /// Its ordinal.
        ordinal: u32,
        /// Steps in the attempt.
        steps: u32,
        /// The step code.
        step: String,
    },
    /// A step's completion was committed.
    StepSucceeded {
        /// The attempt.
        attempt: AttemptId,
        /// Its ordinal.
        ordinal: u32,
        /// Steps in the attempt.
        steps: u32,
        /// The step code.
        step: String,
    },
    /// The delivery ended.
    Finished {
        /// The attempt.
        attempt: AttemptId,
        /// How.
        outcome: Outcome,
    },
    /// A heartbeat did not reach the ledger (transport error); the driver retries it
    /// while the lease lasts.
    HeartbeatFailed {
        /// The attempt.
        attempt: AttemptId,
        /// What failed.
        error: String,
    },
    /// A write other than a heartbeat got no answer saying whether it committed:
    /// the ledger was unreachable, or its connection was lost during `COMMIT` (a
    /// database failing over). The driver sends it again, and reads the attempt back
    /// when a repeat of a write that ends it is refused.
    WriteUnconfirmed {
        /// The attempt.
        attempt: AttemptId,
        /// The write's operation (`begin-step`, `complete-and-continue`, `finish`, …).
        write: &'static str,
        /// What the ledger answered.
        error: String,
    },
    /// A ledger request failed in transport; it will be retried.
    LedgerUnavailable {
        /// What failed.
        error: String,
        /// When the worker tries again.
        retry_in_ms: u64,
    },
    /// The worker was told to stop.
    Stopping {
        /// Deliveries still in flight.
        in_flight: usize,
        /// How long they get to finish.
        grace_ms: u64,
    },
    /// The grace period ran out with deliveries in flight; their leases will expire.
    GraceExpired {
        /// Deliveries dropped.
        dropped: usize,
    },
    /// The worker can run nothing (no executor reaches a target, or no queue): it
    /// claims nothing.
    RunsNothing {
        /// Why.
        reason: String,
    },
}

impl fmt::Display for WorkerEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerEvent::Claimed {
                attempt,
                plan,
                delivery,
                steps,
                skipped,
                ..
            } => {
                write!(
                    f,
                    "claimed attempt {attempt} of plan {plan} (delivery {delivery}, {steps} steps"
                )?;
                if *skipped > 0 {
                    write!(f, ", {skipped} already succeeded")?;
                }
                f.write_str(")")
            }
            WorkerEvent::StepBegun {
                attempt,
                ordinal,
                steps,
                step,
            } => {
                write!(f, "attempt {attempt} step {ordinal}/{steps} {step}: running")
            }
            WorkerEvent::StepSucceeded {
                attempt,
                ordinal,
                steps,
                step,
            } => {
                write!(f, "attempt {attempt} step {ordinal}/{steps} {step}: succeeded")
            }
            WorkerEvent::Finished { attempt, outcome } => match outcome {
                Outcome::Delivered => write!(f, "attempt {attempt}: delivered"),
                Outcome::Failed(e) => write!(f, "attempt {attempt}: failed: {e}"),
                Outcome::Refused(r) => write!(f, "attempt {attempt}: write refused ({r}); stopped work on it"),
                Outcome::Abandoned(r) => write!(f, "attempt {attempt}: abandoned: {r}"),
                Outcome::GaveBack { until, error } => {
                    write!(f, "attempt {attempt}: gave back ({error}); next delivery at {until}")
                }
                Outcome::Exhausted { why, error } => write!(f, "attempt {attempt}: failed, {} ({error})", why.as_str()),
                Outcome::Yielded { until } => write!(
                    f,
                    "attempt {attempt}: handed back, its next step's target is at its limit; next delivery at {until}"
                ),
            },
            WorkerEvent::HeartbeatFailed { attempt, error } => {
                write!(
                    f,
                    "attempt {attempt}: heartbeat failed ({error}); retrying while the lease lasts"
                )
            }
            WorkerEvent::WriteUnconfirmed { attempt, write, error } => {
                write!(
                    f,
                    "attempt {attempt}: {write} not confirmed ({error}); sending it again"
                )
            }
            WorkerEvent::LedgerUnavailable { error, retry_in_ms } => {
                write!(f, "ledger unavailable ({error}); retrying in {retry_in_ms} ms")
            }
            WorkerEvent::Stopping { in_flight, grace_ms } => {
                write!(
                    f,
                    "stopping: no new claims; {in_flight} deliveries in flight get {grace_ms} ms to finish"
                )
            }
            WorkerEvent::RunsNothing { reason } => {
                write!(f, "this worker can run nothing: {reason}; it claims nothing")
            }
            WorkerEvent::GraceExpired { dropped } => {
                write!(
                    f,
                    "grace period over: dropped {dropped} deliveries; their leases will expire"
                )
            }
        }
    }
}

/// How a worker run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunOptions {
    /// Exit once no attempt the worker could run is QUEUED or RUNNING.
    pub until_idle: bool,
    /// After a stop request, how long in-flight deliveries may take.
    pub grace_ms: u64,
}

/// What a worker did over a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerReport {
    /// Commands claimed.
    pub claimed: u64,
    /// Deliveries that ended DELIVERED.
    pub delivered: u64,
    /// Deliveries that ended FAILED.
    pub failed: u64,
    /// Deliveries stopped by a refused write.
    pub refused: u64,
    /// Deliveries abandoned (or dropped at the end of the grace period).
    pub abandoned: u64,
    /// Deliveries that gave their command back after a transient failure, to be
    /// delivered again after its backoff.
    pub gave_back: u64,
}

/// The time budget of one executor call unless the worker is given another.
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(300);

/// Who hears a worker's events; `None` when nobody listens, so that no event is
/// built for nobody.
type Observer = Option<Arc<dyn Fn(&WorkerEvent) + Send + Sync>>;

/// A worker: claims commands and delivers them.
pub struct Worker<L, E, C> {
    id: String,
    ledger: Arc<L>,
    executor: Arc<E>,
    clock: Arc<C>,
    config: WorkerConfig,
    observer: Observer,
    step_timeout: Duration,
    /// What it can run; `None`: an executor that does not say ([`Executor::reach`]),
    /// so anything.
    capabilities: Option<Capabilities>,
}

impl<L, E, C> fmt::Debug for Worker<L, E, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.id)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<L: Ledger, E: Executor, C: Clock> Worker<L, E, C> {
    /// A worker named `id` (the lease owner it records).
    pub fn new(id: impl Into<String>, ledger: Arc<L>, executor: Arc<E>, clock: Arc<C>, config: WorkerConfig) -> Self {
        let capabilities = executor.reach().map(|executors| Capabilities {
            executors,
            queues: BTreeSet::from([DEFAULT_QUEUE.to_owned()]),
        });
        Self {
            id: id.into(),
            ledger,
            executor,
            clock,
            capabilities,
            config,
            observer: None,
            step_timeout: DEFAULT_STEP_TIMEOUT,
        }
    }

    /// Takes work of these queues only (instead of the default queue,
    /// [`DEFAULT_QUEUE`]). No effect with an executor that does not say what it
    /// runs ([`Executor::reach`]).
    pub fn with_queues(mut self, queues: impl IntoIterator<Item = String>) -> Self {
        if let Some(capabilities) = &mut self.capabilities {
            capabilities.queues = queues.into_iter().collect();
        }
        self
    }

    /// What it can run, as its claims and its fleet row say; `None`: anything.
    pub fn capabilities(&self) -> Option<&Capabilities> {
        self.capabilities.as_ref()
    }

    /// Gives every executor call at most `timeout` (at least 1 ms); a call still
    /// running then is dropped and its step fails.
    pub fn with_step_timeout(mut self, timeout: Duration) -> Self {
        self.step_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Calls `observer` for every [`WorkerEvent`].
    pub fn on_event(mut self, observer: impl Fn(&WorkerEvent) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Runs until `stop` resolves (then drains within the grace period) or, with
    /// `until_idle`, until no attempt that it could run is QUEUED or RUNNING
    /// ([`Ledger::open_attempts_for`]). A worker that can run
    /// nothing ([`Capabilities::is_empty`]) says so ([`WorkerEvent::RunsNothing`])
    /// and claims nothing.
    pub async fn run(&self, stop: impl Future<Output = ()>, options: RunOptions) -> WorkerReport {
        let mut report = WorkerReport::default();
        if let Some(reason) = self.capabilities.as_ref().and_then(runs_nothing) {
            self.emit(|| WorkerEvent::RunsNothing { reason });
            if !options.until_idle {
                stop.await;
            }
            return report;
        }
        self.report_in(true).await;
        let mut next_report = tokio::time::Instant::now() + Duration::from_millis(REPORT_EVERY_MS);
        let mut tasks: JoinSet<Ended> = JoinSet::new();
        // Set once the worker is told to stop: deliveries claim nothing more.
        let stopping = Arc::new(AtomicBool::new(false));
        let mut stop = std::pin::pin!(stop);
        let mut grace_until: Option<tokio::time::Instant> = None;
        let mut backoff_ms = 0u64;
        // The ledger's wake-ups, if it has any: a change means "claim now".
        let mut wake = self.ledger.wake();
        loop {
            let mut wait_ms = self.config.poll_interval_ms;
            let capacity = (self.config.batch_size as usize).saturating_sub(tasks.len());
            if grace_until.is_none() && self.config.polling && capacity > 0 {
                let round = Round {
                    tasks: &mut tasks,
                    stopping: &stopping,
                    report: &mut report,
                    backoff_ms: &mut backoff_ms,
                };
                match self.claim_round(capacity, round, options).await {
                    Some(ms) => wait_ms = ms,
                    None => break,
                }
            }
            if grace_until.is_some() && tasks.is_empty() {
                break;
            }
            // Waking up to poll only helps with a free slot: with every slot busy the
            // next claim waits for a delivery to end, which wakes the loop anyway. So
            // a busy worker arms no poll timer per delivery.
            let poll = grace_until.is_none() && tasks.len() < self.config.batch_size as usize;
            tokio::select! {
                biased;
                () = &mut stop, if grace_until.is_none() => {
                    stopping.store(true, Ordering::Relaxed);
                    grace_until = Some(tokio::time::Instant::now() + Duration::from_millis(options.grace_ms));
                    self.emit(|| WorkerEvent::Stopping { in_flight: tasks.len(), grace_ms: options.grace_ms });
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    // A delivery that ended its attempt may have claimed the next
                    // one in the same write: deliver it in the slot it frees.
                    for (claimed, at) in tally(&mut report, done) {
                        tasks.spawn(self.deliver(claimed, at, &stopping));
                    }
                }
                () = sleep_until_opt(grace_until) => {
                    self.drop_after_grace(&mut tasks, &mut report);
                    break;
                }
                () = tokio::time::sleep_until(next_report) => {
                    self.report_in(false).await;
                    next_report = tokio::time::Instant::now() + Duration::from_millis(REPORT_EVERY_MS);
                }
                () = sleep_ms_opt(poll.then_some(wait_ms)) => {}
                () = woken(&mut wake), if poll && self.config.polling => {}
            }
        }
        report
    }

    /// One claim for up to `capacity` commands, each delivered in a task of its
    /// own; answers how long to wait before the next one, or `None` when the worker
    /// runs `until_idle` and nothing is open any more.
    async fn claim_round(&self, capacity: usize, round: Round<'_>, options: RunOptions) -> Option<u64> {
        // The lease estimate starts before the claim is sent: conservative by the
        // claim's round trip.
        let sent_at = self.clock.now();
        let wall = trace::wall_now();
        let claimed = match self.ledger.claim_batch(self.claim_request(capacity as u32)).await {
            Ok(claimed) => claimed,
            Err(e) => return Some(self.back_off(round.backoff_ms, &e)),
        };
        let window = ClaimWindow::since(wall);
        *round.backoff_ms = 0;
        let full = claimed.len() == capacity;
        for c in claimed {
            round.report.claimed += 1;
            let at = ClaimedAt { at: sent_at, window };
            round.tasks.spawn(self.deliver(c, at, round.stopping));
        }
        if full {
            return Some(0);
        }
        if options.until_idle && round.tasks.is_empty() {
            let open = match &self.capabilities {
                Some(capabilities) => self.ledger.open_attempts_for(capabilities).await,
                None => self.ledger.open_attempts().await,
            };
            match open {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => return Some(self.back_off(round.backoff_ms, &e)),
            }
        }
        Some(self.config.poll_interval_ms)
    }

    /// The grace period is over: deliveries that ended (their last write committed)
    /// while the timer fired count as what they were; the rest are dropped, their
    /// leases left to expire.
    fn drop_after_grace(&self, tasks: &mut JoinSet<Ended>, report: &mut WorkerReport) {
        while let Some(done) = tasks.try_join_next() {
            // Too late to deliver what it claimed: its lease will expire.
            report.abandoned += tally(report, done).len() as u64;
        }
        let dropped = tasks.len();
        tasks.abort_all();
        report.abandoned += dropped as u64;
        if dropped > 0 {
            self.emit(|| WorkerEvent::GraceExpired { dropped });
        }
    }

    /// A claim of up to `batch` commands this worker can run, beginning each.
    fn claim_request(&self, batch: u32) -> ClaimRequest {
        ClaimRequest {
            owner: self.id.clone(),
            batch,
            lease_ms: self.config.lease_ms,
            begin: true,
            capabilities: self.capabilities.clone(),
        }
    }

    /// Reports this worker to the ledger's fleet ([`Ledger::report_worker`]); a
    /// failure is only told (the next report tries again).
    async fn report_in(&self, starting: bool) {
        let Some(capabilities) = &self.capabilities else { return };
        if let Err(e) = self.ledger.report_worker(&self.id, capabilities, starting).await {
            self.emit(|| WorkerEvent::LedgerUnavailable {
                error: e.to_string(),
                retry_in_ms: REPORT_EVERY_MS,
            });
        }
    }

    fn back_off(&self, backoff_ms: &mut u64, error: &LedgerError) -> u64 {
        let cap = self.config.poll_interval_ms;
        *backoff_ms = (*backoff_ms * 2).clamp((cap / 8).max(10), cap);
        let retry_in_ms = *backoff_ms;
        self.emit(|| WorkerEvent::LedgerUnavailable {
            error: error.to_string(),
            retry_in_ms,
        });
        retry_in_ms
    }

    fn emit(&self, event: impl FnOnce() -> WorkerEvent) {
        emit(&self.observer, event);
    }

    /// Delivers one claimed command to its end (for this worker). Unless the worker
    /// is `stopping` (or does not poll), the write that ends the attempt also claims
    /// the next command ([`Ledger::worker_then_claim`]), which the delivery hands back.
    fn deliver(
        &self,
        claimed: Claimed,
        at: ClaimedAt,
        stopping: &Arc<AtomicBool>,
    ) -> impl Future<Output = Ended> + Send + 'static {
        let claim_next = self.config.polling.then(|| self.claim_request(1));
        let delivery = Delivery {
            claim_next,
            stopping: Arc::clone(stopping),
            ledger: Arc::clone(&self.ledger),
            executor: Arc::clone(&self.executor),
            clock: Arc::clone(&self.clock),
            observer: self.observer.clone(),
            lease_ms: self.config.lease_ms,
            max_evidence_bytes: self.config.max_evidence_bytes,
            step_timeout: self.step_timeout,
            claimed: Box::new(claimed),
            claimed_at: at.at,
            window: at.window,
        };
        delivery.run()
    }
}

/// What one claim round works on: the delivery tasks, the stop flag, the report
/// and the ledger backoff.
struct Round<'a> {
    tasks: &'a mut JoinSet<Ended>,
    stopping: &'a Arc<AtomicBool>,
    report: &'a mut WorkerReport,
    backoff_ms: &'a mut u64,
}

/// Why a worker with `capabilities` can run nothing, if it cannot.
fn runs_nothing(capabilities: &Capabilities) -> Option<String> {
    if capabilities.queues.is_empty() {
        return Some("it takes no queue".to_owned());
    }
    capabilities.is_empty().then(|| {
        "it has no executor that reaches any target (register an executor, or allow hosts for http:v1)".to_owned()
    })
}

/// How a delivery ended, with the commands its ending write claimed (each with
/// the instant that write was sent, where its lease estimate starts).
struct Ended {
    outcome: Outcome,
    next: Vec<(Claimed, ClaimedAt)>,
}

/// When a command was claimed: the worker clock's reading as the claim was sent (the
/// lease estimate starts there), and the claim's wall-clock window for its span.
#[derive(Debug, Clone, Copy)]
struct ClaimedAt {
    at: Timestamp,
    window: Option<ClaimWindow>,
}

/// Counts a delivery's end (and what it claimed) in the report; answers what it
/// claimed.
fn tally(report: &mut WorkerReport, done: Result<Ended, tokio::task::JoinError>) -> Vec<(Claimed, ClaimedAt)> {
    let Ok(Ended { outcome, next }) = done else {
        report.abandoned += 1;
        return Vec::new();
    };
    match outcome {
        Outcome::Delivered => report.delivered += 1,
        Outcome::Failed(_) | Outcome::Exhausted { .. } => report.failed += 1,
        Outcome::GaveBack { .. } | Outcome::Yielded { .. } => report.gave_back += 1,
        Outcome::Refused(_) => report.refused += 1,
        Outcome::Abandoned(_) => report.abandoned += 1,
    }
    report.claimed += next.len() as u64;
    next
}

/// A give-back's jitter for the delivery under `token`: drawn from the lease token
/// (itself from the ledger's entropy), so deliveries spread apart and a simulation
/// stays a function of its seed.
fn jitter(token: &LeaseToken) -> u64 {
    let digest = leasehold_engine::canonical::sha256_hex(token.expose().as_bytes());
    u64::from_str_radix(&digest[..16], 16).unwrap_or(0)
}

/// Resolves when the ledger's wake-up receiver changes; never, without one (or once
/// its sender is gone).
async fn woken(wake: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(rx) = wake {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    *wake = None;
    std::future::pending::<()>().await;
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Builds an event only when somebody listens.
fn emit(observer: &Observer, event: impl FnOnce() -> WorkerEvent) {
    if let Some(observer) = observer {
        observer(&event());
    }
}

/// A request in flight. It borrows the delivery (its ledger, executor and lease),
/// which outlives it: no reference count or lease is copied per request.
type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The driver's [`Failure`] for a ledger error: a mapping, no judgement.
fn failure(error: LedgerError) -> Failure {
    match error {
        LedgerError::Refused(refusal) => Failure::Refused(refusal),
        LedgerError::NotFound { .. } => Failure::NotFound,
        LedgerError::Unavailable(_) => Failure::Unavailable,
        // Whatever else went wrong, the request may have been applied.
        _ => Failure::Ambiguous,
    }
}

/// A worker request in flight: the ledger's reply with the commands it claimed.
type WriteCall<'a> = Boxed<'a, Result<(Reply, Vec<Claimed>), LedgerError>>;

/// The read-back in flight.
type ReadCall<'a> = Boxed<'a, Result<AttemptRecord, LedgerError>>;

struct Delivery<L, E, C> {
    /// The claim an ending write makes, if this worker claims.
    claim_next: Option<ClaimRequest>,
    stopping: Arc<AtomicBool>,
    ledger: Arc<L>,
    executor: Arc<E>,
    clock: Arc<C>,
    observer: Observer,
    lease_ms: u64,
    max_evidence_bytes: usize,
    step_timeout: Duration,
    // Boxed: the task that owns this future is allocated per delivery, and a
    // smaller one is cheaper to allocate and to move.
    claimed: Box<Claimed>,
    claimed_at: Timestamp,
    window: Option<ClaimWindow>,
}

impl<L: Ledger, E: Executor, C: Clock> Delivery<L, E, C> {
    async fn run(self) -> Ended {
        let record = &self.claimed.record;
        let attempt = &record.attempt.id;
        let steps = record.receipts.len() as u32;
        let delivery = record.command.delivery_count;
        self.claimed_events();
        let mut spans = DeliveryTrace::open(&self.claimed, self.window);
        // Boxed, like the claim: it keeps the delivery's task small.
        let mut driver = Box::new(
            Driver::fused(record, self.lease_ms, self.claimed_at)
                .with_max_evidence_bytes(self.max_evidence_bytes)
                .with_policy(&self.claimed.plan, jitter(&self.claimed.lease.token)),
        );
        // The worker request in flight (what it was, when it was sent, its call), or
        // the read-back; the driver sends one at a time.
        let mut write_call: Option<(WorkerOp, WriteSent, WriteCall<'_>)> = None;
        let mut read_call: Option<ReadCall<'_>> = None;
        let mut executor_call: Option<(u32, Boxed<'_, ExecutorResult>)> = None;
        // The last write other than a heartbeat, for the event a read-back that finds
        // it committed reports.
        let mut last_write = WorkerOp::Heartbeat;
        // What ending writes claimed (a repeat after a lost reply may claim again),
        // each with when its write was sent.
        let mut next: Vec<(Claimed, ClaimedAt)> = Vec::new();
        let outcome = loop {
            // One reading for the whole turn: the actions drained now are sent now.
            let now = self.clock.now();
            while let Some(action) = driver.poll_action(now) {
                match action {
                    DriverAction::Execute { ordinal } => {
                        executor_call = Some((ordinal, self.execute(ordinal, &mut spans)));
                    }
                    DriverAction::Ledger(request) => {
                        let ends = driver.ends_attempt(&request);
                        let (op, call) = self.send(request, ends, &mut spans);
                        if op != WorkerOp::Heartbeat {
                            last_write = op;
                        }
                        let sent = WriteSent {
                            at: now,
                            wall: trace::wall_now(),
                        };
                        write_call = Some((op, sent, call));
                    }
                    DriverAction::ReadAttempt => {
                        let (ledger, lease) = (&*self.ledger, &self.claimed.lease);
                        read_call = Some(Box::pin(ledger.attempt(&lease.attempt_id)));
                    }
                }
            }
            if let Some(outcome) = driver.outcome() {
                break outcome.clone();
            }
            let wait_ms = driver.poll_timeout().map(|d| d.at.millis_since(now));
            tokio::select! {
                biased;
                result = maybe(write_call.as_mut().map(|(_, _, f)| f)) => {
                    let (op, sent, _) = write_call.take().expect("a worker request was in flight");
                    self.report_reply(op, &result, steps);
                    match result {
                        Ok((reply, claimed)) => {
                            let at = ClaimedAt { at: sent.at, window: ClaimWindow::since(sent.wall) };
                            next.extend(claimed.into_iter().map(|c| (c, at)));
                            driver.handle_reply(self.clock.now(), reply);
                        }
                        Err(e) => driver.handle_failure(self.clock.now(), failure(e)),
                    }
                }
                result = maybe(read_call.as_mut()) => {
                    read_call = None;
                    match result {
                        Ok(record) => driver.handle_read(self.clock.now(), &record),
                        Err(e) => driver.handle_failure(self.clock.now(), failure(e)),
                    }
                    let delivered = driver.outcome() == Some(&Outcome::Delivered);
                    if let (true, WorkerOp::CompleteAndContinue(ordinal)) = (delivered, last_write) {
                        // The read-back found the lost completion committed.
                        self.step_event(false, ordinal, steps);
                    }
                }
                result = maybe(executor_call.as_mut().map(|(_, f)| f)) => {
                    let (ordinal, _) = executor_call.take().expect("an executor call was in flight");
                    driver.handle_executed(self.clock.now(), ordinal, result);
                }
                () = sleep_ms_opt(wait_ms) => driver.handle_timeout(self.clock.now()),
            }
        };
        self.executor.release(attempt, delivery);
        spans.finish(&outcome);
        emit(&self.observer, || WorkerEvent::Finished {
            attempt: attempt.clone(),
            outcome: outcome.clone(),
        });
        Ended { outcome, next }
    }

    /// Emits the claim's event, and a begun event for each step the claim found (or
    /// made) RUNNING.
    fn claimed_events(&self) {
        let record = &self.claimed.record;
        let (steps, delivery) = (record.receipts.len() as u32, record.command.delivery_count);
        emit(&self.observer, || WorkerEvent::Claimed {
            attempt: record.attempt.id.clone(),
            plan: self.claimed.plan.name.clone(),
            command: record.command.id.clone(),
            delivery,
            steps,
            skipped: record
                .receipts
                .iter()
                .filter(|r| r.status == leasehold_engine::ReceiptStatus::Succeeded)
                .count() as u32,
            queued_ms: (delivery == 1).then(|| self.claimed_at.millis_since(record.attempt.created_at)),
        });
        for r in &record.receipts {
            if r.status == leasehold_engine::ReceiptStatus::Running {
                self.step_event(true, r.ordinal, steps);
            }
        }
    }

    /// Emits a step's begun (or succeeded) event.
    fn step_event(&self, begun: bool, ordinal: u32, steps: u32) {
        emit(&self.observer, || {
            let attempt = self.claimed.record.attempt.id.clone();
            let step = self
                .claimed
                .record
                .receipt(ordinal)
                .map(|r| r.step_code.clone())
                .unwrap_or_default();
            if begun {
                WorkerEvent::StepBegun {
                    attempt,
                    ordinal,
                    steps,
                    step,
                }
            } else {
                WorkerEvent::StepSucceeded {
                    attempt,
                    ordinal,
                    steps,
                    step,
                }
            }
        });
    }

    /// Emits the events a ledger reply stands for: committed steps, failed heartbeats.
    fn report_reply(&self, op: WorkerOp, result: &Result<(Reply, Vec<Claimed>), LedgerError>, steps: u32) {
        match (op, result) {
            (WorkerOp::BeginStep(ordinal), Ok((reply, _))) if op.answered_by(reply) => {
                self.step_event(true, ordinal, steps)
            }
            (WorkerOp::CompleteAndContinue(ordinal), Ok((Reply::Continued(continued), _))) => {
                self.step_event(false, ordinal, steps);
                if let Continued::Began(next) = continued {
                    self.step_event(true, *next, steps);
                }
            }
            (WorkerOp::Heartbeat, Err(e)) if !matches!(e, LedgerError::Refused(_) | LedgerError::NotFound { .. }) => {
                emit(&self.observer, || WorkerEvent::HeartbeatFailed {
                    attempt: self.claimed.record.attempt.id.clone(),
                    error: e.to_string(),
                });
            }
            (_, Err(e)) if e.is_transient() => emit(&self.observer, || WorkerEvent::WriteUnconfirmed {
                attempt: self.claimed.record.attempt.id.clone(),
                write: op.op().as_str(),
                error: e.to_string(),
            }),
            _ => {}
        }
    }

    /// Sends a worker request: one that `ends` the attempt claims the worker's next
    /// command in the same write (unless the worker is stopping) and has a span of
    /// its own, when spans are taken.
    fn send(&self, request: WorkerRequest, ends: bool, spans: &mut DeliveryTrace) -> (WorkerOp, WriteCall<'_>) {
        let claim = self
            .claim_next
            .as_ref()
            .filter(|_| ends && !self.stopping.load(Ordering::Relaxed));
        let op = request.kind();
        let call = self.write(request, claim.cloned());
        match ends.then(|| spans.end_write(op)).filter(|s| !s.is_disabled()) {
            Some(span) => (op, traced_write(span, call)),
            None => (op, call),
        }
    }

    /// Sends a worker request as it is; the request (and its evidence) moves into the
    /// future. With `claim`, a write that ends the attempt claims the worker's next
    /// command in the same call ([`Ledger::worker_then_claim`]); the call answers what
    /// it claimed.
    fn write(&self, request: WorkerRequest, claim: Option<ClaimRequest>) -> WriteCall<'_> {
        let (ledger, lease) = (&*self.ledger, &self.claimed.lease);
        Box::pin(async move {
            match claim {
                Some(claim) => ledger.worker_then_claim(lease, request, claim).await,
                None => Ok((ledger.worker(lease, request).await?, Vec::new())),
            }
        })
    }

    /// Calls the executor for a step (the request is built now, the call runs when
    /// polled).
    fn execute(&self, ordinal: u32, spans: &mut DeliveryTrace) -> Boxed<'_, ExecutorResult> {
        let record = &self.claimed.record;
        let receipt = record.receipt(ordinal);
        let step = receipt.and_then(|r| AttemptRecord::step_of(&self.claimed.plan, r));
        let traced = step.as_ref().map(|s| spans.step(ordinal, s));
        let request = step.zip(receipt).map(|(step, receipt)| ExecRequest {
            plan_id: self.claimed.plan.id.clone(),
            attempt_id: record.attempt.id.clone(),
            command_id: record.command.id.clone(),
            delivery: record.command.delivery_count,
            action: record.attempt.action,
            ordinal,
            step,
            idempotency_key: receipt.idempotency_key.clone(),
            traceparent: traced.as_ref().map(|(_, ctx)| *ctx),
        });
        match request.zip(traced) {
            Some((request, (span, _))) => {
                let (code, budget) = (request.step.code.clone(), self.step_timeout);
                let call = self.executor.execute(request);
                let recorded = span.clone();
                let call = async move {
                    let result = match tokio::time::timeout(budget, call).await {
                        Ok(result) => result,
                        Err(_) => ExecutorResult::Permanent(format!(
                            "step {code}: still running after its time budget of {} ms (step timeout); stopped",
                            budget.as_millis()
                        )),
                    };
                    recorded.record("leasehold.outcome", trace::result_name(&result));
                    result
                };
                Box::pin(call.instrument(span))
            }
            None => Box::pin(std::future::ready(ExecutorResult::Permanent(format!(
                "step {ordinal} is not in the plan"
            )))),
        }
    }
}

/// A worker request as it was sent: the worker clock's reading, and the wall clock's
/// when spans are reported (the window of what an ending write claims).
#[derive(Debug, Clone, Copy)]
struct WriteSent {
    at: Timestamp,
    wall: Option<std::time::SystemTime>,
}

/// `call` inside `span`, which records whether the ledger applied it.
fn traced_write(span: tracing::Span, call: WriteCall<'_>) -> WriteCall<'_> {
    let recorded = span.clone();
    Box::pin(
        async move {
            let result = call.await;
            let outcome = match &result {
                Ok(_) => "applied",
                Err(LedgerError::Refused(_) | LedgerError::NotFound { .. }) => "refused",
                Err(_) => "unknown",
            };
            recorded.record("leasehold.outcome", outcome);
            result
        }
        .instrument(span),
    )
}

async fn maybe<F: Future + Unpin>(future: Option<&mut F>) -> F::Output {
    match future {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// Sleeps `ms`, or forever. The timer is created (and boxed, keeping the futures
/// that embed this one small) only when first polled: a `select!` whose other
/// branch is ready at once never makes one.
async fn sleep_ms_opt(ms: Option<u64>) {
    match ms {
        Some(ms) => Box::pin(tokio::time::sleep(Duration::from_millis(ms))).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::entropy::SeededEntropy;
    use crate::executor::{DryRun, Executors};
    use crate::ledger::memory::MemoryLedger;
    use leasehold_engine::{Action, PlanSpec, Step};
    use std::sync::Mutex;

    #[tokio::test]
    async fn a_delivery_reports_claim_steps_and_end_in_order() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
        let ledger = Arc::new(MemoryLedger::new(clock.clone(), Arc::new(SeededEntropy::new(3))));
        let spec = PlanSpec {
            input: None,
            on_failure: None,
            name: "two".into(),
            queue: None,
            recovery: "resume".into(),
            volatile_fields: Vec::new(),
            steps: ["first", "second"]
                .into_iter()
                .map(|code| Step {
                    code: code.into(),
                    executor: crate::executor::dry_run::NAME.into(),
                    target: None,
                    payload: serde_json::json!({}),
                    retry: None,
                })
                .collect(),
            retry: None,
        };
        let plan = ledger.register_plan(spec, &Executors::new().names()).await.unwrap();
        let attempt = ledger.enqueue(&plan.id, Action::Execute).await.unwrap().attempt.id;
        let events = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&events);
        let config = WorkerConfig::clamped(true, 10, 1, 60_000);
        let worker = Worker::new("w", ledger, Arc::new(DryRun), clock, config)
            .on_event(move |e| seen.lock().unwrap().push(e.to_string()));
        let options = RunOptions {
            until_idle: true,
            grace_ms: 0,
        };
        let report = worker.run(std::future::pending(), options).await;
        assert_eq!((report.claimed, report.delivered), (1, 1));
        let expected = [
            format!("claimed attempt {attempt} of plan two (delivery 1, 2 steps)"),
            format!("attempt {attempt} step 1/2 first: running"),
            format!("attempt {attempt} step 1/2 first: succeeded"),
            format!("attempt {attempt} step 2/2 second: running"),
            format!("attempt {attempt} step 2/2 second: succeeded"),
            format!("attempt {attempt}: delivered"),
        ];
        assert_eq!(*events.lock().unwrap(), expected);
    }

    /// Told to stop, a worker finishes what it holds within the grace period, and
    /// its ending write claims nothing more.
    #[tokio::test]
    async fn a_stopping_worker_claims_nothing_with_its_ending_write() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
        let memory = Arc::new(MemoryLedger::new(clock.clone(), Arc::new(SeededEntropy::new(5))));
        let ledger = Arc::new(crate::bench::CountingLedger::new(Arc::clone(&memory)));
        let mut attempts = Vec::new();
        for i in 0..3 {
            let plan = ledger
                .register_plan(crate::bench::plan_spec(format!("p{i}"), 1), &Executors::new().names())
                .await
                .unwrap();
            attempts.push(ledger.enqueue(&plan.id, Action::Execute).await.unwrap().attempt.id);
        }
        let config = WorkerConfig::clamped(true, 10, 1, 60_000);
        let worker = Worker::new("w", Arc::clone(&ledger), Arc::new(DryRun), clock, config);
        let options = RunOptions {
            until_idle: false,
            grace_ms: 60_000,
        };
        // The stop is seen before the claimed delivery first runs.
        let report = worker.run(std::future::ready(()), options).await;
        assert_eq!((report.claimed, report.delivered), (1, 1), "{report:?}");
        let counts = ledger.counts();
        assert_eq!((counts.claims, counts.claims_after_writes), (1, 0), "{counts:?}");
        assert_eq!(memory.open_attempts().await.unwrap(), 2, "two attempts stay QUEUED");
    }

    /// An executor whose evidence is a string of `0` bytes.
    struct Huge(usize);

    impl Executor for Huge {
        async fn execute(&self, _: ExecRequest) -> ExecutorResult {
            ExecutorResult::Done {
                evidence: serde_json::json!({"blob": "x".repeat(self.0)}),
                target_receipt: serde_json::json!({}),
            }
        }
    }

    /// Delivers one attempt of a one-step plan run by `executor` under `config`;
    /// answers the report, the attempt as stored, and the worker's printed lines.
    async fn deliver_one(executor: Huge, config: WorkerConfig) -> (WorkerReport, AttemptRecord, Vec<String>) {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
        let ledger = Arc::new(MemoryLedger::new(clock.clone(), Arc::new(SeededEntropy::new(6))));
        let spec = PlanSpec {
            input: None,
            on_failure: None,
            name: "huge".into(),
            queue: None,
            recovery: "resume".into(),
            volatile_fields: Vec::new(),
            steps: vec![Step {
                code: "dump".into(),
                executor: "huge:v1".into(),
                target: None,
                payload: serde_json::json!({}),
                retry: None,
            }],
            retry: None,
        };
        let plan = ledger.register_plan(spec, &["huge:v1"]).await.unwrap();
        let attempt = ledger.enqueue(&plan.id, Action::Execute).await.unwrap().attempt.id;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&lines);
        let worker = Worker::new("w", Arc::clone(&ledger), Arc::new(executor), clock, config)
            .on_event(move |e| seen.lock().unwrap().push(e.to_string()));
        let options = RunOptions {
            until_idle: true,
            grace_ms: 0,
        };
        let report = worker.run(std::future::pending(), options).await;
        let record = ledger.attempt(&attempt).await.unwrap();
        let lines = lines.lock().unwrap().clone();
        (report, record, lines)
    }

    #[tokio::test]
    async fn evidence_over_the_workers_cap_fails_the_step_and_nothing_of_it_is_stored() {
        let config = WorkerConfig::clamped(true, 10, 1, 60_000);
        let (report, record, lines) = deliver_one(Huge(6_260_100), config).await;
        assert_eq!(
            (report.claimed, report.failed, report.delivered),
            (1, 1, 0),
            "{report:?}"
        );
        let receipt = &record.receipts[0];
        assert_eq!(receipt.status, leasehold_engine::ReceiptStatus::Failed);
        assert_eq!((&receipt.evidence, &receipt.target_receipt), (&None, &None));
        let error = "step 1: step dump: evidence (with its target receipt) is 6,260,113 bytes, over the limit of \
                     262,144 bytes (the worker's --max-evidence-bytes)";
        assert_eq!(receipt.error.as_deref(), Some(error));
        assert_eq!(
            lines.last().unwrap(),
            &format!("attempt {}: failed: {error}", record.attempt.id)
        );
        // A worker given a larger cap stores it.
        let config = config.with_max_evidence_bytes(8 * 1024 * 1024);
        let (report, record, _) = deliver_one(Huge(6_260_100), config).await;
        assert_eq!((report.delivered, report.failed), (1, 0), "{report:?}");
        assert_eq!(record.receipts[0].evidence.as_ref().map(String::len), Some(6_260_111));
    }

    #[tokio::test]
    async fn a_worker_nobody_listens_to_still_delivers() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
        let ledger = Arc::new(MemoryLedger::new(clock.clone(), Arc::new(SeededEntropy::new(4))));
        for i in 0..3 {
            let plan = ledger
                .register_plan(crate::bench::plan_spec(format!("p{i}"), 2), &Executors::new().names())
                .await
                .unwrap();
            ledger.enqueue(&plan.id, Action::Execute).await.unwrap();
        }
        let config = WorkerConfig::clamped(true, 10, 2, 60_000);
        let worker = Worker::new("w", Arc::clone(&ledger), Arc::new(DryRun), clock, config);
        let options = RunOptions {
            until_idle: true,
            grace_ms: 0,
        };
        let report = worker.run(std::future::pending(), options).await;
        assert_eq!((report.claimed, report.delivered), (3, 3));
        assert_eq!(ledger.open_attempts().await.unwrap(), 0);
    }

    /// Dry runs, but saying it reaches no target with any executor.
    struct Blind;

    impl Executor for Blind {
        async fn execute(&self, request: ExecRequest) -> ExecutorResult {
            DryRun.execute(request).await
        }

        fn reach(&self) -> Option<std::collections::BTreeMap<String, leasehold_engine::Reach>> {
            Some(std::collections::BTreeMap::new())
        }
    }

    #[tokio::test]
    async fn a_worker_that_can_run_nothing_says_so_and_claims_nothing() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
        let ledger = Arc::new(MemoryLedger::new(clock.clone(), Arc::new(SeededEntropy::new(5))));
        let plan = ledger
            .register_plan(crate::bench::plan_spec("p".into(), 1), &Executors::new().names())
            .await
            .unwrap();
        ledger.enqueue(&plan.id, Action::Execute).await.unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&events);
        let config = WorkerConfig::clamped(true, 10, 2, 60_000);
        let worker = Worker::new("w", Arc::clone(&ledger), Arc::new(Blind), clock, config)
            .on_event(move |e| seen.lock().unwrap().push(e.to_string()));
        let options = RunOptions {
            until_idle: true,
            grace_ms: 0,
        };
        let report = worker.run(std::future::pending(), options).await;
        assert_eq!(report.claimed, 0);
        assert_eq!(
            ledger.open_attempts().await.unwrap(),
            1,
            "the attempt waits for another worker"
        );
        assert_eq!(
            *events.lock().unwrap(),
            [
                "this worker can run nothing: it has no executor that reaches any target \
              (register an executor, or allow hosts for http:v1); it claims nothing"
            ]
        );
        // It did not join the fleet either.
        assert!(ledger.workers().await.unwrap().0.is_empty());
        // A worker that can run the plan reports itself and delivers it.
        let able = Worker::new(
            "able",
            Arc::clone(&ledger),
            Arc::new(Executors::new()),
            Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000))),
            config,
        );
        assert_eq!(worker_queues(&able), ["default"]);
        assert_eq!(able.run(std::future::pending(), options).await.delivered, 1);
        let (fleet, _) = ledger.workers().await.unwrap();
        assert_eq!(fleet.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(), ["able"]);
    }

    fn worker_queues<L: Ledger, E: Executor, C: Clock>(w: &Worker<L, E, C>) -> Vec<String> {
        w.capabilities()
            .map(|c| c.queues.iter().cloned().collect())
            .unwrap_or_default()
    }
}
