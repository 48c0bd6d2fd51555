//! The model's state and its actions.

use super::digest::{Changing, Shared};
use super::ledger::{Answer, Ledger, Limits, Req};
use super::{Budget, Config, TICK_MS};
use crate::bugs::Bug;
use crate::clock::EPOCH_MS;
use crate::db::{DbEvent, EventOutcome, Snap};
use crate::plans::{self, SANDBOX};
use crate::protocol::TargetReply;
use crate::target::{CallAnswer, CallRecord, KeyRecord};
use crate::world::DETACHED_RETRY_MS;
use leasehold::ledger::limits::LimitTable;
use leasehold_engine::driver::{DeadlineReason, Driver, DriverAction, ExecutorResult, Outcome};
use leasehold_engine::transition::{enqueue, NewIds};
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, AttemptStatus, CommandId, CommandStatus, Failure, OperatorRequest, Timestamp,
    WorkerOp, WorkerRequest,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::rc::Rc;

/// A worker's lease and the driver delivering it.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub attempt: usize,
    pub driver: Driver,
    pub token: u32,
    pub delivery: u32,
}

/// A ledger call in flight, under the lease of token ordinal `token`: a worker
/// request as the driver asked for it, or (`None`) the read-back of the attempt.
#[derive(Debug, Clone)]
pub(super) struct Sending {
    pub attempt: usize,
    pub request: Option<WorkerRequest>,
    pub token: u32,
    pub sent_at: Timestamp,
}

/// An executor call in flight since tick `since`.
#[derive(Debug, Clone)]
pub(super) struct Exec {
    pub attempt: usize,
    pub ordinal: u32,
    pub token: u32,
    pub delivery: u32,
    pub since: u32,
}

/// A call the executor's client sends again on its own at tick `due` (the planted
/// `executor-retries-detached`), `excused` if a fault had touched the lease it
/// came from.
#[derive(Debug, Clone)]
pub(super) struct Resend {
    pub from: usize,
    pub exec: Exec,
    pub due: u32,
    pub excused: bool,
}

/// A request delayed in the network: it lands later, answering nobody.
#[derive(Debug, Clone)]
pub(super) struct Stray {
    pub from: usize,
    pub attempt: usize,
    pub request: WorkerRequest,
    pub token: u32,
    pub sent_at: Timestamp,
}

/// The kept past: it only grows (until it is archived), so in the state's `Debug`
/// text (its fingerprint) the chained digest of its events stands for it, and the
/// events are not written out again on every transition.
#[derive(Clone, Default)]
pub(super) struct Past {
    /// Shared by the states whose pasts are alike (most transitions keep none).
    events: Rc<Vec<DbEvent>>,
    digest: u64,
}

impl Past {
    pub fn events(&self) -> &[DbEvent] {
        &self.events
    }

    fn push(&mut self, e: DbEvent) {
        self.digest = super::digest::digest(self.digest, &e);
        Rc::make_mut(&mut self.events).push(e);
    }
}

impl std::fmt::Debug for Past {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Past({}, {:016x})", self.events.len(), self.digest)
    }
}

/// One worker.
#[derive(Debug, Clone, Default)]
pub(super) struct Worker {
    pub held: Option<Held>,
    pub sending: Option<Sending>,
    pub exec: Option<Exec>,
    pub paused: bool,
    /// Whether a fault (crash, pause, lost or delayed reply, lost executor reply)
    /// touched the lease it holds or last held.
    pub faulted: bool,
    /// The token ordinal of the lease it holds or last held.
    pub lease: Option<u32>,
}

/// The whole model state.
#[derive(Debug, Clone)]
pub(super) struct State {
    pub tick: u32,
    /// Every attempt's rows, in the order they were enqueued (`att-1` first).
    pub attempts: Vec<Shared<Snap>>,
    /// How many of them, first, are archived ([`archive`]): ended before the
    /// operator's retry or compensate, and checked no more.
    pub archived: usize,
    pub workers: Vec<Shared<Worker>>,
    pub strays: Vec<Stray>,
    /// Calls the executor's client will send again on its own.
    pub resends: Vec<Resend>,
    /// The ledger's per-target limits and their loads.
    pub limits: Shared<LimitTable>,
    /// What the target did.
    pub target: Shared<Effects>,
    /// The enqueues and the applied claims: what invariants 6, 7 and 12 read of the past.
    pub past: Past,
    pub budget: Budget,
    pub minted: u32,
}

/// The target's records: its effect and reply per idempotency key and sandbox, the
/// steps applied in each place, its first call of each step from each delivery, and
/// how many target receipts it gave.
#[derive(Debug, Clone, Default)]
pub(super) struct Effects {
    pub keys: BTreeMap<(String, Option<String>), KeyRecord>,
    pub applied: BTreeMap<String, Vec<String>>,
    pub calls: Vec<CallRecord>,
    pub receipts_given: u32,
}

/// One action of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Act {
    Work(usize),
    Claim(usize, bool),
    /// The request in flight lands: its reply `lost` or not, and `fused` with a
    /// claim in the same transaction (a request that ends its attempt).
    Deliver(usize, bool, bool),
    Delay(usize),
    ExecDone(usize),
    ExecLost(usize),
    ExecPermanent(usize),
    ExecTransient(usize),
    Crash(usize),
    Pause(usize),
    Resume(usize),
    Stray(usize),
    /// A call the executor's client sends again on its own lands at the target.
    Resend(usize),
    Reconcile(usize),
    Abort(usize),
    /// The operator enqueues a new attempt of plan `.0` with `.1` (retry or compensate).
    Enqueue(usize, Action),
    Tick,
}

/// What one action did: its description, the db events it logged, and the takeovers
/// of a lease whose holder no fault had touched (invariant 13).
#[derive(Debug, Default)]
pub(super) struct Done {
    pub label: String,
    pub events: Vec<DbEvent>,
    pub healthy_takeover: Option<String>,
    /// Whether a write that ended an attempt claimed a command in the same transaction.
    pub fused_claim: bool,
    /// A call of a step after its attempt ended, that no fault or abort excuses
    /// (invariant 17).
    pub late_call: Option<String>,
}

pub(super) fn name(i: usize) -> String {
    format!("w{}", i + 1)
}

fn at(tick: u32, skew_ms: i64) -> Timestamp {
    Timestamp::from_millis(EPOCH_MS + i64::from(tick) * TICK_MS as i64 + skew_ms)
}

impl State {
    pub fn db_now(&self) -> Timestamp {
        at(self.tick, 0)
    }

    pub fn worker_now(&self, config: &Config, i: usize) -> Timestamp {
        at(self.tick, config.skews_ms.get(i).copied().unwrap_or(0))
    }

    /// The state's fingerprint: the digest of its `Debug` text (tokens are ordinals
    /// there; the rows, the target's records and the kept past are written as their
    /// own digests), except that once no enqueue may come the archived attempts are
    /// left out (only their number is kept): nothing reads them any more (they are
    /// terminal, so no claim, reconcile or abort takes them, the enqueue guard runs
    /// no more, and the invariants read the attempts not archived), so the second
    /// attempts that differ only in how the first one ended are one.
    pub fn fingerprint(&self) -> u64 {
        let read = if self.budget.enqueues == 0 { self.archived } else { 0 };
        let view = (
            self.tick,
            &self.attempts[read..],
            self.archived,
            &self.workers,
            &self.strays,
            &self.resends,
            &self.limits,
            &self.target,
            &self.past,
            self.budget,
            self.minted,
        );
        super::digest::digest(0, &view)
    }

    /// The digest of what the checker reads of this state besides a transition's
    /// own events: the attempts not archived, the target's records and the kept
    /// past.
    pub fn checked_digest(&self) -> u64 {
        let rows: Vec<u64> = self.live_rows().map(Shared::digest).collect();
        super::digest::digest(self.past.digest, &(rows, self.target.digest()))
    }

    /// The rows of the attempts not archived.
    fn live_rows(&self) -> impl Iterator<Item = &Shared<Snap>> {
        self.attempts.iter().skip(self.archived)
    }

    /// Worker `i`, to change.
    pub fn worker(&mut self, i: usize) -> Changing<'_, Worker> {
        self.workers[i].get_mut()
    }

    /// The attempts not archived.
    pub fn live(&self) -> impl Iterator<Item = &Snap> {
        self.live_rows().map(|a| &**a)
    }

    /// The ledger applies `req` from `from` to attempt `k` at its clock, under the
    /// configuration's per-target limits if it sets any.
    fn request(&mut self, ledger: &Ledger<'_>, k: usize, from: &str, req: &Req<'_>) -> Answer {
        let db_now = self.db_now();
        let (after, answer) = if ledger.config.limits.is_empty() {
            ledger.apply(&self.attempts[k], None, (from, req), db_now)
        } else {
            let mut table = self.limits.get_mut();
            let limits = Limits {
                table: &mut table,
                rows: &self.attempts,
            };
            ledger.apply(&self.attempts[k], Some(limits), (from, req), db_now)
        };
        self.attempts[k] = Shared::new(after);
        answer
    }

    /// Whether every attempt is terminal.
    pub fn all_terminal(&self) -> bool {
        self.attempts.iter().all(|a| a.record.attempt.status.is_terminal())
    }

    /// Whether every attempt is terminal and nothing is in flight.
    pub fn ended(&self) -> bool {
        self.all_terminal()
            && self.strays.is_empty()
            && self.resends.is_empty()
            && self.workers.iter().all(|w| w.sending.is_none() && w.exec.is_none())
    }

    /// Whether every attempt is terminal, nothing is in flight and the operator
    /// may enqueue no more.
    pub fn settled(&self) -> bool {
        self.ended() && self.budget.enqueues == 0
    }

    /// Whether no worker holds a lease, sends, calls the executor or is paused, and
    /// no request is in the network.
    pub fn quiet(&self) -> bool {
        self.strays.is_empty()
            && self.resends.is_empty()
            && self
                .workers
                .iter()
                .all(|w| w.held.is_none() && w.sending.is_none() && w.exec.is_none() && !w.paused)
    }
}

/// When a driver's timer wakes the worker: at its deadline, except that the planted
/// `late-heartbeat` wakes a heartbeat one lease late.
fn wake_at(config: &Config, driver: &Driver) -> Option<Timestamp> {
    let d = driver.poll_timeout()?;
    let late = d.reason == DeadlineReason::Heartbeat && config.bugs.contains(&Bug::LateHeartbeat);
    Some(if late { d.at.plus_ms(config.lease_ms()) } else { d.at })
}

/// Whether worker `i` has something to do now (a due timer, an action, an ended
/// delivery to drop).
pub(super) fn work_due(config: &Config, s: &State, i: usize) -> bool {
    let w = &s.workers[i];
    let Some(h) = &w.held else { return false };
    let now = s.worker_now(config, i);
    if h.driver.outcome().is_some() || wake_at(config, &h.driver).is_some_and(|t| t <= now) {
        return true;
    }
    h.driver.clone().poll_action(now).is_some()
}

/// Whether worker `i` is idle and a claim of it would take a command. Under
/// per-target limits, the claim is tried on a copy of the limits: a claim the
/// limits refuse takes nothing and changes nothing that matters (a refusal only
/// caches until when its target refuses, which the limits would tell again), so it
/// is no action, and it does not hold the clock back.
fn can_claim(ledger: &Ledger<'_>, s: &State, i: usize) -> bool {
    let w = &s.workers[i];
    if w.held.is_some() || w.sending.is_some() {
        return false;
    }
    let (who, sent_at, db_now) = (name(i), s.worker_now(ledger.config, i), s.db_now());
    let candidate = ledger.claim_candidate((&s.attempts, &s.limits), &who, sent_at, db_now);
    let Some(k) = candidate.filter(|_| !ledger.config.limits.is_empty()) else {
        return candidate.is_some();
    };
    let mut table = (*s.limits).clone();
    let limits = Limits {
        table: &mut table,
        rows: &s.attempts,
    };
    let claim = Req::Claim(&who, s.minted + 1, sent_at);
    let (_, answer) = ledger.apply(&s.attempts[k], Some(limits), (&who, &claim), db_now);
    answer.reply.is_ok()
}

/// Whether the clock may advance: no worker that is up has work due now, and no
/// executor call has used up its time.
fn may_tick(ledger: &Ledger<'_>, s: &State, faults: bool) -> bool {
    let c = ledger.config;
    (s.tick < c.horizon || !faults)
        && s.resends.iter().all(|r| r.due > s.tick)
        && s.workers.iter().enumerate().all(|(i, w)| {
            w.paused
                || (w.sending.is_none()
                    && w.exec.as_ref().is_none_or(|e| e.since + c.exec_ticks > s.tick)
                    && !work_due(c, s, i)
                    && !can_claim(ledger, s, i))
        })
}

/// Every action enabled in `s`; without `faults`, the fault-free fair schedule's
/// (no fault, no operator, the clock past the horizon).
pub(super) fn enabled(ledger: &Ledger<'_>, s: &State, faults: bool) -> Vec<Act> {
    let b = if faults { s.budget } else { Budget::default() };
    if faults && s.ended() {
        return operator_waits(ledger, s, &b);
    }
    let mut acts = Vec::new();
    for (i, w) in s.workers.iter().enumerate() {
        if w.paused {
            acts.push(Act::Resume(i));
            continue;
        }
        worker_acts(ledger, s, i, &b, &mut acts);
    }
    acts.extend((0..s.strays.len()).map(Act::Stray));
    let due = s.resends.iter().enumerate().filter(|(_, r)| r.due <= s.tick);
    acts.extend(due.map(|(j, _)| Act::Resend(j)));
    operator_acts(ledger, s, &b, &mut acts);
    if may_tick(ledger, s, faults) {
        acts.push(Act::Tick);
    }
    acts
}

/// Once every attempt has ended and nothing is in flight, only the operator's
/// enqueue is left to explore: the workers resume and act, one at a time (what
/// they do with an ended attempt, they do in any order), and once they are quiet
/// the operator enqueues, at once (waiting would only leave the new attempt less
/// time before the horizon).
fn operator_waits(ledger: &Ledger<'_>, s: &State, b: &Budget) -> Vec<Act> {
    let mut acts = Vec::new();
    for (i, w) in s.workers.iter().enumerate() {
        if w.paused {
            acts.push(Act::Resume(i));
        } else if work_due(ledger.config, s, i) {
            acts.push(Act::Work(i));
        }
    }
    acts.truncate(1);
    if acts.is_empty() {
        operator_acts(ledger, s, b, &mut acts);
    }
    acts
}

/// The operator's: reconcile a PROCESSING command, abort an open attempt, retry or
/// compensate a plan whose attempts are all terminal once the workers are quiet
/// (the engine's action guard decides whether it may; a refused enqueue changes
/// nothing).
fn operator_acts(ledger: &Ledger<'_>, s: &State, b: &Budget, acts: &mut Vec<Act>) {
    for (k, a) in s.attempts.iter().enumerate() {
        if b.reconciles > 0 && a.record.command.status == CommandStatus::Processing {
            acts.push(Act::Reconcile(k));
        }
        if b.aborts > 0 && !a.record.attempt.status.is_terminal() {
            acts.push(Act::Abort(k));
        }
    }
    if b.enqueues == 0 || !s.quiet() {
        return;
    }
    for (p, plan) in ledger.plans.iter().enumerate() {
        let mut of_plan = s.attempts.iter().filter(|a| a.record.attempt.plan_id == plan.id);
        if of_plan.all(|a| a.record.attempt.status.is_terminal()) {
            acts.push(Act::Enqueue(p, Action::Retry));
            acts.push(Act::Enqueue(p, Action::Compensate));
        }
    }
}

fn worker_acts(ledger: &Ledger<'_>, s: &State, i: usize, b: &Budget, acts: &mut Vec<Act>) {
    let w = &s.workers[i];
    if w.sending.is_some() {
        let fused = ends_attempt(w);
        acts.push(Act::Deliver(i, false, false));
        if fused {
            acts.push(Act::Deliver(i, false, true));
        }
        if b.lost_replies > 0 {
            acts.push(Act::Deliver(i, true, false));
            if fused {
                acts.push(Act::Deliver(i, true, true));
            }
        }
        if b.delays > 0 {
            acts.push(Act::Delay(i));
        }
    }
    if w.exec.is_some() {
        acts.push(Act::ExecDone(i));
        if b.exec_losses > 0 {
            acts.push(Act::ExecLost(i));
        }
        if b.permanents > 0 {
            acts.push(Act::ExecPermanent(i));
        }
        if b.transients > 0 {
            acts.push(Act::ExecTransient(i));
        }
    }
    if work_due(ledger.config, s, i) {
        acts.push(Act::Work(i));
    }
    if can_claim(ledger, s, i) {
        acts.push(Act::Claim(i, false));
        if b.lost_replies > 0 {
            acts.push(Act::Claim(i, true));
        }
    }
    let busy = w.held.is_some() || w.sending.is_some() || w.exec.is_some();
    if busy && b.crashes > 0 {
        acts.push(Act::Crash(i));
    }
    if busy && b.pauses > 0 {
        acts.push(Act::Pause(i));
    }
}

/// Whether the worker's request in flight ends its attempt, once applied: the write
/// its driver may claim the next command with ([`Driver::ends_attempt`]).
fn ends_attempt(w: &Worker) -> bool {
    let Some(Sending {
        request: Some(request),
        token,
        ..
    }) = &w.sending
    else {
        return false;
    };
    w.held
        .as_ref()
        .is_some_and(|h| h.token == *token && h.driver.ends_attempt(request))
}

/// Performs `act` on `s`, then forgets the leases that have ended.
pub(super) fn perform(ledger: &Ledger<'_>, s: &mut State, act: Act) -> Done {
    let done = perform_act(ledger, s, act);
    forget_ended_leases(s);
    done
}

/// A worker's lease that no row holds any more can never be taken over again (a
/// token is never minted twice), so whether a fault touched it matters no more
/// (invariant 13 reads it only for a takeover of that token): two states that
/// differ only there are one.
fn forget_ended_leases(s: &mut State) {
    for w in &mut s.workers {
        let forget = w.lease.is_some() && !s.attempts.iter().any(|a| a.token == w.lease);
        if forget || (w.lease.is_none() && w.faulted) {
            let mut w = w.get_mut();
            (w.lease, w.faulted) = (None, false);
        }
    }
}

fn perform_act(ledger: &Ledger<'_>, s: &mut State, act: Act) -> Done {
    let who = |i: usize| format!("worker {}", name(i));
    match act {
        Act::Work(i) => {
            let (did, late_call) = work(ledger.config, s, i);
            Done {
                late_call,
                ..simple(format!("{} {did}", who(i)))
            }
        }
        Act::Claim(i, lost) => claim(ledger, s, i, lost),
        Act::Deliver(i, lost, fused) => deliver(ledger, s, i, lost, fused),
        Act::Delay(i) => delay(ledger.config, s, i),
        Act::ExecDone(i) | Act::ExecLost(i) | Act::ExecPermanent(i) | Act::ExecTransient(i) => {
            executed(ledger, s, i, act)
        }
        Act::Crash(i) => {
            s.budget.crashes -= 1;
            let lease = s.workers[i].lease;
            *s.worker(i) = Worker {
                faulted: true,
                lease,
                ..Worker::default()
            };
            // Its executor's client went down with it.
            s.resends.retain(|r| r.from != i);
            simple(format!("{} crashes and restarts idle", who(i)))
        }
        Act::Pause(i) => {
            s.budget.pauses -= 1;
            s.worker(i).paused = true;
            fault(s, i);
            simple(format!("{} pauses", who(i)))
        }
        Act::Resume(i) => {
            s.worker(i).paused = false;
            simple(format!("{} resumes", who(i)))
        }
        Act::Stray(j) => stray(ledger, s, j),
        Act::Resend(j) => resend(ledger, s, j),
        Act::Reconcile(k) => operator(ledger, s, k, OperatorRequest::Reconcile),
        Act::Abort(k) => operator(
            ledger,
            s,
            k,
            OperatorRequest::Abort {
                reason: "operator".into(),
            },
        ),
        Act::Enqueue(p, action) => enqueue_attempt(ledger, s, p, action),
        Act::Tick => {
            s.tick += 1;
            simple(format!("clock → t={}", s.tick))
        }
    }
}

fn simple(label: String) -> Done {
    Done {
        label,
        ..Done::default()
    }
}

/// The worker fires its due timers and performs every action its driver asks for;
/// answers what it did and a call it sent after its attempt ended ([`late_call`]).
fn work(config: &Config, s: &mut State, i: usize) -> (String, Option<String>) {
    let call = |w: &Worker| w.exec.as_ref().map(|e| (e.token, e.ordinal, e.since));
    let before = call(&s.workers[i]);
    let did = drive(config, s, i);
    let w = &s.workers[i];
    let sent = call(w) != before;
    let late = w.exec.as_ref().filter(|_| sent).and_then(|e| {
        let excused = w.faulted && w.lease == Some(e.token);
        late_call(config, s, i, e, excused)
    });
    (did, late)
}

/// Invariant 17 for a call of `exec`'s step that worker `i` sends now: its attempt
/// has ended, and neither a fault of the lease it came from (`excused`) nor an
/// abort at most a lease before excuses it (as the simulator's
/// [`crate::delivery::no_calls_after_the_end`] excuses them).
fn late_call(config: &Config, s: &State, i: usize, exec: &Exec, excused: bool) -> Option<String> {
    let a = &s.attempts[exec.attempt].record.attempt;
    let end = a.finished_at.filter(|_| a.status.is_terminal() && !excused)?;
    let now = s.db_now();
    if a.status == AttemptStatus::Aborted && now <= end.plus_ms(config.lease_ms()) {
        return None;
    }
    Some(format!(
        "{} step {}: {} called the target at t={} (delivery {}), after the attempt ended {} at t={}",
        a.id,
        exec.ordinal,
        name(i),
        s.tick,
        exec.delivery,
        a.status,
        ticks(end)
    ))
}

/// The worker fires its due timers and performs every action its driver asks for.
fn drive(config: &Config, s: &mut State, i: usize) -> String {
    let now = s.worker_now(config, i);
    let tick = s.tick;
    let mut guard = s.worker(i);
    let w: &mut Worker = &mut guard;
    let Some(h) = w.held.as_mut() else {
        return "has nothing to do".into();
    };
    if wake_at(config, &h.driver).is_some_and(|t| t <= now) {
        h.driver.handle_timeout(now);
    }
    let mut did = Vec::new();
    while let Some(action) = h.driver.poll_action(now) {
        match action {
            DriverAction::Execute { ordinal } => {
                did.push(format!("calls the executor for step {ordinal}"));
                w.exec = Some(Exec {
                    attempt: h.attempt,
                    ordinal,
                    token: h.token,
                    delivery: h.delivery,
                    since: tick,
                });
            }
            call => {
                let request = match call {
                    DriverAction::Ledger(request) => Some(request),
                    _ => None,
                };
                did.push(format!("sends {}", request_name(request.as_ref())));
                w.sending = Some(Sending {
                    attempt: h.attempt,
                    request,
                    token: h.token,
                    sent_at: now,
                });
            }
        }
    }
    if let Some(outcome) = h.driver.outcome() {
        did.push(format!("ends its delivery: {}", outcome_text(outcome)));
        w.held = None;
    }
    did.join(", ")
}

/// A ledger call as the trace names it (`None`: the read-back).
fn request_name(r: Option<&WorkerRequest>) -> String {
    match r.map(WorkerRequest::kind) {
        Some(op @ (WorkerOp::BeginStep(o) | WorkerOp::CompleteStep(o) | WorkerOp::CompleteAndContinue(o))) => {
            format!("{} {o}", op.op())
        }
        Some(WorkerOp::Fail(ordinal)) => format!("fail (step {ordinal:?})"),
        Some(op) => op.op().to_string(),
        None => "a read of the attempt".into(),
    }
}

fn outcome_text(o: &Outcome) -> String {
    match o {
        Outcome::Delivered => "delivered".into(),
        Outcome::Failed(e) => format!("failed ({e})"),
        Outcome::Refused(r) => format!("refused ({r})"),
        Outcome::Abandoned(why) => format!("abandoned ({why})"),
        Outcome::GaveBack { until, error } => format!("gave back until {until} ({error})"),
        Outcome::Exhausted { why, error } => format!("{} ({error})", why.as_str()),
        Outcome::Yielded { until } => format!("yielded until {until}"),
    }
}

/// Whether the kept past holds `e`: an applied enqueue or claim, or, where the
/// configuration sets per-target limits, every applied event (invariants 20–22
/// replay the targets' leases and breakers from the whole log).
pub(super) fn keeps(config: &Config, e: &DbEvent) -> bool {
    let kept = !config.limits.is_empty() || e.op.is_claim() || e.op == leasehold_engine::Op::Enqueue;
    kept && e.outcome == EventOutcome::Applied
}

/// Records a db event at the current tick; the kept past takes it if it
/// [`keeps`] it (without its instants unless limits read them: [`timeless`]).
/// Answers the takeover of a healthy holder, if the event is one.
fn log(config: &Config, s: &mut State, mut e: DbEvent, done: &mut Done) {
    e.at_ms = u64::from(s.tick) * TICK_MS;
    if let Some(msg) = healthy_takeover(s, &e) {
        done.healthy_takeover = Some(msg);
    }
    if keeps(config, &e) {
        s.past.push(if config.limits.is_empty() {
            timeless(&e)
        } else {
            e.clone()
        });
    }
    done.events.push(e);
}

/// A claim or enqueue as the kept past holds it: without the instants, which
/// invariants 6, 7 and 12 do not read, so that paths differing only in when they
/// claimed meet.
fn timeless(e: &DbEvent) -> DbEvent {
    let strip = |snap: &Option<Snap>| {
        snap.clone().map(|mut s| {
            let (a, c) = (&mut s.record.attempt, &mut s.record.command);
            (a.started_at, a.finished_at) = (None, None);
            (c.lease_until, c.last_heartbeat_at, c.finished_at) = (None, None, None);
            for r in &mut s.record.receipts {
                (r.started_at, r.finished_at) = (None, None);
            }
            s
        })
    };
    let t0 = Timestamp::from_millis(EPOCH_MS);
    DbEvent {
        at_ms: 0,
        db_now: t0,
        decided_at: t0,
        before: strip(&e.before),
        after: strip(&e.after),
        ..e.clone()
    }
}

/// Invariant 13: an applied claim or reconcile that ended a lease whose holder no
/// fault had touched.
fn healthy_takeover(s: &State, e: &DbEvent) -> Option<String> {
    let (b, a) = (e.before.as_ref()?, e.after.as_ref()?);
    let ends = (e.op.is_claim() || e.op == leasehold_engine::Op::Reconcile) && a.token != b.token;
    if e.outcome != EventOutcome::Applied || !ends || b.record.command.status != CommandStatus::Processing {
        return None;
    }
    let owner = b.record.command.lease_owner.as_deref()?;
    let i = s.workers.iter().enumerate().position(|(i, _)| name(i) == owner)?;
    // A holder that has since claimed another lease left this one unended: only a
    // crash or a lost reply does that.
    let w = &s.workers[i];
    (!w.faulted && w.lease == b.token).then(|| {
        format!(
            "{} by {} at t={} took over the lease of {owner}, which no fault had touched",
            e.op, e.from, s.tick
        )
    })
}

fn claim(ledger: &Ledger<'_>, s: &mut State, i: usize, lost: bool) -> Done {
    let now = s.worker_now(ledger.config, i);
    let mut done = Done::default();
    let Some((held, claimed)) = claim_next(ledger, s, i, now, &mut done) else {
        done.label = format!("worker {} finds nothing to claim", name(i));
        return done;
    };
    done.label = format!("worker {} claims {claimed}", name(i));
    if lost {
        s.budget.lost_replies -= 1;
        fault(s, i);
        done.label.push_str(", reply lost");
    } else {
        *s.worker(i) = Worker {
            lease: Some(held.token),
            held: Some(held),
            ..Worker::default()
        };
    }
    done
}

/// The ledger's claim for worker `i` of the first claimable command, sent at
/// `sent_at` (worker clock); answers the lease for the worker to hold (unless its
/// reply is lost) and what it claimed, for the trace.
fn claim_next(
    ledger: &Ledger<'_>,
    s: &mut State,
    i: usize,
    sent_at: Timestamp,
    done: &mut Done,
) -> Option<(Held, String)> {
    let who = name(i);
    let k = ledger.claim_candidate((&s.attempts, &s.limits), &who, sent_at, s.db_now())?;
    let token = s.minted + 1;
    let answer = s.request(ledger, k, &who, &Req::Claim(&who, token, sent_at));
    if let Some(e) = answer.event {
        log(ledger.config, s, e, done);
    }
    let reply = answer.reply.ok()?;
    s.minted = token;
    // A claim that found its attempt exhausted ended it and granted no lease.
    if matches!(reply, leasehold_engine::Reply::Exhausted(_)) {
        return None;
    }
    let record = super::ledger::record_of(&s.attempts[k]);
    let until = record.command.lease_until.map_or(0, ticks);
    let driver = Driver::fused(&record, ledger.config.lease_ms(), sent_at)
        .with_policy(ledger.plan_of(&record), ledger.config.jitter);
    let held = Held {
        attempt: k,
        driver,
        token,
        delivery: record.command.delivery_count,
    };
    Some((
        held,
        format!("{} (token#{token}, lease until t={until})", record.attempt.id),
    ))
}

/// A db-clock instant in ticks.
pub(super) fn ticks(t: Timestamp) -> i64 {
    (t.as_millis() - EPOCH_MS).div_euclid(TICK_MS as i64)
}

/// The ledger performs the call in flight and, unless its reply is `lost`, the
/// worker hands how it ended to its driver; a `fused` request that the ledger
/// applies claims the next command in the same transaction, and the worker holds
/// what it claimed unless the reply is lost. Answers the ledger's verdict.
fn apply_sending(
    ledger: &Ledger<'_>,
    s: &mut State,
    i: usize,
    sending: &Sending,
    (lost, fused): (bool, bool),
    done: &mut Done,
) -> (&'static str, String) {
    let now = s.worker_now(ledger.config, i);
    let token = sending.token;
    let k = sending.attempt;
    let Some(request) = &sending.request else {
        let mut record = super::ledger::record_of(&s.attempts[k]);
        record.command.lease_token = None;
        if !lost {
            answer_driver(s, i, token, |d| d.handle_read(now, &record));
        }
        return ("read", String::new());
    };
    let req = Req::Worker(request, token, sending.sent_at);
    let answer = s.request(ledger, k, &name(i), &req);
    if let Some(e) = answer.event {
        log(ledger.config, s, e, done);
    }
    let applied = answer.reply.is_ok();
    let verdict = if applied { "applied" } else { "refused" };
    if !lost {
        answer_driver(s, i, token, |d| match answer.reply {
            Ok(reply) => d.handle_reply(now, reply),
            Err(refusal) => d.handle_failure(now, Failure::Refused(refusal)),
        });
    }
    if !(fused && applied) {
        return (verdict, String::new());
    }
    let claimed = claim_next(ledger, s, i, sending.sent_at, done).map(|(held, claimed)| {
        if !lost {
            let mut w = s.worker(i);
            (w.lease, w.held, w.faulted) = (Some(held.token), Some(held), false);
        }
        claimed
    });
    done.fused_claim = claimed.is_some();
    let claimed = claimed.unwrap_or_else(|| "nothing".into());
    (verdict, format!(" and, in the same write, claims {claimed}"))
}

fn deliver(ledger: &Ledger<'_>, s: &mut State, i: usize, lost: bool, fused: bool) -> Done {
    let Some(sending) = s.worker(i).sending.take() else {
        return simple("nothing in flight".into());
    };
    let mut done = Done::default();
    let (verdict, claimed) = apply_sending(ledger, s, i, &sending, (lost, fused), &mut done);
    done.label = format!(
        "ledger {} {}'s {} (token#{}){claimed}",
        verdict,
        name(i),
        request_name(sending.request.as_ref()),
        sending.token
    );
    if lost {
        s.budget.lost_replies -= 1;
        fault(s, i);
        done.label.push_str(", reply lost");
        let now = s.worker_now(ledger.config, i);
        answer_driver(s, i, sending.token, |d| d.handle_failure(now, Failure::Ambiguous));
    }
    done
}

/// Hands worker `i`'s driver how its ledger call ended, if it still holds the lease
/// of token ordinal `token`.
fn answer_driver(s: &mut State, i: usize, token: u32, answer: impl FnOnce(&mut Driver)) {
    if let Some(h) = s.worker(i).held.as_mut().filter(|h| h.token == token) {
        answer(&mut h.driver);
    }
}

fn delay(config: &Config, s: &mut State, i: usize) -> Done {
    let Some(sending) = s.worker(i).sending.take() else {
        return simple("nothing in flight".into());
    };
    s.budget.delays -= 1;
    fault(s, i);
    if let Some(request) = sending.request.clone() {
        s.strays.push(Stray {
            from: i,
            attempt: sending.attempt,
            request,
            token: sending.token,
            sent_at: sending.sent_at,
        });
    }
    let now = s.worker_now(config, i);
    answer_driver(s, i, sending.token, |d| d.handle_failure(now, Failure::Ambiguous));
    simple(format!(
        "the network delays {}'s {} (token#{}); its reply times out",
        name(i),
        request_name(sending.request.as_ref()),
        sending.token
    ))
}

fn stray(ledger: &Ledger<'_>, s: &mut State, j: usize) -> Done {
    let st = s.strays.remove(j);
    let req = Req::Worker(&st.request, st.token, st.sent_at);
    let answer = s.request(ledger, st.attempt, &name(st.from), &req);
    let verdict = if answer.reply.is_ok() { "applies" } else { "refuses" };
    let mut done = simple(format!(
        "ledger {verdict} {}'s delayed {} (token#{})",
        name(st.from),
        st.request.op(),
        st.token
    ));
    if let Some(e) = answer.event {
        log(ledger.config, s, e, &mut done);
    }
    done
}

/// A fault touches worker `i`: its lease, and the calls its executor's client will
/// send again (the simulator excuses a late call of a worker a fault touched since
/// the claim of its delivery).
fn fault(s: &mut State, i: usize) {
    s.worker(i).faulted = true;
    for r in s.resends.iter_mut().filter(|r| r.from == i) {
        r.excused = true;
    }
}

/// A call the executor's client sends again on its own lands at the target, whatever
/// became of its attempt (the planted `executor-retries-detached`).
fn resend(ledger: &Ledger<'_>, s: &mut State, j: usize) -> Done {
    let r = s.resends.remove(j);
    let late_call = late_call(ledger.config, s, r.from, &r.exec, r.excused);
    let _ = call_target(ledger, s, r.from, &r.exec);
    Done {
        late_call,
        ..simple(format!(
            "{}'s executor client sends step {} (delivery {}) again on its own",
            name(r.from),
            r.exec.ordinal,
            r.exec.delivery
        ))
    }
}

/// With `executor-retries-detached` planted, the executor's client of worker `i`
/// will send a call that did not succeed (`failed`) again on its own, 4 s (ticks)
/// later.
fn detach(config: &Config, s: &mut State, i: usize, exec: &Exec, failed: bool) {
    if !failed || !config.bugs.contains(&Bug::ExecutorRetriesDetached) {
        return;
    }
    let w = &s.workers[i];
    let resend = Resend {
        from: i,
        exec: exec.clone(),
        due: s.tick + (DETACHED_RETRY_MS / TICK_MS) as u32,
        excused: w.faulted && w.lease == Some(exec.token),
    };
    s.resends.push(resend);
}

/// An operator request on attempt `k`. A refused one changes nothing and spends
/// nothing, so the search meets its state again and prunes it.
fn operator(ledger: &Ledger<'_>, s: &mut State, k: usize, request: OperatorRequest) -> Done {
    let answer = s.request(ledger, k, "operator", &Req::Operator(&request));
    match (&request, answer.reply.is_ok()) {
        (OperatorRequest::Reconcile, true) => s.budget.reconciles -= 1,
        (OperatorRequest::Abort { .. }, true) => s.budget.aborts -= 1,
        _ => {}
    }
    let verdict = match &answer.reply {
        Ok(_) => "applied",
        Err(_) => "refused",
    };
    let attempt = &s.attempts[k].record.attempt.id;
    let mut done = simple(format!("operator {} {attempt} ({verdict})", request.op()));
    if let Some(e) = answer.event {
        log(ledger.config, s, e, &mut done);
    }
    done
}

/// The enqueue of a new attempt of plan `p` with `action`, through the engine's
/// [`enqueue`] on the plan's history as the memory ledger makes it: the first
/// attempts (`execute`) and the operator's retries and compensates. A refused one
/// changes nothing. An applied retry or compensate spends an enqueue and gives the
/// new attempt the configuration's second budget; if every attempt has ended and
/// the workers are quiet, the past is archived first ([`archive`]).
pub(super) fn enqueue_attempt(ledger: &Ledger<'_>, s: &mut State, p: usize, action: Action) -> Done {
    let plan = &ledger.plans[p];
    let history: Vec<AttemptRecord> = s
        .attempts
        .iter()
        .filter(|a| a.record.attempt.plan_id == plan.id)
        .map(|a| super::ledger::record_of(a))
        .collect();
    let n = s.attempts.len() + 1;
    let ids = NewIds {
        attempt: AttemptId::new(format!("att-{n}")),
        command: CommandId::new(format!("cmd-{n}")),
        trace: None,
    };
    let operator = action != Action::Execute;
    let restart = operator && s.all_terminal() && s.quiet();
    let t = if restart { at(0, 0) } else { s.db_now() };
    let (outcome, after, mut label) = match enqueue(plan, &history, action, ids, t) {
        Ok(record) => {
            let rows = super::ledger::snap_of(record);
            let label = format!("operator enqueues {} of {} ({action})", rows.record.attempt.id, plan.id);
            (EventOutcome::Applied, Some(rows), label)
        }
        Err(refusal) => (
            EventOutcome::Refused(refusal.to_string()),
            None,
            format!("operator {action} of {} (refused)", plan.id),
        ),
    };
    if operator && after.is_some() {
        s.budget = Budget {
            enqueues: s.budget.enqueues.saturating_sub(1),
            ..ledger.config.second
        };
        if restart {
            archive(s, s.budget.enqueues > 0);
            s.limits = ledger.limits();
            label.push_str("; the attempts before it are archived, and the clock and the tokens start again");
        }
    }
    let count = history.len() + usize::from(after.is_some());
    let event = DbEvent {
        seq: 0,
        at_ms: 0,
        db_now: t,
        decided_at: t,
        from: if operator { "operator" } else { "enqueuer" }.into(),
        op: leasehold_engine::Op::Enqueue,
        attempt: after.as_ref().map(|a| a.record.attempt.id.clone()),
        ordinal: None,
        presented: None,
        before: None,
        after: after.clone(),
        outcome,
        plan_attempts: Some((history.len(), count)),
        reply_lost: false,
    };
    let mut done = simple(label);
    if let Some(rows) = after {
        s.attempts.push(Shared::new(rows));
    }
    log(ledger.config, s, event, &mut done);
    done
}

/// Archives the past once every attempt has ended and the workers are quiet: no
/// worker, request or executor call refers to an attempt any more, nothing open
/// holds an instant or a token, and every invariant of the attempts so far has been
/// checked on every transition that could change what it reads (their rows, claims,
/// calls and effects change no more). What the future reads of them is the plan's
/// history for the enqueue guard: the archived rows keep each attempt's identity,
/// action, number and status and (if `more` enqueues may come) its receipts'
/// steps and statuses, nothing else. The kept past, the target's records and every
/// worker's lease are dropped, and the clock and the token ordinals start again:
/// two pasts that end alike are one state from here on.
fn archive(s: &mut State, more: bool) {
    for snap in &mut s.attempts[s.archived..] {
        *snap = Shared::new(archived(&snap.record, more));
    }
    s.archived = s.attempts.len();
    s.tick = 0;
    s.workers.iter_mut().for_each(|w| *w = Shared::new(Worker::default()));
    s.past = Past::default();
    s.target = Shared::new(Effects::default());
    s.minted = 0;
}

/// An ended attempt's rows as the archive keeps them.
fn archived(r: &AttemptRecord, more: bool) -> Snap {
    let t0 = at(0, 0);
    let a = &r.attempt;
    let attempt = leasehold_engine::Attempt {
        input: None,
        input_sha256: None,
        order_key: None,
        id: a.id.clone(),
        plan_id: a.plan_id.clone(),
        number: a.number,
        action: a.action,
        status: a.status,
        created_at: t0,
        started_at: None,
        finished_at: None,
        error: None,
        trace: None,
        enqueue_key: None,
        request_sha256: None,
    };
    let receipts = if more {
        r.receipts
            .iter()
            .map(|x| leasehold_engine::Receipt {
                evidence: None,
                evidence_sha256: None,
                target_receipt: None,
                error: None,
                started_at: None,
                finished_at: None,
                ..x.clone()
            })
            .collect()
    } else {
        Vec::new()
    };
    let command = leasehold_engine::Command {
        available_at: t0,
        lease_owner: None,
        lease_token: None,
        lease_until: None,
        last_heartbeat_at: None,
        finished_at: None,
        delivery_count: 0,
        last_error: None,
        ..r.command.clone()
    };
    Snap {
        record: AttemptRecord {
            attempt,
            command,
            receipts,
        },
        token: None,
    }
}

/// The executor call in flight answers: done, its reply lost after the effect, or a
/// permanent failure before any effect.
fn executed(ledger: &Ledger<'_>, s: &mut State, i: usize, act: Act) -> Done {
    let Some(exec) = s.worker(i).exec.take() else {
        return simple("no executor call".into());
    };
    let (result, label) = match act {
        Act::ExecPermanent(_) => {
            s.budget.permanents -= 1;
            let r = ExecutorResult::Permanent("the target refuses".into());
            (r, "fails permanently")
        }
        Act::ExecTransient(_) => {
            s.budget.transients -= 1;
            let r = ExecutorResult::Transient("the target is unreachable".into());
            (r, "is unreachable for")
        }
        _ => {
            let done = call_target(ledger, s, i, &exec);
            if act == Act::ExecLost(i) {
                s.budget.exec_losses -= 1;
                fault(s, i);
                (ExecutorResult::Transient("reply lost".into()), "applies, reply lost")
            } else {
                (done, "applies")
            }
        }
    };
    let failed = !matches!(result, ExecutorResult::Done { .. } | ExecutorResult::Permanent(_));
    detach(ledger.config, s, i, &exec, failed);
    let now = s.worker_now(ledger.config, i);
    if let Some(h) = s.worker(i).held.as_mut().filter(|h| h.token == exec.token) {
        h.driver.handle_executed(now, exec.ordinal, result);
    }
    simple(format!(
        "target {label} {}'s step {} (delivery {})",
        name(i),
        exec.ordinal,
        exec.delivery
    ))
}

/// The target applies (or recognises) one call, as the simulator's target does, and
/// answers the executor's result.
fn call_target(ledger: &Ledger<'_>, s: &mut State, i: usize, exec: &Exec) -> ExecutorResult {
    let record = &s.attempts[exec.attempt].record;
    let receipt = record.receipt(exec.ordinal).cloned();
    let step = receipt
        .as_ref()
        .and_then(|r| ledger.plan_of(record).step(&r.step_code))
        .cloned();
    let (Some(r), Some(step)) = (receipt, step) else {
        return ExecutorResult::Permanent("no such step".into());
    };
    let sandbox = (step.executor == SANDBOX).then(|| plans::sandbox_id(&record.attempt.id, exec.delivery));
    let id = (r.idempotency_key.clone(), sandbox.clone());
    let call = CallRecord {
        at_ms: 0,
        sent_ms: 0,
        attempt: record.attempt.id.clone(),
        ordinal: exec.ordinal,
        key: r.idempotency_key.clone(),
        sandbox: sandbox.clone(),
        delivery: exec.delivery,
        worker: name(i),
        answer: if s.target.keys.contains_key(&id) {
            CallAnswer::Duplicate
        } else {
            CallAnswer::Applied
        },
        reply_lost: false,
        traceparent: None,
    };
    let seen = s.target.calls.iter().any(|c| {
        (&c.attempt, c.ordinal, c.delivery, &c.sandbox) == (&call.attempt, call.ordinal, call.delivery, &call.sandbox)
    });
    if !seen {
        s.target.update(|t| t.calls.push(call));
    }
    let reply = match s.target.keys.get(&id) {
        Some(k) => k.reply.clone(),
        None => {
            let attempt = s.attempts[exec.attempt].record.attempt.id.clone();
            s.target
                .update(|t| new_effect(t, &step.code, exec, id, sandbox.as_deref(), &attempt))
        }
    };
    ExecutorResult::Done {
        evidence: plans::evidence(&step, &r.idempotency_key, sandbox.as_deref(), &name(i), &reply.applied),
        target_receipt: reply.target_receipt,
    }
}

fn new_effect(
    s: &mut Effects,
    code: &str,
    exec: &Exec,
    id: (String, Option<String>),
    sandbox: Option<&str>,
    attempt: &leasehold_engine::AttemptId,
) -> TargetReply {
    let place = sandbox.map_or_else(|| format!("durable:{attempt}"), str::to_owned);
    let applied = s.applied.entry(place).or_default();
    applied.push(code.to_owned());
    let applied = applied.clone();
    s.receipts_given += 1;
    let reply = TargetReply {
        target_receipt: json!({ "target": "sim", "key": id.0, "receipt": format!("tr-{:06}", s.receipts_given) }),
        applied,
    };
    let record = KeyRecord {
        attempt: attempt.clone(),
        ordinal: exec.ordinal,
        step: code.to_owned(),
        effects: 1,
        deliveries: 1,
        reply: reply.clone(),
    };
    s.keys.insert(id, record);
    reply
}
