//! Versioned schema migrations, shared by the SQL ledgers.
//!
//! Contract: a backend's migrations are a static, strictly increasing list of
//! [`Migration`]s (version ≥ 1, name, SQL) embedded in the binary with `include_str!`
//! from `migrations/<backend>/NNNN_name.sql`. A `schema_migrations(version, name,
//! applied_at)` table records what was applied. Applying is idempotent: versions
//! already recorded are skipped, and [`run`] answers only the versions applied now. A
//! database that records a version newer than the binary knows is refused with
//! [`LedgerError::Integrity`] before anything is applied, because this binary cannot
//! know what that schema means.
//!
//! The version logic is backend-neutral: [`pending`] is a pure function, and [`run`]
//! drives any [`MigrationTarget`] (a synchronous backend). An asynchronous backend can
//! read its recorded versions itself, call [`pending`], and apply the answer in order.
//! The backend is responsible for serializing concurrent migrators (SQLite: the whole
//! run inside one `BEGIN IMMEDIATE` transaction).

use super::LedgerError;
use leasehold_engine::Timestamp;

/// One schema migration: a version, a short name and the SQL that applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Strictly increasing, starting at 1; the `NNNN` of its file name.
    pub version: u32,
    /// The `name` of its file name (`0001_init.sql` → `init`).
    pub name: &'static str,
    /// The SQL script, possibly several statements.
    pub sql: &'static str,
}

/// The SQLite migrations, in version order.
pub static SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../migrations/sqlite/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "claim_indexes",
        sql: include_str!("../../migrations/sqlite/0002_claim_indexes.sql"),
    },
    Migration {
        version: 3,
        name: "check_lists",
        sql: include_str!("../../migrations/sqlite/0003_check_lists.sql"),
    },
    Migration {
        version: 4,
        name: "api_tokens",
        sql: include_str!("../../migrations/sqlite/0004_api_tokens.sql"),
    },
    Migration {
        version: 5,
        name: "open_attempts",
        sql: include_str!("../../migrations/sqlite/0005_open_attempts.sql"),
    },
    Migration {
        version: 6,
        name: "row_room",
        sql: include_str!("../../migrations/sqlite/0006_row_room.sql"),
    },
    Migration {
        version: 7,
        name: "plan_names",
        sql: include_str!("../../migrations/sqlite/0007_plan_names.sql"),
    },
    Migration {
        version: 8,
        name: "open_by_command",
        sql: include_str!("../../migrations/sqlite/0008_open_by_command.sql"),
    },
    Migration {
        version: 9,
        name: "delivery_policy",
        sql: include_str!("../../migrations/sqlite/0009_delivery_policy.sql"),
    },
    Migration {
        version: 10,
        name: "routing",
        sql: include_str!("../../migrations/sqlite/0010_routing.sql"),
    },
    Migration {
        version: 11,
        name: "target_limits",
        sql: include_str!("../../migrations/sqlite/0011_target_limits.sql"),
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
}

/// Checks that a migration list is well formed: versions start at 1 or later and
/// strictly increase.
pub fn check_list(migrations: &[Migration]) -> Result<(), LedgerError> {
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

/// The migrations still to apply, in version order, given the versions a database
/// records. A recorded version newer than every known one is an integrity error.
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

/// Checks, on every open, that a ledger's recorded schema version (`newest`, the
/// largest in its `schema_migrations`; `None` when empty) is one this binary can use:
/// a newer one is refused as [`LedgerError::BadInput`] naming both versions.
/// `ledger` says which ledger, for the message.
pub fn check_version(ledger: &str, newest: Option<i64>, migrations: &[Migration]) -> Result<(), LedgerError> {
    let known = migrations.last().map_or(0, |m| m.version);
    match newest {
        Some(version) if version > i64::from(known) => Err(LedgerError::BadInput(format!(
            "{ledger} has schema version {version}, newer than this binary's {known}: use the leasehold release that wrote it"
        ))),
        Some(version) if version < 1 => Err(LedgerError::Integrity(format!(
            "{ledger} records schema version {version}, which no release wrote"
        ))),
        _ => Ok(()),
    }
}

/// Applies every pending migration to `target` in version order, recording each at
/// `now`; answers the versions applied now (empty when up to date).
pub fn run<T: MigrationTarget + ?Sized>(
    target: &mut T,
    migrations: &[Migration],
    now: Timestamp,
) -> Result<Vec<u32>, LedgerError> {
    target.ensure_history()?;
    let applied = target.applied_versions()?;
    let mut done = Vec::new();
    for migration in pending(migrations, &applied)? {
        target.apply(migration, now)?;
        done.push(migration.version);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &[Migration] = &[
        Migration {
            version: 1,
            name: "init",
            sql: "a",
        },
        Migration {
            version: 2,
            name: "more",
            sql: "b",
        },
    ];

    /// A target that records what it was asked to do.
    #[derive(Default)]
    struct Recorder {
        history: bool,
        applied: Vec<(u32, &'static str, Timestamp)>,
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
    }

    #[test]
    fn the_sqlite_list_is_well_formed() {
        check_list(SQLITE).unwrap();
        assert_eq!(SQLITE[0].version, 1);
        assert!(SQLITE[0].sql.contains("CREATE TABLE command"));
    }

    #[test]
    fn pending_skips_applied_versions_in_order() {
        let p = pending(LIST, &[1]).unwrap();
        assert_eq!(p.iter().map(|m| m.version).collect::<Vec<_>>(), vec![2]);
        assert!(pending(LIST, &[2, 1]).unwrap().is_empty());
        assert_eq!(pending(LIST, &[]).unwrap().len(), 2);
    }

    #[test]
    fn a_version_newer_than_the_binary_is_an_integrity_error() {
        let e = pending(LIST, &[1, 2, 7]).unwrap_err();
        assert!(matches!(e, LedgerError::Integrity(_)), "{e}");
        assert!(e.to_string().contains("schema version 7"), "{e}");
    }

    #[test]
    fn check_version_refuses_a_newer_schema_naming_both_versions() {
        assert!(check_version("x", Some(2), LIST).is_ok());
        assert!(check_version("x", Some(1), LIST).is_ok());
        assert!(check_version("x", None, LIST).is_ok());
        let e = check_version("the ledger at a.db", Some(9), LIST).unwrap_err();
        assert!(matches!(e, LedgerError::BadInput(_)), "{e}");
        assert_eq!(
            e.to_string(),
            "the ledger at a.db has schema version 9, newer than this binary's 2: use the leasehold release that wrote it"
        );
    }

    #[test]
    fn out_of_order_lists_are_refused() {
        let bad = [LIST[1], LIST[0]];
        assert!(check_list(&bad).is_err());
        assert!(check_list(&[Migration {
            version: 0,
            name: "zero",
            sql: ""
        }])
        .is_err());
    }

    #[test]
    fn run_is_idempotent_and_answers_what_it_applied() {
        let mut target = Recorder::default();
        let now = Timestamp::from_millis(42);
        assert_eq!(run(&mut target, LIST, now).unwrap(), vec![1, 2]);
        assert!(target.history);
        assert_eq!(run(&mut target, LIST, now).unwrap(), Vec::<u32>::new());
        assert_eq!(target.applied, vec![(1, "init", now), (2, "more", now)]);
    }
}
