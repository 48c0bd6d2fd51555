//! The `api_token` table on PostgreSQL: one statement per operation, on a pooled
//! session of the ledger.

use super::{name_taken, no_table, Role, TokenInfo, TokenStore};
use crate::ledger::postgres::PostgresLedger;
use crate::ledger::LedgerError;
use leasehold_engine::Timestamp;
use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

fn error(e: tokio_postgres::Error) -> LedgerError {
    match e.code() {
        Some(code) if *code == SqlState::UNDEFINED_TABLE => no_table(),
        Some(_) => LedgerError::Internal(format!("postgres api_token: {}", describe(&e))),
        None => LedgerError::Unavailable(format!("postgres api_token: {e}")),
    }
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

fn info(row: &Row) -> Result<TokenInfo, LedgerError> {
    let bad = |column: &str| LedgerError::Integrity(format!("api_token row: column {column}: unexpected value"));
    let name: String = row.try_get(0).map_err(|_| bad("name"))?;
    let role: String = row.try_get(1).map_err(|_| bad("role"))?;
    let created: i64 = row.try_get(2).map_err(|_| bad("created_at"))?;
    let revoked: Option<i64> = row.try_get(3).map_err(|_| bad("revoked_at"))?;
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

impl TokenStore for PostgresLedger {
    async fn add_token(&self, name: &str, role: Role, hash: &str, now: Timestamp) -> Result<TokenInfo, LedgerError> {
        super::check_name(name)?;
        let client = self.session().await?;
        let inserted = client
            .execute(
                "INSERT INTO api_token (name, role, sha256, created_at) VALUES ($1, $2, $3, $4)",
                &[&name, &role.as_str(), &hash, &now.as_millis()],
            )
            .await;
        match inserted {
            Ok(_) => Ok(TokenInfo {
                name: name.to_owned(),
                role,
                created_at: now,
                revoked_at: None,
            }),
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => Err(name_taken(name)),
            Err(e) => Err(error(e)),
        }
    }

    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, LedgerError> {
        let client = self.session().await?;
        let rows = client
            .query(&format!("{SELECT} ORDER BY created_at, name"), &[])
            .await
            .map_err(error)?;
        rows.iter().map(info).collect()
    }

    async fn revoke_token(&self, name: &str, now: Timestamp) -> Result<TokenInfo, LedgerError> {
        let client = self.session().await?;
        let row = client
            .query_opt(
                "UPDATE api_token SET revoked_at = COALESCE(revoked_at, $1) WHERE name = $2 \
                 RETURNING name, role, created_at, revoked_at",
                &[&now.as_millis(), &name],
            )
            .await
            .map_err(error)?;
        match row {
            Some(row) => info(&row),
            None => Err(LedgerError::NotFound {
                kind: "token",
                id: name.to_owned(),
            }),
        }
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenInfo>, LedgerError> {
        let client = self.session().await?;
        let row = client
            .query_opt(&format!("{SELECT} WHERE sha256 = $1 AND revoked_at IS NULL"), &[&hash])
            .await
            .map_err(error)?;
        row.as_ref().map(info).transpose()
    }
}
