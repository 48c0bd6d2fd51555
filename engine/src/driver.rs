//! The worker driver: a sans-IO state machine that delivers one claimed command. It
//! owns every delivery rule; the runtime around it only performs its actions and
//! reports how they ended.
//!
//! # Contract
//! Create a [`Driver`] with [`Driver::fused`] from the attempt as the claim left it,
//! then loop:
//! 1. drain [`Driver::poll_action`] and perform each action: a [`LedgerRequest`] (at
//!    most one is in flight at a time) or an executor call ([`DriverAction::Execute`],
//!    at most one at a time, outside every transaction);
//! 2. report how each ledger request ended with [`Driver::handle_reply`] (map the
//!    ledger's answer to a [`Reply`] and nothing more) and each executor answer with
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
//!   completion is a [`LedgerRequest::CompleteAndContinue`], and the ledger's
//!   [`Continued`] answer decides what follows: [`Continued::Began`] executes that
//!   step, [`Continued::Finished`] ends the delivery DELIVERED. A one-step delivery
//!   takes two transactions, an n-step one n + 1.
//! - **Refusals** ([`Reply::Refused`]) stop the driver at once: the worker no longer
//!   holds the command. [`Reply::NotFound`] (the command or attempt is gone) is the
//!   same: a [`Refusal::StaleToken`].
//! - **Transport failures.** [`Reply::Unavailable`] (nothing was written) and
//!   [`Reply::Ambiguous`] (it may have been) both send the same request again after a
//!   backoff; every worker transition is idempotent under the same lease, so a repeat
//!   of an applied begin, completion or heartbeat only renews. Writes that end the
//!   attempt (finish, fail, the last completion) are not: once one was ambiguous, a
//!   refusal of its repeat is disambiguated by reading the attempt back
//!   ([`LedgerRequest::ReadAttempt`]). If the attempt ended as that write ends it,
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
//!   retried with a growing backoff, [`EXECUTOR_ATTEMPTS_MAX`] calls per step at most,
//!   and then the command is abandoned. An answer for a step that is not being
//!   executed (late, after a refusal) is dropped.
//! - **The evidence cap.** Whatever the executor, a step whose evidence and target
//!   receipt take more than the cap together (canonical JSON bytes; default
//!   [`MAX_EVIDENCE_BYTES`], set with [`Driver::with_max_evidence_bytes`]) fails the
//!   attempt permanently, with a message naming the size and the limit; nothing of
//!   it is written.

use crate::canonical::canonical_json;
use crate::ids::{CommandId, Timestamp};
use crate::lease::heartbeat_ms;
use crate::lease::MAX_EVIDENCE_BYTES;
use crate::model::{AttemptRecord, CommandStatus, ReceiptStatus};
use crate::transition::{Continued, Refusal};
use serde_json::Value;

/// Transient executor failures tolerated per step before the driver gives up.
pub const EXECUTOR_ATTEMPTS_MAX: u32 = 3;

/// Something the runtime must do for the driver.
#[derive(Debug, Clone, PartialEq)]
pub enum DriverAction {
    /// Call the step's executor (outside every transaction) and report its answer
    /// with [`Driver::handle_executed`].
    Execute {
        /// The receipt's ordinal.
        ordinal: u32,
    },
    /// Send this request to the ledger and report how it ended with
    /// [`Driver::handle_reply`].
    Ledger(LedgerRequest),
}

/// A ledger request the driver asks for, under the claimed lease.
#[derive(Debug, Clone, PartialEq)]
pub enum LedgerRequest {
    /// Begin the step at this ordinal (answered [`Reply::Committed`]).
    BeginStep {
        /// The receipt's ordinal.
        ordinal: u32,
    },
    /// Complete the step with its evidence and, in the same transaction, begin the
    /// next one or finish the attempt after the last (answered
    /// [`Reply::Continued`]).
    CompleteAndContinue {
        /// The receipt's ordinal.
        ordinal: u32,
        /// The executor's evidence.
        evidence: Value,
        /// What the target answered.
        target_receipt: Value,
    },
    /// Fail the attempt (answered [`Reply::Committed`]).
    Fail {
        /// The failing step, if one.
        ordinal: Option<u32>,
        /// Why.
        error: String,
    },
    /// Finish the attempt (answered [`Reply::Committed`]).
    Finish,
    /// Renew the lease (answered [`Reply::Committed`]).
    Heartbeat,
    /// Read the attempt with its command and receipts (answered [`Reply::Read`]), to
    /// learn whether an ending write whose reply was lost had committed.
    ReadAttempt,
}

/// How a ledger request ended: the ledger's answer, unjudged.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The write committed. A complete-and-continue is answered with
    /// [`Reply::Continued`] instead: `Committed` says nothing of what followed, so
    /// the driver takes it for an uncertain reply.
    Committed,
    /// A complete-and-continue committed; what the ledger did after the completion.
    Continued(Continued),
    /// The attempt as read back for [`LedgerRequest::ReadAttempt`].
    Read(Box<AttemptRecord>),
    /// The ledger refused the write; nothing was written.
    Refused(Refusal),
    /// The ledger has no such command or attempt.
    NotFound,
    /// The ledger could not be reached or was busy; nothing was written.
    Unavailable,
    /// The request may or may not have been applied (the reply was lost).
    Ambiguous,
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
    /// A repeated ending write was refused after an uncertain reply: read the
    /// attempt back. `failed` is the error a fail would have ended it with.
    Verify {
        refusal: Refusal,
        failed: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Begin(u32),
    CompleteAndContinue(u32),
    Fail,
    Finish,
    Heartbeat,
    Read,
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
    in_flight: Option<(Sent, Timestamp)>,
    /// Whether the phase's request got an uncertain reply and may have committed.
    uncertain: bool,
    renewed_at: Timestamp,
    heartbeat_due: bool,
    ledger_retry_at: Option<Timestamp>,
    ledger_backoff_ms: u64,
    executor_retry_at: Option<Timestamp>,
    executor_failures: u32,
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
            outcome: None,
        }
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
        let next = match &self.phase {
            Phase::Executing(_) => None,
            Phase::Execute(o) => {
                let o = *o;
                if self.executor_retry_at.is_none() {
                    self.phase = Phase::Executing(o);
                    return Some(DriverAction::Execute { ordinal: o });
                }
                None
            }
            Phase::Begin(o) => Some((Sent::Begin(*o), LedgerRequest::BeginStep { ordinal: *o })),
            Phase::Complete(o, evidence, target_receipt) => Some((
                Sent::CompleteAndContinue(*o),
                LedgerRequest::CompleteAndContinue {
                    ordinal: *o,
                    evidence: evidence.clone(),
                    target_receipt: target_receipt.clone(),
                },
            )),
            Phase::Fail(o, error) => Some((
                Sent::Fail,
                LedgerRequest::Fail {
                    ordinal: *o,
                    error: error.clone(),
                },
            )),
            Phase::Finish => Some((Sent::Finish, LedgerRequest::Finish)),
            Phase::Verify { .. } => Some((Sent::Read, LedgerRequest::ReadAttempt)),
        };
        let (sent, request) = match next {
            Some(next) => next,
            // Only the executor is busy (or waiting to be retried): renew if due.
            None if self.heartbeat_due => {
                self.heartbeat_due = false;
                (Sent::Heartbeat, LedgerRequest::Heartbeat)
            }
            None => return None,
        };
        self.in_flight = Some((sent, now));
        Some(DriverAction::Ledger(request))
    }

    /// The next instant the driver must be woken, with the reason.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Deadline> {
        if self.outcome.is_some() {
            return None;
        }
        // A fixed array, not a Vec: the runtime asks once per wake-up.
        let heartbeat = !self.heartbeat_due && !matches!(self.in_flight, Some((Sent::Heartbeat, _)));
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

    /// The ledger request in flight ended with `reply`.
    pub fn handle_reply(&mut self, now: Timestamp, reply: Reply) {
        let Some((sent, sent_at)) = self.in_flight.take() else {
            return;
        };
        if self.outcome.is_some() {
            return;
        }
        match (sent, reply) {
            (Sent::Read, Reply::Read(record)) => self.verify(&record),
            (Sent::CompleteAndContinue(_), Reply::Committed) | (_, Reply::Ambiguous) => {
                if !matches!(sent, Sent::Heartbeat | Sent::Read) {
                    self.uncertain = true;
                }
                self.retry_later(sent, now);
            }
            // A read answered with anything but the record tells nothing: read again.
            (Sent::Read, Reply::Committed | Reply::Continued(_)) | (_, Reply::Unavailable) => {
                self.retry_later(sent, now)
            }
            (_, Reply::Read(_)) => self.retry_later(sent, now),
            (_, Reply::Committed) => self.committed(sent, sent_at, None),
            (_, Reply::Continued(continued)) => self.committed(sent, sent_at, Some(continued)),
            (_, Reply::Refused(refusal)) => self.refused(sent, refusal),
            (_, Reply::NotFound) => {
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

    fn committed(&mut self, sent: Sent, sent_at: Timestamp, continued: Option<Continued>) {
        self.renewed_at = self.renewed_at.max(sent_at);
        self.heartbeat_due = false;
        self.ledger_backoff_ms = 0;
        if sent != Sent::Heartbeat {
            self.uncertain = false;
        }
        match sent {
            Sent::Begin(o) => {
                self.executor_failures = 0;
                self.phase = Phase::Execute(o);
            }
            Sent::CompleteAndContinue(o) => match continued {
                Some(Continued::Began(next)) if next > o && self.steps.iter().any(|(s, _)| *s == next) => {
                    self.executor_failures = 0;
                    self.phase = Phase::Execute(next);
                }
                Some(Continued::Began(next)) => {
                    self.outcome = Some(Outcome::Abandoned(format!(
                        "the ledger began step {next} after completing step {o}, which is not a later step of this \
                         attempt; leaving the lease to expire"
                    )));
                }
                Some(Continued::Finished) => self.outcome = Some(Outcome::Delivered),
                // Not reached: `handle_reply` takes a bare commit of a completion for
                // an uncertain reply.
                None => self.uncertain = true,
            },
            Sent::Fail => self.outcome = Some(Outcome::Failed(self.failing_error())),
            Sent::Finish => self.outcome = Some(Outcome::Delivered),
            Sent::Heartbeat | Sent::Read => {}
        }
    }

    fn refused(&mut self, sent: Sent, refusal: Refusal) {
        if self.uncertain && self.ends(sent) {
            let failed = (sent == Sent::Fail).then(|| self.failing_error());
            self.phase = Phase::Verify { refusal, failed };
            return;
        }
        self.outcome = Some(Outcome::Refused(refusal));
    }

    /// After a refused repeat of an ending write: whether the first try had ended the
    /// attempt under this very lease.
    fn verify(&mut self, record: &AttemptRecord) {
        let Phase::Verify { refusal, failed } = &self.phase else {
            return;
        };
        let expected = match failed {
            Some(_) => CommandStatus::Failed,
            None => CommandStatus::Delivered,
        };
        let c = &record.command;
        let ours = c.status == expected && c.lease_owner == self.owner && c.delivery_count == self.delivery;
        self.outcome = Some(match (ours, failed) {
            (true, Some(error)) => Outcome::Failed(error.clone()),
            (true, None) => Outcome::Delivered,
            (false, _) => Outcome::Refused(refusal.clone()),
        });
    }

    /// Whether `request`, once committed, ends the attempt: a finish, a fail, or the
    /// last step's completion (the write a worker may claim its next command with).
    #[must_use]
    pub fn ends_attempt(&self, request: &LedgerRequest) -> bool {
        let sent = match request {
            LedgerRequest::BeginStep { ordinal } => Sent::Begin(*ordinal),
            LedgerRequest::CompleteAndContinue { ordinal, .. } => Sent::CompleteAndContinue(*ordinal),
            LedgerRequest::Fail { .. } => Sent::Fail,
            LedgerRequest::Finish => Sent::Finish,
            LedgerRequest::Heartbeat => Sent::Heartbeat,
            LedgerRequest::ReadAttempt => Sent::Read,
        };
        self.ends(sent)
    }

    fn ends(&self, sent: Sent) -> bool {
        match sent {
            Sent::Fail | Sent::Finish => true,
            Sent::CompleteAndContinue(o) => self.steps.last().is_some_and(|(last, _)| *last <= o),
            Sent::Begin(_) | Sent::Heartbeat | Sent::Read => false,
        }
    }

    fn failing_error(&self) -> String {
        match &self.phase {
            Phase::Fail(_, error) => error.clone(),
            _ => String::new(),
        }
    }

    fn retry_later(&mut self, sent: Sent, now: Timestamp) {
        if sent == Sent::Heartbeat {
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
