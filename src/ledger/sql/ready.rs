//! Whether a SQL ledger can serve ([`crate::ledger::Ledger::check_ready`]): its
//! schema is at this binary's version, and every table the binary uses answers a
//! query that names every column it reads. Each probe reads no row
//! (`WHERE 1 = 0`), whatever the ledger holds.
//!
//! What is missing is said in one line each, naming a table or a version, never the
//! database, its URL or its contents. A backend runs the probes and tells what its
//! database's error means ([`Absent`]); anything else (the database unreachable)
//! is an error of the check itself.

use super::table::{ATTEMPT, COMMAND, PLAN, RECEIPT};
use crate::ledger::migrate::Migration;

/// One table's probe.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    /// The table.
    pub(crate) table: &'static str,
    /// A query naming every column the binary reads from it, answering no row.
    pub(crate) sql: String,
}

/// Every table the ledger reads or writes, the API tokens' included.
pub(crate) fn probes() -> Vec<Probe> {
    let mut probes: Vec<Probe> = [&PLAN, &ATTEMPT, &COMMAND, &RECEIPT]
        .into_iter()
        .map(|t| Probe {
            table: t.name,
            sql: format!("SELECT {} FROM {} WHERE 1 = 0", t.column_list(None), t.name),
        })
        .collect();
    probes.push(Probe {
        table: "api_token",
        sql: "SELECT * FROM api_token WHERE 1 = 0".to_owned(),
    });
    probes
}

/// What a probe's error says is absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Absent {
    /// The table.
    Table,
    /// A column the binary reads.
    Column,
}

/// The line that says `absent` of `table`.
pub(crate) fn absent(table: &str, absent: Absent) -> String {
    match absent {
        Absent::Table => format!("table {table} is missing"),
        Absent::Column => format!("table {table} lacks a column this binary reads"),
    }
}

/// What is wrong with a schema whose newest recorded version is `newest` (`None`
/// without a `schema_migrations` table, `Some(None)` with an empty one), for a
/// binary that knows `migrations`: nothing when it is the newest this binary knows.
pub(crate) fn version(newest: Option<Option<i64>>, migrations: &[Migration]) -> Option<String> {
    let known = migrations.last().map_or(0, |m| i64::from(m.version));
    match newest {
        None => Some("table schema_migrations is missing: run `leasehold migrate`".to_owned()),
        Some(None) => Some("no schema version is recorded: run `leasehold migrate`".to_owned()),
        Some(Some(v)) if v < known => Some(format!(
            "schema version {v} is older than this binary's {known}: run `leasehold migrate`"
        )),
        Some(Some(v)) if v > known => Some(format!(
            "schema version {v} is newer than this binary's {known}: use the leasehold release that wrote it"
        )),
        Some(Some(_)) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::migrate::SQLITE;

    #[test]
    fn only_this_binarys_version_is_ready() {
        let known = i64::from(SQLITE.last().unwrap().version);
        assert_eq!(version(Some(Some(known)), SQLITE), None);
        for (newest, says) in [
            (None, "table schema_migrations is missing"),
            (Some(None), "no schema version is recorded"),
            (Some(Some(known - 1)), "older than this binary's"),
            (Some(Some(known + 1)), "newer than this binary's"),
        ] {
            let problem = version(newest, SQLITE).expect("a problem");
            assert!(problem.contains(says), "{newest:?}: {problem}");
        }
    }

    #[test]
    fn every_table_is_probed_without_reading_a_row() {
        let probes = probes();
        let tables: Vec<&str> = probes.iter().map(|p| p.table).collect();
        assert_eq!(tables, ["plan", "attempt", "command", "receipt", "api_token"]);
        assert!(probes.iter().all(|p| p.sql.ends_with("WHERE 1 = 0")));
        assert!(probes[1].sql.contains("created_at"), "{}", probes[1].sql);
    }
}
