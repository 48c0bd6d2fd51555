//! Enqueue in the caller's own SQLite transaction ([`leasehold::outbox`]): the
//! business row and its outbox rows commit or roll back together, a worker delivers
//! what was committed, and a refused enqueue leaves nothing of itself in the
//! transaction.

use leasehold::clock::SystemClock;
use leasehold::engine::driver::ExecutorResult;
use leasehold::engine::lease::WorkerConfig;
use leasehold::engine::transition::Start;
use leasehold::engine::{Action, AttemptStatus, CommandStatus, PlanId, PlanSpec, ReceiptStatus, Refusal, TraceContext};
use leasehold::entropy::OsEntropy;
use leasehold::executor::{ExecRequest, Executor, Executors};
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::{EnqueueRequest, Ledger, LedgerError};
use leasehold::outbox::rusqlite::{Connection, TransactionBehavior};
use leasehold::outbox::Outbox;
use leasehold::worker::{RunOptions, Worker, WorkerReport};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tempfile::TempDir;

/// A program's own executor: records the orders it was asked to push.
#[derive(Default, Clone)]
struct Crm {
    pushed: Arc<Mutex<Vec<(String, String)>>>,
    traces: Arc<Mutex<Vec<Option<TraceContext>>>>,
}

impl Executor for Crm {
    async fn execute(&self, request: ExecRequest) -> ExecutorResult {
        let order = request.step.payload["order"].as_str().unwrap_or_default().to_owned();
        self.pushed
            .lock()
            .unwrap()
            .push((order.clone(), request.idempotency_key.clone()));
        self.traces.lock().unwrap().push(request.traceparent);
        ExecutorResult::Done {
            evidence: json!({"pushed": order}),
            target_receipt: json!({"crm_id": format!("crm-{order}")}),
        }
    }
}

/// A migrated ledger file in a temporary directory, and its path.
async fn migrated() -> (TempDir, String, SqliteLedger) {
    let dir = TempDir::new().expect("temporary directory");
    let path = dir.path().join("shop.db").to_str().expect("UTF-8 path").to_owned();
    let ledger = SqliteLedger::open(&path, Arc::new(SystemClock), Arc::new(OsEntropy)).expect("open");
    ledger.migrate().await.expect("migrate");
    (dir, path, ledger)
}

/// Runs a worker with `executors` until nothing is open; answers its report.
async fn deliver_all(ledger: &Arc<SqliteLedger>, executors: Executors) -> WorkerReport {
    let config = WorkerConfig::clamped(true, 10, 5, 5_000);
    let worker = Worker::new(
        "shop-worker",
        Arc::clone(ledger),
        Arc::new(executors),
        Arc::new(SystemClock),
        config,
    );
    let options = RunOptions {
        until_idle: true,
        grace_ms: 0,
    };
    worker.run(std::future::pending(), options).await
}

/// The application's connection, with its own `orders` table.
fn app_connection(path: &str) -> Connection {
    let conn = Connection::open(path).expect("open the application's connection");
    conn.busy_timeout(Duration::from_secs(5)).expect("busy timeout");
    conn.execute_batch("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total_cents INTEGER NOT NULL)")
        .expect("orders table");
    conn
}

fn order_plan(order: &str) -> PlanSpec {
    serde_json::from_value(json!({
        "name": format!("deliver-order-{order}"),
        "recovery": "resume",
        "steps": [{"code": "push", "executor": "crm:v1", "payload": {"order": order}}],
    }))
    .expect("a valid plan")
}

fn executors(crm: &Crm) -> Executors {
    Executors::builder()
        .register("crm:v1", crm.clone())
        .build()
        .expect("registry")
}

/// Rows per table: (orders, plan, attempt, receipt, command).
fn counts(conn: &Connection) -> [i64; 5] {
    ["orders", "plan", "attempt", "receipt", "command"].map(|table| {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| row.get(0))
            .expect("count")
    })
}

#[tokio::test]
async fn committed_order_and_command_are_delivered_by_a_worker() {
    let (_dir, path, ledger) = migrated().await;
    let crm = Crm::default();
    let executors = executors(&crm);
    let mut conn = app_connection(&path);
    let outbox = Outbox::new();

    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    tx.execute("INSERT INTO orders (id, total_cents) VALUES ('o-1', 4200)", [])
        .unwrap();
    let plan = outbox
        .register_plan_sqlite(&tx, order_plan("o-1"), &executors.names())
        .unwrap();
    let record = outbox.enqueue_sqlite(&tx, &plan.id, Action::Execute).unwrap();
    assert_eq!(record.attempt.status, AttemptStatus::Queued);
    assert_eq!(record.command.status, CommandStatus::Pending);
    assert_eq!(record.receipts.len(), 1);
    // Not committed yet: another connection sees none of it.
    let other = Connection::open(&path).unwrap();
    assert_eq!(counts(&other), [0, 0, 0, 0, 0]);
    tx.commit().unwrap();
    assert_eq!(counts(&other), [1, 1, 1, 1, 1]);

    let ledger = Arc::new(ledger);
    let report = deliver_all(&ledger, executors).await;
    assert_eq!((report.claimed, report.delivered, report.failed), (1, 1, 0));
    let delivered = ledger.attempt(&record.attempt.id).await.unwrap();
    assert_eq!(delivered.attempt.status, AttemptStatus::Succeeded);
    assert_eq!(delivered.command.status, CommandStatus::Delivered);
    assert_eq!(delivered.receipts[0].status, ReceiptStatus::Succeeded);
    let target_receipt: serde_json::Value = serde_json::from_str(
        delivered.receipts[0]
            .target_receipt
            .as_deref()
            .expect("a target receipt"),
    )
    .unwrap();
    assert_eq!(target_receipt, json!({"crm_id": "crm-o-1"}));
    assert_eq!(
        *crm.pushed.lock().unwrap(),
        vec![("o-1".to_owned(), record.receipts[0].idempotency_key.clone())]
    );
}

#[tokio::test]
async fn an_enqueue_in_the_callers_trace_is_delivered_in_it() {
    let (_dir, path, ledger) = migrated().await;
    let crm = Crm::default();
    let executors = executors(&crm);
    let mut conn = app_connection(&path);
    let outbox = Outbox::new();
    let caller = TraceContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let plan = outbox
        .register_plan_sqlite(&tx, order_plan("o-7"), &executors.names())
        .unwrap();
    let request = EnqueueRequest::new(Action::Execute).traced(Some(caller));
    let record = outbox.enqueue_sqlite_with(&tx, &plan.id, request).unwrap().record;
    tx.commit().unwrap();
    let trace = record.attempt.trace.expect("a trace context");
    assert_eq!(trace, TraceContext::for_attempt(Some(&caller), &record.attempt.id));
    let ledger = Arc::new(ledger);
    assert_eq!(deliver_all(&ledger, executors).await.delivered, 1);
    assert_eq!(
        ledger.attempt(&record.attempt.id).await.unwrap().attempt.trace,
        Some(trace)
    );
    let sent = crm.traces.lock().unwrap().clone();
    let [Some(step)] = sent.as_slice() else {
        panic!("one call, with a trace context: {sent:?}");
    };
    assert_eq!(
        step.trace_id(),
        caller.trace_id(),
        "the step runs in the caller's trace"
    );
    assert_ne!(step.span_id(), trace.span_id(), "under a span of its own");
}

#[tokio::test]
async fn rolled_back_transaction_leaves_no_plan_attempt_receipt_or_command() {
    let (_dir, path, ledger) = migrated().await;
    let executors = executors(&Crm::default());
    let mut conn = app_connection(&path);
    let outbox = Outbox::new();
    // A plan registered and committed before: only the attempt is in the transaction.
    let kept = ledger
        .register_plan(order_plan("o-0"), &executors.names())
        .await
        .unwrap();

    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    tx.execute("INSERT INTO orders (id, total_cents) VALUES ('o-2', 100)", [])
        .unwrap();
    let plan = outbox
        .register_plan_sqlite(&tx, order_plan("o-2"), &executors.names())
        .unwrap();
    let first = outbox.enqueue_sqlite(&tx, &plan.id, Action::Execute).unwrap();
    let second = outbox.enqueue_sqlite(&tx, &kept.id, Action::Execute).unwrap();
    assert_eq!(counts(&tx), [1, 2, 2, 2, 2]);
    tx.rollback().unwrap();

    assert_eq!(counts(&conn), [0, 1, 0, 0, 0]);
    for attempt in [&first.attempt.id, &second.attempt.id] {
        assert!(matches!(
            ledger.attempt(attempt).await,
            Err(LedgerError::NotFound { kind: "attempt", .. })
        ));
    }
    assert!(matches!(ledger.plan(&plan.id).await, Err(LedgerError::NotFound { .. })));
    assert!(ledger.history(&kept.id).await.unwrap().is_empty());
    assert_eq!(ledger.open_attempts().await.unwrap(), 0);
}

#[tokio::test]
async fn unknown_or_retired_plan_is_refused_and_writes_nothing() {
    let (_dir, path, ledger) = migrated().await;
    let executors = executors(&Crm::default());
    let mut conn = app_connection(&path);
    let outbox = Outbox::new();
    let retired = ledger
        .register_plan(order_plan("o-r"), &executors.names())
        .await
        .unwrap();
    ledger.retire_plan(&retired.id).await.unwrap();

    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    tx.execute("INSERT INTO orders (id, total_cents) VALUES ('o-3', 1)", [])
        .unwrap();
    let unknown = outbox
        .enqueue_sqlite(&tx, &PlanId::new("pln-missing"), Action::Execute)
        .unwrap_err();
    assert_eq!(unknown.to_string(), "plan pln-missing not found");
    let refused = outbox.enqueue_sqlite(&tx, &retired.id, Action::Execute).unwrap_err();
    assert!(
        matches!(refused, LedgerError::Refused(Refusal::Guard { .. })),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("RETIRED"), "{refused}");
    // The caller's own row is still in its transaction; nothing of the refused calls is.
    assert_eq!(counts(&tx), [1, 1, 0, 0, 0]);
    tx.commit().unwrap();
    assert_eq!(counts(&conn), [1, 1, 0, 0, 0]);
}

#[tokio::test]
async fn second_execute_of_one_plan_while_the_first_is_open_is_refused() {
    let (_dir, path, _ledger) = migrated().await;
    let executors = executors(&Crm::default());
    let mut conn = app_connection(&path);
    let outbox = Outbox::new();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let plan = outbox
        .register_plan_sqlite(&tx, order_plan("o-4"), &executors.names())
        .unwrap();
    let again = outbox
        .register_plan_sqlite(&tx, order_plan("o-4"), &executors.names())
        .unwrap();
    assert_eq!(again.id, plan.id, "the same content answers the same plan");
    let first = outbox.enqueue_sqlite(&tx, &plan.id, Action::Execute).unwrap();
    let e = outbox.enqueue_sqlite(&tx, &plan.id, Action::Execute).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("attempt {} is still QUEUED", first.attempt.id)),
        "{e}"
    );
    assert_eq!(counts(&tx), [0, 1, 1, 1, 1]);
}

#[tokio::test]
async fn a_plan_with_an_unknown_executor_is_refused_before_anything_is_written() {
    let (_dir, path, _ledger) = migrated().await;
    let mut conn = app_connection(&path);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let e = Outbox::new()
        .register_plan_sqlite(&tx, order_plan("o-5"), &Executors::new().names())
        .unwrap_err();
    assert!(matches!(e, LedgerError::InvalidPlan(_)), "{e:?}");
    assert!(e.to_string().contains("crm:v1"), "{e}");
    assert_eq!(counts(&tx), [0, 0, 0, 0, 0]);
}

#[tokio::test]
async fn a_failing_insert_leaves_nothing_of_the_enqueue_in_the_transaction() {
    let (_dir, path, ledger) = migrated().await;
    let executors = executors(&Crm::default());
    let mut conn = app_connection(&path);
    let plan = ledger
        .register_plan(order_plan("o-6"), &executors.names())
        .await
        .unwrap();
    // The receipt insert fails after the attempt and command rows were inserted.
    conn.execute_batch(
        "CREATE TRIGGER no_receipts BEFORE INSERT ON receipt BEGIN SELECT RAISE(ABORT, 'no receipts today'); END;",
    )
    .unwrap();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    tx.execute("INSERT INTO orders (id, total_cents) VALUES ('o-6', 5)", [])
        .unwrap();
    let e = Outbox::new()
        .enqueue_sqlite(&tx, &plan.id, Action::Execute)
        .unwrap_err();
    assert!(e.to_string().contains("no receipts today"), "{e}");
    assert_eq!(counts(&tx), [1, 1, 0, 0, 0]);
    tx.commit().unwrap();
    assert_eq!(counts(&conn), [1, 1, 0, 0, 0]);
    assert!(ledger.history(&plan.id).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_database_without_the_ledger_schema_is_refused() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("plain.db").to_str().unwrap().to_owned();
    let mut conn = app_connection(&path);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let e = Outbox::new()
        .enqueue_sqlite(&tx, &PlanId::new("pln-1"), Action::Execute)
        .unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("{path} holds no leasehold schema: run `leasehold migrate`")
    );
    let tables: i64 = tx
        .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(tables, 1, "only the application's own table");
}

#[tokio::test]
async fn a_ledger_from_a_newer_release_is_refused_and_nothing_is_written() {
    let (_dir, path, ledger) = migrated().await;
    let executors = executors(&Crm::default());
    let plan = ledger
        .register_plan(order_plan("o-7"), &executors.names())
        .await
        .unwrap();
    let mut conn = app_connection(&path);
    conn.execute(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)",
        [],
    )
    .unwrap();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let e = Outbox::new()
        .enqueue_sqlite(&tx, &plan.id, Action::Execute)
        .unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    let message = e.to_string();
    assert!(
        message.starts_with(&format!(
            "the ledger at {path} has schema version 99, newer than this binary's"
        )),
        "{message}"
    );
    let e = Outbox::new()
        .register_plan_sqlite(&tx, order_plan("o-8"), &executors.names())
        .unwrap_err();
    assert!(e.to_string().contains("schema version 99"), "{e}");
    assert_eq!(counts(&tx), [0, 1, 0, 0, 0]);
}

#[tokio::test]
async fn a_connection_outside_a_transaction_is_refused() {
    let (_dir, path, ledger) = migrated().await;
    let plan = ledger
        .register_plan(order_plan("o-9"), &executors(&Crm::default()).names())
        .await
        .unwrap();
    let conn = app_connection(&path);
    let e = Outbox::new()
        .enqueue_sqlite(&conn, &plan.id, Action::Execute)
        .unwrap_err();
    assert!(e.to_string().contains("not inside a transaction"), "{e}");
    assert_eq!(counts(&conn), [0, 1, 0, 0, 0]);
}

#[tokio::test]
async fn an_enqueue_scheduled_for_later_is_not_claimable_before_its_start() {
    let (_dir, path, ledger) = migrated().await;
    let executors = executors(&Crm::default());
    let mut conn = app_connection(&path);
    let outbox = Outbox::new();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let plan = outbox
        .register_plan_sqlite(&tx, order_plan("o-later"), &executors.names())
        .unwrap();
    let record = outbox
        .enqueue_sqlite_at(&tx, &plan.id, Action::Execute, Start::After(3_600_000))
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(
        record.command.available_at.millis_since(record.attempt.created_at),
        3_600_000,
        "claimable an hour after its enqueue"
    );
    let claimed = ledger.claim("shop-worker", 5, 5_000).await.unwrap();
    assert!(claimed.is_empty(), "nothing is claimable before its start");
    assert_eq!(ledger.open_attempts().await.unwrap(), 1, "but it is queued");
}
