//! What the SQL ledgers share for writes made inside a caller's own transaction
//! ([`crate::outbox`]): the engine's decision, with ids drawn from the entropy in the
//! order the ledgers draw them (plan; or attempt, then command).

use super::{EnqueueRequest, LedgerError};
use crate::entropy::{Entropy, IdKind};
use leasehold_engine::transition;
use leasehold_engine::{AttemptRecord, Plan, PlanId, PlanSpec, Timestamp, Writes};

/// The engine's enqueue of `plan` at `now` over its `history`, claimable from
/// `start`: the new attempt's rows and the writes that insert them (`Guard::Absent`).
pub(crate) fn decide_enqueue(
    plan: &Plan,
    history: &[AttemptRecord],
    request: EnqueueRequest,
    entropy: &dyn Entropy,
    now: Timestamp,
) -> Result<(AttemptRecord, Writes), LedgerError> {
    let ids = super::new_attempt_ids(entropy, request.parent);
    let record = transition::enqueue_at(plan, history, request.action, ids, now, request.start)?;
    let writes = Writes::new_attempt(&record);
    Ok((record, writes))
}

/// The plan `spec` describes, validated against `known_executors`, with a fresh id,
/// registered at `now`.
pub(crate) fn decide_plan(
    spec: PlanSpec,
    known_executors: &[&str],
    entropy: &dyn Entropy,
    now: Timestamp,
) -> Result<Plan, LedgerError> {
    Ok(spec.into_plan(known_executors, PlanId::new(entropy.id(IdKind::Plan)), now)?)
}
