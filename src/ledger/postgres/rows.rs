//! PostgreSQL's execution of the shared SQL layer ([`crate::ledger::sql`]), and its own
//! SQL text: the locking reads of a transition and the claim's candidate CTE with
//! `FOR UPDATE SKIP LOCKED`.
//!
//! Values are bound by the types the server inferred for each placeholder (a NULL is
//! a NULL of that type), and rows are read strictly through the shared decoders
//! ([`crate::ledger::sql::decode`]). Locking reads take the rows in the lock order:
//! attempt, then command, then receipts by ordinal. Writes run the statements of
//! [`crate::ledger::sql::write::plan`]; the command's `UPDATE` carries the guard as
//! its `WHERE` condition and zero affected rows (PostgreSQL counts matched rows) is a
//! refusal. Every statement of the ledger's own sessions is prepared once per session
//! (deadpool's statement cache); a caller's plain `tokio_postgres` transaction (the
//! outbox, [`super::outbox`]) has no cache and prepares each statement as it runs it
//! ([`Session`]).

use super::error::{classify, Phase, TxError};
use crate::ledger::listing::{all_read, placed, PlanRow};
use crate::ledger::sql::decode::{self, ColumnReader};
use crate::ledger::sql::query::queries;
use crate::ledger::sql::table::{plan_json, plan_values, ATTEMPT, COMMAND, PLAN, RECEIPT};
use crate::ledger::sql::write::{self, Expect, Statement};
use crate::ledger::sql::{self, Sql, Value, POSTGRES};
use crate::ledger::LedgerError;
use deadpool_postgres::GenericClient;
use leasehold_engine::{
    Attempt, AttemptId, AttemptRecord, Command, Plan, PlanId, PlanStatus, Receipt, Timestamp, Writes,
};
use std::collections::BTreeMap;
use std::future::Future;
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Row, Statement as Prepared};

/// What the row code runs its statements on: a pooled session or one of its
/// transactions (every [`GenericClient`], preparing through deadpool's statement
/// cache), or a caller's own `tokio_postgres` transaction (the outbox's
/// [`super::outbox`] session, which prepares plainly: it has no cache).
pub(super) trait Session: Sync {
    /// Prepares `sql` (from the session's statement cache where it has one).
    fn prepare_statement(&self, sql: &str) -> impl Future<Output = Result<Prepared, tokio_postgres::Error>> + Send;

    /// Runs a prepared query; answers its rows.
    fn query_statement(
        &self,
        statement: &Prepared,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + Send;

    /// Runs a prepared statement; answers the rows it affected.
    fn execute_statement(
        &self,
        statement: &Prepared,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<u64, tokio_postgres::Error>> + Send;
}

impl<C: GenericClient> Session for C {
    async fn prepare_statement(&self, sql: &str) -> Result<Prepared, tokio_postgres::Error> {
        self.prepare_cached(sql).await
    }

    async fn query_statement(
        &self,
        statement: &Prepared,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        GenericClient::query(self, statement, params).await
    }

    async fn execute_statement(
        &self,
        statement: &Prepared,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        GenericClient::execute(self, statement, params).await
    }
}

/// The database clock's now, in milliseconds since the Unix epoch.
pub(super) const NOW_SQL: &str = POSTGRES.now_ms;

pub(super) fn not_found(kind: &'static str, id: impl ToString) -> LedgerError {
    LedgerError::NotFound {
        kind,
        id: id.to_string(),
    }
}

fn statement_error(e: tokio_postgres::Error) -> TxError {
    classify(&e, Phase::Statement)
}

/// A shared [`Value`] as the driver binds it for a placeholder of type `ty`.
enum Param<'a> {
    Int8(Option<i64>),
    Int4(Option<i32>),
    Text(Option<&'a str>),
}

impl Param<'_> {
    fn as_sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Param::Int8(v) => v,
            Param::Int4(v) => v,
            Param::Text(v) => v,
        }
    }
}

/// Binds `values` to a statement whose placeholders have `types`.
fn params<'a>(types: &[Type], values: &[Value<'a>]) -> Result<Vec<Param<'a>>, TxError> {
    if types.len() != values.len() {
        return Err(LedgerError::Internal(format!(
            "a statement takes {} parameters, {} given",
            types.len(),
            values.len()
        ))
        .into());
    }
    types
        .iter()
        .zip(values)
        .map(|(ty, v)| {
            let param = match (*ty == Type::INT8, *ty == Type::INT4, v) {
                (true, _, Value::Int(i)) => Param::Int8(Some(*i)),
                (true, _, Value::Null) => Param::Int8(None),
                (_, true, Value::Int(i)) => {
                    Param::Int4(Some(i32::try_from(*i).map_err(|_| {
                        LedgerError::Internal(format!("{i} does not fit a 32-bit parameter"))
                    })?))
                }
                (_, true, Value::Null) => Param::Int4(None),
                (false, false, Value::Text(t)) => Param::Text(Some(t)),
                (false, false, Value::Null) => Param::Text(None),
                // The value is not named: it could be a lease token.
                _ => {
                    return Err(TxError::Ledger(LedgerError::Internal(format!(
                        "a parameter of type {ty} was given a value of another type"
                    ))))
                }
            };
            Ok(param)
        })
        .collect()
}

/// Any column's value, read only to see whether it is NULL.
struct Anything;

impl<'a> FromSql<'a> for Anything {
    fn from_sql(_: &Type, _: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Anything)
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// A driver row as the shared decoders read it.
struct PgRow<'r>(&'r Row);

impl PgRow<'_> {
    fn column(&self, idx: usize) -> Result<&tokio_postgres::Column, String> {
        self.0.columns().get(idx).ok_or_else(|| format!("#{idx} is missing"))
    }

    fn get<'a, T: FromSql<'a>>(&'a self, idx: usize) -> Result<Option<T>, String> {
        // The value itself is not echoed: it could be a lease token.
        self.0
            .try_get::<_, Option<T>>(idx)
            .map_err(|_| format!("{} has an unexpected value", self.0.columns()[idx].name()))
    }
}

impl ColumnReader for PgRow<'_> {
    fn int(&mut self, idx: usize) -> Result<Option<i64>, String> {
        let ty = self.column(idx)?.type_().clone();
        if ty == Type::INT8 {
            self.get::<i64>(idx)
        } else if ty == Type::INT4 {
            Ok(self.get::<i32>(idx)?.map(i64::from))
        } else if ty == Type::INT2 {
            Ok(self.get::<i16>(idx)?.map(i64::from))
        } else if ty == Type::BOOL {
            Ok(self.get::<bool>(idx)?.map(i64::from))
        } else {
            Err(format!("{} is not an integer", self.0.columns()[idx].name()))
        }
    }

    fn text(&mut self, idx: usize) -> Result<Option<String>, String> {
        self.column(idx)?;
        self.get::<String>(idx)
    }

    fn is_null(&mut self, idx: usize) -> Result<bool, String> {
        self.column(idx)?;
        Ok(self.get::<Anything>(idx)?.is_none())
    }
}

/// Runs a query (prepared once per pooled session, [`Session`]) and answers its rows.
pub(super) async fn rows<C: Session>(c: &C, sql: &str, values: &[Value<'_>]) -> Result<Vec<Row>, TxError> {
    let statement = c.prepare_statement(sql).await.map_err(statement_error)?;
    let params = params(statement.params(), values)?;
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(Param::as_sql).collect();
    c.query_statement(&statement, &refs).await.map_err(statement_error)
}

/// Runs a query and parses every row.
pub(super) async fn query_all<C: Session, T>(
    c: &C,
    sql: &str,
    values: &[Value<'_>],
    parse: impl Fn(&mut dyn ColumnReader) -> Result<T, LedgerError>,
) -> Result<Vec<T>, TxError> {
    parse_all(&rows(c, sql, values).await?, parse)
}

/// Parses every row.
pub(super) fn parse_all<T>(
    rows: &[Row],
    parse: impl Fn(&mut dyn ColumnReader) -> Result<T, LedgerError>,
) -> Result<Vec<T>, TxError> {
    rows.iter()
        .map(|r| parse(&mut PgRow(r)).map_err(TxError::from))
        .collect()
}

/// Runs a query and parses its first row, if any.
pub(super) async fn query_one<C: Session, T>(
    c: &C,
    sql: &str,
    values: &[Value<'_>],
    parse: impl Fn(&mut dyn ColumnReader) -> Result<T, LedgerError>,
) -> Result<Option<T>, TxError> {
    Ok(query_all(c, sql, values, parse).await?.into_iter().next())
}

/// Runs a statement; answers the rows it affected.
pub(super) async fn execute<C: Session>(c: &C, sql: &str, values: &[Value<'_>]) -> Result<u64, TxError> {
    let statement = c.prepare_statement(sql).await.map_err(statement_error)?;
    let params = params(statement.params(), values)?;
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(Param::as_sql).collect();
    c.execute_statement(&statement, &refs).await.map_err(statement_error)
}

/// The database clock's now.
pub(super) async fn db_now<C: Session>(c: &C) -> Result<Timestamp, TxError> {
    query_one(c, &format!("SELECT {NOW_SQL}"), &[], |r| {
        decode::scalar(r, 0, "the database's now")
    })
    .await?
    .map(Timestamp::from_millis)
    .ok_or_else(|| TxError::Ledger(LedgerError::Internal("the database answered no time".into())))
}

fn plan_row(row: &mut dyn ColumnReader) -> Result<Plan, LedgerError> {
    decode::plan(row, 0)
}

/// A plan by id; `lock` takes it `FOR UPDATE` (enqueue serializes on its plan).
pub(super) async fn read_plan<C: Session>(c: &C, id: &PlanId, lock: bool) -> Result<Option<Plan>, TxError> {
    let q = queries(&POSTGRES);
    let sql = if lock { &q.plan_by_id_locked } else { &q.plan_by_id };
    query_one(c, sql, &[Value::Text(id.as_str())], plan_row).await
}

/// Plans by id (claims read the plans of their candidates in one query).
pub(super) async fn read_plans_by_id<C: Session>(c: &C, ids: &[&PlanId]) -> Result<BTreeMap<PlanId, Plan>, TxError> {
    if ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let marks = sql::placeholders(&POSTGRES, 1, ids.len());
    let values: Vec<Value<'_>> = ids.iter().map(|id| Value::Text(id.as_str())).collect();
    let sql = format!("SELECT {} FROM plan WHERE id IN ({marks})", PLAN.column_list(None));
    let plans = query_all(c, &sql, &values, plan_row).await?;
    Ok(plans.into_iter().map(|p| (p.id.clone(), p)).collect())
}

/// Serializes registrations of one content: a transaction-scoped advisory lock on the
/// fingerprint (row locks hold no gaps here, so the lookup alone would let two
/// concurrent registrations both insert).
pub(super) async fn lock_fingerprint<C: Session>(c: &C, fingerprint: &str) -> Result<(), TxError> {
    rows(
        c,
        "SELECT pg_advisory_xact_lock(hashtext($1))",
        &[Value::Text(fingerprint)],
    )
    .await?;
    Ok(())
}

/// The oldest READY plan with this fingerprint, locked.
pub(super) async fn lock_ready_plan_by_fingerprint<C: Session>(
    c: &C,
    fingerprint: &str,
) -> Result<Option<Plan>, TxError> {
    let sql = &queries(&POSTGRES).ready_plan_by_fingerprint_locked;
    query_one(c, sql, &[Value::Text(fingerprint)], plan_row).await
}

/// Every plan, in registration order.
pub(super) async fn read_plans<C: Session>(c: &C) -> Result<Vec<Plan>, TxError> {
    Ok(all_read(read_plan_rows(c).await?)?)
}

/// Every plan, in registration order, each row read on its own: a listing's
/// ([`PlanRow`]).
pub(super) async fn read_plan_rows<C: Session>(c: &C) -> Result<Vec<PlanRow>, TxError> {
    let rows = query_all(c, &queries(&POSTGRES).plans, &[], |r| decode::listed_plan(r)).await?;
    Ok(placed(rows))
}

/// The plans named `name`, oldest first.
pub(super) async fn read_plans_named<C: Session>(c: &C, name: &str) -> Result<Vec<Plan>, TxError> {
    query_all(c, &queries(&POSTGRES).plans_named, &[Value::Text(name)], plan_row).await
}

/// Up to `limit` plans, newest first, registered before `before` (from the newest when
/// `None`); an unknown `before` is not found.
pub(super) async fn read_plans_newest_first<C: Session>(
    c: &C,
    before: Option<&PlanId>,
    limit: u32,
) -> Result<Vec<Plan>, TxError> {
    Ok(all_read(read_plan_rows_newest_first(c, before, limit).await?)?)
}

/// [`read_plans_newest_first`], each row read on its own: a listing's ([`PlanRow`]).
pub(super) async fn read_plan_rows_newest_first<C: Session>(
    c: &C,
    before: Option<&PlanId>,
    limit: u32,
) -> Result<Vec<PlanRow>, TxError> {
    let (sql, values) = sql::query::plans_page(&POSTGRES, before, limit);
    let page = query_all(c, sql, &values, |r| decode::listed_plan(r)).await?;
    // An empty page after `before`: the oldest plan, or no such plan.
    if let (true, Some(id)) = (page.is_empty(), before) {
        read_plan(c, id, false).await?.ok_or_else(|| not_found("plan", id))?;
    }
    Ok(placed(page))
}

/// Inserts a newly registered plan.
pub(super) async fn insert_plan<C: Session>(c: &C, plan: &Plan) -> Result<(), TxError> {
    let (steps, volatile) = plan_json(plan)?;
    let values = plan_values(plan, &steps, &volatile);
    execute(c, &queries(&POSTGRES).insert_plan, &values).await?;
    Ok(())
}

/// Sets a plan's status; answers whether the plan exists.
pub(super) async fn set_plan_status<C: Session>(c: &C, id: &PlanId, status: PlanStatus) -> Result<bool, TxError> {
    let values = [Value::Text(status.as_str()), Value::Text(id.as_str())];
    Ok(execute(c, &queries(&POSTGRES).set_plan_status, &values).await? > 0)
}

/// `SELECT <command> FROM command WHERE attempt_id = $1 FOR UPDATE`.
fn command_of_attempt_locked() -> String {
    format!("{} FOR UPDATE", queries(&POSTGRES).command_of_attempt)
}

/// An attempt, its command and its receipts, locked in that order, and — when
/// `with_now` — the database clock's now read once they are all held (so a lock wait
/// does not age it). The four statements are pipelined: sent at once, executed by the
/// server one after the other, in this order.
pub(super) async fn lock_record<C: Session>(
    c: &C,
    id: &AttemptId,
    with_now: bool,
) -> Result<Option<(AttemptRecord, Option<Timestamp>)>, TxError> {
    let q = queries(&POSTGRES);
    let key = [Value::Text(id.as_str())];
    let command_sql = command_of_attempt_locked();
    let now_sql = format!("SELECT {NOW_SQL}");
    // Prepare first (cached after a session's first use), so that the pipelined
    // executions go out in lock order.
    let (a, cmd, r, n) = tokio::try_join!(
        c.prepare_statement(&q.attempt_by_id_locked),
        c.prepare_statement(&command_sql),
        c.prepare_statement(&q.receipts_of_attempt_locked),
        c.prepare_statement(&now_sql),
    )
    .map_err(statement_error)?;
    let pa = params(a.params(), &key)?;
    let pc = params(cmd.params(), &key)?;
    let pr = params(r.params(), &key)?;
    let ra: Vec<&(dyn ToSql + Sync)> = pa.iter().map(Param::as_sql).collect();
    let rc: Vec<&(dyn ToSql + Sync)> = pc.iter().map(Param::as_sql).collect();
    let rr: Vec<&(dyn ToSql + Sync)> = pr.iter().map(Param::as_sql).collect();
    let (attempts, commands, receipts, now) = if with_now {
        let (x, y, z, w) = tokio::try_join!(
            c.query_statement(&a, &ra),
            c.query_statement(&cmd, &rc),
            c.query_statement(&r, &rr),
            c.query_statement(&n, &[])
        )
        .map_err(statement_error)?;
        (x, y, z, Some(w))
    } else {
        let (x, y, z) = tokio::try_join!(
            c.query_statement(&a, &ra),
            c.query_statement(&cmd, &rc),
            c.query_statement(&r, &rr)
        )
        .map_err(statement_error)?;
        (x, y, z, None)
    };
    let Some(attempt) = parse_all(&attempts, |r| decode::attempt(r, 0))?.into_iter().next() else {
        return Ok(None);
    };
    let command = parse_all(&commands, |r| decode::command(r, 0))?
        .into_iter()
        .next()
        .ok_or_else(|| decode::no_command(id))?;
    let receipts = parse_all(&receipts, |r| decode::receipt(r, 0))?;
    let now = match now {
        Some(rows) => Some(
            parse_all(&rows, |r| decode::scalar(r, 0, "the database's now"))?
                .into_iter()
                .next()
                .map(Timestamp::from_millis)
                .ok_or_else(|| LedgerError::Internal("the database answered no time".into()))?,
        ),
        None => None,
    };
    Ok(Some((
        AttemptRecord {
            attempt,
            command,
            receipts,
        },
        now,
    )))
}

/// An attempt's receipts by ordinal (non-locking).
pub(super) async fn read_receipts<C: Session>(c: &C, id: &AttemptId) -> Result<Vec<Receipt>, TxError> {
    let sql = &queries(&POSTGRES).receipts_of_attempt;
    query_all(c, sql, &[Value::Text(id.as_str())], |r| decode::receipt(r, 0)).await
}

/// An attempt with its command and receipts (non-locking; the caller's transaction
/// makes it one snapshot).
pub(super) async fn read_record<C: Session>(c: &C, id: &AttemptId) -> Result<Option<AttemptRecord>, TxError> {
    let q = queries(&POSTGRES);
    let key = [Value::Text(id.as_str())];
    let Some(attempt) = query_one(c, &q.attempt_by_id, &key, |r| decode::attempt(r, 0)).await? else {
        return Ok(None);
    };
    let command = query_one(c, &q.command_of_attempt, &key, |r| decode::command(r, 0))
        .await?
        .ok_or_else(|| decode::no_command(id))?;
    let receipts = read_receipts(c, id).await?;
    Ok(Some(AttemptRecord {
        attempt,
        command,
        receipts,
    }))
}

/// Every attempt of a plan with its command and receipts, by number (non-locking).
pub(super) async fn read_history<C: Session>(c: &C, plan: &PlanId) -> Result<Vec<AttemptRecord>, TxError> {
    let q = queries(&POSTGRES);
    let key = [Value::Text(plan.as_str())];
    let attempts = query_all(c, &q.history_attempts, &key, |r| decode::attempt(r, 0)).await?;
    if attempts.is_empty() {
        return Ok(Vec::new());
    }
    let commands = query_all(c, &q.history_commands, &key, |r| decode::command(r, 0)).await?;
    let receipts = query_all(c, &q.history_receipts, &key, |r| decode::receipt(r, 0)).await?;
    Ok(decode::history(attempts, commands, receipts)?)
}

/// A command a claim locked, with its attempt, as they are now (locked).
#[derive(Debug)]
pub(super) struct Picked {
    /// The attempt, locked.
    pub(super) attempt: Attempt,
    /// Its command, locked: the latest committed version, which may no longer be
    /// claimable (a race lost to a claimer that committed meanwhile).
    pub(super) command: Command,
}

/// Locks up to `want` commands claimable at `now` (bound, or the database's clock
/// when `None`), oldest `available_at` first, then by id, with their attempts,
/// skipping every one that another transaction holds.
///
/// The CTE picks the candidates from the two arms of the claim rule, each a range of
/// its own partial index (`command_pending`, `command_leased`), without locking them;
/// the outer query then locks, in claim order, each candidate's attempt and command
/// (`FOR UPDATE OF a, c SKIP LOCKED`) until it holds `want` of them. `SKIP LOCKED`
/// never waits, so this statement cannot take part in a deadlock whatever order it
/// takes the two rows of one candidate in. The rows come back as they are once locked
/// (READ COMMITTED re-reads a row changed since the statement's snapshot), so the
/// caller re-checks each at its `now` before it decides.
pub(super) async fn lock_claimable<C: Session>(
    c: &C,
    now: Option<Timestamp>,
    window: u32,
    want: u32,
) -> Result<(Vec<Picked>, Timestamp), TxError> {
    let mut sql = Sql::new(&POSTGRES);
    let push_now = |sql: &mut Sql<'_>| match now {
        Some(t) => {
            sql.bind(Value::ts(t));
        }
        None => {
            sql.push("(SELECT now_ms FROM clock)");
        }
    };
    sql.push(&format!(
        "WITH clock AS MATERIALIZED (SELECT {NOW_SQL} AS now_ms), candidate AS ("
    ));
    sql.push("(SELECT id, attempt_id, available_at FROM command WHERE ")
        .push(&write::claimable_pending(""));
    push_now(&mut sql);
    sql.push(" ORDER BY ")
        .push(write::CLAIM_ORDER)
        .push(" LIMIT ")
        .bind(Value::Int(window.into()))
        .push(") UNION ALL (SELECT id, attempt_id, available_at FROM command WHERE ")
        .push(&write::claimable_expired(""));
    push_now(&mut sql);
    sql.push(" ORDER BY lease_until, id LIMIT ")
        .bind(Value::Int(window.into()))
        .push("))");
    sql.push(&format!(
        " SELECT {}, {}, (SELECT now_ms FROM clock) FROM candidate w \
         JOIN attempt a ON a.id = w.attempt_id JOIN command c ON c.id = w.id \
         ORDER BY w.available_at, w.id LIMIT ",
        ATTEMPT.column_list(Some("a")),
        COMMAND.column_list(Some("c"))
    ))
    .bind(Value::Int(want.into()))
    .push(" FOR UPDATE OF a, c SKIP LOCKED");
    let rows = rows(c, &sql.text, &sql.values).await?;
    let attempt_columns = ATTEMPT.columns.len();
    let base = attempt_columns + COMMAND.columns.len();
    let mut read_now = None;
    let mut picked = Vec::with_capacity(rows.len());
    for row in &rows {
        let mut r = PgRow(row);
        let attempt = decode::attempt(&mut r, 0)?;
        let command = decode::command(&mut r, attempt_columns)?;
        read_now = Some(decode::scalar(&mut r, base, "claim: now")?);
        picked.push(Picked { attempt, command });
    }
    let now = match (now, read_now) {
        (Some(t), _) => t,
        (None, Some(ms)) => Timestamp::from_millis(ms),
        (None, None) => db_now(c).await?,
    };
    Ok((picked, now))
}

/// The receipts of `ids`' attempts, locked, grouped by attempt in ordinal order (a
/// claim holds every one of those attempts already).
pub(super) async fn lock_receipts_of<C: Session>(
    c: &C,
    ids: &[&AttemptId],
) -> Result<BTreeMap<AttemptId, Vec<Receipt>>, TxError> {
    let mut out: BTreeMap<AttemptId, Vec<Receipt>> = BTreeMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let marks = sql::placeholders(&POSTGRES, 1, ids.len());
    let values: Vec<Value<'_>> = ids.iter().map(|id| Value::Text(id.as_str())).collect();
    let sql = format!(
        "SELECT {} FROM receipt WHERE attempt_id IN ({marks}) ORDER BY attempt_id, ordinal FOR UPDATE",
        RECEIPT.column_list(None)
    );
    for r in query_all(c, &sql, &values, |r| decode::receipt(r, 0)).await? {
        out.entry(r.attempt_id.clone()).or_default().push(r);
    }
    Ok(out)
}

/// How many attempts are open (QUEUED or RUNNING): the shared count of their PENDING
/// and PROCESSING commands, from the `command_pending` and `command_leased` partial
/// indexes (migration 3 dropped `attempt_open`).
pub(super) async fn count_open_attempts<C: Session>(c: &C) -> Result<u64, TxError> {
    let n = query_one(c, &queries(&POSTGRES).open_attempts, &[], |row| {
        decode::scalar(row, 0, "open attempts")
    })
    .await?
    .unwrap_or(0);
    u64::try_from(n).map_err(|_| TxError::Ledger(LedgerError::Internal(format!("negative count {n}"))))
}

/// Runs the statements of a transition, checking each. They are sent at once, so the
/// session pipelines them (one round trip instead of one per statement) and the server
/// runs them in order. The answer is the first failure in statement order (a failed
/// guard, the command's statement, comes first); every caller rolls the whole
/// transaction back on a failure, so the statements that ran after it never commit.
async fn run<C: Session>(c: &C, statements: &[Statement<'_>]) -> Result<(), TxError> {
    let outcomes = futures_util::future::join_all(statements.iter().map(|s| async move {
        match s.expect {
            Expect::GuardHolds(attempt) => {
                let row = query_one(c, &s.sql, &s.values, |r| decode::guard_check(r)).await?;
                write::guard_answer(attempt, row).map_err(TxError::from)
            }
            expect => expect
                .check(execute(c, &s.sql, &s.values).await?)
                .map_err(TxError::from),
        }
    }))
    .await;
    outcomes.into_iter().collect()
}

/// Applies the engine's writes over `before`, the rows as locked in this transaction
/// (`None` for `Guard::Absent`, an insert): [`write::plan`]. A guard that no longer
/// holds answers [`leasehold_engine::Refusal::StaleToken`]; the caller then rolls the
/// whole transaction back, so every row stays as it was.
pub(super) async fn apply_writes<C: Session>(
    c: &C,
    before: Option<&AttemptRecord>,
    writes: &Writes,
) -> Result<(), TxError> {
    let statements = write::plan(&POSTGRES, before, writes)?;
    run(c, &statements).await
}
