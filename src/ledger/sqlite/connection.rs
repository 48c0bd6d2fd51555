//! [`SqliteCore`]: the synchronous SQLite ledger over one connection.

use super::rows::{self, not_found, SqlResult};
use crate::clock::Clock;
use crate::entropy::{Entropy, IdKind};
use crate::ledger::migrate::{self, SQLITE};
use crate::ledger::{Claimed, LedgerError};
use leasehold_engine::transition::{self, Continued, NewIds, ReconcileOutcome};
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, CommandId, Guard, Lease, Plan, PlanId, PlanSpec, PlanStatus, Refusal, Timestamp,
    Writes,
};
use rusqlite::{Connection, Transaction, TransactionBehavior};
use serde_json::Value;
use std::collections::BTreeMap;
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
/// It has a method for every method of [`crate::ledger::Ledger`], with the same
/// arguments and results, run on the calling thread: the simulator calls it from
/// inside a single-threaded host, and [`super::SqliteLedger`] calls it from
/// `spawn_blocking`. Every transition is one `BEGIN IMMEDIATE` transaction; reads are
/// one deferred transaction each, so they see a consistent snapshot.
pub struct SqliteCore {
    conn: Connection,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
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
        let conn = Connection::open(path).map_err(|e| match rows::sql_error(e) {
            LedgerError::Internal(m) => LedgerError::Internal(format!("cannot open the database: {m}")),
            other => other,
        })?;
        // Set first: switching to WAL itself may have to wait for another connection.
        conn.busy_timeout(BUSY_TIMEOUT).sql()?;
        if !is_private(path) {
            let _mode: String = conn
                .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
                .sql()?;
        }
        conn.pragma_update(None, "synchronous", "NORMAL").sql()?;
        conn.pragma_update(None, "foreign_keys", "ON").sql()?;
        // The default 2 MiB page cache no longer holds the indexes a claim walks by
        // random text ids once some ten thousand attempts are queued; claims then read
        // most pages back from the OS. 32 MiB (a ceiling, allocated as used) keeps a
        // queue of 20,000 cached.
        conn.pragma_update(None, "cache_size", -32_768).sql()?;
        conn.set_prepared_statement_cache_capacity(64);
        Ok(Self { conn, clock, entropy })
    }

    /// The underlying connection (tests and diagnostics).
    #[cfg(test)]
    pub(super) fn connection(&self) -> &Connection {
        &self.conn
    }

    /// A write transaction: takes the database's write lock now, so that what it
    /// reads cannot change before it writes.
    pub(super) fn write_tx(&self) -> Result<Transaction<'_>, LedgerError> {
        Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate).sql()
    }

    fn read_tx(&self) -> Result<Transaction<'_>, LedgerError> {
        Transaction::new_unchecked(&self.conn, TransactionBehavior::Deferred).sql()
    }

    /// Applies pending schema migrations; answers the versions applied now.
    pub fn migrate(&self) -> Result<Vec<u32>, LedgerError> {
        let tx = self.write_tx()?;
        let now = self.clock.now();
        let applied = migrate::run(&mut rows::SqliteMigrations { conn: &tx }, SQLITE, now)?;
        tx.commit().sql()?;
        Ok(applied)
    }

    /// Validates and registers a plan; content a READY plan already has answers that
    /// plan.
    pub fn register_plan(&self, spec: PlanSpec, known_executors: &[&str]) -> Result<Plan, LedgerError> {
        let tx = self.write_tx()?;
        let now = self.clock.now();
        let plan = spec.into_plan(known_executors, PlanId::new(self.entropy.id(IdKind::Plan)), now)?;
        if let Some(existing) = rows::read_ready_plan_by_fingerprint(&tx, &plan.fingerprint)? {
            return Ok(existing);
        }
        rows::insert_plan(&tx, &plan)?;
        tx.commit().sql()?;
        Ok(plan)
    }

    /// A plan by id.
    pub fn plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        let tx = self.read_tx()?;
        rows::read_plan(&tx, id)?.ok_or_else(|| not_found("plan", id))
    }

    /// Every plan, oldest first.
    pub fn list_plans(&self) -> Result<Vec<Plan>, LedgerError> {
        let tx = self.read_tx()?;
        rows::read_plans(&tx)
    }

    /// Marks a plan RETIRED.
    pub fn retire_plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        let tx = self.write_tx()?;
        if !rows::set_plan_status(&tx, id, PlanStatus::Retired)? {
            return Err(not_found("plan", id));
        }
        let plan = rows::read_plan(&tx, id)?.ok_or_else(|| not_found("plan", id))?;
        tx.commit().sql()?;
        Ok(plan)
    }

    /// Enqueues an attempt: attempt, receipts and command in one transaction.
    pub fn enqueue(&self, plan: &PlanId, action: Action) -> Result<AttemptRecord, LedgerError> {
        let mut tx = self.write_tx()?;
        let now = self.clock.now();
        let plan = rows::read_plan(&tx, plan)?.ok_or_else(|| not_found("plan", plan))?;
        let history = rows::read_history(&tx, &plan.id)?;
        let ids = NewIds {
            attempt: AttemptId::new(self.entropy.id(IdKind::Attempt)),
            command: CommandId::new(self.entropy.id(IdKind::Command)),
        };
        let record = transition::enqueue(&plan, &history, action, ids, now)?;
        let writes = Writes {
            guard: Guard::Absent,
            attempt: Some(record.attempt.clone()),
            command: Some(record.command.clone()),
            receipts: record.receipts.clone(),
        };
        rows::apply_writes(&mut tx, &writes)?;
        tx.commit().sql()?;
        Ok(record)
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
        if batch == 0 {
            return Ok(Vec::new());
        }
        let mut tx = self.write_tx()?;
        let now = self.clock.now();
        let mut plans: BTreeMap<PlanId, Plan> = BTreeMap::new();
        let mut claimed = Vec::new();
        for (command_id, attempt_id) in rows::claim_candidates(&tx, now, batch)? {
            let Some(mut record) = rows::read_record(&tx, &attempt_id)? else {
                continue;
            };
            let plan = match plans.get(&record.attempt.plan_id) {
                Some(p) => p.clone(),
                None => {
                    let p = rows::read_plan(&tx, &record.attempt.plan_id)?
                        .ok_or_else(|| LedgerError::Integrity(format!("attempt {attempt_id} names a missing plan")))?;
                    plans.insert(p.id.clone(), p.clone());
                    p
                }
            };
            let token = self.entropy.token();
            let decided = if begin {
                transition::claim_and_begin(&record, plan.recovery, owner, token.clone(), lease_ms, now)
            } else {
                transition::claim(&record, plan.recovery, owner, token.clone(), lease_ms, now)
            };
            let Ok(writes) = decided else {
                continue;
            };
            match rows::apply_writes(&mut tx, &writes) {
                Ok(()) => {}
                // Taken by someone else between the candidate query and the write.
                Err(LedgerError::Refused(_)) => continue,
                Err(e) => return Err(e),
            }
            writes.apply_to(&mut record);
            claimed.push(Claimed {
                lease: Lease {
                    command_id,
                    attempt_id,
                    token,
                },
                plan,
                record,
            });
        }
        tx.commit().sql()?;
        Ok(claimed)
    }

    /// Renews a lease; answers the new deadline (ledger clock).
    pub fn heartbeat(&self, lease: &Lease, lease_ms: u64) -> Result<Timestamp, LedgerError> {
        let record = self.worker_transition(lease, |r, now| {
            transition::heartbeat(&r.command, &lease.token, lease_ms, now)
        })?;
        record
            .command
            .lease_until
            .ok_or_else(|| LedgerError::Internal("renewed lease has no deadline".into()))
    }

    /// Begins a step.
    pub fn begin_step(&self, lease: &Lease, ordinal: u32, lease_ms: u64) -> Result<(), LedgerError> {
        self.worker_transition(lease, |r, now| {
            transition::begin_step(r, ordinal, &lease.token, lease_ms, now)
        })
        .map(drop)
    }

    /// Completes a step with its evidence and target receipt.
    pub fn complete_step(
        &self,
        lease: &Lease,
        ordinal: u32,
        evidence: &Value,
        target_receipt: &Value,
        lease_ms: u64,
    ) -> Result<(), LedgerError> {
        self.worker_transition(lease, |r, now| {
            transition::complete_step(r, ordinal, evidence, target_receipt, &lease.token, lease_ms, now)
        })
        .map(drop)
    }

    /// Completes a step and, in the same transaction, begins the next one or
    /// finishes the attempt after the last.
    pub fn complete_and_continue(
        &self,
        lease: &Lease,
        ordinal: u32,
        evidence: &Value,
        target_receipt: &Value,
        lease_ms: u64,
    ) -> Result<Continued, LedgerError> {
        let mut continued = Continued::Finished;
        self.worker_transition(lease, |r, now| {
            let (c, writes) =
                transition::complete_and_continue(r, ordinal, evidence, target_receipt, &lease.token, lease_ms, now)?;
            continued = c;
            Ok(writes)
        })?;
        Ok(continued)
    }

    /// Fails the attempt (at a step, if given).
    pub fn fail(&self, lease: &Lease, ordinal: Option<u32>, error: &str) -> Result<(), LedgerError> {
        self.worker_transition(lease, |r, now| transition::fail(r, ordinal, error, &lease.token, now))
            .map(drop)
    }

    /// Finishes the attempt: SUCCEEDED and DELIVERED.
    pub fn finish(&self, lease: &Lease) -> Result<(), LedgerError> {
        self.worker_transition(lease, |r, now| transition::finish(r, &lease.token, now))
            .map(drop)
    }

    /// Requeues an attempt whose lease expired; refuses a live lease.
    pub fn reconcile(&self, attempt: &AttemptId) -> Result<(ReconcileOutcome, AttemptRecord), LedgerError> {
        let mut tx = self.write_tx()?;
        let now = self.clock.now();
        let mut record = rows::read_record(&tx, attempt)?.ok_or_else(|| not_found("attempt", attempt))?;
        let plan =
            rows::read_plan(&tx, &record.attempt.plan_id)?.ok_or_else(|| not_found("plan", &record.attempt.plan_id))?;
        let (outcome, writes) = transition::reconcile(&record, plan.recovery, now)?;
        rows::apply_writes(&mut tx, &writes)?;
        writes.apply_to(&mut record);
        tx.commit().sql()?;
        Ok((outcome, record))
    }

    /// Aborts a QUEUED or RUNNING attempt, fencing its worker.
    pub fn abort(&self, attempt: &AttemptId, reason: &str) -> Result<AttemptRecord, LedgerError> {
        let mut tx = self.write_tx()?;
        let now = self.clock.now();
        let mut record = rows::read_record(&tx, attempt)?.ok_or_else(|| not_found("attempt", attempt))?;
        let writes = transition::abort(&record, reason, now)?;
        rows::apply_writes(&mut tx, &writes)?;
        writes.apply_to(&mut record);
        tx.commit().sql()?;
        Ok(record)
    }

    /// An attempt with its command and receipts.
    pub fn attempt(&self, attempt: &AttemptId) -> Result<AttemptRecord, LedgerError> {
        let tx = self.read_tx()?;
        rows::read_record(&tx, attempt)?.ok_or_else(|| not_found("attempt", attempt))
    }

    /// Every attempt of a plan, by number.
    pub fn history(&self, plan: &PlanId) -> Result<Vec<AttemptRecord>, LedgerError> {
        let tx = self.read_tx()?;
        rows::read_plan(&tx, plan)?.ok_or_else(|| not_found("plan", plan))?;
        rows::read_history(&tx, plan)
    }

    /// How many attempts are QUEUED or RUNNING.
    pub fn open_attempts(&self) -> Result<u64, LedgerError> {
        let tx = self.read_tx()?;
        rows::count_open_attempts(&tx)
    }

    /// One worker transition: read the record in lock order, let the engine decide at
    /// the ledger's `now`, write under the engine's guard; answers the record as
    /// written.
    fn worker_transition(
        &self,
        lease: &Lease,
        decide: impl FnOnce(&AttemptRecord, Timestamp) -> Result<Writes, Refusal>,
    ) -> Result<AttemptRecord, LedgerError> {
        let mut tx = self.write_tx()?;
        let now = self.clock.now();
        let mut record =
            rows::read_record(&tx, &lease.attempt_id)?.ok_or_else(|| not_found("attempt", &lease.attempt_id))?;
        if record.command.id != lease.command_id {
            return Err(not_found("command", &lease.command_id));
        }
        let writes = decide(&record, now)?;
        rows::apply_writes(&mut tx, &writes)?;
        writes.apply_to(&mut record);
        tx.commit().sql()?;
        Ok(record)
    }
}
