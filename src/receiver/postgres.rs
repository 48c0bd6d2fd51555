//! The target's PostgreSQL store: a pool on the database a `postgres://` URL names
//! (the ledger's URL syntax and options: `pool_max`, `connect_timeout_ms`,
//! `statement_timeout_ms`, `lock_timeout_ms`, `idle_timeout_s`, `retry_max`,
//! `sslmode`).
//!
//! Claims are single guarded statements: an `INSERT … ON CONFLICT DO NOTHING` that
//! the primary key lets only one request win (the losers insert nothing and read the
//! row), and an `UPDATE … WHERE claim_token IS NOT DISTINCT FROM <the expired one>`
//! that only one request can take over. The apply is one transaction: the guarded
//! `UPDATE` of the key to `done` (zero rows: the claim was taken over, roll back),
//! then the effect's `INSERT`; serialization failures, deadlocks and lock timeouts
//! retry it whole, up to `retry_max` times. A connection lost during `COMMIT` answers
//! unavailable (the sender's retry then finds the key done, or still held by this
//! claim until its hold expires). Passwords never appear in errors: the URL prints
//! with `***`.

use super::{order_by_path, order_query, Begun, Claim, Counted, Effects, KeyStore, StoreError, StoredResponse};
use crate::entropy::{Entropy, OsEntropy};
use crate::ledger::postgres::{PostgresLedger, PostgresUrl};
use std::time::Duration;
use tokio_postgres::error::SqlState;

/// The target's tables; see `sqlite.rs` for what each column means. An effects
/// table created before effect rows kept their path gets it (earlier rows: NULL).
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS leasehold_target_key (
        idempotency_key TEXT COLLATE \"C\" NOT NULL PRIMARY KEY,
        body_sha256     TEXT NOT NULL,
        state           TEXT NOT NULL,
        claim_token     TEXT NULL,
        held_until_ms   BIGINT NOT NULL,
        status          INTEGER NULL,
        response        TEXT NULL,
        created_at_ms   BIGINT NOT NULL,
        finished_at_ms  BIGINT NULL
    );
    CREATE TABLE IF NOT EXISTS leasehold_target_effect (
        id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        idempotency_key TEXT COLLATE \"C\" NOT NULL,
        receipt_id      TEXT NOT NULL,
        applied_at_ms   BIGINT NOT NULL,
        path            TEXT NULL
    );
    ALTER TABLE leasehold_target_effect ADD COLUMN IF NOT EXISTS path TEXT NULL;
    CREATE INDEX IF NOT EXISTS leasehold_target_effect_key ON leasehold_target_effect (idempotency_key);
    CREATE TABLE IF NOT EXISTS leasehold_target_counter (
        name  TEXT NOT NULL PRIMARY KEY,
        value BIGINT NOT NULL
    );
    INSERT INTO leasehold_target_counter (name, value)
        VALUES ('replays', 0), ('conflicts', 0), ('mismatches', 0) ON CONFLICT DO NOTHING;
";

/// Advisory lock key that serializes two targets creating the tables at once
/// (`CREATE TABLE IF NOT EXISTS` is not safe against a concurrent creator).
const SCHEMA_LOCK: i64 = 0x6c68_7467_745f_6b79;

/// Keys, effects and counters in a PostgreSQL database.
#[derive(Clone)]
pub struct PostgresStore {
    ledger: PostgresLedger,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", self.ledger.url())
            .finish_non_exhaustive()
    }
}

fn to_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Whether trying the whole apply again may succeed.
fn retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE
            || *c == SqlState::T_R_DEADLOCK_DETECTED
            || *c == SqlState::LOCK_NOT_AVAILABLE
    )
}

impl PostgresStore {
    /// Connects to the database `url` names and creates the target's tables.
    pub async fn open(url: &PostgresUrl) -> Result<Self, StoreError> {
        let ledger = PostgresLedger::open(url, std::sync::Arc::new(OsEntropy))
            .map_err(|e| StoreError::Invalid(format!("{url}: {e}")))?;
        let store = Self { ledger };
        let mut client = store.client().await?;
        let created = async {
            let tx = client.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK]).await?;
            tx.batch_execute(SCHEMA).await?;
            tx.commit().await
        }
        .await;
        created.map_err(|e| StoreError::Invalid(format!("{url}: cannot create the target's tables: {}", text(&e))))?;
        Ok(store)
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.ledger.session().await.map_err(|e| match e {
            crate::ledger::LedgerError::Unavailable(m) => StoreError::Unavailable(m),
            other => StoreError::Invalid(other.to_string()),
        })
    }

    fn unavailable(&self, e: &tokio_postgres::Error) -> StoreError {
        StoreError::Unavailable(format!("postgres at {}: {}", self.ledger.url(), text(e)))
    }

    /// One try of the apply transaction.
    async fn apply_once(
        client: &mut deadpool_postgres::Client,
        claim: &Claim,
        receipt_id: &str,
        path: &str,
        response: &StoredResponse,
        now: i64,
    ) -> Result<bool, tokio_postgres::Error> {
        let tx = client.transaction().await?;
        let updated = tx
            .execute(
                "UPDATE leasehold_target_key
                 SET state = 'done', claim_token = NULL, status = $1, response = $2, finished_at_ms = $3
                 WHERE idempotency_key = $4 AND state = 'processing' AND claim_token = $5",
                &[
                    &i32::from(response.status),
                    &response.body,
                    &now,
                    &claim.key,
                    &claim.token,
                ],
            )
            .await?;
        if updated != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        // The effect. A receiver of your own writes its business rows here, in this
        // same transaction.
        tx.execute(
            "INSERT INTO leasehold_target_effect (idempotency_key, receipt_id, applied_at_ms, path)
             VALUES ($1, $2, $3, $4)",
            &[&claim.key, &receipt_id, &now, &path],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// A server error's code and message, or the driver's text.
fn text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

impl KeyStore for PostgresStore {
    async fn begin(&self, key: &str, body_sha256: &str, now_ms: u64, hold_ms: u64) -> Result<Begun, StoreError> {
        let token = format!("{:016x}", OsEntropy.next_u64());
        let (now, until) = (to_i64(now_ms), to_i64(now_ms.saturating_add(hold_ms)));
        let claimed = || {
            Begun::Claimed(Claim {
                key: key.to_owned(),
                token: token.clone(),
            })
        };
        let client = self.client().await?;
        // Each pass either decides or lost a race that changed the row; rows are never
        // deleted, so a few passes always decide.
        for _ in 0..4 {
            let inserted = client
                .execute(
                    "INSERT INTO leasehold_target_key
                         (idempotency_key, body_sha256, state, claim_token, held_until_ms, created_at_ms)
                     VALUES ($1, $2, 'processing', $3, $4, $5) ON CONFLICT (idempotency_key) DO NOTHING",
                    &[&key, &body_sha256, &token, &until, &now],
                )
                .await
                .map_err(|e| self.unavailable(&e))?;
            if inserted == 1 {
                return Ok(claimed());
            }
            let row = client
                .query_opt(
                    "SELECT body_sha256, state, claim_token, held_until_ms, status, response
                     FROM leasehold_target_key WHERE idempotency_key = $1",
                    &[&key],
                )
                .await
                .map_err(|e| self.unavailable(&e))?;
            let Some(row) = row else { continue };
            let (sha, state, old_token, held_until): (String, String, Option<String>, i64) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            if state == "done" {
                let status: Option<i32> = row.get(4);
                let response: Option<String> = row.get(5);
                return Ok(Begun::Done {
                    body_sha256: sha,
                    response: StoredResponse {
                        status: status.and_then(|s| u16::try_from(s).ok()).unwrap_or(200),
                        body: response.unwrap_or_default(),
                    },
                });
            }
            if held_until >= now || sha != body_sha256 {
                return Ok(Begun::Processing { body_sha256: sha });
            }
            // The earlier claim was abandoned (its process died): no effect was applied
            // under it, so this request takes the key over — unless another did first.
            let taken = client
                .execute(
                    "UPDATE leasehold_target_key SET claim_token = $1, held_until_ms = $2
                     WHERE idempotency_key = $3 AND state = 'processing' AND claim_token IS NOT DISTINCT FROM $4",
                    &[&token, &until, &key, &old_token],
                )
                .await
                .map_err(|e| self.unavailable(&e))?;
            if taken == 1 {
                return Ok(claimed());
            }
        }
        Err(StoreError::Unavailable(format!(
            "key {key}: the claim kept changing under this request; retry"
        )))
    }

    async fn apply(
        &self,
        claim: &Claim,
        receipt_id: &str,
        path: &str,
        response: &StoredResponse,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tries = self.ledger.url().options.retry_max.max(1);
        for tried in 1..=tries {
            match Self::apply_once(&mut client, claim, receipt_id, path, response, to_i64(now_ms)).await {
                Ok(applied) => return Ok(applied),
                Err(e) if retryable(&e) && tried < tries => {
                    tokio::time::sleep(Duration::from_millis(10 * u64::from(tried))).await;
                }
                Err(e) => return Err(self.unavailable(&e)),
            }
        }
        Err(StoreError::Unavailable(format!(
            "key {}: apply kept conflicting",
            claim.key
        )))
    }

    async fn count(&self, counted: Counted) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE leasehold_target_counter SET value = value + 1 WHERE name = $1",
                &[&counted.name()],
            )
            .await
            .map(|_| ())
            .map_err(|e| self.unavailable(&e))
    }

    async fn effects(&self) -> Result<Effects, StoreError> {
        let mut client = self.client().await?;
        let read = async {
            // One snapshot for all the reads.
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await?;
            let count = |n: i64| n.max(0) as u64;
            let mut effects = Effects::default();
            for row in tx
                .query("SELECT state, COUNT(*) FROM leasehold_target_key GROUP BY state", &[])
                .await?
            {
                let (state, n): (String, i64) = (row.get(0), row.get(1));
                match state.as_str() {
                    "done" => effects.keys = count(n),
                    _ => effects.in_progress += count(n),
                }
            }
            for row in tx
                .query(
                    "SELECT idempotency_key, COUNT(*) FROM leasehold_target_effect GROUP BY idempotency_key",
                    &[],
                )
                .await?
            {
                let (key, n): (String, i64) = (row.get(0), row.get(1));
                effects.effects += count(n);
                effects.by_key.insert(key, count(n));
            }
            let order = tx.query(&order_query(), &[]).await?;
            effects.order_by_path = order_by_path(order.iter().map(|row| (row.get(0), row.get(1))));
            for row in tx
                .query("SELECT name, value FROM leasehold_target_counter", &[])
                .await?
            {
                let (name, n): (String, i64) = (row.get(0), row.get(1));
                match name.as_str() {
                    "replays" => effects.replays = count(n),
                    "conflicts" => effects.conflicts = count(n),
                    "mismatches" => effects.mismatches = count(n),
                    _ => {}
                }
            }
            tx.commit().await?;
            Ok::<_, tokio_postgres::Error>(effects)
        }
        .await;
        read.map_err(|e| self.unavailable(&e))
    }
}
