//! The request vocabulary: every worker and operator transition as data, and the one
//! entry point that decides any of them.
//!
//! Contract: a ledger reads an attempt's rows in lock order (attempt, command,
//! receipts), hands them to [`decide`] with the request, the instant (its own clock)
//! and what only it knows (the lease token a request presents or a claim grants, the
//! plan's recovery mode), and applies the answered [`Writes`] under their guard; the
//! [`Reply`] is what the caller is told once they are applied. [`decide`] calls the
//! named transitions of [`crate::transition`] and nothing else, so a request decides
//! exactly what its transition decides. The requests, the replies and [`Refusal`]
//! are serde data (the simulator sends them over its wire as they are); lease tokens
//! never are: they travel beside a request, never inside one.
//!
//! Every operation has one name, an [`Op`]: traces, logs and the simulator's checks
//! match on it, never on its spelling.
//!
//! Adding a transition: a variant here, its [`Op`], its arm in [`decide`] (and its
//! transition function); the ledgers apply every request through the same path.

use crate::ids::{LeaseToken, Timestamp};
use crate::model::{AttemptRecord, Plan, Recovery};
use crate::policy::Exhaustion;
use crate::route::Capabilities;
use crate::transition::{self, Continued, GaveBack, ReconcileOutcome, Refusal, Writes};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// A claim: up to `batch` claimable commands for `owner` under fresh leases of
/// `lease_ms`. Each candidate is decided on its own ([`Request::Claim`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRequest {
    /// The worker that will hold the leases.
    pub owner: String,
    /// The most commands to claim.
    pub batch: u32,
    /// The lease length to grant.
    pub lease_ms: u64,
    /// Whether to begin each claimed attempt's next step in the same transaction
    /// ([`transition::claim_and_begin`]).
    pub begin: bool,
    /// What the worker can run; a claim takes only commands whose next step it can
    /// ([`crate::route`]). `None`: anything.
    #[serde(default)]
    pub capabilities: Option<Capabilities>,
}

/// A ledger operation's name: every request's, and the enqueue's. Its [`fmt::Display`]
/// is the spelling traces, logs and the simulator print (`claim-and-begin`,
/// `complete-step`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// Enqueue an attempt ([`transition::enqueue`]).
    Enqueue,
    /// Claim a command ([`transition::claim`]).
    Claim,
    /// Claim a command and begin its next step ([`transition::claim_and_begin`]).
    ClaimAndBegin,
    /// [`WorkerRequest::Heartbeat`].
    Heartbeat,
    /// [`WorkerRequest::BeginStep`].
    BeginStep,
    /// [`WorkerRequest::CompleteStep`].
    CompleteStep,
    /// [`WorkerRequest::CompleteAndContinue`].
    CompleteAndContinue,
    /// [`WorkerRequest::Fail`].
    Fail,
    /// [`WorkerRequest::Finish`].
    Finish,
    /// [`WorkerRequest::GiveBack`].
    GiveBack,
    /// [`OperatorRequest::Reconcile`].
    Reconcile,
    /// [`OperatorRequest::Abort`].
    Abort,
    /// A WAITING command released when the attempt ahead of it on its order key
    /// ended ([`crate::order::after_end`]): no request names it, the transition that
    /// ended the head decides it.
    Release,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 13] = [
        Op::Enqueue,
        Op::Claim,
        Op::ClaimAndBegin,
        Op::Heartbeat,
        Op::BeginStep,
        Op::CompleteStep,
        Op::CompleteAndContinue,
        Op::Fail,
        Op::Finish,
        Op::GiveBack,
        Op::Reconcile,
        Op::Abort,
        Op::Release,
    ];

    /// The operation's printed name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Op::Enqueue => "enqueue",
            Op::Claim => "claim",
            Op::ClaimAndBegin => "claim-and-begin",
            Op::Heartbeat => "heartbeat",
            Op::BeginStep => "begin-step",
            Op::CompleteStep => "complete-step",
            Op::CompleteAndContinue => "complete-and-continue",
            Op::Fail => "fail",
            Op::Finish => "finish",
            Op::GiveBack => "give-back",
            Op::Reconcile => "reconcile",
            Op::Abort => "abort",
            Op::Release => "release",
        }
    }

    /// Whether the operation claims (mints a token and counts a delivery).
    pub const fn is_claim(self) -> bool {
        matches!(self, Op::Claim | Op::ClaimAndBegin)
    }

    /// Whether the operation is a [`WorkerRequest`] (presents a lease).
    pub const fn is_worker(self) -> bool {
        matches!(
            self,
            Op::Heartbeat
                | Op::BeginStep
                | Op::CompleteStep
                | Op::CompleteAndContinue
                | Op::Fail
                | Op::Finish
                | Op::GiveBack
        )
    }

    /// Whether the operation completes a step (and records its evidence).
    pub const fn completes_step(self) -> bool {
        matches!(self, Op::CompleteStep | Op::CompleteAndContinue)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl ClaimRequest {
    /// The claim's operation: claim-and-begin when it begins the next step.
    pub fn op(&self) -> Op {
        if self.begin {
            Op::ClaimAndBegin
        } else {
            Op::Claim
        }
    }
}

/// A request of a worker that holds a lease (the lease travels beside it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkerRequest {
    /// Renew the lease ([`transition::heartbeat`]).
    Heartbeat {
        /// Lease length to grant from now.
        lease_ms: u64,
    },
    /// Begin a step ([`transition::begin_step`]).
    BeginStep {
        /// The receipt.
        ordinal: u32,
        /// Lease length to grant from now.
        lease_ms: u64,
    },
    /// Complete a step with its evidence ([`transition::complete_step`]).
    CompleteStep {
        /// The receipt.
        ordinal: u32,
        /// The executor's evidence.
        evidence: Value,
        /// The target's receipt.
        target_receipt: Value,
        /// Lease length to grant from now.
        lease_ms: u64,
    },
    /// Complete a step and begin the next one, or finish after the last
    /// ([`transition::complete_and_continue`]).
    CompleteAndContinue {
        /// The receipt.
        ordinal: u32,
        /// The executor's evidence.
        evidence: Value,
        /// The target's receipt.
        target_receipt: Value,
        /// Lease length to grant from now.
        lease_ms: u64,
    },
    /// Fail the attempt, at a step if given ([`transition::fail`]).
    Fail {
        /// The failing step.
        ordinal: Option<u32>,
        /// Why.
        error: String,
    },
    /// Finish the attempt: SUCCEEDED and DELIVERED ([`transition::finish`]).
    Finish,
    /// Hand the command back after a transient failure, claimable again after
    /// `delay_ms`, or end the attempt exhausted if its policy allows no further
    /// delivery ([`transition::give_back`]). Decided with the attempt's plan.
    GiveBack {
        /// Why (kept as the command's `last_error`).
        error: String,
        /// How long until the command is claimable again (at most the policy's
        /// `backoff_max_ms`).
        delay_ms: u64,
    },
}

impl WorkerRequest {
    /// What the request is, without its payload: what a driver or runtime keeps of
    /// a request in flight once the request itself (evidence and all) was sent.
    pub fn kind(&self) -> WorkerOp {
        match self {
            WorkerRequest::Heartbeat { .. } => WorkerOp::Heartbeat,
            WorkerRequest::BeginStep { ordinal, .. } => WorkerOp::BeginStep(*ordinal),
            WorkerRequest::CompleteStep { ordinal, .. } => WorkerOp::CompleteStep(*ordinal),
            WorkerRequest::CompleteAndContinue { ordinal, .. } => WorkerOp::CompleteAndContinue(*ordinal),
            WorkerRequest::Fail { ordinal, .. } => WorkerOp::Fail(*ordinal),
            WorkerRequest::Finish => WorkerOp::Finish,
            WorkerRequest::GiveBack { .. } => WorkerOp::GiveBack,
        }
    }

    /// The request's operation (traces, logs, the simulator's seams).
    pub fn op(&self) -> Op {
        self.kind().op()
    }

    /// The receipt the request is about, if it names one.
    pub fn ordinal(&self) -> Option<u32> {
        self.kind().ordinal()
    }

    /// The lease length the request grants, if it renews the lease.
    pub fn lease_ms(&self) -> Option<u64> {
        match self {
            WorkerRequest::Heartbeat { lease_ms }
            | WorkerRequest::BeginStep { lease_ms, .. }
            | WorkerRequest::CompleteStep { lease_ms, .. }
            | WorkerRequest::CompleteAndContinue { lease_ms, .. } => Some(*lease_ms),
            WorkerRequest::Fail { .. } | WorkerRequest::Finish | WorkerRequest::GiveBack { .. } => None,
        }
    }

    /// Whether [`decide`] needs the attempt's plan for this request (the ledger
    /// reads it only then): a give-back, whose policy it applies.
    pub fn needs_plan(&self) -> bool {
        matches!(self, WorkerRequest::GiveBack { .. })
    }
}

/// A [`WorkerRequest`]'s kind with the receipt it names ([`WorkerRequest::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerOp {
    /// [`WorkerRequest::Heartbeat`].
    Heartbeat,
    /// [`WorkerRequest::BeginStep`] of this receipt.
    BeginStep(u32),
    /// [`WorkerRequest::CompleteStep`] of this receipt.
    CompleteStep(u32),
    /// [`WorkerRequest::CompleteAndContinue`] of this receipt.
    CompleteAndContinue(u32),
    /// [`WorkerRequest::Fail`], at this step if one.
    Fail(Option<u32>),
    /// [`WorkerRequest::Finish`].
    Finish,
    /// [`WorkerRequest::GiveBack`].
    GiveBack,
}

impl WorkerOp {
    /// The request's operation (traces, logs, the simulator's seams).
    pub fn op(self) -> Op {
        match self {
            WorkerOp::Heartbeat => Op::Heartbeat,
            WorkerOp::BeginStep(_) => Op::BeginStep,
            WorkerOp::CompleteStep(_) => Op::CompleteStep,
            WorkerOp::CompleteAndContinue(_) => Op::CompleteAndContinue,
            WorkerOp::Fail(_) => Op::Fail,
            WorkerOp::Finish => Op::Finish,
            WorkerOp::GiveBack => Op::GiveBack,
        }
    }

    /// The receipt the request is about, if it names one.
    pub fn ordinal(self) -> Option<u32> {
        match self {
            WorkerOp::BeginStep(o) | WorkerOp::CompleteStep(o) | WorkerOp::CompleteAndContinue(o) => Some(o),
            WorkerOp::Fail(o) => o,
            WorkerOp::Heartbeat | WorkerOp::Finish | WorkerOp::GiveBack => None,
        }
    }

    /// Whether `reply` is the one [`decide`] answers for this request once applied:
    /// [`Reply::Renewed`] for a heartbeat, [`Reply::Continued`] for a
    /// complete-and-continue, [`Reply::GaveBack`] or [`Reply::Exhausted`] for a
    /// give-back, [`Reply::Applied`] for the others. Any other reply says nothing
    /// of what the request did.
    pub fn answered_by(self, reply: &Reply) -> bool {
        matches!(
            (self, reply),
            (WorkerOp::Heartbeat, Reply::Renewed { .. })
                | (WorkerOp::CompleteAndContinue(_), Reply::Continued(_))
                | (WorkerOp::GiveBack, Reply::GaveBack { .. } | Reply::Exhausted(_))
                | (
                    WorkerOp::BeginStep(_) | WorkerOp::CompleteStep(_) | WorkerOp::Fail(_) | WorkerOp::Finish,
                    Reply::Applied
                )
        )
    }
}

/// A request of an operator, on one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OperatorRequest {
    /// Requeue an expired lease; refuse a live one ([`transition::reconcile`]).
    Reconcile,
    /// Abort a QUEUED or RUNNING attempt, fencing its worker ([`transition::abort`]).
    Abort {
        /// Why.
        reason: String,
    },
}

impl OperatorRequest {
    /// The request's operation (traces, logs, the simulator's seams).
    pub fn op(&self) -> Op {
        match self {
            OperatorRequest::Reconcile => Op::Reconcile,
            OperatorRequest::Abort { .. } => Op::Abort,
        }
    }
}

/// What a decided request tells its caller once its writes are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reply {
    /// Applied; nothing more to tell (a claim, begin, complete, fail, finish, abort).
    Applied,
    /// The lease was renewed until this instant (ledger clock).
    Renewed {
        /// The new deadline.
        until: Timestamp,
    },
    /// What complete-and-continue did after completing the step.
    Continued(Continued),
    /// What reconcile did.
    Reconciled(ReconcileOutcome),
    /// The command was given back, claimable again from this instant (ledger clock).
    GaveBack {
        /// Its new `available_at`.
        until: Timestamp,
    },
    /// The policy allowed no further delivery: the attempt ended FAILED, exhausted
    /// (a give-back, or a claim that found the attempt exhausted and claimed
    /// nothing).
    Exhausted(Exhaustion),
}

/// Why a request got no [`Reply`]: how a runtime classifies its ledger's errors for
/// the [`crate::driver::Driver`] (the one mapping between the two).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The ledger refused the request; nothing was written.
    Refused(Refusal),
    /// The ledger has no such command or attempt.
    NotFound,
    /// The ledger could not be reached or was busy; nothing was written.
    Unavailable,
    /// The request may or may not have been applied (the reply was lost).
    Ambiguous,
}

/// A request with what the ledger supplies beside the rows.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    /// The claim of one candidate, granting `token`, with its attempt's plan.
    Claim(&'a ClaimRequest, &'a LeaseToken, &'a Plan),
    /// A worker request presenting the lease `token`, with the attempt's plan when
    /// the request [needs it](WorkerRequest::needs_plan).
    Worker(&'a WorkerRequest, &'a LeaseToken, Option<&'a Plan>),
    /// An operator request; `recovery` is the attempt's plan's.
    Operator(&'a OperatorRequest, Recovery),
}

impl Request<'_> {
    /// The request's operation.
    pub fn op(&self) -> Op {
        match self {
            Request::Claim(c, _, _) => c.op(),
            Request::Worker(w, _, _) => w.op(),
            Request::Operator(o, _) => o.op(),
        }
    }
}

/// A decision: the writes to apply and the reply once they are, or a refusal
/// (nothing is written).
pub type Decision = Result<(Writes, Reply), Refusal>;

/// Decides `request` on `record` (the attempt's rows as read, in lock order) at
/// `now` (ledger clock), by the request's transition.
pub fn decide(record: &AttemptRecord, request: Request<'_>, now: Timestamp) -> Decision {
    let (mut writes, reply) = decide_rows(record, request, now)?;
    transition::follow_route(record, &mut writes);
    Ok((writes, reply))
}

/// [`decide`] but for the command's route ([`transition::follow_route`]).
fn decide_rows(record: &AttemptRecord, request: Request<'_>, now: Timestamp) -> Decision {
    match request {
        Request::Claim(claim, token, plan) => {
            if let Some(why) = transition::claim_exhausts(record, plan, now) {
                return Ok((transition::exhaust(record, why, now), Reply::Exhausted(why)));
            }
            let transition = if claim.begin {
                transition::claim_and_begin
            } else {
                transition::claim
            };
            let writes = transition(record, plan.recovery, &claim.owner, token.clone(), claim.lease_ms, now)?;
            if let Some(reason) = claim.capabilities.as_ref().and_then(|c| {
                let route = transition::claim_route(record, &writes, plan);
                c.refusal(&route)
            }) {
                return Err(Refusal::CannotRun {
                    command: record.command.id.clone(),
                    reason,
                });
            }
            Ok((writes, Reply::Applied))
        }
        Request::Worker(worker, token, plan) => decide_worker(record, worker, token, plan, now),
        Request::Operator(OperatorRequest::Reconcile, recovery) => {
            let (outcome, writes) = transition::reconcile(record, recovery, now)?;
            Ok((writes, Reply::Reconciled(outcome)))
        }
        Request::Operator(OperatorRequest::Abort { reason }, _) => {
            Ok((transition::abort(record, reason, now)?, Reply::Applied))
        }
    }
}

fn decide_worker(
    record: &AttemptRecord,
    request: &WorkerRequest,
    token: &LeaseToken,
    plan: Option<&Plan>,
    now: Timestamp,
) -> Decision {
    let applied = |writes: Writes| (writes, Reply::Applied);
    match request {
        WorkerRequest::Heartbeat { lease_ms } => {
            let writes = transition::heartbeat(&record.command, token, *lease_ms, now)?;
            let until = writes
                .command
                .as_ref()
                .and_then(|c| c.lease_until)
                .unwrap_or_else(|| now.plus_ms(*lease_ms));
            Ok((writes, Reply::Renewed { until }))
        }
        WorkerRequest::BeginStep { ordinal, lease_ms } => {
            transition::begin_step(record, *ordinal, token, *lease_ms, now).map(applied)
        }
        WorkerRequest::CompleteStep {
            ordinal,
            evidence,
            target_receipt,
            lease_ms,
        } => transition::complete_step(record, *ordinal, evidence, target_receipt, token, *lease_ms, now).map(applied),
        WorkerRequest::CompleteAndContinue {
            ordinal,
            evidence,
            target_receipt,
            lease_ms,
        } => {
            let (continued, writes) =
                transition::complete_and_continue(record, *ordinal, evidence, target_receipt, token, *lease_ms, now)?;
            Ok((writes, Reply::Continued(continued)))
        }
        WorkerRequest::Fail { ordinal, error } => transition::fail(record, *ordinal, error, token, now).map(applied),
        WorkerRequest::Finish => transition::finish(record, token, now).map(applied),
        WorkerRequest::GiveBack { error, delay_ms } => {
            let Some(plan) = plan else {
                return Err(Refusal::OutOfOrder {
                    attempt: record.attempt.id.clone(),
                    ordinal: 0,
                    reason: "a give-back is decided with the attempt's plan, and none was given".to_owned(),
                });
            };
            let (gave, writes) = transition::give_back(record, plan, error, *delay_ms, token, now)?;
            let reply = match gave {
                GaveBack::Until(until) => Reply::GaveBack { until },
                GaveBack::Exhausted(why) => Reply::Exhausted(why),
            };
            Ok((writes, reply))
        }
    }
}
