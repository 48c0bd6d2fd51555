//! Claims per second on MySQL / MariaDB with 1, 2, 4 and 8 concurrent workers at
//! claim batches 1, 5 and 32, and how many claim races were lost (and refused).
//!
//! `LEASEHOLD_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test cargo bench --features
//! mysql --bench mysql_claims -- [JOBS]` — each run gets a scratch database with JOBS
//! claimable one-step commands (default 200 per command of a batch, at least 2,000:
//! 2,000 at batch 1 and 5, 6,400 at batch 32), then N workers, each with its own
//! ledger (its own connection pool, as separate machines would have), call
//! `Ledger::claim` until nothing is left. The database's clock decides; the run is
//! timed from the first claim to the empty queue, and checks that every command was
//! claimed exactly once.
//!
//! Environment (each a comma-separated list; every combination runs):
//! `BATCHES` (default `1,5,32`), `WORKERS` (default `1,2,4,8`), `SPREADS` (the
//! `claim_spread` URL option, default `16`), `SKIP_LOCKED` (the `skip_locked` URL
//! option: `1` uses `SKIP LOCKED` where the server has it, `0` forces the MySQL 5.7
//! path; default `1`), and `REPEAT` (runs of each combination, default 1).

mod support;

use leasehold::entropy::OsEntropy;
use leasehold::ledger::mysql::scratch::ScratchDatabase;
use leasehold::ledger::mysql::{MysqlLedger, MysqlStats, MysqlUrl};
use leasehold::ledger::Ledger;
use leasehold_engine::{Action, PlanSpec};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LEASE_MS: u64 = 60_000;

fn spec(n: u64) -> PlanSpec {
    serde_json::from_value(json!({
        "name": format!("bench-{n}"),
        "recovery": "resume",
        "steps": [{"code": "notify", "executor": "dry-run:v1", "payload": {"n": n}}],
    }))
    .expect("a valid plan")
}

/// One configuration of a run.
#[derive(Debug, Clone, Copy)]
struct Config {
    jobs: u64,
    batch: u32,
    workers: u32,
    spread: u32,
    skip_locked: bool,
}

/// What one run measured.
struct Measured {
    elapsed: Duration,
    claims: u64,
    stats: MysqlStats,
    /// The claim path the workers took: `SKIP LOCKED` or the portable one.
    skip_locked: bool,
}

/// One timed run in a fresh scratch database.
async fn run(admin: &MysqlUrl, config: Config) -> Measured {
    let scratch = ScratchDatabase::create(admin, "lh_bench_")
        .await
        .expect("scratch database");
    let mut url = scratch.url().clone();
    url.options.claim_spread = config.spread;
    url.options.skip_locked = config.skip_locked;
    let setup = MysqlLedger::open(&url, Arc::new(OsEntropy));
    setup.migrate().await.expect("migrate");
    let mut lanes = Vec::new();
    for lane in 0..8 {
        let setup = setup.clone();
        let jobs = config.jobs;
        lanes.push(tokio::spawn(async move {
            for n in (lane..jobs).step_by(8) {
                let plan = setup.register_plan(spec(n), &["dry-run:v1"]).await.expect("register");
                setup.enqueue(&plan.id, Action::Execute).await.expect("enqueue");
            }
        }));
    }
    for lane in lanes {
        lane.await.expect("setup lane");
    }
    let ledgers: Vec<MysqlLedger> = (0..config.workers)
        .map(|_| MysqlLedger::open(&url, Arc::new(OsEntropy)))
        .collect();
    // Warm every pool with one connection, untimed.
    for l in &ledgers {
        l.open_attempts().await.expect("warm up");
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(config.workers as usize + 1));
    let mut tasks = Vec::new();
    for (w, ledger) in ledgers.iter().enumerate() {
        let (ledger, barrier) = (ledger.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let owner = format!("bench-{w}");
            let mut mine = Vec::new();
            barrier.wait().await;
            loop {
                let claimed = ledger.claim(&owner, config.batch, LEASE_MS).await.expect("claim");
                if claimed.is_empty() {
                    break;
                }
                assert!(claimed.len() <= config.batch as usize, "more than a batch");
                mine.extend(claimed.into_iter().map(|c| c.lease.command_id));
            }
            mine
        }));
    }
    barrier.wait().await;
    let started = Instant::now();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("claimer"));
    }
    let elapsed = started.elapsed();
    let distinct: BTreeSet<_> = all.iter().collect();
    assert_eq!(distinct.len(), all.len(), "a command was claimed twice");
    let mut stats = MysqlStats::default();
    for l in &ledgers {
        let s = l.stats();
        stats.claims += s.claims;
        stats.lost_claim_races += s.lost_claim_races;
        stats.refused_claim_updates += s.refused_claim_updates;
        stats.retries += s.retries;
    }
    assert_eq!(all.len() as u64, config.jobs, "every command claimed");
    Measured {
        elapsed,
        claims: all.len() as u64,
        stats,
        skip_locked: ledgers.iter().all(|l| l.uses_skip_locked() == Some(true)),
    }
}

fn list(var: &str, default: &str) -> Vec<u32> {
    std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{var} is a comma-separated list of numbers"))
        })
        .collect()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
        eprintln!("set LEASEHOLD_TEST_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test)");
        std::process::exit(2);
    };
    let admin = MysqlUrl::parse(&admin).unwrap_or_else(|e| panic!("LEASEHOLD_TEST_MYSQL_URL: {e}"));
    let jobs: Option<u64> = support::bench_arg().map(|a| a.parse().expect("JOBS is a number"));
    let batches = list("BATCHES", "1,5,32");
    let workers = list("WORKERS", "1,2,4,8");
    let spreads = list("SPREADS", "16");
    let modes = list("SKIP_LOCKED", "1");
    let repeat = list("REPEAT", "1").first().copied().unwrap_or(1).max(1);
    match jobs {
        Some(jobs) => println!("{jobs} one-step commands per run, database clock\n"),
        None => println!("max(2000, 200 × batch) one-step commands per run, database clock\n"),
    }
    println!("path          spread  batch  workers  claims/s    elapsed  lost races  refused  retries");
    for skip_locked in modes {
        for &spread in &spreads {
            for &batch in &batches {
                for &w in &workers {
                    for _ in 0..repeat {
                        let config = Config {
                            jobs: jobs.unwrap_or_else(|| (200 * u64::from(batch)).max(2_000)),
                            batch,
                            workers: w,
                            spread,
                            skip_locked: skip_locked != 0,
                        };
                        let m = run(&admin, config).await;
                        println!(
                            "{:<12}  {spread:>6}  {batch:>5}  {w:>7}  {:>8.0}  {:>9.2?}  {:>10}  {:>7}  {:>7}",
                            if m.skip_locked { "skip-locked" } else { "portable" },
                            m.claims as f64 / m.elapsed.as_secs_f64(),
                            m.elapsed,
                            m.stats.lost_claim_races,
                            m.stats.refused_claim_updates,
                            m.stats.retries
                        );
                    }
                }
            }
        }
    }
}
