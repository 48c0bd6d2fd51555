//! The `api_token` table on MySQL / MariaDB: one statement per operation, on a plain
//! pooled connection.

use super::{name_taken, no_table, Role, TokenInfo, TokenStore};
use crate::ledger::mysql::MysqlLedger;
use crate::ledger::LedgerError;
use leasehold_engine::Timestamp;
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

/// The server's "no such table" and "duplicate entry" errors.
const ER_NO_SUCH_TABLE: u16 = 1146;
const ER_DUP_ENTRY: u16 = 1062;

fn error(e: mysql_async::Error) -> LedgerError {
    match &e {
        mysql_async::Error::Server(s) if s.code == ER_NO_SUCH_TABLE => no_table(),
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => {
            LedgerError::Unavailable(format!("mysql api_token: {e}"))
        }
        _ => LedgerError::Internal(format!("mysql api_token: {e}")),
    }
}

type Row = (String, String, i64, Option<i64>);

fn info((name, role, created, revoked): Row) -> Result<TokenInfo, LedgerError> {
    Ok(TokenInfo {
        name,
        role: role
            .parse::<Role>()
            .map_err(|_| LedgerError::Integrity(format!("api_token: unknown role {role:?}")))?,
        created_at: Timestamp::from_millis(created),
        revoked_at: revoked.map(Timestamp::from_millis),
    })
}

const SELECT: &str = "SELECT name, role, created_at, revoked_at FROM api_token";

/// Inserts a token; a name or hash already present is refused.
pub(crate) async fn add(
    conn: &mut Conn,
    name: &str,
    role: Role,
    hash: &str,
    now: Timestamp,
) -> Result<TokenInfo, LedgerError> {
    let inserted = conn
        .exec_drop(
            "INSERT INTO api_token (name, role, sha256, created_at) VALUES (?, ?, ?, ?)",
            (name, role.as_str(), hash, now.as_millis()),
        )
        .await;
    match inserted {
        Ok(()) => Ok(TokenInfo {
            name: name.to_owned(),
            role,
            created_at: now,
            revoked_at: None,
        }),
        Err(mysql_async::Error::Server(s)) if s.code == ER_DUP_ENTRY => Err(name_taken(name)),
        Err(e) => Err(error(e)),
    }
}

/// Every token, oldest first.
pub(crate) async fn list(conn: &mut Conn) -> Result<Vec<TokenInfo>, LedgerError> {
    let rows: Vec<Row> = conn
        .query(format!("{SELECT} ORDER BY created_at, name"))
        .await
        .map_err(error)?;
    rows.into_iter().map(info).collect()
}

/// Revokes a token by name (idempotent).
pub(crate) async fn revoke(conn: &mut Conn, name: &str, now: Timestamp) -> Result<TokenInfo, LedgerError> {
    conn.exec_drop(
        "UPDATE api_token SET revoked_at = COALESCE(revoked_at, ?) WHERE name = ?",
        (now.as_millis(), name),
    )
    .await
    .map_err(error)?;
    let row: Option<Row> = conn
        .exec_first(format!("{SELECT} WHERE name = ?"), (name,))
        .await
        .map_err(error)?;
    row.map(info).unwrap_or_else(|| {
        Err(LedgerError::NotFound {
            kind: "token",
            id: name.to_owned(),
        })
    })
}

/// The active token with this hash.
pub(crate) async fn by_hash(conn: &mut Conn, hash: &str) -> Result<Option<TokenInfo>, LedgerError> {
    let row: Option<Row> = conn
        .exec_first(format!("{SELECT} WHERE sha256 = ? AND revoked_at IS NULL"), (hash,))
        .await
        .map_err(error)?;
    row.map(info).transpose()
}

impl TokenStore for MysqlLedger {
    async fn add_token(&self, name: &str, role: Role, hash: &str, now: Timestamp) -> Result<TokenInfo, LedgerError> {
        super::check_name(name)?;
        add(&mut self.pooled_connection().await?, name, role, hash, now).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, LedgerError> {
        list(&mut self.pooled_connection().await?).await
    }

    async fn revoke_token(&self, name: &str, now: Timestamp) -> Result<TokenInfo, LedgerError> {
        revoke(&mut self.pooled_connection().await?, name, now).await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenInfo>, LedgerError> {
        by_hash(&mut self.pooled_connection().await?, hash).await
    }
}
