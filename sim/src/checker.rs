//! The invariant checker: what every seed must satisfy.
//!
//! Contract: [`check`] reads only what the run recorded — the db host's event log and
//! latest rows, the target's effect records, the clients' log and the liveness
//! verdict — and answers one [`Violation`] per broken rule (empty on a pass). The
//! invariants, numbered as in docs/verification.md:
//! 1. No transition from a non-current lease token was ever applied.
//! 2. At most one live lease per command at any db-time instant: no claim or
//!    reconcile ended a lease before it expired (abort may: it fences).
//! 3. Terminal attempts and their receipts never change afterwards.
//! 4. Steps begin in order; no receipt is RUNNING or SUCCEEDED before its
//!    predecessors SUCCEEDED.
//! 5. The target applied at most one effect per idempotency key (per sandbox); one
//!    key per step; every succeeded receipt holds the target receipt of its key.
//! 6. `delivery_count` equals 1 plus the takeovers the history shows (the claims).
//! 7. Every acknowledged enqueue exists; a refused enqueue left nothing behind; every
//!    attempt came from an applied enqueue.
//! 8. Liveness: after healing, every attempt is terminal within the bound.
//! 9. Every successful forward attempt of a plan has the plan's reference semantic
//!    fingerprint (the same on every seed), their raw fingerprints differ, and a
//!    `replay` attempt's receipts all come from its last delivery's sandbox.
//! 10. No lease token appears in any trace line or report ([`scan_for_tokens`]).
//! 11. Every committed image follows the transition table of docs/design.md
//!     ([`crate::history::transitions`]).
//! 12. The target's calls keep the recovery promises, each call checked against the
//!     delivery it came from ([`crate::history::recovery_promises`]).
//! 13. A healthy holder keeps its lease: no claim or reconcile ended a lease whose
//!     holder no fault touched between the claim that granted it and its end ([`FaultLog`]:
//!     a crash, pause, partition or hold of that worker, a db restart, a lost reply
//!     to it, a clock of it or of the db beyond the bound, or the executor failing
//!     as often as the driver tolerates). The design renews a lease at a third of
//!     its length so that this never happens.
//! 14. No claim of a command before its `available_at` ([`crate::delivery`], as are
//!     15–18).
//! 15. No delivery past the policy's `max_deliveries`.
//! 16. An attempt whose target is down ends exhausted within the policy's bound.
//! 17. No call of a step after its attempt ended.
//! 18. An attempt through flaky targets that no fault touched ends SUCCEEDED, each
//!     key applied once.
//!
//! Messages name attempts, steps and token ordinals (`token#3`), never token text.

use crate::clients::ClientLog;
use crate::db::{lease_live, DbEvent, EventOutcome, Snap};
use crate::delivery::{self, Timing};
use crate::history;
use crate::plans;
use crate::target::TargetState;
use leasehold_engine::canonical::canonical_json;
use leasehold_engine::evidence::{raw_fingerprint, semantic_fingerprint};
use leasehold_engine::{AttemptId, AttemptStatus, CommandStatus, Op, Plan, PlanId, Receipt, ReceiptStatus, Recovery};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's number (0: the simulation itself failed).
    pub invariant: u8,
    /// What happened.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.invariant, self.message)
    }
}

/// What the checker reads.
#[derive(Debug, Clone, Copy)]
pub struct CheckInput<'a> {
    /// The db host's event log.
    pub events: &'a [DbEvent],
    /// The latest rows of every attempt.
    pub latest: &'a BTreeMap<AttemptId, Snap>,
    /// The registered plans.
    pub plans: &'a BTreeMap<PlanId, Plan>,
    /// The target's records.
    pub target: &'a TargetState,
    /// The clients' log.
    pub clients: &'a ClientLog,
    /// The liveness failure, if the run had one.
    pub liveness: Option<&'a str>,
    /// What touched each worker, for invariants 13 and 16–18 (`None`: not checked
    /// here).
    pub faults: Option<&'a FaultLog>,
    /// The run's timing, for invariants 16–18 (`None`: not checked here).
    pub timing: Option<&'a Timing>,
}

/// What may make a lease's holder lose it (invariant 13), per worker.
#[derive(Debug, Clone, Default)]
pub struct FaultLog {
    /// `(worker, from ms, to ms)`: a fault touched that worker (every worker, for
    /// `*`) in this interval of simulated time.
    pub windows: Vec<(String, u64, u64)>,
    /// `(worker, at ms)`: executor calls of that worker that failed transiently.
    pub executor_failures: Vec<(String, u64)>,
}

impl FaultLog {
    /// Whether a fault touched `worker` between `from` and `to`, or its executor
    /// failed as often as the driver tolerates between `from` and `ended` (so it
    /// gave the lease up).
    pub fn excuses(&self, worker: &str, (from, to): (u64, u64), ended: u64) -> bool {
        let touched = self
            .windows
            .iter()
            .any(|(w, a, b)| (w == worker || w == "*") && *a <= to && *b >= from);
        let failures = self
            .executor_failures
            .iter()
            .filter(|(w, at)| w == worker && (from..=ended).contains(at))
            .count();
        touched || failures >= leasehold_engine::driver::EXECUTOR_ATTEMPTS_MAX as usize
    }

    /// How much of `(from, to)` the `windows` cover together, each instant counted
    /// once.
    pub fn covered_ms(windows: &[(u64, u64)], (from, to): (u64, u64)) -> u64 {
        let mut clipped: Vec<(u64, u64)> = windows
            .iter()
            .map(|(a, b)| ((*a).max(from), (*b).min(to)))
            .filter(|(a, b)| a < b)
            .collect();
        clipped.sort_unstable();
        let (mut total, mut reach) = (0, from);
        for (a, b) in clipped {
            let a = a.max(reach);
            if b > a {
                total += b - a;
                reach = b;
            }
        }
        total
    }
}

/// Checks invariants 1–9 and 11–18.
pub fn check(input: &CheckInput<'_>) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut push = |invariant: u8, message: String| v.push(Violation { invariant, message });
    fenced_writes(input, &mut push);
    single_lease(input, &mut push);
    terminal_is_final(input, &mut push);
    steps_in_order(input, &mut push);
    target_effects(input, &mut push);
    delivery_counts(input, &mut push);
    enqueues(input, &mut push);
    if let Some(l) = input.liveness {
        push(8, l.to_owned());
    }
    fingerprints(input, &mut push);
    history::transitions(input.events, input.plans, &mut push);
    history::recovery_promises(input.events, input.plans, &input.target.calls, &mut push);
    healthy_holders(input, &mut push);
    delivery::claims_after_available(input.events, &mut push);
    delivery::delivery_cap(input.events, input.plans, &mut push);
    if let (Some(t), Some(f)) = (input.timing, input.faults) {
        delivery::exhausts_in_time(input, t, f, &mut push);
        delivery::no_calls_after_the_end(input, t, f, &mut push);
        delivery::flaky_recovers(input, t, f, &mut push);
    }
    v
}

/// The invariants of one transition, for a checker that keeps only a summary of the
/// past (the model checker, [`crate::model`]): 1–4, 11, 14 and 15 on `step`, the transition's
/// own events (their rows before are the rows the previous transition left); 5, 7
/// and 9 on the latest rows and the target; 6 and 12 on `input.events`, which must
/// hold the enqueues, every applied claim so far and `step`'s other events.
pub fn check_transition(input: &CheckInput<'_>, step: &[DbEvent]) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut push = |invariant: u8, message: String| v.push(Violation { invariant, message });
    let local = CheckInput { events: step, ..*input };
    fenced_writes(&local, &mut push);
    single_lease(&local, &mut push);
    terminal_is_final(&local, &mut push);
    steps_in_order(&local, &mut push);
    target_effects(input, &mut push);
    delivery_counts(input, &mut push);
    enqueues(input, &mut push);
    fingerprints(input, &mut push);
    history::transitions(step, input.plans, &mut push);
    history::recovery_promises(input.events, input.plans, &input.target.calls, &mut push);
    delivery::claims_after_available(step, &mut push);
    delivery::delivery_cap(step, input.plans, &mut push);
    v
}

fn token(t: Option<u32>) -> String {
    t.map_or_else(|| "none".to_owned(), |t| format!("token#{t}"))
}

/// Invariant 1: An applied worker transition presented the command's current token, and the
/// command was PROCESSING.
fn fenced_writes(input: &CheckInput<'_>, push: &mut impl FnMut(u8, String)) {
    for e in input
        .events
        .iter()
        .filter(|e| e.op.is_worker() && e.outcome == EventOutcome::Applied)
    {
        let attempt = e.attempt.as_ref().map_or_else(String::new, ToString::to_string);
        match &e.before {
            None => push(
                1,
                format!("event #{}: {} applied to {attempt}, which did not exist", e.seq, e.op),
            ),
            Some(b)
                if b.record.command.status != CommandStatus::Processing
                    || b.token.is_none()
                    || b.token != e.presented =>
            {
                push(
                    1,
                    format!(
                        "event #{}: {} of {attempt} by {} applied with {} while the command was {} under {}",
                        e.seq,
                        e.op,
                        e.from,
                        token(e.presented),
                        b.record.command.status,
                        token(b.token)
                    ),
                );
            }
            Some(_) => {}
        }
    }
}

/// Invariant 2: A claim or a reconcile that ended a lease did so only after it expired.
fn single_lease(input: &CheckInput<'_>, push: &mut impl FnMut(u8, String)) {
    for e in input.events.iter().filter(|e| e.outcome == EventOutcome::Applied) {
        let (Some(b), Some(a)) = (&e.before, &e.after) else {
            continue;
        };
        let ends_lease = match e.op {
            op if op.is_claim() => true,
            Op::Reconcile => a.token != b.token,
            _ => false,
        };
        if ends_lease && lease_live(b, e.db_now) {
            push(
                2,
                format!(
                    "event #{}: {} of {} by {} at db time {} ended the live {} of {} (until {}); then {} under {}",
                    e.seq,
                    e.op,
                    a.record.attempt.id,
                    e.from,
                    e.db_now,
                    token(b.token),
                    b.record.command.lease_owner.as_deref().unwrap_or("?"),
                    b.record.command.lease_until.map_or_else(String::new, |t| t.to_string()),
                    a.record.command.status,
                    token(a.token),
                ),
            );
        }
    }
}

/// When a lease was last renewed (or granted), in simulated ms, and its length.
#[derive(Debug, Clone, Copy)]
struct Renewal {
    granted_ms: u64,
    renewed_ms: u64,
    lease_ms: u64,
}

impl Renewal {
    fn of(e: &DbEvent, granted_ms: u64) -> Option<Self> {
        let until = e.after.as_ref()?.record.command.lease_until?;
        Some(Self {
            granted_ms,
            renewed_ms: e.at_ms,
            lease_ms: until.millis_since(e.decided_at),
        })
    }

    /// The interval in which a fault could have kept the holder from renewing: from
    /// the grant to two thirds of a lease after the last renewal (the heartbeat is
    /// due at a third; the rest covers a clock within the drift bound and the
    /// round trip).
    fn window(&self, ended_ms: u64) -> (u64, u64) {
        let due = self.renewed_ms + self.lease_ms * 2 / 3;
        (self.granted_ms, due.min(ended_ms))
    }
}

/// Invariant 13: a claim or reconcile ended a lease only if a fault touched its holder
/// while it should have renewed it.
fn healthy_holders(input: &CheckInput<'_>, push: &mut impl FnMut(u8, String)) {
    let Some(faults) = input.faults else { return };
    let mut leases: BTreeMap<(&AttemptId, u32), Renewal> = BTreeMap::new();
    for e in input.events.iter().filter(|e| e.outcome == EventOutcome::Applied) {
        let (Some(id), Some(b), Some(a)) = (&e.attempt, &e.before, &e.after) else {
            continue;
        };
        let held = b.token.zip(b.record.command.lease_owner.as_deref());
        if let (Some((t, owner)), true) = (held, ends_lease(e, b, a)) {
            let (from, to) = leases.get(&(id, t)).map_or((0, e.at_ms), |r| r.window(e.at_ms));
            let lost = input
                .events
                .iter()
                .any(|x| x.reply_lost && x.from == owner && (from..=to).contains(&x.at_ms));
            if !lost && !faults.excuses(owner, (from, to), e.at_ms) {
                push(
                    13,
                    format!(
                        "event #{}: {} of {id} by {} at {} ms ended {} of {owner}, granted at {from} ms, and no fault touched {owner} until {to} ms, when it should have renewed",
                        e.seq, e.op, e.from, e.at_ms, token(Some(t))
                    ),
                );
            }
        }
        let renewed = match (e.op.is_claim(), e.presented) {
            (true, _) => a.token.and_then(|t| Some((t, Renewal::of(e, e.at_ms)?))),
            (false, Some(t)) if a.token == Some(t) && a.record.command.lease_until != b.record.command.lease_until => {
                let granted = leases.get(&(id, t)).map_or(0, |r| r.granted_ms);
                Renewal::of(e, granted).map(|r| (t, r))
            }
            _ => None,
        };
        if let Some((t, r)) = renewed {
            leases.insert((id, t), r);
        }
    }
}

/// Whether an applied claim or reconcile ended the PROCESSING lease it found.
fn ends_lease(e: &DbEvent, b: &Snap, a: &Snap) -> bool {
    (e.op.is_claim() || e.op == Op::Reconcile)
        && a.token != b.token
        && b.record.command.status == CommandStatus::Processing
}

/// Invariant 3: Once an attempt is terminal, it and its receipts stay exactly as they were.
fn terminal_is_final(input: &CheckInput<'_>, push: &mut impl FnMut(u8, String)) {
    let mut frozen: BTreeMap<&AttemptId, &Snap> = BTreeMap::new();
    let mut reported: BTreeSet<&AttemptId> = BTreeSet::new();
    let snaps = input
        .events
        .iter()
        .flat_map(|e| {
            [e.before.as_ref(), e.after.as_ref()]
                .into_iter()
                .flatten()
                .map(move |s| (Some(e.seq), s))
        })
        .chain(input.latest.values().map(|s| (None, s)));
    for (seq, s) in snaps {
        let id = &s.record.attempt.id;
        match frozen.get(id) {
            Some(f)
                if (f.record.attempt != s.record.attempt || f.record.receipts != s.record.receipts)
                    && reported.insert(id) =>
            {
                let at = seq.map_or_else(|| "at the end".to_owned(), |q| format!("at event #{q}"));
                push(
                    3,
                    format!(
                        "attempt {id} changed {at} after it was {}: now {} with receipts [{}]",
                        f.record.attempt.status,
                        s.record.attempt.status,
                        receipt_statuses(&s.record.receipts)
                    ),
                );
            }
            Some(_) => {}
            None if s.record.attempt.status.is_terminal() => {
                frozen.insert(id, s);
            }
            None => {}
        }
    }
}

fn receipt_statuses(receipts: &[Receipt]) -> String {
    receipts
        .iter()
        .map(|r| format!("{}:{}", r.ordinal, r.status))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Invariant 4: In every recorded state, a RUNNING or SUCCEEDED receipt has only SUCCEEDED
/// receipts before it.
fn steps_in_order(input: &CheckInput<'_>, push: &mut impl FnMut(u8, String)) {
    let mut reported: BTreeSet<AttemptId> = BTreeSet::new();
    let snaps = input
        .events
        .iter()
        .filter_map(|e| e.after.as_ref().map(|s| (format!("event #{}", e.seq), s)));
    for (at, s) in snaps {
        let mut receipts: Vec<&Receipt> = s.record.receipts.iter().collect();
        receipts.sort_by_key(|r| r.ordinal);
        let mut all_before_succeeded = true;
        for r in receipts {
            if matches!(r.status, ReceiptStatus::Running | ReceiptStatus::Succeeded) && !all_before_succeeded {
                if reported.insert(s.record.attempt.id.clone()) {
                    push(
                        4,
                        format!(
                            "{at}: attempt {} step {} is {} before its predecessors succeeded: [{}]",
                            s.record.attempt.id,
                            r.ordinal,
                            r.status,
                            receipt_statuses(&s.record.receipts)
                        ),
                    );
                }
                break;
            }
            all_before_succeeded &= r.status == ReceiptStatus::Succeeded;
        }
    }
}

fn parse(text: Option<&str>) -> Option<Value> {
    text.and_then(|t| serde_json::from_str(t).ok())
}

/// The sandbox a receipt's evidence names, if any.
pub(crate) fn sandbox_of(receipt: &Receipt) -> Option<String> {
    parse(receipt.evidence.as_deref())?
        .get("sandbox_id")?
        .as_str()
        .map(str::to_owned)
}

/// Invariant 5: One effect per key (per sandbox), one key per step, and every succeeded
/// receipt holds its key's target receipt.
fn target_effects(input: &CheckInput<'_>, push: &mut impl FnMut(u8, String)) {
    let mut keys_per_step: BTreeMap<(&AttemptId, u32, Option<&str>), BTreeSet<&str>> = BTreeMap::new();
    for ((key, sandbox), k) in &input.target.keys {
        if k.effects > 1 {
            push(
                5,
                format!(
                    "the target applied key of {} step {} {} times",
                    k.attempt, k.ordinal, k.effects
                ),
            );
        }
        keys_per_step
            .entry((&k.attempt, k.ordinal, sandbox.as_deref()))
            .or_default()
            .insert(key.as_str());
        match input.latest.get(&k.attempt).and_then(|s| s.record.receipt(k.ordinal)) {
            Some(r) if r.idempotency_key != *key => {
                push(
                    5,
                    format!(
                        "{} step {} reached the target with a key that is not its receipt's",
                        k.attempt, k.ordinal
                    ),
                );
            }
            None => push(
                5,
                format!(
                    "the target applied {} step {}, which the ledger does not have",
                    k.attempt, k.ordinal
                ),
            ),
            Some(_) => {}
        }
    }
    for ((attempt, ordinal, _), keys) in &keys_per_step {
        if keys.len() > 1 {
            push(
                5,
                format!(
                    "{attempt} step {ordinal} reached the target under {} different keys",
                    keys.len()
                ),
            );
        }
    }
    for s in input.latest.values() {
        for r in s
            .record
            .receipts
            .iter()
            .filter(|r| r.status == ReceiptStatus::Succeeded)
        {
            let id = (r.idempotency_key.clone(), sandbox_of(r));
            match input.target.keys.get(&id) {
                None => push(
                    5,
                    format!(
                        "{} step {} SUCCEEDED without any effect at the target",
                        r.attempt_id, r.ordinal
                    ),
                ),
                Some(k) if r.target_receipt.as_deref() != Some(canonical_json(&k.reply.target_receipt).as_str()) => {
                    push(
                        5,
                        format!(
                            "{} step {} records a target receipt the target never gave for its key",
                            r.attempt_id, r.ordinal
                        ),
                    );
                }
                Some(_) => {}
            }
        }
    }
}

/// Invariant 6: Every recorded `delivery_count` equals the claims applied so far.
fn delivery_counts(input: &CheckInput<'_>, push: &mut impl FnMut(u8, String)) {
    let mut claims: BTreeMap<&AttemptId, u32> = BTreeMap::new();
    let mut reported: BTreeSet<&AttemptId> = BTreeSet::new();
    for e in input.events {
        let (Some(id), Some(a)) = (&e.attempt, &e.after) else {
            continue;
        };
        if e.is_delivery() {
            *claims.entry(id).or_default() += 1;
        }
        let n = claims.get(id).copied().unwrap_or(0);
        if a.record.command.delivery_count != n && reported.insert(id) {
            push(
                6,
                format!(
                    "event #{}: {id} has delivery_count {} but the history shows {n} claims",
                    e.seq, a.record.command.delivery_count
                ),
            );
        }
    }
    for (id, s) in input.latest {
        let n = claims.get(id).copied().unwrap_or(0);
        if s.record.command.delivery_count != n && !reported.contains(id) {
            push(
                6,
                format!(
                    "{id} ends with delivery_count {} but the history shows {n} claims",
                    s.record.command.delivery_count
                ),
            );
        }
    }
}

/// Invariant 7: Acknowledged enqueues exist, refused ones left nothing, and every attempt
/// came from an applied enqueue.
fn enqueues(input: &CheckInput<'_>, push: &mut impl FnMut(u8, String)) {
    let applied: BTreeSet<&AttemptId> = input
        .events
        .iter()
        .filter(|e| e.op == Op::Enqueue && e.outcome == EventOutcome::Applied)
        .filter_map(|e| e.attempt.as_ref())
        .collect();
    for (plan, action, attempt) in &input.clients.acked {
        if !input.latest.contains_key(attempt) || !applied.contains(attempt) {
            push(
                7,
                format!("acknowledged enqueue {action} of plan {plan} ({attempt}) does not exist"),
            );
        }
    }
    for e in input.events.iter().filter(|e| e.op == Op::Enqueue) {
        match (&e.outcome, e.plan_attempts) {
            (EventOutcome::Applied, Some((before, after))) if after != before + 1 => {
                push(
                    7,
                    format!(
                        "event #{}: an enqueue changed the plan's attempts from {before} to {after}",
                        e.seq
                    ),
                );
            }
            (EventOutcome::Refused(_) | EventOutcome::Failed(_), Some((before, after))) if after != before => {
                push(
                    7,
                    format!(
                        "event #{}: a refused enqueue left {} attempts behind",
                        e.seq,
                        after - before
                    ),
                );
            }
            _ => {}
        }
    }
    for id in input.latest.keys() {
        if !applied.contains(id) {
            push(7, format!("attempt {id} exists without an applied enqueue"));
        }
    }
}

/// Invariant 9: Semantic fingerprints of successful forward attempts match the plan's
/// reference; raw fingerprints differ; replay receipts share the last sandbox.
fn fingerprints(input: &CheckInput<'_>, push: &mut impl FnMut(u8, String)) {
    for plan in input.plans.values() {
        let mut raw: BTreeMap<String, &AttemptId> = BTreeMap::new();
        let successes = input.latest.values().filter(|s| {
            s.record.attempt.plan_id == plan.id
                && s.record.attempt.action.is_forward()
                && s.record.attempt.status == AttemptStatus::Succeeded
        });
        for s in successes {
            let r = &s.record;
            // A template's reference is that of the steps its input resolved.
            let reference = plans::reference_fingerprint(&plans::as_run(plan, r));
            let semantic = semantic_fingerprint(plan, &r.receipts);
            if semantic != reference {
                push(
                    9,
                    format!(
                        "attempt {} of {} has semantic fingerprint {} but the plan's is {}",
                        r.attempt.id,
                        plan.name,
                        &semantic[..12],
                        &reference[..12]
                    ),
                );
            }
            let rf = raw_fingerprint(&r.receipts);
            if let Some(other) = raw.insert(rf, &r.attempt.id) {
                push(
                    9,
                    format!(
                        "attempts {other} and {} of {} have the same raw fingerprint",
                        r.attempt.id, plan.name
                    ),
                );
            }
            if plan.recovery == Recovery::Replay {
                let expected = plans::sandbox_id(&r.attempt.id, r.command.delivery_count);
                for receipt in &r.receipts {
                    if sandbox_of(receipt).as_deref() != Some(expected.as_str()) {
                        push(
                            9,
                            format!(
                                "attempt {} step {} kept evidence from sandbox {} instead of its last delivery's {expected}",
                                r.attempt.id,
                                receipt.ordinal,
                                sandbox_of(receipt).unwrap_or_else(|| "none".into())
                            ),
                        );
                        break;
                    }
                }
            }
        }
    }
}

/// Invariant 10: No line holds any lease token's text. Tokens are 32 hex digits: every such
/// run in the lines is collected once and looked up, so the scan is linear.
pub fn scan_for_tokens(lines: &[String], tokens: &[String]) -> Vec<Violation> {
    let tokens: BTreeSet<&str> = tokens.iter().map(String::as_str).collect();
    let mut v = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let bytes = line.as_bytes();
        let mut start = 0;
        while start < bytes.len() {
            let run = bytes[start..].iter().take_while(|b| b.is_ascii_hexdigit()).count();
            if run >= 32 {
                let window_hit = (0..=run - 32).any(|o| tokens.contains(&line[start + o..start + o + 32]));
                if window_hit {
                    v.push(Violation {
                        invariant: 10,
                        message: format!("trace line {} contains a lease token", i + 1),
                    });
                    break;
                }
            }
            start += run.max(1);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_scan_finds_a_token_anywhere_in_a_line() {
        let tok = "0123456789abcdef0123456789abcdef".to_owned();
        let lines = vec!["clean line".to_owned(), format!("leak:x{tok}y"), format!("{tok}")];
        let v = scan_for_tokens(&lines, &[tok]);
        assert_eq!(v.len(), 2);
        assert!(!v[0].message.contains("0123456789abcdef"));
    }
}
