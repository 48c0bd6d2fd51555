//! The delivery policy with real processes: a `leasehold target` process and
//! `leasehold worker` processes (killed with SIGKILL at random and restarted) deliver
//! one-step `http:v1` plans with a `[retry]` table — on SQLite, and on MariaDB /
//! MySQL (`LEASEHOLD_TEST_MYSQL_URL`) and PostgreSQL (`LEASEHOLD_TEST_POSTGRES_URL`)
//! when their variable is set (else the case says it is skipped).
//!
//! - **poison**: the target answers every request 503 (`--fail-rate 1`). Every
//!   attempt must end FAILED with an `exhausted` reason, every command within its
//!   `max_deliveries`, and the target must have seen no more calls per key than the
//!   policy allows: `max_deliveries` x `step_max_tries` x the tries one `http:v1`
//!   call can make within its `budget_ms` (see [`HTTP_TRIES_PER_CALL`]).
//! - **flaky**: the target fails everything for its first three seconds
//!   (`--fail-for 3s`), then recovers. Every attempt must end SUCCEEDED, after
//!   give-backs, and the target must have applied each key exactly once.
//!
//! The kill schedule comes from a seed printed at the start (`LEASEHOLD_POLICY_SEED=N`
//! replays it). The end state is read from the ledger, polled with a deadline; the
//! pauses of the schedule only pace it.
//!
//! Needs the `cli` feature (the binary, the target); without it this file is empty.
#![cfg(feature = "cli")]

use leasehold::engine::{Action, AttemptId, AttemptRecord, AttemptStatus, CommandStatus, PlanSpec};
use leasehold::entropy::{Entropy, OsEntropy, SeededEntropy};
use leasehold::ledger::Ledger;
use leasehold::receiver::Effects;
use serde_json::json;
use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[path = "procs/mod.rs"]
mod procs;

/// Attempts per run, each of its own plan.
const ATTEMPTS: usize = 6;
/// Worker processes alive at once (a killed one is replaced at once).
const WORKERS: usize = 2;
const LEASE_SECS: u64 = 2;
/// Kills stop after this long (or once every attempt has ended)...
const KILL_WINDOW: Duration = Duration::from_secs(8);
/// ...then every attempt must have ended, and every worker exited, within this.
const DEADLINE: Duration = Duration::from_secs(90);

/// The poison plans' policy.
const POISON_MAX_DELIVERIES: u64 = 3;
const POISON_STEP_MAX_TRIES: u64 = 2;
/// The poison plans' `budget_ms`: the smallest a call may have.
const POISON_BUDGET_MS: u64 = 100;
/// The most tries one `http:v1` call makes within [`POISON_BUDGET_MS`]: the executor
/// waits at least 50 ms before its second try and at least 100 ms more before a
/// third (half of its 100 ms, doubling, backoff ceiling), and starts no try whose
/// wait would end past the budget; 50 + 100 > 100, so two.
const HTTP_TRIES_PER_CALL: u64 = 2;

/// The flaky target's outage (from its start, before the attempts are enqueued).
const FLAKY_FOR: &str = "3s";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    Poison,
    Flaky,
}

#[test]
fn sqlite_poison_attempts_end_failed_exhausted_within_their_policy() {
    sqlite(Scenario::Poison);
}

#[test]
fn sqlite_a_flaky_target_gets_every_key_once_after_give_backs() {
    sqlite(Scenario::Flaky);
}

#[test]
fn mysql_poison_attempts_end_failed_exhausted_within_their_policy() {
    mysql(Scenario::Poison);
}

#[test]
fn mysql_a_flaky_target_gets_every_key_once_after_give_backs() {
    mysql(Scenario::Flaky);
}

#[test]
fn postgres_poison_attempts_end_failed_exhausted_within_their_policy() {
    postgres(Scenario::Poison);
}

#[test]
fn postgres_a_flaky_target_gets_every_key_once_after_give_backs() {
    postgres(Scenario::Flaky);
}

fn sqlite(scenario: Scenario) {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_sqlite(&runtime, Run::new("sqlite", scenario, &runtime));
}

fn mysql(scenario: Scenario) {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_mysql(&runtime, "lh_policy_", Run::new("mysql", scenario, &runtime));
}

fn postgres(scenario: Scenario) {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_postgres(&runtime, "lh_policy_", Run::new("postgres", scenario, &runtime));
}

/// A child process and its output.
struct Proc {
    child: Child,
    out: procs::Output,
}

impl Proc {
    fn spawn(args: &[&str]) -> Self {
        let (child, out) = procs::spawn(args);
        Self { child, out }
    }

    /// Waits (bounded) for the first output line containing `needle`.
    fn wait_for_line(&self, needle: &str, within: Duration) -> String {
        self.out.wait_for_line("the process", needle, within)
    }

    /// Whether a line of its output so far contains `needle`.
    fn printed(&self, needle: &str) -> bool {
        self.out.printed(needle)
    }

    fn output(&self) -> String {
        self.out.text()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl procs::Scenario for Run<'_> {
    fn run<L: Ledger>(self, ledger: &L, ledger_url: &str, target_url: &str) {
        Run::run(&self, ledger, ledger_url, target_url);
    }
}

/// One scenario on one backend.
struct Run<'a> {
    backend: &'static str,
    scenario: Scenario,
    seed: u64,
    runtime: &'a tokio::runtime::Runtime,
}

impl<'a> Run<'a> {
    fn new(backend: &'static str, scenario: Scenario, runtime: &'a tokio::runtime::Runtime) -> Self {
        let seed = match std::env::var("LEASEHOLD_POLICY_SEED") {
            Ok(s) => s.trim().parse().expect("LEASEHOLD_POLICY_SEED must be a whole number"),
            Err(_) => OsEntropy.next_u64(),
        };
        let _ = writeln!(
            std::io::stderr(),
            "delivery policy ({backend}, {scenario:?}): seed {seed} (replay with LEASEHOLD_POLICY_SEED={seed})"
        );
        Self {
            backend,
            scenario,
            seed,
            runtime,
        }
    }

    fn context(&self) -> String {
        format!(
            "{} {:?}, seed {} (LEASEHOLD_POLICY_SEED={} replays it)",
            self.backend, self.scenario, self.seed, self.seed
        )
    }

    /// The plan of attempt `n`: one http:v1 step to the target, and the scenario's policy.
    fn plan(&self, n: usize, addr: &str) -> PlanSpec {
        let (retry, budget_ms) = match self.scenario {
            Scenario::Poison => (
                json!({"max_deliveries": POISON_MAX_DELIVERIES, "backoff_base_ms": 100, "backoff_max_ms": 400,
                       "step_max_tries": POISON_STEP_MAX_TRIES}),
                POISON_BUDGET_MS,
            ),
            // Enough deliveries to outlast the outage: each takes at least ~100 ms.
            Scenario::Flaky => (
                json!({"max_deliveries": 200, "backoff_base_ms": 200, "backoff_max_ms": 1000, "step_max_tries": 2}),
                300,
            ),
        };
        serde_json::from_value(json!({
            "name": format!("policy-{n:02}"),
            "recovery": "resume",
            "retry": retry,
            "steps": [{
                "code": "post-order",
                "executor": "http:v1",
                "payload": {"url": format!("http://{addr}/orders/{n}"), "body": {"order": n},
                            "timeout_ms": 1_000, "budget_ms": budget_ms},
            }],
        }))
        .expect("a valid plan")
    }

    fn target_args(&self, target_url: &str) -> Vec<String> {
        let mut args: Vec<String> = [
            "--db",
            target_url,
            "target",
            "--listen",
            "127.0.0.1:0",
            "--fail-rate",
            "1",
        ]
        .map(str::to_owned)
        .into();
        if self.scenario == Scenario::Flaky {
            args.extend(["--fail-for".to_owned(), FLAKY_FOR.to_owned()]);
        }
        args.extend(["--seed".to_owned(), self.seed.to_string()]);
        args
    }

    fn run<L: Ledger>(&self, ledger: &L, ledger_url: &str, target_url: &str) {
        let started = Instant::now();
        let args = self.target_args(target_url);
        let target = Proc::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let listening = target.wait_for_line("listening on http://", Duration::from_secs(30));
        let addr = listening.rsplit("http://").next().unwrap().trim().to_owned();
        let attempts: Vec<AttemptId> = (0..ATTEMPTS)
            .map(|n| {
                self.runtime.block_on(async {
                    let plan = ledger.register_plan(self.plan(n, &addr), &["http:v1"]).await.unwrap();
                    ledger.enqueue(&plan.id, Action::Execute).await.unwrap().attempt.id
                })
            })
            .collect();
        let (kills, logs) = self.deliver(ledger, ledger_url, &addr);
        let gave_back = logs.iter().filter(|l| l.contains(": gave back (")).count();
        let records: Vec<AttemptRecord> = attempts
            .iter()
            .map(|id| self.runtime.block_on(ledger.attempt(id)).unwrap())
            .collect();
        let effects = procs::effects(self.runtime, &addr);
        let deliveries: u32 = records.iter().map(|r| r.command.delivery_count).sum();
        let _ = writeln!(
            std::io::stderr(),
            "delivery policy ({}, {:?}) seed {}: {ATTEMPTS} attempts, {kills} workers killed, {deliveries} deliveries, \
             {gave_back} give-backs logged, {} injected 503s, {} keys applied, {:.1} s",
            self.backend,
            self.scenario,
            self.seed,
            effects.faults.failed,
            effects.keys,
            started.elapsed().as_secs_f64()
        );
        match self.scenario {
            Scenario::Poison => self.check_poison(&records, &effects),
            Scenario::Flaky => self.check_flaky(&records, &effects),
        }
        assert!(gave_back >= 1, "{}: no worker logged a give-back", self.context());
        assert!(kills >= 1, "{}: the schedule killed no worker", self.context());
        assert!(Command::new("kill")
            .args(["-TERM", &target.child.id().to_string()])
            .status()
            .unwrap()
            .success());
    }

    /// Runs the workers, killing one (and starting another) as soon as one is seen
    /// holding a claim, then one at random every 0.3-1.2 s within the kill window,
    /// until every attempt has ended and every worker has exited; answers how many
    /// were killed, and every worker's output.
    fn deliver<L: Ledger>(&self, ledger: &L, ledger_url: &str, addr: &str) -> (u32, Vec<String>) {
        let draws = SeededEntropy::new(self.seed);
        let between = |draws: &SeededEntropy| Duration::from_millis(300 + draws.next_u64() % 901);
        let spawn = |n: u32| {
            let id = format!("policy-w{n}");
            Proc::spawn(&[
                "--db",
                ledger_url,
                "worker",
                "--id",
                &id,
                "--lease-secs",
                &LEASE_SECS.to_string(),
                "--poll-secs",
                "1",
                "--batch",
                "2",
                "--until-idle",
                "--http-allow",
                addr,
            ])
        };
        let open = || self.runtime.block_on(ledger.open_attempts()).unwrap_or(u64::MAX);
        let mut started = WORKERS as u32;
        let mut workers: Vec<Proc> = (0..started).map(spawn).collect();
        let window = Instant::now() + KILL_WINDOW;
        let deadline = Instant::now() + DEADLINE;
        let mut next_kill = Instant::now();
        let mut kills = 0;
        let mut gone = Vec::new();
        while open() > 0 {
            assert!(
                Instant::now() < deadline,
                "{}: {} attempts still open after {DEADLINE:?}",
                self.context(),
                open()
            );
            // The first kill is of the first worker seen holding a claim; then any
            // worker, at random.
            let now = Instant::now();
            let due = if kills == 0 {
                workers.iter().position(|w| w.printed("claimed attempt"))
            } else {
                (now >= next_kill && now < window).then(|| (draws.next_u64() % WORKERS as u64) as usize)
            };
            if let Some(slot) = due {
                let _ = workers[slot].child.kill();
                let _ = workers[slot].child.wait();
                kills += 1;
                gone.push(std::mem::replace(&mut workers[slot], spawn(started)));
                started += 1;
                next_kill = Instant::now() + between(&draws);
            }
            // Paces the loop; the end state is what is waited for.
            std::thread::sleep(Duration::from_millis(100));
        }
        for worker in &mut workers {
            let status = loop {
                if let Some(status) = worker.child.try_wait().unwrap() {
                    break status;
                }
                assert!(
                    Instant::now() < deadline,
                    "{}: a worker did not exit once idle",
                    self.context()
                );
                std::thread::sleep(Duration::from_millis(50));
            };
            assert!(
                status.success(),
                "{}: worker exited {status}: {}",
                self.context(),
                worker.output()
            );
        }
        let logs = gone.iter().chain(&workers).flat_map(|w| w.out.lines()).collect();
        (kills, logs)
    }

    /// Poison: FAILED exhausted, within the delivery cap, and within the call bound
    /// per key at the target.
    fn check_poison(&self, records: &[AttemptRecord], effects: &Effects) {
        let ctx = self.context();
        let bound = POISON_MAX_DELIVERIES * POISON_STEP_MAX_TRIES * HTTP_TRIES_PER_CALL;
        for r in records {
            let error = r.attempt.error.as_deref().unwrap_or_default();
            assert_eq!(r.attempt.status, AttemptStatus::Failed, "{ctx}: {r:?}");
            assert!(
                error.contains("exhausted"),
                "{ctx}: attempt {} failed with {error:?}",
                r.attempt.id
            );
            assert_eq!(r.command.status, CommandStatus::Failed, "{ctx}: {r:?}");
            let count = u64::from(r.command.delivery_count);
            assert!(
                (1..=POISON_MAX_DELIVERIES).contains(&count),
                "{ctx}: attempt {} delivered {count} times",
                r.attempt.id
            );
            let key = &r.receipts[0].idempotency_key;
            let calls = effects.faults.failed_by_key.get(key).copied().unwrap_or(0);
            assert!(
                (1..=bound).contains(&calls),
                "{ctx}: key {key} was called {calls} times (at most {bound}: {POISON_MAX_DELIVERIES} deliveries x \
                 {POISON_STEP_MAX_TRIES} tries x {HTTP_TRIES_PER_CALL} HTTP tries)"
            );
        }
        let keys: BTreeSet<&String> = records.iter().map(|r| &r.receipts[0].idempotency_key).collect();
        assert_eq!(
            effects.faults.failed_by_key.keys().collect::<BTreeSet<_>>(),
            keys,
            "{ctx}: calls of keys no attempt has"
        );
        assert_eq!(
            effects.faults.failed,
            effects.faults.failed_by_key.values().sum::<u64>(),
            "{ctx}: every call was of an attempt's key"
        );
        assert_eq!(
            (effects.keys, effects.effects),
            (0, 0),
            "{ctx}: nothing applied: {effects:?}"
        );
    }

    /// Flaky: SUCCEEDED after give-backs, each key applied exactly once.
    fn check_flaky(&self, records: &[AttemptRecord], effects: &Effects) {
        let ctx = self.context();
        for r in records {
            assert_eq!(r.attempt.status, AttemptStatus::Succeeded, "{ctx}: {r:?}");
            assert_eq!(r.command.status, CommandStatus::Delivered, "{ctx}: {r:?}");
        }
        let keys: BTreeSet<&String> = records.iter().map(|r| &r.receipts[0].idempotency_key).collect();
        assert_eq!(
            effects.by_key.keys().collect::<BTreeSet<_>>(),
            keys,
            "{ctx}: {effects:?}"
        );
        assert!(
            effects.by_key.values().all(|n| *n == 1),
            "{ctx}: a key applied twice: {effects:?}"
        );
        assert_eq!(
            (effects.keys, effects.effects, effects.in_progress),
            (ATTEMPTS as u64, ATTEMPTS as u64, 0)
        );
        assert!(
            effects.faults.failed >= 1,
            "{ctx}: the outage failed nothing: {effects:?}"
        );
        assert!(
            records.iter().any(|r| r.command.delivery_count >= 2),
            "{ctx}: no command was delivered again: {records:?}"
        );
    }
}
