//! `dry-run:v1`: an executor with no side effects, for demos, tests and kill drills.
//!
//! Contract: the evidence is a pure function of the step code and the payload
//! (`{"executor", "step", "payload_sha256"}`, plus `"compensated": true` when the
//! action is `compensate`: an `execute` and a `retry` record the same evidence, so
//! the release gate compares them as equals), and the target
//! receipt a pure function of the idempotency key (`{"dry_run": key}`), so every
//! delivery of the same step records the same thing. Payload fields it reads:
//! - `delay_ms` (whole number): sleep this long on the tokio clock before answering;
//! - `fail` (string or `true`): answer a permanent failure (the string is the
//!   message); `false` means do not fail.
//!
//! Any other payload field is carried only through `payload_sha256`. A `delay_ms`
//! or `fail` of the wrong type is a permanent failure naming the field.

use super::{describe, pace, payload_delay_ms, ExecRequest, Executor, ExecutorResult};
use leasehold_engine::canonical::fingerprint;
use leasehold_engine::Action;
use serde_json::{json, Value};
use std::future::Future;

/// The executor name plans use for [`DryRun`].
pub const NAME: &str = "dry-run:v1";

/// The `dry-run:v1` executor: deterministic evidence, no side effects.
#[derive(Debug, Default, Clone, Copy)]
pub struct DryRun;

impl DryRun {
    /// A dry-run executor.
    pub fn new() -> Self {
        Self
    }
}

impl Executor for DryRun {
    fn execute(&self, request: ExecRequest) -> impl Future<Output = ExecutorResult> + Send {
        // The answer is a pure function of the request, so it is computed up front:
        // the future then holds only the answer while it sleeps, not the request.
        let (delay_ms, result) = answer(&request);
        async move {
            pace(delay_ms).await;
            result
        }
    }
}

/// The delay to sleep for, and the answer to give after it.
fn answer(request: &ExecRequest) -> (Option<u64>, ExecutorResult) {
    let step = &request.step;
    let delay_ms = match payload_delay_ms(step) {
        Ok(delay_ms) => delay_ms,
        Err(message) => return (None, ExecutorResult::Permanent(message)),
    };
    let failure = match step.payload.get("fail") {
        None | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(format!("step {}: failed on request (payload fail = true)", step.code)),
        Some(Value::String(message)) => Some(message.clone()),
        Some(other) => {
            return (
                None,
                ExecutorResult::Permanent(format!(
                    "step {}: payload field fail must be a string or a boolean, not {}",
                    step.code,
                    describe(other)
                )),
            )
        }
    };
    if let Some(message) = failure {
        return (delay_ms, ExecutorResult::Permanent(message));
    }
    let mut evidence = json!({
        "executor": NAME,
        "step": step.code,
        "payload_sha256": fingerprint(&step.payload),
    });
    if request.action == Action::Compensate {
        evidence["compensated"] = json!(true);
    }
    let result = ExecutorResult::Done {
        evidence,
        target_receipt: json!({ "dry_run": request.idempotency_key }),
    };
    (delay_ms, result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_engine::AttemptId;
    use serde_json::json;

    fn request(code: &str, payload: Value) -> ExecRequest {
        crate::executor::tests::request(NAME, code, payload)
    }

    #[tokio::test]
    async fn evidence_is_deterministic_and_the_same_key_gets_the_same_receipt() {
        let first = DryRun.execute(request("notify", json!({"b": 2, "a": 1}))).await;
        let mut again = request("notify", json!({"a": 1.0, "b": 2}));
        again.delivery = 2;
        again.attempt_id = AttemptId::new("att-other");
        let second = DryRun.execute(again).await;
        assert_eq!(first, second);
        let ExecutorResult::Done {
            evidence,
            target_receipt,
        } = first
        else {
            panic!("expected done, got {first:?}");
        };
        assert_eq!(
            evidence,
            json!({
                "executor": "dry-run:v1",
                "step": "notify",
                "payload_sha256": fingerprint(&json!({"a": 1, "b": 2})),
            })
        );
        assert_eq!(target_receipt, json!({"dry_run": "ik-notify"}));
    }

    #[tokio::test]
    async fn different_keys_get_different_receipts() {
        let a = DryRun.execute(request("a", json!({}))).await;
        let mut other = request("a", json!({}));
        other.idempotency_key = "ik-other".into();
        let b = DryRun.execute(other).await;
        let (ExecutorResult::Done { target_receipt: ra, .. }, ExecutorResult::Done { target_receipt: rb, .. }) = (a, b)
        else {
            panic!("both should be done");
        };
        assert_ne!(ra, rb);
    }

    #[tokio::test]
    async fn compensation_is_recorded_and_retry_matches_execute() {
        let mut req = request("a", json!({}));
        req.action = Action::Compensate;
        let result = DryRun.execute(req).await;
        assert!(matches!(result, ExecutorResult::Done { ref evidence, .. } if evidence["compensated"] == true));
        let mut retry = request("a", json!({}));
        retry.action = Action::Retry;
        assert_eq!(
            DryRun.execute(retry).await,
            DryRun.execute(request("a", json!({}))).await
        );
    }

    #[tokio::test]
    async fn fail_answers_a_permanent_failure() {
        assert_eq!(
            DryRun.execute(request("a", json!({"fail": "target said no"}))).await,
            ExecutorResult::Permanent("target said no".into())
        );
        assert_eq!(
            DryRun.execute(request("a", json!({"fail": true}))).await,
            ExecutorResult::Permanent("step a: failed on request (payload fail = true)".into())
        );
        assert!(matches!(
            DryRun.execute(request("a", json!({"fail": false}))).await,
            ExecutorResult::Done { .. }
        ));
        let ExecutorResult::Permanent(message) = DryRun.execute(request("a", json!({"fail": 7}))).await else {
            panic!("a numeric fail is malformed");
        };
        assert!(message.contains("payload field fail"), "{message}");
    }

    #[tokio::test]
    async fn a_bad_delay_type_is_a_permanent_failure_naming_delay_ms() {
        let result = DryRun.execute(request("slow", json!({"delay_ms": "soon"}))).await;
        assert_eq!(
            result,
            ExecutorResult::Permanent(
                "step slow: payload field delay_ms must be a non-negative whole number of milliseconds, \
                 not a string (\"soon\")"
                    .into()
            )
        );
    }

    #[tokio::test]
    async fn a_delay_sleeps_before_answering() {
        let started = tokio::time::Instant::now();
        let result = DryRun.execute(request("slow", json!({"delay_ms": 1}))).await;
        assert!(matches!(result, ExecutorResult::Done { .. }));
        assert!(started.elapsed() >= std::time::Duration::from_millis(1));
    }
}
