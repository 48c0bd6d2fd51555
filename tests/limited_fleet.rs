//! A target's concurrency limit holds across worker processes that are killed: four
//! `leasehold worker` processes at batch 5 deliver `http:v1` attempts to one
//! `leasehold target` (each request held for a while) whose target has
//! `max_in_flight` 2 (set with `leasehold limits set`), while workers are killed (SIGKILL) at seeded random moments
//! and replaced. The target never processed more than 2 requests at once, every
//! attempt SUCCEEDED, and every key was applied once. On SQLite, and on MariaDB /
//! MySQL (`LEASEHOLD_TEST_MYSQL_URL`) and PostgreSQL (`LEASEHOLD_TEST_POSTGRES_URL`)
//! when their variable is set (else the case says it is skipped).
//!
//! Needs the `cli` feature (the binary, the target); without it this file is empty.
#![cfg(feature = "cli")]

use leasehold::engine::{Action, AttemptId, AttemptStatus, PlanSpec};
use leasehold::ledger::Ledger;
use procs::Proc;
use serde_json::json;
use std::time::{Duration, Instant};

#[path = "procs/mod.rs"]
mod procs;

const ATTEMPTS: usize = 32;
const WORKERS: usize = 4;
const LIMIT: u32 = 2;
/// How long the target holds each request: long enough that a batch of 5 would
/// open 5 at once if nothing limited it.
const DELAY_MS: &str = "150";
/// Workers killed (each replaced at once).
const KILLS: usize = 4;
const DEADLINE: Duration = Duration::from_secs(90);

#[test]
fn sqlite_a_targets_limit_holds_while_workers_are_killed() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_sqlite(&runtime, Limited { runtime: &runtime });
}

#[test]
fn mysql_a_targets_limit_holds_while_workers_are_killed() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_mysql(&runtime, "lh_limit_", Limited { runtime: &runtime });
}

#[test]
fn postgres_a_targets_limit_holds_while_workers_are_killed() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_postgres(&runtime, "lh_limit_", Limited { runtime: &runtime });
}

struct Limited<'a> {
    runtime: &'a tokio::runtime::Runtime,
}

/// xorshift64: the kill schedule's draws, from a seed the failure message names.
struct Draws(u64);

impl Draws {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

impl procs::Scenario for Limited<'_> {
    fn run<L: Ledger>(self, ledger: &L, ledger_url: &str, target_url: &str) {
        let target = Proc::spawn(&[
            "--db",
            target_url,
            "target",
            "--listen",
            "127.0.0.1:0",
            "--delay-ms",
            DELAY_MS,
        ]);
        let listening = target
            .1
            .wait_for_line("the target", "listening on http://", Duration::from_secs(30));
        let addr = listening.rsplit("http://").next().unwrap().trim().to_owned();
        let target = format!("http://{addr}");
        let set = procs::run_cli(&[
            "--db",
            ledger_url,
            "limits",
            "set",
            &target,
            "--max-in-flight",
            &LIMIT.to_string(),
        ]);
        assert!(set.contains(&target), "{set}");
        let (rows, _) = self.runtime.block_on(ledger.limits()).expect("limits");
        assert_eq!(
            rows[0].limit.max_in_flight,
            Some(LIMIT),
            "the limit as the ledger holds it"
        );
        let ids: Vec<AttemptId> = (0..ATTEMPTS).map(|n| self.enqueue(ledger, plan(n, &addr))).collect();
        let seed = 0x5eed_u64 ^ addr.len() as u64;
        let kills = self.run_fleet(ledger, (ledger_url, &addr), &ids, seed);
        for id in &ids {
            let r = self.runtime.block_on(ledger.attempt(id)).unwrap();
            assert_eq!(
                r.attempt.status,
                AttemptStatus::Succeeded,
                "{id}: {:?}",
                r.attempt.error
            );
        }
        let effects = procs::effects(self.runtime, &addr);
        assert!(
            effects.max_concurrent <= u64::from(LIMIT),
            "seed {seed:#x}: the target processed {} requests at once, over the limit of {LIMIT}",
            effects.max_concurrent
        );
        assert_eq!(effects.keys, ATTEMPTS as u64, "{effects:?}");
        assert!(
            effects.by_key.values().all(|n| *n == 1),
            "a key applied twice: {effects:?}"
        );
        assert_eq!(kills, KILLS, "the schedule killed every worker it meant to");
        eprintln!(
            "limited fleet: {ATTEMPTS} attempts, {KILLS} workers killed, most at once {} (limit {LIMIT})",
            effects.max_concurrent
        );
    }
}

impl Limited<'_> {
    fn enqueue<L: Ledger>(&self, ledger: &L, spec: PlanSpec) -> AttemptId {
        self.runtime.block_on(async {
            let plan = ledger.register_plan(spec, &["http:v1"]).await.unwrap();
            ledger.enqueue(&plan.id, Action::Execute).await.unwrap().attempt.id
        })
    }

    /// Runs the workers until every attempt of `ids` ended, killing one at random
    /// (then replacing it) every 150 to 400 milliseconds until `KILLS` died;
    /// answers how many were killed.
    fn run_fleet<L: Ledger>(
        &self,
        ledger: &L,
        (ledger_url, addr): (&str, &str),
        ids: &[AttemptId],
        seed: u64,
    ) -> usize {
        let worker = |n: usize| {
            let id = format!("w{n}");
            let args = [
                "--db",
                ledger_url,
                "worker",
                "--id",
                &id,
                "--batch",
                "5",
                "--lease-secs",
                "2",
                "--poll-secs",
                "1",
                "--http-allow",
                addr,
            ];
            Proc::spawn(&args)
        };
        let mut fleet: Vec<Proc> = (0..WORKERS).map(worker).collect();
        let mut draws = Draws(seed | 1);
        let (mut kills, mut next_kill) = (0, Instant::now() + Duration::from_millis(100 + draws.next(200)));
        let deadline = Instant::now() + DEADLINE;
        while self.open(ledger, ids) > 0 {
            assert!(
                Instant::now() < deadline,
                "seed {seed:#x}: attempts still open after {DEADLINE:?}"
            );
            if kills < KILLS && Instant::now() >= next_kill {
                let victim = draws.next(WORKERS as u64) as usize;
                fleet[victim] = worker(WORKERS + kills);
                kills += 1;
                next_kill = Instant::now() + Duration::from_millis(150 + draws.next(250));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        kills
    }

    fn open<L: Ledger>(&self, ledger: &L, ids: &[AttemptId]) -> usize {
        ids.iter()
            .filter(|id| {
                !self
                    .runtime
                    .block_on(ledger.attempt(id))
                    .unwrap()
                    .attempt
                    .status
                    .is_terminal()
            })
            .count()
    }
}

fn plan(n: usize, addr: &str) -> PlanSpec {
    serde_json::from_value(json!({
        "name": format!("limited-{n}"),
        "recovery": "resume",
        "steps": [{"code": "post", "executor": "http:v1",
                   "payload": {"url": format!("http://{addr}/orders/{n}"), "body": {"order": n}}}],
    }))
    .expect("a valid plan")
}
