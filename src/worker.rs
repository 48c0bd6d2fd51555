//! The tokio worker runtime: a thin loop around the engine's [`Driver`].
//!
//! A [`Worker`] polls its ledger for up to `batch_size` commands at a time, drives
//! one [`Driver`] per claimed command in its own task, sends heartbeats on the
//! driver's deadlines, and calls the executor between two ledger requests, never
//! inside a transaction. When the ledger is unreachable it backs off (doubling up to
//! the poll interval). When told to stop it claims nothing more and lets in-flight
//! deliveries finish within a grace period; deliveries still running then are
//! dropped, and their leases expire for another worker to take over.
//!
//! The worker is generic over its ledger, executor and clock, so the simulator runs
//! this same code with an RPC ledger client, a simulated target and skewed clocks.
//! Its clock only schedules heartbeats and polls; leases are decided by the ledger.

use crate::clock::Clock;
use crate::executor::{ExecRequest, Executor, ExecutorResult};
use crate::ledger::{Claimed, Ledger, LedgerError};
use leasehold_engine::driver::{Driver, DriverAction, Outcome};
use leasehold_engine::lease::WorkerConfig;
use leasehold_engine::{AttemptId, Lease, Refusal, Timestamp};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

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
        /// The command's delivery count (2 or more after a takeover).
        delivery: u32,
        /// Steps in the attempt.
        steps: u32,
        /// Steps already SUCCEEDED (skipped by a resume takeover).
        skipped: u32,
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
            },
            WorkerEvent::LedgerUnavailable { error, retry_in_ms } => {
                write!(f, "ledger unavailable ({error}); retrying in {retry_in_ms} ms")
            }
            WorkerEvent::Stopping { in_flight, grace_ms } => {
                write!(
                    f,
                    "stopping: no new claims; {in_flight} deliveries in flight get {grace_ms} ms to finish"
                )
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
    /// Exit once no attempt is QUEUED or RUNNING.
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
}

type Observer = Arc<dyn Fn(&WorkerEvent) + Send + Sync>;

/// A worker: claims commands and delivers them.
pub struct Worker<L, E, C> {
    id: String,
    ledger: Arc<L>,
    executor: Arc<E>,
    clock: Arc<C>,
    config: WorkerConfig,
    observer: Observer,
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
        Self {
            id: id.into(),
            ledger,
            executor,
            clock,
            config,
            observer: Arc::new(|_| {}),
        }
    }

    /// Calls `observer` for every [`WorkerEvent`].
    pub fn on_event(mut self, observer: impl Fn(&WorkerEvent) + Send + Sync + 'static) -> Self {
        self.observer = Arc::new(observer);
        self
    }

    /// Runs until `stop` resolves (then drains within the grace period) or, with
    /// `until_idle`, until no attempt is QUEUED or RUNNING.
    pub async fn run(&self, stop: impl Future<Output = ()>, options: RunOptions) -> WorkerReport {
        let mut report = WorkerReport::default();
        let mut tasks: JoinSet<Outcome> = JoinSet::new();
        let mut stop = std::pin::pin!(stop);
        let mut grace_until: Option<tokio::time::Instant> = None;
        let mut backoff_ms = 0u64;
        loop {
            let mut wait_ms = self.config.poll_interval_ms;
            let capacity = (self.config.batch_size as usize).saturating_sub(tasks.len());
            if grace_until.is_none() && self.config.polling && capacity > 0 {
                // The lease estimate starts before the claim is sent: conservative by
                // the claim's round trip.
                let sent_at = self.clock.now();
                match self
                    .ledger
                    .claim_and_begin(&self.id, capacity as u32, self.config.lease_ms)
                    .await
                {
                    Ok(claimed) => {
                        backoff_ms = 0;
                        let full = claimed.len() == capacity;
                        for c in claimed {
                            report.claimed += 1;
                            tasks.spawn(self.deliver(c, sent_at));
                        }
                        if full {
                            wait_ms = 0;
                        } else if options.until_idle && tasks.is_empty() {
                            match self.ledger.open_attempts().await {
                                Ok(0) => break,
                                Ok(_) => {}
                                Err(e) => wait_ms = self.back_off(&mut backoff_ms, &e),
                            }
                        }
                    }
                    Err(e) => wait_ms = self.back_off(&mut backoff_ms, &e),
                }
            }
            if grace_until.is_some() && tasks.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                () = &mut stop, if grace_until.is_none() => {
                    grace_until = Some(tokio::time::Instant::now() + Duration::from_millis(options.grace_ms));
                    self.emit(&WorkerEvent::Stopping { in_flight: tasks.len(), grace_ms: options.grace_ms });
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    match done {
                        Ok(Outcome::Delivered) => report.delivered += 1,
                        Ok(Outcome::Failed(_)) => report.failed += 1,
                        Ok(Outcome::Refused(_)) => report.refused += 1,
                        Ok(Outcome::Abandoned(_)) | Err(_) => report.abandoned += 1,
                    }
                }
                () = sleep_until_opt(grace_until) => {
                    let dropped = tasks.len();
                    tasks.abort_all();
                    report.abandoned += dropped as u64;
                    self.emit(&WorkerEvent::GraceExpired { dropped });
                    break;
                }
                () = tokio::time::sleep(Duration::from_millis(wait_ms)), if grace_until.is_none() => {}
            }
        }
        report
    }

    fn back_off(&self, backoff_ms: &mut u64, error: &LedgerError) -> u64 {
        let cap = self.config.poll_interval_ms;
        *backoff_ms = (*backoff_ms * 2).clamp((cap / 8).max(10), cap);
        self.emit(&WorkerEvent::LedgerUnavailable {
            error: error.to_string(),
            retry_in_ms: *backoff_ms,
        });
        *backoff_ms
    }

    fn emit(&self, event: &WorkerEvent) {
        (self.observer)(event);
    }

    /// Delivers one claimed command to its end (for this worker).
    fn deliver(&self, claimed: Claimed, claimed_at: Timestamp) -> impl Future<Output = Outcome> + Send + 'static {
        let delivery = Delivery {
            ledger: Arc::clone(&self.ledger),
            executor: Arc::clone(&self.executor),
            clock: Arc::clone(&self.clock),
            observer: Arc::clone(&self.observer),
            lease_ms: self.config.lease_ms,
            claimed,
            claimed_at,
        };
        delivery.run()
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

struct Delivery<L, E, C> {
    ledger: Arc<L>,
    executor: Arc<E>,
    clock: Arc<C>,
    observer: Observer,
    lease_ms: u64,
    claimed: Claimed,
    claimed_at: Timestamp,
}

impl<L: Ledger, E: Executor, C: Clock> Delivery<L, E, C> {
    async fn run(self) -> Outcome {
        let record = &self.claimed.record;
        let attempt = record.attempt.id.clone();
        let steps = record.receipts.len() as u32;
        let statuses: Vec<_> = record.receipts.iter().map(|r| (r.ordinal, r.status)).collect();
        let skipped = statuses
            .iter()
            .filter(|(_, s)| *s == leasehold_engine::ReceiptStatus::Succeeded)
            .count();
        let delivery = record.command.delivery_count;
        (self.observer)(&WorkerEvent::Claimed {
            attempt: attempt.clone(),
            plan: self.claimed.plan.name.clone(),
            delivery,
            steps,
            skipped: skipped as u32,
        });
        for (ordinal, status) in &statuses {
            if *status == leasehold_engine::ReceiptStatus::Running {
                (self.observer)(&self.step_event(true, *ordinal, &attempt, steps));
            }
        }
        let mut driver = Driver::fused(&statuses, self.lease_ms, self.claimed_at);
        let mut ledger_call: Option<(DriverAction, Boxed<Result<(), LedgerError>>)> = None;
        let mut executor_call: Option<(u32, Boxed<ExecutorResult>)> = None;
        // Whether the request now in flight repeats one whose outcome was unknown.
        let mut retried = false;
        let outcome = loop {
            while let Some(action) = driver.poll_action(self.clock.now()) {
                match action {
                    DriverAction::Execute { ordinal } => {
                        executor_call = Some((ordinal, Box::pin(self.execute(ordinal))));
                    }
                    other => {
                        let call = self.ledger_request(&other);
                        ledger_call = Some((other, call));
                    }
                }
            }
            if let Some(outcome) = driver.outcome() {
                break outcome.clone();
            }
            let wait_ms = driver.poll_timeout().map(|d| d.at.millis_since(self.clock.now()));
            tokio::select! {
                biased;
                result = maybe(ledger_call.as_mut().map(|(_, f)| f)) => {
                    let (action, _) = ledger_call.take().expect("a ledger call was in flight");
                    let now = self.clock.now();
                    match result {
                        Ok(()) => {
                            retried = false;
                            self.report_commit(&action, &attempt, steps);
                            driver.handle_committed(now);
                        }
                        Err(LedgerError::Refused(refusal)) => {
                            if std::mem::take(&mut retried) && self.ended_by_us(&action).await {
                                // The first try committed and only its reply was lost.
                                self.report_commit(&action, &attempt, steps);
                                driver.handle_committed(now);
                            } else {
                                driver.handle_refused(now, refusal);
                            }
                        }
                        Err(LedgerError::NotFound { .. }) => driver.handle_refused(
                            now,
                            Refusal::StaleToken { command: self.claimed.lease.command_id.clone() },
                        ),
                        Err(_) => {
                            retried = true;
                            driver.handle_ledger_error(now);
                        }
                    }
                }
                result = maybe(executor_call.as_mut().map(|(_, f)| f)) => {
                    let (ordinal, _) = executor_call.take().expect("an executor call was in flight");
                    driver.handle_executed(self.clock.now(), ordinal, result);
                }
                () = sleep_ms_opt(wait_ms) => driver.handle_timeout(self.clock.now()),
            }
        };
        self.executor.release(&attempt, delivery);
        (self.observer)(&WorkerEvent::Finished {
            attempt,
            outcome: outcome.clone(),
        });
        outcome
    }

    /// After a retried request that ends an attempt (finish, fail, the last
    /// complete-and-continue) is refused: whether the first try had in fact ended it
    /// under this very lease (same owner and delivery), its reply lost.
    async fn ended_by_us(&self, action: &DriverAction) -> bool {
        let ends = match action {
            DriverAction::Finish | DriverAction::Fail { .. } => true,
            DriverAction::CompleteAndContinue { ordinal, .. } => {
                self.claimed.record.receipts.iter().all(|r| r.ordinal <= *ordinal)
            }
            _ => false,
        };
        if !ends {
            return false;
        }
        let Ok(now) = self.ledger.attempt(&self.claimed.lease.attempt_id).await else {
            return false;
        };
        let mine = &self.claimed.record.command;
        let expected = match action {
            DriverAction::Fail { .. } => leasehold_engine::CommandStatus::Failed,
            _ => leasehold_engine::CommandStatus::Delivered,
        };
        now.command.status == expected
            && now.command.lease_owner == mine.lease_owner
            && now.command.delivery_count == mine.delivery_count
    }

    fn lease(&self) -> Lease {
        self.claimed.lease.clone()
    }

    fn step_code(&self, ordinal: u32) -> String {
        self.claimed
            .record
            .receipt(ordinal)
            .map(|r| r.step_code.clone())
            .unwrap_or_default()
    }

    fn step_event(&self, begun: bool, ordinal: u32, attempt: &AttemptId, steps: u32) -> WorkerEvent {
        let (attempt, step) = (attempt.clone(), self.step_code(ordinal));
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
    }

    fn report_commit(&self, action: &DriverAction, attempt: &AttemptId, steps: u32) {
        match action {
            DriverAction::BeginStep { ordinal } => (self.observer)(&self.step_event(true, *ordinal, attempt, steps)),
            DriverAction::CompleteStep { ordinal, .. } => {
                (self.observer)(&self.step_event(false, *ordinal, attempt, steps));
            }
            DriverAction::CompleteAndContinue { ordinal, .. } => {
                (self.observer)(&self.step_event(false, *ordinal, attempt, steps));
                let next = self
                    .claimed
                    .record
                    .receipts
                    .iter()
                    .map(|r| r.ordinal)
                    .filter(|o| o > ordinal)
                    .min();
                if let Some(next) = next {
                    (self.observer)(&self.step_event(true, next, attempt, steps));
                }
            }
            _ => {}
        }
    }

    fn ledger_request(&self, action: &DriverAction) -> Boxed<Result<(), LedgerError>> {
        let ledger = Arc::clone(&self.ledger);
        let lease = self.lease();
        let lease_ms = self.lease_ms;
        match action.clone() {
            DriverAction::BeginStep { ordinal } => {
                Box::pin(async move { ledger.begin_step(&lease, ordinal, lease_ms).await })
            }
            DriverAction::CompleteStep {
                ordinal,
                evidence,
                target_receipt,
            } => Box::pin(async move {
                ledger
                    .complete_step(&lease, ordinal, &evidence, &target_receipt, lease_ms)
                    .await
            }),
            DriverAction::CompleteAndContinue {
                ordinal,
                evidence,
                target_receipt,
            } => Box::pin(async move {
                ledger
                    .complete_and_continue(&lease, ordinal, &evidence, &target_receipt, lease_ms)
                    .await
                    .map(drop)
            }),
            DriverAction::Fail { ordinal, error } => {
                Box::pin(async move { ledger.fail(&lease, ordinal, &error).await })
            }
            DriverAction::Finish => Box::pin(async move { ledger.finish(&lease).await }),
            DriverAction::Heartbeat | DriverAction::Execute { .. } => {
                Box::pin(async move { ledger.heartbeat(&lease, lease_ms).await.map(drop) })
            }
        }
    }

    fn execute(&self, ordinal: u32) -> impl Future<Output = ExecutorResult> + Send + 'static {
        let executor = Arc::clone(&self.executor);
        let record = &self.claimed.record;
        let receipt = record.receipt(ordinal);
        let step = receipt.and_then(|r| self.claimed.plan.step(&r.step_code)).cloned();
        let request = step.zip(receipt).map(|(step, receipt)| ExecRequest {
            plan_id: self.claimed.plan.id.clone(),
            attempt_id: record.attempt.id.clone(),
            command_id: record.command.id.clone(),
            delivery: record.command.delivery_count,
            action: record.attempt.action,
            ordinal,
            step,
            idempotency_key: receipt.idempotency_key.clone(),
        });
        async move {
            match request {
                Some(request) => executor.execute(request).await,
                None => ExecutorResult::Permanent(format!("step {ordinal} is not in the plan")),
            }
        }
    }
}

async fn maybe<F: Future + Unpin>(future: Option<&mut F>) -> F::Output {
    match future {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

async fn sleep_ms_opt(ms: Option<u64>) {
    match ms {
        Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        None => std::future::pending().await,
    }
}
