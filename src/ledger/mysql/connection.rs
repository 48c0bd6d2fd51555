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
use crate::ledger::sql::decode;
use crate::ledger::{decide, Claimed, LedgerError};
use leasehold_engine::transition::{self, is_claimable, NewIds};
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, ClaimRequest, CommandId, Lease, OperatorRequest, Plan, PlanId, PlanSpec,
    PlanStatus, Reply, Request, Timestamp, WorkerRequest, Writes,
};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, IsolationLevel, Transaction, TxOpts};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The first backoff after a conflict; it doubles per try up to [`BACKOFF_MAX_MS`].
const BACKOFF_BASE_MS: u64 = 2;
/// The longest backoff between two tries of one transaction.
const BACKOFF_MAX_MS: u64 = 250;
/// The most candidates a claim looks at in one window (unless its batch is larger).
pub(super) const CLAIM_WINDOW_MAX: u32 = 1_000;
/// Server errors that mean "no `SKIP LOCKED` here": a parse error (1064, and 1149 of
/// old servers) or a feature not supported yet (1235).
const SKIP_LOCKED_UNSUPPORTED: &[u16] = &[1064, 1149, 1235];

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

    /// `now` as read by a locking read ([`rows::lock_record`], [`rows::lock_head`]), unless a
    /// clock is injected.
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
        pause_at(&self.shared.hooks.pause).await;
    }

    /// Whether a test asked the next claim to pause before it locks anything.
    #[cfg(test)]
    fn test_pause_armed(&self) -> bool {
        self.shared
            .hooks
            .pause
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Pauses a `SKIP LOCKED` claim while it holds its rows, if a test asked for it.
    #[cfg(test)]
    async fn test_pause_holding(&self) {
        pause_at(&self.shared.hooks.pause_holding).await;
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
    /// Pause the next claim once it has fixed what it sees and before it locks
    /// anything: (signal reached, wait for this).
    pub(super) pause: std::sync::Mutex<Option<Pause>>,
    /// Pause the next `SKIP LOCKED` claim while it holds the rows it locked.
    pub(super) pause_holding: std::sync::Mutex<Option<Pause>>,
}

/// A test's pause point: a sender that says the claim got there, and a receiver that
/// lets it go on (tests only).
#[cfg(test)]
pub(super) type Pause = (tokio::sync::oneshot::Sender<()>, tokio::sync::oneshot::Receiver<()>);

/// Signals the test and waits for its go-ahead, if it armed `slot`.
#[cfg(test)]
async fn pause_at(slot: &std::sync::Mutex<Option<Pause>>) {
    let pause = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some((reached, resume)) = pause {
        let _ = reached.send(());
        let _ = resume.await;
    }
}

/// Begins a write transaction (the session's REPEATABLE READ).
async fn begin(conn: &mut Conn) -> Result<Transaction<'_>, TxError> {
    conn.start_transaction(TxOpts::default()).await.db()
}

/// What the server's answer to the `SKIP LOCKED` probe says: it ran (yes), it did not
/// parse or is not supported (no), or some other error (that error, classified).
pub(super) fn skip_locked_answer(probed: Result<(), mysql_async::Error>) -> Result<bool, TxError> {
    match probed {
        Ok(()) => Ok(true),
        Err(mysql_async::Error::Server(e)) if SKIP_LOCKED_UNSUPPORTED.contains(&e.code) => Ok(false),
        Err(e) => Err(classify(&e, Phase::Statement)),
    }
}

/// Begins a `SKIP LOCKED` claim, at READ UNCOMMITTED: the claim window is then read
/// as the rows are now, other claimers' uncommitted claims included, instead of from a
/// snapshot that lags the locks (a lagging snapshot lists commands that others have
/// claimed since, each a lost race). Nothing is decided on what that read saw: every
/// decision is made on the rows as locked, and locking reads always see the latest
/// committed version, at any isolation level. `stale_snapshot` (tests only) instead
/// fixes a REPEATABLE READ snapshot at once, to stage the race that the window read
/// can still lose.
async fn begin_claim(conn: &mut Conn, stale_snapshot: bool) -> Result<Transaction<'_>, TxError> {
    let mut opts = TxOpts::default();
    if stale_snapshot {
        opts.with_consistent_snapshot(true);
    } else {
        opts.with_isolation_level(IsolationLevel::ReadUncommitted);
    }
    conn.start_transaction(opts).await.db()
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

    /// The plans named `name`, oldest first.
    pub(super) async fn plans_named_once(&self, name: &str) -> Result<Vec<Plan>, TxError> {
        let mut conn = self.connect().await?;
        rows::read_plans_named(&mut conn, name).await
    }

    /// Up to `limit` plans, newest first, registered before `before`.
    pub(super) async fn plans_newest_first_once(
        &self,
        before: Option<&PlanId>,
        limit: u32,
    ) -> Result<Vec<Plan>, TxError> {
        let mut conn = self.connect().await?;
        rows::read_plans_newest_first(&mut conn, before, limit).await
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
            let writes = Writes::new_attempt(&record);
            rows::apply_writes(&mut tx, None, &writes).await?;
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
        request: &ClaimRequest,
        want: usize,
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
            let mut held = Vec::new();
            let mut lost = 0u64;
            let mut latest: Option<Timestamp> = None;
            for candidate in candidates {
                if held.len() >= want {
                    break;
                }
                let Some(plan) = plans.get(&candidate.plan) else {
                    continue;
                };
                let Some((attempt, command, db_now)) = rows::lock_head(&mut tx, &candidate.attempt).await? else {
                    lost += 1;
                    continue;
                };
                let now = self.decide_at(db_now);
                if command.id != candidate.command || !is_claimable(&command, now) {
                    lost += 1;
                    continue;
                }
                latest = Some(latest.map_or(now, |l| l.max(now)));
                let receipts = rows::read_receipts(&mut tx, &attempt.id, true).await?;
                let record = AttemptRecord {
                    attempt,
                    command,
                    receipts,
                };
                held.push((record, plan.clone()));
            }
            // Decide every claim at the latest now, read once its rows were locked: a
            // command claimable at an earlier now still is, and one guard lets the
            // writes go out as one statement per table.
            let Some(now) = latest else {
                return Ok(ClaimBatch {
                    claimed: Vec::new(),
                    lost,
                });
            };
            let mut batch = self.write_claims(&mut tx, held, request, now).await?;
            batch.lost += lost;
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

    /// Lets the engine decide the claim of every held record at `now` and writes the
    /// claims with one `UPDATE` per table under their shared `Claimable(now)` guard;
    /// answers the claims as written. A record the engine refuses (a terminal attempt
    /// whose command is claimable) is passed over and counted as lost. The rows are
    /// locked, so the guard cannot fail; if it ever does, the whole transaction is
    /// undone and tried again ([`TxError::Retry`]).
    async fn write_claims(
        &self,
        tx: &mut Transaction<'_>,
        held: Vec<(AttemptRecord, Plan)>,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> Result<ClaimBatch, TxError> {
        let mut lost = 0u64;
        let mut decided = Vec::with_capacity(held.len());
        for (record, plan) in held {
            let token = self.shared.entropy.token();
            match decide(None, &record, Request::Claim(request, &token, plan.recovery), now) {
                Ok((writes, _)) => decided.push((record, plan, token, writes)),
                Err(_) => lost += 1,
            }
        }
        let all: Vec<(&AttemptRecord, &Writes)> = decided.iter().map(|(r, _, _, w)| (r, w)).collect();
        match rows::apply_writes_batch(tx, &all).await {
            Ok(()) => {}
            Err(TxError::Ledger(LedgerError::Refused(refusal))) => {
                self.shared.stats.refused_claim_updates.fetch_add(1, Ordering::Relaxed);
                return Err(TxError::Retry(format!(
                    "mysql: a guarded claim update matched fewer rows than it held ({refusal})"
                )));
            }
            Err(e) => return Err(e),
        }
        let claimed = decided
            .into_iter()
            .map(|(record, plan, token, writes)| Claimed::applied(record, plan, token, &writes))
            .collect();
        Ok(ClaimBatch { claimed, lost })
    }

    /// Whether the server understands `SELECT … FOR UPDATE SKIP LOCKED`: asks it
    /// once, with a statement that reads nothing. A parse error (MySQL 5.7, MariaDB
    /// before 10.6) or "not supported" answers no; any other error is the error.
    pub(super) async fn probe_skip_locked_once(&self) -> Result<bool, TxError> {
        use mysql_async::prelude::Queryable;
        let mut conn = self.connect().await?;
        let probed = conn
            .query_drop("SELECT id FROM command WHERE 1 = 0 FOR UPDATE SKIP LOCKED")
            .await;
        skip_locked_answer(probed)
    }

    /// Claims up to `batch` commands in one transaction with `SKIP LOCKED`: lock the
    /// oldest claimable commands (each attempt, then its command) that no other
    /// transaction holds, re-check each at the decision's now, lock their receipts,
    /// read their plans, let the engine decide, and write every claim with one
    /// `UPDATE` per table under the shared `Claimable(now)` guard. One commit for the
    /// batch: eight round trips whatever the batch (isolation level, begin, lock,
    /// receipts, plans, command and attempt writes, commit), one more where the claims
    /// change receipts.
    ///
    /// The candidates come from a window of `batch × claim_spread` commands in claim
    /// order (oldest `available_at`, then id), read as the rows are now
    /// ([`begin_claim`]). Rows another claimer holds are skipped, so the claim order
    /// is "oldest first among the commands nobody else is claiming right now". When a
    /// window yields fewer than the batch and was full, the claim looks again through
    /// a window twice as wide (at most [`CLAIM_WINDOW_MAX`], then the next one), until
    /// a window is not full: the queue ends there. A row that another claimer wrote
    /// and committed between this claim's read of the window and its lock is locked,
    /// found no longer claimable and counted as a lost race; it never counts as a
    /// claim.
    ///
    /// This transaction never waits for a lock: `SKIP LOCKED` never waits, and every
    /// later statement touches only rows of attempts it already holds, which every
    /// other transaction locks only after their attempt (the lock order), so it cannot
    /// take part in a deadlock.
    pub(super) async fn claim_skip_locked_once(&self, request: &ClaimRequest) -> Result<ClaimBatch, TxError> {
        let mut conn = self.connect().await?;
        #[cfg(test)]
        let stale_snapshot = self.test_pause_armed();
        #[cfg(not(test))]
        let stale_snapshot = false;
        let mut tx = begin_claim(&mut conn, stale_snapshot).await?;
        let result = self.claim_skip_locked_in(&mut tx, request).await;
        match result {
            // Nothing was written: release the locks without a commit.
            Ok(batch) if batch.claimed.is_empty() => {
                let _ = tx.rollback().await;
                Ok(batch)
            }
            other => end(tx, other, true).await,
        }
    }

    /// The claim of [`Self::claim_skip_locked_once`] inside the transaction `tx`
    /// (begun by [`begin_claim`]).
    async fn claim_skip_locked_in(
        &self,
        tx: &mut Transaction<'_>,
        request: &ClaimRequest,
    ) -> Result<ClaimBatch, TxError> {
        let batch = request.batch;
        let spread = self.shared.url.options.claim_spread.max(1);
        let window_max = CLAIM_WINDOW_MAX.max(batch);
        let base_window = batch.saturating_mul(spread).clamp(batch, window_max);
        #[cfg(test)]
        self.test_pause_after_listing().await;
        // A clock given to the ledger decides; else the first statement's `now`
        // does, for every later statement too, so the batch shares one guard.
        let mut now = self.shared.clock.as_ref().map(|c| c.now());
        let mut after: Option<rows::ClaimKey> = None;
        let mut window = base_window;
        let mut heads = Vec::new();
        let mut lost = 0u64;
        loop {
            let want = batch - heads.len() as u32;
            let at = now.map_or(rows::NowSql::Db, rows::NowSql::At);
            let picked = rows::lock_claimable(tx, at, after.as_ref(), window, want).await?;
            let looked_through = picked.len() < want as usize;
            for p in picked {
                let decide_at = *now.get_or_insert(p.now);
                after = Some(p.key);
                if is_claimable(&p.command, decide_at) {
                    heads.push((p.attempt, p.command));
                } else {
                    lost += 1;
                }
            }
            if heads.len() >= batch as usize {
                break;
            }
            if looked_through {
                // Every command of the window was taken or held by others. Look
                // further only if there is more: a wider window from the same
                // place (or, at the widest, the next window), so that no command
                // nobody holds is passed over.
                let at = now.map_or(rows::NowSql::Db, rows::NowSql::At);
                match rows::claim_window_end(tx, at, after.as_ref(), window).await? {
                    None => break,
                    Some((end, db_now)) => {
                        now.get_or_insert(db_now);
                        if window >= window_max {
                            after = Some(end);
                        }
                        window = window.saturating_mul(2).min(window_max);
                    }
                }
            }
        }
        let Some(now) = now.filter(|_| !heads.is_empty()) else {
            return Ok(ClaimBatch {
                claimed: Vec::new(),
                lost,
            });
        };
        #[cfg(test)]
        self.test_pause_holding().await;
        let ids: Vec<&AttemptId> = heads.iter().map(|(a, _)| &a.id).collect();
        let receipts = rows::lock_receipts_of(tx, &ids).await?;
        // Plans are immutable but for their status, which a claim does not look
        // at: a plain read.
        let mut plan_ids: Vec<&PlanId> = heads.iter().map(|(a, _)| &a.plan_id).collect();
        plan_ids.sort();
        plan_ids.dedup();
        let plans = rows::read_plans_by_id(tx, &plan_ids).await?;
        let held = decode::claimed_records(heads, receipts, &plans)?;
        let mut batch = self.write_claims(tx, held, request, now).await?;
        batch.lost += lost;
        Ok(batch)
    }

    /// One try of a request of the worker holding `lease`: lock the attempt, its
    /// command and its receipts (the lock order), let the engine decide at the
    /// ledger's now, and write under the engine's guard.
    pub(super) async fn worker_once(&self, lease: &Lease, request: &WorkerRequest) -> Result<Reply, TxError> {
        let mut conn = self.connect().await?;
        let mut tx = begin(&mut conn).await?;
        let result = self.worker_in(&mut tx, lease, request).await;
        end(tx, result, true).await
    }

    /// One try of a worker request and then a `SKIP LOCKED` claim, in one
    /// transaction ([`crate::ledger::Ledger::worker_then_claim`]). The request's
    /// reads lock their rows, so the claim's isolation (READ UNCOMMITTED, see
    /// [`begin_claim`]) does not change what it decides. A claim that the engine or an
    /// integrity check refuses is undone alone (a savepoint) and the request stands;
    /// a claim that fails in the server fails the whole transaction (InnoDB rolls a
    /// deadlock's whole transaction back), to be tried again as one.
    pub(super) async fn worker_then_claim_once(
        &self,
        lease: &Lease,
        request: &WorkerRequest,
        claim: &ClaimRequest,
    ) -> Result<(Reply, ClaimBatch), TxError> {
        let mut conn = self.connect().await?;
        let mut tx = begin_claim(&mut conn, false).await?;
        let result: Result<_, TxError> = async {
            let reply = self.worker_in(&mut tx, lease, request).await?;
            tx.query_drop("SAVEPOINT leasehold_claim").await.db()?;
            let batch = match self.claim_skip_locked_in(&mut tx, claim).await {
                Ok(batch) => batch,
                Err(TxError::Ledger(_)) => {
                    tx.query_drop("ROLLBACK TO SAVEPOINT leasehold_claim").await.db()?;
                    ClaimBatch::default()
                }
                Err(e) => return Err(e),
            };
            Ok((reply, batch))
        }
        .await;
        end(tx, result, true).await
    }

    /// The request of [`Self::worker_once`] inside the transaction `tx`: lock the
    /// record, decide, write.
    async fn worker_in(
        &self,
        tx: &mut Transaction<'_>,
        lease: &Lease,
        request: &WorkerRequest,
    ) -> Result<Reply, TxError> {
        let (record, db_now) = self.lock_record(tx, &lease.attempt_id).await?;
        if record.command.id != lease.command_id {
            return Err(not_found("command", &lease.command_id).into());
        }
        #[cfg(test)]
        self.test_kill(KillPoint::AfterReads, tx.id()).await?;
        #[cfg(test)]
        self.test_stall().await;
        let request = Request::Worker(request, &lease.token);
        let (writes, reply) = decide(None, &record, request, self.decide_at(db_now))?;
        rows::apply_writes(tx, Some(&record), &writes).await?;
        #[cfg(test)]
        self.test_kill(KillPoint::BeforeCommit, tx.id()).await?;
        Ok(reply)
    }

    /// One try of an operator request: the same reads in lock order, with the plan
    /// for its recovery mode; answers the reply and the record as written.
    pub(super) async fn operator_once(
        &self,
        attempt: &AttemptId,
        request: &OperatorRequest,
    ) -> Result<(Reply, AttemptRecord), TxError> {
        let mut conn = self.connect().await?;
        let mut tx = begin(&mut conn).await?;
        let result: Result<_, TxError> = async {
            let (mut record, db_now) = self.lock_record(&mut tx, attempt).await?;
            let plan = rows::read_plan(&mut tx, &record.attempt.plan_id, false)
                .await?
                .ok_or_else(|| not_found("plan", &record.attempt.plan_id))?;
            let request = Request::Operator(request, plan.recovery);
            let (writes, reply) = decide(None, &record, request, self.decide_at(db_now))?;
            rows::apply_writes(&mut tx, Some(&record), &writes).await?;
            writes.apply_to(&mut record);
            Ok((reply, record))
        }
        .await;
        end(tx, result, true).await
    }

    /// Locks an attempt's rows in lock order (attempt, command, then receipts) and
    /// answers them with the database's now as the locking read saw it.
    async fn lock_record(
        &self,
        tx: &mut Transaction<'_>,
        attempt: &AttemptId,
    ) -> Result<(AttemptRecord, Timestamp), TxError> {
        Ok(rows::lock_record(tx, attempt)
            .await?
            .ok_or_else(|| not_found("attempt", attempt))?)
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
