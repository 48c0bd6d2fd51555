//! What the SQL ledgers share for writes made inside a caller's own transaction
//! ([`crate::outbox`]): a registration's decision, with its id drawn from the entropy
//! (an enqueue's is [`super::decide_enqueue`]).

use super::LedgerError;
use crate::entropy::{Entropy, IdKind};
use leasehold_engine::{Plan, PlanId, PlanSpec, Timestamp};

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
