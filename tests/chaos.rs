//! Real-process chaos: a `leasehold target` process that fails requests (503) and
//! drops replies after applying them, and three `leasehold worker` processes that
//! are killed (SIGKILL, then replaced) and paused (SIGSTOP past their lease, then
//! SIGCONT) at random, deliver attempts of three-step `http:v1` plans — on SQLite,
//! on MariaDB / MySQL (with `LEASEHOLD_TEST_MYSQL_URL`) and on PostgreSQL (with
//! `LEASEHOLD_TEST_POSTGRES_URL`); a server case without its variable is skipped,
//! saying so.
//!
//! The schedule (which worker, kill or pause, when, for how long) and the target's
//! fault draws come from one seed, printed at the start and in every failure;
//! `LEASEHOLD_CHAOS_SEED=N` replays it (the processes' own timing still varies).
//! Faults are injected for a bounded window, then every paused worker is continued
//! and the run must converge within a deadline; each backend's run stops by itself.
//!
//! What is asserted, from the ledger, from the workers' own logs and from the
//! target's `GET /effects`:
//! - every attempt SUCCEEDED, its command DELIVERED, every receipt SUCCEEDED;
//! - the target applied every key exactly once (`by_key` is 1 for each of the
//!   ledger's keys, and nothing else), and holds no key half-done;
//! - `delivery_count` = 1 + takeovers for every command: the claims the workers
//!   logged have distinct delivery numbers up to `delivery_count`, the last one by
//!   the lease owner on record, which alone logged the delivery (or, killed between
//!   its finish and its log line, logged nothing of it); every earlier claim's
//!   holder was killed or logged that it abandoned the lease or was refused; claims
//!   no log shows (a worker killed between its claim and its log line) are no more
//!   than the kills;
//! - nothing written by a fenced worker: every refusal any worker met is the
//!   stale-token refusal of that attempt's command, and every SUCCEEDED receipt's
//!   target receipt and evidence are what the target stored for its key (asked again
//!   as a sender would, which must replay and apply nothing).
//!
//! The figures (attempts, kills, pauses, dropped replies, takeovers, keys applied
//! once) go to stderr even when the test passes.

use leasehold::engine::{Action, AttemptId, AttemptRecord};
use leasehold::entropy::{Entropy, SeededEntropy};
use leasehold::ledger::Ledger;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::{Duration, Instant};

#[path = "procs/mod.rs"]
mod procs;

use procs::outcome::{self, STEPS};
use procs::{Draws, Killable as Proc};

/// Attempts delivered per backend, and the steps of each.
const ATTEMPTS: usize = 36;
/// Worker processes alive at any time (a killed one is replaced at once).
const WORKERS: usize = 3;
const LEASE_SECS: u64 = 2;
/// Faults are injected for at most this long...
const CHAOS_WINDOW: Duration = Duration::from_secs(30);
/// ...then every attempt must be delivered, and every worker gone, within this.
const LIVENESS_DEADLINE: Duration = Duration::from_secs(60);
/// The target's faults.
const FAIL_RATE: f64 = 0.15;
const DROP_REPLY_RATE: f64 = 0.2;
const DELAY_MS: u64 = 200;

#[test]
fn sqlite_chaos_every_key_is_applied_once_and_nothing_fenced_is_written() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_sqlite(&runtime, Chaos::new("sqlite", &runtime));
}

#[test]
fn mysql_chaos_every_key_is_applied_once_and_nothing_fenced_is_written() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_mysql(&runtime, "lh_chaos_", Chaos::new("mysql", &runtime));
}

#[test]
fn postgres_chaos_every_key_is_applied_once_and_nothing_fenced_is_written() {
    let _alone = procs::alone();
    let runtime = procs::runtime();
    procs::on_postgres(&runtime, "lh_chaos_", Chaos::new("postgres", &runtime));
}

impl procs::Scenario for Chaos<'_> {
    fn run<L: Ledger>(self, ledger: &L, ledger_url: &str, target_url: &str) {
        Chaos::run(&self, ledger, ledger_url, target_url);
    }
}

/// What one worker logged about one attempt, in its order.
#[derive(Debug, Clone, PartialEq)]
enum Logged {
    Claimed(u32),
    Delivered,
    Refused(String),
    Abandoned,
    Failed(String),
}

/// Reads a worker's log: (attempt, event) in the order printed.
fn parse_log(id: &str, lines: &[String]) -> Vec<(AttemptId, Logged)> {
    let prefix = format!("[{id}] ");
    let mut events = Vec::new();
    for line in lines {
        let Some(text) = line.strip_prefix(&prefix) else {
            continue;
        };
        if let Some(rest) = text.strip_prefix("claimed attempt ") {
            let mut words = rest.split_whitespace();
            let attempt = words.next().unwrap_or_default();
            let delivery = rest
                .split_once("(delivery ")
                .and_then(|(_, d)| d.split([',', ')']).next())
                .and_then(|d| d.trim().parse().ok())
                .unwrap_or(0);
            events.push((AttemptId::new(attempt), Logged::Claimed(delivery)));
        } else if let Some(rest) = text.strip_prefix("attempt ") {
            let Some((attempt, what)) = rest.split_once(": ") else {
                continue;
            };
            if attempt.contains(' ') {
                continue; // a step line: "attempt A step 1/3 …"
            }
            let event = if what == "delivered" {
                Logged::Delivered
            } else if let Some(reason) = what.strip_prefix("write refused (") {
                Logged::Refused(reason.trim_end_matches("); stopped work on it").to_owned())
            } else if what.starts_with("abandoned") {
                Logged::Abandoned
            } else if let Some(error) = what.strip_prefix("failed: ") {
                Logged::Failed(error.to_owned())
            } else {
                continue;
            };
            events.push((AttemptId::new(attempt), event));
        }
    }
    events
}

/// One backend's run.
struct Chaos<'a> {
    backend: &'static str,
    seeded: procs::Seeded,
    runtime: &'a tokio::runtime::Runtime,
}

/// The figures a run prints.
#[derive(Debug, Default)]
struct Figures {
    kills: u32,
    pauses: u32,
    workers_started: u32,
    takeovers: u64,
    takeovers_logged: u64,
    claims_unlogged: u64,
    deliveries_unlogged: u64,
    refusals: u64,
    refusals_of_paused_workers: u64,
    abandoned: u64,
}

impl<'a> Chaos<'a> {
    fn new(backend: &'static str, runtime: &'a tokio::runtime::Runtime) -> Self {
        let seeded = procs::Seeded::new(
            "LEASEHOLD_CHAOS_SEED",
            format!("chaos ({backend})"),
            "cargo test -p leasehold --features cli --test chaos",
        );
        Self {
            backend,
            seeded,
            runtime,
        }
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
        let listening = target.wait_for_line("listening on http://", Duration::from_secs(30));
        let addr = listening.rsplit("http://").next().unwrap().trim().to_owned();

        // Plans and attempts, through the ledger.
        let mut attempts = Vec::new();
        for n in 0..ATTEMPTS {
            let record = self.runtime.block_on(async {
                let plan = ledger
                    .register_plan(outcome::plan("chaos", n, &addr), &["http:v1"])
                    .await
                    .unwrap();
                ledger.enqueue(&plan.id, Action::Execute).await.unwrap()
            });
            attempts.push((n, record.attempt.id));
        }

        let mut figures = Figures::default();
        let spawn_worker = |slot: usize, generation: u32| {
            let id = format!("chaos-w{slot}-g{generation}");
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

        // The safety phase: kill and pause at random, for a bounded window.
        let open = || self.runtime.block_on(ledger.open_attempts()).unwrap_or(u64::MAX);
        let chaos_started = Instant::now();
        let mut next_event = chaos_started + draws.ms(300, 1_200);
        // The first two events are a kill and a pause, in the seed's order; then any.
        let mut events = 0u32;
        let first_kill = draws.below(2) == 0;
        while chaos_started.elapsed() < CHAOS_WINDOW && open() > 0 {
            let now = Instant::now();
            for (worker, _) in &mut live {
                if worker.paused_until.is_some_and(|until| until <= now) {
                    worker.signal("CONT");
                    worker.paused_until = None;
                }
            }
            let wake = live
                .iter()
                .filter_map(|(w, _)| w.paused_until)
                .chain([next_event])
                .min()
                .unwrap();
            if wake > now {
                // Paces the schedule; nothing waits on this for a result.
                std::thread::sleep((wake - now).min(Duration::from_millis(200)));
                continue;
            }
            next_event = now + draws.ms(300, 1_200);
            let slot = draws.below(WORKERS as u64) as usize;
            let any_kill = draws.below(2) == 0;
            let pause_for = draws.ms(LEASE_SECS * 1_000 + 500, LEASE_SECS * 1_000 + 2_000);
            let kill = match events {
                0 => first_kill,
                1 => !first_kill,
                _ => any_kill,
            };
            let (worker, generation) = &mut live[slot];
            if worker.paused_until.is_some() || !worker.running() {
                continue;
            }
            if !worker.try_signal(if kill { "KILL" } else { "STOP" }) {
                continue; // it exited on its own since it was looked at
            }
            events += 1;
            if kill {
                let _ = worker.child.wait();
                worker.killed = true;
                figures.kills += 1;
                *generation += 1;
                let replacement = spawn_worker(slot, *generation);
                figures.workers_started += 1;
                gone.push(std::mem::replace(worker, replacement));
            } else {
                worker.pauses += 1;
                worker.paused_until = Some(Instant::now() + pause_for);
                figures.pauses += 1;
            }
        }
        let chaos_elapsed = chaos_started.elapsed();

        // The liveness phase: no more faults but the target's; everything converges.
        for (worker, _) in &mut live {
            if worker.paused_until.take().is_some() {
                worker.signal("CONT");
            }
        }
        let deadline = Instant::now() + LIVENESS_DEADLINE;
        while open() > 0 {
            self.seeded.check(Instant::now() < deadline, || {
                format!(
                    "{} attempts still open {LIVENESS_DEADLINE:?} after the faults stopped",
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
                format!("worker {} exited {status}: {}", worker.id, worker.out.stderr())
            });
        }
        let mut workers = gone;
        workers.extend(live.into_iter().map(|(w, _)| w));

        let effects = procs::effects(self.runtime, &addr);
        let _ = writeln!(
            std::io::stderr(),
            "chaos ({}) seed {}: injected {} kills and {} pauses into {} worker processes over {:.1} s; \
             the target dropped {} replies and failed {} requests",
            self.backend,
            self.seeded.seed,
            figures.kills,
            figures.pauses,
            figures.workers_started,
            chaos_elapsed.as_secs_f64(),
            effects.faults.dropped_replies,
            effects.faults.failed,
        );
        let records: Vec<(usize, AttemptRecord)> = attempts
            .iter()
            .map(|(n, id)| (*n, self.runtime.block_on(ledger.attempt(id)).unwrap()))
            .collect();
        self.seeded.check_all(outcome::ledger_problems(&records));
        self.seeded
            .check_all(outcome::effect_problems(records.iter().map(|(_, r)| r), &effects));
        self.check_takeovers(&records, &workers, &mut figures);
        self.seeded
            .check_all(outcome::receipt_problems(self.runtime, &records, &addr, &effects));

        let keys = records.iter().map(|(_, r)| r.receipts.len()).sum::<usize>();
        let once = effects.by_key.values().filter(|n| **n == 1).count();
        let _ = writeln!(
            std::io::stderr(),
            "chaos ({}) seed {}: {ATTEMPTS} attempts of {STEPS} http:v1 steps SUCCEEDED; \
             {} worker processes ({} kills, {} pauses past the {LEASE_SECS} s lease); \
             target: {} dropped replies, {} injected 503s, {} replays, {} 409s; \
             {} takeovers ({} logged, {} claims and {} deliveries lost with a killed worker's log), \
             {} stale-token refusals ({} after a pause), {} abandoned leases; \
             keys applied once: {once}/{keys}; faults for {:.1} s, total {:.1} s",
            self.backend,
            self.seeded.seed,
            figures.workers_started,
            figures.kills,
            figures.pauses,
            effects.faults.dropped_replies,
            effects.faults.failed,
            effects.replays,
            effects.conflicts,
            figures.takeovers,
            figures.takeovers_logged,
            figures.claims_unlogged,
            figures.deliveries_unlogged,
            figures.refusals,
            figures.refusals_of_paused_workers,
            figures.abandoned,
            chaos_elapsed.as_secs_f64(),
            started.elapsed().as_secs_f64(),
        );
        self.seeded.check(figures.kills >= 1 && figures.pauses >= 1, || {
            format!("the schedule injected too little to prove anything: {figures:?}")
        });
        self.seeded.check(effects.faults.dropped_replies >= 1, || {
            format!("the target dropped no reply: {effects:?}")
        });
        target.signal("TERM");
    }

    fn check_takeovers(&self, records: &[(usize, AttemptRecord)], workers: &[Proc], figures: &mut Figures) {
        // Per attempt: (worker index, event) in each worker's order.
        let mut logged: BTreeMap<AttemptId, Vec<(usize, Logged)>> = BTreeMap::new();
        for (w, worker) in workers.iter().enumerate() {
            for (attempt, event) in parse_log(&worker.id, &worker.lines()) {
                logged.entry(attempt).or_default().push((w, event));
            }
        }
        let mut problems = Vec::new();
        for (_, r) in records {
            let attempt = &r.attempt.id;
            let count = r.command.delivery_count;
            let events = logged.get(attempt).cloned().unwrap_or_default();
            figures.takeovers += u64::from(count.saturating_sub(1));
            let claims: Vec<(usize, u32)> = events
                .iter()
                .filter_map(|(w, e)| match e {
                    Logged::Claimed(d) => Some((*w, *d)),
                    _ => None,
                })
                .collect();
            let deliveries: BTreeSet<u32> = claims.iter().map(|(_, d)| *d).collect();
            if deliveries.len() != claims.len() || deliveries.iter().any(|d| *d == 0 || *d > count) {
                problems.push(format!(
                    "attempt {attempt}: claims {claims:?} do not fit delivery_count {count}"
                ));
            }
            figures.takeovers_logged += claims.iter().filter(|(_, d)| *d >= 2).count() as u64;
            figures.claims_unlogged += u64::from(count) - deliveries.len() as u64;
            let owner = r.command.lease_owner.as_deref().unwrap_or_default();
            let last = claims.iter().find(|(_, d)| *d == count);
            if last.map(|(w, _)| workers[*w].id.as_str()) != Some(owner) {
                problems.push(format!(
                    "attempt {attempt}: delivery {count} (the last) was not logged by its lease owner {owner}: {claims:?}"
                ));
            }
            let deliverers: Vec<&str> = events
                .iter()
                .filter(|(_, e)| *e == Logged::Delivered)
                .map(|(w, _)| workers[*w].id.as_str())
                .collect();
            let owner_killed = last.is_some_and(|(w, _)| workers[*w].killed);
            if deliverers.is_empty() && owner_killed {
                // Killed between committing the finish and printing its line.
                figures.deliveries_unlogged += 1;
            } else if deliverers != [owner] {
                problems.push(format!(
                    "attempt {attempt}: logged as delivered by {deliverers:?}, lease owner {owner}"
                ));
            }
            for (w, delivery) in claims.iter().filter(|(_, d)| *d < count) {
                // This holder's lease was lost: it was killed, or it said it let go.
                let worker = &workers[*w];
                let let_go = events
                    .iter()
                    .any(|(x, e)| x == w && matches!(e, Logged::Abandoned | Logged::Refused(_)));
                if !worker.killed && !let_go {
                    problems.push(format!(
                        "attempt {attempt}: delivery {delivery} by {} was taken over, yet that worker was \
                         neither killed nor logged losing its lease",
                        worker.id
                    ));
                }
            }
            let stale = format!("command {} is not held by this lease", r.command.id);
            for (w, event) in &events {
                match event {
                    Logged::Refused(reason) => {
                        figures.refusals += 1;
                        if workers[*w].pauses > 0 {
                            figures.refusals_of_paused_workers += 1;
                        }
                        if *reason != stale {
                            problems.push(format!(
                                "attempt {attempt}: {} was refused with {reason:?}, not the stale-token refusal",
                                workers[*w].id
                            ));
                        }
                    }
                    Logged::Abandoned => figures.abandoned += 1,
                    Logged::Failed(error) => problems.push(format!(
                        "attempt {attempt}: {} logged a failure: {error}",
                        workers[*w].id
                    )),
                    Logged::Claimed(_) | Logged::Delivered => {}
                }
            }
        }
        if figures.claims_unlogged > u64::from(figures.kills) {
            problems.push(format!(
                "{} claims appear in no log, more than the {} kills could explain",
                figures.claims_unlogged, figures.kills
            ));
        }
        if figures.deliveries_unlogged > u64::from(figures.kills) {
            problems.push(format!(
                "{} deliveries appear in no log, more than the {} kills could explain",
                figures.deliveries_unlogged, figures.kills
            ));
        }
        if !problems.is_empty() {
            self.seeded.fail(&problems);
        }
    }
}
