//! Versioned schema migrations, shared by the SQL ledgers, and the rolling-upgrade
//! policy (N-1) they follow.
//!
//! Contract: a backend's migrations are a static, strictly increasing list of
//! [`Migration`]s (version ≥ 1, name, SQL, [`Compat`]) embedded in the binary with
//! `include_str!` from `migrations/<backend>/NNNN_name.sql`. A `schema_migrations(version,
//! name, applied_at)` table records what was applied. Applying is idempotent: versions
//! already recorded are skipped, and [`run`] answers only the versions applied now.
//!
//! Rolling upgrades: every migration declares whether the code of the schema before
//! it may keep running on it ([`Compat::Additive`]) or not ([`Compat::Breaking`]).
//! Each migrator records, for the schema it leaves, a [`CompatRow`] in the
//! `schema_compat` table: the oldest schema version whose code may still run on this
//! database ([`oldest_compatible`]: the newest breaking migration applied) and the
//! release that wrote it. A binary that finds a schema newer than it knows reads the
//! row of the newest version ([`check_version`]): when its own schema is at least the
//! oldest compatible one it runs (and `migrate` applies nothing); otherwise it is
//! refused with [`LedgerError::BadInput`], naming the release it needs, before
//! anything is read or written. A newer schema without a row of its own is refused
//! (on open naming both versions; by `migrate` as an integrity error).
//!
//! The `schema_compat` row format is stable from its first version on, because older
//! binaries read it without knowing the migrations that came after them: its columns
//! `version`, `oldest_compatible` and `written_by` keep their names, types and meaning
//! forever; a later release may add columns, never drop, rename or retype these.
//!
//! The version logic is backend-neutral: [`pending`], [`oldest_compatible`] and
//! [`check_version`] are pure functions, and [`run`] drives any [`MigrationTarget`] (a
//! synchronous backend). An asynchronous backend reads its recorded versions itself,
//! calls [`newer_schema`] and [`pending`], applies the answer in order and records
//! [`CompatRow::written`]. The backend is responsible for serializing concurrent
//! migrators (SQLite: the whole run inside one `BEGIN IMMEDIATE` transaction).

use super::LedgerError;
use leasehold_engine::Timestamp;

/// The release this binary is (`leasehold --version`), recorded with each schema it writes.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// Whether the code of the schema before a migration may keep running on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compat {
    /// Only adds what the previous schema's code never reads nor needs to write:
    /// nullable or defaulted columns, tables, indexes. Workers of the previous release
    /// keep running while the new release rolls out.
    Additive,
    /// Changes what the previous schema's code reads or relies on (a table rebuilt, an
    /// index or column it uses dropped, rows it would misread): every binary older than
    /// this migration is refused once it is applied.
    Breaking,
}

/// One schema migration: a version, a short name, the SQL that applies it and whether
/// the previous schema's code may run on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Strictly increasing, starting at 1; the `NNNN` of its file name.
    pub version: u32,
    /// The `name` of its file name (`0001_init.sql` → `init`).
    pub name: &'static str,
    /// The SQL script, possibly several statements.
    pub sql: &'static str,
    /// Whether the code of schema `version - 1` may keep running on it.
    pub compat: Compat,
}

/// A `schema_compat` row: what a migrator recorded about the schema it left. Its
/// format is stable (see the module's contract).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompatRow {
    /// The schema version the row describes (the newest applied).
    pub version: u32,
    /// The oldest schema version whose code may run on that schema.
    pub oldest_compatible: u32,
    /// The leasehold release that migrated the database to `version`.
    pub written_by: String,
}

/// The name of the migration that creates the `schema_compat` table (every backend's).
pub const COMPAT_TABLE: &str = "schema_compat";

/// Every backend's read of the newest `schema_compat` row: only the columns whose
/// format is stable, so that every release reads it the same way.
pub const NEWEST_COMPAT_ROW: &str =
    "SELECT version, oldest_compatible, written_by FROM schema_compat ORDER BY version DESC LIMIT 1";

impl CompatRow {
    /// The row a migrator that knows `migrations` records once they are all applied,
    /// as release `written_by`; `None` for a list without the `schema_compat` table
    /// (a release before it, which recorded no row).
    pub fn written(migrations: &[Migration], written_by: &str) -> Option<Self> {
        if !migrations.iter().any(|m| m.name == COMPAT_TABLE) {
            return None;
        }
        let version = migrations.last().map_or(0, |m| m.version);
        Some(Self {
            version,
            oldest_compatible: oldest_compatible(migrations, version),
            written_by: written_by.to_owned(),
        })
    }

    /// The row as a backend stores it (versions as 64-bit integers); a version that
    /// is not a `u32` is an integrity error.
    pub fn from_stored(version: i64, oldest_compatible: i64, written_by: String) -> Result<Self, LedgerError> {
        let number =
            |v: i64| u32::try_from(v).map_err(|_| LedgerError::Integrity(format!("schema_compat: bad version {v}")));
        Ok(Self {
            version: number(version)?,
            oldest_compatible: number(oldest_compatible)?,
            written_by,
        })
    }
}

/// The SQLite migrations, in version order.
pub static SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../migrations/sqlite/0001_init.sql"),
        // Breaking: nothing older runs on a new ledger.
        compat: Compat::Breaking,
    },
    Migration {
        version: 2,
        name: "claim_indexes",
        sql: include_str!("../../migrations/sqlite/0002_claim_indexes.sql"),
        // Breaking: drops the indexes the previous release claimed and counted with.
        compat: Compat::Breaking,
    },
    Migration {
        version: 3,
        name: "check_lists",
        sql: include_str!("../../migrations/sqlite/0003_check_lists.sql"),
        // Breaking: rebuilds the attempt, receipt and command tables.
        compat: Compat::Breaking,
    },
    Migration {
        version: 4,
        name: "api_tokens",
        sql: include_str!("../../migrations/sqlite/0004_api_tokens.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 5,
        name: "open_attempts",
        sql: include_str!("../../migrations/sqlite/0005_open_attempts.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 6,
        name: "row_room",
        sql: include_str!("../../migrations/sqlite/0006_row_room.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 7,
        name: "plan_names",
        sql: include_str!("../../migrations/sqlite/0007_plan_names.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 8,
        name: "open_by_command",
        sql: include_str!("../../migrations/sqlite/0008_open_by_command.sql"),
        // Breaking: drops attempt_open, which the previous release's open-attempt count reads.
        compat: Compat::Breaking,
    },
    Migration {
        version: 9,
        name: "delivery_policy",
        sql: include_str!("../../migrations/sqlite/0009_delivery_policy.sql"),
        // Breaking: plans may carry retry policies the previous release would not apply.
        compat: Compat::Breaking,
    },
    Migration {
        version: 10,
        name: "routing",
        sql: include_str!("../../migrations/sqlite/0010_routing.sql"),
        // Breaking: the previous release would claim commands routed to other queues and executors.
        compat: Compat::Breaking,
    },
    Migration {
        version: 11,
        name: "target_limits",
        sql: include_str!("../../migrations/sqlite/0011_target_limits.sql"),
        // Breaking: the previous release would lease commands past their target's limits.
        compat: Compat::Breaking,
    },
    Migration {
        version: 12,
        name: COMPAT_TABLE,
        sql: include_str!("../../migrations/sqlite/0012_schema_compat.sql"),
        compat: Compat::Additive,
    },
    Migration {
        version: 13,
        name: "traces",
        sql: include_str!("../../migrations/sqlite/0013_traces.sql"),
        // Additive: a nullable column the previous release neither reads nor writes.
        compat: Compat::Additive,
    },
    Migration {
        version: 14,
        name: "enqueue_keys",
        sql: include_str!("../../migrations/sqlite/0014_enqueue_keys.sql"),
        // Additive: the previous release writes no key and reads none; a keyed
        // attempt is, to it, an attempt like any other.
        compat: Compat::Additive,
    },
    Migration {
        version: 15,
        name: "producer_role",
        sql: include_str!("../../migrations/sqlite/0015_producer_role.sql"),
        // Additive: the previous release reads and writes tokens as before; a
        // producer token is one it does not know, and refuses.
        compat: Compat::Additive,
    },
    Migration {
        version: 16,
        name: "templates",
        sql: include_str!("../../migrations/sqlite/0016_templates.sql"),
        // Breaking: the previous release would deliver a template's step with its
        // `{"$input": …}` references unresolved, and cannot read a WAITING command.
        compat: Compat::Breaking,
    },
    Migration {
        version: 17,
        name: "plan_targets",
        sql: include_str!("../../migrations/sqlite/0017_plan_targets.sql"),
        // Additive: the previous release neither writes nor reads the column.
        compat: Compat::Additive,
    },
];

/// What a backend provides to [`run`]: the few operations that touch its database.
pub trait MigrationTarget {
    /// Creates the `schema_migrations` table if it does not exist.
    fn ensure_history(&mut self) -> Result<(), LedgerError>;
    /// The versions recorded in `schema_migrations`, any order.
    fn applied_versions(&mut self) -> Result<Vec<u32>, LedgerError>;
    /// Runs one migration's SQL and records its version, name and `applied_at`.
    fn apply(&mut self, migration: &Migration, applied_at: Timestamp) -> Result<(), LedgerError>;
    /// The `schema_compat` row of the newest version it holds (`None` without one).
    fn compat_row(&mut self) -> Result<Option<CompatRow>, LedgerError>;
    /// Records `row` at `written_at` unless a row of its version exists.
    fn record_compat(&mut self, row: &CompatRow, written_at: Timestamp) -> Result<(), LedgerError>;
}

/// Checks that a migration list is well formed: versions start at 1 or later and
/// strictly increase, and the first is breaking (no older code runs on a new schema).
pub fn check_list(migrations: &[Migration]) -> Result<(), LedgerError> {
    if let Some(first) = migrations.first().filter(|m| m.compat != Compat::Breaking) {
        return Err(LedgerError::Internal(format!(
            "migration {} ({}) creates the schema: it must be declared breaking",
            first.version, first.name
        )));
    }
    let mut last = 0u32;
    for m in migrations {
        if m.version <= last {
            return Err(LedgerError::Internal(format!(
                "migration {} ({}) is out of order: versions must strictly increase from 1",
                m.version, m.name
            )));
        }
        last = m.version;
    }
    Ok(())
}

/// The versions of `migrations`, in their order.
pub fn versions(migrations: &[Migration]) -> Vec<u32> {
    migrations.iter().map(|m| m.version).collect()
}

/// The oldest schema version whose code may run on a database migrated up to
/// `newest` with `migrations`: the version of the newest breaking migration at or
/// below `newest` (the additive ones after it change nothing that code relies on);
/// 0 when none is.
pub fn oldest_compatible(migrations: &[Migration], newest: u32) -> u32 {
    migrations
        .iter()
        .filter(|m| m.version <= newest && m.compat == Compat::Breaking)
        .map(|m| m.version)
        .max()
        .unwrap_or(0)
}

/// Whether a database recording `applied` has a schema newer than `migrations` know.
pub fn newer(migrations: &[Migration], applied: &[u32]) -> bool {
    let known = migrations.last().map_or(0, |m| m.version);
    applied.iter().any(|v| *v > known)
}

/// What a migrator does on a database recording `applied`, whose `schema_compat`
/// row of the newest version is `row` (read only when [`newer`]): `Ok(None)` when
/// the schema is not newer than `migrations` (apply [`pending`]); `Ok(Some(row))`
/// when it is newer and this binary may run on it (apply nothing); refused as by
/// [`check_version`] when it may not, or as by [`pending`] when no row describes
/// that version.
pub fn newer_schema(
    migrations: &[Migration],
    applied: &[u32],
    row: Option<&CompatRow>,
) -> Result<Option<CompatRow>, LedgerError> {
    let newest = applied.iter().copied().max().unwrap_or(0);
    match row {
        Some(row) if newer(migrations, applied) && row.version == newest => {
            check_version("the ledger", Some(i64::from(newest)), Some(row), migrations)
        }
        _ => pending(migrations, applied).map(|_| None),
    }
}

/// The migrations still to apply, in version order, given the versions a database
/// records. A recorded version newer than every known one is an integrity error
/// (a migrator checks [`newer`] first).
pub fn pending<'m>(migrations: &'m [Migration], applied: &[u32]) -> Result<Vec<&'m Migration>, LedgerError> {
    check_list(migrations)?;
    let newest_known = migrations.last().map_or(0, |m| m.version);
    if let Some(newest) = applied.iter().copied().filter(|v| *v > newest_known).max() {
        return Err(LedgerError::Integrity(format!(
            "the database records schema version {newest}, newer than the newest this binary knows ({newest_known})"
        )));
    }
    Ok(migrations.iter().filter(|m| !applied.contains(&m.version)).collect())
}

/// Checks that a ledger's recorded schema version (`newest`, the largest in its
/// `schema_migrations`; `None` when empty) is one this binary (`migrations`, release
/// [`RELEASE`]) can use, given the `schema_compat` row of the newest version it holds
/// (`row`). At or below this binary's version: `Ok(None)`. Newer, with a row of that
/// version allowing this binary's schema: `Ok(Some(row))`. Newer otherwise:
/// [`LedgerError::BadInput`] naming the release needed (or, without a row for that
/// version, both versions). `ledger` says which ledger, for the message.
pub fn check_version(
    ledger: &str,
    newest: Option<i64>,
    row: Option<&CompatRow>,
    migrations: &[Migration],
) -> Result<Option<CompatRow>, LedgerError> {
    let known = migrations.last().map_or(0, |m| m.version);
    match newest {
        Some(version) if version > i64::from(known) => match row {
            Some(row) if i64::from(row.version) == version && row.oldest_compatible <= known => Ok(Some(row.clone())),
            Some(row) if i64::from(row.version) == version => Err(LedgerError::BadInput(format!(
                "{ledger} has schema {version}, written by leasehold {by}, which needs the code of schema {oldest} \
                 or later; this binary is leasehold {RELEASE} (schema {known}): upgrade to leasehold {by} or later",
                by = row.written_by,
                oldest = row.oldest_compatible,
            ))),
            _ => Err(LedgerError::BadInput(format!(
                "{ledger} has schema version {version}, newer than this binary's {known}: \
                 use the leasehold release that wrote it"
            ))),
        },
        Some(version) if version < 1 => Err(LedgerError::Integrity(format!(
            "{ledger} records schema version {version}, which no release wrote"
        ))),
        _ => Ok(None),
    }
}

/// The newest version a readiness check compares with this binary's
/// ([`crate::ledger::sql::ready`]): a newer schema that `row` lets this binary run on
/// counts as this binary's own, so that the previous release keeps serving.
pub fn ready_version(
    newest: Option<Option<i64>>,
    row: Option<&CompatRow>,
    migrations: &[Migration],
) -> Option<Option<i64>> {
    let known = migrations.last().map_or(0, |m| m.version);
    match (newest, row) {
        (Some(Some(v)), Some(row))
            if v > i64::from(known) && i64::from(row.version) == v && row.oldest_compatible <= known =>
        {
            Some(Some(i64::from(known)))
        }
        _ => newest,
    }
}

/// The one line that says a ledger runs on `row`'s newer, compatible schema.
pub fn newer_notice(row: &CompatRow, migrations: &[Migration]) -> String {
    let known = migrations.last().map_or(0, |m| m.version);
    format!(
        "the ledger's schema {} (written by leasehold {}) is newer than this binary's {known} and compatible with it \
         (it runs the code of schema {} or later)",
        row.version, row.written_by, row.oldest_compatible
    )
}

/// Applies every pending migration to `target` in version order, recording each at
/// `now`, then the [`CompatRow`] of the schema it leaves, as release `written_by`;
/// answers the versions applied now (empty when up to date). On a newer schema it
/// applies nothing when this binary may run on it, and is refused otherwise
/// ([`check_version`]).
pub fn run<T: MigrationTarget + ?Sized>(
    target: &mut T,
    migrations: &[Migration],
    written_by: &str,
    now: Timestamp,
) -> Result<Vec<u32>, LedgerError> {
    target.ensure_history()?;
    let applied = target.applied_versions()?;
    if newer(migrations, &applied) {
        let row = target.compat_row()?;
        if newer_schema(migrations, &applied, row.as_ref())?.is_some() {
            return Ok(Vec::new());
        }
    }
    let mut done = Vec::new();
    for migration in pending(migrations, &applied)? {
        target.apply(migration, now)?;
        done.push(migration.version);
    }
    if let Some(row) = CompatRow::written(migrations, written_by) {
        target.record_compat(&row, now)?;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn m(version: u32, name: &'static str, compat: Compat) -> Migration {
        Migration {
            version,
            name,
            sql: "",
            compat,
        }
    }

    const LIST: &[Migration] = &[m(1, "init", Compat::Breaking), m(2, COMPAT_TABLE, Compat::Additive)];

    /// A target that records what it was asked to do.
    #[derive(Default)]
    struct Recorder {
        history: bool,
        applied: Vec<(u32, &'static str, Timestamp)>,
        compat: Vec<(CompatRow, Timestamp)>,
    }

    impl MigrationTarget for Recorder {
        fn ensure_history(&mut self) -> Result<(), LedgerError> {
            self.history = true;
            Ok(())
        }
        fn applied_versions(&mut self) -> Result<Vec<u32>, LedgerError> {
            Ok(self.applied.iter().map(|a| a.0).collect())
        }
        fn apply(&mut self, migration: &Migration, applied_at: Timestamp) -> Result<(), LedgerError> {
            self.applied.push((migration.version, migration.name, applied_at));
            Ok(())
        }
        fn compat_row(&mut self) -> Result<Option<CompatRow>, LedgerError> {
            Ok(self.compat.iter().map(|c| c.0.clone()).max_by_key(|r| r.version))
        }
        fn record_compat(&mut self, row: &CompatRow, written_at: Timestamp) -> Result<(), LedgerError> {
            if !self.compat.iter().any(|c| c.0.version == row.version) {
                self.compat.push((row.clone(), written_at));
            }
            Ok(())
        }
    }

    fn row(version: u32, oldest_compatible: u32, by: &str) -> CompatRow {
        CompatRow {
            version,
            oldest_compatible,
            written_by: by.to_owned(),
        }
    }

    #[test]
    fn the_sqlite_list_is_well_formed() {
        check_list(SQLITE).unwrap();
        assert_eq!(SQLITE[0].version, 1);
        assert!(SQLITE[0].sql.contains("CREATE TABLE command"));
        let compat = SQLITE
            .iter()
            .find(|m| m.name == "schema_compat")
            .expect("schema_compat");
        assert!(compat.sql.contains("CREATE TABLE schema_compat"), "{}", compat.sql);
    }

    #[test]
    fn the_oldest_compatible_schema_is_the_newest_breaking_migration_applied() {
        let list = [
            m(1, "init", Compat::Breaking),
            m(2, "index", Compat::Additive),
            m(3, "rebuild", Compat::Breaking),
            m(4, "column", Compat::Additive),
            m(5, "table", Compat::Additive),
        ];
        let answers: Vec<u32> = (1..=5).map(|newest| oldest_compatible(&list, newest)).collect();
        assert_eq!(answers, vec![1, 1, 3, 3, 3]);
        assert_eq!(oldest_compatible(&list, 0), 0);
        assert_eq!(oldest_compatible(&[m(1, "a", Compat::Additive)], 1), 0);
        let breaking_last = [m(1, "init", Compat::Breaking), m(2, "drop", Compat::Breaking)];
        assert_eq!(oldest_compatible(&breaking_last, 2), 2);
        assert_eq!(
            CompatRow::written(&list, "9.9.9"),
            None,
            "no schema_compat table, no row"
        );
        let mut with_table = list.to_vec();
        with_table[1].name = COMPAT_TABLE;
        assert_eq!(CompatRow::written(&with_table, "9.9.9"), Some(row(5, 3, "9.9.9")));
    }

    #[test]
    fn the_shipped_lists_record_their_newest_breaking_migration() {
        // Templates are the newest breaking migration of each list: a ledger this
        // binary migrates refuses the code of the schemas before it, which would run
        // a template's steps with their `$input` references unresolved. What came
        // after them is additive.
        #[allow(unused_mut)]
        let mut lists = vec![(SQLITE, 16, "plan_targets")];
        #[cfg(feature = "postgres")]
        lists.push((crate::ledger::postgres::schema::MIGRATIONS, 11, "sql_enqueue"));
        #[cfg(feature = "mysql")]
        lists.push((crate::ledger::mysql::schema::MIGRATIONS, 12, "sql_enqueue"));
        for (list, templates, newest_name) in lists {
            let row = CompatRow::written(list, RELEASE).unwrap();
            let newest = list.last().unwrap();
            assert_eq!((row.version, newest.name), (templates + 1, newest_name));
            assert_eq!(row.oldest_compatible, templates, "{row:?}");
            assert_eq!(row.written_by, env!("CARGO_PKG_VERSION"));
        }
    }

    #[test]
    fn pending_skips_applied_versions_in_order() {
        let p = pending(LIST, &[1]).unwrap();
        assert_eq!(p.iter().map(|m| m.version).collect::<Vec<_>>(), vec![2]);
        assert!(pending(LIST, &[2, 1]).unwrap().is_empty());
        assert_eq!(pending(LIST, &[]).unwrap().len(), 2);
        assert!(!newer(LIST, &[1, 2]));
        assert!(newer(LIST, &[1, 2, 3]));
    }

    #[test]
    fn a_version_newer_than_the_binary_is_an_integrity_error_for_pending() {
        let e = pending(LIST, &[1, 2, 7]).unwrap_err();
        assert!(matches!(e, LedgerError::Integrity(_)), "{e}");
        assert!(e.to_string().contains("schema version 7"), "{e}");
    }

    #[test]
    fn check_version_accepts_known_schemas_and_newer_compatible_ones() {
        assert_eq!(check_version("x", Some(2), None, LIST).unwrap(), None);
        assert_eq!(check_version("x", Some(1), None, LIST).unwrap(), None);
        assert_eq!(check_version("x", None, None, LIST).unwrap(), None);
        for oldest in [1, 2] {
            let newer = row(3, oldest, "0.3.0");
            assert_eq!(check_version("x", Some(3), Some(&newer), LIST).unwrap(), Some(newer));
        }
        let notice = newer_notice(&row(3, 2, "0.3.0"), LIST);
        assert_eq!(
            notice,
            "the ledger's schema 3 (written by leasehold 0.3.0) is newer than this binary's 2 and compatible \
             with it (it runs the code of schema 2 or later)"
        );
    }

    #[test]
    fn check_version_refuses_an_incompatible_newer_schema_naming_the_release_needed() {
        let e = check_version("the ledger at a.db", Some(4), Some(&row(4, 3, "0.3.0")), LIST).unwrap_err();
        assert!(matches!(e, LedgerError::BadInput(_)), "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "the ledger at a.db has schema 4, written by leasehold 0.3.0, which needs the code of schema 3 \
                 or later; this binary is leasehold {RELEASE} (schema 2): upgrade to leasehold 0.3.0 or later"
            )
        );
    }

    #[test]
    fn check_version_refuses_a_newer_schema_naming_both_versions() {
        // No row, or only an older version's: nothing says this binary may run.
        for stale in [None, Some(row(8, 1, "0.2.0"))] {
            let e = check_version("the ledger at a.db", Some(9), stale.as_ref(), LIST).unwrap_err();
            assert!(matches!(e, LedgerError::BadInput(_)), "{e}");
            assert_eq!(
                e.to_string(),
                "the ledger at a.db has schema version 9, newer than this binary's 2: use the leasehold release that wrote it"
            );
        }
        let e = check_version("x", Some(0), None, LIST).unwrap_err();
        assert!(matches!(e, LedgerError::Integrity(_)), "{e}");
    }

    #[test]
    fn out_of_order_lists_and_an_additive_first_migration_are_refused() {
        let bad = [LIST[1], LIST[0]];
        assert!(check_list(&bad).is_err());
        assert!(check_list(&[m(0, "zero", Compat::Breaking)]).is_err());
        let e = check_list(&[m(1, "init", Compat::Additive)]).unwrap_err();
        assert!(e.to_string().contains("must be declared breaking"), "{e}");
    }

    #[test]
    fn run_is_idempotent_and_answers_what_it_applied() {
        let mut target = Recorder::default();
        let now = Timestamp::from_millis(42);
        assert_eq!(run(&mut target, LIST, "0.1.0", now).unwrap(), vec![1, 2]);
        assert!(target.history);
        assert_eq!(run(&mut target, LIST, "0.1.0", now).unwrap(), Vec::<u32>::new());
        assert_eq!(target.applied, vec![(1, "init", now), (2, COMPAT_TABLE, now)]);
        let mut older = Recorder::default();
        run(&mut older, &LIST[..1], "0.0.9", now).unwrap();
        assert!(older.compat.is_empty(), "a list without the table records no row");
        assert_eq!(target.compat, vec![(row(2, 1, "0.1.0"), now)]);
    }

    #[test]
    fn run_on_a_newer_schema_applies_nothing_when_compatible_and_is_refused_otherwise() {
        let next = [LIST[0], LIST[1], m(3, "column", Compat::Additive)];
        let mut target = Recorder::default();
        let now = Timestamp::from_millis(7);
        run(&mut target, &next, "0.2.0", now).unwrap();
        assert_eq!(run(&mut target, LIST, "0.1.0", now).unwrap(), Vec::<u32>::new());
        let breaking = [next[0], next[1], next[2], m(4, "rebuild", Compat::Breaking)];
        assert_eq!(run(&mut target, &breaking, "0.3.0", now).unwrap(), vec![4]);
        let before = (target.applied.len(), target.compat.len());
        let e = run(&mut target, LIST, "0.1.0", now).unwrap_err();
        assert!(e.to_string().contains("upgrade to leasehold 0.3.0 or later"), "{e}");
        assert_eq!(
            (target.applied.len(), target.compat.len()),
            before,
            "a refused run writes nothing"
        );
        assert_eq!(target.compat.last().unwrap().0, row(4, 4, "0.3.0"));
    }
}
