//! Rolling upgrades (docs/upgrades.md): this binary plays the previous release.
//!
//! A synthetic next release is this binary's migrations plus one additive migration (a
//! column with a default, a table, an index), declared additive and recorded as written
//! by leasehold [`NEXT`]. On a database each backend migrated so (SQLite, MySQL,
//! PostgreSQL; the memory ledger has no schema), this binary's code runs the
//! conformance suite's core delivery path (register, enqueue, claim, step, finish,
//! routing) and, as the `leasehold` process, migrates (applying nothing, and saying
//! so), registers, enqueues, delivers with a worker (which says at start that it runs
//! on a newer, compatible schema) and gates. A release after it adds a breaking
//! migration (a column the current code reads, renamed), recorded as written by
//! [`AFTER_NEXT`]: then every command, `migrate` included, is refused with exit code 2,
//! naming the release it needs, and nothing is written.
//!
//! MySQL needs `LEASEHOLD_TEST_MYSQL_URL`, PostgreSQL `LEASEHOLD_TEST_POSTGRES_URL`;
//! without one, that backend's tests print why they are skipped and pass.

mod cli_support;
#[path = "conformance/mod.rs"]
#[allow(dead_code, unused_imports)]
mod conformance;

use cli_support::BIN;
use conformance::Harness;
use leasehold::clock::{Clock, ManualClock};
use leasehold::entropy::{Entropy, SeededEntropy};
use leasehold::ledger::migrate::{Compat, Migration, SQLITE};
use leasehold::ledger::mysql::scratch::ScratchDatabase as MyScratch;
use leasehold::ledger::mysql::{MysqlLedger, MysqlUrl};
use leasehold::ledger::postgres::scratch::ScratchDatabase as PgScratch;
use leasehold::ledger::postgres::{PostgresLedger, PostgresUrl};
use leasehold::ledger::sqlite::{OpenMode, SqliteLedger};
use leasehold::ledger::{Ledger, LedgerError};
use mysql_async::prelude::Queryable;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

/// The release the next schema is recorded as written by.
const NEXT: &str = "99.0.0";
/// The release after it, whose migration is breaking.
const AFTER_NEXT: &str = "99.1.0";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Mysql,
    Postgres,
}

impl Backend {
    /// This binary's migrations.
    fn current(self) -> &'static [Migration] {
        match self {
            Self::Sqlite => SQLITE,
            Self::Mysql => leasehold::ledger::mysql::schema::MIGRATIONS,
            Self::Postgres => leasehold::ledger::postgres::schema::MIGRATIONS,
        }
    }

    /// This binary's newest schema version.
    fn known(self) -> u32 {
        self.current().last().unwrap().version
    }

    /// The next release's additive migration: a column with a default on a table
    /// this binary writes, a table and an index it knows nothing of.
    fn additive_sql(self) -> &'static str {
        match self {
            Self::Sqlite => {
                "ALTER TABLE command ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
                 CREATE TABLE delivery_note (attempt_id TEXT NOT NULL PRIMARY KEY, note TEXT);
                 CREATE INDEX attempt_by_plan ON attempt (plan_id, created_at);"
            }
            Self::Mysql => {
                "ALTER TABLE command ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;
                 CREATE TABLE delivery_note (attempt_id VARCHAR(64) NOT NULL PRIMARY KEY, note TEXT) ENGINE = InnoDB;
                 CREATE INDEX attempt_by_plan ON attempt (plan_id, created_at);"
            }
            Self::Postgres => {
                "ALTER TABLE command ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;
                 CREATE TABLE delivery_note (attempt_id TEXT COLLATE \"C\" NOT NULL PRIMARY KEY, note TEXT);
                 CREATE INDEX attempt_by_plan ON attempt (plan_id, created_at);"
            }
        }
    }

    /// The release after's breaking migration: a column this binary reads, renamed.
    fn breaking_sql(self) -> &'static str {
        match self {
            Self::Sqlite | Self::Postgres => "ALTER TABLE command RENAME COLUMN last_error TO failure;",
            Self::Mysql => "ALTER TABLE command CHANGE last_error failure TEXT NULL;",
        }
    }

    /// The next release's migrations: this binary's and the additive one.
    fn next(self) -> &'static [Migration] {
        extended(
            self.current(),
            &[("next_additive", self.additive_sql(), Compat::Additive)],
        )
    }

    /// The release after's: the next release's and the breaking one.
    fn after_next(self) -> &'static [Migration] {
        extended(
            self.next(),
            &[("after_breaking", self.breaking_sql(), Compat::Breaking)],
        )
    }
}

/// `base` followed by `extra`, numbered on from it (leaked: a test's lifetime).
fn extended(base: &'static [Migration], extra: &[(&'static str, &'static str, Compat)]) -> &'static [Migration] {
    let mut list = base.to_vec();
    for (name, sql, compat) in extra {
        let version = list.last().unwrap().version + 1;
        list.push(Migration {
            version,
            name,
            sql,
            compat: *compat,
        });
    }
    Box::leak(list.into_boxed_slice())
}

/// What this binary's notice says of the next schema on `backend`.
fn notice(backend: Backend) -> String {
    format!(
        "the ledger's schema {} (written by leasehold {NEXT}) is newer than this binary's {} and compatible with it",
        backend.known() + 1,
        backend.known()
    )
}

/// What this binary's refusal of the release after's schema on `backend` says.
fn refusal(backend: Backend) -> String {
    let breaking = backend.known() + 2;
    format!(
        "has schema {breaking}, written by leasehold {AFTER_NEXT}, which needs the code of schema {breaking} or later; \
         this binary is leasehold {} (schema {}): upgrade to leasehold {AFTER_NEXT} or later",
        env!("CARGO_PKG_VERSION"),
        backend.known()
    )
}

/// Checks what a newer release's migrator answered: its own migration(s) only.
fn assert_applied(applied: Vec<u32>, from: u32, to: u32) {
    assert_eq!(
        applied,
        (from..=to).collect::<Vec<_>>(),
        "the newer release applies its own"
    );
}

// ---------------------------------------------------------------------------------
// The conformance suite's core path on the next schema, through this binary's code.

/// A SQLite ledger the next release migrated (after this one), opened by this
/// binary as every command but `migrate` opens it: the schema is checked on every
/// connection.
async fn sqlite_next(clock: Arc<ManualClock>) -> Option<Harness<SqliteLedger>> {
    let dir = tempfile::TempDir::new().expect("temporary directory");
    let path = dir.path().join("ledger.db").to_str().unwrap().to_owned();
    let ledger_clock: Arc<dyn Clock> = clock.clone();
    let entropy: Arc<dyn Entropy> = Arc::new(SeededEntropy::new(0x1ea5e));
    let setup = SqliteLedger::open(&path, ledger_clock.clone(), entropy.clone()).expect("open");
    setup.migrate().await.expect("this release migrates");
    let known = Backend::Sqlite.known();
    assert_applied(
        setup.migrate_as(Backend::Sqlite.next(), NEXT).await.unwrap(),
        known + 1,
        known + 1,
    );
    drop(setup);
    let open = move || {
        let handle = SqliteLedger::open_with(&path, OpenMode::Existing, ledger_clock.clone(), entropy.clone())
            .expect("this binary opens the next, compatible schema");
        std::future::ready(handle)
    };
    let ledger = open().await;
    accepts_the_next_schema(&ledger, Backend::Sqlite).await;
    Some(Harness::new(ledger, clock, open, dir))
}

/// A MySQL ledger the next release migrated, in a database of its own.
async fn mysql_next(clock: Arc<ManualClock>) -> Option<Harness<MysqlLedger>> {
    let admin = mysql_admin()?;
    let db = MyScratch::create(&admin, "lh_upgrade_").await.expect("a test database");
    let url = db.url().clone();
    let ledger_clock: Arc<dyn Clock> = clock.clone();
    let entropy: Arc<dyn Entropy> = Arc::new(SeededEntropy::new(0x1ea5e));
    let setup = MysqlLedger::open_with_clock(&url, ledger_clock.clone(), entropy.clone());
    setup.migrate().await.expect("this release migrates");
    let known = Backend::Mysql.known();
    assert_applied(
        setup.migrate_as(Backend::Mysql.next(), NEXT).await.unwrap(),
        known + 1,
        known + 1,
    );
    setup.disconnect().await.unwrap();
    let open = move || {
        std::future::ready(MysqlLedger::open_with_clock(
            &url,
            ledger_clock.clone(),
            entropy.clone(),
        ))
    };
    let ledger = open().await;
    ledger
        .check_schema()
        .await
        .expect("this binary accepts the next, compatible schema");
    accepts_the_next_schema(&ledger, Backend::Mysql).await;
    Some(Harness::new(ledger, clock, open, db))
}

/// A PostgreSQL ledger the next release migrated, in a database of its own.
async fn postgres_next(clock: Arc<ManualClock>) -> Option<Harness<PostgresLedger>> {
    let admin = postgres_admin()?;
    let db = PgScratch::create(&admin, "lh_upgrade_").await.expect("a test database");
    let url = db.url().clone();
    let ledger_clock: Arc<dyn Clock> = clock.clone();
    let entropy: Arc<dyn Entropy> = Arc::new(SeededEntropy::new(0x1ea5e));
    let setup = PostgresLedger::open_with_clock(&url, ledger_clock.clone(), entropy.clone()).unwrap();
    setup.migrate().await.expect("this release migrates");
    let known = Backend::Postgres.known();
    assert_applied(
        setup.migrate_as(Backend::Postgres.next(), NEXT).await.unwrap(),
        known + 1,
        known + 1,
    );
    drop(setup);
    let open = move || {
        std::future::ready(PostgresLedger::open_with_clock(&url, ledger_clock.clone(), entropy.clone()).unwrap())
    };
    let ledger = open().await;
    ledger
        .check_schema()
        .await
        .expect("this binary accepts the next, compatible schema");
    accepts_the_next_schema(&ledger, Backend::Postgres).await;
    Some(Harness::new(ledger, clock, open, db))
}

/// This binary's `migrate` applies nothing to the next schema, it is ready to serve
/// on it, and its notice names the schema and the release that wrote it.
async fn accepts_the_next_schema<L: Ledger>(ledger: &L, backend: Backend) {
    assert_eq!(ledger.migrate().await.unwrap(), Vec::<u32>::new(), "nothing to apply");
    assert_eq!(ledger.check_ready().await.unwrap(), Vec::<String>::new(), "ready");
    let said = ledger.schema_notice().await.unwrap().expect("a notice");
    assert!(said.starts_with(&notice(backend)), "{said}");
}

fn mysql_admin() -> Option<MysqlUrl> {
    match std::env::var("LEASEHOLD_TEST_MYSQL_URL") {
        Ok(url) if !url.is_empty() => Some(MysqlUrl::parse(&url).expect("LEASEHOLD_TEST_MYSQL_URL")),
        _ => {
            println!("skipped: LEASEHOLD_TEST_MYSQL_URL is not set");
            None
        }
    }
}

fn postgres_admin() -> Option<PostgresUrl> {
    match std::env::var("LEASEHOLD_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(PostgresUrl::parse(&url).expect("LEASEHOLD_TEST_POSTGRES_URL")),
        _ => {
            println!("skipped: LEASEHOLD_TEST_POSTGRES_URL is not set");
            None
        }
    }
}

/// The conformance tests of the core delivery path, on `$factory`'s ledgers.
macro_rules! core_path {
    ($module:ident, $factory:expr) => {
        mod $module {
            crate::conformance_suite!(@current_thread $factory;
                registering_the_same_content_twice_answers_the_same_plan,
                enqueue_writes_a_queued_attempt_pending_receipts_in_step_order_and_a_pending_command,
                claim_makes_the_command_processing_and_the_attempt_running_and_leaves_nothing_claimable,
                begin_complete_finish_delivers_with_canonical_evidence_and_its_sha256,
                complete_and_continue_delivers_n_steps_in_n_plus_one_transitions,
                fail_aborts_later_receipts_and_fails_the_attempt_and_command,
                claims_take_only_the_routes_the_worker_can_run,
            );
        }
    };
}

core_path!(sqlite_core, super::sqlite_next);
core_path!(mysql_core, super::mysql_next);
core_path!(postgres_core, super::postgres_next);

// ---------------------------------------------------------------------------------
// The `leasehold` process on the next schema, then on the release after's.

fn leasehold(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--db")
        .arg(url)
        .args(args)
        .env_remove("LEASEHOLD_DB")
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `args`, which must succeed; answers its stdout.
fn ok(url: &str, args: &[&str]) -> String {
    let out = leasehold(url, args);
    assert!(out.status.success(), "leasehold {args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// What a database holds that a refused command must leave alone: its attempts,
/// its newest schema version and its `schema_compat` rows.
const COUNTS: &str = "SELECT (SELECT COUNT(*) FROM attempt), (SELECT MAX(version) FROM schema_migrations), \
                      (SELECT COUNT(*) FROM schema_compat)";

/// On the next schema at `url`, this binary's processes migrate (nothing), register,
/// enqueue, deliver with a worker and gate; answers the plan and the attempt.
fn the_cli_delivers_on_the_next_schema(backend: Backend, url: &str, dir: &Path) -> (String, String) {
    let migrated = ok(url, &["migrate"]);
    assert!(
        migrated.starts_with(&notice(backend)) && migrated.trim_end().ends_with(": applied nothing"),
        "{migrated}"
    );
    let file = dir.join("plan.toml");
    std::fs::write(
        &file,
        "name = \"rollout\"\nrecovery = \"resume\"\n[[steps]]\ncode = \"a\"\nexecutor = \"dry-run:v1\"\n",
    )
    .unwrap();
    let plan = ok(url, &["plan", "add", file.to_str().unwrap()]);
    let plan = plan.split_whitespace().next().unwrap().to_owned();
    let attempt = ok(url, &["enqueue", &plan]).trim().to_owned();
    let worked = ok(url, &["worker", "--id", "old-1", "--until-idle"]);
    let first = worked.lines().next().unwrap_or_default();
    assert!(first.starts_with(&format!("[old-1] {}", notice(backend))), "{worked}");
    assert!(worked.contains("delivered 1"), "{worked}");
    let status: serde_json::Value = serde_json::from_str(&ok(url, &["--json", "status", &attempt])).unwrap();
    assert_eq!(status["attempt"]["status"], "SUCCEEDED", "{status}");
    assert_eq!(status["command"]["status"], "DELIVERED", "{status}");
    let gate: serde_json::Value = serde_json::from_str(&ok(url, &["--json", "gate", &plan])).unwrap();
    assert_eq!(gate["verdict"], "PASS", "{gate}");
    (plan, attempt)
}

/// On the release after's schema at `url`, every command this binary runs is
/// refused naming the release it needs, and `counts` (what the database holds) does
/// not change.
fn the_cli_refuses_the_breaking_schema(
    backend: Backend,
    url: &str,
    plan: &str,
    attempt: &str,
    counts: impl Fn() -> [i64; 3],
) {
    let before = counts();
    assert_eq!(
        before[1],
        i64::from(backend.known() + 2),
        "the breaking migration is applied"
    );
    for args in [
        vec!["migrate"],
        vec!["plan", "list"],
        vec!["enqueue", plan],
        vec!["status", attempt],
        vec!["worker", "--id", "old-2", "--until-idle"],
        vec!["gate", plan],
    ] {
        let out = leasehold(url, &args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&refusal(backend)), "{args:?}: {stderr}");
        assert_eq!(text(&out.stdout), "", "{args:?}");
    }
    assert_eq!(counts(), before, "a refused command writes nothing");
}

#[test]
fn sqlite_the_previous_release_runs_on_an_additive_schema_and_is_refused_on_a_breaking_one() {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("ledger.db").to_str().unwrap().to_owned();
    let url = format!("sqlite://{path}");
    ok(&url, &["migrate"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let next = |migrations: &'static [Migration], release: &'static str| {
        let ledger = SqliteLedger::open(
            &path,
            Arc::new(leasehold::clock::SystemClock),
            Arc::new(leasehold::entropy::OsEntropy),
        )
        .unwrap();
        runtime.block_on(ledger.migrate_as(migrations, release)).unwrap()
    };
    let known = Backend::Sqlite.known();
    assert_applied(next(Backend::Sqlite.next(), NEXT), known + 1, known + 1);
    let (plan, attempt) = the_cli_delivers_on_the_next_schema(Backend::Sqlite, &url, dir.path());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let priority: i64 = conn
        .query_row("SELECT priority FROM command", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        priority, 0,
        "the command this binary wrote took the new column's default"
    );
    assert_applied(next(Backend::Sqlite.after_next(), AFTER_NEXT), known + 2, known + 2);
    let counts = || {
        conn.query_row(COUNTS, [], |r| Ok([r.get::<_, i64>(0)?, r.get(1)?, r.get(2)?]))
            .unwrap()
    };
    the_cli_refuses_the_breaking_schema(Backend::Sqlite, &url, &plan, &attempt, counts);
    let e = SqliteLedger::open_with(
        &path,
        OpenMode::Existing,
        Arc::new(leasehold::clock::SystemClock),
        Arc::new(leasehold::entropy::OsEntropy),
    )
    .unwrap_err();
    assert!(
        matches!(&e, LedgerError::BadInput(m) if m.contains(&refusal(Backend::Sqlite))),
        "{e}"
    );
}

#[test]
fn mysql_the_previous_release_runs_on_an_additive_schema_and_is_refused_on_a_breaking_one() {
    let Some(admin) = mysql_admin() else { return };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let db = runtime.block_on(MyScratch::create(&admin, "lh_upgrade_")).unwrap();
    let raw = std::env::var("LEASEHOLD_TEST_MYSQL_URL").unwrap();
    let url = cli_support::mysql_url_of(&raw, &db.url().database);
    ok(&url, &["migrate"]);
    let next = |migrations: &'static [Migration], release: &'static str| {
        let ledger = MysqlLedger::open(db.url(), Arc::new(leasehold::entropy::OsEntropy));
        let applied = runtime.block_on(ledger.migrate_as(migrations, release)).unwrap();
        runtime.block_on(ledger.disconnect()).unwrap();
        applied
    };
    let known = Backend::Mysql.known();
    assert_applied(next(Backend::Mysql.next(), NEXT), known + 1, known + 1);
    let dir = tempfile::TempDir::new().unwrap();
    let (plan, attempt) = the_cli_delivers_on_the_next_schema(Backend::Mysql, &url, dir.path());
    assert_applied(next(Backend::Mysql.after_next(), AFTER_NEXT), known + 2, known + 2);
    let counts = || {
        runtime.block_on(async {
            let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
            let row: (i64, i64, i64) = conn.query_first(COUNTS).await.unwrap().unwrap();
            conn.disconnect().await.unwrap();
            [row.0, row.1, row.2]
        })
    };
    the_cli_refuses_the_breaking_schema(Backend::Mysql, &url, &plan, &attempt, counts);
}

#[test]
fn postgres_the_previous_release_runs_on_an_additive_schema_and_is_refused_on_a_breaking_one() {
    let Some(admin) = postgres_admin() else { return };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let db = runtime.block_on(PgScratch::create(&admin, "lh_upgrade_")).unwrap();
    let url = db.url().to_string();
    ok(&url, &["migrate"]);
    let next = |migrations: &'static [Migration], release: &'static str| {
        let ledger = PostgresLedger::open(db.url(), Arc::new(leasehold::entropy::OsEntropy)).unwrap();
        runtime.block_on(ledger.migrate_as(migrations, release)).unwrap()
    };
    let known = Backend::Postgres.known();
    assert_applied(next(Backend::Postgres.next(), NEXT), known + 1, known + 1);
    let dir = tempfile::TempDir::new().unwrap();
    let (plan, attempt) = the_cli_delivers_on_the_next_schema(Backend::Postgres, &url, dir.path());
    assert_applied(next(Backend::Postgres.after_next(), AFTER_NEXT), known + 2, known + 2);
    let counts = || {
        runtime.block_on(async {
            let (client, connection) = db.url().config().connect(tokio_postgres::NoTls).await.unwrap();
            let driver = tokio::spawn(connection);
            let row = client.query_one(COUNTS, &[]).await.unwrap();
            drop(client);
            let _ = driver.await;
            [row.get(0), row.get(1), row.get(2)]
        })
    };
    the_cli_refuses_the_breaking_schema(Backend::Postgres, &url, &plan, &attempt, counts);
}
