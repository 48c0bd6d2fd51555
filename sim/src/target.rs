//! The target host (an idempotent service) and the executor that calls it.
//!
//! Contract:
//! - The target applies each idempotency key at most once (per sandbox, for
//!   sandboxed steps) and answers every repeated delivery of a key with the reply
//!   it gave the first time, target receipt included. It records every effect, so
//!   the checker can prove invariant 5, and every call with the delivery (the
//!   claim's `delivery_count`) it came from, so the checker can tell a redelivery of
//!   the ambiguous step from a redelivery of finished work (invariant 12).
//! - It answers after the step's `delay_ms` (times the profile's slowdown); the effect happens on arrival. While
//!   faults are on, a reply may be lost after the effect (the connection closes
//!   without an answer): the executor sees a transient failure.
//! - A step's payload may make the target misbehave for it ([`TargetMode`]): answer
//!   503 to the first calls of each key and then recover (flaky), answer 503 to
//!   every call (down), or answer 429 with a `Retry-After` to the first calls
//!   (throttled). Such an answer applies nothing and is recorded as a call.
//! - [`TargetExecutor`] is the worker's [`Executor`]: a pooled connection per call,
//!   with a deadline; no answer in time, and a 503, are [`ExecutorResult::Transient`];
//!   a 429 is [`ExecutorResult::Throttled`]. A step whose payload says
//!   `fail_on = <action>` fails permanently for that action, before any effect.

use crate::plans::{self, DURABLE, SANDBOX};
use crate::protocol::{read_frame, write_frame, CallError, Pool, TargetAnswer, TargetMode, TargetReply, TargetRequest};
use crate::rng::Rng;
use crate::trace::Trace;
use leasehold::executor::{ExecRequest, Executor, ExecutorResult};
use leasehold_engine::{AttemptId, Reach, TraceContext};
use serde_json::json;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

/// The target host's port.
pub const TARGET_PORT: u16 = 8080;

/// One idempotency key (in one sandbox) as the target saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyRecord {
    /// The attempt that sent it.
    pub attempt: AttemptId,
    /// The receipt's ordinal.
    pub ordinal: u32,
    /// The step code.
    pub step: String,
    /// Effects applied for it (at most one for a correct target).
    pub effects: u32,
    /// Deliveries received.
    pub deliveries: u32,
    /// The reply every delivery got.
    pub reply: TargetReply,
}

/// How the target answered one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallAnswer {
    /// The key's effect was applied now.
    Applied,
    /// The key had been applied before: answered from the record.
    Duplicate,
    /// 503, nothing applied.
    Unavailable,
    /// 429 with a `Retry-After`, nothing applied.
    Throttled,
}

/// One call the target received, with the delivery it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    /// Simulated time of arrival.
    pub at_ms: u64,
    /// Simulated time the executor sent it.
    pub sent_ms: u64,
    /// The attempt.
    pub attempt: AttemptId,
    /// The receipt's ordinal.
    pub ordinal: u32,
    /// The idempotency key it carried.
    pub key: String,
    /// The sandbox it named, for sandboxed steps.
    pub sandbox: Option<String>,
    /// The delivery (the command's `delivery_count` under its claim) it came from.
    pub delivery: u32,
    /// The worker that sent it.
    pub worker: String,
    /// How the target answered.
    pub answer: CallAnswer,
    /// Whether the answer was lost (the connection closed without it).
    pub reply_lost: bool,
    /// The trace context it carried.
    pub traceparent: Option<TraceContext>,
}

/// The target's state. Never lost: the target host does not crash.
#[derive(Debug)]
pub struct TargetState {
    /// Per (key, sandbox).
    pub keys: BTreeMap<(String, Option<String>), KeyRecord>,
    /// Step codes applied per attempt (durable steps).
    pub durable: BTreeMap<AttemptId, Vec<String>>,
    /// Step codes applied per sandbox.
    pub sandboxes: BTreeMap<String, Vec<String>>,
    /// Calls received per idempotency key (any sandbox): what a flaky or throttled
    /// step counts.
    pub calls_per_key: BTreeMap<String, u32>,
    /// Every call, in arrival order.
    pub calls: Vec<CallRecord>,
    /// Repeated deliveries answered from the record.
    pub duplicates: u64,
    /// Replies lost after the effect.
    pub replies_lost: u64,
    /// Whether faults (lost replies) are on.
    pub faults_on: bool,
    reply_loss: f64,
    slowdown: u64,
    rng: Rng,
    receipts_issued: u64,
    trace: Trace,
}

impl TargetState {
    /// An empty target.
    pub fn new(seed: u64, reply_loss: f64, slowdown: u64, trace: Trace) -> Self {
        Self {
            keys: BTreeMap::new(),
            durable: BTreeMap::new(),
            sandboxes: BTreeMap::new(),
            calls_per_key: BTreeMap::new(),
            calls: Vec::new(),
            duplicates: 0,
            replies_lost: 0,
            faults_on: true,
            reply_loss,
            slowdown: slowdown.max(1),
            rng: Rng::new(seed, "target-replies"),
            receipts_issued: 0,
            trace,
        }
    }

    /// Answers one call: refused as the step's mode says, or applied (or
    /// recognised); answers whether to drop the answer too.
    pub fn apply(&mut self, req: &TargetRequest) -> (TargetAnswer, bool) {
        let id = (req.key.clone(), req.sandbox.clone());
        let nth = {
            let n = self.calls_per_key.entry(req.key.clone()).or_default();
            *n = n.saturating_add(1);
            *n
        };
        let (answer, call) = match refusal(req.mode, nth) {
            Some(refused) => {
                let what = match refused {
                    TargetAnswer::Throttled { retry_after_ms } => format!("429, retry after {retry_after_ms} ms"),
                    _ => "503".to_owned(),
                };
                self.trace.line(
                    "target",
                    format!(
                        "{} step {} ({}) from {}: answered {what}",
                        req.attempt, req.ordinal, req.step, req.worker
                    ),
                );
                let call = match refused {
                    TargetAnswer::Throttled { .. } => CallAnswer::Throttled,
                    _ => CallAnswer::Unavailable,
                };
                (refused, call)
            }
            None if self.keys.contains_key(&id) => {
                (TargetAnswer::Served(self.recognise(req, &id)), CallAnswer::Duplicate)
            }
            None => (TargetAnswer::Served(self.first_effect(req, id)), CallAnswer::Applied),
        };
        let lost = self.faults_on && self.rng.chance(self.reply_loss);
        if lost {
            self.replies_lost += 1;
            self.trace
                .line("target", format!("{} step {}: reply lost", req.attempt, req.ordinal));
        }
        self.calls.push(CallRecord {
            at_ms: crate::clock::elapsed_ms(),
            sent_ms: req.sent_ms,
            attempt: req.attempt.clone(),
            ordinal: req.ordinal,
            key: req.key.clone(),
            sandbox: req.sandbox.clone(),
            delivery: req.delivery,
            worker: req.worker.clone(),
            answer: call,
            reply_lost: lost,
            traceparent: req.traceparent,
        });
        (answer, lost)
    }

    /// A repeated delivery of an applied key: the reply it got the first time.
    fn recognise(&mut self, req: &TargetRequest, id: &(String, Option<String>)) -> TargetReply {
        self.duplicates += 1;
        self.trace.line(
            "target",
            format!(
                "{} step {} ({}) from {}: duplicate, same receipt",
                req.attempt, req.ordinal, req.step, req.worker
            ),
        );
        self.keys.get_mut(id).map_or_else(
            || TargetReply {
                target_receipt: json!(null),
                applied: Vec::new(),
            },
            |k| {
                k.deliveries += 1;
                k.reply.clone()
            },
        )
    }

    /// The first delivery of a key: its effect, recorded.
    fn first_effect(&mut self, req: &TargetRequest, id: (String, Option<String>)) -> TargetReply {
        let applied = match &req.sandbox {
            Some(s) => {
                let v = self.sandboxes.entry(s.clone()).or_default();
                v.push(req.step.clone());
                v.clone()
            }
            None => {
                let v = self.durable.entry(req.attempt.clone()).or_default();
                v.push(req.step.clone());
                v.clone()
            }
        };
        self.receipts_issued += 1;
        let reply = TargetReply {
            target_receipt: json!({ "target": "sim", "key": req.key, "receipt": format!("tr-{:06}", self.receipts_issued) }),
            applied,
        };
        self.keys.insert(
            id,
            KeyRecord {
                attempt: req.attempt.clone(),
                ordinal: req.ordinal,
                step: req.step.clone(),
                effects: 1,
                deliveries: 1,
                reply: reply.clone(),
            },
        );
        let place = req.sandbox.as_deref().unwrap_or("durable");
        self.trace.line(
            "target",
            format!(
                "{} step {} ({}) from {}: applied in {place}",
                req.attempt, req.ordinal, req.step, req.worker
            ),
        );
        reply
    }
}

/// The refusal the `nth` call of a key of a step in `mode` gets, if any.
fn refusal(mode: TargetMode, nth: u32) -> Option<TargetAnswer> {
    match mode {
        TargetMode::Down => Some(TargetAnswer::Unavailable),
        TargetMode::Flaky { calls } if nth <= calls => Some(TargetAnswer::Unavailable),
        TargetMode::Throttled { calls, retry_after_ms } if nth <= calls => {
            Some(TargetAnswer::Throttled { retry_after_ms })
        }
        TargetMode::Healthy | TargetMode::Flaky { .. } | TargetMode::Throttled { .. } => None,
    }
}

/// Serves the target on [`TARGET_PORT`].
pub async fn serve(state: Rc<RefCell<TargetState>>) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", TARGET_PORT)).await?;
    loop {
        let (mut stream, _) = listener.accept().await?;
        let state = Rc::clone(&state);
        tokio::task::spawn_local(async move {
            while let Ok(Some(req)) = read_frame::<_, TargetRequest>(&mut stream).await {
                let (reply, lost, delay_ms) = {
                    let mut s = state.borrow_mut();
                    let (reply, lost) = s.apply(&req);
                    (reply, lost, req.delay_ms.saturating_mul(s.slowdown))
                };
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                if lost || write_frame(&mut stream, &reply).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// The worker's executor: a client of the target host.
#[derive(Debug)]
pub struct TargetExecutor {
    worker: String,
    pool: Pool,
    timeout_ms: u64,
    failures: Option<FailureLog>,
    detached_retry_ms: Option<u64>,
    /// Runs only durable steps (a worker of a mixed fleet without the sandbox).
    durable_only: bool,
}

/// `(worker, at ms)`: every executor call that failed in transit (no answer in
/// time, a broken connection), shared by the workers' executors (invariant 13 reads
/// it). A target's 503 or 429 answer is not a failure of the call.
pub type FailureLog = std::sync::Arc<std::sync::Mutex<Vec<(String, u64)>>>;

impl TargetExecutor {
    /// The executor of worker `worker`, with this deadline per call.
    pub fn new(worker: impl Into<String>, timeout_ms: u64) -> Self {
        Self {
            worker: worker.into(),
            pool: Pool::new("target", TARGET_PORT),
            timeout_ms,
            failures: None,
            detached_retry_ms: None,
            durable_only: false,
        }
    }

    /// This executor without `sim-sandbox:v1`: its worker advertises only the
    /// durable target, and a sandbox step it is handed anyway fails as an unknown
    /// executor (as a real worker without the executor does).
    pub fn durable_only(mut self) -> Self {
        self.durable_only = true;
        self
    }

    /// This executor, recording its transient failures in `log`.
    pub fn recording(mut self, log: FailureLog) -> Self {
        self.failures = Some(log);
        self
    }

    /// Planted (`executor-retries-detached`): after a call that did not succeed, the
    /// executor's client sends it again on its own `after_ms` later, whatever the
    /// driver has done since.
    pub fn retrying_detached(mut self, after_ms: u64) -> Self {
        self.detached_retry_ms = Some(after_ms);
        self
    }

    /// The executors it runs.
    pub fn runs(&self) -> &'static [&'static str] {
        if self.durable_only {
            &[DURABLE]
        } else {
            plans::KNOWN
        }
    }

    fn record_failure(&self) {
        if let Some(log) = &self.failures {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            log.push((self.worker.clone(), crate::clock::elapsed_ms()));
        }
    }

    async fn send(&self, req: &TargetRequest) -> Result<TargetAnswer, String> {
        self.pool
            .call(req, Duration::from_millis(self.timeout_ms))
            .await
            .map_err(|e| match e {
                CallError::NotSent(m) | CallError::NoReply(m) => m,
            })
    }

    /// Planted: sends `req` again after the detached delay, on a connection of its
    /// own, and forgets the answer.
    fn resend_detached(&self, req: &TargetRequest) {
        let Some(after_ms) = self.detached_retry_ms else {
            return;
        };
        let (mut req, timeout) = (req.clone(), Duration::from_millis(self.timeout_ms));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            req.sent_ms = crate::clock::elapsed_ms();
            let _ = Pool::new("target", TARGET_PORT)
                .call::<_, TargetAnswer>(&req, timeout)
                .await;
        });
    }
}

impl Executor for TargetExecutor {
    fn reach(&self) -> Option<BTreeMap<String, Reach>> {
        Some(self.runs().iter().map(|e| ((*e).to_owned(), Reach::Any)).collect())
    }

    async fn execute(&self, request: ExecRequest) -> ExecutorResult {
        let step = &request.step;
        let sandbox = match step.executor.as_str() {
            SANDBOX if !self.durable_only => Some(plans::sandbox_id(&request.attempt_id, request.delivery)),
            DURABLE => None,
            other => return ExecutorResult::Permanent(format!("step {}: unknown executor {other:?}", step.code)),
        };
        if step.payload.get("fail_on").and_then(|v| v.as_str()) == Some(request.action.as_str()) {
            return ExecutorResult::Permanent(format!(
                "step {}: the target refuses this step for action {}",
                step.code, request.action
            ));
        }
        let delay_ms = step.payload.get("delay_ms").and_then(|v| v.as_u64()).unwrap_or(0);
        let req = TargetRequest {
            key: request.idempotency_key.clone(),
            sandbox: sandbox.clone(),
            attempt: request.attempt_id.clone(),
            ordinal: request.ordinal,
            step: step.code.clone(),
            worker: self.worker.clone(),
            delivery: request.delivery,
            delay_ms,
            mode: TargetMode::of(&step.payload),
            sent_ms: crate::clock::elapsed_ms(),
            traceparent: request.traceparent,
        };
        let answer = self.send(&req).await;
        if !matches!(answer, Ok(TargetAnswer::Served(_))) {
            self.resend_detached(&req);
        }
        match answer {
            Ok(TargetAnswer::Served(reply)) => ExecutorResult::Done {
                evidence: plans::evidence(
                    step,
                    &request.idempotency_key,
                    sandbox.as_deref(),
                    &self.worker,
                    &reply.applied,
                ),
                target_receipt: reply.target_receipt,
            },
            Ok(TargetAnswer::Unavailable) => {
                ExecutorResult::Transient(format!("the target answered 503 to {}", step.code))
            }
            Ok(TargetAnswer::Throttled { retry_after_ms }) => ExecutorResult::Throttled {
                error: format!("the target answered 429 to {}", step.code),
                retry_after_ms,
            },
            Err(e) => {
                self.record_failure();
                ExecutorResult::Transient(format!("step {}: {e}", step.code))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_payload_names_its_target_mode() {
        assert_eq!(TargetMode::of(&json!({ "delay_ms": 5 })), TargetMode::Healthy);
        assert_eq!(TargetMode::of(&json!({ "down": true })), TargetMode::Down);
        assert_eq!(
            TargetMode::of(&json!({ "flaky_calls": 3 })),
            TargetMode::Flaky { calls: 3 }
        );
        assert_eq!(
            TargetMode::of(&json!({ "throttle_calls": 1, "retry_after_ms": 300 })),
            TargetMode::Throttled {
                calls: 1,
                retry_after_ms: 300
            }
        );
    }

    #[test]
    fn a_flaky_or_throttled_key_is_refused_for_its_window_then_served() {
        let flaky = TargetMode::Flaky { calls: 2 };
        assert_eq!(refusal(flaky, 1), Some(TargetAnswer::Unavailable));
        assert_eq!(refusal(flaky, 2), Some(TargetAnswer::Unavailable));
        assert_eq!(refusal(flaky, 3), None);
        let throttled = TargetMode::Throttled {
            calls: 1,
            retry_after_ms: 300,
        };
        assert_eq!(
            refusal(throttled, 1),
            Some(TargetAnswer::Throttled { retry_after_ms: 300 })
        );
        assert_eq!(refusal(throttled, 2), None);
        assert_eq!(refusal(TargetMode::Down, 1_000), Some(TargetAnswer::Unavailable));
        assert_eq!(refusal(TargetMode::Healthy, 1), None);
    }
}
