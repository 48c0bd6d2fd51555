//! The memory ledger: the reference interpreter of the engine's transitions.
//!
//! One mutex over the whole state makes every transition atomic; the engine's
//! [`Guard`] is checked directly against the stored command. Nothing survives the
//! process. Clones share the same state (several "connections" to one ledger).

use super::{Claimed, Ledger, LedgerError};
use crate::clock::Clock;
use crate::entropy::{Entropy, IdKind};
use leasehold_engine::transition::{self, Continued, NewIds, ReconcileOutcome};
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, CommandId, Guard, Lease, Plan, PlanId, PlanSpec, PlanStatus, Timestamp, Writes,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct State {
    plans: BTreeMap<PlanId, Plan>,
    plan_order: Vec<PlanId>,
    attempts: BTreeMap<AttemptId, AttemptRecord>,
    commands: BTreeMap<CommandId, AttemptId>,
}

/// The in-memory reference ledger.
#[derive(Clone)]
pub struct MemoryLedger {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
}

impl std::fmt::Debug for MemoryLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLedger").finish_non_exhaustive()
    }
}

impl MemoryLedger {
    /// An empty ledger deciding leases on `clock` and minting from `entropy`.
    pub fn new(clock: Arc<dyn Clock>, entropy: Arc<dyn Entropy>) -> Self {
        Self {
            state: Arc::default(),
            clock,
            entropy,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied transition:
        // writes are applied only after every check passed.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(state: &State, attempt: &AttemptId) -> Result<AttemptRecord, LedgerError> {
        state
            .attempts
            .get(attempt)
            .cloned()
            .ok_or_else(|| LedgerError::NotFound {
                kind: "attempt",
                id: attempt.to_string(),
            })
    }

    fn plan_of(state: &State, id: &PlanId) -> Result<Plan, LedgerError> {
        state.plans.get(id).cloned().ok_or_else(|| LedgerError::NotFound {
            kind: "plan",
            id: id.to_string(),
        })
    }

    /// Applies writes whose guard still admits the stored command.
    fn apply(state: &mut State, attempt: &AttemptId, writes: &Writes) -> Result<(), LedgerError> {
        let record = state.attempts.get_mut(attempt).ok_or_else(|| LedgerError::NotFound {
            kind: "attempt",
            id: attempt.to_string(),
        })?;
        if !writes.guard.admits(Some(&record.command)) {
            return Err(LedgerError::Refused(leasehold_engine::Refusal::StaleToken {
                command: record.command.id.clone(),
            }));
        }
        writes.apply_to(record);
        Ok(())
    }

    fn worker_transition(
        &self,
        lease: &Lease,
        decide: impl FnOnce(&AttemptRecord, Timestamp) -> Result<Writes, leasehold_engine::Refusal>,
    ) -> Result<AttemptRecord, LedgerError> {
        let mut state = self.lock();
        let record = Self::record(&state, &lease.attempt_id)?;
        if record.command.id != lease.command_id {
            return Err(LedgerError::NotFound {
                kind: "command",
                id: lease.command_id.to_string(),
            });
        }
        let writes = decide(&record, self.clock.now())?;
        Self::apply(&mut state, &lease.attempt_id, &writes)?;
        Self::record(&state, &lease.attempt_id)
    }

    fn claim_with(&self, owner: &str, batch: u32, lease_ms: u64, begin: bool) -> Result<Vec<Claimed>, LedgerError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let mut candidates: Vec<(Timestamp, CommandId, AttemptId)> = state
            .attempts
            .values()
            .filter(|r| Guard::Claimable(now).admits(Some(&r.command)))
            .map(|r| (r.command.available_at, r.command.id.clone(), r.attempt.id.clone()))
            .collect();
        candidates.sort();
        let mut claimed = Vec::new();
        for (_, command_id, attempt_id) in candidates.into_iter().take(batch as usize) {
            let record = Self::record(&state, &attempt_id)?;
            let plan = Self::plan_of(&state, &record.attempt.plan_id)?;
            let token = self.entropy.token();
            let decided = if begin {
                transition::claim_and_begin(&record, plan.recovery, owner, token.clone(), lease_ms, now)
            } else {
                transition::claim(&record, plan.recovery, owner, token.clone(), lease_ms, now)
            };
            let writes = match decided {
                Ok(w) => w,
                Err(_) => continue,
            };
            Self::apply(&mut state, &attempt_id, &writes)?;
            claimed.push(Claimed {
                lease: Lease {
                    command_id,
                    attempt_id: attempt_id.clone(),
                    token,
                },
                plan,
                record: Self::record(&state, &attempt_id)?,
            });
        }
        Ok(claimed)
    }
}

impl Ledger for MemoryLedger {
    async fn migrate(&self) -> Result<Vec<u32>, LedgerError> {
        Ok(Vec::new())
    }

    async fn register_plan(&self, spec: PlanSpec, known_executors: &[&str]) -> Result<Plan, LedgerError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let plan = spec.into_plan(known_executors, PlanId::new(self.entropy.id(IdKind::Plan)), now)?;
        if let Some(existing) = state
            .plans
            .values()
            .find(|p| p.fingerprint == plan.fingerprint && p.status == PlanStatus::Ready)
        {
            return Ok(existing.clone());
        }
        state.plan_order.push(plan.id.clone());
        state.plans.insert(plan.id.clone(), plan.clone());
        Ok(plan)
    }

    async fn plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        Self::plan_of(&self.lock(), id)
    }

    async fn list_plans(&self) -> Result<Vec<Plan>, LedgerError> {
        let state = self.lock();
        Ok(state
            .plan_order
            .iter()
            .filter_map(|id| state.plans.get(id).cloned())
            .collect())
    }

    async fn retire_plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        let mut state = self.lock();
        let plan = state.plans.get_mut(id).ok_or_else(|| LedgerError::NotFound {
            kind: "plan",
            id: id.to_string(),
        })?;
        plan.status = PlanStatus::Retired;
        Ok(plan.clone())
    }

    async fn enqueue(&self, plan: &PlanId, action: Action) -> Result<AttemptRecord, LedgerError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let plan = Self::plan_of(&state, plan)?;
        let history: Vec<AttemptRecord> = state
            .attempts
            .values()
            .filter(|r| r.attempt.plan_id == plan.id)
            .cloned()
            .collect();
        let ids = NewIds {
            attempt: AttemptId::new(self.entropy.id(IdKind::Attempt)),
            command: CommandId::new(self.entropy.id(IdKind::Command)),
        };
        let record = transition::enqueue(&plan, &history, action, ids, now)?;
        state
            .commands
            .insert(record.command.id.clone(), record.attempt.id.clone());
        state.attempts.insert(record.attempt.id.clone(), record.clone());
        Ok(record)
    }

    async fn claim(&self, owner: &str, batch: u32, lease_ms: u64) -> Result<Vec<Claimed>, LedgerError> {
        self.claim_with(owner, batch, lease_ms, false)
    }

    async fn claim_and_begin(&self, owner: &str, batch: u32, lease_ms: u64) -> Result<Vec<Claimed>, LedgerError> {
        self.claim_with(owner, batch, lease_ms, true)
    }

    async fn complete_and_continue(
        &self,
        lease: &Lease,
        ordinal: u32,
        evidence: &Value,
        target_receipt: &Value,
        lease_ms: u64,
    ) -> Result<Continued, LedgerError> {
        let mut continued = Continued::Finished;
        self.worker_transition(lease, |r, now| {
            let (c, writes) =
                transition::complete_and_continue(r, ordinal, evidence, target_receipt, &lease.token, lease_ms, now)?;
            continued = c;
            Ok(writes)
        })?;
        Ok(continued)
    }

    async fn heartbeat(&self, lease: &Lease, lease_ms: u64) -> Result<Timestamp, LedgerError> {
        let record = self.worker_transition(lease, |r, now| {
            transition::heartbeat(&r.command, &lease.token, lease_ms, now)
        })?;
        record
            .command
            .lease_until
            .ok_or_else(|| LedgerError::Internal("renewed lease has no deadline".into()))
    }

    async fn begin_step(&self, lease: &Lease, ordinal: u32, lease_ms: u64) -> Result<(), LedgerError> {
        self.worker_transition(lease, |r, now| {
            transition::begin_step(r, ordinal, &lease.token, lease_ms, now)
        })
        .map(drop)
    }

    async fn complete_step(
        &self,
        lease: &Lease,
        ordinal: u32,
        evidence: &Value,
        target_receipt: &Value,
        lease_ms: u64,
    ) -> Result<(), LedgerError> {
        self.worker_transition(lease, |r, now| {
            transition::complete_step(r, ordinal, evidence, target_receipt, &lease.token, lease_ms, now)
        })
        .map(drop)
    }

    async fn fail(&self, lease: &Lease, ordinal: Option<u32>, error: &str) -> Result<(), LedgerError> {
        self.worker_transition(lease, |r, now| transition::fail(r, ordinal, error, &lease.token, now))
            .map(drop)
    }

    async fn finish(&self, lease: &Lease) -> Result<(), LedgerError> {
        self.worker_transition(lease, |r, now| transition::finish(r, &lease.token, now))
            .map(drop)
    }

    async fn reconcile(&self, attempt: &AttemptId) -> Result<(ReconcileOutcome, AttemptRecord), LedgerError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let record = Self::record(&state, attempt)?;
        let plan = Self::plan_of(&state, &record.attempt.plan_id)?;
        let (outcome, writes) = transition::reconcile(&record, plan.recovery, now)?;
        Self::apply(&mut state, attempt, &writes)?;
        Ok((outcome, Self::record(&state, attempt)?))
    }

    async fn abort(&self, attempt: &AttemptId, reason: &str) -> Result<AttemptRecord, LedgerError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let record = Self::record(&state, attempt)?;
        let writes = transition::abort(&record, reason, now)?;
        Self::apply(&mut state, attempt, &writes)?;
        Self::record(&state, attempt)
    }

    async fn attempt(&self, attempt: &AttemptId) -> Result<AttemptRecord, LedgerError> {
        Self::record(&self.lock(), attempt)
    }

    async fn history(&self, plan: &PlanId) -> Result<Vec<AttemptRecord>, LedgerError> {
        let state = self.lock();
        Self::plan_of(&state, plan)?;
        let mut records: Vec<AttemptRecord> = state
            .attempts
            .values()
            .filter(|r| &r.attempt.plan_id == plan)
            .cloned()
            .collect();
        records.sort_by_key(|r| r.attempt.number);
        Ok(records)
    }

    async fn open_attempts(&self) -> Result<u64, LedgerError> {
        let state = self.lock();
        Ok(state
            .attempts
            .values()
            .filter(|r| !r.attempt.status.is_terminal())
            .count() as u64)
    }
}
