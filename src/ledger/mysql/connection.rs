//! Connections, transactions and retries, and every transition of the MySQL ledger.
//!
//! Each `*_once` method is one try: it takes a pooled connection, runs one
//! transaction and ends it (commit on success, rollback on any error, so row locks
//! are released at once). [`MysqlLedger::retry`] runs a try again after a
//! [`TxError::Retry`] with bounded, jittered exponential backoff (the jitter drawn
//! from the ledger's entropy), and turns the last error into a [`LedgerError`].

use super::error::{classify, DbResult, Phase, TxError};
use super::rows::{self, not_found, Candidate};
use super::{schema, MysqlLedger};
use crate::entropy::IdKind;
use crate::ledger::{Claimed, LedgerError};
use leasehold_engine::transition::{self, is_claimable, NewIds};
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, CommandId, Guard, Lease, Plan, PlanId, PlanSpec, PlanStatus, Refusal, Timestamp,
    Writes,
};
use mysql_async::{Conn, Transaction, TxOpts};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The first backoff after a conflict; it doubles per try up to [`BACKOFF_MAX_MS`].
const BACKOFF_BASE_MS: u64 = 2;
/// The longest backoff between two tries of one transaction.
const BACKOFF_MAX_MS: u64 = 250;

/// Where a test asks the ledger to have its own connection killed (tests only).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KillPoint {
    /// In a worker transition, after its locking reads.
    AfterReads,
    /// In a worker transition, just before `COMMIT`.
    BeforeCommit,
}

impl MysqlLedger {
    /// A pooled connection, within the configured connect timeout.
    pub(super) async fn connect(&self) -> Result<Conn, TxError> {
        let timeout = self.shared.url.options.connect_timeout();
        match tokio::time::timeout(timeout, self.shared.pool.get_conn()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(match classify(&e, Phase::Connect) {
                // Name the server (the URL prints without its password).
                TxError::Ledger(LedgerError::Unavailable(m)) => {
                    LedgerError::Unavailable(format!("cannot connect to {}: {m}", self.shared.url)).into()
                }
                other => other,
            }),
            Err(_) => Err(LedgerError::Unavailable(format!(
                "mysql: no connection to {} within {} ms (pool_max {})",
                self.shared.url,
                timeout.as_millis(),
                self.shared.url.options.pool_max
            ))
            .into()),
        }
    }

    /// The ledger clock's now: the injected clock, or else the database's.
    async fn now(&self, conn: &mut Conn) -> Result<Timestamp, TxError> {
        match &self.shared.clock {
            Some(clock) => Ok(clock.now()),
            None => rows::db_now(conn).await,
        }
    }

    /// `now` as read by a locking read ([`rows::lock_head`]), unless a clock is injected.
    fn decide_at(&self, db_now: Timestamp) -> Timestamp {
        self.shared.clock.as_ref().map_or(db_now, |c| c.now())
    }

    /// Runs `op` until it answers something other than [`TxError::Retry`], at most
    /// `retry_max` times, sleeping a jittered, growing backoff in between.
    pub(super) async fn retry<T, F, Fut>(&self, mut op: F) -> Result<T, LedgerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TxError>>,
    {
        let tries = self.shared.url.options.retry_max.max(1);
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
                    self.shared.stats.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(self.backoff(tried)).await;
                }
            }
        }
    }

    /// Jittered backoff: uniform in [cap/2, cap], where cap doubles with every try
    /// (from [`BACKOFF_BASE_MS`] up to [`BACKOFF_MAX_MS`]).
    fn backoff(&self, tried: u32) -> Duration {
        let cap = BACKOFF_BASE_MS
            .saturating_mul(1u64 << tried.min(16))
            .min(BACKOFF_MAX_MS);
        let half = cap / 2;
        Duration::from_millis(half + self.shared.entropy.next_u64() % (cap - half + 1))
    }

    /// Kills this connection from another one if a test asked for it at `point`.
    #[cfg(test)]
    async fn test_kill(&self, point: KillPoint, conn_id: u32) -> Result<(), TxError> {
        use mysql_async::prelude::Queryable;
        let armed = {
            let mut kill = self.shared.hooks.kill.lock().unwrap_or_else(|e| e.into_inner());
            if *kill == Some(point) {
                *kill = None;
                true
            } else {
                false
            }
        };
        if armed {
            let mut other = self.connect().await?;
            other.query_drop(format!("KILL CONNECTION {conn_id}")).await.db()?;
        }
        Ok(())
    }

    /// Sleeps while holding the transaction, if a test asked for it (a frozen worker).
    #[cfg(test)]
    async fn test_stall(&self) {
        let stall = self.shared.hooks.stall.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(stall) = stall {
            tokio::time::sleep(stall).await;
        }
    }

    /// Pauses a claim between listing its candidates and locking them, if a test
    /// asked for it: signals the test, then waits for its go-ahead.
    #[cfg(test)]
    pub(super) async fn test_pause_after_listing(&self) {
        let pause = self.shared.hooks.pause.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((reached, resume)) = pause {
            let _ = reached.send(());
            let _ = resume.await;
        }
    }
}

/// What tests can make the ledger do at chosen points (tests only).
#[cfg(test)]
#[derive(Debug, Default)]
pub(super) struct Hooks {
    /// Kill the next worker transition's connection at this point.
    pub(super) kill: std::sync::Mutex<Option<KillPoint>>,
    /// Stall the next worker transition this long after its locking reads.
    pub(super) stall: std::sync::Mutex<Option<Duration>>,
    /// Pause the next claim after listing: (signal reached, wait for this).
    #[allow(clippy::type_complexity)]
    pub(super) pause: std::sync::Mutex<Option<(tokio::sync::oneshot::Sender<()>, tokio::sync::oneshot::Receiver<()>)>>,
}

/// Begins a write transaction (the session's REPEATABLE READ).
async fn begin(conn: &mut Conn) -> Result<Transaction<'_>, TxError> {
    conn.start_transaction(TxOpts::default()).await.db()
}

/// Begins a read: one consistent snapshot for all its statements.
async fn begin_read(conn: &mut Conn) -> Result<Transaction<'_>, TxError> {
    let mut opts = TxOpts::default();
    opts.with_consistent_snapshot(true);
    conn.start_transaction(opts).await.db()
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
            // A failed rollback means a broken connection: the server rolls back.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// What one claim transaction did.
#[derive(Debug, Default)]
pub(super) struct ClaimBatch {
    /// The commands claimed (committed).
    pub(super) claimed: Vec<Claimed>,
    /// Candidates no longer claimable once locked: races lost to another claimer.
    pub(super) lost: u64,
}

impl MysqlLedger {
    /// Applies pending migrations under the migration lock.
    pub(super) async fn migrate_once(&self) -> Result<Vec<u32>, TxError> {
        let mut conn = self.connect().await?;
        let now = self.shared.clock.as_ref().map(|c| c.now());
        schema::run(&mut conn, now).await
    }

    /// Registers a plan, or answers the READY plan that has its content.
    pub(super) async fn register_plan_once(&self, spec: PlanSpec, known: &[&str]) -> Result<Plan, TxError> {
        let mut conn = self.connect().await?;
        let now = self.now(&mut conn).await?;
        let plan = spec
            .into_plan(known, PlanId::new(self.shared.entropy.id(IdKind::Plan)), now)
            .map_err(LedgerError::from)?;
        let mut tx = begin(&mut conn).await?;
        let result: Result<_, TxError> = async {
            if let Some(existing) = rows::lock_ready_plan_by_fingerprint(&mut tx, &plan.fingerprint).await? {
                return Ok(existing);
            }
            rows::insert_plan(&mut tx, &plan).await?;
            Ok(plan)
        }
        .await;
        end(tx, result, true).await
    }

    /// A plan by id.
    pub(super) async fn plan_once(&self, id: &PlanId) -> Result<Plan, TxError> {
        let mut conn = self.connect().await?;
        rows::read_plan(&mut conn, id, false)
            .await?
            .ok_or_else(|| not_found("plan", id).into())
    }

    /// Every plan, oldest first.
    pub(super) async fn list_plans_once(&self) -> Result<Vec<Plan>, TxError> {
        let mut conn = self.connect().await?;
        rows::read_plans(&mut conn).await
    }

    /// Marks a plan RETIRED.
    pub(super) async fn retire_plan_once(&self, id: &PlanId) -> Result<Plan, TxError> {
        let mut conn = self.connect().await?;
        let mut tx = begin(&mut conn).await?;
        let result: Result<_, TxError> = async {
            if !rows::set_plan_status(&mut tx, id, PlanStatus::Retired).await? {
                return Err(not_found("plan", id).into());
            }
            rows::read_plan(&mut tx, id, false)
                .await?
                .ok_or_else(|| not_found("plan", id).into())
        }
        .await;
        end(tx, result, true).await
    }

    /// Enqueues an attempt. The plan row is locked first, so enqueues of one plan
    /// are serialized and the action guard sees every earlier attempt.
    pub(super) async fn enqueue_once(&self, plan: &PlanId, action: Action) -> Result<AttemptRecord, TxError> {
        let mut conn = self.connect().await?;
        let mut tx = begin(&mut conn).await?;
        let result: Result<_, TxError> = async {
            let plan = rows::read_plan(&mut tx, plan, true)
                .await?
                .ok_or_else(|| not_found("plan", plan))?;
            let now = match &self.shared.clock {
                Some(clock) => clock.now(),
                None => rows::db_now(&mut tx).await?,
            };
            let history = rows::read_history(&mut tx, &plan.id).await?;
            let ids = NewIds {
                attempt: AttemptId::new(self.shared.entropy.id(IdKind::Attempt)),
                command: CommandId::new(self.shared.entropy.id(IdKind::Command)),
            };
            let record = transition::enqueue(&plan, &history, action, ids, now)?;
            let writes = Writes {
                guard: Guard::Absent,
                attempt: Some(record.attempt.clone()),
                command: Some(record.command.clone()),
                receipts: record.receipts.clone(),
            };
            rows::apply_writes(&mut tx, &writes).await?;
            Ok(record)
        }
        .await;
        end(tx, result, true).await
    }

    /// Lists up to `limit` claimable commands, oldest first (a plain read that locks
    /// nothing).
    pub(super) async fn claim_candidates_once(&self, limit: u32) -> Result<Vec<Candidate>, TxError> {
        let mut conn = self.connect().await?;
        let now = self.now(&mut conn).await?;
        rows::claim_candidates(&mut conn, now, limit).await
    }

    /// Claims up to `want` of `candidates` in one transaction, in their order (the
    /// claimers' common order, so that two claimers never wait on each other in a
    /// cycle): for each, lock its attempt and command, check it is still claimable at
    /// the database's now, lock its receipts, let the engine decide, and write under
    /// the engine's `Claimable(now)` guard. One commit for the whole batch.
    pub(super) async fn claim_batch_once(
        &self,
        candidates: &[Candidate],
        owner: &str,
        want: usize,
        lease_ms: u64,
        begin_next: bool,
    ) -> Result<ClaimBatch, TxError> {
        let mut conn = self.connect().await?;
        // Plans are immutable but for their status, which a claim does not look at:
        // read them before the transaction, so that it holds its locks shorter. Every
        // race lost needs one more candidate; twice the batch is plenty.
        let candidates = &candidates[..candidates.len().min(want.saturating_mul(2))];
        let mut ids: Vec<&PlanId> = candidates.iter().map(|c| &c.plan).collect();
        ids.sort();
        ids.dedup();
        let plans: BTreeMap<PlanId, Plan> = rows::read_plans_by_id(&mut conn, &ids).await?;
        let mut tx = begin(&mut conn).await?;
        let result: Result<_, TxError> = async {
            let mut batch = ClaimBatch::default();
            for candidate in candidates {
                if batch.claimed.len() >= want {
                    break;
                }
                let Some(plan) = plans.get(&candidate.plan) else {
                    continue;
                };
                let Some((attempt, command, db_now)) = rows::lock_head(&mut tx, &candidate.attempt).await? else {
                    batch.lost += 1;
                    continue;
                };
                let now = self.decide_at(db_now);
                if command.id != candidate.command || !is_claimable(&command, now) {
                    batch.lost += 1;
                    continue;
                }
                let receipts = rows::read_receipts(&mut tx, &attempt.id, true).await?;
                let mut record = AttemptRecord {
                    attempt,
                    command,
                    receipts,
                };
                let token = self.shared.entropy.token();
                let decided = if begin_next {
                    transition::claim_and_begin(&record, plan.recovery, owner, token.clone(), lease_ms, now)
                } else {
                    transition::claim(&record, plan.recovery, owner, token.clone(), lease_ms, now)
                };
                let Ok(writes) = decided else {
                    batch.lost += 1;
                    continue;
                };
                match rows::apply_writes(&mut tx, &writes).await {
                    Ok(()) => {}
                    // The row is locked, so the guard cannot fail; if it ever does, the
                    // attempt row may already be written: undo the whole batch.
                    Err(TxError::Ledger(LedgerError::Refused(_))) => {
                        self.shared.stats.refused_claim_updates.fetch_add(1, Ordering::Relaxed);
                        return Err(TxError::Retry(format!(
                            "mysql: the guarded claim of command {} matched no row",
                            candidate.command
                        )));
                    }
                    Err(e) => return Err(e),
                }
                writes.apply_to(&mut record);
                batch.claimed.push(Claimed {
                    lease: Lease {
                        command_id: candidate.command.clone(),
                        attempt_id: candidate.attempt.clone(),
                        token,
                    },
                    plan: plan.clone(),
                    record,
                });
            }
            Ok(batch)
        }
        .await;
        match result {
            // Nothing was written: release the locks without a commit.
            Ok(batch) if batch.claimed.is_empty() => {
                let _ = tx.rollback().await;
                Ok(batch)
            }
            other => end(tx, other, true).await,
        }
    }

    /// One worker transition: lock the attempt, its command and its receipts (the
    /// lock order), let the engine decide at the ledger's now, and write under the
    /// engine's guard; answers what `decide` answered beside the writes, and the
    /// record as written.
    pub(super) async fn worker_once<X, F>(&self, lease: &Lease, decide: &F) -> Result<(X, AttemptRecord), TxError>
    where
        F: Fn(&AttemptRecord, Timestamp) -> Result<(X, Writes), Refusal> + Sync,
        X: Send,
    {
        let mut conn = self.connect().await?;
        let mut tx = begin(&mut conn).await?;
        let result: Result<_, TxError> = async {
            let (attempt, command, db_now) = rows::lock_head(&mut tx, &lease.attempt_id)
                .await?
                .ok_or_else(|| not_found("attempt", &lease.attempt_id))?;
            if command.id != lease.command_id {
                return Err(not_found("command", &lease.command_id).into());
            }
            let receipts = rows::read_receipts(&mut tx, &attempt.id, true).await?;
            #[cfg(test)]
            self.test_kill(KillPoint::AfterReads, tx.id()).await?;
            #[cfg(test)]
            self.test_stall().await;
            let mut record = AttemptRecord {
                attempt,
                command,
                receipts,
            };
            let (answer, writes) = decide(&record, self.decide_at(db_now))?;
            rows::apply_writes(&mut tx, &writes).await?;
            writes.apply_to(&mut record);
            #[cfg(test)]
            self.test_kill(KillPoint::BeforeCommit, tx.id()).await?;
            Ok((answer, record))
        }
        .await;
        end(tx, result, true).await
    }

    /// One operator transition (reconcile, abort): the same reads in lock order, with
    /// the plan for its recovery mode.
    pub(super) async fn operator_once<X, F>(
        &self,
        attempt: &AttemptId,
        decide: &F,
    ) -> Result<(X, AttemptRecord), TxError>
    where
        F: Fn(&AttemptRecord, &Plan, Timestamp) -> Result<(X, Writes), Refusal> + Sync,
        X: Send,
    {
        let mut conn = self.connect().await?;
        let mut tx = begin(&mut conn).await?;
        let result: Result<_, TxError> = async {
            let (a, command, db_now) = rows::lock_head(&mut tx, attempt)
                .await?
                .ok_or_else(|| not_found("attempt", attempt))?;
            let receipts = rows::read_receipts(&mut tx, &a.id, true).await?;
            let plan = rows::read_plan(&mut tx, &a.plan_id, false)
                .await?
                .ok_or_else(|| not_found("plan", &a.plan_id))?;
            let mut record = AttemptRecord {
                attempt: a,
                command,
                receipts,
            };
            let (answer, writes) = decide(&record, &plan, self.decide_at(db_now))?;
            rows::apply_writes(&mut tx, &writes).await?;
            writes.apply_to(&mut record);
            Ok((answer, record))
        }
        .await;
        end(tx, result, true).await
    }

    /// An attempt with its command and receipts, from one snapshot.
    pub(super) async fn attempt_once(&self, attempt: &AttemptId) -> Result<AttemptRecord, TxError> {
        let mut conn = self.connect().await?;
        let mut tx = begin_read(&mut conn).await?;
        let result: Result<_, TxError> = async {
            rows::read_record(&mut tx, attempt)
                .await?
                .ok_or_else(|| not_found("attempt", attempt).into())
        }
        .await;
        end(tx, result, false).await
    }

    /// Every attempt of a plan, by number, from one snapshot.
    pub(super) async fn history_once(&self, plan: &PlanId) -> Result<Vec<AttemptRecord>, TxError> {
        let mut conn = self.connect().await?;
        let mut tx = begin_read(&mut conn).await?;
        let result: Result<_, TxError> = async {
            rows::read_plan(&mut tx, plan, false)
                .await?
                .ok_or_else(|| not_found("plan", plan))?;
            rows::read_history(&mut tx, plan).await
        }
        .await;
        end(tx, result, false).await
    }

    /// How many attempts are QUEUED or RUNNING.
    pub(super) async fn open_attempts_once(&self) -> Result<u64, TxError> {
        let mut conn = self.connect().await?;
        rows::count_open_attempts(&mut conn).await
    }
}
