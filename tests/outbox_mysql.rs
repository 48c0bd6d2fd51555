//! Enqueue in the caller's own MySQL / MariaDB transaction ([`leasehold::outbox`])
//! against the server at `LEASEHOLD_TEST_MYSQL_URL` (e.g.
//! `mysql://root@127.0.0.1:3306/test`): the business row and its outbox rows commit or
//! roll back together, a worker delivers what was committed, and a refused enqueue
//! leaves nothing of itself in the transaction. Every test runs in a scratch database
//! of its own; without the variable every test prints why it is skipped and passes.

use leasehold::clock::SystemClock;
use leasehold::engine::driver::ExecutorResult;
use leasehold::engine::lease::WorkerConfig;
use leasehold::engine::{Action, AttemptStatus, CommandStatus, PlanId, PlanSpec, Refusal};
use leasehold::entropy::OsEntropy;
use leasehold::executor::{ExecRequest, Executor, Executors};
use leasehold::ledger::mysql::scratch::ScratchDatabase;
use leasehold::ledger::mysql::{MysqlLedger, MysqlUrl};
use leasehold::ledger::{Ledger, LedgerError};
use leasehold::outbox::mysql_async::prelude::Queryable;
use leasehold::outbox::mysql_async::{Conn, OptsBuilder, TxOpts};
use leasehold::outbox::Outbox;
use leasehold::worker::{RunOptions, Worker};
use serde_json::json;
use std::sync::Arc;

/// The variable that names the test server.
const URL_VAR: &str = "LEASEHOLD_TEST_MYSQL_URL";

/// A scratch database (dropped after the test) and the application's connection to it.
struct Shop {
    db: ScratchDatabase,
    conn: Conn,
}

/// A fresh scratch database with an `orders` table, migrated when `migrate`; `None`
/// (with the reason printed) without a test server.
async fn shop(migrate: bool) -> Option<(Shop, MysqlLedger)> {
    let admin = match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => MysqlUrl::parse(&url).unwrap_or_else(|e| panic!("{URL_VAR}: {e}")),
        _ => {
            println!("skipped: {URL_VAR} is not set (e.g. {URL_VAR}=mysql://root@127.0.0.1:3306/test)");
            return None;
        }
    };
    let db = ScratchDatabase::create(&admin, "lh_outbox_")
        .await
        .unwrap_or_else(|e| panic!("cannot create a test database at {admin}: {e}"));
    let ledger = MysqlLedger::open(db.url(), Arc::new(OsEntropy));
    if migrate {
        ledger.migrate().await.expect("migrate");
    }
    let url = db.url();
    let opts = OptsBuilder::default()
        .ip_or_hostname(url.host.clone())
        .tcp_port(url.port)
        .user(url.user.clone())
        .pass(url.expose_password().map(str::to_owned))
        .db_name(Some(url.database.clone()));
    let mut conn = Conn::new(opts).await.expect("the application's connection");
    conn.query_drop("CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, total_cents INT NOT NULL) ENGINE = InnoDB")
        .await
        .expect("orders table");
    Some((Shop { db, conn }, ledger))
}

/// A program's own executor: pushes the order it is given.
struct Crm;

impl Executor for Crm {
    async fn execute(&self, request: ExecRequest) -> ExecutorResult {
        let order = request.step.payload["order"].as_str().unwrap_or_default().to_owned();
        ExecutorResult::Done {
            evidence: json!({"pushed": order}),
            target_receipt: json!({"crm_id": format!("crm-{order}")}),
        }
    }
}

fn executors() -> Executors {
    Executors::builder().register("crm:v1", Crm).build().expect("registry")
}

fn order_plan(order: &str) -> PlanSpec {
    serde_json::from_value(json!({
        "name": format!("deliver-order-{order}"),
        "recovery": "resume",
        "steps": [{"code": "push", "executor": "crm:v1", "payload": {"order": order}}],
    }))
    .expect("a valid plan")
}

/// Rows per table: (orders, plan, attempt, receipt, command).
async fn counts<Q: Queryable + Send>(q: &mut Q) -> [i64; 5] {
    let mut out = [0; 5];
    for (i, table) in ["orders", "plan", "attempt", "receipt", "command"].iter().enumerate() {
        let n: Option<i64> = q
            .query_first(format!("SELECT COUNT(*) FROM {table}"))
            .await
            .expect("count");
        out[i] = n.unwrap_or(0);
    }
    out
}

#[tokio::test]
async fn committed_order_and_command_are_delivered_by_a_worker() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let executors = executors();
    let outbox = Outbox::new();
    let mut tx = shop.conn.start_transaction(TxOpts::default()).await.unwrap();
    tx.query_drop("INSERT INTO orders (id, total_cents) VALUES ('o-1', 4200)")
        .await
        .unwrap();
    let plan = outbox
        .register_plan_mysql(&mut tx, order_plan("o-1"), &executors.names())
        .await
        .unwrap();
    let record = outbox.enqueue_mysql(&mut tx, &plan.id, Action::Execute).await.unwrap();
    assert_eq!(record.attempt.status, AttemptStatus::Queued);
    assert_eq!(counts(&mut tx).await, [1, 1, 1, 1, 1]);
    // Not committed yet: the ledger (other connections) sees none of it.
    assert_eq!(ledger.open_attempts().await.unwrap(), 0);
    tx.commit().await.unwrap();
    assert_eq!(ledger.open_attempts().await.unwrap(), 1);

    let ledger = Arc::new(ledger);
    let worker = Worker::new(
        "shop-worker",
        ledger.clone(),
        Arc::new(executors),
        Arc::new(SystemClock),
        WorkerConfig::clamped(true, 10, 5, 5_000),
    );
    let options = RunOptions {
        until_idle: true,
        grace_ms: 0,
    };
    let report = worker.run(std::future::pending(), options).await;
    assert_eq!((report.claimed, report.delivered, report.failed), (1, 1, 0));
    let delivered = ledger.attempt(&record.attempt.id).await.unwrap();
    assert_eq!(delivered.attempt.status, AttemptStatus::Succeeded);
    assert_eq!(delivered.command.status, CommandStatus::Delivered);
}

#[tokio::test]
async fn rolled_back_transaction_leaves_no_plan_attempt_receipt_or_command() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let executors = executors();
    let outbox = Outbox::new();
    let kept = ledger
        .register_plan(order_plan("o-0"), &executors.names())
        .await
        .unwrap();
    let mut tx = shop.conn.start_transaction(TxOpts::default()).await.unwrap();
    tx.query_drop("INSERT INTO orders (id, total_cents) VALUES ('o-2', 100)")
        .await
        .unwrap();
    let plan = outbox
        .register_plan_mysql(&mut tx, order_plan("o-2"), &executors.names())
        .await
        .unwrap();
    let first = outbox.enqueue_mysql(&mut tx, &plan.id, Action::Execute).await.unwrap();
    let second = outbox.enqueue_mysql(&mut tx, &kept.id, Action::Execute).await.unwrap();
    assert_eq!(counts(&mut tx).await, [1, 2, 2, 2, 2]);
    tx.rollback().await.unwrap();

    assert_eq!(counts(&mut shop.conn).await, [0, 1, 0, 0, 0]);
    for attempt in [&first.attempt.id, &second.attempt.id] {
        assert!(matches!(
            ledger.attempt(attempt).await,
            Err(LedgerError::NotFound { kind: "attempt", .. })
        ));
    }
    assert!(matches!(ledger.plan(&plan.id).await, Err(LedgerError::NotFound { .. })));
    assert_eq!(ledger.open_attempts().await.unwrap(), 0);
}

#[tokio::test]
async fn unknown_or_retired_plan_is_refused_and_writes_nothing() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let outbox = Outbox::new();
    let retired = ledger
        .register_plan(order_plan("o-r"), &executors().names())
        .await
        .unwrap();
    ledger.retire_plan(&retired.id).await.unwrap();
    let mut tx = shop.conn.start_transaction(TxOpts::default()).await.unwrap();
    tx.query_drop("INSERT INTO orders (id, total_cents) VALUES ('o-3', 1)")
        .await
        .unwrap();
    let unknown = outbox
        .enqueue_mysql(&mut tx, &PlanId::new("pln-missing"), Action::Execute)
        .await
        .unwrap_err();
    assert_eq!(unknown.to_string(), "plan pln-missing not found");
    let refused = outbox
        .enqueue_mysql(&mut tx, &retired.id, Action::Execute)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, LedgerError::Refused(Refusal::Guard { .. })),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("RETIRED"), "{refused}");
    assert_eq!(counts(&mut tx).await, [1, 1, 0, 0, 0]);
    tx.commit().await.unwrap();
    assert_eq!(counts(&mut shop.conn).await, [1, 1, 0, 0, 0]);
}

#[tokio::test]
async fn a_failing_insert_leaves_nothing_of_the_enqueue_in_the_transaction() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = ledger
        .register_plan(order_plan("o-6"), &executors().names())
        .await
        .unwrap();
    // The receipt insert fails after the attempt and command rows were inserted.
    shop.conn
        .query_drop(
            "CREATE TRIGGER no_receipts BEFORE INSERT ON receipt FOR EACH ROW \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no receipts today'",
        )
        .await
        .unwrap();
    let mut tx = shop.conn.start_transaction(TxOpts::default()).await.unwrap();
    tx.query_drop("INSERT INTO orders (id, total_cents) VALUES ('o-6', 5)")
        .await
        .unwrap();
    let e = Outbox::new()
        .enqueue_mysql(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no receipts today"), "{e}");
    assert_eq!(counts(&mut tx).await, [1, 1, 0, 0, 0]);
    tx.commit().await.unwrap();
    assert_eq!(counts(&mut shop.conn).await, [1, 1, 0, 0, 0]);
}

#[tokio::test]
async fn a_database_without_the_ledger_schema_is_refused() {
    let Some((mut shop, _ledger)) = shop(false).await else {
        return;
    };
    let database = shop.db.url().database.clone();
    let mut tx = shop.conn.start_transaction(TxOpts::default()).await.unwrap();
    let e = Outbox::new()
        .enqueue_mysql(&mut tx, &PlanId::new("pln-1"), Action::Execute)
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("the ledger at database `{database}` holds no leasehold schema: run `leasehold migrate`")
    );
}

#[tokio::test]
async fn a_ledger_from_a_newer_release_is_refused_and_nothing_is_written() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = ledger
        .register_plan(order_plan("o-7"), &executors().names())
        .await
        .unwrap();
    shop.conn
        .query_drop("INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)")
        .await
        .unwrap();
    let mut tx = shop.conn.start_transaction(TxOpts::default()).await.unwrap();
    let e = Outbox::new()
        .enqueue_mysql(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("has schema version 99, newer than this binary's"),
        "{e}"
    );
    let e = Outbox::new()
        .register_plan_mysql(&mut tx, order_plan("o-8"), &executors().names())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("schema version 99"), "{e}");
    assert_eq!(counts(&mut tx).await, [0, 1, 0, 0, 0]);
}

#[tokio::test]
async fn an_enqueue_on_a_snapshot_older_than_the_latest_attempt_is_refused() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = ledger
        .register_plan(order_plan("o-9"), &executors().names())
        .await
        .unwrap();
    let mut opts = TxOpts::default();
    opts.with_consistent_snapshot(true);
    let mut tx = shop.conn.start_transaction(opts).await.unwrap();
    // Committed after the transaction's snapshot was fixed.
    let committed = ledger.enqueue(&plan.id, Action::Execute).await.unwrap();
    let e = Outbox::new()
        .enqueue_mysql(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    assert!(e.to_string().contains("snapshot predates attempt 1"), "{e}");
    tx.rollback().await.unwrap();
    let history = ledger.history(&plan.id).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].attempt.id, committed.attempt.id);
}

#[tokio::test]
async fn an_order_key_whose_head_ended_since_the_snapshot_is_refused() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let spec: PlanSpec = serde_json::from_value(json!({
        "name": "ordered-pushes", "recovery": "resume",
        "input": {"order": {"type": "string", "required": true}},
        "steps": [{"code": "push", "executor": "crm:v1", "payload": {"order": {"$input": "/order"}}}],
    }))
    .unwrap();
    let plan = ledger.register_plan(spec, &executors().names()).await.unwrap();
    let request = |order: &str| {
        leasehold::ledger::EnqueueRequest::new(Action::Execute)
            .with_input(Some(json!({"order": order})))
            .ordered(Some("customer-1".into()))
    };
    ledger.enqueue_with(&plan.id, request("o-13")).await.unwrap();
    let mut opts = TxOpts::default();
    opts.with_consistent_snapshot(true);
    let mut tx = shop.conn.start_transaction(opts).await.unwrap();
    // The head ends after the snapshot was fixed.
    let head = ledger.claim("w", 1, 30_000).await.unwrap().remove(0);
    ledger.begin_step(&head.lease, 1, 30_000).await.unwrap();
    let done = json!({"ok": true});
    ledger
        .complete_step(&head.lease, 1, &done, &done, 30_000)
        .await
        .unwrap();
    ledger.finish(&head.lease).await.unwrap();
    let e = Outbox::new()
        .enqueue_mysql_with(&mut tx, &plan.id, request("o-14"))
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    assert!(e.to_string().contains("snapshot predates its end"), "{e}");
    tx.rollback().await.unwrap();
    // On a fresh snapshot, it is claimable at once: nothing waits for good.
    let mut tx = shop.conn.start_transaction(TxOpts::default()).await.unwrap();
    let enqueued = Outbox::new()
        .enqueue_mysql_with(&mut tx, &plan.id, request("o-14"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(enqueued.record.command.status, CommandStatus::Pending);
}

#[tokio::test]
async fn the_attempt_is_stamped_with_the_database_clock_whatever_the_session_time_zone() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = ledger
        .register_plan(order_plan("o-10"), &executors().names())
        .await
        .unwrap();
    shop.conn.query_drop("SET time_zone = '+05:00'").await.unwrap();
    let mut tx = shop.conn.start_transaction(TxOpts::default()).await.unwrap();
    let before: i64 = tx
        .query_first("SELECT CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) AS SIGNED)")
        .await
        .unwrap()
        .unwrap();
    let record = Outbox::new()
        .enqueue_mysql(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let created = record.attempt.created_at.as_millis();
    assert_eq!(record.command.available_at.as_millis(), created);
    // Epoch milliseconds, not shifted by the session's five hours.
    assert!(
        (before..before + 60_000).contains(&created),
        "created_at {created} vs the server's now {before}"
    );
    // Claimable at once by a worker's claim on the ledger's own (UTC) sessions.
    let claimed = ledger.claim("w", 1, 5_000).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].lease.attempt_id, record.attempt.id);
}
