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
use rusqlite::types::{FromSql, Value as SqlValue};
use rusqlite::{params_from_iter, Connection, ErrorCode, Row, Transaction};
use std::collections::BTreeMap;
use std::str::FromStr;

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
}

impl Cols<'_, '_> {
    fn get<T: FromSql>(&self, idx: usize) -> Result<T, LedgerError> {
        self.row.get(idx).map_err(|e| match sql_error(e) {
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
    let c = Cols { row, table: "plan" };
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
    let c = Cols { row, table: "attempt" };
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
    let c = Cols { row, table: "command" };
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
    let c = Cols { row, table: "receipt" };
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

/// An attempt with its command and receipts, read in lock order.
pub(super) fn read_record(conn: &Connection, id: &AttemptId) -> Result<Option<AttemptRecord>, LedgerError> {
    let Some(attempt) = query_one(
        conn,
        &format!("SELECT {ATTEMPT_COLUMNS} FROM attempt WHERE id = ?1"),
        [id.as_str()],
        attempt_from_row,
    )?
    else {
        return Ok(None);
    };
    let command = query_one(
        conn,
        &format!("SELECT {COMMAND_COLUMNS} FROM command WHERE attempt_id = ?1"),
        [id.as_str()],
        command_from_row,
    )?
    .ok_or_else(|| LedgerError::Integrity(format!("attempt {id} has no command")))?;
    let receipts = query_all(
        conn,
        &format!("SELECT {RECEIPT_COLUMNS} FROM receipt WHERE attempt_id = ?1 ORDER BY ordinal"),
        [id.as_str()],
        receipt_from_row,
    )?;
    Ok(Some(AttemptRecord {
        attempt,
        command,
        receipts,
    }))
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

/// The claim's candidates: two index range scans, each limited, then merged. Written
/// as one `OR`, SQLite unions both whole ranges and sorts every claimable command on
/// each claim, which made a claim cost linear in the queue's length.
pub(super) const CLAIM_CANDIDATES_SQL: &str = "SELECT id, attempt_id FROM ( \
       SELECT * FROM (SELECT id, attempt_id, available_at FROM command \
                      WHERE status = 'PENDING' AND available_at <= ?1 ORDER BY available_at, id LIMIT ?2) \
       UNION ALL \
       SELECT * FROM (SELECT id, attempt_id, available_at FROM command \
                      WHERE status = 'PROCESSING' AND lease_until < ?1 ORDER BY available_at, id LIMIT ?2)) \
     ORDER BY available_at, id LIMIT ?2";

/// Commands a claim at `now` may take, oldest `available_at` first (then by id).
pub(super) fn claim_candidates(
    conn: &Connection,
    now: Timestamp,
    batch: u32,
) -> Result<Vec<(CommandId, AttemptId)>, LedgerError> {
    query_all(
        conn,
        CLAIM_CANDIDATES_SQL,
        rusqlite::params![now.as_millis(), i64::from(batch)],
        |row| {
            let c = Cols { row, table: "command" };
            Ok((CommandId::new(c.get::<String>(0)?), AttemptId::new(c.get::<String>(1)?)))
        },
    )
}

/// How many attempts are QUEUED or RUNNING.
pub(super) fn count_open_attempts(conn: &Connection) -> Result<u64, LedgerError> {
    let n: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM attempt WHERE status IN ('QUEUED', 'RUNNING')")
        .sql()?
        .query_row([], |row| row.get(0))
        .sql()?;
    u64::try_from(n).map_err(|_| LedgerError::Internal(format!("negative count {n}")))
}

fn ts(t: Timestamp) -> SqlValue {
    SqlValue::Integer(t.as_millis())
}

fn opt_ts(t: Option<Timestamp>) -> SqlValue {
    t.map_or(SqlValue::Null, ts)
}

fn text(s: &str) -> SqlValue {
    SqlValue::Text(s.to_owned())
}

fn opt_text(s: Option<&str>) -> SqlValue {
    s.map_or(SqlValue::Null, text)
}

/// The guard as a SQL condition on the command row, with its parameters numbered from
/// `first`. `Guard::Absent` has none: it is an `INSERT`.
fn guard_condition(guard: &Guard, first: usize) -> Option<(String, Vec<SqlValue>)> {
    match guard {
        Guard::Absent => None,
        Guard::Holds(token) => Some((
            format!("status = 'PROCESSING' AND lease_token = ?{first}"),
            vec![text(token.expose())],
        )),
        Guard::Claimable(now) => Some((
            format!(
                "((status = 'PENDING' AND available_at <= ?{first}) OR (status = 'PROCESSING' AND lease_until < ?{first}))"
            ),
            vec![ts(*now)],
        )),
        Guard::Unchanged { status, lease_token } => Some((
            format!("status = ?{first} AND lease_token IS ?{}", first + 1),
            vec![text(status.as_str()), opt_text(lease_token.as_ref().map(|t| t.expose()))],
        )),
    }
}

fn attempt_values(a: &Attempt) -> Vec<SqlValue> {
    vec![
        text(a.id.as_str()),
        text(a.plan_id.as_str()),
        SqlValue::Integer(a.number.into()),
        text(a.action.as_str()),
        text(a.status.as_str()),
        ts(a.created_at),
        opt_ts(a.started_at),
        opt_ts(a.finished_at),
        opt_text(a.error.as_deref()),
    ]
}

fn command_values(c: &Command) -> Vec<SqlValue> {
    vec![
        text(c.id.as_str()),
        text(c.attempt_id.as_str()),
        text(c.status.as_str()),
        ts(c.available_at),
        opt_text(c.lease_owner.as_deref()),
        opt_text(c.lease_token.as_ref().map(|t| t.expose())),
        opt_ts(c.lease_until),
        opt_ts(c.last_heartbeat_at),
        SqlValue::Integer(c.delivery_count.into()),
        opt_text(c.last_error.as_deref()),
        opt_ts(c.finished_at),
    ]
}

fn receipt_values(r: &Receipt) -> Vec<SqlValue> {
    vec![
        text(r.attempt_id.as_str()),
        SqlValue::Integer(r.ordinal.into()),
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

fn execute(conn: &Connection, sql: &str, values: Vec<SqlValue>) -> Result<usize, LedgerError> {
    conn.prepare_cached(sql).sql()?.execute(params_from_iter(values)).sql()
}

fn stale(command: &CommandId) -> LedgerError {
    LedgerError::Refused(Refusal::StaleToken {
        command: command.clone(),
    })
}

/// Applies the engine's writes inside `tx`, all or nothing (under a savepoint).
///
/// `Guard::Absent` inserts the images as new rows (attempt, command, receipts); any
/// other guard updates them (attempt, command, receipts: the lock order) with the
/// command's `UPDATE` conditioned on the guard. A guard that no longer holds answers
/// [`Refusal::StaleToken`] and leaves every row as it was. Writes without any image
/// write nothing.
pub(super) fn apply_writes(tx: &mut Transaction<'_>, writes: &Writes) -> Result<(), LedgerError> {
    if writes.is_empty() {
        return Ok(());
    }
    let sp = tx.savepoint().sql()?;
    if writes.guard == Guard::Absent {
        insert_images(&sp, writes)?;
    } else {
        update_images(&sp, writes)?;
    }
    sp.commit().sql()
}

fn insert_images(conn: &Connection, writes: &Writes) -> Result<(), LedgerError> {
    let (Some(attempt), Some(command)) = (&writes.attempt, &writes.command) else {
        return Err(LedgerError::Internal(
            "a new attempt needs its attempt and command images".into(),
        ));
    };
    execute(
        conn,
        &format!("INSERT INTO attempt ({ATTEMPT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"),
        attempt_values(attempt),
    )?;
    let inserted = execute(
        conn,
        &format!(
            "INSERT INTO command ({COMMAND_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
             ON CONFLICT DO NOTHING"
        ),
        command_values(command),
    )?;
    if inserted == 0 {
        return Err(stale(&command.id));
    }
    for r in &writes.receipts {
        execute(
            conn,
            &format!("INSERT INTO receipt ({RECEIPT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"),
            receipt_values(r),
        )?;
    }
    Ok(())
}

fn update_images(conn: &Connection, writes: &Writes) -> Result<(), LedgerError> {
    if let Some(a) = &writes.attempt {
        // Only the lifecycle columns change; the rest is identity.
        let n = execute(
            conn,
            "UPDATE attempt SET status = ?1, started_at = ?2, finished_at = ?3, error = ?4 WHERE id = ?5",
            vec![
                text(a.status.as_str()),
                opt_ts(a.started_at),
                opt_ts(a.finished_at),
                opt_text(a.error.as_deref()),
                text(a.id.as_str()),
            ],
        )?;
        if n == 0 {
            return Err(LedgerError::Integrity(format!(
                "attempt {} vanished during a transition",
                a.id
            )));
        }
    }
    match &writes.command {
        Some(c) => update_command(conn, c, &writes.guard)?,
        None => {
            // The engine renews or rewrites the command whenever it changes anything;
            // should it ever not, the guard must still hold.
            let attempt_id = writes
                .attempt
                .as_ref()
                .map(|a| &a.id)
                .or_else(|| writes.receipts.first().map(|r| &r.attempt_id))
                .ok_or_else(|| LedgerError::Internal("writes name no attempt".into()))?;
            check_guard(conn, attempt_id, &writes.guard)?;
        }
    }
    for r in &writes.receipts {
        let n = execute(
            conn,
            "UPDATE receipt SET status = ?1, evidence = ?2, evidence_sha256 = ?3, target_receipt = ?4, error = ?5, \
             started_at = ?6, finished_at = ?7 WHERE attempt_id = ?8 AND ordinal = ?9",
            vec![
                text(r.status.as_str()),
                opt_text(r.evidence.as_deref()),
                opt_text(r.evidence_sha256.as_deref()),
                opt_text(r.target_receipt.as_deref()),
                opt_text(r.error.as_deref()),
                opt_ts(r.started_at),
                opt_ts(r.finished_at),
                text(r.attempt_id.as_str()),
                SqlValue::Integer(r.ordinal.into()),
            ],
        )?;
        if n == 0 {
            return Err(LedgerError::Integrity(format!(
                "receipt {} of attempt {} vanished during a transition",
                r.ordinal, r.attempt_id
            )));
        }
    }
    Ok(())
}

/// The command's new image, written only where the guard holds.
fn update_command(conn: &Connection, c: &Command, guard: &Guard) -> Result<(), LedgerError> {
    let mut values = vec![
        text(c.status.as_str()),
        ts(c.available_at),
        opt_text(c.lease_owner.as_deref()),
        opt_text(c.lease_token.as_ref().map(|t| t.expose())),
        opt_ts(c.lease_until),
        opt_ts(c.last_heartbeat_at),
        SqlValue::Integer(c.delivery_count.into()),
        opt_text(c.last_error.as_deref()),
        opt_ts(c.finished_at),
        text(c.id.as_str()),
    ];
    let (condition, guard_values) = guard_condition(guard, values.len() + 1)
        .ok_or_else(|| LedgerError::Internal("an update needs a guard other than absent".into()))?;
    values.extend(guard_values);
    let n = execute(
        conn,
        &format!(
            "UPDATE command SET status = ?1, available_at = ?2, lease_owner = ?3, lease_token = ?4, \
             lease_until = ?5, last_heartbeat_at = ?6, delivery_count = ?7, last_error = ?8, finished_at = ?9 \
             WHERE id = ?10 AND {condition}"
        ),
        values,
    )?;
    if n == 0 {
        return Err(stale(&c.id));
    }
    Ok(())
}

/// Refuses unless the guard holds on the attempt's command, writing nothing.
fn check_guard(conn: &Connection, attempt_id: &AttemptId, guard: &Guard) -> Result<(), LedgerError> {
    let (condition, guard_values) = guard_condition(guard, 2)
        .ok_or_else(|| LedgerError::Internal("a check needs a guard other than absent".into()))?;
    let mut values = vec![text(attempt_id.as_str())];
    values.extend(guard_values);
    let row = query_one(
        conn,
        &format!("SELECT id, coalesce(({condition}), 0) FROM command WHERE attempt_id = ?1"),
        params_from_iter(values),
        |row| {
            let c = Cols { row, table: "command" };
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
            |row| {
                Cols {
                    row,
                    table: "schema_migrations",
                }
                .count(0)
            },
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
