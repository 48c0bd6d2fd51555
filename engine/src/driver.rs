//! The worker driver: a sans-IO state machine that delivers one claimed command.
//!
//! # Contract
//! Create a [`Driver`] from the claimed receipts, then loop:
//! 1. drain [`Driver::poll_action`] and perform each action (a ledger request or an
//!    executor call) — at most one ledger request is in flight at a time;
//! 2. report each result with `handle_committed`, `handle_refused`,
//!    `handle_ledger_error` or `handle_executed`, always with the current time of
//!    the worker's clock;
//! 3. when nothing is in progress, wait until [`Driver::poll_timeout`] and call
//!    [`Driver::handle_timeout`];
//!
//! until [`Driver::outcome`] is `Some`. The driver never holds a transaction: the
//! executor is called between two ledger requests. A refusal stops it at once.
//! Heartbeats are due every lease/3 after the last renewal (begin and complete renew
//! the lease too). If the lease would lapse before it could be renewed (by the
//! worker's own clock, measured from when the renewing request was sent) the driver
//! abandons the command and leaves the lease to expire.

use crate::ids::Timestamp;
use crate::lease::heartbeat_ms;
use crate::model::ReceiptStatus;
use crate::transition::Refusal;
use serde_json::Value;

/// Transient executor failures tolerated per step before the driver gives up.
pub const EXECUTOR_ATTEMPTS_MAX: u32 = 3;

/// Something the runtime must do for the driver.
#[derive(Debug, Clone, PartialEq)]
pub enum DriverAction {
    /// Ledger: begin the step at this ordinal.
    BeginStep {
        /// The receipt's ordinal.
        ordinal: u32,
    },
    /// Call the step's executor (outside every transaction).
    Execute {
        /// The receipt's ordinal.
        ordinal: u32,
    },
    /// Ledger: complete the step with its evidence.
    CompleteStep {
        /// The receipt's ordinal.
        ordinal: u32,
        /// The executor's evidence.
        evidence: Value,
        /// What the target answered.
        target_receipt: Value,
    },
    /// Ledger: complete the step and, in the same transaction, begin the next one
    /// or finish the attempt after the last (fused mode, see [`Driver::fused`]).
    CompleteAndContinue {
        /// The receipt's ordinal.
        ordinal: u32,
        /// The executor's evidence.
        evidence: Value,
        /// What the target answered.
        target_receipt: Value,
    },
    /// Ledger: fail the attempt.
    Fail {
        /// The failing step, if one.
        ordinal: Option<u32>,
        /// Why.
        error: String,
    },
    /// Ledger: finish the attempt.
    Finish,
    /// Ledger: renew the lease.
    Heartbeat,
}

/// What the executor answered.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecutorResult {
    /// The step ran.
    Done {
        /// Evidence to store.
        evidence: Value,
        /// What the target answered.
        target_receipt: Value,
    },
    /// The step can never succeed: the attempt fails.
    Permanent(String),
    /// The outcome is unknown or the target was unreachable: retry with the same key.
    Transient(String),
}

/// Why the driver wants to be woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeadlineReason {
    /// The lease would lapse: abandon unless renewed by then.
    LeaseExpiry,
    /// A heartbeat is due.
    Heartbeat,
    /// Retry a ledger request after a transport error.
    RetryLedger,
    /// Retry an executor call after a transient failure.
    RetryExecutor,
}

/// A deadline with its reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// When (worker clock).
    pub at: Timestamp,
    /// Why.
    pub reason: DeadlineReason,
}

/// How a delivery ended for this worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Finished: attempt SUCCEEDED, command DELIVERED.
    Delivered,
    /// Failed: attempt and command FAILED.
    Failed(String),
    /// The ledger refused a write: this worker no longer holds the command.
    Refused(Refusal),
    /// The worker gave up and leaves the lease to expire.
    Abandoned(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Begin(u32),
    Execute(u32),
    Executing(u32),
    Complete(u32, Value, Value),
    Fail(Option<u32>, String),
    Finish,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    Begin(u32),
    Complete(u32),
    CompleteAndContinue(u32),
    Fail,
    Finish,
    Heartbeat,
}

/// Delivers one claimed command. See the module docs for the calling contract.
#[derive(Debug)]
pub struct Driver {
    fused: bool,
    lease_ms: u64,
    ordinals: Vec<u32>,
    phase: Phase,
    in_flight: Option<(Request, Timestamp)>,
    renewed_at: Timestamp,
    heartbeat_due: bool,
    ledger_retry_at: Option<Timestamp>,
    ledger_backoff_ms: u64,
    executor_retry_at: Option<Timestamp>,
    executor_failures: u32,
    failing_error: Option<String>,
    outcome: Option<Outcome>,
}

impl Driver {
    /// A driver for a command just claimed at `now` (worker clock) with a lease of
    /// `lease_ms`. `receipts` are the claimed attempt's (ordinal, status) pairs: the
    /// driver starts at the first one that has not SUCCEEDED, so a `resume` takeover
    /// skips finished steps, while a `replay` takeover (whose receipts the claim
    /// reset) starts over.
    pub fn new(receipts: &[(u32, ReceiptStatus)], lease_ms: u64, now: Timestamp) -> Self {
        let mut ordinals: Vec<u32> = receipts.iter().map(|(o, _)| *o).collect();
        ordinals.sort_unstable();
        let first = receipts
            .iter()
            .filter(|(_, s)| *s != ReceiptStatus::Succeeded)
            .map(|(o, _)| *o)
            .min();
        Self {
            fused: false,
            lease_ms,
            ordinals,
            phase: first.map_or(Phase::Finish, Phase::Begin),
            in_flight: None,
            renewed_at: now,
            heartbeat_due: false,
            ledger_retry_at: None,
            ledger_backoff_ms: 0,
            executor_retry_at: None,
            executor_failures: 0,
            failing_error: None,
            outcome: None,
        }
    }

    /// A driver in fused mode, for ledgers that chain transitions: the claim has
    /// already begun the next step (so a RUNNING first step is executed at once), and
    /// each completion begins the next step or finishes the attempt in the same
    /// transaction ([`DriverAction::CompleteAndContinue`]). A one-step delivery takes
    /// two transactions, an n-step one n + 1.
    pub fn fused(receipts: &[(u32, ReceiptStatus)], lease_ms: u64, now: Timestamp) -> Self {
        let mut driver = Self::new(receipts, lease_ms, now);
        driver.fused = true;
        if let Phase::Begin(o) = driver.phase {
            if receipts.iter().any(|(x, s)| *x == o && *s == ReceiptStatus::Running) {
                driver.phase = Phase::Execute(o);
            }
        }
        driver
    }

    /// How the delivery ended, once it has.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// Whether a ledger request is awaiting its reply.
    pub fn awaiting_ledger(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The ordinal whose executor call is awaiting its result.
    pub fn executing(&self) -> Option<u32> {
        match self.phase {
            Phase::Executing(o) => Some(o),
            _ => None,
        }
    }

    /// The next action to perform, if any. `now` is when the request is sent; the
    /// lease estimate is measured from it.
    pub fn poll_action(&mut self, now: Timestamp) -> Option<DriverAction> {
        if self.outcome.is_some() || self.in_flight.is_some() || self.ledger_retry_at.is_some() {
            return None;
        }
        let phase_ready = match self.phase {
            Phase::Executing(_) => false,
            Phase::Execute(_) => self.executor_retry_at.is_none(),
            _ => true,
        };
        if phase_ready {
            let (request, action) = match &self.phase {
                Phase::Begin(o) => (Request::Begin(*o), DriverAction::BeginStep { ordinal: *o }),
                Phase::Execute(o) => {
                    let o = *o;
                    self.phase = Phase::Executing(o);
                    return Some(DriverAction::Execute { ordinal: o });
                }
                Phase::Complete(o, evidence, target_receipt) if self.fused => (
                    Request::CompleteAndContinue(*o),
                    DriverAction::CompleteAndContinue {
                        ordinal: *o,
                        evidence: evidence.clone(),
                        target_receipt: target_receipt.clone(),
                    },
                ),
                Phase::Complete(o, evidence, target_receipt) => (
                    Request::Complete(*o),
                    DriverAction::CompleteStep {
                        ordinal: *o,
                        evidence: evidence.clone(),
                        target_receipt: target_receipt.clone(),
                    },
                ),
                Phase::Fail(o, error) => (
                    Request::Fail,
                    DriverAction::Fail {
                        ordinal: *o,
                        error: error.clone(),
                    },
                ),
                Phase::Finish => (Request::Finish, DriverAction::Finish),
                Phase::Executing(_) => return None,
            };
            self.in_flight = Some((request, now));
            return Some(action);
        }
        if self.heartbeat_due {
            self.heartbeat_due = false;
            self.in_flight = Some((Request::Heartbeat, now));
            return Some(DriverAction::Heartbeat);
        }
        None
    }

    /// The next instant the driver must be woken, with the reason.
    pub fn poll_timeout(&self) -> Option<Deadline> {
        if self.outcome.is_some() {
            return None;
        }
        // A fixed array, not a Vec: the runtime asks once per wake-up.
        let heartbeat = !self.heartbeat_due && !matches!(self.in_flight, Some((Request::Heartbeat, _)));
        let deadlines = [
            Some((self.lease_expiry(), DeadlineReason::LeaseExpiry)),
            heartbeat.then(|| {
                (
                    self.renewed_at.plus_ms(heartbeat_ms(self.lease_ms)),
                    DeadlineReason::Heartbeat,
                )
            }),
            self.ledger_retry_at.map(|at| (at, DeadlineReason::RetryLedger)),
            self.executor_retry_at.map(|at| (at, DeadlineReason::RetryExecutor)),
        ];
        deadlines
            .into_iter()
            .flatten()
            .min()
            .map(|(at, reason)| Deadline { at, reason })
    }

    /// Wakes the driver at `now`: fires every timer that is due.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        if self.outcome.is_some() {
            return;
        }
        if now >= self.lease_expiry() {
            self.outcome = Some(Outcome::Abandoned(format!(
                "lease not renewed within {} ms; leaving it to expire",
                self.lease_ms
            )));
            return;
        }
        if self.ledger_retry_at.is_some_and(|at| at <= now) {
            self.ledger_retry_at = None;
        }
        if self.executor_retry_at.is_some_and(|at| at <= now) {
            self.executor_retry_at = None;
        }
        if now >= self.renewed_at.plus_ms(heartbeat_ms(self.lease_ms)) {
            self.heartbeat_due = true;
        }
    }

    /// The ledger committed the request in flight.
    pub fn handle_committed(&mut self, _now: Timestamp) {
        let Some((request, sent_at)) = self.in_flight.take() else {
            return;
        };
        self.renewed_at = self.renewed_at.max(sent_at);
        self.heartbeat_due = false;
        self.ledger_backoff_ms = 0;
        match request {
            Request::Begin(o) => {
                self.executor_failures = 0;
                self.phase = Phase::Execute(o);
            }
            Request::Complete(o) => {
                self.phase = match self.ordinals.iter().find(|x| **x > o) {
                    Some(next) => Phase::Begin(*next),
                    None => Phase::Finish,
                };
            }
            Request::CompleteAndContinue(o) => match self.ordinals.iter().find(|x| **x > o) {
                Some(next) => {
                    self.executor_failures = 0;
                    self.phase = Phase::Execute(*next);
                }
                None => self.outcome = Some(Outcome::Delivered),
            },
            Request::Fail => {
                let error = self.failing_error.take().unwrap_or_default();
                self.outcome = Some(Outcome::Failed(error));
            }
            Request::Finish => self.outcome = Some(Outcome::Delivered),
            Request::Heartbeat => {}
        }
    }

    /// The ledger refused the request in flight: stop at once.
    pub fn handle_refused(&mut self, _now: Timestamp, refusal: Refusal) {
        self.in_flight = None;
        self.outcome = Some(Outcome::Refused(refusal));
    }

    /// The request in flight failed in transport (ledger unreachable, or the reply
    /// was lost): retry it after a backoff, until the lease would lapse.
    pub fn handle_ledger_error(&mut self, now: Timestamp) {
        let Some((request, _)) = self.in_flight.take() else {
            return;
        };
        if request == Request::Heartbeat {
            self.heartbeat_due = true;
        }
        let cap = heartbeat_ms(self.lease_ms).max(1);
        self.ledger_backoff_ms = (self.ledger_backoff_ms.max(cap / 16).max(1) * 2).min(cap);
        self.ledger_retry_at = Some(now.plus_ms(self.ledger_backoff_ms));
    }

    /// The executor answered for `ordinal`.
    pub fn handle_executed(&mut self, now: Timestamp, ordinal: u32, result: ExecutorResult) {
        if self.outcome.is_some() || self.phase != Phase::Executing(ordinal) {
            return;
        }
        match result {
            ExecutorResult::Done {
                evidence,
                target_receipt,
            } => {
                self.phase = Phase::Complete(ordinal, evidence, target_receipt);
            }
            ExecutorResult::Permanent(error) => {
                let error = format!("step {ordinal}: {error}");
                self.failing_error = Some(error.clone());
                self.phase = Phase::Fail(Some(ordinal), error);
            }
            ExecutorResult::Transient(error) => {
                self.executor_failures += 1;
                if self.executor_failures >= EXECUTOR_ATTEMPTS_MAX {
                    self.outcome = Some(Outcome::Abandoned(format!(
                        "step {ordinal}: executor failed {} times ({error}); leaving the lease to expire",
                        self.executor_failures
                    )));
                } else {
                    let backoff = (heartbeat_ms(self.lease_ms) / 4).max(1) << (self.executor_failures - 1);
                    self.executor_retry_at = Some(now.plus_ms(backoff));
                    self.phase = Phase::Execute(ordinal);
                }
            }
        }
    }

    fn lease_expiry(&self) -> Timestamp {
        self.renewed_at.plus_ms(self.lease_ms)
    }
}
