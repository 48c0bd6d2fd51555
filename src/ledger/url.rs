//! The database URL that picks a ledger: `sqlite://`, `mysql://` or `postgres://`.
//!
//! Contract: [`DbUrl::parse`] answers the backend and its parsed URL, or
//! [`LedgerError::BadInput`] naming the scheme or the shape that is wrong, never the
//! URL's credentials. Each backend's own URL type parses and clamps its options.

use super::{mysql, postgres, LedgerError};

/// A parsed database URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbUrl {
    /// `sqlite://PATH` (relative or absolute) or `sqlite::memory:`.
    Sqlite(String),
    /// `mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?OPTIONS]` (MySQL or MariaDB).
    Mysql(mysql::MysqlUrl),
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?OPTIONS]` (`postgresql://`
    /// too).
    Postgres(postgres::PostgresUrl),
}

/// Refuses a `scheme` URL parameter that is not in `known`, naming only the
/// parameter: its value could be a secret put in the wrong place.
pub(super) fn known_parameter(scheme: &str, name: &str, known: &[&str]) -> Result<(), LedgerError> {
    if known.contains(&name) {
        return Ok(());
    }
    Err(LedgerError::BadInput(format!(
        "--db: unknown {scheme} URL parameter {name:?} (known: {})",
        known.join(", ")
    )))
}

/// A `scheme` URL parameter's whole number.
pub(super) fn whole_number(scheme: &str, name: &str, value: &str) -> Result<u64, LedgerError> {
    value
        .parse()
        .map_err(|_| LedgerError::BadInput(format!("--db: {scheme} URL parameter {name:?} must be a whole number")))
}

impl DbUrl {
    /// Parses a database URL; the error names the URL's scheme or shape, never its
    /// credentials.
    pub fn parse(url: &str) -> Result<Self, LedgerError> {
        if url == "sqlite::memory:" {
            return Ok(DbUrl::Sqlite(":memory:".to_owned()));
        }
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(LedgerError::BadInput(
                    "--db: sqlite URL has no path (expected sqlite://FILE)".into(),
                ));
            }
            return Ok(DbUrl::Sqlite(path.to_owned()));
        }
        if url.starts_with("mysql://") {
            return mysql::MysqlUrl::parse(url).map(DbUrl::Mysql);
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return postgres::PostgresUrl::parse(url).map(DbUrl::Postgres);
        }
        let scheme = url.split_once("://").map(|(s, _)| s);
        Err(LedgerError::BadInput(match scheme {
            Some(s) if !s.is_empty() => {
                format!("--db: unsupported scheme {s:?} (expected sqlite://FILE, mysql://USER@HOST/DB or postgres://USER@HOST/DB)")
            }
            _ => "--db: not a database URL (expected sqlite://FILE, mysql://USER@HOST/DB or postgres://USER@HOST/DB)"
                .to_owned(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_name_what_is_wrong() {
        assert_eq!(DbUrl::parse("sqlite://x.db").unwrap(), DbUrl::Sqlite("x.db".into()));
        assert_eq!(
            DbUrl::parse("sqlite:///tmp/x.db").unwrap(),
            DbUrl::Sqlite("/tmp/x.db".into())
        );
        assert_eq!(
            DbUrl::parse("sqlite::memory:").unwrap(),
            DbUrl::Sqlite(":memory:".into())
        );
        let e = DbUrl::parse("redis://u:secret@h/db").unwrap_err().to_string();
        assert!(
            e.contains("unsupported scheme \"redis\"") && !e.contains("secret"),
            "{e}"
        );
        match DbUrl::parse("postgresql://app:secret@db.internal/outbox").unwrap() {
            DbUrl::Postgres(u) => {
                assert_eq!((u.host(), u.port(), u.database()), ("db.internal", 5432, "outbox"));
                assert!(!format!("{u:?} {u}").contains("secret"));
            }
            other => panic!("expected a postgres URL, got {other:?}"),
        }
        assert!(DbUrl::parse("nonsense")
            .unwrap_err()
            .to_string()
            .contains("not a database URL"));
        assert!(DbUrl::parse("sqlite://").is_err());
        assert!(e.contains("mysql://"), "{e}");
        match DbUrl::parse("mysql://app:secret@db.internal:3307/outbox?pool_max=4").unwrap() {
            DbUrl::Mysql(u) => {
                assert_eq!(
                    (u.host.as_str(), u.port, u.database.as_str()),
                    ("db.internal", 3307, "outbox")
                );
                assert_eq!(u.options.pool_max, 4);
                assert!(!format!("{u:?} {u}").contains("secret"));
            }
            other => panic!("expected a mysql URL, got {other:?}"),
        }
        let e = DbUrl::parse("mysql://app:secret@db.internal:3307")
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no database") && !e.contains("secret"), "{e}");
    }
}
