//! Real-process failover of the ledger's own database: `leasehold worker` processes
//! deliver attempts of three-step `http:v1` plans to the reference receiver while
//! the test kills the database under them —
//! - on PostgreSQL, a primary with a synchronous streaming standby
//!   (`scripts/pg-cluster`): the standby stops acknowledging for a moment, so that
//!   the commits sent meanwhile wait unanswered, then the primary is killed
//!   (SIGKILL) — those commits are in doubt — and the standby promoted; every
//!   process reaches the new primary through a two-host URL with
//!   `target_session_attrs=read-write`;
//! - on MariaDB Galera, three nodes (`scripts/galera-cluster`), one of them with its
//!   clock ahead (libfaketime): each worker talks to its own node, and nodes are
//!   paused (SIGSTOP: their clients' commits wait), killed (SIGKILL) and restarted,
//!   rejoining the cluster;
//!
//! and kills worker processes (SIGKILL, replaced at once) while the database is
//! down. The test enqueues through the library meanwhile, each attempt under an
//! enqueue key, trying again with the same key whenever the answer is unavailable
//! or unknown.
//!
//! What is asserted afterwards, from the ledger and the receiver:
//! - every acknowledged enqueue exists, and each key made one attempt (no
//!   duplicate from a retried enqueue whose first commit was in doubt);
//! - every attempt SUCCEEDED and every receipt SUCCEEDED;
//! - the receiver applied each of the ledger's keys exactly once;
//! - nothing written under a replaced token: every receipt is what the receiver
//!   stored for its key, and every refusal a worker met is the stale-token refusal.
//!
//! The runs need the cluster scripts' servers (PostgreSQL 15, MariaDB with
//! galera-4, libfaketime) and ports 5441–5442, 3311–3313 and 4571–4593 on
//! 127.0.0.1; they are skipped, saying so, without `LEASEHOLD_TEST_FAILOVER=1`
//! (`.ci/run` installs what they need and sets it). The schedule comes from one
//! seed, printed at the start; `LEASEHOLD_FAILOVER_SEED=N` replays it. The figures
//! (database kills, failovers, worker kills, takeovers, commits in doubt) go to
//! stderr even when the test passes.

use leasehold::engine::{Action, AttemptId, AttemptRecord, PlanId};
use leasehold::entropy::{OsEntropy, SeededEntropy};
use leasehold::ledger::mysql::{MysqlLedger, MysqlUrl};
use leasehold::ledger::postgres::{PostgresLedger, PostgresUrl};
use leasehold::ledger::{EnqueueRequest, Ledger, LedgerError};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "procs/mod.rs"]
mod procs;

use procs::outcome::{self, STEPS};
use procs::{Draws, Killable as Proc};

/// Attempts enqueued per run.
const ATTEMPTS: usize = 40;
/// Worker processes alive at any time.
const WORKERS: usize = 3;
const LEASE_SECS: u64 = 3;
/// Time between two enqueues of the test.
const PACE: Duration = Duration::from_millis(40);
/// How long one enqueue may go unanswered (unavailable or in doubt) before the run
/// fails.
const ENQUEUE_DEADLINE: Duration = Duration::from_secs(60);
/// Once the faults stop, every attempt must end within this.
const LIVENESS_DEADLINE: Duration = Duration::from_secs(120);
/// How long the receiver takes per request, so that deliveries are in flight when
/// the database fails.
const TARGET_DELAY_MS: u64 = 150;
/// How far ahead of the others one Galera node's clock runs.
const GALERA_CLOCK_AHEAD: &str = "+1s";

#[test]
fn postgres_primary_killed_and_standby_promoted_loses_nothing_and_fences_every_stale_write() {
    let Some(dir) = cluster_dir("postgres") else { return };
    let _alone = procs::alone();
    let runtime = procs::runtime();
    let cluster = PgCluster::start(dir);
    let url = PostgresUrl::parse(&cluster.url()).unwrap();
    let ledger = runtime.block_on(async {
        let ledger = PostgresLedger::open(&url, Arc::new(OsEntropy)).unwrap();
        ledger.migrate().await.unwrap();
        ledger
    });
    Failover::new("postgres", &runtime).run(cluster, ledger);
}

#[test]
fn galera_nodes_killed_and_rejoined_lose_nothing_and_fence_every_stale_write() {
    let Some(dir) = cluster_dir("galera") else { return };
    let _alone = procs::alone();
    let runtime = procs::runtime();
    let cluster = GaleraCluster::start(dir);
    let url = MysqlUrl::parse(&cluster.worker_url(0)).unwrap();
    let ledger = runtime.block_on(async {
        let ledger = MysqlLedger::open(&url, Arc::new(OsEntropy));
        ledger.migrate().await.unwrap();
        ledger
    });
    Failover::new("galera", &runtime).run(cluster, ledger);
}

/// A directory for a cluster's data, readable by the database's own user; `None`
/// (the run is skipped, saying so) without `LEASEHOLD_TEST_FAILOVER=1`.
fn cluster_dir(which: &str) -> Option<tempfile::TempDir> {
    if std::env::var("LEASEHOLD_TEST_FAILOVER").as_deref() != Ok("1") {
        println!("skipped ({which}): LEASEHOLD_TEST_FAILOVER is not 1 (the run starts its own database cluster)");
        return None;
    }
    let dir = tempfile::Builder::new().prefix("lh-failover-").tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    Some(dir)
}

/// Runs `scripts/NAME ARGS` with `env`; it must succeed.
fn script(name: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join(name);
    let out = Command::new(&path)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", path.display()));
    assert!(
        out.status.success(),
        "{} {args:?} exited {}:\n{}\n{}",
        path.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A database cluster the run fails and recovers.
trait Cluster {
    /// The URL worker `slot` is started with.
    fn worker_url(&self, slot: usize) -> String;
    /// Takes the database (or a node of it) down; answers what it did.
    fn fail(&mut self, draws: &Draws) -> String;
    /// Brings it back (promotes the standby, restarts the node); answers what it did.
    fn recover(&mut self) -> String;
    /// How many times the run fails it.
    fn rounds(&self) -> usize;
}

/// A PostgreSQL primary on 5441 with a synchronous standby on 5442.
struct PgCluster {
    dir: tempfile::TempDir,
}

impl PgCluster {
    fn start(dir: tempfile::TempDir) -> Self {
        let cluster = Self { dir };
        let started = script("pg-cluster", &["start", &cluster.path(), "sync"], &[]);
        let _ = writeln!(std::io::stderr(), "failover (postgres): {}", started.trim());
        cluster
    }

    fn path(&self) -> String {
        self.dir.path().display().to_string()
    }

    fn url(&self) -> String {
        "postgres://postgres@127.0.0.1:5441,127.0.0.1:5442/test?target_session_attrs=read-write\
         &connect_timeout_ms=1000&pool_max=4"
            .to_owned()
    }
}

impl Cluster for PgCluster {
    fn worker_url(&self, _slot: usize) -> String {
        self.url()
    }

    /// Pauses the standby's WAL receiver, so that every commit on the primary waits
    /// for it, unanswered; then kills the primary: those commits are in doubt to
    /// their clients (the standby may or may not hold them once it resumes).
    fn fail(&mut self, draws: &Draws) -> String {
        script("pg-cluster", &["pause-standby", &self.path()], &[]);
        let paused = draws.ms(300, 1_000);
        std::thread::sleep(paused);
        script("pg-cluster", &["kill-primary", &self.path()], &[]);
        script("pg-cluster", &["resume-standby", &self.path()], &[]);
        format!(
            "paused the standby's WAL receiver for {} ms, then killed the primary (SIGKILL)",
            paused.as_millis()
        )
    }

    fn recover(&mut self) -> String {
        script("pg-cluster", &["promote", &self.path()], &[]);
        "promoted the standby".to_owned()
    }

    fn rounds(&self) -> usize {
        1
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| script("pg-cluster", &["stop", &self.path()], &[]));
    }
}

/// Three Galera nodes on 3311–3313, the third with its clock ahead.
struct GaleraCluster {
    dir: tempfile::TempDir,
    down: Option<usize>,
    kills: usize,
}

impl GaleraCluster {
    fn start(dir: tempfile::TempDir) -> Self {
        let cluster = Self {
            dir,
            down: None,
            kills: 0,
        };
        let started = script(
            "galera-cluster",
            &["start", &cluster.path()],
            &[
                ("GALERA_FAKETIME_NODE", "3"),
                ("GALERA_FAKETIME_OFFSET", GALERA_CLOCK_AHEAD),
            ],
        );
        let _ = writeln!(
            std::io::stderr(),
            "failover (galera): {}; node 3's clock {GALERA_CLOCK_AHEAD}",
            started.trim()
        );
        cluster
    }

    fn path(&self) -> String {
        self.dir.path().display().to_string()
    }
}

impl Cluster for GaleraCluster {
    /// Worker `slot` talks to node `slot % 3 + 1`; the test's own ledger (slot 0)
    /// to node 1, which is never killed.
    fn worker_url(&self, slot: usize) -> String {
        format!(
            "mysql://root@127.0.0.1:{}/test?connect_timeout_ms=1000&pool_max=4",
            3311 + slot % 3
        )
    }

    /// Kills node 2, then node 3 (whose clock runs ahead): each kill leaves two
    /// nodes, a quorum. Node 3 is killed last because libfaketime can stall its
    /// group timers for minutes after a restart, and a stalled node 3 beside a
    /// killed node 2 would leave no quorum.
    /// Each node is paused (SIGSTOP) for a moment before it is killed, so that its
    /// clients' commits sent meanwhile are in doubt.
    fn fail(&mut self, draws: &Draws) -> String {
        self.kills += 1;
        let node = (1 + self.kills).to_string();
        script("galera-cluster", &["pause", &self.path(), &node], &[]);
        let paused = draws.ms(300, 1_000);
        std::thread::sleep(paused);
        script("galera-cluster", &["kill", &self.path(), &node], &[]);
        self.down = Some(1 + self.kills);
        format!(
            "paused node {node} for {} ms, then killed it (SIGKILL)",
            paused.as_millis()
        )
    }

    fn recover(&mut self) -> String {
        let node = self.down.take().expect("a node is down");
        script("galera-cluster", &["restart", &self.path(), &node.to_string()], &[]);
        format!("node {node} rejoined")
    }

    fn rounds(&self) -> usize {
        2
    }
}

impl Drop for GaleraCluster {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| script("galera-cluster", &["stop", &self.path()], &[]));
    }
}

/// The worker processes: each slot's current process, and those killed.
struct Fleet {
    name: &'static str,
    urls: Vec<String>,
    addr: String,
    live: Vec<(Proc, u32)>,
    gone: Vec<Proc>,
    kills: u32,
    started: u32,
}

impl Fleet {
    /// One worker per URL (slot), delivering to the receiver at `addr`.
    fn start(name: &'static str, urls: Vec<String>, addr: &str) -> Self {
        let mut fleet = Self {
            name,
            urls,
            addr: addr.to_owned(),
            live: Vec::new(),
            gone: Vec::new(),
            kills: 0,
            started: 0,
        };
        fleet.live = (0..fleet.urls.len()).map(|slot| (fleet.spawn(slot, 0), 0)).collect();
        fleet
    }

    fn spawn(&mut self, slot: usize, generation: u32) -> Proc {
        let id = format!("{}-w{slot}-g{generation}", self.name);
        let lease = LEASE_SECS.to_string();
        self.started += 1;
        Proc::spawn(
            &id,
            &[
                "--db",
                &self.urls[slot],
                "worker",
                "--id",
                &id,
                "--lease-secs",
                &lease,
                "--poll-secs",
                "1",
                "--batch",
                "1",
                "--step-timeout-secs",
                "8",
                "--http-allow",
                &self.addr,
            ],
        )
    }

    /// Kills (SIGKILL) a drawn worker and starts its replacement.
    fn kill_one(&mut self, draws: &Draws) {
        let slot = draws.below(self.live.len() as u64) as usize;
        if !self.live[slot].0.try_signal("KILL") {
            return; // it exited on its own
        }
        let generation = self.live[slot].1 + 1;
        let replacement = self.spawn(slot, generation);
        let (mut killed, _) = std::mem::replace(&mut self.live[slot], (replacement, generation));
        let _ = killed.child.wait();
        killed.killed = true;
        self.kills += 1;
        self.gone.push(killed);
    }

    /// Stops every live worker (SIGTERM) and waits (bounded) for each to exit
    /// cleanly; answers every worker that ran, or what went wrong.
    fn stop(&mut self) -> Result<Vec<Proc>, String> {
        for (worker, _) in &self.live {
            worker.signal("TERM");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut workers = std::mem::take(&mut self.gone);
        for (mut worker, _) in self.live.drain(..) {
            while worker.running() {
                if Instant::now() > deadline {
                    return Err(format!("worker {} did not stop on SIGTERM", worker.id));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let status = worker.child.wait().unwrap();
            if !status.success() {
                return Err(format!("worker {} exited {status}: {}", worker.id, worker.out.stderr()));
            }
            workers.push(worker);
        }
        Ok(workers)
    }
}

/// What the test's enqueues met.
#[derive(Debug, Default)]
struct Produced {
    /// (n, attempt) for every acknowledged enqueue.
    acked: Vec<(usize, AttemptId)>,
    /// Enqueues answered "outcome unknown", then tried again under their key.
    in_doubt: u32,
    /// Enqueues answered "unavailable", then tried again.
    unavailable: u32,
    /// Enqueues whose retry answered the attempt an earlier try had created.
    answered_again: u32,
    /// Enqueues that failed for good: (n, error).
    failed: Vec<(usize, String)>,
}

/// Enqueues one attempt of each plan under the key `failover-N`, `PACE` apart,
/// trying each again under its key while the answer is transient; counts in
/// `done` how many have been answered.
async fn produce<L: Ledger>(ledger: L, plans: Vec<PlanId>, done: Arc<AtomicUsize>) -> Produced {
    let mut produced = Produced::default();
    for (n, plan) in plans.iter().enumerate() {
        let request = || EnqueueRequest::new(Action::Execute).keyed(Some(format!("failover-{n}")));
        let started = Instant::now();
        let mut tried_before = false;
        loop {
            match ledger.enqueue_with(plan, request()).await {
                Ok(enqueued) => {
                    produced.answered_again += u32::from(tried_before && !enqueued.created);
                    produced.acked.push((n, enqueued.record.attempt.id));
                    break;
                }
                Err(e) if e.is_transient() && started.elapsed() < ENQUEUE_DEADLINE => {
                    match e {
                        LedgerError::Ambiguous(_) => produced.in_doubt += 1,
                        _ => produced.unavailable += 1,
                    }
                    tried_before = true;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    produced.failed.push((n, e.to_string()));
                    break;
                }
            }
        }
        done.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(PACE).await;
    }
    produced
}

/// The figures a run prints.
#[derive(Debug, Default)]
struct Figures {
    db_faults: Vec<String>,
    worker_kills: u32,
    workers_started: u32,
    takeovers: u64,
    refusals: u64,
    worker_lines_in_doubt: u64,
    worker_lines_unavailable: u64,
    listening_again_ms: Option<u64>,
    keys: usize,
}

/// One cluster's run.
struct Failover<'a> {
    name: &'static str,
    seeded: procs::Seeded,
    runtime: &'a tokio::runtime::Runtime,
}

impl<'a> Failover<'a> {
    fn new(name: &'static str, runtime: &'a tokio::runtime::Runtime) -> Self {
        let seeded = procs::Seeded::new(
            "LEASEHOLD_FAILOVER_SEED",
            format!("failover ({name})"),
            "LEASEHOLD_TEST_FAILOVER=1 cargo test -p leasehold --features cli --test db_failover",
        );
        Self { name, seeded, runtime }
    }

    fn run<C: Cluster, L: Ledger + Clone + 'static>(&self, mut cluster: C, ledger: L) {
        let started = Instant::now();
        let draws = Draws(SeededEntropy::new(self.seeded.seed));
        let store = tempfile::tempdir().unwrap();
        let target_db = format!("sqlite://{}", store.path().join("target.db").display());
        let delay = TARGET_DELAY_MS.to_string();
        let target = Proc::spawn(
            "target",
            &[
                "--db",
                &target_db,
                "target",
                "--listen",
                "127.0.0.1:0",
                "--delay-ms",
                &delay,
            ],
        );
        let listening = target.wait_for_line("listening on http://", Duration::from_secs(30));
        let addr = listening.rsplit("http://").next().unwrap().trim().to_owned();
        let plans: Vec<PlanId> = (0..ATTEMPTS)
            .map(|n| {
                let spec = outcome::plan(self.name, n, &addr);
                self.runtime
                    .block_on(ledger.register_plan(spec, &["http:v1"]))
                    .unwrap()
                    .id
            })
            .collect();
        let mut fleet = Fleet::start(self.name, (0..WORKERS).map(|s| cluster.worker_url(s)).collect(), &addr);
        let mut figures = Figures::default();
        let mut wake = self.runtime.block_on(async { ledger.wake() });
        let done = Arc::new(AtomicUsize::new(0));
        let producer = self
            .runtime
            .spawn(produce(ledger.clone(), plans.clone(), Arc::clone(&done)));
        for round in 0..cluster.rounds() {
            self.await_enqueues(&done, ATTEMPTS * (round + 1) / (cluster.rounds() + 2));
            figures.db_faults.push(cluster.fail(&draws));
            if let Some(wake) = &mut wake {
                // What the listener heard from the database that just went down.
                wake.borrow_and_update();
            }
            // While it is down: pace, then kill one worker and replace it.
            std::thread::sleep(draws.ms(300, 1_500));
            fleet.kill_one(&draws);
            std::thread::sleep(draws.ms(200, 1_500));
            figures.db_faults.push(cluster.recover());
        }
        if let Some(wake) = &mut wake {
            figures.listening_again_ms = Some(self.listening_again(wake));
        }
        let produced = self.runtime.block_on(producer).unwrap();
        self.await_the_end(&ledger);
        let workers = fleet.stop().unwrap_or_else(|problem| self.seeded.fail(&[problem]));
        (figures.worker_kills, figures.workers_started) = (fleet.kills, fleet.started);
        self.check(&ledger, &plans, &produced, &addr, &workers, &mut figures);
        self.report(&figures, &produced, started);
        target.signal("TERM");
    }

    /// Waits (bounded) until `due` of the test's enqueues have been answered: the
    /// database fails while enqueues, claims and deliveries are all in flight.
    fn await_enqueues(&self, done: &AtomicUsize, due: usize) {
        let waiting = Instant::now();
        while done.load(Ordering::SeqCst) < due {
            if waiting.elapsed() > ENQUEUE_DEADLINE {
                self.seeded
                    .fail(&[format!("only {} enqueues answered", done.load(Ordering::SeqCst))]);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every promise, asked of the ledger, the receiver and the workers' logs.
    fn check<L: Ledger>(
        &self,
        ledger: &L,
        plans: &[PlanId],
        produced: &Produced,
        addr: &str,
        workers: &[Proc],
        figures: &mut Figures,
    ) {
        let records = self.check_enqueues(ledger, plans, produced);
        let effects = procs::effects(self.runtime, addr);
        self.seeded.check_all(outcome::ledger_problems(&records));
        self.seeded
            .check_all(outcome::effect_problems(records.iter().map(|(_, r)| r), &effects));
        self.seeded
            .check_all(outcome::receipt_problems(self.runtime, &records, addr, &effects));
        self.seeded.check_all(refusal_problems(&records, workers, figures));
        figures.takeovers = records
            .iter()
            .map(|(_, r)| u64::from(r.command.delivery_count - 1))
            .sum();
        figures.keys = records.iter().map(|(_, r)| r.receipts.len()).sum();
    }

    /// Waits (bounded) for the ledger's wake-ups to have moved since the database
    /// went down: its listener reached the new primary (it bumps once it listens
    /// again, and at every enqueue's `NOTIFY`, which only a listener there hears).
    /// Answers how long after the database came back, in ms.
    fn listening_again(&self, wake: &mut tokio::sync::watch::Receiver<u64>) -> u64 {
        let since = Instant::now();
        let moved = self
            .runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), wake.changed()).await });
        if !matches!(moved, Ok(Ok(()))) {
            self.seeded
                .fail(&["the ledger's listener heard nothing within 30 s of the database coming back".to_owned()]);
        }
        since.elapsed().as_millis() as u64
    }

    /// Waits (bounded) until no attempt is open, asking again while the ledger is
    /// unreachable.
    fn await_the_end<L: Ledger>(&self, ledger: &L) {
        let deadline = Instant::now() + LIVENESS_DEADLINE;
        loop {
            match self.runtime.block_on(ledger.open_attempts()) {
                Ok(0) => return,
                Ok(open) if Instant::now() > deadline => self.seeded.fail(&[format!(
                    "{open} attempts still open {LIVENESS_DEADLINE:?} after the database came back"
                )]),
                Err(e) if Instant::now() > deadline => self.seeded.fail(&[format!("the ledger still answers {e}")]),
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Every acknowledged enqueue exists, and each plan (one key each) has exactly
    /// one attempt: the record of each.
    fn check_enqueues<L: Ledger>(
        &self,
        ledger: &L,
        plans: &[PlanId],
        produced: &Produced,
    ) -> Vec<(usize, AttemptRecord)> {
        let mut problems: Vec<String> = produced
            .failed
            .iter()
            .map(|(n, e)| format!("enqueue {n} failed for good: {e}"))
            .collect();
        let mut records = Vec::new();
        for (n, id) in &produced.acked {
            let history = self.runtime.block_on(ledger.history(&plans[*n])).unwrap();
            match history.as_slice() {
                [record] if record.attempt.id == *id => records.push((*n, record.clone())),
                [] => problems.push(format!(
                    "enqueue {n} was acknowledged as {id}, yet its plan has no attempt"
                )),
                _ => problems.push(format!(
                    "enqueue {n} was acknowledged as {id}, yet its plan has attempts {:?}",
                    history.iter().map(|r| r.attempt.id.to_string()).collect::<Vec<_>>()
                )),
            }
        }
        self.seeded.check_all(problems);
        records
    }

    fn report(&self, figures: &Figures, produced: &Produced, started: Instant) {
        let _ = writeln!(
            std::io::stderr(),
            "failover ({}) seed {}: {ATTEMPTS} attempts of {STEPS} http:v1 steps SUCCEEDED, {} keys applied once; \
             database: {}; {} worker kills ({} processes); {} takeovers, {} stale-token refusals; \
             enqueues: {} in doubt, {} unavailable, {} answered again by key; worker log lines: {} in doubt, \
             {} unavailable; listener heard the new primary after {}; total {:.1} s",
            self.name,
            self.seeded.seed,
            figures.keys,
            figures.db_faults.join(", "),
            figures.worker_kills,
            figures.workers_started,
            figures.takeovers,
            figures.refusals,
            produced.in_doubt,
            produced.unavailable,
            produced.answered_again,
            figures.worker_lines_in_doubt,
            figures.worker_lines_unavailable,
            figures
                .listening_again_ms
                .map_or("- (no listener)".to_owned(), |ms| format!("{ms} ms")),
            started.elapsed().as_secs_f64(),
        );
    }
}

/// Every refusal a worker logged is the stale-token refusal of that attempt's
/// command, and no worker logged a failure; counts refusals and the lines that
/// met a ledger in doubt or unreachable.
fn refusal_problems(records: &[(usize, AttemptRecord)], workers: &[Proc], figures: &mut Figures) -> Vec<String> {
    let stale: Vec<(String, String)> = records
        .iter()
        .map(|(_, r)| {
            (
                format!("attempt {}: ", r.attempt.id),
                format!("write refused (command {} is not held by this lease)", r.command.id),
            )
        })
        .collect();
    let mut problems = Vec::new();
    for worker in workers {
        for line in worker.lines() {
            figures.worker_lines_in_doubt += u64::from(line.contains("outcome unknown"));
            figures.worker_lines_unavailable += u64::from(line.contains("ledger unavailable"));
            let refused = line.contains(": write refused (");
            if refused {
                figures.refusals += 1;
            }
            let expected = stale
                .iter()
                .any(|(attempt, refusal)| line.contains(attempt.as_str()) && line.contains(refusal.as_str()));
            if (refused && !expected) || line.contains(": failed: ") {
                problems.push(format!("{}: {line}", worker.id));
            }
        }
    }
    problems
}
