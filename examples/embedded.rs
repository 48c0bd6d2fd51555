//! An application that embeds leasehold: a shop writes an order row and enqueues its
//! delivery to a CRM in **one** SQLite transaction, then runs a worker with its own
//! executor (`acme-crm:v1`, registered by name) that pushes committed orders to the
//! CRM. A second order's transaction is rolled back (its payment is declined): it
//! leaves no order row and nothing to deliver.
//!
//! `cargo run --example embedded` — uses a fresh SQLite file in a temporary directory
//! (no service needed), prints what happened, and exits once nothing is left to
//! deliver.

use leasehold::clock::SystemClock;
use leasehold::engine::driver::ExecutorResult;
use leasehold::engine::lease::WorkerConfig;
use leasehold::engine::{Action, AttemptStatus, CommandStatus, PlanSpec};
use leasehold::entropy::OsEntropy;
use leasehold::executor::{ExecRequest, Executor, Executors};
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::{EnqueueRequest, Ledger};
use leasehold::outbox::rusqlite::{Connection, TransactionBehavior};
use leasehold::outbox::Outbox;
use leasehold::worker::{RunOptions, Worker, WorkerReport};
use serde_json::json;
use std::collections::BTreeMap;
use std::error::Error;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The application's own executor: pushes an order to a (here, in-memory) CRM. Like
/// every executor it must be idempotent by key: a redelivery of the same step (after
/// a worker crashed between the call and its commit) sends the same key and gets the
/// same CRM id back instead of a second record.
#[derive(Clone, Default)]
pub struct AcmeCrm {
    /// Idempotency key → (order, CRM id).
    records: Arc<Mutex<BTreeMap<String, (String, String)>>>,
}

impl AcmeCrm {
    /// The orders the CRM holds, in key order.
    pub fn orders(&self) -> Vec<String> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.values().map(|(order, _)| order.clone()).collect()
    }
}

impl Executor for AcmeCrm {
    async fn execute(&self, request: ExecRequest) -> ExecutorResult {
        let Some(order) = request.step.payload["order"].as_str() else {
            return ExecutorResult::Permanent(format!("step {}: payload field order is missing", request.step.code));
        };
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let next = format!("crm-{:04}", records.len() + 1);
        let (_, crm_id) = records
            .entry(request.idempotency_key.clone())
            .or_insert_with(|| (order.to_owned(), next));
        ExecutorResult::Done {
            evidence: json!({"order": order, "accepted": true}),
            target_receipt: json!({"crm_id": crm_id}),
        }
    }
}

/// What the run did, read back from the database and the CRM.
#[derive(Debug)]
pub struct Outcome {
    /// Order ids in the `orders` table.
    pub orders: Vec<String>,
    /// Per committed order: (order, attempt status, command status, CRM id).
    pub deliveries: Vec<(String, AttemptStatus, CommandStatus, String)>,
    /// Orders whose transaction was rolled back, with why.
    pub rolled_back: Vec<(String, String)>,
    /// Attempt, receipt and command rows in the ledger.
    pub outbox_rows: [i64; 3],
    /// Orders the CRM received.
    pub crm_orders: Vec<String>,
    /// What the worker did.
    pub worker: WorkerReport,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (order, attempt, command, crm_id) in &self.deliveries {
            writeln!(
                f,
                "order {order}: committed; attempt {attempt}, command {command}, CRM id {crm_id}"
            )?;
        }
        for (order, why) in &self.rolled_back {
            writeln!(f, "order {order}: rolled back ({why}); no order row, nothing enqueued")?;
        }
        let [attempts, receipts, commands] = self.outbox_rows;
        writeln!(
            f,
            "orders table: {:?}; outbox: {attempts} attempt(s), {receipts} receipt(s), {commands} command(s)",
            self.orders
        )?;
        writeln!(
            f,
            "worker: claimed {}, delivered {}, failed {}; CRM received {:?}",
            self.worker.claimed, self.worker.delivered, self.worker.failed, self.crm_orders
        )
    }
}

/// The template that delivers every order: one step for the CRM, its payload the
/// order's own input (`{"$input": …}`, resolved and frozen on each attempt).
fn delivery_template() -> Result<PlanSpec, serde_json::Error> {
    serde_json::from_value(json!({
        "name": "deliver-order",
        "recovery": "resume",
        "input": {
            "order": {"type": "string", "required": true},
            "total_cents": {"type": "integer", "required": true}
        },
        "steps": [{
            "code": "push-to-crm",
            "executor": "acme-crm:v1",
            "payload": {"order": {"$input": "/order"}, "total_cents": {"$input": "/total_cents"}}
        }],
    }))
}

/// Writes the order row and its delivery in one transaction of the application's
/// own; commits it unless `decline` names a reason to roll it back.
fn place_order(
    conn: &mut Connection,
    outbox: &Outbox,
    executors: &Executors,
    order: &str,
    total_cents: i64,
    decline: Option<&str>,
) -> Result<Option<leasehold::engine::AttemptId>, Box<dyn Error>> {
    // IMMEDIATE: take the write lock before the first read, so no worker's write can
    // slip in between and fail this transaction with SQLITE_BUSY.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute(
        "INSERT INTO orders (id, total_cents) VALUES (?1, ?2)",
        (order, total_cents),
    )?;
    // The same content answers the same plan: one template for every order.
    let plan = outbox.register_plan_sqlite(&tx, delivery_template()?, &executors.names())?;
    let input = json!({"order": order, "total_cents": total_cents});
    let request = EnqueueRequest::new(Action::Execute).with_input(Some(input));
    let record = outbox.enqueue_sqlite_with(&tx, &plan.id, request)?.record;
    if decline.is_some() {
        tx.rollback()?; // the order row and the outbox rows go together
        return Ok(None);
    }
    tx.commit()?; // the order row and the outbox rows, durable together
    Ok(Some(record.attempt.id))
}

/// Runs the shop against the SQLite file at `path`: two orders, one rolled back,
/// then a worker until nothing is left to deliver.
pub async fn run_shop(path: &str) -> Result<Outcome, Box<dyn Error>> {
    // The ledger's tables live in the application's database.
    let ledger = Arc::new(SqliteLedger::open(path, Arc::new(SystemClock), Arc::new(OsEntropy))?);
    ledger.migrate().await?;

    let crm = AcmeCrm::default();
    let executors = Arc::new(Executors::builder().register("acme-crm:v1", crm.clone()).build()?);
    let outbox = Outbox::new();

    let mut conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total_cents INTEGER NOT NULL)")?;

    let mut committed = Vec::new();
    let mut rolled_back = Vec::new();
    for (order, total_cents, decline) in [("o-1001", 4_200, None), ("o-1002", 990, Some("payment declined"))] {
        match place_order(&mut conn, &outbox, &executors, order, total_cents, decline)? {
            Some(attempt) => committed.push((order.to_owned(), attempt)),
            None => rolled_back.push((order.to_owned(), decline.unwrap_or_default().to_owned())),
        }
    }

    // The library's worker, with the application's executor: it polls the ledger,
    // delivers what was committed, and (until_idle) returns once nothing is open.
    let worker = Worker::new(
        "shop-worker-1",
        ledger.clone(),
        executors,
        Arc::new(SystemClock),
        WorkerConfig::clamped(true, 50, 5, 10_000),
    );
    let options = RunOptions {
        until_idle: true,
        grace_ms: 1_000,
    };
    let report = worker.run(std::future::pending(), options).await;

    let mut deliveries = Vec::new();
    for (order, attempt) in committed {
        let record = ledger.attempt(&attempt).await?;
        let crm_id = record
            .receipts
            .first()
            .and_then(|r| r.target_receipt.as_deref())
            .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
            .and_then(|t| t["crm_id"].as_str().map(str::to_owned))
            .unwrap_or_default();
        deliveries.push((order, record.attempt.status, record.command.status, crm_id));
    }
    let mut orders = Vec::new();
    for row in conn
        .prepare("SELECT id FROM orders ORDER BY id")?
        .query_map([], |r| r.get(0))?
    {
        orders.push(row?);
    }
    let mut outbox_rows = [0i64; 3];
    for (n, table) in outbox_rows.iter_mut().zip(["attempt", "receipt", "command"]) {
        *n = conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?;
    }
    Ok(Outcome {
        orders,
        deliveries,
        rolled_back,
        outbox_rows,
        crm_orders: crm.orders(),
        worker: report,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shop.db");
    let path = path.to_str().ok_or("the temporary path is not UTF-8")?;
    println!("shop database: {path}");
    let outcome = run_shop(path).await?;
    print!("{outcome}");
    Ok(())
}
