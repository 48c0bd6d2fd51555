//! Enqueue in the caller's own transaction: the transactional outbox.
//!
//! An application that writes a business row (an order) and must deliver something
//! because of it (push the order to a CRM) writes both in **one** transaction of its
//! own: [`Outbox::enqueue_sqlite`] (a `rusqlite` transaction),
//! [`Outbox::enqueue_mysql`] (a `mysql_async` transaction) or
//! [`Outbox::enqueue_postgres`] (a `tokio_postgres` transaction) writes the attempt,
//! its receipts and its outbox command with the ledger's own row code, inside that
//! transaction, and commits nothing. If the caller commits, the business row and the
//! command are durable together and a [`crate::worker::Worker`] on the same database
//! delivers the command; if it rolls back, neither exists. [`Outbox::register_plan_sqlite`],
//! [`Outbox::register_plan_mysql`] and [`Outbox::register_plan_postgres`] register a
//! plan in the same transaction: one template whose step payloads refer to each
//! attempt's input ([`crate::ledger::EnqueueRequest::with_input`], docs/templates.md).
//!
//! Contract:
//! - the database must hold a ledger schema this release can use: the same check as
//!   every open ([`crate::ledger::migrate::check_version`]), so a database never
//!   migrated, or migrated by a newer release to a schema this release may not run
//!   on, is refused with [`LedgerError::BadInput`] before anything is read or written;
//! - the engine decides, exactly as for [`crate::ledger::Ledger::enqueue`]: the plan
//!   must exist ([`LedgerError::NotFound`]) and be READY, with no attempt still open
//!   for `execute` unless it is a template ([`LedgerError::Refused`]), and a
//!   template's input must fit its `[input]` table ([`LedgerError::BadInput`]);
//! - each call runs under a savepoint of the caller's transaction: when it fails,
//!   nothing of it is left in the transaction, and the caller's own writes stay as
//!   they were (the caller decides whether to commit them anyway; on PostgreSQL the
//!   savepoint also keeps a failed statement from aborting the caller's transaction);
//! - time: on SQLite the ledger's clock is the system clock, as for
//!   [`crate::ledger::sqlite::SqliteLedger`] in production; on MySQL it is the
//!   database's (`UTC_TIMESTAMP(6)`, whatever the session's time zone), read
//!   inside the transaction; on PostgreSQL too (`clock_timestamp()`, as the
//!   PostgreSQL ledger reads it). [`Outbox::with_clock`] replaces any of them
//!   (tests). Ids come from the OS's randomness unless [`Outbox::with_entropy`] says
//!   otherwise;
//! - on PostgreSQL an enqueue also sends the ledger's `NOTIFY` in the transaction,
//!   which PostgreSQL delivers only if the caller commits: idle workers wake at once.
//!
//! The transaction must be on the database the workers use, with the ledger's tables
//! (`leasehold migrate`). On SQLite, begin it with
//! [`rusqlite::TransactionBehavior::Immediate`] and give the connection a busy timeout:
//! a deferred transaction that reads before it writes fails with `SQLITE_BUSY` when
//! another connection (a worker) wrote in between. On MySQL, enqueue before other
//! plain reads of a REPEATABLE READ transaction, or use READ COMMITTED: an enqueue
//! whose snapshot misses an attempt committed since is refused. On PostgreSQL, the
//! same: a REPEATABLE READ or SERIALIZABLE transaction's snapshot is fixed by its
//! first statement, and an enqueue deciding on one that misses an attempt committed
//! since is refused ([`LedgerError::BadInput`]; a serialization failure is
//! [`LedgerError::Unavailable`]), nothing written.
//!
//! ```
//! use leasehold::engine::{Action, PlanSpec};
//! use leasehold::executor::Executors;
//! use leasehold::ledger::EnqueueRequest;
//! use leasehold::outbox::Outbox;
//! use leasehold::outbox::rusqlite::{Connection, TransactionBehavior};
//! # use leasehold::ledger::{Ledger, sqlite::SqliteLedger};
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("shop.db");
//! # let path = path.to_str().unwrap();
//! # let rt = tokio::runtime::Runtime::new()?;
//! # rt.block_on(async {
//! #     let ledger = SqliteLedger::open(path, std::sync::Arc::new(leasehold::clock::SystemClock),
//! #         std::sync::Arc::new(leasehold::entropy::OsEntropy))?;
//! #     ledger.migrate().await
//! # })?;
//!
//! let mut conn = Connection::open(path)?;
//! conn.busy_timeout(std::time::Duration::from_secs(5))?;
//! conn.execute_batch("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total_cents INTEGER)")?;
//! let outbox = Outbox::new();
//! let executors = Executors::new(); // the workers' registry
//! let spec: PlanSpec = serde_json::from_value(serde_json::json!({
//!     "name": "deliver-order",
//!     "recovery": "resume",
//!     "input": {"order": {"type": "string", "required": true}},
//!     "steps": [{"code": "notify", "executor": "dry-run:v1", "payload": {"order": {"$input": "/order"}}}],
//! }))?;
//!
//! let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
//! tx.execute("INSERT INTO orders (id, total_cents) VALUES ('o-1', 4200)", [])?;
//! let plan = outbox.register_plan_sqlite(&tx, spec, &executors.names())?;
//! let input = serde_json::json!({"order": "o-1"});
//! let request = EnqueueRequest::new(Action::Execute).with_input(Some(input));
//! let record = outbox.enqueue_sqlite_with(&tx, &plan.id, request)?.record;
//! tx.commit()?; // the order and its delivery, together
//! assert_eq!(record.receipts[0].payload.as_deref(), Some(r#"{"order":"o-1"}"#));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::clock::Clock;
#[cfg(feature = "sqlite")]
use crate::clock::SystemClock;
use crate::entropy::{Entropy, OsEntropy};
#[cfg(feature = "mysql")]
use crate::ledger::mysql::outbox as mysql;
#[cfg(feature = "postgres")]
use crate::ledger::postgres::outbox as postgres;
#[cfg(feature = "sqlite")]
use crate::ledger::sqlite::outbox as sqlite;
use crate::ledger::{EnqueueRequest, Enqueued, LedgerError};
use leasehold_engine::transition::Start;
use leasehold_engine::{Action, AttemptRecord, Plan, PlanId, PlanSpec};
use std::fmt;
use std::sync::Arc;

/// The `mysql_async` this crate is built with: its transactions are what
/// [`Outbox::enqueue_mysql`] takes.
#[cfg(feature = "mysql")]
pub use mysql_async;
/// The `rusqlite` this crate is built with: its connections and transactions are
/// what [`Outbox::enqueue_sqlite`] takes.
#[cfg(feature = "sqlite")]
pub use rusqlite;
/// The `tokio_postgres` this crate is built with: its transactions are what
/// [`Outbox::enqueue_postgres`] takes (a `deadpool_postgres::Transaction` derefs to one).
#[cfg(feature = "postgres")]
pub use tokio_postgres;

/// Writes plans and attempts inside the caller's own transaction (see the
/// [module](self) documentation). Cheap to clone; holds no connection.
#[derive(Clone)]
pub struct Outbox {
    /// `None`: the ledger's own clock (the system's for SQLite, the database's for
    /// MySQL and PostgreSQL).
    clock: Option<Arc<dyn Clock>>,
    entropy: Arc<dyn Entropy>,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("clock", &if self.clock.is_some() { "given" } else { "ledger" })
            .finish_non_exhaustive()
    }
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Outbox {
    /// An outbox deciding on the ledger's clock and minting ids from the OS.
    pub fn new() -> Self {
        Self {
            clock: None,
            entropy: Arc::new(OsEntropy),
        }
    }

    /// Decides on `clock` instead of the ledger's (tests; production keeps the
    /// ledger's, which is what the workers' leases are decided on).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Mints ids from `entropy` instead of the OS (deterministic tests).
    pub fn with_entropy(mut self, entropy: Arc<dyn Entropy>) -> Self {
        self.entropy = entropy;
        self
    }

    #[cfg(feature = "sqlite")]
    fn sqlite_now(&self) -> leasehold_engine::Timestamp {
        match &self.clock {
            Some(clock) => clock.now(),
            None => SystemClock.now(),
        }
    }

    /// Validates `spec` against `known_executors` (a worker's
    /// [`crate::executor::Executors::names`]) and registers it inside the caller's
    /// SQLite transaction (pass `&tx`; any connection inside a transaction or
    /// savepoint will do). Content that a READY plan already has answers that plan.
    /// Nothing is committed.
    #[cfg(feature = "sqlite")]
    pub fn register_plan_sqlite(
        &self,
        tx: &rusqlite::Connection,
        spec: PlanSpec,
        known_executors: &[&str],
    ) -> Result<Plan, LedgerError> {
        sqlite::register_plan(tx, spec, known_executors, &*self.entropy, self.sqlite_now())
    }

    /// Enqueues an attempt of `plan` inside the caller's SQLite transaction (pass
    /// `&tx`): the attempt QUEUED, its receipts PENDING and its command PENDING,
    /// available now. Nothing is committed: they become durable, and claimable by
    /// workers, when the caller commits, and vanish if it rolls back.
    #[cfg(feature = "sqlite")]
    pub fn enqueue_sqlite(
        &self,
        tx: &rusqlite::Connection,
        plan: &PlanId,
        action: Action,
    ) -> Result<AttemptRecord, LedgerError> {
        self.enqueue_sqlite_at(tx, plan, action, Start::Now)
    }

    /// [`Outbox::enqueue_sqlite`] with the command claimable from `start` (an
    /// instant already past means at once).
    #[cfg(feature = "sqlite")]
    pub fn enqueue_sqlite_at(
        &self,
        tx: &rusqlite::Connection,
        plan: &PlanId,
        action: Action,
        start: Start,
    ) -> Result<AttemptRecord, LedgerError> {
        Ok(self
            .enqueue_sqlite_with(tx, plan, EnqueueRequest::new(action).at(start))?
            .record)
    }

    /// [`Outbox::enqueue_sqlite`] of the attempt `request` describes: its action, when
    /// its command becomes claimable, the trace (`traceparent`) it joins, and its
    /// enqueue key: with the key of an earlier enqueue of the same request, it
    /// answers that attempt (`created: false`) and writes nothing.
    #[cfg(feature = "sqlite")]
    pub fn enqueue_sqlite_with(
        &self,
        tx: &rusqlite::Connection,
        plan: &PlanId,
        request: EnqueueRequest,
    ) -> Result<Enqueued, LedgerError> {
        sqlite::enqueue(tx, plan, request, &*self.entropy, self.sqlite_now())
    }

    /// [`Outbox::register_plan_sqlite`] inside the caller's MySQL / MariaDB
    /// transaction, at the database's clock.
    #[cfg(feature = "mysql")]
    pub async fn register_plan_mysql(
        &self,
        tx: &mut mysql_async::Transaction<'_>,
        spec: PlanSpec,
        known_executors: &[&str],
    ) -> Result<Plan, LedgerError> {
        mysql::register_plan(tx, spec, known_executors, &*self.entropy, self.clock.as_deref()).await
    }

    /// [`Outbox::enqueue_sqlite`] inside the caller's MySQL / MariaDB transaction: the
    /// plan row is locked first, and the attempt is available at the database's now.
    #[cfg(feature = "mysql")]
    pub async fn enqueue_mysql(
        &self,
        tx: &mut mysql_async::Transaction<'_>,
        plan: &PlanId,
        action: Action,
    ) -> Result<AttemptRecord, LedgerError> {
        self.enqueue_mysql_at(tx, plan, action, Start::Now).await
    }

    /// [`Outbox::enqueue_mysql`] with the command claimable from `start` (by the
    /// database's clock; an instant already past means at once).
    #[cfg(feature = "mysql")]
    pub async fn enqueue_mysql_at(
        &self,
        tx: &mut mysql_async::Transaction<'_>,
        plan: &PlanId,
        action: Action,
        start: Start,
    ) -> Result<AttemptRecord, LedgerError> {
        let request = EnqueueRequest::new(action).at(start);
        Ok(self.enqueue_mysql_with(tx, plan, request).await?.record)
    }

    /// [`Outbox::enqueue_mysql`] of the attempt `request` describes: its action, when
    /// its command becomes claimable, the trace (`traceparent`) it joins, and its
    /// enqueue key: with the key of an earlier enqueue of the same request, it
    /// answers that attempt (`created: false`) and writes nothing.
    #[cfg(feature = "mysql")]
    pub async fn enqueue_mysql_with(
        &self,
        tx: &mut mysql_async::Transaction<'_>,
        plan: &PlanId,
        request: EnqueueRequest,
    ) -> Result<Enqueued, LedgerError> {
        mysql::enqueue(tx, plan, request, &*self.entropy, self.clock.as_deref()).await
    }

    /// [`Outbox::register_plan_sqlite`] inside the caller's PostgreSQL transaction
    /// (pass `&mut tx`; a `deadpool_postgres::Transaction` derefs to one), at the
    /// database's clock.
    #[cfg(feature = "postgres")]
    pub async fn register_plan_postgres(
        &self,
        tx: &mut tokio_postgres::Transaction<'_>,
        spec: PlanSpec,
        known_executors: &[&str],
    ) -> Result<Plan, LedgerError> {
        postgres::register_plan(tx, spec, known_executors, &*self.entropy, self.clock.as_deref()).await
    }

    /// [`Outbox::enqueue_sqlite`] inside the caller's PostgreSQL transaction: the plan
    /// row is locked first, the attempt is available at the database's now, and idle
    /// workers are notified when (and only if) the caller commits.
    #[cfg(feature = "postgres")]
    pub async fn enqueue_postgres(
        &self,
        tx: &mut tokio_postgres::Transaction<'_>,
        plan: &PlanId,
        action: Action,
    ) -> Result<AttemptRecord, LedgerError> {
        self.enqueue_postgres_at(tx, plan, action, Start::Now).await
    }

    /// [`Outbox::enqueue_postgres`] with the command claimable from `start` (by the
    /// database's clock; an instant already past means at once).
    #[cfg(feature = "postgres")]
    pub async fn enqueue_postgres_at(
        &self,
        tx: &mut tokio_postgres::Transaction<'_>,
        plan: &PlanId,
        action: Action,
        start: Start,
    ) -> Result<AttemptRecord, LedgerError> {
        let request = EnqueueRequest::new(action).at(start);
        Ok(self.enqueue_postgres_with(tx, plan, request).await?.record)
    }

    /// [`Outbox::enqueue_postgres`] of the attempt `request` describes: its action, when
    /// its command becomes claimable, the trace (`traceparent`) it joins, and its
    /// enqueue key: with the key of an earlier enqueue of the same request, it
    /// answers that attempt (`created: false`) and writes nothing.
    #[cfg(feature = "postgres")]
    pub async fn enqueue_postgres_with(
        &self,
        tx: &mut tokio_postgres::Transaction<'_>,
        plan: &PlanId,
        request: EnqueueRequest,
    ) -> Result<Enqueued, LedgerError> {
        postgres::enqueue(tx, plan, request, &*self.entropy, self.clock.as_deref()).await
    }
}
