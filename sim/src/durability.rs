//! Invariant 26: an acknowledged transition is never undone.
//!
//! Durability: the db's history never goes backwards. Each attempt's applied events
//! form a chain, each leaving the rows the next one must find. The db host reads the
//! rows before each request from what it holds (after a failover, from the promoted
//! replica), and the checker compares: every event's rows before, and the attempt's
//! rows at the end of the run, must be the rows the attempt's last applied event
//! left (no rows, before its enqueue). When they are not, the rows are those some
//! earlier event of the chain left (or none: the attempt is gone), and every applied
//! event after it was undone. That breaks the invariant if one of those was
//! acknowledged: the db host sent its reply (a reply lost to a fault was not, and a
//! commit nobody heard of may vanish with an asynchronous replica). Rows that no
//! event of the chain left break it too.

use crate::checker::Violation;
use crate::db::{DbEvent, EventOutcome, Snap};
use leasehold_engine::{AttemptId, Op};
use std::collections::BTreeMap;

/// The violations of invariant 26, from the event log and the latest rows.
pub fn survives(events: &[DbEvent], latest: &BTreeMap<AttemptId, Snap>) -> Vec<Violation> {
    let mut chains: BTreeMap<&AttemptId, Vec<&DbEvent>> = BTreeMap::new();
    let mut v = Vec::new();
    for e in events {
        let Some(id) = e.attempt.as_ref() else { continue };
        let chain = chains.entry(id).or_default();
        let created = e.op == Op::Enqueue && e.outcome == EventOutcome::Applied;
        if !created {
            let at = format!("event #{} ({} by {})", e.seq, e.op, e.from);
            v.extend(observe(id, chain, e.before.as_ref(), &at));
        }
        if e.outcome == EventOutcome::Applied && e.after.is_some() {
            chain.push(e);
        }
    }
    for (id, chain) in &mut chains {
        v.extend(observe(id, chain, latest.get(*id), "the end of the run"));
    }
    v
}

/// Compares the rows `seen` at `at` with what the attempt's `chain` of applied
/// events left; on a difference, cuts the chain back to the event whose rows were
/// seen and answers the violation, if an undone event was acknowledged or no event
/// left those rows.
fn observe<'a>(id: &AttemptId, chain: &mut Vec<&'a DbEvent>, seen: Option<&Snap>, at: &str) -> Option<Violation> {
    if chain.last().and_then(|e| e.after.as_ref()) == seen {
        return None;
    }
    let Some(kept) = chain
        .iter()
        .rposition(|e| e.after.as_ref() == seen)
        .map(|i| i + 1)
        .or(seen.is_none().then_some(0))
    else {
        let last = chain
            .last()
            .map_or_else(|| "none".to_owned(), |e| format!("#{}", e.seq));
        *chain = Vec::new();
        return Some(Violation {
            invariant: 26,
            message: format!("{at} found {id}'s rows as no event left them (its last applied event is {last})"),
        });
    };
    let undone: Vec<&'a DbEvent> = chain.split_off(kept);
    let acked: Vec<String> = undone
        .iter()
        .filter(|e| !e.reply_lost)
        .map(|e| format!("#{} {}", e.seq, e.op))
        .collect();
    if acked.is_empty() {
        return None;
    }
    let back_to = chain.last().map_or_else(
        || "before its enqueue".to_owned(),
        |e| format!("as event #{} left them", e.seq),
    );
    Some(Violation {
        invariant: 26,
        message: format!(
            "{at} found {id}'s rows {back_to}: the acknowledged {} undone",
            if acked.len() == 1 {
                format!("event {} was", acked[0])
            } else {
                format!("events {} were", acked.join(", "))
            }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plans;
    use leasehold_engine::transition::{self, NewIds};
    use leasehold_engine::{Action, CommandId, PlanId, PlanSpec, Timestamp};

    /// Three rows of one attempt: as enqueued, then with one and two deliveries.
    fn rows() -> Vec<Snap> {
        let spec = PlanSpec {
            input: None,
            on_failure: None,
            name: "p".into(),
            queue: None,
            recovery: "resume".into(),
            volatile_fields: vec![],
            steps: vec![leasehold_engine::Step {
                code: "a".into(),
                executor: plans::DURABLE.into(),
                target: None,
                payload: serde_json::json!({}),
                retry: None,
            }],
            retry: None,
        };
        let plan = spec
            .into_plan(plans::KNOWN, PlanId::new("plan-1"), Timestamp::from_millis(0))
            .expect("a valid plan");
        let ids = NewIds {
            attempt: AttemptId::new("att-1"),
            command: CommandId::new("cmd-1"),
            trace: None,
        };
        let record = transition::enqueue(&plan, &[], Action::Execute, ids, Timestamp::from_millis(0)).expect("enqueue");
        (0..3)
            .map(|d| {
                let mut r = record.clone();
                r.command.delivery_count = d;
                Snap { record: r, token: None }
            })
            .collect()
    }

    fn event(seq: u64, op: Op, (before, after): (Option<&Snap>, Option<&Snap>), reply_lost: bool) -> DbEvent {
        DbEvent {
            seq,
            at_ms: seq,
            db_now: Timestamp::from_millis(0),
            decided_at: Timestamp::from_millis(0),
            from: "w1".into(),
            op,
            attempt: Some(AttemptId::new("att-1")),
            ordinal: None,
            presented: None,
            before: before.cloned(),
            after: after.cloned(),
            outcome: EventOutcome::Applied,
            plan_attempts: None,
            reply_lost,
        }
    }

    /// An enqueue and a claim, each acknowledged unless `lost`.
    fn history(r: &[Snap], lost: bool) -> Vec<DbEvent> {
        vec![
            event(0, Op::Enqueue, (None, Some(&r[0])), false),
            event(1, Op::Claim, (Some(&r[0]), Some(&r[1])), lost),
        ]
    }

    #[test]
    fn an_unbroken_history_passes() {
        let r = rows();
        let mut events = history(&r, false);
        events.push(event(2, Op::Claim, (Some(&r[1]), Some(&r[2])), false));
        let latest = BTreeMap::from([(AttemptId::new("att-1"), r[2].clone())]);
        assert_eq!(survives(&events, &latest), Vec::new());
    }

    #[test]
    fn an_acknowledged_claim_undone_is_caught_once() {
        let r = rows();
        let mut events = history(&r, false);
        events.push(event(2, Op::Claim, (Some(&r[0]), Some(&r[1])), false));
        let latest = BTreeMap::from([(AttemptId::new("att-1"), r[1].clone())]);
        let v = survives(&events, &latest);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].invariant, 26);
        assert!(
            v[0].message.contains("event #2") && v[0].message.contains("event #1 claim was undone"),
            "{v:?}"
        );
    }

    #[test]
    fn a_commit_nobody_heard_of_may_vanish() {
        let r = rows();
        let events = history(&r, true);
        let latest = BTreeMap::from([(AttemptId::new("att-1"), r[0].clone())]);
        assert_eq!(survives(&events, &latest), Vec::new());
    }

    #[test]
    fn a_vanished_enqueue_and_foreign_rows_are_caught() {
        let r = rows();
        let v = survives(&history(&r, true), &BTreeMap::new());
        assert!(v.len() == 1 && v[0].message.contains("before its enqueue"), "{v:?}");
        let latest = BTreeMap::from([(AttemptId::new("att-1"), r[2].clone())]);
        let v = survives(&history(&r, false), &latest);
        assert!(v.len() == 1 && v[0].message.contains("as no event left them"), "{v:?}");
    }
}
