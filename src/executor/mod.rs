//! Executors: what runs a step, selected by the step's `executor` string.
//!
//! An executor is called by the worker outside every transaction, with the step's
//! idempotency key. It answers an [`ExecutorResult`]: evidence and a target receipt,
//! a permanent failure (the attempt fails), or a transient one (retried with the
//! same key, and after a takeover redelivered with the same key).

use leasehold_engine::{Action, AttemptId, CommandId, PlanId, Step};
use std::future::Future;

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
