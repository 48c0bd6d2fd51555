//! What the server asks of its ledger, as one object-safe trait: the handlers are
//! written once, for any ledger and token store.

use crate::ledger::bulk::{abort_open, retry_failed, BulkFilter, BulkOutcome};
use crate::ledger::fleet::WorkerRow;
use crate::ledger::limits::TargetRow;
use crate::ledger::listing::{AttemptCounts, AttemptPage, AttemptQuery, PlanRow};
use crate::ledger::{find_plan, EnqueueRequest, Enqueued, Ledger, LedgerError};
use crate::tokens::{create_token, Role, TokenInfo, TokenSecret, TokenStore};
use leasehold_engine::limits::TargetLimit;
use leasehold_engine::transition::ReconcileOutcome;
use leasehold_engine::{Action, AttemptId, AttemptRecord, Plan, PlanId, PlanSpec, Timestamp};
use std::future::Future;
use std::pin::Pin;

/// A boxed future borrowing the backend.
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = Result<T, LedgerError>> + Send + 'a>>;

/// The ledger and token operations the server uses (each one call of
/// [`Ledger`] or [`TokenStore`], or [`find_plan`], [`retry_failed`] or
/// [`abort_open`]).
pub trait Backend: Send + Sync + 'static {
    /// [`Ledger::list_plans`].
    fn list_plans(&self) -> Fut<'_, Vec<Plan>>;
    /// [`Ledger::plans_newest_first`].
    fn plans_newest_first<'a>(&'a self, before: Option<&'a PlanId>, limit: u32) -> Fut<'a, Vec<Plan>>;
    /// [`Ledger::list_plan_rows`].
    fn list_plan_rows(&self) -> Fut<'_, Vec<PlanRow>>;
    /// [`Ledger::plan_rows_newest_first`].
    fn plan_rows_newest_first<'a>(&'a self, before: Option<&'a PlanId>, limit: u32) -> Fut<'a, Vec<PlanRow>>;
    /// [`find_plan`]: by id, or else by name.
    fn find_plan<'a>(&'a self, reference: &'a str) -> Fut<'a, Plan>;
    /// [`Ledger::register_plan`].
    fn register_plan<'a>(&'a self, spec: PlanSpec, known: &'a [&'a str]) -> Fut<'a, Plan>;
    /// [`Ledger::enqueue`].
    fn enqueue<'a>(&'a self, plan: &'a PlanId, action: Action) -> Fut<'a, AttemptRecord>;
    /// [`Ledger::enqueue_with`].
    fn enqueue_with<'a>(&'a self, plan: &'a PlanId, request: EnqueueRequest) -> Fut<'a, Enqueued>;
    /// [`retry_failed`].
    fn retry_failed<'a>(&'a self, filter: &'a BulkFilter, dry_run: bool) -> Fut<'a, BulkOutcome>;
    /// [`abort_open`], as `who`.
    fn abort_open<'a>(&'a self, filter: &'a BulkFilter, who: &'a str, dry_run: bool) -> Fut<'a, BulkOutcome>;
    /// [`Ledger::list_attempts`].
    fn list_attempts<'a>(&'a self, query: &'a AttemptQuery) -> Fut<'a, AttemptPage>;
    /// [`Ledger::count_attempts`].
    fn count_attempts(&self, cap: u64) -> Fut<'_, AttemptCounts>;
    /// [`Ledger::attempt`].
    fn attempt<'a>(&'a self, id: &'a AttemptId) -> Fut<'a, AttemptRecord>;
    /// [`Ledger::history`].
    fn history<'a>(&'a self, plan: &'a PlanId) -> Fut<'a, Vec<AttemptRecord>>;
    /// [`Ledger::reconcile`].
    fn reconcile<'a>(&'a self, id: &'a AttemptId) -> Fut<'a, (ReconcileOutcome, AttemptRecord)>;
    /// [`Ledger::abort`].
    fn abort<'a>(&'a self, id: &'a AttemptId, reason: &'a str) -> Fut<'a, AttemptRecord>;
    /// [`Ledger::open_attempts`].
    fn open_attempts(&self) -> Fut<'_, u64>;
    /// [`Ledger::check_ready`] (readiness).
    fn check_ready(&self) -> Fut<'_, Vec<String>>;
    /// [`Ledger::workers`].
    fn workers(&self) -> Fut<'_, (Vec<WorkerRow>, Timestamp)>;
    /// [`Ledger::set_limit`].
    fn set_limit(&self, limit: TargetLimit) -> Fut<'_, ()>;
    /// [`Ledger::clear_limit`].
    fn clear_limit<'a>(&'a self, target: &'a str) -> Fut<'a, bool>;
    /// [`Ledger::limits`].
    fn limits(&self) -> Fut<'_, (Vec<TargetRow>, Timestamp)>;
    /// [`TokenStore::token_by_hash`].
    fn token_by_hash<'a>(&'a self, hash: &'a str) -> Fut<'a, Option<TokenInfo>>;
    /// [`create_token`].
    fn create_token<'a>(&'a self, name: &'a str, role: Role, now: Timestamp) -> Fut<'a, (TokenInfo, TokenSecret)>;
    /// [`TokenStore::list_tokens`].
    fn list_tokens(&self) -> Fut<'_, Vec<TokenInfo>>;
    /// [`TokenStore::revoke_token`].
    fn revoke_token<'a>(&'a self, name: &'a str, now: Timestamp) -> Fut<'a, TokenInfo>;
}

impl<L: Ledger + TokenStore> Backend for L {
    fn list_plans(&self) -> Fut<'_, Vec<Plan>> {
        Box::pin(Ledger::list_plans(self))
    }
    fn plans_newest_first<'a>(&'a self, before: Option<&'a PlanId>, limit: u32) -> Fut<'a, Vec<Plan>> {
        Box::pin(Ledger::plans_newest_first(self, before, limit))
    }
    fn list_plan_rows(&self) -> Fut<'_, Vec<PlanRow>> {
        Box::pin(Ledger::list_plan_rows(self))
    }
    fn plan_rows_newest_first<'a>(&'a self, before: Option<&'a PlanId>, limit: u32) -> Fut<'a, Vec<PlanRow>> {
        Box::pin(Ledger::plan_rows_newest_first(self, before, limit))
    }
    fn find_plan<'a>(&'a self, reference: &'a str) -> Fut<'a, Plan> {
        Box::pin(find_plan(self, reference))
    }
    fn register_plan<'a>(&'a self, spec: PlanSpec, known: &'a [&'a str]) -> Fut<'a, Plan> {
        Box::pin(Ledger::register_plan(self, spec, known))
    }
    fn enqueue<'a>(&'a self, plan: &'a PlanId, action: Action) -> Fut<'a, AttemptRecord> {
        Box::pin(Ledger::enqueue(self, plan, action))
    }
    fn enqueue_with<'a>(&'a self, plan: &'a PlanId, request: EnqueueRequest) -> Fut<'a, Enqueued> {
        Box::pin(Ledger::enqueue_with(self, plan, request))
    }
    fn retry_failed<'a>(&'a self, filter: &'a BulkFilter, dry_run: bool) -> Fut<'a, BulkOutcome> {
        Box::pin(retry_failed(self, filter, dry_run))
    }
    fn abort_open<'a>(&'a self, filter: &'a BulkFilter, who: &'a str, dry_run: bool) -> Fut<'a, BulkOutcome> {
        Box::pin(abort_open(self, filter, who, dry_run))
    }
    fn list_attempts<'a>(&'a self, query: &'a AttemptQuery) -> Fut<'a, AttemptPage> {
        Box::pin(Ledger::list_attempts(self, query))
    }
    fn count_attempts(&self, cap: u64) -> Fut<'_, AttemptCounts> {
        Box::pin(Ledger::count_attempts(self, cap))
    }
    fn attempt<'a>(&'a self, id: &'a AttemptId) -> Fut<'a, AttemptRecord> {
        Box::pin(Ledger::attempt(self, id))
    }
    fn history<'a>(&'a self, plan: &'a PlanId) -> Fut<'a, Vec<AttemptRecord>> {
        Box::pin(Ledger::history(self, plan))
    }
    fn reconcile<'a>(&'a self, id: &'a AttemptId) -> Fut<'a, (ReconcileOutcome, AttemptRecord)> {
        Box::pin(Ledger::reconcile(self, id))
    }
    fn abort<'a>(&'a self, id: &'a AttemptId, reason: &'a str) -> Fut<'a, AttemptRecord> {
        Box::pin(Ledger::abort(self, id, reason))
    }
    fn open_attempts(&self) -> Fut<'_, u64> {
        Box::pin(Ledger::open_attempts(self))
    }
    fn check_ready(&self) -> Fut<'_, Vec<String>> {
        Box::pin(Ledger::check_ready(self))
    }
    fn workers(&self) -> Fut<'_, (Vec<WorkerRow>, Timestamp)> {
        Box::pin(Ledger::workers(self))
    }
    fn set_limit(&self, limit: TargetLimit) -> Fut<'_, ()> {
        Box::pin(Ledger::set_limit(self, limit))
    }
    fn clear_limit<'a>(&'a self, target: &'a str) -> Fut<'a, bool> {
        Box::pin(Ledger::clear_limit(self, target))
    }
    fn limits(&self) -> Fut<'_, (Vec<TargetRow>, Timestamp)> {
        Box::pin(Ledger::limits(self))
    }
    fn token_by_hash<'a>(&'a self, hash: &'a str) -> Fut<'a, Option<TokenInfo>> {
        Box::pin(TokenStore::token_by_hash(self, hash))
    }
    fn create_token<'a>(&'a self, name: &'a str, role: Role, now: Timestamp) -> Fut<'a, (TokenInfo, TokenSecret)> {
        Box::pin(create_token(self, name, role, now))
    }
    fn list_tokens(&self) -> Fut<'_, Vec<TokenInfo>> {
        Box::pin(TokenStore::list_tokens(self))
    }
    fn revoke_token<'a>(&'a self, name: &'a str, now: Timestamp) -> Fut<'a, TokenInfo> {
        Box::pin(TokenStore::revoke_token(self, name, now))
    }
}

/// What `record` waits for when no live worker can run its next step
/// ([`crate::ledger::fleet::waits_for`]); `None` when it does not wait, or the plan
/// or the fleet cannot be read (the record is shown without it).
pub async fn waits_for(backend: &dyn Backend, record: &AttemptRecord) -> Option<String> {
    if record.attempt.status != leasehold_engine::AttemptStatus::Queued {
        return None;
    }
    let plan = backend.find_plan(record.attempt.plan_id.as_str()).await.ok()?;
    let (fleet, now) = backend.workers().await.ok()?;
    crate::ledger::fleet::waits_for(record, &plan, &fleet, now)
}
