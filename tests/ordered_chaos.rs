//! Real-process chaos for ordered keys: a template plan's attempts that share an
//! order key are delivered one at a time, in enqueue order, while `leasehold worker`
//! processes are killed (SIGKILL, then replaced) at random and a `leasehold target`
//! process fails requests (503) and drops replies after applying them — on SQLite,
//! on MariaDB / MySQL (with `LEASEHOLD_TEST_MYSQL_URL`) and on PostgreSQL (with
//! `LEASEHOLD_TEST_POSTGRES_URL`); a server case without its variable is skipped,
//! saying so.
//!
//! The plan is one template: `[input]` with `user` and `change` (both required
//! strings) and one `http:v1` step posting `{"user", "change"}` from the input to
//! the target. A step's `url` must be a string when the plan is registered (the
//! step's target, its scheme, host and port, is derived from it then), and a
//! `$input` reference replaces a whole JSON value, never part of a string; so one
//! template cannot post each user's changes to a path of its own. Every change goes
//! to the one path [`PATH`] instead, and the target's `order_by_path` for it is the
//! order in which every key was first applied, across all users. Each key maps back
//! to its attempt through the ledger's receipts (and so to its user and change,
//! which the receipt's frozen payload and a replay at the target confirm), so the
//! order of one user's keys in that one list is the order the target first applied
//! that user's changes. That order is sound to compare: the target gives a key's
//! effect its row id when it applies it, and the attempt behind it is released
//! only after the one ahead has ended, i.e. after its effect was committed.
//!
//! For each of [`USERS`] users, [`CHANGES`] are enqueued with the user as order
//! key: the first two through the ledger before any worker runs (the second must
//! wait: its command is WAITING), the last through `leasehold enqueue --input …
//! --order-key …` while the workers run (it waits or not, depending on how far the
//! user's earlier changes got).
//!
//! The kill schedule (which worker, when: most kills aim at a worker holding a
//! lease, so that heads of order keys are taken over), the moments of the
//! enqueues made while the workers run and the target's fault draws come from one
//! seed, printed at the start and in every failure; `LEASEHOLD_CHAOS_SEED=N`
//! replays it (the processes' own timing still varies). Workers are killed for a
//! bounded window; then the run must converge within a deadline, and each
//! backend's run stops by itself.
//!
//! What is asserted, from the ledger and from the target's `GET /effects`:
//! - every attempt SUCCEEDED, its command DELIVERED, its receipt SUCCEEDED, and
//!   the receipt's frozen payload carries the attempt's own user and change;
//! - the target applied every key exactly once (`by_key` is 1 for each of the
//!   ledger's keys, and nothing else), holds no key half-done, and applied the
//!   body the ledger holds for the key (asked again with it, it replays);
//! - for each user, `order_by_path` lists the keys of the user's changes in
//!   enqueue order, and the ledger shows each change first claimed no earlier than
//!   the one ahead of it finished.
//!
//! The figures (attempts, waits, kills, takeovers, dropped replies) go to stderr
//! even when the test passes.

use leasehold::engine::canonical::canonical_json;
use leasehold::engine::{
    Action, AttemptId, AttemptRecord, AttemptStatus, CommandStatus, PlanId, PlanSpec, ReceiptStatus,
};
use leasehold::entropy::{Entropy, SeededEntropy};
use leasehold::ledger::{EnqueueRequest, Ledger};
use leasehold::receiver::Effects;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "procs/mod.rs"]
mod procs;

use procs::outcome;
use procs::{Draws, Killable as Proc};

/// Users, each one order key.
const USERS: usize = 8;
/// Each user's changes, in enqueue order.
const CHANGES: [&str; 3] = ["grant", "promote", "revoke"];
/// The template's name.
const PLAN: &str = "access-changes";
/// The one path every change is posted to.
const PATH: &str = "/access/changes";
/// Worker processes alive at any time (a killed one is replaced at once).
const WORKERS: usize = 3;
const LEASE_SECS: u64 = 2;
/// Workers are killed for at most this long...
const CHAOS_WINDOW: Duration = Duration::from_secs(20);
/// ...then every attempt must be delivered, and every worker gone, within this.
const LIVENESS_DEADLINE: Duration = Duration::from_secs(45);
/// The target's faults.
const FAIL_RATE: f64 = 0.1;
const DROP_REPLY_RATE: f64 = 0.15;
const DELAY_MS: u64 = 150;
/// Each user's last change is enqueued at a seeded moment this soon after the workers
/// start.
const ENQUEUE_SPREAD_MS: u64 = 4_000;

#[test]
fn sqlite_ordered_chaos_each_users_changes_apply_once_in_enqueue_order() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_sqlite(&runtime, Ordered::new("sqlite", &runtime));
}

#[test]
fn mysql_ordered_chaos_each_users_changes_apply_once_in_enqueue_order() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_mysql(&runtime, "lh_ordered_chaos_", Ordered::new("mysql", &runtime));
}

#[test]
fn postgres_ordered_chaos_each_users_changes_apply_once_in_enqueue_order() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_postgres(&runtime, "lh_ordered_chaos_", Ordered::new("postgres", &runtime));
}

impl procs::Scenario for Ordered<'_> {
    fn run<L: Ledger>(self, ledger: &L, ledger_url: &str, target_url: &str) {
        Ordered::run(&self, ledger, ledger_url, target_url);
    }
}

/// One change of one user: its attempt, and whether its enqueue left it WAITING.
#[derive(Debug, Clone)]
struct Change {
    user: String,
    change: &'static str,
    attempt: AttemptId,
    waited: bool,
}

/// The figures a run prints.
#[derive(Debug, Default)]
struct Figures {
    kills: u32,
    kills_of_holders: u32,
    workers_started: u32,
    idle_exits: u32,
    waited: u32,
    enqueued_while_running: u32,
    takeovers: u64,
}

/// One backend's run.
struct Ordered<'a> {
    backend: &'static str,
    seeded: procs::Seeded,
    runtime: &'a tokio::runtime::Runtime,
}

impl<'a> Ordered<'a> {
    fn new(backend: &'static str, runtime: &'a tokio::runtime::Runtime) -> Self {
        let seeded = procs::Seeded::new(
            "LEASEHOLD_CHAOS_SEED",
            format!("ordered chaos ({backend})"),
            "cargo test -p leasehold --features cli --test ordered_chaos",
        );
        Self {
            backend,
            seeded,
            runtime,
        }
    }

    /// The template: one http:v1 step posting the input's user and change.
    fn plan(target: &str) -> PlanSpec {
        serde_json::from_value(json!({
            "name": PLAN,
            "recovery": "resume",
            "on_failure": "block",
            "input": {
                "user": {"type": "string", "required": true},
                "change": {"type": "string", "required": true},
            },
            "steps": [{
                "code": "apply",
                "executor": "http:v1",
                "payload": {
                    "url": format!("http://{target}{PATH}"),
                    "body": {"user": {"$input": "/user"}, "change": {"$input": "/change"}},
                    "evidence": ["/id"],
                    "timeout_ms": 2_000,
                    "budget_ms": 5_000,
                },
            }],
        }))
        .expect("a valid template")
    }

    fn input(user: &str, change: &str) -> Value {
        json!({"user": user, "change": change})
    }

    /// Enqueues `change` for `user` through the ledger.
    fn enqueue<L: Ledger>(&self, ledger: &L, plan: &PlanId, user: &str, change: &'static str) -> Change {
        let request = EnqueueRequest::new(Action::Execute)
            .with_input(Some(Self::input(user, change)))
            .ordered(Some(user.to_owned()));
        let enqueued = self
            .runtime
            .block_on(ledger.enqueue_with(plan, request))
            .unwrap_or_else(|e| self.seeded.fail(&[format!("enqueue {change} for {user}: {e}")]));
        self.seeded.check(enqueued.created, || {
            format!("enqueue {change} for {user} created nothing")
        });
        Change {
            user: user.to_owned(),
            change,
            attempt: enqueued.record.attempt.id.clone(),
            waited: enqueued.record.command.status == CommandStatus::Waiting,
        }
    }

    /// Enqueues `change` for `user` through `leasehold enqueue`.
    fn enqueue_cli(&self, ledger_url: &str, user: &str, change: &'static str) -> Change {
        let input = Self::input(user, change).to_string();
        let out = Command::new(procs::BIN)
            .args(["--db", ledger_url, "enqueue", PLAN, "--input", &input])
            .args(["--order-key", user, "--json"])
            .env_remove("LEASEHOLD_DB")
            .output()
            .expect("run leasehold enqueue");
        let stderr = String::from_utf8_lossy(&out.stderr);
        self.seeded.check(out.status.success(), || {
            format!("leasehold enqueue {change} for {user} exited {}: {stderr}", out.status)
        });
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            self.seeded
                .fail(&[format!("enqueue --json printed no JSON ({e}): {stderr}")])
        });
        let waited = answer["command"]["status"] == "WAITING";
        self.seeded.check(
            answer["created"] == true && answer["attempt"]["order_key"] == user,
            || format!("enqueue {change} for {user} answered {answer}"),
        );
        // The CLI says so when the attempt waits, and only then.
        self.seeded
            .check(waited == stderr.contains("waits for the attempts ahead of it"), || {
                format!(
                    "enqueue {change} for {user}: command {} but stderr {stderr:?}",
                    answer["command"]["status"]
                )
            });
        Change {
            user: user.to_owned(),
            change,
            attempt: AttemptId::new(answer["attempt_id"].as_str().unwrap_or_default()),
            waited,
        }
    }

    /// The slots whose worker holds the lease of a PROCESSING command of `changes`.
    fn lease_holders<L: Ledger>(&self, ledger: &L, changes: &[Change], live: &[(Proc, u32)]) -> Vec<usize> {
        let owners: BTreeSet<String> = changes
            .iter()
            .filter_map(|c| self.runtime.block_on(ledger.attempt(&c.attempt)).ok())
            .filter(|r| r.command.status == CommandStatus::Processing)
            .filter_map(|r| r.command.lease_owner)
            .collect();
        (0..live.len())
            .filter(|slot| owners.contains(&live[*slot].0.id))
            .collect()
    }

    fn run<L: Ledger>(&self, ledger: &L, ledger_url: &str, target_url: &str) {
        let started = Instant::now();
        let draws = Draws(SeededEntropy::new(self.seeded.seed));
        let target_seed = draws.0.next_u64().to_string();
        let (fail, drop_reply, delay) = (FAIL_RATE.to_string(), DROP_REPLY_RATE.to_string(), DELAY_MS.to_string());
        let target = Proc::spawn(
            "target",
            &[
                "--db",
                target_url,
                "target",
                "--listen",
                "127.0.0.1:0",
                "--fail-rate",
                &fail,
                "--drop-reply-rate",
                &drop_reply,
                "--delay-ms",
                &delay,
                "--seed",
                &target_seed,
            ],
        );
        let listening = target
            .out
            .wait_for_line(&target.id, "listening on http://", Duration::from_secs(30));
        let addr = listening.rsplit("http://").next().unwrap().trim().to_owned();

        // The template, and every change but the last of each user, before any worker.
        let plan = self
            .runtime
            .block_on(ledger.register_plan(Self::plan(&addr), &["http:v1"]))
            .unwrap_or_else(|e| self.seeded.fail(&[format!("register the template: {e}")]));
        let users: Vec<String> = (0..USERS).map(|u| format!("user-{u:02}")).collect();
        let (last, earlier) = CHANGES.split_last().unwrap();
        let mut changes: Vec<Change> = Vec::new();
        for user in &users {
            for (i, change) in earlier.iter().enumerate() {
                let enqueued = self.enqueue(ledger, &plan.id, user, change);
                // Nothing runs yet: the first waits for nothing, the others for it.
                self.seeded.check(enqueued.waited == (i > 0), || {
                    format!("{change} for {user} enqueued WAITING = {}", enqueued.waited)
                });
                changes.push(enqueued);
            }
        }

        let mut figures = Figures::default();
        let spawn_worker = |slot: usize, generation: u32| {
            let id = format!("ordered-w{slot}-g{generation}");
            Proc::spawn(
                &id,
                &[
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
                    "1",
                    "--step-timeout-secs",
                    "8",
                    "--until-idle",
                    "--http-allow",
                    &addr,
                ],
            )
        };
        let mut live: Vec<(Proc, u32)> = (0..WORKERS).map(|slot| (spawn_worker(slot, 0), 0)).collect();
        figures.workers_started = WORKERS as u32;
        let mut gone: Vec<Proc> = Vec::new();

        // The safety phase: the last change of each user is enqueued while the workers
        // run, at a seeded moment (before or after the user's earlier changes end), and
        // workers are killed at random, for a bounded window. A kill aims, most of the
        // time, at a worker holding a lease.
        let open = || self.runtime.block_on(ledger.open_attempts()).unwrap_or(u64::MAX);
        let chaos_started = Instant::now();
        let mut to_enqueue: Vec<(Instant, &String)> = users
            .iter()
            .map(|user| (chaos_started + draws.ms(0, ENQUEUE_SPREAD_MS), user))
            .collect();
        to_enqueue.sort();
        let mut to_enqueue: VecDeque<(Instant, &String)> = to_enqueue.into();
        let mut next_event = chaos_started + draws.ms(300, 1_200);
        while chaos_started.elapsed() < CHAOS_WINDOW && (!to_enqueue.is_empty() || open() > 0) {
            while to_enqueue.front().is_some_and(|(at, _)| *at <= Instant::now()) {
                let (_, user) = to_enqueue.pop_front().unwrap();
                changes.push(self.enqueue_cli(ledger_url, user, last));
                figures.enqueued_while_running += 1;
            }
            // A worker finds nothing open (every change enqueued so far delivered) and
            // exits before the rest are enqueued: it must have exited cleanly; another
            // takes its slot.
            for (slot, (worker, generation)) in live.iter_mut().enumerate() {
                if worker.running() {
                    continue;
                }
                let status = worker.child.wait().unwrap();
                self.seeded.check(status.success(), || {
                    format!("worker {} exited {status}: {}", worker.id, worker.out.text())
                });
                figures.idle_exits += 1;
                *generation += 1;
                figures.workers_started += 1;
                gone.push(std::mem::replace(worker, spawn_worker(slot, *generation)));
            }
            let now = Instant::now();
            let wake = to_enqueue.front().map_or(next_event, |(at, _)| next_event.min(*at));
            if wake > now {
                // Paces the schedule; nothing waits on this for a result.
                std::thread::sleep((wake - now).min(Duration::from_millis(100)));
                continue;
            }
            if next_event > now {
                continue;
            }
            next_event = now + draws.ms(300, 1_200);
            let (aim, pick) = (draws.below(4), draws.0.next_u64());
            let holders = self.lease_holders(ledger, &changes, &live);
            let slot = match holders.len() {
                0 => pick as usize % WORKERS,
                _ if aim == 0 => pick as usize % WORKERS,
                n => holders[pick as usize % n],
            };
            let (worker, generation) = &mut live[slot];
            if !worker.running() || !worker.try_signal("KILL") {
                continue; // it exited on its own since it was looked at
            }
            let _ = worker.child.wait();
            worker.killed = true;
            figures.kills += 1;
            if holders.contains(&slot) {
                figures.kills_of_holders += 1;
            }
            *generation += 1;
            figures.workers_started += 1;
            gone.push(std::mem::replace(worker, spawn_worker(slot, *generation)));
        }
        let chaos_elapsed = chaos_started.elapsed();
        self.seeded.check(to_enqueue.is_empty(), || {
            format!(
                "{} changes were never enqueued within {CHAOS_WINDOW:?}",
                to_enqueue.len()
            )
        });

        // The liveness phase: no more kills; everything converges.
        let deadline = Instant::now() + LIVENESS_DEADLINE;
        while open() > 0 {
            self.seeded.check(Instant::now() < deadline, || {
                format!(
                    "{} attempts still open {LIVENESS_DEADLINE:?} after the kills stopped",
                    open()
                )
            });
            std::thread::sleep(Duration::from_millis(100));
        }
        for (worker, _) in &mut live {
            while worker.running() {
                self.seeded.check(Instant::now() < deadline, || {
                    format!("worker {} did not exit once idle", worker.id)
                });
                std::thread::sleep(Duration::from_millis(50));
            }
            let status = worker.child.wait().unwrap();
            self.seeded.check(status.success(), || {
                format!("worker {} exited {status}: {}", worker.id, worker.out.text())
            });
        }
        let killed = gone.iter().filter(|w| w.killed).count();
        self.seeded.check(killed == figures.kills as usize, || {
            format!("{killed} workers killed, {} kills counted", figures.kills)
        });

        let effects = procs::effects(self.runtime, &addr);
        let records: Vec<(Change, AttemptRecord)> = changes
            .iter()
            .map(|c| {
                let record = self
                    .runtime
                    .block_on(ledger.attempt(&c.attempt))
                    .unwrap_or_else(|e| self.seeded.fail(&[format!("read attempt {}: {e}", c.attempt)]));
                (c.clone(), record)
            })
            .collect();
        figures.waited = changes.iter().filter(|c| c.waited).count() as u32;
        figures.takeovers = records
            .iter()
            .map(|(_, r)| u64::from(r.command.delivery_count.saturating_sub(1)))
            .sum();
        let _ = writeln!(
            std::io::stderr(),
            "ordered chaos ({}) seed {}: {} attempts ({USERS} users x {} changes, {} enqueued WAITING, \
             {} enqueued while the workers ran); {} worker processes ({} kills, {} of them of a \
             lease holder, {} idle exits replaced), {} takeovers; target: {} dropped replies, \
             {} injected 503s, {} replays, {} 409s, {} keys applied; kills for {:.1} s, total {:.1} s",
            self.backend,
            self.seeded.seed,
            records.len(),
            CHANGES.len(),
            figures.waited,
            figures.enqueued_while_running,
            figures.workers_started,
            figures.kills,
            figures.kills_of_holders,
            figures.idle_exits,
            figures.takeovers,
            effects.faults.dropped_replies,
            effects.faults.failed,
            effects.replays,
            effects.conflicts,
            effects.by_key.len(),
            chaos_elapsed.as_secs_f64(),
            started.elapsed().as_secs_f64(),
        );
        self.check_ledger(&records);
        let problems = outcome::effect_problems(records.iter().map(|(_, r)| r), &effects);
        if !problems.is_empty() {
            self.seeded.fail(&problems);
        }
        self.check_order(&records, &effects);
        self.check_bodies(&records, &addr, &effects);

        self.seeded.check(figures.kills >= 1, || {
            format!("the schedule killed no worker, which proves too little: {figures:?}")
        });
        let _ = target.try_signal("TERM");
    }

    /// Every attempt SUCCEEDED, its command DELIVERED, its one receipt SUCCEEDED with
    /// the attempt's own user and change frozen in its payload.
    fn check_ledger(&self, records: &[(Change, AttemptRecord)]) {
        let mut problems = Vec::new();
        for (c, r) in records {
            let id = &r.attempt.id;
            if r.attempt.status != AttemptStatus::Succeeded || r.command.status != CommandStatus::Delivered {
                problems.push(format!(
                    "attempt {id} ({} for {}) is {} (command {}): {:?} / {:?}",
                    c.change, c.user, r.attempt.status, r.command.status, r.attempt.error, r.command.last_error
                ));
            }
            if r.attempt.order_key.as_deref() != Some(c.user.as_str()) {
                problems.push(format!(
                    "attempt {id}: order key {:?}, not {}",
                    r.attempt.order_key, c.user
                ));
            }
            if r.receipts.len() != 1 {
                problems.push(format!("attempt {id} has {} receipts, not 1", r.receipts.len()));
                continue;
            }
            let receipt = &r.receipts[0];
            if receipt.status != ReceiptStatus::Succeeded {
                problems.push(format!("attempt {id} is {}: {:?}", receipt.status, receipt.error));
            }
            let body = Self::body_of(r);
            if body != Some(Self::input(&c.user, c.change)) {
                problems.push(format!(
                    "attempt {id} ({} for {}): its receipt's payload is {:?}",
                    c.change, c.user, receipt.payload
                ));
            }
        }
        if !problems.is_empty() {
            self.seeded.fail(&problems);
        }
    }

    /// The body the attempt's receipt holds, resolved from its input at enqueue.
    fn body_of(r: &AttemptRecord) -> Option<Value> {
        let payload: Value = serde_json::from_str(r.receipts.first()?.payload.as_deref()?).ok()?;
        payload.get("body").cloned()
    }

    /// Each user's changes were first applied in enqueue order (their keys' places
    /// in `order_by_path`), and each was first claimed no earlier than the one ahead
    /// of it finished.
    fn check_order(&self, records: &[(Change, AttemptRecord)], effects: &Effects) {
        let mut problems = Vec::new();
        let paths: Vec<&str> = effects.order_by_path.keys().map(String::as_str).collect();
        if paths != [PATH] {
            problems.push(format!("the target applied keys at {paths:?}, not only at {PATH}"));
        }
        let listed: &[String] = effects.order_by_path.get(PATH).map(Vec::as_slice).unwrap_or_default();
        let place: BTreeMap<&str, usize> = listed.iter().enumerate().map(|(i, k)| (k.as_str(), i)).collect();
        if place.len() != listed.len() || listed.len() != records.len() {
            problems.push(format!(
                "order_by_path lists {} keys ({} distinct) for {} attempts",
                listed.len(),
                place.len(),
                records.len()
            ));
        }
        let mut by_user: BTreeMap<&str, Vec<&(Change, AttemptRecord)>> = BTreeMap::new();
        for entry in records {
            by_user.entry(entry.0.user.as_str()).or_default().push(entry);
        }
        for (user, mut entries) in by_user {
            entries.sort_by_key(|(_, r)| r.attempt.number);
            let order: Vec<&str> = entries.iter().map(|(c, _)| c.change).collect();
            if order != CHANGES {
                problems.push(format!(
                    "{user}: the ledger numbers its changes {order:?}, not {CHANGES:?}"
                ));
                continue;
            }
            for pair in entries.windows(2) {
                let ((ahead, a), (behind, b)) = (pair[0], pair[1]);
                let key = |r: &AttemptRecord| {
                    r.receipts
                        .first()
                        .map(|x| x.idempotency_key.clone())
                        .unwrap_or_default()
                };
                let (ka, kb) = (key(a), key(b));
                match (place.get(ka.as_str()), place.get(kb.as_str())) {
                    (Some(pa), Some(pb)) if pa < pb => {}
                    (pa, pb) => problems.push(format!(
                        "{user}: {} (key {ka}, place {pa:?}) was not first applied before {} (key {kb}, place {pb:?})",
                        ahead.change, behind.change
                    )),
                }
                match (a.attempt.finished_at, b.attempt.started_at) {
                    (Some(finished), Some(started)) if started >= finished => {}
                    (finished, started) => problems.push(format!(
                        "{user}: {} (attempt {}) started at {started:?}, before {} (attempt {}) finished at {finished:?}",
                        behind.change, b.attempt.id, ahead.change, a.attempt.id
                    )),
                }
            }
        }
        if !problems.is_empty() {
            self.seeded.fail(&problems);
        }
    }

    /// The target applied, under each key, the body the ledger holds for it: asked
    /// again as a sender would (same key, same body), it replays and applies nothing.
    fn check_bodies(&self, records: &[(Change, AttemptRecord)], addr: &str, before: &Effects) {
        let asks: Vec<(String, String)> = records
            .iter()
            .filter_map(|(_, r)| {
                let key = r.receipts.first()?.idempotency_key.clone();
                Some((key, canonical_json(&Self::body_of(r)?)))
            })
            .collect();
        let url = format!("http://{addr}{PATH}");
        let answers: Vec<(String, Result<(), String>)> = self.runtime.block_on(async {
            let client = reqwest::Client::new();
            let mut answers = Vec::new();
            for (key, body) in asks {
                let mut answer = Err("no answer but 503 in 50 tries".to_owned());
                // The target still fails some requests (503): ask again.
                for _ in 0..50 {
                    let Ok(response) = client
                        .post(&url)
                        .header("idempotency-key", &key)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await
                    else {
                        continue;
                    };
                    let status = response.status();
                    if status == 503 {
                        continue;
                    }
                    let replayed = response
                        .headers()
                        .get("idempotent-replayed")
                        .is_some_and(|v| v == "true");
                    let text = response.text().await.unwrap_or_default();
                    answer = if status == 201 && replayed {
                        Ok(())
                    } else {
                        Err(format!("answered {status} (replayed: {replayed}): {text}"))
                    };
                    break;
                }
                answers.push((key, answer));
            }
            answers
        });
        let mut problems: Vec<String> = answers
            .into_iter()
            .filter_map(|(key, answer)| {
                answer
                    .err()
                    .map(|e| format!("key {key}: the target did not replay it: {e}"))
            })
            .collect();
        let after = procs::effects(self.runtime, addr);
        if after.by_key != before.by_key || after.effects != before.effects {
            problems.push("asking again applied something".to_owned());
        }
        if !problems.is_empty() {
            self.seeded.fail(&problems);
        }
    }
}
