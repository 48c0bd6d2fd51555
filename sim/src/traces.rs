//! Invariant 23: every attempt carries the trace its enqueue named, and every call of
//! its steps carries that trace onward.
//!
//! An acknowledged enqueue that named a trace (`traceparent`) has its attempt in that
//! trace, as a child of the caller's span; one that named none has a trace of its
//! own, derived from the attempt's id ([`TraceContext::for_attempt`]). An attempt
//! whose enqueue's reply was lost is in its own trace or in one some enqueue named. Every call a
//! target receives carries its attempt's trace id with a span of its own (the step's).

use crate::checker::Violation;
use crate::clients::ClientLog;
use crate::db::Snap;
use crate::target::CallRecord;
use leasehold_engine::{AttemptId, TraceContext};
use std::collections::{BTreeMap, BTreeSet};

/// The violations of invariant 23 in a run's latest rows, its clients' log and the
/// target's calls.
pub fn carried(latest: &BTreeMap<AttemptId, Snap>, clients: &ClientLog, calls: &[CallRecord]) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut push = |message: String| v.push(Violation { invariant: 23, message });
    let acked: BTreeSet<&AttemptId> = clients.acked.iter().map(|(_, _, id)| id).collect();
    for (id, snap) in latest {
        let expected = TraceContext::for_attempt(clients.traced.get(id), id);
        // An enqueue whose reply was lost: any trace it may have named.
        let unacked = |t: TraceContext| {
            !acked.contains(id)
                && (clients
                    .named
                    .iter()
                    .any(|p| TraceContext::for_attempt(Some(p), id) == t))
        };
        match snap.record.attempt.trace {
            Some(t) if t == expected || unacked(t) => {}
            Some(t) => push(match clients.traced.get(id) {
                Some(parent) => format!(
                    "{id} was enqueued in trace {} but is in {}",
                    parent.trace_id(),
                    t.trace_id()
                ),
                None => format!("{id} has trace context {t}, not its own {expected}"),
            }),
            None => push(format!("{id} has no trace context")),
        }
    }
    for call in calls {
        let Some(own) = latest.get(&call.attempt).and_then(|s| s.record.attempt.trace) else {
            continue;
        };
        match call.traceparent {
            Some(t) if t.trace_id() == own.trace_id() && t.span_id() != own.span_id() => {}
            Some(t) => push(format!(
                "{} step {} (delivery {}) reached the target with traceparent {t}, not a span of trace {}",
                call.attempt,
                call.ordinal,
                call.delivery,
                own.trace_id()
            )),
            None => push(format!(
                "{} step {} (delivery {}) reached the target without a traceparent",
                call.attempt, call.ordinal, call.delivery
            )),
        }
    }
    v
}
