//! Ledgers: where plans, attempts, receipts and commands live.
//!
//! Every implementation applies the engine's request vocabulary
//! ([`leasehold_engine::request`]) one transaction per request: it reads the rows in
//! lock order (attempt, command, receipts), lets the engine decide
//! ([`leasehold_engine::decide`], through the [`WritesHook`] if one is set), and
//! writes the new images under the engine's [`leasehold_engine::Guard`], treating a
//! guard that no longer holds as a refusal. One method applies every worker request
//! ([`Ledger::worker`]), one every operator request ([`Ledger::operator`]), one the
//! claims ([`Ledger::claim_batch`]); the named transitions are provided on top.
//! Lease decisions use the ledger's own clock; ids and tokens come from its entropy.
//!
//! Implementations: [`memory::MemoryLedger`] (the reference),
//! [`sqlite::SqliteLedger`], [`mysql::MysqlLedger`] and [`postgres::PostgresLedger`].
//! [`DbUrl`] parses the URL that picks one.

// Its row-by-row reading helpers are the SQL ledgers'; a build with none of them (the
// memory ledger only) leaves them unused.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "mysql", feature = "postgres")),
    allow(dead_code)
)]
pub mod bulk;
pub mod fleet;
pub mod limits;
pub mod listing;
pub mod memory;
pub mod migrate;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub(crate) mod outbox;
#[cfg(any(feature = "mysql", feature = "postgres"))]
mod percent;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod prune;
#[cfg(any(feature = "mysql", feature = "postgres"))]
mod scratch;
// One SQL layer for every SQL backend; a build without some of them leaves their
// dialects unused.
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
#[cfg_attr(
    not(all(feature = "sqlite", feature = "mysql", feature = "postgres")),
    allow(dead_code)
)]
pub(crate) mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod url;

#[cfg(any(feature = "mysql", feature = "postgres"))]
pub use sql::SqlLedger;
pub use url::DbUrl;

use crate::entropy::{Entropy, IdKind};
use leasehold_engine::input::Prepared;
use leasehold_engine::limits::TargetLimit;
use leasehold_engine::plan::PlanError;
use leasehold_engine::transition::{self, Continued, NewIds, ReconcileOutcome, Start};
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, Capabilities, ClaimRequest, CommandId, CommandStatus, Decision, Lease,
    LeaseToken, OperatorRequest, Plan, PlanId, PlanSpec, Refusal, Reply, Request, Timestamp, TraceContext,
    WorkerRequest, Writes,
};
use serde_json::Value;
use std::future::Future;

/// Why a ledger call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The engine refused the transition; nothing was written.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The plan is invalid; nothing was written.
    #[error("invalid plan: {0}")]
    InvalidPlan(#[from] PlanError),
    /// No such plan or attempt.
    #[error("{kind} {id} not found")]
    NotFound {
        /// `plan`, `attempt` or `command`.
        kind: &'static str,
        /// The id or name that was looked up.
        id: String,
    },
    /// Malformed input other than a plan (a URL, an argument).
    #[error("{0}")]
    BadInput(String),
    /// The ledger could not be reached, or was busy; nothing was written. Retry.
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
    /// The request may or may not have been applied (the connection was lost).
    #[error("outcome unknown: {0}")]
    Ambiguous(String),
    /// Stored data is inconsistent (a bad row, a schema from the future).
    #[error("ledger integrity: {0}")]
    Integrity(String),
    /// A bug or an unexpected database error.
    #[error("internal ledger error: {0}")]
    Internal(String),
}

impl LedgerError {
    /// Whether retrying the same request may succeed (unavailable or ambiguous).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Ambiguous(_))
    }
}

/// A seam on a ledger's write path: it sees the rows a request was decided on and
/// the engine's decision for them (its writes and reply, or its refusal), and may
/// replace that decision before it is applied. Production ledgers have none; the
/// simulator plants its bugs through it (`leasehold-sim`'s `bugs` module), so the
/// engine needs no bug switches.
pub type WritesHook = std::sync::Arc<dyn Fn(&AttemptRecord, Decision) -> Decision + Send + Sync>;

/// Decides `request` on `record` at `now` with the engine's one entry point
/// ([`leasehold_engine::decide`]), through `hook` if there is one: every ledger's
/// write path decides here.
pub(crate) fn decide(
    hook: Option<&WritesHook>,
    record: &AttemptRecord,
    request: Request<'_>,
    now: Timestamp,
) -> Decision {
    let decided = leasehold_engine::decide(record, request, now);
    match hook {
        Some(hook) => hook(record, decided),
        None => decided,
    }
}

/// What an enqueue asks for besides its plan: the attempt's action, when its command
/// becomes claimable, the trace it joins, the key that makes it idempotent and, for
/// a template, its input and order key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueRequest {
    /// execute, retry or compensate.
    pub action: Action,
    /// When its command becomes claimable (by the ledger's clock).
    pub start: Start,
    /// The caller's trace context (`traceparent`): the attempt's trace is a child of
    /// it, or a new trace when there is none ([`TraceContext::for_attempt`]).
    pub parent: Option<TraceContext>,
    /// The caller's enqueue key: an enqueue with the key of an earlier one answers
    /// that one's attempt when it is the same request, and is refused
    /// ([`Refusal::KeyReused`]) when it is another
    /// ([`leasehold_engine::transition::keyed`]). 1 to 255 characters, none that a
    /// name may not hold.
    pub key: Option<String>,
    /// A template's input ([`leasehold_engine::input`]): checked against the plan's
    /// `[input]`, resolved into each step's payload and frozen on the receipts. None
    /// for a template takes `{}`; a plan without `[input]` takes none.
    pub input: Option<serde_json::Value>,
    /// A template's order key ([`leasehold_engine::order`]): attempts with the same
    /// one run one at a time, in enqueue order.
    pub order_key: Option<String>,
}

impl EnqueueRequest {
    /// An attempt doing `action`, claimable at once, in a new trace.
    pub fn new(action: Action) -> Self {
        Self {
            action,
            start: Start::Now,
            parent: None,
            key: None,
            input: None,
            order_key: None,
        }
    }

    /// Claimable from `start`.
    pub fn at(self, start: Start) -> Self {
        Self { start, ..self }
    }

    /// In the trace of `parent` (none: a new trace).
    pub fn traced(self, parent: Option<TraceContext>) -> Self {
        Self { parent, ..self }
    }

    /// With the enqueue key `key` (none: not idempotent).
    pub fn keyed(self, key: Option<String>) -> Self {
        Self { key, ..self }
    }

    /// With a template's input (none: `{}` for a template).
    pub fn with_input(self, input: Option<serde_json::Value>) -> Self {
        Self { input, ..self }
    }

    /// With the order key `order_key` (none: runs beside the template's others).
    pub fn ordered(self, order_key: Option<String>) -> Self {
        Self { order_key, ..self }
    }
}

/// What an enqueue answered: the attempt, and whether this enqueue created it (or
/// answered the attempt an earlier enqueue with the same key created). As JSON: the
/// record's fields with `attempt_id` and `created`.
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueued {
    /// The attempt's rows.
    pub record: AttemptRecord,
    /// Created by this enqueue.
    pub created: bool,
}

impl Enqueued {
    /// The writes that insert the attempt (`Guard::Absent`) when this enqueue created
    /// it; none when it answered an earlier one.
    pub(crate) fn writes(&self) -> Option<Writes> {
        self.created.then(|| Writes::new_attempt(&self.record))
    }
}

impl serde::Serialize for Enqueued {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View<'a> {
            attempt_id: &'a AttemptId,
            created: bool,
            #[serde(flatten)]
            record: &'a AttemptRecord,
        }
        View {
            attempt_id: &self.record.attempt.id,
            created: self.created,
            record: &self.record,
        }
        .serialize(serializer)
    }
}

/// An enqueue of `plan` decided over its `history` and the attempt its key names
/// already (`keyed`): that attempt answered, when the same request enqueued it, or
/// a new attempt with fresh ids and the key stored with it. For a template,
/// `history` need only hold its latest attempt and the open one with the request's
/// order key (what the SQL ledgers read for it).
pub(crate) fn decide_enqueue(
    plan: &Plan,
    history: &[AttemptRecord],
    keyed: Option<&AttemptRecord>,
    request: &EnqueueRequest,
    (entropy, now): (&dyn Entropy, Timestamp),
) -> Result<Enqueued, LedgerError> {
    let input = template_input(plan, request)?;
    let key = match &request.key {
        Some(key) => {
            transition::check_enqueue_key("enqueue key", key).map_err(LedgerError::BadInput)?;
            let template = transition::TemplateKey {
                input_sha256: input.as_ref().map(|i| i.sha256.as_str()),
                order_key: request.order_key.as_deref(),
            };
            let sha = transition::enqueue_request_sha256(&plan.id, request.action, request.start, template);
            if let Some(existing) = transition::keyed(keyed, key, &sha)? {
                return Ok(Enqueued {
                    record: existing.clone(),
                    created: false,
                });
            }
            Some((key.clone(), sha))
        }
        None => None,
    };
    let ids = new_attempt_ids(entropy, request.parent);
    let mut record = match &input {
        Some(input) if request.action == Action::Execute => {
            let template = transition::TemplateEnqueue {
                input,
                order_key: request.order_key.as_deref(),
                latest_number: history.iter().map(|r| r.attempt.number).max().unwrap_or(0),
                ahead: history
                    .iter()
                    .find(|r| !r.attempt.status.is_terminal() && r.attempt.order_key == request.order_key),
            };
            transition::enqueue_template(plan, template, ids, now, request.start)?
        }
        _ => transition::enqueue_at(plan, history, request.action, ids, now, request.start)?,
    };
    if let Some((key, sha)) = key {
        record.attempt.enqueue_key = Some(key);
        record.attempt.request_sha256 = Some(sha);
    }
    Ok(Enqueued { record, created: true })
}

/// A template's input, checked and resolved ([`leasehold_engine::input::prepare`]);
/// none for a plan without `[input]`, which may be given neither input nor an
/// order key. Errors name the field.
fn template_input(plan: &Plan, request: &EnqueueRequest) -> Result<Option<Prepared>, LedgerError> {
    if let Some(key) = &request.order_key {
        transition::check_enqueue_key("order_key", key).map_err(LedgerError::BadInput)?;
    }
    if plan.is_template() && request.action != Action::Execute {
        // Refused by the template's own guard ([`transition::enqueue_at`]).
        return Ok(None);
    }
    if !plan.is_template() {
        let given = match (&request.input, &request.order_key) {
            (Some(_), _) => "input",
            (None, Some(_)) => "order_key",
            (None, None) => return Ok(None),
        };
        return Err(LedgerError::BadInput(format!(
            "{given}: plan {} declares no [input], so its attempts take neither input nor an order key",
            plan.id
        )));
    }
    let empty = serde_json::Value::Object(serde_json::Map::new());
    let input = request.input.as_ref().unwrap_or(&empty);
    let prepared = leasehold_engine::input::prepare(plan, input).map_err(|e| LedgerError::BadInput(e.to_string()))?;
    Ok(Some(prepared))
}

/// A new attempt's ids, drawn from `entropy` (attempt, then command), and its trace
/// context, a child of `parent` or a new trace.
pub(crate) fn new_attempt_ids(entropy: &dyn Entropy, parent: Option<TraceContext>) -> NewIds {
    let attempt = AttemptId::new(entropy.id(IdKind::Attempt));
    NewIds {
        trace: Some(TraceContext::for_attempt(parent.as_ref(), &attempt)),
        attempt,
        command: CommandId::new(entropy.id(IdKind::Command)),
    }
}

/// A command claimed under a fresh lease, with what the worker needs to deliver it.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The lease: command, attempt and token.
    pub lease: Lease,
    /// The plan the attempt executes.
    pub plan: Plan,
    /// The attempt's rows as the claim left them.
    pub record: AttemptRecord,
}

impl Claimed {
    /// The claim of `record` (as read) under `token`, once its claim's `writes` are
    /// applied. (The SQL ledgers' claims: unused in a build with none of them.)
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "mysql", feature = "postgres")),
        allow(dead_code)
    )]
    pub(crate) fn applied(mut record: AttemptRecord, plan: Plan, token: LeaseToken, writes: &Writes) -> Self {
        writes.apply_to(&mut record);
        Self {
            lease: Lease {
                command_id: record.command.id.clone(),
                attempt_id: record.attempt.id.clone(),
                token,
            },
            plan,
            record,
        }
    }
}

impl Claimed {
    /// Whether the claim left a lease to deliver under: every claim but one that
    /// found its attempt exhausted and ended it instead ([`Reply::Exhausted`]), whose
    /// record shows the attempt ended.
    pub(crate) fn is_lease(&self) -> bool {
        self.record.command.status == CommandStatus::Processing
    }

    /// The claims of a batch that left leases ([`Claimed::is_lease`]): what a claim
    /// answers once its writes (the exhausted attempts' ends too) are committed.
    #[cfg_attr(not(any(feature = "mysql", feature = "postgres")), allow(dead_code))]
    pub(crate) fn leases(claimed: Vec<Claimed>) -> Vec<Claimed> {
        claimed.into_iter().filter(Claimed::is_lease).collect()
    }
}

/// A reply that does not fit the request it answers: a ledger bug.
fn unexpected(op: &str, reply: Reply) -> LedgerError {
    LedgerError::Internal(format!("{op}: unexpected reply {reply:?}"))
}

/// [`Ledger::worker_then_claim`] as two transactions: the request, then (once it is
/// applied) the claim, whose failure claims nothing and leaves the request standing.
pub(crate) async fn worker_then_claim_apart<L: Ledger + ?Sized>(
    ledger: &L,
    lease: &Lease,
    request: WorkerRequest,
    claim: ClaimRequest,
) -> Result<(Reply, Vec<Claimed>), LedgerError> {
    let reply = ledger.worker(lease, request).await?;
    let claimed = ledger.claim_batch(claim).await.unwrap_or_default();
    Ok((reply, claimed))
}

/// The operations of a ledger. Each transition is atomic; reads are consistent
/// snapshots.
///
/// Transitions arrive as the engine's request vocabulary ([`leasehold_engine::request`]):
/// an implementation provides [`Ledger::claim_batch`] (claims, on their own candidate
/// path), [`Ledger::worker`] (every request of a lease holder) and
/// [`Ledger::operator`] (every operator request), each deciding with
/// [`leasehold_engine::decide`]; the named transition methods
/// ([`Ledger::heartbeat`], [`Ledger::abort`], …) are provided on top of them.
pub trait Ledger: Send + Sync + 'static {
    /// Whether [`Ledger::worker_then_claim`] claims in the worker write's own
    /// transaction (one commit for both) rather than in a second one.
    fn fuses_claims(&self) -> bool {
        false
    }

    /// Applies pending schema migrations; answers the versions applied now (empty
    /// when up to date).
    fn migrate(&self) -> impl Future<Output = Result<Vec<u32>, LedgerError>> + Send;

    /// Validates and registers a plan. Registering content that a READY plan already
    /// has (same fingerprint) answers that plan.
    fn register_plan(
        &self,
        spec: PlanSpec,
        known_executors: &[&str],
    ) -> impl Future<Output = Result<Plan, LedgerError>> + Send;

    /// A plan by id.
    fn plan(&self, id: &PlanId) -> impl Future<Output = Result<Plan, LedgerError>> + Send;

    /// Every plan, oldest first.
    fn list_plans(&self) -> impl Future<Output = Result<Vec<Plan>, LedgerError>> + Send;

    /// The plans named `name`, oldest first. The SQL ledgers answer from an index on
    /// the name; the default filters [`Ledger::list_plans`].
    fn plans_named(&self, name: &str) -> impl Future<Output = Result<Vec<Plan>, LedgerError>> + Send {
        async move {
            let plans = self.list_plans().await?;
            Ok(plans.into_iter().filter(|p| p.name == name).collect())
        }
    }

    /// Up to `limit` plans, newest first: the newest when `before` is `None`, else
    /// those registered before the plan `before` (the last one of the previous page).
    /// An unknown `before` is [`LedgerError::NotFound`]. The SQL ledgers read only the
    /// page; the default filters [`Ledger::list_plans`].
    fn plans_newest_first(
        &self,
        before: Option<&PlanId>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<Plan>, LedgerError>> + Send {
        async move {
            let plans = self.list_plans().await?;
            let end = match before {
                None => plans.len(),
                Some(id) => plans
                    .iter()
                    .position(|p| &p.id == id)
                    .ok_or_else(|| LedgerError::NotFound {
                        kind: "plan",
                        id: id.to_string(),
                    })?,
            };
            Ok(plans[..end].iter().rev().take(limit as usize).cloned().collect())
        }
    }

    /// Every plan like [`Ledger::list_plans`], for a listing: a plan whose stored row
    /// does not parse is listed as damaged in its place ([`listing::PlanRow`]) instead
    /// of failing the whole list. The default reads [`Ledger::list_plans`].
    fn list_plan_rows(&self) -> impl Future<Output = Result<Vec<listing::PlanRow>, LedgerError>> + Send {
        listing::plan_rows_from_list(self)
    }

    /// A page of plans like [`Ledger::plans_newest_first`], for a listing: a plan whose
    /// stored row does not parse is listed as damaged in its place. The default reads
    /// [`Ledger::plans_newest_first`].
    fn plan_rows_newest_first(
        &self,
        before: Option<&PlanId>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<listing::PlanRow>, LedgerError>> + Send {
        listing::plan_rows_from_page(self, before, limit)
    }

    /// Marks a plan RETIRED: it accepts no new attempts.
    fn retire_plan(&self, id: &PlanId) -> impl Future<Output = Result<Plan, LedgerError>> + Send;

    /// Enqueues an attempt claimable at once: attempt, receipts and command in one
    /// transaction.
    fn enqueue(
        &self,
        plan: &PlanId,
        action: Action,
    ) -> impl Future<Output = Result<AttemptRecord, LedgerError>> + Send {
        self.enqueue_at(plan, action, Start::Now)
    }

    /// Enqueues an attempt whose command is claimable from `start` (by the ledger's
    /// clock; an instant already past means at once), in a new trace.
    fn enqueue_at(
        &self,
        plan: &PlanId,
        action: Action,
        start: Start,
    ) -> impl Future<Output = Result<AttemptRecord, LedgerError>> + Send {
        let enqueued = self.enqueue_with(plan, EnqueueRequest::new(action).at(start));
        async move { Ok(enqueued.await?.record) }
    }

    /// Enqueues the attempt `request` describes: attempt, receipts and command in one
    /// transaction, the attempt's trace context (and its key) stored with it; or, for
    /// a key an earlier enqueue of the same request used, answers that attempt.
    fn enqueue_with(
        &self,
        plan: &PlanId,
        request: EnqueueRequest,
    ) -> impl Future<Output = Result<Enqueued, LedgerError>> + Send;

    /// Claims up to `request.batch` claimable commands for `request.owner` under
    /// fresh leases of `request.lease_ms`, oldest `available_at` first, each decided
    /// as [`leasehold_engine::Request::Claim`] (with `begin`, also beginning its next
    /// step), in one transaction where the ledger can.
    fn claim_batch(&self, request: ClaimRequest) -> impl Future<Output = Result<Vec<Claimed>, LedgerError>> + Send;

    /// Applies a request of the worker holding `lease`, in one transaction: reads
    /// the attempt's rows in lock order, decides with the ledger's clock, writes
    /// under the engine's guard. A lease whose command is not the attempt's is
    /// [`LedgerError::NotFound`].
    fn worker(&self, lease: &Lease, request: WorkerRequest) -> impl Future<Output = Result<Reply, LedgerError>> + Send;

    /// Applies a request of the worker holding `lease` like [`Ledger::worker`] and,
    /// once it is applied, claims like [`Ledger::claim_batch`]: the worker that ends
    /// one attempt claims its next in the same transaction where the ledger can (the
    /// SQLite and PostgreSQL ledgers do, and MySQL's with `SKIP LOCKED`; this default
    /// runs the two one after the other). The claim
    /// never undoes the request: a claim that fails claims nothing and the request
    /// stands; a refused request claims nothing.
    fn worker_then_claim(
        &self,
        lease: &Lease,
        request: WorkerRequest,
        claim: ClaimRequest,
    ) -> impl Future<Output = Result<(Reply, Vec<Claimed>), LedgerError>> + Send {
        worker_then_claim_apart(self, lease, request, claim)
    }

    /// Applies an operator request to an attempt, in one transaction; answers the
    /// reply and the attempt's rows as the request left them.
    fn operator(
        &self,
        attempt: &AttemptId,
        request: OperatorRequest,
    ) -> impl Future<Output = Result<(Reply, AttemptRecord), LedgerError>> + Send;

    /// Claims up to `batch` claimable commands for `owner` with a lease of `lease_ms`.
    fn claim(
        &self,
        owner: &str,
        batch: u32,
        lease_ms: u64,
    ) -> impl Future<Output = Result<Vec<Claimed>, LedgerError>> + Send {
        self.claim_batch(ClaimRequest {
            owner: owner.to_owned(),
            batch,
            lease_ms,
            begin: false,
            capabilities: None,
        })
    }

    /// Claims like [`Ledger::claim`] and begins each claimed attempt's next step (the
    /// first that has not SUCCEEDED) in the same transaction.
    fn claim_and_begin(
        &self,
        owner: &str,
        batch: u32,
        lease_ms: u64,
    ) -> impl Future<Output = Result<Vec<Claimed>, LedgerError>> + Send {
        self.claim_batch(ClaimRequest {
            owner: owner.to_owned(),
            batch,
            lease_ms,
            begin: true,
            capabilities: None,
        })
    }

    /// Completes a step and begins the next one, or finishes the attempt after the
    /// last, in the same transaction.
    fn complete_and_continue(
        &self,
        lease: &Lease,
        ordinal: u32,
        evidence: &Value,
        target_receipt: &Value,
        lease_ms: u64,
    ) -> impl Future<Output = Result<Continued, LedgerError>> + Send {
        let request = WorkerRequest::CompleteAndContinue {
            ordinal,
            evidence: evidence.clone(),
            target_receipt: target_receipt.clone(),
            lease_ms,
        };
        async move {
            match self.worker(lease, request).await? {
                Reply::Continued(continued) => Ok(continued),
                other => Err(unexpected("complete-and-continue", other)),
            }
        }
    }

    /// Renews a lease; answers the new deadline (ledger clock).
    fn heartbeat(&self, lease: &Lease, lease_ms: u64) -> impl Future<Output = Result<Timestamp, LedgerError>> + Send {
        async move {
            match self.worker(lease, WorkerRequest::Heartbeat { lease_ms }).await? {
                Reply::Renewed { until } => Ok(until),
                other => Err(unexpected("heartbeat", other)),
            }
        }
    }

    /// Begins a step.
    fn begin_step(
        &self,
        lease: &Lease,
        ordinal: u32,
        lease_ms: u64,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        let request = WorkerRequest::BeginStep { ordinal, lease_ms };
        async move { self.worker(lease, request).await.map(drop) }
    }

    /// Completes a step with its evidence and target receipt.
    fn complete_step(
        &self,
        lease: &Lease,
        ordinal: u32,
        evidence: &Value,
        target_receipt: &Value,
        lease_ms: u64,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        let request = WorkerRequest::CompleteStep {
            ordinal,
            evidence: evidence.clone(),
            target_receipt: target_receipt.clone(),
            lease_ms,
        };
        async move { self.worker(lease, request).await.map(drop) }
    }

    /// Fails the attempt (at a step, if given).
    fn fail(
        &self,
        lease: &Lease,
        ordinal: Option<u32>,
        error: &str,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        let request = WorkerRequest::Fail {
            ordinal,
            error: error.to_owned(),
        };
        async move { self.worker(lease, request).await.map(drop) }
    }

    /// Finishes the attempt: SUCCEEDED and DELIVERED.
    fn finish(&self, lease: &Lease) -> impl Future<Output = Result<(), LedgerError>> + Send {
        async move { self.worker(lease, WorkerRequest::Finish).await.map(drop) }
    }

    /// Requeues an attempt whose lease expired; refuses a live lease.
    fn reconcile(
        &self,
        attempt: &AttemptId,
    ) -> impl Future<Output = Result<(ReconcileOutcome, AttemptRecord), LedgerError>> + Send {
        async move {
            match self.operator(attempt, OperatorRequest::Reconcile).await? {
                (Reply::Reconciled(outcome), record) => Ok((outcome, record)),
                (other, _) => Err(unexpected("reconcile", other)),
            }
        }
    }

    /// Aborts a QUEUED or RUNNING attempt, fencing its worker.
    fn abort(
        &self,
        attempt: &AttemptId,
        reason: &str,
    ) -> impl Future<Output = Result<AttemptRecord, LedgerError>> + Send {
        let request = OperatorRequest::Abort {
            reason: reason.to_owned(),
        };
        async move { self.operator(attempt, request).await.map(|(_, record)| record) }
    }

    /// An attempt with its command and receipts.
    fn attempt(&self, attempt: &AttemptId) -> impl Future<Output = Result<AttemptRecord, LedgerError>> + Send;

    /// Every attempt of a plan, by number.
    fn history(&self, plan: &PlanId) -> impl Future<Output = Result<Vec<AttemptRecord>, LedgerError>> + Send;

    /// How many attempts are QUEUED or RUNNING, counted by their commands (PENDING or
    /// PROCESSING: every transition writes an attempt and its command together).
    fn open_attempts(&self) -> impl Future<Output = Result<u64, LedgerError>> + Send;

    /// A page of attempts across plans, newest first ([`listing`]). The default
    /// reads every history; the SQL ledgers answer from an index.
    fn list_attempts(
        &self,
        query: &listing::AttemptQuery,
    ) -> impl Future<Output = Result<listing::AttemptPage, LedgerError>> + Send {
        listing::list_from_history(self, query)
    }

    /// Wake-ups for idle workers: a receiver whose value changes whenever work may
    /// have become claimable (PostgreSQL's `LISTEN`/`NOTIFY`), so that a worker
    /// claims at once instead of at its next poll; polling stays the fallback, for
    /// what nothing announces (an expired lease). `None`, the default: this ledger
    /// announces nothing. Called inside a tokio runtime.
    fn wake(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// What keeps this ledger from serving, one line each; empty when it is ready.
    /// The SQL ledgers check that their schema is at this binary's version and that
    /// every table they use answers a query naming every column they read (reading
    /// no row); each line names a table or a version, never the database. An error:
    /// the ledger could not be asked (unreachable, busy). The default (a ledger
    /// without a schema, in memory) is always ready.
    fn check_ready(&self) -> impl Future<Output = Result<Vec<String>, LedgerError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// One line when this ledger's schema is newer than this binary's and compatible
    /// with it ([`migrate::newer_notice`]): the binary runs on it, and says so when a
    /// worker starts and when `migrate` applies nothing. `None` otherwise (the
    /// default: a ledger without a schema); refused as on open when the newer schema
    /// is not compatible.
    fn schema_notice(&self) -> impl Future<Output = Result<Option<String>, LedgerError>> + Send {
        async { Ok(None) }
    }

    /// Attempts per status, each count capped at `cap` ([`listing`]). The default
    /// reads every history; the SQL ledgers stop counting at the cap.
    fn count_attempts(&self, cap: u64) -> impl Future<Output = Result<listing::AttemptCounts, LedgerError>> + Send {
        listing::count_from_history(self, cap)
    }

    /// How many open attempts (QUEUED or RUNNING) a worker with `capabilities` could
    /// run ([`Capabilities::admits`] on their commands): what a worker's `until_idle`
    /// waits for. The default counts every open attempt.
    fn open_attempts_for(&self, capabilities: &Capabilities) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        let _ = capabilities;
        self.open_attempts()
    }

    /// Records that worker `id` runs with `capabilities`, seen now (ledger clock):
    /// `starting` a run writes its row afresh (and forgets workers unheard of for
    /// [`fleet::FORGET_AFTER_MS`]), later reports renew it ([`fleet`]). The default
    /// keeps no fleet (a ledger that is only a client of another's, as the
    /// simulator's).
    fn report_worker(
        &self,
        id: &str,
        capabilities: &Capabilities,
        starting: bool,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        let _ = (id, capabilities, starting);
        async { Ok(()) }
    }

    /// Every worker row, by id, and the ledger's now (to tell the live ones,
    /// [`fleet::WorkerRow::is_live`]). The default: none.
    fn workers(&self) -> impl Future<Output = Result<(Vec<fleet::WorkerRow>, Timestamp), LedgerError>> + Send {
        async { Ok((Vec::new(), Timestamp::from_millis(0))) }
    }

    /// Sets a target's limits ([`limits`]), its row created on first use; a bad
    /// value is refused naming the field, and nothing is written. The default (a
    /// ledger that keeps no limits) refuses.
    fn set_limit(&self, limit: TargetLimit) -> impl Future<Output = Result<(), LedgerError>> + Send {
        let _ = limit;
        async { Err(LedgerError::BadInput("this ledger keeps no target limits".into())) }
    }

    /// Removes a target's limits; whether it had any.
    fn clear_limit(&self, target: &str) -> impl Future<Output = Result<bool, LedgerError>> + Send {
        let _ = target;
        async { Ok(false) }
    }

    /// Every limited target, by target, and the ledger's now. The default: none.
    fn limits(&self) -> impl Future<Output = Result<(Vec<limits::TargetRow>, Timestamp), LedgerError>> + Send {
        async { Ok((Vec::new(), Timestamp::from_millis(0))) }
    }

    /// What retention keeps of a plan whatever the age of its attempts
    /// ([`prune::Keep`]). The default reads the plan's whole history; the SQL
    /// ledgers probe their index.
    fn prune_keep(&self, plan: &PlanId) -> impl Future<Output = Result<prune::Keep, LedgerError>> + Send {
        prune::keep_from_history(self, plan)
    }

    /// Up to `query.limit` attempts of a plan that retention may delete, numbered
    /// above `query.after`, by number, with their commands and receipts
    /// ([`prune`] says which). The default reads the plan's whole history; the SQL
    /// ledgers read only the page.
    fn prunable(
        &self,
        query: &prune::PruneQuery,
    ) -> impl Future<Output = Result<Vec<AttemptRecord>, LedgerError>> + Send {
        prune::prunable_from_history(self, query)
    }

    /// Deletes these attempts with their commands and receipts, in one transaction,
    /// leaving any that is not ended; answers how many were deleted. Only
    /// [`prune::prune`] calls it, with attempts [`Ledger::prunable`] answered. The
    /// default (a ledger that is only a client of another's) refuses.
    fn delete_attempts(&self, ids: &[AttemptId]) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        let _ = ids;
        prune::cannot_delete()
    }
}

/// A limit as given, checked: the error names the field.
pub(crate) fn checked_limit(limit: &TargetLimit) -> Result<(), LedgerError> {
    limit.validate().map_err(LedgerError::BadInput)
}

/// Finds a plan by id, or else by name (the newest READY plan of that name, or the
/// newest of any status).
pub async fn find_plan<L: Ledger>(ledger: &L, reference: &str) -> Result<Plan, LedgerError> {
    match ledger.plan(&PlanId::new(reference)).await {
        Err(LedgerError::NotFound { .. }) => {}
        other => return other,
    }
    let named = ledger.plans_named(reference).await?;
    named
        .iter()
        .rev()
        .find(|p| p.status == leasehold_engine::PlanStatus::Ready)
        .or(named.last())
        .cloned()
        .ok_or_else(|| LedgerError::NotFound {
            kind: "plan",
            id: reference.to_owned(),
        })
}
