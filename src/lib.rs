//! leasehold: a durable, lease-fenced outbox for multi-step deliveries.
//!
//! The rules live in [`leasehold_engine`] (re-exported as [`engine`]); this crate
//! drives them: ledgers ([`ledger`]) store the rows, the tokio [`worker`] delivers
//! claimed commands through [`executor`]s, [`outbox`] enqueues inside an
//! application's own transaction, and the `leasehold` binary is the CLI.
//!
//! Cargo features: `sqlite` (default) the SQLite ledger, `mysql` and `postgres` theirs,
//! `cli` the binary and what only it needs (`serve`, `tokens`, `receiver`, `bench`,
//! `report`, `listener`; every backend). An application that embeds the library with
//! the default features builds none of the server's crates (`docs/library.md`).
//!
//! There are three ways in. All three share one database (SQLite, PostgreSQL or MySQL /
//! MariaDB) and its guarantees: an enqueue writes the attempt, its receipts and its
//! outbox command together; workers on any number of processes claim commands under
//! a fenced lease and call executors outside every transaction; a crashed worker's
//! lease expires and another takes over, sending the same idempotency key per step.
//!
//! # 1. The CLI
//!
//! ```sh
//! leasehold migrate                                # create or upgrade the schema
//! leasehold plan add scenarios/plans/dry-run.toml  # register a plan file
//! leasehold enqueue dry-run                        # attempt + receipts + command
//! leasehold worker --until-idle                    # deliver, then exit
//! ```
//!
//! A plan file is a [`engine::PlanSpec`] in TOML (or JSON); `plan add` validates it
//! against the executors a worker runs ([`executor::Executors::names`]), as here:
//!
//! ```
//! use leasehold::engine::{PlanId, PlanSpec, Timestamp};
//! use leasehold::executor::Executors;
//!
//! let spec: PlanSpec = toml::from_str(r#"
//!     name = "notify-release"
//!     recovery = "resume"
//!     [[steps]]
//!     code = "notify"
//!     executor = "dry-run:v1"
//!     payload = { channel = "releases" }
//! "#)?;
//! let plan = spec.into_plan(&Executors::new().names(), PlanId::new("pln-1"), Timestamp::from_millis(0))?;
//! assert_eq!(plan.steps[0].code, "notify");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # 2. An embedded worker with the program's own executors
//!
//! A program registers its executors by name next to the built-ins, registers plans
//! that use them, and runs the library's [`worker::Worker`] on a ledger:
//!
//! ```
//! use leasehold::clock::SystemClock;
//! use leasehold::engine::driver::ExecutorResult;
//! use leasehold::engine::lease::WorkerConfig;
//! use leasehold::engine::{Action, PlanSpec};
//! use leasehold::entropy::OsEntropy;
//! use leasehold::executor::{ExecRequest, Executor, Executors};
//! use leasehold::ledger::{sqlite::SqliteLedger, Ledger};
//! use leasehold::worker::{RunOptions, Worker};
//! use std::sync::Arc;
//!
//! /// Pushes an order to a CRM; the same idempotency key must get the same answer.
//! struct AcmeCrm;
//!
//! impl Executor for AcmeCrm {
//!     async fn execute(&self, request: ExecRequest) -> ExecutorResult {
//!         ExecutorResult::Done {
//!             evidence: serde_json::json!({"order": request.step.payload["order"]}),
//!             target_receipt: serde_json::json!({"crm_id": format!("crm-{}", request.idempotency_key)}),
//!         }
//!     }
//! }
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let executors = Arc::new(Executors::builder().register("acme-crm:v1", AcmeCrm).build()?);
//! let ledger = Arc::new(SqliteLedger::open(":memory:", Arc::new(SystemClock), Arc::new(OsEntropy))?);
//! ledger.migrate().await?;
//! let spec: PlanSpec = serde_json::from_value(serde_json::json!({
//!     "name": "push-order-7", "recovery": "resume",
//!     "steps": [{"code": "push", "executor": "acme-crm:v1", "payload": {"order": 7}}],
//! }))?;
//! let plan = ledger.register_plan(spec, &executors.names()).await?;
//! ledger.enqueue(&plan.id, Action::Execute).await?;
//!
//! let config = WorkerConfig::clamped(true, 50, 5, 10_000);
//! let worker = Worker::new("worker-1", ledger.clone(), executors, Arc::new(SystemClock), config);
//! let until_idle = RunOptions { until_idle: true, grace_ms: 1_000 };
//! let report = worker.run(std::future::pending(), until_idle).await;
//! assert_eq!(report.delivered, 1);
//! # Ok(())
//! # }
//! ```
//!
//! # 3. Enqueue in the application's own transaction
//!
//! The transactional outbox: a business row and its delivery commit or roll back
//! together ([`outbox::Outbox`]; a worker as in 2 delivers what was committed).
//! On SQLite:
//!
//! ```
//! use leasehold::engine::{Action, PlanSpec};
//! use leasehold::executor::Executors;
//! use leasehold::ledger::{sqlite::SqliteLedger, Ledger};
//! use leasehold::outbox::rusqlite::{Connection, TransactionBehavior};
//! use leasehold::outbox::Outbox;
//! # use std::sync::Arc;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("shop.db");
//! # let path = path.to_str().unwrap();
//! # let clock = Arc::new(leasehold::clock::SystemClock);
//! # let ledger = SqliteLedger::open(path, clock, Arc::new(leasehold::entropy::OsEntropy))?;
//! ledger.migrate().await?; // the ledger's tables, in the application's database
//! let mut conn = Connection::open(path)?;
//! conn.busy_timeout(std::time::Duration::from_secs(5))?;
//! conn.execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY)")?;
//! let spec: PlanSpec = serde_json::from_value(serde_json::json!({
//!     "name": "deliver-order-o-1", "recovery": "resume",
//!     "steps": [{"code": "notify", "executor": "dry-run:v1", "payload": {"order": "o-1"}}],
//! }))?;
//!
//! let outbox = Outbox::new();
//! let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
//! tx.execute("INSERT INTO orders (id) VALUES ('o-1')", [])?;
//! let plan = outbox.register_plan_sqlite(&tx, spec, &Executors::new().names())?;
//! let record = outbox.enqueue_sqlite(&tx, &plan.id, Action::Execute)?;
//! tx.rollback()?; // or commit: the order and its delivery go together
//! assert!(ledger.attempt(&record.attempt.id).await.is_err());
//! # Ok(())
//! # }
//! ```
//!
//! On MySQL / MariaDB, with the caller's `mysql_async` transaction (needs a server,
//! so not run here):
//!
//! ```no_run
//! # #[cfg(feature = "mysql")] mod example {
//! use leasehold::engine::{Action, PlanId};
//! use leasehold::outbox::mysql_async::{prelude::Queryable, Pool, TxOpts};
//! use leasehold::outbox::Outbox;
//!
//! # async fn place_order(pool: &Pool, plan: &PlanId) -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = pool.get_conn().await?;
//! let mut tx = conn.start_transaction(TxOpts::default()).await?;
//! tx.exec_drop("INSERT INTO orders (id) VALUES (?)", ("o-1",)).await?;
//! Outbox::new().enqueue_mysql(&mut tx, plan, Action::Execute).await?;
//! tx.commit().await?;
//! # Ok(())
//! # }
//! # }
//! ```
//!
//! A complete application is `examples/embedded.rs` (`cargo run --example embedded`);
//! the guarantees are in `docs/library.md`.

pub use leasehold_engine as engine;

pub mod archive;
#[cfg(feature = "cli")]
pub mod bench;
pub mod clock;
pub mod entropy;
pub mod executor;
pub mod ledger;
#[cfg(feature = "cli")]
pub mod listener;
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub mod outbox;
#[cfg(feature = "cli")]
pub mod receiver;
#[cfg(feature = "cli")]
pub mod report;
#[cfg(feature = "cli")]
pub mod serve;
pub mod text;
#[cfg(feature = "cli")]
pub mod tokens;
pub mod trace;
pub mod worker;
