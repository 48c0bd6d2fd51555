//! Executors: what runs a step, selected by the step's `executor` string.
//!
//! An executor is called by the worker outside every transaction, with the step's
//! idempotency key. It answers an [`ExecutorResult`]: evidence and a target receipt,
//! a permanent failure (the attempt fails), or a transient one (retried with the
//! same key, and after a takeover redelivered with the same key).
//!
//! Contract shared by every executor here:
//! - the same idempotency key always gets the same target receipt;
//! - evidence is derived only from the step, its payload and the target's state, so
//!   two deliveries that do the same work record the same semantic evidence;
//! - waiting uses `tokio::time` only, and nothing blocks on another thread, so an
//!   executor runs unchanged under a simulated clock on a single-threaded host;
//! - a malformed payload is a permanent failure whose message names the field.
//!
//! [`Executors`] is the registry that the worker uses: it dispatches on
//! `request.step.executor` to [`DryRun`] (`dry-run:v1`) or [`SqliteSandbox`]
//! (`sqlite-sandbox:v1`); [`KNOWN_EXECUTORS`] is what plan validation accepts.

pub mod dry_run;
pub mod sandbox;

pub use dry_run::DryRun;
pub use sandbox::SqliteSandbox;

use leasehold_engine::{Action, AttemptId, CommandId, PlanId, Step};
use serde_json::Value;
use std::future::Future;
use std::time::Duration;

pub use leasehold_engine::driver::ExecutorResult;

/// One call of an executor for one step of one delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecRequest {
    /// The plan.
    pub plan_id: PlanId,
    /// The attempt.
    pub attempt_id: AttemptId,
    /// The command.
    pub command_id: CommandId,
    /// The command's delivery count for this claim (1 on the first claim).
    pub delivery: u32,
    /// execute, retry or compensate.
    pub action: Action,
    /// The receipt's ordinal.
    pub ordinal: u32,
    /// The plan step.
    pub step: Step,
    /// Stable for (attempt, step) across deliveries.
    pub idempotency_key: String,
}

/// Runs steps.
pub trait Executor: Send + Sync + 'static {
    /// Runs one step.
    fn execute(&self, request: ExecRequest) -> impl Future<Output = ExecutorResult> + Send;

    /// A delivery of `attempt` ended (any outcome): free what it held.
    fn release(&self, attempt: &AttemptId, delivery: u32) {
        let _ = (attempt, delivery);
    }
}

/// The executor names this installation knows; plan validation accepts only these.
pub const KNOWN_EXECUTORS: &[&str] = &[dry_run::NAME, sandbox::NAME];

/// The registry of every built-in executor, dispatching on the step's `executor`.
#[derive(Debug, Default)]
pub struct Executors {
    dry_run: DryRun,
    sandbox: SqliteSandbox,
}

impl Executors {
    /// A registry with a fresh [`DryRun`] and a [`SqliteSandbox`] holding no sandboxes.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `dry-run:v1` executor.
    pub fn dry_run(&self) -> &DryRun {
        &self.dry_run
    }

    /// The `sqlite-sandbox:v1` executor.
    pub fn sandbox(&self) -> &SqliteSandbox {
        &self.sandbox
    }
}

impl Executor for Executors {
    async fn execute(&self, request: ExecRequest) -> ExecutorResult {
        match request.step.executor.as_str() {
            dry_run::NAME => self.dry_run.execute(request).await,
            // Boxed: the sandbox's future is large, and inline it would make every
            // dry-run call's future as large (an allocation glibc serves slowly).
            sandbox::NAME => Box::pin(self.sandbox.execute(request)).await,
            other => ExecutorResult::Permanent(format!(
                "step {}: unknown executor {other:?} (known: {})",
                request.step.code,
                KNOWN_EXECUTORS.join(", ")
            )),
        }
    }

    fn release(&self, attempt: &AttemptId, delivery: u32) {
        self.dry_run.release(attempt, delivery);
        self.sandbox.release(attempt, delivery);
    }
}

/// Reads the optional `delay_ms` payload field: a non-negative whole number of
/// milliseconds. A float with no fractional part is accepted because canonical JSON
/// (and so the plan fingerprint) treats `300.0` and `300` as the same value.
pub(crate) fn payload_delay_ms(step: &Step) -> Result<Option<u64>, String> {
    let Some(value) = step.payload.get("delay_ms") else {
        return Ok(None);
    };
    let whole = value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0 && *f <= u64::MAX as f64)
            .map(|f| f as u64)
    });
    match whole {
        Some(ms) => Ok(Some(ms)),
        None => Err(format!(
            "step {}: payload field delay_ms must be a non-negative whole number of milliseconds, not {}",
            step.code,
            describe(value)
        )),
    }
}

/// Sleeps for the step's `delay_ms`, on the tokio clock so that a paused or
/// simulated clock governs it.
pub(crate) async fn pace(delay_ms: Option<u64>) {
    if let Some(ms) = delay_ms.filter(|ms| *ms > 0) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// A short description of a JSON value for error messages: its type and its text.
pub(crate) fn describe(value: &Value) -> String {
    let kind = match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    let text = value.to_string();
    if text.chars().count() > 60 {
        format!("{kind} ({}…)", text.chars().take(60).collect::<String>())
    } else {
        format!("{kind} ({text})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn request(executor: &str, code: &str, payload: Value) -> ExecRequest {
        ExecRequest {
            plan_id: PlanId::new("plan-1"),
            attempt_id: AttemptId::new("att-1"),
            command_id: CommandId::new("cmd-1"),
            delivery: 1,
            action: Action::Execute,
            ordinal: 1,
            step: Step {
                code: code.into(),
                executor: executor.into(),
                payload,
            },
            idempotency_key: format!("ik-{code}"),
        }
    }

    #[tokio::test]
    async fn registry_dispatches_on_the_step_executor() {
        let executors = Executors::new();
        let dry = executors.execute(request("dry-run:v1", "a", json!({}))).await;
        assert!(matches!(dry, ExecutorResult::Done { ref evidence, .. } if evidence["executor"] == "dry-run:v1"));
        let sbx = executors
            .execute(request("sqlite-sandbox:v1", "b", json!({"sql": [], "checks": []})))
            .await;
        assert!(
            matches!(sbx, ExecutorResult::Done { ref evidence, .. } if evidence["sandbox_id"] == "sbx-att-1-d1"),
            "{sbx:?}"
        );
        assert_eq!(executors.sandbox().open_sandboxes().len(), 1);
        executors.release(&AttemptId::new("att-1"), 1);
        assert!(executors.sandbox().open_sandboxes().is_empty());
    }

    #[tokio::test]
    async fn registry_refuses_an_unknown_executor_permanently() {
        let result = Executors::new().execute(request("nope:v9", "a", json!({}))).await;
        assert_eq!(
            result,
            ExecutorResult::Permanent(
                "step a: unknown executor \"nope:v9\" (known: dry-run:v1, sqlite-sandbox:v1)".into()
            )
        );
    }

    #[test]
    fn known_executors_are_the_registered_ones() {
        assert_eq!(KNOWN_EXECUTORS, &["dry-run:v1", "sqlite-sandbox:v1"]);
    }

    #[test]
    fn delay_accepts_whole_numbers_and_names_the_field_otherwise() {
        let step = |payload| request("dry-run:v1", "s", payload).step;
        assert_eq!(payload_delay_ms(&step(json!({}))), Ok(None));
        assert_eq!(payload_delay_ms(&step(json!({"delay_ms": 5}))), Ok(Some(5)));
        assert_eq!(payload_delay_ms(&step(json!({"delay_ms": 5.0}))), Ok(Some(5)));
        for bad in [json!("5"), json!(-1), json!(1.5), json!(null)] {
            let err = payload_delay_ms(&step(json!({"delay_ms": bad}))).unwrap_err();
            assert!(err.starts_with("step s: payload field delay_ms must be"), "{err}");
        }
    }
}
