//! The routing invariant: 19.
//!
//! 19. No worker claims a command it cannot run: every applied claim by a worker of
//!     a mixed fleet's partial part ([`WorldParams::durable_only_workers`]) begins a
//!     step whose executor that worker runs (the durable target's). A claim that
//!     ignored the route hands the worker a step it would fail as an unknown
//!     executor, losing an attempt a full worker would have delivered.

use crate::checker::Violation;
use crate::db::DbEvent;
use crate::plans;
use crate::profile::WorldParams;
use leasehold_engine::route::Route;
use leasehold_engine::{Plan, PlanId};
use std::collections::BTreeMap;

/// Invariant 19 over `events`: each claim's step, by the plan of its attempt.
pub fn claims_runnable(events: &[DbEvent], plans: &BTreeMap<PlanId, Plan>, world: &WorldParams) -> Vec<Violation> {
    let mut out = Vec::new();
    for e in events
        .iter()
        .filter(|e| e.is_delivery() && world.is_durable_only(&e.from))
    {
        let (Some(id), Some(after)) = (&e.attempt, &e.after) else {
            continue;
        };
        let record = &after.record;
        let Some(plan) = plans.get(&record.attempt.plan_id) else {
            continue;
        };
        let Some(next) = leasehold_engine::transition::next_step(record) else {
            continue;
        };
        let code = record.receipt(next).map_or("", |r| r.step_code.as_str());
        let route = Route::of_step(plan, code);
        if route.executor != plans::DURABLE {
            out.push(Violation {
                invariant: 19,
                message: format!(
                    "event #{}: {} of {id} by {}, which runs only {}, begins step {next} ({code}) of executor {}",
                    e.seq,
                    e.op,
                    e.from,
                    plans::DURABLE,
                    route.executor
                ),
            });
        }
    }
    out
}
