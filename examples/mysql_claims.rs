//! Claims per second on MySQL / MariaDB with 1, 4 and 8 concurrent workers, and how
//! many claim races were lost (and refused).
//!
//! `LEASEHOLD_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test cargo run --release
//! --example mysql_claims [JOBS]` — each run gets a scratch database with JOBS
//! (default 2,000) claimable one-step commands, then N workers, each with its own
//! ledger (its own connection pool, as separate machines would have), call
//! `Ledger::claim` with batch 5 until nothing is left. The database's clock decides;
//! the run is timed from the first claim to the empty queue. Every configuration runs
//! with the default `claim_spread` (16) and with 1 (strictly oldest first), or with
//! the spreads listed in `SPREADS` (e.g. `SPREADS=1,4,16`).

use leasehold::entropy::OsEntropy;
use leasehold::ledger::mysql::scratch::ScratchDatabase;
use leasehold::ledger::mysql::{MysqlLedger, MysqlStats, MysqlUrl};
use leasehold::ledger::Ledger;
use leasehold_engine::{Action, PlanSpec};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BATCH: u32 = 5;
const LEASE_MS: u64 = 60_000;

fn spec(n: u64) -> PlanSpec {
    serde_json::from_value(json!({
        "name": format!("bench-{n}"),
        "recovery": "resume",
        "steps": [{"code": "notify", "executor": "dry-run:v1", "payload": {"n": n}}],
    }))
    .expect("a valid plan")
}

/// One timed run: answers the elapsed time, the claims and the summed counters.
async fn run(admin: &MysqlUrl, jobs: u64, workers: u32, spread: u32) -> (Duration, u64, MysqlStats) {
    let scratch = ScratchDatabase::create(admin, "lh_bench_")
        .await
        .expect("scratch database");
    let mut url = scratch.url().clone();
    url.options.claim_spread = spread;
    let setup = MysqlLedger::open(&url, Arc::new(OsEntropy));
    setup.migrate().await.expect("migrate");
    let mut lanes = Vec::new();
    for lane in 0..8 {
        let setup = setup.clone();
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
    let ledgers: Vec<MysqlLedger> = (0..workers)
        .map(|_| MysqlLedger::open(&url, Arc::new(OsEntropy)))
        .collect();
    // Warm every pool with one connection, untimed.
    for l in &ledgers {
        l.open_attempts().await.expect("warm up");
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(workers as usize + 1));
    let mut tasks = Vec::new();
    for (w, ledger) in ledgers.iter().enumerate() {
        let (ledger, barrier) = (ledger.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let owner = format!("bench-{w}");
            let mut mine = Vec::new();
            barrier.wait().await;
            loop {
                let claimed = ledger.claim(&owner, BATCH, LEASE_MS).await.expect("claim");
                if claimed.is_empty() {
                    break;
                }
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
    assert_eq!(all.len() as u64, jobs, "every command claimed");
    let mut stats = MysqlStats::default();
    for l in &ledgers {
        let s = l.stats();
        stats.claims += s.claims;
        stats.lost_claim_races += s.lost_claim_races;
        stats.refused_claim_updates += s.refused_claim_updates;
        stats.retries += s.retries;
    }
    (elapsed, all.len() as u64, stats)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
        eprintln!("set LEASEHOLD_TEST_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test)");
        std::process::exit(2);
    };
    let admin = MysqlUrl::parse(&admin).unwrap_or_else(|e| panic!("LEASEHOLD_TEST_MYSQL_URL: {e}"));
    let jobs: u64 = std::env::args()
        .nth(1)
        .map_or(2_000, |a| a.parse().expect("JOBS is a number"));
    println!("{jobs} one-step commands per run, batch {BATCH}, database clock\n");
    println!("workers  spread  claims/s  elapsed     lost races  refused updates  retries");
    let spreads: Vec<u32> = std::env::var("SPREADS")
        .unwrap_or_else(|_| "16,1".into())
        .split(',')
        .map(|s| s.trim().parse().expect("SPREADS is a comma-separated list of numbers"))
        .collect();
    for spread in spreads {
        for workers in [1, 4, 8] {
            let (elapsed, claims, s) = run(&admin, jobs, workers, spread).await;
            println!(
                "{workers:>7}  {spread:>6}  {:>8.0}  {:>9.2?}  {:>10}  {:>15}  {:>7}",
                claims as f64 / elapsed.as_secs_f64(),
                elapsed,
                s.lost_claim_races,
                s.refused_claim_updates,
                s.retries
            );
        }
    }
}
