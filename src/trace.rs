//! The spans of a delivery, as `tracing` spans a subscriber may export.
//!
//! Every attempt has a W3C trace context ([`TraceContext`]), stored with it at
//! enqueue: the caller's trace (a `traceparent` given to the enqueue) or a new one. A
//! delivery of the attempt reports, under the target [`TARGET`]:
//!
//! ```text
//! leasehold.enqueue               the attempt's own span (reported by `serve`), a
//! │                               child of the caller's when it gave a traceparent
//! └── leasehold.delivery          from the claim to the delivery's end
//!     ├── leasehold.claim         the claim that leased it
//!     ├── leasehold.step          each call of a step's executor (http:v1 sends its
//!     │                           context as the request's `traceparent`)
//!     └── leasehold.end           each ending write (finish, fail, give-back, the
//!                                 last step's completion)
//! ```
//!
//! Span ids are the engine's ([`TraceContext::span`]): derived from the attempt's
//! context, the delivery and the span's role, so the `traceparent` a target receives
//! names the step span a trace backend shows. Each span carries them as fields —
//! [`fields::TRACE_ID`], [`fields::SPAN_ID`], [`fields::PARENT_ID`] — with, where the
//! span covers a time it did not live through (the claim), [`fields::START`] and
//! [`fields::END`]; the `leasehold serve` and `leasehold worker` binaries export these
//! spans over OTLP when configured to. Attributes name attempts, plans, steps,
//! executors and outcomes: never a lease token, a payload, a secret or an error text.
//!
//! With no subscriber interested in [`TARGET`], the spans are disabled and cost a
//! check per span; the wall clock is read only when they are enabled.

use crate::ledger::Claimed;
use leasehold_engine::driver::{ExecutorResult, Outcome};
use leasehold_engine::trace::SpanRole;
use leasehold_engine::{AttemptRecord, Step, TraceContext, WorkerOp};
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::field::Empty;
use tracing::Span;

/// The `tracing` target of every span here.
pub const TARGET: &str = "leasehold::trace";

/// The names of the fields that place a span in its trace.
pub mod fields {
    /// The trace id (32 hex digits).
    pub const TRACE_ID: &str = "trace_id";
    /// The span's own id (16 hex digits).
    pub const SPAN_ID: &str = "span_id";
    /// The parent span's id (16 hex digits).
    pub const PARENT_ID: &str = "parent_id";
    /// The trace flags (bit 0: sampled), the attempt's trace context's.
    pub const FLAGS: &str = "trace_flags";
    /// When the span began, in nanoseconds since the Unix epoch, for a span created
    /// after the fact (otherwise: when it was created).
    pub const START: &str = "start_unix_nanos";
    /// When the span ended, likewise (otherwise: when it closed).
    pub const END: &str = "end_unix_nanos";
}

/// Whether a subscriber takes these spans.
fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::INFO)
}

/// The wall clock now, when the spans are enabled (they are reported, never decided
/// on).
pub(crate) fn wall_now() -> Option<SystemTime> {
    enabled().then(SystemTime::now)
}

/// When a claim was sent and answered (wall clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimWindow {
    sent: SystemTime,
    answered: SystemTime,
}

impl ClaimWindow {
    /// The window of a claim sent at `sent` ([`wall_now`]) and answered now.
    pub(crate) fn since(sent: Option<SystemTime>) -> Option<ClaimWindow> {
        sent.map(|sent| ClaimWindow {
            sent,
            answered: SystemTime::now(),
        })
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Reports the span of the enqueue that wrote `record`, sent at `sent` ([`wall_now`])
/// under the caller's `parent` (none: the root of the attempt's new trace).
pub fn report_enqueue(record: &AttemptRecord, parent: Option<&TraceContext>, sent: Option<SystemTime>) {
    let (Some(own), Some(sent)) = (record.attempt.trace, sent) else {
        return;
    };
    let _enqueue = tracing::info_span!(target: TARGET, parent: None, "leasehold.enqueue",
        trace_id = own.trace_id(), span_id = own.span_id(), parent_id = parent.map(|p| p.span_id()), trace_flags = own.flags(),
        start_unix_nanos = unix_nanos(sent), end_unix_nanos = unix_nanos(SystemTime::now()),
        leasehold.attempt = record.attempt.id.as_str(), leasehold.plan_id = record.attempt.plan_id.as_str(),
        leasehold.action = record.attempt.action.as_str());
}

/// The spans of one delivery: its own, and the numbering of its step calls and ending
/// writes.
pub(crate) struct DeliveryTrace {
    attempt: TraceContext,
    delivery: u32,
    /// The delivery span's own context.
    own: TraceContext,
    span: Span,
    calls: u32,
    ends: u32,
}

impl DeliveryTrace {
    /// Opens the delivery's span (and reports its claim's, when the claim's window
    /// is known) for `claimed`.
    pub(crate) fn open(claimed: &Claimed, window: Option<ClaimWindow>) -> DeliveryTrace {
        let record = &claimed.record;
        let attempt = record
            .attempt
            .trace
            .unwrap_or_else(|| TraceContext::for_attempt(None, &record.attempt.id));
        let delivery = record.command.delivery_count;
        let own = attempt.span(delivery, SpanRole::Delivery);
        let span = tracing::info_span!(target: TARGET, parent: None, "leasehold.delivery",
            trace_id = own.trace_id(), span_id = own.span_id(), parent_id = attempt.span_id(), trace_flags = own.flags(),
            start_unix_nanos = window.map(|w| unix_nanos(w.sent)),
            leasehold.attempt = record.attempt.id.as_str(), leasehold.plan = claimed.plan.name.as_str(),
            leasehold.action = record.attempt.action.as_str(), leasehold.delivery = delivery,
            leasehold.outcome = Empty);
        if let (Some(w), false) = (window, span.is_disabled()) {
            let claim = attempt.span(delivery, SpanRole::Claim);
            let _claim = tracing::info_span!(target: TARGET, parent: None, "leasehold.claim",
                trace_id = claim.trace_id(), span_id = claim.span_id(), parent_id = own.span_id(), trace_flags = own.flags(),
                start_unix_nanos = unix_nanos(w.sent), end_unix_nanos = unix_nanos(w.answered),
                leasehold.attempt = record.attempt.id.as_str(), leasehold.delivery = delivery);
        }
        DeliveryTrace {
            attempt,
            delivery,
            own,
            span,
            calls: 0,
            ends: 0,
        }
    }

    /// The span of the next call of step `ordinal`, and the trace context the call
    /// carries (the span's).
    pub(crate) fn step(&mut self, ordinal: u32, step: &Step) -> (Span, TraceContext) {
        self.calls += 1;
        let ctx = self.attempt.span(self.delivery, SpanRole::Step(ordinal, self.calls));
        let span = tracing::info_span!(target: TARGET, parent: None, "leasehold.step",
            trace_id = ctx.trace_id(), span_id = ctx.span_id(), parent_id = self.own.span_id(), trace_flags = ctx.flags(),
            leasehold.step = step.code.as_str(), leasehold.ordinal = ordinal,
            leasehold.executor = step.executor.as_str(), leasehold.outcome = Empty);
        (span, ctx)
    }

    /// The span of the next ending write, `op`.
    pub(crate) fn end_write(&mut self, op: WorkerOp) -> Span {
        self.ends += 1;
        let ctx = self.attempt.span(self.delivery, SpanRole::End(self.ends));
        tracing::info_span!(target: TARGET, parent: None, "leasehold.end",
            trace_id = ctx.trace_id(), span_id = ctx.span_id(), parent_id = self.own.span_id(), trace_flags = ctx.flags(),
            leasehold.write = op.op().as_str(), leasehold.outcome = Empty)
    }

    /// Records how the delivery ended; its span closes when this is dropped.
    pub(crate) fn finish(&self, outcome: &Outcome) {
        self.span.record("leasehold.outcome", outcome_name(outcome));
    }
}

/// The name of a delivery's outcome, as its span records it.
fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Delivered => "delivered",
        Outcome::Failed(_) => "failed",
        Outcome::Refused(_) => "refused",
        Outcome::GaveBack { .. } => "gave-back",
        Outcome::Exhausted { .. } => "exhausted",
        Outcome::Abandoned(_) => "abandoned",
        Outcome::Yielded { .. } => "yielded",
    }
}

/// The name of an executor's answer, as a step span records it.
pub(crate) fn result_name(result: &ExecutorResult) -> &'static str {
    match result {
        ExecutorResult::Done { .. } => "done",
        ExecutorResult::Permanent(_) => "permanent",
        ExecutorResult::Transient(_) => "transient",
        ExecutorResult::Throttled { .. } => "throttled",
    }
}
