//! The MySQL / MariaDB ledger: many workers on many machines, one durable outbox.
//!
//! Contract: every transition is one InnoDB transaction (REPEATABLE READ; a `SKIP
//! LOCKED` claim runs at READ UNCOMMITTED, see below, which changes only what its
//! non-locking reads of candidates and plans see) that reads its rows in lock order
//! with `SELECT … FOR UPDATE` (attempt, then command, then receipts by ordinal), lets
//! the engine ([`leasehold_engine::transition`]) decide at the ledger clock's `now`,
//! and writes the engine's row images; the command row's
//! `UPDATE` carries the engine's [`leasehold_engine::Guard`] as its `WHERE` clause, and
//! zero matched rows (connections set `CLIENT_FOUND_ROWS`, so an `UPDATE` that changes
//! nothing still counts its row) is a refusal
//! ([`leasehold_engine::Refusal::StaleToken`]) after which the transaction is rolled
//! back. Reads are consistent snapshots (`START TRANSACTION WITH CONSISTENT SNAPSHOT`).
//! The semantics are those of the reference [`super::memory::MemoryLedger`].
//!
//! Time: lease decisions use the database's clock in a UTC session, read inside the
//! transaction once its rows are locked (a worker or operator request locks its
//! record with one statement and reads `SYSDATE(6)` as each row is produced, keeping
//! the latest; a claim reads `NOW(6)` in a statement that never waits for a lock,
//! `SKIP LOCKED`, or, on the portable path, in the one after the attempt's lock) —
//! never a worker's clock, so workers on machines with skewed clocks agree. Tests may
//! inject a [`Clock`] instead ([`MysqlLedger::open_with_clock`]). Ids and lease tokens
//! come from the [`Entropy`] (the OS in production).
//!
//! Claims take one of two paths, chosen once per ledger: the first claim asks the
//! server whether it understands `SELECT … FOR UPDATE SKIP LOCKED` (MariaDB 10.6+,
//! MySQL 8.0.1+; a probe statement that reads nothing, [`MysqlLedger::uses_skip_locked`]
//! tells the answer), and the URL option `skip_locked=0` forces the portable path.
//! Either way a lease is held by at most one claimer: every claim locks the attempt
//! and then the command, re-checks at the decision's now that the command is still
//! claimable, and writes the engine's claim under its `Claimable(now)` guard; a
//! guarded `UPDATE` that matches fewer rows than it should undoes the whole batch. A
//! candidate found taken once locked is a lost race: counted ([`MysqlLedger::stats`]),
//! never a success. The claims of a batch are written with one `UPDATE` per table and
//! committed together.
//!
//! - `SKIP LOCKED`: one statement reads a window of `batch × claim_spread` claimable
//!   commands in claim order without locking them, then locks, oldest first, the
//!   attempt and then the command of each until it holds `batch` of them, skipping
//!   every one that another transaction holds — so concurrent claimers take disjoint
//!   commands and never wait on each other. The order is "oldest `available_at`, then
//!   id, among the commands nobody else is claiming at that moment". The window is
//!   read at READ UNCOMMITTED, as the rows are now (other claimers' uncommitted claims
//!   included), so that it rarely lists a command that another claimer has taken
//!   since: such a lost race needs the other claimer to write and commit its claim
//!   within this one statement. When a window yields too few commands the claim looks
//!   through a wider one, until a window is not full. This transaction never waits
//!   for a lock, so it cannot deadlock.
//! - Portable (MySQL 5.7, or `skip_locked=0`): a plain read lists up to `batch ×
//!   claim_spread` claimable commands, oldest first; the claimer starts at a random one
//!   of them (so that concurrent claimers mostly take different rows) and, in one
//!   transaction, for each candidate in list order locks its attempt and command (a
//!   held one is waited for), and re-checks it at the database's now.
//!
//! Errors: deadlocks (1213), lock-wait timeouts (1205) and a connection lost before
//! `COMMIT` roll the transaction back and are retried whole, up to `retry_max` times
//! with jittered exponential backoff, then answer [`LedgerError::Unavailable`]. A
//! connection lost during `COMMIT` answers [`LedgerError::Ambiguous`] (a worker then
//! retries or lets its lease expire). Failing to connect within `connect_timeout_ms`
//! is [`LedgerError::Unavailable`]. A worker frozen in the middle of a transaction
//! holds its row locks only until the server drops its idle connection
//! (`idle_timeout_s`, the session's `wait_timeout`), which rolls the transaction back.
//! Tokens and passwords never appear in SQL text, errors or logs. The schema lives in
//! `migrations/mysql/` and is applied by [`Ledger::migrate`] ([`schema`]), never by
//! opening.

mod connection;
mod error;
mod listing;
pub(crate) mod outbox;
pub(in crate::ledger) mod rows;
pub mod schema;
pub mod scratch;
#[cfg(test)]
mod tests;
mod url;

pub use url::{MysqlOptions, MysqlUrl};

use super::{Claimed, Ledger, LedgerError};
use crate::clock::Clock;
use crate::entropy::Entropy;
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, ClaimRequest, Lease, OperatorRequest, Plan, PlanId, PlanSpec, Reply,
    WorkerRequest,
};
use mysql_async::{OptsBuilder, Pool, PoolConstraints, PoolOpts};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Counters of one ledger (shared by its clones) since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MysqlStats {
    /// Commands claimed.
    pub claims: u64,
    /// Candidates that were claimable when listed but taken by someone else before
    /// this claimer locked them: lost races, each refused (never a double claim). On
    /// the `SKIP LOCKED` path, commands that another claimer still holds are skipped,
    /// not lost; only one that another claimer wrote and committed while this claim's
    /// locking statement ran is a lost race.
    pub lost_claim_races: u64,
    /// Guarded claim `UPDATE`s that matched no row (the row lock should make this 0).
    pub refused_claim_updates: u64,
    /// Transactions tried again after a deadlock, lock-wait timeout or lost connection.
    pub retries: u64,
}

#[derive(Debug, Default)]
struct Counters {
    claims: AtomicU64,
    lost_claim_races: AtomicU64,
    refused_claim_updates: AtomicU64,
    retries: AtomicU64,
}

/// What the ledger knows of the server's `SKIP LOCKED`: not asked yet, or the answer.
const SKIP_LOCKED_UNKNOWN: u8 = 0;
const SKIP_LOCKED_YES: u8 = 1;
const SKIP_LOCKED_NO: u8 = 2;

struct Shared {
    pool: Pool,
    url: MysqlUrl,
    clock: Option<Arc<dyn Clock>>,
    entropy: Arc<dyn Entropy>,
    stats: Counters,
    /// [`SKIP_LOCKED_UNKNOWN`], [`SKIP_LOCKED_YES`] or [`SKIP_LOCKED_NO`]: probed at the
    /// first claim, then fixed for the ledger's life (and its clones').
    skip_locked: AtomicU8,
    #[cfg(test)]
    hooks: connection::Hooks,
}

/// What [`MysqlLedger::server_status`] read.
#[derive(Debug, Clone)]
pub(crate) struct ServerStatus {
    /// `@@version`.
    pub(crate) version: String,
    /// `@@pid_file`, if the server has one.
    pub(crate) pid_file: Option<String>,
    /// The status variables asked for, name and value.
    pub(crate) variables: Vec<(String, String)>,
}

/// The MySQL / MariaDB ledger: an async [`Ledger`] over a connection pool.
///
/// Clones share the pool and the counters. Any number of ledgers, in any number of
/// processes on any number of machines, may use the same database at once.
#[derive(Clone)]
pub struct MysqlLedger {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MysqlLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlLedger")
            .field("url", &self.shared.url)
            .finish_non_exhaustive()
    }
}

impl MysqlLedger {
    /// A pooled connection for stores kept beside the ledger's tables (the API
    /// tokens of [`crate::tokens`]), its errors classified like the ledger's.
    pub(crate) async fn pooled_connection(&self) -> Result<mysql_async::Conn, LedgerError> {
        self.retry(|| self.connect()).await
    }

    /// A ledger on the database at `url`, deciding leases on the database's clock and
    /// minting ids and tokens from `entropy`. Connects lazily: an unreachable server
    /// shows as [`LedgerError::Unavailable`] on the first call. Creates no table: call
    /// [`Ledger::migrate`] for that. Must be called inside a tokio runtime.
    pub fn open(url: &MysqlUrl, entropy: Arc<dyn Entropy>) -> Self {
        Self::build(url, None, entropy)
    }

    /// Like [`MysqlLedger::open`], but deciding leases on `clock` instead of the
    /// database's clock. For tests only (the conformance suite moves a manual clock);
    /// production must use the database's clock so that every machine agrees.
    pub fn open_with_clock(url: &MysqlUrl, clock: Arc<dyn Clock>, entropy: Arc<dyn Entropy>) -> Self {
        Self::build(url, Some(clock), entropy)
    }

    fn build(url: &MysqlUrl, clock: Option<Arc<dyn Clock>>, entropy: Arc<dyn Entropy>) -> Self {
        let o = url.options;
        let constraints = PoolConstraints::new(o.pool_min.min(o.pool_max), o.pool_max)
            .unwrap_or_else(|| PoolConstraints::new(0, o.pool_max.max(1)).unwrap_or_default());
        let pool_opts = PoolOpts::default()
            .with_constraints(constraints)
            // Keep up to pool_max idle connections for a while instead of closing
            // every one above pool_min as soon as it is returned; close them before
            // the server's wait_timeout does.
            .with_inactive_connection_ttl(Duration::from_secs((o.idle_timeout_s / 2).clamp(1, 60)))
            // Sessions are never left dirty (every transaction is ended), so the
            // reset round trip, which also drops cached statements, is not needed.
            .with_reset_connection(false);
        let session = vec![
            "SET time_zone = '+00:00'".to_owned(),
            "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ".to_owned(),
            format!("SET SESSION innodb_lock_wait_timeout = {}", o.lock_wait_timeout_s),
            format!("SET SESSION wait_timeout = {}", o.idle_timeout_s),
            "SET SESSION sql_mode = 'STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,\
             NO_ENGINE_SUBSTITUTION'"
                .to_owned(),
        ];
        let opts = OptsBuilder::default()
            .ip_or_hostname(url.host.clone())
            .tcp_port(url.port)
            .user(url.user.clone())
            .pass(url.expose_password().map(str::to_owned))
            .db_name(Some(url.database.clone()))
            .client_found_rows(true)
            .tcp_nodelay(true)
            .tcp_keepalive(Some(Duration::from_secs(30)))
            .stmt_cache_size(64)
            .setup(session)
            .pool_opts(pool_opts);
        Self {
            shared: Arc::new(Shared {
                pool: Pool::new(opts),
                url: url.clone(),
                clock,
                entropy,
                stats: Counters::default(),
                skip_locked: AtomicU8::new(if o.skip_locked {
                    SKIP_LOCKED_UNKNOWN
                } else {
                    SKIP_LOCKED_NO
                }),
                #[cfg(test)]
                hooks: connection::Hooks::default(),
            }),
        }
    }

    /// The URL this ledger connects to (its password hidden when printed).
    pub fn url(&self) -> &MysqlUrl {
        &self.shared.url
    }

    /// The counters since this ledger was opened.
    pub fn stats(&self) -> MysqlStats {
        let c = &self.shared.stats;
        MysqlStats {
            claims: c.claims.load(Ordering::Relaxed),
            lost_claim_races: c.lost_claim_races.load(Ordering::Relaxed),
            refused_claim_updates: c.refused_claim_updates.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
        }
    }

    /// Claim races lost (and refused) since this ledger was opened.
    pub fn lost_claim_races(&self) -> u64 {
        self.stats().lost_claim_races
    }

    /// Whether claims use `SKIP LOCKED`: `None` until the first claim has asked the
    /// server (unless the URL said `skip_locked=0`), then whether the server has it.
    pub fn uses_skip_locked(&self) -> Option<bool> {
        match self.shared.skip_locked.load(Ordering::Relaxed) {
            SKIP_LOCKED_YES => Some(true),
            SKIP_LOCKED_NO => Some(false),
            _ => None,
        }
    }

    /// Whether to claim with `SKIP LOCKED`, asking the server the first time.
    async fn skip_locked(&self) -> Result<bool, LedgerError> {
        if let Some(known) = self.uses_skip_locked() {
            return Ok(known);
        }
        let supported = self.retry(|| self.probe_skip_locked_once()).await?;
        let state = if supported { SKIP_LOCKED_YES } else { SKIP_LOCKED_NO };
        self.shared.skip_locked.store(state, Ordering::Relaxed);
        Ok(supported)
    }

    /// The server's global status variables named in `names` (`SHOW GLOBAL STATUS`,
    /// as the server prints them), its `@@version` and its `@@pid_file`, on one of
    /// the pool's connections: what `leasehold bench` reads around its deliveries
    /// ([`crate::bench::server`]).
    pub(crate) async fn server_status(&self, names: &[&str]) -> Result<ServerStatus, LedgerError> {
        use error::DbResult;
        use mysql_async::prelude::Queryable;
        let list = names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ");
        self.retry(|| async {
            let mut conn = self.connect().await?;
            let variables: Vec<(String, String)> = conn
                .query(format!("SHOW GLOBAL STATUS WHERE Variable_name IN ({list})"))
                .await
                .db()?;
            let about: Option<(String, Option<String>)> =
                conn.query_first("SELECT @@version, @@pid_file").await.db()?;
            let (version, pid_file) = about.unwrap_or_default();
            Ok(ServerStatus {
                version,
                pid_file,
                variables,
            })
        })
        .await
    }

    /// Closes the pool's connections once they are idle. Other clones stop working.
    pub async fn disconnect(&self) -> Result<(), LedgerError> {
        self.shared
            .pool
            .clone()
            .disconnect()
            .await
            .map_err(|e| LedgerError::Unavailable(format!("mysql: {e}")))
    }

    /// Has the next worker transition's connection killed at `point` (tests).
    #[cfg(test)]
    fn kill_at(&self, point: connection::KillPoint) {
        *self.shared.hooks.kill.lock().unwrap_or_else(|e| e.into_inner()) = Some(point);
    }

    /// Stalls the next worker transition for `ms` while it holds its row locks (tests).
    #[cfg(test)]
    fn stall_next_transition(&self, ms: u64) {
        *self.shared.hooks.stall.lock().unwrap_or_else(|e| e.into_inner()) = Some(Duration::from_millis(ms));
    }

    /// Pauses the next claim once it has fixed what it sees (listed its candidates,
    /// or taken its snapshot) and before it locks anything; answers a receiver that
    /// fires when it got there and a sender that lets it go on (tests).
    #[cfg(test)]
    fn pause_next_claim(&self) -> (tokio::sync::oneshot::Receiver<()>, tokio::sync::oneshot::Sender<()>) {
        Self::arm(&self.shared.hooks.pause)
    }

    /// Pauses the next `SKIP LOCKED` claim while it holds the rows it locked (tests).
    #[cfg(test)]
    fn pause_next_claim_holding(&self) -> (tokio::sync::oneshot::Receiver<()>, tokio::sync::oneshot::Sender<()>) {
        Self::arm(&self.shared.hooks.pause_holding)
    }

    #[cfg(test)]
    fn arm(
        slot: &std::sync::Mutex<Option<connection::Pause>>,
    ) -> (tokio::sync::oneshot::Receiver<()>, tokio::sync::oneshot::Sender<()>) {
        let (reached_tx, reached_rx) = tokio::sync::oneshot::channel();
        let (resume_tx, resume_rx) = tokio::sync::oneshot::channel();
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((reached_tx, resume_rx));
        (reached_rx, resume_tx)
    }

    /// The commands a committed claim transaction took, counted (with its lost races)
    /// in the ledger's stats.
    fn counted(&self, batch: connection::ClaimBatch) -> Vec<Claimed> {
        let counters = &self.shared.stats;
        counters.claims.fetch_add(batch.claimed.len() as u64, Ordering::Relaxed);
        counters.lost_claim_races.fetch_add(batch.lost, Ordering::Relaxed);
        batch.claimed
    }

    async fn claim_with(&self, request: &ClaimRequest) -> Result<Vec<Claimed>, LedgerError> {
        let batch = request.batch;
        if batch == 0 {
            return Ok(Vec::new());
        }
        if self.skip_locked().await? {
            let b = self.retry(|| self.claim_skip_locked_once(request)).await?;
            return Ok(self.counted(b));
        }
        let spread = self.shared.url.options.claim_spread.max(1);
        let window = batch.saturating_mul(spread).min(1_000);
        let candidates = self.retry(|| self.claim_candidates_once(window)).await?;
        #[cfg(test)]
        self.test_pause_after_listing().await;
        // Start at a random candidate (leaving at least a batch after it), so that
        // claimers polling at the same moment mostly lock different rows. Each
        // transaction locks in the listed (oldest first) order, so the candidates
        // before the start, tried only when races were lost, are a second one.
        let start = match candidates.len().checked_sub(batch as usize) {
            Some(room) if spread > 1 && room > 0 => (self.shared.entropy.next_u64() % (room as u64 + 1)) as usize,
            _ => 0,
        };
        let (head, tail) = candidates.split_at(start);
        let mut claimed: Vec<Claimed> = Vec::new();
        for part in [tail, head] {
            let want = (batch as usize).saturating_sub(claimed.len());
            if want == 0 || part.is_empty() {
                continue;
            }
            match self.retry(|| self.claim_batch_once(part, request, want)).await {
                Ok(b) => claimed.extend(self.counted(b)),
                // The leases already committed are real: hand them to the worker.
                Err(_) if !claimed.is_empty() => break,
                Err(e) => return Err(e),
            }
        }
        Ok(claimed)
    }
}

impl Ledger for MysqlLedger {
    /// Where the server has `SKIP LOCKED` (known once probed); a server without it
    /// runs the request and the claim one after the other.
    fn fuses_claims(&self) -> bool {
        self.uses_skip_locked() == Some(true)
    }

    async fn migrate(&self) -> Result<Vec<u32>, LedgerError> {
        self.retry(|| self.migrate_once()).await
    }

    async fn register_plan(&self, spec: PlanSpec, known_executors: &[&str]) -> Result<Plan, LedgerError> {
        self.retry(|| self.register_plan_once(spec.clone(), known_executors))
            .await
    }

    async fn plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        self.retry(|| self.plan_once(id)).await
    }

    async fn list_plans(&self) -> Result<Vec<Plan>, LedgerError> {
        self.retry(|| self.list_plans_once()).await
    }

    async fn plans_named(&self, name: &str) -> Result<Vec<Plan>, LedgerError> {
        self.retry(|| self.plans_named_once(name)).await
    }

    async fn plans_newest_first(&self, before: Option<&PlanId>, limit: u32) -> Result<Vec<Plan>, LedgerError> {
        self.retry(|| self.plans_newest_first_once(before, limit)).await
    }

    async fn list_plan_rows(&self) -> Result<Vec<crate::ledger::listing::PlanRow>, LedgerError> {
        self.retry(|| async {
            let mut conn = self.connect().await?;
            rows::read_plan_rows(&mut conn).await
        })
        .await
    }

    async fn plan_rows_newest_first(
        &self,
        before: Option<&PlanId>,
        limit: u32,
    ) -> Result<Vec<crate::ledger::listing::PlanRow>, LedgerError> {
        self.retry(|| async {
            let mut conn = self.connect().await?;
            rows::read_plan_rows_newest_first(&mut conn, before, limit).await
        })
        .await
    }

    async fn retire_plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        self.retry(|| self.retire_plan_once(id)).await
    }

    async fn enqueue(&self, plan: &PlanId, action: Action) -> Result<AttemptRecord, LedgerError> {
        self.retry(|| self.enqueue_once(plan, action)).await
    }

    async fn claim_batch(&self, request: ClaimRequest) -> Result<Vec<Claimed>, LedgerError> {
        self.claim_with(&request).await
    }

    async fn worker(&self, lease: &Lease, request: WorkerRequest) -> Result<Reply, LedgerError> {
        self.retry(|| self.worker_once(lease, &request)).await
    }

    /// In one transaction on a server with `SKIP LOCKED`; otherwise the request,
    /// then a claim of its own.
    async fn worker_then_claim(
        &self,
        lease: &Lease,
        request: WorkerRequest,
        claim: ClaimRequest,
    ) -> Result<(Reply, Vec<Claimed>), LedgerError> {
        if claim.batch == 0 || !self.skip_locked().await? {
            return crate::ledger::worker_then_claim_apart(self, lease, request, claim).await;
        }
        let (reply, batch) = self
            .retry(|| self.worker_then_claim_once(lease, &request, &claim))
            .await?;
        Ok((reply, self.counted(batch)))
    }

    async fn operator(
        &self,
        attempt: &AttemptId,
        request: OperatorRequest,
    ) -> Result<(Reply, AttemptRecord), LedgerError> {
        self.retry(|| self.operator_once(attempt, &request)).await
    }

    async fn attempt(&self, attempt: &AttemptId) -> Result<AttemptRecord, LedgerError> {
        self.retry(|| self.attempt_once(attempt)).await
    }

    async fn history(&self, plan: &PlanId) -> Result<Vec<AttemptRecord>, LedgerError> {
        self.retry(|| self.history_once(plan)).await
    }

    async fn open_attempts(&self) -> Result<u64, LedgerError> {
        self.retry(|| self.open_attempts_once()).await
    }

    // The console's reads ([`listing`]).
    async fn list_attempts(
        &self,
        query: &crate::ledger::listing::AttemptQuery,
    ) -> Result<crate::ledger::listing::AttemptPage, LedgerError> {
        self.retry(|| self.list_attempts_once(query)).await
    }

    async fn count_attempts(&self, cap: u64) -> Result<crate::ledger::listing::AttemptCounts, LedgerError> {
        self.retry(|| self.count_attempts_once(cap)).await
    }

    async fn check_ready(&self) -> Result<Vec<String>, LedgerError> {
        self.retry(|| async {
            let mut conn = self.connect().await?;
            schema::check_ready(&mut conn).await
        })
        .await
    }
}
