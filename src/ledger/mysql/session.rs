//! MySQL's [`Session`]: values bound positionally, rows read strictly through the
//! shared decoders ([`crate::ledger::sql::decode`]), a transition's statements run one
//! after the other (a duplicate command is the guard failing: MySQL has no conflict
//! clause the shared writes could use), and a record locked by one statement.
//!
//! Locking reads (`FOR UPDATE`) take the rows in the lock order: attempt, then
//! command, then receipts by ordinal. The command row's guarded `UPDATE` counts
//! matched rows, not changed ones (connections set `CLIENT_FOUND_ROWS`), so zero
//! affected rows is a refusal. Lease tokens are bound as parameters only.

use super::error::{DbResult, TxError};
use crate::ledger::sql::decode::{self, ColumnReader};
use crate::ledger::sql::query::queries;
use crate::ledger::sql::session::{self, Parse, Session};
use crate::ledger::sql::table::{ATTEMPT, COMMAND, RECEIPT};
use crate::ledger::sql::write::{self, Expect, Statement};
use crate::ledger::sql::{Dialect, Value, MYSQL};
use leasehold_engine::{AttemptId, AttemptRecord, Receipt, Timestamp};
use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{Conn, Params, Row, Transaction};
use std::future::Future;

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

/// What a MySQL session runs its statements on: a pooled connection, one of its
/// transactions, or a caller's own transaction (the outbox).
pub(crate) trait MyClient: Send {
    /// Runs a statement; answers its rows.
    fn rows(&mut self, sql: &str, params: Params) -> impl Future<Output = Result<Vec<Row>, TxError>> + Send;

    /// Runs a statement; answers the rows it matched.
    fn count(&mut self, sql: &str, params: Params) -> impl Future<Output = Result<u64, TxError>> + Send;

    /// Runs a statement, answering the driver's own error (for a caller that looks at
    /// the server's error code).
    fn exec_raw(&mut self, sql: &str, params: Params) -> impl Future<Output = Result<(), mysql_async::Error>> + Send;

    /// The server's id of this connection (`KILL CONNECTION` takes it; tests).
    #[cfg_attr(not(test), allow(dead_code))]
    fn connection_id(&self) -> u32;
}

/// [`MyClient`] for anything the driver can query.
macro_rules! my_client {
    ($($ty:ty),*) => {$(
        impl MyClient for $ty {
            async fn rows(&mut self, sql: &str, params: Params) -> Result<Vec<Row>, TxError> {
                self.exec(sql, params).await.db()
            }

            async fn count(&mut self, sql: &str, params: Params) -> Result<u64, TxError> {
                self.exec_drop(sql, params).await.db()?;
                Ok(self.affected_rows())
            }

            async fn exec_raw(&mut self, sql: &str, params: Params) -> Result<(), mysql_async::Error> {
                self.exec_drop(sql, params).await
            }

            fn connection_id(&self) -> u32 {
                self.id()
            }
        }
    )*};
}

my_client!(Conn, Transaction<'_>);

impl<C: MyClient> MyClient for &mut C {
    fn rows(&mut self, sql: &str, params: Params) -> impl Future<Output = Result<Vec<Row>, TxError>> + Send {
        (**self).rows(sql, params)
    }

    fn count(&mut self, sql: &str, params: Params) -> impl Future<Output = Result<u64, TxError>> + Send {
        (**self).count(sql, params)
    }

    fn exec_raw(&mut self, sql: &str, params: Params) -> impl Future<Output = Result<(), mysql_async::Error>> + Send {
        (**self).exec_raw(sql, params)
    }

    fn connection_id(&self) -> u32 {
        (**self).connection_id()
    }
}

/// A pooled connection, bare (a one-statement read) or in a transaction.
pub(crate) enum MyConn<'c> {
    /// The pooled connection itself.
    Single(&'c mut Conn),
    /// A transaction on it.
    Tx(Transaction<'c>),
}

impl MyClient for MyConn<'_> {
    async fn rows(&mut self, sql: &str, params: Params) -> Result<Vec<Row>, TxError> {
        match self {
            MyConn::Single(c) => c.rows(sql, params).await,
            MyConn::Tx(t) => t.rows(sql, params).await,
        }
    }

    async fn count(&mut self, sql: &str, params: Params) -> Result<u64, TxError> {
        match self {
            MyConn::Single(c) => c.count(sql, params).await,
            MyConn::Tx(t) => t.count(sql, params).await,
        }
    }

    async fn exec_raw(&mut self, sql: &str, params: Params) -> Result<(), mysql_async::Error> {
        match self {
            MyConn::Single(c) => c.exec_raw(sql, params).await,
            MyConn::Tx(t) => t.exec_raw(sql, params).await,
        }
    }

    fn connection_id(&self) -> u32 {
        match self {
            MyConn::Single(c) => c.connection_id(),
            MyConn::Tx(t) => t.connection_id(),
        }
    }
}

/// A [`MyClient`] as the ledger's [`Session`].
pub(crate) struct MySession<C>(pub(crate) C);

impl<C: MyClient> Session for MySession<C> {
    fn dialect(&self) -> &'static Dialect {
        &MYSQL
    }

    async fn query<T: Send>(
        &mut self,
        sql: &str,
        values: &[Value<'_>],
        parse: impl Parse<T>,
    ) -> Result<Vec<T>, TxError> {
        let rows = self.0.rows(sql, params(values)).await?;
        rows.into_iter()
            .map(|r| parse(&mut MysqlRow(r)).map_err(TxError::from))
            .collect()
    }

    async fn execute(&mut self, sql: &str, values: &[Value<'_>]) -> Result<u64, TxError> {
        self.0.count(sql, params(values)).await
    }

    /// One statement after the other; an existing command met by an insert is the
    /// guard failing.
    async fn run(&mut self, statements: &[Statement<'_>]) -> Result<(), TxError> {
        for s in statements {
            match s.expect {
                Expect::InsertedUnlessPresent(id) => match self.0.exec_raw(&s.sql, params(&s.values)).await {
                    Ok(()) => {}
                    Err(mysql_async::Error::Server(e)) if e.code == ER_DUP_ENTRY => return Err(write::stale(id).into()),
                    Err(e) => return Err(e).db(),
                },
                _ => session::check(self, s).await?,
            }
        }
        Ok(())
    }

    /// One statement; the database's now is always read (it costs nothing there).
    async fn lock_record(
        &mut self,
        id: &AttemptId,
        _with_now: bool,
    ) -> Result<Option<(AttemptRecord, Option<Timestamp>)>, TxError> {
        Ok(lock_record(self, id).await?.map(|(record, now)| (record, Some(now))))
    }
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
async fn lock_record<C: MyClient>(
    s: &mut MySession<C>,
    id: &AttemptId,
) -> Result<Option<(AttemptRecord, Timestamp)>, TxError> {
    let (attempt_columns, command_columns) = (ATTEMPT.columns.len(), COMMAND.columns.len());
    let receipt_base = attempt_columns + command_columns;
    let now_at = receipt_base + RECEIPT.columns.len();
    let key = [Value::Text(id.as_str())];
    // Every row repeats the attempt and the command; each is parsed (strictly), the
    // first kept.
    let rows = s
        .query(&LOCK_RECORD_SQL, &key, move |row| {
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
        let sql = &queries(&MYSQL).attempt_by_id;
        return match session::query_one(s, sql, &key, |r| decode::attempt(r, 0)).await? {
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
    let record = AttemptRecord {
        attempt,
        command,
        receipts,
    };
    Ok(Some((record, Timestamp::from_millis(latest))))
}
