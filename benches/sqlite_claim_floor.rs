//! How close batched SQLite claims come to what the ledger's claim must do, with no
//! engine, decoding or writer thread at all: the floor that the ratio of batch-32
//! claims to the raw loop (`claims/sqlite/batch-32/4` in `cargo bench`) can reach.
//!
//! `cargo bench --features cli --bench sqlite_claim_floor -- [JOBS]` (default 40,000). One
//! template ledger with JOBS one-step attempts is prepared in a temporary directory
//! as `leasehold bench` prepares its own. Then each round runs, every one on a fresh
//! copy (or queue) with 4 claimers taking 32 commands per transaction until none is
//! left, each checked to have taken every command exactly once:
//!
//! - `raw`: the raw batched loop of `cargo bench` and `leasehold bench`
//!   ([`RawKind::ClaimBatch`]: one `UPDATE … WHERE id IN (SELECT … LIMIT 32)` on a
//!   one-table queue with an integer key);
//! - `leasehold`: `Ledger::claim` at batch 32, the real ledger;
//! - `floor`: the statements the ledger's claim runs, from 4 threads on their own
//!   connections, and nothing else: `BEGIN IMMEDIATE`, the probe of expired leases,
//!   the candidate read (each command with its attempt, plan and receipts, every
//!   column fetched and none decoded), per command the guarded command `UPDATE` and
//!   the attempt `UPDATE` (status and start), `COMMIT`;
//! - `floor-int`: the same on a copy whose attempt, command and receipt rows are keyed
//!   by integers (the text ids kept in a unique column), with the ledger's columns,
//!   checks and partial indexes;
//! - `queue-int`: on that copy, what a plain job queue does: the candidates' ids
//!   only, and one `UPDATE` of the command row each.
//!
//! The floor's statements are written here as the ledger's SQLite layer writes them
//! (`src/ledger/sqlite/rows.rs`, `src/ledger/sql/write.rs`); `ROUNDS` (default 3) sets
//! the rounds. Figures and what they mean: `docs/performance.md`, "The floor of a
//! batched claim".

mod support;

use leasehold::bench::raw::{RawKind, SqliteRaw};
use leasehold::clock::SystemClock;
use leasehold::entropy::OsEntropy;
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::Ledger;
use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// As the `leasehold` binary and the criterion harness.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CLAIMERS: u32 = 4;
const BATCH: u32 = 32;
const LEASE_MS: u64 = 600_000;

/// The columns the ledger's candidate read answers, in its order.
const ATTEMPT_COLUMNS: &str =
    "a.id, a.plan_id, a.number, a.action, a.status, a.created_at, a.started_at, a.finished_at, a.error";
const COMMAND_COLUMNS: &str = "c.id, c.attempt_id, c.status, c.available_at, c.lease_owner, c.lease_token, \
     c.lease_until, c.last_heartbeat_at, c.delivery_count, c.last_error, c.finished_at";
const PLAN_COLUMNS: &str =
    "p.id, p.name, p.status, p.recovery, p.steps_json, p.volatile_fields_json, p.fingerprint, p.created_at";
const RECEIPT_COLUMNS: &str = "r.attempt_id, r.ordinal, r.step_code, r.idempotency_key, r.status, r.evidence, \
     r.evidence_sha256, r.target_receipt, r.error, r.started_at, r.finished_at";
/// Where the command's id and the attempt's id are in a candidate row.
const COMMAND_ID: usize = 9;
const ATTEMPT_ID: usize = 0;

/// What a floor run does per claimed command.
#[derive(Clone, Copy, PartialEq)]
enum Work {
    /// The whole record read; the command and the attempt written.
    Claim,
    /// The command's ids read; the command written.
    Queue,
}

fn main() {
    let jobs: u64 = support::bench_arg().and_then(|s| s.parse().ok()).unwrap_or(40_000);
    let rounds: u32 = std::env::var("ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let template = dir.path().join("template.db");
    rt.block_on(async {
        let ledger = Arc::new(open(&template));
        ledger.migrate().await.expect("migrate");
        leasehold::bench::prepare(ledger, "floor", jobs, 1, 1, Arc::default())
            .await
            .expect("prepare");
    });
    println!("{jobs} one-step commands, {CLAIMERS} claimers, {BATCH} per transaction; claims/s and ratio to raw");
    for round in 1..=rounds {
        let raw = SqliteRaw::new(dir.path())
            .run_blocking(RawKind::ClaimBatch, CLAIMERS, jobs)
            .expect("the raw loop")
            .per_s();
        let copy = |name: &str| {
            let path = dir.path().join(format!("{name}-{round}.db"));
            std::fs::copy(&template, &path).expect("copy the template");
            path
        };
        let ledger = leasehold_claims(&rt, &copy("ledger"), jobs);
        let floor_text = floor(&copy("floor"), jobs, Work::Claim, false);
        let int_path = copy("int");
        integer_keys(&int_path);
        let floor_int = floor(&int_path, jobs, Work::Claim, true);
        let int_path = copy("queue");
        integer_keys(&int_path);
        let queue_int = floor(&int_path, jobs, Work::Queue, true);
        let show = |name: &str, rate: f64| format!("{name} {rate:.0} ({:.2})", rate / raw);
        println!(
            "round {round}: raw {raw:.0}; {}; {}; {}; {}",
            show("leasehold", ledger),
            show("floor", floor_text),
            show("floor-int", floor_int),
            show("queue-int", queue_int),
        );
        for name in ["ledger", "floor", "int", "queue"] {
            remove(&dir.path().join(format!("{name}-{round}.db")));
        }
    }
}

fn open(path: &Path) -> SqliteLedger {
    SqliteLedger::open(
        path.to_str().expect("a UTF-8 path"),
        Arc::new(SystemClock),
        Arc::new(OsEntropy),
    )
    .expect("open the ledger")
}

fn remove(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}

/// `Ledger::claim` at [`BATCH`] from [`CLAIMERS`] tasks until the queue is empty.
fn leasehold_claims(rt: &tokio::runtime::Runtime, path: &Path, jobs: u64) -> f64 {
    let ledger = Arc::new(open(path));
    let began = Instant::now();
    let claimed = rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..CLAIMERS {
            let ledger = Arc::clone(&ledger);
            tasks.spawn(async move {
                let owner = format!("claimer-{w}");
                let mut claimed = 0u64;
                loop {
                    let got = ledger.claim(&owner, BATCH, LEASE_MS).await.expect("claim");
                    if got.is_empty() {
                        return claimed;
                    }
                    claimed += got.len() as u64;
                }
            });
        }
        let mut claimed = 0;
        while let Some(n) = tasks.join_next().await {
            claimed += n.expect("a claimer");
        }
        claimed
    });
    let elapsed = began.elapsed();
    assert_eq!(claimed, jobs, "the ledger claimed every command once");
    jobs as f64 / elapsed.as_secs_f64()
}

fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    i64::try_from(since.as_millis()).expect("milliseconds fit")
}

/// The candidate read: the ledger's (`rows::claim_sql`) for [`Work::Claim`], the ids
/// alone for [`Work::Queue`]; the same text whether the tables are keyed by text or
/// by integers.
fn candidate_read(work: Work) -> String {
    let window = "SELECT rowid AS rid FROM command WHERE status = 'PENDING' AND available_at <= ?1 \
                  ORDER BY available_at, id LIMIT ?2";
    match work {
        Work::Claim => format!(
            "SELECT {ATTEMPT_COLUMNS}, {COMMAND_COLUMNS}, {PLAN_COLUMNS}, {RECEIPT_COLUMNS} FROM ({window}) k \
             CROSS JOIN command c ON c.rowid = k.rid CROSS JOIN attempt a ON a.id = c.attempt_id \
             CROSS JOIN plan p ON p.id = a.plan_id LEFT JOIN receipt r ON r.attempt_id = a.id"
        ),
        // The command's id at the same place as in the whole read.
        Work::Queue => format!(
            "SELECT c.attempt_id, 0, 0, 0, 0, 0, 0, 0, 0, c.id FROM ({window}) k CROSS JOIN command c ON c.rowid = k.rid"
        ),
    }
}

/// The ledger's guarded claim `UPDATE` of a command (the columns a claim changes, the
/// `Claimable(now)` guard), and its attempt `UPDATE`.
const UPDATE_COMMAND: &str = "UPDATE command SET status = ?2, lease_owner = ?3, lease_token = ?4, lease_until = ?5, \
     last_heartbeat_at = ?6, delivery_count = ?7 WHERE id = ?1 \
     AND ((status = 'PENDING' AND available_at <= ?8) OR (status = 'PROCESSING' AND lease_until < ?9))";
const UPDATE_ATTEMPT: &str = "UPDATE attempt SET status = ?2, started_at = ?3 WHERE id = ?1";
const ANY_EXPIRED: &str = "SELECT EXISTS (SELECT 1 FROM command WHERE status = 'PROCESSING' AND lease_until < ?1)";

/// [`CLAIMERS`] threads, each on its own connection with the ledger's settings,
/// claiming [`BATCH`] commands per transaction with `work` until none is left.
fn floor(path: &Path, jobs: u64, work: Work, integer: bool) -> f64 {
    let read = candidate_read(work);
    let claimed = AtomicU64::new(0);
    let start = Barrier::new(CLAIMERS as usize);
    let began: Mutex<Option<Instant>> = Mutex::new(None);
    std::thread::scope(|s| {
        for w in 0..CLAIMERS {
            let (read, claimed, start, began) = (&read, &claimed, &start, &began);
            s.spawn(move || {
                let conn = Connection::open(path).expect("open");
                conn.busy_timeout(Duration::from_secs(5)).expect("busy timeout");
                conn.pragma_update(None, "synchronous", "NORMAL").expect("synchronous");
                conn.pragma_update(None, "foreign_keys", "ON").expect("foreign keys");
                conn.pragma_update(None, "cache_size", -32_768).expect("cache size");
                conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
                    .expect("QPSG");
                start.wait();
                began.lock().expect("the start").get_or_insert_with(Instant::now);
                let mut serial = 0u64;
                while let Some(n) = floor_claim(&conn, read, work, integer, w, &mut serial) {
                    claimed.fetch_add(n, Ordering::Relaxed);
                }
            });
        }
    });
    let elapsed = began.into_inner().expect("the start").expect("started").elapsed();
    assert_eq!(claimed.into_inner(), jobs, "the floor claimed every command once");
    jobs as f64 / elapsed.as_secs_f64()
}

/// One claim transaction; `None` once nothing was left to claim.
fn floor_claim(conn: &Connection, read: &str, work: Work, integer: bool, worker: u32, serial: &mut u64) -> Option<u64> {
    while conn.execute_batch("BEGIN IMMEDIATE").is_err() {
        std::thread::yield_now();
    }
    let now = now_ms();
    let _: bool = conn
        .prepare_cached(ANY_EXPIRED)
        .expect("prepare")
        .query_row([now], |r| r.get(0))
        .expect("probe");
    let columns = match work {
        Work::Claim => 39,
        Work::Queue => 10,
    };
    let mut ids: Vec<(Value, Value)> = Vec::with_capacity(BATCH as usize);
    {
        let mut stmt = conn.prepare_cached(read).expect("prepare");
        let mut rows = stmt.query(rusqlite::params![now, i64::from(BATCH)]).expect("read");
        while let Some(row) = rows.next().expect("a row") {
            for i in 0..columns {
                row.get_ref(i).expect("a column");
            }
            let id = |i: usize| -> Value {
                if integer {
                    Value::Integer(row.get(i).expect("an integer id"))
                } else {
                    Value::Text(row.get(i).expect("a text id"))
                }
            };
            ids.push((id(COMMAND_ID), id(ATTEMPT_ID)));
        }
    }
    if ids.is_empty() {
        conn.execute_batch("COMMIT").expect("commit");
        return None;
    }
    for (command, attempt) in &ids {
        *serial += 1;
        let token = format!("{worker:08x}{serial:024x}");
        let values = [
            command.clone(),
            Value::Text("PROCESSING".into()),
            Value::Text(format!("claimer-{worker}")),
            Value::Text(token),
            Value::Integer(now + LEASE_MS as i64),
            Value::Integer(now),
            Value::Integer(1),
            Value::Integer(now),
            Value::Integer(now),
        ];
        update_one(conn, UPDATE_COMMAND, values);
        if work == Work::Claim {
            update_one(
                conn,
                UPDATE_ATTEMPT,
                [attempt.clone(), Value::Text("RUNNING".into()), Value::Integer(now)],
            );
        }
    }
    conn.execute_batch("COMMIT").expect("commit");
    Some(ids.len() as u64)
}

/// Runs an `UPDATE` that must match exactly one row (the guard held, the row exists).
fn update_one<const N: usize>(conn: &Connection, sql: &str, values: [Value; N]) {
    let n = conn
        .prepare_cached(sql)
        .expect("prepare")
        .execute(params_from_iter(values))
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_eq!(n, 1, "{sql} matched one row");
}

/// Rebuilds the attempt, command and receipt tables of the ledger at `path` keyed by
/// integers (each row's rowid; the text ids kept in a unique column `ext`), with the
/// ledger's columns, checks and indexes otherwise.
fn integer_keys(path: &Path) {
    let conn = Connection::open(path).expect("open");
    conn.execute_batch(
        "PRAGMA foreign_keys = OFF;
         BEGIN;
         CREATE TABLE attempt_i (
             id INTEGER PRIMARY KEY, ext TEXT NOT NULL UNIQUE,
             plan_id TEXT NOT NULL REFERENCES plan (id),
             number INTEGER NOT NULL CHECK (number >= 1),
             action TEXT NOT NULL CHECK (action = 'execute' OR action = 'retry' OR action = 'compensate'),
             status TEXT NOT NULL CHECK (status = 'QUEUED' OR status = 'RUNNING' OR status = 'SUCCEEDED'
                                         OR status = 'FAILED' OR status = 'ABORTED'),
             created_at INTEGER NOT NULL, started_at INTEGER, finished_at INTEGER, error TEXT, room BLOB,
             UNIQUE (plan_id, number));
         INSERT INTO attempt_i SELECT rowid, id, plan_id, number, action, status, created_at, started_at,
             finished_at, error, room FROM attempt;
         CREATE TABLE command_i (
             id INTEGER PRIMARY KEY, ext TEXT NOT NULL UNIQUE,
             attempt_id INTEGER NOT NULL UNIQUE REFERENCES attempt_i (id),
             status TEXT NOT NULL CHECK (status = 'PENDING' OR status = 'PROCESSING' OR status = 'DELIVERED'
                                         OR status = 'FAILED' OR status = 'ABORTED'),
             available_at INTEGER NOT NULL, lease_owner TEXT, lease_token TEXT, lease_until INTEGER,
             last_heartbeat_at INTEGER,
             delivery_count INTEGER NOT NULL DEFAULT 0 CHECK (delivery_count >= 0),
             last_error TEXT, finished_at INTEGER, room BLOB,
             CHECK (status <> 'PROCESSING' OR (lease_token IS NOT NULL AND lease_until IS NOT NULL)));
         INSERT INTO command_i SELECT c.rowid, c.id, a.rowid, c.status, c.available_at, c.lease_owner,
             c.lease_token, c.lease_until, c.last_heartbeat_at, c.delivery_count, c.last_error, c.finished_at,
             c.room FROM command c JOIN attempt a ON a.id = c.attempt_id;
         CREATE TABLE receipt_i (
             attempt_id INTEGER NOT NULL REFERENCES attempt_i (id), ordinal INTEGER NOT NULL CHECK (ordinal >= 1),
             step_code TEXT NOT NULL, idempotency_key TEXT NOT NULL,
             status TEXT NOT NULL CHECK (status = 'PENDING' OR status = 'RUNNING' OR status = 'SUCCEEDED'
                                         OR status = 'FAILED' OR status = 'ABORTED'),
             evidence TEXT, evidence_sha256 TEXT, target_receipt TEXT, error TEXT, started_at INTEGER,
             finished_at INTEGER, room BLOB,
             PRIMARY KEY (attempt_id, ordinal), CHECK ((evidence IS NULL) = (evidence_sha256 IS NULL)));
         INSERT INTO receipt_i SELECT a.rowid, r.ordinal, r.step_code, r.idempotency_key, r.status, r.evidence,
             r.evidence_sha256, r.target_receipt, r.error, r.started_at, r.finished_at, r.room
             FROM receipt r JOIN attempt a ON a.id = r.attempt_id;
         DROP TABLE receipt; DROP TABLE command; DROP TABLE attempt;
         ALTER TABLE attempt_i RENAME TO attempt;
         ALTER TABLE command_i RENAME TO command;
         ALTER TABLE receipt_i RENAME TO receipt;
         CREATE INDEX command_pending ON command (available_at, id) WHERE status = 'PENDING';
         CREATE INDEX command_leased ON command (lease_until) WHERE status = 'PROCESSING';
         CREATE INDEX attempt_by_created ON attempt (created_at, id);
         CREATE INDEX attempt_failed ON attempt (created_at, id) WHERE status = 'FAILED';
         CREATE INDEX attempt_aborted ON attempt (created_at, id) WHERE status = 'ABORTED';
         COMMIT;
         VACUUM;",
    )
    .expect("rebuild with integer keys");
}
