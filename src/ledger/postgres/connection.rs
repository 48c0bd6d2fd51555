//! Transactions and retries, and every request of the PostgreSQL ledger.
//!
//! Each `*_once` method is one try: it takes a pooled session, runs one transaction
//! and ends it (commit on success, rollback on any error, so row locks are released
//! at once). [`PostgresLedger::retry`] runs a try again after a [`TxError::Retry`] with
//! bounded, jittered exponential backoff, and turns the last error into a
//! [`LedgerError`].
//!
//! Writes run at READ COMMITTED (the server's default): every locking read answers
//! the latest committed version of its rows, and a guarded `UPDATE` re-evaluates its
//! guard on the latest version of the row it waited for. Reads of several statements
//! run at REPEATABLE READ, read only: one snapshot.

use super::error::{classify, Phase, TxError};
use super::rows::{self, not_found};
use super::PostgresLedger;
use crate::entropy::IdKind;
use crate::ledger::sql::decode;
use crate::ledger::{decide, Claimed, LedgerError};
use deadpool_postgres::{Client, Transaction};
use leasehold_engine::transition::{self, is_claimable, NewIds};
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, ClaimRequest, CommandId, Lease, OperatorRequest, Plan, PlanId, PlanSpec,
    PlanStatus, Reply, Request, Timestamp, WorkerRequest, Writes,
};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_postgres::IsolationLevel;

/// The first backoff after a conflict; it doubles per try up to [`BACKOFF_MAX_MS`].
const BACKOFF_BASE_MS: u64 = 2;
/// The longest backoff between two tries of one transaction.
const BACKOFF_MAX_MS: u64 = 250;
/// How many candidates per command wanted a claim looks through (at least
/// [`CLAIM_WINDOW_MIN`], at most [`CLAIM_WINDOW_MAX`]): room for the ones that other
/// claimers hold right now, which `SKIP LOCKED` passes over.
const CLAIM_SPREAD: u32 = 8;
const CLAIM_WINDOW_MIN: u32 = 64;
const CLAIM_WINDOW_MAX: u32 = 1_000;

fn statement(e: tokio_postgres::Error) -> TxError {
    classify(&e, Phase::Statement)
}

/// Begins a write transaction (READ COMMITTED).
async fn begin(client: &mut Client) -> Result<Transaction<'_>, TxError> {
    client.transaction().await.map_err(statement)
}

/// Begins a read: one snapshot for all its statements.
pub(super) async fn begin_read(client: &mut Client) -> Result<Transaction<'_>, TxError> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(statement)
}

/// Commits on success, rolls back on error. A lost connection during the `COMMIT`
/// of a write is ambiguous; during a read's it does not matter.
async fn end<T>(tx: Transaction<'_>, result: Result<T, TxError>, write: bool) -> Result<T, TxError> {
    match result {
        Ok(v) => {
            let phase = if write { Phase::Commit } else { Phase::Statement };
            tx.commit().await.map_err(|e| classify(&e, phase))?;
            Ok(v)
        }
        Err(e) => {
            // A failed rollback means a broken session: the server rolls back.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

impl PostgresLedger {
    /// Runs `op` until it answers something other than [`TxError::Retry`], at most
    /// `retry_max` times, sleeping a jittered, growing backoff in between.
    pub(super) async fn retry<T, F, Fut>(&self, mut op: F) -> Result<T, LedgerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TxError>>,
    {
        let tries = self.url.options.retry_max.max(1);
        let mut tried = 0u32;
        loop {
            tried += 1;
            match op().await {
                Ok(v) => return Ok(v),
                Err(TxError::Ledger(e)) => return Err(e),
                Err(TxError::Ambiguous(m)) => return Err(LedgerError::Ambiguous(m)),
                Err(TxError::Retry(m)) if tried >= tries => {
                    return Err(LedgerError::Unavailable(format!("{m} (gave up after {tried} tries)")))
                }
                Err(TxError::Retry(_)) => {
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(self.backoff(tried)).await;
                }
            }
        }
    }

    /// Jittered backoff: uniform in [cap/2, cap], where cap doubles with every try.
    fn backoff(&self, tried: u32) -> Duration {
        let cap = BACKOFF_BASE_MS
            .saturating_mul(1u64 << tried.min(16))
            .min(BACKOFF_MAX_MS);
        let half = cap / 2;
        Duration::from_millis(half + self.entropy.next_u64() % (cap - half + 1))
    }

    /// The decision's now: the injected clock, else the database's as read.
    fn decide_at(&self, db_now: Option<Timestamp>) -> Result<Timestamp, TxError> {
        match (&self.clock, db_now) {
            (Some(clock), _) => Ok(clock.now()),
            (None, Some(now)) => Ok(now),
            (None, None) => Err(LedgerError::Internal("no clock to decide on".into()).into()),
        }
    }

    /// The ledger clock's now inside `tx`: the injected clock, or the database's.
    async fn now_in(&self, tx: &Transaction<'_>) -> Result<Timestamp, TxError> {
        match &self.clock {
            Some(clock) => Ok(clock.now()),
            None => rows::db_now(tx).await,
        }
    }

    /// Registers a plan, or answers the READY plan that has its content.
    pub(super) async fn register_plan_once(&self, spec: PlanSpec, known: &[&str]) -> Result<Plan, TxError> {
        let mut client = self.connect().await?;
        let tx = begin(&mut client).await?;
        let result: Result<_, TxError> = async {
            let now = self.now_in(&tx).await?;
            let plan = spec
                .into_plan(known, PlanId::new(self.entropy.id(IdKind::Plan)), now)
                .map_err(LedgerError::from)?;
            rows::lock_fingerprint(&tx, &plan.fingerprint).await?;
            if let Some(existing) = rows::lock_ready_plan_by_fingerprint(&tx, &plan.fingerprint).await? {
                return Ok(existing);
            }
            rows::insert_plan(&tx, &plan).await?;
            Ok(plan)
        }
        .await;
        end(tx, result, true).await
    }

    /// A plan by id.
    pub(super) async fn plan_once(&self, id: &PlanId) -> Result<Plan, TxError> {
        let client = self.connect().await?;
        rows::read_plan(&client, id, false)
            .await?
            .ok_or_else(|| not_found("plan", id).into())
    }

    /// Every plan, oldest first.
    pub(super) async fn list_plans_once(&self) -> Result<Vec<Plan>, TxError> {
        let client = self.connect().await?;
        rows::read_plans(&client).await
    }

    /// The plans named `name`, oldest first.
    pub(super) async fn plans_named_once(&self, name: &str) -> Result<Vec<Plan>, TxError> {
        let client = self.connect().await?;
        rows::read_plans_named(&client, name).await
    }

    /// Up to `limit` plans, newest first, registered before `before`.
    pub(super) async fn plans_newest_first_once(
        &self,
        before: Option<&PlanId>,
        limit: u32,
    ) -> Result<Vec<Plan>, TxError> {
        let client = self.connect().await?;
        rows::read_plans_newest_first(&client, before, limit).await
    }

    /// Marks a plan RETIRED.
    pub(super) async fn retire_plan_once(&self, id: &PlanId) -> Result<Plan, TxError> {
        let mut client = self.connect().await?;
        let tx = begin(&mut client).await?;
        let result: Result<_, TxError> = async {
            if !rows::set_plan_status(&tx, id, PlanStatus::Retired).await? {
                return Err(not_found("plan", id).into());
            }
            rows::read_plan(&tx, id, false)
                .await?
                .ok_or_else(|| not_found("plan", id).into())
        }
        .await;
        end(tx, result, true).await
    }

    /// Enqueues an attempt. The plan row is locked first, so enqueues of one plan are
    /// serialized, and the history read after the lock (READ COMMITTED: a fresh
    /// snapshot per statement) sees every earlier attempt. The enqueue notifies idle
    /// workers in the same transaction ([`super::notify`]).
    pub(super) async fn enqueue_once(&self, plan: &PlanId, action: Action) -> Result<AttemptRecord, TxError> {
        let mut client = self.connect().await?;
        let tx = begin(&mut client).await?;
        let result: Result<_, TxError> = async {
            let plan = rows::read_plan(&tx, plan, true)
                .await?
                .ok_or_else(|| not_found("plan", plan))?;
            let now = self.now_in(&tx).await?;
            let history = rows::read_history(&tx, &plan.id).await?;
            let ids = NewIds {
                attempt: AttemptId::new(self.entropy.id(IdKind::Attempt)),
                command: CommandId::new(self.entropy.id(IdKind::Command)),
            };
            let record = transition::enqueue(&plan, &history, action, ids, now)?;
            let writes = Writes::new_attempt(&record);
            rows::apply_writes(&tx, None, &writes).await?;
            super::notify::send(&tx).await?;
            Ok(record)
        }
        .await;
        end(tx, result, true).await
    }

    /// Claims up to `batch` commands in one transaction: lock the oldest claimable
    /// commands that no other transaction holds, with their attempts
    /// ([`rows::lock_claimable`]), re-check each at the decision's now, lock their
    /// receipts, read their plans, let the engine decide, and write each claim under
    /// its `Claimable(now)` guard. A candidate that is no longer claimable once locked
    /// is a lost race (counted, never a claim). The rows are locked, so a guard cannot
    /// fail; if one ever does, the whole transaction is undone and tried again.
    pub(super) async fn claim_once(&self, request: &ClaimRequest) -> Result<Vec<Claimed>, TxError> {
        let mut client = self.connect().await?;
        let tx = begin(&mut client).await?;
        let result = self.claim_in(&tx, request).await;
        match result {
            // Nothing was written: release the locks without a commit.
            Ok(claimed) if claimed.is_empty() => {
                let _ = tx.rollback().await;
                Ok(claimed)
            }
            other => {
                let claimed = end(tx, other, true).await?;
                self.stats.claims.fetch_add(claimed.len() as u64, Ordering::Relaxed);
                Ok(claimed)
            }
        }
    }

    /// The claim of [`Self::claim_once`] inside the transaction `tx`.
    async fn claim_in(&self, tx: &Transaction<'_>, request: &ClaimRequest) -> Result<Vec<Claimed>, TxError> {
        let batch = request.batch;
        let window = batch
            .saturating_mul(CLAIM_SPREAD)
            .clamp(CLAIM_WINDOW_MIN, CLAIM_WINDOW_MAX)
            .max(batch);
        let at = self.clock.as_ref().map(|c| c.now());
        let (picked, now) = rows::lock_claimable(tx, at, window, batch).await?;
        let mut heads = Vec::with_capacity(picked.len());
        for p in picked {
            if is_claimable(&p.command, now) {
                heads.push((p.attempt, p.command));
            } else {
                self.stats.lost_claim_races.fetch_add(1, Ordering::Relaxed);
            }
        }
        if heads.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&AttemptId> = heads.iter().map(|(a, _)| &a.id).collect();
        let receipts = rows::lock_receipts_of(tx, &ids).await?;
        let mut plan_ids: Vec<&PlanId> = heads.iter().map(|(a, _)| &a.plan_id).collect();
        plan_ids.sort();
        plan_ids.dedup();
        let plans = rows::read_plans_by_id(tx, &plan_ids).await?;
        let mut claimed = Vec::with_capacity(heads.len());
        for (record, plan) in decode::claimed_records(heads, receipts, &plans)? {
            let token = self.entropy.token();
            let Ok((writes, _)) = decide(None, &record, Request::Claim(request, &token, plan.recovery), now) else {
                // A terminal attempt whose command is claimable: passed over.
                self.stats.lost_claim_races.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            match rows::apply_writes(tx, Some(&record), &writes).await {
                Ok(()) => {}
                Err(TxError::Ledger(LedgerError::Refused(refusal))) => {
                    return Err(TxError::Retry(format!(
                        "postgres: a guarded claim update matched no row it held ({refusal})"
                    )));
                }
                Err(e) => return Err(e),
            }
            claimed.push(Claimed::applied(record, plan, token, &writes));
        }
        Ok(claimed)
    }

    /// One try of a request of the worker holding `lease`: lock the attempt, its
    /// command and its receipts (the lock order), let the engine decide at the
    /// ledger's now, and write under the engine's guard.
    pub(super) async fn worker_once(&self, lease: &Lease, request: &WorkerRequest) -> Result<Reply, TxError> {
        let mut client = self.connect().await?;
        let tx = begin(&mut client).await?;
        let result = self.worker_in(&tx, lease, request).await;
        end(tx, result, true).await
    }

    /// One try of a worker request and then a claim, in one transaction
    /// ([`crate::ledger::Ledger::worker_then_claim`]): the claim runs under a
    /// savepoint, so a claim that fails is undone alone and the request stands.
    pub(super) async fn worker_then_claim_once(
        &self,
        lease: &Lease,
        request: &WorkerRequest,
        claim: &ClaimRequest,
    ) -> Result<(Reply, Vec<Claimed>), TxError> {
        let mut client = self.connect().await?;
        let mut tx = begin(&mut client).await?;
        let reply = match self.worker_in(&tx, lease, request).await {
            Ok(reply) => reply,
            Err(e) => return end(tx, Err(e), true).await,
        };
        // A savepoint that cannot be released or rolled back fails the whole
        // transaction: committing past a failed statement would lose the request.
        let claimed = match tx.transaction().await {
            Ok(savepoint) => match self.claim_in(&savepoint, claim).await {
                Ok(claimed) => savepoint.commit().await.map(|()| claimed).map_err(statement),
                Err(_) => savepoint.rollback().await.map(|()| Vec::new()).map_err(statement),
            },
            Err(e) => Err(statement(e)),
        };
        let claimed = end(tx, claimed, true).await?;
        self.stats.claims.fetch_add(claimed.len() as u64, Ordering::Relaxed);
        Ok((reply, claimed))
    }

    /// The request of [`Self::worker_once`] inside the transaction `tx`: lock the
    /// record, decide, write.
    async fn worker_in(&self, tx: &Transaction<'_>, lease: &Lease, request: &WorkerRequest) -> Result<Reply, TxError> {
        let (record, db_now) = rows::lock_record(tx, &lease.attempt_id, self.clock.is_none())
            .await?
            .ok_or_else(|| not_found("attempt", &lease.attempt_id))?;
        if record.command.id != lease.command_id {
            return Err(not_found("command", &lease.command_id).into());
        }
        let request = Request::Worker(request, &lease.token);
        let (writes, reply) = decide(None, &record, request, self.decide_at(db_now)?)?;
        rows::apply_writes(tx, Some(&record), &writes).await?;
        Ok(reply)
    }

    /// One try of an operator request (reconcile, abort): the same reads in lock
    /// order, with the plan for its recovery mode; answers the reply and the record
    /// as written. A request that makes work claimable again (a reconcile's requeue)
    /// notifies idle workers.
    pub(super) async fn operator_once(
        &self,
        attempt: &AttemptId,
        request: &OperatorRequest,
    ) -> Result<(Reply, AttemptRecord), TxError> {
        let mut client = self.connect().await?;
        let tx = begin(&mut client).await?;
        let result: Result<_, TxError> = async {
            let (mut record, db_now) = rows::lock_record(&tx, attempt, self.clock.is_none())
                .await?
                .ok_or_else(|| not_found("attempt", attempt))?;
            let plan = rows::read_plan(&tx, &record.attempt.plan_id, false)
                .await?
                .ok_or_else(|| not_found("plan", &record.attempt.plan_id))?;
            let request = Request::Operator(request, plan.recovery);
            let (writes, reply) = decide(None, &record, request, self.decide_at(db_now)?)?;
            let requeued = writes
                .command
                .as_ref()
                .is_some_and(|c| c.status == leasehold_engine::CommandStatus::Pending)
                && record.command.status != leasehold_engine::CommandStatus::Pending;
            rows::apply_writes(&tx, Some(&record), &writes).await?;
            if requeued {
                super::notify::send(&tx).await?;
            }
            writes.apply_to(&mut record);
            Ok((reply, record))
        }
        .await;
        end(tx, result, true).await
    }

    /// An attempt with its command and receipts, from one snapshot.
    pub(super) async fn attempt_once(&self, attempt: &AttemptId) -> Result<AttemptRecord, TxError> {
        let mut client = self.connect().await?;
        let tx = begin_read(&mut client).await?;
        let result: Result<_, TxError> = async {
            rows::read_record(&tx, attempt)
                .await?
                .ok_or_else(|| not_found("attempt", attempt).into())
        }
        .await;
        end(tx, result, false).await
    }

    /// Every attempt of a plan, by number, from one snapshot.
    pub(super) async fn history_once(&self, plan: &PlanId) -> Result<Vec<AttemptRecord>, TxError> {
        let mut client = self.connect().await?;
        let tx = begin_read(&mut client).await?;
        let result: Result<_, TxError> = async {
            rows::read_plan(&tx, plan, false)
                .await?
                .ok_or_else(|| not_found("plan", plan))?;
            rows::read_history(&tx, plan).await
        }
        .await;
        end(tx, result, false).await
    }

    /// How many attempts are QUEUED or RUNNING.
    pub(super) async fn open_attempts_once(&self) -> Result<u64, TxError> {
        let client = self.connect().await?;
        rows::count_open_attempts(&client).await
    }
}
