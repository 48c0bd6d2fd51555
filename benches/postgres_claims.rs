//! Claims per second on PostgreSQL with 1, 2, 4 and 8 concurrent workers at claim
//! batches 1, 5 and 32, and the enqueue→claim latency of an idle worker with and
//! without `LISTEN`/`NOTIFY` wake-ups.
//!
//! `LEASEHOLD_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test cargo bench
//! --features postgres --bench postgres_claims -- [claims|latency]` (both when not given).
//!
//! - `claims`: each run gets a scratch database with max(2,000, 200 × batch)
//!   claimable one-step commands, then N workers, each with its own ledger (its own
//!   pool, as separate machines would have), call `Ledger::claim` until nothing is
//!   left. The database's clock decides; the run is timed from the first claim to the
//!   empty queue, and checks that every command was claimed exactly once.
//!   Environment: `BATCHES` (default `1,5,32`), `WORKERS` (default `1,2,4,8`),
//!   `ROUTED=1` (each claim carries the capabilities of a `leasehold worker` with one
//!   allowed host, so the claim's query filters by route, as a real worker's does;
//!   default: no capabilities, no filter).
//! - `latency`: one real [`Worker`] (batch 1, `POLL_MS`, default 1,000 ms) idles on
//!   a scratch database while `SAMPLES` (default 40) attempts are enqueued one at a
//!   time, a random 100–400 ms apart; each sample is the time from just before the
//!   `enqueue` call to the worker's claim event. Once with `notify=1` (the default),
//!   once with `notify=0` (polling only). Prints the median, p90, p99 and max.

mod support;

use leasehold::clock::SystemClock;
use leasehold::entropy::{Entropy, OsEntropy};
use leasehold::executor::Executors;
use leasehold::ledger::postgres::scratch::ScratchDatabase;
use leasehold::ledger::postgres::{PostgresLedger, PostgresUrl};
use leasehold::ledger::Ledger;
use leasehold::worker::{RunOptions, Worker, WorkerEvent};
use leasehold_engine::lease::WorkerConfig;
use leasehold_engine::route::DEFAULT_QUEUE;
use leasehold_engine::{Action, AttemptId, Capabilities, ClaimRequest, PlanSpec};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
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

/// One timed claims run in a fresh scratch database: claims per second, lost races.
async fn claims(admin: &PostgresUrl, jobs: u64, batch: u32, workers: u32) -> (f64, Duration, u64) {
    let scratch = ScratchDatabase::create(admin, "lh_bench_")
        .await
        .expect("scratch database");
    let url = scratch.url().clone();
    let setup = PostgresLedger::open(&url, Arc::new(OsEntropy)).expect("open");
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
    let ledgers: Vec<PostgresLedger> = (0..workers)
        .map(|_| PostgresLedger::open(&url, Arc::new(OsEntropy)).expect("open"))
        .collect();
    // Warm every pool with one session, untimed.
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
                let request = ClaimRequest {
                    owner: owner.clone(),
                    batch,
                    lease_ms: LEASE_MS,
                    begin: false,
                    capabilities: routed(),
                };
                let claimed = ledger.claim_batch(request).await.expect("claim");
                if claimed.is_empty() {
                    break;
                }
                assert!(claimed.len() <= batch as usize, "more than a batch");
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
    // A claimer that found every remaining command held by others stops early; the
    // others finish the queue.
    assert_eq!(all.len() as u64, jobs, "every command claimed");
    let lost = ledgers.iter().map(|l| l.stats().lost_claim_races).sum();
    (all.len() as f64 / elapsed.as_secs_f64(), elapsed, lost)
}

/// Enqueue→claim latencies of one idle worker, in milliseconds, sorted.
async fn latency(admin: &PostgresUrl, notify: bool, samples: u64, poll_ms: u64) -> Vec<f64> {
    let scratch = ScratchDatabase::create(admin, "lh_bench_")
        .await
        .expect("scratch database");
    let mut url = scratch.url().clone();
    url.options.notify = notify;
    let ledger = Arc::new(PostgresLedger::open(&url, Arc::new(OsEntropy)).expect("open"));
    ledger.migrate().await.expect("migrate");
    let mut plans = Vec::new();
    for n in 0..samples {
        plans.push(
            ledger
                .register_plan(spec(n), &["dry-run:v1"])
                .await
                .expect("register")
                .id,
        );
    }
    let claimed_at: Arc<Mutex<BTreeMap<AttemptId, Instant>>> = Arc::default();
    let seen = claimed_at.clone();
    let worker = Worker::new(
        "latency",
        ledger.clone(),
        Arc::new(Executors::new()),
        Arc::new(SystemClock),
        WorkerConfig::clamped(true, poll_ms, 1, LEASE_MS),
    )
    .on_event(move |e| {
        if let WorkerEvent::Claimed { attempt, .. } = e {
            seen.lock().unwrap().insert(attempt.clone(), Instant::now());
        }
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        let stop = async {
            let _ = stop_rx.await;
        };
        worker
            .run(
                stop,
                RunOptions {
                    until_idle: false,
                    grace_ms: 5_000,
                },
            )
            .await
    });
    // Let the worker start and go idle (its listening session up), untimed.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut enqueued = Vec::new();
    for plan in &plans {
        tokio::time::sleep(Duration::from_millis(100 + OsEntropy.next_u64() % 300)).await;
        let at = Instant::now();
        let record = ledger.enqueue(plan, Action::Execute).await.expect("enqueue");
        enqueued.push((record.attempt.id, at));
    }
    // Every sample is claimed within a poll interval of its enqueue.
    let deadline = Instant::now() + Duration::from_millis(poll_ms * 3 + 5_000);
    while claimed_at.lock().unwrap().len() < enqueued.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop_tx.send(());
    run.await.expect("worker");
    let claimed_at = claimed_at.lock().unwrap();
    let mut ms: Vec<f64> = enqueued
        .iter()
        .map(|(id, at)| {
            let claimed = claimed_at.get(id).expect("every attempt claimed");
            claimed.saturating_duration_since(*at).as_secs_f64() * 1_000.0
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    ms
}

/// With `ROUTED=1`: what a `leasehold worker --http-allow crm.example` can run.
fn routed() -> Option<Capabilities> {
    if std::env::var("ROUTED").as_deref() != Ok("1") {
        return None;
    }
    let config = leasehold::executor::HttpConfig::allowing(["crm.example"]).expect("a host");
    let executors = Executors::builder().http(config).build().expect("executors");
    leasehold::executor::Executor::reach(&executors).map(|executors| Capabilities {
        executors,
        queues: BTreeSet::from([DEFAULT_QUEUE.to_owned()]),
    })
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
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
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_POSTGRES_URL") else {
        eprintln!("set LEASEHOLD_TEST_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test)");
        std::process::exit(2);
    };
    let admin = PostgresUrl::parse(&admin).unwrap_or_else(|e| panic!("LEASEHOLD_TEST_POSTGRES_URL: {e}"));
    let mode = support::bench_arg();
    if mode.as_deref() != Some("latency") {
        let routed = if routed().is_some() {
            "routed claims"
        } else {
            "claims without capabilities"
        };
        println!("max(2000, 200 × batch) one-step commands per run, database clock, {routed}\n");
        println!("batch  workers  claims/s    elapsed  lost races");
        for &batch in &list("BATCHES", "1,5,32") {
            for &w in &list("WORKERS", "1,2,4,8") {
                let jobs = (200 * u64::from(batch)).max(2_000);
                let (rate, elapsed, lost) = claims(&admin, jobs, batch, w).await;
                println!("{batch:>5}  {w:>7}  {rate:>8.0}  {elapsed:>9.2?}  {lost:>10}");
            }
        }
        println!();
    }
    if mode.as_deref() != Some("claims") {
        let samples = u64::from(list("SAMPLES", "40")[0]).max(2);
        let poll_ms = u64::from(list("POLL_MS", "1000")[0]);
        println!("enqueue→claim latency, one idle worker, poll {poll_ms} ms, {samples} samples (ms)\n");
        println!("notify  median     p90     p99     max");
        for notify in [true, false] {
            let ms = latency(&admin, notify, samples, poll_ms).await;
            println!(
                "{:<6}  {:>6.1}  {:>6.1}  {:>6.1}  {:>6.1}",
                if notify { "on" } else { "off" },
                quantile(&ms, 0.5),
                quantile(&ms, 0.9),
                quantile(&ms, 0.99),
                ms[ms.len() - 1]
            );
        }
    }
}
