//! Throughput, measured side by side in one run so that every ratio is fair:
//!
//! - `baseline/*`: the raw SQL loops leasehold is measured against, on plain
//!   rusqlite — one conditional `UPDATE … WHERE status = 'PENDING'` claim per
//!   transaction, 32 claims per transaction, and claim then token-checked complete
//!   (two transactions per job) — 4 threads on one file database in WAL,
//!   `synchronous=NORMAL`, `BEGIN IMMEDIATE`;
//! - `claims/<backend>`: `Ledger::claim` at batch 1, 5 and 32 with 1, 2, 4 and 8
//!   concurrent claimers until the queue is empty (memory, SQLite, and MySQL/MariaDB
//!   when `LEASEHOLD_TEST_MYSQL_URL` is set, run last: the server's background work
//!   after a run would slow whatever came next);
//! - `deliveries/<backend>`: one-step and six-step dry-run deliveries through the real
//!   fused `Worker`, with their transactions per attempt: exactly what `leasehold
//!   bench` runs ([`leasehold::bench::setup`] untimed, then [`leasehold::bench::measure`]),
//!   on a fresh file.
//!
//! The raw baselines are [`leasehold::bench::raw`], the definition `leasehold bench
//! --baseline` runs too. Each criterion iteration is one whole run over a fresh queue
//! (`iter_custom`): the queue is built untimed (claims: a copy of a template file),
//! and the run is timed from the first claim until the queue is empty. Throughput is in jobs (claims or
//! deliveries). After criterion's own report a summary prints the median figures and
//! the ratios to the baselines, and writes them to `target/criterion/leasehold-summary.txt`.
//!
//! Queues: 20,000 jobs for the baselines and the SQLite claims with 4 claimers (the
//! runs compared with them), 3,000 for the other SQLite claim runs, 1,000 for MySQL,
//! 2,000 for the memory ledger (whose claim scans every attempt), 3,000 one-step and
//! 1,000 six-step deliveries. `LEASEHOLD_BENCH_JOBS=N` sets every SQLite and MySQL
//! claim queue and the baselines to N. `LEASEHOLD_BENCH_RUNTIME=current_thread` runs
//! the claimers and workers on a current-thread tokio runtime instead of the default
//! multi-thread one. `cargo bench --features cli` takes about five minutes on 2 cores
//! (plus about five more for MySQL when it is set). Run as a test (`cargo test
//! --features cli --benches`) each benchmark runs once on a tiny queue.

use criterion::{BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput};
use leasehold::bench::raw::{RawKind, SqliteRaw};
use leasehold::bench::{self, BenchOptions, CountingLedger, Prepared};
use leasehold::clock::SystemClock;
use leasehold::entropy::OsEntropy;
use leasehold::ledger::memory::MemoryLedger;
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::Ledger;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

/// The allocator the `leasehold` binary runs with, so that both harnesses measure the
/// same program (see `src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Threads of the raw baselines (and claimers compared with them).
const BASELINE_THREADS: u32 = 4;
/// The claim batch sizes and claimer counts of the grid.
const BATCHES: [u32; 3] = [1, 5, 32];
const WORKERS: [u32; 4] = [1, 2, 4, 8];
/// A lease no run outlives: nothing expires mid-run.
const LEASE_MS: u64 = 600_000;

/// Queue sizes, small when run as a test.
#[derive(Clone, Copy)]
struct Scale {
    /// Jobs per baseline run, and per SQLite claim run with 4 claimers (the runs
    /// compared with the baselines).
    jobs: u64,
    /// Jobs per SQLite claim run with 1, 2 or 8 claimers (fewer, to bound the time).
    grid_jobs: u64,
    /// Jobs per MySQL claim run (every claim is several network round trips).
    mysql_jobs: u64,
    /// Jobs per memory claim run (its claim scans every attempt: quadratic).
    memory_jobs: u64,
    /// One-step deliveries per run.
    deliveries_1: u64,
    /// Six-step deliveries per run.
    deliveries_6: u64,
}

impl Scale {
    fn new(test_mode: bool) -> Self {
        if test_mode {
            return Self {
                jobs: 64,
                grid_jobs: 64,
                mysql_jobs: 64,
                memory_jobs: 64,
                deliveries_1: 32,
                deliveries_6: 16,
            };
        }
        let all: Option<u64> = std::env::var("LEASEHOLD_BENCH_JOBS").ok().and_then(|v| v.parse().ok());
        Self {
            jobs: all.unwrap_or(20_000),
            grid_jobs: all.unwrap_or(3_000),
            mysql_jobs: all.unwrap_or(1_000),
            memory_jobs: 2_000,
            deliveries_1: 3_000,
            deliveries_6: 1_000,
        }
    }
}

/// One timed run.
struct Run {
    id: String,
    jobs: u64,
    elapsed: Duration,
    tx_per_attempt: Option<f64>,
    /// SQLite: ledger calls per transaction the writer committed (group commit).
    calls_per_commit: Option<f64>,
}

/// Every timed run, for the summary.
static RUNS: Mutex<Vec<Run>> = Mutex::new(Vec::new());

fn record(id: &str, jobs: u64, elapsed: Duration, tx_per_attempt: Option<f64>) {
    record_grouped(id, jobs, elapsed, tx_per_attempt, None);
}

fn record_grouped(id: &str, jobs: u64, elapsed: Duration, tx_per_attempt: Option<f64>, calls_per_commit: Option<f64>) {
    let run = Run {
        id: id.to_owned(),
        jobs,
        elapsed,
        tx_per_attempt,
        calls_per_commit,
    };
    RUNS.lock().unwrap_or_else(|e| e.into_inner()).push(run);
}

fn group<'a>(c: &'a mut Criterion, name: &str, jobs: u64) -> BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Elements(jobs));
    g
}

// ---------------------------------------------------------------------------------
// Raw SQL baselines: plain rusqlite, the definition `leasehold bench --baseline`
// shares ([`leasehold::bench::raw`]).

fn baselines(c: &mut Criterion, scale: Scale) {
    let raw = SqliteRaw::new(std::env::temp_dir());
    let mut g = group(c, "baseline", scale.jobs);
    for kind in [RawKind::ClaimOne, RawKind::ClaimBatch, RawKind::ClaimThenComplete] {
        let name = kind.name();
        let id = format!("baseline/{name}/{BASELINE_THREADS}");
        g.bench_function(BenchmarkId::new(name, BASELINE_THREADS), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        let run = raw
                            .run_blocking(kind, BASELINE_THREADS, scale.jobs)
                            .expect("raw baseline");
                        record(&id, scale.jobs, run.elapsed, None);
                        run.elapsed
                    })
                    .sum()
            })
        });
    }
    g.finish();
}

// ---------------------------------------------------------------------------------
// Claims per backend.

/// `workers` concurrent claimers take `batch` at a time until the queue is empty;
/// answers the commands claimed.
async fn claim_all<L: Ledger>(ledger: Arc<L>, workers: u32, batch: u32) -> u64 {
    let mut tasks = JoinSet::new();
    for w in 0..workers {
        let ledger = Arc::clone(&ledger);
        tasks.spawn(async move {
            let owner = format!("claimer-{w}");
            let mut claimed = 0u64;
            loop {
                match ledger.claim(&owner, batch, LEASE_MS).await {
                    Ok(got) if got.is_empty() => return claimed,
                    Ok(got) => claimed += got.len() as u64,
                    Err(e) if e.is_transient() => tokio::task::yield_now().await,
                    Err(e) => panic!("claim failed: {e}"),
                }
            }
        });
    }
    let mut claimed = 0;
    while let Some(n) = tasks.join_next().await {
        claimed += n.expect("claimer task");
    }
    claimed
}

/// A migrated SQLite file with attempts already enqueued, copied for each run.
struct Template {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Template {
    fn new(rt: &Runtime, attempts: u64, steps: u32) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("template.db");
        rt.block_on(async {
            let ledger = Arc::new(sqlite(&path));
            ledger.migrate().await.expect("migrate");
            bench::prepare(ledger, "bench", attempts, steps, 1, Arc::default())
                .await
                .expect("prepare")
        });
        // Every connection is closed: the WAL is checkpointed into the file.
        Self { _dir: dir, path }
    }

    /// A private copy of the template, and its directory.
    fn copy(&self) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("ledger.db");
        std::fs::copy(&self.path, &path).expect("copy the template");
        (dir, path)
    }
}

fn sqlite(path: &Path) -> SqliteLedger {
    SqliteLedger::open(
        path.to_str().expect("a UTF-8 path"),
        Arc::new(SystemClock),
        Arc::new(OsEntropy),
    )
    .expect("open the SQLite ledger")
}

async fn memory_queue(jobs: u64) -> Arc<MemoryLedger> {
    let ledger = Arc::new(MemoryLedger::new(Arc::new(SystemClock), Arc::new(OsEntropy)));
    bench::prepare(Arc::clone(&ledger), "bench", jobs, 1, 1, Arc::default())
        .await
        .expect("prepare");
    ledger
}

fn claims(c: &mut Criterion, rt: &Runtime, scale: Scale) {
    let mut g = group(c, "claims/memory", scale.memory_jobs);
    for batch in BATCHES {
        for workers in WORKERS {
            let id = format!("claims/memory/batch-{batch}/{workers}");
            g.bench_function(BenchmarkId::new(format!("batch-{batch}"), workers), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| {
                            let ledger = rt.block_on(memory_queue(scale.memory_jobs));
                            let began = Instant::now();
                            let claimed = rt.block_on(claim_all(ledger, workers, batch));
                            let elapsed = began.elapsed();
                            assert_eq!(claimed, scale.memory_jobs);
                            record(&id, claimed, elapsed, None);
                            elapsed
                        })
                        .sum()
                })
            });
        }
    }
    g.finish();

    let big = Template::new(rt, scale.jobs, 1);
    let small = Template::new(rt, scale.grid_jobs, 1);
    let mut g = group(c, "claims/sqlite", scale.jobs);
    for batch in BATCHES {
        for workers in WORKERS {
            let (template, jobs) = if workers == BASELINE_THREADS {
                (&big, scale.jobs)
            } else {
                (&small, scale.grid_jobs)
            };
            g.throughput(Throughput::Elements(jobs));
            let id = format!("claims/sqlite/batch-{batch}/{workers}");
            g.bench_function(BenchmarkId::new(format!("batch-{batch}"), workers), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| {
                            let (_dir, path) = template.copy();
                            let ledger = Arc::new(sqlite(&path));
                            let began = Instant::now();
                            let claimed = rt.block_on(claim_all(Arc::clone(&ledger), workers, batch));
                            let elapsed = began.elapsed();
                            assert_eq!(claimed, jobs);
                            let grouped = ledger.writer_stats().calls_per_group();
                            record_grouped(&id, claimed, elapsed, None, Some(grouped));
                            elapsed
                        })
                        .sum()
                })
            });
        }
    }
    g.finish();
}

/// MySQL / MariaDB claims, when `LEASEHOLD_TEST_MYSQL_URL` names a server.
mod mysql {
    use super::*;
    use leasehold::ledger::mysql::scratch::ScratchDatabase;
    use leasehold::ledger::mysql::{MysqlLedger, MysqlUrl};

    const URL_VAR: &str = "LEASEHOLD_TEST_MYSQL_URL";

    /// Lost claim races per benchmark id (summed over runs), for the summary.
    pub(super) static LOST_RACES: Mutex<BTreeMap<String, (u64, u64)>> = Mutex::new(BTreeMap::new());

    pub(super) fn claims(c: &mut Criterion, rt: &Runtime, scale: Scale) {
        let Some(admin) = std::env::var(URL_VAR).ok().filter(|u| !u.is_empty()) else {
            println!("claims/mysql: skipped ({URL_VAR} is not set)");
            return;
        };
        let admin = MysqlUrl::parse(&admin).unwrap_or_else(|e| panic!("{URL_VAR}: {e}"));
        let mut g = group(c, "claims/mysql", scale.mysql_jobs);
        for batch in BATCHES {
            for workers in WORKERS {
                let id = format!("claims/mysql/batch-{batch}/{workers}");
                g.bench_function(BenchmarkId::new(format!("batch-{batch}"), workers), |b| {
                    b.iter_custom(|iters| {
                        (0..iters)
                            .map(|_| {
                                let (elapsed, lost) = rt.block_on(run(&admin, scale.mysql_jobs, workers, batch));
                                record(&id, scale.mysql_jobs, elapsed, None);
                                let mut races = LOST_RACES.lock().unwrap_or_else(|e| e.into_inner());
                                let entry = races.entry(id.clone()).or_default();
                                entry.0 += lost;
                                entry.1 += scale.mysql_jobs;
                                elapsed
                            })
                            .sum()
                    })
                });
            }
        }
        g.finish();
    }

    /// One run on a scratch database: fill it untimed, then time the claims.
    async fn run(admin: &MysqlUrl, jobs: u64, workers: u32, batch: u32) -> (Duration, u64) {
        let scratch = ScratchDatabase::create(admin, "lh_bench_")
            .await
            .expect("scratch database");
        let ledger = Arc::new(MysqlLedger::open(scratch.url(), Arc::new(OsEntropy)));
        ledger.migrate().await.expect("migrate");
        bench::prepare(Arc::clone(&ledger), "bench", jobs, 1, 8, Arc::default())
            .await
            .expect("prepare");
        let lost_before = ledger.lost_claim_races();
        let began = Instant::now();
        let claimed = claim_all(Arc::clone(&ledger), workers, batch).await;
        let elapsed = began.elapsed();
        assert_eq!(claimed, jobs);
        let lost = ledger.lost_claim_races() - lost_before;
        let _ = ledger.disconnect().await;
        drop(scratch);
        (elapsed, lost)
    }
}

// ---------------------------------------------------------------------------------
// End-to-end deliveries through the real worker.

fn deliveries(c: &mut Criterion, rt: &Runtime, scale: Scale) {
    let cases = [
        (1u32, BASELINE_THREADS, 1u32, scale.deliveries_1),
        (1, BASELINE_THREADS, 5, scale.deliveries_1),
        (6, BASELINE_THREADS, 1, scale.deliveries_6),
    ];
    for (steps, workers, batch, attempts) in cases {
        let mut g = group(c, &format!("deliveries/sqlite/{steps}-step"), attempts);
        let id = format!("deliveries/sqlite/{steps}-step/batch-{batch}/{workers}");
        g.bench_function(BenchmarkId::new(format!("batch-{batch}"), workers), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        // What `leasehold bench` does, on a fresh file.
                        let dir = tempfile::tempdir().expect("temporary directory");
                        let inner = Arc::new(sqlite(&dir.path().join("ledger.db")));
                        let options = options(attempts, workers, steps, batch);
                        let (ledger, prepared) = rt
                            .block_on(bench::setup(Arc::clone(&inner), &options, Arc::default()))
                            .expect("setup");
                        let before = inner.writer_stats();
                        let (elapsed, tx) = rt.block_on(deliver(ledger, &prepared, &options));
                        let after = inner.writer_stats();
                        let grouped = bench::WriterFigures::between(before, after).calls_per_commit();
                        record_grouped(&id, attempts, elapsed, Some(tx), Some(grouped));
                        elapsed
                    })
                    .sum()
            })
        });
        g.finish();
    }
    for (steps, attempts) in [(1u32, scale.memory_jobs), (6, scale.memory_jobs)] {
        let mut g = group(c, &format!("deliveries/memory/{steps}-step"), attempts);
        let id = format!("deliveries/memory/{steps}-step/batch-1/{BASELINE_THREADS}");
        g.bench_function(BenchmarkId::new("batch-1", BASELINE_THREADS), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        let inner = Arc::new(MemoryLedger::new(Arc::new(SystemClock), Arc::new(OsEntropy)));
                        let options = options(attempts, BASELINE_THREADS, steps, 1);
                        let (ledger, prepared) = rt
                            .block_on(bench::setup(inner, &options, Arc::default()))
                            .expect("setup");
                        let (elapsed, tx) = rt.block_on(deliver(ledger, &prepared, &options));
                        record(&id, attempts, elapsed, Some(tx));
                        elapsed
                    })
                    .sum()
            })
        });
        g.finish();
    }
}

fn options(attempts: u64, workers: u32, steps: u32, batch: u32) -> BenchOptions {
    BenchOptions {
        attempts,
        workers,
        steps,
        batch,
        tag: "bench".into(),
    }
}

/// Delivers every prepared attempt ([`bench::measure`], as `leasehold bench` does),
/// checks exactly-once, answers the elapsed time and the transactions per attempt.
async fn deliver<L: Ledger>(
    ledger: Arc<CountingLedger<L>>,
    prepared: &Prepared,
    options: &BenchOptions,
) -> (Duration, f64) {
    let report = bench::measure(ledger, prepared, options, Arc::default())
        .await
        .expect("measure");
    assert!(
        report.exactly_once(),
        "not delivered exactly once: {:?}",
        report.verified.problems
    );
    (report.measured.elapsed, report.transactions_per_attempt)
}

// ---------------------------------------------------------------------------------
// Summary with the ratios to the baselines and their goals (docs/performance.md).

fn summary() -> String {
    let runs = RUNS.lock().unwrap_or_else(|e| e.into_inner());
    let mut by_id: BTreeMap<&str, (Vec<f64>, Option<f64>)> = BTreeMap::new();
    let mut grouping: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for run in runs.iter() {
        let entry = by_id.entry(&run.id).or_default();
        entry
            .0
            .push(run.jobs as f64 / run.elapsed.as_secs_f64().max(f64::MIN_POSITIVE));
        if run.tx_per_attempt.is_some() {
            entry.1 = run.tx_per_attempt;
        }
        if let Some(g) = run.calls_per_commit {
            grouping.entry(&run.id).or_default().push(g);
        }
    }
    let median = |id: &str| {
        by_id.get(id).map(|(rates, _)| {
            let mut r = rates.clone();
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        })
    };
    let mut out = String::from("\nleasehold throughput summary (median of every timed run, jobs per second)\n");
    for (id, (rates, tx)) in &by_id {
        let _ = write!(
            out,
            "  {id:<48} {:>10.0}/s  ({} runs)",
            median(id).unwrap_or(0.0),
            rates.len()
        );
        if let Some(tx) = tx {
            let _ = write!(out, "  {tx:.2} transactions per attempt");
        }
        if let Some(g) = grouping.get(*id) {
            let mean = g.iter().sum::<f64>() / g.len() as f64;
            let _ = write!(out, "  {mean:.2} calls per SQLite commit");
        }
        out.push('\n');
    }
    for (id, (lost, jobs)) in mysql::LOST_RACES.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let _ = writeln!(out, "  {id:<48} {lost} lost claim races over {jobs} claims");
    }
    out.push_str(
        "  (transactions per attempt: ledger transitions, each atomic; the SQLite writer commits the calls\n   \
         waiting together, and those arriving while they run, as one transaction, each in its own\n   \
         savepoint: calls per SQLite commit)\n",
    );
    out.push_str("\nratios to the raw baselines (4 workers / threads, same run):\n");
    let t = BASELINE_THREADS;
    let goals = [
        (
            format!("claims/sqlite/batch-1/{t}"),
            format!("baseline/claim-1-per-tx/{t}"),
            0.8,
        ),
        (
            format!("claims/sqlite/batch-32/{t}"),
            format!("baseline/claim-32-per-tx/{t}"),
            0.7,
        ),
        (
            format!("deliveries/sqlite/1-step/batch-1/{t}"),
            format!("baseline/claim-then-complete/{t}"),
            1.0,
        ),
        (
            format!("deliveries/sqlite/1-step/batch-5/{t}"),
            format!("baseline/claim-then-complete/{t}"),
            1.0,
        ),
    ];
    for (ours, theirs, goal) in goals {
        if let (Some(a), Some(b)) = (median(&ours), median(&theirs)) {
            let ratio = a / b;
            let verdict = if ratio >= goal { "met" } else { "MISSED" };
            let _ = writeln!(out, "  {ours} / {theirs} = {ratio:.2} (goal >= {goal}: {verdict})");
        }
    }
    if let Some((_, Some(tx))) = by_id.get(format!("deliveries/sqlite/6-step/batch-1/{t}").as_str()) {
        let _ = writeln!(out, "  six-step transactions per attempt = {tx:.2} (goal 7)");
    }
    out
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` does not: then every
    // benchmark runs once, as a test, on a tiny queue.
    let test_mode = !std::env::args().any(|a| a == "--bench");
    let scale = Scale::new(test_mode);
    let rt = if std::env::var("LEASEHOLD_BENCH_RUNTIME").as_deref() == Ok("current_thread") {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    }
    .expect("tokio runtime");
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1))
        .without_plots()
        .configure_from_args();
    baselines(&mut c, scale);
    claims(&mut c, &rt, scale);
    deliveries(&mut c, &rt, scale);
    // Last: the MySQL server keeps working (purge, page flushes) for a while after a
    // run, on the same cores, which would slow whatever ran next and skew its ratio.
    mysql::claims(&mut c, &rt, scale);
    c.final_summary();
    let text = summary();
    println!("{text}");
    if !test_mode {
        let dir = Path::new("target").join("criterion");
        if std::fs::create_dir_all(&dir).is_ok() {
            let _ = std::fs::write(dir.join("leasehold-summary.txt"), &text);
        }
    }
}
