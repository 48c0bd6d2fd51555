//! PostgreSQL's [`Session`]: values bound by the types the server inferred for each
//! placeholder (a NULL is a NULL of that type), rows read strictly through the shared
//! decoders ([`crate::ledger::sql::decode`]), a transition's statements and a record's
//! locking reads pipelined (sent at once, run by the server one after the other, in
//! order), and PostgreSQL's own pieces: the advisory lock on a plan's fingerprint and
//! the workers' `NOTIFY`.
//!
//! Every statement of the ledger's own sessions is prepared once per pooled session
//! (deadpool's statement cache); a caller's plain `tokio_postgres` transaction (the
//! outbox, [`super::outbox`]) has no cache and prepares each statement as it runs it
//! ([`PgClient`]).

use super::error::{classify, Phase, TxError};
use crate::ledger::sql::decode::{self, ColumnReader};
use crate::ledger::sql::query::queries;
use crate::ledger::sql::session::{Parse, Session};
use crate::ledger::sql::write::{self, Expect, Statement};
use crate::ledger::sql::{Dialect, Value, POSTGRES};
use crate::ledger::LedgerError;
use deadpool_postgres::GenericClient;
use leasehold_engine::{AttemptId, AttemptRecord, Timestamp};
use std::future::Future;
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Row, Statement as Prepared};

/// What a PostgreSQL session runs its statements on: a pooled session or one of its
/// transactions (preparing through deadpool's statement cache), or a caller's own
/// `tokio_postgres` transaction (which prepares plainly: it has no cache).
pub(crate) trait PgClient: Send + Sync {
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

impl<C: GenericClient + Send + Sync> PgClient for C {
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

/// A pooled session, bare (a one-statement read) or in a transaction.
pub(crate) enum PgConn<'c> {
    /// The pooled session itself.
    Single(&'c deadpool_postgres::Client),
    /// A transaction on it.
    Tx(deadpool_postgres::Transaction<'c>),
}

impl PgClient for PgConn<'_> {
    async fn prepare_statement(&self, sql: &str) -> Result<Prepared, tokio_postgres::Error> {
        match self {
            PgConn::Single(c) => c.prepare_statement(sql).await,
            PgConn::Tx(t) => t.prepare_statement(sql).await,
        }
    }

    async fn query_statement(
        &self,
        statement: &Prepared,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self {
            PgConn::Single(c) => c.query_statement(statement, params).await,
            PgConn::Tx(t) => t.query_statement(statement, params).await,
        }
    }

    async fn execute_statement(
        &self,
        statement: &Prepared,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        match self {
            PgConn::Single(c) => c.execute_statement(statement, params).await,
            PgConn::Tx(t) => t.execute_statement(statement, params).await,
        }
    }
}

/// A [`PgClient`] as the ledger's [`Session`].
pub(crate) struct PgSession<C>(pub(crate) C);

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

/// One parameter: `v` bound to a placeholder of type `ty`.
fn param<'a>(ty: &Type, v: &Value<'a>) -> Result<Param<'a>, TxError> {
    Ok(match (*ty == Type::INT8, *ty == Type::INT4, v) {
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
            return Err(
                LedgerError::Internal(format!("a parameter of type {ty} was given a value of another type")).into(),
            )
        }
    })
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
    types.iter().zip(values).map(|(ty, v)| param(ty, v)).collect()
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

/// Parses every row.
fn parse_all<T>(rows: &[Row], parse: impl Parse<T>) -> Result<Vec<T>, TxError> {
    rows.iter()
        .map(|r| parse(&mut PgRow(r)).map_err(TxError::from))
        .collect()
}

/// A prepared statement with its parameters bound, ready to run.
struct Bound<'a> {
    statement: Prepared,
    params: Vec<Param<'a>>,
}

impl Bound<'_> {
    fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params.iter().map(Param::as_sql).collect()
    }
}

/// Prepares every statement first (cached after a session's first use), so that
/// their executions, sent at once, go out in this order whatever was cached.
async fn prepare_all<'a, C: PgClient>(c: &C, statements: &[(&str, &[Value<'a>])]) -> Result<Vec<Bound<'a>>, TxError> {
    let prepared = futures_util::future::join_all(statements.iter().map(|(sql, _)| c.prepare_statement(sql))).await;
    prepared
        .into_iter()
        .zip(statements)
        .map(|(statement, (_, values))| {
            let statement = statement.map_err(statement_error)?;
            let params = params(statement.params(), values)?;
            Ok(Bound { statement, params })
        })
        .collect()
}

/// Runs one prepared statement of a transition and checks its outcome.
async fn run_bound<C: PgClient>(c: &C, bound: &Bound<'_>, expect: Expect<'_>) -> Result<(), TxError> {
    let refs = bound.refs();
    match expect {
        Expect::GuardHolds(attempt) => {
            let rows = c
                .query_statement(&bound.statement, &refs)
                .await
                .map_err(statement_error)?;
            let row = parse_all(&rows, |r| decode::guard_check(r))?.into_iter().next();
            write::guard_answer(attempt, row).map_err(TxError::from)
        }
        expect => {
            let rows = c
                .execute_statement(&bound.statement, &refs)
                .await
                .map_err(statement_error)?;
            expect.check(rows).map_err(TxError::from)
        }
    }
}

impl<C: PgClient> Session for PgSession<C> {
    fn dialect(&self) -> &'static Dialect {
        &POSTGRES
    }

    async fn query<T: Send>(
        &mut self,
        sql: &str,
        values: &[Value<'_>],
        parse: impl Parse<T>,
    ) -> Result<Vec<T>, TxError> {
        let c = &self.0;
        let statement = c.prepare_statement(sql).await.map_err(statement_error)?;
        let params = params(statement.params(), values)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(Param::as_sql).collect();
        let rows = c.query_statement(&statement, &refs).await.map_err(statement_error)?;
        parse_all(&rows, parse)
    }

    async fn execute(&mut self, sql: &str, values: &[Value<'_>]) -> Result<u64, TxError> {
        let c = &self.0;
        let statement = c.prepare_statement(sql).await.map_err(statement_error)?;
        let params = params(statement.params(), values)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(Param::as_sql).collect();
        c.execute_statement(&statement, &refs).await.map_err(statement_error)
    }

    /// Pipelined: every statement is prepared, then all are sent at once; the server
    /// runs them in order. The answer is the first failure in statement order (a
    /// failed guard, the command's statement, comes first).
    async fn run(&mut self, statements: &[Statement<'_>]) -> Result<(), TxError> {
        let c = &self.0;
        let texts: Vec<(&str, &[Value<'_>])> = statements.iter().map(|s| (&*s.sql, &s.values[..])).collect();
        let bound = prepare_all(c, &texts).await?;
        let runs = bound.iter().zip(statements).map(|(b, s)| run_bound(c, b, s.expect));
        futures_util::future::join_all(runs).await.into_iter().collect()
    }

    async fn lock_record(
        &mut self,
        id: &AttemptId,
        with_now: bool,
    ) -> Result<Option<(AttemptRecord, Option<Timestamp>)>, TxError> {
        lock_record(&self.0, id, with_now).await
    }

    async fn lock_fingerprint(&mut self, fingerprint: &str) -> Result<(), TxError> {
        let sql = "SELECT pg_advisory_xact_lock(hashtext($1))";
        self.query(sql, &[Value::Text(fingerprint)], |_| Ok(())).await.map(drop)
    }

    async fn announce(&mut self) -> Result<(), TxError> {
        super::notify::send(self).await
    }
}

/// An attempt, its command and its receipts, locked in that order, and — when
/// `with_now` — the database clock's now read once they are all held. The
/// statements are pipelined: sent at once, executed by the server one after the
/// other, in this order.
async fn lock_record<C: PgClient>(
    c: &C,
    id: &AttemptId,
    with_now: bool,
) -> Result<Option<(AttemptRecord, Option<Timestamp>)>, TxError> {
    let q = queries(&POSTGRES);
    let key = [Value::Text(id.as_str())];
    let command_sql = format!("{} FOR UPDATE", q.command_of_attempt);
    let now_sql = format!("SELECT {}", POSTGRES.now_ms);
    let mut texts: Vec<(&str, &[Value<'_>])> = vec![
        (&q.attempt_by_id_locked, &key),
        (&command_sql, &key),
        (&q.receipts_of_attempt_locked, &key),
    ];
    if with_now {
        texts.push((&now_sql, &[]));
    }
    let bound = prepare_all(c, &texts).await?;
    let refs: Vec<_> = bound.iter().map(Bound::refs).collect();
    let runs = bound.iter().zip(&refs).map(|(b, r)| c.query_statement(&b.statement, r));
    let results = futures_util::future::try_join_all(runs)
        .await
        .map_err(statement_error)?;
    record_of(id, &results)
}

/// The record (and the now, if read) from [`lock_record`]'s answers.
fn record_of(id: &AttemptId, results: &[Vec<Row>]) -> Result<Option<(AttemptRecord, Option<Timestamp>)>, TxError> {
    let Some(attempt) = parse_all(&results[0], |r| decode::attempt(r, 0))?.into_iter().next() else {
        return Ok(None);
    };
    let command = parse_all(&results[1], |r| decode::command(r, 0))?
        .into_iter()
        .next()
        .ok_or_else(|| decode::no_command(id))?;
    let receipts = parse_all(&results[2], |r| decode::receipt(r, 0))?;
    let now = match results.get(3) {
        Some(rows) => Some(
            parse_all(rows, |r| decode::scalar(r, 0, "the database's now"))?
                .into_iter()
                .next()
                .map(Timestamp::from_millis)
                .ok_or_else(|| LedgerError::Internal("the database answered no time".into()))?,
        ),
        None => None,
    };
    let record = AttemptRecord {
        attempt,
        command,
        receipts,
    };
    Ok(Some((record, now)))
}
