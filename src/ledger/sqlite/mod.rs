//! The SQLite ledger.
//!
//! Contract: every transition is one `BEGIN IMMEDIATE` transaction (or, inside a group
//! commit, one savepoint of it) that reads its rows (attempt, command and receipts in
//! one statement; a claim reads its whole batch, plans included, in one statement per
//! partial index), lets the engine ([`leasehold_engine::transition`]) decide at the
//! ledger clock's `now` (read inside the transaction), and writes the engine's row
//! images with `UPDATE`s that set only the columns that change: the command row's
//! `UPDATE` goes first and carries the engine's [`leasehold_engine::Guard`] as its
//! `WHERE` clause, and zero affected rows is a refusal
//! ([`leasehold_engine::Refusal::StaleToken`]) that leaves every row as it was. (The
//! lock order of docs/design.md is about row locks; SQLite's write lock is the whole
//! database, taken by `BEGIN IMMEDIATE` before the first read.) A claim writes its
//! batch row by row with prepared statements, by key; each statement's text is built
//! once per set of changed columns. The schema's CHECK constraints are written as
//! `OR` chains (migration 3): SQLite evaluates an `IN` list of more than two
//! constants by building a temporary B-tree on every run. Reads
//! are consistent snapshots (one deferred transaction each). The semantics are those
//! of the reference [`super::memory::MemoryLedger`], call for call, including the order
//! in which ids and tokens are drawn from the entropy.
//!
//! Errors: SQLite busy or locked (after a 5 s busy timeout) is
//! [`LedgerError::Unavailable`]; a row that does not parse is
//! [`LedgerError::Integrity`]; anything else from SQLite is
//! [`LedgerError::Internal`]. Lease tokens are bound as parameters and never appear in
//! SQL text, errors or logs.
//!
//! Two faces: [`SqliteCore`] is synchronous over one connection (for the simulator's
//! single-threaded hosts); [`SqliteLedger`] is the async [`Ledger`] for production. It
//! sends every write to one writer thread that owns a core and runs the writes one
//! after the other, in arrival order, and runs reads on `spawn_blocking` over a small
//! pool of other cores (WAL readers never wait for the writer). SQLite admits one
//! writer at a time anyway: queueing a process's writes in memory instead of letting
//! them race for the file lock spares the busy handler's sleeps (1 ms and up while
//! the lock is free again within a few microseconds) and keeps the writer's
//! statements prepared. Group commit, merged claims and the checkpointer: the
//! `writer` module (`writer.rs`). The transitions themselves: [`SqliteCore`] (`transitions.rs`).
//! Writers in other processes still meet at the file lock and the busy timeout. (A
//! paused tokio clock does not know about the writer thread: it may auto-advance while a write is queued, as it would during any other I/O.) The
//! schema lives in `migrations/sqlite/` and is applied by `migrate()`
//! ([`super::migrate`]), never by opening.

pub mod open;
pub(crate) mod outbox;
pub(in crate::ledger) mod rows;
#[cfg(test)]
mod tests;
mod transitions;
mod writer;

pub use leasehold_engine::ClaimRequest;
pub use open::OpenMode;
pub use transitions::{SqliteCore, BUSY_TIMEOUT};
use writer::{Call, Job, Writer};
pub use writer::{GroupCall, WriterStats};

use super::fleet::WorkerRow;
use super::limits::TargetRow;
use super::listing::{AttemptCounts, AttemptPage, AttemptQuery, PlanRow};
use super::migrate;
use super::{Claimed, EnqueueRequest, Enqueued, Ledger, LedgerError};
use crate::clock::Clock;
use crate::entropy::Entropy;
use leasehold_engine::limits::TargetLimit;
use leasehold_engine::{
    AttemptId, AttemptRecord, Capabilities, Lease, OperatorRequest, Plan, PlanId, PlanSpec, Timestamp, WorkerRequest,
};
use std::sync::{Arc, Mutex, MutexGuard};

/// Idle connections a file-backed [`SqliteLedger`] keeps open for reads.
const POOL_IDLE_MAX: usize = 4;

/// Where a [`SqliteLedger`]'s reads run.
enum Pool {
    /// A private in-memory database exists only inside its one connection, which the
    /// writer thread owns: reads go to the writer too.
    Private,
    /// A file: idle read connections, taken one per read and opened on demand.
    File(Mutex<Vec<SqliteCore>>),
}

struct Shared {
    path: String,
    /// How the pool's further connections open (never creating the file again).
    mode: OpenMode,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
    pool: Pool,
    writer: Writer,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while a core was in use rolled its transaction back on unwind; the
    // core and the pool are still sound.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Runs a read on an idle pooled core (file databases only).
    fn with_core<T>(&self, f: impl FnOnce(&SqliteCore) -> Result<T, LedgerError>) -> Result<T, LedgerError> {
        match &self.pool {
            Pool::Private => Err(LedgerError::Internal("a private database has no read pool".into())),
            Pool::File(idle) => {
                let taken = lock(idle).pop();
                let core = match taken {
                    Some(core) => core,
                    None => SqliteCore::open_with(&self.path, self.mode, self.clock.clone(), self.entropy.clone())?,
                };
                let out = f(&core);
                let mut idle = lock(idle);
                if idle.len() < POOL_IDLE_MAX {
                    idle.push(core);
                }
                out
            }
        }
    }
}

/// The production SQLite ledger: an async [`Ledger`] whose writes run in order on one
/// writer thread's [`SqliteCore`] and whose reads run on a small pool of others, each
/// on `tokio::task::spawn_blocking`.
///
/// Clones share the writer and the pool; the writer thread ends (closing its
/// connection) when the last clone is dropped. Several ledgers (or processes) may open
/// the same file; `BEGIN IMMEDIATE` and the busy timeout serialize their transitions.
#[derive(Clone)]
pub struct SqliteLedger {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SqliteLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteLedger").finish_non_exhaustive()
    }
}

impl SqliteLedger {
    /// Opens the database at `path` (`":memory:"` for a private in-memory one, served
    /// by a single connection) without creating any table: call
    /// [`Ledger::migrate`] for that.
    pub fn open(path: &str, clock: Arc<dyn Clock>, entropy: Arc<dyn Entropy>) -> Result<Self, LedgerError> {
        Self::open_with(path, OpenMode::Create, clock, entropy)
    }

    /// [`SqliteLedger::open`] in `mode` ([`open`]): every connection is opened so,
    /// and the schema version is checked before anything else unless creating.
    pub fn open_with(
        path: &str,
        mode: OpenMode,
        clock: Arc<dyn Clock>,
        entropy: Arc<dyn Entropy>,
    ) -> Result<Self, LedgerError> {
        let first = SqliteCore::open_with(path, mode, clock.clone(), entropy.clone())?;
        let (pool, writer) = if transitions::is_private(path) {
            (Pool::Private, Writer::spawn(first, None)?)
        } else {
            // A read-only ledger's writer only ever answers refusals from SQLite,
            // and it needs no checkpointer.
            let checkpointer = match mode {
                OpenMode::ReadOnly => None,
                _ => Some(SqliteCore::open_with(path, mode, clock.clone(), entropy.clone())?),
            };
            let writer = Writer::spawn(
                SqliteCore::open_with(path, mode, clock.clone(), entropy.clone())?,
                checkpointer,
            )?;
            (Pool::File(Mutex::new(vec![first])), writer)
        };
        Ok(Self {
            shared: Arc::new(Shared {
                path: path.to_owned(),
                mode: match mode {
                    OpenMode::ReadOnly => OpenMode::ReadOnly,
                    OpenMode::Create | OpenMode::Existing => OpenMode::Existing,
                },
                clock,
                entropy,
                pool,
                writer,
            }),
        })
    }

    /// [`Ledger::migrate`] with `migrations`, recorded as written by release
    /// `written_by` ([`migrate::run`]); the rolling-upgrade tests play a newer
    /// release so.
    pub async fn migrate_as(
        &self,
        migrations: &'static [migrate::Migration],
        written_by: &'static str,
    ) -> Result<Vec<u32>, LedgerError> {
        // Alone: a migration switches foreign keys off, which only works outside a
        // transaction.
        self.write_job(move |core| core.migrate_as(migrations, written_by), true)
            .await
    }

    /// How the writer thread has grouped this ledger's writes so far (all clones
    /// share one writer).
    pub fn writer_stats(&self) -> WriterStats {
        self.shared.writer.stats()
    }

    /// Runs a write transition `f` on the writer thread, after the writes sent
    /// before it.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&SqliteCore) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        self.write_job(f, false).await
    }

    /// [`SqliteLedger::write`], alone (in no group) when `alone`.
    async fn write_job<T: Send + 'static>(
        &self,
        f: impl FnOnce(&SqliteCore) -> Result<T, LedgerError> + Send + 'static,
        alone: bool,
    ) -> Result<T, LedgerError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let call: Call = Box::new(move |core| {
            let out = f(core);
            Box::new(move |committed: Result<(), LedgerError>| {
                let _ = reply.send(match (out, committed) {
                    // Its writes are durable only if its group committed.
                    (Ok(_), Err(e)) => Err(e),
                    (out, _) => out,
                });
            })
        });
        let job = if alone { Job::Alone(call) } else { Job::Call(call) };
        self.send(job, answer).await
    }

    /// Runs a claim on the writer thread, merged with the claims waiting with it.
    async fn claim_on_writer(&self, request: ClaimRequest) -> Result<Vec<Claimed>, LedgerError> {
        if request.batch == 0 {
            return Ok(Vec::new());
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.send(Job::Claim(request, reply), answer).await
    }

    /// Sends `job` to the writer thread and waits for its `answer`.
    async fn send<T>(
        &self,
        job: Job,
        answer: tokio::sync::oneshot::Receiver<Result<T, LedgerError>>,
    ) -> Result<T, LedgerError> {
        let sent = self.shared.writer.jobs.as_ref().map(|jobs| jobs.send(job));
        if !matches!(sent, Some(Ok(()))) {
            return Err(LedgerError::Internal("the sqlite writer thread is gone".into()));
        }
        answer
            .await
            .map_err(|_| LedgerError::Internal("sqlite task did not complete".into()))?
    }

    /// Runs `f` on the writer thread's connection, after the writes sent before it:
    /// for stores kept beside the ledger's tables ([`crate::tokens`]). `f` must not
    /// write the attempt, command or receipt tables: the writer keeps the records of
    /// the attempts it wrote and trusts them while no other connection commits.
    #[cfg(feature = "cli")]
    pub(crate) async fn write_with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        self.write(move |core| f(core.raw_connection())).await
    }

    /// Runs a read `f` on a pooled connection, like the ledger's own reads.
    pub(crate) async fn read_with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        self.run(move |core| f(core.raw_connection())).await
    }

    /// Runs a read `f` on a pooled core on tokio's blocking pool (on the writer
    /// thread for a private database, whose one connection it owns).
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&SqliteCore) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        if matches!(self.shared.pool, Pool::Private) {
            return self.write(f).await;
        }
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || shared.with_core(f))
            .await
            .map_err(|e| LedgerError::Internal(format!("sqlite task did not complete: {e}")))?
    }
}

impl Ledger for SqliteLedger {
    fn fuses_claims(&self) -> bool {
        true
    }

    async fn migrate(&self) -> Result<Vec<u32>, LedgerError> {
        self.migrate_as(migrate::SQLITE, migrate::RELEASE).await
    }

    async fn schema_notice(&self) -> Result<Option<String>, LedgerError> {
        let path = self.shared.path.clone();
        self.read_with(move |conn| open::schema_notice(conn, &path)).await
    }

    async fn register_plan(&self, spec: PlanSpec, known_executors: &[&str]) -> Result<Plan, LedgerError> {
        let known: Vec<String> = known_executors.iter().map(|s| (*s).to_owned()).collect();
        self.write(move |core| {
            let known: Vec<&str> = known.iter().map(String::as_str).collect();
            core.register_plan(spec, &known)
        })
        .await
    }

    async fn plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        let id = id.clone();
        self.run(move |core| core.plan(&id)).await
    }

    async fn list_plans(&self) -> Result<Vec<Plan>, LedgerError> {
        self.run(|core| core.list_plans()).await
    }

    async fn plans_named(&self, name: &str) -> Result<Vec<Plan>, LedgerError> {
        let name = name.to_owned();
        self.run(move |core| core.plans_named(&name)).await
    }

    async fn plans_newest_first(&self, before: Option<&PlanId>, limit: u32) -> Result<Vec<Plan>, LedgerError> {
        let before = before.cloned();
        self.run(move |core| core.plans_newest_first(before.as_ref(), limit))
            .await
    }

    async fn list_plan_rows(&self) -> Result<Vec<PlanRow>, LedgerError> {
        self.run(|core| core.plan_rows()).await
    }

    async fn plan_rows_newest_first(&self, before: Option<&PlanId>, limit: u32) -> Result<Vec<PlanRow>, LedgerError> {
        let before = before.cloned();
        self.run(move |core| core.plan_rows_newest_first(before.as_ref(), limit))
            .await
    }

    async fn retire_plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        let id = id.clone();
        self.write(move |core| core.retire_plan(&id)).await
    }

    async fn enqueue_with(&self, plan: &PlanId, request: EnqueueRequest) -> Result<Enqueued, LedgerError> {
        let plan = plan.clone();
        self.write(move |core| core.enqueue_with(&plan, request)).await
    }

    async fn claim_batch(&self, request: ClaimRequest) -> Result<Vec<Claimed>, LedgerError> {
        self.claim_on_writer(request).await
    }

    async fn worker(&self, lease: &Lease, request: WorkerRequest) -> Result<leasehold_engine::Reply, LedgerError> {
        let lease = lease.clone();
        self.write(move |core| core.worker(&lease, request)).await
    }

    async fn worker_then_claim(
        &self,
        lease: &Lease,
        request: WorkerRequest,
        claim: ClaimRequest,
    ) -> Result<(leasehold_engine::Reply, Vec<Claimed>), LedgerError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = writer::ThenJob {
            lease: lease.clone(),
            request,
            claim,
            reply,
        };
        self.send(Job::Then(Box::new(job)), answer).await
    }

    async fn operator(
        &self,
        attempt: &AttemptId,
        request: OperatorRequest,
    ) -> Result<(leasehold_engine::Reply, AttemptRecord), LedgerError> {
        let attempt = attempt.clone();
        self.write(move |core| core.operator(&attempt, request)).await
    }

    async fn attempt(&self, attempt: &AttemptId) -> Result<AttemptRecord, LedgerError> {
        let attempt = attempt.clone();
        self.run(move |core| core.attempt(&attempt)).await
    }

    async fn history(&self, plan: &PlanId) -> Result<Vec<AttemptRecord>, LedgerError> {
        let plan = plan.clone();
        self.run(move |core| core.history(&plan)).await
    }

    async fn open_attempts(&self) -> Result<u64, LedgerError> {
        self.run(|core| core.open_attempts()).await
    }

    async fn open_attempts_for(&self, capabilities: &Capabilities) -> Result<u64, LedgerError> {
        let capabilities = capabilities.clone();
        self.run(move |core| core.open_attempts_for(&capabilities)).await
    }

    async fn report_worker(&self, id: &str, capabilities: &Capabilities, starting: bool) -> Result<(), LedgerError> {
        let (id, capabilities) = (id.to_owned(), capabilities.clone());
        self.write(move |core| core.report_worker(&id, &capabilities, starting))
            .await
    }

    async fn workers(&self) -> Result<(Vec<WorkerRow>, Timestamp), LedgerError> {
        self.run(|core| core.workers()).await
    }

    async fn set_limit(&self, limit: TargetLimit) -> Result<(), LedgerError> {
        crate::ledger::checked_limit(&limit)?;
        self.write(move |core| core.set_limit(&limit)).await
    }

    async fn clear_limit(&self, target: &str) -> Result<bool, LedgerError> {
        let target = target.to_owned();
        self.write(move |core| core.clear_limit(&target)).await
    }

    async fn limits(&self) -> Result<(Vec<TargetRow>, Timestamp), LedgerError> {
        self.run(|core| core.limits()).await
    }

    // The console's reads ([`crate::ledger::sql::listing`]).
    async fn list_attempts(&self, query: &AttemptQuery) -> Result<AttemptPage, LedgerError> {
        let query = query.clone();
        self.run(move |core| core.list_attempts(&query)).await
    }

    async fn count_attempts(&self, cap: u64) -> Result<AttemptCounts, LedgerError> {
        self.run(move |core| core.count_attempts(cap)).await
    }

    async fn prune_keep(&self, plan: &PlanId) -> Result<super::prune::Keep, LedgerError> {
        let plan = plan.clone();
        self.run(move |core| core.prune_keep(&plan)).await
    }

    async fn prunable(&self, query: &super::prune::PruneQuery) -> Result<Vec<AttemptRecord>, LedgerError> {
        let query = query.clone();
        self.run(move |core| core.prunable(&query)).await
    }

    async fn delete_attempts(&self, ids: &[AttemptId]) -> Result<u64, LedgerError> {
        let ids = ids.to_vec();
        self.write(move |core| core.delete_attempts(&ids)).await
    }

    async fn check_ready(&self) -> Result<Vec<String>, LedgerError> {
        match self.read_with(rows::check_ready).await {
            // A read connection could not open: the file's schema is refused (its
            // message names the file, which the answer does not).
            Err(LedgerError::BadInput(m)) => {
                tracing::warn!(error = %crate::text::clean(&m), "ledger not ready");
                Ok(vec![
                    "the ledger's schema is missing or newer than this binary's (the server log has the cause)".into(),
                ])
            }
            other => other,
        }
    }
}
