//! The worker's ledger client: the production [`Ledger`] trait over the db host's
//! TCP protocol.
//!
//! Contract: requests go over a small pool of connections ([`Pool`]); every
//! request has a deadline (a partitioned stream hangs forever otherwise). A connection that cannot be made
//! in time, or is refused, is [`LedgerError::Unavailable`] (nothing was sent); once
//! the request was written, a timeout, a closed connection or a broken frame is
//! [`LedgerError::Ambiguous`] (the db may have committed it). The db host's own
//! errors come back as the ledger errors they were. Each request carries this
//! host's name and clock reading.

use crate::clock::SimClock;
use crate::db::DB_PORT;
use crate::protocol::{CallError, DbEnvelope, DbReply, DbRequest, DbResponse, Pool, WireLease};
use leasehold::clock::Clock;
use leasehold::ledger::{Claimed, Ledger, LedgerError};
use leasehold_engine::transition::{Continued, ReconcileOutcome};
use leasehold_engine::{Action, AttemptId, AttemptRecord, Lease, Plan, PlanId, PlanSpec, Timestamp};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// A [`Ledger`] that is a client of the db host.
#[derive(Debug)]
pub struct RpcLedger {
    from: String,
    pool: Pool,
    timeout: Duration,
    clock: Arc<SimClock>,
}

impl RpcLedger {
    /// A client for host `from`, whose clock is `clock`, with this deadline per
    /// request.
    pub fn new(from: impl Into<String>, clock: Arc<SimClock>, timeout_ms: u64) -> Self {
        Self {
            from: from.into(),
            pool: Pool::new("db", DB_PORT),
            timeout: Duration::from_millis(timeout_ms),
            clock,
        }
    }

    /// Sends one request and waits for its reply, within the deadline.
    pub async fn call(&self, request: DbRequest) -> Result<DbReply, LedgerError> {
        let op = request.op();
        let envelope = DbEnvelope {
            from: self.from.clone(),
            sent_at: self.clock.now(),
            request,
        };
        match self.pool.call::<_, DbResponse>(&envelope, self.timeout).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(e.into_error()),
            Err(CallError::NotSent(e)) => Err(LedgerError::Unavailable(format!("{op}: {e}"))),
            Err(CallError::NoReply(e)) => Err(LedgerError::Ambiguous(format!("{op}: {e}"))),
        }
    }
}

fn unexpected(op: &str, reply: &DbReply) -> LedgerError {
    LedgerError::Internal(format!("{op}: unexpected reply {}", reply_kind(reply)))
}

fn reply_kind(reply: &DbReply) -> &'static str {
    match reply {
        DbReply::Done => "done",
        DbReply::Versions(_) => "versions",
        DbReply::Plan(_) => "plan",
        DbReply::Plans(_) => "plans",
        DbReply::Claimed(_) => "claimed",
        DbReply::Until(_) => "until",
        DbReply::Record(_) => "record",
        DbReply::Reconciled { .. } => "reconciled",
        DbReply::Records(_) => "records",
        DbReply::Count(_) => "count",
        DbReply::Continued(_) => "continued",
    }
}

macro_rules! expect {
    ($self:ident, $req:expr, $pat:pat => $out:expr) => {{
        let request = $req;
        let op = request.op();
        match $self.call(request).await? {
            $pat => Ok($out),
            other => Err(unexpected(op, &other)),
        }
    }};
}

impl Ledger for RpcLedger {
    async fn migrate(&self) -> Result<Vec<u32>, LedgerError> {
        expect!(self, DbRequest::Migrate, DbReply::Versions(v) => v)
    }

    async fn register_plan(&self, spec: PlanSpec, known_executors: &[&str]) -> Result<Plan, LedgerError> {
        let known = known_executors.iter().map(|s| (*s).to_owned()).collect();
        expect!(self, DbRequest::RegisterPlan { spec, known }, DbReply::Plan(p) => p)
    }

    async fn plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        expect!(self, DbRequest::Plan { id: id.clone() }, DbReply::Plan(p) => p)
    }

    async fn list_plans(&self) -> Result<Vec<Plan>, LedgerError> {
        expect!(self, DbRequest::ListPlans, DbReply::Plans(p) => p)
    }

    async fn retire_plan(&self, id: &PlanId) -> Result<Plan, LedgerError> {
        expect!(self, DbRequest::RetirePlan { id: id.clone() }, DbReply::Plan(p) => p)
    }

    async fn enqueue(&self, plan: &PlanId, action: Action) -> Result<AttemptRecord, LedgerError> {
        expect!(self, DbRequest::Enqueue { plan: plan.clone(), action }, DbReply::Record(r) => r)
    }

    async fn claim(&self, owner: &str, batch: u32, lease_ms: u64) -> Result<Vec<Claimed>, LedgerError> {
        expect!(self, DbRequest::Claim { owner: owner.to_owned(), batch, lease_ms },
            DbReply::Claimed(c) => c.into_iter().map(|c| c.into_claimed()).collect())
    }

    async fn claim_and_begin(&self, owner: &str, batch: u32, lease_ms: u64) -> Result<Vec<Claimed>, LedgerError> {
        expect!(self, DbRequest::ClaimAndBegin { owner: owner.to_owned(), batch, lease_ms },
            DbReply::Claimed(c) => c.into_iter().map(|c| c.into_claimed()).collect())
    }

    async fn complete_and_continue(
        &self,
        lease: &Lease,
        ordinal: u32,
        evidence: &Value,
        target_receipt: &Value,
        lease_ms: u64,
    ) -> Result<Continued, LedgerError> {
        let request = DbRequest::CompleteAndContinue {
            lease: WireLease::of(lease),
            ordinal,
            evidence: evidence.clone(),
            target_receipt: target_receipt.clone(),
            lease_ms,
        };
        expect!(self, request, DbReply::Continued(began) => began.map_or(Continued::Finished, Continued::Began))
    }

    async fn heartbeat(&self, lease: &Lease, lease_ms: u64) -> Result<Timestamp, LedgerError> {
        expect!(self, DbRequest::Heartbeat { lease: WireLease::of(lease), lease_ms }, DbReply::Until(t) => t)
    }

    async fn begin_step(&self, lease: &Lease, ordinal: u32, lease_ms: u64) -> Result<(), LedgerError> {
        expect!(self, DbRequest::BeginStep { lease: WireLease::of(lease), ordinal, lease_ms }, DbReply::Done => ())
    }

    async fn complete_step(
        &self,
        lease: &Lease,
        ordinal: u32,
        evidence: &Value,
        target_receipt: &Value,
        lease_ms: u64,
    ) -> Result<(), LedgerError> {
        let request = DbRequest::CompleteStep {
            lease: WireLease::of(lease),
            ordinal,
            evidence: evidence.clone(),
            target_receipt: target_receipt.clone(),
            lease_ms,
        };
        expect!(self, request, DbReply::Done => ())
    }

    async fn fail(&self, lease: &Lease, ordinal: Option<u32>, error: &str) -> Result<(), LedgerError> {
        let request = DbRequest::Fail {
            lease: WireLease::of(lease),
            ordinal,
            error: error.to_owned(),
        };
        expect!(self, request, DbReply::Done => ())
    }

    async fn finish(&self, lease: &Lease) -> Result<(), LedgerError> {
        expect!(self, DbRequest::Finish { lease: WireLease::of(lease) }, DbReply::Done => ())
    }

    async fn reconcile(&self, attempt: &AttemptId) -> Result<(ReconcileOutcome, AttemptRecord), LedgerError> {
        expect!(self, DbRequest::Reconcile { attempt: attempt.clone() },
        DbReply::Reconciled { requeued, record } => {
            (if requeued { ReconcileOutcome::Requeued } else { ReconcileOutcome::Unchanged }, record)
        })
    }

    async fn abort(&self, attempt: &AttemptId, reason: &str) -> Result<AttemptRecord, LedgerError> {
        expect!(self, DbRequest::Abort { attempt: attempt.clone(), reason: reason.to_owned() }, DbReply::Record(r) => r)
    }

    async fn attempt(&self, attempt: &AttemptId) -> Result<AttemptRecord, LedgerError> {
        expect!(self, DbRequest::Attempt { attempt: attempt.clone() }, DbReply::Record(r) => r)
    }

    async fn history(&self, plan: &PlanId) -> Result<Vec<AttemptRecord>, LedgerError> {
        expect!(self, DbRequest::History { plan: plan.clone() }, DbReply::Records(r) => r)
    }

    async fn open_attempts(&self) -> Result<u64, LedgerError> {
        expect!(self, DbRequest::OpenAttempts, DbReply::Count(n) => n)
    }
}
