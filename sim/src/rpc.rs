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
use leasehold::ledger::{Claimed, EnqueueRequest, Enqueued, Ledger, LedgerError};
use leasehold_engine::{
    AttemptId, AttemptRecord, ClaimRequest, Lease, OperatorRequest, Plan, PlanId, PlanSpec, Reply, WorkerRequest,
};
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
        let op = request.name();
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
        DbReply::Versions(_) => "versions",
        DbReply::Plan(_) => "plan",
        DbReply::Plans(_) => "plans",
        DbReply::Claimed(_) => "claimed",
        DbReply::Record(_) => "record",
        DbReply::Enqueued { .. } => "enqueued",
        DbReply::Worker(_) => "worker",
        DbReply::Operator { .. } => "operator",
        DbReply::Records(_) => "records",
        DbReply::Count(_) => "count",
    }
}

macro_rules! expect {
    ($self:ident, $req:expr, $pat:pat => $out:expr) => {{
        let request = $req;
        let op = request.name();
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

    async fn enqueue_with(&self, plan: &PlanId, request: EnqueueRequest) -> Result<Enqueued, LedgerError> {
        let EnqueueRequest {
            action,
            start,
            parent,
            key,
            input,
            order_key,
        } = request;
        let request = DbRequest::Enqueue {
            plan: plan.clone(),
            action,
            start,
            parent,
            key,
            input,
            order_key,
        };
        expect!(self, request, DbReply::Enqueued { record, created } => Enqueued { record, created })
    }

    async fn claim_batch(&self, request: ClaimRequest) -> Result<Vec<Claimed>, LedgerError> {
        expect!(self, DbRequest::Claim(request),
            DbReply::Claimed(c) => c.into_iter().map(|c| c.into_claimed()).collect())
    }

    async fn worker(&self, lease: &Lease, request: WorkerRequest) -> Result<Reply, LedgerError> {
        expect!(self, DbRequest::Worker { lease: WireLease::of(lease), request }, DbReply::Worker(reply) => reply)
    }

    async fn operator(
        &self,
        attempt: &AttemptId,
        request: OperatorRequest,
    ) -> Result<(Reply, AttemptRecord), LedgerError> {
        expect!(self, DbRequest::Operator { attempt: attempt.clone(), request },
            DbReply::Operator { reply, record } => (reply, record))
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
