//! Exhaustive model checking of the lease protocol with the engine's own code.
//!
//! Contract: [`check`] explores every interleaving of a small [`Config`] (workers,
//! an attempt of each of its `resume` or `replay` plans and the operator's retry or
//! compensate, a lease of a few ticks, a delivery policy, bounded faults) breadth
//! first and answers a [`Report`]: the states explored, and the first state that
//! breaks an invariant with the shortest path to it, as a numbered step list. The model is the code: every ledger transition goes through
//! [`leasehold_engine::request::decide`] and [`leasehold_engine::Writes::apply_to`]
//! under its guard, exactly as the memory ledger applies it, with the planted bugs'
//! seams of the simulator's db host ([`crate::db::planted_instant`],
//! [`crate::db::skips_token_check`], [`crate::db::planted_decision`]); every worker
//! is the engine's [`leasehold_engine::driver::Driver`], and the model only performs
//! the actions its `poll_action` asks for.
//!
//! # Why a hand-written breadth-first search
//! Stateright wants `Hash + Eq` states; the engine's rows and the driver hold
//! `serde_json::Value`s and a [`leasehold_engine::LeaseToken`] whose `Debug` hides
//! its value. Here a state is fingerprinted by a 64-bit digest of its `Debug` text
//! (tokens are kept as ordinals beside the rows, as the simulator's
//! [`crate::db::Snap`] keeps them; the kept past, which only grows, by the chained
//! digest of its events), and the search keeps, per fingerprint, its parent's
//! fingerprint and the action that led there (the steps' labels are made again, by
//! performing the path once more, only for a counterexample), so the first
//! violation found is one with the fewest steps. No dependency is added.
//!
//! Every transition is checked, also one that leads to a state already reached (the
//! invariants on a transition's own events could break on one path into a state and
//! not on another). Most transitions change one part of a state: the attempts' rows,
//! each worker, the target's records and the kept past are each shared by the
//! states that have not changed them, with their digest computed once (a state's
//! fingerprint digests theirs), and a transition that logs no event, whose checker
//! input is all in the state, is checked only once per distinct input. So `large`,
//! millions of states, fits in a few gigabytes.
//!
//! # State
//! Every attempt's rows (as [`crate::db::Snap`]: the memory ledger's record, the
//! token as an ordinal), in the order they were enqueued; each worker's driver with
//! its lease (naming its attempt), its request in flight and its executor call (or
//! none when idle or crashed), whether it is paused and whether a
//! fault touched its current lease; requests delayed in the network; the database
//! clock (ticks) and each worker's fixed skew; the target's effects per idempotency
//! key and sandbox; the fault and operator budgets left. History is kept small: only
//! what the invariants need from the past, the enqueues and the applied claims (for
//! invariants 6, 7 and 12) and each delivery's first call of each step (invariant 12;
//! a repeated call checks nothing new). Every other invariant is checked on each
//! transition's own events, so two paths that reach the same rows, drivers and
//! effects by different histories are one state.
//!
//! # Reductions
//! What cannot influence the future is dropped, so that more paths meet:
//! - a worker's lease that no row holds any more is forgotten with whether a fault
//!   touched it (a token is never minted twice: no claim can take it over again);
//! - once every attempt has ended and the workers are quiet, the operator's retry or
//!   compensate archives the past: no worker, request or call refers to an attempt
//!   any more and nothing open holds an instant or a token, so the attempts so far
//!   keep only what the engine's enqueue guard reads (identity, action, number,
//!   status, and the receipts' steps and statuses while another enqueue may come),
//!   the kept past, the target's records and the leases are dropped (every
//!   invariant read them on every transition that could change them, and none
//!   reads two attempts together but the enqueue counts and invariant 9, which only
//!   compares successful forward attempts, and a retry follows only a failed or
//!   aborted one), and the clock and the token ordinals start again at t=0 and #1.
//!   Every ending of the first attempt leads to one of a few second attempts (a
//!   retry, or a compensate of one or two steps), each explored once, with the
//!   configuration's `second` budget of faults;
//! - once no enqueue may come, the archived attempts leave the fingerprint (their
//!   number stays): nothing reads them any more (they are terminal, so no claim,
//!   reconcile or abort takes them, the enqueue guard runs no more, and the
//!   invariants read the attempts not archived), so a second attempt is explored
//!   once whatever way the first one ended.
//!
//! # Actions
//! A worker acts (fires its due timers and performs what `poll_action` answers:
//! a ledger request or an executor call), or claims when idle (the first claimable
//! command, oldest `available_at` first, as the memory ledger claims); its request
//! is delivered and answered, delivered with the reply lost, or delayed in the
//! network (the worker sees an ambiguous reply, the request lands later); a request
//! that ends its attempt ([`leasehold_engine::driver::Driver::ends_attempt`]) is
//! delivered either alone or with the worker's next claim in the same write, as
//! `Ledger::worker_then_claim` does; its executor call answers (done, reply lost
//! after the effect, permanent failure, or unreachable: a transient failure before
//! the target); it crashes or pauses and resumes; the operator reconciles or aborts
//! an attempt, or, once every attempt of a plan has ended and the workers are
//! quiet, retries or compensates it: a new attempt enqueued through the engine's
//! `enqueue` under its action guard, which then runs with the `second` budget of
//! faults; the clock advances one tick. Time advances only when no worker that is
//! up has work due at the current tick (maximal progress: a healthy worker is never
//! late by the scheduler's choice), and an executor call answers within
//! `exec_ticks`.
//!
//! # Properties
//! After every transition: the simulator's safety invariants 1–7, 9, 11, 12, 14 and 15 (the
//! checker's own functions, [`crate::checker::check_transition`]: 11 is the history
//! model, [`crate::history::transitions`], and 14 and 15 the delivery policy's
//! [`crate::delivery::claims_after_available`] and
//! [`crate::delivery::delivery_cap`]); 19 in a mixed fleet
//! ([`crate::routing::claims_runnable`]) and 20–22 under per-target limits
//! ([`crate::limits::check`], on the whole log, which such a configuration keeps);
//! and two of the model's own: 13 (a lease taken over only from a holder a fault
//! touched) and 17 (no call of a step sent after its attempt ended, unless a fault
//! of the lease it came from, or an abort at most a lease before, excuses it, as
//! the simulator excuses it). Liveness (invariant 8): from every state, the
//! fault-free fair schedule (paused workers resume, requests and calls answer at
//! once, the clock advances when nothing is due, no operator) ends every attempt
//! within `liveness_ticks`.
//!
//! # The delivery policy
//! The ledger decides each claim and give-back with the attempt's plan, as the
//! memory ledger does; each driver has the plan's policy
//! ([`leasehold_engine::driver::Driver::with_policy`], with the configuration's
//! fixed `jitter`). The shipped plans allow two deliveries, one call of a step per
//! delivery and a backoff of half a tick: an unreachable target makes the driver
//! give the command back at once, claimable again from the next tick, and the
//! second give-back (or a claim after a takeover of the second delivery) ends the
//! attempt FAILED, exhausted. The `policy` and `large` configurations have
//! transient failures to spend. The simulator's invariants 16 and 18 need what the
//! model has not: a target that is down or flaky by its plan (here a transient
//! failure is a fault, and liveness, with no fault, is 16's bound). The executor's
//! client sends each call once; the planted `executor-retries-detached` makes it
//! send a call that did not succeed (unreachable, or its reply lost) again on its
//! own four ticks later, landing at that tick whatever the driver did since.
//!
//! # Routing and per-target limits
//! In the `routed` configurations the first worker runs only the durable target's
//! executor: its claims carry its capabilities, which the ledger's candidates and
//! the engine's claim decision honour as the memory ledger does. In the `limited`
//! ones the ledger keeps per-target limits in the memory ledger's own
//! [`leasehold::ledger::limits::LimitTable`] (part of each state): a claim's
//! candidates leave out blocked targets, a claim's lease is admitted by its target
//! or the candidate passed over, and a worker's write goes through
//! [`leasehold::ledger::limits::LimitTable::worker_write`]; the limits' planted bugs
//! loosen the table for each claim and set it back after, as the simulator's db
//! host does.

mod digest;
mod ledger;
mod search;
mod state;

pub use search::{check, Report};

use crate::bugs::Bug;
use crate::plans::{DURABLE, SANDBOX};
use leasehold_engine::limits::{Breaker, Rate, TargetLimit};
use leasehold_engine::{Recovery, RetrySpec};

/// Milliseconds per tick of the model's clock.
pub const TICK_MS: u64 = 1_000;

/// Half a tick: the shipped configurations' backoff, so that a command given back
/// at a tick is claimable from the next one, and a claim decided early is seen.
const HALF_TICK_MS: i64 = TICK_MS as i64 / 2;

/// How many of each fault and operator action a run may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Budget {
    /// Worker crashes (the worker restarts idle).
    pub crashes: u8,
    /// Worker pauses (resumed later).
    pub pauses: u8,
    /// Ledger replies lost after the commit.
    pub lost_replies: u8,
    /// Requests delayed in the network past their sender's lease.
    pub delays: u8,
    /// Executor replies lost after the target's effect.
    pub exec_losses: u8,
    /// Permanent executor failures.
    pub permanents: u8,
    /// Transient executor failures before the target (it is unreachable): the
    /// driver calls again within its step's tries, then gives the command back.
    pub transients: u8,
    /// Operator reconciles.
    pub reconciles: u8,
    /// Operator aborts.
    pub aborts: u8,
    /// Operator retries and compensates: a new attempt of a plan whose attempts
    /// are all terminal, enqueued with `retry` or `compensate` under the engine's
    /// action guard.
    pub enqueues: u8,
}

/// One bounded configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Its name, in reports.
    pub name: String,
    /// Each worker's clock offset from the database's, in milliseconds.
    pub skews_ms: Vec<i64>,
    /// The plans' recovery mode (of the odd-numbered plans, with `mixed_plans`).
    pub recovery: Recovery,
    /// Whether the even-numbered plans are of the other recovery mode: a resume
    /// plan's steps run on the durable target, a replay plan's in a sandbox.
    pub mixed_plans: bool,
    /// The first this many workers run only the durable target's executor (a mixed
    /// fleet): their claims carry their capabilities, the others' none.
    pub durable_only: u32,
    /// The per-target limits set on the ledger before the first attempt.
    pub limits: Vec<TargetLimit>,
    /// How many plans, each with a first attempt enqueued at the start.
    pub plans: u32,
    /// The plan's steps.
    pub steps: u32,
    /// The lease, in ticks.
    pub lease_ticks: u32,
    /// The last tick the clock may reach.
    pub horizon: u32,
    /// The most ticks an executor call may take to answer.
    pub exec_ticks: u32,
    /// Faults and operator actions.
    pub budget: Budget,
    /// The faults and operator actions of the operator's retry or compensate: once
    /// every attempt has ended and the workers are quiet, the past is archived and
    /// the new attempt starts with this budget (and the clock at t=0); its
    /// `enqueues` is not read: the operator's enqueues are the first budget's.
    pub second: Budget,
    /// The plans' delivery policy (their `[retry]` table).
    pub retry: Option<RetrySpec>,
    /// Picks the point in each give-back's backoff window (the driver's jitter; the
    /// model draws no randomness).
    pub jitter: u64,
    /// The bound of the liveness check, in ticks from any state.
    pub liveness_ticks: u32,
    /// Planted bugs.
    pub bugs: Vec<Bug>,
    /// Stop after this many states (0: explore them all); a report says when it
    /// stopped early.
    pub max_states: usize,
    /// Write a line on stderr every million states (the states, those waiting,
    /// the transitions and the time so far).
    pub progress: bool,
}

impl Config {
    /// The CI configuration for `recovery`: two workers (the second one's clock a
    /// tick ahead), one plan of two steps, a lease of three ticks, the clock up to
    /// tick 5, executor calls of up to three ticks; a delivery policy of two
    /// deliveries, one call of a step per delivery and a backoff of half a tick;
    /// one crash, one pause (whose request in flight lands late: the stale-token
    /// case), one reconcile, one abort, and one retry or compensate (a second
    /// attempt, without faults).
    pub fn small(recovery: Recovery) -> Self {
        Self {
            name: format!("small-{recovery}"),
            skews_ms: vec![0, TICK_MS as i64],
            recovery,
            mixed_plans: false,
            durable_only: 0,
            limits: Vec::new(),
            plans: 1,
            steps: 2,
            lease_ticks: 3,
            horizon: 5,
            exec_ticks: 3,
            budget: Budget {
                crashes: 1,
                pauses: 1,
                reconciles: 1,
                aborts: 1,
                enqueues: 1,
                ..Budget::default()
            },
            second: Budget::default(),
            retry: Some(RetrySpec {
                max_deliveries: Some(2),
                backoff_base_ms: Some(HALF_TICK_MS),
                backoff_max_ms: Some(HALF_TICK_MS),
                step_max_tries: Some(1),
                deadline_secs: None,
            }),
            jitter: HALF_TICK_MS as u64,
            liveness_ticks: 24,
            bugs: Vec::new(),
            max_states: 0,
            progress: false,
        }
    }

    /// The larger configuration for `recovery`: the small one with a tick more of
    /// horizon, a lost ledger reply, a transient executor failure (a give-back),
    /// and the first attempt's faults and operator actions (but another retry or
    /// compensate) for the second attempt too.
    pub fn large(recovery: Recovery) -> Self {
        let mut c = Self::small(recovery);
        c.name = format!("large-{recovery}");
        c.horizon = 6;
        c.budget.lost_replies = 1;
        c.budget.transients = 1;
        c.second = Budget {
            enqueues: 0,
            ..c.budget
        };
        c
    }

    /// Two plans of one step each, their first attempts open together: the one
    /// configuration where a write that ends an attempt can claim another (with a
    /// single plan, the engine's enqueue guard leaves no other attempt open), with
    /// one crash and one reconcile.
    pub fn pair(recovery: Recovery) -> Self {
        let mut c = Self::small(recovery);
        c.name = format!("pair-{recovery}");
        c.plans = 2;
        c.steps = 1;
        c.budget = Budget {
            crashes: 1,
            reconciles: 1,
            ..Budget::default()
        };
        c
    }

    /// The delivery policy's configuration: the small one with two transient
    /// executor failures (two give-backs: the second exhausts the attempt's two
    /// deliveries) in place of the pause, so that the search goes through every
    /// give-back, backoff, re-claim and exhaustion.
    pub fn policy(recovery: Recovery) -> Self {
        let mut c = Self::small(recovery);
        c.name = format!("policy-{recovery}");
        c.budget.pauses = 0;
        c.budget.transients = 2;
        c
    }

    /// A mixed fleet: the pair's two plans, the second of the other recovery mode
    /// (one plan on the durable target, one in a sandbox), and a first worker that
    /// runs only the durable target's executor.
    pub fn routed(recovery: Recovery) -> Self {
        let mut c = Self::pair(recovery);
        c.name = format!("routed-{recovery}");
        c.mixed_plans = true;
        c.durable_only = 1;
        c
    }

    /// Per-target limits: the pair's two plans, both on the target of `recovery`,
    /// which takes one lease at a time, one entry per two ticks, and whose breaker
    /// one give-back opens for three ticks; with one crash, one reconcile and one
    /// transient executor failure (a give-back).
    pub fn limited(recovery: Recovery) -> Self {
        let mut c = Self::pair(recovery);
        c.name = format!("limited-{recovery}");
        let target = match recovery {
            Recovery::Resume => DURABLE,
            Recovery::Replay => SANDBOX,
        };
        c.limits = vec![TargetLimit {
            target: target.to_owned(),
            max_in_flight: Some(1),
            rate: Some(Rate {
                count: 1,
                per_ms: 2 * TICK_MS,
            }),
            breaker: Some(Breaker {
                failures: 1,
                cooldown_ms: 3 * TICK_MS,
            }),
        }];
        c.budget.transients = 1;
        c
    }

    /// The configuration the model checker looks for `bug` in, by the invariant the
    /// simulator catches it by: the mixed fleet's for routing (19), the limited
    /// target's for the limits (20–22), the delivery policy's for the policy
    /// (14–18), the small one of `recovery` for the others.
    pub fn finding(bug: Bug, recovery: Recovery) -> Self {
        let make = match bug.caught_by().0 {
            19 => Config::routed,
            20..=22 => Config::limited,
            14.. => Config::policy,
            _ => Config::small,
        };
        make(recovery).with_bugs(&[bug])
    }

    /// The configuration names [`Config::named`] knows.
    pub const NAMES: &'static [&'static str] = &["small", "policy", "large", "pair", "routed", "limited"];

    /// The named configurations ([`Config::NAMES`]), one per recovery mode.
    pub fn named(name: &str) -> Option<Vec<Config>> {
        let make = match name {
            "small" => Config::small,
            "policy" => Config::policy,
            "large" => Config::large,
            "pair" => Config::pair,
            "routed" => Config::routed,
            "limited" => Config::limited,
            _ => return None,
        };
        Some(vec![make(Recovery::Resume), make(Recovery::Replay)])
    }

    /// This configuration with `bugs` planted.
    pub fn with_bugs(mut self, bugs: &[Bug]) -> Self {
        self.bugs = bugs.to_vec();
        self
    }

    fn lease_ms(&self) -> u64 {
        u64::from(self.lease_ticks) * TICK_MS
    }

    /// The recovery mode of plan `n` (from 1).
    fn recovery_of(&self, n: u32) -> Recovery {
        match (self.mixed_plans && n.is_multiple_of(2), self.recovery) {
            (false, mode) => mode,
            (true, Recovery::Resume) => Recovery::Replay,
            (true, Recovery::Replay) => Recovery::Resume,
        }
    }

    /// Whether worker `i` (from 0) runs only the durable target's executor.
    fn is_durable_only(&self, i: usize) -> bool {
        i < self.durable_only as usize
    }
}
