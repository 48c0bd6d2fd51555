//! The MySQL schema migrations and their runner.
//!
//! Contract: the migrations are [`MIGRATIONS`] (from `migrations/mysql/`), applied in
//! version order by the shared version logic ([`crate::ledger::migrate::pending`]) and
//! recorded in `schema_migrations(version, name, applied_at)`, then the schema's
//! `schema_compat` row; already recorded versions are skipped, and a recorded version
//! newer than the binary knows is left as it is when this binary may run on it and
//! refused otherwise ([`migrate::newer_schema`]), before anything runs. MySQL commits DDL implicitly, so the run cannot be one
//! transaction: concurrent migrators of the same database are serialized by the named
//! lock `leasehold.migrate.<database>` (`GET_LOCK`), held by one connection for the
//! whole run, and every migration's statements are idempotent so that a run cut short
//! can simply run again.

use super::error::{DbResult, TxError};
use super::session::MySession;
use crate::ledger::migrate::{self, Compat, CompatRow, Migration};
use crate::ledger::sql::ready;
use crate::ledger::sql::session::db_now;
use crate::ledger::LedgerError;
use leasehold_engine::Timestamp;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Value};

/// The MySQL migrations, in version order.
pub static MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../../migrations/mysql/0001_init.sql"),
        // Breaking: nothing older runs on a new ledger.
        compat: Compat::Breaking,
    },
    Migration {
        version: 2,
        name: "covering_claim_index",
        sql: include_str!("../../../migrations/mysql/0002_covering_claim_index.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 3,
        name: "api_tokens",
        sql: include_str!("../../../migrations/mysql/0003_api_tokens.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 4,
        name: "plan_names",
        sql: include_str!("../../../migrations/mysql/0004_plan_names.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 5,
        name: "delivery_policy",
        sql: include_str!("../../../migrations/mysql/0005_delivery_policy.sql"),
        // Breaking: plans may carry retry policies the previous release would not apply.
        compat: Compat::Breaking,
    },
    Migration {
        version: 6,
        name: "routing",
        sql: include_str!("../../../migrations/mysql/0006_routing.sql"),
        // Breaking: the previous release would claim commands routed to other queues and executors.
        compat: Compat::Breaking,
    },
    Migration {
        version: 7,
        name: "target_limits",
        sql: include_str!("../../../migrations/mysql/0007_target_limits.sql"),
        // Breaking: the previous release would lease commands past their target's limits.
        compat: Compat::Breaking,
    },
    Migration {
        version: 8,
        name: migrate::COMPAT_TABLE,
        sql: include_str!("../../../migrations/mysql/0008_schema_compat.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 9,
        name: "traces",
        sql: include_str!("../../../migrations/mysql/0009_traces.sql"),
        // Additive: a nullable column the previous release neither reads nor writes.
        compat: Compat::Additive,
    },
    Migration {
        version: 10,
        name: "enqueue_keys",
        sql: include_str!("../../../migrations/mysql/0010_enqueue_keys.sql"),
        // Additive: the previous release writes no key and reads none; a keyed
        // attempt is, to it, an attempt like any other.
        compat: Compat::Additive,
    },
    Migration {
        version: 11,
        name: "producer_role",
        sql: include_str!("../../../migrations/mysql/0011_producer_role.sql"),
        // Additive: the previous release reads and writes tokens as before; a
        // producer token is one it does not know, and refuses.
        compat: Compat::Additive,
    },
    Migration {
        version: 12,
        name: "templates",
        sql: include_str!("../../../migrations/mysql/0012_templates.sql"),
        // Breaking: the previous release would deliver a template's step with its
        // `{"$input": …}` references unresolved, and cannot read a WAITING command.
        compat: Compat::Breaking,
    },
    Migration {
        version: 13,
        name: "sql_enqueue",
        sql: include_str!("../../../migrations/mysql/0013_sql_enqueue.sql"),
        // Additive: a new column the previous release neither writes nor reads, and
        // routines it does not call.
        compat: Compat::Additive,
    },
];

/// How long a migrator waits for another one to finish, in seconds.
const MIGRATE_LOCK_WAIT_S: i64 = 60;

/// Splits a migration script into statements: `--` comments are dropped and the
/// delimiter (`;`) ends a statement unless it is inside a quoted string or
/// identifier. A line `DELIMITER $$` between statements changes the delimiter, as
/// the `mysql` client reads a file, so that a routine's body keeps its `;`.
pub(super) fn statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut delimiter = ";".to_owned();
    let mut quote: Option<char> = None;
    let mut rest = sql;
    while let Some(c) = rest.chars().next() {
        if quote.is_none() && current.trim().is_empty() {
            if let Some((new, after)) = delimiter_line(rest) {
                delimiter = new.to_owned();
                current.clear();
                rest = after;
                continue;
            }
        }
        match quote {
            Some(q) => {
                current.push(c);
                if c == q {
                    quote = None;
                }
            }
            None if matches!(c, '\'' | '"' | '`') => {
                quote = Some(c);
                current.push(c);
            }
            None if rest.starts_with("--") => {
                rest = rest.find('\n').map_or("", |i| &rest[i..]);
                continue;
            }
            None if rest.starts_with(delimiter.as_str()) => {
                push_statement(&mut out, &current);
                current.clear();
                rest = &rest[delimiter.len()..];
                continue;
            }
            None => current.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    push_statement(&mut out, &current);
    out
}

/// A `DELIMITER <text>` line at the start of `text` (after blanks): the new
/// delimiter and what follows the line.
fn delimiter_line(text: &str) -> Option<(&str, &str)> {
    let trimmed = text.trim_start();
    let (line, after) = trimmed.split_once('\n').unwrap_or((trimmed, ""));
    let word = line.get(..10)?;
    if !word.eq_ignore_ascii_case("DELIMITER ") {
        return None;
    }
    let new = line[10..].trim();
    (!new.is_empty()).then_some((new, after))
}

/// Adds `statement` to `out` unless it is blank.
fn push_statement(out: &mut Vec<String>, statement: &str) {
    let statement = statement.trim();
    if !statement.is_empty() {
        out.push(statement.to_owned());
    }
}

/// Applies the pending migrations over `conn`, holding the migration lock; answers the
/// versions applied now. `now` answers `applied_at` (the ledger's clock).
pub(super) async fn run(conn: &mut Conn, now: Option<Timestamp>) -> Result<Vec<u32>, TxError> {
    run_as(conn, now, MIGRATIONS, migrate::RELEASE).await
}

/// [`run`] with `migrations`, recorded as written by release `written_by`.
async fn run_as(
    conn: &mut Conn,
    now: Option<Timestamp>,
    migrations: &[Migration],
    written_by: &str,
) -> Result<Vec<u32>, TxError> {
    let lock_name = "CONCAT('leasehold.migrate.', DATABASE())";
    let got: Option<Option<i64>> = conn
        .exec_first(format!("SELECT GET_LOCK({lock_name}, ?)"), (MIGRATE_LOCK_WAIT_S,))
        .await
        .db()?;
    match got.flatten() {
        Some(1) => {}
        _ => {
            return Err(LedgerError::Unavailable(format!(
                "another migrator held the schema lock for {MIGRATE_LOCK_WAIT_S} s"
            ))
            .into())
        }
    }
    let result = run_locked(conn, now, migrations, written_by).await;
    // Closing the connection would release the lock too; release it now so that a
    // pooled connection does not keep it.
    let released: Result<Option<Option<i64>>, _> = conn.query_first(format!("SELECT RELEASE_LOCK({lock_name})")).await;
    let applied = result?;
    released.db()?;
    Ok(applied)
}

impl super::MysqlLedger {
    /// [`crate::ledger::Ledger::migrate`] with `migrations`, recorded as written by
    /// release `written_by`; the rolling-upgrade tests play a newer release so.
    pub async fn migrate_as(
        &self,
        migrations: &'static [Migration],
        written_by: &'static str,
    ) -> Result<Vec<u32>, LedgerError> {
        self.retry(|| async {
            let mut conn = self.backend.connect().await?;
            run_as(&mut conn, None, migrations, written_by).await
        })
        .await
    }

    /// Refuses a database this binary cannot use, before any other call: no
    /// `schema_migrations` table (never migrated), or a schema version newer than
    /// the newest this binary knows that it may not run on
    /// ([`migrate::check_version`]). The CLI calls it on every open but `migrate`'s.
    pub async fn check_schema(&self) -> Result<(), LedgerError> {
        self.retry(|| async {
            let mut conn = self.backend.connect().await?;
            check_schema(&mut conn, &self.backend.url.to_string()).await
        })
        .await
    }
}

/// [`super::MysqlLedger::check_schema`] over one connection (or inside a caller's
/// transaction, [`super::outbox`]); `url` (shown without its password) names the
/// ledger in messages.
pub(super) async fn check_schema<Q: Queryable + Send>(conn: &mut Q, url: &str) -> Result<(), TxError> {
    checked_schema(conn, url).await.map(drop)
}

/// [`check_schema`], answering the `schema_compat` row of a newer, compatible schema.
async fn checked_schema<Q: Queryable + Send>(conn: &mut Q, url: &str) -> Result<Option<CompatRow>, TxError> {
    let Some(newest) = newest_version(conn).await? else {
        return Err(LedgerError::BadInput(format!(
            "the ledger at {url} holds no leasehold schema: run `leasehold migrate`"
        ))
        .into());
    };
    let row = row_if_newer(conn, newest).await?;
    Ok(migrate::check_version(
        &format!("the ledger at {url}"),
        newest,
        row.as_ref(),
        MIGRATIONS,
    )?)
}

/// [`crate::ledger::Ledger::schema_notice`]: `None` without a schema (opening
/// refuses that) or at this binary's version or older.
pub(super) async fn schema_notice<Q: Queryable + Send>(conn: &mut Q, url: &str) -> Result<Option<String>, TxError> {
    if newest_version(conn).await?.is_none() {
        return Ok(None);
    }
    let newer = checked_schema(conn, url).await?;
    Ok(newer.map(|row| migrate::newer_notice(&row, MIGRATIONS)))
}

/// The `schema_compat` row of the newest version when `newest` is newer than this
/// binary's schema (`None` otherwise: nothing is read).
async fn row_if_newer<Q: Queryable + Send>(conn: &mut Q, newest: Option<i64>) -> Result<Option<CompatRow>, TxError> {
    let known = MIGRATIONS.last().map_or(0, |m| i64::from(m.version));
    match newest {
        Some(v) if v > known => compat_row(conn).await,
        _ => Ok(None),
    }
}

/// The `schema_compat` row of the newest version recorded: `None` without that table
/// or a row. Reads only the columns whose format is stable.
async fn compat_row<Q: Queryable + Send>(conn: &mut Q) -> Result<Option<CompatRow>, TxError> {
    if !has_table(conn, migrate::COMPAT_TABLE).await? {
        return Ok(None);
    }
    let row: Option<(i64, i64, String)> = conn.query_first(migrate::NEWEST_COMPAT_ROW).await.db()?;
    let row = row.map(|(version, oldest, written_by)| CompatRow::from_stored(version, oldest, written_by));
    Ok(row.transpose()?)
}

/// Whether the database holds table `name`.
async fn has_table<Q: Queryable + Send>(conn: &mut Q, name: &str) -> Result<bool, TxError> {
    let tables: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
            (name,),
        )
        .await
        .db()?;
    Ok(tables.unwrap_or(0) > 0)
}

/// The newest schema version `schema_migrations` records: `None` without that table
/// (never migrated), `Some(None)` with an empty one.
async fn newest_version<Q: Queryable + Send>(conn: &mut Q) -> Result<Option<Option<i64>>, TxError> {
    if !has_table(conn, "schema_migrations").await? {
        return Ok(None);
    }
    let newest: Option<Option<i64>> = conn
        .query_first("SELECT MAX(version) FROM schema_migrations")
        .await
        .db()?;
    Ok(Some(newest.flatten()))
}

/// What keeps this database from serving ([`crate::ledger::sql::ready`]): its schema's
/// version, then each table whose probe the server refuses because the table or one
/// of its columns does not exist. Each probe reads no row.
pub(super) async fn check_ready<Q: Queryable + Send>(conn: &mut Q) -> Result<Vec<String>, TxError> {
    use super::error::{classify, Phase, ER_BAD_FIELD_ERROR, ER_NO_SUCH_TABLE};
    let newest = newest_version(conn).await?;
    let row = row_if_newer(conn, newest.flatten()).await?;
    let mut problems: Vec<String> =
        ready::version(migrate::ready_version(newest, row.as_ref(), MIGRATIONS), MIGRATIONS)
            .into_iter()
            .collect();
    for probe in ready::probes() {
        if let Err(e) = conn.query_drop(probe.sql.as_str()).await {
            let absent = match &e {
                mysql_async::Error::Server(s) if s.code == ER_NO_SUCH_TABLE => ready::Absent::Table,
                mysql_async::Error::Server(s) if s.code == ER_BAD_FIELD_ERROR => ready::Absent::Column,
                _ => return Err(classify(&e, Phase::Statement)),
            };
            problems.push(ready::absent(probe.table, absent));
        }
    }
    Ok(problems)
}

async fn run_locked(
    conn: &mut Conn,
    now: Option<Timestamp>,
    migrations: &[Migration],
    written_by: &str,
) -> Result<Vec<u32>, TxError> {
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS schema_migrations (\
         version INT UNSIGNED NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at BIGINT NOT NULL\
         ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    )
    .await
    .db()?;
    let applied: Vec<i64> = conn
        .query("SELECT version FROM schema_migrations ORDER BY version")
        .await
        .db()?;
    let applied: Vec<u32> = applied
        .into_iter()
        .map(|v| u32::try_from(v).map_err(|_| LedgerError::Integrity(format!("schema_migrations: bad version {v}"))))
        .collect::<Result<_, _>>()?;
    if migrate::newer(migrations, &applied) {
        let row = compat_row(conn).await?;
        if migrate::newer_schema(migrations, &applied, row.as_ref())?.is_some() {
            return Ok(Vec::new());
        }
    }
    let mut done = Vec::new();
    for migration in migrate::pending(migrations, &applied)? {
        apply(conn, migration, now).await?;
        done.push(migration.version);
    }
    // Written once every migration is: a run cut short writes it the next time.
    if let Some(record) = CompatRow::written(migrations, written_by) {
        record_compat(conn, &record, now).await?;
    }
    Ok(done)
}

/// Records `record` in `schema_compat` unless a row of its version exists.
async fn record_compat(conn: &mut Conn, record: &CompatRow, now: Option<Timestamp>) -> Result<(), TxError> {
    let written_at = applied_at(conn, now).await?;
    conn.exec_drop(
        "INSERT INTO schema_compat (version, oldest_compatible, written_by, written_at) VALUES (?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE version = version",
        vec![
            Value::from(record.version),
            Value::from(record.oldest_compatible),
            Value::from(record.written_by.as_str()),
            Value::from(written_at.as_millis()),
        ],
    )
    .await
    .db()?;
    Ok(())
}

/// The ledger's clock for `applied_at`: `now`, or the database's.
async fn applied_at(conn: &mut Conn, now: Option<Timestamp>) -> Result<Timestamp, TxError> {
    match now {
        Some(now) => Ok(now),
        None => db_now(&mut MySession(&mut *conn)).await,
    }
}

/// Runs one migration's statements and records its version.
async fn apply(conn: &mut Conn, migration: &Migration, now: Option<Timestamp>) -> Result<(), TxError> {
    for statement in statements(migration.sql) {
        conn.query_drop(statement).await.map_err(|e| {
            match super::error::classify(&e, super::error::Phase::Statement) {
                TxError::Ledger(LedgerError::Internal(m)) => TxError::Ledger(LedgerError::Internal(format!(
                    "migration {} ({}): {m}",
                    migration.version, migration.name
                ))),
                other => other,
            }
        })?;
    }
    let applied_at = applied_at(conn, now).await?;
    conn.exec_drop(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
        vec![
            Value::from(migration.version),
            Value::from(migration.name),
            Value::from(applied_at.as_millis()),
        ],
    )
    .await
    .db()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mysql_list_is_well_formed_and_splits_into_statements() {
        migrate::check_list(MIGRATIONS).unwrap();
        let statements = statements(MIGRATIONS[0].sql);
        assert_eq!(statements.len(), 4, "{statements:#?}");
        for (s, table) in statements.iter().zip(["plan", "attempt", "receipt", "command"]) {
            assert!(s.starts_with(&format!("CREATE TABLE IF NOT EXISTS {table} (")), "{s}");
            assert!(s.contains("ENGINE = InnoDB"), "{s}");
            assert!(!s.contains("--"), "a comment survived: {s}");
        }
        let second = super::statements(MIGRATIONS[1].sql);
        assert_eq!(second.len(), 1, "{second:#?}");
        assert!(second[0].starts_with("ALTER TABLE command"), "{}", second[0]);
    }

    #[test]
    fn splitting_respects_quotes_and_comments() {
        let sql = "-- a; comment\nSELECT 'a;b'; SELECT `x;y` -- tail; here\n; ;\nSELECT 3";
        assert_eq!(statements(sql), vec!["SELECT 'a;b'", "SELECT `x;y`", "SELECT 3"]);
    }

    #[test]
    fn a_delimiter_line_keeps_a_routine_body_whole() {
        let sql = "SELECT 1;\n-- a routine\nDELIMITER $$\nCREATE PROCEDURE p()\nBEGIN\n  SELECT 'x;$$';\n  SELECT 2;\nEND $$\n\
                   delimiter ;\nSELECT 3;";
        assert_eq!(
            statements(sql),
            vec![
                "SELECT 1",
                "CREATE PROCEDURE p()\nBEGIN\n  SELECT 'x;$$';\n  SELECT 2;\nEND",
                "SELECT 3"
            ]
        );
    }
}
