//! Builders for the gate and comparison tests: a ledger on a fixed clock and seed, a
//! small three-step plan, and deliveries driven through the [`Ledger`] trait with
//! evidence the test chooses. Every lease token a fixture is handed is recorded, so
//! a test can check that no report ever shows one.

// Each test binary that includes this module uses only some of it.
#![allow(dead_code)]

use leasehold::clock::ManualClock;
use leasehold::entropy::SeededEntropy;
use leasehold::executor::Executors;
use leasehold::ledger::memory::MemoryLedger;
use leasehold::ledger::Ledger;
use leasehold_engine::canonical::fingerprint;
use leasehold_engine::{Action, AttemptId, AttemptRecord, AttemptStatus, Lease, Plan, PlanSpec, Timestamp};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

/// The ledger clock's reading when a fixture starts.
pub const START_MS: i64 = 1_796_000_000_000;
/// The entropy seed of every fixture.
pub const SEED: u64 = 42;
/// The lease owner every claim names.
pub const OWNER: &str = "gate-test-worker";
/// The lease every claim and renewal grants.
pub const LEASE_MS: u64 = 60_000;
/// How far the clock moves between two ledger calls.
pub const TICK_MS: u64 = 1_000;

/// A fresh clock at [`START_MS`].
pub fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(Timestamp::from_millis(START_MS)))
}

/// A memory ledger on `clock` minting from [`SEED`].
pub fn memory_ledger(clock: &Arc<ManualClock>) -> MemoryLedger {
    MemoryLedger::new(clock.clone(), Arc::new(SeededEntropy::new(SEED)))
}

/// The three-step plan of the snapshot cases: two sandbox steps and a dry run, with
/// `run_id` declared volatile.
pub fn demo_spec() -> PlanSpec {
    serde_json::from_value(json!({
        "name": "gate-demo",
        "recovery": "replay",
        "volatile_fields": ["run_id"],
        "steps": [
            {"code": "create-schema", "executor": "sqlite-sandbox:v1", "payload": {
                "sql": ["CREATE TABLE account (id INTEGER PRIMARY KEY, email TEXT NOT NULL, country TEXT NOT NULL)"],
                "checks": [{"name": "tables", "query": "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"}],
            }},
            {"code": "seed-accounts", "executor": "sqlite-sandbox:v1", "payload": {
                "sql": ["INSERT INTO account VALUES (1, 'ada@example.com', 'US'), (2, 'bert@example.com', 'DE')"],
                "checks": [{"name": "accounts", "query": "SELECT id, email, country FROM account ORDER BY id"}],
            }},
            {"code": "notify", "executor": "dry-run:v1", "payload": {"channel": "release"}},
        ],
    }))
    .expect("the demo spec is well formed")
}

/// The evidence of each step of the demo plan for one attempt: only `sandbox_id`
/// and `run_id` depend on the attempt.
pub fn demo_evidence(attempt: &AttemptId) -> Vec<Value> {
    let sandbox = format!("sbx-{attempt}-d1");
    vec![
        json!({"sandbox_id": sandbox, "statements": 1, "checks": {"tables": [["account"]]}}),
        json!({"sandbox_id": sandbox, "statements": 1, "checks": {"accounts": [
            [1, "ada@example.com", "US"],
            [2, "bert@example.com", "DE"],
        ]}}),
        json!({
            "executor": "dry-run:v1",
            "step": "notify",
            "payload_sha256": fingerprint(&json!({"channel": "release"})),
            "run_id": format!("run-{attempt}"),
        }),
    ]
}

/// [`demo_evidence`] with one non-volatile field changed: the first account's email,
/// at `/receipts/1/evidence/checks/accounts/0/1`.
pub fn drifted_evidence(attempt: &AttemptId) -> Vec<Value> {
    let mut evidence = demo_evidence(attempt);
    evidence[1]["checks"]["accounts"][0][1] = json!("ada@example.org");
    evidence
}

/// The JSON pointer of the field [`drifted_evidence`] changes.
pub const DRIFTED_PATH: &str = "/receipts/1/evidence/checks/accounts/0/1";

/// A ledger with one registered plan, on a manual clock.
pub struct Fixture<L> {
    /// The ledger.
    pub ledger: L,
    /// Its clock.
    pub clock: Arc<ManualClock>,
    /// The registered plan (as registered; see [`Fixture::plan`] for its current row).
    pub plan: Plan,
    tokens: Mutex<Vec<String>>,
}

impl Fixture<MemoryLedger> {
    /// A memory ledger with the demo plan registered.
    pub async fn memory() -> Self {
        let clock = clock();
        Self::new(memory_ledger(&clock), clock, demo_spec()).await
    }
}

impl<L: Ledger> Fixture<L> {
    /// Registers `spec` in `ledger`.
    pub async fn new(ledger: L, clock: Arc<ManualClock>, spec: PlanSpec) -> Self {
        let plan = ledger
            .register_plan(spec, &Executors::new().names())
            .await
            .expect("the plan registers");
        Self {
            ledger,
            clock,
            plan,
            tokens: Mutex::new(Vec::new()),
        }
    }

    fn tick(&self) {
        self.clock.advance_ms(TICK_MS);
    }

    /// Every lease token this fixture was handed.
    pub fn tokens(&self) -> Vec<String> {
        self.tokens.lock().expect("not poisoned").clone()
    }

    /// Records a token minted outside the ledger (for hand-built records).
    pub fn remember_token(&self, token: &str) {
        self.tokens.lock().expect("not poisoned").push(token.to_owned());
    }

    /// The plan's current row.
    pub async fn plan(&self) -> Plan {
        self.ledger.plan(&self.plan.id).await.expect("the plan exists")
    }

    /// Every attempt of the plan, by number.
    pub async fn history(&self) -> Vec<AttemptRecord> {
        self.ledger.history(&self.plan.id).await.expect("history reads")
    }

    /// Enqueues the next forward attempt (`retry` after a FAILED or ABORTED one,
    /// `execute` otherwise) and claims it; answers the lease and the claimed rows.
    pub async fn start(&self) -> (Lease, AttemptRecord) {
        let latest = self.history().await.pop();
        let action = match latest.map(|r| r.attempt.status) {
            Some(AttemptStatus::Failed | AttemptStatus::Aborted) => Action::Retry,
            _ => Action::Execute,
        };
        self.tick();
        let record = self
            .ledger
            .enqueue(&self.plan.id, action)
            .await
            .expect("enqueue is admitted");
        self.tick();
        let claimed = self.ledger.claim(OWNER, 1, LEASE_MS).await.expect("claim succeeds");
        let claimed = claimed
            .into_iter()
            .find(|c| c.lease.attempt_id == record.attempt.id)
            .expect("our attempt");
        self.remember_token(claimed.lease.token.expose());
        (claimed.lease, claimed.record)
    }

    /// Begins the step at `ordinal`.
    pub async fn begin(&self, lease: &Lease, ordinal: u32) {
        self.tick();
        self.ledger
            .begin_step(lease, ordinal, LEASE_MS)
            .await
            .expect("begin is admitted");
    }

    /// Begins and completes the step at `ordinal` with `evidence`; the target
    /// receipt names the sandbox and the idempotency key, as the sandbox does.
    pub async fn step(&self, lease: &Lease, record: &AttemptRecord, ordinal: u32, evidence: &Value) {
        self.begin(lease, ordinal).await;
        let key = &record.receipt(ordinal).expect("the receipt exists").idempotency_key;
        let target = json!({"sandbox": format!("sbx-{}-d1", lease.attempt_id), "idempotency_key": key});
        self.tick();
        self.ledger
            .complete_step(lease, ordinal, evidence, &target, LEASE_MS)
            .await
            .expect("complete is admitted");
    }

    /// Delivers one attempt to SUCCEEDED/DELIVERED with the evidence `make` gives
    /// for its id; answers its id.
    pub async fn deliver(&self, make: impl Fn(&AttemptId) -> Vec<Value>) -> AttemptId {
        let (lease, record) = self.start().await;
        for (evidence, ordinal) in make(&lease.attempt_id).iter().zip(1u32..) {
            self.step(&lease, &record, ordinal, evidence).await;
        }
        self.tick();
        self.ledger.finish(&lease).await.expect("finish is admitted");
        lease.attempt_id
    }
}
