//! The memory ledger: the reference interpreter of the engine's transitions.
//!
//! One mutex over the whole state makes every transition atomic; the engine's
//! [`Guard`](leasehold_engine::Guard) is checked directly against the stored
//! command. Nothing survives the process. Clones share the same state (several
//! "connections" to one ledger).
//!
//! Claims do not scan: ordered indexes of the PENDING commands (by `available_at`,
//! then command id) and of the PROCESSING ones (by `lease_until`) are kept in step
//! with every write, so a claim reads the claimable commands in claim order
//! directly, and the count of open attempts is kept the same way.

use super::fleet::WorkerRow;
use super::limits::{self, Leases, LimitTable, TargetRow};
use super::{Claimed, EnqueueRequest, Enqueued, Ledger, LedgerError};
use crate::clock::Clock;
use crate::entropy::{Entropy, IdKind};
use leasehold_engine::limits::TargetLimit;
use leasehold_engine::order;
use leasehold_engine::{
    AttemptId, AttemptRecord, Capabilities, ClaimRequest, CommandId, CommandStatus, Lease, LeaseToken, OperatorRequest,
    Plan, PlanId, PlanSpec, PlanStatus, Reply, Request, Timestamp, WorkerRequest, Writes,
};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex, MutexGuard};

/// A map that is only looked up, never iterated (its order would be the hasher's).
/// The hasher has fixed keys: no OS randomness, the same layout on every run.
type Lookup<K, V> = HashMap<K, V, BuildHasherDefault<DefaultHasher>>;

#[derive(Debug, Default)]
struct State {
    // Looked up by id only: hashed, because a lookup in an ordered map of string
    // ids compares (and so reads) a dozen or more keys, each elsewhere in memory.
    plans: Lookup<PlanId, Plan>,
    plan_order: Vec<PlanId>,
    /// The READY plan of each fingerprint (registering it again answers that plan;
    /// only retiring it lets another READY plan have the same content).
    ready: Lookup<String, PlanId>,
    attempts: Lookup<AttemptId, AttemptRecord>,
    /// Every attempt of each plan: what an enqueue's guard and a history read.
    by_plan: Lookup<PlanId, Vec<AttemptId>>,
    index: ClaimIndex,
    /// The fleet's rows, by worker id.
    workers: std::collections::BTreeMap<String, WorkerRow>,
    /// The limited targets' rows.
    limits: LimitTable,
}

/// The live leases as the memory ledger's limits see them: a walk of the leased
/// index from `now` on.
struct LiveLeases<'a> {
    attempts: &'a Lookup<AttemptId, AttemptRecord>,
    index: &'a ClaimIndex,
}

impl Leases for LiveLeases<'_> {
    fn live(&self, target: &str, now: Timestamp) -> u32 {
        let live = self
            .index
            .leased
            .iter()
            .skip_while(|(until, _)| *until < now)
            .filter(|(_, id)| self.attempts.get(id).is_some_and(|r| r.command.target == target))
            .count();
        u32::try_from(live).unwrap_or(u32::MAX)
    }

    fn lease_of(&self, command: &CommandId, target: &str, now: Timestamp) -> Option<Timestamp> {
        let record = self.attempts.values().find(|r| r.command.id == *command)?;
        let c = &record.command;
        (c.status == CommandStatus::Processing && c.target == target)
            .then_some(c.lease_until)
            .flatten()
            .filter(|until| *until >= now)
    }
}

/// What a claim and an idle worker ask about, kept in step with every command row so
/// that neither scans the attempts.
#[derive(Debug, Default)]
struct ClaimIndex {
    /// PENDING commands in claim order, `(available_at, command id)`: the available
    /// ones are a prefix.
    pending: BTreeSet<(Timestamp, CommandId, AttemptId)>,
    /// PROCESSING commands by `lease_until`: the expired ones are a prefix.
    leased: BTreeSet<(Timestamp, AttemptId)>,
    /// How many commands are WAITING behind an order key.
    waiting: usize,
}

/// Where a record sits in the [`ClaimIndex`]: its command's slot (the command id
/// never changes, so the timestamp tells slots apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Pending(Timestamp),
    Leased(Timestamp),
    Waiting,
    Neither,
}

impl Slot {
    fn of(record: &AttemptRecord) -> Self {
        let c = &record.command;
        match (c.status, c.lease_until) {
            (CommandStatus::Pending, _) => Slot::Pending(c.available_at),
            (CommandStatus::Processing, Some(until)) => Slot::Leased(until),
            (CommandStatus::Waiting, _) => Slot::Waiting,
            _ => Slot::Neither,
        }
    }
}

impl ClaimIndex {
    /// Attempts QUEUED or RUNNING, counted by their commands (PENDING, WAITING or
    /// PROCESSING, which always holds a lease), as every backend counts them.
    fn open(&self) -> u64 {
        (self.pending.len() + self.leased.len() + self.waiting) as u64
    }

    fn add(&mut self, record: &AttemptRecord, slot: Slot) {
        let id = &record.attempt.id;
        match slot {
            Slot::Pending(at) => {
                self.pending.insert((at, record.command.id.clone(), id.clone()));
            }
            Slot::Leased(until) => {
                self.leased.insert((until, id.clone()));
            }
            Slot::Waiting => self.waiting += 1,
            Slot::Neither => {}
        }
    }

    fn remove(&mut self, record: &AttemptRecord, slot: Slot) {
        let id = &record.attempt.id;
        match slot {
            Slot::Pending(at) => {
                self.pending.remove(&(at, record.command.id.clone(), id.clone()));
            }
            Slot::Leased(until) => {
                self.leased.remove(&(until, id.clone()));
            }
            Slot::Waiting => self.waiting -= 1,
            Slot::Neither => {}
        }
    }

    /// Applies writes whose guard still admits the stored command, and re-indexes
    /// the record.
    fn apply(&mut self, record: &mut AttemptRecord, writes: Writes) -> Result<(), LedgerError> {
        if !writes.guard.admits(Some(&record.command)) {
            return Err(LedgerError::Refused(leasehold_engine::Refusal::StaleToken {
                command: record.command.id.clone(),
            }));
        }
        let before = Slot::of(record);
        apply_writes(record, writes);
        let after = Slot::of(record);
        if after != before {
            self.remove(record, before);
            self.add(record, after);
        }
        Ok(())
    }

    /// The first `batch` claimable commands at `now` in claim order (oldest
    /// `available_at` first, then command id): PENDING and available, or PROCESSING
    /// with `lease_until < now`.
    fn claimable(
        &self,
        attempts: &Lookup<AttemptId, AttemptRecord>,
        now: Timestamp,
        (batch, caps): (usize, Option<&Capabilities>),
        blocked: impl Fn(&str) -> bool,
    ) -> Vec<(Timestamp, CommandId, AttemptId)> {
        let admits = |id: &AttemptId| {
            attempts
                .get(id)
                .is_some_and(|r| caps.is_none_or(|c| c.admits(&r.command)) && !blocked(&r.command.target))
        };
        let mut candidates: Vec<(Timestamp, CommandId, AttemptId)> = self
            .pending
            .iter()
            .take_while(|(at, _, _)| *at <= now)
            .filter(|(_, _, id)| admits(id))
            .take(batch)
            .cloned()
            .collect();
        let pending = candidates.len();
        candidates.extend(
            self.leased
                .iter()
                .take_while(|(until, _)| *until < now)
                .filter(|(_, id)| admits(id))
                .filter_map(|(_, id)| attempts.get(id))
                .map(|r| (r.command.available_at, r.command.id.clone(), r.attempt.id.clone())),
        );
        if candidates.len() > pending {
            candidates.sort();
            candidates.truncate(batch);
        }
        candidates
    }
}

/// [`Writes::apply_to`], moving the new row images into the record instead of
/// copying them (the writes are spent).
fn apply_writes(record: &mut AttemptRecord, writes: Writes) {
    if let Some(attempt) = writes.attempt {
        record.attempt = attempt;
    }
    if let Some(command) = writes.command {
        record.command = command;
    }
    for receipt in writes.receipts {
        if let Some(slot) = record.receipts.iter_mut().find(|x| x.ordinal == receipt.ordinal) {
            *slot = receipt;
        }
    }
}

impl State {
    /// The attempts an enqueue of `plan` decides over: every one of a plan without
    /// input; a template's latest and its open ones with `order_key`.
    fn enqueue_history(&self, plan: &Plan, order_key: Option<&str>) -> Vec<AttemptRecord> {
        let all = self
            .by_plan
            .get(&plan.id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.attempts.get(id));
        if !plan.is_template() {
            return all.cloned().collect();
        }
        let mut latest: Option<&AttemptRecord> = None;
        let mut chosen = Vec::new();
        for r in all {
            if latest.is_none_or(|l| l.attempt.number < r.attempt.number) {
                latest = Some(r);
            }
            let open = !r.attempt.status.is_terminal();
            if open && order_key.is_some() && r.attempt.order_key.as_deref() == order_key {
                chosen.push(r.clone());
            }
        }
        chosen.extend(latest.cloned());
        chosen
    }

    /// Applies writes to an attempt's record under their guard ([`ClaimIndex::apply`]);
    /// writes that end the head of an order key decide the attempts waiting behind it
    /// ([`order::after_end`]) in the same step.
    fn write(&mut self, id: &AttemptId, writes: Writes) -> Result<(), LedgerError> {
        let record = self
            .attempts
            .get_mut(id)
            .ok_or_else(|| MemoryLedger::not_found("attempt", id))?;
        let ordered = writes.attempt.as_ref().is_some_and(|a| a.order_key.is_some());
        let before = ordered.then(|| record.clone());
        self.index.apply(record, writes)?;
        match before {
            Some(before) if order::ends_head(&before, record) => {
                let after = record.clone();
                self.follow_order(&after)
            }
            _ => Ok(()),
        }
    }

    fn follow_order(&mut self, head: &AttemptRecord) -> Result<(), LedgerError> {
        let plan = MemoryLedger::plan_of(self, &head.attempt.plan_id)?;
        let waiting: Vec<AttemptRecord> = self
            .by_plan
            .get(&plan.id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.attempts.get(id))
            .filter(|r| r.command.status == CommandStatus::Waiting && r.attempt.order_key == head.attempt.order_key)
            .cloned()
            .collect();
        let now = head.attempt.finished_at.unwrap_or(head.attempt.created_at);
        for writes in order::after_end(&plan, head, &waiting, now) {
            let Some(next) = waiting
                .iter()
                .find(|r| writes.command.as_ref().is_some_and(|c| c.id == r.command.id))
            else {
                continue;
            };
            let record = self
                .attempts
                .get_mut(&next.attempt.id)
                .ok_or_else(|| MemoryLedger::not_found("attempt", &next.attempt.id))?;
            self.index.apply(record, writes)?;
        }
        Ok(())
    }

    /// Stores a new record and indexes it.
    fn insert(&mut self, record: AttemptRecord) {
        let id = record.attempt.id.clone();
        self.by_plan
            .entry(record.attempt.plan_id.clone())
            .or_default()
            .push(id.clone());
        self.index.add(&record, Slot::of(&record));
        self.attempts.insert(id, record);
    }

    /// Deletes an ended attempt's record (retention); whether it did.
    fn delete(&mut self, id: &AttemptId) -> bool {
        if !self.attempts.get(id).is_some_and(|r| r.attempt.status.is_terminal()) {
            return false;
        }
        let Some(record) = self.attempts.remove(id) else {
            return false;
        };
        if let Some(ids) = self.by_plan.get_mut(&record.attempt.plan_id) {
            ids.retain(|a| a != id);
        }
        true
    }
}

/// The in-memory reference ledger.
#[derive(Clone)]
pub struct MemoryLedger {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
    /// The API tokens ([`crate::tokens`]), shared by clones like the state.
    #[cfg(feature = "cli")]
    pub(crate) tokens: Arc<Mutex<crate::tokens::MemoryTokens>>,
    writes_hook: Option<super::WritesHook>,
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
            #[cfg(feature = "cli")]
            tokens: Arc::default(),
            writes_hook: None,
        }
    }

    /// This ledger with a [`super::WritesHook`] on every transition's writes.
    #[must_use]
    pub fn with_writes_hook(mut self, hook: super::WritesHook) -> Self {
        self.writes_hook = Some(hook);
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied transition:
        // writes are applied only after every check passed.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn not_found(kind: &'static str, id: &impl std::fmt::Display) -> LedgerError {
        LedgerError::NotFound {
            kind,
            id: id.to_string(),
        }
    }

    fn record(state: &State, attempt: &AttemptId) -> Result<AttemptRecord, LedgerError> {
        state
            .attempts
            .get(attempt)
            .cloned()
            .ok_or_else(|| Self::not_found("attempt", attempt))
    }

    fn plan_of(state: &State, id: &PlanId) -> Result<Plan, LedgerError> {
        state.plans.get(id).cloned().ok_or_else(|| Self::not_found("plan", id))
    }

    /// The one write path of every worker and operator request: looks the record up
    /// (not copying it), decides `request` on it at the clock's reading under the
    /// lock, passes a worker's decision (`worker`: its request and token) through the
    /// target limits ([`LimitTable::worker_write`]), applies the writes under their guard, and
    /// answers the reply with `answer` of the record as it left it. `command`, if
    /// given, must be the attempt's command.
    fn apply<'r, T>(
        &self,
        (attempt, command): (&AttemptId, Option<&CommandId>),
        request: impl FnOnce(&Lookup<PlanId, Plan>, &AttemptRecord) -> Result<Request<'r>, LedgerError>,
        worker: Option<(&WorkerRequest, &LeaseToken)>,
        answer: impl FnOnce(Reply, &AttemptRecord) -> T,
    ) -> Result<T, LedgerError> {
        let mut guard = self.lock();
        let now = self.clock.now();
        let state = &mut *guard;
        let record = state
            .attempts
            .get(attempt)
            .ok_or_else(|| Self::not_found("attempt", attempt))?;
        if let Some(command) = command.filter(|c| **c != record.command.id) {
            return Err(Self::not_found("command", command));
        }
        let request = request(&state.plans, record)?;
        let mut decided = super::decide(self.writes_hook.as_ref(), record, request, now)?;
        if let Some(worker) = worker.filter(|_| !state.limits.is_empty()) {
            let leases = LiveLeases {
                attempts: &state.attempts,
                index: &state.index,
            };
            decided = state.limits.worker_write(&leases, worker, record, decided, now)?;
        }
        let (writes, reply) = decided;
        state.write(attempt, writes)?;
        let record = state
            .attempts
            .get(attempt)
            .ok_or_else(|| Self::not_found("attempt", attempt))?;
        Ok(answer(reply, record))
    }

    fn claim_with(&self, request: &ClaimRequest) -> Result<Vec<Claimed>, LedgerError> {
        let now = self.clock.now();
        let mut guard = self.lock();
        let state = &mut *guard;
        let window = (request.batch as usize, request.capabilities.as_ref());
        let candidates = {
            let leases = LiveLeases {
                attempts: &state.attempts,
                index: &state.index,
            };
            let blocked = |t: &str| !state.limits.is_empty() && state.limits.blocks(t, &leases, now);
            state.index.claimable(&state.attempts, now, window, blocked)
        };
        let mut claimed = Vec::with_capacity(candidates.len());
        for (_, command_id, attempt_id) in candidates {
            let record = state
                .attempts
                .get(&attempt_id)
                .ok_or_else(|| Self::not_found("attempt", &attempt_id))?;
            let plan = state
                .plans
                .get(&record.attempt.plan_id)
                .ok_or_else(|| Self::not_found("plan", &record.attempt.plan_id))?;
            let token = self.entropy.token();
            let claim = Request::Claim(request, &token, plan);
            let Ok((writes, _)) = super::decide(self.writes_hook.as_ref(), record, claim, now) else {
                continue;
            };
            if let Some(target) = limits::entered(record, &writes, now) {
                let leases = LiveLeases {
                    attempts: &state.attempts,
                    index: &state.index,
                };
                if state.limits.admit(target, &command_id, &leases, now).is_err() {
                    continue;
                }
            }
            let plan = plan.clone();
            state.write(&attempt_id, writes)?;
            let record = state
                .attempts
                .get(&attempt_id)
                .ok_or_else(|| Self::not_found("attempt", &attempt_id))?;
            let claim = Claimed {
                lease: Lease {
                    command_id,
                    attempt_id,
                    token,
                },
                plan,
                record: record.clone(),
            };
            if claim.is_lease() {
                claimed.push(claim);
            }
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
        let existing = state.ready.get(&plan.fingerprint).and_then(|id| state.plans.get(id));
        if let Some(existing) = existing.filter(|p| p.status == PlanStatus::Ready) {
            return Ok(existing.clone());
        }
        state.plan_order.push(plan.id.clone());
        state.ready.insert(plan.fingerprint.clone(), plan.id.clone());
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
        let plan = plan.clone();
        if state.ready.get(&plan.fingerprint) == Some(&plan.id) {
            state.ready.remove(&plan.fingerprint);
        }
        Ok(plan)
    }

    async fn enqueue_with(&self, plan: &PlanId, request: EnqueueRequest) -> Result<Enqueued, LedgerError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let plan = Self::plan_of(&state, plan)?;
        let history = state.enqueue_history(&plan, request.order_key.as_deref());
        let keyed = request.key.as_ref().and_then(|key| {
            let holds = |r: &&AttemptRecord| r.attempt.enqueue_key.as_ref() == Some(key);
            state.attempts.values().find(holds).cloned()
        });
        let enqueued = super::decide_enqueue(&plan, &history, keyed.as_ref(), &request, (&*self.entropy, now))?;
        if enqueued.created {
            state.insert(enqueued.record.clone());
        }
        Ok(enqueued)
    }

    async fn claim_batch(&self, request: ClaimRequest) -> Result<Vec<Claimed>, LedgerError> {
        self.claim_with(&request)
    }

    async fn worker(&self, lease: &Lease, request: WorkerRequest) -> Result<Reply, LedgerError> {
        // Plans never change but for their status: read before the write is as good.
        let plan = match request.needs_plan() {
            true => {
                let state = self.lock();
                let record = Self::record(&state, &lease.attempt_id)?;
                Some(Self::plan_of(&state, &record.attempt.plan_id)?)
            }
            false => None,
        };
        self.apply(
            (&lease.attempt_id, Some(&lease.command_id)),
            |_, _| Ok(Request::Worker(&request, &lease.token, plan.as_ref())),
            Some((&request, &lease.token)),
            |reply, _| reply,
        )
    }

    async fn operator(
        &self,
        attempt: &AttemptId,
        request: OperatorRequest,
    ) -> Result<(Reply, AttemptRecord), LedgerError> {
        self.apply(
            (attempt, None),
            |plans, record| {
                let plan = plans
                    .get(&record.attempt.plan_id)
                    .ok_or_else(|| Self::not_found("plan", &record.attempt.plan_id))?;
                Ok(Request::Operator(&request, plan.recovery))
            },
            None,
            |reply, record| (reply, record.clone()),
        )
    }

    async fn attempt(&self, attempt: &AttemptId) -> Result<AttemptRecord, LedgerError> {
        Self::record(&self.lock(), attempt)
    }

    async fn history(&self, plan: &PlanId) -> Result<Vec<AttemptRecord>, LedgerError> {
        let state = self.lock();
        Self::plan_of(&state, plan)?;
        let mut records: Vec<AttemptRecord> = state
            .by_plan
            .get(plan)
            .into_iter()
            .flatten()
            .filter_map(|id| state.attempts.get(id))
            .cloned()
            .collect();
        records.sort_by_key(|r| r.attempt.number);
        Ok(records)
    }

    async fn open_attempts(&self) -> Result<u64, LedgerError> {
        Ok(self.lock().index.open())
    }

    async fn open_attempts_for(&self, capabilities: &Capabilities) -> Result<u64, LedgerError> {
        let open = self
            .lock()
            .attempts
            .values()
            .filter(|r| !r.command.status.is_terminal() && capabilities.admits(&r.command))
            .count();
        Ok(open as u64)
    }

    async fn report_worker(&self, id: &str, capabilities: &Capabilities, starting: bool) -> Result<(), LedgerError> {
        let now = self.clock.now();
        let mut state = self.lock();
        if starting {
            state
                .workers
                .retain(|_, w| w.last_seen_at.plus_ms(super::fleet::FORGET_AFTER_MS) >= now);
        }
        let row = state.workers.entry(id.to_owned()).or_insert_with(|| WorkerRow {
            id: id.to_owned(),
            capabilities: capabilities.clone(),
            started_at: now,
            last_seen_at: now,
        });
        if starting {
            row.started_at = now;
        }
        row.capabilities = capabilities.clone();
        row.last_seen_at = now;
        Ok(())
    }

    async fn workers(&self) -> Result<(Vec<WorkerRow>, Timestamp), LedgerError> {
        let rows = self.lock().workers.values().cloned().collect();
        Ok((rows, self.clock.now()))
    }

    async fn set_limit(&self, limit: TargetLimit) -> Result<(), LedgerError> {
        super::checked_limit(&limit)?;
        self.lock().limits.set(limit);
        Ok(())
    }

    async fn clear_limit(&self, target: &str) -> Result<bool, LedgerError> {
        Ok(self.lock().limits.clear(target))
    }

    async fn limits(&self) -> Result<(Vec<TargetRow>, Timestamp), LedgerError> {
        let now = self.clock.now();
        let state = self.lock();
        let leases = LiveLeases {
            attempts: &state.attempts,
            index: &state.index,
        };
        Ok((state.limits.list(&leases, now), now))
    }

    async fn delete_attempts(&self, ids: &[AttemptId]) -> Result<u64, LedgerError> {
        let mut state = self.lock();
        Ok(ids.iter().filter(|id| state.delete(id)).count() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::entropy::SeededEntropy;
    use crate::executor::Executors;
    use leasehold_engine::transition::{self, NewIds};
    use leasehold_engine::{Action, Guard, Step};

    fn spec(name: &str, recovery: &str, steps: usize) -> PlanSpec {
        PlanSpec {
            input: None,
            on_failure: None,
            name: name.to_owned(),
            queue: None,
            recovery: recovery.to_owned(),
            volatile_fields: Vec::new(),
            steps: (1..=steps)
                .map(|i| Step {
                    code: format!("step-{i}"),
                    executor: "dry-run:v1".to_owned(),
                    target: None,
                    payload: serde_json::json!({ "n": i }),
                    retry: None,
                })
                .collect(),
            retry: None,
        }
    }

    /// What a claim took before the indexes: every claimable command, sorted.
    fn scanned(state: &State, now: Timestamp, batch: usize) -> Vec<(Timestamp, CommandId, AttemptId)> {
        let mut all: Vec<_> = state
            .attempts
            .values()
            .filter(|r| Guard::Claimable(now).admits(Some(&r.command)))
            .map(|r| (r.command.available_at, r.command.id.clone(), r.attempt.id.clone()))
            .collect();
        all.sort();
        all.truncate(batch);
        all
    }

    fn assert_indexes_match_a_scan(ledger: &MemoryLedger, now: Timestamp, why: &str) {
        let state = ledger.lock();
        for batch in [1, 2, 5, 1_000] {
            assert_eq!(
                state.index.claimable(&state.attempts, now, (batch, None), |_| false),
                scanned(&state, now, batch),
                "claim order (batch {batch}) after {why}"
            );
        }
        let open = state
            .attempts
            .values()
            .filter(|r| !r.command.status.is_terminal())
            .count() as u64;
        assert_eq!(state.index.open(), open, "open attempts after {why}");
        let indexed = state.index.pending.len() + state.index.leased.len();
        let expected = state
            .attempts
            .values()
            .filter(|r| matches!(Slot::of(r), Slot::Pending(_) | Slot::Leased(_)))
            .count();
        assert_eq!(indexed, expected, "index entries after {why}");
    }

    #[tokio::test]
    async fn an_expired_lease_is_claimed_in_available_at_order_with_the_pending_commands() {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
        let ledger = MemoryLedger::new(clock.clone(), Arc::new(SeededEntropy::new(7)));
        let mut attempts = Vec::new();
        for name in ["a", "b", "c"] {
            let plan = ledger
                .register_plan(spec(name, "resume", 2), &Executors::new().names())
                .await
                .unwrap();
            attempts.push(ledger.enqueue(&plan.id, Action::Execute).await.unwrap().attempt.id);
            clock.advance_ms(1);
        }
        let first = ledger.claim("w1", 1, 100).await.unwrap();
        assert_eq!(first[0].lease.attempt_id, attempts[0]);
        clock.advance_ms(101);
        // The lease of a (enqueued first) has expired: it comes before b and c again.
        let again: Vec<AttemptId> = ledger
            .claim("w2", 2, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.lease.attempt_id)
            .collect();
        assert_eq!(again, attempts[..2]);
        assert_eq!(ledger.open_attempts().await.unwrap(), 3);
    }

    /// Drives a pseudo-random mix of every transition and checks after each one that
    /// the indexes answer what a scan of every attempt answers.
    #[tokio::test]
    async fn the_claim_indexes_agree_with_a_scan_through_every_transition() {
        let start = Timestamp::from_millis(2_000_000);
        let clock = Arc::new(ManualClock::new(start));
        let ledger = MemoryLedger::new(clock.clone(), Arc::new(SeededEntropy::new(11)));
        let mut plans = Vec::new();
        for i in 0..12 {
            let recovery = if i % 2 == 0 { "resume" } else { "replay" };
            plans.push(
                ledger
                    .register_plan(spec(&format!("p{i}"), recovery, 1 + i % 3), &Executors::new().names())
                    .await
                    .unwrap(),
            );
        }
        let mut leases: Vec<Claimed> = Vec::new();
        let mut seed = 0x5eed_u64;
        let mut next = move |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        for round in 0..600 {
            let op = next(10);
            let why = format!("round {round} op {op}");
            match op {
                0 | 1 => {
                    let plan = &plans[next(plans.len() as u64) as usize];
                    let action = [Action::Execute, Action::Retry, Action::Compensate][next(3) as usize];
                    let _ = ledger.enqueue(&plan.id, action).await;
                }
                2 | 3 => {
                    let batch = 1 + next(3) as u32;
                    if let Ok(claimed) = ledger.claim_and_begin("w", batch, 50 + next(100)).await {
                        leases.extend(claimed);
                    }
                }
                4 => clock.advance_ms(next(120)),
                _ if leases.is_empty() => {}
                _ => {
                    let c = &leases[next(leases.len() as u64) as usize];
                    let lease = &c.lease;
                    let ordinal = 1 + next(3) as u32;
                    let evidence = serde_json::json!({ "round": round });
                    let _ = match op {
                        5 => ledger.heartbeat(lease, 80).await.map(drop),
                        6 => ledger
                            .complete_and_continue(lease, ordinal, &evidence, &evidence, 80)
                            .await
                            .map(drop),
                        7 => ledger.fail(lease, Some(ordinal), "no").await,
                        8 => ledger.reconcile(&lease.attempt_id).await.map(drop),
                        _ => ledger.abort(&lease.attempt_id, "stop").await.map(drop),
                    };
                }
            }
            assert_indexes_match_a_scan(&ledger, clock.now(), &why);
            // Also just past the next lease expiry, where PROCESSING rows join in.
            assert_indexes_match_a_scan(&ledger, clock.now().plus_ms(200), &why);
        }
        assert!(leases.len() > 20, "the mix claimed too little: {}", leases.len());
    }

    #[test]
    fn moving_writes_into_a_record_is_applying_them() {
        let now = Timestamp::from_millis(1_000);
        let plan = spec("p", "replay", 3)
            .into_plan(&Executors::new().names(), PlanId::new("p"), now)
            .unwrap();
        let ids = NewIds {
            attempt: AttemptId::new("a"),
            command: CommandId::new("c"),
            trace: None,
        };
        let record = transition::enqueue(&plan, &[], Action::Execute, ids, now).unwrap();
        let token = leasehold_engine::LeaseToken::new("t");
        let writes = transition::claim_and_begin(&record, plan.recovery, "w", token.clone(), 60_000, now).unwrap();
        let (mut moved, mut copied) = (record.clone(), record);
        writes.apply_to(&mut copied);
        apply_writes(&mut moved, writes);
        assert_eq!(moved, copied);
        let evidence = serde_json::json!({ "ok": true });
        let (_, writes) =
            transition::complete_and_continue(&moved, 1, &evidence, &evidence, &token, 60_000, now).unwrap();
        writes.apply_to(&mut copied);
        apply_writes(&mut moved, writes);
        assert_eq!(moved, copied);
        let writes = transition::fail(&moved, Some(2), "no", &token, now).unwrap();
        writes.apply_to(&mut copied);
        apply_writes(&mut moved, writes);
        assert_eq!(moved, copied);
    }
}
