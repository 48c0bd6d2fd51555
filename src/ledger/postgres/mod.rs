//! The PostgreSQL ledger: connection pool, TLS, migrations and the schema check.
//!
//! Contract: [`PostgresLedger::open`] builds a pool (deadpool-postgres over
//! tokio-postgres) from a [`PostgresUrl`] without connecting; every pooled session
//! starts with the URL's `statement_timeout`, `lock_timeout` and
//! `idle_in_transaction_session_timeout`. TLS goes through rustls, with libpq's
//! meaning of the URL's `sslmode` ([`tls`]).
//! [`PostgresLedger::migrate`] applies `migrations/postgres/` under an advisory lock
//! ([`schema`]); [`PostgresLedger::check_schema`] refuses a database without the schema
//! or with a newer one, naming both versions. A transaction that meets a serialization
//! failure, a deadlock, a lock timeout or a connection lost before `COMMIT` is tried
//! again, up to the URL's `retry_max`; a connection lost during `COMMIT` is reported
//! as ambiguous ([`error`]).
//!
//! The ledger's transitions come through the shared SQL layer; until they do, the CLI
//! does not accept `postgres://` URLs.

mod error;
pub mod schema;
pub mod scratch;
mod tls;
mod url;

pub use url::{PostgresOptions, PostgresUrl, Ssl};

use crate::entropy::Entropy;
use crate::ledger::LedgerError;
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use error::TxError;
use std::future::Future;
use std::sync::Arc;

/// A PostgreSQL ledger: a pool of sessions on one database.
#[derive(Clone)]
pub struct PostgresLedger {
    pool: Pool,
    url: Arc<PostgresUrl>,
    #[allow(dead_code)]
    entropy: Arc<dyn Entropy>,
}

impl std::fmt::Debug for PostgresLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLedger")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl PostgresLedger {
    /// A ledger on `url`'s database. Connects lazily: an unreachable server shows on
    /// the first call, as `Unavailable`.
    pub fn open(url: &PostgresUrl, entropy: Arc<dyn Entropy>) -> Result<Self, LedgerError> {
        let manager = Manager::from_config(
            url.config().clone(),
            tls::connector(url.options.ssl == Ssl::VerifyFull)?,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let settings = url.options.session_settings();
        let pool = Pool::builder(manager)
            .max_size(url.options.pool_max)
            .wait_timeout(Some(url.options.connect_timeout()))
            .create_timeout(Some(url.options.connect_timeout()))
            .runtime(Runtime::Tokio1)
            .post_create(Hook::async_fn(move |client, _| {
                let settings = settings.clone();
                Box::pin(async move { client.batch_execute(&settings).await.map_err(HookError::Backend) })
            }))
            .build()
            .map_err(|e| LedgerError::Internal(format!("postgres pool: {e}")))?;
        Ok(Self {
            pool,
            url: Arc::new(url.clone()),
            entropy,
        })
    }

    /// The URL this ledger connects to (its password never prints).
    pub fn url(&self) -> &PostgresUrl {
        &self.url
    }

    async fn connect(&self) -> Result<deadpool_postgres::Client, TxError> {
        self.pool
            .get()
            .await
            .map_err(|e| TxError::Ledger(error::pool_error(&self.url.to_string(), e)))
    }

    /// Runs `attempt` until it answers something other than [`TxError::Retry`], at
    /// most `retry_max` times.
    async fn retry<T, F, Fut>(&self, mut attempt: F) -> Result<T, LedgerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TxError>>,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            match attempt().await {
                Ok(v) => return Ok(v),
                Err(TxError::Retry(m)) if tries >= self.url.options.retry_max => {
                    return Err(LedgerError::Unavailable(format!("{m} (after {tries} tries)")))
                }
                Err(TxError::Retry(_)) => tokio::task::yield_now().await,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Applies every pending migration; answers the versions applied now.
    pub async fn migrate(&self) -> Result<Vec<u32>, LedgerError> {
        self.retry(|| async {
            let mut client = self.connect().await?;
            schema::migrate(&mut client).await
        })
        .await
    }

    /// Refuses a database without the schema or with a newer one (see [`schema`]).
    pub async fn check_schema(&self) -> Result<(), LedgerError> {
        self.retry(|| async {
            let client = self.connect().await?;
            schema::check_schema(&client, &self.url.to_string()).await
        })
        .await
    }
}

#[cfg(test)]
mod tests;
