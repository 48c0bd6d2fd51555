//! The per-target limits' invariants: 20–22.
//!
//! Contract: [`check`] reads only the db host's event log (the applied events' row
//! images before and after, at the db host's own time) and the limits the profile set
//! on the ledger when the world started ([`crate::profile::LimitParams`]), and pushes
//! one [`Violation`] per broken rule, naming attempts, targets, instants and token
//! ordinals, never token text. A lease **enters** target `T` at an applied event
//! whose after-image is PROCESSING on `T` (`command.target`) under a lease that the
//! before-image did not hold on `T`: a claim, or a worker write that moves its lease
//! onto a step of `T` (the ledger's own rule, read from the images).
//!
//! 20. At every db-time instant, the live leases on `T` (PROCESSING on `T` with
//!     `lease_until` at or after that instant) number at most `max_in_flight`. The
//!     count can only grow where a lease becomes live on `T` (an entry, or a
//!     renewal of a lease that had expired), so it is taken there.
//! 21. The entries into `T` never number more than `rate.count` within any half-open
//!     window `[t, t + rate.per_ms)` of db time.
//! 22. `T`'s breaker, replayed from the log: every applied give-back is a failure of
//!     the target its before-image's command was on, every receipt that an applied
//!     worker write made SUCCEEDED a success of its receipt's target; `failures`
//!     consecutive failures open it until `cooldown_ms` after the last of them, a
//!     success closes it. While it is open, no lease enters `T`; once its cool-down
//!     has passed (half-open), a lease enters `T` only if no earlier probe still holds
//!     a live lease on `T`, and that lease is the new probe, until an outcome closes
//!     or reopens the breaker.

use crate::checker::Violation;
use crate::db::{DbEvent, EventOutcome, Snap};
use leasehold_engine::limits::{Breaker, TargetLimit};
use leasehold_engine::{AttemptId, CommandStatus, Op, ReceiptStatus, Timestamp};
use std::collections::BTreeMap;

/// Invariants 20–22 over `events`, for every target `limits` names.
pub fn check(events: &[DbEvent], limits: &[TargetLimit]) -> Vec<Violation> {
    let mut out = Vec::new();
    for limit in limits {
        let mut walk = Walk::new(limit);
        for e in events.iter().filter(|e| e.outcome == EventOutcome::Applied) {
            walk.step(e, &mut out);
        }
        walk.rate(&mut out);
    }
    out
}

/// Whether `after` holds a lease on its command's target that `before` did not hold
/// there: the lease entered that target.
pub fn enters(before: Option<&Snap>, after: &Snap) -> bool {
    let a = &after.record.command;
    if a.status != CommandStatus::Processing || a.target.is_empty() {
        return false;
    }
    before.is_none_or(|b| {
        let c = &b.record.command;
        let same_lease = c.status == CommandStatus::Processing && b.token == after.token;
        !same_lease || c.target != a.target
    })
}

/// The end of the lease `snap` holds on `target`, if it holds one.
fn lease_on(snap: &Snap, target: &str) -> Option<Timestamp> {
    let c = &snap.record.command;
    (c.status == CommandStatus::Processing && c.target == target)
        .then_some(c.lease_until)
        .flatten()
}

/// The breaker as the log replays it.
#[derive(Debug, Default)]
struct BreakerLog {
    failures: u32,
    open_until: Option<Timestamp>,
    probe: Option<AttemptId>,
}

/// One target's walk over the log.
struct Walk<'a> {
    limit: &'a TargetLimit,
    /// The end of every lease held on the target, by attempt.
    leases: BTreeMap<AttemptId, Timestamp>,
    /// Every entry: its instant, its event and its attempt.
    entries: Vec<(Timestamp, u64, AttemptId)>,
    breaker: BreakerLog,
}

impl<'a> Walk<'a> {
    fn new(limit: &'a TargetLimit) -> Self {
        Self {
            limit,
            leases: BTreeMap::new(),
            entries: Vec::new(),
            breaker: BreakerLog::default(),
        }
    }

    fn live(&self, id: &AttemptId, now: Timestamp) -> bool {
        self.leases.get(id).is_some_and(|until| *until >= now)
    }

    /// One applied event: its outcomes for the breaker, then its entry, then the
    /// lease it leaves.
    fn step(&mut self, e: &DbEvent, out: &mut Vec<Violation>) {
        let (Some(id), Some(after)) = (&e.attempt, &e.after) else {
            return;
        };
        let now = e.db_now;
        if e.op.is_worker() {
            self.outcomes(e, now);
        }
        let target = self.limit.target.as_str();
        let entered = after.record.command.target == target && enters(e.before.as_ref(), after);
        if entered {
            if let Some(message) = self.admitted_by_breaker(id, now) {
                out.push(Violation {
                    invariant: 22,
                    message: format!("event #{}: {} of {id} by {}: {message}", e.seq, e.op, e.from),
                });
            }
            self.entries.push((now, e.seq, id.clone()));
        }
        let was_live = self.live(id, now);
        match lease_on(after, target) {
            Some(until) => self.leases.insert(id.clone(), until),
            None => self.leases.remove(id),
        };
        if self.live(id, now) && (entered || !was_live) {
            self.in_flight(e, id, now, out);
        }
    }

    /// Invariant 20 at `now`, where `id`'s lease became live on the target.
    fn in_flight(&self, e: &DbEvent, id: &AttemptId, now: Timestamp, out: &mut Vec<Violation>) {
        let Some(max) = self.limit.max_in_flight else { return };
        let live: Vec<String> = self
            .leases
            .iter()
            .filter(|(_, until)| **until >= now)
            .map(|(a, _)| a.to_string())
            .collect();
        if live.len() > max as usize {
            out.push(Violation {
                invariant: 20,
                message: format!(
                    "event #{}: {} of {id} by {} at db time {now} made {} leases live on {} (max_in_flight {max}): {}",
                    e.seq,
                    e.op,
                    e.from,
                    live.len(),
                    self.limit.target,
                    live.join(", ")
                ),
            });
        }
    }

    /// What an applied worker write tells the breaker: a give-back is a failure of
    /// the target it gave back, a step made SUCCEEDED a success of its target.
    fn outcomes(&mut self, e: &DbEvent, now: Timestamp) {
        let Some(breaker) = self.limit.breaker else { return };
        let target = self.limit.target.as_str();
        let Some(before) = &e.before else { return };
        if e.op == Op::GiveBack {
            if before.record.command.target == target {
                self.failed(breaker, now);
            }
            return;
        }
        let Some(after) = &e.after else { return };
        let succeeded = after.record.receipts.iter().any(|r| {
            r.status == ReceiptStatus::Succeeded
                && r.target == target
                && before
                    .record
                    .receipt(r.ordinal)
                    .is_some_and(|b| b.status != ReceiptStatus::Succeeded)
        });
        if succeeded {
            self.breaker = BreakerLog::default();
        }
    }

    fn failed(&mut self, breaker: Breaker, now: Timestamp) {
        let b = &mut self.breaker;
        b.failures = b.failures.saturating_add(1);
        if b.failures >= breaker.failures {
            b.open_until = Some(now.plus_ms(breaker.cooldown_ms));
            b.probe = None;
        }
    }

    /// Invariant 22 for an entry of `id` at `now`: why the breaker should have
    /// refused it, if it should have; else the entry is taken as the probe of a
    /// half-open breaker.
    fn admitted_by_breaker(&mut self, id: &AttemptId, now: Timestamp) -> Option<String> {
        let breaker = self.limit.breaker?;
        let until = self
            .breaker
            .open_until
            .filter(|_| self.breaker.failures >= breaker.failures)?;
        let target = &self.limit.target;
        if now < until {
            return Some(format!(
                "entered {target} at db time {now} while its breaker was open until {until} ({} consecutive give-backs)",
                self.breaker.failures
            ));
        }
        if let Some(probe) = self.breaker.probe.as_ref().filter(|p| self.live(p, now)) {
            return Some(format!(
                "entered {target} at db time {now} while its half-open breaker's probe {probe} still held a live lease there"
            ));
        }
        self.breaker.probe = Some(id.clone());
        None
    }

    /// Invariant 21: no `count + 1` entries within any window of `per_ms`.
    fn rate(&self, out: &mut Vec<Violation>) {
        let Some(rate) = self.limit.rate else { return };
        let mut entries = self.entries.clone();
        entries.sort();
        let n = rate.count as usize;
        for (first, last) in entries.iter().zip(entries.iter().skip(n)) {
            if last.0 < first.0.plus_ms(rate.per_ms) {
                out.push(Violation {
                    invariant: 21,
                    message: format!(
                        "{} entries into {} within {} ms: from {} (event #{}, {}) to {} (event #{}, {}), past its rate of {rate}",
                        n + 1,
                        self.limit.target,
                        last.0.millis_since(first.0),
                        first.0,
                        first.1,
                        first.2,
                        last.0,
                        last.1,
                        last.2
                    ),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plans;
    use leasehold_engine::limits::Rate;
    use leasehold_engine::transition::{self, NewIds};
    use leasehold_engine::{Action, AttemptRecord, CommandId, PlanId, PlanSpec, Step};
    use serde_json::json;

    const T: &str = plans::DURABLE;

    fn record(id: &str) -> AttemptRecord {
        let spec = PlanSpec {
            input: None,
            on_failure: None,
            name: "p".into(),
            queue: None,
            recovery: "resume".into(),
            volatile_fields: vec![],
            steps: vec![Step {
                code: "a".into(),
                executor: T.into(),
                target: None,
                payload: json!({}),
                retry: None,
            }],
            retry: None,
        };
        let plan = spec
            .into_plan(plans::KNOWN, PlanId::new("plan-1"), Timestamp::from_millis(0))
            .expect("a valid plan");
        let ids = NewIds {
            attempt: AttemptId::new(id),
            command: CommandId::new(format!("cmd-{id}")),
            trace: None,
        };
        transition::enqueue(&plan, &[], Action::Execute, ids, Timestamp::from_millis(0)).expect("enqueue")
    }

    /// `id`'s rows: PROCESSING on `T` under `token` until `until` ms, or PENDING.
    fn snap(id: &str, lease: Option<(u32, i64)>) -> Snap {
        let mut record = record(id);
        record.command.target = T.into();
        if let Some((_, until)) = lease {
            record.command.status = CommandStatus::Processing;
            record.command.lease_until = Some(Timestamp::from_millis(until));
        }
        Snap {
            record,
            token: lease.map(|(t, _)| t),
        }
    }

    fn event(seq: u64, now_ms: i64, op: Op, before: Snap, after: Snap) -> DbEvent {
        DbEvent {
            seq,
            at_ms: seq,
            db_now: Timestamp::from_millis(now_ms),
            decided_at: Timestamp::from_millis(now_ms),
            from: "w1".into(),
            op,
            attempt: Some(before.record.attempt.id.clone()),
            ordinal: None,
            presented: after.token,
            before: Some(before),
            after: Some(after),
            outcome: EventOutcome::Applied,
            plan_attempts: None,
            reply_lost: false,
        }
    }

    /// A claim of `id` at `now_ms` granting token `token` for a lease of 1 s.
    fn claim(seq: u64, id: &str, token: u32, now_ms: i64) -> DbEvent {
        event(
            seq,
            now_ms,
            Op::Claim,
            snap(id, None),
            snap(id, Some((token, now_ms + 1_000))),
        )
    }

    fn limit(max_in_flight: Option<u32>, rate: Option<Rate>, breaker: Option<Breaker>) -> TargetLimit {
        TargetLimit {
            target: T.into(),
            max_in_flight,
            rate,
            breaker,
        }
    }

    fn broken(events: &[DbEvent], limit: &TargetLimit) -> Vec<u8> {
        check(events, std::slice::from_ref(limit))
            .iter()
            .map(|v| v.invariant)
            .collect()
    }

    #[test]
    fn a_second_live_lease_past_max_in_flight_breaks_20() {
        let l = limit(Some(1), None, None);
        assert_eq!(broken(&[claim(0, "a", 1, 0), claim(1, "b", 2, 500)], &l), vec![20]);
        assert!(broken(&[claim(0, "a", 1, 0), claim(1, "b", 2, 1_001)], &l).is_empty());
    }

    #[test]
    fn a_renewal_is_not_an_entry_but_an_expired_lease_renewed_counts_again() {
        let renew = |seq, now, until| {
            event(
                seq,
                now,
                Op::Heartbeat,
                snap("a", Some((1, 1_000))),
                snap("a", Some((1, until))),
            )
        };
        assert!(!enters(
            Some(&snap("a", Some((1, 1_000)))),
            &snap("a", Some((1, 2_000)))
        ));
        let l = limit(Some(1), None, None);
        let late = [claim(0, "a", 1, 0), claim(1, "b", 2, 1_500), renew(2, 1_600, 2_600)];
        assert_eq!(broken(&late, &l), vec![20]);
        let timely = [claim(0, "a", 1, 0), renew(1, 500, 1_500), claim(2, "b", 2, 1_501)];
        assert!(broken(&timely, &l).is_empty());
    }

    #[test]
    fn more_entries_than_the_rate_within_a_window_break_21() {
        let l = limit(
            None,
            Some(Rate {
                count: 2,
                per_ms: 1_000,
            }),
            None,
        );
        let tight = [claim(0, "a", 1, 0), claim(1, "b", 2, 500), claim(2, "c", 3, 999)];
        assert_eq!(broken(&tight, &l), vec![21]);
        let spaced = [claim(0, "a", 1, 0), claim(1, "b", 2, 500), claim(2, "c", 3, 1_000)];
        assert!(broken(&spaced, &l).is_empty());
    }

    #[test]
    fn entries_through_an_open_or_probing_breaker_break_22() {
        let l = limit(
            None,
            None,
            Some(Breaker {
                failures: 1,
                cooldown_ms: 800,
            }),
        );
        let give_back = event(1, 100, Op::GiveBack, snap("a", Some((1, 1_000))), snap("a", None));
        let opened = || vec![claim(0, "a", 1, 0), give_back.clone()];
        let mut open = opened();
        open.push(claim(2, "b", 2, 899));
        assert_eq!(broken(&open, &l), vec![22]);
        let mut probing = opened();
        probing.extend([claim(2, "b", 2, 900), claim(3, "c", 3, 950)]);
        assert_eq!(broken(&probing, &l), vec![22]);
        let mut probe_expired = opened();
        probe_expired.extend([claim(2, "b", 2, 900), claim(3, "c", 3, 1_901)]);
        assert!(broken(&probe_expired, &l).is_empty());
    }
}
