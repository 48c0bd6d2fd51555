//! Rows ↔ engine model, and the MySQL interpreter of the engine's [`Guard`].
//!
//! Reads parse every column strictly: a status text the engine does not know, a NULL
//! where a value belongs or a negative count is [`LedgerError::Integrity`]. Locking
//! reads (`FOR UPDATE`) take the rows in the lock order: attempt, then command, then
//! receipts by ordinal. Writes apply the engine's full row images; the command row's
//! `UPDATE` carries the guard as its `WHERE` clause, and — the connection sets
//! `CLIENT_FOUND_ROWS`, so the count is of matched rows, not of changed ones — zero
//! affected rows is a refusal. Lease tokens are bound as parameters only.

use super::error::{DbResult, TxError};
use crate::ledger::LedgerError;
use leasehold_engine::{
    Attempt, AttemptId, AttemptRecord, Command, CommandId, Guard, LeaseToken, Plan, PlanId, PlanStatus, Receipt,
    Refusal, Step, Timestamp, Writes,
};
use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{Params, Row, Transaction, Value};
use std::collections::BTreeMap;
use std::str::FromStr;

/// The database clock's now, in milliseconds since the Unix epoch. Sessions run with
/// `time_zone = '+00:00'`, so the conversion is exact (no daylight-saving overlap).
pub(super) const NOW_SQL: &str = "CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) AS SIGNED)";

const PLAN_COLUMNS: &str = "id, name, status, recovery, steps_json, volatile_fields_json, fingerprint, created_at";
const ATTEMPT_COLUMNS: &str = "id, plan_id, number, action, status, created_at, started_at, finished_at, error";
const COMMAND_COLUMNS: &str = "id, attempt_id, status, available_at, lease_owner, lease_token, lease_until, \
     last_heartbeat_at, delivery_count, last_error, finished_at";
const RECEIPT_COLUMNS: &str = "attempt_id, ordinal, step_code, idempotency_key, status, evidence, evidence_sha256, \
     target_receipt, error, started_at, finished_at";

pub(super) fn not_found(kind: &'static str, id: impl ToString) -> LedgerError {
    LedgerError::NotFound {
        kind,
        id: id.to_string(),
    }
}

/// Duplicate entry for a unique key.
const ER_DUP_ENTRY: u16 = 1062;

fn stale(command: &CommandId) -> TxError {
    TxError::Ledger(LedgerError::Refused(Refusal::StaleToken {
        command: command.clone(),
    }))
}

/// Positional parameters (none is `Params::Empty`, which the driver requires).
fn params(values: Vec<Value>) -> Params {
    if values.is_empty() {
        Params::Empty
    } else {
        Params::Positional(values)
    }
}

fn text(s: &str) -> Value {
    Value::Bytes(s.as_bytes().to_vec())
}

fn opt_text(s: Option<&str>) -> Value {
    s.map_or(Value::NULL, text)
}

fn ts(t: Timestamp) -> Value {
    Value::Int(t.as_millis())
}

fn opt_ts(t: Option<Timestamp>) -> Value {
    t.map_or(Value::NULL, ts)
}

fn count(n: u32) -> Value {
    Value::Int(n.into())
}

/// Strict column readers over one row of one table (or of several, side by side:
/// column `idx` is read at `base + idx`).
struct Cols {
    row: Row,
    table: &'static str,
    base: usize,
}

impl Cols {
    fn new(row: Row, table: &'static str) -> Self {
        Self { row, table, base: 0 }
    }

    /// Reads the next table's columns, which start at `base`.
    fn at(&mut self, table: &'static str, base: usize) -> &mut Self {
        self.table = table;
        self.base = base;
        self
    }

    fn column_name(&self, idx: usize) -> String {
        self.row
            .columns_ref()
            .get(idx)
            .map_or_else(|| format!("#{idx}"), |c| c.name_str().into_owned())
    }

    fn get<T: FromValue>(&mut self, idx: usize) -> Result<T, LedgerError> {
        let idx = self.base + idx;
        match self.row.take_opt::<T, usize>(idx) {
            Some(Ok(v)) => Ok(v),
            // The value itself is not echoed: it could be a lease token.
            Some(Err(_)) => Err(LedgerError::Integrity(format!(
                "{} row: column {} has an unexpected value",
                self.table,
                self.column_name(idx)
            ))),
            None => Err(LedgerError::Integrity(format!(
                "{} row: column {} is missing",
                self.table,
                self.column_name(idx)
            ))),
        }
    }

    fn string(&mut self, idx: usize) -> Result<String, LedgerError> {
        self.get::<String>(idx)
    }

    fn opt_string(&mut self, idx: usize) -> Result<Option<String>, LedgerError> {
        self.get::<Option<String>>(idx)
    }

    fn text_enum<T: FromStr>(&mut self, idx: usize) -> Result<T, LedgerError>
    where
        T::Err: std::fmt::Display,
    {
        let text = self.string(idx)?;
        text.parse()
            .map_err(|e| LedgerError::Integrity(format!("{} row: {e}", self.table)))
    }

    fn timestamp(&mut self, idx: usize) -> Result<Timestamp, LedgerError> {
        self.get::<i64>(idx).map(Timestamp::from_millis)
    }

    fn opt_timestamp(&mut self, idx: usize) -> Result<Option<Timestamp>, LedgerError> {
        Ok(self.get::<Option<i64>>(idx)?.map(Timestamp::from_millis))
    }

    fn count(&mut self, idx: usize) -> Result<u32, LedgerError> {
        let n: i64 = self.get(idx)?;
        u32::try_from(n).map_err(|_| LedgerError::Integrity(format!("{} row: {n} is not a valid count", self.table)))
    }

    fn json<T: serde::de::DeserializeOwned>(&mut self, idx: usize) -> Result<T, LedgerError> {
        let text = self.string(idx)?;
        serde_json::from_str(&text).map_err(|e| LedgerError::Integrity(format!("{} row: bad JSON: {e}", self.table)))
    }
}

fn plan_from_row(row: Row) -> Result<Plan, LedgerError> {
    let mut c = Cols::new(row, "plan");
    Ok(Plan {
        id: PlanId::new(c.string(0)?),
        name: c.string(1)?,
        status: c.text_enum(2)?,
        recovery: c.text_enum(3)?,
        steps: c.json::<Vec<Step>>(4)?,
        volatile_fields: c.json::<Vec<String>>(5)?,
        fingerprint: c.string(6)?,
        created_at: c.timestamp(7)?,
    })
}

fn attempt_from_row(row: Row) -> Result<Attempt, LedgerError> {
    attempt_from_cols(&mut Cols::new(row, "attempt"))
}

fn attempt_from_cols(c: &mut Cols) -> Result<Attempt, LedgerError> {
    Ok(Attempt {
        id: AttemptId::new(c.string(0)?),
        plan_id: PlanId::new(c.string(1)?),
        number: c.count(2)?,
        action: c.text_enum(3)?,
        status: c.text_enum(4)?,
        created_at: c.timestamp(5)?,
        started_at: c.opt_timestamp(6)?,
        finished_at: c.opt_timestamp(7)?,
        error: c.opt_string(8)?,
    })
}

fn command_from_cols(c: &mut Cols) -> Result<Command, LedgerError> {
    Ok(Command {
        id: CommandId::new(c.string(0)?),
        attempt_id: AttemptId::new(c.string(1)?),
        status: c.text_enum(2)?,
        available_at: c.timestamp(3)?,
        lease_owner: c.opt_string(4)?,
        lease_token: c.opt_string(5)?.map(LeaseToken::new),
        lease_until: c.opt_timestamp(6)?,
        last_heartbeat_at: c.opt_timestamp(7)?,
        delivery_count: c.count(8)?,
        last_error: c.opt_string(9)?,
        finished_at: c.opt_timestamp(10)?,
    })
}

fn command_from_row(row: Row) -> Result<Command, LedgerError> {
    command_from_cols(&mut Cols::new(row, "command"))
}

fn receipt_from_row(row: Row) -> Result<Receipt, LedgerError> {
    let mut c = Cols::new(row, "receipt");
    Ok(Receipt {
        attempt_id: AttemptId::new(c.string(0)?),
        ordinal: c.count(1)?,
        step_code: c.string(2)?,
        idempotency_key: c.string(3)?,
        status: c.text_enum(4)?,
        evidence: c.opt_string(5)?,
        evidence_sha256: c.opt_string(6)?,
        target_receipt: c.opt_string(7)?,
        error: c.opt_string(8)?,
        started_at: c.opt_timestamp(9)?,
        finished_at: c.opt_timestamp(10)?,
    })
}

/// Runs a query and parses every row.
async fn query_all<Q, T>(
    q: &mut Q,
    sql: &str,
    values: Vec<Value>,
    parse: impl Fn(Row) -> Result<T, LedgerError>,
) -> Result<Vec<T>, TxError>
where
    Q: Queryable + Send,
{
    let rows: Vec<Row> = q.exec(sql, params(values)).await.db()?;
    rows.into_iter().map(|r| parse(r).map_err(TxError::from)).collect()
}

/// Runs a query and parses its first row, if any.
async fn query_one<Q, T>(
    q: &mut Q,
    sql: &str,
    values: Vec<Value>,
    parse: impl Fn(Row) -> Result<T, LedgerError>,
) -> Result<Option<T>, TxError>
where
    Q: Queryable + Send,
{
    let row: Option<Row> = q.exec_first(sql, params(values)).await.db()?;
    row.map(parse).transpose().map_err(TxError::from)
}

/// Runs a statement; answers the rows it matched (`CLIENT_FOUND_ROWS`).
async fn execute(tx: &mut Transaction<'_>, sql: &str, values: Vec<Value>) -> Result<u64, TxError> {
    tx.exec_drop(sql, params(values)).await.db()?;
    Ok(tx.affected_rows())
}

/// The database clock's now.
pub(super) async fn db_now<Q: Queryable + Send>(q: &mut Q) -> Result<Timestamp, TxError> {
    let now: Option<i64> = q.query_first(format!("SELECT {NOW_SQL}")).await.db()?;
    now.map(Timestamp::from_millis)
        .ok_or_else(|| TxError::Ledger(LedgerError::Internal("the database answered no time".into())))
}

/// A plan by id; `lock` takes it `FOR UPDATE` (enqueue serializes on its plan).
pub(super) async fn read_plan<Q: Queryable + Send>(
    q: &mut Q,
    id: &PlanId,
    lock: bool,
) -> Result<Option<Plan>, TxError> {
    let sql = format!(
        "SELECT {PLAN_COLUMNS} FROM plan WHERE id = ?{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    query_one(q, &sql, vec![text(id.as_str())], plan_from_row).await
}

/// Plans by id (claims read the plans of their candidates in one query).
pub(super) async fn read_plans_by_id<Q: Queryable + Send>(
    q: &mut Q,
    ids: &[&PlanId],
) -> Result<BTreeMap<PlanId, Plan>, TxError> {
    if ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let marks = vec!["?"; ids.len()].join(", ");
    let plans = query_all(
        q,
        &format!("SELECT {PLAN_COLUMNS} FROM plan WHERE id IN ({marks})"),
        ids.iter().map(|id| text(id.as_str())).collect(),
        plan_from_row,
    )
    .await?;
    Ok(plans.into_iter().map(|p| (p.id.clone(), p)).collect())
}

/// The oldest READY plan with this fingerprint, locked. When there is none, the
/// locking read holds the index gap where it would be, so a concurrent registration
/// of the same content waits (or deadlocks and is retried) instead of inserting a
/// duplicate.
pub(super) async fn lock_ready_plan_by_fingerprint(
    tx: &mut Transaction<'_>,
    fingerprint: &str,
) -> Result<Option<Plan>, TxError> {
    query_one(
        tx,
        &format!(
            "SELECT {PLAN_COLUMNS} FROM plan WHERE fingerprint = ? AND status = 'READY' ORDER BY seq LIMIT 1 FOR UPDATE"
        ),
        vec![text(fingerprint)],
        plan_from_row,
    )
    .await
}

/// Every plan, in registration order.
pub(super) async fn read_plans<Q: Queryable + Send>(q: &mut Q) -> Result<Vec<Plan>, TxError> {
    query_all(
        q,
        &format!("SELECT {PLAN_COLUMNS} FROM plan ORDER BY seq"),
        Vec::new(),
        plan_from_row,
    )
    .await
}

/// Inserts a newly registered plan.
pub(super) async fn insert_plan(tx: &mut Transaction<'_>, plan: &Plan) -> Result<(), TxError> {
    let steps = serde_json::to_string(&plan.steps).map_err(|e| LedgerError::Internal(format!("plan steps: {e}")))?;
    let volatile = serde_json::to_string(&plan.volatile_fields)
        .map_err(|e| LedgerError::Internal(format!("plan volatile fields: {e}")))?;
    execute(
        tx,
        "INSERT INTO plan (id, name, status, recovery, steps_json, volatile_fields_json, fingerprint, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        vec![
            text(plan.id.as_str()),
            text(&plan.name),
            text(plan.status.as_str()),
            text(plan.recovery.as_str()),
            text(&steps),
            text(&volatile),
            text(&plan.fingerprint),
            ts(plan.created_at),
        ],
    )
    .await?;
    Ok(())
}

/// Sets a plan's status; answers whether the plan exists.
pub(super) async fn set_plan_status(
    tx: &mut Transaction<'_>,
    id: &PlanId,
    status: PlanStatus,
) -> Result<bool, TxError> {
    let n = execute(
        tx,
        "UPDATE plan SET status = ? WHERE id = ?",
        vec![text(status.as_str()), text(id.as_str())],
    )
    .await?;
    Ok(n > 0)
}

/// An attempt and its command, locked in that order, with the database clock's now
/// read once both are held (so a lock wait does not age it).
pub(super) async fn lock_head(
    tx: &mut Transaction<'_>,
    id: &AttemptId,
) -> Result<Option<(Attempt, Command, Timestamp)>, TxError> {
    let Some(attempt) = query_one(
        tx,
        &format!("SELECT {ATTEMPT_COLUMNS} FROM attempt WHERE id = ? FOR UPDATE"),
        vec![text(id.as_str())],
        attempt_from_row,
    )
    .await?
    else {
        return Ok(None);
    };
    let (command, now) = query_one(
        tx,
        &format!("SELECT {COMMAND_COLUMNS}, {NOW_SQL} FROM command WHERE attempt_id = ? FOR UPDATE"),
        vec![text(id.as_str())],
        |row| {
            let mut c = Cols::new(row, "command");
            let command = command_from_cols(&mut c)?;
            Ok((command, c.timestamp(11)?))
        },
    )
    .await?
    .ok_or_else(|| LedgerError::Integrity(format!("attempt {id} has no command")))?;
    Ok(Some((attempt, command, now)))
}

/// An attempt's receipts by ordinal; `lock` takes them `FOR UPDATE`.
pub(super) async fn read_receipts<Q: Queryable + Send>(
    q: &mut Q,
    id: &AttemptId,
    lock: bool,
) -> Result<Vec<Receipt>, TxError> {
    let sql = format!(
        "SELECT {RECEIPT_COLUMNS} FROM receipt WHERE attempt_id = ? ORDER BY ordinal{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    query_all(q, &sql, vec![text(id.as_str())], receipt_from_row).await
}

/// An attempt with its command and receipts (a consistent, non-locking read).
pub(super) async fn read_record<Q: Queryable + Send>(
    q: &mut Q,
    id: &AttemptId,
) -> Result<Option<AttemptRecord>, TxError> {
    let Some(attempt) = query_one(
        q,
        &format!("SELECT {ATTEMPT_COLUMNS} FROM attempt WHERE id = ?"),
        vec![text(id.as_str())],
        attempt_from_row,
    )
    .await?
    else {
        return Ok(None);
    };
    let command = query_one(
        q,
        &format!("SELECT {COMMAND_COLUMNS} FROM command WHERE attempt_id = ?"),
        vec![text(id.as_str())],
        command_from_row,
    )
    .await?
    .ok_or_else(|| LedgerError::Integrity(format!("attempt {id} has no command")))?;
    let receipts = read_receipts(q, id, false).await?;
    Ok(Some(AttemptRecord {
        attempt,
        command,
        receipts,
    }))
}

/// Every attempt of a plan with its command and receipts, by number (non-locking).
pub(super) async fn read_history<Q: Queryable + Send>(q: &mut Q, plan: &PlanId) -> Result<Vec<AttemptRecord>, TxError> {
    let attempts = query_all(
        q,
        &format!("SELECT {ATTEMPT_COLUMNS} FROM attempt WHERE plan_id = ? ORDER BY number"),
        vec![text(plan.as_str())],
        attempt_from_row,
    )
    .await?;
    if attempts.is_empty() {
        return Ok(Vec::new());
    }
    let prefixed = |columns: &str, alias: &str| {
        columns
            .split(", ")
            .map(|c| format!("{alias}.{}", c.trim()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut commands: BTreeMap<AttemptId, Command> = query_all(
        q,
        &format!(
            "SELECT {} FROM command c JOIN attempt a ON a.id = c.attempt_id WHERE a.plan_id = ?",
            prefixed(COMMAND_COLUMNS, "c")
        ),
        vec![text(plan.as_str())],
        command_from_row,
    )
    .await?
    .into_iter()
    .map(|c| (c.attempt_id.clone(), c))
    .collect();
    let mut receipts: BTreeMap<AttemptId, Vec<Receipt>> = BTreeMap::new();
    for r in query_all(
        q,
        &format!(
            "SELECT {} FROM receipt r JOIN attempt a ON a.id = r.attempt_id WHERE a.plan_id = ? \
             ORDER BY r.attempt_id, r.ordinal",
            prefixed(RECEIPT_COLUMNS, "r")
        ),
        vec![text(plan.as_str())],
        receipt_from_row,
    )
    .await?
    {
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

/// One command a claim may take.
#[derive(Debug, Clone)]
pub(super) struct Candidate {
    /// The command.
    pub(super) command: CommandId,
    /// Its attempt.
    pub(super) attempt: AttemptId,
    /// The attempt's plan.
    pub(super) plan: PlanId,
}

/// Up to `limit` commands claimable at `now`, oldest `available_at` first (then by
/// id); a plain read that locks nothing. Each arm of the `UNION` is a range scan of
/// its own index (`command_claimable`, `command_expired`).
pub(super) async fn claim_candidates<Q: Queryable + Send>(
    q: &mut Q,
    now: Timestamp,
    limit: u32,
) -> Result<Vec<Candidate>, TxError> {
    let limit = Value::Int(limit.into());
    query_all(
        q,
        "SELECT id, attempt_id, plan_id FROM ( \
           (SELECT c.id, c.attempt_id, a.plan_id, c.available_at FROM command c JOIN attempt a ON a.id = c.attempt_id \
             WHERE c.status = 'PENDING' AND c.available_at <= ? ORDER BY c.available_at, c.id LIMIT ?) \
           UNION ALL \
           (SELECT c.id, c.attempt_id, a.plan_id, c.available_at FROM command c JOIN attempt a ON a.id = c.attempt_id \
             WHERE c.status = 'PROCESSING' AND c.lease_until < ? ORDER BY c.lease_until, c.id LIMIT ?) \
         ) AS candidate ORDER BY available_at, id LIMIT ?",
        vec![ts(now), limit.clone(), ts(now), limit.clone(), limit],
        |row| {
            let mut c = Cols::new(row, "command");
            Ok(Candidate {
                command: CommandId::new(c.string(0)?),
                attempt: AttemptId::new(c.string(1)?),
                plan: PlanId::new(c.string(2)?),
            })
        },
    )
    .await
}

/// Where a statement takes its `now` from.
#[derive(Debug, Clone, Copy)]
pub(super) enum NowSql {
    /// The database's clock, read by the statement itself ([`NOW_SQL`]; constant
    /// within one statement).
    Db,
    /// A time the ledger already holds, bound as a parameter.
    At(Timestamp),
}

/// A statement's text and its positional parameters, built side by side so that
/// every `?` gets its value in order.
#[derive(Debug, Default)]
struct Sql {
    text: String,
    values: Vec<Value>,
}

impl Sql {
    fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    fn bind(&mut self, value: Value) -> &mut Self {
        self.text.push('?');
        self.values.push(value);
        self
    }

    fn now(&mut self, now: NowSql) -> &mut Self {
        match now {
            NowSql::Db => self.push(NOW_SQL),
            NowSql::At(t) => self.bind(ts(t)),
        }
    }
}

/// The position of a command in the claim order: its `available_at`, then its id.
pub(super) type ClaimKey = (Timestamp, CommandId);

/// Appends the claim window: up to `window` commands claimable at `now` that come
/// after `after` in the claim order, oldest first — a plain, non-locking read. Each
/// arm of the `UNION` is a range scan of its own index: `command_claimable`, which
/// covers the window (migration 2) and is already in its order, and
/// `command_expired`, whose few expired leases are sorted.
fn push_claim_window(sql: &mut Sql, now: NowSql, after: Option<&ClaimKey>, window: u32) {
    let arm = |sql: &mut Sql, index: &str, condition: &str| {
        sql.push("(SELECT id, attempt_id, available_at FROM command FORCE INDEX (")
            .push(index)
            .push(") WHERE ")
            .push(condition)
            .now(now);
        if let Some((at, id)) = after {
            sql.push(" AND (available_at > ")
                .bind(ts(*at))
                .push(" OR (available_at = ")
                .bind(ts(*at))
                .push(" AND id > ")
                .bind(text(id.as_str()))
                .push("))");
        }
        sql.push(" ORDER BY available_at, id LIMIT ")
            .bind(Value::Int(window.into()))
            .push(")");
    };
    sql.push("SELECT id, attempt_id, available_at FROM (");
    arm(sql, "command_claimable", "status = 'PENDING' AND available_at <= ");
    sql.push(" UNION ALL ");
    arm(sql, "command_expired", "status = 'PROCESSING' AND lease_until < ");
    sql.push(") AS claimable ORDER BY available_at, id LIMIT ")
        .bind(Value::Int(window.into()));
}

/// A command a claim locked, with its attempt, as they are now (locked).
#[derive(Debug)]
pub(super) struct Picked {
    /// The attempt, locked.
    pub(super) attempt: Attempt,
    /// Its command, locked: the latest committed version, which may no longer be
    /// claimable (a race lost to a claimer that committed after this claim read its
    /// window).
    pub(super) command: Command,
    /// The `now` the statement decided with.
    pub(super) now: Timestamp,
    /// The command's place in the claim order, as the window saw it.
    pub(super) key: ClaimKey,
}

/// Locks up to `want` of the claim window's commands, oldest first, skipping every
/// one whose attempt or command another transaction holds (`SKIP LOCKED`, MariaDB
/// 10.6+ / MySQL 8.0.1+), and answers them as locked.
///
/// Lock order: the window is a derived table, read without locks (MariaDB does not
/// lock the rows of a materialized derived table for the outer `FOR UPDATE`, and MySQL
/// 8 documents that an outer locking clause does not lock the tables of a subquery);
/// the outer join, its order fixed by `STRAIGHT_JOIN`, then locks each
/// candidate's attempt and only after it its command — attempt before command, as
/// everywhere. Both are primary-key lookups (`FORCE INDEX (PRIMARY)`: on a small table
/// the optimizer would rather scan `attempt` through a join buffer, which sorts after
/// the join — locking every candidate, not `want` of them — and which MariaDB 10.11
/// answers with no rows at all when `SKIP LOCKED` skipped one). Row locks by primary
/// key take no gap locks, and `SKIP LOCKED` never waits, so this statement waits on no
/// one. The sort is of the window alone, so the `LIMIT` stops the join after `want`
/// rows: the rest of the window stays unlocked.
pub(super) async fn lock_claimable(
    tx: &mut Transaction<'_>,
    now: NowSql,
    after: Option<&ClaimKey>,
    window: u32,
    want: u32,
) -> Result<Vec<Picked>, TxError> {
    let a = ATTEMPT_COLUMNS
        .split(", ")
        .map(|c| format!("a.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let c = COMMAND_COLUMNS
        .split(", ")
        .map(|c| format!("c.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ");
    let mut sql = Sql::default();
    sql.push(&format!("SELECT {a}, {c}, "))
        .now(now)
        .push(" AS now, w.available_at FROM (");
    push_claim_window(&mut sql, now, after, window);
    sql.push(
        ") AS w STRAIGHT_JOIN attempt a FORCE INDEX (PRIMARY) ON a.id = w.attempt_id \
         STRAIGHT_JOIN command c FORCE INDEX (PRIMARY) ON c.id = w.id",
    );
    sql.push(" ORDER BY w.available_at, w.id LIMIT ")
        .bind(Value::Int(want.into()))
        .push(" FOR UPDATE SKIP LOCKED");
    let attempt_columns = ATTEMPT_COLUMNS.split(", ").count();
    let command_columns = COMMAND_COLUMNS.split(", ").count();
    query_all(tx, &sql.text, sql.values, |row| {
        let mut cols = Cols::new(row, "attempt");
        let attempt = attempt_from_cols(&mut cols)?;
        let command = command_from_cols(cols.at("command", attempt_columns))?;
        let cols = cols.at("claim", attempt_columns + command_columns);
        let now = cols.timestamp(0)?;
        let key = (cols.timestamp(1)?, command.id.clone());
        Ok(Picked {
            attempt,
            command,
            now,
            key,
        })
    })
    .await
}

/// The last command of a full claim window after `after` (a plain read), with the
/// statement's `now`; `None` when the window holds fewer than `window` commands, so
/// that nothing claimable lies beyond it.
pub(super) async fn claim_window_end<Q: Queryable + Send>(
    q: &mut Q,
    now: NowSql,
    after: Option<&ClaimKey>,
    window: u32,
) -> Result<Option<(ClaimKey, Timestamp)>, TxError> {
    let mut sql = Sql::default();
    sql.push("SELECT w.available_at, w.id, ").now(now).push(" FROM (");
    push_claim_window(&mut sql, now, after, window);
    sql.push(") AS w ORDER BY w.available_at, w.id LIMIT 1 OFFSET ")
        .bind(Value::Int(window.saturating_sub(1).into()));
    query_one(q, &sql.text, sql.values, |row| {
        let mut c = Cols::new(row, "command");
        Ok(((c.timestamp(0)?, CommandId::new(c.string(1)?)), c.timestamp(2)?))
    })
    .await
}

/// The receipts of `ids`' attempts, locked, grouped by attempt in ordinal order (a
/// claim holds every one of those attempts already).
pub(super) async fn lock_receipts_of(
    tx: &mut Transaction<'_>,
    ids: &[&AttemptId],
) -> Result<BTreeMap<AttemptId, Vec<Receipt>>, TxError> {
    let mut out: BTreeMap<AttemptId, Vec<Receipt>> = BTreeMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let marks = vec!["?"; ids.len()].join(", ");
    for r in query_all(
        tx,
        &format!(
            "SELECT {RECEIPT_COLUMNS} FROM receipt WHERE attempt_id IN ({marks}) ORDER BY attempt_id, ordinal FOR UPDATE"
        ),
        ids.iter().map(|id| text(id.as_str())).collect(),
        receipt_from_row,
    )
    .await?
    {
        out.entry(r.attempt_id.clone()).or_default().push(r);
    }
    Ok(out)
}

/// How many attempts are QUEUED or RUNNING.
pub(super) async fn count_open_attempts<Q: Queryable + Send>(q: &mut Q) -> Result<u64, TxError> {
    let n: Option<i64> = q
        .query_first("SELECT COUNT(*) FROM attempt WHERE status IN ('QUEUED', 'RUNNING')")
        .await
        .db()?;
    let n = n.unwrap_or(0);
    u64::try_from(n).map_err(|_| TxError::Ledger(LedgerError::Internal(format!("negative count {n}"))))
}

/// The guard as a SQL condition on the command row, with its parameters.
/// `Guard::Absent` has none: it is an `INSERT`.
pub(super) fn guard_condition(guard: &Guard) -> Option<(&'static str, Vec<Value>)> {
    match guard {
        Guard::Absent => None,
        Guard::Holds(token) => Some(("status = 'PROCESSING' AND lease_token = ?", vec![text(token.expose())])),
        Guard::Claimable(now) => Some((
            "((status = 'PENDING' AND available_at <= ?) OR (status = 'PROCESSING' AND lease_until < ?))",
            vec![ts(*now), ts(*now)],
        )),
        Guard::Unchanged { status, lease_token } => Some((
            "status = ? AND lease_token <=> ?",
            vec![
                text(status.as_str()),
                opt_text(lease_token.as_ref().map(|t| t.expose())),
            ],
        )),
    }
}

/// Applies the engine's writes inside `tx`.
///
/// `Guard::Absent` inserts the images as new rows (attempt, command, receipts); any
/// other guard updates them (attempt, command, receipts: the lock order) with the
/// command's `UPDATE` conditioned on the guard. A guard that no longer holds answers
/// [`Refusal::StaleToken`]; the caller then rolls the whole transaction back, so
/// every row stays as it was. Writes without any image write nothing.
pub(super) async fn apply_writes(tx: &mut Transaction<'_>, writes: &Writes) -> Result<(), TxError> {
    if writes.is_empty() {
        return Ok(());
    }
    if writes.guard == Guard::Absent {
        insert_images(tx, writes).await
    } else {
        update_images(tx, writes).await
    }
}

/// Applies several transitions' writes inside `tx` with one `UPDATE` per table
/// instead of one per row, when it can: every one of them updates rows (no
/// `Guard::Absent`), carries an attempt and a command image, and all share one guard
/// (a claim's `Claimable(now)`). Otherwise it applies them one by one
/// ([`apply_writes`]). The checks are those of [`apply_writes`]: the guarded command
/// `UPDATE` must match every one of its commands — else [`Refusal::StaleToken`], and
/// the caller rolls the whole transaction back — and every attempt and receipt
/// written must exist. Every row written is held already (the attempts and commands
/// by the claim's locking reads, the receipts by theirs), so the order of the writes
/// takes no lock in a new order: the commands go first, so that other claimers'
/// reads of the claim window stop listing them as early as possible.
pub(super) async fn apply_writes_batch(tx: &mut Transaction<'_>, writes: &[&Writes]) -> Result<(), TxError> {
    let Some(first) = writes.first() else {
        return Ok(());
    };
    let batchable = writes
        .iter()
        .all(|w| w.guard != Guard::Absent && w.guard == first.guard && w.attempt.is_some() && w.command.is_some());
    if !batchable {
        for w in writes {
            apply_writes(tx, w).await?;
        }
        return Ok(());
    }
    let commands: Vec<&Command> = writes.iter().filter_map(|w| w.command.as_ref()).collect();
    let (condition, guard_values) = guard_condition(&first.guard)
        .ok_or_else(|| LedgerError::Internal("an update needs a guard other than absent".into()))?;
    let rows: Vec<RowUpdate> = commands
        .iter()
        .map(|c| RowUpdate {
            key: vec![text(c.id.as_str())],
            set: command_set_values(c),
        })
        .collect();
    let n = update_rows(
        tx,
        "command",
        &["id"],
        COMMAND_SET,
        &rows,
        Some((condition, guard_values)),
    )
    .await?;
    if n != rows.len() as u64 {
        return Err(stale(&commands[0].id));
    }
    let attempts: Vec<RowUpdate> = writes
        .iter()
        .filter_map(|w| w.attempt.as_ref())
        .map(|a| RowUpdate {
            key: vec![text(a.id.as_str())],
            set: vec![
                text(a.status.as_str()),
                opt_ts(a.started_at),
                opt_ts(a.finished_at),
                opt_text(a.error.as_deref()),
            ],
        })
        .collect();
    let n = update_rows(tx, "attempt", &["id"], ATTEMPT_LIFECYCLE, &attempts, None).await?;
    if n != attempts.len() as u64 {
        return Err(LedgerError::Integrity("an attempt vanished during a transition".into()).into());
    }
    let receipts: Vec<RowUpdate> = writes
        .iter()
        .flat_map(|w| &w.receipts)
        .map(|r| RowUpdate {
            key: vec![text(r.attempt_id.as_str()), count(r.ordinal)],
            set: receipt_set_values(r),
        })
        .collect();
    let n = update_rows(tx, "receipt", &["attempt_id", "ordinal"], RECEIPT_SET, &receipts, None).await?;
    if n != receipts.len() as u64 {
        return Err(LedgerError::Integrity("a receipt vanished during a transition".into()).into());
    }
    Ok(())
}

/// The attempt columns a transition changes; the rest is identity.
const ATTEMPT_LIFECYCLE: &[&str] = &["status", "started_at", "finished_at", "error"];
/// The command columns a transition writes.
const COMMAND_SET: &[&str] = &[
    "status",
    "available_at",
    "lease_owner",
    "lease_token",
    "lease_until",
    "last_heartbeat_at",
    "delivery_count",
    "last_error",
    "finished_at",
];
/// The receipt columns a transition writes.
const RECEIPT_SET: &[&str] = &[
    "status",
    "evidence",
    "evidence_sha256",
    "target_receipt",
    "error",
    "started_at",
    "finished_at",
];

fn command_set_values(c: &Command) -> Vec<Value> {
    vec![
        text(c.status.as_str()),
        ts(c.available_at),
        opt_text(c.lease_owner.as_deref()),
        opt_text(c.lease_token.as_ref().map(|t| t.expose())),
        opt_ts(c.lease_until),
        opt_ts(c.last_heartbeat_at),
        count(c.delivery_count),
        opt_text(c.last_error.as_deref()),
        opt_ts(c.finished_at),
    ]
}

fn receipt_set_values(r: &Receipt) -> Vec<Value> {
    vec![
        text(r.status.as_str()),
        opt_text(r.evidence.as_deref()),
        opt_text(r.evidence_sha256.as_deref()),
        opt_text(r.target_receipt.as_deref()),
        opt_text(r.error.as_deref()),
        opt_ts(r.started_at),
        opt_ts(r.finished_at),
    ]
}

/// One row of a multi-row `UPDATE`: its key values and its new column values.
struct RowUpdate {
    key: Vec<Value>,
    set: Vec<Value>,
}

/// Updates `rows` of `table` in one statement where `condition` holds; answers the
/// rows it matched. A column whose new value is the same for every row is set to that
/// value; any other column to a `CASE` over the rows' keys.
async fn update_rows(
    tx: &mut Transaction<'_>,
    table: &str,
    key_columns: &[&str],
    set_columns: &[&str],
    rows: &[RowUpdate],
    condition: Option<(&str, Vec<Value>)>,
) -> Result<u64, TxError> {
    let Some(first) = rows.first() else {
        return Ok(0);
    };
    let matches = |sql: &mut Sql, row: &RowUpdate| {
        sql.push("(");
        for (i, (column, value)) in key_columns.iter().zip(&row.key).enumerate() {
            if i > 0 {
                sql.push(" AND ");
            }
            sql.push(column).push(" = ").bind(value.clone());
        }
        sql.push(")");
    };
    let mut sql = Sql::default();
    sql.push("UPDATE ").push(table).push(" SET ");
    for (j, column) in set_columns.iter().enumerate() {
        if j > 0 {
            sql.push(", ");
        }
        sql.push(column).push(" = ");
        if rows.iter().all(|r| r.set[j] == first.set[j]) {
            sql.bind(first.set[j].clone());
        } else {
            sql.push("CASE");
            for r in rows {
                sql.push(" WHEN ");
                matches(&mut sql, r);
                sql.push(" THEN ").bind(r.set[j].clone());
            }
            sql.push(" ELSE ").push(column).push(" END");
        }
    }
    sql.push(" WHERE (");
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            sql.push(" OR ");
        }
        matches(&mut sql, r);
    }
    sql.push(")");
    if let Some((condition, values)) = condition {
        sql.push(" AND ").push(condition);
        sql.values.extend(values);
    }
    execute(tx, &sql.text, sql.values).await
}

fn attempt_values(a: &Attempt) -> Vec<Value> {
    vec![
        text(a.id.as_str()),
        text(a.plan_id.as_str()),
        count(a.number),
        text(a.action.as_str()),
        text(a.status.as_str()),
        ts(a.created_at),
        opt_ts(a.started_at),
        opt_ts(a.finished_at),
        opt_text(a.error.as_deref()),
    ]
}

fn command_values(c: &Command) -> Vec<Value> {
    vec![
        text(c.id.as_str()),
        text(c.attempt_id.as_str()),
        text(c.status.as_str()),
        ts(c.available_at),
        opt_text(c.lease_owner.as_deref()),
        opt_text(c.lease_token.as_ref().map(|t| t.expose())),
        opt_ts(c.lease_until),
        opt_ts(c.last_heartbeat_at),
        count(c.delivery_count),
        opt_text(c.last_error.as_deref()),
        opt_ts(c.finished_at),
    ]
}

fn receipt_values(r: &Receipt) -> Vec<Value> {
    vec![
        text(r.attempt_id.as_str()),
        count(r.ordinal),
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

async fn insert_images(tx: &mut Transaction<'_>, writes: &Writes) -> Result<(), TxError> {
    let (Some(attempt), Some(command)) = (&writes.attempt, &writes.command) else {
        return Err(LedgerError::Internal("a new attempt needs its attempt and command images".into()).into());
    };
    execute(
        tx,
        &format!("INSERT INTO attempt ({ATTEMPT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"),
        attempt_values(attempt),
    )
    .await?;
    // A command for this attempt already existing is the guard failing.
    let inserted = tx
        .exec_drop(
            format!("INSERT INTO command ({COMMAND_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
            params(command_values(command)),
        )
        .await;
    match inserted {
        Ok(()) => {}
        Err(mysql_async::Error::Server(e)) if e.code == ER_DUP_ENTRY => return Err(stale(&command.id)),
        Err(e) => return Err(e).db(),
    }
    for r in &writes.receipts {
        execute(
            tx,
            &format!("INSERT INTO receipt ({RECEIPT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
            receipt_values(r),
        )
        .await?;
    }
    Ok(())
}

async fn update_images(tx: &mut Transaction<'_>, writes: &Writes) -> Result<(), TxError> {
    if let Some(a) = &writes.attempt {
        // Only the lifecycle columns change; the rest is identity.
        let n = execute(
            tx,
            "UPDATE attempt SET status = ?, started_at = ?, finished_at = ?, error = ? WHERE id = ?",
            vec![
                text(a.status.as_str()),
                opt_ts(a.started_at),
                opt_ts(a.finished_at),
                opt_text(a.error.as_deref()),
                text(a.id.as_str()),
            ],
        )
        .await?;
        if n == 0 {
            return Err(LedgerError::Integrity(format!("attempt {} vanished during a transition", a.id)).into());
        }
    }
    match &writes.command {
        Some(c) => update_command(tx, c, &writes.guard).await?,
        None => {
            // The engine renews or rewrites the command whenever it changes anything;
            // should it ever not, the guard must still hold.
            let attempt_id = writes
                .attempt
                .as_ref()
                .map(|a| &a.id)
                .or_else(|| writes.receipts.first().map(|r| &r.attempt_id))
                .ok_or_else(|| LedgerError::Internal("writes name no attempt".into()))?;
            check_guard(tx, attempt_id, &writes.guard).await?;
        }
    }
    for r in &writes.receipts {
        let n = execute(
            tx,
            "UPDATE receipt SET status = ?, evidence = ?, evidence_sha256 = ?, target_receipt = ?, error = ?, \
             started_at = ?, finished_at = ? WHERE attempt_id = ? AND ordinal = ?",
            vec![
                text(r.status.as_str()),
                opt_text(r.evidence.as_deref()),
                opt_text(r.evidence_sha256.as_deref()),
                opt_text(r.target_receipt.as_deref()),
                opt_text(r.error.as_deref()),
                opt_ts(r.started_at),
                opt_ts(r.finished_at),
                text(r.attempt_id.as_str()),
                count(r.ordinal),
            ],
        )
        .await?;
        if n == 0 {
            return Err(LedgerError::Integrity(format!(
                "receipt {} of attempt {} vanished during a transition",
                r.ordinal, r.attempt_id
            ))
            .into());
        }
    }
    Ok(())
}

/// The command's new image, written only where the guard holds.
async fn update_command(tx: &mut Transaction<'_>, c: &Command, guard: &Guard) -> Result<(), TxError> {
    let (condition, guard_values) = guard_condition(guard)
        .ok_or_else(|| LedgerError::Internal("an update needs a guard other than absent".into()))?;
    let mut values = vec![
        text(c.status.as_str()),
        ts(c.available_at),
        opt_text(c.lease_owner.as_deref()),
        opt_text(c.lease_token.as_ref().map(|t| t.expose())),
        opt_ts(c.lease_until),
        opt_ts(c.last_heartbeat_at),
        count(c.delivery_count),
        opt_text(c.last_error.as_deref()),
        opt_ts(c.finished_at),
        text(c.id.as_str()),
    ];
    values.extend(guard_values);
    let n = execute(
        tx,
        &format!(
            "UPDATE command SET status = ?, available_at = ?, lease_owner = ?, lease_token = ?, lease_until = ?, \
             last_heartbeat_at = ?, delivery_count = ?, last_error = ?, finished_at = ? WHERE id = ? AND {condition}"
        ),
        values,
    )
    .await?;
    if n == 0 {
        return Err(stale(&c.id));
    }
    Ok(())
}

/// Refuses unless the guard holds on the attempt's command, writing nothing.
async fn check_guard(tx: &mut Transaction<'_>, attempt_id: &AttemptId, guard: &Guard) -> Result<(), TxError> {
    let (condition, guard_values) = guard_condition(guard)
        .ok_or_else(|| LedgerError::Internal("a check needs a guard other than absent".into()))?;
    let mut values = guard_values;
    values.push(text(attempt_id.as_str()));
    let row = query_one(
        tx,
        &format!("SELECT id, COALESCE(({condition}), 0) FROM command WHERE attempt_id = ?"),
        values,
        |row| {
            let mut c = Cols::new(row, "command");
            Ok((CommandId::new(c.string(0)?), c.get::<i64>(1)? != 0))
        },
    )
    .await?;
    match row {
        Some((_, true)) => Ok(()),
        Some((id, false)) => Err(stale(&id)),
        None => Err(LedgerError::Integrity(format!("attempt {attempt_id} has no command")).into()),
    }
}
