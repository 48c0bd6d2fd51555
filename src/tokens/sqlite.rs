//! The `api_token` table on SQLite: one statement per operation, on a plain
//! connection.

use super::{name_taken, no_table, Role, TokenInfo, TokenStore};
use crate::ledger::sqlite::SqliteLedger;
use crate::ledger::LedgerError;
use leasehold_engine::Timestamp;
use rusqlite::{params, Connection, OptionalExtension, Row};

fn error(e: rusqlite::Error) -> LedgerError {
    let text = e.to_string();
    match &e {
        _ if text.contains("no such table: api_token") => no_table(),
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ) =>
        {
            LedgerError::Unavailable(format!("sqlite: {text}"))
        }
        _ => LedgerError::Internal(format!("sqlite api_token: {text}")),
    }
}

fn token(row: &Row<'_>) -> rusqlite::Result<(String, String, i64, Option<i64>)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

fn info((name, role, created, revoked): (String, String, i64, Option<i64>)) -> Result<TokenInfo, LedgerError> {
    Ok(TokenInfo {
        name,
        role: role
            .parse::<Role>()
            .map_err(|_| LedgerError::Integrity(format!("api_token: unknown role {role:?}")))?,
        created_at: Timestamp::from_millis(created),
        revoked_at: revoked.map(Timestamp::from_millis),
    })
}

const COLUMNS: &str = "name, role, created_at, revoked_at";

/// Inserts a token; a name or hash already present is refused.
pub(crate) fn add(
    conn: &Connection,
    name: &str,
    role: Role,
    hash: &str,
    now: Timestamp,
) -> Result<TokenInfo, LedgerError> {
    let inserted = conn.execute(
        "INSERT INTO api_token (name, role, sha256, created_at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
        params![name, role.as_str(), hash, now.as_millis()],
    );
    match inserted.map_err(error)? {
        0 => Err(name_taken(name)),
        _ => Ok(TokenInfo {
            name: name.to_owned(),
            role,
            created_at: now,
            revoked_at: None,
        }),
    }
}

/// Every token, oldest first.
pub(crate) fn list(conn: &Connection) -> Result<Vec<TokenInfo>, LedgerError> {
    let mut statement = conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM api_token ORDER BY created_at, name"))
        .map_err(error)?;
    let rows = statement.query_map([], token).map_err(error)?;
    rows.map(|r| r.map_err(error).and_then(info)).collect()
}

/// Revokes a token by name (idempotent).
pub(crate) fn revoke(conn: &Connection, name: &str, now: Timestamp) -> Result<TokenInfo, LedgerError> {
    let row = conn
        .query_row(
            &format!("UPDATE api_token SET revoked_at = COALESCE(revoked_at, ?2) WHERE name = ?1 RETURNING {COLUMNS}"),
            params![name, now.as_millis()],
            token,
        )
        .optional()
        .map_err(error)?;
    row.map(info).unwrap_or_else(|| {
        Err(LedgerError::NotFound {
            kind: "token",
            id: name.to_owned(),
        })
    })
}

/// The active token with this hash.
pub(crate) fn by_hash(conn: &Connection, hash: &str) -> Result<Option<TokenInfo>, LedgerError> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM api_token WHERE sha256 = ?1 AND revoked_at IS NULL"
    ))
    .map_err(error)?
    .query_row([hash], token)
    .optional()
    .map_err(error)?
    .map(info)
    .transpose()
}

impl TokenStore for SqliteLedger {
    async fn add_token(&self, name: &str, role: Role, hash: &str, now: Timestamp) -> Result<TokenInfo, LedgerError> {
        super::check_name(name)?;
        let (name, hash) = (name.to_owned(), hash.to_owned());
        self.write_with(move |conn| add(conn, &name, role, &hash, now)).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, LedgerError> {
        self.read_with(list).await
    }

    async fn revoke_token(&self, name: &str, now: Timestamp) -> Result<TokenInfo, LedgerError> {
        let name = name.to_owned();
        self.write_with(move |conn| revoke(conn, &name, now)).await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenInfo>, LedgerError> {
        let hash = hash.to_owned();
        self.read_with(move |conn| by_hash(conn, &hash)).await
    }
}
