//! The PostgreSQL ledger: connection pool, TLS, migrations and the schema check.
//!
//! Contract: [`PostgresLedger::open`] builds a pool (deadpool-postgres over
//! tokio-postgres) from a [`PostgresUrl`] without connecting; every pooled session
//! starts with the URL's `statement_timeout`, `lock_timeout` and
//! `idle_in_transaction_session_timeout`. TLS goes through rustls, with libpq's
//! meaning of the URL's `sslmode` (`tls.rs`).
//! [`crate::ledger::Ledger::migrate`] applies `migrations/postgres/` under an advisory lock
//! ([`schema`]); [`PostgresLedger::check_schema`] refuses a database without the schema
//! or with a newer one, naming both versions. A transaction that meets a serialization
//! failure, a deadlock, a lock timeout or a connection lost before `COMMIT` is tried
//! again, up to the URL's `retry_max`; a connection lost during `COMMIT` is reported
//! as ambiguous (`error.rs`).
//!
//! Requests are the shared transaction bodies of [`SqlLedger`] over this module's
//! [`PgBackend`] and its session (`session.rs`): every request of the engine's
//! vocabulary ([`leasehold_engine::request`]) is one transaction — a claim batch, a worker
//! request ([`crate::ledger::Ledger::worker`]) or an operator request
//! ([`crate::ledger::Ledger::operator`]) — that
//! reads its rows in lock order with `SELECT … FOR UPDATE` (attempt, then command,
//! then receipts by ordinal), lets the engine decide ([`leasehold_engine::decide`]) at
//! the database clock's now (read once the rows are held), and writes the engine's row
//! images through the shared SQL layer (`src/ledger/sql/`): the command's
//! `UPDATE` carries the engine's [`leasehold_engine::Guard`] as its `WHERE` condition,
//! and zero affected rows is a refusal ([`leasehold_engine::Refusal::StaleToken`])
//! after which the transaction is rolled back. Claims lock the oldest claimable
//! commands nobody else holds with `FOR UPDATE SKIP LOCKED` (a CTE picks the
//! candidates, `claim.rs`), so concurrent claimers take disjoint commands and never wait on each
//! other. Enqueues, and operator requests that make a command claimable again (a
//! reconcile's requeue), notify idle workers (`LISTEN`/`NOTIFY`, [`notify`]). The semantics
//! are those of the reference [`super::memory::MemoryLedger`]; tests may inject a
//! [`Clock`] instead of the database's ([`PostgresLedger::open_with_clock`]).

mod claim;
mod error;
pub mod notify;
pub(crate) mod outbox;
pub mod schema;
pub mod scratch;
pub(crate) mod session;
mod tls;
mod url;

pub use url::{PostgresOptions, PostgresUrl, Ssl};

use crate::clock::Clock;
use crate::entropy::Entropy;
use crate::ledger::sql::ledger::{SqlBackend, SqlContext, TxKind};
use crate::ledger::sql::SqlLedger;
use crate::ledger::{Claimed, LedgerError};
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use error::{classify, Phase, TxError};
use leasehold_engine::ClaimRequest;
use session::{PgConn, PgSession};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio_postgres::IsolationLevel;

/// The PostgreSQL ledger: the shared [`SqlLedger`] over a [`PgBackend`]. Clones
/// share the pool and the counters.
pub type PostgresLedger = SqlLedger<PgBackend>;

/// Counters of a [`PostgresLedger`] (and its clones) since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PostgresStats {
    /// Commands claimed.
    pub claims: u64,
    /// Candidates that were no longer claimable once locked.
    pub lost_claim_races: u64,
    /// Transactions tried again after a conflict or a lost connection.
    pub retries: u64,
    /// Groups of more than one lease holder's request written in one transaction
    /// (`group_writes`).
    pub groups: u64,
    /// Requests written in those groups.
    pub grouped_requests: u64,
    /// Groups undone: for a request with an answer of its own (a refusal, not
    /// found), written alone while the rest were grouped again, or for a claim
    /// refused on damaged rows, every request then written alone.
    pub split_groups: u64,
}

#[derive(Debug, Default)]
struct Counters {
    claims: AtomicU64,
    lost_claim_races: AtomicU64,
}

/// PostgreSQL for [`SqlLedger`]: the pool (deadpool-postgres over tokio-postgres,
/// TLS through rustls), its transactions, its claim and its wake-ups.
pub struct PgBackend {
    pool: Pool,
    url: PostgresUrl,
    stats: Counters,
    wake: std::sync::OnceLock<tokio::sync::watch::Receiver<u64>>,
}

impl PgBackend {
    /// A pooled session.
    async fn connect(&self) -> Result<deadpool_postgres::Client, TxError> {
        self.pool
            .get()
            .await
            .map_err(|e| TxError::Ledger(error::pool_error(&self.url.to_string(), e)))
    }
}

impl SqlBackend for PgBackend {
    type Conn = deadpool_postgres::Client;
    type Tx<'c> = PgSession<PgConn<'c>>;

    async fn connect(&self) -> Result<Self::Conn, TxError> {
        PgBackend::connect(self).await
    }

    /// Writes and claims at READ COMMITTED (the server's default): every locking read
    /// answers the latest committed version of its rows, and a guarded `UPDATE`
    /// re-evaluates its guard on the latest version of the row it waited for. Reads of
    /// several statements at REPEATABLE READ, read only: one snapshot.
    async fn begin<'c>(&'c self, conn: &'c mut Self::Conn, kind: TxKind) -> Result<Self::Tx<'c>, TxError> {
        let statement = |e| classify(&e, Phase::Statement);
        let conn = match kind {
            TxKind::Single => PgConn::Single(conn),
            TxKind::Write | TxKind::Claim => PgConn::Tx(conn.transaction().await.map_err(statement)?),
            TxKind::Read => PgConn::Tx(
                conn.build_transaction()
                    .isolation_level(IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()
                    .await
                    .map_err(statement)?,
            ),
        };
        Ok(PgSession(conn))
    }

    async fn commit(&self, tx: Self::Tx<'_>, kind: TxKind) -> Result<(), TxError> {
        let phase = if kind.writes() { Phase::Commit } else { Phase::Statement };
        match tx.0 {
            PgConn::Single(_) => Ok(()),
            PgConn::Tx(t) => t.commit().await.map_err(|e| classify(&e, phase)),
        }
    }

    async fn rollback(&self, tx: Self::Tx<'_>) {
        if let PgConn::Tx(t) = tx.0 {
            // A failed rollback means a broken session: the server rolls back.
            let _ = t.rollback().await;
        }
    }

    async fn claim_in(
        &self,
        ctx: &SqlContext,
        tx: &mut Self::Tx<'_>,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed>, TxError> {
        claim::claim_in(self, ctx, tx, request).await
    }

    async fn claim_many_in(
        &self,
        ctx: &SqlContext,
        tx: &mut Self::Tx<'_>,
        requests: &[&ClaimRequest],
    ) -> Result<Vec<Vec<Claimed>>, TxError> {
        claim::claim_many(self, ctx, tx, requests).await
    }

    /// As the URL's `group_writes` says (yes by default): a group of requests costs
    /// one transaction, one pass of locking reads and one claim for all of them.
    fn groups_writes(&self) -> bool {
        self.url.options.group_writes
    }

    async fn migrate(&self, _ctx: &SqlContext) -> Result<Vec<u32>, TxError> {
        let mut client = self.connect().await?;
        schema::migrate(&mut client).await
    }

    async fn check_ready(&self) -> Result<Vec<String>, TxError> {
        let client = self.connect().await?;
        schema::check_ready(&client).await
    }

    async fn schema_notice(&self) -> Result<Option<String>, TxError> {
        let client = self.connect().await?;
        schema::schema_notice(&client, &self.url.to_string()).await
    }

    fn wake(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        if !self.url.options.notify {
            return None;
        }
        Some(self.wake.get_or_init(|| notify::listen(&self.url)).clone())
    }
}

impl SqlLedger<PgBackend> {
    /// A ledger over the database at `url`, deciding leases on the database's clock
    /// and minting ids and tokens from `entropy`. Builds the pool; connects on first
    /// use.
    pub fn open(url: &PostgresUrl, entropy: Arc<dyn Entropy>) -> Result<Self, LedgerError> {
        Self::build(url, None, entropy)
    }

    /// [`PostgresLedger::open`], deciding leases on `clock` instead of the
    /// database's (tests).
    pub fn open_with_clock(
        url: &PostgresUrl,
        clock: Arc<dyn Clock>,
        entropy: Arc<dyn Entropy>,
    ) -> Result<Self, LedgerError> {
        Self::build(url, Some(clock), entropy)
    }

    fn build(url: &PostgresUrl, clock: Option<Arc<dyn Clock>>, entropy: Arc<dyn Entropy>) -> Result<Self, LedgerError> {
        let backend = PgBackend {
            pool: pool(url)?,
            url: url.clone(),
            stats: Counters::default(),
            wake: std::sync::OnceLock::new(),
        };
        Ok(SqlLedger::new(backend, clock, entropy, url.options.retry_max))
    }

    /// The counters so far (this ledger and its clones).
    pub fn stats(&self) -> PostgresStats {
        let c = &self.backend.stats;
        let g = &self.ctx.groups;
        PostgresStats {
            claims: c.claims.load(Ordering::Relaxed),
            lost_claim_races: c.lost_claim_races.load(Ordering::Relaxed),
            retries: self.retries(),
            groups: g.grouped.load(Ordering::Relaxed),
            grouped_requests: g.grouped_requests.load(Ordering::Relaxed),
            split_groups: g.split.load(Ordering::Relaxed),
        }
    }

    /// The URL this ledger was opened with.
    pub fn url(&self) -> &PostgresUrl {
        &self.backend.url
    }

    /// A pooled session, for stores kept beside the ledger's tables
    /// ([`crate::tokens`]) and the raw baselines.
    #[cfg(any(test, feature = "cli"))]
    pub(crate) async fn session(&self) -> Result<deadpool_postgres::Client, LedgerError> {
        self.backend.connect().await.map_err(LedgerError::from)
    }

    /// Refuses a database without the ledger's schema or with a newer one, naming
    /// both versions.
    pub async fn check_schema(&self) -> Result<(), LedgerError> {
        self.retry(|| async {
            let client = self.backend.connect().await?;
            schema::check_schema(&client, &self.backend.url.to_string()).await
        })
        .await
    }
}

/// The pool of `url`: every session starts with the URL's session settings.
fn pool(url: &PostgresUrl) -> Result<Pool, LedgerError> {
    let manager = Manager::from_config(
        url.config().clone(),
        tls::connector(url.options.ssl == Ssl::VerifyFull)?,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let settings = url.options.session_settings();
    Pool::builder(manager)
        .max_size(url.options.pool_max)
        .wait_timeout(Some(url.options.connect_timeout()))
        .create_timeout(Some(url.options.connect_timeout()))
        .runtime(Runtime::Tokio1)
        .post_create(Hook::async_fn(move |client, _| {
            let settings = settings.clone();
            Box::pin(async move { client.batch_execute(&settings).await.map_err(HookError::Backend) })
        }))
        .build()
        .map_err(|e| LedgerError::Internal(format!("postgres pool: {e}")))
}

#[cfg(test)]
mod tests;
