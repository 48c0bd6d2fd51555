//! Scratch databases for tests and benchmarks: one fresh database each, dropped after.
//!
//! Contract: [`ScratchDatabase::create`] creates `<prefix><16 random hex digits>` on
//! the server of an admin URL (whose own database is only used to connect) and answers
//! the URL of the new database; dropping the value drops the database, from a thread
//! of its own so that it works inside or outside a tokio runtime. Nothing here is used
//! by the ledger itself.

use super::MysqlUrl;
use crate::entropy::{Entropy, OsEntropy};
use crate::ledger::LedgerError;
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

/// A database created for one test or benchmark, dropped when this is dropped.
#[derive(Debug)]
pub struct ScratchDatabase {
    admin: MysqlUrl,
    url: MysqlUrl,
}

async fn admin_statement(admin: &MysqlUrl, sql: String) -> Result<(), LedgerError> {
    let unavailable = |e: mysql_async::Error| LedgerError::Unavailable(format!("mysql at {admin}: {e}"));
    let mut conn = Conn::new(admin.connection_opts()).await.map_err(unavailable)?;
    // A transaction left open on the database (a test that failed while a claim held
    // its rows) would make DROP DATABASE wait for its metadata lock for as long as
    // the server's default allows (a year): give up after a while instead.
    conn.query_drop(format!("SET SESSION lock_wait_timeout = {ADMIN_LOCK_WAIT_S}"))
        .await
        .map_err(unavailable)?;
    conn.query_drop(sql).await.map_err(unavailable)?;
    conn.disconnect().await.map_err(unavailable)
}

/// How long creating or dropping a scratch database waits for a metadata lock.
const ADMIN_LOCK_WAIT_S: u32 = 30;

impl ScratchDatabase {
    /// Creates a fresh, empty database named `prefix` and 16 random hex digits on the
    /// server that `admin` points at.
    pub async fn create(admin: &MysqlUrl, prefix: &str) -> Result<Self, LedgerError> {
        let name = format!("{prefix}{:016x}", OsEntropy.next_u64());
        if name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(LedgerError::BadInput(format!("{name:?} is not a usable database name")));
        }
        admin_statement(
            admin,
            format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"),
        )
        .await?;
        Ok(Self {
            admin: admin.clone(),
            url: admin.with_database(&name),
        })
    }

    /// The URL of the scratch database (the admin URL's server and credentials).
    pub fn url(&self) -> &MysqlUrl {
        &self.url
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let sql = format!("DROP DATABASE IF EXISTS `{}`", self.url.database);
        crate::ledger::scratch::drop_database(&self.url.database, async move { admin_statement(&admin, sql).await });
    }
}
