//! Raw baselines: the least an outbox can do on a database, written by hand in plain
//! SQL, so that every leasehold figure can be read as a ratio to one measured in the
//! same process, on the same database kind, in the same run.
//!
//! Contract: [`RawBaseline::run`] builds a fresh one-table queue of `jobs` PENDING
//! jobs (untimed), starts `workers` workers at once, each on its own connection, that
//! work until nothing is PENDING (timed from their common start until the last one
//! ends), checks that every job was claimed exactly once, and drops the queue. What a
//! worker does per loop is the [`RawKind`]:
//! - [`RawKind::ClaimOne`]: one conditional claim (`UPDATE … WHERE status =
//!   'PENDING'` under a fresh token) per transaction;
//! - [`RawKind::ClaimBatch`]: the same, [`RAW_CLAIM_BATCH`] jobs per transaction;
//! - [`RawKind::ClaimThenComplete`]: claim one, then complete it with a token-checked
//!   `UPDATE` in a second transaction — the two-transaction loop a one-step delivery
//!   is compared with.
//!
//! Backends ([`for_ledger`] picks the one matching a ledger):
//! - [`SqliteRaw`]: a file database in WAL mode with the ledger's settings
//!   (`synchronous=NORMAL`, a 5 s busy timeout, `BEGIN IMMEDIATE`), one blocking
//!   thread per worker, an integer key; the claim is one `UPDATE … RETURNING`.
//! - [`MysqlRaw`]: an InnoDB table in the ledger's own database (so the server's
//!   durability settings are the ledger's), a session like the ledger's
//!   (`REPEATABLE READ`); the claim is `SELECT … FOR UPDATE SKIP LOCKED` and the
//!   conditional `UPDATE` in one transaction, the complete one autocommitted
//!   `UPDATE`. Deadlocks, lock-wait timeouts and snapshot conflicts are retried.
//! - [`PostgresRaw`]: a table in the ledger's own database, sessions from a pool built
//!   like the ledger's (same TLS and session settings); the claim is one autocommitted
//!   `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED) RETURNING`, the complete
//!   one autocommitted token-checked `UPDATE`.
//!
//! A further backend is one more `RawBaseline` implementation and one more arm in
//! [`for_ledger`].

use crate::ledger::mysql::{MysqlLedger, MysqlUrl};
use crate::ledger::postgres::{PostgresLedger, PostgresUrl};
use crate::ledger::sqlite::SqliteLedger;
use crate::ledger::LedgerError;
use std::any::Any;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Jobs per transaction of [`RawKind::ClaimBatch`].
pub const RAW_CLAIM_BATCH: u32 = 32;

/// What a raw worker does per loop (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawKind {
    /// One conditional claim per transaction.
    ClaimOne,
    /// [`RAW_CLAIM_BATCH`] claims per transaction.
    ClaimBatch,
    /// Claim one, then a token-checked complete: two transactions per job.
    ClaimThenComplete,
}

impl RawKind {
    /// The name the harnesses report it under.
    pub fn name(self) -> &'static str {
        match self {
            RawKind::ClaimOne => "claim-1-per-tx",
            RawKind::ClaimBatch => "claim-32-per-tx",
            RawKind::ClaimThenComplete => "claim-then-complete",
        }
    }

    fn limit(self) -> u32 {
        match self {
            RawKind::ClaimBatch => RAW_CLAIM_BATCH,
            RawKind::ClaimOne | RawKind::ClaimThenComplete => 1,
        }
    }
}

/// One timed raw run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RawRun {
    /// What the workers did.
    pub kind: RawKind,
    /// Concurrent workers.
    pub workers: u32,
    /// Jobs in the queue (each claimed, and completed if the kind completes, once).
    pub jobs: u64,
    /// From the workers' common start until the last one found nothing PENDING.
    #[serde(rename = "elapsed_ms", serialize_with = "super::as_millis")]
    pub elapsed: Duration,
}

impl RawRun {
    /// Jobs per second.
    pub fn per_s(&self) -> f64 {
        self.jobs as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// A boxed future, so that baselines can be chosen at run time.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A raw baseline on one database kind (see the module docs for the contract).
pub trait RawBaseline: Send + Sync {
    /// The database kind, for reports.
    fn backend(&self) -> &'static str;

    /// Runs `workers` workers of `kind` over a fresh queue of `jobs` jobs.
    fn run(&self, kind: RawKind, workers: u32, jobs: u64) -> BoxFuture<'_, Result<RawRun, LedgerError>>;
}

/// The raw baseline on the database kind of `ledger` (any [`crate::ledger::Ledger`]),
/// if it has one: the memory ledger has none.
pub fn for_ledger(ledger: &dyn Any) -> Option<Box<dyn RawBaseline>> {
    if ledger.is::<SqliteLedger>() {
        return Some(Box::new(SqliteRaw::new(std::env::temp_dir())));
    }
    if let Some(mysql) = ledger.downcast_ref::<MysqlLedger>() {
        return Some(Box::new(MysqlRaw::new(mysql.url().clone())));
    }
    if let Some(postgres) = ledger.downcast_ref::<PostgresLedger>() {
        return Some(Box::new(PostgresRaw::new(postgres.url().clone())));
    }
    None
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A name no other run of this process (or another one) uses at the same time.
fn unique_name(prefix: &str) -> String {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}{}_{}_{}",
        std::process::id(),
        now_ms(),
        SERIAL.fetch_add(1, Ordering::Relaxed)
    )
}

// ---------------------------------------------------------------------------------
// SQLite.

/// The raw baseline on SQLite: queue files in a directory of the caller's choice.
#[derive(Debug, Clone)]
pub struct SqliteRaw {
    dir: PathBuf,
}

impl SqliteRaw {
    /// Queues are created (and removed) in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Runs on the calling thread, blocking it (the workers are threads of their own).
    pub fn run_blocking(&self, kind: RawKind, workers: u32, jobs: u64) -> Result<RawRun, LedgerError> {
        let path = self.dir.join(format!("{}.db", unique_name("leasehold-raw-")));
        let result = sqlite_run(&path, kind, workers.max(1), jobs);
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
        result
    }
}

impl RawBaseline for SqliteRaw {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn run(&self, kind: RawKind, workers: u32, jobs: u64) -> BoxFuture<'_, Result<RawRun, LedgerError>> {
        let raw = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || raw.run_blocking(kind, workers, jobs))
                .await
                .map_err(|e| LedgerError::Internal(format!("raw baseline thread: {e}")))?
        })
    }
}

fn sqlite_error(e: rusqlite::Error) -> LedgerError {
    LedgerError::Internal(format!("raw baseline (sqlite): {e}"))
}

/// A connection as every baseline worker opens it (the ledger's settings).
fn sqlite_open(path: &Path) -> Result<rusqlite::Connection, LedgerError> {
    let conn = rusqlite::Connection::open(path).map_err(sqlite_error)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(sqlite_error)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite_error)?;
    // As the ledger's: plans never depend on bound values, so a cached statement is
    // not prepared again on every use (see `SqliteCore::open_with`).
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(sqlite_error)?;
    Ok(conn)
}

/// A fresh queue in WAL mode with `jobs` PENDING jobs; the connection that made it
/// stays open during the run, as a ledger keeps its own.
fn sqlite_queue(path: &Path, jobs: u64) -> Result<rusqlite::Connection, LedgerError> {
    let mut conn = sqlite_open(path)?;
    let _: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(sqlite_error)?;
    conn.execute_batch(
        "CREATE TABLE job (id INTEGER PRIMARY KEY, status TEXT NOT NULL, available_at INTEGER NOT NULL, \
         lease_token TEXT, lease_until INTEGER, attempts INTEGER NOT NULL DEFAULT 0, finished_at INTEGER);
         CREATE INDEX job_claimable ON job (status, available_at);",
    )
    .map_err(sqlite_error)?;
    let tx = conn.transaction().map_err(sqlite_error)?;
    {
        let mut insert = tx
            .prepare("INSERT INTO job (status, available_at) VALUES ('PENDING', ?1)")
            .map_err(sqlite_error)?;
        for i in 0..jobs {
            insert.execute([i as i64]).map_err(sqlite_error)?;
        }
    }
    tx.commit().map_err(sqlite_error)?;
    Ok(conn)
}

/// `BEGIN IMMEDIATE`, tried again while SQLite answers busy at once (as it may in WAL
/// mode without calling the busy handler), as a ledger's caller retries `Unavailable`.
fn begin_immediate(conn: &rusqlite::Connection) -> Result<(), LedgerError> {
    loop {
        match conn.prepare_cached("BEGIN IMMEDIATE").and_then(|mut s| s.execute([])) {
            Ok(_) => return Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::DatabaseBusy => {
                std::thread::yield_now();
            }
            Err(e) => return Err(sqlite_error(e)),
        }
    }
}

fn commit(conn: &rusqlite::Connection) -> Result<(), LedgerError> {
    conn.prepare_cached("COMMIT")
        .and_then(|mut s| s.execute([]))
        .map(drop)
        .map_err(sqlite_error)
}

/// One SQLite worker: opens its connection, waits for the others, then claims (and
/// completes) until nothing is PENDING; answers when it started (after the barrier)
/// and the jobs it claimed.
fn sqlite_worker(path: &Path, kind: RawKind, worker: u32, start: &Barrier) -> (Instant, Result<u64, LedgerError>) {
    let conn = sqlite_open(path);
    // Every worker passes the barrier, even one that could not open its connection.
    start.wait();
    let started = Instant::now();
    (started, conn.and_then(|conn| sqlite_work(&conn, kind, worker)))
}

/// The loop of [`sqlite_worker`] on its open connection.
fn sqlite_work(conn: &rusqlite::Connection, kind: RawKind, worker: u32) -> Result<u64, LedgerError> {
    let mut claimed = 0u64;
    let mut serial = 0u64;
    // `+status` keeps the planner on the primary key for the outer `UPDATE`: on the
    // status index it would scan every PENDING job per claim.
    let claim_sql = "UPDATE job SET status = 'PROCESSING', lease_token = ?1 || '-' || id, lease_until = ?2, \
                     attempts = attempts + 1 \
                     WHERE id IN (SELECT id FROM job WHERE status = 'PENDING' AND available_at <= ?3 \
                                  ORDER BY available_at, id LIMIT ?4) AND +status = 'PENDING' \
                     RETURNING id, lease_token";
    let complete_sql = "UPDATE job SET status = 'DONE', lease_token = NULL, finished_at = ?3 \
                        WHERE id = ?1 AND status = 'PROCESSING' AND lease_token = ?2";
    loop {
        serial += 1;
        let token = format!("{worker:08x}{serial:024x}");
        let now = now_ms();
        begin_immediate(conn)?;
        let got: Vec<(i64, String)> = {
            let mut claim = conn.prepare_cached(claim_sql).map_err(sqlite_error)?;
            let rows = claim
                .query_map(rusqlite::params![token, now + 60_000, now, kind.limit()], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .map_err(sqlite_error)?;
            rows.collect::<Result<_, _>>().map_err(sqlite_error)?
        };
        commit(conn)?;
        if got.is_empty() {
            return Ok(claimed);
        }
        claimed += got.len() as u64;
        if kind == RawKind::ClaimThenComplete {
            for (id, token) in got {
                begin_immediate(conn)?;
                let n = conn
                    .prepare_cached(complete_sql)
                    .map_err(sqlite_error)?
                    .execute(rusqlite::params![id, token, now_ms()])
                    .map_err(sqlite_error)?;
                commit(conn)?;
                if n != 1 {
                    return Err(LedgerError::Internal(format!(
                        "raw baseline (sqlite): the token-checked complete of job {id} matched {n} rows"
                    )));
                }
            }
        }
    }
}

fn sqlite_run(path: &Path, kind: RawKind, workers: u32, jobs: u64) -> Result<RawRun, LedgerError> {
    let _keep = sqlite_queue(path, jobs)?;
    let start = Arc::new(Barrier::new(workers as usize + 1));
    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let (path, start) = (path.to_owned(), Arc::clone(&start));
            std::thread::spawn(move || sqlite_worker(&path, kind, w, &start))
        })
        .collect();
    start.wait();
    // Timed from the first worker's start, as each worker saw it: this thread may
    // be scheduled out after the barrier while the workers run.
    let mut began = Instant::now();
    let mut claimed = 0;
    let mut failure = None;
    for thread in threads {
        match thread.join() {
            Ok((started, result)) => {
                began = began.min(started);
                match result {
                    Ok(n) => claimed += n,
                    Err(e) => failure = Some(e),
                }
            }
            Err(_) => failure = Some(LedgerError::Internal("raw baseline (sqlite): a worker panicked".into())),
        }
    }
    let elapsed = began.elapsed();
    finish(kind, workers, jobs, claimed, elapsed, failure)
}

fn finish(
    kind: RawKind,
    workers: u32,
    jobs: u64,
    claimed: u64,
    elapsed: Duration,
    failure: Option<LedgerError>,
) -> Result<RawRun, LedgerError> {
    if let Some(e) = failure {
        return Err(e);
    }
    if claimed != jobs {
        return Err(LedgerError::Internal(format!(
            "raw baseline: {claimed} claims of {jobs} jobs, not one each"
        )));
    }
    Ok(RawRun {
        kind,
        workers,
        jobs,
        elapsed,
    })
}

// ---------------------------------------------------------------------------------
// MySQL / MariaDB.

/// The raw baseline on MySQL or MariaDB: a scratch table in the ledger's database.
#[derive(Debug, Clone)]
pub struct MysqlRaw {
    url: MysqlUrl,
}

impl MysqlRaw {
    /// Queues are tables created (and dropped) in the database `url` names.
    pub fn new(url: MysqlUrl) -> Self {
        Self { url }
    }

    fn opts(&self) -> mysql_async::OptsBuilder {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname(self.url.host.clone())
            .tcp_port(self.url.port)
            .user(self.url.user.clone())
            .pass(self.url.expose_password().map(str::to_owned))
            .db_name(Some(self.url.database.clone()))
            .client_found_rows(true)
            .tcp_nodelay(true)
            .setup(vec![
                "SET time_zone = '+00:00'".to_owned(),
                "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ".to_owned(),
            ])
    }

    async fn connect(&self) -> Result<mysql_async::Conn, LedgerError> {
        mysql_async::Conn::new(self.opts())
            .await
            .map_err(|e| LedgerError::Unavailable(format!("raw baseline: mysql at {}: {e}", self.url)))
    }
}

fn mysql_error(e: mysql_async::Error) -> LedgerError {
    LedgerError::Internal(format!("raw baseline (mysql): {e}"))
}

/// Whether trying the transaction again may succeed: a deadlock, a lock-wait timeout
/// or (MariaDB) a snapshot conflict, as the ledger retries them.
fn mysql_retryable(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if matches!(s.code, 1213 | 1205 | 1020))
}

impl RawBaseline for MysqlRaw {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    fn run(&self, kind: RawKind, workers: u32, jobs: u64) -> BoxFuture<'_, Result<RawRun, LedgerError>> {
        Box::pin(async move {
            let table = unique_name("lh_raw_");
            let mut admin = self.connect().await?;
            let result = mysql_run(self, &mut admin, &table, kind, workers.max(1), jobs).await;
            use mysql_async::prelude::Queryable;
            let dropped = admin.query_drop(format!("DROP TABLE IF EXISTS `{table}`")).await;
            let _ = admin.disconnect().await;
            let run = result?;
            dropped.map_err(mysql_error)?;
            Ok(run)
        })
    }
}

async fn mysql_run(
    raw: &MysqlRaw,
    admin: &mut mysql_async::Conn,
    table: &str,
    kind: RawKind,
    workers: u32,
    jobs: u64,
) -> Result<RawRun, LedgerError> {
    use mysql_async::prelude::Queryable;
    admin
        .query_drop(format!(
            "CREATE TABLE `{table}` (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, status VARCHAR(16) NOT NULL, \
             available_at BIGINT NOT NULL, lease_token VARCHAR(64) NULL, lease_until BIGINT NULL, \
             attempts INT NOT NULL DEFAULT 0, finished_at BIGINT NULL, \
             KEY job_claimable (status, available_at, id)) ENGINE = InnoDB"
        ))
        .await
        .map_err(mysql_error)?;
    let mut filled = 0u64;
    while filled < jobs {
        let chunk = (jobs - filled).min(1_000);
        let values: Vec<String> = (filled..filled + chunk).map(|i| format!("('PENDING', {i})")).collect();
        admin
            .query_drop(format!(
                "INSERT INTO `{table}` (status, available_at) VALUES {}",
                values.join(", ")
            ))
            .await
            .map_err(mysql_error)?;
        filled += chunk;
    }
    let mut conns = Vec::with_capacity(workers as usize);
    for _ in 0..workers {
        conns.push(raw.connect().await?);
    }
    let workers_run = conns
        .into_iter()
        .enumerate()
        .map(|(w, conn)| mysql_worker(conn, table.to_owned(), kind, w as u32));
    run_tasks("mysql", kind, workers, jobs, workers_run).await
}

/// Starts every worker at once, waits for all of them, and checks the run.
async fn run_tasks<F>(
    backend: &str,
    kind: RawKind,
    workers: u32,
    jobs: u64,
    tasks_to_run: impl Iterator<Item = F>,
) -> Result<RawRun, LedgerError>
where
    F: Future<Output = Result<u64, LedgerError>> + Send + 'static,
{
    let began = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for task in tasks_to_run {
        tasks.spawn(task);
    }
    let mut claimed = 0;
    let mut failure = None;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(n)) => claimed += n,
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(LedgerError::Internal(format!("raw baseline ({backend}) worker: {e}"))),
        }
    }
    let elapsed = began.elapsed();
    finish(kind, workers, jobs, claimed, elapsed, failure)
}

/// One MySQL worker on its own connection: claims (and completes) until nothing is
/// PENDING; answers the jobs it claimed.
async fn mysql_worker(
    mut conn: mysql_async::Conn,
    table: String,
    kind: RawKind,
    worker: u32,
) -> Result<u64, LedgerError> {
    use mysql_async::prelude::Queryable;
    let select = format!(
        "SELECT id FROM `{table}` WHERE status = 'PENDING' AND available_at <= ? ORDER BY available_at, id \
         LIMIT {} FOR UPDATE SKIP LOCKED",
        kind.limit()
    );
    let complete = format!(
        "UPDATE `{table}` SET status = 'DONE', lease_token = NULL, finished_at = ? \
         WHERE id = ? AND status = 'PROCESSING' AND lease_token = ?"
    );
    let mut claimed = 0u64;
    let mut serial = 0u64;
    loop {
        serial += 1;
        let token = format!("{worker:08x}{serial:024x}");
        let now = now_ms();
        let got = loop {
            match mysql_claim(&mut conn, &table, &select, &token, now).await {
                Ok(Some(got)) => break got,
                // Rolled back: try again.
                Ok(None) => continue,
                Err(e) if mysql_retryable(&e) => continue,
                Err(e) => return Err(mysql_error(e)),
            }
        };
        if got.is_empty() {
            let _ = conn.disconnect().await;
            return Ok(claimed);
        }
        claimed += got.len() as u64;
        if kind == RawKind::ClaimThenComplete {
            for id in got {
                loop {
                    match conn.exec_drop(&complete, (now_ms(), id, token.as_str())).await {
                        Ok(()) => break,
                        Err(e) if mysql_retryable(&e) => continue,
                        Err(e) => return Err(mysql_error(e)),
                    }
                }
                if conn.affected_rows() != 1 {
                    return Err(LedgerError::Internal(format!(
                        "raw baseline (mysql): the token-checked complete of job {id} matched {} rows",
                        conn.affected_rows()
                    )));
                }
            }
        }
    }
}

/// One claim transaction: lock up to the kind's limit of PENDING jobs, skipping those
/// another worker holds, and take them with a conditional `UPDATE`. `None`: rolled
/// back, try again.
async fn mysql_claim(
    conn: &mut mysql_async::Conn,
    table: &str,
    select: &str,
    token: &str,
    now: i64,
) -> Result<Option<Vec<i64>>, mysql_async::Error> {
    use mysql_async::prelude::Queryable;
    let mut tx = conn.start_transaction(mysql_async::TxOpts::default()).await?;
    let ids: Vec<i64> = tx.exec(select, (now,)).await?;
    if !ids.is_empty() {
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        tx.exec_drop(
            format!(
                "UPDATE `{table}` SET status = 'PROCESSING', lease_token = ?, lease_until = ?, \
                 attempts = attempts + 1 WHERE id IN ({}) AND status = 'PENDING'",
                list.join(", ")
            ),
            (token, now + 60_000),
        )
        .await?;
        if tx.affected_rows() != ids.len() as u64 {
            // Not reached: the rows are locked by this transaction.
            tx.rollback().await?;
            return Ok(None);
        }
    }
    tx.commit().await?;
    Ok(Some(ids))
}

// ---------------------------------------------------------------------------------
// PostgreSQL.

/// The raw baseline on PostgreSQL: a scratch table in the ledger's database.
#[derive(Debug, Clone)]
pub struct PostgresRaw {
    url: PostgresUrl,
}

impl PostgresRaw {
    /// Queues are tables created (and dropped) in the database `url` names.
    pub fn new(url: PostgresUrl) -> Self {
        Self { url }
    }
}

fn postgres_error(e: tokio_postgres::Error) -> LedgerError {
    LedgerError::Internal(format!("raw baseline (postgres): {e}"))
}

impl RawBaseline for PostgresRaw {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn run(&self, kind: RawKind, workers: u32, jobs: u64) -> BoxFuture<'_, Result<RawRun, LedgerError>> {
        Box::pin(async move {
            let workers = workers.max(1);
            // Sessions as the ledger's are made (TLS, timeouts), one per worker and
            // one to create and drop the table.
            let mut url = self.url.clone();
            url.options.pool_max = workers as usize + 1;
            let pool = PostgresLedger::open(&url, Arc::new(crate::entropy::OsEntropy))?;
            let table = unique_name("lh_raw_");
            let admin = pool.session().await?;
            let result = postgres_run(&pool, &admin, &table, kind, workers, jobs).await;
            let dropped = admin.batch_execute(&format!("DROP TABLE IF EXISTS {table}")).await;
            let run = result?;
            dropped.map_err(postgres_error)?;
            Ok(run)
        })
    }
}

async fn postgres_run(
    pool: &PostgresLedger,
    admin: &tokio_postgres::Client,
    table: &str,
    kind: RawKind,
    workers: u32,
    jobs: u64,
) -> Result<RawRun, LedgerError> {
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, status TEXT NOT NULL, \
             available_at BIGINT NOT NULL, lease_token TEXT NULL, lease_until BIGINT NULL, \
             attempts INT NOT NULL DEFAULT 0, finished_at BIGINT NULL); \
             CREATE INDEX {table}_claimable ON {table} (available_at, id) WHERE status = 'PENDING'; \
             INSERT INTO {table} (status, available_at) SELECT 'PENDING', g FROM generate_series(0, {last}) g; \
             ANALYZE {table}",
            last = jobs as i64 - 1
        ))
        .await
        .map_err(postgres_error)?;
    let mut sessions = Vec::with_capacity(workers as usize);
    for _ in 0..workers {
        sessions.push(pool.session().await?);
    }
    let workers_run = sessions
        .into_iter()
        .enumerate()
        .map(|(w, session)| postgres_worker(session, table.to_owned(), kind, w as u32));
    run_tasks("postgres", kind, workers, jobs, workers_run).await
}

/// One PostgreSQL worker on its own session: claims (and completes) until nothing is
/// PENDING; answers the jobs it claimed.
async fn postgres_worker(
    session: deadpool_postgres::Client,
    table: String,
    kind: RawKind,
    worker: u32,
) -> Result<u64, LedgerError> {
    let claim = session
        .prepare(&format!(
            "UPDATE {table} SET status = 'PROCESSING', lease_token = $1 || '-' || id, lease_until = $2, \
             attempts = attempts + 1 \
             WHERE id IN (SELECT id FROM {table} WHERE status = 'PENDING' AND available_at <= $3 \
                          ORDER BY available_at, id LIMIT {} FOR UPDATE SKIP LOCKED) \
             RETURNING id, lease_token",
            kind.limit()
        ))
        .await
        .map_err(postgres_error)?;
    let complete = session
        .prepare(&format!(
            "UPDATE {table} SET status = 'DONE', lease_token = NULL, finished_at = $3 \
             WHERE id = $1 AND status = 'PROCESSING' AND lease_token = $2"
        ))
        .await
        .map_err(postgres_error)?;
    let mut claimed = 0u64;
    let mut serial = 0u64;
    loop {
        serial += 1;
        let token = format!("{worker:08x}{serial:024x}");
        let now = now_ms();
        let rows = session
            .query(&claim, &[&token, &(now + 60_000), &now])
            .await
            .map_err(postgres_error)?;
        if rows.is_empty() {
            return Ok(claimed);
        }
        claimed += rows.len() as u64;
        if kind == RawKind::ClaimThenComplete {
            for row in rows {
                let (id, token): (i64, String) = (row.get(0), row.get(1));
                let n = session
                    .execute(&complete, &[&id, &token, &now_ms()])
                    .await
                    .map_err(postgres_error)?;
                if n != 1 {
                    return Err(LedgerError::Internal(format!(
                        "raw baseline (postgres): the token-checked complete of job {id} matched {n} rows"
                    )));
                }
            }
        }
    }
}
