//! A mixed fleet with real processes: a `leasehold worker` that may not reach the
//! target (no `--http-allow`) starts first and polls while `http:v1` attempts wait;
//! `leasehold status` says what they wait for; a worker that may reach the target
//! starts and delivers them all. Nothing fails, and the first worker claims nothing
//! but the work of its own kind. On SQLite, and on MariaDB / MySQL
//! (`LEASEHOLD_TEST_MYSQL_URL`) and PostgreSQL (`LEASEHOLD_TEST_POSTGRES_URL`) when
//! their variable is set (else the case says it is skipped).
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

/// `http:v1` attempts, each of its own plan.
const HTTP_ATTEMPTS: usize = 6;
/// `dry-run:v1` attempts, which the worker without the allowlist may run.
const DRY_ATTEMPTS: usize = 3;
/// Every attempt must have ended within this.
const DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn sqlite_a_worker_that_cannot_reach_the_target_leaves_its_work_to_one_that_can() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_sqlite(&runtime, Fleet { runtime: &runtime });
}

#[test]
fn mysql_a_worker_that_cannot_reach_the_target_leaves_its_work_to_one_that_can() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_mysql(&runtime, "lh_fleet_", Fleet { runtime: &runtime });
}

#[test]
fn postgres_a_worker_that_cannot_reach_the_target_leaves_its_work_to_one_that_can() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_postgres(&runtime, "lh_fleet_", Fleet { runtime: &runtime });
}

struct Fleet<'a> {
    runtime: &'a tokio::runtime::Runtime,
}

impl procs::Scenario for Fleet<'_> {
    fn run<L: Ledger>(self, ledger: &L, ledger_url: &str, target_url: &str) {
        let target = Proc::spawn(&["--db", target_url, "target", "--listen", "127.0.0.1:0"]);
        let listening = target
            .1
            .wait_for_line("the target", "listening on http://", Duration::from_secs(30));
        let addr = listening.rsplit("http://").next().unwrap().trim().to_owned();
        let http: Vec<AttemptId> = (0..HTTP_ATTEMPTS)
            .map(|n| self.enqueue(ledger, http_plan(n, &addr)))
            .collect();
        let dry: Vec<AttemptId> = (0..DRY_ATTEMPTS).map(|n| self.enqueue(ledger, dry_plan(n))).collect();
        let worker = |id: &str, allow: Option<&str>| {
            let mut args = vec![
                "--db",
                ledger_url,
                "worker",
                "--id",
                id,
                "--poll-secs",
                "1",
                "--until-idle",
            ];
            args.extend(allow.iter().flat_map(|a| ["--http-allow", *a]));
            Proc::spawn(&args)
        };
        let blind = worker("blind", None);
        // The blind worker delivers what it can run, and polls again past the rest.
        self.wait_until(ledger, &dry, "the dry-run attempts");
        blind
            .1
            .wait_for_line("the blind worker", "claimed attempt", Duration::from_secs(5));
        let status = procs::run_cli(&["--db", ledger_url, "status", http[0].as_str()]);
        assert!(
            status.contains(&format!(
                "waits for       a worker that may reach http://{addr} with http:v1"
            )),
            "{status}"
        );
        let able = worker("able", Some(&addr));
        self.wait_until(ledger, &http, "the http:v1 attempts");
        for id in http.iter().chain(&dry) {
            let r = self.runtime.block_on(ledger.attempt(id)).unwrap();
            assert_eq!(
                r.attempt.status,
                AttemptStatus::Succeeded,
                "{id}: {:?}",
                r.attempt.error
            );
        }
        let blind_lines = blind.1.lines();
        let claimed_http = blind_lines
            .iter()
            .filter(|l| l.contains("claimed attempt") && http.iter().any(|id| l.contains(id.as_str())))
            .count();
        assert_eq!(
            claimed_http, 0,
            "the blind worker claimed http:v1 work: {blind_lines:?}"
        );
        let able_done = able.1.wait_for_line("the able worker", "done: claimed", DEADLINE);
        assert!(able_done.contains(&format!("claimed {HTTP_ATTEMPTS},")), "{able_done}");
        assert!(able_done.contains("failed 0"), "{able_done}");
    }
}

impl Fleet<'_> {
    fn enqueue<L: Ledger>(&self, ledger: &L, spec: PlanSpec) -> AttemptId {
        self.runtime.block_on(async {
            let plan = ledger.register_plan(spec, &["http:v1", "dry-run:v1"]).await.unwrap();
            ledger.enqueue(&plan.id, Action::Execute).await.unwrap().attempt.id
        })
    }

    /// Polls (bounded) until every attempt of `ids` is terminal.
    fn wait_until<L: Ledger>(&self, ledger: &L, ids: &[AttemptId], what: &str) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let open = ids
                .iter()
                .filter(|id| {
                    !self
                        .runtime
                        .block_on(ledger.attempt(id))
                        .unwrap()
                        .attempt
                        .status
                        .is_terminal()
                })
                .count();
            if open == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {open} still open after {DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn http_plan(n: usize, addr: &str) -> PlanSpec {
    serde_json::from_value(json!({
        "name": format!("fleet-http-{n}"),
        "recovery": "resume",
        "steps": [{"code": "post", "executor": "http:v1",
                   "payload": {"url": format!("http://{addr}/orders/{n}"), "body": {"order": n}}}],
    }))
    .expect("a valid plan")
}

fn dry_plan(n: usize) -> PlanSpec {
    serde_json::from_value(json!({
        "name": format!("fleet-dry-{n}"),
        "recovery": "resume",
        "steps": [{"code": "check", "executor": "dry-run:v1", "payload": {"n": n}}],
    }))
    .expect("a valid plan")
}
