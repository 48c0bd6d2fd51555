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
//! - [`TargetExecutor`] is the worker's [`Executor`]: a pooled connection per call,
//!   with a deadline; no answer in time is [`ExecutorResult::Transient`]. A step whose
//!   payload says `fail_on = <action>` fails permanently for that action, before
//!   any effect.

use crate::plans::{self, DURABLE, SANDBOX};
use crate::protocol::{read_frame, write_frame, CallError, Pool, TargetReply, TargetRequest};
use crate::rng::Rng;
use crate::trace::Trace;
use leasehold::executor::{ExecRequest, Executor, ExecutorResult};
use leasehold_engine::AttemptId;
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

/// One call the target received, with the delivery it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    /// Simulated time of arrival.
    pub at_ms: u64,
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
    /// Whether the key had been applied before (answered from the record).
    pub duplicate: bool,
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

    /// Applies (or recognises) one delivery; answers the reply and whether to drop it.
    pub fn apply(&mut self, req: &TargetRequest) -> (TargetReply, bool) {
        let id = (req.key.clone(), req.sandbox.clone());
        self.calls.push(CallRecord {
            at_ms: crate::clock::elapsed_ms(),
            attempt: req.attempt.clone(),
            ordinal: req.ordinal,
            key: req.key.clone(),
            sandbox: req.sandbox.clone(),
            delivery: req.delivery,
            worker: req.worker.clone(),
            duplicate: self.keys.contains_key(&id),
        });
        let reply = if let Some(k) = self.keys.get_mut(&id) {
            k.deliveries += 1;
            self.duplicates += 1;
            self.trace.line(
                "target",
                format!(
                    "{} step {} ({}) from {}: duplicate, same receipt",
                    req.attempt, req.ordinal, req.step, req.worker
                ),
            );
            k.reply.clone()
        } else {
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
        };
        let lost = self.faults_on && self.rng.chance(self.reply_loss);
        if lost {
            self.replies_lost += 1;
            self.trace
                .line("target", format!("{} step {}: reply lost", req.attempt, req.ordinal));
        }
        (reply, lost)
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
}

/// `(worker, at ms)`: every executor call that failed transiently, shared by the
/// workers' executors (invariant 13 reads it).
pub type FailureLog = std::sync::Arc<std::sync::Mutex<Vec<(String, u64)>>>;

impl TargetExecutor {
    /// The executor of worker `worker`, with this deadline per call.
    pub fn new(worker: impl Into<String>, timeout_ms: u64) -> Self {
        Self {
            worker: worker.into(),
            pool: Pool::new("target", TARGET_PORT),
            timeout_ms,
            failures: None,
        }
    }

    /// This executor, recording its transient failures in `log`.
    pub fn recording(mut self, log: FailureLog) -> Self {
        self.failures = Some(log);
        self
    }

    fn record_failure(&self) {
        if let Some(log) = &self.failures {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            log.push((self.worker.clone(), crate::clock::elapsed_ms()));
        }
    }

    async fn send(&self, req: &TargetRequest) -> Result<TargetReply, String> {
        self.pool
            .call(req, Duration::from_millis(self.timeout_ms))
            .await
            .map_err(|e| match e {
                CallError::NotSent(m) | CallError::NoReply(m) => m,
            })
    }
}

impl Executor for TargetExecutor {
    async fn execute(&self, request: ExecRequest) -> ExecutorResult {
        let step = &request.step;
        let sandbox = match step.executor.as_str() {
            SANDBOX => Some(plans::sandbox_id(&request.attempt_id, request.delivery)),
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
        };
        match self.send(&req).await {
            Ok(reply) => ExecutorResult::Done {
                evidence: plans::evidence(
                    step,
                    &request.idempotency_key,
                    sandbox.as_deref(),
                    &self.worker,
                    &reply.applied,
                ),
                target_receipt: reply.target_receipt,
            },
            Err(e) => {
                self.record_failure();
                ExecutorResult::Transient(format!("step {}: {e}", step.code))
            }
        }
    }
}
