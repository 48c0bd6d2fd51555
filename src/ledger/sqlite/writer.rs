//! The SQLite writer thread: one connection that runs every write of a
//! [`super::SqliteLedger`] in arrival order, the group commit that puts the writes
//! waiting together into one transaction, and the checkpointer thread beside it.
//!
//! Contract: every write (and every read of a private in-memory database, whose one
//! connection the writer owns) is a [`Job`] sent to the writer's queue, run once in
//! order. The jobs waiting together, and those that arrive while they run (at most
//! [`MAX_GROUP`] in all), run in one transaction, each in its own savepoint
//! ([`SqliteCore::group_extending`]): a failing call rolls back only
//! its own writes, every reply is sent only after the group's `COMMIT`, and a failed
//! `COMMIT` fails every call of the group. The claims of a group run merged, as one
//! [`SqliteCore::claim_many`] after the group's other calls: one candidate read for
//! all of them, each taking exactly what it would have taken alone (the calls of a
//! group are all unanswered, so that order is one they could have run in). The claim
//! of a worker's request-then-claim ([`Job::Then`]) joins them once its request is
//! applied, in the same transaction as that request. A migration
//! ([`Job::Alone`]) runs alone, outside any group. An idle writer polls its queue for
//! [`SPIN_BEFORE_PARK`] before it parks. For a file, a checkpointer thread with its
//! own connection runs the WAL checkpoints (`PASSIVE` every [`CHECKPOINT_EVERY`]
//! commits, then `RESTART` past [`WAL_MAX_FRAMES`] pages), so the writer's commits
//! never copy pages back or wait for an fsync; it ends before the writer's
//! connection closes. A panicking call loses only its own replies. What each of
//! these is worth is measured in `docs/performance-log.md`.

use super::rows::SqlResult;
use super::SqliteCore;
use crate::ledger::{Claimed, LedgerError};
use leasehold_engine::{ClaimRequest, Lease, Reply, WorkerRequest};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A call that runs on the writer's core and answers how to send its result once the
/// group it ran in has committed (or failed to).
pub(super) type Call = Box<dyn FnOnce(&SqliteCore) -> Answer + Send>;

/// A call for the writer thread.
pub(super) enum Job {
    /// A call, grouped with the others waiting.
    Call(Call),
    /// A call that runs alone, outside any group (a migration).
    Alone(Call),
    /// A claim: the claims of one group run together ([`SqliteCore::claim_many`]).
    Claim(ClaimRequest, ClaimReply),
    /// A worker's request, then a claim ([`crate::ledger::Ledger::worker_then_claim`]):
    /// the request runs at its place in the group and, once applied, its claim runs
    /// with the group's other claims.
    Then(Box<ThenJob>),
}
/// Where a merged claim's result goes.
type ClaimReply = tokio::sync::oneshot::Sender<Result<Vec<Claimed>, LedgerError>>;
/// Where a [`Job::Then`]'s request and claim results go.
pub(super) type ThenReply = tokio::sync::oneshot::Sender<Result<(Reply, Vec<Claimed>), LedgerError>>;

/// A [`Job::Then`]: the worker's lease and request, the claim to run once the
/// request is applied, and where the two results go.
pub(super) struct ThenJob {
    pub(super) lease: Lease,
    pub(super) request: WorkerRequest,
    pub(super) claim: ClaimRequest,
    pub(super) reply: ThenReply,
}

/// What a [`Job::Then`]'s request left for its claim, and what the claim took.
#[derive(Default)]
struct ThenState {
    /// The request was applied (its claim may run).
    applied: bool,
    /// What its claim took, once run in the request's transaction.
    claimed: Vec<Claimed>,
}

/// Where the result of one claim of a group's merged [`Unit::Claims`] goes.
enum ClaimTo {
    /// A [`Job::Claim`]'s caller, answered by the merged claim.
    Plain(ClaimReply),
    /// A [`Job::Then`]'s request, which answers with it ([`Unit::Request`]).
    Then(Arc<Mutex<ThenState>>),
}

/// What the writer runs as one call of a group: one call, the request of a
/// [`Job::Then`], or all the claims of the group merged.
enum Unit {
    Call(Call),
    Request {
        lease: Lease,
        request: WorkerRequest,
        reply: ThenReply,
        state: Arc<Mutex<ThenState>>,
    },
    Claims(Vec<(ClaimRequest, ClaimTo)>),
}

impl Unit {
    /// Runs the unit; answers how to send its results once its group has committed.
    fn run(self, core: &SqliteCore) -> Answer {
        match self {
            Unit::Call(call) => call(core),
            Unit::Request {
                lease,
                request,
                reply,
                state,
            } => {
                let out = core.worker(&lease, request);
                lock(&state).applied = out.is_ok();
                Box::new(move |committed: Result<(), LedgerError>| {
                    let _ = reply.send(match (out, committed) {
                        (Ok(reply), Ok(())) => Ok((reply, std::mem::take(&mut lock(&state).claimed))),
                        // Its writes are durable only if the group committed.
                        (Ok(_), Err(e)) | (Err(e), _) => Err(e),
                    });
                })
            }
            Unit::Claims(claims) => {
                // A request's claim runs only in the transaction that applied the
                // request: a unit run alone (its group lost) claims nothing for it.
                let in_group = !core.raw_connection().is_autocommit();
                let (requests, to): (Vec<ClaimRequest>, Vec<ClaimTo>) = claims
                    .into_iter()
                    .filter(|(_, to)| match to {
                        ClaimTo::Plain(_) => true,
                        ClaimTo::Then(state) => in_group && lock(state).applied,
                    })
                    .unzip();
                let results: Vec<Result<Vec<Claimed>, LedgerError>> = match core.claim_many(&requests) {
                    Ok(claimed) => claimed.into_iter().map(Ok).collect(),
                    Err(e) => requests.iter().map(|_| Err(e.clone())).collect(),
                };
                let mut replies = Vec::new();
                for (to, result) in to.into_iter().zip(results) {
                    match to {
                        ClaimTo::Plain(reply) => replies.push((reply, result)),
                        // A claim that fails claims nothing; the request stands.
                        ClaimTo::Then(state) => lock(&state).claimed = result.unwrap_or_default(),
                    }
                }
                Box::new(move |committed: Result<(), LedgerError>| {
                    for (reply, result) in replies {
                        let _ = reply.send(match (result, &committed) {
                            // Their writes are durable only if the group committed.
                            (Ok(_), Err(e)) => Err(e.clone()),
                            (result, _) => result,
                        });
                    }
                })
            }
        }
    }
}

/// Locks a [`ThenState`] (only the writer thread does, one unit at a time; a unit
/// that panicked while holding it left nothing half-written that matters).
fn lock(state: &Mutex<ThenState>) -> std::sync::MutexGuard<'_, ThenState> {
    state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Gathers a group's jobs into units: every claim, and the claim of every
/// [`Job::Then`], joins the group's one [`Unit::Claims`], which runs after the
/// group's other units. The calls of a group are concurrent (none has been answered
/// when the group starts), so any order of them is one they could have run in.
fn units(jobs: Vec<Job>) -> Vec<Unit> {
    let mut units = Vec::with_capacity(jobs.len() + 1);
    let mut claims = Vec::new();
    for job in jobs {
        match job {
            Job::Call(call) | Job::Alone(call) => units.push(Unit::Call(call)),
            Job::Claim(request, reply) => claims.push((request, ClaimTo::Plain(reply))),
            Job::Then(job) => {
                let ThenJob {
                    lease,
                    request,
                    claim,
                    reply,
                } = *job;
                let state = Arc::new(Mutex::new(ThenState::default()));
                claims.push((claim, ClaimTo::Then(Arc::clone(&state))));
                units.push(Unit::Request {
                    lease,
                    request,
                    reply,
                    state,
                });
            }
        }
    }
    if !claims.is_empty() {
        units.push(Unit::Claims(claims));
    }
    units
}
/// Moves the jobs waiting in `queue` into `jobs`, while the group holds fewer than
/// [`MAX_GROUP`] (`taken` counts them); a job that must run alone is `held` for
/// after the group, and ends the gathering (this one and every later one).
fn gather(queue: &mpsc::Receiver<Job>, jobs: &mut Vec<Job>, held: &mut Option<Job>, taken: &mut usize) {
    while held.is_none() && *taken < MAX_GROUP {
        match queue.try_recv() {
            Ok(job @ Job::Alone(_)) => {
                *held = Some(job);
                return;
            }
            Ok(job) => {
                jobs.push(job);
                *taken += 1;
            }
            Err(_) => return,
        }
    }
}

/// A group's jobs as the calls [`SqliteCore::group_extending`] runs (see [`units`]).
fn group_calls<'a>(jobs: Vec<Job>) -> Vec<GroupCall<'a, Option<Answer>>> {
    units(jobs)
        .into_iter()
        .map(|unit| {
            Box::new(move |core: &SqliteCore| {
                // A panicking unit loses only its own replies (its callers see an
                // internal error); its transaction or savepoint rolled back on unwind.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unit.run(core))).ok()
            }) as GroupCall<'a, Option<Answer>>
        })
        .collect()
}

/// Runs `jobs` as one group, as the writer thread does, and sends their answers
/// (tests).
#[cfg(test)]
pub(super) fn run_group(core: &SqliteCore, jobs: Vec<Job>) {
    for (reply, committed) in core.group_extending(group_calls(jobs), Vec::new) {
        if let Some(reply) = reply {
            reply(committed);
        }
    }
}

/// Sends a call's result, given its group's commit outcome.
pub(super) type Answer = Box<dyn FnOnce(Result<(), LedgerError>) + Send>;

/// The most calls the writer commits in one group.
const MAX_GROUP: usize = 64;
/// The writer asks for a checkpoint after this many commits: at 4 to 5 pages per
/// transition, about SQLite's own default of a checkpoint per 1,000 WAL pages. Each
/// checkpoint fsyncs the database file; asking every 32 commits cost one-step
/// deliveries at batch 5 about a tenth of their throughput (the checkpointer
/// competes for the cores with the callers).
const CHECKPOINT_EVERY: u64 = 256;

/// The writer connection's page cache ceiling, in MiB ([`SqliteCore::set_cache_mib`]).
const WRITER_CACHE_MIB: i64 = 256;

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
pub(super) struct Writer {
    pub(super) jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Counters>,
}

/// What the writer thread has done, counted as it goes.
#[derive(Default)]
struct Counters {
    groups: AtomicU64,
    calls: AtomicU64,
    /// The writer thread's id in `/proc` (0 where there is none).
    tid: AtomicU64,
}

/// How a [`super::SqliteLedger`]'s writer thread grouped the writes it ran (see
/// [`super::SqliteLedger::writer_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions the writer committed (or tried to): one per group.
    pub groups: u64,
    /// Calls it ran in them (every write, and the reads of a private database).
    pub calls: u64,
    /// The CPU time the writer thread has used, in nanoseconds (Linux: from
    /// `/proc/self/task/<id>/schedstat`; `None` elsewhere).
    pub cpu_ns: Option<u64>,
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
    pub(super) fn spawn(core: SqliteCore, checkpointer: Option<SqliteCore>) -> Result<Self, LedgerError> {
        core.set_cache_mib(WRITER_CACHE_MIB)?;
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
                counters.tid.store(this_thread_id().unwrap_or(0), Ordering::Relaxed);
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
                    // Group commit: the calls already waiting join the first one,
                    // and those that arrive while the group runs join it too.
                    let alone = matches!(first, Job::Alone(_));
                    let mut jobs = vec![first];
                    let mut taken = 1;
                    let replies = if alone {
                        core.group(group_calls(jobs))
                    } else {
                        gather(&queue, &mut jobs, &mut held, &mut taken);
                        core.group_extending(group_calls(jobs), || {
                            let mut jobs = Vec::new();
                            gather(&queue, &mut jobs, &mut held, &mut taken);
                            group_calls(jobs)
                        })
                    };
                    counters.groups.fetch_add(1, Ordering::Relaxed);
                    counters.calls.fetch_add(taken as u64, Ordering::Relaxed);
                    for (reply, committed) in replies {
                        if let Some(reply) = reply {
                            reply(committed);
                        }
                    }
                    commits += 1;
                    if commits.is_multiple_of(CHECKPOINT_EVERY) {
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

    /// How the writer has grouped the calls sent to it so far.
    pub(super) fn stats(&self) -> WriterStats {
        WriterStats {
            groups: self.stats.groups.load(Ordering::Relaxed),
            calls: self.stats.calls.load(Ordering::Relaxed),
            cpu_ns: match self.stats.tid.load(Ordering::Relaxed) {
                0 => None,
                tid => thread_cpu_ns(tid),
            },
        }
    }
}

/// The calling thread's id in `/proc` (Linux), from the `/proc/thread-self` link.
fn this_thread_id() -> Option<u64> {
    std::fs::read_link("/proc/thread-self")
        .ok()?
        .file_name()?
        .to_str()?
        .parse()
        .ok()
}

/// The CPU time a thread of this process has used, in nanoseconds: the first field
/// of its `schedstat`.
fn thread_cpu_ns(tid: u64) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
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

/// One call of a [`SqliteCore::group`].
pub type GroupCall<'a, T> = Box<dyn FnOnce(&SqliteCore) -> T + 'a>;

impl SqliteCore {
    /// Runs `calls` in one write transaction (group commit): each call's own
    /// transaction becomes a savepoint of it, so a call that fails rolls back only
    /// its own writes, and one `COMMIT` makes every call's writes durable at once.
    /// Answers, for each call, its result and whether the transaction holding its
    /// writes committed: a call's success counts only if that is `Ok`. A group of
    /// one is just that call. Should SQLite roll the whole group back by itself (an
    /// I/O error, a full disk), the calls run so far answer that error and the
    /// others run alone, each in its own transaction.
    pub fn group<T>(&self, calls: Vec<GroupCall<'_, T>>) -> Vec<(T, Result<(), LedgerError>)> {
        if calls.len() <= 1 {
            return calls.into_iter().map(|call| (call(self), Ok(()))).collect();
        }
        self.group_extending(calls, Vec::new)
    }

    /// [`SqliteCore::group`], always in one transaction (a group of one too), that
    /// then runs the calls `more` answers, again and again, before it commits: the
    /// writer's calls that arrive while its group runs join it. `more` answering
    /// none ends the group.
    pub(super) fn group_extending<'a, T>(
        &self,
        calls: Vec<GroupCall<'a, T>>,
        mut more: impl FnMut() -> Vec<GroupCall<'a, T>>,
    ) -> Vec<(T, Result<(), LedgerError>)> {
        let alone = |call: GroupCall<'a, T>| (call(self), Ok(()));
        let Ok(outer) = self.write_tx() else {
            // No group (another process holds the lock past the busy timeout): each
            // call tries alone and answers its own error.
            return calls.into_iter().map(alone).collect();
        };
        let mut calls = calls.into_iter();
        let mut grouped = Vec::new();
        let mut lost = false;
        'group: loop {
            for call in calls.by_ref() {
                grouped.push(call(self));
                if self.raw_connection().is_autocommit() {
                    lost = true;
                    break 'group;
                }
            }
            let next = more();
            if next.is_empty() {
                break;
            }
            calls = next.into_iter();
        }
        let committed = if lost {
            drop(outer);
            Err(LedgerError::Internal(
                "sqlite rolled back the transaction of a group commit".into(),
            ))
        } else {
            outer.commit()
        };
        let mut out: Vec<_> = grouped.into_iter().map(|r| (r, committed.clone())).collect();
        out.extend(calls.map(alone));
        out
    }

    /// Stops this connection from checkpointing the WAL when it commits (SQLite
    /// does so by default once the WAL holds 1,000 pages, inside the commit that
    /// crossed it, fsyncs included): a [`super::SqliteLedger`]'s writer leaves
    /// checkpoints to its checkpointer thread.
    pub(super) fn disable_autocheckpoint(&self) -> Result<(), LedgerError> {
        self.raw_connection().pragma_update(None, "wal_autocheckpoint", 0).sql()
    }

    /// Gives the writer's connection a page cache of up to `mib` MiB (allocated as
    /// used): every claim and completion walks the indexes by random text ids, so a
    /// queue of 100,000 under a history of a million needs more than a reader does.
    pub(super) fn set_cache_mib(&self, mib: i64) -> Result<(), LedgerError> {
        self.raw_connection()
            .pragma_update(None, "cache_size", -mib * 1024)
            .sql()
    }

    /// Runs a checkpoint: `PASSIVE` (copies what it can without waiting for the
    /// writer), then `RESTART` (waits for the writer, so that the next write starts
    /// the WAL over) if the WAL still holds more than `max_frames` pages. Answers the
    /// WAL's size in pages as the last checkpoint found it.
    pub(super) fn checkpoint(&self, max_frames: i64) -> Result<i64, LedgerError> {
        let run = |mode: &str| -> Result<i64, LedgerError> {
            self.raw_connection()
                .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
                    row.get::<_, i64>(1)
                })
                .sql()
        };
        let frames = run("PASSIVE")?;
        if frames > max_frames {
            return run("RESTART");
        }
        Ok(frames)
    }
}
