//! The model's ledger: the attempts' rows, and every request applied to them as the
//! memory ledger applies it (the engine decides, the planted bugs' seams of the
//! simulator's db host rewrite, the guard admits, the writes apply), each recorded
//! as the db host records it ([`DbEvent`]).

use super::digest::Shared;
use super::Config;
use crate::bugs::Bug;
use crate::db::{one_more, planted_decision, planted_instant, skips_token_check, DbEvent, EventOutcome, Snap};
use leasehold_engine::transition::is_claimable;
use leasehold_engine::{
    decide, AttemptRecord, ClaimRequest, Exhaustion, Op, OperatorRequest, Plan, Refusal, Reply, Request, Timestamp,
    WorkerRequest,
};

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

    /// The instant the ledger decides `req` at, given its own clock `db_now`.
    pub fn decided_at(&self, rows: &Snap, req: &Req<'_>, db_now: Timestamp) -> Timestamp {
        let reconciled = matches!(req, Req::Operator(OperatorRequest::Reconcile)).then_some(rows);
        planted_instant(self.bugs(), (Some(req.op()), req.sent_at()), reconciled, db_now).unwrap_or(db_now)
    }

    /// The attempt (its index in `attempts`) a claim sent at `sent_at` (worker
    /// clock) takes, as the memory ledger picks it: the first claimable command in
    /// claim order, oldest `available_at` first, then command id.
    pub fn claim_candidate(&self, attempts: &[Shared<Snap>], sent_at: Timestamp, db_now: Timestamp) -> Option<usize> {
        let now =
            planted_instant(self.bugs(), (Some(Op::ClaimAndBegin), Some(sent_at)), None, db_now).unwrap_or(db_now);
        attempts
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.record.attempt.status.is_terminal() && is_claimable(&s.record.command, now))
            .min_by_key(|(_, s)| (s.record.command.available_at, s.record.command.id.clone()))
            .map(|(k, _)| k)
    }

    /// Applies `req` from `from` to `rows` at `db_now`; answers the reply and the event.
    pub fn apply(&self, rows: &mut Snap, from: &str, req: &Req<'_>, db_now: Timestamp) -> Answer {
        let now = self.decided_at(rows, req, db_now);
        let before = rows.clone();
        let mut record = record_of(rows);
        let presented = match req {
            Req::Claim(_, n, _) | Req::Worker(_, n, _) => Some(*n),
            Req::Operator(_) => None,
        };
        let reply = self.decide(&record, req, now).and_then(|(writes, reply)| {
            if !writes.guard.admits(Some(&record.command)) {
                return Err(Refusal::StaleToken {
                    command: record.command.id.clone(),
                });
            }
            writes.apply_to(&mut record);
            Ok(reply)
        });
        *rows = snap_of(record);
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
        // The memory ledger skips a claim candidate the engine refuses, unlogged.
        let logged = !(matches!(req, Req::Claim(..)) && reply.is_err());
        Answer {
            reply,
            event: logged.then_some(event),
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
        let lease_ms = self.config.lease_ms();
        match req {
            Req::Claim(owner, n, _) => {
                let claim = ClaimRequest {
                    owner: (*owner).to_owned(),
                    batch: 1,
                    lease_ms,
                    begin: true,
                    capabilities: None,
                };
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
