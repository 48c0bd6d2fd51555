//! The model's ledger: the attempts' rows, and every request applied to them as the
//! memory ledger applies it (the engine decides, the planted bugs' seams of the
//! simulator's db host rewrite, the per-target limits admit with the memory
//! ledger's own [`LimitTable`], the guard admits, the writes apply), each recorded
//! as the db host records it ([`DbEvent`]).

use super::digest::Shared;
use super::Config;
use crate::bugs::Bug;
use crate::db::{
    loosened, one_more, planted_decision, planted_instant, routed, skips_token_check, DbEvent, EventOutcome, Snap,
};
use crate::plans::DURABLE;
use leasehold::ledger::limits::{entered, Leases, LimitTable};
use leasehold_engine::route::DEFAULT_QUEUE;
use leasehold_engine::transition::is_claimable;
use leasehold_engine::{
    decide, AttemptRecord, Capabilities, ClaimRequest, CommandId, CommandStatus, Exhaustion, Op, OperatorRequest, Plan,
    Reach, Refusal, Reply, Request, Timestamp, WorkerRequest, Writes,
};
use std::collections::{BTreeMap, BTreeSet};

/// The token text minted for ordinal `n`.
pub(super) fn token(n: u32) -> leasehold_engine::LeaseToken {
    leasehold_engine::LeaseToken::new(format!("model-token-{n}"))
}

fn ordinal(t: &leasehold_engine::LeaseToken) -> Option<u32> {
    t.expose().strip_prefix("model-token-")?.parse().ok()
}

/// The memory ledger's record of a snapshot: the token ordinal back in its row.
pub(super) fn record_of(snap: &Snap) -> AttemptRecord {
    let mut record = snap.record.clone();
    record.command.lease_token = snap.token.map(token);
    record
}

/// A record as the log keeps it: the token replaced by its ordinal.
pub(super) fn snap_of(mut record: AttemptRecord) -> Snap {
    let token = record.command.lease_token.take().as_ref().and_then(ordinal);
    Snap { record, token }
}

/// A request as it reaches the ledger.
#[derive(Debug, Clone, Copy)]
pub(super) enum Req<'a> {
    /// A claim (and begin) by this worker, minting this token ordinal, sent at
    /// this worker-clock instant.
    Claim(&'a str, u32, Timestamp),
    /// A worker request presenting this token ordinal, sent at this worker-clock
    /// instant.
    Worker(&'a WorkerRequest, u32, Timestamp),
    /// An operator request.
    Operator(&'a OperatorRequest),
}

impl Req<'_> {
    fn op(&self) -> Op {
        match self {
            Req::Claim(..) => Op::ClaimAndBegin,
            Req::Worker(w, ..) => w.op(),
            Req::Operator(o) => o.op(),
        }
    }

    fn sent_at(&self) -> Option<Timestamp> {
        match self {
            Req::Claim(_, _, at) | Req::Worker(_, _, at) => Some(*at),
            _ => None,
        }
    }
}

/// How a request ended: the reply (or refusal) and the event the db host logs.
pub(super) struct Answer {
    /// What the requester is told.
    pub reply: Result<Reply, Refusal>,
    /// The logged event (none for a claim that found nothing to claim).
    pub event: Option<DbEvent>,
}

/// The per-target limits a request passes: the ledger's table and the rows its
/// live leases are counted on (every attempt's, as they were before the request).
pub(super) struct Limits<'a> {
    pub table: &'a mut LimitTable,
    pub rows: &'a [Shared<Snap>],
}

/// The live leases of every attempt's rows.
struct RowLeases<'a>(&'a [Shared<Snap>]);

impl Leases for RowLeases<'_> {
    fn live(&self, target: &str, now: Timestamp) -> u32 {
        let live = self
            .0
            .iter()
            .filter(|s| lease_on(&s.record, target, now).is_some())
            .count();
        u32::try_from(live).unwrap_or(u32::MAX)
    }

    fn lease_of(&self, command: &CommandId, target: &str, now: Timestamp) -> Option<Timestamp> {
        let rows = self.0.iter().find(|s| s.record.command.id == *command)?;
        lease_on(&rows.record, target, now)
    }
}

/// The end of the live lease `record`'s command holds on `target` at `now`, if any.
fn lease_on(record: &AttemptRecord, target: &str, now: Timestamp) -> Option<Timestamp> {
    let c = &record.command;
    (c.status == CommandStatus::Processing && c.target == target)
        .then_some(c.lease_until)
        .flatten()
        .filter(|until| *until >= now)
}

/// The ledger of one configuration.
pub(super) struct Ledger<'c> {
    pub config: &'c Config,
    /// The configuration's plans, `plan-1` first.
    pub plans: &'c [Plan],
}

impl Ledger<'_> {
    fn bugs(&self) -> &[Bug] {
        &self.config.bugs
    }

    /// The plan an attempt belongs to.
    pub fn plan_of(&self, record: &AttemptRecord) -> &Plan {
        let id = &record.attempt.plan_id;
        self.plans
            .iter()
            .find(|p| p.id == *id)
            .expect("every attempt is of a plan of the configuration")
    }

    /// The per-target limits set on the ledger before the first attempt, no entry
    /// made yet.
    pub fn limits(&self) -> Shared<LimitTable> {
        let mut table = LimitTable::default();
        self.config.limits.iter().for_each(|l| table.set(l.clone()));
        Shared::new(table)
    }

    /// The instant the ledger decides `req` at, given its own clock `db_now`.
    pub fn decided_at(&self, rows: &Snap, req: &Req<'_>, db_now: Timestamp) -> Timestamp {
        let reconciled = matches!(req, Req::Operator(OperatorRequest::Reconcile)).then_some(rows);
        planted_instant(self.bugs(), (Some(req.op()), req.sent_at()), reconciled, db_now).unwrap_or(db_now)
    }

    /// The claim worker `owner` sends: its capabilities if it runs only the
    /// durable target's executor ([`Config::durable_only`]), as the ledger takes it
    /// (the planted `claim-ignores-route` drops them: [`routed`]).
    fn claim_request(&self, owner: &str) -> ClaimRequest {
        let claim = ClaimRequest {
            owner: owner.to_owned(),
            batch: 1,
            lease_ms: self.config.lease_ms(),
            begin: true,
            capabilities: self.capabilities(owner),
        };
        routed(self.bugs(), &claim)
    }

    /// The capabilities worker `owner` claims with: the durable target's executor
    /// only if it is one of the configuration's durable-only workers, else none (it
    /// runs every executor).
    fn capabilities(&self, owner: &str) -> Option<Capabilities> {
        let config = self.config;
        let durable_only = config.durable_only > 0
            && (0..config.skews_ms.len()).any(|i| config.is_durable_only(i) && super::state::name(i) == owner);
        durable_only.then(|| Capabilities {
            executors: BTreeMap::from([(DURABLE.to_owned(), Reach::Any)]),
            queues: BTreeSet::from([DEFAULT_QUEUE.to_owned()]),
        })
    }

    /// The limits a claim runs under: the configuration's, each loosened as a
    /// planted limits bug loosens it ([`loosened`]) for the claim, as the
    /// simulator's db host sets them (clearing a limit loosened of its only field)
    /// just before the claim. Answers the limits to set back after it.
    fn loosen(&self, table: &mut LimitTable) -> Vec<leasehold_engine::limits::TargetLimit> {
        let mut restore = Vec::new();
        for limit in &self.config.limits {
            let Some(loose) = loosened(self.bugs(), limit) else {
                continue;
            };
            if loose.max_in_flight.is_none() && loose.rate.is_none() && loose.breaker.is_none() {
                table.clear(&loose.target);
            } else {
                table.set(loose);
            }
            restore.push(limit.clone());
        }
        restore
    }

    /// The attempt (its index in `attempts`) a claim by `owner` sent at `sent_at`
    /// (worker clock) takes, as the memory ledger picks it: the first claimable
    /// command in claim order, oldest `available_at` first, then command id, among
    /// those the claim's capabilities admit and on no target its limits block.
    pub fn claim_candidate(
        &self,
        (attempts, table): (&[Shared<Snap>], &LimitTable),
        owner: &str,
        sent_at: Timestamp,
        db_now: Timestamp,
    ) -> Option<usize> {
        let now =
            planted_instant(self.bugs(), (Some(Op::ClaimAndBegin), Some(sent_at)), None, db_now).unwrap_or(db_now);
        let capabilities = (self.config.durable_only > 0)
            .then(|| self.claim_request(owner).capabilities)
            .flatten();
        let loose = (!self.config.limits.is_empty()).then(|| {
            let mut loose = table.clone();
            self.loosen(&mut loose);
            loose
        });
        let leases = RowLeases(attempts);
        attempts
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.record.attempt.status.is_terminal() && is_claimable(&s.record.command, now))
            .filter(|(_, s)| capabilities.as_ref().is_none_or(|c| c.admits(&s.record.command)))
            .filter(|(_, s)| {
                loose
                    .as_ref()
                    .is_none_or(|t| !t.blocks(&s.record.command.target, &leases, now))
            })
            .min_by_key(|(_, s)| (s.record.command.available_at, s.record.command.id.clone()))
            .map(|(k, _)| k)
    }

    /// Applies `req` from `from` to `rows` at `db_now`, under `limits` if the
    /// configuration sets any; answers the rows after it, the reply and the event.
    pub fn apply(
        &self,
        rows: &Snap,
        limits: Option<Limits<'_>>,
        (from, req): (&str, &Req<'_>),
        db_now: Timestamp,
    ) -> (Snap, Answer) {
        let now = self.decided_at(rows, req, db_now);
        let before = rows.clone();
        let mut record = record_of(rows);
        let presented = match req {
            Req::Claim(_, n, _) | Req::Worker(_, n, _) => Some(*n),
            Req::Operator(_) => None,
        };
        let reply = self.decide(&record, req, now).and_then(|decided| {
            let (writes, reply) = match limits {
                Some(limits) => self.limited(limits, &record, req, decided, now)?,
                None => decided,
            };
            if !writes.guard.admits(Some(&record.command)) {
                return Err(Refusal::StaleToken {
                    command: record.command.id.clone(),
                });
            }
            writes.apply_to(&mut record);
            Ok(reply)
        });
        let rows = snap_of(record);
        let outcome = match &reply {
            Ok(_) => EventOutcome::Applied,
            Err(r) => EventOutcome::Refused(r.to_string()),
        };
        let event = DbEvent {
            seq: 0,
            at_ms: 0,
            db_now,
            decided_at: now,
            from: from.to_owned(),
            op: req.op(),
            attempt: Some(rows.record.attempt.id.clone()),
            ordinal: match req {
                Req::Worker(w, ..) => w.ordinal(),
                _ => None,
            },
            presented,
            before: Some(before),
            after: Some(rows.clone()),
            outcome,
            plan_attempts: None,
            reply_lost: false,
        };
        // The memory ledger skips a claim candidate the engine or the limits refuse,
        // unlogged.
        let logged = !(matches!(req, Req::Claim(..)) && reply.is_err());
        let answer = Answer {
            reply,
            event: logged.then_some(event),
        };
        (rows, answer)
    }

    /// A decision under the per-target limits, as the memory ledger makes it: a
    /// claim's lease admitted by the target it enters (under the limits a planted
    /// bug loosens for the claim: [`Ledger::loosen`]), or the candidate passed over;
    /// a worker's write through [`LimitTable::worker_write`].
    fn limited(
        &self,
        limits: Limits<'_>,
        record: &AttemptRecord,
        req: &Req<'_>,
        (writes, reply): (Writes, Reply),
        now: Timestamp,
    ) -> Result<(Writes, Reply), Refusal> {
        let Limits { table, rows } = limits;
        match req {
            Req::Claim(..) => {
                let Some(target) = entered(record, &writes, now) else {
                    return Ok((writes, reply));
                };
                let restore = self.loosen(table);
                let leases = RowLeases(rows);
                let admitted = table.admit(target, &record.command.id, &leases, now);
                restore.into_iter().for_each(|l| table.set(l));
                admitted.map_err(|blocked| Refusal::Limited {
                    command: record.command.id.clone(),
                    reason: blocked.to_string(),
                })?;
                Ok((writes, reply))
            }
            Req::Worker(w, n, _) => {
                let leases = RowLeases(rows);
                table.worker_write(&leases, (w, &token(*n)), record, (writes, reply), now)
            }
            Req::Operator(_) => Ok((writes, reply)),
        }
    }

    /// The engine's decision, through the planted bugs' seams; with
    /// `delivery-cap-off-by-one` planted, a claim or give-back the engine finds
    /// exhausted by deliveries is decided again under a cap one higher
    /// ([`one_more`]), as the db host decides it.
    fn decide(
        &self,
        record: &AttemptRecord,
        req: &Req<'_>,
        now: Timestamp,
    ) -> Result<(leasehold_engine::Writes, Reply), Refusal> {
        let plan = self.plan_of(record);
        let decided = self.decide_under(plan, record, req, now);
        let heartbeat_ms = match req {
            Req::Worker(WorkerRequest::Heartbeat { lease_ms }, ..) => *lease_ms,
            _ => 0,
        };
        match planted_decision(
            self.bugs(),
            (req.op(), now, heartbeat_ms),
            plan.recovery,
            record,
            decided,
        ) {
            Ok((_, Reply::Exhausted(Exhaustion::Deliveries))) if self.bugs().contains(&Bug::DeliveryCapOffByOne) => {
                self.decide_under(&one_more(plan), record, req, now)
            }
            decided => decided,
        }
    }

    /// The engine's decision of `req` under `plan`.
    fn decide_under(
        &self,
        plan: &Plan,
        record: &AttemptRecord,
        req: &Req<'_>,
        now: Timestamp,
    ) -> Result<(leasehold_engine::Writes, Reply), Refusal> {
        match req {
            Req::Claim(owner, n, _) => {
                let claim = self.claim_request(owner);
                decide(record, Request::Claim(&claim, &token(*n), plan), now)
            }
            Req::Worker(w, n, _) => {
                let presented = match &record.command.lease_token {
                    Some(current) if skips_token_check(self.bugs(), w.op()) => current.clone(),
                    _ => token(*n),
                };
                decide(
                    record,
                    Request::Worker(w, &presented, w.needs_plan().then_some(plan)),
                    now,
                )
            }
            Req::Operator(o) => decide(record, Request::Operator(o, plan.recovery), now),
        }
    }
}
