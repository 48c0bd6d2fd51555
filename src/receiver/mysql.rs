//! The target's MySQL / MariaDB store: a connection pool on the database a
//! `mysql://` URL names (the ledger's URL syntax and options: `pool_max`,
//! `pool_min`, `connect_timeout_ms`, `lock_wait_timeout_s`, `retry_max`; the
//! others are accepted and unused).
//!
//! Claims are single guarded statements: a plain `INSERT` that the primary key
//! lets only one request win (the losers get 1062, duplicate entry, and read the
//! row), and an `UPDATE … WHERE claim_token = <the expired one>` that only one
//! request can take over. The apply is one InnoDB transaction: the guarded
//! `UPDATE` of the key to `done` (zero rows: the claim was taken over, roll back),
//! then the effect's `INSERT`; deadlocks and lock-wait timeouts retry it whole, up
//! to `retry_max` times. A connection lost during `COMMIT` answers unavailable (the
//! sender's retry then finds the key done, or still held by this claim until its
//! hold expires). Passwords never appear in errors: the URL prints as `***`.

use super::{order_by_path, order_query, Begun, Claim, Counted, Effects, KeyStore, StoreError, StoredResponse};
use crate::entropy::{Entropy, OsEntropy};
use crate::ledger::mysql::MysqlUrl;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder, Pool, PoolConstraints, PoolOpts, TxOpts};
use std::time::Duration;

/// Duplicate entry for a unique key.
const ER_DUP_ENTRY: u16 = 1062;
/// Deadlock found when trying to get lock.
const ER_LOCK_DEADLOCK: u16 = 1213;
/// Lock wait timeout exceeded.
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// Duplicate column name.
const ER_DUP_FIELDNAME: u16 = 1060;

/// The target's tables; see `sqlite.rs` for what each column means.
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS leasehold_target_key (
        idempotency_key VARCHAR(255) NOT NULL PRIMARY KEY,
        body_sha256     CHAR(64) NOT NULL,
        state           VARCHAR(16) NOT NULL,
        claim_token     CHAR(16) NULL,
        held_until_ms   BIGINT NOT NULL,
        status          SMALLINT UNSIGNED NULL,
        response        MEDIUMTEXT NULL,
        created_at_ms   BIGINT NOT NULL,
        finished_at_ms  BIGINT NULL
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS leasehold_target_effect (
        id              BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        idempotency_key VARCHAR(255) NOT NULL,
        receipt_id      VARCHAR(64) NOT NULL,
        applied_at_ms   BIGINT NOT NULL,
        path            MEDIUMTEXT NULL,
        KEY leasehold_target_effect_key (idempotency_key)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS leasehold_target_counter (
        name  VARCHAR(32) NOT NULL PRIMARY KEY,
        value BIGINT NOT NULL
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "INSERT IGNORE INTO leasehold_target_counter (name, value) VALUES ('replays', 0), ('conflicts', 0), ('mismatches', 0)",
];

/// Keys, effects and counters in a MySQL / MariaDB database.
#[derive(Clone)]
pub struct MysqlStore {
    pool: Pool,
    url: MysqlUrl,
}

impl std::fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlStore")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// A server error's code, if it is one.
fn code(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}

/// A key row as `begin` reads it: sha, state, token, held until, status, response.
type KeyRow = (String, String, Option<String>, i64, Option<u16>, Option<String>);

fn to_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

impl MysqlStore {
    /// Connects to the database `url` names and creates the target's tables.
    pub async fn open(url: &MysqlUrl) -> Result<Self, StoreError> {
        let o = url.options;
        let constraints = PoolConstraints::new(o.pool_min.min(o.pool_max), o.pool_max).unwrap_or_default();
        let opts = OptsBuilder::default()
            .ip_or_hostname(url.host.clone())
            .tcp_port(url.port)
            .user(url.user.clone())
            .pass(url.expose_password().map(str::to_owned))
            .db_name(Some(url.database.clone()))
            .tcp_nodelay(true)
            .setup(vec![
                "SET SESSION sql_mode = 'STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,NO_ENGINE_SUBSTITUTION'"
                    .to_owned(),
                format!("SET SESSION innodb_lock_wait_timeout = {}", o.lock_wait_timeout_s),
            ])
            .pool_opts(PoolOpts::default().with_constraints(constraints));
        let store = Self {
            pool: Pool::new(opts),
            url: url.clone(),
        };
        let mut conn = store.conn().await?;
        for statement in SCHEMA {
            conn.query_drop(*statement)
                .await
                .map_err(|e| StoreError::Invalid(format!("{url}: cannot create the target's tables: {e}")))?;
        }
        // An effects table created before effect rows kept their path gets it (its
        // earlier rows keep NULL); where it is there already, or another target added
        // it just now, the server answers "duplicate column".
        match conn
            .query_drop("ALTER TABLE leasehold_target_effect ADD COLUMN path MEDIUMTEXT NULL")
            .await
        {
            Err(e) if code(&e) != Some(ER_DUP_FIELDNAME) => Err(StoreError::Invalid(format!(
                "{url}: cannot add the path column to leasehold_target_effect: {e}"
            ))),
            _ => Ok(store),
        }
    }

    async fn conn(&self) -> Result<Conn, StoreError> {
        let timeout = self.url.options.connect_timeout();
        match tokio::time::timeout(timeout, self.pool.get_conn()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(StoreError::Unavailable(format!("mysql at {}: {e}", self.url))),
            Err(_) => Err(StoreError::Unavailable(format!(
                "mysql at {}: no connection within {} ms",
                self.url,
                timeout.as_millis()
            ))),
        }
    }

    fn unavailable(&self, e: mysql_async::Error) -> StoreError {
        StoreError::Unavailable(format!("mysql at {}: {e}", self.url))
    }

    /// One try of the apply transaction.
    async fn apply_once(
        &self,
        conn: &mut Conn,
        claim: &Claim,
        receipt_id: &str,
        path: &str,
        response: &StoredResponse,
        now: i64,
    ) -> Result<bool, mysql_async::Error> {
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        tx.exec_drop(
            "UPDATE leasehold_target_key
             SET state = 'done', claim_token = NULL, status = ?, response = ?, finished_at_ms = ?
             WHERE idempotency_key = ? AND state = 'processing' AND claim_token = ?",
            (response.status, &response.body, now, &claim.key, &claim.token),
        )
        .await?;
        if tx.affected_rows() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        // The effect. A receiver of your own writes its business rows here, in this
        // same transaction.
        tx.exec_drop(
            "INSERT INTO leasehold_target_effect (idempotency_key, receipt_id, applied_at_ms, path)
             VALUES (?, ?, ?, ?)",
            (&claim.key, receipt_id, now, path),
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }
}

impl KeyStore for MysqlStore {
    async fn begin(&self, key: &str, body_sha256: &str, now_ms: u64, hold_ms: u64) -> Result<Begun, StoreError> {
        let token = format!("{:016x}", OsEntropy.next_u64());
        let (now, until) = (to_i64(now_ms), to_i64(now_ms.saturating_add(hold_ms)));
        let claimed = || {
            Begun::Claimed(Claim {
                key: key.to_owned(),
                token: token.clone(),
            })
        };
        let mut conn = self.conn().await?;
        // Each pass either decides or lost a race that changed the row; rows are never
        // deleted, so a few passes always decide.
        for _ in 0..4 {
            let inserted = conn
                .exec_drop(
                    "INSERT INTO leasehold_target_key
                         (idempotency_key, body_sha256, state, claim_token, held_until_ms, created_at_ms)
                     VALUES (?, ?, 'processing', ?, ?, ?)",
                    (key, body_sha256, &token, until, now),
                )
                .await;
            match inserted {
                Ok(()) => return Ok(claimed()),
                Err(e) if code(&e) == Some(ER_DUP_ENTRY) => {}
                Err(e) => return Err(self.unavailable(e)),
            }
            let row: Option<KeyRow> = conn
                .exec_first(
                    "SELECT body_sha256, state, claim_token, held_until_ms, status, response
                     FROM leasehold_target_key WHERE idempotency_key = ?",
                    (key,),
                )
                .await
                .map_err(|e| self.unavailable(e))?;
            let Some((sha, state, old_token, held_until, status, response)) = row else {
                continue;
            };
            if state == "done" {
                return Ok(Begun::Done {
                    body_sha256: sha,
                    response: StoredResponse {
                        status: status.unwrap_or(200),
                        body: response.unwrap_or_default(),
                    },
                });
            }
            if held_until >= now || sha != body_sha256 {
                return Ok(Begun::Processing { body_sha256: sha });
            }
            // The earlier claim was abandoned (its process died): no effect was applied
            // under it, so this request takes the key over — unless another did first.
            conn.exec_drop(
                "UPDATE leasehold_target_key SET claim_token = ?, held_until_ms = ?
                 WHERE idempotency_key = ? AND state = 'processing' AND claim_token <=> ?",
                (&token, until, key, old_token),
            )
            .await
            .map_err(|e| self.unavailable(e))?;
            if conn.affected_rows() == 1 {
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
        let mut conn = self.conn().await?;
        let tries = self.url.options.retry_max.max(1);
        for tried in 1..=tries {
            match self
                .apply_once(&mut conn, claim, receipt_id, path, response, to_i64(now_ms))
                .await
            {
                Ok(applied) => return Ok(applied),
                Err(e) if matches!(code(&e), Some(ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT)) && tried < tries => {
                    tokio::time::sleep(Duration::from_millis(10 * u64::from(tried))).await;
                }
                Err(e) => return Err(self.unavailable(e)),
            }
        }
        Err(StoreError::Unavailable(format!(
            "key {}: apply kept deadlocking",
            claim.key
        )))
    }

    async fn count(&self, counted: Counted) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        conn.exec_drop(
            "UPDATE leasehold_target_counter SET value = value + 1 WHERE name = ?",
            (counted.name(),),
        )
        .await
        .map_err(|e| self.unavailable(e))
    }

    async fn effects(&self) -> Result<Effects, StoreError> {
        let mut conn = self.conn().await?;
        let mut opts = TxOpts::default();
        opts.with_consistent_snapshot(true).with_readonly(true);
        let mut tx = conn.start_transaction(opts).await.map_err(|e| self.unavailable(e))?;
        let read = async {
            let count = |n: Option<i64>| n.unwrap_or(0).max(0) as u64;
            let states: Vec<(String, i64)> = tx
                .query("SELECT state, COUNT(*) FROM leasehold_target_key GROUP BY state")
                .await?;
            let mut effects = Effects::default();
            for (state, n) in states {
                match state.as_str() {
                    "done" => effects.keys = count(Some(n)),
                    _ => effects.in_progress += count(Some(n)),
                }
            }
            let by_key: Vec<(String, i64)> = tx
                .query("SELECT idempotency_key, COUNT(*) FROM leasehold_target_effect GROUP BY idempotency_key")
                .await?;
            for (key, n) in by_key {
                effects.effects += count(Some(n));
                effects.by_key.insert(key, count(Some(n)));
            }
            let order: Vec<(String, String)> = tx.query(order_query()).await?;
            effects.order_by_path = order_by_path(order);
            let counters: Vec<(String, i64)> = tx.query("SELECT name, value FROM leasehold_target_counter").await?;
            for (name, n) in counters {
                match name.as_str() {
                    "replays" => effects.replays = count(Some(n)),
                    "conflicts" => effects.conflicts = count(Some(n)),
                    "mismatches" => effects.mismatches = count(Some(n)),
                    _ => {}
                }
            }
            Ok::<_, mysql_async::Error>(effects)
        }
        .await;
        let effects = read.map_err(|e| self.unavailable(e))?;
        tx.commit().await.map_err(|e| self.unavailable(e))?;
        Ok(effects)
    }
}
