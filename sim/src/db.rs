//! The db host: a ledger served over `turmoil::net` TCP, and its event log.
//!
//! Contract:
//! - The committed state ([`DbState`]) lives outside the host's factory, in an
//!   `Rc<RefCell<_>>` the factory captures, so a db host restart (crash, then
//!   bounce) keeps what was committed; requests in flight at the crash are lost.
//! - Backends: the memory ledger, or the production SQLite ledger's synchronous
//!   [`SqliteCore`] on `":memory:"`, called inline inside the host's task (never on
//!   `spawn_blocking`, which would stall turmoil's clock). Each request is handled
//!   to completion without an `.await`, so a transition is atomic in simulated time.
//! - Every worker and operator transition, applied or refused, is recorded as a
//!   [`DbEvent`]: the db host's own time, the operation, the attempt, the row images
//!   before and after (with the lease token replaced by an ordinal that stands for
//!   it), and the outcome. The checker proves invariants 1–4, 6, 7, 20–22 and 26 from this log.
//!   Token texts are kept only in a private map, for invariant 10's scan.
//! - Faults: while faults are on, a mutating request may be committed and its reply
//!   dropped (the connection closes without an answer).
//! - Planted bugs ([`crate::bugs`]) live here, at the seams between the workers and
//!   the ledger: a request decided at another `now` (the worker's clock reading, or
//!   just past a live lease), a stale token replaced by the current one, or the
//!   engine's writes rewritten through the ledger's [`WritesHook`] before they are
//!   applied, or a claim run under loosened per-target limits ([`loosened`]).
//!   Without planted bugs none of these seams does anything.
//! - Failover ([`DbState::fail_over`]): while the profile has failovers, the host
//!   journals every mutating request with the instant it was decided at and the
//!   entropy it drew. A failover builds the promoted replica as a fresh ledger of the
//!   same backend and replays the journal into it, minus the last committed
//!   transactions an asynchronous replica lacks; the replica's clock is then off by
//!   the drawn offset, and the host reads every attempt's rows again.

use crate::bugs::Bug;
use crate::clock::{elapsed_ms, DbClock};
use crate::protocol::{read_frame, write_frame, DbEnvelope, DbReply, DbRequest, DbResponse, WireClaimed, WireError};
use crate::rng::Rng;
use crate::trace::Trace;
use leasehold::clock::Clock;
use leasehold::entropy::{Entropy, IdKind};
use leasehold::ledger::memory::MemoryLedger;
use leasehold::ledger::sqlite::SqliteCore;
use leasehold::ledger::WritesHook;
use leasehold::ledger::{Claimed, Ledger, LedgerError};
use leasehold::ledger::{EnqueueRequest, Enqueued};
use leasehold_engine::canonical::{canonical_json, sha256_hex};
use leasehold_engine::limits::TargetLimit;
use leasehold_engine::transition::{is_claimable, next_step};
use leasehold_engine::{
    decide as engine_decide, AttemptId, AttemptRecord, ClaimRequest, CommandStatus, Decision, Exhaustion, Guard, Lease,
    LeaseToken, Op, OperatorRequest, Plan, PlanId, PlanSpec, ReceiptStatus, Recovery, Refusal, Reply, Request,
    RetrySpec, Timestamp, WorkerRequest, Writes,
};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::ops::Range;
use std::pin::pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// The db host's port.
pub const DB_PORT: u16 = 5432;

/// Which ledger the db host serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum BackendKind {
    /// The in-memory reference ledger.
    Memory,
    /// The SQLite ledger's synchronous core on an in-memory database.
    Sqlite,
}

impl BackendKind {
    /// Both backends.
    pub const ALL: &'static [BackendKind] = &[BackendKind::Memory, BackendKind::Sqlite];

    /// `memory` or `sqlite`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Memory => "memory",
            BackendKind::Sqlite => "sqlite",
        }
    }
}

/// The ledger inside the db host.
enum Backend {
    Memory(MemoryLedger),
    Sqlite(SqliteCore),
}

struct NoopWake;

impl Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
}

/// Runs a future that never waits (the memory ledger's methods lock a mutex and
/// return) to completion on the spot.
fn ready<F: Future>(f: F) -> F::Output {
    let waker = Waker::from(Arc::new(NoopWake));
    let mut cx = Context::from_waker(&waker);
    match pin!(f).poll(&mut cx) {
        Poll::Ready(out) => out,
        // The memory ledger holds a std mutex and never awaits: a pending poll
        // would be a bug in this simulator, not a fault to simulate.
        Poll::Pending => panic!("a memory ledger call did not complete at once"),
    }
}

macro_rules! call {
    ($backend:expr, $method:ident($($arg:expr),*)) => {
        match $backend {
            Backend::Memory(m) => ready(m.$method($($arg),*)),
            Backend::Sqlite(s) => s.$method($($arg),*),
        }
    };
}

/// An attempt's rows as the log keeps them: the token replaced by its ordinal.
#[derive(Debug, Clone, PartialEq)]
pub struct Snap {
    /// The rows, with `command.lease_token` always `None`.
    pub record: AttemptRecord,
    /// The ordinal of the command's lease token, if it has one.
    pub token: Option<u32>,
}

/// How a logged request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventOutcome {
    /// The transition was committed.
    Applied,
    /// The ledger refused it; nothing was written.
    Refused(String),
    /// Some other error (not found, unavailable, internal).
    Failed(String),
}

/// One worker or operator transition as the db host saw it.
#[derive(Debug, Clone)]
pub struct DbEvent {
    /// Position in the log.
    pub seq: u64,
    /// Simulated time.
    pub at_ms: u64,
    /// The db host's own clock.
    pub db_now: Timestamp,
    /// The time the ledger decided at (differs only under `lease-on-worker-clock`).
    pub decided_at: Timestamp,
    /// The requesting host.
    pub from: String,
    /// The operation.
    pub op: Op,
    /// The attempt.
    pub attempt: Option<AttemptId>,
    /// The receipt, for step operations.
    pub ordinal: Option<u32>,
    /// The ordinal of the token the request presented (for a claim: the token it
    /// granted).
    pub presented: Option<u32>,
    /// The attempt's rows before.
    pub before: Option<Snap>,
    /// The attempt's rows after.
    pub after: Option<Snap>,
    /// How it ended.
    pub outcome: EventOutcome,
    /// For enqueue: the plan's attempt count before and after.
    pub plan_attempts: Option<(usize, usize)>,
    /// Whether the reply was dropped (a lost reply).
    pub reply_lost: bool,
}

impl DbEvent {
    /// An applied claim that delivered the command: every applied claim but one that
    /// found its attempt exhausted and ended it instead (no lease, no delivery).
    pub fn is_delivery(&self) -> bool {
        self.op.is_claim()
            && self.outcome == EventOutcome::Applied
            && self
                .after
                .as_ref()
                .is_some_and(|a| !a.record.attempt.status.is_terminal())
    }

    /// Refused because the presented token was not the command's current one.
    pub fn is_stale_refusal(&self) -> bool {
        matches!(self.outcome, EventOutcome::Refused(_))
            && self.presented.is_some()
            && self.before.as_ref().is_some_and(|b| b.token != self.presented)
    }
}

/// What the writes seam knows of the request in flight: its operation (and, for a
/// seam that decides it again, the request itself), the planted bugs, each plan,
/// and the token the ledger minted last.
#[derive(Default)]
struct Seam {
    op: Option<Op>,
    request: Option<DbRequest>,
    /// The instant the request is decided at, and the lease it asks for.
    now: Timestamp,
    lease_ms: u64,
    bugs: Vec<Bug>,
    recovery: BTreeMap<PlanId, Recovery>,
    plans: BTreeMap<PlanId, Plan>,
    minted: Arc<Mutex<Option<LeaseToken>>>,
}

impl Seam {
    fn planted(&self, bug: Bug) -> bool {
        self.bugs.contains(&bug)
    }

    /// Planted (`delivery-cap-off-by-one`): the request decided again under its
    /// plan's policy with one delivery more, with the token the claim minted (a
    /// claim) or the one the lease holds (a give-back, whose token the engine found
    /// current).
    fn one_more_delivery(&self, record: &AttemptRecord) -> Option<Decision> {
        let plan = one_more(self.plans.get(&record.attempt.plan_id)?);
        match self.request.as_ref()? {
            DbRequest::Claim(claim) => {
                let token = self.minted.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
                Some(engine_decide(record, Request::Claim(claim, &token, &plan), self.now))
            }
            DbRequest::Worker { request, .. } => {
                let token = record.command.lease_token.clone()?;
                Some(engine_decide(
                    record,
                    Request::Worker(request, &token, Some(&plan)),
                    self.now,
                ))
            }
            _ => None,
        }
    }
}

/// `plan` with every resolved `max_deliveries` (the plan's and each step's) one more:
/// the policy `delivery-cap-off-by-one` decides again under.
pub fn one_more(plan: &Plan) -> Plan {
    let mut p = plan.clone();
    let cap = |code: &str| Some(i64::from(plan.policy(code).max_deliveries) + 1);
    p.retry = Some(RetrySpec {
        max_deliveries: cap(""),
        ..plan.retry.clone().unwrap_or_default()
    });
    for step in &mut p.steps {
        if let Some(r) = &mut step.retry {
            r.max_deliveries = cap(&step.code);
        }
    }
    p
}

/// Planted (`backoff-in-seconds`): a give-back's `available_at` a thousand times
/// as far from now as the engine set it; answers the new instant.
fn stretch_backoff(seam: &Seam, writes: &mut Writes) -> Option<Timestamp> {
    if seam.op != Some(Op::GiveBack) || !seam.planted(Bug::BackoffInSeconds) {
        return None;
    }
    let c = writes.command.as_mut().filter(|c| c.status == CommandStatus::Pending)?;
    c.available_at = seam
        .now
        .plus_ms(c.available_at.millis_since(seam.now).saturating_mul(1_000));
    Some(c.available_at)
}

/// The ledger's entropy, remembering the last token it minted: a claim mints its
/// token just before its decision, so the writes seam can decide it again.
struct Minting {
    inner: Arc<dyn Entropy>,
    last: Arc<Mutex<Option<LeaseToken>>>,
}

impl Entropy for Minting {
    fn next_u64(&self) -> u64 {
        self.inner.next_u64()
    }

    fn id(&self, kind: IdKind) -> String {
        self.inner.id(kind)
    }

    fn token(&self) -> LeaseToken {
        let token = self.inner.token();
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(token.clone());
        token
    }
}

/// The ledger's entropy as a tape: while recording, every draw is kept, so that a
/// failover replays each journaled request with exactly the ids and tokens it drew.
/// Ids and tokens are built from the draws as [`Entropy`]'s defaults build them.
struct Tape {
    inner: Arc<dyn Entropy>,
    state: Mutex<TapeState>,
}

#[derive(Default)]
struct TapeState {
    recording: bool,
    drawn: Vec<u64>,
    replaying: Option<VecDeque<u64>>,
    diverged: bool,
}

impl Tape {
    fn lock(&self) -> std::sync::MutexGuard<'_, TapeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many draws were recorded.
    fn len(&self) -> usize {
        self.lock().drawn.len()
    }

    /// Starts recording.
    fn record(&self) {
        self.lock().recording = true;
    }

    /// Answers the recorded `draws` from now on, instead of drawing.
    fn replay(&self, draws: Range<usize>) {
        let mut s = self.lock();
        let queue = s.drawn.get(draws).unwrap_or_default().iter().copied().collect();
        s.replaying = Some(queue);
    }

    /// Ends a replay: whether every request drew exactly what it had drawn.
    fn replayed(&self) -> bool {
        let mut s = self.lock();
        let exact = !s.diverged && s.replaying.as_ref().is_none_or(VecDeque::is_empty);
        s.replaying = None;
        s.diverged = false;
        exact
    }
}

impl Entropy for Tape {
    fn next_u64(&self) -> u64 {
        let mut s = self.lock();
        if let Some(queue) = &mut s.replaying {
            if let Some(v) = queue.pop_front() {
                return v;
            }
            s.diverged = true;
            return self.inner.next_u64();
        }
        let v = self.inner.next_u64();
        if s.recording {
            s.drawn.push(v);
        }
        v
    }
}

/// One mutating request as the journal keeps it, to replay into a replica.
struct Journaled {
    env: DbEnvelope,
    /// The instant it was decided at.
    decided_at: Timestamp,
    /// Its draws on the [`Tape`].
    draws: Range<usize>,
    /// Whether it committed something (an applied transition, a new plan).
    committed: bool,
    /// The events it logged.
    events: Range<usize>,
}

/// Where a journal that loses its last `lost` commits ends: at the `lost`-th
/// committing request from its end (0 if it has fewer).
fn cut(journal: &[Journaled], lost: u64) -> usize {
    if lost == 0 {
        return journal.len();
    }
    let mut seen = 0;
    for (i, j) in journal.iter().enumerate().rev() {
        seen += u64::from(j.committed);
        if seen == lost {
            return i;
        }
    }
    0
}

/// Puts `r` into `writes` in place of any write of the same receipt.
fn upsert(writes: &mut Writes, r: leasehold_engine::Receipt) {
    match writes.receipts.iter_mut().find(|w| w.ordinal == r.ordinal) {
        Some(slot) => *slot = r,
        None => writes.receipts.push(r),
    }
    writes.receipts.sort_by_key(|w| w.ordinal);
}

/// After a claim's receipt writes were rewritten: nothing is left RUNNING but, for a
/// claim-and-begin, the first step that has not SUCCEEDED.
fn rebegin(record: &AttemptRecord, writes: &mut Writes, begin: bool) {
    let mut image = record.clone();
    writes.apply_to(&mut image);
    let next = if begin { next_step(&image) } else { None };
    let now = writes.command.as_ref().and_then(|c| c.last_heartbeat_at);
    for r in &image.receipts {
        let mut r = r.clone();
        if Some(r.ordinal) == next && r.status == ReceiptStatus::Pending {
            r.status = ReceiptStatus::Running;
            r.started_at = now;
            upsert(writes, r);
        } else if Some(r.ordinal) != next && r.status == ReceiptStatus::Running {
            r.status = ReceiptStatus::Pending;
            r.started_at = None;
            upsert(writes, r);
        }
    }
}

/// The decision seam: replaces the engine's decision as the planted bugs would have
/// decided.
fn decide(seam: &Seam, record: &AttemptRecord, decided: Decision) -> Decision {
    match decided {
        // `heartbeat` without its token check renews whatever lease the row holds,
        // under a guard that only asks for the row as read.
        Err(Refusal::StaleToken { .. })
            if seam.op == Some(Op::Heartbeat) && seam.planted(Bug::HeartbeatIgnoresToken) =>
        {
            let c = &record.command;
            let until = seam.now.plus_ms(seam.lease_ms);
            let mut renewed = c.clone();
            renewed.lease_until = Some(until);
            renewed.last_heartbeat_at = Some(seam.now);
            let writes = Writes {
                guard: Guard::Unchanged {
                    status: c.status,
                    lease_token: c.lease_token.clone(),
                },
                attempt: None,
                command: Some(renewed),
                receipts: Vec::new(),
            };
            Ok((writes, Reply::Renewed { until }))
        }
        Ok((writes, reply @ Reply::Exhausted(Exhaustion::Deliveries))) if seam.planted(Bug::DeliveryCapOffByOne) => {
            seam.one_more_delivery(record).unwrap_or(Ok((writes, reply)))
        }
        Ok((mut writes, mut reply)) => {
            rewrite(seam, record, &mut writes);
            if let Some(until) = stretch_backoff(seam, &mut writes) {
                reply = Reply::GaveBack { until };
            }
            Ok((writes, reply))
        }
        refused => refused,
    }
}

/// The writes seam: rewrites the engine's writes as the planted bugs would have
/// written them.
fn rewrite(seam: &Seam, record: &AttemptRecord, writes: &mut Writes) {
    let recovery = seam
        .recovery
        .get(&record.attempt.plan_id)
        .copied()
        .unwrap_or(Recovery::Resume);
    let takeover = record.command.delivery_count >= 1;
    let claim = seam.op.is_some_and(Op::is_claim);
    let begins = seam.op == Some(Op::ClaimAndBegin);
    let succeeded = || record.receipts.iter().filter(|r| r.status == ReceiptStatus::Succeeded);
    if seam.planted(Bug::ReplayKeepsReceipts)
        && recovery == Recovery::Replay
        && takeover
        && (claim || seam.op == Some(Op::Reconcile))
    {
        for r in succeeded() {
            upsert(writes, r.clone());
        }
        rebegin(record, writes, begins);
    }
    if seam.planted(Bug::ResumeRedeliversSucceeded) && recovery == Recovery::Resume && takeover && claim {
        for r in succeeded() {
            let mut r = r.clone();
            r.status = ReceiptStatus::Pending;
            r.evidence = None;
            r.evidence_sha256 = None;
            r.target_receipt = None;
            r.started_at = None;
            r.finished_at = None;
            upsert(writes, r);
        }
        rebegin(record, writes, begins);
    }
    if seam.planted(Bug::AbortRewritesSucceeded) && seam.op == Some(Op::Abort) {
        let error = writes.attempt.as_ref().and_then(|a| a.error.clone());
        for r in succeeded() {
            let mut r = r.clone();
            r.status = ReceiptStatus::Aborted;
            r.error.clone_from(&error);
            upsert(writes, r);
        }
    }
    if seam.planted(Bug::ReconcileKeepsRunning)
        && seam.op == Some(Op::Reconcile)
        && writes
            .command
            .as_ref()
            .is_some_and(|c| c.status == CommandStatus::Pending)
    {
        writes.receipts.clear();
    }
    if seam.planted(Bug::FingerprintKeepsVolatile) && seam.op.is_some_and(Op::completes_step) {
        for w in &mut writes.receipts {
            let Some(mut evidence) = w
                .evidence
                .as_deref()
                .and_then(|e| serde_json::from_str::<Value>(e).ok())
            else {
                continue;
            };
            let Some(map) = evidence.as_object_mut() else { continue };
            let Some(sandbox) = map.get("sandbox_id").cloned() else {
                continue;
            };
            map.insert("sandbox_name".into(), sandbox);
            let text = canonical_json(&evidence);
            w.evidence_sha256 = Some(sha256_hex(text.as_bytes()));
            w.evidence = Some(text);
        }
    }
}

/// How far ahead of its clock the planted `claim-before-available` decides claims.
pub const CLAIM_AHEAD_MS: u64 = 500;

/// The `now` seam: the instant a planted bug makes the ledger decide a request of
/// `op` at instead of `db_now`, if any. `worker_sent_at` is the clock reading a
/// worker's request carried (`None` for other hosts); `reconciled` the rows of the
/// attempt a reconcile names (`None` for other requests).
pub fn planted_instant(
    bugs: &[Bug],
    (op, worker_sent_at): (Option<Op>, Option<Timestamp>),
    reconciled: Option<&Snap>,
    db_now: Timestamp,
) -> Option<Timestamp> {
    // Planted: decide a reconcile of a live lease just after the lease's end.
    let live_until = reconciled
        .filter(|s| lease_live(s, db_now))
        .and_then(|s| s.record.command.lease_until);
    let claim = op.is_some_and(Op::is_claim);
    match (live_until, worker_sent_at) {
        (Some(until), _) if bugs.contains(&Bug::ReconcileStealsLiveLease) => Some(until.plus_ms(1)),
        _ if claim && bugs.contains(&Bug::ClaimBeforeAvailable) => Some(db_now.plus_ms(CLAIM_AHEAD_MS)),
        (_, Some(sent)) if bugs.contains(&Bug::LeaseOnWorkerClock) => Some(sent),
        _ => None,
    }
}

/// The routing seam: the claim as the ledger takes it. Planted
/// (`claim-ignores-route`): without the worker's capabilities, so that the ledger
/// hands it any claimable command, whatever it can run.
pub fn routed(bugs: &[Bug], request: &ClaimRequest) -> ClaimRequest {
    let mut request = request.clone();
    if bugs.contains(&Bug::ClaimIgnoresRoute) {
        request.capabilities = None;
    }
    request
}

/// The limits seam: `limit` as a planted bug makes the ledger take it for one
/// claim (`limit-ignored` without `max_in_flight`, `rate-ignored` without `rate`,
/// `breaker-ignored` without `breaker`); `None` when no planted bug loosens it.
pub fn loosened(bugs: &[Bug], limit: &TargetLimit) -> Option<TargetLimit> {
    let mut l = limit.clone();
    if bugs.contains(&Bug::LimitIgnored) {
        l.max_in_flight = None;
    }
    if bugs.contains(&Bug::RateIgnored) {
        l.rate = None;
    }
    if bugs.contains(&Bug::BreakerIgnored) {
        l.breaker = None;
    }
    (l != *limit).then_some(l)
}

/// The token seam: whether a planted bug makes the ledger present the command's
/// current token in place of the one a request of `op` carried.
pub fn skips_token_check(bugs: &[Bug], op: Op) -> bool {
    op.completes_step() && bugs.contains(&Bug::CompleteSkipsTokenCheck)
}

/// The decision and writes seams: the engine's decision of a request `op` on
/// `record` at `now` (a heartbeat's lease `lease_ms`; the plan's `recovery`), as the
/// planted `bugs` rewrite it. Without planted bugs, the decision as it was. (The
/// seam that decides a request again, `delivery-cap-off-by-one`, needs the request
/// and the plan, which only the db host keeps: here it leaves the decision as it
/// was.)
pub fn planted_decision(
    bugs: &[Bug],
    (op, now, lease_ms): (Op, Timestamp, u64),
    recovery: Recovery,
    record: &AttemptRecord,
    decided: Decision,
) -> Decision {
    let seam = Seam {
        op: Some(op),
        now,
        lease_ms,
        bugs: bugs.to_vec(),
        recovery: BTreeMap::from([(record.attempt.plan_id.clone(), recovery)]),
        ..Seam::default()
    };
    decide(&seam, record, decided)
}

/// The seams of `bugs`: the seam's state, the ledger's entropy (`tape`, remembering
/// the token it minted last for `delivery-cap-off-by-one`) and the writes hook (none
/// without planted bugs).
fn seams(bugs: &[Bug], tape: Arc<Tape>) -> (Arc<Mutex<Seam>>, Arc<dyn Entropy>, Option<WritesHook>) {
    let minted = Arc::new(Mutex::new(None));
    let entropy: Arc<dyn Entropy> = if bugs.contains(&Bug::DeliveryCapOffByOne) {
        Arc::new(Minting {
            inner: tape,
            last: Arc::clone(&minted),
        })
    } else {
        tape
    };
    let seam = Arc::new(Mutex::new(Seam {
        bugs: bugs.to_vec(),
        minted,
        ..Seam::default()
    }));
    let hook: Option<WritesHook> = (!bugs.is_empty()).then(|| {
        let seam = Arc::clone(&seam);
        let hook: WritesHook = Arc::new(move |record: &AttemptRecord, decided| {
            decide(&seam.lock().unwrap_or_else(|e| e.into_inner()), record, decided)
        });
        hook
    });
    (seam, entropy, hook)
}

/// A fresh, migrated ledger of `kind` deciding on `clock`, minting from `entropy`,
/// its writes through `hook`.
fn open_backend(
    kind: BackendKind,
    clock: Arc<DbClock>,
    entropy: Arc<dyn Entropy>,
    hook: Option<WritesHook>,
) -> Result<Backend, LedgerError> {
    let clock: Arc<dyn Clock> = clock;
    Ok(match kind {
        BackendKind::Memory => {
            let ledger = MemoryLedger::new(clock, entropy);
            Backend::Memory(match hook {
                Some(h) => ledger.with_writes_hook(h),
                None => ledger,
            })
        }
        BackendKind::Sqlite => {
            let mut core = SqliteCore::open(":memory:", clock, entropy)?;
            core.migrate()?;
            if let Some(h) = hook {
                core.set_writes_hook(h);
            }
            Backend::Sqlite(core)
        }
    })
}

/// The db host's durable state and its log. Survives db host restarts.
pub struct DbState {
    backend: Backend,
    /// What builds a fresh ledger like this one (a promoted replica).
    kind: BackendKind,
    entropy: Arc<dyn Entropy>,
    hook: Option<WritesHook>,
    tape: Arc<Tape>,
    /// Every mutating request, while failovers are on ([`DbState::keep_journal`]).
    journal: Option<Vec<Journaled>>,
    /// Replaying the journal: nothing is logged or traced.
    quiet: bool,
    /// The instant the ledger was opened (and migrated) at.
    opened_at: Timestamp,
    seam: Arc<Mutex<Seam>>,
    bugs: Vec<Bug>,
    clock: Arc<DbClock>,
    trace: Trace,
    tokens: BTreeMap<String, u32>,
    rng: Rng,
    /// The limits set on the ledger when the world started.
    limits: Vec<TargetLimit>,
    /// Every transition, in commit order.
    pub events: Vec<DbEvent>,
    /// The latest rows of every attempt.
    pub latest: BTreeMap<AttemptId, Snap>,
    /// Every registered plan.
    pub plans: BTreeMap<PlanId, Plan>,
    /// The attempts enqueues created, each with the enqueue key its request carried
    /// as the db host received it.
    pub keyed: BTreeMap<AttemptId, String>,
    /// The attempts enqueues created with an order key, each with its plan and the
    /// order key its request carried as the db host received it.
    pub ordered: BTreeMap<AttemptId, (PlanId, String)>,
    /// Whether faults (lost replies) are on.
    pub faults_on: bool,
    /// Chance that a mutating request's reply is lost while faults are on.
    pub reply_loss: f64,
    /// Replies dropped so far.
    pub replies_lost: u64,
    /// Failovers so far.
    pub failovers: u64,
    /// Committed transactions the failovers lost.
    pub commits_lost: u64,
}

impl std::fmt::Debug for DbState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbState")
            .field("events", &self.events.len())
            .finish_non_exhaustive()
    }
}

impl DbState {
    /// A fresh, migrated ledger of `kind` deciding on `clock` and minting from
    /// `entropy`, with `bugs` planted at its seams.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: BackendKind,
        clock: Arc<DbClock>,
        entropy: Arc<dyn Entropy>,
        trace: Trace,
        seed: u64,
        reply_loss: f64,
        bugs: &[Bug],
    ) -> Result<Self, LedgerError> {
        let tape = Arc::new(Tape {
            inner: entropy,
            state: Mutex::default(),
        });
        let (seam, entropy, hook) = seams(bugs, tape.clone());
        let backend = open_backend(kind, clock.clone(), Arc::clone(&entropy), hook.clone())?;
        Ok(Self {
            backend,
            kind,
            entropy,
            hook,
            tape,
            journal: None,
            quiet: false,
            opened_at: clock.now(),
            seam,
            bugs: bugs.to_vec(),
            clock,
            trace,
            tokens: BTreeMap::new(),
            rng: Rng::new(seed, "db-replies"),
            limits: Vec::new(),
            events: Vec::new(),
            latest: BTreeMap::new(),
            plans: BTreeMap::new(),
            keyed: BTreeMap::new(),
            ordered: BTreeMap::new(),
            faults_on: true,
            reply_loss,
            replies_lost: 0,
            failovers: 0,
            commits_lost: 0,
        })
    }

    /// Sets each target's `limits` on the ledger ([`Ledger::set_limit`]); the
    /// first it refuses is the error.
    pub fn set_limits(&mut self, limits: &[TargetLimit]) -> Result<(), LedgerError> {
        for limit in limits {
            self.put_limit(limit)?;
            self.trace.line(
                "db",
                format!(
                    "limit {}: max_in_flight {:?}, rate {}, breaker {:?}",
                    limit.target,
                    limit.max_in_flight,
                    limit.rate.map_or_else(|| "none".to_owned(), |r| r.to_string()),
                    limit.breaker
                ),
            );
        }
        self.limits = limits.to_vec();
        Ok(())
    }

    /// Sets `limit` on the ledger, or clears its target's limits if it limits
    /// nothing (a limit loosened of its only field).
    fn put_limit(&self, limit: &TargetLimit) -> Result<(), LedgerError> {
        if limit.max_in_flight.is_none() && limit.rate.is_none() && limit.breaker.is_none() {
            let _cleared: bool = call!(&self.backend, clear_limit(&limit.target))?;
            return Ok(());
        }
        match &self.backend {
            Backend::Memory(m) => ready(m.set_limit(limit.clone())),
            Backend::Sqlite(s) => s.set_limit(limit),
        }
    }

    /// Planted: every limit loosened for the claim about to run ([`loosened`]);
    /// answers the limits to restore after it.
    fn loosen_limits(&self) -> Vec<TargetLimit> {
        let mut restore = Vec::new();
        for limit in &self.limits {
            let Some(loose) = loosened(&self.bugs, limit) else {
                continue;
            };
            if self.put_limit(&loose).is_ok() {
                restore.push(limit.clone());
            }
        }
        restore
    }

    /// The text of every lease token minted so far. Never print these: the checker
    /// uses them only to scan output for leaks.
    pub fn token_texts(&self) -> Vec<String> {
        self.tokens.keys().cloned().collect()
    }

    /// How many lease tokens were minted.
    pub fn tokens_minted(&self) -> usize {
        self.tokens.len()
    }

    fn ordinal_of(&mut self, text: &str) -> u32 {
        let next = u32::try_from(self.tokens.len()).unwrap_or(u32::MAX).saturating_add(1);
        *self.tokens.entry(text.to_owned()).or_insert(next)
    }

    fn known_ordinal(&self, text: &str) -> Option<u32> {
        self.tokens.get(text).copied()
    }

    fn snap(&mut self, mut record: AttemptRecord) -> Snap {
        let token = record.command.lease_token.take().map(|t| self.ordinal_of(t.expose()));
        Snap { record, token }
    }

    /// Logs what a transition that ended the head of an order key did to the
    /// attempts waiting behind it ([`leasehold_engine::order::after_end`], in the
    /// same transaction): each WAITING attempt whose rows changed is read again and
    /// logged as released (its command PENDING) or aborted (blocked).
    fn follow_waiting(&mut self, env: &DbEnvelope, (db_now, decided_at): (Timestamp, Timestamp)) {
        let waiting: Vec<(AttemptId, Snap)> = self
            .latest
            .iter()
            .filter(|(_, s)| s.record.command.status == CommandStatus::Waiting)
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect();
        for (id, before) in waiting {
            let Some(after) = self.read_snap(&id) else { continue };
            if after == before {
                continue;
            }
            let op = match after.record.command.status {
                CommandStatus::Pending => Op::Release,
                _ => Op::Abort,
            };
            self.latest.insert(id.clone(), after.clone());
            let outcome = EventOutcome::Applied;
            self.log(
                (env, op),
                db_now,
                decided_at,
                Some(id),
                None,
                None,
                Some(before),
                Some(after),
                outcome,
                None,
            );
        }
    }

    fn read_snap(&mut self, attempt: &AttemptId) -> Option<Snap> {
        let record: Result<AttemptRecord, LedgerError> = call!(&self.backend, attempt(attempt));
        record.ok().map(|r| self.snap(r))
    }

    fn plan_attempt_count(&self, plan: &PlanId) -> usize {
        let history: Result<Vec<AttemptRecord>, LedgerError> = call!(&self.backend, history(plan));
        history.map_or(0, |h| h.len())
    }

    /// Handles one request; answers the response and whether to drop it (a lost
    /// reply).
    pub fn handle(&mut self, env: DbEnvelope) -> (DbResponse, bool) {
        let db_now = self.clock.own_now();
        let worker_sent_at = env.from.starts_with('w').then_some(env.sent_at);
        let reconciled = match &env.request {
            DbRequest::Operator {
                attempt,
                request: OperatorRequest::Reconcile,
            } => self.latest.get(attempt),
            _ => None,
        };
        if let Some(at) = planted_instant(&self.bugs, (env.request.op(), worker_sent_at), reconciled, db_now) {
            self.clock.decide_at(at);
        }
        self.set_seam(&env.request);
        let decided_at = self.clock.now();
        let mutating = is_mutating(&env.request);
        let marks = (self.events.len(), self.plans.len(), self.tape.len());
        let response = self.dispatch(&env, db_now, decided_at);
        self.clock.clear();
        let lost = mutating && self.faults_on && self.rng.chance(self.reply_loss);
        if lost {
            self.replies_lost += 1;
            for e in &mut self.events[marks.0..] {
                e.reply_lost = true;
            }
            self.trace.line(
                "db",
                format!("{} from {}: committed, reply lost", env.request.name(), env.from),
            );
        }
        if mutating {
            self.journal(env, decided_at, marks, response.is_ok());
        }
        (response, lost)
    }

    /// Tells the writes seam which request is decided next, and at which instant.
    fn set_seam(&self, request: &DbRequest) {
        let mut seam = self.seam.lock().unwrap_or_else(|e| e.into_inner());
        seam.op = request.op();
        seam.request = seam.planted(Bug::DeliveryCapOffByOne).then(|| request.clone());
        seam.now = self.clock.now();
        seam.lease_ms = match request {
            DbRequest::Worker {
                request: WorkerRequest::Heartbeat { lease_ms },
                ..
            } => *lease_ms,
            _ => 0,
        };
    }

    /// Keeps a journal of every mutating request from now on, for failovers.
    pub fn keep_journal(&mut self) {
        self.journal.get_or_insert_with(Vec::new);
        self.tape.record();
    }

    /// Journals a mutating request just handled (`ok`: it was answered, not
    /// refused); `marks` are the event count, plan count and draw count before it.
    fn journal(&mut self, env: DbEnvelope, decided_at: Timestamp, marks: (usize, usize, usize), ok: bool) {
        let Some(journal) = self.journal.as_mut() else { return };
        let applied = self.events[marks.0..]
            .iter()
            .any(|e| e.outcome == EventOutcome::Applied);
        let committed =
            applied || self.plans.len() > marks.1 || (ok && matches!(env.request, DbRequest::RetirePlan { .. }));
        journal.push(Journaled {
            env,
            decided_at,
            draws: marks.2..self.tape.len(),
            committed,
            events: marks.0..self.events.len(),
        });
    }

    /// Fails the db host over to its replica, which lacks the last `lost` committed
    /// transactions (planted `failover-loses-commit`: at least one) and whose clock
    /// reads `offset_ms` more than the primary's. Call it while the host is down.
    /// Answers a line for the trace, or why the replica could not be built.
    pub fn fail_over(&mut self, lost: u64, offset_ms: i64) -> Result<String, String> {
        let lost = if self.bugs.contains(&Bug::FailoverLosesCommit) {
            lost.max(1)
        } else {
            lost
        };
        let mut journal = self.journal.take().ok_or("no journal was kept")?;
        let dropped = journal.split_off(cut(&journal, lost));
        let replayed = self.promote(&journal);
        self.journal = Some(journal);
        replayed?;
        self.clock.shift(offset_ms);
        let gone: Vec<String> = dropped
            .iter()
            .flat_map(|j| j.events.clone())
            .filter(|i| self.events[*i].outcome == EventOutcome::Applied)
            .map(|i| format!("#{i}"))
            .collect();
        let commits = dropped.iter().filter(|j| j.committed).count() as u64;
        self.failovers += 1;
        self.commits_lost += commits;
        Ok(format!(
            "failover: the replica is promoted, its clock {offset_ms:+} ms off the primary's; {commits} commit(s) lost{}",
            if gone.is_empty() {
                String::new()
            } else {
                format!(" (events {})", gone.join(" "))
            }
        ))
    }

    /// Builds the promoted replica: a fresh ledger with the world's limits, into
    /// which `journal` is replayed quietly, each request at the instant it was
    /// decided at and with the draws it drew; then reads every attempt's rows again.
    fn promote(&mut self, journal: &[Journaled]) -> Result<(), String> {
        let (clock, entropy, hook) = (self.clock.clone(), Arc::clone(&self.entropy), self.hook.clone());
        self.clock.decide_at(self.opened_at);
        let opened = open_backend(self.kind, clock, entropy, hook).map(|b| self.backend = b);
        let limited = self.limits.clone().iter().try_for_each(|l| self.put_limit(l));
        self.clock.clear();
        opened.and(limited).map_err(|e| e.to_string())?;
        self.quiet = true;
        let mut diverged = None;
        for j in journal {
            self.tape.replay(j.draws.clone());
            self.clock.decide_at(j.decided_at);
            self.set_seam(&j.env.request);
            let _ = self.dispatch(&j.env, j.decided_at, j.decided_at);
            self.clock.clear();
            if !self.tape.replayed() && diverged.is_none() {
                diverged = Some(j.env.request.name());
            }
        }
        self.quiet = false;
        self.reread_latest();
        match diverged {
            Some(name) => Err(format!("replaying the journal diverged at a {name} request")),
            None => Ok(()),
        }
    }

    /// Reads every attempt's rows from the ledger again (after a failover).
    fn reread_latest(&mut self) {
        let ids: Vec<AttemptId> = self.latest.keys().cloned().collect();
        for id in ids {
            match self.read_snap(&id) {
                Some(snap) => self.latest.insert(id, snap),
                None => self.latest.remove(&id),
            };
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn log(
        &mut self,
        (env, op): (&DbEnvelope, Op),
        db_now: Timestamp,
        decided_at: Timestamp,
        attempt: Option<AttemptId>,
        ordinal: Option<u32>,
        presented: Option<u32>,
        before: Option<Snap>,
        after: Option<Snap>,
        outcome: EventOutcome,
        plan_attempts: Option<(usize, usize)>,
    ) {
        if self.quiet {
            return;
        }
        let seq = self.events.len() as u64;
        let mut text = format!("#{seq} {op} from {}", env.from);
        if let Some(a) = &attempt {
            text.push_str(&format!(" {a}"));
        }
        if let Some(o) = ordinal {
            text.push_str(&format!(" step {o}"));
        }
        if let Some(p) = presented {
            text.push_str(&format!(" token#{p}"));
        }
        if let Some(a) = &after {
            let c = &a.record.command;
            text.push_str(&format!(
                " -> {}/{} d{}",
                a.record.attempt.status, c.status, c.delivery_count
            ));
            if let Some(t) = a.token {
                text.push_str(&format!(" token#{t}"));
            }
        }
        match &outcome {
            EventOutcome::Applied => text.push_str(" applied"),
            EventOutcome::Refused(r) => text.push_str(&format!(" refused: {r}")),
            EventOutcome::Failed(r) => text.push_str(&format!(" failed: {r}")),
        }
        if decided_at != db_now {
            text.push_str(&format!(" (decided at {decided_at}, db clock {db_now})"));
        }
        self.trace.line("db", text);
        self.events.push(DbEvent {
            seq,
            at_ms: elapsed_ms(),
            db_now,
            decided_at,
            from: env.from.clone(),
            op,
            attempt,
            ordinal,
            presented,
            before,
            after,
            outcome,
            plan_attempts,
            reply_lost: false,
        });
    }

    fn outcome<T>(result: &Result<T, LedgerError>) -> EventOutcome {
        match result {
            Ok(_) => EventOutcome::Applied,
            Err(LedgerError::Refused(r)) => EventOutcome::Refused(r.to_string()),
            Err(e) => EventOutcome::Failed(e.to_string()),
        }
    }

    /// A worker transition: log it with the rows before and after.
    fn worker_op<T>(
        &mut self,
        (env, op): (&DbEnvelope, Op),
        (db_now, decided_at): (Timestamp, Timestamp),
        lease: &Lease,
        ordinal: Option<u32>,
        run: impl FnOnce(&Backend, &Lease) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        let presented = self.known_ordinal(lease.token.expose());
        let substituted = self.substitute_token(op, lease);
        let lease = substituted.as_ref().unwrap_or(lease);
        let before = self.latest.get(&lease.attempt_id).cloned();
        let result = run(&self.backend, lease);
        let after = self.read_snap(&lease.attempt_id);
        if let Some(a) = &after {
            self.latest.insert(lease.attempt_id.clone(), a.clone());
        }
        let outcome = Self::outcome(&result);
        self.log(
            (env, op),
            db_now,
            decided_at,
            Some(lease.attempt_id.clone()),
            ordinal,
            presented,
            before,
            after,
            outcome,
            None,
        );
        result
    }

    /// Planted: a stale token replaced by the command's current one, for the
    /// operations whose token check a planted bug skips.
    fn substitute_token(&self, op: Op, lease: &Lease) -> Option<Lease> {
        if !skips_token_check(&self.bugs, op) {
            return None;
        }
        let record: Result<AttemptRecord, LedgerError> = call!(&self.backend, attempt(&lease.attempt_id));
        let current = record.ok()?.command.lease_token?;
        Some(Lease {
            token: current,
            ..lease.clone()
        })
    }

    fn dispatch(&mut self, env: &DbEnvelope, db_now: Timestamp, decided_at: Timestamp) -> DbResponse {
        let times = (db_now, decided_at);
        let result: Result<DbReply, LedgerError> = match &env.request {
            DbRequest::Migrate => call!(&self.backend, migrate()).map(DbReply::Versions),
            DbRequest::RegisterPlan { spec, known } => self.register(spec.clone(), known),
            DbRequest::Plan { id } => call!(&self.backend, plan(id)).map(DbReply::Plan),
            DbRequest::ListPlans => call!(&self.backend, list_plans()).map(DbReply::Plans),
            DbRequest::RetirePlan { id } => call!(&self.backend, retire_plan(id)).map(DbReply::Plan),
            DbRequest::Enqueue {
                plan,
                action,
                start,
                parent,
                key,
                input,
                order_key,
            } => {
                let parent = parent.filter(|_| !self.bugs.contains(&Bug::EnqueueDropsTrace));
                let forwarded = key.clone().filter(|_| !self.bugs.contains(&Bug::EnqueueIgnoresKey));
                let ordered = order_key.clone().filter(|_| !self.bugs.contains(&Bug::OrderKeyIgnored));
                let request = EnqueueRequest::new(*action)
                    .at(*start)
                    .traced(parent)
                    .keyed(forwarded)
                    .with_input(input.clone())
                    .ordered(ordered);
                let enqueued = self.enqueue(env, times, plan, (request, key.as_deref()));
                if let (Ok(DbReply::Enqueued { record, created: true }), Some(k)) = (&enqueued, order_key) {
                    self.ordered
                        .insert(record.attempt.id.clone(), (plan.clone(), k.clone()));
                }
                enqueued
            }
            DbRequest::Claim(request) => {
                let request = routed(&self.bugs, request);
                let restore = self.loosen_limits();
                let claimed = self.claim((env, request.op()), times, |b| call!(b, claim_batch(request)));
                for limit in &restore {
                    // The limit was set once with these values: setting it again
                    // cannot be refused.
                    let _ = self.put_limit(limit);
                }
                self.follow_waiting(env, times);
                claimed
            }
            DbRequest::Worker { lease, request } => {
                let lease = lease.to_lease();
                let reply = self.worker_op((env, request.op()), times, &lease, request.ordinal(), |b, l| {
                    call!(b, worker(l, request.clone()))
                });
                self.follow_waiting(env, times);
                reply.map(DbReply::Worker)
            }
            DbRequest::Operator { attempt, request } => {
                let reply = self.operator_op((env, request.op()), times, attempt, |b| {
                    call!(b, operator(attempt, request.clone()))
                        .map(|(reply, record)| DbReply::Operator { reply, record })
                });
                self.follow_waiting(env, times);
                reply
            }
            DbRequest::Attempt { attempt } => call!(&self.backend, attempt(attempt)).map(DbReply::Record),
            DbRequest::History { plan } => call!(&self.backend, history(plan)).map(DbReply::Records),
            DbRequest::OpenAttempts => call!(&self.backend, open_attempts()).map(DbReply::Count),
        };
        result.map(strip_tokens).map_err(|e| WireError::of(&e))
    }

    fn register(&mut self, spec: PlanSpec, known: &[String]) -> Result<DbReply, LedgerError> {
        let known: Vec<&str> = known.iter().map(String::as_str).collect();
        let plan: Plan = call!(&self.backend, register_plan(spec, &known))?;
        {
            let mut seam = self.seam.lock().unwrap_or_else(|e| e.into_inner());
            seam.recovery.insert(plan.id.clone(), plan.recovery);
            seam.plans.insert(plan.id.clone(), plan.clone());
        }
        if !self.plans.contains_key(&plan.id) {
            self.trace.line(
                "db",
                format!("registered plan {} ({}, {})", plan.id, plan.name, plan.recovery),
            );
            self.plans.insert(plan.id.clone(), plan.clone());
        }
        Ok(DbReply::Plan(plan))
    }

    fn enqueue(
        &mut self,
        env: &DbEnvelope,
        (db_now, decided_at): (Timestamp, Timestamp),
        plan: &PlanId,
        (request, received_key): (EnqueueRequest, Option<&str>),
    ) -> Result<DbReply, LedgerError> {
        let count_before = self.plan_attempt_count(plan);
        let result: Result<Enqueued, LedgerError> = call!(&self.backend, enqueue_with(plan, request));
        let count_after = self.plan_attempt_count(plan);
        if let Ok(Enqueued { record, created: false }) = &result {
            // Answered for its key: nothing was written, so no transition is logged.
            if !self.quiet {
                self.trace.line(
                    "db",
                    format!("enqueue from {} answered {} for its key", env.from, record.attempt.id),
                );
            }
            return result.map(|e| DbReply::Enqueued {
                record: e.record,
                created: false,
            });
        }
        let (attempt, after) = match &result {
            Ok(Enqueued { record, .. }) => {
                let snap = self.snap(record.clone());
                self.latest.insert(record.attempt.id.clone(), snap.clone());
                if let Some(key) = received_key {
                    self.keyed.insert(record.attempt.id.clone(), key.to_owned());
                }
                (Some(record.attempt.id.clone()), Some(snap))
            }
            Err(_) => (None, None),
        };
        let outcome = Self::outcome(&result);
        self.log(
            (env, Op::Enqueue),
            db_now,
            decided_at,
            attempt,
            None,
            None,
            None,
            after,
            outcome,
            Some((count_before, count_after)),
        );
        result.map(|e| DbReply::Enqueued {
            record: e.record,
            created: e.created,
        })
    }

    fn claim(
        &mut self,
        env: (&DbEnvelope, Op),
        (db_now, decided_at): (Timestamp, Timestamp),
        run: impl FnOnce(&Backend) -> Result<Vec<Claimed>, LedgerError>,
    ) -> Result<DbReply, LedgerError> {
        // The ledger answers only the claims that granted a lease: a candidate it
        // found exhausted (and ended) is read back from the rows of every command
        // that was claimable.
        let candidates: Vec<AttemptId> = self
            .latest
            .iter()
            .filter(|(_, s)| !s.record.attempt.status.is_terminal() && is_claimable(&s.record.command, decided_at))
            .map(|(id, _)| id.clone())
            .collect();
        let result = run(&self.backend);
        let claimed = match result {
            Ok(c) => c,
            Err(e) => {
                let outcome = Self::outcome::<()>(&Err(e.clone()));
                self.log(env, db_now, decided_at, None, None, None, None, None, outcome, None);
                return Err(e);
            }
        };
        for c in &claimed {
            let attempt = c.lease.attempt_id.clone();
            self.ordinal_of(c.lease.token.expose());
            let after = self.snap(c.record.clone());
            self.log_claim(env, (db_now, decided_at), attempt, after);
        }
        for attempt in candidates {
            if claimed.iter().any(|c| c.lease.attempt_id == attempt) {
                continue;
            }
            match self.read_snap(&attempt) {
                Some(after) if self.latest.get(&attempt) != Some(&after) => {
                    self.log_claim(env, (db_now, decided_at), attempt, after);
                }
                _ => {}
            }
        }
        Ok(DbReply::Claimed(claimed.iter().map(WireClaimed::of).collect()))
    }

    /// Logs one applied claim of `attempt` that left `after` (the token it granted,
    /// if any, is the one the request presented).
    fn log_claim(&mut self, env: (&DbEnvelope, Op), times: (Timestamp, Timestamp), attempt: AttemptId, after: Snap) {
        let before = self.latest.get(&attempt).cloned();
        self.latest.insert(attempt.clone(), after.clone());
        let granted = after.token;
        self.log(
            env,
            times.0,
            times.1,
            Some(attempt),
            None,
            granted,
            before,
            Some(after),
            EventOutcome::Applied,
            None,
        );
    }

    fn operator_op(
        &mut self,
        env: (&DbEnvelope, Op),
        (db_now, decided_at): (Timestamp, Timestamp),
        attempt: &AttemptId,
        run: impl FnOnce(&Backend) -> Result<DbReply, LedgerError>,
    ) -> Result<DbReply, LedgerError> {
        let before = self.latest.get(attempt).cloned();
        let result = run(&self.backend);
        let after = self.read_snap(attempt);
        if let Some(a) = &after {
            self.latest.insert(attempt.clone(), a.clone());
        }
        let outcome = Self::outcome(&result);
        self.log(
            env,
            db_now,
            decided_at,
            Some(attempt.clone()),
            None,
            None,
            before,
            after,
            outcome,
            None,
        );
        result
    }
}

/// Whether a request may write: every one but the reads.
fn is_mutating(request: &DbRequest) -> bool {
    !matches!(
        request,
        DbRequest::Plan { .. }
            | DbRequest::ListPlans
            | DbRequest::Attempt { .. }
            | DbRequest::History { .. }
            | DbRequest::OpenAttempts
    )
}

/// Replies carry rows, never tokens (the claim's own token travels in its lease).
fn strip_tokens(reply: DbReply) -> DbReply {
    fn strip(mut r: AttemptRecord) -> AttemptRecord {
        r.command.lease_token = None;
        r
    }
    match reply {
        DbReply::Record(r) => DbReply::Record(strip(r)),
        DbReply::Enqueued { record, created } => DbReply::Enqueued {
            record: strip(record),
            created,
        },
        DbReply::Records(rs) => DbReply::Records(rs.into_iter().map(strip).collect()),
        DbReply::Operator { reply, record } => DbReply::Operator {
            reply,
            record: strip(record),
        },
        DbReply::Claimed(cs) => DbReply::Claimed(
            cs.into_iter()
                .map(|mut c| {
                    c.record = strip(c.record);
                    c
                })
                .collect(),
        ),
        other => other,
    }
}

/// Whether a snapshot shows a live lease at `now` (PROCESSING and not yet expired).
pub fn lease_live(snap: &Snap, now: Timestamp) -> bool {
    let c = &snap.record.command;
    c.status == CommandStatus::Processing && c.lease_until.is_some_and(|until| until >= now)
}

/// Serves the ledger on [`DB_PORT`] until the host crashes.
pub async fn serve(state: Rc<RefCell<DbState>>, trace: Trace) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", DB_PORT)).await?;
    trace.line("db", "up: serving the ledger");
    loop {
        let (stream, _) = listener.accept().await?;
        let state = Rc::clone(&state);
        tokio::task::spawn_local(async move {
            let _ = serve_connection(state, stream).await;
        });
    }
}

async fn serve_connection(state: Rc<RefCell<DbState>>, mut stream: turmoil::net::TcpStream) -> std::io::Result<()> {
    while let Some(env) = read_frame::<_, DbEnvelope>(&mut stream).await? {
        let (response, lost) = state.borrow_mut().handle(env);
        if lost {
            return Ok(());
        }
        write_frame(&mut stream, &response).await?;
    }
    Ok(())
}
