//! The PostgreSQL ledger: connection pool, TLS, migrations and the schema check.
//!
//! Contract: [`PostgresLedger::open`] builds a pool (deadpool-postgres over
//! tokio-postgres) from a [`PostgresUrl`] without connecting; every pooled session
//! starts with the URL's `statement_timeout`, `lock_timeout` and
//! `idle_in_transaction_session_timeout`. TLS goes through rustls, with libpq's
//! meaning of the URL's `sslmode` (`tls.rs`).
//! [`PostgresLedger::migrate`] applies `migrations/postgres/` under an advisory lock
//! ([`schema`]); [`PostgresLedger::check_schema`] refuses a database without the schema
//! or with a newer one, naming both versions. A transaction that meets a serialization
//! failure, a deadlock, a lock timeout or a connection lost before `COMMIT` is tried
//! again, up to the URL's `retry_max`; a connection lost during `COMMIT` is reported
//! as ambiguous (`error.rs`).
//!
//! Requests (`connection.rs`): every request of the engine's vocabulary
//! ([`leasehold_engine::request`]) is one transaction — a claim batch, a worker
//! request ([`Ledger::worker`]) or an operator request ([`Ledger::operator`]) — that
//! reads its rows in lock order with `SELECT … FOR UPDATE` (attempt, then command,
//! then receipts by ordinal), lets the engine decide ([`leasehold_engine::decide`]) at
//! the database clock's now (read once the rows are held), and writes the engine's row
//! images through the shared SQL layer (`src/ledger/sql/`): the command's
//! `UPDATE` carries the engine's [`leasehold_engine::Guard`] as its `WHERE` condition,
//! and zero affected rows is a refusal ([`leasehold_engine::Refusal::StaleToken`])
//! after which the transaction is rolled back. Claims lock the oldest claimable
//! commands nobody else holds with `FOR UPDATE SKIP LOCKED` (a CTE picks the
//! candidates), so concurrent claimers take disjoint commands and never wait on each
//! other. Enqueues, and operator requests that make a command claimable again (a
//! reconcile's requeue), notify idle workers (`LISTEN`/`NOTIFY`, [`notify`]). The semantics
//! are those of the reference [`super::memory::MemoryLedger`]; tests may inject a
//! [`Clock`] instead of the database's ([`PostgresLedger::open_with_clock`]).

mod connection;
mod error;
mod listing;
pub mod notify;
pub(crate) mod outbox;
mod rows;
pub mod schema;
pub mod scratch;
mod tls;
mod url;

pub use url::{PostgresOptions, PostgresUrl, Ssl};

use crate::clock::Clock;
use crate::entropy::Entropy;
use crate::ledger::{Claimed, Ledger, LedgerError};
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use error::TxError;
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, ClaimRequest, Lease, OperatorRequest, Plan, PlanId, PlanSpec, Reply,
    WorkerRequest,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters of one ledger (shared by its clones) since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PostgresStats {
    /// Commands claimed.
    pub claims: u64,
    /// Candidates that were claimable when the claim read them but no longer once it
    /// held them (another claimer committed first): refused, never a double claim.
    pub lost_claim_races: u64,
    /// Transactions tried again after a serialization failure, a deadlock, a lock
    /// timeout or a connection lost before `COMMIT`.
    pub retries: u64,
}

#[derive(Debug, Default)]
struct Counters {
    claims: AtomicU64,
    lost_claim_races: AtomicU64,
    retries: AtomicU64,
}

/// A PostgreSQL ledger: a pool of sessions on one database. Clones share the pool
/// and the counters; any number of ledgers in any number of processes may use one
/// database at once.
#[derive(Clone)]
pub struct PostgresLedger {
    pool: Pool,
    url: Arc<PostgresUrl>,
    clock: Option<Arc<dyn Clock>>,
    entropy: Arc<dyn Entropy>,
    stats: Arc<Counters>,
    /// The wake-up listener's receiver, once a worker asked for it ([`notify`]).
    wake: Arc<std::sync::OnceLock<tokio::sync::watch::Receiver<u64>>>,
}

impl std::fmt::Debug for PostgresLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLedger")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl PostgresLedger {
    /// A ledger on `url`'s database. Connects lazily: an unreachable server shows on
    /// the first call, as `Unavailable`.
    pub fn open(url: &PostgresUrl, entropy: Arc<dyn Entropy>) -> Result<Self, LedgerError> {
        Self::build(url, None, entropy)
    }

    /// Like [`PostgresLedger::open`], but deciding leases on `clock` instead of the
    /// database's clock. For tests only (the conformance suite moves a manual clock);
    /// production must use the database's clock so that every machine agrees.
    pub fn open_with_clock(
        url: &PostgresUrl,
        clock: Arc<dyn Clock>,
        entropy: Arc<dyn Entropy>,
    ) -> Result<Self, LedgerError> {
        Self::build(url, Some(clock), entropy)
    }

    fn build(url: &PostgresUrl, clock: Option<Arc<dyn Clock>>, entropy: Arc<dyn Entropy>) -> Result<Self, LedgerError> {
        let manager = Manager::from_config(
            url.config().clone(),
            tls::connector(url.options.ssl == Ssl::VerifyFull)?,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let settings = url.options.session_settings();
        let pool = Pool::builder(manager)
            .max_size(url.options.pool_max)
            .wait_timeout(Some(url.options.connect_timeout()))
            .create_timeout(Some(url.options.connect_timeout()))
            .runtime(Runtime::Tokio1)
            .post_create(Hook::async_fn(move |client, _| {
                let settings = settings.clone();
                Box::pin(async move { client.batch_execute(&settings).await.map_err(HookError::Backend) })
            }))
            .build()
            .map_err(|e| LedgerError::Internal(format!("postgres pool: {e}")))?;
        Ok(Self {
            pool,
            url: Arc::new(url.clone()),
            clock,
            entropy,
            stats: Arc::new(Counters::default()),
            wake: Arc::new(std::sync::OnceLock::new()),
        })
    }

    /// The counters since this ledger was opened.
    pub fn stats(&self) -> PostgresStats {
        let c = &self.stats;
        PostgresStats {
            claims: c.claims.load(Ordering::Relaxed),
            lost_claim_races: c.lost_claim_races.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
        }
    }

    /// The URL this ledger connects to (its password never prints).
    pub fn url(&self) -> &PostgresUrl {
        &self.url
    }

    async fn connect(&self) -> Result<deadpool_postgres::Client, TxError> {
        self.pool
            .get()
            .await
            .map_err(|e| TxError::Ledger(error::pool_error(&self.url.to_string(), e)))
    }

    /// A pooled session, for the stores that share this pool's settings (the
    /// reference target's).
    pub(crate) async fn session(&self) -> Result<deadpool_postgres::Client, LedgerError> {
        self.connect().await.map_err(LedgerError::from)
    }

    /// Applies every pending migration; answers the versions applied now.
    pub async fn migrate(&self) -> Result<Vec<u32>, LedgerError> {
        self.retry(|| async {
            let mut client = self.connect().await?;
            schema::migrate(&mut client).await
        })
        .await
    }

    /// Refuses a database without the schema or with a newer one (see [`schema`]).
    pub async fn check_schema(&self) -> Result<(), LedgerError> {
        self.retry(|| async {
            let client = self.connect().await?;
            schema::check_schema(&client, &self.url.to_string()).await
        })
        .await
    }
}

impl Ledger for PostgresLedger {
    fn fuses_claims(&self) -> bool {
        true
    }

    async fn migrate(&self) -> Result<Vec<u32>, LedgerError> {
        PostgresLedger::migrate(self).await
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
            let client = self.connect().await?;
            rows::read_plan_rows(&client).await
        })
        .await
    }

    async fn plan_rows_newest_first(
        &self,
        before: Option<&PlanId>,
        limit: u32,
    ) -> Result<Vec<crate::ledger::listing::PlanRow>, LedgerError> {
        self.retry(|| async {
            let client = self.connect().await?;
            rows::read_plan_rows_newest_first(&client, before, limit).await
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
        if request.batch == 0 {
            return Ok(Vec::new());
        }
        self.retry(|| self.claim_once(&request)).await
    }

    async fn worker(&self, lease: &Lease, request: WorkerRequest) -> Result<Reply, LedgerError> {
        self.retry(|| self.worker_once(lease, &request)).await
    }

    async fn worker_then_claim(
        &self,
        lease: &Lease,
        request: WorkerRequest,
        claim: ClaimRequest,
    ) -> Result<(Reply, Vec<Claimed>), LedgerError> {
        if claim.batch == 0 {
            return Ok((self.worker(lease, request).await?, Vec::new()));
        }
        self.retry(|| self.worker_then_claim_once(lease, &request, &claim))
            .await
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

    async fn list_attempts(
        &self,
        query: &crate::ledger::listing::AttemptQuery,
    ) -> Result<crate::ledger::listing::AttemptPage, LedgerError> {
        self.retry(|| self.list_attempts_once(query)).await
    }

    /// The `LISTEN` session's wake-ups (`notify::listen`, started by the first
    /// call), unless the URL says `notify=0`.
    fn wake(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        if !self.url.options.notify {
            return None;
        }
        Some(self.wake.get_or_init(|| notify::listen(&self.url)).clone())
    }

    async fn check_ready(&self) -> Result<Vec<String>, LedgerError> {
        self.retry(|| async {
            let client = self.connect().await?;
            schema::check_ready(&client).await
        })
        .await
    }

    async fn count_attempts(&self, cap: u64) -> Result<crate::ledger::listing::AttemptCounts, LedgerError> {
        self.retry(|| self.count_attempts_once(cap)).await
    }
}

#[cfg(test)]
mod tests;
