//! Four `leasehold worker` processes on one MariaDB / MySQL database deliver 1,000
//! attempts of a one-step dry-run plan: every attempt ends SUCCEEDED, every command
//! DELIVERED at delivery 1, none is lost, and no command was ever held by two leases.
//!
//! Evidence for the last: each worker logs every claim (`claimed attempt …`); no
//! attempt appears in two logs (nor twice in one), and every command's
//! `delivery_count` is 1 — a second lease on a command would have been a second claim
//! and raised it. The setup goes through the ledger API (enqueueing 1,000 attempts
//! through the CLI would start 2,000 processes). Runs on both claim paths: `SKIP
//! LOCKED` (the default, where the server has it) and the portable one
//! (`skip_locked=0`, as on MySQL 5.7). Needs `LEASEHOLD_TEST_MYSQL_URL`; without it
//! the test prints why it is skipped and passes.

use leasehold::entropy::OsEntropy;
use leasehold::ledger::mysql::scratch::ScratchDatabase;
use leasehold::ledger::mysql::{MysqlLedger, MysqlUrl};
use leasehold::ledger::Ledger;
use leasehold_engine::{Action, AttemptId, AttemptStatus, CommandStatus, PlanSpec};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
const WORKERS: usize = 4;
const ATTEMPTS: usize = 1_000;
/// How long the workers get before the test kills them and fails.
const DEADLINE: Duration = Duration::from_secs(300);

/// A one-step dry-run plan; the number makes every plan's content (and so its
/// fingerprint) distinct, and `execute` needs a plan with no open attempt.
fn spec(n: usize) -> PlanSpec {
    serde_json::from_value(json!({
        "name": format!("multiprocess-{n:04}"),
        "recovery": "resume",
        "steps": [{"code": "notify", "executor": "dry-run:v1", "payload": {"delay_ms": 0, "n": n}}],
    }))
    .expect("a valid plan")
}

/// Registers the plans and enqueues their attempts, eight at a time.
async fn enqueue_all(ledger: &MysqlLedger) -> BTreeSet<AttemptId> {
    let mut tasks = Vec::new();
    for lane in 0..8 {
        let ledger = ledger.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for n in (lane..ATTEMPTS).step_by(8) {
                let plan = ledger.register_plan(spec(n), &["dry-run:v1"]).await.expect("register");
                ids.push(
                    ledger
                        .enqueue(&plan.id, Action::Execute)
                        .await
                        .expect("enqueue")
                        .attempt
                        .id,
                );
            }
            ids
        }));
    }
    let mut all = BTreeSet::new();
    for t in tasks {
        all.extend(t.await.expect("an enqueue task panicked"));
    }
    all
}

/// What one worker process printed and how it ended.
struct WorkerRun {
    id: String,
    success: bool,
    stdout: String,
    stderr: String,
}

impl WorkerRun {
    /// The attempts this worker logged as claimed, in order.
    fn claims(&self) -> Vec<AttemptId> {
        let marker = "claimed attempt ";
        self.stdout
            .lines()
            .filter_map(|line| line.split_once(marker))
            .filter_map(|(_, rest)| rest.split_whitespace().next())
            .map(AttemptId::new)
            .collect()
    }

    /// The `delivered N` of its closing line.
    fn delivered(&self) -> u64 {
        self.stdout
            .lines()
            .rev()
            .find_map(|line| line.split_once(" delivered ").map(|(_, rest)| rest))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// Runs the workers to completion (each until idle), all at once.
fn run_workers(url: &str) -> Vec<WorkerRun> {
    let mut children = Vec::new();
    for w in 0..WORKERS {
        let id = format!("mp-worker-{w}");
        let child = Command::new(BIN)
            .args([
                "--db",
                url,
                "worker",
                "--id",
                &id,
                "--until-idle",
                "--poll-secs",
                "1",
                "--batch",
                "8",
            ])
            .env_remove("LEASEHOLD_DB")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a worker");
        children.push((id, child));
    }
    // Drain every pipe from the start, on threads: a worker whose pipe is full blocks
    // in the middle of whatever it was doing (a transaction included).
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let children: Vec<_> = children
        .into_iter()
        .map(|(id, mut child)| {
            let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
            let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
            (id, child, out, err)
        })
        .collect();
    let started = Instant::now();
    let mut runs = Vec::new();
    for (id, child, out, err) in children {
        // Wait on a thread so the deadline can end a worker that never exits.
        let pid = child.id();
        let (done, exited) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let mut child = child;
            let status = child.wait().expect("wait for a worker");
            let _ = done.send(());
            status
        });
        let left = DEADLINE.saturating_sub(started.elapsed());
        if exited.recv_timeout(left).is_err() {
            let _ = std::process::Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
        }
        let status = waiter.join().expect("reap a worker");
        runs.push(WorkerRun {
            id,
            success: status.success(),
            stdout: out.join().expect("stdout reader"),
            stderr: err.join().expect("stderr reader"),
        });
    }
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_worker_processes_deliver_1000_attempts_each_exactly_once() {
    deliver_with_four_processes(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_worker_processes_on_the_portable_claim_path_deliver_1000_attempts_each_exactly_once() {
    deliver_with_four_processes(false).await;
}

/// Four worker processes deliver every attempt exactly once; `skip_locked` is the
/// workers' `skip_locked` URL option.
async fn deliver_with_four_processes(skip_locked: bool) {
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
        println!("skipped: LEASEHOLD_TEST_MYSQL_URL is not set (e.g. mysql://root@127.0.0.1:3306/test)");
        return;
    };
    let admin = MysqlUrl::parse(&admin).expect("LEASEHOLD_TEST_MYSQL_URL");
    let db = ScratchDatabase::create(&admin, "lh_mp_")
        .await
        .expect("create a test database");
    let url = db.url().clone();
    let ledger = MysqlLedger::open(&url, Arc::new(OsEntropy));
    ledger.migrate().await.expect("migrate");
    let setup = Instant::now();
    let attempts = enqueue_all(&ledger).await;
    assert_eq!(attempts.len(), ATTEMPTS);
    assert_eq!(ledger.open_attempts().await.unwrap(), ATTEMPTS as u64);
    println!("enqueued {ATTEMPTS} attempts in {:?}", setup.elapsed());

    let mut worker_url = url.clone();
    worker_url.options.skip_locked = skip_locked;
    let cli_url = worker_url.expose();
    let started = Instant::now();
    let runs = tokio::task::spawn_blocking(move || run_workers(&cli_url))
        .await
        .expect("the worker runner panicked");
    let elapsed = started.elapsed();

    let mut claimed_by: BTreeMap<AttemptId, Vec<String>> = BTreeMap::new();
    let mut delivered = 0;
    for run in &runs {
        assert!(
            run.success,
            "worker {} failed or timed out\n--- stdout tail ---\n{}\n--- stderr ---\n{}",
            run.id,
            run.stdout.lines().rev().take(20).collect::<Vec<_>>().join("\n"),
            run.stderr
        );
        for attempt in run.claims() {
            claimed_by.entry(attempt).or_default().push(run.id.clone());
        }
        delivered += run.delivered();
    }
    let per_worker: Vec<(String, usize)> = runs.iter().map(|r| (r.id.clone(), r.claims().len())).collect();
    println!(
        "{ATTEMPTS} attempts delivered by {WORKERS} processes (skip_locked={skip_locked}) in {elapsed:?}; \
         claims per worker: {per_worker:?}"
    );

    let twice: Vec<_> = claimed_by.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(twice.is_empty(), "attempts claimed more than once: {twice:?}");
    let claimed: BTreeSet<AttemptId> = claimed_by.keys().cloned().collect();
    assert_eq!(claimed, attempts, "every attempt claimed, and nothing else");
    assert_eq!(delivered, ATTEMPTS as u64, "the workers' own delivered counts");
    assert!(
        per_worker.iter().filter(|(_, n)| *n > 0).count() >= 2,
        "the work was not shared: {per_worker:?}"
    );

    assert_eq!(ledger.open_attempts().await.unwrap(), 0);
    for attempt in &attempts {
        let record = ledger.attempt(attempt).await.expect("read an attempt");
        assert_eq!(record.attempt.status, AttemptStatus::Succeeded, "{attempt}");
        assert_eq!(record.command.status, CommandStatus::Delivered, "{attempt}");
        assert_eq!(record.command.delivery_count, 1, "{attempt}: claimed more than once");
        assert!(
            record.command.lease_token.is_none(),
            "{attempt}: a delivered command holds no lease"
        );
        let owner = record.command.lease_owner.clone().unwrap_or_default();
        assert_eq!(
            claimed_by.get(attempt).map(|by| by[0].as_str()),
            Some(owner.as_str()),
            "{attempt}: the lease owner on record is not the worker that logged the claim"
        );
        assert!(record
            .receipts
            .iter()
            .all(|r| r.status == leasehold_engine::ReceiptStatus::Succeeded));
    }
}
