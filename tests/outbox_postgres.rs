//! Enqueue in the caller's own PostgreSQL transaction ([`leasehold::outbox`]) against
//! the server at `LEASEHOLD_TEST_POSTGRES_URL` (e.g.
//! `postgres://postgres@127.0.0.1:5432/test`): the business row and its outbox rows
//! commit or roll back together, a worker delivers what was committed, a refused or
//! failed call leaves nothing of itself in the transaction and the transaction usable,
//! a stale REPEATABLE READ snapshot is refused, and the workers' `NOTIFY` is delivered
//! only on commit. Every test runs in a scratch database of its own; without the
//! variable every test prints why it is skipped and passes.

use leasehold::clock::SystemClock;
use leasehold::engine::driver::ExecutorResult;
use leasehold::engine::lease::WorkerConfig;
use leasehold::engine::{Action, AttemptStatus, CommandStatus, Plan, PlanId, PlanSpec, Refusal};
use leasehold::entropy::OsEntropy;
use leasehold::executor::{ExecRequest, Executor, Executors};
use leasehold::ledger::postgres::notify::CHANNEL;
use leasehold::ledger::postgres::scratch::ScratchDatabase;
use leasehold::ledger::postgres::{PostgresLedger, PostgresUrl};
use leasehold::ledger::{Ledger, LedgerError};
use leasehold::outbox::tokio_postgres::{AsyncMessage, Client, GenericClient, IsolationLevel, NoTls};
use leasehold::outbox::Outbox;
use leasehold::worker::{RunOptions, Worker};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The variable that names the test server.
const URL_VAR: &str = "LEASEHOLD_TEST_POSTGRES_URL";

/// A scratch database (dropped after the test) and the application's session on it.
struct Shop {
    db: ScratchDatabase,
    client: Client,
}

/// A session on `url`'s database, its connection driven by a task of its own;
/// `notifications` receives the channel of every notification it gets.
async fn connect(url: &PostgresUrl, notifications: Option<mpsc::UnboundedSender<String>>) -> Client {
    let (client, mut connection) = url.config().connect(NoTls).await.expect("the application's session");
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let (AsyncMessage::Notification(n), Some(tx)) = (message, &notifications) {
                let _ = tx.send(n.channel().to_owned());
            }
        }
    });
    client
}

/// A fresh scratch database with an `orders` table, migrated when `migrate`; `None`
/// (with the reason printed) without a test server.
async fn shop(migrate: bool) -> Option<(Shop, PostgresLedger)> {
    let admin = match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => PostgresUrl::parse(&url).unwrap_or_else(|e| panic!("{URL_VAR}: {e}")),
        _ => {
            println!("skipped: {URL_VAR} is not set (e.g. {URL_VAR}=postgres://postgres@127.0.0.1:5432/test)");
            return None;
        }
    };
    let db = ScratchDatabase::create(&admin, "lh_outbox_")
        .await
        .unwrap_or_else(|e| panic!("cannot create a test database at {admin}: {e}"));
    let ledger = PostgresLedger::open(db.url(), Arc::new(OsEntropy)).expect("open");
    if migrate {
        ledger.migrate().await.expect("migrate");
    }
    let client = connect(db.url(), None).await;
    client
        .batch_execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total_cents INT NOT NULL)")
        .await
        .expect("orders table");
    Some((Shop { db, client }, ledger))
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
/// Registers the plan of `order` through the ledger (its own transaction, committed).
async fn registered(ledger: &PostgresLedger, order: &str) -> Plan {
    ledger
        .register_plan(order_plan(order), &executors().names())
        .await
        .unwrap()
}

/// A REPEATABLE READ transaction: its first statement fixes its snapshot.
async fn repeatable_read(client: &mut Client) -> tokio_postgres::Transaction<'_> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .start()
        .await
        .unwrap()
}

async fn counts(c: &impl GenericClient) -> [i64; 5] {
    let mut out = [0; 5];
    for (i, table) in ["orders", "plan", "attempt", "receipt", "command"].iter().enumerate() {
        out[i] = c
            .query_one(&format!("SELECT COUNT(*) FROM {table}"), &[])
            .await
            .expect("count")
            .get(0);
    }
    out
}

/// Inserts an order: the statement succeeding shows that the transaction is usable.
async fn insert_order(c: &impl GenericClient, id: &str) {
    c.execute("INSERT INTO orders (id, total_cents) VALUES ($1, 1)", &[&id])
        .await
        .unwrap_or_else(|e| panic!("the transaction is no longer usable: {e}"));
}

/// The database clock's now in milliseconds since the Unix epoch.
async fn db_millis(c: &impl GenericClient) -> i64 {
    c.query_one("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn committed_order_and_command_are_delivered_by_a_worker() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let executors = executors();
    let outbox = Outbox::new();
    let mut tx = shop.client.transaction().await.unwrap();
    insert_order(&tx, "o-1").await;
    let plan = outbox
        .register_plan_postgres(&mut tx, order_plan("o-1"), &executors.names())
        .await
        .unwrap();
    let record = outbox
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap();
    assert_eq!(record.attempt.status, AttemptStatus::Queued);
    assert_eq!(record.receipts.len(), 1);
    assert_eq!(counts(&tx).await, [1, 1, 1, 1, 1]);
    // Not committed yet: the ledger (other sessions) sees none of it.
    assert_eq!(ledger.open_attempts().await.unwrap(), 0);
    assert!(matches!(ledger.plan(&plan.id).await, Err(LedgerError::NotFound { .. })));
    tx.commit().await.unwrap();
    assert_eq!(ledger.open_attempts().await.unwrap(), 1);
    assert_eq!(ledger.plan(&plan.id).await.unwrap(), plan);

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
async fn the_attempt_is_stamped_with_the_database_clock_and_claimable_at_once() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = registered(&ledger, "o-10").await;
    // The session's time zone does not move epoch milliseconds.
    shop.client
        .batch_execute("SET TimeZone = 'Asia/Kolkata'")
        .await
        .unwrap();
    let mut tx = shop.client.transaction().await.unwrap();
    let before = db_millis(&tx).await;
    let record = Outbox::new()
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap();
    let after = db_millis(&tx).await;
    tx.commit().await.unwrap();
    let created = record.attempt.created_at.as_millis();
    assert_eq!(record.command.available_at.as_millis(), created);
    assert!(
        (before..=after).contains(&created),
        "created_at {created} is not the database's now, read between {before} and {after}"
    );
    let claimed = ledger.claim("w", 1, 5_000).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].lease.attempt_id, record.attempt.id);
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
    let mut tx = shop.client.transaction().await.unwrap();
    insert_order(&tx, "o-2").await;
    let plan = outbox
        .register_plan_postgres(&mut tx, order_plan("o-2"), &executors.names())
        .await
        .unwrap();
    let first = outbox
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap();
    let second = outbox
        .enqueue_postgres(&mut tx, &kept.id, Action::Execute)
        .await
        .unwrap();
    assert_eq!(counts(&tx).await, [1, 2, 2, 2, 2]);
    tx.rollback().await.unwrap();

    assert_eq!(counts(&shop.client).await, [0, 1, 0, 0, 0]);
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
async fn registering_known_content_answers_the_existing_plan_and_writes_nothing() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let names = executors();
    let names = names.names();
    let existing = ledger.register_plan(order_plan("o-4"), &names).await.unwrap();
    let mut tx = shop.client.transaction().await.unwrap();
    let outbox = Outbox::new();
    let again = outbox
        .register_plan_postgres(&mut tx, order_plan("o-4"), &names)
        .await
        .unwrap();
    assert_eq!(again, existing);
    let invalid: PlanSpec = serde_json::from_value(json!({
        "name": "bad", "recovery": "resume",
        "steps": [{"code": "push", "executor": "fax:v1", "payload": {}}],
    }))
    .unwrap();
    let e = outbox
        .register_plan_postgres(&mut tx, invalid, &names)
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::InvalidPlan(_)), "{e:?}");
    assert!(e.to_string().contains("fax:v1"), "{e}");
    insert_order(&tx, "o-4").await;
    tx.commit().await.unwrap();
    assert_eq!(counts(&shop.client).await, [1, 1, 0, 0, 0]);
}

#[tokio::test]
async fn unknown_or_retired_plan_is_refused_and_the_transaction_stays_usable() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let outbox = Outbox::new();
    let retired = registered(&ledger, "o-r").await;
    ledger.retire_plan(&retired.id).await.unwrap();
    let mut tx = shop.client.transaction().await.unwrap();
    insert_order(&tx, "o-3").await;
    let unknown = outbox
        .enqueue_postgres(&mut tx, &PlanId::new("pln-missing"), Action::Execute)
        .await
        .unwrap_err();
    assert_eq!(unknown.to_string(), "plan pln-missing not found");
    let refused = outbox
        .enqueue_postgres(&mut tx, &retired.id, Action::Execute)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, LedgerError::Refused(Refusal::Guard { .. })),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("RETIRED"), "{refused}");
    insert_order(&tx, "o-3b").await;
    assert_eq!(counts(&tx).await, [2, 1, 0, 0, 0]);
    tx.commit().await.unwrap();
    assert_eq!(counts(&shop.client).await, [2, 1, 0, 0, 0]);
}

#[tokio::test]
async fn a_second_open_execute_attempt_is_refused_and_the_first_is_kept() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = registered(&ledger, "o-5").await;
    let outbox = Outbox::new();
    let mut tx = shop.client.transaction().await.unwrap();
    insert_order(&tx, "o-5").await;
    let first = outbox
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap();
    let e = outbox
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::Refused(Refusal::Guard { .. })), "{e:?}");
    insert_order(&tx, "o-5b").await;
    assert_eq!(counts(&tx).await, [2, 1, 1, 1, 1]);
    tx.commit().await.unwrap();
    let history = ledger.history(&plan.id).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].attempt.id, first.attempt.id);
}

#[tokio::test]
async fn a_failing_insert_leaves_nothing_of_the_enqueue_and_the_transaction_usable() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = registered(&ledger, "o-6").await;
    // The receipt insert fails after the attempt row was inserted: without the
    // savepoint, PostgreSQL would abort the caller's whole transaction.
    shop.client
        .batch_execute(
            "CREATE FUNCTION no_receipts() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'no receipts today'; END $$; \
             CREATE TRIGGER no_receipts BEFORE INSERT ON receipt FOR EACH ROW EXECUTE FUNCTION no_receipts()",
        )
        .await
        .unwrap();
    let mut tx = shop.client.transaction().await.unwrap();
    insert_order(&tx, "o-6").await;
    let e = Outbox::new()
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no receipts today"), "{e}");
    insert_order(&tx, "o-6b").await;
    assert_eq!(counts(&tx).await, [2, 1, 0, 0, 0]);
    tx.commit().await.unwrap();
    assert_eq!(counts(&shop.client).await, [2, 1, 0, 0, 0]);
}

#[tokio::test]
async fn a_transaction_that_already_failed_is_refused_with_the_way_out() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = registered(&ledger, "o-14").await;
    let mut tx = shop.client.transaction().await.unwrap();
    tx.batch_execute("SELECT 1 / 0").await.unwrap_err();
    let e = Outbox::new()
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    let message = e.to_string();
    assert!(message.contains("postgres 25P02"), "{message}");
    assert!(message.contains("nothing was enqueued: roll it back"), "{message}");
    tx.rollback().await.unwrap();
    assert_eq!(counts(&shop.client).await, [0, 1, 0, 0, 0]);
}

#[tokio::test]
async fn a_database_without_the_ledger_schema_is_refused() {
    let Some((mut shop, _ledger)) = shop(false).await else {
        return;
    };
    let database = shop.db.url().database().to_owned();
    let mut tx = shop.client.transaction().await.unwrap();
    let e = Outbox::new()
        .enqueue_postgres(&mut tx, &PlanId::new("pln-1"), Action::Execute)
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("the ledger at database `{database}` holds no leasehold schema: run `leasehold migrate`")
    );
    let e = Outbox::new()
        .register_plan_postgres(&mut tx, order_plan("o-1"), &executors().names())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("holds no leasehold schema"), "{e}");
    insert_order(&tx, "o-1").await;
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn a_ledger_from_a_newer_release_is_refused_and_nothing_is_written() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = registered(&ledger, "o-7").await;
    shop.client
        .batch_execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)")
        .await
        .unwrap();
    let mut tx = shop.client.transaction().await.unwrap();
    let e = Outbox::new()
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("has schema version 99, newer than this binary's"),
        "{e}"
    );
    let e = Outbox::new()
        .register_plan_postgres(&mut tx, order_plan("o-8"), &executors().names())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("schema version 99"), "{e}");
    assert_eq!(counts(&tx).await, [0, 1, 0, 0, 0]);
}

#[tokio::test]
async fn an_enqueue_on_a_snapshot_older_than_the_latest_attempt_is_refused() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = registered(&ledger, "o-9").await;
    let mut tx = repeatable_read(&mut shop.client).await;
    // A plain read fixes the snapshot; the ledger's enqueue commits after it.
    assert_eq!(counts(&tx).await, [0, 1, 0, 0, 0]);
    let committed = ledger.enqueue(&plan.id, Action::Execute).await.unwrap();
    let e = Outbox::new()
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    let message = e.to_string();
    assert!(message.contains("snapshot predates attempt 1"), "{message}");
    assert!(message.contains("nothing was enqueued"), "{message}");
    assert!(message.contains("READ COMMITTED"), "{message}");
    // The savepoint undid the failure: the transaction goes on and commits.
    insert_order(&tx, "o-9").await;
    tx.commit().await.unwrap();
    let history = ledger.history(&plan.id).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].attempt.id, committed.attempt.id);
    assert_eq!(counts(&shop.client).await, [1, 1, 1, 1, 1]);
}

#[tokio::test]
async fn an_enqueue_of_a_plan_changed_since_the_snapshot_is_a_serialization_failure() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = registered(&ledger, "o-11").await;
    let mut tx = repeatable_read(&mut shop.client).await;
    assert_eq!(counts(&tx).await, [0, 1, 0, 0, 0]);
    // Retired (the plan row updated) after the snapshot: locking it is 40001.
    ledger.retire_plan(&plan.id).await.unwrap();
    let e = Outbox::new()
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::Unavailable(_)), "{e:?}");
    let message = e.to_string();
    assert!(message.contains("postgres 40001"), "{message}");
    assert!(message.contains("nothing was enqueued"), "{message}");
    assert!(message.contains("READ COMMITTED"), "{message}");
    insert_order(&tx, "o-11").await;
    tx.commit().await.unwrap();
    assert_eq!(counts(&shop.client).await, [1, 1, 0, 0, 0]);
}

#[tokio::test]
async fn an_order_key_whose_head_ended_since_the_snapshot_is_a_serialization_failure() {
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
    let mut tx = repeatable_read(&mut shop.client).await;
    assert_eq!(counts(&tx).await, [0, 1, 1, 1, 1], "the snapshot sees the head open");
    // The head ends after the snapshot: its transaction writes the plan row.
    let head = ledger.claim("w", 1, 30_000).await.unwrap().remove(0);
    ledger.begin_step(&head.lease, 1, 30_000).await.unwrap();
    let done = json!({"ok": true});
    ledger
        .complete_step(&head.lease, 1, &done, &done, 30_000)
        .await
        .unwrap();
    ledger.finish(&head.lease).await.unwrap();
    let e = Outbox::new()
        .enqueue_postgres_with(&mut tx, &plan.id, request("o-14"))
        .await
        .unwrap_err();
    assert!(matches!(e, LedgerError::Unavailable(_)), "{e:?}");
    assert!(e.to_string().contains("postgres 40001"), "{e}");
    tx.rollback().await.unwrap();
    // Run again on a fresh snapshot, it is claimable at once: nothing waits for good.
    let mut tx = shop.client.transaction().await.unwrap();
    let enqueued = Outbox::new()
        .enqueue_postgres_with(&mut tx, &plan.id, request("o-14"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(enqueued.record.command.status, CommandStatus::Pending);
}

#[tokio::test]
async fn a_pooled_deadpool_transaction_is_accepted() {
    let Some((shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = registered(&ledger, "o-12").await;
    let manager = deadpool_postgres::Manager::new(shop.db.url().config().clone(), NoTls);
    let pool = deadpool_postgres::Pool::builder(manager).max_size(1).build().unwrap();
    let mut session = pool.get().await.unwrap();
    let mut tx = session.transaction().await.unwrap();
    insert_order(&*tx, "o-12").await;
    let record = Outbox::new()
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ledger.attempt(&record.attempt.id).await.unwrap(), record);
}

/// The channel of the next notification heard (bounded, in case none comes).
async fn next(heard: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(30), heard.recv())
        .await
        .expect("a notification within 30 s")
        .expect("the listener is running")
}

#[tokio::test]
async fn workers_are_notified_only_when_the_transaction_commits() {
    let Some((mut shop, ledger)) = shop(true).await else {
        return;
    };
    let plan = registered(&ledger, "o-13").await;
    let (sender, mut heard) = mpsc::unbounded_channel();
    let listener = connect(shop.db.url(), Some(sender)).await;
    listener
        .batch_execute(&format!("LISTEN {CHANNEL}; LISTEN outbox_test_marker"))
        .await
        .unwrap();
    // Notifications arrive in commit order: the marker, sent after each
    // transaction ended, shows whether that transaction notified.
    let outbox = Outbox::new();

    let mut tx = shop.client.transaction().await.unwrap();
    outbox
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    shop.client.batch_execute("NOTIFY outbox_test_marker").await.unwrap();
    assert_eq!(
        next(&mut heard).await,
        "outbox_test_marker",
        "a rolled-back enqueue notified"
    );

    let mut tx = shop.client.transaction().await.unwrap();
    outbox
        .enqueue_postgres(&mut tx, &plan.id, Action::Execute)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    shop.client.batch_execute("NOTIFY outbox_test_marker").await.unwrap();
    assert_eq!(next(&mut heard).await, CHANNEL, "a committed enqueue did not notify");
    assert_eq!(next(&mut heard).await, "outbox_test_marker");
}
