//! The MySQL / MariaDB ledger: many workers on many machines, one durable outbox.
//!
//! The transaction bodies are the shared ones ([`SqlLedger`]); this module holds what
//! is MySQL's own: the pool and its session settings, error classification
//! (`error.rs`), URL options, the session (`session.rs`), the claims (`claim.rs`)
//! and the migrations ([`schema`]).
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
//! inject a [`Clock`] instead ([`SqlLedger::open_with_clock`]). Ids and lease tokens
//! come from the [`Entropy`] (the OS in production).
//!
//! Claims take one of two paths, chosen once per ledger: the first claim asks the
//! server whether it understands `SELECT … FOR UPDATE SKIP LOCKED` (MariaDB 10.6+,
//! MySQL 8.0.1+; a probe statement that reads nothing, [`SqlLedger::uses_skip_locked`]
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
//! `migrations/mysql/` and is applied by [`crate::ledger::Ledger::migrate`] ([`schema`]), never by
//! opening.

mod claim;
mod error;
#[cfg(test)]
mod hooks;
pub(crate) mod outbox;
pub mod schema;
pub mod scratch;
pub(crate) mod session;
#[cfg(test)]
mod tests;
mod url;

pub use url::{MysqlOptions, MysqlUrl};

use super::sql::ledger::{claim_alone, retry, Checkpoint, SqlBackend, SqlContext, TxKind};
use super::sql::SqlLedger;
use super::{Claimed, LedgerError};
use crate::clock::Clock;
use crate::entropy::Entropy;
use error::{classify, DbResult, Phase, TxError};
use leasehold_engine::ClaimRequest;
use mysql_async::{Conn, IsolationLevel, OptsBuilder, Pool, PoolConstraints, PoolOpts, TxOpts};
use session::{MyConn, MySession};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The MySQL / MariaDB ledger: the shared [`SqlLedger`] over a connection pool.
///
/// Clones share the pool and the counters. Any number of ledgers, in any number of
/// processes on any number of machines, may use the same database at once.
pub type MysqlLedger = SqlLedger<MysqlBackend>;

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
}

/// What the ledger knows of the server's `SKIP LOCKED`: not asked yet, or the answer.
const SKIP_LOCKED_UNKNOWN: u8 = 0;
const SKIP_LOCKED_YES: u8 = 1;
const SKIP_LOCKED_NO: u8 = 2;

/// What [`SqlLedger::server_status`] read.
#[cfg(feature = "cli")]
#[derive(Debug, Clone)]
pub(crate) struct ServerStatus {
    /// `@@version`.
    pub(crate) version: String,
    /// `@@pid_file`, if the server has one.
    pub(crate) pid_file: Option<String>,
    /// The status variables asked for, name and value.
    pub(crate) variables: Vec<(String, String)>,
}

/// MySQL / MariaDB for [`SqlLedger`]: the pool, its transactions, its claims.
pub struct MysqlBackend {
    pool: Pool,
    url: MysqlUrl,
    stats: Counters,
    /// [`SKIP_LOCKED_UNKNOWN`], [`SKIP_LOCKED_YES`] or [`SKIP_LOCKED_NO`]: probed at the
    /// first claim, then fixed for the ledger's life (and its clones').
    skip_locked: AtomicU8,
    #[cfg(test)]
    hooks: hooks::Hooks,
}

type MyBackend = MysqlBackend;

impl MysqlBackend {
    /// A pooled connection, within the configured connect timeout.
    async fn connect(&self) -> Result<Conn, TxError> {
        let timeout = self.url.options.connect_timeout();
        match tokio::time::timeout(timeout, self.pool.get_conn()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(match classify(&e, Phase::Connect) {
                // Name the server (the URL prints without its password).
                TxError::Ledger(LedgerError::Unavailable(m)) => {
                    LedgerError::Unavailable(format!("cannot connect to {}: {m}", self.url)).into()
                }
                other => other,
            }),
            Err(_) => Err(LedgerError::Unavailable(format!(
                "mysql: no connection to {} within {} ms (pool_max {})",
                self.url,
                timeout.as_millis(),
                self.url.options.pool_max
            ))
            .into()),
        }
    }

    /// Whether claims use `SKIP LOCKED`, if known.
    fn uses_skip_locked(&self) -> Option<bool> {
        match self.skip_locked.load(Ordering::Relaxed) {
            SKIP_LOCKED_YES => Some(true),
            SKIP_LOCKED_NO => Some(false),
            _ => None,
        }
    }

    /// Whether to claim with `SKIP LOCKED`, asking the server the first time.
    async fn skip_locked(&self, ctx: &SqlContext) -> Result<bool, LedgerError> {
        if let Some(known) = self.uses_skip_locked() {
            return Ok(known);
        }
        let supported = retry(ctx, || claim::probe_skip_locked_once(self)).await?;
        let state = if supported { SKIP_LOCKED_YES } else { SKIP_LOCKED_NO };
        self.skip_locked.store(state, Ordering::Relaxed);
        Ok(supported)
    }

    /// [`SqlBackend::begin`], named by its own types (the claims call it).
    async fn begin_tx<'c>(&self, conn: &'c mut Conn, kind: TxKind) -> Result<MySession<MyConn<'c>>, TxError> {
        if kind == TxKind::Single {
            return Ok(MySession(MyConn::Single(conn)));
        }
        let tx = conn.start_transaction(self.tx_opts(kind)).await.db()?;
        Ok(MySession(MyConn::Tx(tx)))
    }

    /// The options a transaction of `kind` starts with. A claim runs at READ
    /// UNCOMMITTED: its window is then read as the rows are now, other claimers'
    /// uncommitted claims included, instead of from a snapshot that lags the locks (a
    /// lagging snapshot lists commands that others have claimed since, each a lost
    /// race). Nothing is decided on what that read saw: every decision is made on the
    /// rows as locked, and locking reads always see the latest committed version, at
    /// any isolation level. A test that pauses the next claim instead fixes a
    /// REPEATABLE READ snapshot at once, to stage the race the window read can still
    /// lose. Reads take one consistent snapshot; writes run at the session's
    /// REPEATABLE READ.
    fn tx_opts(&self, kind: TxKind) -> TxOpts {
        let mut opts = TxOpts::default();
        #[cfg(test)]
        let stale_snapshot = hooks::pause_armed(self);
        #[cfg(not(test))]
        let stale_snapshot = false;
        match kind {
            TxKind::Claim if !stale_snapshot => {
                opts.with_isolation_level(IsolationLevel::ReadUncommitted);
            }
            TxKind::Claim => {
                opts.with_consistent_snapshot(true);
            }
            TxKind::Read => {
                opts.with_consistent_snapshot(true).with_readonly(Some(true));
            }
            TxKind::Write | TxKind::Single => {}
        }
        opts
    }
}

impl SqlBackend for MysqlBackend {
    type Conn = Conn;
    type Tx<'c> = MySession<MyConn<'c>>;

    async fn connect(&self) -> Result<Conn, TxError> {
        MysqlBackend::connect(self).await
    }

    async fn begin<'c>(&'c self, conn: &'c mut Conn, kind: TxKind) -> Result<Self::Tx<'c>, TxError> {
        self.begin_tx(conn, kind).await
    }

    async fn commit(&self, tx: Self::Tx<'_>, kind: TxKind) -> Result<(), TxError> {
        commit_tx(tx, kind).await
    }

    async fn rollback(&self, tx: Self::Tx<'_>) {
        rollback_tx(tx).await
    }

    async fn claim_in(
        &self,
        ctx: &SqlContext,
        tx: &mut Self::Tx<'_>,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed>, TxError> {
        claim::claim_skip_locked(self, ctx, tx, request).await
    }

    /// With `SKIP LOCKED` where the server has it, else the portable path.
    async fn claim(&self, ctx: &SqlContext, request: &ClaimRequest) -> Result<Vec<Claimed>, LedgerError> {
        if self.skip_locked(ctx).await? {
            claim_alone(self, ctx, request).await
        } else {
            claim::claim_portable(self, ctx, request).await
        }
    }

    /// Where the server has `SKIP LOCKED`; a server without it runs the request and
    /// the claim one after the other.
    async fn fuses(&self, ctx: &SqlContext) -> Result<bool, LedgerError> {
        self.skip_locked(ctx).await
    }

    fn fuses_claims(&self) -> bool {
        self.uses_skip_locked() == Some(true)
    }

    async fn checkpoint(&self, tx: &mut Self::Tx<'_>, point: Checkpoint) -> Result<(), TxError> {
        #[cfg(test)]
        hooks::checkpoint(self, &tx.0, point).await?;
        let _ = (tx, point);
        Ok(())
    }

    async fn migrate(&self, ctx: &SqlContext) -> Result<Vec<u32>, TxError> {
        let mut conn = self.connect().await?;
        schema::run(&mut conn, ctx.clock.as_ref().map(|c| c.now())).await
    }

    async fn check_ready(&self) -> Result<Vec<String>, TxError> {
        let mut conn = self.connect().await?;
        schema::check_ready(&mut conn).await
    }

    async fn schema_notice(&self) -> Result<Option<String>, TxError> {
        let mut conn = self.connect().await?;
        schema::schema_notice(&mut conn, &self.url.to_string()).await
    }
}

impl SqlLedger<MysqlBackend> {
    /// A ledger on the database at `url`, deciding leases on the database's clock and
    /// minting ids and tokens from `entropy`. Connects lazily: an unreachable server
    /// shows as [`LedgerError::Unavailable`] on the first call. Creates no table: call
    /// [`crate::ledger::Ledger::migrate`] for that. Must be called inside a tokio
    /// runtime.
    pub fn open(url: &MysqlUrl, entropy: Arc<dyn Entropy>) -> Self {
        SqlLedger::new(backend(url), None, entropy, url.options.retry_max)
    }

    /// Like [`MysqlLedger::open`], but deciding leases on `clock` instead of the
    /// database's clock. For tests only (the conformance suite moves a manual clock);
    /// production must use the database's clock so that every machine agrees.
    pub fn open_with_clock(url: &MysqlUrl, clock: Arc<dyn Clock>, entropy: Arc<dyn Entropy>) -> Self {
        SqlLedger::new(backend(url), Some(clock), entropy, url.options.retry_max)
    }

    /// The URL this ledger connects to (its password hidden when printed).
    pub fn url(&self) -> &MysqlUrl {
        &self.backend.url
    }

    /// The counters since this ledger was opened.
    pub fn stats(&self) -> MysqlStats {
        let c = &self.backend.stats;
        MysqlStats {
            claims: c.claims.load(Ordering::Relaxed),
            lost_claim_races: c.lost_claim_races.load(Ordering::Relaxed),
            refused_claim_updates: c.refused_claim_updates.load(Ordering::Relaxed),
            retries: self.retries(),
        }
    }

    /// Claim races lost (and refused) since this ledger was opened.
    pub fn lost_claim_races(&self) -> u64 {
        self.stats().lost_claim_races
    }

    /// Whether claims use `SKIP LOCKED`: `None` until the first claim has asked the
    /// server (unless the URL said `skip_locked=0`), then whether the server has it.
    pub fn uses_skip_locked(&self) -> Option<bool> {
        self.backend.uses_skip_locked()
    }

    /// A pooled connection for stores kept beside the ledger's tables (the API
    /// tokens of [`crate::tokens`]), its errors classified like the ledger's.
    #[cfg(any(test, feature = "cli"))]
    pub(crate) async fn pooled_connection(&self) -> Result<Conn, LedgerError> {
        self.retry(|| self.backend.connect()).await
    }

    /// The server's global status variables named in `names` (`SHOW GLOBAL STATUS`,
    /// as the server prints them), its `@@version` and its `@@pid_file`, on one of
    /// the pool's connections: what `leasehold bench` reads around its deliveries
    /// ([`crate::bench::server`]).
    #[cfg(feature = "cli")]
    pub(crate) async fn server_status(&self, names: &[&str]) -> Result<ServerStatus, LedgerError> {
        use mysql_async::prelude::Queryable;
        let list = names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ");
        self.retry(|| async {
            let mut conn = self.backend.connect().await?;
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
        self.backend
            .pool
            .clone()
            .disconnect()
            .await
            .map_err(|e| LedgerError::Unavailable(format!("mysql: {e}")))
    }

    /// Has the next worker transition's connection killed at `point` (tests).
    #[cfg(test)]
    fn kill_at(&self, point: Checkpoint) {
        *self.backend.hooks.kill.lock().unwrap_or_else(|e| e.into_inner()) = Some(point);
    }

    /// Stalls the next worker transition for `ms` while it holds its row locks (tests).
    #[cfg(test)]
    fn stall_next_transition(&self, ms: u64) {
        *self.backend.hooks.stall.lock().unwrap_or_else(|e| e.into_inner()) = Some(Duration::from_millis(ms));
    }

    /// Pauses the next claim once it has fixed what it sees (listed its candidates,
    /// or taken its snapshot) and before it locks anything; answers a receiver that
    /// fires when it got there and a sender that lets it go on (tests).
    #[cfg(test)]
    fn pause_next_claim(&self) -> (tokio::sync::oneshot::Receiver<()>, tokio::sync::oneshot::Sender<()>) {
        hooks::arm(&self.backend.hooks.pause)
    }

    /// Pauses the next `SKIP LOCKED` claim while it holds the rows it locked (tests).
    #[cfg(test)]
    fn pause_next_claim_holding(&self) -> (tokio::sync::oneshot::Receiver<()>, tokio::sync::oneshot::Sender<()>) {
        hooks::arm(&self.backend.hooks.pause_holding)
    }
}

/// Commits `tx` (a lost `COMMIT` of a kind that writes is ambiguous).
async fn commit_tx(tx: MySession<MyConn<'_>>, kind: TxKind) -> Result<(), TxError> {
    let phase = if kind.writes() { Phase::Commit } else { Phase::Statement };
    match tx.0 {
        MyConn::Single(_) => Ok(()),
        MyConn::Tx(t) => t.commit().await.map_err(|e| classify(&e, phase)),
    }
}

/// Rolls `tx` back (a failed rollback means a broken connection: the server rolls
/// back itself).
async fn rollback_tx(tx: MySession<MyConn<'_>>) {
    if let MyConn::Tx(t) = tx.0 {
        let _ = t.rollback().await;
    }
}

/// The backend of `url`: its pool, every connection set up with the ledger's session
/// settings (UTC, REPEATABLE READ, the URL's lock-wait and idle timeouts, strict
/// mode).
fn backend(url: &MysqlUrl) -> MysqlBackend {
    let o = url.options;
    MysqlBackend {
        pool: Pool::new(pool_opts(url)),
        url: url.clone(),
        stats: Counters::default(),
        skip_locked: AtomicU8::new(if o.skip_locked {
            SKIP_LOCKED_UNKNOWN
        } else {
            SKIP_LOCKED_NO
        }),
        #[cfg(test)]
        hooks: hooks::Hooks::default(),
    }
}

/// The pool's options for `url`.
fn pool_opts(url: &MysqlUrl) -> OptsBuilder {
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
    url.connection_opts()
        .client_found_rows(true)
        .tcp_nodelay(true)
        .tcp_keepalive(Some(Duration::from_secs(30)))
        .stmt_cache_size(64)
        .setup(session)
        .pool_opts(pool_opts)
}
