//! Trace context on every ledger: an enqueue stores the attempt's W3C trace context —
//! a child of the caller's `traceparent`, or a trace of its own — and every read of the
//! attempt answers it unchanged: the claim a worker delivers from, the history, a
//! takeover's claim, a retry's new attempt (a trace of its own unless given one).

use super::{claim_one, deliver, register, Harness, LEASE_MS};
use leasehold::engine::{Action, TraceContext};
use leasehold::ledger::{EnqueueRequest, Ledger};

const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

pub async fn an_attempt_keeps_the_trace_it_was_enqueued_in_through_every_read<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register(l, "traced", "resume", 2).await;
    let caller = TraceContext::parse(CALLER).unwrap();
    let request = EnqueueRequest::new(Action::Execute).traced(Some(caller));
    let enqueued = l.enqueue_with(&id, request).await.expect("enqueue").record;
    let trace = enqueued.attempt.trace.expect("the attempt has a trace context");
    assert_eq!(trace, TraceContext::for_attempt(Some(&caller), &enqueued.attempt.id));
    assert_eq!(trace.trace_id(), caller.trace_id(), "the caller's trace");
    assert_ne!(trace.span_id(), caller.span_id(), "a span of its own");
    let claimed = claim_one(l, "w1").await;
    assert_eq!(claimed.record.attempt.trace, Some(trace), "the claim carries it");
    h.advance_ms(LEASE_MS + 1);
    let taken_over = claim_one(l, "w2").await;
    assert_eq!(taken_over.record.attempt.trace, Some(trace), "a takeover carries it");
    let read = l.attempt(&enqueued.attempt.id).await.expect("attempt");
    assert_eq!(read.attempt.trace, Some(trace));
    let history = l.history(&id).await.expect("history");
    assert_eq!(history[0].attempt.trace, Some(trace));
}

pub async fn an_attempt_enqueued_without_a_trace_starts_its_own<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register(l, "untraced", "resume", 1).await;
    let first = l.enqueue(&id, Action::Execute).await.expect("enqueue");
    let own = TraceContext::for_attempt(None, &first.attempt.id);
    assert_eq!(first.attempt.trace, Some(own));
    deliver(l, "w1").await;
    let again = l.enqueue(&id, Action::Compensate).await.expect("compensate");
    let other = again.attempt.trace.expect("a trace context");
    assert_ne!(other.trace_id(), own.trace_id(), "each attempt its own trace");
    assert_eq!(claim_one(l, "w1").await.record.attempt.trace, Some(other));
}
