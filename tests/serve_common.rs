//! A `leasehold serve` under test: the real router on a loopback port over a SQLite
//! ledger in a scratch directory, with one token per role. Shared by the API and
//! browser tests (included with `#[path]`); on its own it holds no test.
#![allow(dead_code, missing_docs)]

use leasehold::bench::plan_spec;
use leasehold::clock::{Clock, SystemClock};
use leasehold::entropy::OsEntropy;
use leasehold::executor::Executors;
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::{Claimed, Ledger};
use leasehold::serve::App;
use leasehold::tokens::{create_token, Role};
use leasehold_engine::request::{Reply, WorkerRequest};
use leasehold_engine::{Action, AttemptRecord, Plan, Timestamp};
use leasehold_engine::{Lease, RetrySpec};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A server and the ledger behind it.
pub struct TestServer {
    pub base: String,
    pub ledger: Arc<SqliteLedger>,
    pub app: App,
    pub viewer: String,
    /// A producer's token: enqueue only.
    pub producer: String,
    pub operator: String,
    pub admin: String,
    pub db_path: String,
    _dir: tempfile::TempDir,
}

pub fn now() -> Timestamp {
    leasehold::clock::Clock::now(&SystemClock)
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|app| app).await
    }

    /// Starts a server whose app `configure` adjusts first.
    pub async fn start_with(configure: impl FnOnce(App) -> App) -> Self {
        Self::start_with_clock(Arc::new(SystemClock), configure).await
    }

    /// Starts a server that reads the time ("time left", metric ages) from `clock`
    /// (the ledger keeps the system clock), whose app `configure` adjusts first.
    pub async fn start_with_clock(clock: Arc<dyn Clock>, configure: impl FnOnce(App) -> App) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let db_path = dir.path().join("ledger.db").display().to_string();
        let ledger = Arc::new(SqliteLedger::open(&db_path, Arc::new(SystemClock), Arc::new(OsEntropy)).expect("open"));
        ledger.migrate().await.expect("migrate");
        let mut secrets = Vec::new();
        for (name, role) in [
            ("viewer", Role::Viewer),
            ("producer", Role::Producer),
            ("operator", Role::Operator),
            ("admin", Role::Admin),
        ] {
            let (_, secret) = create_token(ledger.as_ref(), name, role, now()).await.expect("token");
            secrets.push(secret.expose().to_owned());
        }
        let app = configure(App::with_clock(Arc::clone(&ledger), &Executors::new().names(), clock));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let router = leasehold::serve::router(app.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        let [viewer, producer, operator, admin]: [String; 4] = secrets.try_into().expect("four tokens");
        Self {
            base,
            ledger,
            app,
            viewer,
            producer,
            operator,
            admin,
            db_path,
            _dir: dir,
        }
    }

    /// The token of `role`.
    pub fn token(&self, role: Role) -> &str {
        match role {
            Role::Viewer => &self.viewer,
            Role::Producer => &self.producer,
            Role::Operator => &self.operator,
            Role::Admin => &self.admin,
        }
    }

    /// Registers a dry-run plan named `name` with `steps` steps.
    pub async fn plan(&self, name: &str, steps: u32) -> Plan {
        self.ledger
            .register_plan(plan_spec(name.to_owned(), steps), &Executors::new().names())
            .await
            .expect("register")
    }

    /// Registers a dry-run plan named `name` with `steps` steps whose `[retry]` table
    /// allows `max_deliveries` deliveries.
    pub async fn plan_with_retry(&self, name: &str, steps: u32, max_deliveries: i64) -> Plan {
        let mut spec = plan_spec(name.to_owned(), steps);
        spec.retry = Some(RetrySpec {
            max_deliveries: Some(max_deliveries),
            ..RetrySpec::default()
        });
        self.ledger
            .register_plan(spec, &Executors::new().names())
            .await
            .expect("register")
    }

    /// Gives the command of `lease` back after a transient `error`, claimable again
    /// after `delay_ms` (or exhausted, as the plan's policy says): the ledger's reply.
    pub async fn give_back(&self, lease: &Lease, error: &str, delay_ms: u64) -> Reply {
        let request = WorkerRequest::GiveBack {
            error: error.to_owned(),
            delay_ms,
        };
        self.ledger.worker(lease, request).await.expect("give back")
    }

    /// A plan named `name` that allows one delivery, and its attempt, exhausted: one
    /// claim, given back with `error`.
    pub async fn exhausted(&self, name: &str, error: &str) -> AttemptRecord {
        let plan = self.plan_with_retry(name, 1, 1).await;
        let record = self.enqueue(&plan).await;
        let claimed = self.claim(60_000).await;
        assert_eq!(
            claimed.lease.attempt_id, record.attempt.id,
            "the new attempt was claimed"
        );
        let reply = self.give_back(&claimed.lease, error, 1_000).await;
        assert!(matches!(reply, Reply::Exhausted(_)), "{reply:?}");
        self.ledger.attempt(&record.attempt.id).await.expect("attempt")
    }

    /// Enqueues an execute attempt of `plan`.
    pub async fn enqueue(&self, plan: &Plan) -> AttemptRecord {
        self.ledger.enqueue(&plan.id, Action::Execute).await.expect("enqueue")
    }

    /// Claims the one claimable command under a lease of `lease_ms`, beginning its
    /// first step: a RUNNING attempt with a live lease.
    pub async fn claim(&self, lease_ms: u64) -> Claimed {
        let mut claimed = self
            .ledger
            .claim_and_begin("test-worker", 1, lease_ms)
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1, "one command to claim");
        claimed.remove(0)
    }
}

/// Waits until `condition` holds, checking every 20 ms, for at most `limit`.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !condition().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
