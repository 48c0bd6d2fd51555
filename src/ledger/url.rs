//! The database URL that picks a ledger: `sqlite://`, `mysql://` or `postgres://`.
//!
//! Contract: [`DbUrl::parse`] answers the backend and its parsed URL, or
//! [`LedgerError::BadInput`] naming the scheme or the shape that is wrong, never the
//! URL's credentials. Each backend's own URL type parses and clamps its options. A
//! scheme whose backend this build leaves out (its Cargo feature is off) is
//! [`LedgerError::BadInput`] naming the feature to enable.

#[cfg(feature = "mysql")]
use super::mysql;
#[cfg(feature = "postgres")]
use super::postgres;
use super::LedgerError;

/// A parsed database URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbUrl {
    /// `sqlite://PATH` (relative or absolute) or `sqlite::memory:`.
    #[cfg(feature = "sqlite")]
    Sqlite(String),
    /// `mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?OPTIONS]` (MySQL or MariaDB).
    #[cfg(feature = "mysql")]
    Mysql(mysql::MysqlUrl),
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?OPTIONS]` (`postgresql://`
    /// too).
    #[cfg(feature = "postgres")]
    Postgres(postgres::PostgresUrl),
}

/// Refuses a `scheme` URL parameter that is not in `known`, naming only the
/// parameter: its value could be a secret put in the wrong place.
#[cfg(any(feature = "mysql", feature = "postgres"))]
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
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(super) fn whole_number(scheme: &str, name: &str, value: &str) -> Result<u64, LedgerError> {
    value
        .parse()
        .map_err(|_| LedgerError::BadInput(format!("--db: {scheme} URL parameter {name:?} must be a whole number")))
}

impl DbUrl {
    /// Parses a database URL; the error names the URL's scheme or shape, never its
    /// credentials.
    pub fn parse(url: &str) -> Result<Self, LedgerError> {
        if url == "sqlite::memory:" || url.starts_with("sqlite://") {
            return parse_sqlite(url);
        }
        if url.starts_with("mysql://") {
            return parse_mysql(url);
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return parse_postgres(url);
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

#[cfg(feature = "sqlite")]
fn parse_sqlite(url: &str) -> Result<DbUrl, LedgerError> {
    match url.strip_prefix("sqlite://") {
        None => Ok(DbUrl::Sqlite(":memory:".to_owned())),
        Some("") => Err(LedgerError::BadInput(
            "--db: sqlite URL has no path (expected sqlite://FILE)".into(),
        )),
        Some(path) => Ok(DbUrl::Sqlite(path.to_owned())),
    }
}

#[cfg(not(feature = "sqlite"))]
fn parse_sqlite(_: &str) -> Result<DbUrl, LedgerError> {
    Err(missing_backend("sqlite"))
}

#[cfg(feature = "mysql")]
fn parse_mysql(url: &str) -> Result<DbUrl, LedgerError> {
    mysql::MysqlUrl::parse(url).map(DbUrl::Mysql)
}

#[cfg(not(feature = "mysql"))]
fn parse_mysql(_: &str) -> Result<DbUrl, LedgerError> {
    Err(missing_backend("mysql"))
}

#[cfg(feature = "postgres")]
fn parse_postgres(url: &str) -> Result<DbUrl, LedgerError> {
    postgres::PostgresUrl::parse(url).map(DbUrl::Postgres)
}

#[cfg(not(feature = "postgres"))]
fn parse_postgres(_: &str) -> Result<DbUrl, LedgerError> {
    Err(missing_backend("postgres"))
}

/// A URL of a backend this build leaves out: names the Cargo feature that adds it.
/// (The binary has every backend, so this is a library caller's error: no `--db`.)
#[cfg(not(all(feature = "sqlite", feature = "mysql", feature = "postgres")))]
fn missing_backend(feature: &str) -> LedgerError {
    LedgerError::BadInput(format!(
        "this build has no {feature} support (enable the `{feature}` feature)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_urls_parse_or_name_what_is_wrong() {
        assert_eq!(DbUrl::parse("sqlite://x.db").unwrap(), DbUrl::Sqlite("x.db".into()));
        assert_eq!(
            DbUrl::parse("sqlite:///tmp/x.db").unwrap(),
            DbUrl::Sqlite("/tmp/x.db".into())
        );
        assert_eq!(
            DbUrl::parse("sqlite::memory:").unwrap(),
            DbUrl::Sqlite(":memory:".into())
        );
        assert!(DbUrl::parse("sqlite://").is_err());
    }

    #[test]
    fn other_schemes_are_named_never_their_credentials() {
        let e = DbUrl::parse("redis://u:secret@h/db").unwrap_err().to_string();
        assert!(
            e.contains("unsupported scheme \"redis\"") && !e.contains("secret"),
            "{e}"
        );
        assert!(e.contains("mysql://"), "{e}");
        assert!(DbUrl::parse("nonsense")
            .unwrap_err()
            .to_string()
            .contains("not a database URL"));
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_urls_parse_without_showing_the_password() {
        let DbUrl::Postgres(u) = DbUrl::parse("postgresql://app:secret@db.internal/outbox").unwrap() else {
            panic!("expected a postgres URL");
        };
        assert_eq!((u.host(), u.port(), u.database()), ("db.internal", 5432, "outbox"));
        assert!(!format!("{u:?} {u}").contains("secret"));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_urls_parse_or_name_what_is_wrong() {
        let DbUrl::Mysql(u) = DbUrl::parse("mysql://app:secret@db.internal:3307/outbox?pool_max=4").unwrap() else {
            panic!("expected a mysql URL");
        };
        assert_eq!(
            (u.host.as_str(), u.port, u.database.as_str()),
            ("db.internal", 3307, "outbox")
        );
        assert_eq!(u.options.pool_max, 4);
        assert!(!format!("{u:?} {u}").contains("secret"));
        let e = DbUrl::parse("mysql://app:secret@db.internal:3307")
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no database") && !e.contains("secret"), "{e}");
    }

    /// A URL of a backend the build leaves out names the feature, never the password.
    #[cfg(not(all(feature = "sqlite", feature = "mysql", feature = "postgres")))]
    #[test]
    fn a_left_out_backend_names_its_feature() {
        let urls = [
            (cfg!(feature = "sqlite"), "sqlite", "sqlite://x.db"),
            (cfg!(feature = "mysql"), "mysql", "mysql://app:secret@h/db"),
            (cfg!(feature = "postgres"), "postgres", "postgres://app:secret@h/db"),
        ];
        for (_, feature, url) in urls.into_iter().filter(|(built, _, _)| !built) {
            let e = DbUrl::parse(url).unwrap_err().to_string();
            let expected = format!("this build has no {feature} support (enable the `{feature}` feature)");
            assert_eq!(e, expected, "{url}");
        }
    }
}
