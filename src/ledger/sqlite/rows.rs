//! SQLite's execution of the shared SQL layer ([`crate::ledger::sql`]): a
//! synchronous [`Session`] ([`SqliteSession`], each of its futures ready when
//! returned, polled once by [`sync`]), and SQLite's own SQL text: the one-statement
//! read of an attempt's rows and the claim's candidate queries over the partial
//! indexes.
//!
//! Reads parse every column strictly ([`crate::ledger::sql::decode`]). Writes run the statements of
//! [`crate::ledger::sql::write::plan`]; the command row's `UPDATE` carries the guard as its `WHERE`
//! clause and zero affected rows is a refusal. Lease tokens are bound as parameters
//! only, so no SQL text or error message ever contains one.

use super::super::migrate::{CompatRow, Migration, MigrationTarget};
use super::super::LedgerError;
use crate::ledger::sql::decode::{self, ColumnReader};
use crate::ledger::sql::ready;
use crate::ledger::sql::session::{self, Parse, Session};
use crate::ledger::sql::table::{ATTEMPT, COMMAND, PLAN, RECEIPT};
use crate::ledger::sql::write::{self, Statement};
use crate::ledger::sql::{poll_now, Dialect, Sql, TxError, Value, SQLITE, SQLITE_WITHOUT_ROOM};
use leasehold_engine::{AttemptId, AttemptRecord, Capabilities, Guard, Plan, Timestamp, Writes};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params_from_iter, Connection, ErrorCode, Row};
use std::cell::RefCell;
use std::future::{ready as done, Future};
use std::rc::Rc;
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

/// A rusqlite row as the shared decoders read it.
struct SqliteRow<'a, 'b>(&'a Row<'b>);

impl SqliteRow<'_, '_> {
    fn value(&self, idx: usize) -> Result<ValueRef<'_>, String> {
        self.0.get_ref(idx).map_err(|e| e.to_string())
    }
}

impl ColumnReader for SqliteRow<'_, '_> {
    fn int(&mut self, idx: usize) -> Result<Option<i64>, String> {
        match self.value(idx)? {
            ValueRef::Null => Ok(None),
            ValueRef::Integer(i) => Ok(Some(i)),
            other => Err(format!("is {}, not an integer", other.data_type())),
        }
    }

    fn text(&mut self, idx: usize) -> Result<Option<String>, String> {
        match self.value(idx)? {
            ValueRef::Null => Ok(None),
            ValueRef::Text(t) => std::str::from_utf8(t)
                .map(|t| Some(t.to_owned()))
                .map_err(|_| "is not UTF-8".to_owned()),
            other => Err(format!("is {}, not text", other.data_type())),
        }
    }

    fn is_null(&mut self, idx: usize) -> Result<bool, String> {
        Ok(matches!(self.value(idx)?, ValueRef::Null))
    }
}

/// A value bound without a copy.
pub(in crate::ledger) fn bind<'a>(v: &Value<'a>) -> ToSqlOutput<'a> {
    ToSqlOutput::Borrowed(match *v {
        Value::Null => ValueRef::Null,
        Value::Int(i) => ValueRef::Integer(i),
        Value::Text(t) => ValueRef::Text(t.as_bytes()),
    })
}

/// Runs a query and parses every row.
fn query_all<T>(
    conn: &Connection,
    sql: &str,
    values: &[Value<'_>],
    parse: impl Fn(&mut SqliteRow<'_, '_>) -> Result<T, LedgerError>,
) -> Result<Vec<T>, LedgerError> {
    let mut stmt = conn.prepare_cached(sql).sql()?;
    let mut rows = stmt.query(params_from_iter(values.iter().map(bind))).sql()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().sql()? {
        out.push(parse(&mut SqliteRow(row))?);
    }
    Ok(out)
}

fn execute(conn: &Connection, sql: &str, values: &[Value<'_>]) -> Result<usize, LedgerError> {
    conn.prepare_cached(sql)
        .sql()?
        .execute(params_from_iter(values.iter().map(bind)))
        .sql()
}

/// A connection (inside a transaction of the caller's) as the ledger's [`Session`]:
/// every statement runs before its future is returned.
pub(super) struct SqliteSession<'c> {
    pub(super) conn: &'c Connection,
    /// The dialect its writes are spelled in ([`write_dialect`]).
    pub(super) dialect: &'static Dialect,
}

impl<'c> SqliteSession<'c> {
    /// `conn` writing in `dialect`.
    pub(super) fn new(conn: &'c Connection, dialect: &'static Dialect) -> Self {
        Self { conn, dialect }
    }
}

/// The answer of a [`SqliteSession`]'s future, which never waits.
pub(super) fn sync<T>(future: impl Future<Output = Result<T, TxError>>) -> Result<T, LedgerError> {
    match poll_now(future) {
        Some(answer) => answer.map_err(LedgerError::from),
        None => Err(LedgerError::Internal("a SQLite statement waited".into())),
    }
}

impl Session for SqliteSession<'_> {
    fn dialect(&self) -> &'static Dialect {
        self.dialect
    }

    fn query<T: Send>(
        &mut self,
        sql: &str,
        values: &[Value<'_>],
        parse: impl Parse<T>,
    ) -> impl Future<Output = Result<Vec<T>, TxError>> + Send {
        done(query_all(self.conn, sql, values, |r| parse(r)).map_err(TxError::from))
    }

    fn execute(&mut self, sql: &str, values: &[Value<'_>]) -> impl Future<Output = Result<u64, TxError>> + Send {
        done(execute(self.conn, sql, values).map(|n| n as u64).map_err(TxError::from))
    }

    fn run(&mut self, statements: &[Statement<'_>]) -> impl Future<Output = Result<(), TxError>> + Send {
        done(run(self.conn, statements).map_err(TxError::from))
    }

    /// SQLite's write lock is the whole database, taken by `BEGIN IMMEDIATE` before
    /// the first read: a plain read is a locked one.
    fn lock_record(
        &mut self,
        id: &AttemptId,
        _with_now: bool,
    ) -> impl Future<Output = Result<Option<(AttemptRecord, Option<Timestamp>)>, TxError>> + Send {
        done(
            read_record(self.conn, id)
                .map(|r| r.map(|r| (r, None)))
                .map_err(TxError::from),
        )
    }
}

/// Where the command's columns start in an attempt-and-command row.
const COMMAND_BASE: usize = ATTEMPT.columns.len();

/// The attempt's and then the command's columns, aliased `a` and `c`.
fn attempt_and_command() -> String {
    format!("{}, {}", ATTEMPT.column_list(Some("a")), COMMAND.column_list(Some("c")))
}

/// An attempt and its command from one attempt-and-command row (the command's
/// columns NULL when the attempt has none: an integrity error).
fn head(row: &mut SqliteRow<'_, '_>) -> Result<AttemptRecord, LedgerError> {
    let attempt = decode::attempt(row, 0)?;
    let command = decode::command_if_any(row, COMMAND_BASE)?.ok_or_else(|| decode::no_command(&attempt.id))?;
    Ok(AttemptRecord {
        attempt,
        command,
        receipts: Vec::new(),
    })
}

/// An attempt with its command and receipts, in one statement (one row per
/// receipt). (In a write transaction SQLite's lock is the whole database, taken
/// before the first read, so the order in which rows are read cannot deadlock.)
pub(super) fn read_record(conn: &Connection, id: &AttemptId) -> Result<Option<AttemptRecord>, LedgerError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {}, {} FROM attempt a LEFT JOIN command c ON c.attempt_id = a.id \
             LEFT JOIN receipt r ON r.attempt_id = a.id WHERE a.id = ?1",
            attempt_and_command(),
            RECEIPT.column_list(Some("r"))
        )
    });
    const RECEIPT_BASE: usize = COMMAND_BASE + COMMAND.columns.len();
    let mut stmt = conn.prepare_cached(&SQL).sql()?;
    let mut rows = stmt.query([id.as_str()]).sql()?;
    let mut record: Option<AttemptRecord> = None;
    while let Some(row) = rows.next().sql()? {
        let row = &mut SqliteRow(row);
        let record = match &mut record {
            Some(r) => r,
            None => record.insert(head(row)?),
        };
        record.receipts.extend(decode::receipt_if_any(row, RECEIPT_BASE)?);
    }
    if let Some(record) = &mut record {
        record.receipts.sort_by_key(|r| r.ordinal);
    }
    Ok(record)
}

/// The claim statement over the commands matching `range` (one arm of the shared
/// claim rule, the range of one partial index): see [`CLAIM_PENDING_SQL`].
fn claim_sql(range: &str) -> String {
    claim_sql_routed(range, "")
}

/// [`claim_sql`] with a routing condition after the range (` AND …`, placeholders
/// from `?3`).
fn claim_sql_routed(range: &str, route: &str) -> String {
    format!(
        "SELECT {}, {}, {} FROM (SELECT rowid AS rid FROM command WHERE {range}?1{route}{} ORDER BY {} LIMIT ?2) k \
         CROSS JOIN command c ON c.rowid = k.rid CROSS JOIN attempt a ON a.id = c.attempt_id \
         CROSS JOIN plan p ON p.id = a.plan_id LEFT JOIN receipt r ON r.attempt_id = a.id",
        attempt_and_command(),
        PLAN.column_list(Some("p")),
        RECEIPT.column_list(Some("r")),
        crate::ledger::sql::limits::unblocked("", "?1"),
        write::CLAIM_ORDER,
    )
}

/// A claim's candidates of one kind, with everything a claim reads: the limited
/// range of one partial index (`command_pending` for PENDING commands by
/// availability, `command_leased` for PROCESSING ones whose lease has expired), each
/// command beside its attempt and its plan, once per receipt (or once with
/// NULL receipt columns for an attempt without any). Rows come in no particular
/// order: [`claim_candidates`] sorts them.
pub(super) static CLAIM_PENDING_SQL: LazyLock<String> = LazyLock::new(|| claim_sql(&write::claimable_pending("")));
/// [`CLAIM_PENDING_SQL`] for PROCESSING commands whose lease has expired.
pub(super) static CLAIM_EXPIRED_SQL: LazyLock<String> = LazyLock::new(|| claim_sql(&write::claimable_expired("")));
/// Whether any lease has expired at `?1`: one probe of `command_leased`, asked before
/// [`CLAIM_EXPIRED_SQL`], which sorts its range by availability (a temporary B-tree
/// built on every run, even for an empty range, about a twentieth of a claim).
pub(super) static ANY_EXPIRED_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT EXISTS (SELECT 1 FROM command WHERE {}?1)",
        write::claimable_expired("")
    )
});
thread_local! {
    /// The routed claim statements of the last routing condition this thread (the
    /// writer's) claimed with: a worker's claims all carry the same capabilities, so
    /// the statements' text is built once, not on every claim.
    static ROUTED_CLAIM_SQL: RefCell<Option<(String, Rc<[String; 2]>)>> = const { RefCell::new(None) };
}

/// The claim statements (PENDING, then expired) with the routing condition `route`.
fn routed_claim_sql(route: &str) -> Rc<[String; 2]> {
    ROUTED_CLAIM_SQL.with_borrow_mut(|cached| match cached {
        Some((text, sqls)) if text == route => Rc::clone(sqls),
        _ => {
            let sqls = Rc::new([
                claim_sql_routed(&write::claimable_pending(""), route),
                claim_sql_routed(&write::claimable_expired(""), route),
            ]);
            *cached = Some((route.to_owned(), Rc::clone(&sqls)));
            sqls
        }
    })
}

/// Adds one claim row (a command beside one of its receipts) to `found`.
fn push_candidate_row(found: &mut Vec<Candidate>, row: &mut SqliteRow<'_, '_>) -> Result<(), LedgerError> {
    let command = decode::command(row, COMMAND_BASE)?;
    // A command's rows (one per receipt) come one after another; should they
    // not, the merge after the sort joins its entries.
    match found.last_mut() {
        Some((record, _)) if record.command.id == command.id => {}
        _ => {
            let record = AttemptRecord {
                attempt: decode::attempt(row, 0)?,
                command,
                receipts: Vec::new(),
            };
            found.push((record, decode::plan(row, CLAIM_PLAN_BASE)?));
        }
    }
    if let (Some((record, _)), Some(receipt)) = (found.last_mut(), decode::receipt_if_any(row, CLAIM_RECEIPT_BASE)?) {
        record.receipts.push(receipt);
    }
    Ok(())
}

/// Where the plan's and then the receipt's columns start in a claim row.
const CLAIM_PLAN_BASE: usize = COMMAND_BASE + COMMAND.columns.len();
const CLAIM_RECEIPT_BASE: usize = CLAIM_PLAN_BASE + PLAN.columns.len();

/// A claim candidate: its attempt's record as read, and its plan.
pub(super) type Candidate = (AttemptRecord, Plan);

/// The commands a claim at `now` may take, oldest `available_at` first (then by
/// command id), at most `batch`, each with its attempt, receipts (by ordinal) and
/// plan: one statement per partial index, each an index range scan limited to
/// `batch` (written as one `OR`, SQLite unions both whole ranges and sorts every
/// claimable command on each claim); the expired range only when
/// [`ANY_EXPIRED_SQL`] finds it is not empty.
pub(super) fn claim_candidates(
    conn: &Connection,
    now: Timestamp,
    batch: u32,
    caps: Option<&Capabilities>,
) -> Result<Vec<Candidate>, LedgerError> {
    // One allocation for the batch, sorted in place ([`in_claim_order`]): a map of
    // these records (a few hundred bytes each) allocates a node of kilobytes per
    // eleven of them, and with glibc's allocator every allocation that large first
    // consolidates its caches of small blocks (docs/performance-log.md, "The floor of a
    // batched claim").
    let mut found: Vec<Candidate> = Vec::with_capacity(batch as usize);
    let expired: bool = conn
        .prepare_cached(&ANY_EXPIRED_SQL)
        .sql()?
        .query_row([now.as_millis()], |row| row.get(0))
        .sql()?;
    let mut route = Sql::new(&SQLITE);
    route.values = vec![Value::ts(now), Value::Int(batch.into())];
    if let Some(caps) = caps {
        write::push_route_filter(&mut route, "", caps);
    }
    let routed = caps.map(|_| routed_claim_sql(&route.text));
    let sqls: Vec<&str> = match (&routed, expired) {
        (None, false) => vec![&CLAIM_PENDING_SQL],
        (None, true) => vec![&CLAIM_PENDING_SQL, &CLAIM_EXPIRED_SQL],
        (Some(r), false) => vec![&r[0]],
        (Some(r), true) => vec![&r[0], &r[1]],
    };
    for sql in sqls {
        let mut stmt = conn.prepare_cached(sql).sql()?;
        let mut rows = stmt.query(params_from_iter(route.values.iter().map(bind))).sql()?;
        while let Some(row) = rows.next().sql()? {
            push_candidate_row(&mut found, &mut SqliteRow(row))?;
        }
    }
    Ok(in_claim_order(found, batch))
}

/// The first `batch` of `found` in claim order (oldest `available_at`, then command
/// id), with the entries of one command (its rows as read, receipts split between
/// them) joined into one, and each record's receipts by ordinal. Sorted in place: an
/// unstable sort allocates nothing, and no two commands share an id.
pub(super) fn in_claim_order(mut found: Vec<Candidate>, batch: u32) -> Vec<Candidate> {
    found.sort_unstable_by(|(a, _), (b, _)| {
        (a.command.available_at, &a.command.id).cmp(&(b.command.available_at, &b.command.id))
    });
    found.dedup_by(|(later, _), (kept, _)| {
        let same = later.command.id == kept.command.id;
        if same {
            kept.receipts.append(&mut later.receipts);
        }
        same
    });
    found.truncate(batch as usize);
    for (record, _) in &mut found {
        record.receipts.sort_by_key(|r| r.ordinal);
    }
    found
}

/// Runs the statements of a transition in order, checking each.
pub(super) fn run(conn: &Connection, statements: &[Statement<'_>]) -> Result<(), LedgerError> {
    // The dialect does not matter to the checks: the statements are spelled already.
    let mut s = SqliteSession::new(conn, &SQLITE);
    statements
        .iter()
        .try_for_each(|statement| sync(session::check(&mut s, statement)))
}

/// The first schema version whose attempt, command and receipt tables have their
/// `room` column.
const ROOM_VERSION: i64 = 6;

/// The dialect rows are written in on a ledger at schema version `newest` (as
/// recorded in `schema_migrations`): [`SQLITE`] from [`ROOM_VERSION`] on,
/// [`SQLITE_WITHOUT_ROOM`] before it (a ledger an older release left, or none at all).
pub(super) fn dialect_for(newest: Option<i64>) -> &'static Dialect {
    if newest.is_some_and(|v| v >= ROOM_VERSION) {
        &SQLITE
    } else {
        &SQLITE_WITHOUT_ROOM
    }
}

/// [`dialect_for`] the schema version `conn`'s ledger records.
pub(super) fn write_dialect(conn: &Connection) -> Result<&'static Dialect, LedgerError> {
    Ok(dialect_for(super::open::schema_version(conn).sql()?.flatten()))
}

/// Applies the engine's writes over `before`, the attempt's rows as read in this same
/// write transaction ([`write::plan`]): the guarded command `UPDATE` first (a guard
/// that no longer holds answers [`leasehold_engine::Refusal::StaleToken`] having
/// written nothing, no savepoint needed), then the attempt, then the receipts. Any
/// other error may leave earlier writes of the transaction in place: the caller must
/// then abandon the transaction (every caller returns the error, and dropping the
/// transaction rolls it back). (SQLite's write lock is the whole database, taken by
/// `BEGIN IMMEDIATE` before the first read, so the order of the statements inside
/// cannot deadlock with another transition.) `d` is the ledger's write dialect
/// ([`write_dialect`]).
pub(super) fn update_writes(
    conn: &Connection,
    d: &'static Dialect,
    before: &AttemptRecord,
    writes: &Writes,
) -> Result<(), LedgerError> {
    if writes.guard == Guard::Absent && !writes.is_empty() {
        return Err(LedgerError::Internal(
            "an update needs a guard other than absent".into(),
        ));
    }
    run(conn, &write::plan(d, Some(before), writes)?)?;
    follow_order(conn, d, before, writes)
}

/// The attempts behind an order key's head that `writes` ended, decided and written
/// ([`crate::ledger::sql::order::follow_order`]).
fn follow_order(
    conn: &Connection,
    d: &'static Dialect,
    before: &AttemptRecord,
    writes: &Writes,
) -> Result<(), LedgerError> {
    let mut session = SqliteSession { conn, dialect: d };
    sync(crate::ledger::sql::order::follow_order(&mut session, before, writes)).map(|_| ())
}

/// Applies the writes of several transitions (a claim's batch), each over the rows
/// read for it (`before`), one after the other as [`update_writes`] does; answers,
/// for each item, whether its guard held and its writes were applied (a refused item
/// wrote nothing). On any other error the caller must abandon the transaction.
///
/// One prepared `UPDATE` per row, by key: measured against one
/// `UPDATE … FROM json_each(?)` per table for the whole batch, it runs fewer
/// instructions per claim (see `docs/performance-log.md`), because every `->>`
/// re-parses the bound JSON.
pub(super) fn update_many(
    conn: &Connection,
    d: &'static Dialect,
    items: &[(&AttemptRecord, &Writes)],
) -> Result<Vec<bool>, LedgerError> {
    items
        .iter()
        .map(|(before, writes)| match update_writes(conn, d, before, writes) {
            Ok(()) => Ok(true),
            Err(LedgerError::Refused(_)) => Ok(false),
            Err(e) => Err(e),
        })
        .collect()
}

/// Refuses unless the guard holds on the attempt's command, writing nothing (tests).
#[cfg(test)]
pub(super) fn check_guard(conn: &Connection, attempt_id: &AttemptId, guard: &Guard) -> Result<(), LedgerError> {
    if *guard == Guard::Absent {
        return Err(LedgerError::Internal("a check needs a guard other than absent".into()));
    }
    run(conn, &[write::guard_check(&SQLITE, attempt_id, guard)])
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
            &[],
            |row| {
                let n = decode::scalar(row, 0, "schema_migrations row")?;
                u32::try_from(n)
                    .map_err(|_| LedgerError::Integrity(format!("schema_migrations row: {n} is not a version")))
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

    fn compat_row(&mut self) -> Result<Option<CompatRow>, LedgerError> {
        super::open::compat_row(self.conn).sql()
    }

    fn record_compat(&mut self, row: &CompatRow, written_at: Timestamp) -> Result<(), LedgerError> {
        super::open::record_compat(self.conn, row, written_at).sql()
    }
}

/// What keeps this ledger from serving ([`crate::ledger::sql::ready`]): its schema's
/// version, then each table the probe of which does not prepare because the table or
/// one of its columns is absent. Preparing compiles against the schema and reads
/// nothing.
pub(super) fn check_ready(conn: &Connection) -> Result<Vec<String>, LedgerError> {
    let newest = super::open::ready_version(conn).sql()?;
    let mut problems: Vec<String> = ready::version(newest, super::super::migrate::SQLITE)
        .into_iter()
        .collect();
    for probe in ready::probes() {
        if let Err(e) = conn.prepare(&probe.sql) {
            let message = e.to_string();
            let absent = if message.contains("no such table") {
                ready::Absent::Table
            } else if message.contains("no such column") {
                ready::Absent::Column
            } else {
                return Err(sql_error(e));
            };
            problems.push(ready::absent(probe.table, absent));
        }
    }
    Ok(problems)
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
