//! [`SqliteCore`]: the synchronous SQLite ledger over one connection: opening it,
//! its transactions, and every transition (claims on their candidate path, worker
//! and operator requests on one generic path) and read of the ledger.

use super::rows::{self, sync, SqlResult, SqliteSession};
use crate::clock::Clock;
use crate::entropy::Entropy;
use crate::ledger::limits::TargetRow;
use crate::ledger::listing::{AttemptCounts, AttemptPage, AttemptQuery, PlanRow};
use crate::ledger::migrate::{self, Migration, SQLITE};
use crate::ledger::prune::{Keep, PruneQuery};
use crate::ledger::sql::ledger::{enqueue_in, register_in, Decider};
use crate::ledger::sql::limits;
use crate::ledger::sql::session::{self, not_found};
use crate::ledger::sql::{listing, Dialect};
use crate::ledger::{decide, Claimed, LedgerError};
use crate::ledger::{EnqueueRequest, Enqueued};
use leasehold_engine::limits::TargetLimit;
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, Capabilities, ClaimRequest, Lease, OperatorRequest, Plan, PlanId, PlanSpec,
    PlanStatus, Reply, Request, Timestamp, WorkerRequest, Writes,
};
use rusqlite::config::DbConfig;
use rusqlite::Connection;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long a connection waits for another one's write lock before answering
/// [`LedgerError::Unavailable`].
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `path` names a private in-memory (or temporary) database, which exists
/// only for the one connection that opened it.
pub(super) fn is_private(path: &str) -> bool {
    path.is_empty() || path == ":memory:" || path.starts_with("file::memory:") || path.contains("mode=memory")
}

/// A synchronous ledger over one SQLite connection.
///
/// It has a method for every core method of [`crate::ledger::Ledger`] (and the two
/// named claims), with the same arguments and results, run on the calling thread: the simulator calls it from
/// inside a single-threaded host, and [`super::SqliteLedger`] calls it from
/// `spawn_blocking`. Every transition is one `BEGIN IMMEDIATE` transaction; reads are
/// one deferred transaction each, so they see a consistent snapshot.
pub struct SqliteCore {
    conn: Connection,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
    writes_hook: Option<crate::ledger::WritesHook>,
    records: RefCell<Records>,
    /// The dialect of this connection's writes: whether the ledger's rows keep room
    /// ([`rows::write_dialect`]), as found when it opened and after each migration.
    dialect: Cell<&'static Dialect>,
}

/// The records of the open attempts this connection last wrote, as it wrote them, so
/// that the next transition of one does not read its rows again (a worker's step
/// write after its claim, the claim after it).
///
/// Contract: an entry is used only inside a write transaction, and only while the
/// database is known to hold exactly what this connection wrote: the outermost write
/// transaction reads `PRAGMA data_version` under its write lock and empties the cache
/// if another connection (in this process or any other) has committed since; any
/// rollback (a call's savepoint or a whole transaction) empties it too. A transition
/// stores the record as the engine's writes left it ([`Writes::apply_to`]), only when
/// every image it wrote belongs to that attempt, and drops it once the attempt is
/// terminal. Debug builds check every entry used against a fresh read.
#[derive(Default)]
struct Records {
    /// `PRAGMA data_version` as the current (or last) write transaction read it.
    version: Option<i64>,
    map: HashMap<AttemptId, AttemptRecord>,
}

/// The most records kept: past it the cache starts over (open attempts under way on
/// a writer number in the tens to hundreds).
const MAX_RECORDS: usize = 4096;

impl Records {
    /// Stores `record` as its attempt's rows now are, or drops it if it is terminal.
    fn store(&mut self, record: AttemptRecord) {
        if record.command.status.is_terminal() {
            self.map.remove(&record.attempt.id);
            return;
        }
        if self.map.len() >= MAX_RECORDS {
            self.map.clear();
        }
        self.map.insert(record.attempt.id.clone(), record);
    }

    /// Stores `after`, the record a transition's writes left, if `owned` (see
    /// [`owns`]); otherwise forgets everything (the writes touched rows it cannot place).
    fn store_written(&mut self, owned: bool, after: AttemptRecord) {
        if owned {
            self.store(after);
        } else {
            self.map.clear();
        }
    }
}

/// Whether every image in `writes` is one of `before`'s rows, so that `before` with
/// `writes` applied is what the attempt's rows now hold.
fn owns(before: &AttemptRecord, writes: &Writes) -> bool {
    let id = &before.attempt.id;
    writes.attempt.as_ref().is_none_or(|a| &a.id == id)
        && writes
            .command
            .as_ref()
            .is_none_or(|c| c.id == before.command.id && &c.attempt_id == id)
        && writes
            .receipts
            .iter()
            .all(|r| &r.attempt_id == id && before.receipt(r.ordinal).is_some())
}

/// A transaction on a core's connection: `BEGIN …` … `COMMIT`, or, when the
/// connection is already inside a transaction (a group), `SAVEPOINT` … `RELEASE`.
/// Dropped without [`Tx::commit`], it rolls back what it wrote (and only that).
pub(super) struct Tx<'c> {
    conn: &'c Connection,
    nested: bool,
    open: bool,
    /// The connection's record cache, emptied if this rolls back (`None` for a read).
    records: Option<&'c RefCell<Records>>,
}

impl<'c> Tx<'c> {
    fn begin(conn: &'c Connection, begin: &str, records: Option<&'c RefCell<Records>>) -> Result<Self, LedgerError> {
        let nested = !conn.is_autocommit();
        let sql = if nested { "SAVEPOINT leasehold_call" } else { begin };
        conn.prepare_cached(sql).and_then(|mut s| s.execute([])).sql()?;
        let tx = Self {
            conn,
            nested,
            open: true,
            records,
        };
        if let (Some(records), false) = (records, nested) {
            // The write lock is held: no other connection commits until this ends.
            let version: i64 = conn
                .prepare_cached("PRAGMA data_version")
                .and_then(|mut s| s.query_row([], |row| row.get(0)))
                .sql()?;
            let mut records = records.borrow_mut();
            if records.version != Some(version) {
                records.map.clear();
                records.version = Some(version);
            }
        }
        Ok(tx)
    }

    /// Commits (or releases the savepoint).
    pub(super) fn commit(mut self) -> Result<(), LedgerError> {
        let sql = if self.nested {
            "RELEASE leasehold_call"
        } else {
            "COMMIT"
        };
        let done = self.conn.prepare_cached(sql).and_then(|mut s| s.execute([])).sql();
        // A failed COMMIT leaves the transaction open: Drop rolls it back.
        self.open = done.is_err();
        done.map(drop)
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.open {
            if let Some(records) = self.records {
                records.borrow_mut().map.clear();
            }
            let sql = if self.nested {
                "ROLLBACK TO leasehold_call; RELEASE leasehold_call"
            } else {
                "ROLLBACK"
            };
            let _ = self.conn.execute_batch(sql);
        }
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl std::fmt::Debug for SqliteCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteCore").finish_non_exhaustive()
    }
}

impl SqliteCore {
    /// Opens (creating the file if needed, but no tables) the database at `path`
    /// (`":memory:"` for a private in-memory one), deciding leases on `clock` and
    /// minting ids and tokens from `entropy`.
    ///
    /// Sets WAL for files, `synchronous=NORMAL`, `foreign_keys=ON` and a busy timeout
    /// of [`BUSY_TIMEOUT`].
    pub fn open(path: &str, clock: Arc<dyn Clock>, entropy: Arc<dyn Entropy>) -> Result<Self, LedgerError> {
        Self::open_with(path, super::OpenMode::Create, clock, entropy)
    }

    /// [`SqliteCore::open`] in `mode` (see [`super::open`]): only
    /// [`super::OpenMode::Create`] creates a file, every other mode checks the
    /// schema version first, and a read-only connection sets no pragma that writes.
    pub fn open_with(
        path: &str,
        mode: super::OpenMode,
        clock: Arc<dyn Clock>,
        entropy: Arc<dyn Entropy>,
    ) -> Result<Self, LedgerError> {
        let conn = super::open::connect(path, mode, is_private(path))?;
        // Set first: switching to WAL itself may have to wait for another connection.
        conn.busy_timeout(BUSY_TIMEOUT).sql()?;
        if !is_private(path) && mode != super::OpenMode::ReadOnly {
            let _mode: String = conn
                .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
                .sql()?;
        }
        conn.pragma_update(None, "synchronous", "NORMAL").sql()?;
        conn.pragma_update(None, "foreign_keys", "ON").sql()?;
        // The query planner's stability guarantee: plans never depend on bound
        // values. Without it SQLite (after 3.46) marks a statement whose plan looked
        // at a bound value (`col = ?` in a join or a sort, a `LIMIT ?`) to be
        // prepared again when its bindings are cleared, which rusqlite does to every
        // cached statement after each use: claims, enqueues and reads each paid a
        // fresh prepare. Our statements are written for their indexes, not for values.
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).sql()?;
        // The default 2 MiB page cache no longer holds the indexes a claim walks by
        // random text ids once some ten thousand attempts are queued; claims then read
        // most pages back from the OS. 32 MiB (a ceiling, allocated as used) keeps a
        // queue of 20,000 cached; the writer raises its own (see `writer::WRITER_CACHE_MIB`).
        conn.pragma_update(None, "cache_size", -32_768).sql()?;
        conn.set_prepared_statement_cache_capacity(64);
        let dialect = Cell::new(rows::write_dialect(&conn)?);
        Ok(Self {
            conn,
            clock,
            entropy,
            writes_hook: None,
            records: RefCell::default(),
            dialect,
        })
    }

    /// Puts a [`crate::ledger::WritesHook`] on every transition's writes.
    pub fn set_writes_hook(&mut self, hook: crate::ledger::WritesHook) {
        self.writes_hook = Some(hook);
    }

    /// The underlying connection (tests and diagnostics).
    #[cfg(test)]
    pub(super) fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The underlying connection, to install hooks on it (tests).
    #[cfg(test)]
    pub(super) fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The attempts whose records this connection holds (tests).
    #[cfg(test)]
    pub(super) fn cached_records(&self) -> Vec<AttemptId> {
        self.records.borrow().map.keys().cloned().collect()
    }

    /// The underlying connection, for stores kept beside the ledger's tables
    /// ([`crate::tokens`]) and the listing reads ([`super::listing`]).
    pub(crate) fn raw_connection(&self) -> &Connection {
        &self.conn
    }

    /// A write transaction: takes the database's write lock now, so that what it
    /// reads cannot change before it writes. Inside a group (see
    /// [`SqliteCore::group`]) it is a savepoint of the group's transaction instead.
    pub(super) fn write_tx(&self) -> Result<Tx<'_>, LedgerError> {
        Tx::begin(&self.conn, "BEGIN IMMEDIATE", Some(&self.records))
    }

    fn read_tx(&self) -> Result<Tx<'_>, LedgerError> {
        Tx::begin(&self.conn, "BEGIN DEFERRED", None)
    }

    /// `tx` as the shared row code's session, writing in this ledger's dialect.
    fn session<'t>(&self, tx: &'t Tx<'_>) -> SqliteSession<'t> {
        SqliteSession::new(tx, self.dialect.get())
    }

    /// What registrations and enqueues decide with: this ledger's entropy and clock.
    fn decider(&self) -> Decider<'_> {
        Decider {
            entropy: &*self.entropy,
            clock: Some(&*self.clock),
        }
    }

    /// An attempt's record inside the write transaction `tx`: the one this connection
    /// last wrote if it still holds (see [`Records`]), else read.
    fn locked_record(&self, tx: &Tx<'_>, id: &AttemptId) -> Result<Option<AttemptRecord>, LedgerError> {
        if let Some(record) = self.records.borrow().map.get(id) {
            #[cfg(debug_assertions)]
            {
                let read = rows::read_record(tx, id)?;
                assert_eq!(
                    read.as_ref(),
                    Some(record),
                    "the cached record of attempt {id} is stale"
                );
            }
            return Ok(Some(record.clone()));
        }
        rows::read_record(tx, id)
    }

    /// Applies pending schema migrations; answers the versions applied now.
    ///
    /// A migration may rebuild a table that others reference (SQLite cannot alter a
    /// CHECK constraint): migrations run with foreign keys off, in one transaction
    /// that checks every foreign key (`PRAGMA foreign_key_check`) before it commits,
    /// and foreign keys are on again afterwards, whatever happened. (The pragma does
    /// nothing inside a transaction: the caller must not be inside one, and
    /// [`super::SqliteLedger`] runs a migration alone, never in a group.)
    pub fn migrate(&self) -> Result<Vec<u32>, LedgerError> {
        self.migrate_as(SQLITE, migrate::RELEASE)
    }

    /// [`SqliteCore::migrate`] with `migrations`, recorded as written by release
    /// `written_by` (the rolling-upgrade tests play a newer release so).
    pub fn migrate_as(&self, migrations: &[Migration], written_by: &str) -> Result<Vec<u32>, LedgerError> {
        if !self.conn.is_autocommit() {
            return Err(LedgerError::Internal(
                "migrations cannot run inside another transaction".into(),
            ));
        }
        self.conn.pragma_update(None, "foreign_keys", "OFF").sql()?;
        let applied = self.migrate_without_foreign_keys(migrations, written_by);
        let on = self.conn.pragma_update(None, "foreign_keys", "ON").sql();
        let applied = applied?;
        on?;
        self.dialect.set(rows::write_dialect(&self.conn)?);
        Ok(applied)
    }

    fn migrate_without_foreign_keys(
        &self,
        migrations: &[Migration],
        written_by: &str,
    ) -> Result<Vec<u32>, LedgerError> {
        let tx = self.write_tx()?;
        let now = self.clock.now();
        let applied = migrate::run(&mut rows::SqliteMigrations { conn: &tx }, migrations, written_by, now)?;
        rows::check_foreign_keys(&tx)?;
        tx.commit()?;
        Ok(applied)
    }

    /// Validates and registers a plan; content a READY plan already has answers that
    /// plan.
    pub fn register_plan(&self, spec: PlanSpec, known_executors: &[&str]) -> Result<Plan, LedgerError> {
        let tx = self.write_tx()?;
        let plan = sync(register_in(
            &mut self.session(&tx),
            spec,
            known_executors,
            &self.decider(),
        ))?;
        tx.commit()?;
        Ok(plan)
    }

    /// A plan by id.
    pub fn plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        let tx = self.read_tx()?;
        sync(session::plan_by_id(&mut self.session(&tx), id, false))
    }

    /// Every plan, oldest first.
    pub fn list_plans(&self) -> Result<Vec<Plan>, LedgerError> {
        let tx = self.read_tx()?;
        sync(session::read_plans(&mut self.session(&tx)))
    }

    /// The plans named `name`, oldest first.
    pub fn plans_named(&self, name: &str) -> Result<Vec<Plan>, LedgerError> {
        let tx = self.read_tx()?;
        sync(session::read_plans_named(&mut self.session(&tx), name))
    }

    /// Up to `limit` plans, newest first, registered before `before`.
    pub fn plans_newest_first(&self, before: Option<&PlanId>, limit: u32) -> Result<Vec<Plan>, LedgerError> {
        let tx = self.read_tx()?;
        sync(session::read_plans_newest_first(&mut self.session(&tx), before, limit))
    }

    /// Every plan, oldest first, each row read on its own (a listing's).
    pub fn plan_rows(&self) -> Result<Vec<PlanRow>, LedgerError> {
        let tx = self.read_tx()?;
        sync(session::read_plan_rows(&mut self.session(&tx)))
    }

    /// [`SqliteCore::plans_newest_first`], each row read on its own (a listing's).
    pub fn plan_rows_newest_first(&self, before: Option<&PlanId>, limit: u32) -> Result<Vec<PlanRow>, LedgerError> {
        let tx = self.read_tx()?;
        sync(session::read_plan_rows_newest_first(
            &mut self.session(&tx),
            before,
            limit,
        ))
    }

    /// Records worker `id` ([`crate::ledger::Ledger::report_worker`]).
    pub fn report_worker(&self, id: &str, capabilities: &Capabilities, starting: bool) -> Result<(), LedgerError> {
        let tx = self.write_tx()?;
        let json = crate::ledger::fleet::capabilities_json(capabilities);
        let now = self.clock.now();
        sync(crate::ledger::sql::fleet::report_worker(
            &mut self.session(&tx),
            id,
            &json,
            now,
            starting,
        ))?;
        tx.commit()?;
        Ok(())
    }

    /// Open attempts a worker with `capabilities` could run
    /// ([`crate::ledger::Ledger::open_attempts_for`]).
    pub fn open_attempts_for(&self, capabilities: &Capabilities) -> Result<u64, LedgerError> {
        let tx = self.read_tx()?;
        sync(crate::ledger::sql::fleet::count_open_for(
            &mut self.session(&tx),
            capabilities,
        ))
    }

    /// Every worker row, and the ledger's now ([`crate::ledger::Ledger::workers`]).
    pub fn workers(&self) -> Result<(Vec<crate::ledger::fleet::WorkerRow>, Timestamp), LedgerError> {
        let tx = self.read_tx()?;
        let rows = sync(crate::ledger::sql::fleet::read_workers(&mut self.session(&tx)))?;
        Ok((rows, self.clock.now()))
    }

    /// Sets a target's limits ([`crate::ledger::Ledger::set_limit`]).
    pub fn set_limit(&self, limit: &TargetLimit) -> Result<(), LedgerError> {
        crate::ledger::checked_limit(limit)?;
        let tx = self.write_tx()?;
        sync(limits::set_limit(&mut self.session(&tx), limit, self.clock.now()))?;
        tx.commit()?;
        Ok(())
    }

    /// Removes a target's limits ([`crate::ledger::Ledger::clear_limit`]).
    pub fn clear_limit(&self, target: &str) -> Result<bool, LedgerError> {
        let tx = self.write_tx()?;
        let cleared = sync(limits::clear_limit(&mut self.session(&tx), target))?;
        tx.commit()?;
        Ok(cleared)
    }

    /// Every limited target, and the ledger's now ([`crate::ledger::Ledger::limits`]).
    pub fn limits(&self) -> Result<(Vec<TargetRow>, Timestamp), LedgerError> {
        let tx = self.read_tx()?;
        let now = self.clock.now();
        Ok((sync(limits::list_limits(&mut self.session(&tx), now))?, now))
    }

    /// Marks a plan RETIRED.
    pub fn retire_plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        let tx = self.write_tx()?;
        let s = &mut self.session(&tx);
        if !sync(session::set_plan_status(s, id, PlanStatus::Retired))? {
            return Err(not_found("plan", id));
        }
        let plan = sync(session::plan_by_id(s, id, false))?;
        tx.commit()?;
        Ok(plan)
    }

    /// Enqueues an attempt: attempt, receipts and command in one transaction.
    pub fn enqueue(&self, plan: &PlanId, action: Action) -> Result<AttemptRecord, LedgerError> {
        Ok(self.enqueue_with(plan, EnqueueRequest::new(action))?.record)
    }

    /// [`SqliteCore::enqueue`] of the attempt `request` describes, or the attempt an
    /// earlier enqueue of the same request with its key created.
    pub fn enqueue_with(&self, plan: &PlanId, request: EnqueueRequest) -> Result<Enqueued, LedgerError> {
        let tx = self.write_tx()?;
        let enqueued = sync(enqueue_in(&mut self.session(&tx), plan, &request, &self.decider()))?;
        tx.commit()?;
        Ok(enqueued)
    }

    /// Claims up to `batch` claimable commands for `owner` with a lease of
    /// `lease_ms`, oldest first, in one transaction.
    pub fn claim(&self, owner: &str, batch: u32, lease_ms: u64) -> Result<Vec<Claimed>, LedgerError> {
        self.claim_with(owner, batch, lease_ms, false)
    }

    /// Claims like [`SqliteCore::claim`] and, in the same transaction, begins each
    /// claimed attempt's next step.
    pub fn claim_and_begin(&self, owner: &str, batch: u32, lease_ms: u64) -> Result<Vec<Claimed>, LedgerError> {
        self.claim_with(owner, batch, lease_ms, true)
    }

    fn claim_with(&self, owner: &str, batch: u32, lease_ms: u64, begin: bool) -> Result<Vec<Claimed>, LedgerError> {
        let request = ClaimRequest {
            owner: owner.to_owned(),
            batch,
            lease_ms,
            begin,
            capabilities: None,
        };
        self.claim_batch(request)
    }

    /// One claim ([`crate::ledger::Ledger::claim_batch`]), in one transaction.
    pub fn claim_batch(&self, request: ClaimRequest) -> Result<Vec<Claimed>, LedgerError> {
        Ok(self
            .claim_many(std::slice::from_ref(&request))?
            .pop()
            .unwrap_or_default())
    }

    /// Runs several claims in one transaction, with one candidate read for all of
    /// them, and answers what each claimed, in order: exactly
    /// what the claims would have claimed one after the other at one instant (the
    /// writer thread merges the claims that wait together, see
    /// [`super::SqliteLedger`]).
    ///
    /// Claim `k` run alone would consider the `batch` oldest claimable commands that
    /// the claims before it did not take (a candidate its transition refuses stays
    /// claimable for the next). The merged read fetches the oldest `Σ batch`
    /// candidates: if it found that many, at most `Σ batch before k` of them are
    /// taken, so claim `k`'s window lies inside the read; if it found fewer, it holds
    /// every claimable command. Tokens are drawn in the same order as alone: per
    /// claim, per candidate of its window.
    pub fn claim_many(&self, requests: &[ClaimRequest]) -> Result<Vec<Vec<Claimed>>, LedgerError> {
        let mut claimed: Vec<Vec<Claimed>> = requests.iter().map(|_| Vec::new()).collect();
        if requests.iter().all(|r| r.batch == 0) {
            return Ok(claimed);
        }
        let tx = self.write_tx()?;
        let now = self.clock.now();
        // Claims of workers that can run different routes read their candidates
        // apart, one group after another in this transaction (a group's read sees
        // the claims written before it).
        let mut groups: Vec<(&Option<Capabilities>, Vec<usize>)> = Vec::new();
        for (k, request) in requests.iter().enumerate() {
            match groups.iter_mut().find(|(caps, _)| **caps == request.capabilities) {
                Some((_, members)) => members.push(k),
                None => groups.push((&request.capabilities, vec![k])),
            }
        }
        for (_, members) in groups {
            self.claim_group(&tx, now, requests, &members, &mut claimed)?;
        }
        tx.commit()?;
        Ok(claimed)
    }

    /// The claims `members` of `requests` (all with the same capabilities), with one
    /// candidate read ([`SqliteCore::claim_many`]), each answered into `claimed`.
    fn claim_group(
        &self,
        tx: &Tx<'_>,
        now: Timestamp,
        requests: &[ClaimRequest],
        members: &[usize],
        claimed: &mut [Vec<Claimed>],
    ) -> Result<(), LedgerError> {
        let total = members
            .iter()
            .fold(0u32, |sum, &k| sum.saturating_add(requests[k].batch));
        let caps = requests[members[0]].capabilities.as_ref();
        let mut candidates: Vec<Option<rows::Candidate>> = rows::claim_candidates(tx, now, total, caps)?
            .into_iter()
            .map(Some)
            .collect();
        // Every vector sized once (see `rows::claim_candidates` on large allocations).
        let mut decided = Vec::with_capacity(candidates.len());
        let mut gates = limits::Gates::default();
        let mut session = self.session(tx);
        for &k in members {
            let request = &requests[k];
            let window: Vec<usize> = (0..candidates.len())
                .filter(|&i| candidates[i].is_some())
                .take(request.batch as usize)
                .collect();
            for i in window {
                let Some((record, plan)) = &candidates[i] else { continue };
                let token = self.entropy.token();
                let claim = Request::Claim(request, &token, plan);
                let Ok((writes, _)) = decide(self.writes_hook.as_ref(), record, claim, now) else {
                    continue;
                };
                if !sync(limits::admits_claim(&mut session, &mut gates, record, &writes, now))? {
                    continue;
                }
                if let Some((record, plan)) = candidates[i].take() {
                    decided.push((k, record, plan, token, writes));
                }
            }
        }
        sync(gates.store(&mut session, now))?;
        let items: Vec<_> = decided
            .iter()
            .map(|(_, record, _, _, writes)| (record, writes))
            .collect();
        // A command taken by someone else between the candidate query and the write
        // is refused and skipped (nothing was written for it).
        let applied = rows::update_many(tx, self.dialect.get(), &items)?;
        let mut records = self.records.borrow_mut();
        for ((k, record, plan, token, writes), applied) in decided.into_iter().zip(applied) {
            if applied {
                let owned = owns(&record, &writes);
                let claim = Claimed::applied(record, plan, token, &writes);
                records.store_written(owned, claim.record.clone());
                if claim.is_lease() {
                    claimed[k].push(claim);
                }
            }
        }
        Ok(())
    }

    /// Applies a request of the worker holding `lease` ([`crate::ledger::Ledger::worker`]):
    /// one `BEGIN IMMEDIATE` transaction that reads the record in lock order, lets the
    /// engine decide at the ledger's `now` and writes under the engine's guard.
    pub fn worker(&self, lease: &Lease, request: WorkerRequest) -> Result<Reply, LedgerError> {
        let tx = self.write_tx()?;
        let now = self.clock.now();
        let mut record = self
            .locked_record(&tx, &lease.attempt_id)?
            .ok_or_else(|| not_found("attempt", &lease.attempt_id))?;
        if record.command.id != lease.command_id {
            return Err(not_found("command", &lease.command_id));
        }
        let plan = match request.needs_plan() {
            true => Some(sync(session::plan_by_id(
                &mut self.session(&tx),
                &record.attempt.plan_id,
                false,
            ))?),
            false => None,
        };
        let decided = decide(
            self.writes_hook.as_ref(),
            &record,
            Request::Worker(&request, &lease.token, plan.as_ref()),
            now,
        )?;
        let limited = sync(limits::limit_worker(
            &mut self.session(&tx),
            (&request, &lease.token),
            &record,
            decided,
            now,
        ))?;
        let (writes, reply) = (limited.writes, limited.reply);
        rows::update_writes(&tx, self.dialect.get(), &record, &writes)?;
        rows::run(&tx, &limits::reset_statements(self.dialect.get(), &limited.resets))?;
        let owned = owns(&record, &writes);
        writes.apply_to(&mut record);
        self.records.borrow_mut().store_written(owned, record);
        tx.commit()?;
        Ok(reply)
    }

    /// Applies a worker request, then claims ([`crate::ledger::Ledger::worker_then_claim`]):
    /// both are savepoints of one transaction (the call's own, or its group's), so a
    /// worker that ends an attempt claims its next in the same commit; the claim rolls
    /// back alone if it fails, and the request stands. A refused or failed request
    /// writes nothing and claims nothing. ([`super::SqliteLedger`]'s writer thread
    /// runs the two apart within its group instead, so that the claim joins the
    /// group's other claims: see `writer::Job::Then`.)
    pub fn worker_then_claim(
        &self,
        lease: &Lease,
        request: WorkerRequest,
        claim: ClaimRequest,
    ) -> Result<(Reply, Vec<Claimed>), LedgerError> {
        // Alone, one transaction holds both; in a group, the group's already does.
        let both = if self.conn.is_autocommit() {
            Some(self.write_tx()?)
        } else {
            None
        };
        let reply = self.worker(lease, request)?;
        let claimed = self.claim_batch(claim).unwrap_or_default();
        if let Some(both) = both {
            both.commit()?;
        }
        Ok((reply, claimed))
    }

    /// Applies an operator request to an attempt ([`crate::ledger::Ledger::operator`]):
    /// the same reads, with the plan for its recovery mode; answers the reply and the
    /// record as written.
    pub fn operator(
        &self,
        attempt: &AttemptId,
        request: OperatorRequest,
    ) -> Result<(Reply, AttemptRecord), LedgerError> {
        let tx = self.write_tx()?;
        let now = self.clock.now();
        let mut record = self
            .locked_record(&tx, attempt)?
            .ok_or_else(|| not_found("attempt", attempt))?;
        let plan = sync(session::plan_by_id(
            &mut self.session(&tx),
            &record.attempt.plan_id,
            false,
        ))?;
        let (writes, reply) = decide(
            self.writes_hook.as_ref(),
            &record,
            Request::Operator(&request, plan.recovery),
            now,
        )?;
        rows::update_writes(&tx, self.dialect.get(), &record, &writes)?;
        let owned = owns(&record, &writes);
        writes.apply_to(&mut record);
        self.records.borrow_mut().store_written(owned, record.clone());
        tx.commit()?;
        Ok((reply, record))
    }

    /// An attempt with its command and receipts.
    pub fn attempt(&self, attempt: &AttemptId) -> Result<AttemptRecord, LedgerError> {
        let tx = self.read_tx()?;
        rows::read_record(&tx, attempt)?.ok_or_else(|| not_found("attempt", attempt))
    }

    /// Every attempt of a plan, by number.
    pub fn history(&self, plan: &PlanId) -> Result<Vec<AttemptRecord>, LedgerError> {
        let tx = self.read_tx()?;
        let s = &mut self.session(&tx);
        sync(session::plan_by_id(s, plan, false))?;
        sync(session::read_history(s, plan))
    }

    /// How many attempts are QUEUED or RUNNING, counted by their commands.
    pub fn open_attempts(&self) -> Result<u64, LedgerError> {
        let tx = self.read_tx()?;
        sync(session::count_open_attempts(&mut self.session(&tx)))
    }

    /// A page of attempts, newest first, from one snapshot
    /// ([`crate::ledger::Ledger::list_attempts`]).
    pub fn list_attempts(&self, query: &AttemptQuery) -> Result<AttemptPage, LedgerError> {
        let tx = self.read_tx()?;
        let limit = query.clamped_limit();
        let page = sync(listing::page(&mut self.session(&tx), query, limit))?;
        Ok(AttemptPage::from_page_rows(page, limit))
    }

    /// Attempts per status, each count capped at `cap`
    /// ([`crate::ledger::Ledger::count_attempts`]).
    pub fn count_attempts(&self, cap: u64) -> Result<AttemptCounts, LedgerError> {
        let tx = self.read_tx()?;
        sync(listing::counts(&mut self.session(&tx), cap))
    }

    /// What retention keeps of a plan ([`crate::ledger::Ledger::prune_keep`]).
    pub fn prune_keep(&self, plan: &PlanId) -> Result<Keep, LedgerError> {
        let tx = self.read_tx()?;
        sync(crate::ledger::sql::prune::keep_of(&mut self.session(&tx), plan))
    }

    /// A page of prunable attempts ([`crate::ledger::Ledger::prunable`]).
    pub fn prunable(&self, query: &PruneQuery) -> Result<Vec<AttemptRecord>, LedgerError> {
        let tx = self.read_tx()?;
        sync(crate::ledger::sql::prune::prunable(&mut self.session(&tx), query))
    }

    /// Deletes ended attempts with their rows ([`crate::ledger::Ledger::delete_attempts`]).
    pub fn delete_attempts(&self, ids: &[AttemptId]) -> Result<u64, LedgerError> {
        let tx = self.write_tx()?;
        let deleted = sync(crate::ledger::sql::prune::delete_attempts(&mut self.session(&tx), ids))?;
        tx.commit()?;
        Ok(deleted)
    }
}
