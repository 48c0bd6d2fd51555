//! The session layer: what a SQL backend's connection does inside a transaction
//! ([`Session`]), and every read and write of the ledger's rows written once on top
//! of it.
//!
//! A [`Session`] runs a statement's text with its [`Value`]s and hands each row to
//! the shared decoders ([`super::decode`]); it answers the rows a statement matched;
//! it runs a transition's statements ([`super::write::plan`]) checking each (a
//! backend may pipeline them); and it locks an attempt's rows in the lock order
//! (attempt, command, receipts), which each backend does with its own SQL. Nothing
//! else is the backend's: the functions below are the ledger's reads and writes, one
//! spelling for every dialect, the text coming from [`super::query::queries`].
//!
//! A session's futures are `Send` whenever what they answer is: an asynchronous
//! backend's sessions are polled by tokio; SQLite's run each statement before they
//! answer a ready future, and its transitions are polled once, with a no-op waker
//! ([`super::poll_now`]).

use super::decode::{self, ColumnReader};
use super::query::queries;
use super::table::{plan_json, plan_values, Table, ATTEMPT, COMMAND, PLAN, RECEIPT};
use super::write::{self, Expect, Statement};
use super::{placeholders, Dialect, TxError, Value};
use crate::ledger::listing::{all_read, placed, PlanRow};
use crate::ledger::LedgerError;
use leasehold_engine::{AttemptId, AttemptRecord, Plan, PlanId, PlanStatus, Receipt, Timestamp, Writes};
use std::collections::BTreeMap;
use std::future::Future;

/// A row parser: reads one row through a [`ColumnReader`].
pub(crate) trait Parse<T>: Fn(&mut dyn ColumnReader) -> Result<T, LedgerError> + Send + Sync {}

impl<T, F: Fn(&mut dyn ColumnReader) -> Result<T, LedgerError> + Send + Sync> Parse<T> for F {}

/// A connection inside a transaction (or, for a one-statement read, outside one).
pub(crate) trait Session {
    /// The dialect of the statements it runs.
    fn dialect(&self) -> &'static Dialect;

    /// Runs a query; answers every row as `parse` reads it.
    fn query<T: Send>(
        &mut self,
        sql: &str,
        values: &[Value<'_>],
        parse: impl Parse<T>,
    ) -> impl Future<Output = Result<Vec<T>, TxError>> + Send;

    /// Runs a statement; answers the rows it matched (not only those it changed).
    fn execute(&mut self, sql: &str, values: &[Value<'_>]) -> impl Future<Output = Result<u64, TxError>> + Send;

    /// Runs a transition's statements, in order, checking each ([`check`]; a backend
    /// may send them at once). The answer is the first failure in
    /// statement order; the caller then rolls the whole transaction back.
    fn run(&mut self, statements: &[Statement<'_>]) -> impl Future<Output = Result<(), TxError>> + Send;

    /// Locks an attempt, its command and its receipts, in that order, and — when
    /// `with_now` — reads the database clock's now once they are held (so that a
    /// lock wait does not age it). `None`: no such attempt.
    fn lock_record(
        &mut self,
        id: &AttemptId,
        with_now: bool,
    ) -> impl Future<Output = Result<Option<(AttemptRecord, Option<Timestamp>)>, TxError>> + Send;

    /// Serializes the registrations of one content where the lookup of a READY plan
    /// by its fingerprint does not (PostgreSQL: an advisory lock); by default nothing.
    fn lock_fingerprint(&mut self, fingerprint: &str) -> impl Future<Output = Result<(), TxError>> + Send {
        let _ = fingerprint;
        async { Ok(()) }
    }

    /// Announces that work became claimable (PostgreSQL's `NOTIFY`, delivered when
    /// the transaction commits); by default nothing.
    fn announce(&mut self) -> impl Future<Output = Result<(), TxError>> + Send {
        async { Ok(()) }
    }
}

/// The error of a lookup that found nothing.
pub(crate) fn not_found(kind: &'static str, id: impl ToString) -> LedgerError {
    LedgerError::NotFound {
        kind,
        id: id.to_string(),
    }
}

/// Runs a query and answers its first row, if any.
pub(crate) async fn query_one<S: Session, T: Send>(
    s: &mut S,
    sql: &str,
    values: &[Value<'_>],
    parse: impl Parse<T>,
) -> Result<Option<T>, TxError> {
    Ok(s.query(sql, values, parse).await?.into_iter().next())
}

/// Runs one statement of a transition and checks its outcome.
pub(crate) async fn check<S: Session>(s: &mut S, statement: &Statement<'_>) -> Result<(), TxError> {
    match statement.expect {
        Expect::GuardHolds(attempt) => {
            let row = query_one(s, &statement.sql, &statement.values, |r| decode::guard_check(r)).await?;
            write::guard_answer(attempt, row).map_err(TxError::from)
        }
        expect => {
            let rows = s.execute(&statement.sql, &statement.values).await?;
            expect.check(rows).map_err(TxError::from)
        }
    }
}

/// The database clock's now.
pub(crate) async fn db_now<S: Session>(s: &mut S) -> Result<Timestamp, TxError> {
    let sql = format!("SELECT {}", s.dialect().now_ms);
    query_one(s, &sql, &[], |r| decode::scalar(r, 0, "the database's now"))
        .await?
        .map(Timestamp::from_millis)
        .ok_or_else(|| LedgerError::Internal("the database answered no time".into()).into())
}

/// A plan by id; `lock` takes it `FOR UPDATE` where rows lock (an enqueue
/// serializes on its plan).
pub(crate) async fn read_plan<S: Session>(s: &mut S, id: &PlanId, lock: bool) -> Result<Option<Plan>, TxError> {
    let q = queries(s.dialect());
    let sql = if lock { &q.plan_by_id_locked } else { &q.plan_by_id };
    query_one(s, sql, &[Value::Text(id.as_str())], |r| decode::plan(r, 0)).await
}

/// A plan by id that must exist.
pub(crate) async fn plan_by_id<S: Session>(s: &mut S, id: &PlanId, lock: bool) -> Result<Plan, TxError> {
    read_plan(s, id, lock)
        .await?
        .ok_or_else(|| not_found("plan", id).into())
}

/// Plans by id, in one query (a claim reads the plans of its candidates).
pub(crate) async fn read_plans_by_id<S: Session>(
    s: &mut S,
    ids: &[&PlanId],
) -> Result<BTreeMap<PlanId, Plan>, TxError> {
    if ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let marks = placeholders(s.dialect(), 1, ids.len());
    let values: Vec<Value<'_>> = ids.iter().map(|id| Value::Text(id.as_str())).collect();
    let sql = format!("SELECT {} FROM plan WHERE id IN ({marks})", PLAN.column_list(None));
    let plans = s.query(&sql, &values, |r| decode::plan(r, 0)).await?;
    Ok(plans.into_iter().map(|p| (p.id.clone(), p)).collect())
}

/// The oldest READY plan with this fingerprint, locked where rows lock. One
/// registered before its step targets were stored (`targets_json`) gets them now.
pub(crate) async fn ready_plan_by_fingerprint<S: Session>(
    s: &mut S,
    fingerprint: &str,
) -> Result<Option<Plan>, TxError> {
    let sql = &queries(s.dialect()).ready_plan_by_fingerprint_locked;
    let Some(existing) = query_one(s, sql, &[Value::Text(fingerprint)], |r| decode::plan(r, 0)).await? else {
        return Ok(None);
    };
    // A plan registered before its targets were stored gets them now.
    let json = plan_json(&existing)?;
    let fill = [Value::Text(&json.targets), Value::Text(existing.id.as_str())];
    s.execute(&queries(s.dialect()).fill_plan_targets, &fill).await?;
    Ok(Some(existing))
}

/// Every plan, in registration order.
pub(crate) async fn read_plans<S: Session>(s: &mut S) -> Result<Vec<Plan>, TxError> {
    Ok(all_read(read_plan_rows(s).await?)?)
}

/// Every plan, in registration order, each row read on its own: a listing's
/// ([`PlanRow`]).
pub(crate) async fn read_plan_rows<S: Session>(s: &mut S) -> Result<Vec<PlanRow>, TxError> {
    let sql = &queries(s.dialect()).plans;
    Ok(placed(s.query(sql, &[], |r| decode::listed_plan(r)).await?))
}

/// The plans named `name`, oldest first.
pub(crate) async fn read_plans_named<S: Session>(s: &mut S, name: &str) -> Result<Vec<Plan>, TxError> {
    let sql = &queries(s.dialect()).plans_named;
    s.query(sql, &[Value::Text(name)], |r| decode::plan(r, 0)).await
}

/// Up to `limit` plans, newest first, registered before `before` (from the newest
/// when `None`); an unknown `before` is not found.
pub(crate) async fn read_plans_newest_first<S: Session>(
    s: &mut S,
    before: Option<&PlanId>,
    limit: u32,
) -> Result<Vec<Plan>, TxError> {
    Ok(all_read(read_plan_rows_newest_first(s, before, limit).await?)?)
}

/// [`read_plans_newest_first`], each row read on its own: a listing's ([`PlanRow`]).
pub(crate) async fn read_plan_rows_newest_first<S: Session>(
    s: &mut S,
    before: Option<&PlanId>,
    limit: u32,
) -> Result<Vec<PlanRow>, TxError> {
    let (sql, values) = super::query::plans_page(s.dialect(), before, limit);
    let page = s.query(sql, &values, |r| decode::listed_plan(r)).await?;
    // An empty page after `before`: the oldest plan, or no such plan.
    if let (true, Some(id)) = (page.is_empty(), before) {
        plan_by_id(s, id, false).await?;
    }
    Ok(placed(page))
}

/// Inserts a newly registered plan.
pub(crate) async fn insert_plan<S: Session>(s: &mut S, plan: &Plan) -> Result<(), TxError> {
    let json = plan_json(plan)?;
    let values = plan_values(plan, &json);
    let sql = &queries(s.dialect()).insert_plan;
    s.execute(sql, &values).await?;
    Ok(())
}

/// Sets a plan's status; answers whether the plan exists.
pub(crate) async fn set_plan_status<S: Session>(s: &mut S, id: &PlanId, status: PlanStatus) -> Result<bool, TxError> {
    let values = [Value::Text(status.as_str()), Value::Text(id.as_str())];
    let sql = &queries(s.dialect()).set_plan_status;
    Ok(s.execute(sql, &values).await? > 0)
}

/// An attempt's receipts by ordinal; `lock` takes them `FOR UPDATE` where rows lock.
pub(crate) async fn read_receipts<S: Session>(s: &mut S, id: &AttemptId, lock: bool) -> Result<Vec<Receipt>, TxError> {
    let q = queries(s.dialect());
    let sql = if lock {
        &q.receipts_of_attempt_locked
    } else {
        &q.receipts_of_attempt
    };
    s.query(sql, &[Value::Text(id.as_str())], |r| decode::receipt(r, 0))
        .await
}

/// An attempt with its command and receipts (non-locking; the caller's transaction
/// makes it one snapshot).
pub(crate) async fn read_record<S: Session>(s: &mut S, id: &AttemptId) -> Result<Option<AttemptRecord>, TxError> {
    let q = queries(s.dialect());
    let key = [Value::Text(id.as_str())];
    let Some(attempt) = query_one(s, &q.attempt_by_id, &key, |r| decode::attempt(r, 0)).await? else {
        return Ok(None);
    };
    let command = query_one(s, &q.command_of_attempt, &key, |r| decode::command(r, 0))
        .await?
        .ok_or_else(|| decode::no_command(id))?;
    let receipts = read_receipts(s, id, false).await?;
    Ok(Some(AttemptRecord {
        attempt,
        command,
        receipts,
    }))
}

/// The attempt an enqueue key names, with its command and receipts (non-locking).
pub(crate) async fn read_keyed<S: Session>(s: &mut S, key: &str) -> Result<Option<AttemptRecord>, TxError> {
    let q = queries(s.dialect());
    let id = query_one(s, &q.attempt_by_enqueue_key, &[Value::Text(key)], |r| {
        decode::string(r, 0, "attempt row: column id")
    })
    .await?;
    match id {
        Some(id) => read_record(s, &AttemptId::new(id)).await,
        None => Ok(None),
    }
}

/// Every attempt of a plan with its command and receipts, by number (non-locking).
pub(crate) async fn read_history<S: Session>(s: &mut S, plan: &PlanId) -> Result<Vec<AttemptRecord>, TxError> {
    let q = queries(s.dialect());
    let key = [Value::Text(plan.as_str())];
    let attempts = s.query(&q.history_attempts, &key, |r| decode::attempt(r, 0)).await?;
    if attempts.is_empty() {
        return Ok(Vec::new());
    }
    let commands = s.query(&q.history_commands, &key, |r| decode::command(r, 0)).await?;
    let receipts = s.query(&q.history_receipts, &key, |r| decode::receipt(r, 0)).await?;
    Ok(decode::history(attempts, commands, receipts)?)
}

/// The receipts of `ids`' attempts, locked where rows lock, grouped by attempt in
/// ordinal order (a claim holds every one of those attempts already).
pub(crate) async fn lock_receipts_of<S: Session>(
    s: &mut S,
    ids: &[&AttemptId],
) -> Result<BTreeMap<AttemptId, Vec<Receipt>>, TxError> {
    let mut out: BTreeMap<AttemptId, Vec<Receipt>> = BTreeMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let sql = locking_read(s.dialect(), &RECEIPT, "attempt_id", "attempt_id, ordinal", ids.len());
    for r in s.query(&sql, &id_values(ids), |r| decode::receipt(r, 0)).await? {
        out.entry(r.attempt_id.clone()).or_default().push(r);
    }
    Ok(out)
}

/// `SELECT` of `table`'s rows whose `key` is one of `n` values, ordered by `order`,
/// locked where rows lock.
fn locking_read(d: &Dialect, table: &Table, key: &str, order: &str, n: usize) -> String {
    format!(
        "SELECT {} FROM {} WHERE {key} IN ({}) ORDER BY {order}{}",
        table.column_list(None),
        table.name,
        placeholders(d, 1, n),
        d.for_update()
    )
}

/// Attempt ids as the values of [`locking_read`]'s placeholders.
fn id_values<'a>(ids: &[&'a AttemptId]) -> Vec<Value<'a>> {
    ids.iter().map(|id| Value::Text(id.as_str())).collect()
}

/// The records of `ids`' attempts (distinct ids, in id order), locked in lock
/// order where rows lock: every attempt, then every command, then every receipt,
/// each in attempt order, three statements for all of them. An id without an
/// attempt is not in the answer; an attempt without a command is
/// [`LedgerError::Integrity`].
pub(crate) async fn lock_records<S: Session>(
    s: &mut S,
    ids: &[&AttemptId],
) -> Result<BTreeMap<AttemptId, AttemptRecord>, TxError> {
    if ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let d = s.dialect();
    let values = id_values(ids);
    let attempts = locking_read(d, &ATTEMPT, "id", "id", ids.len());
    let commands = locking_read(d, &COMMAND, "attempt_id", "attempt_id", ids.len());
    let attempts = s.query(&attempts, &values, |r| decode::attempt(r, 0)).await?;
    let mut commands: BTreeMap<AttemptId, _> = s
        .query(&commands, &values, |r| decode::command(r, 0))
        .await?
        .into_iter()
        .map(|c| (c.attempt_id.clone(), c))
        .collect();
    let mut receipts = lock_receipts_of(s, ids).await?;
    let mut records = BTreeMap::new();
    for attempt in attempts {
        let command = commands
            .remove(&attempt.id)
            .ok_or_else(|| decode::no_command(&attempt.id))?;
        let receipts = receipts.remove(&attempt.id).unwrap_or_default();
        records.insert(
            attempt.id.clone(),
            AttemptRecord {
                attempt,
                command,
                receipts,
            },
        );
    }
    Ok(records)
}

/// How many attempts are open (QUEUED or RUNNING): the count of their PENDING and
/// PROCESSING commands.
pub(crate) async fn count_open_attempts<S: Session>(s: &mut S) -> Result<u64, TxError> {
    let sql = &queries(s.dialect()).open_attempts;
    let n = query_one(s, sql, &[], |row| decode::scalar(row, 0, "open attempts"))
        .await?
        .unwrap_or(0);
    u64::try_from(n).map_err(|_| LedgerError::Internal(format!("negative count {n}")).into())
}

/// Applies the engine's writes over `before`, the rows as locked in this transaction
/// (`None` for `Guard::Absent`, an insert): [`write::plan`]. A guard that no longer
/// holds answers [`leasehold_engine::Refusal::StaleToken`]; the caller then rolls the
/// whole transaction back, so every row stays as it was. Writes that end the head
/// of an order key decide the attempts behind it too ([`super::order::follow_order`]).
pub(crate) async fn apply_writes<S: Session>(
    s: &mut S,
    before: Option<&AttemptRecord>,
    writes: &Writes,
) -> Result<(), TxError> {
    let statements = write::plan(s.dialect(), before, writes)?;
    s.run(&statements).await?;
    if let Some(before) = before {
        super::order::follow_order(s, before, writes).await?;
    }
    Ok(())
}
