//! Invariant 25: attempts with one order key run one at a time, in enqueue order.
//!
//! The enqueuer gives a template's attempts a few order keys, so that attempts
//! with one key are enqueued while another with it is open. The db host logs each
//! attempt an enqueue created with the order key its request carried as received.
//! From the event log: no attempt with a key was claimed before every attempt
//! enqueued earlier with that key (of its plan) had ended — so no two of them were
//! ever open and claimed at once, and they started in enqueue order.

use crate::checker::Violation;
use crate::db::{DbEvent, EventOutcome, Snap};
use leasehold_engine::{AttemptId, PlanId};
use std::collections::BTreeMap;

/// When an attempt was first claimed and when it ended, as event sequence numbers.
#[derive(Debug, Default, Clone, Copy)]
struct Span {
    claimed: Option<u64>,
    ended: Option<u64>,
}

/// The violations of invariant 25, from the event log, the attempts enqueued with
/// an order key (`ordered`) and the latest rows (for each attempt's number).
pub fn one_at_a_time(
    events: &[DbEvent],
    ordered: &BTreeMap<AttemptId, (PlanId, String)>,
    latest: &BTreeMap<AttemptId, Snap>,
) -> Vec<Violation> {
    let spans = spans(events, ordered);
    let mut keys: BTreeMap<(&PlanId, &str), Vec<(u32, &AttemptId)>> = BTreeMap::new();
    for (id, (plan, key)) in ordered {
        if let Some(s) = latest.get(id) {
            keys.entry((plan, key)).or_default().push((s.record.attempt.number, id));
        }
    }
    let mut v = Vec::new();
    for ((plan, key), mut attempts) in keys {
        attempts.sort();
        for pair in attempts.windows(2) {
            let ((_, ahead), (_, behind)) = (pair[0], pair[1]);
            let (a, b) = (
                spans.get(ahead).copied().unwrap_or_default(),
                spans.get(behind).copied().unwrap_or_default(),
            );
            let Some(claimed) = b.claimed else { continue };
            if a.ended.is_none_or(|ended| ended > claimed) {
                v.push(Violation {
                    invariant: 25,
                    message: format!(
                        "attempt {behind} (order key {key:?} of plan {plan}) was claimed at event #{claimed} while \
                         attempt {ahead}, enqueued before it with that key, was still open{}",
                        a.ended
                            .map_or_else(String::new, |e| format!(" (it ended at event #{e})"))
                    ),
                });
            }
        }
    }
    v
}

/// Each ordered attempt's first applied claim and the applied event that ended it.
fn spans(events: &[DbEvent], ordered: &BTreeMap<AttemptId, (PlanId, String)>) -> BTreeMap<AttemptId, Span> {
    let mut spans: BTreeMap<AttemptId, Span> = BTreeMap::new();
    for e in events.iter().filter(|e| e.outcome == EventOutcome::Applied) {
        let Some(id) = e.attempt.as_ref().filter(|id| ordered.contains_key(*id)) else {
            continue;
        };
        let span = spans.entry(id.clone()).or_default();
        if e.op.is_claim() && span.claimed.is_none() {
            span.claimed = Some(e.seq);
        }
        let ends = e.after.as_ref().is_some_and(|a| a.record.attempt.status.is_terminal());
        if ends && span.ended.is_none() {
            span.ended = Some(e.seq);
        }
    }
    spans
}
