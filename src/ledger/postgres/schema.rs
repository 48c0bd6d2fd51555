//! The PostgreSQL ledger's schema: its migrations and the check every open makes.
//!
//! Contract: the migrations are [`MIGRATIONS`] (from `migrations/postgres/`), applied
//! in version order by [`crate::ledger::Ledger::migrate`] in one transaction that first
//! takes a transaction-scoped advisory lock ([`MIGRATE_LOCK`]), so concurrent
//! migrators of one database run one after the other and the later ones apply nothing.
//! PostgreSQL's DDL is transactional: a migration that fails leaves nothing behind.
//! `schema_migrations.applied_at` and `schema_compat.written_at` are read from the
//! database's clock. The `schema_compat` row is written in the same transaction; a
//! newer schema this binary may run on is left as it is ([`migrate::newer_schema`]).

use super::error::{classify, Phase, TxError};
use crate::ledger::migrate::{self, Compat, CompatRow, Migration};
use crate::ledger::sql::ready;
use crate::ledger::LedgerError;
use tokio_postgres::{Client, GenericClient};

/// The PostgreSQL migrations, in version order.
pub static MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../../migrations/postgres/0001_init.sql"),
        // Breaking: nothing older runs on a new ledger.
        compat: Compat::Breaking,
    },
    Migration {
        version: 2,
        name: "plan_names",
        sql: include_str!("../../../migrations/postgres/0002_plan_names.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 3,
        name: "open_by_command",
        sql: include_str!("../../../migrations/postgres/0003_open_by_command.sql"),
        // Breaking: drops attempt_open, which the previous release's open-attempt count reads.
        compat: Compat::Breaking,
    },
    Migration {
        version: 4,
        name: "delivery_policy",
        sql: include_str!("../../../migrations/postgres/0004_delivery_policy.sql"),
        // Breaking: plans may carry retry policies the previous release would not apply.
        compat: Compat::Breaking,
    },
    Migration {
        version: 5,
        name: "routing",
        sql: include_str!("../../../migrations/postgres/0005_routing.sql"),
        // Breaking: the previous release would claim commands routed to other queues and executors.
        compat: Compat::Breaking,
    },
    Migration {
        version: 6,
        name: "target_limits",
        sql: include_str!("../../../migrations/postgres/0006_target_limits.sql"),
        // Breaking: the previous release would lease commands past their target's limits.
        compat: Compat::Breaking,
    },
    Migration {
        version: 7,
        name: migrate::COMPAT_TABLE,
        sql: include_str!("../../../migrations/postgres/0007_schema_compat.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 8,
        name: "traces",
        sql: include_str!("../../../migrations/postgres/0008_traces.sql"),
        // Additive: a nullable column the previous release neither reads nor writes.
        compat: Compat::Additive,
    },
    Migration {
        version: 9,
        name: "enqueue_keys",
        sql: include_str!("../../../migrations/postgres/0009_enqueue_keys.sql"),
        // Additive: the previous release writes no key and reads none; a keyed
        // attempt is, to it, an attempt like any other.
        compat: Compat::Additive,
    },
    Migration {
        version: 10,
        name: "producer_role",
        sql: include_str!("../../../migrations/postgres/0010_producer_role.sql"),
        // Additive: the previous release reads and writes tokens as before; a
        // producer token is one it does not know, and refuses.
        compat: Compat::Additive,
    },
    Migration {
        version: 11,
        name: "templates",
        sql: include_str!("../../../migrations/postgres/0011_templates.sql"),
        // Breaking: the previous release would deliver a template's step with its
        // `{"$input": …}` references unresolved, and cannot read a WAITING command.
        compat: Compat::Breaking,
    },
    Migration {
        version: 12,
        name: "sql_enqueue",
        sql: include_str!("../../../migrations/postgres/0012_sql_enqueue.sql"),
        // Additive: a new column the previous release neither writes nor reads, and
        // functions it does not call.
        compat: Compat::Additive,
    },
];

impl super::PostgresLedger {
    /// [`crate::ledger::Ledger::migrate`] with `migrations`, recorded as written by
    /// release `written_by`; the rolling-upgrade tests play a newer release so.
    pub async fn migrate_as(
        &self,
        migrations: &'static [Migration],
        written_by: &'static str,
    ) -> Result<Vec<u32>, LedgerError> {
        self.retry(|| async {
            let mut client = self.backend.connect().await?;
            migrate_as(&mut client, migrations, written_by).await
        })
        .await
    }
}

/// The advisory lock key that serializes migrators of one database ("leasehol" in ASCII).
pub const MIGRATE_LOCK: i64 = 0x6c65_6173_6568_6f6c;

/// The database clock in milliseconds since the Unix epoch, as SQL.
pub(super) const NOW_MS: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";

/// Applies every pending migration in one transaction; answers the versions applied.
pub(super) async fn migrate(client: &mut Client) -> Result<Vec<u32>, TxError> {
    migrate_as(client, MIGRATIONS, migrate::RELEASE).await
}

/// [`migrate`] with `migrations`, recorded as written by release `written_by`.
async fn migrate_as(client: &mut Client, migrations: &[Migration], written_by: &str) -> Result<Vec<u32>, TxError> {
    migrate::check_list(migrations)?;
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
    if migrate::newer(migrations, &applied) {
        let row = compat_row(&tx).await?;
        if migrate::newer_schema(migrations, &applied, row.as_ref())?.is_some() {
            return Ok(Vec::new());
        }
    }
    let mut done = Vec::new();
    for migration in migrate::pending(migrations, &applied)? {
        apply(&tx, migration).await?;
        done.push(migration.version);
    }
    if let Some(record) = CompatRow::written(migrations, written_by) {
        record_compat(&tx, &record).await?;
    }
    tx.commit().await.map_err(|e| classify(&e, Phase::Commit))?;
    Ok(done)
}

/// Records `record` in `schema_compat` unless a row of its version exists.
async fn record_compat(tx: &tokio_postgres::Transaction<'_>, record: &CompatRow) -> Result<(), TxError> {
    tx.execute(
        &format!(
            "INSERT INTO schema_compat (version, oldest_compatible, written_by, written_at) \
             VALUES ($1, $2, $3, {NOW_MS}) ON CONFLICT (version) DO NOTHING"
        ),
        &[
            &i64::from(record.version),
            &i64::from(record.oldest_compatible),
            &record.written_by,
        ],
    )
    .await
    .map_err(|e| classify(&e, Phase::Statement))?;
    Ok(())
}

/// Runs one migration's SQL and records it, inside the migrating transaction.
async fn apply(tx: &tokio_postgres::Transaction<'_>, migration: &Migration) -> Result<(), TxError> {
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
    .map_err(|e| classify(&e, Phase::Statement))?;
    Ok(())
}

/// The `schema_compat` row of the newest version when `newest` is newer than this
/// binary's schema (`None` otherwise: nothing is read).
async fn row_if_newer(client: &Client, newest: Option<i64>) -> Result<Option<CompatRow>, TxError> {
    let known = MIGRATIONS.last().map_or(0, |m| i64::from(m.version));
    match newest {
        Some(v) if v > known => compat_row(client).await,
        _ => Ok(None),
    }
}

/// The `schema_compat` row of the newest version recorded: `None` without that table
/// or a row. Reads only the columns whose format is stable.
async fn compat_row<C: GenericClient>(client: &C) -> Result<Option<CompatRow>, TxError> {
    if !has_table(client, migrate::COMPAT_TABLE).await? {
        return Ok(None);
    }
    let row = client
        .query_opt(migrate::NEWEST_COMPAT_ROW, &[])
        .await
        .map_err(|e| classify(&e, Phase::Statement))?;
    let row = row.map(|r| CompatRow::from_stored(r.get(0), r.get(1), r.get(2)));
    Ok(row.transpose()?)
}

/// Whether the search path holds table `name`.
async fn has_table<C: GenericClient>(client: &C, name: &str) -> Result<bool, TxError> {
    let row = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
        .await
        .map_err(|e| classify(&e, Phase::Statement))?;
    Ok(row.get(0))
}

/// Refuses a database this binary cannot use: no `schema_migrations` table (never
/// migrated), or a schema version newer than this binary knows that it may not run
/// on ([`migrate::check_version`]). `ledger` (shown without its password) names the
/// database in messages.
pub(super) async fn check_schema(client: &Client, ledger: &str) -> Result<(), TxError> {
    checked_schema(client, ledger).await.map(drop)
}

/// [`check_schema`], answering the `schema_compat` row of a newer, compatible schema.
async fn checked_schema(client: &Client, ledger: &str) -> Result<Option<CompatRow>, TxError> {
    let Some(newest) = newest_version(client).await? else {
        return Err(LedgerError::BadInput(format!(
            "the ledger at {ledger} holds no leasehold schema: run `leasehold migrate`"
        ))
        .into());
    };
    let row = row_if_newer(client, newest).await?;
    Ok(migrate::check_version(
        &format!("the ledger at {ledger}"),
        newest,
        row.as_ref(),
        MIGRATIONS,
    )?)
}

/// [`crate::ledger::Ledger::schema_notice`]: `None` without a schema (opening
/// refuses that) or at this binary's version or older.
pub(super) async fn schema_notice(client: &Client, ledger: &str) -> Result<Option<String>, TxError> {
    if newest_version(client).await?.is_none() {
        return Ok(None);
    }
    let newer = checked_schema(client, ledger).await?;
    Ok(newer.map(|row| migrate::newer_notice(&row, MIGRATIONS)))
}

/// The newest schema version `schema_migrations` records: `None` without that table
/// (never migrated), `Some(None)` with an empty one.
async fn newest_version(client: &Client) -> Result<Option<Option<i64>>, TxError> {
    if !has_table(client, "schema_migrations").await? {
        return Ok(None);
    }
    let row = client
        .query_one("SELECT MAX(version) FROM schema_migrations", &[])
        .await
        .map_err(|e| classify(&e, Phase::Statement))?;
    Ok(Some(row.get(0)))
}

/// What keeps this database from serving ([`crate::ledger::sql::ready`]): its schema's
/// version, then each table whose probe the server refuses because the table or one
/// of its columns does not exist. Each probe runs on its own (outside a
/// transaction, which the first refusal would abort) and reads no row.
pub(super) async fn check_ready(client: &Client) -> Result<Vec<String>, TxError> {
    use tokio_postgres::error::SqlState;
    let newest = newest_version(client).await?;
    let row = row_if_newer(client, newest.flatten()).await?;
    let mut problems: Vec<String> =
        ready::version(migrate::ready_version(newest, row.as_ref(), MIGRATIONS), MIGRATIONS)
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
