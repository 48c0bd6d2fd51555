//! MySQL's execution of the shared SQL layer ([`crate::ledger::sql`]), and its own
//! SQL text: the locking reads of a transition, the claim window with
//! `FOR UPDATE SKIP LOCKED`, and the multi-row `UPDATE` of a claim's batch.
//!
//! Reads parse every column strictly ([`crate::ledger::sql::decode`]). Locking reads (`FOR
//! UPDATE`) take the rows in the lock order: attempt, then command, then receipts by
//! ordinal. Writes run the statements of [`crate::ledger::sql::write::plan`]; the command row's
//! `UPDATE` carries the guard as its `WHERE` clause, and — the connection sets
//! `CLIENT_FOUND_ROWS`, so the count is of matched rows, not of changed ones — zero
//! affected rows is a refusal. Lease tokens are bound as parameters only.

use super::error::{DbResult, TxError};
use crate::ledger::listing::{all_read, placed, PageKey, PlanRow};
use crate::ledger::sql::decode::{self, ColumnReader};
use crate::ledger::sql::query::queries;
use crate::ledger::sql::table::{
    attempt_values, command_values, plan_json, plan_values, receipt_values, Table, ATTEMPT, COMMAND, PLAN, RECEIPT,
};
use crate::ledger::sql::write::{self, Expect, Statement};
use crate::ledger::sql::{self, Sql, Value, MYSQL};
use crate::ledger::LedgerError;
use leasehold_engine::{
    Attempt, AttemptId, AttemptRecord, Command, CommandId, Guard, Plan, PlanId, PlanStatus, Receipt, Timestamp, Writes,
};
use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{Params, Row, Transaction};
use std::collections::BTreeMap;

/// The database clock's now, in milliseconds since the Unix epoch.
pub(super) const NOW_SQL: &str = MYSQL.now_ms;

pub(super) fn not_found(kind: &'static str, id: impl ToString) -> LedgerError {
    LedgerError::NotFound {
        kind,
        id: id.to_string(),
    }
}

/// Duplicate entry for a unique key.
const ER_DUP_ENTRY: u16 = 1062;

/// The driver's value of a shared [`Value`].
pub(in crate::ledger) fn to_mysql(v: &Value<'_>) -> mysql_async::Value {
    match *v {
        Value::Null => mysql_async::Value::NULL,
        Value::Int(i) => mysql_async::Value::Int(i),
        Value::Text(t) => mysql_async::Value::Bytes(t.as_bytes().to_vec()),
    }
}

/// Positional parameters (none is `Params::Empty`, which the driver requires).
fn params(values: &[Value<'_>]) -> Params {
    if values.is_empty() {
        Params::Empty
    } else {
        Params::Positional(values.iter().map(to_mysql).collect())
    }
}

/// A driver row as the shared decoders read it (each column is taken once).
struct MysqlRow(Row);

impl MysqlRow {
    fn column_name(&self, idx: usize) -> String {
        self.0
            .columns_ref()
            .get(idx)
            .map_or_else(|| format!("#{idx}"), |c| c.name_str().into_owned())
    }

    fn take<T: FromValue>(&mut self, idx: usize) -> Result<T, String> {
        match self.0.take_opt::<T, usize>(idx) {
            Some(Ok(v)) => Ok(v),
            // The value itself is not echoed: it could be a lease token.
            Some(Err(_)) => Err(format!("{} has an unexpected value", self.column_name(idx))),
            None => Err(format!("{} is missing", self.column_name(idx))),
        }
    }
}

impl ColumnReader for MysqlRow {
    fn int(&mut self, idx: usize) -> Result<Option<i64>, String> {
        self.take(idx)
    }

    fn text(&mut self, idx: usize) -> Result<Option<String>, String> {
        self.take(idx)
    }

    fn is_null(&mut self, idx: usize) -> Result<bool, String> {
        match self.0.as_ref(idx) {
            Some(v) => Ok(*v == mysql_async::Value::NULL),
            None => Err(format!("{} is missing", self.column_name(idx))),
        }
    }
}

/// Runs a query and parses every row.
async fn query_all<Q, T>(
    q: &mut Q,
    sql: &str,
    values: &[Value<'_>],
    parse: impl Fn(&mut MysqlRow) -> Result<T, LedgerError>,
) -> Result<Vec<T>, TxError>
where
    Q: Queryable + Send,
{
    let rows: Vec<Row> = q.exec(sql, params(values)).await.db()?;
    rows.into_iter()
        .map(|r| parse(&mut MysqlRow(r)).map_err(TxError::from))
        .collect()
}

/// Runs a query and parses its first row, if any.
async fn query_one<Q, T>(
    q: &mut Q,
    sql: &str,
    values: &[Value<'_>],
    parse: impl Fn(&mut MysqlRow) -> Result<T, LedgerError>,
) -> Result<Option<T>, TxError>
where
    Q: Queryable + Send,
{
    let row: Option<Row> = q.exec_first(sql, params(values)).await.db()?;
    row.map(|r| parse(&mut MysqlRow(r))).transpose().map_err(TxError::from)
}

/// Runs a statement; answers the rows it matched (`CLIENT_FOUND_ROWS`).
async fn execute(tx: &mut Transaction<'_>, sql: &str, values: &[Value<'_>]) -> Result<u64, TxError> {
    tx.exec_drop(sql, params(values)).await.db()?;
    Ok(tx.affected_rows())
}

/// The database clock's now.
pub(super) async fn db_now<Q: Queryable + Send>(q: &mut Q) -> Result<Timestamp, TxError> {
    let now: Option<i64> = q.query_first(format!("SELECT {NOW_SQL}")).await.db()?;
    now.map(Timestamp::from_millis)
        .ok_or_else(|| TxError::Ledger(LedgerError::Internal("the database answered no time".into())))
}

fn plan_row(row: &mut MysqlRow) -> Result<Plan, LedgerError> {
    decode::plan(row, 0)
}

/// A plan by id; `lock` takes it `FOR UPDATE` (enqueue serializes on its plan).
pub(super) async fn read_plan<Q: Queryable + Send>(
    q: &mut Q,
    id: &PlanId,
    lock: bool,
) -> Result<Option<Plan>, TxError> {
    let queries = queries(&MYSQL);
    let sql = if lock {
        &queries.plan_by_id_locked
    } else {
        &queries.plan_by_id
    };
    query_one(q, sql, &[Value::Text(id.as_str())], plan_row).await
}

/// Plans by id (claims read the plans of their candidates in one query).
pub(super) async fn read_plans_by_id<Q: Queryable + Send>(
    q: &mut Q,
    ids: &[&PlanId],
) -> Result<BTreeMap<PlanId, Plan>, TxError> {
    if ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let marks = sql::placeholders(&MYSQL, 1, ids.len());
    let values: Vec<Value<'_>> = ids.iter().map(|id| Value::Text(id.as_str())).collect();
    let plans = query_all(
        q,
        &format!("SELECT {} FROM plan WHERE id IN ({marks})", PLAN.column_list(None)),
        &values,
        plan_row,
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
    let sql = &queries(&MYSQL).ready_plan_by_fingerprint_locked;
    query_one(tx, sql, &[Value::Text(fingerprint)], plan_row).await
}

/// Every plan, in registration order.
pub(super) async fn read_plans<Q: Queryable + Send>(q: &mut Q) -> Result<Vec<Plan>, TxError> {
    Ok(all_read(read_plan_rows(q).await?)?)
}

/// Every plan, in registration order, each row read on its own: a listing's
/// ([`PlanRow`]).
pub(super) async fn read_plan_rows<Q: Queryable + Send>(q: &mut Q) -> Result<Vec<PlanRow>, TxError> {
    let rows = query_all(q, &queries(&MYSQL).plans, &[], decode::listed_plan).await?;
    Ok(placed(rows))
}

/// The plans named `name`, oldest first.
pub(super) async fn read_plans_named<Q: Queryable + Send>(q: &mut Q, name: &str) -> Result<Vec<Plan>, TxError> {
    query_all(q, &queries(&MYSQL).plans_named, &[Value::Text(name)], plan_row).await
}

/// Up to `limit` plans, newest first, registered before `before` (from the newest when
/// `None`); an unknown `before` is not found.
pub(super) async fn read_plans_newest_first<Q: Queryable + Send>(
    q: &mut Q,
    before: Option<&PlanId>,
    limit: u32,
) -> Result<Vec<Plan>, TxError> {
    Ok(all_read(read_plan_rows_newest_first(q, before, limit).await?)?)
}

/// [`read_plans_newest_first`], each row read on its own: a listing's ([`PlanRow`]).
pub(super) async fn read_plan_rows_newest_first<Q: Queryable + Send>(
    q: &mut Q,
    before: Option<&PlanId>,
    limit: u32,
) -> Result<Vec<PlanRow>, TxError> {
    let (sql, values) = sql::query::plans_page(&MYSQL, before, limit);
    let page = query_all(q, sql, &values, decode::listed_plan).await?;
    // An empty page after `before`: the oldest plan, or no such plan.
    if let (true, Some(id)) = (page.is_empty(), before) {
        read_plan(q, id, false).await?.ok_or_else(|| not_found("plan", id))?;
    }
    Ok(placed(page))
}

/// Inserts a newly registered plan.
pub(super) async fn insert_plan(tx: &mut Transaction<'_>, plan: &Plan) -> Result<(), TxError> {
    let (steps, volatile) = plan_json(plan)?;
    let values = plan_values(plan, &steps, &volatile);
    execute(tx, &queries(&MYSQL).insert_plan, &values).await?;
    Ok(())
}

/// Sets a plan's status; answers whether the plan exists.
pub(super) async fn set_plan_status(
    tx: &mut Transaction<'_>,
    id: &PlanId,
    status: PlanStatus,
) -> Result<bool, TxError> {
    let values = [Value::Text(status.as_str()), Value::Text(id.as_str())];
    let n = execute(tx, &queries(&MYSQL).set_plan_status, &values).await?;
    Ok(n > 0)
}

/// An attempt and its command, locked in that order, with the database clock's now
/// read once both are held (so a lock wait does not age it).
pub(super) async fn lock_head(
    tx: &mut Transaction<'_>,
    id: &AttemptId,
) -> Result<Option<(Attempt, Command, Timestamp)>, TxError> {
    let key = [Value::Text(id.as_str())];
    let Some(attempt) = query_one(tx, &queries(&MYSQL).attempt_by_id_locked, &key, |r| {
        decode::attempt(r, 0)
    })
    .await?
    else {
        return Ok(None);
    };
    let sql = format!(
        "SELECT {}, {NOW_SQL} FROM command WHERE attempt_id = ? FOR UPDATE",
        COMMAND.column_list(None)
    );
    let (command, now) = query_one(tx, &sql, &key, |row| {
        let command = decode::command(row, 0)?;
        let now = decode::scalar(row, COMMAND.columns.len(), "the database's now")?;
        Ok((command, Timestamp::from_millis(now)))
    })
    .await?
    .ok_or_else(|| decode::no_command(id))?;
    Ok(Some((attempt, command, now)))
}

/// The database clock's now when the expression runs (`SYSDATE`), in milliseconds:
/// in a locking read's select list it runs for each row once that row is held, where
/// `NOW` would be the statement's start, before any lock wait. (A server started with
/// `--sysdate-is-now` reads it as `NOW`: a decision after a lock wait is then made at
/// the time the statement started, at most the lock-wait timeout earlier.)
const SYSDATE_SQL: &str = "CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000) AS SIGNED)";

/// [`lock_record`]'s statement: one row per receipt (or one with NULL receipt
/// columns), the tables joined in the lock order (`STRAIGHT_JOIN` keeps the nested
/// loop in `FROM` order: the attempt, its command, then its receipts).
static LOCK_RECORD_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT STRAIGHT_JOIN {}, {}, {}, {SYSDATE_SQL} FROM attempt a \
         JOIN command c ON c.attempt_id = a.id LEFT JOIN receipt r ON r.attempt_id = a.id \
         WHERE a.id = ? FOR UPDATE",
        ATTEMPT.column_list(Some("a")),
        COMMAND.column_list(Some("c")),
        RECEIPT.column_list(Some("r")),
    )
});

/// An attempt with its command and receipts (by ordinal), locked in the lock order by
/// one statement, with the database clock's now read once every row was held (the
/// latest of the rows' `SYSDATE`s), so a lock wait does not age it. An attempt without
/// a command is an integrity error; no attempt is `None`.
pub(super) async fn lock_record(
    tx: &mut Transaction<'_>,
    id: &AttemptId,
) -> Result<Option<(AttemptRecord, Timestamp)>, TxError> {
    let (attempt_columns, command_columns) = (ATTEMPT.columns.len(), COMMAND.columns.len());
    let receipt_base = attempt_columns + command_columns;
    let now_at = receipt_base + RECEIPT.columns.len();
    // Every row repeats the attempt and the command; each is parsed (strictly), the
    // first kept.
    let rows = query_all(tx, &LOCK_RECORD_SQL, &[Value::Text(id.as_str())], |row| {
        let attempt = decode::attempt(row, 0)?;
        let command = decode::command(row, attempt_columns)?;
        let receipt = decode::receipt_if_any(row, receipt_base)?;
        let now = decode::scalar(row, now_at, "the database's now")?;
        Ok((attempt, command, receipt, now))
    })
    .await?;
    let mut rows = rows.into_iter();
    let Some((attempt, command, first, now)) = rows.next() else {
        // No row: no attempt, or an attempt without its command.
        let key = [Value::Text(id.as_str())];
        return match query_one(tx, &queries(&MYSQL).attempt_by_id, &key, |r| decode::attempt(r, 0)).await? {
            Some(_) => Err(decode::no_command(id).into()),
            None => Ok(None),
        };
    };
    let mut receipts: Vec<Receipt> = first.into_iter().collect();
    let mut latest = now;
    for (_, _, receipt, now) in rows {
        receipts.extend(receipt);
        latest = latest.max(now);
    }
    receipts.sort_by_key(|r| r.ordinal);
    Ok(Some((
        AttemptRecord {
            attempt,
            command,
            receipts,
        },
        Timestamp::from_millis(latest),
    )))
}

/// An attempt's receipts by ordinal; `lock` takes them `FOR UPDATE`.
pub(super) async fn read_receipts<Q: Queryable + Send>(
    q: &mut Q,
    id: &AttemptId,
    lock: bool,
) -> Result<Vec<Receipt>, TxError> {
    let queries = queries(&MYSQL);
    let sql = if lock {
        &queries.receipts_of_attempt_locked
    } else {
        &queries.receipts_of_attempt
    };
    query_all(q, sql, &[Value::Text(id.as_str())], |r| decode::receipt(r, 0)).await
}

/// A listing's keys (`SELECT id, created_at …` with `params`), in the order read,
/// each as far as it reads ([`decode::page_key`]).
pub(super) async fn read_page_keys<Q: Queryable + Send>(
    q: &mut Q,
    sql: &str,
    params: Vec<mysql_async::Value>,
) -> Result<Vec<PageKey>, TxError> {
    let rows: Vec<Row> = q.exec(sql, params).await.db()?;
    Ok(rows.into_iter().map(|r| decode::page_key(&mut MysqlRow(r))).collect())
}

/// An attempt with its command and receipts (a consistent, non-locking read).
pub(super) async fn read_record<Q: Queryable + Send>(
    q: &mut Q,
    id: &AttemptId,
) -> Result<Option<AttemptRecord>, TxError> {
    let queries = queries(&MYSQL);
    let key = [Value::Text(id.as_str())];
    let Some(attempt) = query_one(q, &queries.attempt_by_id, &key, |r| decode::attempt(r, 0)).await? else {
        return Ok(None);
    };
    let command = query_one(q, &queries.command_of_attempt, &key, |r| decode::command(r, 0))
        .await?
        .ok_or_else(|| decode::no_command(id))?;
    let receipts = read_receipts(q, id, false).await?;
    Ok(Some(AttemptRecord {
        attempt,
        command,
        receipts,
    }))
}

/// Every attempt of a plan with its command and receipts, by number (non-locking).
pub(super) async fn read_history<Q: Queryable + Send>(q: &mut Q, plan: &PlanId) -> Result<Vec<AttemptRecord>, TxError> {
    let queries = queries(&MYSQL);
    let key = [Value::Text(plan.as_str())];
    let attempts = query_all(q, &queries.history_attempts, &key, |r| decode::attempt(r, 0)).await?;
    if attempts.is_empty() {
        return Ok(Vec::new());
    }
    let commands = query_all(q, &queries.history_commands, &key, |r| decode::command(r, 0)).await?;
    let receipts = query_all(q, &queries.history_receipts, &key, |r| decode::receipt(r, 0)).await?;
    Ok(decode::history(attempts, commands, receipts)?)
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
    let sql = format!(
        "SELECT id, attempt_id, plan_id FROM ( \
           (SELECT c.id, c.attempt_id, a.plan_id, c.available_at FROM command c JOIN attempt a ON a.id = c.attempt_id \
             WHERE {pending}? ORDER BY c.available_at, c.id LIMIT ?) \
           UNION ALL \
           (SELECT c.id, c.attempt_id, a.plan_id, c.available_at FROM command c JOIN attempt a ON a.id = c.attempt_id \
             WHERE {expired}? ORDER BY c.lease_until, c.id LIMIT ?) \
         ) AS candidate ORDER BY {order} LIMIT ?",
        pending = write::claimable_pending("c."),
        expired = write::claimable_expired("c."),
        order = write::CLAIM_ORDER,
    );
    let now = Value::ts(now);
    query_all(q, &sql, &[now, limit, now, limit, limit], |row| {
        Ok(Candidate {
            command: decode::command_id(row, 0)?,
            attempt: AttemptId::new(decode::string(row, 1, "claim candidate")?),
            plan: PlanId::new(decode::string(row, 2, "claim candidate")?),
        })
    })
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

impl NowSql {
    /// Appends this `now` to a statement.
    fn push(self, sql: &mut Sql<'_>) {
        match self {
            NowSql::Db => {
                sql.push(NOW_SQL);
            }
            NowSql::At(t) => {
                sql.bind(Value::ts(t));
            }
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
fn push_claim_window<'a>(sql: &mut Sql<'a>, now: NowSql, after: Option<&'a ClaimKey>, window: u32) {
    let arm = |sql: &mut Sql<'a>, index: &str, condition: &str| {
        sql.push("(SELECT id, attempt_id, available_at FROM command FORCE INDEX (")
            .push(index)
            .push(") WHERE ")
            .push(condition);
        now.push(sql);
        if let Some((at, id)) = after {
            sql.push(" AND (available_at > ")
                .bind(Value::ts(*at))
                .push(" OR (available_at = ")
                .bind(Value::ts(*at))
                .push(" AND id > ")
                .bind(Value::Text(id.as_str()))
                .push("))");
        }
        sql.push(" ORDER BY ")
            .push(write::CLAIM_ORDER)
            .push(" LIMIT ")
            .bind(Value::Int(window.into()))
            .push(")");
    };
    sql.push("SELECT id, attempt_id, available_at FROM (");
    arm(sql, "command_claimable", &write::claimable_pending(""));
    sql.push(" UNION ALL ");
    arm(sql, "command_expired", &write::claimable_expired(""));
    sql.push(") AS claimable ORDER BY ")
        .push(write::CLAIM_ORDER)
        .push(" LIMIT ")
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
    let mut sql = Sql::new(&MYSQL);
    sql.push(&format!(
        "SELECT {}, {}, ",
        ATTEMPT.column_list(Some("a")),
        COMMAND.column_list(Some("c"))
    ));
    now.push(&mut sql);
    sql.push(" AS now, w.available_at FROM (");
    push_claim_window(&mut sql, now, after, window);
    sql.push(
        ") AS w STRAIGHT_JOIN attempt a FORCE INDEX (PRIMARY) ON a.id = w.attempt_id \
         STRAIGHT_JOIN command c FORCE INDEX (PRIMARY) ON c.id = w.id",
    );
    sql.push(" ORDER BY w.available_at, w.id LIMIT ")
        .bind(Value::Int(want.into()))
        .push(" FOR UPDATE SKIP LOCKED");
    let attempt_columns = ATTEMPT.columns.len();
    let command_columns = COMMAND.columns.len();
    query_all(tx, &sql.text, &sql.values, |row| {
        let attempt = decode::attempt(row, 0)?;
        let command = decode::command(row, attempt_columns)?;
        let base = attempt_columns + command_columns;
        let now = Timestamp::from_millis(decode::scalar(row, base, "claim: now")?);
        let key = (
            Timestamp::from_millis(decode::scalar(row, base + 1, "claim: available_at")?),
            command.id.clone(),
        );
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
    let mut sql = Sql::new(&MYSQL);
    sql.push("SELECT w.available_at, w.id, ");
    now.push(&mut sql);
    sql.push(" FROM (");
    push_claim_window(&mut sql, now, after, window);
    sql.push(") AS w ORDER BY w.available_at, w.id LIMIT 1 OFFSET ")
        .bind(Value::Int(window.saturating_sub(1).into()));
    query_one(q, &sql.text, &sql.values, |row| {
        let at = Timestamp::from_millis(decode::scalar(row, 0, "claim window: available_at")?);
        let id = decode::command_id(row, 1)?;
        let now = Timestamp::from_millis(decode::scalar(row, 2, "claim window: now")?);
        Ok(((at, id), now))
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
    let marks = sql::placeholders(&MYSQL, 1, ids.len());
    let values: Vec<Value<'_>> = ids.iter().map(|id| Value::Text(id.as_str())).collect();
    let sql = format!(
        "SELECT {} FROM receipt WHERE attempt_id IN ({marks}) ORDER BY attempt_id, ordinal FOR UPDATE",
        RECEIPT.column_list(None)
    );
    for r in query_all(tx, &sql, &values, |r| decode::receipt(r, 0)).await? {
        out.entry(r.attempt_id.clone()).or_default().push(r);
    }
    Ok(out)
}

/// How many attempts are open (QUEUED or RUNNING): the shared count of their PENDING
/// and PROCESSING commands, two ranges of `command_claimable (status, …)`.
pub(super) async fn count_open_attempts<Q: Queryable + Send>(q: &mut Q) -> Result<u64, TxError> {
    let n = query_one(q, &queries(&MYSQL).open_attempts, &[], |row| {
        decode::scalar(row, 0, "open attempts")
    })
    .await?
    .unwrap_or(0);
    u64::try_from(n).map_err(|_| TxError::Ledger(LedgerError::Internal(format!("negative count {n}"))))
}

/// Runs the statements of a transition in order, checking each.
async fn run(tx: &mut Transaction<'_>, statements: &[Statement<'_>]) -> Result<(), TxError> {
    for s in statements {
        match s.expect {
            Expect::GuardHolds(attempt) => {
                let row = query_one(tx, &s.sql, &s.values, decode::guard_check).await?;
                write::guard_answer(attempt, row)?;
            }
            // A command for this attempt already existing is the guard failing.
            Expect::InsertedUnlessPresent(id) => match tx.exec_drop(&*s.sql, params(&s.values)).await {
                Ok(()) => {}
                Err(mysql_async::Error::Server(e)) if e.code == ER_DUP_ENTRY => return Err(write::stale(id).into()),
                Err(e) => return Err(e).db(),
            },
            expect => expect.check(execute(tx, &s.sql, &s.values).await?)?,
        }
    }
    Ok(())
}

/// Applies the engine's writes inside `tx` over `before`, the rows as locked in this
/// transaction (`None` for `Guard::Absent`, an insert): [`write::plan`]. A guard that
/// no longer holds answers [`leasehold_engine::Refusal::StaleToken`]; the caller then
/// rolls the whole transaction back, so every row stays as it was. Writes without any
/// image write nothing.
pub(super) async fn apply_writes(
    tx: &mut Transaction<'_>,
    before: Option<&AttemptRecord>,
    writes: &Writes,
) -> Result<(), TxError> {
    let statements = write::plan(&MYSQL, before, writes)?;
    run(tx, &statements).await
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
pub(super) async fn apply_writes_batch(
    tx: &mut Transaction<'_>,
    items: &[(&AttemptRecord, &Writes)],
) -> Result<(), TxError> {
    let Some((_, first)) = items.first() else {
        return Ok(());
    };
    let batchable = items
        .iter()
        .all(|(_, w)| w.guard != Guard::Absent && w.guard == first.guard && w.attempt.is_some() && w.command.is_some());
    if !batchable {
        for (before, w) in items {
            apply_writes(tx, Some(before), w).await?;
        }
        return Ok(());
    }
    let writes: Vec<&Writes> = items.iter().map(|(_, w)| *w).collect();
    let commands: Vec<&Command> = writes.iter().filter_map(|w| w.command.as_ref()).collect();
    let rows: Vec<[Value<'_>; 11]> = commands.iter().map(|c| command_values(c)).collect();
    let n = update_rows(tx, &COMMAND, &rows, Some(&first.guard)).await?;
    if n != rows.len() as u64 {
        return Err(write::stale(&commands[0].id).into());
    }
    let attempts: Vec<[Value<'_>; 9]> = writes
        .iter()
        .filter_map(|w| w.attempt.as_ref())
        .map(attempt_values)
        .collect();
    let n = update_rows(tx, &ATTEMPT, &attempts, None).await?;
    if n != attempts.len() as u64 {
        return Err(LedgerError::Integrity("an attempt vanished during a transition".into()).into());
    }
    let receipts: Vec<[Value<'_>; 11]> = writes.iter().flat_map(|w| &w.receipts).map(receipt_values).collect();
    let n = update_rows(tx, &RECEIPT, &receipts, None).await?;
    if n != receipts.len() as u64 {
        return Err(LedgerError::Integrity("a receipt vanished during a transition".into()).into());
    }
    Ok(())
}

/// Updates `rows` (full row images) of `table` in one statement where `guard`
/// holds; answers the rows it matched. Every mutable column is set: a column whose
/// new value is the same for every row to that value, any other to a `CASE` over
/// the rows' keys.
async fn update_rows<'a>(
    tx: &mut Transaction<'_>,
    table: &Table,
    rows: &[impl AsRef<[Value<'a>]>],
    guard: Option<&'a Guard>,
) -> Result<u64, TxError> {
    let Some(first) = rows.first().map(AsRef::as_ref) else {
        return Ok(0);
    };
    let matches = |sql: &mut Sql<'a>, row: &[Value<'a>]| {
        sql.push("(");
        for (i, value) in row.iter().take(table.key).enumerate() {
            if i > 0 {
                sql.push(" AND ");
            }
            sql.push(table.column(i)).push(" = ");
            sql.bind(*value);
        }
        sql.push(")");
    };
    let mut sql = Sql::new(&MYSQL);
    sql.push("UPDATE ").push(table.name).push(" SET ");
    for (j, &column) in table.mutable.iter().enumerate() {
        if j > 0 {
            sql.push(", ");
        }
        sql.push(table.column(column)).push(" = ");
        if rows.iter().all(|r| r.as_ref()[column] == first[column]) {
            sql.bind(first[column]);
        } else {
            sql.push("CASE");
            for r in rows {
                sql.push(" WHEN ");
                matches(&mut sql, r.as_ref());
                sql.push(" THEN ").bind(r.as_ref()[column]);
            }
            sql.push(" ELSE ").push(table.column(column)).push(" END");
        }
    }
    sql.push(" WHERE (");
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            sql.push(" OR ");
        }
        matches(&mut sql, r.as_ref());
    }
    sql.push(")");
    if let Some(guard) = guard {
        let mut next = sql.values.len() + 1;
        sql.push(" AND ");
        write::push_guard_text(&MYSQL, &mut sql.text, &mut next, guard);
        sql.values.extend(write::guard_values(guard));
    }
    execute(tx, &sql.text, &sql.values).await
}
