//! The target's SQLite store: one connection, every call one `BEGIN IMMEDIATE`
//! transaction on tokio's blocking pool, so calls from this process and from other
//! processes on the same file are serialized by SQLite's write lock (waiting up to
//! the busy timeout). The file is created if it does not exist; WAL with
//! `synchronous=FULL`, so a stored response survives a crash of the machine too.

use super::{order_by_path, order_query, Begun, Claim, Counted, Effects, KeyStore, StoreError, StoredResponse};
use crate::entropy::{Entropy, OsEntropy};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a call waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The target's tables. `state` is `processing` (claimed, no effect yet) or `done`
/// (effect applied, response stored); the effects table has no unique key on
/// purpose, so a double application would show. An effect's `path` is its request's
/// path (without the query); its `id` orders the applications.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS leasehold_target_key (
    idempotency_key TEXT PRIMARY KEY NOT NULL,
    body_sha256     TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('processing', 'done')),
    claim_token     TEXT,
    held_until_ms   INTEGER NOT NULL,
    status          INTEGER,
    response        TEXT,
    created_at_ms   INTEGER NOT NULL,
    finished_at_ms  INTEGER
);
CREATE TABLE IF NOT EXISTS leasehold_target_effect (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL,
    receipt_id      TEXT NOT NULL,
    applied_at_ms   INTEGER NOT NULL,
    path            TEXT
);
CREATE INDEX IF NOT EXISTS leasehold_target_effect_key ON leasehold_target_effect (idempotency_key);
CREATE TABLE IF NOT EXISTS leasehold_target_counter (
    name  TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO leasehold_target_counter (name, value) VALUES ('replays', 0), ('conflicts', 0), ('mismatches', 0);
";

/// Keys, effects and counters in a SQLite file.
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

fn unavailable(e: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("sqlite: {e}"))
}

impl SqliteStore {
    /// Opens (creating it if needed) the file at `path` (`:memory:` for a store that
    /// lasts as long as this value) and creates the target's tables.
    pub fn open(path: &str) -> Result<Self, StoreError> {
        let conn =
            Connection::open(path).map_err(|e| StoreError::Invalid(format!("cannot open sqlite://{path}: {e}")))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(unavailable)?;
        if path != ":memory:" {
            let mode: String = conn
                .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
                .map_err(unavailable)?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(StoreError::Invalid(format!(
                    "sqlite://{path}: cannot use WAL (journal mode {mode})"
                )));
            }
        }
        conn.pragma_update(None, "synchronous", "FULL").map_err(unavailable)?;
        conn.execute_batch(SCHEMA)
            .and_then(|()| add_path_column(&conn))
            .map_err(|e| StoreError::Invalid(format!("sqlite://{path}: cannot create the target's tables: {e}")))?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` in one transaction on the blocking pool (`BEGIN IMMEDIATE` for a
    /// write, so that it holds the write lock from its first read); commits when `f`
    /// answers `(value, true)`, rolls back when it answers `false` or an error.
    async fn transaction<T: Send + 'static>(
        &self,
        write: bool,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<(T, bool)> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = Arc::clone(&self.conn);
        let behavior = if write {
            TransactionBehavior::Immediate
        } else {
            TransactionBehavior::Deferred
        };
        tokio::task::spawn_blocking(move || {
            // A panic while the lock was held cannot leave a transaction open (the
            // transaction rolls back when dropped), so a poisoned lock is still usable.
            let mut conn = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let tx = conn.transaction_with_behavior(behavior).map_err(unavailable)?;
            let (value, commit) = f(&tx).map_err(unavailable)?;
            if commit {
                tx.commit().map_err(unavailable)?;
            } else {
                tx.rollback().map_err(unavailable)?;
            }
            Ok(value)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("sqlite call failed: {e}")))?
    }
}

/// Adds `path` to an effects table created before effect rows kept it (its
/// earlier rows keep `NULL`). Another process adding it at the same time is fine.
fn add_path_column(conn: &Connection) -> rusqlite::Result<()> {
    let has_path = |conn: &Connection| {
        conn.query_row(
            "SELECT COUNT(*) FROM pragma_table_info('leasehold_target_effect') WHERE name = 'path'",
            [],
            |row| row.get::<_, i64>(0),
        )
        .map(|n| n > 0)
    };
    if has_path(conn)? {
        return Ok(());
    }
    match conn.execute("ALTER TABLE leasehold_target_effect ADD COLUMN path TEXT", []) {
        Err(_) if has_path(conn)? => Ok(()),
        added => added.map(|_| ()),
    }
}

/// The row of a key, as `begin` reads it.
struct KeyRow {
    body_sha256: String,
    state: String,
    claim_token: Option<String>,
    held_until_ms: i64,
    status: Option<i64>,
    response: Option<String>,
}

fn read_key(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Option<KeyRow>> {
    tx.query_row(
        "SELECT body_sha256, state, claim_token, held_until_ms, status, response
         FROM leasehold_target_key WHERE idempotency_key = ?1",
        [key],
        |row| {
            Ok(KeyRow {
                body_sha256: row.get(0)?,
                state: row.get(1)?,
                claim_token: row.get(2)?,
                held_until_ms: row.get(3)?,
                status: row.get(4)?,
                response: row.get(5)?,
            })
        },
    )
    .optional()
}

fn to_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

impl KeyStore for SqliteStore {
    async fn begin(&self, key: &str, body_sha256: &str, now_ms: u64, hold_ms: u64) -> Result<Begun, StoreError> {
        let (key, sha) = (key.to_owned(), body_sha256.to_owned());
        let token = format!("{:016x}", OsEntropy.next_u64());
        let (now, until) = (to_i64(now_ms), to_i64(now_ms.saturating_add(hold_ms)));
        self.transaction(true, move |tx| {
            let claimed = Begun::Claimed(Claim {
                key: key.clone(),
                token: token.clone(),
            });
            let Some(row) = read_key(tx, &key)? else {
                tx.execute(
                    "INSERT INTO leasehold_target_key
                         (idempotency_key, body_sha256, state, claim_token, held_until_ms, created_at_ms)
                     VALUES (?1, ?2, 'processing', ?3, ?4, ?5)",
                    params![key, sha, token, until, now],
                )?;
                return Ok((claimed, true));
            };
            if row.state == "done" {
                let response = StoredResponse {
                    status: row.status.and_then(|s| u16::try_from(s).ok()).unwrap_or(200),
                    body: row.response.unwrap_or_default(),
                };
                return Ok((
                    Begun::Done {
                        body_sha256: row.body_sha256,
                        response,
                    },
                    false,
                ));
            }
            if row.held_until_ms < now && row.body_sha256 == sha {
                // The earlier claim was abandoned (its process died): no effect was
                // applied under it, so this request takes the key over.
                let taken = tx.execute(
                    "UPDATE leasehold_target_key SET claim_token = ?1, held_until_ms = ?2
                     WHERE idempotency_key = ?3 AND state = 'processing' AND claim_token IS ?4",
                    params![token, until, key, row.claim_token],
                )?;
                if taken == 1 {
                    return Ok((claimed, true));
                }
            }
            Ok((
                Begun::Processing {
                    body_sha256: row.body_sha256,
                },
                false,
            ))
        })
        .await
    }

    async fn apply(
        &self,
        claim: &Claim,
        receipt_id: &str,
        path: &str,
        response: &StoredResponse,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let (claim, receipt_id, response) = (claim.clone(), receipt_id.to_owned(), response.clone());
        let path = path.to_owned();
        let now = to_i64(now_ms);
        self.transaction(true, move |tx| {
            let stored = tx.execute(
                "UPDATE leasehold_target_key
                 SET state = 'done', claim_token = NULL, status = ?1, response = ?2, finished_at_ms = ?3
                 WHERE idempotency_key = ?4 AND state = 'processing' AND claim_token = ?5",
                params![response.status, response.body, now, claim.key, claim.token],
            )?;
            if stored != 1 {
                return Ok((false, false));
            }
            // The effect. A receiver of your own writes its business rows here, in
            // this same transaction.
            tx.execute(
                "INSERT INTO leasehold_target_effect (idempotency_key, receipt_id, applied_at_ms, path)
                 VALUES (?1, ?2, ?3, ?4)",
                params![claim.key, receipt_id, now, path],
            )?;
            Ok((true, true))
        })
        .await
    }

    async fn count(&self, counted: Counted) -> Result<(), StoreError> {
        self.transaction(true, move |tx| {
            tx.execute(
                "UPDATE leasehold_target_counter SET value = value + 1 WHERE name = ?1",
                [counted.name()],
            )?;
            Ok(((), true))
        })
        .await
    }

    async fn effects(&self) -> Result<Effects, StoreError> {
        self.transaction(false, |tx| {
            let count = |sql: &str| {
                tx.query_row(sql, [], |row| row.get::<_, i64>(0))
                    .map(|n| n.max(0) as u64)
            };
            let mut effects = Effects {
                keys: count("SELECT COUNT(*) FROM leasehold_target_key WHERE state = 'done'")?,
                in_progress: count("SELECT COUNT(*) FROM leasehold_target_key WHERE state = 'processing'")?,
                effects: count("SELECT COUNT(*) FROM leasehold_target_effect")?,
                ..Effects::default()
            };
            let mut by_key =
                tx.prepare("SELECT idempotency_key, COUNT(*) FROM leasehold_target_effect GROUP BY idempotency_key")?;
            for row in by_key.query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?)))? {
                let (key, n) = row?;
                effects.by_key.insert(key, n.max(0) as u64);
            }
            let mut order = tx.prepare(&order_query())?;
            let rows = order.query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)))?;
            effects.order_by_path = order_by_path(rows.collect::<rusqlite::Result<Vec<_>>>()?);
            let mut counters = tx.prepare("SELECT name, value FROM leasehold_target_counter")?;
            for row in counters.query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?)))? {
                let (name, n) = row?;
                let n = n.max(0) as u64;
                match name.as_str() {
                    "replays" => effects.replays = n,
                    "conflicts" => effects.conflicts = n,
                    "mismatches" => effects.mismatches = n,
                    _ => {}
                }
            }
            Ok((effects, false))
        })
        .await
    }
}
