//! The PostgreSQL ledger's schema: its migrations and the check every open makes.
//!
//! Contract: the migrations are [`MIGRATIONS`] (from `migrations/postgres/`), applied
//! in version order by [`crate::ledger::Ledger::migrate`] in one transaction that first
//! takes a transaction-scoped advisory lock ([`MIGRATE_LOCK`]), so concurrent
//! migrators of one database run one after the other and the later ones apply nothing.
//! PostgreSQL's DDL is transactional: a migration that fails leaves nothing behind.
//! `schema_migrations.applied_at` is read from the database's clock.

use super::error::{classify, Phase, TxError};
use crate::ledger::migrate::{self, Migration};
use crate::ledger::sql::ready;
use crate::ledger::LedgerError;
use tokio_postgres::Client;

/// The PostgreSQL migrations, in version order.
pub static MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../../migrations/postgres/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "plan_names",
        sql: include_str!("../../../migrations/postgres/0002_plan_names.sql"),
    },
    Migration {
        version: 3,
        name: "open_by_command",
        sql: include_str!("../../../migrations/postgres/0003_open_by_command.sql"),
    },
    Migration {
        version: 4,
        name: "delivery_policy",
        sql: include_str!("../../../migrations/postgres/0004_delivery_policy.sql"),
    },
    Migration {
        version: 5,
        name: "routing",
        sql: include_str!("../../../migrations/postgres/0005_routing.sql"),
    },
    Migration {
        version: 6,
        name: "target_limits",
        sql: include_str!("../../../migrations/postgres/0006_target_limits.sql"),
    },
];

/// The advisory lock key that serializes migrators of one database ("leasehol" in ASCII).
pub const MIGRATE_LOCK: i64 = 0x6c65_6173_6568_6f6c;

/// The database clock in milliseconds since the Unix epoch, as SQL.
pub(super) const NOW_MS: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";

/// Applies every pending migration in one transaction; answers the versions applied.
pub(super) async fn migrate(client: &mut Client) -> Result<Vec<u32>, TxError> {
    migrate::check_list(MIGRATIONS)?;
    let statement = |e: tokio_postgres::Error| classify(&e, Phase::Statement);
    let tx = client.transaction().await.map_err(statement)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
        .await
        .map_err(statement)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (\
         version BIGINT NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .await
    .map_err(statement)?;
    let applied = tx
        .query("SELECT version FROM schema_migrations ORDER BY version", &[])
        .await
        .map_err(statement)?
        .iter()
        .map(|row| {
            let v: i64 = row.get(0);
            u32::try_from(v).map_err(|_| LedgerError::Integrity(format!("schema_migrations: bad version {v}")))
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let mut done = Vec::new();
    for migration in migrate::pending(MIGRATIONS, &applied)? {
        tx.batch_execute(migration.sql)
            .await
            .map_err(|e| match classify(&e, Phase::Statement) {
                TxError::Ledger(LedgerError::Internal(m)) => TxError::Ledger(LedgerError::Internal(format!(
                    "migration {} ({}): {m}",
                    migration.version, migration.name
                ))),
                other => other,
            })?;
        tx.execute(
            &format!("INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, {NOW_MS})"),
            &[&i64::from(migration.version), &migration.name],
        )
        .await
        .map_err(statement)?;
        done.push(migration.version);
    }
    tx.commit().await.map_err(|e| classify(&e, Phase::Commit))?;
    Ok(done)
}

/// Refuses a database this binary cannot use: no `schema_migrations` table (never
/// migrated), or a schema version newer than this binary knows. `ledger` (shown
/// without its password) names the database in messages.
pub(super) async fn check_schema(client: &Client, ledger: &str) -> Result<(), TxError> {
    let Some(newest) = newest_version(client).await? else {
        return Err(LedgerError::BadInput(format!(
            "the ledger at {ledger} holds no leasehold schema: run `leasehold migrate`"
        ))
        .into());
    };
    Ok(migrate::check_version(
        &format!("the ledger at {ledger}"),
        newest,
        MIGRATIONS,
    )?)
}

/// The newest schema version `schema_migrations` records: `None` without that table
/// (never migrated), `Some(None)` with an empty one.
async fn newest_version(client: &Client) -> Result<Option<Option<i64>>, TxError> {
    let statement = |e: tokio_postgres::Error| classify(&e, Phase::Statement);
    let row = client
        .query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[])
        .await
        .map_err(statement)?;
    if !row.get::<_, bool>(0) {
        return Ok(None);
    }
    let row = client
        .query_one("SELECT MAX(version) FROM schema_migrations", &[])
        .await
        .map_err(statement)?;
    Ok(Some(row.get(0)))
}

/// What keeps this database from serving ([`crate::ledger::sql::ready`]): its schema's
/// version, then each table whose probe the server refuses because the table or one
/// of its columns does not exist. Each probe runs on its own (outside a
/// transaction, which the first refusal would abort) and reads no row.
pub(super) async fn check_ready(client: &Client) -> Result<Vec<String>, TxError> {
    use tokio_postgres::error::SqlState;
    let mut problems: Vec<String> = ready::version(newest_version(client).await?, MIGRATIONS)
        .into_iter()
        .collect();
    for probe in ready::probes() {
        if let Err(e) = client.query(probe.sql.as_str(), &[]).await {
            let absent = match e.code() {
                Some(code) if *code == SqlState::UNDEFINED_TABLE => ready::Absent::Table,
                Some(code) if *code == SqlState::UNDEFINED_COLUMN => ready::Absent::Column,
                _ => return Err(classify(&e, Phase::Statement)),
            };
            problems.push(ready::absent(probe.table, absent));
        }
    }
    Ok(problems)
}
