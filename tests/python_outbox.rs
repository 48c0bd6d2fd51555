//! `examples/python/take_order.py` against a scratch PostgreSQL and a scratch MySQL /
//! MariaDB database: the order row and its attempt commit together, a retried call
//! answers the attempt it already has, a rolled-back call leaves neither, and a
//! worker delivers the committed attempt with the payload the template resolved from
//! the Python caller's input. Needs `LEASEHOLD_TEST_PYTHON` (a Python 3 with psycopg 3
//! and PyMySQL, e.g. Debian's /usr/bin/python3 with python3-psycopg and
//! python3-pymysql) and the database variables; without them a test prints why it
//! is skipped and passes.

use leasehold::clock::SystemClock;
use leasehold::engine::lease::WorkerConfig;
use leasehold::engine::{AttemptId, AttemptStatus, PlanId, PlanSpec};
use leasehold::entropy::OsEntropy;
use leasehold::executor::Executors;
use leasehold::ledger::Ledger;
use leasehold::worker::{RunOptions, Worker};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

const PYTHON_VAR: &str = "LEASEHOLD_TEST_PYTHON";

fn python() -> Option<String> {
    match std::env::var(PYTHON_VAR) {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            println!("skipped: {PYTHON_VAR} is not set (e.g. {PYTHON_VAR}=/usr/bin/python3 with python3-psycopg and python3-pymysql)");
            None
        }
    }
}

fn template() -> PlanSpec {
    serde_json::from_value(json!({
        "name": "push-order",
        "recovery": "resume",
        "input": {
            "order": {"type": "string", "required": true},
            "total_cents": {"type": "integer", "required": true}
        },
        "steps": [{"code": "push", "executor": "dry-run:v1",
                   "payload": {"order": {"$input": "/order"}, "total": {"$input": "/total_cents"}}}]
    }))
    .expect("the template")
}

/// Runs the example with `db` (`--postgres URL` or `--mysql URL`); its JSON line.
fn take_order(python: &str, db: [&str; 2], plan: &PlanId, order: &str, rollback: bool) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python/take_order.py");
    let mut cmd = Command::new(python);
    cmd.arg(script)
        .args(db)
        .args(["--plan", plan.as_str(), "--order", order, "--total-cents", "4200"]);
    if rollback {
        cmd.arg("--rollback");
    }
    let out = cmd.output().expect("python runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "take_order.py failed: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// Takes o-1 twice and o-2 rolled back, then delivers; answers o-1's attempt.
async fn take_and_deliver<L: Ledger>(ledger: Arc<L>, python: &str, db: [&str; 2]) -> AttemptId {
    let plan = ledger
        .register_plan(template(), &Executors::new().names())
        .await
        .expect("register")
        .id;
    let first = take_order(python, db, &plan, "o-1", false);
    assert_eq!(first["created"], true, "{first}");
    let again = take_order(python, db, &plan, "o-1", false);
    assert_eq!(
        (&again["attempt_id"], &again["created"]),
        (&first["attempt_id"], &json!(false))
    );
    let rolled_back = take_order(python, db, &plan, "o-2", true);
    let gone = AttemptId::new(rolled_back["attempt_id"].as_str().expect("an attempt id"));
    assert!(ledger.attempt(&gone).await.is_err(), "a rolled-back attempt remains");
    let id = AttemptId::new(first["attempt_id"].as_str().expect("an attempt id"));
    let worker = Worker::new(
        "python-shop",
        ledger.clone(),
        Arc::new(Executors::new()),
        Arc::new(SystemClock),
        WorkerConfig::clamped(true, 10, 5, 5_000),
    );
    let options = RunOptions {
        until_idle: true,
        grace_ms: 0,
    };
    let report = worker.run(std::future::pending(), options).await;
    assert_eq!((report.claimed, report.delivered, report.failed), (1, 1, 0));
    let record = ledger.attempt(&id).await.expect("the attempt");
    assert_eq!(record.attempt.status, AttemptStatus::Succeeded);
    assert_eq!(
        record.receipts[0].payload.as_deref(),
        Some(r#"{"order":"o-1","total":4200}"#)
    );
    id
}

#[tokio::test]
async fn python_takes_an_order_on_postgres() {
    use leasehold::ledger::postgres::scratch::ScratchDatabase;
    use leasehold::ledger::postgres::{PostgresLedger, PostgresUrl};
    let Some(python) = python() else { return };
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_POSTGRES_URL") else {
        println!("skipped: LEASEHOLD_TEST_POSTGRES_URL is not set");
        return;
    };
    let admin = PostgresUrl::parse(&admin).expect("LEASEHOLD_TEST_POSTGRES_URL");
    let db = ScratchDatabase::create(&admin, "lh_python_")
        .await
        .expect("a scratch database");
    let ledger = Arc::new(PostgresLedger::open(db.url(), Arc::new(OsEntropy)).expect("open"));
    ledger.migrate().await.expect("migrate");
    let url = db.url().to_string();
    take_and_deliver(ledger, &python, ["--postgres", &url]).await;
    let orders: Vec<String> = {
        let (client, connection) = db
            .url()
            .config()
            .connect(leasehold::outbox::tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        let rows = client
            .query("SELECT id FROM orders ORDER BY id", &[])
            .await
            .expect("orders");
        rows.iter().map(|r| r.get(0)).collect()
    };
    assert_eq!(orders, vec!["o-1".to_owned()]);
}

#[tokio::test]
async fn python_takes_an_order_on_mysql() {
    use leasehold::ledger::mysql::scratch::ScratchDatabase;
    use leasehold::ledger::mysql::{MysqlLedger, MysqlUrl};
    use leasehold::outbox::mysql_async::prelude::Queryable;
    let Some(python) = python() else { return };
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
        println!("skipped: LEASEHOLD_TEST_MYSQL_URL is not set");
        return;
    };
    let admin = MysqlUrl::parse(&admin).expect("LEASEHOLD_TEST_MYSQL_URL");
    let db = ScratchDatabase::create(&admin, "lh_python_")
        .await
        .expect("a scratch database");
    let ledger = Arc::new(MysqlLedger::open(db.url(), Arc::new(OsEntropy)));
    ledger.migrate().await.expect("migrate");
    let url = db.url().to_string();
    take_and_deliver(ledger, &python, ["--mysql", &url]).await;
    let pool = leasehold::outbox::mysql_async::Pool::new(url.as_str());
    let mut conn = pool.get_conn().await.expect("connect");
    let orders: Vec<String> = conn.query("SELECT id FROM orders ORDER BY id").await.expect("orders");
    assert_eq!(orders, vec!["o-1".to_owned()]);
    drop(conn);
    pool.disconnect().await.expect("disconnect");
}
