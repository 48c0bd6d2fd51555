//! Breadth-first search over the model's states, with the invariants checked on
//! every transition and liveness from every state.

use super::digest::Shared;
use super::ledger::Ledger;
use super::state::{enabled, enqueue_attempt, keeps, perform, Act, Done, Effects, Past, State, Worker};
use super::Config;
use crate::checker::{self, CheckInput, Violation};
use crate::clients::ClientLog;
use crate::clock::EPOCH_MS;
use crate::plans::{DURABLE, KNOWN, SANDBOX};
use crate::profile::WorldParams;
use crate::target::TargetState;
use crate::trace::Trace;
use crate::{limits, routing};
use leasehold_engine::{Action, Plan, PlanId, PlanSpec, Recovery, Step, Timestamp};
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

/// How many states apart the progress lines come ([`Config::progress`]).
const PROGRESS_EVERY: usize = 1_000_000;

/// The outcome of checking one configuration.
#[derive(Debug, Clone)]
pub struct Report {
    /// The configuration's name.
    pub config: String,
    /// Distinct states reached.
    pub states: usize,
    /// Transitions performed.
    pub transitions: u64,
    /// Of those, the writes that ended an attempt and claimed another command in
    /// the same transaction.
    pub fused_claims: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// The first violation found, if any.
    pub counterexample: Option<Counterexample>,
    /// Whether the search stopped at the configuration's state limit.
    pub truncated: bool,
    /// The most states that were waiting to be explored at once.
    pub frontier: usize,
}

/// A shortest path to a state that breaks an invariant.
#[derive(Debug, Clone)]
pub struct Counterexample {
    /// What broke.
    pub violations: Vec<Violation>,
    /// The steps from the initial state, in order.
    pub steps: Vec<String>,
}

impl Counterexample {
    /// Whether invariant `n` is among the broken ones.
    pub fn breaks(&self, n: u8) -> bool {
        self.violations.iter().any(|v| v.invariant == n)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} states{}, {} transitions ({} fused claims) in {:.1} s, at most {} states waiting",
            self.config,
            self.states,
            if self.truncated { " (stopped at the limit)" } else { "" },
            self.transitions,
            self.fused_claims,
            self.elapsed.as_secs_f64(),
            self.frontier
        )?;
        let Some(c) = &self.counterexample else {
            return writeln!(f, "  every invariant holds");
        };
        writeln!(f, "  counterexample of {} steps:", c.steps.len())?;
        for (i, step) in c.steps.iter().enumerate() {
            writeln!(f, "  {}. {step}", i + 1)?;
        }
        for v in &c.violations {
            writeln!(f, "  violated {v}")?;
        }
        Ok(())
    }
}

/// The state's fingerprint ([`State::fingerprint`]).
fn fingerprint(s: &State) -> u64 {
    s.fingerprint()
}

/// Hashes a fingerprint, which is a digest already, as itself.
#[derive(Default)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Sets and maps keyed by fingerprints.
type ByPrint = BuildHasherDefault<Identity>;

/// A set of fingerprints. Hashed, unlike the simulator's other collections: the
/// search only inserts and looks up (it never reads the order), the hasher has no
/// random state, and a B-tree of ten million fingerprints is slower and larger.
#[allow(clippy::disallowed_types)]
type Prints = std::collections::HashSet<u64, ByPrint>;

/// Each state reached (but the first) by its fingerprint: the fingerprint of the
/// state it was first reached from and the action that led there. The steps' labels
/// are not kept: the path is performed again from the first state to print them.
#[allow(clippy::disallowed_types)]
type Parents = std::collections::HashMap<u64, (u64, Act), ByPrint>;

/// Plan `n` of `config`: `steps` steps on the durable target (`resume`) or in a
/// sandbox (`replay`), by its recovery mode ([`Config::recovery_of`]).
fn model_plan(config: &Config, n: u32) -> Plan {
    let recovery = config.recovery_of(n);
    let executor = match recovery {
        Recovery::Resume => DURABLE,
        Recovery::Replay => SANDBOX,
    };
    let steps = (1..=config.steps)
        .map(|i| Step {
            code: format!("step-{i}"),
            executor: executor.to_owned(),
            target: None,
            payload: json!({ "delay_ms": 0, "op": format!("step-{i}") }),
            retry: None,
        })
        .collect();
    let spec = PlanSpec {
        input: None,
        on_failure: None,
        name: format!("model-{recovery}-{n}"),
        recovery: recovery.to_string(),
        volatile_fields: vec!["worker".into()],
        steps,
        retry: config.retry.clone(),
        queue: None,
    };
    let t0 = Timestamp::from_millis(EPOCH_MS);
    spec.into_plan(KNOWN, PlanId::new(format!("plan-{n}")), t0)
        .expect("the model's plan is valid")
}

/// The state before any step: each plan's first attempt enqueued (`execute`).
fn initial(ledger: &Ledger<'_>) -> State {
    let config = ledger.config;
    let mut s = State {
        tick: 0,
        attempts: Vec::new(),
        archived: 0,
        workers: vec![Shared::new(Worker::default()); config.skews_ms.len()],
        strays: Vec::new(),
        resends: Vec::new(),
        limits: ledger.limits(),
        target: Shared::new(Effects::default()),
        past: Past::default(),
        budget: config.budget,
        minted: 0,
    };
    for p in 0..ledger.plans.len() {
        enqueue_attempt(ledger, &mut s, p, Action::Execute);
    }
    s
}

/// The simulator's invariants on one transition, plus 13. A transition that logs no
/// event gives the checker nothing but what the state shows it (the attempts not
/// archived, the target's records, the kept past: [`State::checked_digest`]), so its
/// verdict is looked up in `clean`, the digests of such inputs every invariant held
/// on, before the checker runs.
fn checked(
    config: &Config,
    plans: &BTreeMap<PlanId, Plan>,
    (s, done): (&State, &Done),
    clean: &mut Prints,
) -> Vec<Violation> {
    if !done.events.is_empty() || done.healthy_takeover.is_some() || done.late_call.is_some() {
        return violations(config, plans, s, done);
    }
    let input = s.checked_digest();
    if clean.contains(&input) {
        return Vec::new();
    }
    let v = violations(config, plans, s, done);
    if v.is_empty() {
        clean.insert(input);
    }
    v
}

/// The simulator's invariants on one transition: 1–7, 9, 11, 12, 14 and 15 by the
/// checker, 19 where a worker runs only the durable target's executor, 20–22 where
/// the configuration sets per-target limits, and the model's own 13 and 17.
fn violations(config: &Config, plans: &BTreeMap<PlanId, Plan>, s: &State, done: &Done) -> Vec<Violation> {
    // The kept past ends with this transition's own kept events: they go back in
    // their place among its others (a give-back, then the claim fused with it).
    let past = s.past.events();
    let before = past.len() - done.events.iter().filter(|e| keeps(config, e)).count();
    let mut events = past[..before].to_vec();
    events.extend(done.events.iter().cloned());
    let mut target = TargetState::new(0, 0.0, 1, Trace::new());
    target.keys = s.target.keys.clone();
    target.calls = s.target.calls.clone();
    let latest: BTreeMap<_, _> = s.live().map(|a| (a.record.attempt.id.clone(), a.clone())).collect();
    let clients = ClientLog::default();
    let input = CheckInput {
        events: &events,
        latest: &latest,
        plans,
        target: &target,
        clients: &clients,
        liveness: None,
        faults: None,
        timing: None,
    };
    let mut v = checker::check_transition(&input, &done.events);
    if config.durable_only > 0 {
        let world = WorldParams {
            durable_only_workers: config.durable_only,
            ..WorldParams::default()
        };
        v.extend(routing::claims_runnable(&done.events, plans, &world));
    }
    if !config.limits.is_empty() {
        v.extend(limits::check(&events, &config.limits));
    }
    let own = [(13, &done.healthy_takeover), (17, &done.late_call)];
    for (invariant, message) in own {
        if let Some(message) = message {
            v.push(Violation {
                invariant,
                message: message.clone(),
            });
        }
    }
    v
}

/// Runs the fault-free fair schedule from `s` (whose fingerprint is `h`; no operator either); answers why it
/// did not end every attempt within the bound. States proven to end are
/// remembered in `live`.
fn liveness(ledger: &Ledger<'_>, (mut h, s): (u64, &State), live: &mut Prints) -> Option<String> {
    let mut cur = s.clone();
    let mut seen = Vec::new();
    let bound = cur.tick + ledger.config.liveness_ticks;
    for step in 0..10_000 {
        if step > 0 {
            h = fingerprint(&cur);
        }
        if live.contains(&h) || cur.all_terminal() {
            live.extend(seen);
            return None;
        }
        seen.push(h);
        if cur.tick > bound {
            break;
        }
        let Some(act) = enabled(ledger, &cur, false).first().copied() else {
            break;
        };
        perform(ledger, &mut cur, act);
    }
    let open: Vec<String> = cur
        .attempts
        .iter()
        .filter(|a| !a.record.attempt.status.is_terminal())
        .map(|a| {
            format!(
                "{} {} / {}",
                a.record.attempt.id, a.record.attempt.status, a.record.command.status
            )
        })
        .collect();
    Some(format!(
        "the fault-free fair schedule did not end every attempt within {} ticks (at t={}: {})",
        ledger.config.liveness_ticks,
        cur.tick,
        open.join(", ")
    ))
}

/// The steps from the first state to the state of fingerprint `h`, then `last`,
/// labelled as their actions are performed again from `init` (the search is
/// deterministic).
fn path(
    ledger: &Ledger<'_>,
    parents: &Parents,
    (root, init): (u64, &State),
    (mut h, last): (u64, Option<Act>),
) -> Vec<String> {
    let mut acts: Vec<Act> = last.into_iter().collect();
    while h != root {
        let Some((parent, act)) = parents.get(&h) else { break };
        acts.push(*act);
        h = *parent;
    }
    let mut s = init.clone();
    acts.iter()
        .rev()
        .map(|act| perform(ledger, &mut s, *act).label)
        .collect()
}

/// Explores every state of `config` breadth first; stops at the first violation.
pub fn check(config: &Config) -> Report {
    // Wall time only for the report; nothing the search decides reads it.
    #[allow(clippy::disallowed_methods)]
    let started = Instant::now();
    let model_plans: Vec<Plan> = (1..=config.plans.max(1)).map(|n| model_plan(config, n)).collect();
    let ledger = Ledger {
        config,
        plans: &model_plans,
    };
    let plans: BTreeMap<PlanId, Plan> = model_plans.iter().map(|p| (p.id.clone(), p.clone())).collect();
    let init = initial(&ledger);
    let root = fingerprint(&init);
    let mut parents = Parents::default();
    let mut live = Prints::default();
    let mut clean = Prints::default();
    let mut queue = VecDeque::from([(root, init.clone())]);
    let (mut transitions, mut fused_claims) = (0u64, 0u64);
    let mut found = None;
    let mut truncated = false;
    let (mut frontier, mut reported) = (0, 0);
    'search: while let Some((h, s)) = queue.pop_front() {
        if config.max_states > 0 && parents.len() >= config.max_states {
            truncated = true;
            break;
        }
        frontier = frontier.max(queue.len() + 1);
        if config.progress && parents.len() >= reported + PROGRESS_EVERY {
            reported = parents.len();
            let elapsed = started.elapsed().as_secs_f64();
            let (states, waiting) = (parents.len() + 1, queue.len());
            eprintln!(
                "{}: {states} states, {waiting} waiting, {transitions} transitions, {elapsed:.0} s",
                config.name
            );
        }
        if let Some(why) = liveness(&ledger, (h, &s), &mut live) {
            found = Some((
                (h, None),
                vec![Violation {
                    invariant: 8,
                    message: why,
                }],
            ));
            break;
        }
        if s.settled() {
            continue;
        }
        for act in enabled(&ledger, &s, true) {
            let mut next = s.clone();
            let done = perform(&ledger, &mut next, act);
            transitions += 1;
            fused_claims += u64::from(done.fused_claim);
            let v = checked(config, &plans, (&next, &done), &mut clean);
            if !v.is_empty() {
                found = Some(((h, Some(act)), v));
                break 'search;
            }
            let n = fingerprint(&next);
            if n == root || parents.contains_key(&n) {
                continue;
            }
            parents.insert(n, (h, act));
            queue.push_back((n, next));
        }
    }
    Report {
        config: config.name.clone(),
        states: parents.len() + 1,
        transitions,
        fused_claims,
        elapsed: started.elapsed(),
        truncated,
        frontier,
        counterexample: found.map(|(end, violations)| Counterexample {
            violations,
            steps: path(&ledger, &parents, (root, &init), end),
        }),
    }
}
