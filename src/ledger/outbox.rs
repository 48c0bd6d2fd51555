//! What the SQL ledgers share for writes made inside a caller's own transaction
//! ([`crate::outbox`]): the engine's decision, with ids drawn from the entropy in the
//! order the ledgers draw them (plan; or attempt, then command).

use super::{EnqueueRequest, Enqueued, LedgerError};
use crate::entropy::{Entropy, IdKind};
use leasehold_engine::{AttemptRecord, Plan, PlanId, PlanSpec, Timestamp, Writes};

/// The engine's enqueue of `plan` at `now` over its `history` and the attempt its
/// key names (`keyed`) ([`super::decide_enqueue`]), with the writes that insert a new
/// attempt (`Guard::Absent`); none when an earlier attempt is answered.
pub(crate) fn decide_enqueue(
    plan: &Plan,
    history: &[AttemptRecord],
    keyed: Option<&AttemptRecord>,
    request: &EnqueueRequest,
    (entropy, now): (&dyn Entropy, Timestamp),
) -> Result<(Enqueued, Option<Writes>), LedgerError> {
    let enqueued = super::decide_enqueue(plan, history, keyed, request, (entropy, now))?;
    let writes = enqueued.created.then(|| Writes::new_attempt(&enqueued.record));
    Ok((enqueued, writes))
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
