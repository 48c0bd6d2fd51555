//! The delivery policy's invariants: 14–18.
//!
//! Contract: each function reads only what the run recorded (the db host's events,
//! the latest rows, the registered plans, the target's calls and effects, the fault
//! log and the run's [`Timing`]) and pushes one message per broken rule, naming
//! attempts, steps, deliveries and times, never token text.
//!
//! 14. No claim took a PENDING command before its `available_at`, by the db host's
//!     own clock: a give-back's backoff and a scheduled start hold.
//! 15. No delivery took a command past its policy's `max_deliveries` (the policy of
//!     the step the claim delivered).
//! 16. An attempt through a step whose target is always down ends FAILED with an
//!     `exhausted` error (or ABORTED by the operator), and within its bound
//!     ([`exhaustion_bound_ms`]) of fault-free time from its start: time that any
//!     fault window covers ([`FaultLog::covered_ms`]) does not count.
//! 17. No step is called after its attempt ended: every call the target received
//!     was sent before the event that made its attempt terminal, unless the sender
//!     could not know yet (an abort less than a lease earlier) or a fault touched
//!     the sender during its delivery.
//! 18. An attempt through flaky or throttled steps (and no down one) that no fault
//!     touched ends SUCCEEDED, and the target applied each of its keys exactly once.

use crate::checker::{sandbox_of, CheckInput, FaultLog};
use crate::db::{DbEvent, EventOutcome, Snap};
use crate::plans;
use crate::target::CallRecord;
use leasehold_engine::lease::heartbeat_ms;
use leasehold_engine::{AttemptId, AttemptStatus, CommandStatus, Op, Plan, Step};
use std::collections::{BTreeMap, BTreeSet};

/// The run's timing, for the invariants that bound time (16–18).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The workers' lease.
    pub lease_ms: u64,
    /// The workers' poll interval.
    pub poll_interval_ms: u64,
    /// Every ledger request's deadline.
    pub rpc_timeout_ms: u64,
    /// The network's largest latency.
    pub latency_max_ms: u64,
    /// The target's slowdown (it answers after `delay_ms` times this).
    pub target_slowdown: u64,
    /// Simulated time when the run ended.
    pub end_ms: u64,
}

/// Invariant 14: no claim of a PENDING command before its `available_at` (db time).
pub fn claims_after_available(events: &[DbEvent], push: &mut impl FnMut(u8, String)) {
    for e in events
        .iter()
        .filter(|e| e.op.is_claim() && e.outcome == EventOutcome::Applied)
    {
        let (Some(id), Some(b)) = (&e.attempt, &e.before) else {
            continue;
        };
        let c = &b.record.command;
        if c.status == CommandStatus::Pending && c.available_at > e.db_now {
            push(
                14,
                format!(
                    "event #{}: {} of {id} by {} at db time {} took a command available only from {} ({} ms early)",
                    e.seq,
                    e.op,
                    e.from,
                    e.db_now,
                    c.available_at,
                    c.available_at.millis_since(e.db_now)
                ),
            );
        }
    }
}

/// Invariant 15: `delivery_count` never passes the policy's `max_deliveries`.
pub fn delivery_cap(
    events: &[DbEvent],
    plans: &BTreeMap<leasehold_engine::PlanId, Plan>,
    push: &mut impl FnMut(u8, String),
) {
    let mut reported: BTreeSet<&AttemptId> = BTreeSet::new();
    for e in events.iter().filter(|e| e.is_delivery()) {
        let (Some(id), Some(b), Some(a)) = (&e.attempt, &e.before, &e.after) else {
            continue;
        };
        let Some(plan) = plans.get(&b.record.attempt.plan_id) else {
            continue;
        };
        let cap = plan.policy_of(&b.record).max_deliveries;
        let n = a.record.command.delivery_count;
        if n > cap && reported.insert(id) {
            push(
                15,
                format!(
                    "event #{}: {} by {} made delivery {n} of {id}, past its policy's max_deliveries {cap}",
                    e.seq, e.op, e.from
                ),
            );
        }
    }
}

/// An attempt's life in simulated time: from when its command first became
/// claimable to the event that made it terminal (or the end of the run).
#[derive(Debug, Clone, Copy)]
struct Life {
    start_ms: u64,
    end_ms: u64,
    ended: bool,
}

/// When each attempt started (its enqueue, plus a scheduled start) and ended.
fn lives(events: &[DbEvent], end_ms: u64) -> BTreeMap<&AttemptId, Life> {
    let mut lives: BTreeMap<&AttemptId, Life> = BTreeMap::new();
    for e in events.iter().filter(|e| e.outcome == EventOutcome::Applied) {
        let (Some(id), Some(a)) = (&e.attempt, &e.after) else {
            continue;
        };
        if e.op == Op::Enqueue {
            let r = &a.record;
            let delay = r.command.available_at.millis_since(r.attempt.created_at);
            lives.insert(
                id,
                Life {
                    start_ms: e.at_ms + delay,
                    end_ms,
                    ended: false,
                },
            );
        } else if let Some(life) = lives.get_mut(id).filter(|l| !l.ended) {
            if a.record.attempt.status.is_terminal() {
                (life.end_ms, life.ended) = (e.at_ms.max(life.start_ms), true);
            }
        }
    }
    lives
}

/// The steps of `s`'s attempt, as its plan defines them.
fn steps_of<'p>(plan: &'p Plan, s: &Snap) -> Vec<&'p Step> {
    s.record
        .receipts
        .iter()
        .filter_map(|r| plan.step(&r.step_code))
        .collect()
}

/// How long an attempt of `plan` through `steps` may stay open, fault-free, before its
/// down step must have exhausted it: for each of `max_deliveries` deliveries, a
/// lease, a poll and every step called `step_max_tries` times (each call the
/// target's answer time and the driver's pause between tries), plus the longest
/// backoff before each delivery; no more than the deadline, if the policy has one,
/// plus one such delivery and one backoff.
pub fn exhaustion_bound_ms(plan: &Plan, steps: &[&Step], t: &Timing) -> u64 {
    let down = steps.iter().find(|s| plans::is_down(s)).map_or("", |s| s.code.as_str());
    let policy = plan.policy(down);
    let pause = (heartbeat_ms(t.lease_ms) / 4) << policy.step_max_tries.saturating_sub(1).min(20);
    let calls: u64 = steps
        .iter()
        .map(|s| {
            let delay = s.payload.get("delay_ms").and_then(|v| v.as_u64()).unwrap_or(0);
            delay * t.target_slowdown + 2 * t.latency_max_ms + pause
        })
        .sum();
    let delivery = t.lease_ms + t.poll_interval_ms + t.rpc_timeout_ms + u64::from(policy.step_max_tries) * calls;
    let by_deliveries = u64::from(policy.max_deliveries) * (delivery + policy.backoff_max_ms);
    match policy.deadline_secs {
        Some(secs) => by_deliveries.min(secs * 1_000 + delivery + policy.backoff_max_ms),
        None => by_deliveries,
    }
}

/// The fault log's windows, plus a lease after every lost reply and every call
/// that failed in transit: what may slow or disturb a delivery.
fn disturbances(input: &CheckInput<'_>, faults: &FaultLog, lease_ms: u64) -> Vec<(u64, u64)> {
    let mut windows: Vec<(u64, u64)> = faults.windows.iter().map(|(_, a, b)| (*a, *b)).collect();
    let lost_db = input.events.iter().filter(|e| e.reply_lost).map(|e| e.at_ms);
    let lost_target = input.target.calls.iter().filter(|c| c.reply_lost).map(|c| c.at_ms);
    let failed = faults.executor_failures.iter().map(|(_, at)| *at);
    windows.extend(lost_db.chain(lost_target).chain(failed).map(|at| (at, at + lease_ms)));
    windows
}

/// Whether a fault touched attempt `id` during its `life`: a fault window of a
/// worker while it held one of the attempt's deliveries (from its claim to the next
/// claim, or the end), a window of every worker (a db restart), a failed call of a
/// holder during its delivery, a lost reply of the attempt's own, or a reconcile of it.
fn touched(input: &CheckInput<'_>, faults: &FaultLog, id: &AttemptId, life: Life) -> bool {
    let claims: Vec<(&str, u64)> = input
        .events
        .iter()
        .filter(|e| e.attempt.as_ref() == Some(id) && e.is_delivery())
        .map(|e| (e.from.as_str(), e.at_ms))
        .collect();
    let overlaps = |(a, b): (u64, u64), (from, to): (u64, u64)| a <= to && b >= from;
    let held = claims
        .iter()
        .enumerate()
        .map(|(i, (w, from))| (*w, (*from, claims.get(i + 1).map_or(life.end_ms, |(_, at)| *at))));
    for (w, during) in held {
        let window = faults
            .windows
            .iter()
            .any(|(x, a, b)| x == w && overlaps((*a, *b), during));
        let failed = faults
            .executor_failures
            .iter()
            .any(|(x, at)| x == w && (during.0..=during.1).contains(at));
        if window || failed {
            return true;
        }
    }
    let everyone = faults
        .windows
        .iter()
        .any(|(x, a, b)| x == "*" && overlaps((*a, *b), (life.start_ms, life.end_ms)));
    let mine = |e: &&DbEvent| e.attempt.as_ref() == Some(id);
    everyone
        || input
            .events
            .iter()
            .filter(mine)
            .any(|e| e.reply_lost || e.op == Op::Reconcile)
        || input.target.calls.iter().any(|c| c.attempt == *id && c.reply_lost)
}

/// Invariant 16: an attempt through a down step ends exhausted within its bound.
pub fn exhausts_in_time(input: &CheckInput<'_>, t: &Timing, faults: &FaultLog, push: &mut impl FnMut(u8, String)) {
    let lives = lives(input.events, t.end_ms);
    let windows = disturbances(input, faults, t.lease_ms);
    for (id, s) in input.latest {
        let Some(plan) = input.plans.get(&s.record.attempt.plan_id) else {
            continue;
        };
        let steps = steps_of(plan, s);
        let Some(life) = lives.get(id).filter(|_| steps.iter().any(|s| plans::is_down(s))) else {
            continue;
        };
        let a = &s.record.attempt;
        let exhausted = leasehold_engine::Exhaustion::of(a).is_some();
        match a.status {
            AttemptStatus::Succeeded => push(
                16,
                format!("{id} of {} SUCCEEDED through a step whose target is down", plan.name),
            ),
            AttemptStatus::Failed if !exhausted => push(
                16,
                format!(
                    "{id} of {} ended FAILED but not exhausted: {}",
                    plan.name,
                    a.error.as_deref().unwrap_or("no error")
                ),
            ),
            _ => {}
        }
        let bound = exhaustion_bound_ms(plan, &steps, t);
        let open = life
            .end_ms
            .saturating_sub(life.start_ms)
            .saturating_sub(FaultLog::covered_ms(&windows, (life.start_ms, life.end_ms)));
        if open > bound && a.status != AttemptStatus::Aborted {
            push(
                16,
                format!(
                    "{id} of {} (target down) was open {open} ms of fault-free time from {} ms{}, past its bound of {bound} ms",
                    plan.name,
                    life.start_ms,
                    if life.ended { format!(" until {} ms", life.end_ms) } else { ", and never ended".to_owned() },
                ),
            );
        }
    }
}

/// Invariant 17: no call of a step after its attempt ended.
pub fn no_calls_after_the_end(
    input: &CheckInput<'_>,
    t: &Timing,
    faults: &FaultLog,
    push: &mut impl FnMut(u8, String),
) {
    let mut ended: BTreeMap<&AttemptId, &DbEvent> = BTreeMap::new();
    let mut claimed: BTreeMap<(&AttemptId, u32), u64> = BTreeMap::new();
    for e in input.events.iter().filter(|e| e.outcome == EventOutcome::Applied) {
        let (Some(id), Some(a)) = (&e.attempt, &e.after) else {
            continue;
        };
        if e.is_delivery() {
            claimed.insert((id, a.record.command.delivery_count), e.at_ms);
        }
        if a.record.attempt.status.is_terminal() {
            ended.entry(id).or_insert(e);
        }
    }
    let mut reported: BTreeSet<&AttemptId> = BTreeSet::new();
    for c in &input.target.calls {
        let Some(end) = ended.get(&c.attempt).filter(|e| c.sent_ms > e.at_ms) else {
            continue;
        };
        let aborted_lately = end.op == Op::Abort && c.sent_ms <= end.at_ms + t.lease_ms;
        let from = claimed.get(&(&c.attempt, c.delivery)).copied().unwrap_or(0);
        if aborted_lately || faults.excuses(&c.worker, (from, c.sent_ms), c.sent_ms) || !reported.insert(&c.attempt) {
            continue;
        }
        push(17, late_call(c, end));
    }
}

fn late_call(c: &CallRecord, end: &DbEvent) -> String {
    let status = end
        .after
        .as_ref()
        .map_or_else(String::new, |a| a.record.attempt.status.to_string());
    format!(
        "{} step {}: {} called the target at {} ms (delivery {}), {} ms after event #{} ({}) ended the attempt {status}",
        c.attempt,
        c.ordinal,
        c.worker,
        c.sent_ms,
        c.delivery,
        c.sent_ms - end.at_ms,
        end.seq,
        end.op
    )
}

/// Invariant 18: an undisturbed attempt through flaky or throttled steps succeeds,
/// each of its keys applied once.
pub fn flaky_recovers(input: &CheckInput<'_>, t: &Timing, faults: &FaultLog, push: &mut impl FnMut(u8, String)) {
    let lives = lives(input.events, t.end_ms);
    for (id, s) in input.latest {
        let Some(plan) = input.plans.get(&s.record.attempt.plan_id) else {
            continue;
        };
        let steps = steps_of(plan, s);
        let recovering = steps.iter().any(|s| plans::recovers(s)) && !steps.iter().any(|s| plans::is_down(s));
        let Some(life) = lives.get(id).filter(|_| recovering) else {
            continue;
        };
        if touched(input, faults, id, *life) || s.record.attempt.status == AttemptStatus::Aborted {
            continue;
        }
        if s.record.attempt.status != AttemptStatus::Succeeded {
            push(
                18,
                format!(
                    "{id} of {} (flaky target, no fault) ended {} after {} deliveries: {}",
                    plan.name,
                    s.record.attempt.status,
                    s.record.command.delivery_count,
                    s.record.attempt.error.as_deref().unwrap_or("no error")
                ),
            );
            continue;
        }
        for r in &s.record.receipts {
            let effects = input
                .target
                .keys
                .get(&(r.idempotency_key.clone(), sandbox_of(r)))
                .map_or(0, |k| k.effects);
            if effects != 1 {
                push(
                    18,
                    format!(
                        "{id} of {} step {} SUCCEEDED with {effects} effects of its key at the target",
                        plan.name, r.ordinal
                    ),
                );
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_engine::{PlanId, Timestamp};

    fn timing() -> Timing {
        Timing {
            lease_ms: 3_000,
            poll_interval_ms: 250,
            rpc_timeout_ms: 600,
            latency_max_ms: 10,
            target_slowdown: 1,
            end_ms: 60_000,
        }
    }

    fn plan(name: &str) -> Plan {
        let spec = plans::named(&[name.to_owned()]).expect("a known plan").remove(0);
        spec.into_plan(plans::KNOWN, PlanId::new("p"), Timestamp::from_millis(0))
            .expect("a valid plan")
    }

    #[test]
    fn covered_time_counts_overlaps_once_and_clips_to_the_interval() {
        let windows = [(0, 10), (5, 20), (30, 40), (100, 200)];
        assert_eq!(FaultLog::covered_ms(&windows, (8, 35)), 12 + 5);
        assert_eq!(FaultLog::covered_ms(&windows, (50, 90)), 0);
        assert_eq!(FaultLog::covered_ms(&[(0, u64::MAX)], (7, 9)), 2);
    }

    #[test]
    fn the_bound_follows_the_policy_and_the_deadline_caps_it() {
        let t = timing();
        let dead = plan("dead-target");
        let steps: Vec<&Step> = dead.steps.iter().collect();
        // Per delivery: lease, poll, rpc deadline, and two tries of each step, each
        // its answer time (delay + two latencies) and a pause of 250 << 1.
        let delivery = 3_000 + 250 + 600 + 2 * ((150 + 20 + 500) + (200 + 20 + 500));
        assert_eq!(exhaustion_bound_ms(&dead, &steps, &t), 4 * (delivery + 400));
        let deadline = plan("dead-deadline");
        let steps: Vec<&Step> = deadline.steps.iter().collect();
        let delivery = 3_000 + 250 + 600 + 2 * (100 + 20 + 500);
        assert_eq!(exhaustion_bound_ms(&deadline, &steps, &t), 3_000 + delivery + 400);
    }
}
