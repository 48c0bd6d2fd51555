//! Retention: which finished attempts may be deleted, and the batches that delete
//! them ([`prune`]).
//!
//! **What is kept.** An attempt is prunable only if it is ended (SUCCEEDED, FAILED
//! or ABORTED, and of the states asked for), finished before the cutoff, and none of
//! these, per plan ([`Keep`]):
//! - numbered at or above the plan's latest forward attempt (`execute`, `retry`):
//!   that attempt is what the release gate judges and what a compensation undoes,
//!   the compensations above it are what the gate's check 2 and the "already
//!   compensated" guard read, and the highest number of all is what the next
//!   attempt's number follows (so numbers stay unique and increasing);
//! - the gate's baseline: the highest forward attempt below the latest forward one
//!   that is SUCCEEDED with its command DELIVERED;
//! - the plan's latest SUCCEEDED attempt, and its latest SUCCEEDED forward attempt.
//!
//! Open attempts are never prunable (the states are ended ones). Plans are never deleted. With that, the gate's
//! report and every enqueue guard's decision are the same after a prune as before
//! it: both read only the latest forward attempt, the attempts above it, the
//! baseline, and the latest attempt.
//!
//! **Concurrency.** What is kept only moves up while workers deliver: a new attempt
//! is numbered above every kept one, and the new baseline is the old one, the old
//! latest forward attempt, or newer. So what a plan keeps is read once, before its
//! first page, and a batch chosen a moment ago stays prunable when it is deleted.
//! Each batch is its own short transaction.

use super::{Ledger, LedgerError};
use leasehold_engine::{Action, AttemptId, AttemptRecord, AttemptStatus, CommandStatus, PlanId, Timestamp};

/// The batch size when none is given.
pub const DEFAULT_BATCH: u32 = 500;

/// The largest batch accepted.
pub const MAX_BATCH: u32 = 10_000;

/// One page of a plan's prunable attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneQuery {
    /// The plan.
    pub plan: PlanId,
    /// Only attempts numbered above this (0: from the first).
    pub after: u32,
    /// Only attempts finished strictly before this instant.
    pub cutoff: Timestamp,
    /// Only attempts in these (ended) states.
    pub states: Vec<AttemptStatus>,
    /// At most this many.
    pub limit: u32,
    /// What the plan keeps, read once before its first page ([`Ledger::prune_keep`]).
    pub keep: Keep,
}

/// The attempt numbers of one plan that retention keeps whatever their age.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keep {
    /// The latest forward attempt: it and everything above it are kept. `None`: the
    /// plan has no forward attempt, and every attempt is kept.
    pub latest_forward: Option<u32>,
    /// The gate's baseline.
    pub baseline: Option<u32>,
    /// The latest SUCCEEDED attempt.
    pub latest_succeeded: Option<u32>,
    /// The latest SUCCEEDED forward attempt.
    pub latest_succeeded_forward: Option<u32>,
}

impl Keep {
    /// What retention keeps of a plan's `history` (its attempts, any order).
    pub fn of(history: &[AttemptRecord]) -> Self {
        let max = |f: &dyn Fn(&AttemptRecord) -> bool| history.iter().filter(|r| f(r)).map(|r| r.attempt.number).max();
        let forward = |r: &AttemptRecord| r.attempt.action.is_forward();
        let succeeded = |r: &AttemptRecord| r.attempt.status == AttemptStatus::Succeeded;
        let latest_forward = max(&forward);
        // A template's baseline ran the latest's input ([`leasehold_engine::gate`]).
        let input = latest_forward
            .and_then(|lf| history.iter().find(|r| r.attempt.number == lf))
            .map(|r| r.attempt.input_sha256.clone());
        let baseline = latest_forward.and_then(|lf| {
            max(&|r| {
                forward(r)
                    && succeeded(r)
                    && r.command.status == CommandStatus::Delivered
                    && r.attempt.number < lf
                    && input.as_ref() == Some(&r.attempt.input_sha256)
            })
        });
        Self {
            latest_forward,
            baseline,
            latest_succeeded: max(&succeeded),
            latest_succeeded_forward: max(&|r| forward(r) && succeeded(r)),
        }
    }

    /// The numbers kept below the latest forward attempt.
    pub fn singles(&self) -> impl Iterator<Item = u32> {
        [self.baseline, self.latest_succeeded, self.latest_succeeded_forward]
            .into_iter()
            .flatten()
    }

    /// Whether attempt `number` is kept.
    pub fn keeps(&self, number: u32) -> bool {
        self.latest_forward.is_none_or(|lf| number >= lf) || self.singles().any(|n| n == number)
    }
}

impl PruneQuery {
    /// Whether `record` is prunable under this query.
    pub fn selects(&self, record: &AttemptRecord) -> bool {
        let a = &record.attempt;
        a.plan_id == self.plan
            && a.number > self.after
            && self.states.contains(&a.status)
            && a.status.is_terminal()
            && a.finished_at.is_some_and(|at| at < self.cutoff)
            && !self.keep.keeps(a.number)
    }
}

/// What a plan keeps, from its whole history: what a ledger without its own
/// probes answers ([`Ledger::prune_keep`]).
pub async fn keep_from_history<L: Ledger + ?Sized>(ledger: &L, plan: &PlanId) -> Result<Keep, LedgerError> {
    Ok(Keep::of(&ledger.history(plan).await?))
}

/// A page of prunable attempts read from the plan's whole history: what a ledger
/// without its own selection answers ([`Ledger::prunable`]).
pub async fn prunable_from_history<L: Ledger + ?Sized>(
    ledger: &L,
    query: &PruneQuery,
) -> Result<Vec<AttemptRecord>, LedgerError> {
    let history = ledger.history(&query.plan).await?;
    let mut chosen: Vec<AttemptRecord> = history.into_iter().filter(|r| query.selects(r)).collect();
    chosen.sort_by_key(|r| r.attempt.number);
    chosen.truncate(query.limit as usize);
    Ok(chosen)
}

/// What a prune is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneOptions {
    /// Prune attempts finished strictly before this instant.
    pub cutoff: Timestamp,
    /// The ended states to prune (all three when empty).
    pub states: Vec<AttemptStatus>,
    /// Attempts per batch (one transaction each).
    pub batch: u32,
    /// Count only: delete nothing.
    pub dry_run: bool,
    /// After each batch, rest this percent of the time the batch took (100: as long
    /// again), so that the prune takes a bounded share of the database while workers
    /// deliver; 0: no rest.
    pub rest_percent: u32,
}

/// The rest after each batch when none is given: as long as the batch took.
pub const DEFAULT_REST_PERCENT: u32 = 100;

impl PruneOptions {
    /// The states pruned: those given, or every ended state.
    fn states(&self) -> Vec<AttemptStatus> {
        if self.states.is_empty() {
            AttemptStatus::ALL.iter().copied().filter(|s| s.is_terminal()).collect()
        } else {
            self.states.clone()
        }
    }
}

/// Where each batch goes before it is deleted: written and made durable before
/// [`prune`] deletes it ([`crate::archive::ArchiveWriter`]).
pub trait BatchSink: Send {
    /// Records `batch` of `plan` durably; an error stops the prune before the batch
    /// is deleted.
    fn record(&mut self, plan: &leasehold_engine::Plan, batch: &[AttemptRecord]) -> Result<(), LedgerError>;
}

/// Prunes every plan's prunable attempts in batches of `options.batch`: each batch
/// is read, handed to `sink` (if any, before anything of it is deleted), then
/// deleted in one transaction, then the prune rests ([`PruneOptions::rest_percent`]).
/// Answers how many attempts were pruned (or, in a dry run, would be; a dry run
/// reads only, and hands nothing to the sink).
pub async fn prune<L: Ledger + ?Sized>(
    ledger: &L,
    options: &PruneOptions,
    mut sink: Option<&mut dyn BatchSink>,
) -> Result<u64, LedgerError> {
    let states = options.states();
    if let Some(bad) = states.iter().find(|s| !s.is_terminal()) {
        return Err(LedgerError::BadInput(format!("state {bad} is not an ended state")));
    }
    let mut total = 0;
    for plan in ledger.list_plans().await? {
        let query = PruneQuery {
            plan: plan.id.clone(),
            after: 0,
            cutoff: options.cutoff,
            states: states.clone(),
            limit: options.batch.clamp(1, MAX_BATCH),
            keep: ledger.prune_keep(&plan.id).await?,
        };
        total += prune_plan(ledger, &plan, query, options, sink.as_deref_mut()).await?;
    }
    Ok(total)
}

/// [`prune`] of one plan, from `query` on.
async fn prune_plan<'s, L: Ledger + ?Sized>(
    ledger: &L,
    plan: &leasehold_engine::Plan,
    mut query: PruneQuery,
    options: &PruneOptions,
    mut sink: Option<&mut (dyn BatchSink + 's)>,
) -> Result<u64, LedgerError> {
    let mut total = 0;
    loop {
        let began = std::time::Instant::now();
        let batch = ledger.prunable(&query).await?;
        let Some(last) = batch.last() else { break };
        query.after = last.attempt.number;
        if options.dry_run {
            total += batch.len() as u64;
            continue;
        }
        if let Some(sink) = sink.as_deref_mut() {
            sink.record(plan, &batch)?;
        }
        let ids: Vec<AttemptId> = batch.iter().map(|r| r.attempt.id.clone()).collect();
        total += ledger.delete_attempts(&ids).await?;
        if options.rest_percent > 0 {
            tokio::time::sleep(began.elapsed() * options.rest_percent / 100).await;
        }
    }
    Ok(total)
}
/// The default of [`Ledger::delete_attempts`]: a ledger that cannot delete refuses.
pub(crate) async fn cannot_delete() -> Result<u64, LedgerError> {
    Err(LedgerError::BadInput("this ledger does not prune".into()))
}

/// The actions of a forward attempt (`execute`, `retry`), for SQL text.
pub(crate) const FORWARD_ACTIONS: [Action; 2] = [Action::Execute, Action::Retry];
