//! How a SQLite ledger file is opened: for writing (creating it only for `migrate`)
//! or read-only, and checked before any call runs.
//!
//! Contract:
//! - [`OpenMode::Create`] (migrate, demo, bench) creates a missing file, as SQLite
//!   does; [`OpenMode::Existing`] (every other write) and [`OpenMode::ReadOnly`]
//!   (every read) never create one: a missing file is "no ledger at PATH: run
//!   `leasehold migrate`" ([`LedgerError::BadInput`], exit 2 in the CLI);
//! - a read-only open uses `SQLITE_OPEN_READ_ONLY` and sets no pragma that writes
//!   (no `journal_mode`), so a read never changes the file, and a file the process
//!   may only read can still be listed; in a directory it may not write either (no
//!   `-shm` can be made, and none exists, so no process has the ledger open), the
//!   file is read as immutable;
//! - a directory or a file that is not a SQLite database is refused naming the path
//!   ([`LedgerError::BadInput`]);
//! - except for [`OpenMode::Create`], the schema version is checked on every open
//!   ([`check_schema`]): a ledger without the schema, or from a newer release whose
//!   schema this binary may not run on ([`migrate::check_version`]), is refused
//!   before anything is read or written.

use super::super::migrate::{self, CompatRow, SQLITE};
use super::super::LedgerError;
use leasehold_engine::Timestamp;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension};
use std::path::Path;

/// What an open may do to the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Read and write, creating the file if it is missing (migrate, demo, bench).
    Create,
    /// Read and write an existing, migrated ledger.
    Existing,
    /// Only read an existing, migrated ledger; never write or create anything.
    ReadOnly,
}

/// Opens a connection to `path` in `mode`; for a private in-memory database (`private`)
/// the mode is moot. Refuses a missing file (unless creating), a directory and a
/// file that is not a SQLite database, naming the path; checks the schema version
/// unless creating.
pub(super) fn connect(path: &str, mode: OpenMode, private: bool) -> Result<Connection, LedgerError> {
    let uri = path.starts_with("file:");
    if !private && !uri {
        let file = Path::new(path);
        if file.is_dir() {
            return Err(LedgerError::BadInput(format!(
                "{path} is a directory, not a ledger file"
            )));
        }
        if mode != OpenMode::Create && !file.exists() {
            return Err(LedgerError::BadInput(format!(
                "no ledger at {path}: run `leasehold migrate` to create one"
            )));
        }
    }
    let access = match mode {
        OpenMode::Create => OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        OpenMode::Existing if private => OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        OpenMode::Existing => OpenFlags::SQLITE_OPEN_READ_WRITE,
        OpenMode::ReadOnly if private => OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        OpenMode::ReadOnly => OpenFlags::SQLITE_OPEN_READ_ONLY,
    };
    let flags = access | OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| open_error(path, &e))?;
    // Reading the schema is the first thing that touches the file: a file that is
    // not a database fails here, before any pragma.
    let conn = match probe(&conn) {
        Ok(()) => conn,
        Err(e) if mode == OpenMode::ReadOnly && !private && !uri && cannot_share_wal(path, &e) => {
            drop(conn);
            immutable(path).map_err(|e| open_error(path, &e))?
        }
        Err(e) => return Err(open_error(path, &e)),
    };
    if mode != OpenMode::Create && !private {
        check_schema(&conn, path)?;
    }
    Ok(conn)
}

/// Reads the schema table: the first read, which fails on a file that is not a database.
fn probe(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get::<_, i64>(0))
        .map(drop)
}

/// Whether a read-only open of a WAL ledger failed only because SQLite could not
/// create its `-shm` side file (a directory this process may not write) while no
/// `-shm` exists: then no process has the ledger open in WAL mode, nothing is
/// writing it, and the file may be read as it is.
fn cannot_share_wal(path: &str, e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen))
        && !Path::new(&format!("{path}-shm")).exists()
}

/// Opens `path` read-only as an immutable file: no lock, no side file.
fn immutable(path: &str) -> rusqlite::Result<Connection> {
    let mut uri = String::from("file:");
    for c in path.chars() {
        match c {
            '%' | '?' | '#' => uri.push_str(&format!("%{:02X}", c as u32)),
            c => uri.push(c),
        }
    }
    uri.push_str("?immutable=1");
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(uri, flags)?;
    probe(&conn)?;
    Ok(conn)
}

/// Refuses a ledger whose schema this binary cannot use: no `schema_migrations`
/// table (never migrated), or a recorded version newer than the newest known that
/// this binary may not run on ([`migrate::check_version`]). Answers the newest
/// version recorded (`None` for an empty history).
pub fn check_schema(conn: &Connection, path: &str) -> Result<Option<i64>, LedgerError> {
    checked_schema(conn, path).map(|(newest, _)| newest)
}

/// The one-line notice that the ledger at `path` runs on a newer, compatible schema
/// (`None` when its schema is this binary's or older, or absent: opening refuses
/// that); refused as [`check_schema`].
pub(super) fn schema_notice(conn: &Connection, path: &str) -> Result<Option<String>, LedgerError> {
    if schema_version(conn).map_err(|e| open_error(path, &e))?.is_none() {
        return Ok(None);
    }
    let (_, newer) = checked_schema(conn, path)?;
    Ok(newer.map(|row| migrate::newer_notice(&row, SQLITE)))
}

/// [`check_schema`]'s newest version, with the `schema_compat` row of a newer,
/// compatible schema.
fn checked_schema(conn: &Connection, path: &str) -> Result<(Option<i64>, Option<CompatRow>), LedgerError> {
    let Some(newest) = schema_version(conn).map_err(|e| open_error(path, &e))? else {
        return Err(LedgerError::BadInput(format!(
            "{path} holds no leasehold schema: run `leasehold migrate`"
        )));
    };
    let row = row_if_newer(conn, newest).map_err(|e| open_error(path, &e))?;
    let newer = migrate::check_version(&format!("the ledger at {path}"), newest, row.as_ref(), SQLITE)?;
    Ok((newest, newer))
}

/// The newest schema version as a readiness check compares it
/// ([`migrate::ready_version`]): a newer schema this binary may run on counts as its own.
pub(super) fn ready_version(conn: &Connection) -> rusqlite::Result<Option<Option<i64>>> {
    let newest = schema_version(conn)?;
    let row = row_if_newer(conn, newest.flatten())?;
    Ok(migrate::ready_version(newest, row.as_ref(), SQLITE))
}

/// The `schema_compat` row of the newest version when `newest` is newer than this
/// binary's schema (`None` otherwise: nothing is read).
fn row_if_newer(conn: &Connection, newest: Option<i64>) -> rusqlite::Result<Option<CompatRow>> {
    let known = SQLITE.last().map_or(0, |m| i64::from(m.version));
    match newest {
        Some(v) if v > known => compat_row(conn),
        _ => Ok(None),
    }
}

/// The `schema_compat` row of the newest version recorded: `None` without that
/// table or a row. Reads only the columns whose format is stable.
pub(super) fn compat_row(conn: &Connection) -> rusqlite::Result<Option<CompatRow>> {
    if !has_table(conn, migrate::COMPAT_TABLE)? {
        return Ok(None);
    }
    conn.query_row(migrate::NEWEST_COMPAT_ROW, [], |row| {
        Ok(CompatRow {
            version: row.get(0)?,
            oldest_compatible: row.get(1)?,
            written_by: row.get(2)?,
        })
    })
    .optional()
}

/// Records `row` at `written_at` unless a row of its version exists.
pub(super) fn record_compat(conn: &Connection, row: &CompatRow, written_at: Timestamp) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT OR IGNORE INTO schema_compat (version, oldest_compatible, written_by, written_at) VALUES (?1, ?2, ?3, ?4)",
        rusqlite::params![row.version, row.oldest_compatible, row.written_by, written_at.as_millis()],
    )
    .map(drop)
}

fn has_table(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [name],
        |row| row.get::<_, i64>(0),
    )
    .optional()
    .map(|found| found.is_some())
}

/// The newest schema version `schema_migrations` records: `None` without that table
/// (never migrated), `Some(None)` with an empty one.
pub(super) fn schema_version(conn: &Connection) -> rusqlite::Result<Option<Option<i64>>> {
    if !has_table(conn, "schema_migrations")? {
        return Ok(None);
    }
    conn.query_row("SELECT max(version) FROM schema_migrations", [], |row| row.get(0))
        .map(Some)
}

/// An open failure as a one-line error naming the path: bad input when the file is
/// not a usable database, unavailable when it is busy, internal otherwise.
fn open_error(path: &str, e: &rusqlite::Error) -> LedgerError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => {
            LedgerError::BadInput(format!("{path} is not a SQLite database (or it is damaged)"))
        }
        Some(ErrorCode::CannotOpen) => LedgerError::BadInput(format!("cannot open the ledger at {path}: {e}")),
        Some(ErrorCode::PermissionDenied | ErrorCode::ReadOnly) => {
            LedgerError::BadInput(format!("cannot use the ledger at {path}: {e}"))
        }
        Some(ErrorCode::DatabaseCorrupt) => LedgerError::Integrity(format!("the ledger at {path} is damaged: {e}")),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            LedgerError::Unavailable(format!("the ledger at {path} is busy: {e}"))
        }
        _ => LedgerError::Internal(format!("cannot open the ledger at {path}: {e}")),
    }
}
