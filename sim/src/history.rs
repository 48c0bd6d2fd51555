//! The model-based history check: invariants 11 and 12.
//!
//! Contract: [`transitions`] replays the db host's event log against a model of
//! the transition table of docs/design.md, and [`recovery_promises`] the target's call log
//! against the recovery promises; each pushes one message per broken rule.
//!
//! 11. Every committed image follows the table. For each applied event the model
//!     computes, from the rows before it, the operation and the plan's recovery, what
//!     the attempt, command, lease token, `delivery_count` and every receipt (status,
//!     key, evidence) must be afterwards, and compares. In particular a SUCCEEDED
//!     receipt is never rewritten except by a `replay` takeover (a claim of a command
//!     delivered before, or a reconcile that requeues one), which resets it to
//!     PENDING with its evidence dropped; a `resume` takeover only puts the ambiguous
//!     RUNNING receipt back to PENDING, with the same key. A refused or failed request
//!     changed nothing, and an event's rows before are the rows the previous event of
//!     that attempt left. The delivery policy is decided with the attempt's plan: a
//!     claim that finds the cap reached or the deadline passed ends the attempt
//!     FAILED `exhausted: ...` (and no other claim may deliver it then); a give-back
//!     requeues the command with `available_at` within the longest backoff (the
//!     RUNNING receipt PENDING, same key), or ends the attempt exhausted when the
//!     policy allows no further delivery by then.
//! 12. The target's calls keep the recovery promises. Each call names the delivery it
//!     came from; that delivery's claim must exist, the call must carry the receipt's
//!     key, and under `resume` the step must not have SUCCEEDED before that claim
//!     (a takeover redelivers only the ambiguous step). Under `replay` every call of a
//!     delivery lands in that delivery's own sandbox. The first call of each delivery
//!     is the step the claim left next: step one under `replay`, the first step that
//!     had not SUCCEEDED under `resume`. Every step completed under a delivery was
//!     called by that delivery.
//!
//! Messages name attempts, steps, deliveries and token ordinals, never token text.

use crate::db::{DbEvent, EventOutcome, Snap};
use crate::plans;
use crate::target::CallRecord;
use leasehold_engine::canonical::sha256_hex;
use leasehold_engine::policy::{Exhaustion, RetryPolicy};
use leasehold_engine::{
    AttemptId, AttemptStatus, CommandStatus, Op, Plan, PlanId, Receipt, ReceiptStatus, Recovery, Timestamp,
};
use std::collections::{BTreeMap, BTreeSet};

/// What a receipt's evidence must be after a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Evidence {
    /// Exactly what it was before (evidence, its SHA-256 and the target receipt).
    Kept,
    /// Newly recorded: present, with a matching SHA-256 and a target receipt.
    Recorded,
    /// Dropped: no evidence, no SHA-256, no target receipt.
    Dropped,
}

/// What the lease token must be after a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// The same token as before.
    Same,
    /// A token different from the one before.
    Fresh,
    /// No token.
    Cleared,
}

/// The model's answer for one applied transition.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expected {
    attempt: AttemptStatus,
    command: CommandStatus,
    token: Token,
    delivery_count: u32,
    receipts: Vec<(ReceiptStatus, Evidence)>,
    /// How the attempt's error must begin (`exhausted: ...`), if it must.
    error_head: Option<&'static str>,
    /// The range the command's `available_at` must lie in, if the transition sets it.
    available: Option<(Timestamp, Timestamp)>,
}

impl Expected {
    fn unchanged(b: &Snap) -> Self {
        Self {
            attempt: b.record.attempt.status,
            command: b.record.command.status,
            token: Token::Same,
            delivery_count: b.record.command.delivery_count,
            receipts: b.record.receipts.iter().map(|r| (r.status, Evidence::Kept)).collect(),
            error_head: None,
            available: None,
        }
    }

    /// The attempt ends FAILED, exhausted: its next step FAILED, every other open
    /// receipt ABORTED, the command FAILED, the token cleared, no delivery counted.
    fn exhaust(&mut self, why: Exhaustion) {
        let next = self.next_step();
        for (i, r) in self.receipts.iter_mut().enumerate() {
            if !r.0.is_terminal() {
                r.0 = if Some(i) == next {
                    ReceiptStatus::Failed
                } else {
                    ReceiptStatus::Aborted
                };
            }
        }
        self.attempt = AttemptStatus::Failed;
        self.command = CommandStatus::Failed;
        self.token = Token::Cleared;
        self.error_head = Some(why.as_str());
    }

    fn next_step(&self) -> Option<usize> {
        self.receipts.iter().position(|(s, _)| *s != ReceiptStatus::Succeeded)
    }

    /// Begin the step at index `i`: PENDING becomes RUNNING, RUNNING stays.
    fn begin(&mut self, i: usize) -> Result<(), String> {
        if let Some(open) = self.receipts[..i]
            .iter()
            .position(|(s, _)| *s != ReceiptStatus::Succeeded)
        {
            return Err(format!(
                "step {} began while step {} was not SUCCEEDED",
                i + 1,
                open + 1
            ));
        }
        match self.receipts[i].0 {
            ReceiptStatus::Pending | ReceiptStatus::Running => {
                self.receipts[i].0 = ReceiptStatus::Running;
                Ok(())
            }
            s => Err(format!("step {} began while it was {s}", i + 1)),
        }
    }

    /// Complete the step at index `i`: RUNNING becomes SUCCEEDED with new evidence; a
    /// SUCCEEDED one (a retried request) stays as it was.
    fn complete(&mut self, i: usize) -> Result<(), String> {
        match self.receipts[i].0 {
            ReceiptStatus::Running => {
                self.receipts[i] = (ReceiptStatus::Succeeded, Evidence::Recorded);
                Ok(())
            }
            ReceiptStatus::Succeeded => Ok(()),
            s => Err(format!("step {} completed while it was {s}", i + 1)),
        }
    }

    fn finish(&mut self) -> Result<(), String> {
        if let Some(open) = self.next_step() {
            return Err(format!(
                "the attempt finished while step {} was {}",
                open + 1,
                self.receipts[open].0
            ));
        }
        self.attempt = AttemptStatus::Succeeded;
        self.command = CommandStatus::Delivered;
        self.token = Token::Cleared;
        Ok(())
    }

    /// The receipts as a takeover leaves them.
    fn take_over(&mut self, recovery: Recovery) {
        for r in &mut self.receipts {
            match (recovery, r.0) {
                (Recovery::Resume, ReceiptStatus::Running) => r.0 = ReceiptStatus::Pending,
                (Recovery::Replay, s) if s != ReceiptStatus::Pending => {
                    *r = (ReceiptStatus::Pending, Evidence::Dropped)
                }
                _ => {}
            }
        }
    }
}

fn index_of(b: &Snap, ordinal: Option<u32>) -> Result<usize, String> {
    let o = ordinal.ok_or("the event names no step")?;
    b.record
        .receipts
        .iter()
        .position(|r| r.ordinal == o)
        .ok_or_else(|| format!("the attempt has no step {o}"))
}

fn require_processing(b: &Snap) -> Result<(), String> {
    if b.record.command.status == CommandStatus::Processing {
        Ok(())
    } else {
        Err(format!(
            "a worker transition applied while the command was {}",
            b.record.command.status
        ))
    }
}

/// What the model knows beside the rows: the operation, the step it names, the
/// attempt's plan (its recovery and delivery policy) and the instant the ledger
/// decided at.
#[derive(Debug, Clone, Copy)]
struct Ctx<'a> {
    op: Op,
    ordinal: Option<u32>,
    plan: Option<&'a Plan>,
    now: Timestamp,
}

impl Ctx<'_> {
    fn recovery(&self) -> Recovery {
        self.plan.map_or(Recovery::Resume, |p| p.recovery)
    }

    /// The policy that rules the attempt as the rows before show it.
    fn policy(&self, b: &Snap) -> RetryPolicy {
        self.plan.map_or_else(RetryPolicy::default, |p| p.policy_of(&b.record))
    }
}

/// Why the policy allows no further delivery of `b`'s command once it is next
/// claimable at `next` (ledger time): its delivery cap reached, or its deadline
/// (the enqueue plus `deadline_secs`) at or before `next`.
fn exhaustion(policy: &RetryPolicy, b: &Snap, next: Timestamp) -> Option<Exhaustion> {
    if b.record.command.delivery_count >= policy.max_deliveries {
        return Some(Exhaustion::Deliveries);
    }
    let deadline = policy
        .deadline_secs
        .map(|s| b.record.attempt.created_at.plus_ms(s.saturating_mul(1_000)));
    deadline.filter(|d| next >= *d).map(|_| Exhaustion::Deadline)
}

/// The transition table: what an applied request must leave, given the rows before it.
fn model(cx: Ctx<'_>, b: &Snap, a: &Snap) -> Result<Expected, String> {
    let mut x = Expected::unchanged(b);
    match cx.op {
        Op::Claim | Op::ClaimAndBegin => model_claim(cx, b, a, &mut x)?,
        Op::GiveBack => model_give_back(cx, b, a, &mut x)?,
        Op::Heartbeat => require_processing(b)?,
        Op::BeginStep => {
            require_processing(b)?;
            x.begin(index_of(b, cx.ordinal)?)?;
        }
        Op::CompleteStep => {
            require_processing(b)?;
            x.complete(index_of(b, cx.ordinal)?)?;
        }
        Op::CompleteAndContinue => {
            require_processing(b)?;
            x.complete(index_of(b, cx.ordinal)?)?;
            match x.next_step() {
                Some(i) => x.begin(i)?,
                None => x.finish()?,
            }
        }
        Op::Fail => {
            require_processing(b)?;
            if cx.ordinal.is_some() {
                index_of(b, cx.ordinal)?;
            }
            for (r, before) in x.receipts.iter_mut().zip(&b.record.receipts) {
                if !r.0.is_terminal() {
                    r.0 = if Some(before.ordinal) == cx.ordinal {
                        ReceiptStatus::Failed
                    } else {
                        ReceiptStatus::Aborted
                    };
                }
            }
            x.attempt = AttemptStatus::Failed;
            x.command = CommandStatus::Failed;
            x.token = Token::Cleared;
        }
        Op::Finish => {
            require_processing(b)?;
            x.finish()?;
        }
        Op::Reconcile => {
            // An expired lease is requeued; anything else is answered unchanged (a
            // live lease is refused, which the caller checks as a refusal).
            if b.record.command.status == CommandStatus::Processing
                && a.record.command.status != CommandStatus::Processing
            {
                x.take_over(cx.recovery());
                x.attempt = AttemptStatus::Queued;
                x.command = CommandStatus::Pending;
                x.token = Token::Cleared;
            }
        }
        Op::Abort => {
            if b.record.attempt.status.is_terminal() {
                return Err(format!("an abort applied to a {} attempt", b.record.attempt.status));
            }
            for r in &mut x.receipts {
                if !r.0.is_terminal() {
                    r.0 = ReceiptStatus::Aborted;
                }
            }
            x.attempt = AttemptStatus::Aborted;
            x.command = CommandStatus::Aborted;
            x.token = Token::Cleared;
        }
        Op::Release => {
            // The attempt ahead on its order key ended: a WAITING command becomes
            // claimable, nothing else changes.
            if b.record.command.status != CommandStatus::Waiting {
                return Err(format!("a release applied to a {} command", b.record.command.status));
            }
            x.command = CommandStatus::Pending;
        }
        Op::Enqueue => return Err(format!("{} is not a transition of the table", cx.op)),
    }
    Ok(x)
}

/// A claim: a delivery under a fresh token (a takeover resets the receipts as the
/// recovery says) while the policy allows one; else the attempt ends exhausted and
/// no delivery is counted.
fn model_claim(cx: Ctx<'_>, b: &Snap, a: &Snap, x: &mut Expected) -> Result<(), String> {
    if b.record.attempt.status.is_terminal() {
        return Err(format!("a claim applied to a {} attempt", b.record.attempt.status));
    }
    if !matches!(
        b.record.command.status,
        CommandStatus::Pending | CommandStatus::Processing
    ) {
        return Err(format!("a claim applied to a {} command", b.record.command.status));
    }
    let policy = cx.policy(b);
    let due = exhaustion(&policy, b, cx.now);
    if a.record.attempt.status.is_terminal() {
        let Some(why) = due else {
            return Err(format!(
                "a claim ended the attempt {} though its policy allowed another delivery (delivery {} of {})",
                a.record.attempt.status, b.record.command.delivery_count, policy.max_deliveries
            ));
        };
        x.exhaust(why);
        return Ok(());
    }
    if let Some(why) = due {
        return Err(format!(
            "a claim delivered the attempt again though it was {} (delivery {} of {})",
            why.as_str(),
            b.record.command.delivery_count,
            policy.max_deliveries
        ));
    }
    if b.record.command.delivery_count >= 1 {
        x.take_over(cx.recovery());
    }
    x.attempt = AttemptStatus::Running;
    x.command = CommandStatus::Processing;
    x.token = Token::Fresh;
    x.delivery_count = b.record.command.delivery_count.saturating_add(1);
    if cx.op == Op::ClaimAndBegin {
        if let Some(i) = x.next_step() {
            x.begin(i)?;
        }
    }
    Ok(())
}

/// A give-back: the command PENDING again from a moment between now and the
/// policy's longest backoff, the attempt QUEUED, the ambiguous RUNNING receipt
/// PENDING (same key), the token cleared; or, if the policy allows no delivery by
/// then, the attempt ends exhausted.
fn model_give_back(cx: Ctx<'_>, b: &Snap, a: &Snap, x: &mut Expected) -> Result<(), String> {
    require_processing(b)?;
    let policy = cx.policy(b);
    let latest = cx.now.plus_ms(policy.backoff_max_ms);
    if a.record.command.status != CommandStatus::Pending {
        let Some(why) = exhaustion(&policy, b, latest) else {
            return Err(format!(
                "a give-back ended the attempt {} though its policy allowed another delivery (delivery {} of {})",
                a.record.attempt.status, b.record.command.delivery_count, policy.max_deliveries
            ));
        };
        x.exhaust(why);
        return Ok(());
    }
    if let Some(why) = exhaustion(&policy, b, a.record.command.available_at) {
        return Err(format!(
            "a give-back requeued the attempt though it was {} (delivery {} of {})",
            why.as_str(),
            b.record.command.delivery_count,
            policy.max_deliveries
        ));
    }
    x.take_over(Recovery::Resume);
    x.attempt = AttemptStatus::Queued;
    x.command = CommandStatus::Pending;
    x.token = Token::Cleared;
    x.available = Some((cx.now, latest));
    Ok(())
}

fn same_evidence(x: &Receipt, y: &Receipt) -> bool {
    x.evidence == y.evidence && x.evidence_sha256 == y.evidence_sha256 && x.target_receipt == y.target_receipt
}

/// Compares the rows after an applied transition with the model's answer.
fn compare(op: Op, recovery: Recovery, b: &Snap, a: &Snap, x: &Expected) -> Vec<String> {
    let mut out = compare_rows(b, a, x);
    if a.record.receipts.len() != b.record.receipts.len() {
        out.push(format!(
            "the attempt had {} receipts and then {}",
            b.record.receipts.len(),
            a.record.receipts.len()
        ));
        return out;
    }
    let bc = &b.record.command;
    let replay_takeover = recovery == Recovery::Replay
        && bc.delivery_count >= 1
        && ((op.is_claim() && !a.record.attempt.status.is_terminal())
            || (op == Op::Reconcile && x.command == CommandStatus::Pending && bc.status == CommandStatus::Processing));
    let receipts = b.record.receipts.iter().zip(&a.record.receipts).zip(&x.receipts);
    for ((br, ar), (status, evidence)) in receipts {
        if let Err(m) = compare_receipt((op, recovery, replay_takeover), br, ar, (*status, *evidence)) {
            out.push(m);
        }
    }
    out
}

/// Compares the attempt's identity, the attempt's and the command's status, the
/// delivery count and the token with the model's answer.
fn compare_rows(b: &Snap, a: &Snap, x: &Expected) -> Vec<String> {
    let mut out = Vec::new();
    let (ba, aa) = (&b.record.attempt, &a.record.attempt);
    if (&ba.id, &ba.plan_id, ba.number, ba.action) != (&aa.id, &aa.plan_id, aa.number, aa.action)
        || b.record.command.id != a.record.command.id
    {
        out.push("the attempt's identity (id, plan, number, action or command) changed".to_owned());
    }
    if aa.status != x.attempt {
        out.push(format!(
            "the attempt went {} -> {}, the table says {}",
            ba.status, aa.status, x.attempt
        ));
    }
    let (bc, ac) = (&b.record.command, &a.record.command);
    if ac.status != x.command {
        out.push(format!(
            "the command went {} -> {}, the table says {}",
            bc.status, ac.status, x.command
        ));
    }
    if ac.delivery_count != x.delivery_count {
        out.push(format!(
            "delivery_count went {} -> {}, the table says {}",
            bc.delivery_count, ac.delivery_count, x.delivery_count
        ));
    }
    out.extend(compare_token(b, a, x.token));
    if let Some(head) = x.error_head {
        if !aa.error.as_deref().is_some_and(|e| e.starts_with(head)) {
            out.push(format!("the attempt's error does not begin with {head:?}"));
        }
    }
    if let Some((from, to)) = x.available {
        if !(from..=to).contains(&ac.available_at) {
            out.push(format!(
                "available_at is {} ms after the decision, the table says 0 to {} ms",
                ac.available_at.as_millis() - from.as_millis(),
                to.millis_since(from)
            ));
        }
    }
    out
}

/// Compares the command's token after with what the model says it must be.
fn compare_token(b: &Snap, a: &Snap, token: Token) -> Option<String> {
    let (ok, want) = match token {
        Token::Same => (a.token == b.token, "the same token"),
        Token::Fresh => (a.token.is_some() && a.token != b.token, "a fresh token"),
        Token::Cleared => (a.token.is_none(), "no token"),
    };
    (!ok).then(|| {
        format!(
            "the command's token went {} -> {}, the table says {want}",
            tok(b.token),
            tok(a.token)
        )
    })
}

/// Compares one receipt before (`br`) and after (`ar`) an applied `op` with the
/// model's status and evidence for it; only a replay takeover may rewrite a
/// SUCCEEDED receipt.
fn compare_receipt(
    (op, recovery, replay_takeover): (Op, Recovery, bool),
    br: &Receipt,
    ar: &Receipt,
    (status, evidence): (ReceiptStatus, Evidence),
) -> Result<(), String> {
    let o = br.ordinal;
    if (ar.ordinal, &ar.step_code, &ar.idempotency_key) != (o, &br.step_code, &br.idempotency_key) {
        return Err(format!("step {o}'s ordinal, code or idempotency key changed"));
    }
    if br.status == ReceiptStatus::Succeeded && !replay_takeover && (ar.status != br.status || !same_evidence(br, ar)) {
        return Err(format!(
            "step {o} was SUCCEEDED and {op} rewrote it ({}, evidence {}), which only a replay takeover may",
            ar.status,
            if same_evidence(br, ar) { "kept" } else { "changed" }
        ));
    }
    if ar.status != status {
        return Err(format!(
            "step {o} went {} -> {} under {recovery}, the table says {status}",
            br.status, ar.status
        ));
    }
    let (ok, want) = match evidence {
        Evidence::Kept => (same_evidence(br, ar), "kept"),
        Evidence::Recorded => (
            ar.evidence.as_deref().map(|e| sha256_hex(e.as_bytes())) == ar.evidence_sha256
                && ar.evidence.is_some()
                && ar.target_receipt.is_some(),
            "recorded with its SHA-256 and target receipt",
        ),
        Evidence::Dropped => (
            ar.evidence.is_none() && ar.evidence_sha256.is_none() && ar.target_receipt.is_none(),
            "dropped",
        ),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("step {o}'s evidence after {op} is not {want}"))
    }
}

fn tok(t: Option<u32>) -> String {
    t.map_or_else(|| "none".to_owned(), |t| format!("token#{t}"))
}

fn enqueued_ok(a: &Snap) -> Result<(), String> {
    let r = &a.record;
    // An attempt with an order key may wait behind an open one.
    let waits = r.attempt.order_key.is_some() && r.command.status == CommandStatus::Waiting;
    if r.attempt.status != AttemptStatus::Queued
        || !(r.command.status == CommandStatus::Pending || waits)
        || r.command.delivery_count != 0
        || a.token.is_some()
    {
        return Err(format!(
            "an enqueue left {}/{} with delivery_count {} and {}",
            r.attempt.status,
            r.command.status,
            r.command.delivery_count,
            tok(a.token)
        ));
    }
    for (r, o) in r.receipts.iter().zip(1u32..) {
        if r.ordinal != o || r.status != ReceiptStatus::Pending || r.evidence.is_some() {
            return Err(format!(
                "an enqueue left step {} {} (expected step {o} PENDING, no evidence)",
                r.ordinal, r.status
            ));
        }
    }
    if r.receipts.is_empty() {
        return Err("an enqueue left an attempt without receipts".to_owned());
    }
    Ok(())
}

fn recovery_of(plans: &BTreeMap<PlanId, Plan>, s: &Snap) -> Recovery {
    plans
        .get(&s.record.attempt.plan_id)
        .map_or(Recovery::Resume, |p| p.recovery)
}

/// Invariant 11 over the event log.
pub fn transitions(events: &[DbEvent], plans: &BTreeMap<PlanId, Plan>, push: &mut impl FnMut(u8, String)) {
    let mut last: BTreeMap<&AttemptId, &Snap> = BTreeMap::new();
    let mut reported: BTreeSet<&AttemptId> = BTreeSet::new();
    for e in events {
        let Some(id) = e.attempt.as_ref() else { continue };
        let mut problems = Vec::new();
        if let (Some(prev), Some(b)) = (last.get(id), &e.before) {
            if *prev != b {
                problems.push("its rows before differ from what the previous event left".to_owned());
            }
        }
        match (&e.outcome, &e.before, &e.after) {
            (EventOutcome::Applied, None, Some(a)) if e.op == Op::Enqueue => {
                if let Err(m) = enqueued_ok(a) {
                    problems.push(m);
                }
            }
            (EventOutcome::Applied, Some(b), Some(a)) => {
                let cx = Ctx {
                    op: e.op,
                    ordinal: e.ordinal,
                    plan: plans.get(&b.record.attempt.plan_id),
                    now: e.decided_at,
                };
                match model(cx, b, a) {
                    Ok(x) => problems.extend(compare(e.op, cx.recovery(), b, a, &x)),
                    Err(m) => problems.push(m),
                }
            }
            (EventOutcome::Applied, b, a) => problems.push(format!(
                "applied with rows before {} and after {}",
                if b.is_some() { "present" } else { "missing" },
                if a.is_some() { "present" } else { "missing" }
            )),
            (EventOutcome::Refused(_) | EventOutcome::Failed(_), Some(b), Some(a)) if b != a => {
                problems.push("the request was refused but the rows changed".to_owned());
            }
            _ => {}
        }
        if let Some(a) = &e.after {
            last.insert(id, a);
        }
        if !problems.is_empty() && reported.insert(id) {
            push(
                11,
                format!(
                    "event #{}: {} of {id}{} by {}: {}",
                    e.seq,
                    e.op,
                    e.ordinal.map_or_else(String::new, |o| format!(" step {o}")),
                    e.from,
                    problems.join("; ")
                ),
            );
        }
    }
}

/// One delivery of an attempt, as its claim left it.
struct Delivery<'a> {
    before: &'a Snap,
    after: &'a Snap,
    token: Option<u32>,
}

/// Every delivery an applied claim made, by attempt and delivery count.
type Deliveries<'a> = BTreeMap<(&'a AttemptId, u32), Delivery<'a>>;

/// Invariant 12 over the target's calls and the event log.
pub fn recovery_promises(
    events: &[DbEvent],
    plans: &BTreeMap<PlanId, Plan>,
    calls: &[CallRecord],
    push: &mut impl FnMut(u8, String),
) {
    let deliveries = deliveries(events);
    let mut reported: BTreeSet<AttemptId> = BTreeSet::new();
    let mut report = |id: &AttemptId, message: String| {
        if reported.insert(id.clone()) {
            push(12, message);
        }
    };
    let mut first_call: BTreeSet<(&AttemptId, u32)> = BTreeSet::new();
    let mut called: BTreeSet<(&AttemptId, u32, u32)> = BTreeSet::new();
    for c in calls {
        let what = format!(
            "the target's call of {} step {} from delivery {} ({})",
            c.attempt, c.ordinal, c.delivery, c.worker
        );
        let Some(d) = deliveries.get(&(&c.attempt, c.delivery)) else {
            report(&c.attempt, format!("{what}: no claim made that delivery"));
            continue;
        };
        called.insert((&c.attempt, c.ordinal, c.delivery));
        let Some(r) = d.after.record.receipt(c.ordinal) else {
            report(&c.attempt, format!("{what}: the attempt has no such step"));
            continue;
        };
        let first = first_call.insert((&c.attempt, c.delivery));
        for m in call_problems(&what, c, (d, r), recovery_of(plans, d.after), first) {
            report(&c.attempt, m);
        }
    }
    completed_uncalled(events, &deliveries, &called, &mut report);
}

fn deliveries(events: &[DbEvent]) -> Deliveries<'_> {
    let mut deliveries = Deliveries::new();
    for e in events.iter().filter(|e| e.is_delivery()) {
        if let (Some(id), Some(b), Some(a)) = (&e.attempt, &e.before, &e.after) {
            deliveries.insert(
                (id, a.record.command.delivery_count),
                Delivery {
                    before: b,
                    after: a,
                    token: a.token,
                },
            );
        }
    }
    deliveries
}

/// What breaks the recovery promises in the target's call `c` (described as `what`)
/// of step `r` from delivery `d`, the `first` call of that delivery.
fn call_problems(
    what: &str,
    c: &CallRecord,
    (d, r): (&Delivery<'_>, &Receipt),
    recovery: Recovery,
    first: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    if r.idempotency_key != c.key {
        out.push(format!("{what} carried a key that is not the step's"));
    }
    let succeeded_before = d
        .before
        .record
        .receipt(c.ordinal)
        .is_some_and(|r| r.status == ReceiptStatus::Succeeded);
    if recovery == Recovery::Resume && succeeded_before {
        out.push(format!(
            "{what}: the step had SUCCEEDED before the claim that made the delivery (resume redelivered finished work)"
        ));
    }
    if recovery == Recovery::Replay {
        let sandbox = plans::sandbox_id(&c.attempt, c.delivery);
        if c.sandbox.as_deref() != Some(sandbox.as_str()) {
            out.push(format!("{what} is not in that delivery's fresh sandbox"));
        }
    }
    if first {
        let start = match recovery {
            Recovery::Replay => Some(1),
            Recovery::Resume => d
                .before
                .record
                .receipts
                .iter()
                .filter(|r| r.status != ReceiptStatus::Succeeded)
                .map(|r| r.ordinal)
                .min(),
        };
        if start != Some(c.ordinal) {
            out.push(format!(
                "{what} is the delivery's first call, but its claim left step {} next under {recovery}",
                start.map_or_else(|| "none".to_owned(), |s| s.to_string())
            ));
        }
    }
    out
}

/// Reports every step a delivery completed that the delivery never `called`.
fn completed_uncalled(
    events: &[DbEvent],
    deliveries: &Deliveries<'_>,
    called: &BTreeSet<(&AttemptId, u32, u32)>,
    report: &mut impl FnMut(&AttemptId, String),
) {
    let token_delivery: BTreeMap<(&AttemptId, u32), u32> = deliveries
        .iter()
        .filter_map(|((id, n), d)| d.token.map(|t| ((*id, t), *n)))
        .collect();
    for e in events
        .iter()
        .filter(|e| e.op.completes_step() && e.outcome == EventOutcome::Applied)
    {
        let (Some(id), Some(o), Some(b), Some(a)) = (&e.attempt, e.ordinal, &e.before, &e.after) else {
            continue;
        };
        let newly = b.record.receipt(o).is_some_and(|r| r.status == ReceiptStatus::Running)
            && a.record
                .receipt(o)
                .is_some_and(|r| r.status == ReceiptStatus::Succeeded);
        if !newly {
            continue;
        }
        let Some(n) = e.presented.and_then(|t| token_delivery.get(&(id, t))) else {
            continue;
        };
        if !called.contains(&(id, o, *n)) {
            report(
                id,
                format!(
                    "event #{}: {id} step {o} SUCCEEDED under delivery {n}, which never called the target for it",
                    e.seq
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_engine::transition::{self, NewIds};
    use leasehold_engine::{Action, AttemptRecord, CommandId, LeaseToken, Timestamp, Writes};
    use serde_json::json;

    /// A history built by the engine's own transitions, with hooks to tamper.
    struct History {
        plans: BTreeMap<PlanId, Plan>,
        plan: Plan,
        record: AttemptRecord,
        events: Vec<DbEvent>,
        tokens: Vec<LeaseToken>,
        now: i64,
    }

    fn plan(recovery: &str) -> Plan {
        plan_with(recovery, None)
    }

    /// A plan of three durable steps, with this delivery policy.
    fn plan_with(recovery: &str, retry: Option<leasehold_engine::RetrySpec>) -> Plan {
        let spec = leasehold_engine::PlanSpec {
            input: None,
            on_failure: None,
            name: "p".into(),
            queue: None,
            recovery: recovery.into(),
            volatile_fields: vec![],
            steps: ["a", "b", "c"]
                .iter()
                .map(|c| leasehold_engine::Step {
                    code: (*c).into(),
                    executor: plans::DURABLE.into(),
                    target: None,
                    payload: json!({}),
                    retry: None,
                })
                .collect(),
            retry,
        };
        spec.into_plan(plans::KNOWN, PlanId::new("plan-1"), Timestamp::from_millis(0))
            .expect("a valid plan")
    }

    impl History {
        fn new(recovery: &str) -> Self {
            Self::with_plan(plan(recovery))
        }

        /// A resume plan's history under the policy of `max_deliveries` deliveries
        /// and backoffs of at most 400 ms.
        fn capped(max_deliveries: i64) -> Self {
            let retry = leasehold_engine::RetrySpec {
                max_deliveries: Some(max_deliveries),
                backoff_base_ms: Some(50),
                backoff_max_ms: Some(400),
                ..Default::default()
            };
            Self::with_plan(plan_with("resume", Some(retry)))
        }

        fn with_plan(plan: Plan) -> Self {
            let ids = NewIds {
                attempt: AttemptId::new("att-1"),
                command: CommandId::new("cmd-1"),
                trace: None,
            };
            let record =
                transition::enqueue(&plan, &[], Action::Execute, ids, Timestamp::from_millis(0)).expect("enqueue");
            let mut h = Self {
                plans: BTreeMap::from([(plan.id.clone(), plan.clone())]),
                plan,
                record: record.clone(),
                events: Vec::new(),
                tokens: Vec::new(),
                now: 0,
            };
            let after = h.snap(&record);
            h.push(Op::Enqueue, None, None, None, Some(after), EventOutcome::Applied);
            h
        }

        fn snap(&self, r: &AttemptRecord) -> Snap {
            let mut record = r.clone();
            let token = record
                .command
                .lease_token
                .take()
                .and_then(|t| self.tokens.iter().position(|x| x == &t))
                .map(|p| u32::try_from(p + 1).unwrap_or(u32::MAX));
            Snap { record, token }
        }

        fn push(
            &mut self,
            op: Op,
            ordinal: Option<u32>,
            presented: Option<u32>,
            before: Option<Snap>,
            after: Option<Snap>,
            outcome: EventOutcome,
        ) {
            let seq = self.events.len() as u64;
            self.events.push(DbEvent {
                seq,
                at_ms: seq * 10,
                db_now: Timestamp::from_millis(self.now),
                decided_at: Timestamp::from_millis(self.now),
                from: "w1".into(),
                op,
                attempt: Some(self.record.attempt.id.clone()),
                ordinal,
                presented,
                before,
                after,
                outcome,
                plan_attempts: None,
                reply_lost: false,
            });
        }

        /// Applies the engine's writes, then lets `tamper` rewrite the rows after.
        fn apply(&mut self, op: Op, ordinal: Option<u32>, writes: Writes, tamper: impl FnOnce(&mut AttemptRecord)) {
            let before = self.snap(&self.record);
            let presented = before.token;
            writes.apply_to(&mut self.record);
            tamper(&mut self.record);
            let after = self.snap(&self.record);
            let presented = if op.is_claim() { after.token } else { presented };
            self.push(op, ordinal, presented, Some(before), Some(after), EventOutcome::Applied);
        }

        fn token(&self) -> LeaseToken {
            self.tokens.last().cloned().expect("a claim came first")
        }

        fn claim(&mut self, tamper: impl FnOnce(&mut AttemptRecord)) {
            self.now += 100_000;
            let token = LeaseToken::new(format!("{:032x}", self.tokens.len() + 1));
            self.tokens.push(token.clone());
            let w = transition::claim(
                &self.record,
                self.plan.recovery,
                "w1",
                token,
                60_000,
                Timestamp::from_millis(self.now),
            )
            .expect("claim");
            self.apply(Op::Claim, None, w, tamper);
        }

        /// A claim that finds the attempt exhausted, as the engine decides it.
        fn claim_exhausting(&mut self) {
            self.now += 100_000;
            let now = Timestamp::from_millis(self.now);
            let why = transition::claim_exhausts(&self.record, &self.plan, now).expect("exhausted");
            let w = transition::exhaust(&self.record, why, now);
            self.apply(Op::Claim, None, w, |_| {});
        }

        /// The lease holder gives the command back after `delay_ms`.
        fn give_back(&mut self, delay_ms: u64, tamper: impl FnOnce(&mut AttemptRecord)) {
            let now = Timestamp::from_millis(self.now);
            let (_, w) = transition::give_back(&self.record, &self.plan, "503", delay_ms, &self.token(), now)
                .expect("give-back");
            self.apply(Op::GiveBack, None, w, tamper);
        }

        fn begin(&mut self, o: u32) {
            let w = transition::begin_step(&self.record, o, &self.token(), 60_000, Timestamp::from_millis(self.now))
                .expect("begin");
            self.apply(Op::BeginStep, Some(o), w, |_| {});
        }

        fn complete(&mut self, o: u32) {
            let w = transition::complete_step(
                &self.record,
                o,
                &json!({"o": o}),
                &json!({"tr": o}),
                &self.token(),
                60_000,
                Timestamp::from_millis(self.now),
            )
            .expect("complete");
            self.apply(Op::CompleteStep, Some(o), w, |_| {});
        }

        fn call(&self, o: u32, delivery: u32) -> CallRecord {
            let r = self.record.receipt(o).expect("a step");
            CallRecord {
                at_ms: 0,
                sent_ms: 0,
                attempt: self.record.attempt.id.clone(),
                ordinal: o,
                key: r.idempotency_key.clone(),
                sandbox: (self.plan.recovery == Recovery::Replay)
                    .then(|| plans::sandbox_id(&self.record.attempt.id, delivery)),
                delivery,
                worker: "w1".into(),
                answer: crate::target::CallAnswer::Applied,
                reply_lost: false,
                traceparent: None,
            }
        }

        fn violations(&self, calls: &[CallRecord]) -> Vec<(u8, String)> {
            let mut v = Vec::new();
            transitions(&self.events, &self.plans, &mut |i, m| v.push((i, m)));
            recovery_promises(&self.events, &self.plans, calls, &mut |i, m| v.push((i, m)));
            v
        }
    }

    /// Delivery 1 completes step 1 and begins step 2; its worker is lost; delivery 2
    /// takes over.
    fn interrupted(recovery: &str, tamper: impl FnOnce(&mut AttemptRecord)) -> History {
        let mut h = History::new(recovery);
        h.claim(|_| {});
        h.begin(1);
        h.complete(1);
        h.begin(2);
        h.claim(tamper);
        h
    }

    #[test]
    fn a_correct_resume_takeover_passes() {
        let h = interrupted("resume", |_| {});
        let calls = [h.call(1, 1), h.call(2, 1), h.call(2, 2)];
        assert_eq!(h.violations(&calls), vec![]);
        assert_eq!(h.record.receipt(1).map(|r| r.status), Some(ReceiptStatus::Succeeded));
    }

    #[test]
    fn a_correct_replay_takeover_passes() {
        let mut h = interrupted("replay", |_| {});
        h.begin(1);
        let calls = [h.call(1, 1), h.call(2, 1), h.call(1, 2)];
        assert_eq!(h.violations(&calls), vec![]);
    }

    #[test]
    fn a_resume_takeover_that_resets_a_succeeded_step_fires() {
        let h = interrupted("resume", |r| {
            r.receipts[0].status = ReceiptStatus::Pending;
            r.receipts[0].evidence = None;
            r.receipts[0].evidence_sha256 = None;
            r.receipts[0].target_receipt = None;
        });
        let v = h.violations(&[]);
        assert!(
            v.iter().any(|(i, m)| *i == 11 && m.contains("step 1 was SUCCEEDED")),
            "{v:?}"
        );
    }

    #[test]
    fn a_call_for_a_step_that_succeeded_before_the_claim_fires_under_resume() {
        let h = interrupted("resume", |_| {});
        let calls = [h.call(1, 1), h.call(2, 1), h.call(1, 2)];
        let v = h.violations(&calls);
        assert!(
            v.iter()
                .any(|(i, m)| *i == 12 && m.contains("had SUCCEEDED before the claim")),
            "{v:?}"
        );
    }

    #[test]
    fn a_resume_takeover_that_keeps_the_ambiguous_step_running_fires() {
        let h = interrupted("resume", |r| r.receipts[1].status = ReceiptStatus::Running);
        let v = h.violations(&[]);
        assert!(
            v.iter()
                .any(|(i, m)| *i == 11 && m.contains("step 2 went RUNNING -> RUNNING")),
            "{v:?}"
        );
    }

    #[test]
    fn a_takeover_that_changes_a_key_fires() {
        let h = interrupted("resume", |r| r.receipts[1].idempotency_key = "ik-other".into());
        let v = h.violations(&[]);
        assert!(
            v.iter().any(|(i, m)| *i == 11 && m.contains("idempotency key changed")),
            "{v:?}"
        );
    }

    #[test]
    fn a_replay_takeover_that_keeps_succeeded_evidence_fires() {
        let mut h = History::new("replay");
        h.claim(|_| {});
        h.begin(1);
        h.complete(1);
        h.begin(2);
        let kept = h.record.receipts[0].clone();
        h.claim(move |r| r.receipts[0] = kept);
        let v = h.violations(&[]);
        assert!(
            v.iter()
                .any(|(i, m)| *i == 11 && m.contains("step 1 went SUCCEEDED -> SUCCEEDED")),
            "{v:?}"
        );
    }

    #[test]
    fn a_replay_call_outside_its_deliverys_sandbox_fires() {
        let mut h = interrupted("replay", |_| {});
        h.begin(1);
        let mut stale = h.call(1, 2);
        stale.sandbox = Some(plans::sandbox_id(&h.record.attempt.id, 1));
        let v = h.violations(&[h.call(1, 1), h.call(2, 1), stale]);
        assert!(v.iter().any(|(i, m)| *i == 12 && m.contains("fresh sandbox")), "{v:?}");
    }

    #[test]
    fn a_replay_delivery_that_does_not_start_at_step_one_fires() {
        let h = interrupted("replay", |_| {});
        let v = h.violations(&[h.call(1, 1), h.call(2, 1), h.call(2, 2)]);
        assert!(
            v.iter().any(|(i, m)| *i == 12 && m.contains("left step 1 next")),
            "{v:?}"
        );
    }

    #[test]
    fn a_call_from_a_delivery_no_claim_made_fires() {
        let h = interrupted("resume", |_| {});
        let v = h.violations(&[h.call(1, 3)]);
        assert!(v.iter().any(|(i, m)| *i == 12 && m.contains("no claim made")), "{v:?}");
    }

    #[test]
    fn a_step_completed_without_a_call_from_its_delivery_fires() {
        let h = interrupted("resume", |_| {});
        let v = h.violations(&[]);
        assert!(
            v.iter()
                .any(|(i, m)| *i == 12 && m.contains("step 1 SUCCEEDED under delivery 1, which never called")),
            "{v:?}"
        );
    }

    #[test]
    fn an_abort_that_rewrites_a_succeeded_step_fires() {
        let mut h = interrupted("resume", |_| {});
        let w = transition::abort(&h.record, "stop", Timestamp::from_millis(h.now)).expect("abort");
        h.apply(Op::Abort, None, w, |r| r.receipts[0].status = ReceiptStatus::Aborted);
        let v = h.violations(&[]);
        assert!(
            v.iter()
                .any(|(i, m)| *i == 11 && m.contains("step 1 was SUCCEEDED and abort rewrote it")),
            "{v:?}"
        );
    }

    #[test]
    fn a_reconcile_that_does_not_reset_the_ambiguous_step_fires() {
        let mut h = History::new("resume");
        h.claim(|_| {});
        h.begin(1);
        h.now += 100_000;
        let (_, w) =
            transition::reconcile(&h.record, Recovery::Resume, Timestamp::from_millis(h.now)).expect("reconcile");
        h.apply(Op::Reconcile, None, w, |r| {
            r.receipts[0].status = ReceiptStatus::Running
        });
        let v = h.violations(&[]);
        assert!(
            v.iter()
                .any(|(i, m)| *i == 11 && m.contains("step 1 went RUNNING -> RUNNING")),
            "{v:?}"
        );
    }

    #[test]
    fn a_refused_request_that_changed_rows_fires() {
        let mut h = History::new("resume");
        h.claim(|_| {});
        let before = h.snap(&h.record);
        let mut after = before.clone();
        after.record.receipts[0].status = ReceiptStatus::Running;
        h.push(
            Op::BeginStep,
            Some(1),
            Some(9),
            Some(before),
            Some(after),
            EventOutcome::Refused("stale".into()),
        );
        let v = h.violations(&[]);
        assert!(
            v.iter()
                .any(|(i, m)| *i == 11 && m.contains("refused but the rows changed")),
            "{v:?}"
        );
    }

    #[test]
    fn a_step_that_begins_out_of_order_fires() {
        let mut h = History::new("resume");
        h.claim(|_| {});
        let w = transition::begin_step(&h.record, 1, &h.token(), 60_000, Timestamp::from_millis(h.now)).expect("begin");
        h.apply(Op::BeginStep, Some(1), w, |r| {
            r.receipts[1].status = ReceiptStatus::Running
        });
        let v = h.violations(&[]);
        assert!(
            v.iter()
                .any(|(i, m)| *i == 11 && m.contains("step 2 went PENDING -> RUNNING")),
            "{v:?}"
        );
    }

    #[test]
    fn a_finish_that_keeps_the_token_fires() {
        let mut h = History::new("resume");
        h.claim(|_| {});
        for o in 1..=3 {
            h.begin(o);
            h.complete(o);
        }
        let token = h.token();
        let w = transition::finish(&h.record, &token, Timestamp::from_millis(h.now)).expect("finish");
        h.apply(Op::Finish, None, w, |r| r.command.lease_token = Some(token));
        let v = h.violations(&[h.call(1, 1), h.call(2, 1), h.call(3, 1)]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].1.contains("the table says no token"), "{v:?}");
    }

    #[test]
    fn rows_that_changed_between_events_fire() {
        let mut h = History::new("resume");
        h.claim(|_| {});
        h.record.receipts[2].status = ReceiptStatus::Succeeded;
        h.begin(1);
        let v = h.violations(&[]);
        assert!(
            v.iter()
                .any(|(i, m)| *i == 11 && m.contains("differ from what the previous event left")),
            "{v:?}"
        );
    }

    #[test]
    fn a_give_back_and_a_claim_that_exhausts_pass() {
        let mut h = History::capped(2);
        h.claim(|_| {});
        h.begin(1);
        h.give_back(100, |_| {});
        assert_eq!(h.record.command.status, CommandStatus::Pending);
        h.claim(|_| {});
        h.begin(1);
        h.claim_exhausting();
        assert_eq!(h.record.attempt.status, AttemptStatus::Failed);
        let calls = [h.call(1, 1), h.call(1, 2)];
        assert_eq!(h.violations(&calls), vec![]);
    }

    #[test]
    fn a_give_back_that_exhausts_passes() {
        let mut h = History::capped(1);
        h.claim(|_| {});
        h.begin(1);
        h.give_back(100, |_| {});
        assert!(h
            .record
            .attempt
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("exhausted: deliveries")));
        assert_eq!(h.violations(&[h.call(1, 1)]), vec![]);
    }

    #[test]
    fn a_give_back_past_the_longest_backoff_fires() {
        let mut h = History::capped(4);
        h.claim(|_| {});
        h.begin(1);
        let late = Timestamp::from_millis(h.now + 5_000);
        h.give_back(100, |r| r.command.available_at = late);
        let v = h.violations(&[h.call(1, 1)]);
        assert!(
            v.iter().any(|(i, m)| *i == 11 && m.contains("available_at is 5000 ms")),
            "{v:?}"
        );
    }

    #[test]
    fn a_give_back_that_keeps_the_step_running_fires() {
        let mut h = History::capped(4);
        h.claim(|_| {});
        h.begin(1);
        h.give_back(100, |r| r.receipts[0].status = ReceiptStatus::Running);
        let v = h.violations(&[h.call(1, 1)]);
        assert!(
            v.iter()
                .any(|(i, m)| *i == 11 && m.contains("step 1 went RUNNING -> RUNNING")),
            "{v:?}"
        );
    }

    #[test]
    fn a_claim_past_the_delivery_cap_fires_11_and_15() {
        let mut h = History::capped(1);
        h.claim(|_| {});
        h.begin(1);
        h.claim(|_| {});
        let v = h.violations(&[h.call(1, 1)]);
        assert!(
            v.iter()
                .any(|(i, m)| *i == 11 && m.contains("though it was exhausted: deliveries")),
            "{v:?}"
        );
        let mut cap = Vec::new();
        crate::delivery::delivery_cap(&h.events, &h.plans, &mut |i, m| cap.push((i, m)));
        assert_eq!(cap.len(), 1, "{cap:?}");
        assert!(
            cap[0].1.contains("delivery 2") && cap[0].1.contains("max_deliveries 1"),
            "{cap:?}"
        );
    }

    #[test]
    fn a_claim_before_available_at_fires_14() {
        let mut h = History::capped(4);
        h.claim(|_| {});
        h.begin(1);
        h.give_back(300, |_| {});
        let mut v = Vec::new();
        crate::delivery::claims_after_available(&h.events, &mut |i, m| v.push((i, m)));
        assert_eq!(v, vec![], "a give-back is no claim");
        let before = h.snap(&h.record);
        let mut after = before.clone();
        after.record.command.status = CommandStatus::Processing;
        h.now += 10;
        h.push(
            Op::Claim,
            None,
            Some(9),
            Some(before),
            Some(after),
            EventOutcome::Applied,
        );
        crate::delivery::claims_after_available(&h.events, &mut |i, m| v.push((i, m)));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].1.contains("(290 ms early)"), "{v:?}");
    }
}
