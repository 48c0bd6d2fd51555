//! Rows ↔ engine model, and the SQL interpreter of the engine's [`Guard`].
//!
//! Reads parse every column strictly: a status text the engine does not know, a NULL
//! where a value belongs or a negative count is [`LedgerError::Integrity`]. Writes
//! apply the engine's full row images; the command row's `UPDATE` carries the guard
//! as its `WHERE` clause and zero affected rows is a refusal. Lease tokens are bound
//! as parameters only, so no SQL text or error message ever contains one.

use super::super::migrate::{Migration, MigrationTarget};
use super::super::LedgerError;
use leasehold_engine::{
    Attempt, AttemptId, AttemptRecord, Command, CommandId, Guard, Plan, PlanId, PlanStatus, Receipt, Refusal, Step,
    Timestamp, Writes,
};
use rusqlite::types::{FromSql, ToSqlOutput, ValueRef};
use rusqlite::{params_from_iter, Connection, ErrorCode, Row};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::str::FromStr;
use std::sync::LazyLock;

/// Maps a rusqlite error: busy or locked is retryable, a value that does not convert
/// is an integrity error, anything else is internal.
pub(super) fn sql_error(e: rusqlite::Error) -> LedgerError {
    match &e {
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) =>
        {
            LedgerError::Unavailable(format!("sqlite: {e}"))
        }
        rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => LedgerError::Integrity(format!("sqlite: {e}")),
        _ => LedgerError::Internal(format!("sqlite: {e}")),
    }
}

/// `.sql()` on a rusqlite result: the error mapped by [`sql_error`].
pub(super) trait SqlResult<T> {
    /// The result with its error mapped to a [`LedgerError`].
    fn sql(self) -> Result<T, LedgerError>;
}

impl<T> SqlResult<T> for rusqlite::Result<T> {
    fn sql(self) -> Result<T, LedgerError> {
        self.map_err(sql_error)
    }
}

pub(super) fn not_found(kind: &'static str, id: impl ToString) -> LedgerError {
    LedgerError::NotFound {
        kind,
        id: id.to_string(),
    }
}

const PLAN_COLUMNS: &str = "id, name, status, recovery, steps_json, volatile_fields_json, fingerprint, created_at";
const ATTEMPT_COLUMNS: &str = "id, plan_id, number, action, status, created_at, started_at, finished_at, error";
const COMMAND_COLUMNS: &str = "id, attempt_id, status, available_at, lease_owner, lease_token, lease_until, \
     last_heartbeat_at, delivery_count, last_error, finished_at";
const RECEIPT_COLUMNS: &str = "attempt_id, ordinal, step_code, idempotency_key, status, evidence, evidence_sha256, \
     target_receipt, error, started_at, finished_at";

/// Strict column readers over one row of one table.
struct Cols<'a, 'b> {
    row: &'a Row<'b>,
    table: &'static str,
    /// The index of the table's first column in the row (joins put several tables
    /// side by side).
    base: usize,
}

impl<'a, 'b> Cols<'a, 'b> {
    fn new(row: &'a Row<'b>, table: &'static str) -> Self {
        Self::at(row, table, 0)
    }

    /// The table whose first column is column `base` of the row.
    fn at(row: &'a Row<'b>, table: &'static str, base: usize) -> Self {
        Self { row, table, base }
    }

    /// Whether the table's first column (its key) is not NULL: a LEFT JOIN found a row.
    fn present(&self) -> Result<bool, LedgerError> {
        Ok(self.get::<Option<String>>(0)?.is_some())
    }

    fn get<T: FromSql>(&self, idx: usize) -> Result<T, LedgerError> {
        self.row.get(self.base + idx).map_err(|e| match sql_error(e) {
            LedgerError::Integrity(m) => LedgerError::Integrity(format!("{} row: {m}", self.table)),
            other => other,
        })
    }

    fn text_enum<T: FromStr>(&self, idx: usize) -> Result<T, LedgerError>
    where
        T::Err: std::fmt::Display,
    {
        let text: String = self.get(idx)?;
        text.parse()
            .map_err(|e| LedgerError::Integrity(format!("{} row: {e}", self.table)))
    }

    fn timestamp(&self, idx: usize) -> Result<Timestamp, LedgerError> {
        self.get::<i64>(idx).map(Timestamp::from_millis)
    }

    fn opt_timestamp(&self, idx: usize) -> Result<Option<Timestamp>, LedgerError> {
        Ok(self.get::<Option<i64>>(idx)?.map(Timestamp::from_millis))
    }

    fn count(&self, idx: usize) -> Result<u32, LedgerError> {
        let n: i64 = self.get(idx)?;
        u32::try_from(n).map_err(|_| LedgerError::Integrity(format!("{} row: {n} is not a valid count", self.table)))
    }

    fn json<T: serde::de::DeserializeOwned>(&self, idx: usize) -> Result<T, LedgerError> {
        let text: String = self.get(idx)?;
        serde_json::from_str(&text).map_err(|e| LedgerError::Integrity(format!("{} row: bad JSON: {e}", self.table)))
    }
}

fn plan_from_row(row: &Row<'_>) -> Result<Plan, LedgerError> {
    plan_at(row, 0)
}

/// The plan whose [`PLAN_COLUMNS`] start at column `base`.
fn plan_at(row: &Row<'_>, base: usize) -> Result<Plan, LedgerError> {
    let c = Cols::at(row, "plan", base);
    Ok(Plan {
        id: PlanId::new(c.get::<String>(0)?),
        name: c.get(1)?,
        status: c.text_enum(2)?,
        recovery: c.text_enum(3)?,
        steps: c.json::<Vec<Step>>(4)?,
        volatile_fields: c.json::<Vec<String>>(5)?,
        fingerprint: c.get(6)?,
        created_at: c.timestamp(7)?,
    })
}

fn attempt_from_row(row: &Row<'_>) -> Result<Attempt, LedgerError> {
    attempt_at(row, 0)
}

/// The attempt whose [`ATTEMPT_COLUMNS`] start at column `base`.
fn attempt_at(row: &Row<'_>, base: usize) -> Result<Attempt, LedgerError> {
    let c = Cols::at(row, "attempt", base);
    Ok(Attempt {
        id: AttemptId::new(c.get::<String>(0)?),
        plan_id: PlanId::new(c.get::<String>(1)?),
        number: c.count(2)?,
        action: c.text_enum(3)?,
        status: c.text_enum(4)?,
        created_at: c.timestamp(5)?,
        started_at: c.opt_timestamp(6)?,
        finished_at: c.opt_timestamp(7)?,
        error: c.get(8)?,
    })
}

fn command_from_row(row: &Row<'_>) -> Result<Command, LedgerError> {
    command_at(row, 0)
}

/// The command whose [`COMMAND_COLUMNS`] start at column `base`.
fn command_at(row: &Row<'_>, base: usize) -> Result<Command, LedgerError> {
    let c = Cols::at(row, "command", base);
    Ok(Command {
        id: CommandId::new(c.get::<String>(0)?),
        attempt_id: AttemptId::new(c.get::<String>(1)?),
        status: c.text_enum(2)?,
        available_at: c.timestamp(3)?,
        lease_owner: c.get(4)?,
        lease_token: c.get::<Option<String>>(5)?.map(leasehold_engine::LeaseToken::new),
        lease_until: c.opt_timestamp(6)?,
        last_heartbeat_at: c.opt_timestamp(7)?,
        delivery_count: c.count(8)?,
        last_error: c.get(9)?,
        finished_at: c.opt_timestamp(10)?,
    })
}

fn receipt_from_row(row: &Row<'_>) -> Result<Receipt, LedgerError> {
    receipt_at(row, 0)
}

/// The receipt of a `LEFT JOIN receipt` row whose [`RECEIPT_COLUMNS`] start at
/// column `base`, if the join found one.
fn receipt_if_any(row: &Row<'_>, base: usize) -> Result<Option<Receipt>, LedgerError> {
    if Cols::at(row, "receipt", base).present()? {
        receipt_at(row, base).map(Some)
    } else {
        Ok(None)
    }
}

/// The receipt whose [`RECEIPT_COLUMNS`] start at column `base`.
fn receipt_at(row: &Row<'_>, base: usize) -> Result<Receipt, LedgerError> {
    let c = Cols::at(row, "receipt", base);
    Ok(Receipt {
        attempt_id: AttemptId::new(c.get::<String>(0)?),
        ordinal: c.count(1)?,
        step_code: c.get(2)?,
        idempotency_key: c.get(3)?,
        status: c.text_enum(4)?,
        evidence: c.get(5)?,
        evidence_sha256: c.get(6)?,
        target_receipt: c.get(7)?,
        error: c.get(8)?,
        started_at: c.opt_timestamp(9)?,
        finished_at: c.opt_timestamp(10)?,
    })
}

/// Runs a query and parses every row.
fn query_all<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    parse: impl Fn(&Row<'_>) -> Result<T, LedgerError>,
) -> Result<Vec<T>, LedgerError> {
    let mut stmt = conn.prepare_cached(sql).sql()?;
    let mut rows = stmt.query(params).sql()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().sql()? {
        out.push(parse(row)?);
    }
    Ok(out)
}

/// Runs a query and parses its first row, if any.
fn query_one<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    parse: impl Fn(&Row<'_>) -> Result<T, LedgerError>,
) -> Result<Option<T>, LedgerError> {
    let mut stmt = conn.prepare_cached(sql).sql()?;
    let mut rows = stmt.query(params).sql()?;
    match rows.next().sql()? {
        Some(row) => parse(row).map(Some),
        None => Ok(None),
    }
}

/// A plan by id.
pub(super) fn read_plan(conn: &Connection, id: &PlanId) -> Result<Option<Plan>, LedgerError> {
    query_one(
        conn,
        &format!("SELECT {PLAN_COLUMNS} FROM plan WHERE id = ?1"),
        [id.as_str()],
        plan_from_row,
    )
}

/// The oldest READY plan with this fingerprint.
pub(super) fn read_ready_plan_by_fingerprint(
    conn: &Connection,
    fingerprint: &str,
) -> Result<Option<Plan>, LedgerError> {
    query_one(
        conn,
        &format!("SELECT {PLAN_COLUMNS} FROM plan WHERE fingerprint = ?1 AND status = 'READY' ORDER BY rowid LIMIT 1"),
        [fingerprint],
        plan_from_row,
    )
}

/// Every plan, in registration order.
pub(super) fn read_plans(conn: &Connection) -> Result<Vec<Plan>, LedgerError> {
    query_all(
        conn,
        &format!("SELECT {PLAN_COLUMNS} FROM plan ORDER BY rowid"),
        [],
        plan_from_row,
    )
}

/// Inserts a newly registered plan.
pub(super) fn insert_plan(conn: &Connection, plan: &Plan) -> Result<(), LedgerError> {
    let steps = serde_json::to_string(&plan.steps).map_err(|e| LedgerError::Internal(format!("plan steps: {e}")))?;
    let volatile = serde_json::to_string(&plan.volatile_fields)
        .map_err(|e| LedgerError::Internal(format!("plan volatile fields: {e}")))?;
    conn.prepare_cached(
        "INSERT INTO plan (id, name, status, recovery, steps_json, volatile_fields_json, fingerprint, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )
    .sql()?
    .execute(rusqlite::params![
        plan.id.as_str(),
        plan.name,
        plan.status.as_str(),
        plan.recovery.as_str(),
        steps,
        volatile,
        plan.fingerprint,
        plan.created_at.as_millis(),
    ])
    .sql()?;
    Ok(())
}

/// Sets a plan's status; answers whether the plan exists.
pub(super) fn set_plan_status(conn: &Connection, id: &PlanId, status: PlanStatus) -> Result<bool, LedgerError> {
    let n = conn
        .prepare_cached("UPDATE plan SET status = ?1 WHERE id = ?2")
        .sql()?
        .execute([status.as_str(), id.as_str()])
        .sql()?;
    Ok(n > 0)
}

/// [`ATTEMPT_COLUMNS`] of the attempt aliased `a`, then [`COMMAND_COLUMNS`] of the
/// command aliased `c`: one row of an attempt beside its command.
const ATTEMPT_AND_COMMAND: &str = "a.id, a.plan_id, a.number, a.action, a.status, a.created_at, a.started_at, \
     a.finished_at, a.error, c.id, c.attempt_id, c.status, c.available_at, c.lease_owner, c.lease_token, \
     c.lease_until, c.last_heartbeat_at, c.delivery_count, c.last_error, c.finished_at";
/// Where the command's columns start in an [`ATTEMPT_AND_COMMAND`] row.
const COMMAND_BASE: usize = 9;

/// An attempt and its command from one [`ATTEMPT_AND_COMMAND`] row (the command's
/// columns NULL when the attempt has none: an integrity error).
fn attempt_and_command(row: &Row<'_>) -> Result<(Attempt, Command), LedgerError> {
    let attempt = attempt_at(row, 0)?;
    if !Cols::at(row, "command", COMMAND_BASE).present()? {
        return Err(LedgerError::Integrity(format!("attempt {} has no command", attempt.id)));
    }
    Ok((attempt, command_at(row, COMMAND_BASE)?))
}

/// An attempt with its command and receipts, in one statement (one row per
/// receipt). (In a write transaction SQLite's lock is the whole database, taken
/// before the first read, so the order in which rows are read cannot deadlock.)
pub(super) fn read_record(conn: &Connection, id: &AttemptId) -> Result<Option<AttemptRecord>, LedgerError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {ATTEMPT_AND_COMMAND}, r.attempt_id, r.ordinal, r.step_code, r.idempotency_key, r.status, \
             r.evidence, r.evidence_sha256, r.target_receipt, r.error, r.started_at, r.finished_at \
             FROM attempt a LEFT JOIN command c ON c.attempt_id = a.id LEFT JOIN receipt r ON r.attempt_id = a.id \
             WHERE a.id = ?1"
        )
    });
    let mut stmt = conn.prepare_cached(&SQL).sql()?;
    let mut rows = stmt.query([id.as_str()]).sql()?;
    let mut record: Option<AttemptRecord> = None;
    const RECEIPT_BASE: usize = COMMAND_BASE + 11;
    while let Some(row) = rows.next().sql()? {
        let record = match &mut record {
            Some(r) => r,
            None => {
                let (attempt, command) = attempt_and_command(row)?;
                record.insert(AttemptRecord {
                    attempt,
                    command,
                    receipts: Vec::new(),
                })
            }
        };
        record.receipts.extend(receipt_if_any(row, RECEIPT_BASE)?);
    }
    if let Some(record) = &mut record {
        record.receipts.sort_by_key(|r| r.ordinal);
    }
    Ok(record)
}

/// Every attempt of a plan with its command and receipts, by number; read in lock
/// order (all attempts, then their commands, then their receipts).
pub(super) fn read_history(conn: &Connection, plan: &PlanId) -> Result<Vec<AttemptRecord>, LedgerError> {
    let attempts = query_all(
        conn,
        &format!("SELECT {ATTEMPT_COLUMNS} FROM attempt WHERE plan_id = ?1 ORDER BY number"),
        [plan.as_str()],
        attempt_from_row,
    )?;
    if attempts.is_empty() {
        return Ok(Vec::new());
    }
    let mut commands: BTreeMap<AttemptId, Command> = query_all(
        conn,
        &format!(
            "SELECT {COMMAND_COLUMNS} FROM command WHERE attempt_id IN (SELECT id FROM attempt WHERE plan_id = ?1)"
        ),
        [plan.as_str()],
        command_from_row,
    )?
    .into_iter()
    .map(|c| (c.attempt_id.clone(), c))
    .collect();
    let mut receipts: BTreeMap<AttemptId, Vec<Receipt>> = BTreeMap::new();
    for r in query_all(
        conn,
        &format!(
            "SELECT {RECEIPT_COLUMNS} FROM receipt WHERE attempt_id IN (SELECT id FROM attempt WHERE plan_id = ?1) \
             ORDER BY attempt_id, ordinal"
        ),
        [plan.as_str()],
        receipt_from_row,
    )? {
        receipts.entry(r.attempt_id.clone()).or_default().push(r);
    }
    attempts
        .into_iter()
        .map(|attempt| {
            let command = commands
                .remove(&attempt.id)
                .ok_or_else(|| LedgerError::Integrity(format!("attempt {} has no command", attempt.id)))?;
            let receipts = receipts.remove(&attempt.id).unwrap_or_default();
            Ok(AttemptRecord {
                attempt,
                command,
                receipts,
            })
        })
        .collect()
}

/// The claim statement over the commands matching `$range` (one partial index's
/// range): see [`CLAIM_PENDING_SQL`].
macro_rules! claim_sql {
    ($range:literal) => {
        concat!(
            "SELECT a.id, a.plan_id, a.number, a.action, a.status, a.created_at, a.started_at, a.finished_at, \
             a.error, c.id, c.attempt_id, c.status, c.available_at, c.lease_owner, c.lease_token, c.lease_until, \
             c.last_heartbeat_at, c.delivery_count, c.last_error, c.finished_at, p.id, p.name, p.status, \
             p.recovery, p.steps_json, p.volatile_fields_json, p.fingerprint, p.created_at, r.attempt_id, \
             r.ordinal, r.step_code, r.idempotency_key, r.status, r.evidence, r.evidence_sha256, \
             r.target_receipt, r.error, r.started_at, r.finished_at \
             FROM (SELECT rowid AS rid FROM command WHERE ",
            $range,
            " ORDER BY available_at, id LIMIT ?2) k \
             CROSS JOIN command c ON c.rowid = k.rid CROSS JOIN attempt a ON a.id = c.attempt_id \
             CROSS JOIN plan p ON p.id = a.plan_id LEFT JOIN receipt r ON r.attempt_id = a.id"
        )
    };
}

/// A claim's candidates of one kind, with everything a claim reads: the limited
/// range of one partial index (`command_pending` for PENDING commands by
/// availability, `command_leased` for PROCESSING ones whose lease has expired), each
/// command beside its attempt and its plan, once per receipt (or once with
/// NULL receipt columns for an attempt without any). Rows come in no particular
/// order: [`claim_candidates`] sorts them.
pub(super) const CLAIM_PENDING_SQL: &str = claim_sql!("status = 'PENDING' AND available_at <= ?1");
/// [`CLAIM_PENDING_SQL`] for PROCESSING commands whose lease has expired.
pub(super) const CLAIM_EXPIRED_SQL: &str = claim_sql!("status = 'PROCESSING' AND lease_until < ?1");
/// Whether any lease has expired at `?1`: one probe of `command_leased`, asked before
/// [`CLAIM_EXPIRED_SQL`], which sorts its range by availability (a temporary B-tree
/// built on every run, even for an empty range, about a twentieth of a claim).
pub(super) const ANY_EXPIRED_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM command WHERE status = 'PROCESSING' AND lease_until < ?1)";
/// Where the plan's and then the receipt's columns start in a claim row.
const CLAIM_PLAN_BASE: usize = COMMAND_BASE + 11;
const CLAIM_RECEIPT_BASE: usize = CLAIM_PLAN_BASE + 8;

/// A claim candidate: its attempt's record as read, and its plan.
pub(super) type Candidate = (AttemptRecord, Plan);

/// The commands a claim at `now` may take, oldest `available_at` first (then by
/// command id), at most `batch`, each with its attempt, receipts (by ordinal) and
/// plan: one statement per partial index, each an index range scan limited to
/// `batch` (written as one `OR`, SQLite unions both whole ranges and sorts every
/// claimable command on each claim); the expired range only when
/// [`ANY_EXPIRED_SQL`] finds it is not empty.
pub(super) fn claim_candidates(conn: &Connection, now: Timestamp, batch: u32) -> Result<Vec<Candidate>, LedgerError> {
    let mut found: BTreeMap<(Timestamp, CommandId), Candidate> = BTreeMap::new();
    let expired: bool = conn
        .prepare_cached(ANY_EXPIRED_SQL)
        .sql()?
        .query_row([now.as_millis()], |row| row.get(0))
        .sql()?;
    let sqls: &[&str] = if expired {
        &[CLAIM_PENDING_SQL, CLAIM_EXPIRED_SQL]
    } else {
        &[CLAIM_PENDING_SQL]
    };
    for &sql in sqls {
        let mut stmt = conn.prepare_cached(sql).sql()?;
        let mut rows = stmt.query(rusqlite::params![now.as_millis(), i64::from(batch)]).sql()?;
        while let Some(row) = rows.next().sql()? {
            let command = command_at(row, COMMAND_BASE)?;
            let key = (command.available_at, command.id.clone());
            let (record, _) = match found.entry(key) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    let record = AttemptRecord {
                        attempt: attempt_at(row, 0)?,
                        command,
                        receipts: Vec::new(),
                    };
                    v.insert((record, plan_at(row, CLAIM_PLAN_BASE)?))
                }
            };
            record.receipts.extend(receipt_if_any(row, CLAIM_RECEIPT_BASE)?);
        }
    }
    Ok(found
        .into_values()
        .take(batch as usize)
        .map(|(mut record, plan)| {
            record.receipts.sort_by_key(|r| r.ordinal);
            (record, plan)
        })
        .collect())
}

/// How many attempts are QUEUED or RUNNING.
pub(super) fn count_open_attempts(conn: &Connection) -> Result<u64, LedgerError> {
    let n: i64 = conn
        // QUEUED attempts have PENDING commands and RUNNING ones PROCESSING commands:
        // both counts are read from the commands' partial indexes.
        .prepare_cached(
            "SELECT (SELECT COUNT(*) FROM command WHERE status = 'PENDING') \
                  + (SELECT COUNT(*) FROM command WHERE status = 'PROCESSING')",
        )
        .sql()?
        .query_row([], |row| row.get(0))
        .sql()?;
    u64::try_from(n).map_err(|_| LedgerError::Internal(format!("negative count {n}")))
}

/// A value to bind, borrowed from the row image it comes from (no copies).
type Val<'a> = ValueRef<'a>;

fn ts<'a>(t: Timestamp) -> Val<'a> {
    ValueRef::Integer(t.as_millis())
}

fn opt_ts<'a>(t: Option<Timestamp>) -> Val<'a> {
    t.map_or(ValueRef::Null, ts)
}

fn text(s: &str) -> Val<'_> {
    ValueRef::Text(s.as_bytes())
}

fn opt_text(s: Option<&str>) -> Val<'_> {
    s.map_or(ValueRef::Null, text)
}

/// The guard as a SQL condition on the command row over parameters `?2` and `?3`
/// (`?1` is the key).
struct GuardSql<'a> {
    condition: &'static str,
    /// Which guard (part of a statement's cache key).
    kind: u32,
    /// The values of `?2` and `?3` (`NULL` where unused).
    values: [Val<'a>; 2],
    /// How many of them the condition uses.
    used: usize,
}

/// The guard's SQL; `Guard::Absent` has none: it is an `INSERT`.
fn guard_condition(guard: &Guard) -> Option<GuardSql<'_>> {
    match guard {
        Guard::Absent => None,
        Guard::Holds(token) => Some(GuardSql {
            condition: "status = 'PROCESSING' AND lease_token = ?2",
            kind: 1,
            values: [text(token.expose()), ValueRef::Null],
            used: 1,
        }),
        Guard::Claimable(now) => Some(GuardSql {
            condition: "((status = 'PENDING' AND available_at <= ?2) OR (status = 'PROCESSING' AND lease_until < ?2))",
            kind: 2,
            values: [ts(*now), ValueRef::Null],
            used: 1,
        }),
        Guard::Unchanged { status, lease_token } => Some(GuardSql {
            condition: "status = ?2 AND lease_token IS ?3",
            kind: 3,
            values: [
                text(status.as_str()),
                opt_text(lease_token.as_ref().map(|t| t.expose())),
            ],
            used: 2,
        }),
    }
}

fn attempt_values(a: &Attempt) -> [Val<'_>; 9] {
    [
        text(a.id.as_str()),
        text(a.plan_id.as_str()),
        ValueRef::Integer(a.number.into()),
        text(a.action.as_str()),
        text(a.status.as_str()),
        ts(a.created_at),
        opt_ts(a.started_at),
        opt_ts(a.finished_at),
        opt_text(a.error.as_deref()),
    ]
}

fn command_values(c: &Command) -> [Val<'_>; 11] {
    [
        text(c.id.as_str()),
        text(c.attempt_id.as_str()),
        text(c.status.as_str()),
        ts(c.available_at),
        opt_text(c.lease_owner.as_deref()),
        opt_text(c.lease_token.as_ref().map(|t| t.expose())),
        opt_ts(c.lease_until),
        opt_ts(c.last_heartbeat_at),
        ValueRef::Integer(c.delivery_count.into()),
        opt_text(c.last_error.as_deref()),
        opt_ts(c.finished_at),
    ]
}

fn receipt_values(r: &Receipt) -> [Val<'_>; 11] {
    [
        text(r.attempt_id.as_str()),
        ValueRef::Integer(r.ordinal.into()),
        text(&r.step_code),
        text(&r.idempotency_key),
        text(r.status.as_str()),
        opt_text(r.evidence.as_deref()),
        opt_text(r.evidence_sha256.as_deref()),
        opt_text(r.target_receipt.as_deref()),
        opt_text(r.error.as_deref()),
        opt_ts(r.started_at),
        opt_ts(r.finished_at),
    ]
}

fn execute(conn: &Connection, sql: &str, values: &[Val<'_>]) -> Result<usize, LedgerError> {
    conn.prepare_cached(sql)
        .sql()?
        .execute(params_from_iter(values.iter().map(|v| ToSqlOutput::Borrowed(*v))))
        .sql()
}

/// The tables a write statement's cache key names.
#[derive(Clone, Copy)]
enum Table {
    Attempt = 0,
    Command = 1,
    Receipt = 2,
    /// `check_guard`'s read of the command.
    Guard = 3,
}

/// The text of an `UPDATE` (or of `check_guard`'s read), built once per thread for
/// each key: the table, the guard's kind and the set of columns it changes (never
/// empty for an `UPDATE`). (`prepare_cached` finds the prepared statement by this
/// text; building it with `format!` on every write was a tenth of a transition's
/// instructions.)
fn statement(table: Table, guard: u32, changed: u32, build: impl FnOnce() -> String) -> Rc<str> {
    thread_local! {
        static STATEMENTS: RefCell<HashMap<u64, Rc<str>>> = RefCell::new(HashMap::new());
    }
    let key = (u64::from(changed) << 8) | (u64::from(guard) << 2) | table as u64;
    STATEMENTS.with(|cache| Rc::clone(cache.borrow_mut().entry(key).or_insert_with(|| build().into())))
}

fn stale(command: &CommandId) -> LedgerError {
    LedgerError::Refused(Refusal::StaleToken {
        command: command.clone(),
    })
}

/// Inserts the engine's images of a new attempt (`Guard::Absent`: attempt, command,
/// receipts) inside the caller's transaction, all or nothing (under a savepoint). A command that already
/// exists answers [`Refusal::StaleToken`] and leaves every row as it was.
pub(super) fn insert_writes(conn: &Connection, writes: &Writes) -> Result<(), LedgerError> {
    if writes.guard != Guard::Absent {
        return Err(LedgerError::Internal("an insert needs the absent guard".into()));
    }
    conn.prepare_cached("SAVEPOINT leasehold_insert")
        .and_then(|mut s| s.execute([]))
        .sql()?;
    let done = insert_images(conn, writes);
    let end = if done.is_ok() {
        "RELEASE leasehold_insert"
    } else {
        "ROLLBACK TO leasehold_insert; RELEASE leasehold_insert"
    };
    conn.execute_batch(end).sql()?;
    done
}

/// Applies the engine's writes over `before`, the attempt's rows as read in this same
/// write transaction: each row's `UPDATE` sets only the columns whose value changes,
/// so that no index over an unchanged column is rewritten.
///
/// The command's `UPDATE` goes first and carries the guard as its `WHERE` clause: a
/// guard that no longer holds answers [`Refusal::StaleToken`] having written nothing
/// (no savepoint needed). Then the attempt, then the receipts. Any other error may
/// leave earlier writes of the transaction in place: the caller must then abandon the
/// transaction (every caller returns the error, and dropping the transaction rolls
/// it back). Writes without any image write nothing. (SQLite's write lock is the
/// whole database, taken by `BEGIN IMMEDIATE` before the first read, so the order of
/// the statements inside cannot deadlock with another transition.)
pub(super) fn update_writes(conn: &Connection, before: &AttemptRecord, writes: &Writes) -> Result<(), LedgerError> {
    if writes.is_empty() {
        return Ok(());
    }
    if writes.guard == Guard::Absent {
        return Err(LedgerError::Internal(
            "an update needs a guard other than absent".into(),
        ));
    }
    match &writes.command {
        Some(c) => update_command(conn, &before.command, c, &writes.guard)?,
        // The engine renews or rewrites the command whenever it changes anything;
        // should it ever not, the guard must still hold.
        None => check_guard(conn, &before.attempt.id, &writes.guard)?,
    }
    if let Some(a) = &writes.attempt {
        let mut values = vec![text(a.id.as_str())];
        let changed = push_changed(
            &ATTEMPT_MUTABLE,
            &attempt_values(&before.attempt),
            &attempt_values(a),
            &mut values,
        );
        if changed != 0 {
            let sql = statement(Table::Attempt, 0, changed, || {
                format!(
                    "UPDATE attempt SET {} WHERE id = ?1",
                    set_clause(&ATTEMPT_MUTABLE, changed, 2)
                )
            });
            if execute(conn, &sql, &values)? == 0 {
                return Err(LedgerError::Integrity(format!(
                    "attempt {} vanished during a transition",
                    a.id
                )));
            }
        }
    }
    for r in &writes.receipts {
        let old = before.receipt(r.ordinal).ok_or_else(|| {
            LedgerError::Internal(format!(
                "attempt {} has no receipt {} to update",
                r.attempt_id, r.ordinal
            ))
        })?;
        let mut values = vec![text(r.attempt_id.as_str()), ValueRef::Integer(r.ordinal.into())];
        let changed = push_changed(&RECEIPT_MUTABLE, &receipt_values(old), &receipt_values(r), &mut values);
        if changed == 0 {
            continue;
        }
        let sql = statement(Table::Receipt, 0, changed, || {
            format!(
                "UPDATE receipt SET {} WHERE attempt_id = ?1 AND ordinal = ?2",
                set_clause(&RECEIPT_MUTABLE, changed, 3)
            )
        });
        if execute(conn, &sql, &values)? == 0 {
            return Err(LedgerError::Integrity(format!(
                "receipt {} of attempt {} vanished during a transition",
                r.ordinal, r.attempt_id
            )));
        }
    }
    Ok(())
}

/// Applies the writes of several transitions (a claim's batch), each over the rows
/// read for it (`before`), one after the other as [`update_writes`] does; answers,
/// for each item, whether its guard held and its writes were applied (a refused item
/// wrote nothing). On any other error the caller must abandon the transaction.
///
/// One prepared `UPDATE` per row, by key: measured against one
/// `UPDATE … FROM json_each(?)` per table for the whole batch, it runs fewer
/// instructions per claim (callgrind, batch 32: 101k against 122k), because every
/// `->>` re-parses the bound JSON.
pub(super) fn update_many(conn: &Connection, items: &[(&AttemptRecord, &Writes)]) -> Result<Vec<bool>, LedgerError> {
    items
        .iter()
        .map(|(before, writes)| match update_writes(conn, before, writes) {
            Ok(()) => Ok(true),
            Err(LedgerError::Refused(_)) => Ok(false),
            Err(e) => Err(e),
        })
        .collect()
}

/// Appends to `values` the new values of the mutable columns whose value differs
/// between `before` and `after`, in `mutable`'s order; answers which ones (bit `k`
/// for `mutable[k]`).
fn push_changed<'a>(
    mutable: &[(usize, &str)],
    before: &[Val<'_>],
    after: &[Val<'a>],
    values: &mut Vec<Val<'a>>,
) -> u32 {
    let mut changed = 0;
    for (k, &(i, _)) in mutable.iter().enumerate() {
        if before[i] != after[i] {
            changed |= 1 << k;
            values.push(after[i]);
        }
    }
    changed
}

/// The `SET` clause (`col = ?first, …`) of the columns `changed` names.
fn set_clause(mutable: &[(usize, &str)], changed: u32, first: usize) -> String {
    mutable
        .iter()
        .enumerate()
        .filter(|(k, _)| changed & (1 << k) != 0)
        .enumerate()
        .map(|(n, (_, (_, name)))| format!("{name} = ?{}", first + n))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns a transition may change, by their index in the table's values
/// ([`attempt_values`], [`command_values`], [`receipt_values`]); the others are
/// identity.
const ATTEMPT_MUTABLE: [(usize, &str); 4] = [(4, "status"), (6, "started_at"), (7, "finished_at"), (8, "error")];
const COMMAND_MUTABLE: [(usize, &str); 9] = [
    (2, "status"),
    (3, "available_at"),
    (4, "lease_owner"),
    (5, "lease_token"),
    (6, "lease_until"),
    (7, "last_heartbeat_at"),
    (8, "delivery_count"),
    (9, "last_error"),
    (10, "finished_at"),
];
const RECEIPT_MUTABLE: [(usize, &str); 7] = [
    (4, "status"),
    (5, "evidence"),
    (6, "evidence_sha256"),
    (7, "target_receipt"),
    (8, "error"),
    (9, "started_at"),
    (10, "finished_at"),
];

/// The three rows of a new attempt, as [`insert_writes`] inserts them.
fn insert_images(conn: &Connection, writes: &Writes) -> Result<(), LedgerError> {
    let (Some(attempt), Some(command)) = (&writes.attempt, &writes.command) else {
        return Err(LedgerError::Internal(
            "a new attempt needs its attempt and command images".into(),
        ));
    };
    static ATTEMPT: LazyLock<String> = LazyLock::new(|| {
        format!("INSERT INTO attempt ({ATTEMPT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")
    });
    static COMMAND: LazyLock<String> = LazyLock::new(|| {
        format!(
            "INSERT INTO command ({COMMAND_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
             ON CONFLICT DO NOTHING"
        )
    });
    static RECEIPT: LazyLock<String> = LazyLock::new(|| {
        format!("INSERT INTO receipt ({RECEIPT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)")
    });
    execute(conn, &ATTEMPT, &attempt_values(attempt))?;
    if execute(conn, &COMMAND, &command_values(command))? == 0 {
        return Err(stale(&command.id));
    }
    for r in &writes.receipts {
        execute(conn, &RECEIPT, &receipt_values(r))?;
    }
    Ok(())
}

/// The command's new image over `before`, written only where the guard holds.
fn update_command(conn: &Connection, before: &Command, c: &Command, guard: &Guard) -> Result<(), LedgerError> {
    let GuardSql {
        condition,
        kind,
        values: guard_values,
        ..
    } = guard_condition(guard)
        .ok_or_else(|| LedgerError::Internal("an update needs a guard other than absent".into()))?;
    // Both guard parameters are bound: the SET values are numbered from ?4.
    let mut values = vec![text(c.id.as_str())];
    values.extend(guard_values);
    let changed = push_changed(
        &COMMAND_MUTABLE,
        &command_values(before),
        &command_values(c),
        &mut values,
    );
    if changed == 0 {
        return check_guard(conn, &c.attempt_id, guard);
    }
    let sql = statement(Table::Command, kind, changed, || {
        format!(
            "UPDATE command SET {} WHERE id = ?1 AND {condition}",
            set_clause(&COMMAND_MUTABLE, changed, 4)
        )
    });
    if execute(conn, &sql, &values)? == 0 {
        return Err(stale(&c.id));
    }
    Ok(())
}

/// Refuses unless the guard holds on the attempt's command, writing nothing.
pub(super) fn check_guard(conn: &Connection, attempt_id: &AttemptId, guard: &Guard) -> Result<(), LedgerError> {
    let GuardSql {
        condition,
        kind,
        values: [a, b],
        used,
    } = guard_condition(guard)
        .ok_or_else(|| LedgerError::Internal("a check needs a guard other than absent".into()))?;
    let sql = statement(Table::Guard, kind, 0, || {
        format!("SELECT id, coalesce(({condition}), 0) FROM command WHERE attempt_id = ?1")
    });
    // A statement has as many parameters as its highest number: the key and the
    // guard's own.
    let values = [text(attempt_id.as_str()), a, b];
    let row = query_one(
        conn,
        &sql,
        params_from_iter(values[..1 + used].iter().map(|v| ToSqlOutput::Borrowed(*v))),
        |row| {
            let c = Cols::new(row, "command");
            Ok((CommandId::new(c.get::<String>(0)?), c.get::<bool>(1)?))
        },
    )?;
    match row {
        Some((_, true)) => Ok(()),
        Some((id, false)) => Err(stale(&id)),
        None => Err(LedgerError::Integrity(format!("attempt {attempt_id} has no command"))),
    }
}

/// The `schema_migrations` table of a SQLite database, for [`super::super::migrate::run`].
pub(super) struct SqliteMigrations<'c> {
    /// The connection, inside the migrating transaction.
    pub(super) conn: &'c Connection,
}

impl MigrationTarget for SqliteMigrations<'_> {
    fn ensure_history(&mut self) -> Result<(), LedgerError> {
        self.conn
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS schema_migrations (\
                 version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
            )
            .sql()
    }

    fn applied_versions(&mut self) -> Result<Vec<u32>, LedgerError> {
        query_all(
            self.conn,
            "SELECT version FROM schema_migrations ORDER BY version",
            [],
            |row| Cols::new(row, "schema_migrations").count(0),
        )
    }

    fn apply(&mut self, migration: &Migration, applied_at: Timestamp) -> Result<(), LedgerError> {
        self.conn.execute_batch(migration.sql).map_err(|e| match sql_error(e) {
            LedgerError::Internal(m) => {
                LedgerError::Internal(format!("migration {} ({}): {m}", migration.version, migration.name))
            }
            other => other,
        })?;
        self.conn
            .execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
                rusqlite::params![migration.version, migration.name, applied_at.as_millis()],
            )
            .sql()?;
        Ok(())
    }
}

/// Fails with [`LedgerError::Integrity`] naming the first row whose foreign key
/// points nowhere, if any.
pub(super) fn check_foreign_keys(conn: &Connection) -> Result<(), LedgerError> {
    let mut stmt = conn.prepare("PRAGMA foreign_key_check").sql()?;
    let mut rows = stmt.query([]).sql()?;
    match rows.next().sql()? {
        None => Ok(()),
        Some(row) => {
            let table: String = row.get(0).sql()?;
            let rowid: Option<i64> = row.get(1).sql()?;
            let parent: String = row.get(2).sql()?;
            Err(LedgerError::Integrity(format!(
                "{table} row {} refers to a missing {parent} row",
                rowid.map_or_else(|| "?".to_owned(), |r| r.to_string())
            )))
        }
    }
}

/// The name and `applied_at` recorded for `version`, if any (tests).
#[cfg(test)]
pub(super) fn recorded_migration(conn: &Connection, version: u32) -> Result<Option<(String, i64)>, LedgerError> {
    use rusqlite::OptionalExtension;
    conn.query_row(
        "SELECT name, applied_at FROM schema_migrations WHERE version = ?1",
        [version],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .optional()
    .sql()
}
