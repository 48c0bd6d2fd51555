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
//! lock order of DESIGN.md is about row locks; SQLite's write lock is the whole
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
//! statements prepared. The writes waiting together run in one transaction, each in
//! its own savepoint (group commit, [`SqliteCore::group`]): a failing call rolls back
//! only its own writes, every reply is sent only after the group's `COMMIT`, and a
//! failed `COMMIT` fails every call of the group. The claims of a group run merged, as
//! one [`SqliteCore::claim_many`] at the first claim's place: one candidate read for
//! all of them, each taking exactly what it would have taken alone (the calls of a
//! group are all unanswered, so that order is one they could have run in). An idle
//! writer polls its queue for 50 µs before it parks. A migration runs alone, outside
//! any group. A checkpointer thread with its own
//! connection runs the WAL checkpoints (`PASSIVE`, then `RESTART` past 16,384
//! pages), so the writer's commits never copy pages back or wait for an fsync.
//! Writers in other processes still meet at the file lock and the busy timeout. (A paused tokio clock does not know about the writer thread: it
//! may auto-advance while a write is queued, as it would during any other I/O.) The
//! schema lives in `migrations/sqlite/` and is applied by `migrate()`
//! ([`super::migrate`]), never by opening.

mod connection;
mod listing;
pub mod open;
pub(crate) mod outbox;
pub(in crate::ledger) mod rows;
#[cfg(test)]
mod tests;

pub use connection::{GroupCall, SqliteCore, BUSY_TIMEOUT};
pub use leasehold_engine::ClaimRequest;
pub use open::OpenMode;

use super::listing::{AttemptCounts, AttemptPage, AttemptQuery};
use super::{Claimed, Ledger, LedgerError};
use crate::clock::Clock;
use crate::entropy::Entropy;
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, Lease, OperatorRequest, Plan, PlanId, PlanSpec, WorkerRequest,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

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

/// A call that runs on the writer's core and answers how to send its result once the
/// group it ran in has committed (or failed to).
type Call = Box<dyn FnOnce(&SqliteCore) -> Reply + Send>;

/// A call for the writer thread.
enum Job {
    /// A call, grouped with the others waiting.
    Call(Call),
    /// A call that runs alone, outside any group (a migration).
    Alone(Call),
    /// A claim: the claims of one group run together ([`SqliteCore::claim_many`]).
    Claim(ClaimRequest, ClaimReply),
}
/// Where a merged claim's result goes.
type ClaimReply = tokio::sync::oneshot::Sender<Result<Vec<Claimed>, LedgerError>>;

/// What the writer runs as one call of a group: one call, or all the claims of the
/// group merged.
enum Unit {
    Call(Call),
    Claims(Vec<(ClaimRequest, ClaimReply)>),
}

impl Unit {
    /// Runs the unit; answers how to send its results once its group has committed.
    fn run(self, core: &SqliteCore) -> Reply {
        match self {
            Unit::Call(call) => call(core),
            Unit::Claims(claims) => {
                let (requests, replies): (Vec<_>, Vec<_>) = claims.into_iter().unzip();
                let out = core.claim_many(&requests);
                Box::new(move |committed: Result<(), LedgerError>| {
                    let results: Vec<Result<Vec<Claimed>, LedgerError>> = match (out, committed) {
                        (Ok(claimed), Ok(())) => claimed.into_iter().map(Ok).collect(),
                        // Their writes are durable only if the group committed.
                        (Ok(_), Err(e)) | (Err(e), _) => replies.iter().map(|_| Err(e.clone())).collect(),
                    };
                    for (reply, result) in replies.into_iter().zip(results) {
                        let _ = reply.send(result);
                    }
                })
            }
        }
    }
}

/// Gathers a group's jobs into units: every claim joins the group's one
/// [`Unit::Claims`], placed where the first claim came. The calls of a group are
/// concurrent (none has been answered when the group starts), so any order of them
/// is one they could have run in.
fn units(jobs: Vec<Job>) -> Vec<Unit> {
    let mut units = Vec::with_capacity(jobs.len());
    let mut claims_at = None;
    for job in jobs {
        match job {
            Job::Call(call) | Job::Alone(call) => units.push(Unit::Call(call)),
            Job::Claim(request, reply) => match claims_at {
                Some(i) => {
                    if let Some(Unit::Claims(claims)) = units.get_mut(i) {
                        claims.push((request, reply));
                    }
                }
                None => {
                    claims_at = Some(units.len());
                    units.push(Unit::Claims(vec![(request, reply)]));
                }
            },
        }
    }
    units
}
/// Sends a call's result, given its group's commit outcome.
type Reply = Box<dyn FnOnce(Result<(), LedgerError>) + Send>;

/// The most calls the writer commits in one group.
const MAX_GROUP: usize = 64;
/// The writer asks for a checkpoint after this many commits: at 4 to 5 pages per
/// transition, about SQLite's own default of a checkpoint per 1,000 WAL pages. Each
/// checkpoint fsyncs the database file; asking every 32 commits cost one-step
/// deliveries at batch 5 about a tenth of their throughput (the checkpointer
/// competes for the cores with the callers).
const CHECKPOINT_EVERY: u64 = 256;
/// A WAL longer than this (pages) after a passive checkpoint gets a `RESTART`
/// checkpoint, which waits for the writer: the bound on the WAL's growth when
/// passive checkpoints cannot keep up.
const WAL_MAX_FRAMES: i64 = 16_384;

/// The checkpointer thread of a file database: runs the WAL checkpoints the writer
/// asks for on its own connection, so that their copying and fsyncs happen beside
/// the writer instead of inside one of its commits.
struct Checkpointer {
    wake: Option<mpsc::SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    fn spawn(core: SqliteCore) -> Result<Self, LedgerError> {
        // One pending request is enough: requests made while one waits add nothing.
        let (wake, asked) = mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("leasehold-sqlite-checkpointer".into())
            .spawn(move || {
                while asked.recv().is_ok() {
                    // A failed checkpoint (another process busy) is tried again at
                    // the next request; the writer's commits never depend on it.
                    let _ = core.checkpoint(WAL_MAX_FRAMES);
                }
            })
            .map_err(|e| LedgerError::Internal(format!("cannot start the sqlite checkpointer thread: {e}")))?;
        Ok(Self {
            wake: Some(wake),
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.wake.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer thread: owns one core and runs the jobs sent to it in order, the jobs
/// waiting together in one transaction (group commit, [`SqliteCore::group`]). With a
/// checkpointer, the writer's own connection never checkpoints: it wakes the
/// checkpointer every [`CHECKPOINT_EVERY`] commits.
struct Writer {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Counters>,
}

/// What the writer thread has done, counted as it goes.
#[derive(Default)]
struct Counters {
    groups: AtomicU64,
    calls: AtomicU64,
}

/// How a [`SqliteLedger`]'s writer thread grouped the writes it ran (see
/// [`SqliteLedger::writer_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions the writer committed (or tried to): one per group.
    pub groups: u64,
    /// Calls it ran in them (every write, and the reads of a private database).
    pub calls: u64,
}

impl WriterStats {
    /// Calls per committed transaction (1 means no grouping happened).
    pub fn calls_per_group(&self) -> f64 {
        if self.groups == 0 {
            0.0
        } else {
            self.calls as f64 / self.groups as f64
        }
    }
}

impl Writer {
    fn spawn(core: SqliteCore, checkpointer: Option<SqliteCore>) -> Result<Self, LedgerError> {
        let checkpointer = match checkpointer {
            Some(other) => {
                core.disable_autocheckpoint()?;
                Some(Checkpointer::spawn(other)?)
            }
            None => None,
        };
        let (jobs, queue) = mpsc::channel::<Job>();
        let stats = Arc::new(Counters::default());
        let counters = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("leasehold-sqlite-writer".into())
            .spawn(move || {
                let mut commits = 0u64;
                // A call that must run alone, received while gathering a group.
                let mut held: Option<Job> = None;
                loop {
                    let first = match held.take() {
                        Some(job) => job,
                        None => match next_job(&queue) {
                            Ok(job) => job,
                            Err(_) => break,
                        },
                    };
                    // Group commit: the calls already waiting join the first one.
                    let mut jobs = vec![first];
                    while jobs.len() < MAX_GROUP && !matches!(jobs[0], Job::Alone(_)) {
                        match queue.try_recv() {
                            Ok(job @ Job::Alone(_)) => {
                                held = Some(job);
                                break;
                            }
                            Ok(job) => jobs.push(job),
                            Err(_) => break,
                        }
                    }
                    counters.groups.fetch_add(1, Ordering::Relaxed);
                    counters.calls.fetch_add(jobs.len() as u64, Ordering::Relaxed);
                    let calls: Vec<GroupCall<'_, Option<Reply>>> = units(jobs)
                        .into_iter()
                        .map(|unit| {
                            Box::new(move |core: &SqliteCore| {
                                // A panicking unit loses only its own replies (its
                                // callers see an internal error); its transaction
                                // or savepoint rolled back on unwind.
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unit.run(core))).ok()
                            }) as GroupCall<'_, Option<Reply>>
                        })
                        .collect();
                    for (reply, committed) in core.group(calls) {
                        if let Some(reply) = reply {
                            reply(committed);
                        }
                    }
                    commits += 1;
                    if commits % CHECKPOINT_EVERY == 0 {
                        if let Some(Checkpointer { wake: Some(wake), .. }) = &checkpointer {
                            let _ = wake.try_send(());
                        }
                    }
                }
                // The checkpointer ends before the writer's connection closes (the
                // last connection to close checkpoints the WAL into the file).
                drop(checkpointer);
            })
            .map_err(|e| LedgerError::Internal(format!("cannot start the sqlite writer thread: {e}")))?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
            stats,
        })
    }
}

/// How long the writer thread polls its empty queue before it parks: callers
/// answered by the group just committed usually send their next call within a few
/// microseconds, and catching it without parking spares the writer a futex wait and
/// a context switch, and the caller a futex wake.
const SPIN_BEFORE_PARK: std::time::Duration = std::time::Duration::from_micros(50);

/// The writer's next job: polls its empty queue for [`SPIN_BEFORE_PARK`], then
/// blocks.
fn next_job(queue: &mpsc::Receiver<Job>) -> Result<Job, mpsc::RecvError> {
    let mut since: Option<std::time::Instant> = None;
    loop {
        match queue.try_recv() {
            Ok(job) => return Ok(job),
            Err(mpsc::TryRecvError::Disconnected) => return Err(mpsc::RecvError),
            Err(mpsc::TryRecvError::Empty) => {}
        }
        if since.get_or_insert_with(std::time::Instant::now).elapsed() >= SPIN_BEFORE_PARK {
            return queue.recv();
        }
        std::hint::spin_loop();
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has run what was sent; joining it
        // closes its connection (checkpointing the WAL) before the ledger is gone.
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
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
        let (pool, writer) = if connection::is_private(path) {
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

    /// How the writer thread has grouped this ledger's writes so far (all clones
    /// share one writer).
    pub fn writer_stats(&self) -> WriterStats {
        let stats = &self.shared.writer.stats;
        WriterStats {
            groups: stats.groups.load(Ordering::Relaxed),
            calls: stats.calls.load(Ordering::Relaxed),
        }
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
    /// for stores kept beside the ledger's tables ([`crate::tokens`]).
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
    async fn migrate(&self) -> Result<Vec<u32>, LedgerError> {
        // Alone: a migration switches foreign keys off, which only works outside a
        // transaction.
        self.write_job(|core| core.migrate(), true).await
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

    async fn retire_plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        let id = id.clone();
        self.write(move |core| core.retire_plan(&id)).await
    }

    async fn enqueue(&self, plan: &PlanId, action: Action) -> Result<AttemptRecord, LedgerError> {
        let plan = plan.clone();
        self.write(move |core| core.enqueue(&plan, action)).await
    }

    async fn claim_batch(&self, request: ClaimRequest) -> Result<Vec<Claimed>, LedgerError> {
        self.claim_on_writer(request).await
    }

    async fn worker(&self, lease: &Lease, request: WorkerRequest) -> Result<leasehold_engine::Reply, LedgerError> {
        let lease = lease.clone();
        self.write(move |core| core.worker(&lease, request)).await
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

    // The console's reads ([`listing`]).
    async fn list_attempts(&self, query: &AttemptQuery) -> Result<AttemptPage, LedgerError> {
        let query = query.clone();
        self.read_with(move |conn| listing::list_attempts(conn, &query)).await
    }

    async fn count_attempts(&self, cap: u64) -> Result<AttemptCounts, LedgerError> {
        self.read_with(move |conn| listing::count_attempts(conn, cap)).await
    }
}
