//! One simulation run: build the world from a seed and a profile, inject faults,
//! heal, require liveness, and check every invariant.
//!
//! Contract: [`run`] is a pure function of its [`RunConfig`] — the seed drives
//! turmoil's RNG, the fault schedule, every clock's skew, the clients' choices and
//! the ledger's ids and tokens; the epoch is pinned. It builds the world on the
//! calling thread (a `Sim` is `!Send`) and plants exactly the configured bugs at
//! the db host's seams ([`crate::bugs`]). The world: a db host, a target host, the
//! profile's worker hosts running the production [`Worker`], an enqueuer and an
//! operator client. The run has a safety phase (faults on) of `safety_ms`; then
//! every fault is healed and every attempt must be terminal within `liveness_ms`. A
//! db failover (`Fault::Failover`) takes the db host down and promotes its replica
//! ([`DbState::fail_over`]) before it comes back up.

use crate::bugs::Bug;
use crate::checker::{self, CheckInput, FaultLog, Violation};
use crate::clients::{self, ClientCtx, ClientLog};
use crate::clock::{ClockParams, DbClock, SimClock, EPOCH_MS};
use crate::db::{self, BackendKind, DbState};
use crate::delivery::Timing;
use crate::profile::{FaultParams, Profile, Replication, WorldParams};
use crate::rng::Rng;
use crate::rpc::RpcLedger;
use crate::target::{self, FailureLog, TargetExecutor, TargetState};
use crate::trace::{trace_hash, Trace};
use leasehold::entropy::SeededEntropy;
use leasehold::ledger::LedgerError;
use leasehold::worker::{RunOptions, Worker};
use leasehold_engine::lease::WorkerConfig;
use leasehold_engine::Op;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// What to run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The seed.
    pub seed: u64,
    /// The fault profile.
    pub profile: Profile,
    /// The db host's ledger.
    pub backend: BackendKind,
    /// Bugs to plant.
    pub bugs: Vec<Bug>,
    /// Keep the whole trace in the report.
    pub keep_trace: bool,
}

/// What a run counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Faults injected: crashes, partitions, holds, db restarts and failovers, lost
    /// replies, clock jumps.
    pub faults: u64,
    /// Claims of a command that had been claimed before and not given back since:
    /// its lease had expired, or reconcile had requeued it.
    pub takeovers: u64,
    /// Give-backs that requeued a command after a transient failure.
    pub gave_back: u64,
    /// Worker writes refused because their token was not current.
    pub stale_refused: u64,
    /// Repeated deliveries of a key that the target answered from its record.
    pub duplicates: u64,
    /// Attempts enqueued.
    pub attempts: u64,
    /// Attempts SUCCEEDED.
    pub succeeded: u64,
    /// Attempts FAILED.
    pub failed: u64,
    /// Of those, FAILED exhausted (by deliveries or deadline).
    pub exhausted: u64,
    /// Attempts ABORTED.
    pub aborted: u64,
    /// Simulated time, ms.
    pub sim_ms: u64,
    /// Failovers of the db host to its replica.
    pub failovers: u64,
    /// Committed transactions the failovers lost.
    pub commits_lost: u64,
}

impl Stats {
    /// Adds another run's counts.
    pub fn add(&mut self, o: &Stats) {
        self.faults += o.faults;
        self.takeovers += o.takeovers;
        self.gave_back += o.gave_back;
        self.exhausted += o.exhausted;
        self.stale_refused += o.stale_refused;
        self.duplicates += o.duplicates;
        self.attempts += o.attempts;
        self.succeeded += o.succeeded;
        self.failed += o.failed;
        self.aborted += o.aborted;
        self.sim_ms += o.sim_ms;
        self.failovers += o.failovers;
        self.commits_lost += o.commits_lost;
    }
}

/// How a run went.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// The backend.
    pub backend: BackendKind,
    /// Hash of the event trace.
    pub trace_hash: String,
    /// Invariants broken (empty on a pass).
    pub violations: Vec<Violation>,
    /// Counts.
    pub stats: Stats,
    /// The whole trace, if asked for.
    pub trace: Vec<String>,
}

/// A fault the driver applies between steps.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fault {
    Crash {
        worker: String,
        silent: bool,
    },
    Restart {
        worker: String,
        silent: bool,
    },
    Partition {
        worker: String,
        peer: &'static str,
    },
    Repair {
        worker: String,
        peer: &'static str,
    },
    Hold {
        worker: String,
        peer: &'static str,
    },
    Release {
        worker: String,
        peer: &'static str,
    },
    CrashDb,
    RestartDb,
    /// The db host goes down and comes back as its replica (at the next
    /// `RestartDb`), which lacks the last `lost` commits and whose clock reads
    /// `offset_ms` more.
    Failover {
        lost: u64,
        offset_ms: i64,
    },
}

impl Fault {
    fn is_start(&self) -> bool {
        matches!(
            self,
            Fault::Crash { .. }
                | Fault::Partition { .. }
                | Fault::Hold { .. }
                | Fault::CrashDb
                | Fault::Failover { .. }
        )
    }

    fn describe(&self) -> String {
        match self {
            Fault::Crash { worker, silent: false } => format!("crash {worker}"),
            Fault::Crash { worker, silent: true } => format!("silent crash {worker} (partitioned first)"),
            Fault::Restart { worker, .. } => format!("restart {worker}"),
            Fault::Partition { worker, peer } => format!("partition {worker} <-> {peer}"),
            Fault::Repair { worker, peer } => format!("repair {worker} <-> {peer}"),
            Fault::Hold { worker, peer } => format!("hold {worker} <-> {peer}"),
            Fault::Release { worker, peer } => format!("release {worker} <-> {peer}"),
            Fault::CrashDb => "crash db".into(),
            Fault::RestartDb => "restart db".into(),
            Fault::Failover { lost, offset_ms } => {
                format!("fail over db to its replica (clock {offset_ms:+} ms, lacks {lost} commit(s))")
            }
        }
    }
}

/// Everything the seed decides before the run starts.
struct Schedule {
    faults: Vec<(u64, Fault)>,
    worker_clocks: Vec<ClockParams>,
    db_clock: ClockParams,
    operator: Vec<(u64, bool)>,
}

fn skewed_clock(rng: &mut Rng, p: &Profile) -> ClockParams {
    let c = &p.clocks;
    let jumps = (0..rng.range(c.jumps[0], c.jumps[1]))
        .map(|_| (rng.range(0, p.world.safety_ms), rng.signed(c.jump_ms_max)))
        .collect();
    ClockParams {
        offset_ms: rng.signed(c.offset_ms_max),
        drift_ppm: rng.signed(c.drift_ppm_max),
        jumps,
    }
}

fn plan_run(seed: u64, p: &Profile) -> Schedule {
    let mut rng = Rng::new(seed, "faults");
    let mut faults: Vec<(u64, Fault)> = (0..p.world.workers)
        .flat_map(|i| worker_episodes(&mut rng, &format!("w{}", i + 1), p))
        .collect();
    let restarts = db_restarts(&mut rng, p);
    faults.extend(db_failovers(seed, p, &restarts));
    faults.extend(restarts);
    // A stable sort keeps each worker's episode order for equal instants.
    faults.sort_by_key(|(at, _)| *at);
    let (worker_clocks, db_clock) = clocks(seed, p);
    Schedule {
        faults,
        worker_clocks,
        db_clock,
        operator: operator_schedule(seed, p),
    }
}

/// One worker's fault episodes during the safety phase, each a start and (if it
/// comes before the heal) an end, separated by drawn gaps.
fn worker_episodes(rng: &mut Rng, worker: &str, p: &Profile) -> Vec<(u64, Fault)> {
    let (safety, f) = (p.world.safety_ms, &p.faults);
    let mut faults = Vec::new();
    let mut t = rng.range(f.episode_gap_ms[0], f.episode_gap_ms[1]);
    while f.weights.total() > 0 && t < safety {
        let ((start, end), range) = draw_episode(rng, worker, f);
        let duration = rng.range(range[0], range[1]);
        faults.push((t, start));
        if t + duration < safety {
            faults.push((t + duration, end));
        }
        t += duration + rng.range(f.episode_gap_ms[0], f.episode_gap_ms[1]);
    }
    faults
}

/// An episode of `worker` drawn by the profile's weights: its start and end fault,
/// and the range its duration is drawn from.
fn draw_episode(rng: &mut Rng, worker: &str, f: &FaultParams) -> ((Fault, Fault), [u64; 2]) {
    let w = &f.weights;
    let mut roll = rng.range(0, u64::from(w.total()) - 1);
    let mut pick = |weight: u32| {
        let hit = roll < u64::from(weight);
        roll = roll.saturating_sub(u64::from(weight));
        hit
    };
    if pick(w.crash) {
        (crash_episode(worker, false), f.crash_ms)
    } else if pick(w.silent_crash) {
        (crash_episode(worker, true), f.crash_ms)
    } else if pick(w.partition_db) {
        (partition_episode(worker, "db"), f.partition_ms)
    } else if pick(w.partition_target) {
        (partition_episode(worker, "target"), f.partition_ms)
    } else if pick(w.hold_db) {
        (hold_episode(worker, "db"), f.hold_ms)
    } else {
        (hold_episode(worker, "target"), f.hold_ms)
    }
}

fn crash_episode(worker: &str, silent: bool) -> (Fault, Fault) {
    let worker = worker.to_owned();
    (
        Fault::Crash {
            worker: worker.clone(),
            silent,
        },
        Fault::Restart { worker, silent },
    )
}

fn partition_episode(worker: &str, peer: &'static str) -> (Fault, Fault) {
    let worker = worker.to_owned();
    (
        Fault::Partition {
            worker: worker.clone(),
            peer,
        },
        Fault::Repair { worker, peer },
    )
}

fn hold_episode(worker: &str, peer: &'static str) -> (Fault, Fault) {
    let worker = worker.to_owned();
    (
        Fault::Hold {
            worker: worker.clone(),
            peer,
        },
        Fault::Release { worker, peer },
    )
}

/// The db host's crashes and restarts, each wholly inside the safety phase and after
/// the previous one.
fn db_restarts(rng: &mut Rng, p: &Profile) -> Vec<(u64, Fault)> {
    let (safety, f) = (p.world.safety_ms, &p.faults);
    let mut faults = Vec::new();
    let mut db_free_from = safety / 10;
    for _ in 0..rng.range(f.db_restarts[0], f.db_restarts[1]) {
        let at = rng.range(db_free_from, safety * 9 / 10);
        let down = rng.range(f.db_down_ms[0], f.db_down_ms[1]);
        if at + down >= safety {
            continue;
        }
        faults.push((at, Fault::CrashDb));
        faults.push((at + down, Fault::RestartDb));
        db_free_from = at + down + 1;
    }
    faults
}

/// The db host's failovers to its replica, each a [`Fault::Failover`] and the
/// restart that brings the replica up (`db_down_ms` later), wholly inside the
/// safety phase, after the previous one, and clear of every db restart (a draw that
/// would overlap one is skipped). From a stream of their own, so that a profile
/// without failovers draws everything else as before.
fn db_failovers(seed: u64, p: &Profile, restarts: &[(u64, Fault)]) -> Vec<(u64, Fault)> {
    let (safety, f) = (p.world.safety_ms, &p.faults);
    let mut rng = Rng::new(seed, "failovers");
    let busy: Vec<(u64, u64)> = restarts.chunks(2).map(|c| (c[0].0, c[c.len() - 1].0)).collect();
    let mut faults = Vec::new();
    let mut free_from = safety / 10;
    for _ in 0..rng.range(f.db_failovers[0], f.db_failovers[1]) {
        let at = rng.range(free_from, safety * 9 / 10);
        let down = rng.range(f.db_down_ms[0], f.db_down_ms[1]);
        let lost = match f.replication {
            Replication::Sync => 0,
            Replication::Async => rng.range(0, f.max_lost_commits),
        };
        let offset_ms = rng.signed(f.replica_clock_offset_ms_max);
        let clear = busy.iter().all(|(a, b)| at + down < *a || at > *b);
        if at + down >= safety || !clear {
            continue;
        }
        faults.push((at, Fault::Failover { lost, offset_ms }));
        faults.push((at + down, Fault::RestartDb));
        free_from = at + down + 1;
    }
    faults
}

/// Every worker's clock, then the db host's: skewed if the profile skews clocks.
fn clocks(seed: u64, p: &Profile) -> (Vec<ClockParams>, ClockParams) {
    let mut clocks = Rng::new(seed, "clocks");
    let skewed = p.clocks.offset_ms_max + p.clocks.drift_ppm_max + p.clocks.jumps[1] > 0;
    let worker_clocks = (0..p.world.workers)
        .map(|_| {
            if skewed {
                skewed_clock(&mut clocks, p)
            } else {
                ClockParams::default()
            }
        })
        .collect();
    let db_clock = if skewed && p.clocks.db {
        skewed_clock(&mut clocks, p)
    } else {
        ClockParams::default()
    };
    (worker_clocks, db_clock)
}

/// The operator's actions: when, and whether each is an abort (else a reconcile).
fn operator_schedule(seed: u64, p: &Profile) -> Vec<(u64, bool)> {
    let (safety, c) = (p.world.safety_ms, &p.clients);
    let mut ops = Rng::new(seed, "operator-schedule");
    let mut operator: Vec<(u64, bool)> = (0..ops.range(c.operator_actions[0], c.operator_actions[1]))
        .map(|_| (ops.range(safety / 10, safety * 95 / 100), ops.chance(c.abort_share)))
        .collect();
    operator.sort_by_key(|(at, _)| *at);
    operator
}

fn apply_fault(sim: &mut turmoil::Sim<'_>, fault: &Fault) {
    match fault {
        Fault::Crash { worker, silent } => {
            if *silent {
                sim.partition(worker.as_str(), "db");
                sim.partition(worker.as_str(), "target");
            }
            sim.crash(worker.as_str());
        }
        Fault::Restart { worker, silent } => {
            if *silent {
                sim.repair(worker.as_str(), "db");
                sim.repair(worker.as_str(), "target");
            }
            sim.bounce(worker.as_str());
        }
        Fault::Partition { worker, peer } => sim.partition(worker.as_str(), *peer),
        Fault::Repair { worker, peer } => sim.repair(worker.as_str(), *peer),
        Fault::Hold { worker, peer } => sim.hold(worker.as_str(), *peer),
        Fault::Release { worker, peer } => sim.release(worker.as_str(), *peer),
        Fault::CrashDb | Fault::Failover { .. } => sim.crash("db"),
        Fault::RestartDb => sim.bounce("db"),
    }
}

/// The clock a worker's timers run on: its own, except that the planted
/// `late-heartbeat` runs it at a tenth of true speed, so every deadline the
/// driver sets (the heartbeat first) comes ten times late in simulated time. The
/// schedule keeps the drawn clock: the checker sees no skew.
fn timer_clock(params: &ClockParams, bugs: &[Bug]) -> ClockParams {
    let mut params = params.clone();
    if bugs.contains(&Bug::LateHeartbeat) {
        params.drift_ppm -= 900_000;
    }
    params
}

/// How long after a call that got no success the planted
/// `executor-retries-detached` sends it again.
pub const DETACHED_RETRY_MS: u64 = 4_000;

/// The most a clock may drift (parts per million) and still not excuse a lost
/// lease: a heartbeat due at a third of the lease then still lands inside it.
pub const DRIFT_BOUND_PPM: i64 = 500_000;

/// What touched each worker during the run (invariant 13): its fault episodes, each
/// lasting one lease past its end (a retry may still be waiting), db restarts (every
/// worker), clocks beyond the bound or that jump (the whole run), and the executors'
/// transient failures. An episode still open at the heal ends at `heal_ms`.
fn fault_log(plan: &Schedule, heal_ms: u64, lease_ms: u64, failures: &FailureLog) -> FaultLog {
    let mut log = FaultLog::default();
    let mut open: BTreeMap<String, u64> = BTreeMap::new();
    for (at, fault) in &plan.faults {
        let who = match fault {
            Fault::CrashDb | Fault::RestartDb | Fault::Failover { .. } => "*".to_owned(),
            Fault::Crash { worker, .. } | Fault::Restart { worker, .. } => worker.clone(),
            Fault::Partition { worker, .. } | Fault::Repair { worker, .. } => worker.clone(),
            Fault::Hold { worker, .. } | Fault::Release { worker, .. } => worker.clone(),
        };
        if fault.is_start() {
            open.insert(who, *at);
        } else if let Some(from) = open.remove(&who) {
            log.windows.push((who, from, at + lease_ms));
        }
    }
    log.windows
        .extend(open.into_iter().map(|(who, from)| (who, from, heal_ms + lease_ms)));
    let beyond = |c: &ClockParams| !c.jumps.is_empty() || c.drift_ppm.abs() > DRIFT_BOUND_PPM;
    let clocks = plan
        .worker_clocks
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("w{}", i + 1), c));
    for (who, c) in clocks.chain(std::iter::once(("*".to_owned(), &plan.db_clock))) {
        if beyond(c) {
            log.windows.push((who, 0, u64::MAX));
        }
    }
    log.executor_failures = failures.lock().unwrap_or_else(|e| e.into_inner()).clone();
    log
}

fn elapsed_ms(sim: &turmoil::Sim<'_>) -> u64 {
    u64::try_from(sim.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The hosts' shared state: what the driver switches and the checker reads.
struct Hosts {
    db: Rc<RefCell<DbState>>,
    target: Rc<RefCell<TargetState>>,
    clients: Rc<RefCell<ClientLog>>,
    failures: FailureLog,
}

/// How a driven run ended.
#[derive(Default)]
struct Ending {
    /// A simulation error, as invariant 0.
    violations: Vec<Violation>,
    /// Fault episodes started.
    faults_applied: u64,
    /// Why the world did not converge after the heal, if it did not.
    liveness: Option<String>,
    /// Simulated time at the end.
    sim_ms: u64,
}

/// Runs one seed and checks it.
pub fn run(config: &RunConfig) -> RunReport {
    let plan = plan_run(config.seed, &config.profile);
    let trace = Trace::new();
    trace_header(config, &plan, &trace);
    let w = &config.profile.world;
    let mut sim = build_sim(config.seed, w);
    let hosts = match open_hosts(config, &plan, &trace) {
        Ok(hosts) => hosts,
        Err(e) => return unopened(config, &e),
    };
    start_hosts(&mut sim, config, &plan, &trace, &hosts);
    let ending = drive(&mut sim, &plan, w, &hosts, &trace);
    trace.line_at(ending.sim_ms, "sim", "end");
    drop(sim);
    report(config, &plan, &hosts, &trace, ending)
}

/// The trace's first lines: what runs, and every clock that is not true.
fn trace_header(config: &RunConfig, plan: &Schedule, trace: &Trace) {
    trace.line_at(
        0,
        "sim",
        format!(
            "seed {} profile {} backend {} bugs [{}]",
            config.seed,
            config.profile.name,
            config.backend.name(),
            config.bugs.iter().map(|b| b.name()).collect::<Vec<_>>().join(", ")
        ),
    );
    for (i, c) in plan.worker_clocks.iter().enumerate().filter(|(_, c)| !c.is_true()) {
        trace.line_at(0, "sim", format!("w{} clock: {c:?}", i + 1));
    }
    if !plan.db_clock.is_true() {
        trace.line_at(0, "sim", format!("db clock: {:?}", plan.db_clock));
    }
}

/// The turmoil world: seeded, its epoch pinned, long enough for both phases.
fn build_sim<'a>(seed: u64, w: &WorldParams) -> turmoil::Sim<'a> {
    turmoil::Builder::new()
        .rng_seed(seed)
        .epoch(UNIX_EPOCH + Duration::from_millis(u64::try_from(EPOCH_MS).unwrap_or(0)))
        .tick_duration(Duration::from_millis(w.tick_ms.max(1)))
        .simulation_duration(Duration::from_millis(w.safety_ms + w.liveness_ms + 60_000))
        .min_message_latency(Duration::from_millis(w.latency_ms[0]))
        .max_message_latency(Duration::from_millis(w.latency_ms[1].max(w.latency_ms[0])))
        .build()
}

/// The db host's ledger (with the planted bugs), the target's state and the
/// clients' log.
fn open_hosts(config: &RunConfig, plan: &Schedule, trace: &Trace) -> Result<Hosts, LedgerError> {
    let (seed, p) = (config.seed, &config.profile);
    let db_clock = Arc::new(DbClock::new(plan.db_clock.clone()));
    let entropy = Arc::new(SeededEntropy::new(seed ^ 0x6c65_6173_6568_6f6c));
    let mut db = DbState::new(
        config.backend,
        db_clock,
        entropy,
        trace.clone(),
        seed,
        p.faults.db_reply_loss,
        &config.bugs,
    )?;
    db.set_limits(&target_limits(&p.world))?;
    if p.faults.db_failovers[1] > 0 {
        db.keep_journal();
    }
    let target = TargetState::new(seed, p.faults.target_reply_loss, p.world.target_slowdown, trace.clone());
    Ok(Hosts {
        db: Rc::new(RefCell::new(db)),
        target: Rc::new(RefCell::new(target)),
        clients: Rc::new(RefCell::new(ClientLog::default())),
        failures: FailureLog::default(),
    })
}

/// The per-target limits the profile sets on the db host's ledger.
fn target_limits(w: &WorldParams) -> Vec<leasehold_engine::limits::TargetLimit> {
    w.limits.iter().map(crate::profile::LimitParams::to_limit).collect()
}

/// The report of a run whose ledger could not be opened.
fn unopened(config: &RunConfig, e: &LedgerError) -> RunReport {
    RunReport {
        seed: config.seed,
        backend: config.backend,
        trace_hash: String::new(),
        violations: vec![Violation {
            invariant: 0,
            message: format!("cannot open the ledger: {e}"),
        }],
        stats: Stats::default(),
        trace: Vec::new(),
    }
}

/// Puts the db and target hosts, the workers and the clients into the world.
fn start_hosts(sim: &mut turmoil::Sim<'_>, config: &RunConfig, plan: &Schedule, trace: &Trace, hosts: &Hosts) {
    {
        let (state, trace) = (Rc::clone(&hosts.db), trace.clone());
        sim.host("db", move || db::serve(Rc::clone(&state), trace.clone()));
    }
    {
        let state = Rc::clone(&hosts.target);
        sim.host("target", move || target::serve(Rc::clone(&state)));
    }
    for (i, params) in plan.worker_clocks.iter().enumerate() {
        let params = timer_clock(params, &config.bugs);
        start_worker(
            sim,
            format!("w{}", i + 1),
            params,
            &config.profile.world,
            trace,
            (
                &hosts.failures,
                config.bugs.contains(&Bug::ExecutorRetriesDetached),
                i < config.profile.world.durable_only_workers as usize,
            ),
        );
    }
    let w = &config.profile.world;
    let ctx = ClientCtx {
        log: Rc::clone(&hosts.clients),
        trace: trace.clone(),
        seed: config.seed,
        safety_ms: w.safety_ms,
        rpc_timeout_ms: w.rpc_timeout_ms,
    };
    sim.client(
        "enqueuer",
        clients::enqueuer(ctx.clone(), config.profile.clients.clone()),
    );
    sim.client("operator", clients::operator(ctx, plan.operator.clone()));
}

/// A worker host running the production [`Worker`] on its own clock, over the RPC
/// ledger and the target executor (without the sandbox for a `durable_only` worker
/// of a mixed fleet).
fn start_worker(
    sim: &mut turmoil::Sim<'_>,
    name: String,
    params: ClockParams,
    w: &WorldParams,
    trace: &Trace,
    (failures, detached, durable_only): (&FailureLog, bool, bool),
) {
    let config_w = WorkerConfig::clamped(true, w.poll_interval_ms, w.batch_size, w.lease_ms);
    let (trace, failures) = (trace.clone(), failures.clone());
    let (rpc_timeout_ms, target_timeout_ms) = (w.rpc_timeout_ms, w.target_timeout_ms);
    sim.host(name.clone(), move || {
        let (name, trace, params) = (name.clone(), trace.clone(), params.clone());
        let failures = failures.clone();
        async move {
            let clock = Arc::new(SimClock::new(params));
            let ledger = Arc::new(RpcLedger::new(name.clone(), Arc::clone(&clock), rpc_timeout_ms));
            let mut executor = TargetExecutor::new(name.clone(), target_timeout_ms).recording(failures);
            if detached {
                executor = executor.retrying_detached(DETACHED_RETRY_MS);
            }
            if durable_only {
                executor = executor.durable_only();
            }
            let executor = Arc::new(executor);
            trace.line(&name, "worker up");
            let (t, n) = (trace.clone(), name.clone());
            let worker = Worker::new(name, ledger, executor, clock, config_w).on_event(move |e| t.line(&n, e));
            worker.run(std::future::pending::<()>(), RunOptions::default()).await;
            Ok(())
        }
    });
}

/// Steps the world tick by tick: applies each fault at its instant, heals at the end
/// of the safety phase, and then ends at the first tick where the world converged
/// or at the liveness bound.
fn drive(sim: &mut turmoil::Sim<'_>, plan: &Schedule, w: &WorldParams, hosts: &Hosts, trace: &Trace) -> Ending {
    let mut ending = Ending::default();
    let mut next = 0usize;
    let mut healed = false;
    loop {
        let now = elapsed_ms(sim);
        while next < plan.faults.len() && plan.faults[next].0 <= now {
            apply_due_fault(sim, &plan.faults[next].1, hosts, trace, &mut ending);
            next += 1;
        }
        if !healed && now >= w.safety_ms {
            heal(sim, w.workers, trace, now);
            hosts.db.borrow_mut().faults_on = false;
            hosts.target.borrow_mut().faults_on = false;
            healed = true;
        }
        if let Err(e) = sim.step() {
            ending.violations.push(Violation {
                invariant: 0,
                message: format!("simulation error: {e}"),
            });
            break;
        }
        // Liveness is checked after every tick: the run ends at the first tick where
        // the clients are done and every attempt is terminal, or fails at the bound.
        if healed {
            if let ControlFlow::Break(liveness) = converged(hosts, now, w) {
                ending.liveness = liveness;
                break;
            }
        }
    }
    ending.sim_ms = elapsed_ms(sim);
    ending
}

/// Applies one fault that is due; a failover also promotes the db host's replica
/// (a replica that cannot be built is invariant 0).
fn apply_due_fault(sim: &mut turmoil::Sim<'_>, fault: &Fault, hosts: &Hosts, trace: &Trace, ending: &mut Ending) {
    let now = elapsed_ms(sim);
    trace.line_at(now, "sim", fault.describe());
    apply_fault(sim, fault);
    ending.faults_applied += u64::from(fault.is_start());
    if let Fault::Failover { lost, offset_ms } = fault {
        match hosts.db.borrow_mut().fail_over(*lost, *offset_ms) {
            Ok(line) => trace.line_at(now, "db", line),
            Err(e) => ending.violations.push(Violation {
                invariant: 0,
                message: format!("the db host's failover failed: {e}"),
            }),
        }
    }
}

/// Whether a healed world is done at `now`: `Break(None)` once the clients are done
/// and every attempt is terminal, `Break(why)` at the liveness bound, else
/// `Continue`.
fn converged(hosts: &Hosts, now: u64, w: &WorldParams) -> ControlFlow<Option<String>> {
    let clients_done = {
        let l = hosts.clients.borrow();
        l.enqueuer_done && l.operator_done
    };
    let db = hosts.db.borrow();
    let any_open = db.latest.values().any(|s| !s.record.attempt.status.is_terminal());
    if clients_done && !any_open {
        return ControlFlow::Break(None);
    }
    if now < w.safety_ms + w.liveness_ms {
        return ControlFlow::Continue(());
    }
    let open: Vec<String> = db
        .latest
        .values()
        .filter(|s| !s.record.attempt.status.is_terminal())
        .map(|s| format!("{} ({})", s.record.attempt.id, s.record.attempt.status))
        .collect();
    ControlFlow::Break(Some(if clients_done {
        format!(
            "{} attempts not terminal {} ms after healing: {}",
            open.len(),
            w.liveness_ms,
            open.join(", ")
        )
    } else {
        format!("the clients did not finish within {} ms after healing", w.liveness_ms)
    }))
}

/// Checks what the hosts recorded and reports: the violations (each also a trace
/// line), the counts and the trace's hash.
fn report(config: &RunConfig, plan: &Schedule, hosts: &Hosts, trace: &Trace, ending: Ending) -> RunReport {
    let w = &config.profile.world;
    let db = hosts.db.borrow();
    let tgt = hosts.target.borrow();
    let clients = hosts.clients.borrow();
    let stats = stats(plan, w.safety_ms, &db, &tgt, &ending);
    let mut lines = trace.take();
    let input = CheckInput {
        events: &db.events,
        latest: &db.latest,
        plans: &db.plans,
        target: &tgt,
        clients: &clients,
        liveness: ending.liveness.as_deref(),
        faults: Some(&fault_log(plan, w.safety_ms + w.lease_ms, w.lease_ms, &hosts.failures)),
        timing: Some(&Timing {
            lease_ms: w.lease_ms,
            poll_interval_ms: w.poll_interval_ms,
            rpc_timeout_ms: w.rpc_timeout_ms,
            latency_max_ms: w.latency_ms[1].max(w.latency_ms[0]),
            target_slowdown: w.target_slowdown.max(1),
            end_ms: ending.sim_ms,
        }),
    };
    let mut violations = ending.violations;
    violations.extend(checker::check(&input));
    violations.extend(crate::routing::claims_runnable(&db.events, &db.plans, w));
    violations.extend(crate::limits::check(&db.events, &target_limits(w)));
    violations.extend(crate::traces::carried(input.latest, input.clients, &input.target.calls));
    violations.extend(crate::keys::once(&db.keyed, input.clients));
    violations.extend(crate::ordered::one_at_a_time(&db.events, &db.ordered, &db.latest));
    violations.extend(crate::durability::survives(&db.events, &db.latest));
    for v in &violations {
        lines.push(format!("violation [{}] {}", v.invariant, v.message));
    }
    // Invariant 10 scans the whole trace, violations included, for token text.
    violations.extend(checker::scan_for_tokens(&lines, &db.token_texts()));
    RunReport {
        seed: config.seed,
        backend: config.backend,
        trace_hash: trace_hash(&lines),
        violations,
        stats,
        trace: if config.keep_trace { lines } else { Vec::new() },
    }
}

/// What the run counted: faults (episodes, lost replies and clock jumps during the
/// safety phase), takeovers, stale refusals, duplicates and attempts by outcome.
/// Deliveries after the first that took over a lease lost or requeued (not one
/// given back), and the give-backs that requeued a command.
fn redeliveries(events: &[crate::db::DbEvent]) -> (u64, u64) {
    let mut last: BTreeMap<&leasehold_engine::AttemptId, Op> = BTreeMap::new();
    let (mut takeovers, mut gave_back) = (0, 0);
    for e in events.iter().filter(|e| e.outcome == crate::db::EventOutcome::Applied) {
        let (Some(id), Some(a)) = (&e.attempt, &e.after) else {
            continue;
        };
        if e.is_delivery() && a.record.command.delivery_count >= 2 && last.get(id) != Some(&Op::GiveBack) {
            takeovers += 1;
        }
        if e.op == Op::GiveBack && a.record.command.status == leasehold_engine::CommandStatus::Pending {
            gave_back += 1;
        }
        last.insert(id, e.op);
    }
    (takeovers, gave_back)
}

fn stats(plan: &Schedule, safety_ms: u64, db: &DbState, tgt: &TargetState, ending: &Ending) -> Stats {
    let jumps: u64 = plan
        .worker_clocks
        .iter()
        .chain(std::iter::once(&plan.db_clock))
        .map(|c| c.jumps.iter().filter(|(at, _)| *at < safety_ms).count() as u64)
        .sum();
    let (takeovers, gave_back) = redeliveries(&db.events);
    let mut stats = Stats {
        faults: ending.faults_applied + db.replies_lost + tgt.replies_lost + jumps,
        takeovers,
        gave_back,
        stale_refused: db.events.iter().filter(|e| e.is_stale_refusal()).count() as u64,
        duplicates: tgt.duplicates,
        attempts: db.latest.len() as u64,
        sim_ms: ending.sim_ms,
        failovers: db.failovers,
        commits_lost: db.commits_lost,
        ..Stats::default()
    };
    for s in db.latest.values() {
        let a = &s.record.attempt;
        match a.status {
            leasehold_engine::AttemptStatus::Succeeded => stats.succeeded += 1,
            leasehold_engine::AttemptStatus::Failed => {
                stats.failed += 1;
                stats.exhausted += u64::from(leasehold_engine::Exhaustion::of(a).is_some());
            }
            leasehold_engine::AttemptStatus::Aborted => stats.aborted += 1,
            _ => {}
        }
    }
    stats
}

fn heal(sim: &mut turmoil::Sim<'_>, workers: u32, trace: &Trace, now: u64) {
    trace.line_at(
        now,
        "sim",
        "heal: release holds, repair partitions, restart every host that is down",
    );
    for i in 0..workers {
        let worker = format!("w{}", i + 1);
        for peer in ["db", "target"] {
            sim.release(worker.as_str(), peer);
            sim.repair(worker.as_str(), peer);
        }
        if !sim.is_host_running(worker.as_str()) {
            sim.bounce(worker.as_str());
        }
    }
    if !sim.is_host_running("db") {
        sim.bounce("db");
    }
}
