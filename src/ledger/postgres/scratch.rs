//! Scratch databases for tests and benchmarks: one fresh database each, dropped after.
//!
//! Contract: [`ScratchDatabase::create`] creates `<prefix><16 random hex digits>` on
//! the server of an admin URL (whose own database is only used to connect) and answers
//! the URL of the new database; dropping the value drops the database (`WITH (FORCE)`,
//! ending sessions a failed test left), from a thread of its own so that it works
//! inside or outside a tokio runtime. Nothing here is used by the ledger itself.

use super::error::describe;
use super::PostgresUrl;
use crate::entropy::{Entropy, OsEntropy};
use crate::ledger::LedgerError;

/// A database created for one test or benchmark, dropped when this is dropped.
#[derive(Debug)]
pub struct ScratchDatabase {
    admin: PostgresUrl,
    url: PostgresUrl,
}

async fn admin_statement(admin: &PostgresUrl, sql: String) -> Result<(), LedgerError> {
    let unavailable =
        |e: tokio_postgres::Error| LedgerError::Unavailable(format!("postgres at {admin}: {}", describe(&e)));
    let (client, connection) = admin
        .config()
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(unavailable)?;
    let driver = tokio::spawn(connection);
    let result = client.batch_execute(&sql).await.map_err(unavailable);
    drop(client);
    let _ = driver.await;
    result
}

impl ScratchDatabase {
    /// Creates a fresh, empty database named `prefix` and 16 random hex digits on the
    /// server that `admin` points at.
    pub async fn create(admin: &PostgresUrl, prefix: &str) -> Result<Self, LedgerError> {
        let name = format!("{prefix}{:016x}", OsEntropy.next_u64());
        if name.len() > 63
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(LedgerError::BadInput(format!("{name:?} is not a usable database name")));
        }
        admin_statement(
            admin,
            format!("CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8'"),
        )
        .await?;
        Ok(Self {
            admin: admin.clone(),
            url: admin.with_database(&name),
        })
    }

    /// The URL of the scratch database (the admin URL's server and credentials).
    pub fn url(&self) -> &PostgresUrl {
        &self.url
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.url.database());
        crate::ledger::scratch::drop_database(self.url.database(), async move { admin_statement(&admin, sql).await });
    }
}
