//! Every transition of the table in docs/design.md, as a guard plus writes.
//!
//! A transition reads snapshots of the rows (attempt, then command, then receipts:
//! the lock order), decides, and answers either a typed [`Refusal`] or the
//! [`Writes`] to apply. The writes carry a [`Guard`] on the command row: the memory
//! ledger checks it with [`Guard::admits`], the SQL ledgers turn it into a `WHERE`
//! clause and treat zero affected rows as a refusal. Time, owner and token arrive as
//! arguments; nothing here reads a clock or mints anything.

use crate::canonical::{canonical_json, sha256_hex};
use crate::ids::{AttemptId, CommandId, LeaseToken, PlanId, Timestamp};
use crate::model::{
    Action, Attempt, AttemptRecord, AttemptStatus, Command, CommandStatus, Plan, PlanStatus, Receipt, ReceiptStatus,
    Recovery,
};
use crate::plan::{idempotency_key, verify_fingerprint};
use crate::policy::{exhausted, Exhaustion};
use crate::route::Route;
use serde_json::Value;

/// Why a transition was refused. Nothing was written. Serde data: a refusal crosses
/// the simulator's wire as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Refusal {
    /// The command is not PROCESSING under the presented token.
    #[error("command {command} is not held by this lease")]
    StaleToken {
        /// The command.
        command: CommandId,
    },
    /// A live lease is never stolen.
    #[error("command {command} has a live lease held by {owner} until {until}")]
    LiveLease {
        /// The command.
        command: CommandId,
        /// Its holder.
        owner: String,
        /// The lease deadline (ledger clock).
        until: Timestamp,
    },
    /// Claim of a command that is not PENDING-and-available nor expired.
    #[error("command {command} is not claimable: {reason}")]
    NotClaimable {
        /// The command.
        command: CommandId,
        /// Why.
        reason: String,
    },
    /// The attempt already reached a terminal status.
    #[error("attempt {attempt} is already {status}")]
    Terminal {
        /// The attempt.
        attempt: AttemptId,
        /// Its terminal status.
        status: AttemptStatus,
    },
    /// A step transition out of order.
    #[error("attempt {attempt} step {ordinal}: {reason}")]
    OutOfOrder {
        /// The attempt.
        attempt: AttemptId,
        /// The receipt's ordinal.
        ordinal: u32,
        /// Why.
        reason: String,
    },
    /// A claim by a worker that cannot run the step the claim would begin
    /// ([`crate::route::Capabilities`]).
    #[error("command {command} is not for this worker: {reason}")]
    CannotRun {
        /// The command.
        command: CommandId,
        /// Why (its executor, target or queue).
        reason: String,
    },
    /// A write that would renew an expired lease on a target that admits no more
    /// leases now ([`crate::limits`]): the lease stays expired, for a claim to take
    /// over when the target admits one.
    #[error("command {command}: its lease expired and {reason}")]
    Limited {
        /// The command.
        command: CommandId,
        /// Why its target admits no more (the target's refusal).
        reason: String,
    },
    /// An enqueue whose action guard or plan guard does not hold.
    #[error("{action} refused: {reason}")]
    Guard {
        /// The action asked for.
        action: Action,
        /// Why.
        reason: String,
    },
    /// An enqueue whose key an earlier, different request used ([`keyed`]).
    #[error("enqueue key {key:?} was used by another request (attempt {attempt}): a key names one request")]
    KeyReused {
        /// The key.
        key: String,
        /// The attempt the earlier request enqueued.
        attempt: AttemptId,
    },
}

/// The condition the command row must satisfy for the writes to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// A new command: the row must not exist yet.
    Absent,
    /// PROCESSING and holding this token (worker transitions).
    Holds(LeaseToken),
    /// PENDING with `available_at <= now`, or PROCESSING with `lease_until < now`.
    Claimable(Timestamp),
    /// Status and token exactly as read (operator transitions).
    Unchanged {
        /// The status read.
        status: CommandStatus,
        /// The token read.
        lease_token: Option<LeaseToken>,
    },
}

impl Guard {
    /// Whether the command row, as it is now, satisfies the guard.
    pub fn admits(&self, command: Option<&Command>) -> bool {
        match (self, command) {
            (Guard::Absent, c) => c.is_none(),
            (_, None) => false,
            (Guard::Holds(token), Some(c)) => {
                c.status == CommandStatus::Processing && c.lease_token.as_ref() == Some(token)
            }
            (Guard::Claimable(now), Some(c)) => is_claimable(c, *now),
            (Guard::Unchanged { status, lease_token }, Some(c)) => c.status == *status && c.lease_token == *lease_token,
        }
    }
}

/// PENDING and available, or PROCESSING with an expired lease.
pub fn is_claimable(command: &Command, now: Timestamp) -> bool {
    match command.status {
        CommandStatus::Pending => command.available_at <= now,
        CommandStatus::Processing => command.lease_until.is_some_and(|until| until < now),
        _ => false,
    }
}

/// The rows to write, each the full new image of a changed row.
#[derive(Debug, Clone, PartialEq)]
pub struct Writes {
    /// Must hold on the command row, or nothing is written.
    pub guard: Guard,
    /// The attempt's new image, if it changed.
    pub attempt: Option<Attempt>,
    /// The command's new image, if it changed.
    pub command: Option<Command>,
    /// Changed receipts' new images.
    pub receipts: Vec<Receipt>,
}

impl Writes {
    fn none(guard: Guard) -> Self {
        Self {
            guard,
            attempt: None,
            command: None,
            receipts: Vec::new(),
        }
    }

    /// The inserts of a new attempt (an enqueue's record): every row, under
    /// [`Guard::Absent`].
    pub fn new_attempt(record: &AttemptRecord) -> Self {
        Self {
            guard: Guard::Absent,
            attempt: Some(record.attempt.clone()),
            command: Some(record.command.clone()),
            receipts: record.receipts.clone(),
        }
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.attempt.is_none() && self.command.is_none() && self.receipts.is_empty()
    }

    /// Applies the writes to a record in memory (the reference interpreter).
    pub fn apply_to(&self, record: &mut AttemptRecord) {
        if let Some(a) = &self.attempt {
            record.attempt = a.clone();
        }
        if let Some(c) = &self.command {
            record.command = c.clone();
        }
        for r in &self.receipts {
            if let Some(slot) = record.receipts.iter_mut().find(|x| x.ordinal == r.ordinal) {
                *slot = r.clone();
            }
        }
    }
}

/// Fresh ids for an enqueue, minted by the ledger.
#[derive(Debug, Clone)]
pub struct NewIds {
    /// The attempt's id.
    pub attempt: AttemptId,
    /// The command's id.
    pub command: CommandId,
    /// The attempt's trace context ([`crate::trace::TraceContext::for_attempt`]).
    pub trace: Option<crate::trace::TraceContext>,
}

/// The longest enqueue key or order key, in characters.
pub const ENQUEUE_KEY_MAX: usize = 255;

/// Refuses an enqueue key or an order key that is empty, longer than
/// [`ENQUEUE_KEY_MAX`], or holds a character a name may not ([`crate::names`]);
/// the message names `field`.
pub fn check_enqueue_key(field: &str, key: &str) -> Result<(), String> {
    let n = key.chars().count();
    if n == 0 || n > ENQUEUE_KEY_MAX {
        return Err(format!("{field}: {n} characters; a key has 1 to {ENQUEUE_KEY_MAX}"));
    }
    crate::names::check(field, key).map_err(|e| e.to_string())
}

/// The SHA-256 of an enqueue request as its caller gave it: the plan, the action,
/// the start as asked for (`after` a delay, not the instant it came to) and, for a
/// template, the input's fingerprint and the order key where given. Two enqueues
/// with one key are the same request exactly when these are equal; the trace
/// context is not part of it (a retry may come from another span).
pub fn enqueue_request_sha256(plan: &PlanId, action: Action, start: Start, template: TemplateKey<'_>) -> String {
    let mut request = serde_json::json!({"plan": plan, "action": action, "start": start});
    if let Some(sha) = template.input_sha256 {
        request["input_sha256"] = serde_json::json!(sha);
    }
    if let Some(key) = template.order_key {
        request["order_key"] = serde_json::json!(key);
    }
    crate::canonical::fingerprint(&request)
}

/// What a template's enqueue adds to its request's hash ([`enqueue_request_sha256`]):
/// nothing for a plan without input.
#[derive(Debug, Clone, Copy, Default)]
pub struct TemplateKey<'a> {
    /// The input's fingerprint.
    pub input_sha256: Option<&'a str>,
    /// The order key.
    pub order_key: Option<&'a str>,
}

/// An enqueue with `key` and request hash `request_sha256`, given the attempt that
/// holds the key already, if one does: none — enqueue a new attempt (`Ok(None)`);
/// one enqueued by the same request — answer it (`Ok(Some)`), whatever it became;
/// one enqueued by another request — refused, [`Refusal::KeyReused`].
pub fn keyed<'a>(
    existing: Option<&'a AttemptRecord>,
    key: &str,
    request_sha256: &str,
) -> Result<Option<&'a AttemptRecord>, Refusal> {
    match existing {
        None => Ok(None),
        Some(r) if r.attempt.request_sha256.as_deref() == Some(request_sha256) => Ok(Some(r)),
        Some(r) => Err(Refusal::KeyReused {
            key: key.to_owned(),
            attempt: r.attempt.id.clone(),
        }),
    }
}

/// When an enqueued attempt's command becomes claimable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Start {
    /// At once.
    #[default]
    Now,
    /// At this instant (ledger clock); an instant already past means at once.
    At(Timestamp),
    /// This many milliseconds after the enqueue (ledger clock).
    After(u64),
}

impl Start {
    /// The command's `available_at` for an enqueue at `now`.
    pub fn available_at(self, now: Timestamp) -> Timestamp {
        match self {
            Start::Now => now,
            Start::At(at) => at.max(now),
            Start::After(ms) => now.plus_ms(ms),
        }
    }
}

/// Enqueue: validates the plan and the action guard against the plan's history and
/// answers the new attempt, its receipts and its PENDING command, claimable at once.
///
/// `history` holds every earlier attempt of the plan, any order.
pub fn enqueue(
    plan: &Plan,
    history: &[AttemptRecord],
    action: Action,
    ids: NewIds,
    now: Timestamp,
) -> Result<AttemptRecord, Refusal> {
    enqueue_at(plan, history, action, ids, now, Start::Now)
}

/// [`enqueue`], the command claimable from `start`.
pub fn enqueue_at(
    plan: &Plan,
    history: &[AttemptRecord],
    action: Action,
    ids: NewIds,
    now: Timestamp,
    start: Start,
) -> Result<AttemptRecord, Refusal> {
    let refuse = |reason: String| Refusal::Guard { action, reason };
    ready(plan, action)?;
    if plan.is_template() {
        return Err(refuse(format!(
            "plan {} is a template: its attempts are execute attempts with input of their own \
             (enqueue the input again to run it again)",
            plan.id
        )));
    }
    let mut ordered: Vec<&AttemptRecord> = history.iter().collect();
    ordered.sort_by_key(|r| r.attempt.number);
    let latest = ordered.last().copied();
    if let Some(open) = ordered.iter().find(|r| !r.attempt.status.is_terminal()) {
        return Err(refuse(format!(
            "attempt {} is still {}",
            open.attempt.id, open.attempt.status
        )));
    }
    let steps = enqueue_steps(plan, &ordered, action)?;
    let number = latest.map_or(1, |l| l.attempt.number + 1);
    Ok(new_record(
        plan,
        &steps,
        (number, action),
        ids,
        start.available_at(now),
        now,
    ))
}

/// What a template's enqueue brings besides its plan: the input, checked and
/// resolved ([`crate::input::prepare`]), its order key, and what the ledger read.
#[derive(Debug, Clone, Copy)]
pub struct TemplateEnqueue<'a> {
    /// The input and the payloads it resolves.
    pub input: &'a crate::input::Prepared,
    /// Its order key ([`crate::order`]), if any.
    pub order_key: Option<&'a str>,
    /// The plan's highest attempt number (0 for none).
    pub latest_number: u32,
    /// An open attempt of the plan with this order key, if there is one.
    pub ahead: Option<&'a AttemptRecord>,
}

/// Enqueue of a template's attempt: always `execute`, every step, each receipt
/// with its payload resolved from the input; the attempt records its input and
/// its fingerprint. With an attempt open ahead on its order key, its command is
/// WAITING ([`crate::order`]): claimable only once the ones ahead have ended.
pub fn enqueue_template(
    plan: &Plan,
    t: TemplateEnqueue<'_>,
    ids: NewIds,
    now: Timestamp,
    start: Start,
) -> Result<AttemptRecord, Refusal> {
    ready(plan, Action::Execute)?;
    if !plan.is_template() {
        return Err(Refusal::Guard {
            action: Action::Execute,
            reason: format!("plan {} declares no [input]", plan.id),
        });
    }
    let steps: Vec<&str> = plan.steps.iter().map(|s| s.code.as_str()).collect();
    let at = start.available_at(now);
    let mut record = new_record(plan, &steps, (t.latest_number + 1, Action::Execute), ids, at, now);
    record.attempt.input = Some(t.input.text.clone());
    record.attempt.input_sha256 = Some(t.input.sha256.clone());
    record.attempt.order_key = t.order_key.map(str::to_owned);
    for r in &mut record.receipts {
        r.payload = t.input.payloads.get(&r.step_code).cloned();
    }
    let waits = t
        .ahead
        .is_some_and(|a| !a.attempt.status.is_terminal() && a.attempt.order_key.as_deref() == t.order_key);
    if t.order_key.is_some() && waits {
        record.command.status = CommandStatus::Waiting;
    }
    Ok(record)
}

/// A plan that accepts attempts: READY, its content matching its fingerprint.
fn ready(plan: &Plan, action: Action) -> Result<(), Refusal> {
    let refuse = |reason: String| Refusal::Guard { action, reason };
    if plan.status != PlanStatus::Ready {
        return Err(refuse(format!("plan {} is {}", plan.id, plan.status)));
    }
    verify_fingerprint(plan).map_err(|e| refuse(format!("plan {}: {e}", plan.id)))
}

/// A new attempt (`number`, `action`) of `plan` over `steps`, its receipts PENDING
/// and its command PENDING from `available_at`.
fn new_record(
    plan: &Plan,
    steps: &[&str],
    (number, action): (u32, Action),
    ids: NewIds,
    available_at: Timestamp,
    now: Timestamp,
) -> AttemptRecord {
    let attempt = Attempt {
        id: ids.attempt.clone(),
        plan_id: plan.id.clone(),
        number,
        action,
        status: AttemptStatus::Queued,
        created_at: now,
        started_at: None,
        finished_at: None,
        error: None,
        trace: ids.trace,
        enqueue_key: None,
        request_sha256: None,
        input: None,
        input_sha256: None,
        order_key: None,
    };
    let receipts: Vec<Receipt> = steps
        .iter()
        .zip(1u32..)
        .map(|(code, ordinal)| {
            let route = Route::of_step(plan, code);
            Receipt {
                attempt_id: ids.attempt.clone(),
                ordinal,
                step_code: (*code).to_owned(),
                idempotency_key: idempotency_key(&ids.attempt, ordinal, code),
                executor: route.executor,
                target: route.target,
                payload: None,
                status: ReceiptStatus::Pending,
                evidence: None,
                evidence_sha256: None,
                target_receipt: None,
                error: None,
                started_at: None,
                finished_at: None,
            }
        })
        .collect();
    let first = receipts.first();
    let command = Command {
        id: ids.command,
        attempt_id: ids.attempt,
        status: CommandStatus::Pending,
        available_at,
        lease_owner: None,
        lease_token: None,
        lease_until: None,
        last_heartbeat_at: None,
        delivery_count: 0,
        last_error: None,
        finished_at: None,
        queue: plan.queue().to_owned(),
        executor: first.map(|r| r.executor.clone()).unwrap_or_default(),
        target: first.map(|r| r.target.clone()).unwrap_or_default(),
    };
    AttemptRecord {
        attempt,
        command,
        receipts,
    }
}

/// Whether an operator who names `record` may ask for its follow-up `action` (a
/// `retry` of a FAILED or ABORTED attempt, a `compensate` of a FAILED forward one):
/// the attempt must be its plan's latest (its latest forward one, to compensate),
/// so that the follow-up is of what was named. `history` holds every attempt of the
/// plan. The enqueue that follows applies its own guards.
pub fn follow_up_of(record: &AttemptRecord, history: &[AttemptRecord], action: Action) -> Result<(), Refusal> {
    let (a, id) = (&record.attempt, &record.attempt.id);
    let refuse = |reason: String| Err(Refusal::Guard { action, reason });
    match action {
        Action::Retry if !matches!(a.status, AttemptStatus::Failed | AttemptStatus::Aborted) => {
            return refuse(format!("attempt {id} is {}, not FAILED or ABORTED", a.status));
        }
        Action::Compensate if a.status != AttemptStatus::Failed || !a.action.is_forward() => {
            return refuse(format!(
                "attempt {id} is a {} attempt that is {}: only a FAILED forward attempt is compensated",
                a.action, a.status
            ));
        }
        _ => {}
    }
    let latest = history
        .iter()
        .filter(|r| action == Action::Retry || r.attempt.action.is_forward())
        .max_by_key(|r| r.attempt.number);
    if latest.map(|r| &r.attempt.id) != Some(id) {
        let forward = if action == Action::Retry { "" } else { "forward " };
        return refuse(format!(
            "attempt {id} is not the latest {forward}attempt of plan {}",
            a.plan_id
        ));
    }
    Ok(())
}

/// The step codes an enqueue of `action` delivers, in order, or the action guard's
/// refusal: every step for `execute`; every step after a FAILED or ABORTED latest
/// attempt for `retry`; the latest forward attempt's succeeded steps, reversed, for a
/// `compensate` that has not succeeded yet. `ordered` is the plan's history by number.
fn enqueue_steps<'p>(plan: &'p Plan, ordered: &[&'p AttemptRecord], action: Action) -> Result<Vec<&'p str>, Refusal> {
    let refuse = |reason: String| Refusal::Guard { action, reason };
    let latest = ordered.last().copied();
    let steps = match action {
        Action::Execute => plan.steps.iter().map(|s| s.code.as_str()).collect(),
        Action::Retry => match latest {
            Some(l) if matches!(l.attempt.status, AttemptStatus::Failed | AttemptStatus::Aborted) => {
                plan.steps.iter().map(|s| s.code.as_str()).collect()
            }
            Some(l) => {
                return Err(refuse(format!(
                    "the latest attempt {} is {}, not FAILED or ABORTED",
                    l.attempt.id, l.attempt.status
                )))
            }
            None => return Err(refuse(format!("plan {} has no attempt to retry", plan.id))),
        },
        Action::Compensate => {
            let forward = ordered.iter().rev().find(|r| r.attempt.action.is_forward());
            let Some(forward) = forward else {
                return Err(refuse(format!("plan {} has no forward attempt to compensate", plan.id)));
            };
            let compensated = ordered.iter().any(|r| {
                r.attempt.action == Action::Compensate
                    && r.attempt.number > forward.attempt.number
                    && r.attempt.status == AttemptStatus::Succeeded
            });
            if compensated {
                return Err(refuse(format!("attempt {} is already compensated", forward.attempt.id)));
            }
            let done: Vec<&str> = forward
                .receipts
                .iter()
                .filter(|r| r.status == ReceiptStatus::Succeeded)
                .map(|r| r.step_code.as_str())
                .rev()
                .collect();
            if done.is_empty() {
                return Err(refuse(format!(
                    "attempt {} has no succeeded step to compensate",
                    forward.attempt.id
                )));
            }
            done
        }
    };
    Ok(steps)
}

/// Claim: PENDING-and-available or expired PROCESSING becomes PROCESSING under a new
/// token; the attempt RUNNING. On a takeover, `resume` puts the ambiguous RUNNING
/// receipt back to PENDING (same key) and `replay` resets every receipt and drops
/// its evidence.
pub fn claim(
    record: &AttemptRecord,
    recovery: Recovery,
    owner: &str,
    token: LeaseToken,
    lease_ms: u64,
    now: Timestamp,
) -> Result<Writes, Refusal> {
    let c = &record.command;
    if record.attempt.status.is_terminal() {
        return Err(Refusal::Terminal {
            attempt: record.attempt.id.clone(),
            status: record.attempt.status,
        });
    }
    match c.status {
        CommandStatus::Pending if c.available_at > now => {
            return Err(Refusal::NotClaimable {
                command: c.id.clone(),
                reason: format!("not available until {}", c.available_at),
            })
        }
        CommandStatus::Processing if !is_claimable(c, now) => {
            return Err(live_lease(c));
        }
        CommandStatus::Pending | CommandStatus::Processing => {}
        status => {
            return Err(Refusal::NotClaimable {
                command: c.id.clone(),
                reason: format!("it is {status}"),
            });
        }
    }
    let mut receipts = Vec::new();
    if c.delivery_count >= 1 {
        receipts = reset_for_takeover(&record.receipts, recovery);
    }
    let mut command = c.clone();
    if c.status == CommandStatus::Processing {
        command.last_error = Some(format!(
            "lease of {} expired; taken over by {owner}",
            c.lease_owner.as_deref().unwrap_or("unknown worker")
        ));
    }
    command.status = CommandStatus::Processing;
    command.lease_owner = Some(owner.to_owned());
    command.lease_token = Some(token);
    command.lease_until = Some(now.plus_ms(lease_ms));
    command.last_heartbeat_at = Some(now);
    command.delivery_count = c.delivery_count.saturating_add(1);
    let mut attempt = record.attempt.clone();
    attempt.status = AttemptStatus::Running;
    attempt.started_at.get_or_insert(now);
    Ok(Writes {
        guard: Guard::Claimable(now),
        attempt: Some(attempt),
        command: Some(command),
        receipts,
    })
}

fn live_lease(c: &Command) -> Refusal {
    Refusal::LiveLease {
        command: c.id.clone(),
        owner: c.lease_owner.clone().unwrap_or_default(),
        until: c.lease_until.unwrap_or_default(),
    }
}

/// Receipts a takeover changes: `resume` the ambiguous RUNNING one back to PENDING;
/// `replay` every non-PENDING one back to PENDING with its evidence dropped.
fn reset_for_takeover(receipts: &[Receipt], recovery: Recovery) -> Vec<Receipt> {
    receipts
        .iter()
        .filter(|r| match recovery {
            Recovery::Resume => r.status == ReceiptStatus::Running,
            Recovery::Replay => r.status != ReceiptStatus::Pending,
        })
        .map(|r| {
            let mut r = r.clone();
            r.status = ReceiptStatus::Pending;
            r.started_at = None;
            if recovery == Recovery::Replay {
                r.evidence = None;
                r.evidence_sha256 = None;
                r.target_receipt = None;
                r.finished_at = None;
                r.error = None;
            }
            r
        })
        .collect()
}

fn fence(command: &Command, token: &LeaseToken) -> Result<(), Refusal> {
    if command.status == CommandStatus::Processing && command.lease_token.as_ref() == Some(token) {
        Ok(())
    } else {
        Err(Refusal::StaleToken {
            command: command.id.clone(),
        })
    }
}

fn renewed(command: &Command, lease_ms: u64, now: Timestamp) -> Command {
    let mut c = command.clone();
    c.lease_until = Some(now.plus_ms(lease_ms));
    c.last_heartbeat_at = Some(now);
    c
}

fn receipt_at(record: &AttemptRecord, ordinal: u32) -> Result<&Receipt, Refusal> {
    record.receipt(ordinal).ok_or_else(|| Refusal::OutOfOrder {
        attempt: record.attempt.id.clone(),
        ordinal,
        reason: format!("the attempt has {} steps", record.receipts.len()),
    })
}

/// Heartbeat: renews a current lease.
pub fn heartbeat(command: &Command, token: &LeaseToken, lease_ms: u64, now: Timestamp) -> Result<Writes, Refusal> {
    fence(command, token)?;
    Ok(Writes {
        guard: Guard::Holds(token.clone()),
        attempt: None,
        command: Some(renewed(command, lease_ms, now)),
        receipts: Vec::new(),
    })
}

/// Begin step: the receipt RUNNING once every earlier one SUCCEEDED; renews the
/// lease. Beginning a step that is already RUNNING under the same lease (a retried
/// request whose reply was lost) only renews.
pub fn begin_step(
    record: &AttemptRecord,
    ordinal: u32,
    token: &LeaseToken,
    lease_ms: u64,
    now: Timestamp,
) -> Result<Writes, Refusal> {
    fence(&record.command, token)?;
    let receipt = receipt_at(record, ordinal)?;
    if let Some(blocking) = record
        .receipts
        .iter()
        .find(|r| r.ordinal < ordinal && r.status != ReceiptStatus::Succeeded)
    {
        return Err(Refusal::OutOfOrder {
            attempt: record.attempt.id.clone(),
            ordinal,
            reason: format!("step {} is {}, not SUCCEEDED", blocking.ordinal, blocking.status),
        });
    }
    let mut writes = Writes::none(Guard::Holds(token.clone()));
    writes.command = Some(renewed(&record.command, lease_ms, now));
    match receipt.status {
        ReceiptStatus::Pending => {
            let mut r = receipt.clone();
            r.status = ReceiptStatus::Running;
            r.started_at = Some(now);
            writes.receipts.push(r);
            Ok(writes)
        }
        ReceiptStatus::Running => Ok(writes),
        status => Err(Refusal::OutOfOrder {
            attempt: record.attempt.id.clone(),
            ordinal,
            reason: format!("it is already {status}"),
        }),
    }
}

/// Complete step: a RUNNING receipt SUCCEEDED with its evidence (stored as canonical
/// JSON with its SHA-256) and target receipt; renews the lease. Completing an
/// already SUCCEEDED receipt with the same evidence (a retried request) only renews.
pub fn complete_step(
    record: &AttemptRecord,
    ordinal: u32,
    evidence: &Value,
    target_receipt: &Value,
    token: &LeaseToken,
    lease_ms: u64,
    now: Timestamp,
) -> Result<Writes, Refusal> {
    fence(&record.command, token)?;
    let receipt = receipt_at(record, ordinal)?;
    let evidence = canonical_json(evidence);
    let sha = sha256_hex(evidence.as_bytes());
    let mut writes = Writes::none(Guard::Holds(token.clone()));
    writes.command = Some(renewed(&record.command, lease_ms, now));
    match receipt.status {
        ReceiptStatus::Running => {
            let mut r = receipt.clone();
            r.status = ReceiptStatus::Succeeded;
            r.evidence = Some(evidence);
            r.evidence_sha256 = Some(sha);
            r.target_receipt = Some(canonical_json(target_receipt));
            r.finished_at = Some(now);
            writes.receipts.push(r);
            Ok(writes)
        }
        ReceiptStatus::Succeeded if receipt.evidence_sha256.as_deref() == Some(sha.as_str()) => Ok(writes),
        status => Err(Refusal::OutOfOrder {
            attempt: record.attempt.id.clone(),
            ordinal,
            reason: format!("it is {status}, not RUNNING"),
        }),
    }
}

/// Fail: the receipt at `ordinal` (if given) FAILED, every other open receipt
/// ABORTED, the attempt and command FAILED, the token cleared.
pub fn fail(
    record: &AttemptRecord,
    ordinal: Option<u32>,
    error: &str,
    token: &LeaseToken,
    now: Timestamp,
) -> Result<Writes, Refusal> {
    fence(&record.command, token)?;
    if let Some(o) = ordinal {
        receipt_at(record, o)?;
    }
    Ok(failed(record, ordinal, error, Guard::Holds(token.clone()), now))
}

/// The writes of a failure at `ordinal` under `guard` (see [`fail`]).
fn failed(record: &AttemptRecord, ordinal: Option<u32>, error: &str, guard: Guard, now: Timestamp) -> Writes {
    let receipts = record
        .receipts
        .iter()
        .filter(|r| !r.status.is_terminal())
        .map(|r| {
            let mut r = r.clone();
            if Some(r.ordinal) == ordinal {
                r.status = ReceiptStatus::Failed;
                r.error = Some(error.to_owned());
            } else {
                r.status = ReceiptStatus::Aborted;
                r.error = Some(format!("not run: {}", failed_because(ordinal)));
            }
            r.finished_at = Some(now);
            r
        })
        .collect();
    let mut attempt = record.attempt.clone();
    attempt.status = AttemptStatus::Failed;
    attempt.finished_at = Some(now);
    attempt.error = Some(error.to_owned());
    let command = terminal_command(&record.command, CommandStatus::Failed, Some(error.to_owned()), now);
    Writes {
        guard,
        attempt: Some(attempt),
        command: Some(command),
        receipts,
    }
}

/// The reason an exhausted attempt ends with: `exhausted: deliveries: step 2
/// (charge) after 25 deliveries; last error: HTTP 503`.
pub fn exhaustion_reason(record: &AttemptRecord, why: Exhaustion, last_error: Option<&str>) -> String {
    let step = next_step(record)
        .and_then(|o| record.receipt(o))
        .map_or_else(String::new, |r| format!(" step {} ({})", r.ordinal, r.step_code));
    let n = record.command.delivery_count;
    let deliveries = if n == 1 { "delivery" } else { "deliveries" };
    let last = last_error.map_or_else(String::new, |e| format!("; last error: {e}"));
    format!("{}:{step} after {n} {deliveries}{last}", why.as_str())
}

/// Whether `record`'s command, claimable at `now`, is exhausted under `plan`'s
/// policy: then a claim ends the attempt instead ([`exhaust`]).
pub fn claim_exhausts(record: &AttemptRecord, plan: &Plan, now: Timestamp) -> Option<Exhaustion> {
    if record.attempt.status.is_terminal() || !is_claimable(&record.command, now) {
        return None;
    }
    let policy = plan.policy_of(record);
    exhausted(&policy, record.command.delivery_count, record.attempt.created_at, now)
}

/// Exhaust: a claim that finds the attempt exhausted ([`claim_exhausts`]) ends it
/// FAILED with the `exhausted:` reason, the next step FAILED and the other open
/// receipts ABORTED, under the claim's guard.
pub fn exhaust(record: &AttemptRecord, why: Exhaustion, now: Timestamp) -> Writes {
    let reason = exhaustion_reason(record, why, record.command.last_error.as_deref());
    failed(record, next_step(record), &reason, Guard::Claimable(now), now)
}

/// What [`give_back`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GaveBack {
    /// The command is PENDING again, claimable from this instant (ledger clock).
    Until(Timestamp),
    /// The policy allows no further delivery: the attempt ended FAILED, exhausted.
    Exhausted(Exhaustion),
}

/// Give back: the lease holder hands its command back after a step failed
/// transiently. The command PENDING, its lease cleared (the last holder kept in
/// `lease_owner`), `available_at` = `now` + `delay_ms` (at most the policy's
/// `backoff_max_ms`), `last_error` = `error`; the attempt QUEUED; a RUNNING receipt
/// PENDING again (same key). If the policy allows no further delivery by then (the
/// delivery cap is reached, or the deadline passes before `available_at`), the
/// attempt ends FAILED, exhausted, as [`exhaust`] would end it.
pub fn give_back(
    record: &AttemptRecord,
    plan: &Plan,
    error: &str,
    delay_ms: u64,
    token: &LeaseToken,
    now: Timestamp,
) -> Result<(GaveBack, Writes), Refusal> {
    fence(&record.command, token)?;
    let policy = plan.policy_of(record);
    let until = now.plus_ms(delay_ms.min(policy.backoff_max_ms));
    let guard = Guard::Holds(token.clone());
    let c = &record.command;
    if let Some(why) = exhausted(&policy, c.delivery_count, record.attempt.created_at, until) {
        let reason = exhaustion_reason(record, why, Some(error));
        return Ok((
            GaveBack::Exhausted(why),
            failed(record, next_step(record), &reason, guard, now),
        ));
    }
    let mut command = c.clone();
    command.status = CommandStatus::Pending;
    command.lease_token = None;
    command.lease_until = None;
    command.available_at = until;
    command.last_error = Some(error.to_owned());
    let mut attempt = record.attempt.clone();
    attempt.status = AttemptStatus::Queued;
    let receipts = reset_for_takeover(&record.receipts, Recovery::Resume);
    let writes = Writes {
        guard,
        attempt: Some(attempt),
        command: Some(command),
        receipts,
    };
    Ok((GaveBack::Until(until), writes))
}

fn failed_because(ordinal: Option<u32>) -> String {
    ordinal.map_or_else(|| "the attempt failed".to_owned(), |o| format!("step {o} failed"))
}

fn terminal_command(c: &Command, status: CommandStatus, error: Option<String>, now: Timestamp) -> Command {
    let mut c = c.clone();
    c.status = status;
    c.lease_token = None;
    c.lease_until = None;
    c.finished_at = Some(now);
    if error.is_some() {
        c.last_error = error;
    }
    c
}

/// Finish: once every receipt SUCCEEDED, the attempt SUCCEEDED and the command
/// DELIVERED, the token cleared.
pub fn finish(record: &AttemptRecord, token: &LeaseToken, now: Timestamp) -> Result<Writes, Refusal> {
    fence(&record.command, token)?;
    if let Some(open) = record.receipts.iter().find(|r| r.status != ReceiptStatus::Succeeded) {
        return Err(Refusal::OutOfOrder {
            attempt: record.attempt.id.clone(),
            ordinal: open.ordinal,
            reason: format!("it is {}, not SUCCEEDED", open.status),
        });
    }
    let mut attempt = record.attempt.clone();
    attempt.status = AttemptStatus::Succeeded;
    attempt.finished_at = Some(now);
    let command = terminal_command(&record.command, CommandStatus::Delivered, None, now);
    Ok(Writes {
        guard: Guard::Holds(token.clone()),
        attempt: Some(attempt),
        command: Some(command),
        receipts: Vec::new(),
    })
}

/// What reconcile did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReconcileOutcome {
    /// The expired lease was cleared and the command is PENDING again.
    Requeued,
    /// Nothing needed doing (PENDING or terminal).
    Unchanged,
}

/// Reconcile: an expired PROCESSING command goes back to PENDING with its receipts
/// reset as a takeover would and its attempt QUEUED; a live lease is refused; PENDING
/// and terminal commands are left unchanged.
pub fn reconcile(
    record: &AttemptRecord,
    recovery: Recovery,
    now: Timestamp,
) -> Result<(ReconcileOutcome, Writes), Refusal> {
    let c = &record.command;
    let guard = Guard::Unchanged {
        status: c.status,
        lease_token: c.lease_token.clone(),
    };
    match c.status {
        CommandStatus::Processing if !is_claimable(c, now) => Err(live_lease(c)),
        CommandStatus::Processing => {
            let mut command = c.clone();
            command.status = CommandStatus::Pending;
            command.last_error = Some(format!(
                "lease of {} expired; requeued by reconcile",
                c.lease_owner.as_deref().unwrap_or("unknown worker")
            ));
            command.lease_owner = None;
            command.lease_token = None;
            command.lease_until = None;
            command.available_at = now;
            let mut attempt = record.attempt.clone();
            attempt.status = AttemptStatus::Queued;
            let receipts = reset_for_takeover(&record.receipts, recovery);
            Ok((
                ReconcileOutcome::Requeued,
                Writes {
                    guard,
                    attempt: Some(attempt),
                    command: Some(command),
                    receipts,
                },
            ))
        }
        _ => Ok((ReconcileOutcome::Unchanged, Writes::none(guard))),
    }
}

/// Abort: a QUEUED or RUNNING attempt, its open receipts and its command ABORTED, the
/// token cleared (so the active worker is fenced).
pub fn abort(record: &AttemptRecord, reason: &str, now: Timestamp) -> Result<Writes, Refusal> {
    let a = &record.attempt;
    if a.status.is_terminal() {
        return Err(Refusal::Terminal {
            attempt: a.id.clone(),
            status: a.status,
        });
    }
    let c = &record.command;
    let guard = Guard::Unchanged {
        status: c.status,
        lease_token: c.lease_token.clone(),
    };
    let mut attempt = a.clone();
    attempt.status = AttemptStatus::Aborted;
    attempt.finished_at = Some(now);
    attempt.error = Some(reason.to_owned());
    let receipts = record
        .receipts
        .iter()
        .filter(|r| !r.status.is_terminal())
        .map(|r| {
            let mut r = r.clone();
            r.status = ReceiptStatus::Aborted;
            r.error = Some(reason.to_owned());
            r.finished_at = Some(now);
            r
        })
        .collect();
    let mut command = terminal_command(c, CommandStatus::Aborted, Some(reason.to_owned()), now);
    command.lease_owner = c.lease_owner.clone();
    Ok(Writes {
        guard,
        attempt: Some(attempt),
        command: Some(command),
        receipts,
    })
}

impl Writes {
    /// Chains a second transition decided on the rows as these writes leave them:
    /// both apply in one transaction under this (the first) guard. The result holds
    /// the latest image of every row either one changed.
    pub fn then(
        mut self,
        record: &AttemptRecord,
        next: impl FnOnce(&AttemptRecord) -> Result<Writes, Refusal>,
    ) -> Result<Writes, Refusal> {
        let mut after = record.clone();
        self.apply_to(&mut after);
        let more = next(&after)?;
        if more.attempt.is_some() {
            self.attempt = more.attempt;
        }
        if more.command.is_some() {
            self.command = more.command;
        }
        for r in more.receipts {
            match self.receipts.iter_mut().find(|x| x.ordinal == r.ordinal) {
                Some(slot) => *slot = r,
                None => self.receipts.push(r),
            }
        }
        self.receipts.sort_by_key(|r| r.ordinal);
        Ok(self)
    }
}

/// Yield: a lease whose next step's target refused it ([`crate::limits`]) hands its
/// command back, applied on top of the write that moved it there. The command
/// PENDING, claimable again at `until`, its lease cleared (the holder kept in
/// `lease_owner`), `last_error` the reason; the attempt QUEUED; a RUNNING receipt
/// PENDING again. The delivery it ends is not counted against the policy's cap
/// (`delivery_count` one less): it was ended by a limit, not by a failure.
pub fn yield_lease(record: &AttemptRecord, token: &LeaseToken, reason: &str, until: Timestamp) -> Writes {
    let mut command = record.command.clone();
    command.status = CommandStatus::Pending;
    command.lease_token = None;
    command.lease_until = None;
    command.available_at = until;
    command.last_error = Some(reason.to_owned());
    command.delivery_count = command.delivery_count.saturating_sub(1);
    let mut attempt = record.attempt.clone();
    attempt.status = AttemptStatus::Queued;
    Writes {
        guard: Guard::Holds(token.clone()),
        attempt: Some(attempt),
        command: Some(command),
        receipts: reset_for_takeover(&record.receipts, Recovery::Resume),
    }
}

/// The first receipt that has not SUCCEEDED: the step a delivery continues with.
pub fn next_step(record: &AttemptRecord) -> Option<u32> {
    record
        .receipts
        .iter()
        .filter(|r| r.status != ReceiptStatus::Succeeded)
        .map(|r| r.ordinal)
        .min()
}

/// The first receipt of `record` that has not SUCCEEDED once `writes` applied.
fn next_after<'a>(record: &'a AttemptRecord, writes: &'a Writes) -> Option<&'a Receipt> {
    record
        .receipts
        .iter()
        .map(|r| writes.receipts.iter().find(|w| w.ordinal == r.ordinal).unwrap_or(r))
        .filter(|r| r.status != ReceiptStatus::Succeeded)
        .min_by_key(|r| r.ordinal)
}

/// Keeps the command on the route of the step it runs next: after writes that
/// change receipts, an open command carries the executor and target of its first
/// receipt that has not SUCCEEDED (as enqueued), so that claims can be filtered by
/// them ([`crate::route`]). Unchanged once the attempt ends.
pub fn follow_route(record: &AttemptRecord, writes: &mut Writes) {
    if writes.receipts.is_empty() {
        return;
    }
    let command = writes.command.as_ref().unwrap_or(&record.command);
    let Some(next) = next_after(record, writes) else { return };
    if command.status.is_terminal() || (command.executor == next.executor && command.target == next.target) {
        return;
    }
    let mut command = command.clone();
    command.executor.clone_from(&next.executor);
    command.target.clone_from(&next.target);
    writes.command = Some(command);
}

/// The route of the step a claim's `writes` begin (or would begin next), from the
/// plan: what the claimer must be able to run.
pub fn claim_route(record: &AttemptRecord, writes: &Writes, plan: &Plan) -> Route {
    let code = next_after(record, writes).map_or("", |r| r.step_code.as_str());
    Route::of_step(plan, code)
}

/// Claim and, in the same transaction, begin the first step that has not
/// SUCCEEDED (after the claim's takeover resets). Saves one transaction per delivery;
/// every guard of both transitions still holds.
pub fn claim_and_begin(
    record: &AttemptRecord,
    recovery: Recovery,
    owner: &str,
    token: LeaseToken,
    lease_ms: u64,
    now: Timestamp,
) -> Result<Writes, Refusal> {
    let writes = claim(record, recovery, owner, token.clone(), lease_ms, now)?;
    writes.then(record, |claimed| match next_step(claimed) {
        Some(ordinal) => begin_step(claimed, ordinal, &token, lease_ms, now),
        None => Ok(Writes::none(Guard::Holds(token.clone()))),
    })
}

/// What [`complete_and_continue`] did after completing the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Continued {
    /// Began the step at this ordinal.
    Began(u32),
    /// Finished the attempt: SUCCEEDED and DELIVERED.
    Finished,
    /// The next step's target admitted no lease ([`crate::limits`]): the command was
    /// handed back ([`yield_lease`]), claimable again from this instant.
    Yielded(Timestamp),
}

/// Complete a step and, in the same transaction, begin the next one or — after the
/// last — finish the attempt. Saves one transaction per step.
pub fn complete_and_continue(
    record: &AttemptRecord,
    ordinal: u32,
    evidence: &Value,
    target_receipt: &Value,
    token: &LeaseToken,
    lease_ms: u64,
    now: Timestamp,
) -> Result<(Continued, Writes), Refusal> {
    let writes = complete_step(record, ordinal, evidence, target_receipt, token, lease_ms, now)?;
    let mut continued = Continued::Finished;
    let writes = writes.then(record, |completed| match next_step(completed) {
        Some(next) => {
            continued = Continued::Began(next);
            begin_step(completed, next, token, lease_ms, now)
        }
        None => finish(completed, token, now),
    })?;
    Ok((continued, writes))
}
