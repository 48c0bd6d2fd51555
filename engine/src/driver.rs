//! The worker driver: a sans-IO state machine that delivers one claimed command. It
//! owns every delivery rule; the runtime around it only performs its actions and
//! reports how they ended.
//!
//! # Contract
//! Create a [`Driver`] with [`Driver::fused`] from the attempt as the claim left it,
//! then loop:
//! 1. drain [`Driver::poll_action`] and perform each action: send a
//!    [`WorkerRequest`] as it is ([`DriverAction::Ledger`]) or read the attempt back
//!    ([`DriverAction::ReadAttempt`]) (at most one ledger call is in flight at a
//!    time), or call the executor ([`DriverAction::Execute`], at most one at a time,
//!    outside every transaction);
//! 2. report how each ledger call ended: the ledger's own [`Reply`] with
//!    [`Driver::handle_reply`], the attempt it read with [`Driver::handle_read`], or
//!    its error classified as a [`Failure`] with [`Driver::handle_failure`] (the
//!    runtime's one mapping); and each executor answer with
//!    [`Driver::handle_executed`], always with the current time of the worker's clock;
//! 3. when nothing is ready, wait until [`Driver::poll_timeout`] and call
//!    [`Driver::handle_timeout`];
//!
//! until [`Driver::outcome`] is `Some`. The driver never holds a transaction: the
//! executor is called between two ledger requests.
//!
//! # Delivery rules
//! - **Fused steps.** The claim begins the first unfinished step in its own
//!   transaction, so a RUNNING step is executed at once (a step the claim left
//!   PENDING is begun first; a claim whose steps all SUCCEEDED is finished). Each
//!   completion is a [`WorkerRequest::CompleteAndContinue`], and the ledger's
//!   [`Reply::Continued`] answer decides what follows: [`Continued::Began`] executes that
//!   step, [`Continued::Finished`] ends the delivery DELIVERED. A one-step delivery
//!   takes two transactions, an n-step one n + 1.
//! - **Replies.** A request is applied when the ledger answers the reply
//!   [`crate::request::decide`] gives it ([`WorkerOp::answered_by`]): renewed for a
//!   heartbeat, continued for a completion, applied for the others. Any other reply
//!   (a completion answered without its continuation) is taken for an uncertain one.
//! - **Refusals** ([`Failure::Refused`]) stop the driver at once: the worker no longer
//!   holds the command. [`Failure::NotFound`] (the command or attempt is gone) is the
//!   same: a [`Refusal::StaleToken`].
//! - **Transport failures.** [`Failure::Unavailable`] (nothing was written) and
//!   [`Failure::Ambiguous`] (it may have been) both send the same request again after
//!   a backoff; every worker transition is idempotent under the same lease, so a
//!   repeat of an applied begin, completion or heartbeat only renews. Writes that end
//!   the attempt (finish, fail, the last completion) are not: once one was ambiguous,
//!   a refusal of its repeat is disambiguated by reading the attempt back
//!   ([`DriverAction::ReadAttempt`]). If the attempt ended as that write ends it,
//!   under this lease (same owner, same delivery count), the first try committed and
//!   only its reply was lost; otherwise the refusal stands.
//! - **Heartbeats** are due every lease/3 after the last renewal (begin and complete
//!   renew the lease too) and are sent only when no other request is in flight or
//!   waiting to be retried; a read renews nothing.
//! - **The lease estimate** runs from when the last renewing request was sent, by the
//!   worker's own clock. Once it has lapsed the driver abandons the command and leaves
//!   the lease to expire, whichever input comes first: it is checked on every
//!   [`Driver::poll_action`] and [`Driver::handle_timeout`], so a worker that resumes
//!   past its lease (paused, suspended) sends nothing more, whatever order the
//!   runtime reports its wake-ups in.
//! - **Executor answers.** A permanent failure fails the attempt; a transient one is
//!   retried with a growing backoff, the step's `step_max_tries` calls per delivery
//!   at most ([`Driver::with_policy`]; [`EXECUTOR_ATTEMPTS_MAX`] by default), and then
//!   the command is given back ([`WorkerRequest::GiveBack`]) with the policy's
//!   jittered backoff; a throttled answer (`Retry-After`) gives it back at once,
//!   after at least what the target asked. The ledger answers the give-back with
//!   the command's next `available_at`, or ends the attempt exhausted. An answer
//!   for a step that is not being executed (late, after a refusal) is dropped.
//! - **The evidence cap.** Whatever the executor, a step whose evidence and target
//!   receipt take more than the cap together (canonical JSON bytes; default
//!   [`MAX_EVIDENCE_BYTES`], set with [`Driver::with_max_evidence_bytes`]) fails the
//!   attempt permanently, with a message naming the size and the limit; nothing of
//!   it is written.

use crate::canonical::canonical_json;
use crate::ids::{CommandId, Timestamp};
use crate::lease::heartbeat_ms;
use crate::lease::MAX_EVIDENCE_BYTES;
use crate::model::{AttemptRecord, CommandStatus, Plan, ReceiptStatus};
use crate::policy::{Exhaustion, RetryPolicy};
use crate::request::{Failure, Reply, WorkerOp, WorkerRequest};
use crate::transition::{Continued, Refusal};
use serde_json::Value;

/// Calls of one step per delivery when the plan sets no `step_max_tries`
/// ([`crate::policy`]).
pub const EXECUTOR_ATTEMPTS_MAX: u32 = crate::policy::STEP_MAX_TRIES_DEFAULT;

/// Something the runtime must do for the driver.
#[derive(Debug, Clone, PartialEq)]
pub enum DriverAction {
    /// Call the step's executor (outside every transaction) and report its answer
    /// with [`Driver::handle_executed`].
    Execute {
        /// The receipt's ordinal.
        ordinal: u32,
    },
    /// Send this request to the ledger, as it is, under the claimed lease, and report
    /// its [`Reply`] with [`Driver::handle_reply`] (or its error with
    /// [`Driver::handle_failure`]).
    Ledger(WorkerRequest),
    /// Read the attempt with its command and receipts, and report it with
    /// [`Driver::handle_read`] (or the error with [`Driver::handle_failure`]): whether
    /// an ending write whose reply was lost had committed.
    ReadAttempt,
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
    /// The target asked to be called again no sooner than `retry_after_ms` from now
    /// (an HTTP `Retry-After`): the command is given back at once, claimable again
    /// after at least that long (at most the policy's `backoff_max_ms`).
    Throttled {
        /// What the target answered.
        error: String,
        /// How long the target asked to wait.
        retry_after_ms: u64,
    },
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
    /// A step failed transiently past its tries: the command was given back,
    /// claimable again from `until` (ledger clock).
    GaveBack {
        /// Its new `available_at`.
        until: Timestamp,
        /// Why.
        error: String,
    },
    /// The policy allowed no further delivery: the attempt ended FAILED, exhausted.
    Exhausted {
        /// The cap or the deadline.
        why: Exhaustion,
        /// The last step error.
        error: String,
    },
    /// The worker gave up and leaves the lease to expire.
    Abandoned(String),
    /// The next step's target admitted no more leases: the command was handed back,
    /// claimable again from `until` (ledger clock), without spending a delivery.
    Yielded {
        /// Its new `available_at`.
        until: Timestamp,
    },
}

/// What an ending write ends the attempt (or the delivery) with: what a read-back
/// after a lost reply looks for.
#[derive(Debug, Clone, PartialEq)]
enum Ending {
    Delivered,
    Failed(String),
    GaveBack(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Begin(u32),
    Execute(u32),
    Executing(u32),
    Complete(u32, Value, Value),
    Fail(Option<u32>, String),
    Finish,
    /// Give the command back after `error`, claimable again after `delay_ms`.
    GiveBack(String, u64),
    /// A repeated ending write was refused after an uncertain reply: read the
    /// attempt back for what that write would have left.
    Verify {
        refusal: Refusal,
        ending: Ending,
    },
}

/// Delivers one claimed command. See the module docs for the calling contract and
/// the delivery rules.
#[derive(Debug, Clone)]
pub struct Driver {
    lease_ms: u64,
    /// Every step's ordinal and code, in ordinal order.
    steps: Vec<(u32, String)>,
    max_evidence_bytes: usize,
    command: CommandId,
    owner: Option<String>,
    delivery: u32,
    phase: Phase,
    /// The ledger call in flight (`None`: the read-back) and when it was sent.
    in_flight: Option<(Option<WorkerOp>, Timestamp)>,
    /// Whether the phase's request got an uncertain reply and may have committed.
    uncertain: bool,
    renewed_at: Timestamp,
    heartbeat_due: bool,
    ledger_retry_at: Option<Timestamp>,
    ledger_backoff_ms: u64,
    executor_retry_at: Option<Timestamp>,
    executor_failures: u32,
    /// Each step's delivery policy, by ordinal (the default for a step not listed).
    policies: Vec<(u32, RetryPolicy)>,
    /// Picks the point in a give-back's backoff window (full jitter).
    jitter: u64,
    outcome: Option<Outcome>,
}

impl Driver {
    /// A driver for `claimed`, the attempt as the claim (a claim-and-begin) left it,
    /// claimed at `now` (worker clock: when the claim was sent) with a lease of
    /// `lease_ms`. It starts at the first receipt that has not SUCCEEDED: executing it
    /// if the claim began it, beginning it otherwise. So a `resume` takeover skips
    /// finished steps, while a `replay` takeover (whose receipts the claim reset)
    /// starts over. The claim's owner and delivery count identify this lease when a
    /// lost reply is disambiguated.
    pub fn fused(claimed: &AttemptRecord, lease_ms: u64, now: Timestamp) -> Self {
        let mut steps: Vec<(u32, String)> = claimed
            .receipts
            .iter()
            .map(|r| (r.ordinal, r.step_code.clone()))
            .collect();
        steps.sort_unstable();
        let first = claimed
            .receipts
            .iter()
            .filter(|r| r.status != ReceiptStatus::Succeeded)
            .min_by_key(|r| r.ordinal);
        let phase = match first {
            None => Phase::Finish,
            Some(r) if r.status == ReceiptStatus::Running => Phase::Execute(r.ordinal),
            Some(r) => Phase::Begin(r.ordinal),
        };
        Self {
            lease_ms,
            steps,
            max_evidence_bytes: MAX_EVIDENCE_BYTES,
            command: claimed.command.id.clone(),
            owner: claimed.command.lease_owner.clone(),
            delivery: claimed.command.delivery_count,
            phase,
            in_flight: None,
            uncertain: false,
            renewed_at: now,
            heartbeat_due: false,
            ledger_retry_at: None,
            ledger_backoff_ms: 0,
            executor_retry_at: None,
            executor_failures: 0,
            policies: Vec::new(),
            jitter: 0,
            outcome: None,
        }
    }

    /// The same driver ruled by `plan`'s delivery policy (each step's tries, the
    /// give-back's backoff), `jitter` (from the runtime's entropy) picking the
    /// point in each backoff window. Without it every step has the default policy
    /// and no jitter.
    #[must_use]
    pub fn with_policy(mut self, plan: &Plan, jitter: u64) -> Self {
        self.policies = self
            .steps
            .iter()
            .map(|(ordinal, code)| (*ordinal, plan.policy(code)))
            .collect();
        self.jitter = jitter;
        self
    }

    fn policy(&self, ordinal: u32) -> RetryPolicy {
        self.policies
            .iter()
            .find(|(o, _)| *o == ordinal)
            .map(|(_, p)| *p)
            .unwrap_or_default()
    }

    /// The same driver with its evidence cap set to `bytes` (see the module docs);
    /// the worker passes its configured cap.
    #[must_use]
    pub fn with_max_evidence_bytes(mut self, bytes: usize) -> Self {
        self.max_evidence_bytes = bytes;
        self
    }

    /// How the delivery ended, once it has.
    #[must_use]
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// Whether a ledger request is awaiting its reply.
    #[must_use]
    pub fn awaiting_ledger(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The ordinal whose executor call is awaiting its result.
    #[must_use]
    pub fn executing(&self) -> Option<u32> {
        match self.phase {
            Phase::Executing(o) => Some(o),
            _ => None,
        }
    }

    /// The next action to perform, if any. `now` is when the request is sent; the
    /// lease estimate is measured from it. Once the lease estimate has lapsed this
    /// answers `None` and the driver has abandoned the command.
    #[must_use]
    pub fn poll_action(&mut self, now: Timestamp) -> Option<DriverAction> {
        if self.outcome.is_some() || self.abandon_if_lapsed(now) {
            return None;
        }
        if self.in_flight.is_some() || self.ledger_retry_at.is_some() {
            return None;
        }
        match self.phase {
            Phase::Execute(o) if self.executor_retry_at.is_none() => {
                self.phase = Phase::Executing(o);
                return Some(DriverAction::Execute { ordinal: o });
            }
            Phase::Verify { .. } => {
                self.in_flight = Some((None, now));
                return Some(DriverAction::ReadAttempt);
            }
            _ => {}
        }
        let request = match self.phase_request() {
            Some(request) => request,
            // Only the executor is busy (or waiting to be retried): renew if due.
            None if self.heartbeat_due => {
                self.heartbeat_due = false;
                WorkerRequest::Heartbeat {
                    lease_ms: self.lease_ms,
                }
            }
            None => return None,
        };
        self.in_flight = Some((Some(request.kind()), now));
        Some(DriverAction::Ledger(request))
    }

    /// The write the phase asks for, if it asks for one.
    fn phase_request(&self) -> Option<WorkerRequest> {
        let lease_ms = self.lease_ms;
        Some(match &self.phase {
            Phase::Begin(o) => WorkerRequest::BeginStep { ordinal: *o, lease_ms },
            Phase::Complete(o, evidence, target_receipt) => WorkerRequest::CompleteAndContinue {
                ordinal: *o,
                evidence: evidence.clone(),
                target_receipt: target_receipt.clone(),
                lease_ms,
            },
            Phase::Fail(o, error) => WorkerRequest::Fail {
                ordinal: *o,
                error: error.clone(),
            },
            Phase::Finish => WorkerRequest::Finish,
            Phase::GiveBack(error, delay_ms) => WorkerRequest::GiveBack {
                error: error.clone(),
                delay_ms: *delay_ms,
            },
            Phase::Execute(_) | Phase::Executing(_) | Phase::Verify { .. } => return None,
        })
    }

    /// The next instant the driver must be woken, with the reason.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Deadline> {
        if self.outcome.is_some() {
            return None;
        }
        // A fixed array, not a Vec: the runtime asks once per wake-up.
        let heartbeat = !self.heartbeat_due && !matches!(self.in_flight, Some((Some(WorkerOp::Heartbeat), _)));
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
        if self.outcome.is_some() || self.abandon_if_lapsed(now) {
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

    /// The worker request in flight was applied and the ledger answered `reply`.
    pub fn handle_reply(&mut self, now: Timestamp, reply: Reply) {
        let Some((sent, sent_at)) = self.take_in_flight() else {
            return;
        };
        match sent {
            Some(op) if op.answered_by(&reply) => self.committed(op, sent_at, reply),
            // Not the reply the request is answered with (a completion without its
            // continuation): it tells nothing of what the request did.
            Some(op) => self.failed(Some(op), Failure::Ambiguous, now),
            // A read answered as a write tells nothing: read again.
            None => self.retry_later(None, now),
        }
    }

    /// The read-back in flight answered the attempt as `record` holds it.
    pub fn handle_read(&mut self, now: Timestamp, record: &AttemptRecord) {
        let Some((sent, _)) = self.take_in_flight() else {
            return;
        };
        match sent {
            None => self.verify(record),
            // A write answered with a record tells nothing: send it again.
            Some(op) => self.retry_later(Some(op), now),
        }
    }

    /// The ledger call in flight (a write or the read-back) got no answer: `failure`.
    pub fn handle_failure(&mut self, now: Timestamp, failure: Failure) {
        if let Some((sent, _)) = self.take_in_flight() {
            self.failed(sent, failure, now);
        }
    }

    /// The call in flight, taken from it; `None` if none was, or the delivery has
    /// ended.
    fn take_in_flight(&mut self) -> Option<(Option<WorkerOp>, Timestamp)> {
        let in_flight = self.in_flight.take()?;
        self.outcome.is_none().then_some(in_flight)
    }

    fn failed(&mut self, sent: Option<WorkerOp>, failure: Failure, now: Timestamp) {
        match failure {
            Failure::Ambiguous => {
                if sent.is_some_and(|op| op != WorkerOp::Heartbeat) {
                    self.uncertain = true;
                }
                self.retry_later(sent, now);
            }
            Failure::Unavailable => self.retry_later(sent, now),
            Failure::Refused(refusal) => self.refused(sent, refusal),
            Failure::NotFound => {
                let stale = Refusal::StaleToken {
                    command: self.command.clone(),
                };
                self.refused(sent, stale);
            }
        }
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
                self.phase = match self.over_evidence_cap(ordinal, &evidence, &target_receipt) {
                    Some(error) => Phase::Fail(Some(ordinal), format!("step {ordinal}: {error}")),
                    None => Phase::Complete(ordinal, evidence, target_receipt),
                };
            }
            ExecutorResult::Permanent(error) => {
                self.phase = Phase::Fail(Some(ordinal), format!("step {ordinal}: {error}"));
            }
            ExecutorResult::Transient(error) => self.transient(now, ordinal, error),
            ExecutorResult::Throttled { error, retry_after_ms } => {
                let delay = self
                    .policy(ordinal)
                    .backoff_ms(self.delivery, self.jitter, Some(retry_after_ms));
                self.phase = Phase::GiveBack(format!("step {ordinal}: {error}"), delay);
            }
        }
    }

    /// A transient failure of step `ordinal`: call it again after a growing backoff
    /// while its tries last, then give the command back.
    fn transient(&mut self, now: Timestamp, ordinal: u32, error: String) {
        self.executor_failures += 1;
        let policy = self.policy(ordinal);
        if self.executor_failures >= policy.step_max_tries {
            let delay = policy.backoff_ms(self.delivery, self.jitter, None);
            let tries = self.executor_failures;
            let error = format!(
                "step {ordinal}: {error} ({tries} {})",
                if tries == 1 { "try" } else { "tries" }
            );
            self.phase = Phase::GiveBack(error, delay);
        } else {
            let backoff = (heartbeat_ms(self.lease_ms) / 4).max(1) << (self.executor_failures - 1).min(20);
            self.executor_retry_at = Some(now.plus_ms(backoff));
            self.phase = Phase::Execute(ordinal);
        }
    }

    /// Why the evidence and target receipt of step `ordinal` may not be stored, if
    /// together they take more than the cap.
    fn over_evidence_cap(&self, ordinal: u32, evidence: &Value, target_receipt: &Value) -> Option<String> {
        let bytes = canonical_json(evidence).len() + canonical_json(target_receipt).len();
        if bytes <= self.max_evidence_bytes {
            return None;
        }
        let code = self
            .steps
            .iter()
            .find(|(o, _)| *o == ordinal)
            .map_or("", |(_, code)| code.as_str());
        Some(format!(
            "step {code}: evidence (with its target receipt) is {} bytes, over the limit of {} bytes \
             (the worker's --max-evidence-bytes)",
            grouped(bytes),
            grouped(self.max_evidence_bytes)
        ))
    }

    fn committed(&mut self, op: WorkerOp, sent_at: Timestamp, reply: Reply) {
        self.renewed_at = self.renewed_at.max(sent_at);
        self.heartbeat_due = false;
        self.ledger_backoff_ms = 0;
        if op != WorkerOp::Heartbeat {
            self.uncertain = false;
        }
        match (op, reply) {
            (WorkerOp::BeginStep(o), _) => {
                self.executor_failures = 0;
                self.phase = Phase::Execute(o);
            }
            (WorkerOp::CompleteAndContinue(o), Reply::Continued(continued)) => self.continued(o, continued),
            (WorkerOp::Fail(_), _) => self.outcome = Some(Outcome::Failed(self.failing_error())),
            (WorkerOp::Finish, _) => self.outcome = Some(Outcome::Delivered),
            (WorkerOp::GiveBack, Reply::GaveBack { until }) => {
                let error = self.failing_error();
                self.outcome = Some(Outcome::GaveBack { until, error });
            }
            (WorkerOp::GiveBack, Reply::Exhausted(why)) => {
                let error = self.failing_error();
                self.outcome = Some(Outcome::Exhausted { why, error });
            }
            // A heartbeat only renews; the driver sends no other write.
            _ => {}
        }
    }

    /// Step `o`'s completion committed and the ledger did `continued` after it.
    fn continued(&mut self, o: u32, continued: Continued) {
        match continued {
            Continued::Began(next) if next > o && self.steps.iter().any(|(s, _)| *s == next) => {
                self.executor_failures = 0;
                self.phase = Phase::Execute(next);
            }
            Continued::Began(next) => {
                self.outcome = Some(Outcome::Abandoned(format!(
                    "the ledger began step {next} after completing step {o}, which is not a later step of this \
                     attempt; leaving the lease to expire"
                )));
            }
            Continued::Finished => self.outcome = Some(Outcome::Delivered),
            Continued::Yielded(until) => self.outcome = Some(Outcome::Yielded { until }),
        }
    }

    fn refused(&mut self, sent: Option<WorkerOp>, refusal: Refusal) {
        if self.uncertain && sent.is_some_and(|op| self.ends(op)) {
            let ending = match sent {
                Some(WorkerOp::Fail(_)) => Ending::Failed(self.failing_error()),
                Some(WorkerOp::GiveBack) => Ending::GaveBack(self.failing_error()),
                _ => Ending::Delivered,
            };
            self.phase = Phase::Verify { refusal, ending };
            return;
        }
        self.outcome = Some(Outcome::Refused(refusal));
    }

    /// After a refused repeat of an ending write: whether the first try had ended the
    /// attempt (or, for a give-back, the delivery) under this very lease.
    fn verify(&mut self, record: &AttemptRecord) {
        let Phase::Verify { refusal, ending } = &self.phase else {
            return;
        };
        let c = &record.command;
        let ours = c.lease_owner == self.owner && c.delivery_count == self.delivery;
        let exhausted = || Exhaustion::of(&record.attempt);
        let outcome = match (ending, c.status) {
            _ if !ours => None,
            (Ending::Delivered, CommandStatus::Delivered) => Some(Outcome::Delivered),
            (Ending::Failed(error), CommandStatus::Failed) => Some(Outcome::Failed(error.clone())),
            (Ending::GaveBack(error), CommandStatus::Pending) => Some(Outcome::GaveBack {
                until: c.available_at,
                error: error.clone(),
            }),
            (Ending::GaveBack(error), CommandStatus::Failed) => exhausted().map(|why| Outcome::Exhausted {
                why,
                error: error.clone(),
            }),
            _ => None,
        };
        self.outcome = Some(outcome.unwrap_or_else(|| Outcome::Refused(refusal.clone())));
    }

    /// Whether `request`, once committed, ends the attempt: a finish, a fail, or the
    /// last step's completion (the write a worker may claim its next command with).
    #[must_use]
    pub fn ends_attempt(&self, request: &WorkerRequest) -> bool {
        self.ends(request.kind())
    }

    fn ends(&self, op: WorkerOp) -> bool {
        match op {
            WorkerOp::Fail(_) | WorkerOp::Finish | WorkerOp::GiveBack => true,
            WorkerOp::CompleteAndContinue(o) => self.steps.last().is_some_and(|(last, _)| *last <= o),
            WorkerOp::BeginStep(_) | WorkerOp::CompleteStep(_) | WorkerOp::Heartbeat => false,
        }
    }

    fn failing_error(&self) -> String {
        match &self.phase {
            Phase::Fail(_, error) | Phase::GiveBack(error, _) => error.clone(),
            _ => String::new(),
        }
    }

    fn retry_later(&mut self, sent: Option<WorkerOp>, now: Timestamp) {
        if sent == Some(WorkerOp::Heartbeat) {
            self.heartbeat_due = true;
        }
        let cap = heartbeat_ms(self.lease_ms).max(1);
        self.ledger_backoff_ms = (self.ledger_backoff_ms.max(cap / 16).max(1) * 2).min(cap);
        self.ledger_retry_at = Some(now.plus_ms(self.ledger_backoff_ms));
    }

    fn abandon_if_lapsed(&mut self, now: Timestamp) -> bool {
        if now < self.lease_expiry() {
            return false;
        }
        self.outcome = Some(Outcome::Abandoned(format!(
            "lease not renewed within {} ms; leaving it to expire",
            self.lease_ms
        )));
        true
    }

    fn lease_expiry(&self) -> Timestamp {
        self.renewed_at.plus_ms(self.lease_ms)
    }
}

/// `n` with a comma between each group of three digits: `6,260,112`.
fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}
