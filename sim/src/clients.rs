//! The simulation's clients: one enqueues attempts throughout the safety phase, one
//! operator reconciles and aborts at seed-chosen moments.
//!
//! Contract: clients talk to the db host through the same [`RpcLedger`] as the
//! workers (true clocks) and tolerate every transport error. The enqueuer delivers
//! the profile's plans, some attempts with a scheduled start, and records
//! each acknowledged and each refused enqueue in the [`ClientLog`] (invariant 7);
//! an enqueue whose outcome is unknown is counted as ambiguous. Both clients stop
//! acting when the safety phase ends and then mark themselves done.

use crate::clock::{elapsed_ms, SimClock};
use crate::plans;
use crate::profile::ClientParams;
use crate::rng::Rng;
use crate::rpc::RpcLedger;
use crate::trace::Trace;
use leasehold::ledger::{EnqueueRequest, Ledger, LedgerError};
use leasehold_engine::transition::Start;
use leasehold_engine::{Action, AttemptId, AttemptRecord, AttemptStatus, CommandStatus, Plan, PlanId, TraceContext};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// What the clients saw.
#[derive(Debug, Default)]
pub struct ClientLog {
    /// The plans registered.
    pub plans: Vec<Plan>,
    /// Acknowledged enqueues.
    pub acked: Vec<(PlanId, Action, AttemptId)>,
    /// The trace each acknowledged enqueue that named one joined (its `traceparent`).
    pub traced: BTreeMap<AttemptId, TraceContext>,
    /// Every trace an enqueue named, whatever its outcome (an enqueue whose reply was
    /// lost may have been applied).
    pub named: Vec<TraceContext>,
    /// The attempts acknowledged to each enqueue key, one per acknowledged try (a
    /// keyed request is sent again after an unknown outcome, and now and then after
    /// an acknowledged one).
    pub keys: BTreeMap<String, Vec<AttemptId>>,
    /// Refusals of a keyed request that an earlier try had acknowledged, with the
    /// refusal: the same key with the same request must answer, never be refused.
    pub key_refusals: Vec<(String, String)>,
    /// Refused enqueues, with the refusal.
    pub refused: Vec<(PlanId, Action, String)>,
    /// Enqueues whose outcome is unknown.
    pub ambiguous: u64,
    /// Operator actions taken (reconcile or abort), with their outcome.
    pub operator: Vec<String>,
    /// The enqueuer finished.
    pub enqueuer_done: bool,
    /// The operator finished.
    pub operator_done: bool,
}

/// What a client needs.
#[derive(Debug, Clone)]
pub struct ClientCtx {
    /// Shared log.
    pub log: Rc<RefCell<ClientLog>>,
    /// Shared trace.
    pub trace: Trace,
    /// The run's seed.
    pub seed: u64,
    /// When the safety phase ends (simulated ms).
    pub safety_ms: u64,
    /// Ledger RPC deadline.
    pub rpc_timeout_ms: u64,
}

impl ClientCtx {
    fn ledger(&self, host: &str) -> RpcLedger {
        RpcLedger::new(host, Arc::new(SimClock::default()), self.rpc_timeout_ms)
    }
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Registers the profile's plans (retrying through faults), then enqueues attempts
/// until the safety phase ends, some of them (the profile's `scheduled_share`) to
/// start later.
pub async fn enqueuer(ctx: ClientCtx, clients: ClientParams) -> turmoil::Result {
    let ledger = ctx.ledger("enqueuer");
    let mut rng = Rng::new(ctx.seed, "enqueuer");
    // Streams of their own: the traces and keys drawn leave the enqueuer's choices as
    // they were.
    let mut traces = Rng::new(ctx.seed, "traces");
    let mut keys = Rng::new(ctx.seed, "enqueue-keys");
    let mut users = Rng::new(ctx.seed, "order-keys");
    let mut sent = 0u64;
    let mut plans = Vec::new();
    for spec in plans::named(&clients.plans)? {
        loop {
            match ledger.register_plan(spec.clone(), plans::KNOWN).await {
                Ok(p) => {
                    plans.push(p);
                    break;
                }
                Err(e) if e.is_transient() => sleep_ms(100).await,
                Err(e) => return Err(format!("registering plan {}: {e}", spec.name).into()),
            }
        }
    }
    ctx.log.borrow_mut().plans = plans.clone();
    let every_ms = clients.enqueue_every_ms;
    while elapsed_ms() < ctx.safety_ms {
        sleep_ms(rng.range(every_ms[0], every_ms[1])).await;
        if elapsed_ms() >= ctx.safety_ms {
            break;
        }
        let plan = &plans[rng.pick(plans.len())];
        let Ok(history) = ledger.history(&plan.id).await else {
            continue;
        };
        let action = choose_action(&history, &mut rng);
        let start = choose_start(&clients, &mut rng);
        sent += 1;
        let key = keys.chance(0.6).then(|| format!("key-{sent}"));
        let mut request = EnqueueRequest::new(action)
            .at(start)
            .traced(choose_parent(&mut traces))
            .keyed(key);
        if plan.is_template() {
            // A change to one of a few users, in order on the user's key.
            let (input, order_key) = plans::template_input(users.pick(3) as u64, sent);
            request = EnqueueRequest {
                action: Action::Execute,
                ..request
            }
            .with_input(Some(input))
            .ordered(Some(order_key));
        }
        enqueue_keyed(&ctx, &ledger, plan, request, &mut keys).await;
    }
    ctx.log.borrow_mut().enqueuer_done = true;
    Ok(())
}

/// When an enqueue's command starts: now, or (for the profile's scheduled share)
/// after a drawn delay.
fn choose_start(clients: &ClientParams, rng: &mut Rng) -> Start {
    if clients.scheduled_share > 0.0 && rng.chance(clients.scheduled_share) {
        Start::After(rng.range(clients.scheduled_ms[0], clients.scheduled_ms[1]))
    } else {
        Start::Now
    }
}

/// The trace an enqueue joins: half of them name one (a caller's `traceparent`),
/// the rest start their own.
fn choose_parent(rng: &mut Rng) -> Option<TraceContext> {
    if !rng.chance(0.5) {
        return None;
    }
    let (high, low, span) = (rng.next_u64(), rng.next_u64(), rng.next_u64());
    let text = format!("00-{high:016x}{:016x}-{:016x}-01", low | 1, span | 1);
    Some(TraceContext::parse(&text).expect("a well-formed traceparent"))
}

/// How one enqueue went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Acked,
    Refused,
    Unknown,
}

/// Enqueues; a keyed request is sent again once after an unknown outcome (as a client
/// whose request timed out does), and now and then once more after an acknowledged
/// one (a second click): each answer must name the same attempt.
async fn enqueue_keyed(ctx: &ClientCtx, ledger: &RpcLedger, plan: &Plan, request: EnqueueRequest, rng: &mut Rng) {
    let first = enqueue_one(ctx, ledger, plan, request.clone()).await;
    let again = match first {
        Sent::Unknown => true,
        Sent::Acked => rng.chance(0.25),
        Sent::Refused => false,
    };
    if request.key.is_some() && again {
        enqueue_one(ctx, ledger, plan, request).await;
    }
}

/// Enqueues one attempt and records how it went.
async fn enqueue_one(ctx: &ClientCtx, ledger: &RpcLedger, plan: &Plan, request: EnqueueRequest) -> Sent {
    let EnqueueRequest {
        action,
        start,
        parent,
        ref key,
        ..
    } = request;
    let key = key.clone();
    ctx.log.borrow_mut().named.extend(parent);
    let starts = match start {
        Start::After(ms) => format!(", starts in {ms} ms"),
        Start::At(at) => format!(", starts at {at}"),
        Start::Now => String::new(),
    };
    match ledger.enqueue_with(&plan.id, request).await {
        Ok(enqueued) => {
            let record = enqueued.record;
            if let Some(key) = key {
                ctx.log
                    .borrow_mut()
                    .keys
                    .entry(key)
                    .or_default()
                    .push(record.attempt.id.clone());
            }
            if let Some(parent) = parent {
                ctx.log.borrow_mut().traced.insert(record.attempt.id.clone(), parent);
            }
            ctx.trace.line(
                "enqueuer",
                format!(
                    "enqueued {} #{} of {} ({action}{starts})",
                    record.attempt.id, record.attempt.number, plan.name
                ),
            );
            ctx.log
                .borrow_mut()
                .acked
                .push((plan.id.clone(), action, record.attempt.id));
            Sent::Acked
        }
        Err(LedgerError::Refused(r)) => {
            ctx.trace
                .line("enqueuer", format!("enqueue {action} of {} refused: {r}", plan.name));
            let mut log = ctx.log.borrow_mut();
            if let Some(key) = key.filter(|k| log.keys.contains_key(k)) {
                log.key_refusals.push((key, r.to_string()));
            }
            log.refused.push((plan.id.clone(), action, r.to_string()));
            Sent::Refused
        }
        Err(e) => {
            ctx.trace
                .line("enqueuer", format!("enqueue {action} of {} unknown: {e}", plan.name));
            ctx.log.borrow_mut().ambiguous += 1;
            Sent::Unknown
        }
    }
}

/// The action a user would ask for next, given the plan's history; now and then
/// one the action guard must refuse.
fn choose_action(history: &[AttemptRecord], rng: &mut Rng) -> Action {
    let latest = history.iter().max_by_key(|r| r.attempt.number);
    if rng.chance(0.1) {
        return [Action::Execute, Action::Retry, Action::Compensate][rng.pick(3)];
    }
    match latest.map(|r| (r.attempt.status, r.attempt.action)) {
        Some((AttemptStatus::Failed | AttemptStatus::Aborted, _)) => Action::Retry,
        Some((AttemptStatus::Succeeded, a)) if a.is_forward() && rng.chance(0.15) => Action::Compensate,
        _ => Action::Execute,
    }
}

/// Takes the operator's actions at their scheduled moments: each picks an open
/// attempt (a running one if there is any) and reconciles or aborts it.
pub async fn operator(ctx: ClientCtx, schedule: Vec<(u64, bool)>) -> turmoil::Result {
    let ledger = ctx.ledger("operator");
    let mut rng = Rng::new(ctx.seed, "operator");
    for (at_ms, abort) in schedule {
        let now = elapsed_ms();
        if at_ms > now {
            sleep_ms(at_ms - now).await;
        }
        let Some(target) = pick_open_attempt(&ledger, &mut rng).await else {
            continue;
        };
        let line = if abort {
            match ledger.abort(&target, "aborted by the operator").await {
                Ok(r) => format!("abort {target}: {}", r.attempt.status),
                Err(e) => format!("abort {target}: {e}"),
            }
        } else {
            match ledger.reconcile(&target).await {
                Ok((outcome, r)) => format!("reconcile {target}: {outcome:?}, command {}", r.command.status),
                Err(e) => format!("reconcile {target}: {e}"),
            }
        };
        ctx.trace.line("operator", &line);
        ctx.log.borrow_mut().operator.push(line);
    }
    ctx.log.borrow_mut().operator_done = true;
    Ok(())
}

async fn pick_open_attempt(ledger: &RpcLedger, rng: &mut Rng) -> Option<AttemptId> {
    let plans = ledger.list_plans().await.ok()?;
    let mut running = Vec::new();
    let mut open = Vec::new();
    for p in &plans {
        for r in ledger.history(&p.id).await.ok()? {
            if r.command.status == CommandStatus::Processing {
                running.push(r.attempt.id.clone());
            } else if !r.attempt.status.is_terminal() {
                open.push(r.attempt.id.clone());
            }
        }
    }
    let pool = if running.is_empty() { open } else { running };
    (!pool.is_empty()).then(|| pool[rng.pick(pool.len())].clone())
}
