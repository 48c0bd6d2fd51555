//! One [`Ledger`] for every asynchronous SQL backend: [`SqlLedger`] over a
//! [`SqlBackend`].
//!
//! The backend connects, begins and ends transactions, classifies its errors (into
//! [`TxError`]) and claims in its own way; everything else — the retry policy, every
//! transaction body (register, enqueue, a worker's request, an operator's request,
//! the reads), the decision through [`leasehold_engine::decide`] and the guarded
//! writes — is written here once, over the backend's [`Session`].
//!
//! Each request is one transaction (a claim batch, a worker request, an operator
//! request): it reads its rows in lock order through [`Session::lock_record`], lets the
//! engine decide at the ledger's now (the injected clock, else the database's as read
//! once the rows were held) and writes the engine's images under its guard
//! ([`session::apply_writes`]). A transaction that ends in [`TxError::Retry`] is run
//! again, whole, after a jittered, growing backoff, at most the backend's
//! [`SqlContext::tries`] times.

use super::session::{self, not_found, Session};
use super::{limits, TxError};
use crate::clock::Clock;
use crate::entropy::Entropy;
use crate::ledger::decide_enqueue;
use crate::ledger::fleet::WorkerRow;
use crate::ledger::limits::TargetRow;
use crate::ledger::listing::{AttemptCounts, AttemptPage, AttemptQuery, PlanRow};
use crate::ledger::outbox::decide_plan;
use crate::ledger::prune::{Keep, PruneQuery};
use crate::ledger::{decide, Claimed, Ledger, LedgerError};
use crate::ledger::{EnqueueRequest, Enqueued};
use leasehold_engine::limits::TargetLimit;
use leasehold_engine::{
    AttemptId, AttemptRecord, Capabilities, ClaimRequest, CommandStatus, Lease, OperatorRequest, Plan, PlanId,
    PlanSpec, PlanStatus, Reply, Request, Timestamp, WorkerRequest, Writes,
};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The first backoff after a conflict; it doubles per try up to [`BACKOFF_MAX_MS`].
const BACKOFF_BASE_MS: u64 = 2;
/// The longest backoff between two tries of one transaction.
const BACKOFF_MAX_MS: u64 = 250;

/// What a transaction is for: the backend begins (and ends) each kind its own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxKind {
    /// A transition: its locking reads see the latest committed rows, its end is a
    /// `COMMIT` whose loss is ambiguous.
    Write,
    /// A claim (alone, or after a worker request in one transaction).
    Claim,
    /// A read of several statements: one snapshot, read only.
    Read,
    /// A read of one statement: no transaction at all.
    Single,
}

impl TxKind {
    /// Whether ending this kind commits writes (a lost `COMMIT` is then ambiguous).
    pub(crate) fn writes(self) -> bool {
        matches!(self, TxKind::Write | TxKind::Claim)
    }
}

/// What every SQL ledger shares whatever its backend: its clock, its entropy and its
/// retry count.
pub(crate) struct SqlContext {
    /// The injected clock, or `None` for the database's.
    pub(crate) clock: Option<Arc<dyn Clock>>,
    /// Ids, tokens and backoff jitter.
    pub(crate) entropy: Arc<dyn Entropy>,
    /// Transactions tried again after a conflict or a lost connection.
    pub(crate) retries: AtomicU64,
    /// How many times a transaction is tried in all (the URL's `retry_max`).
    pub(crate) tries: u32,
    /// The queue of group writes ([`super::group`]).
    pub(crate) groups: super::group::Groups,
}

impl SqlContext {
    /// A context deciding on `clock` (the database's when `None`).
    pub(crate) fn new(clock: Option<Arc<dyn Clock>>, entropy: Arc<dyn Entropy>, tries: u32) -> Self {
        Self {
            clock,
            entropy,
            retries: AtomicU64::new(0),
            tries,
            groups: Default::default(),
        }
    }

    /// The decision's now: the injected clock, else the database's as read.
    pub(crate) fn decide_at(&self, db_now: Option<Timestamp>) -> Result<Timestamp, TxError> {
        match (&self.clock, db_now) {
            (Some(clock), _) => Ok(clock.now()),
            (None, Some(now)) => Ok(now),
            (None, None) => Err(LedgerError::Internal("no clock to decide on".into()).into()),
        }
    }

    /// What this ledger's registrations and enqueues decide with.
    pub(crate) fn decider(&self) -> Decider<'_> {
        Decider {
            entropy: &*self.entropy,
            clock: self.clock.as_deref(),
        }
    }

    /// Jittered backoff before try `tried + 1`: uniform in [cap/2, cap], where cap
    /// doubles with every try (from [`BACKOFF_BASE_MS`] up to [`BACKOFF_MAX_MS`]).
    fn backoff(&self, tried: u32) -> Duration {
        let cap = BACKOFF_BASE_MS
            .saturating_mul(1u64 << tried.min(16))
            .min(BACKOFF_MAX_MS);
        let half = cap / 2;
        Duration::from_millis(half + self.entropy.next_u64() % (cap - half + 1))
    }
}

/// A moment inside a worker's transaction where a backend's tests may act (kill the
/// connection, stall).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checkpoint {
    /// The record is locked; nothing is written yet.
    AfterReads,
    /// Everything is written; `COMMIT` comes next.
    BeforeCommit,
}

/// What a SQL database does for [`SqlLedger`]: its connections and transactions, its
/// errors (every failure arrives classified as a [`TxError`]), and what is its own
/// SQL (its claim, its locking read of a record, inside [`Session`]).
pub(crate) trait SqlBackend: Sized + Send + Sync + 'static {
    /// A pooled connection.
    type Conn: Send;
    /// A transaction (or, for [`TxKind::Single`], the bare connection) on a
    /// connection.
    type Tx<'c>: Session + Send;

    /// A pooled connection.
    fn connect(&self) -> impl Future<Output = Result<Self::Conn, TxError>> + Send;

    /// Begins a transaction of `kind` on `conn`.
    fn begin<'c>(
        &'c self,
        conn: &'c mut Self::Conn,
        kind: TxKind,
    ) -> impl Future<Output = Result<Self::Tx<'c>, TxError>> + Send;

    /// Commits `tx` (a lost `COMMIT` of a kind that [`TxKind::writes`] is
    /// [`TxError::Ambiguous`]).
    fn commit(&self, tx: Self::Tx<'_>, kind: TxKind) -> impl Future<Output = Result<(), TxError>> + Send;

    /// Rolls `tx` back (a failure means a broken connection, which the server rolls
    /// back itself).
    fn rollback(&self, tx: Self::Tx<'_>) -> impl Future<Output = ()> + Send;

    /// Claims inside `tx` (begun as [`TxKind::Claim`]) what `request` asks for;
    /// answers every claim written, the ends of the attempts a claim found exhausted
    /// among them (the caller keeps the leases, [`Claimed::leases`], once committed).
    fn claim_in(
        &self,
        ctx: &SqlContext,
        tx: &mut Self::Tx<'_>,
        request: &ClaimRequest,
    ) -> impl Future<Output = Result<Vec<Claimed>, TxError>> + Send;

    /// Claims inside `tx` for several requests that share their capabilities;
    /// answers each request's claims, in order. By default each request claims in
    /// turn; a backend may claim for all of them in one pass.
    fn claim_many_in(
        &self,
        ctx: &SqlContext,
        tx: &mut Self::Tx<'_>,
        requests: &[&ClaimRequest],
    ) -> impl Future<Output = Result<Vec<Vec<Claimed>>, TxError>> + Send {
        async move {
            let mut all = Vec::with_capacity(requests.len());
            for request in requests {
                all.push(self.claim_in(ctx, tx, request).await?);
            }
            Ok(all)
        }
    }

    /// Whether the requests of a ledger's lease holders are written in groups, several
    /// callers' in one transaction ([`super::group`]).
    fn groups_writes(&self) -> bool {
        false
    }

    /// A claim batch, whole: by default one [`TxKind::Claim`] transaction around
    /// [`SqlBackend::claim_in`], tried again on conflicts.
    fn claim(
        &self,
        ctx: &SqlContext,
        request: &ClaimRequest,
    ) -> impl Future<Output = Result<Vec<Claimed>, LedgerError>> + Send {
        claim_alone(self, ctx, request)
    }

    /// Whether a worker request and the next claim run in one transaction now
    /// (asking the server once if it must).
    fn fuses(&self, ctx: &SqlContext) -> impl Future<Output = Result<bool, LedgerError>> + Send {
        let _ = ctx;
        async { Ok(true) }
    }

    /// Whether [`SqlBackend::fuses`] is known to answer yes (without asking).
    fn fuses_claims(&self) -> bool {
        true
    }

    /// A worker transaction reached `point` (tests act there).
    fn checkpoint(&self, tx: &mut Self::Tx<'_>, point: Checkpoint) -> impl Future<Output = Result<(), TxError>> + Send {
        let _ = (tx, point);
        async { Ok(()) }
    }

    /// Applies pending migrations; answers the versions applied now.
    fn migrate(&self, ctx: &SqlContext) -> impl Future<Output = Result<Vec<u32>, TxError>> + Send;

    /// What keeps the ledger from serving ([`Ledger::check_ready`]).
    fn check_ready(&self) -> impl Future<Output = Result<Vec<String>, TxError>> + Send;

    /// Whether the schema is newer than this binary's and compatible ([`Ledger::schema_notice`]).
    fn schema_notice(&self) -> impl Future<Output = Result<Option<String>, TxError>> + Send;

    /// Wake-ups for idle workers ([`Ledger::wake`]).
    fn wake(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// Runs `op` until it answers something other than [`TxError::Retry`], at most
/// [`SqlContext::tries`] times, sleeping a jittered, growing backoff in between; the last error
/// becomes a [`LedgerError`].
pub(crate) async fn retry<T, F, Fut>(ctx: &SqlContext, mut op: F) -> Result<T, LedgerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, TxError>>,
{
    let tries = ctx.tries.max(1);
    let mut tried = 0u32;
    loop {
        tried += 1;
        match op().await {
            Ok(v) => return Ok(v),
            Err(TxError::Ledger(e)) => return Err(e),
            Err(TxError::Ambiguous(m)) => return Err(LedgerError::Ambiguous(m)),
            Err(TxError::Retry(m)) if tried >= tries => {
                return Err(LedgerError::Unavailable(format!("{m} (gave up after {tried} tries)")))
            }
            Err(TxError::Retry(_)) => {
                ctx.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(ctx.backoff(tried)).await;
            }
        }
    }
}

/// Ends `tx` by `result`: commits on success, rolls back on an error.
pub(crate) async fn end<B: SqlBackend, T>(
    backend: &B,
    tx: B::Tx<'_>,
    result: Result<T, TxError>,
    kind: TxKind,
) -> Result<T, TxError> {
    match result {
        Ok(v) => backend.commit(tx, kind).await.map(|()| v),
        Err(e) => {
            backend.rollback(tx).await;
            Err(e)
        }
    }
}

/// Ends a claim's transaction: one that claimed nothing wrote nothing, so it only
/// releases its locks (a rollback, no commit); otherwise it commits every claim
/// written (an exhausted attempt's end among them) and answers the leases.
pub(crate) async fn end_claim<B: SqlBackend>(
    backend: &B,
    tx: B::Tx<'_>,
    result: Result<Vec<Claimed>, TxError>,
) -> Result<Vec<Claimed>, TxError> {
    match result {
        Ok(claimed) if claimed.is_empty() => {
            backend.rollback(tx).await;
            Ok(claimed)
        }
        other => end(backend, tx, other, TxKind::Claim).await.map(Claimed::leases),
    }
}

/// A claim batch in a transaction of its own, tried again on conflicts: what
/// [`SqlBackend::claim`] does by default.
pub(crate) fn claim_alone<'a, 'b, 'c, B: SqlBackend>(
    backend: &'a B,
    ctx: &'b SqlContext,
    request: &'c ClaimRequest,
) -> impl Future<Output = Result<Vec<Claimed>, LedgerError>> + Send + use<'a, 'b, 'c, B> {
    retry(ctx, move || claim_once(backend, ctx, request))
}

/// One try of [`claim_alone`]: one claim transaction.
async fn claim_once<B: SqlBackend>(
    backend: &B,
    ctx: &SqlContext,
    request: &ClaimRequest,
) -> Result<Vec<Claimed>, TxError> {
    let mut conn = backend.connect().await?;
    let mut tx = backend.begin(&mut conn, TxKind::Claim).await?;
    let result = backend.claim_in(ctx, &mut tx, request).await;
    end_claim(backend, tx, result).await
}

/// Runs `$body` (which may use `$tx`, the transaction, and `?`) in one transaction of
/// `$kind` on a fresh pooled connection, and ends it by its result.
macro_rules! in_tx {
    ($ledger:expr, $kind:expr, |$tx:ident| $body:expr) => {{
        let backend = &*$ledger.backend;
        let mut conn = backend.connect().await?;
        let mut $tx = backend.begin(&mut conn, $kind).await?;
        let result: Result<_, TxError> = async { $body }.await;
        end(backend, $tx, result, $kind).await
    }};
}

/// A [`Ledger`] over a SQL database: the transaction bodies, written once, run over a
/// backend's sessions (PostgreSQL's, MySQL's). Clones share the backend (its pool) and the context.
pub struct SqlLedger<B> {
    pub(crate) backend: Arc<B>,
    pub(crate) ctx: Arc<SqlContext>,
}

impl<B> Clone for SqlLedger<B> {
    fn clone(&self) -> Self {
        Self {
            backend: Arc::clone(&self.backend),
            ctx: Arc::clone(&self.ctx),
        }
    }
}

impl<B> std::fmt::Debug for SqlLedger<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlLedger")
            .field("backend", &std::any::type_name::<B>())
            .finish_non_exhaustive()
    }
}

// The bound names the crate's own backends: this block is the crate's, not the
// embedder's (its public methods live on each backend's ledger type).
#[allow(private_bounds)]
impl<B: SqlBackend> SqlLedger<B> {
    /// A ledger over `backend`, deciding on `clock` (the database's when `None`).
    pub(crate) fn new(backend: B, clock: Option<Arc<dyn Clock>>, entropy: Arc<dyn Entropy>, tries: u32) -> Self {
        Self {
            backend: Arc::new(backend),
            ctx: Arc::new(SqlContext::new(clock, entropy, tries)),
        }
    }

    /// The ledger's now: its injected clock, else the database's, read in `s`.
    async fn now_in<S: Session>(&self, s: &mut S) -> Result<Timestamp, TxError> {
        match &self.ctx.clock {
            Some(clock) => Ok(clock.now()),
            None => session::db_now(s).await,
        }
    }

    /// Transactions tried again so far (this ledger and its clones).
    pub(crate) fn retries(&self) -> u64 {
        self.ctx.retries.load(Ordering::Relaxed)
    }

    /// Runs `op` with this ledger's retry policy.
    pub(crate) async fn retry<T, F, Fut>(&self, op: F) -> Result<T, LedgerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TxError>>,
    {
        retry(&self.ctx, op).await
    }

    async fn register_plan_once(&self, spec: PlanSpec, known: &[&str]) -> Result<Plan, TxError> {
        in_tx!(self, TxKind::Write, |tx| register_in(
            &mut tx,
            spec,
            known,
            &self.ctx.decider()
        )
        .await)
    }

    async fn retire_plan_once(&self, id: &PlanId) -> Result<Plan, TxError> {
        in_tx!(self, TxKind::Write, |tx| {
            if !session::set_plan_status(&mut tx, id, PlanStatus::Retired).await? {
                return Err(not_found("plan", id).into());
            }
            session::plan_by_id(&mut tx, id, false).await
        })
    }

    /// Enqueues an attempt. The plan row is locked first where rows lock, so enqueues
    /// of one plan are serialized and the history read after the lock sees every
    /// earlier attempt; the enqueue announces new work in the same transaction.
    async fn enqueue_once(&self, plan: &PlanId, request: &EnqueueRequest) -> Result<Enqueued, TxError> {
        in_tx!(self, TxKind::Write, |tx| enqueue_in(
            &mut tx,
            plan,
            request,
            &self.ctx.decider()
        )
        .await)
    }

    pub(super) async fn worker_once(&self, lease: &Lease, request: &WorkerRequest) -> Result<Reply, TxError> {
        in_tx!(self, TxKind::Write, |tx| self.worker_in(&mut tx, lease, request).await)
    }

    /// A worker request, then a claim, in one transaction. A claim that the engine or
    /// an integrity check refuses (a final answer, not a conflict) undoes the whole
    /// transaction and answers `None`: the caller applies the request alone
    /// ([`SqlLedger::worker_once`]) and claims nothing, so the request stands as if it
    /// had come alone. Such a claim is rare (damaged rows); every other one saves the
    /// savepoint that undoing the claim alone would take on every write. A claim that
    /// fails in the server fails the whole transaction, to be tried again as one.
    async fn worker_then_claim_once(
        &self,
        lease: &Lease,
        request: &WorkerRequest,
        claim: &ClaimRequest,
    ) -> Result<Option<(Reply, Vec<Claimed>)>, TxError> {
        let backend = &*self.backend;
        let mut conn = backend.connect().await?;
        let mut tx = backend.begin(&mut conn, TxKind::Claim).await?;
        let reply = match self.worker_in(&mut tx, lease, request).await {
            Ok(reply) => reply,
            Err(e) => return end(backend, tx, Err(e), TxKind::Claim).await,
        };
        match backend.claim_in(&self.ctx, &mut tx, claim).await {
            Ok(claimed) => end(backend, tx, Ok(Some((reply, Claimed::leases(claimed)))), TxKind::Claim).await,
            Err(TxError::Ledger(_)) => {
                backend.rollback(tx).await;
                Ok(None)
            }
            Err(e) => end(backend, tx, Err(e), TxKind::Claim).await,
        }
    }

    /// [`SqlLedger::worker_then_claim_once`], with the request applied alone when
    /// the claim was refused.
    pub(super) async fn worker_then_claim_or_alone(
        &self,
        lease: &Lease,
        request: &WorkerRequest,
        claim: &ClaimRequest,
    ) -> Result<(Reply, Vec<Claimed>), TxError> {
        match self.worker_then_claim_once(lease, request, claim).await? {
            Some(fused) => Ok(fused),
            None => Ok((self.worker_once(lease, request).await?, Vec::new())),
        }
    }

    /// The request of a lease holder inside `tx`: lock the record, decide, write.
    pub(super) async fn worker_in(
        &self,
        tx: &mut B::Tx<'_>,
        lease: &Lease,
        request: &WorkerRequest,
    ) -> Result<Reply, TxError> {
        let (record, db_now) = locked_record(tx, &lease.attempt_id, self.ctx.clock.is_none()).await?;
        self.worker_on(tx, lease, request, record, db_now).await
    }

    /// The request of a lease holder inside `tx`, on its record as locked (and the
    /// database's now, read once it was held): decide, write.
    pub(super) async fn worker_on(
        &self,
        tx: &mut B::Tx<'_>,
        lease: &Lease,
        request: &WorkerRequest,
        record: AttemptRecord,
        db_now: Option<Timestamp>,
    ) -> Result<Reply, TxError> {
        if record.command.id != lease.command_id {
            return Err(not_found("command", &lease.command_id).into());
        }
        self.backend.checkpoint(tx, Checkpoint::AfterReads).await?;
        let plan = match request.needs_plan() {
            true => Some(session::plan_by_id(tx, &record.attempt.plan_id, false).await?),
            false => None,
        };
        let now = self.ctx.decide_at(db_now)?;
        let decided = decide(
            None,
            &record,
            Request::Worker(request, &lease.token, plan.as_ref()),
            now,
        )?;
        let limited = limits::limit_worker(tx, (request, &lease.token), &record, decided, now).await?;
        let mut statements = super::write::plan(tx.dialect(), Some(&record), &limited.writes)?;
        statements.extend(limits::reset_statements(tx.dialect(), &limited.resets));
        tx.run(&statements).await?;
        super::order::follow_order(tx, &record, &limited.writes).await?;
        self.backend.checkpoint(tx, Checkpoint::BeforeCommit).await?;
        Ok(limited.reply)
    }

    /// An operator request: the same reads in lock order, with the plan for its
    /// recovery mode; answers the reply and the record as written. A request that
    /// makes work claimable again (a reconcile's requeue) announces it.
    async fn operator_once(
        &self,
        attempt: &AttemptId,
        request: &OperatorRequest,
    ) -> Result<(Reply, AttemptRecord), TxError> {
        in_tx!(self, TxKind::Write, |tx| {
            let (mut record, db_now) = locked_record(&mut tx, attempt, self.ctx.clock.is_none()).await?;
            let plan = session::plan_by_id(&mut tx, &record.attempt.plan_id, false).await?;
            let request = Request::Operator(request, plan.recovery);
            let (writes, reply) = decide(None, &record, request, self.ctx.decide_at(db_now)?)?;
            session::apply_writes(&mut tx, Some(&record), &writes).await?;
            if requeues(&record, &writes) {
                tx.announce().await?;
            }
            writes.apply_to(&mut record);
            Ok((reply, record))
        })
    }

    async fn attempt_once(&self, attempt: &AttemptId) -> Result<AttemptRecord, TxError> {
        in_tx!(self, TxKind::Read, |tx| {
            session::read_record(&mut tx, attempt)
                .await?
                .ok_or_else(|| not_found("attempt", attempt).into())
        })
    }

    async fn history_once(&self, plan: &PlanId) -> Result<Vec<AttemptRecord>, TxError> {
        in_tx!(self, TxKind::Read, |tx| {
            session::plan_by_id(&mut tx, plan, false).await?;
            session::read_history(&mut tx, plan).await
        })
    }

    async fn list_attempts_once(&self, query: &AttemptQuery) -> Result<AttemptPage, TxError> {
        let limit = query.clamped_limit();
        let page = in_tx!(self, TxKind::Read, |tx| super::listing::page(&mut tx, query, limit)
            .await)?;
        Ok(AttemptPage::from_page_rows(page, limit))
    }
}

/// What a registration or an enqueue decides with: ids from `entropy`, time from
/// `clock` (the database's when `None`).
pub(crate) struct Decider<'a> {
    pub(crate) entropy: &'a dyn Entropy,
    pub(crate) clock: Option<&'a dyn Clock>,
}

impl Decider<'_> {
    /// The decision's now inside `s`.
    async fn now<S: Session>(&self, s: &mut S) -> Result<Timestamp, TxError> {
        match self.clock {
            Some(clock) => Ok(clock.now()),
            None => session::db_now(s).await,
        }
    }
}

/// Registers `spec` inside `tx` (a ledger's own transaction, or an application's:
/// the transactional outbox), or answers the READY plan that has its content.
pub(crate) async fn register_in<S: Session>(
    tx: &mut S,
    spec: PlanSpec,
    known: &[&str],
    by: &Decider<'_>,
) -> Result<Plan, TxError> {
    let now = by.now(tx).await?;
    let plan = decide_plan(spec, known, by.entropy, now)?;
    tx.lock_fingerprint(&plan.fingerprint).await?;
    if let Some(existing) = session::ready_plan_by_fingerprint(tx, &plan.fingerprint).await? {
        return Ok(existing);
    }
    session::insert_plan(tx, &plan).await?;
    Ok(plan)
}

/// Enqueues an attempt of `plan` inside `tx` (a ledger's own transaction, or an
/// application's): the plan is locked first where rows lock, so enqueues of one
/// plan are serialized and the history read after the lock sees every earlier
/// attempt; the engine builds the attempt, it is inserted, and new work is announced
/// in the same transaction.
pub(crate) async fn enqueue_in<S: Session>(
    tx: &mut S,
    plan: &PlanId,
    request: &EnqueueRequest,
    by: &Decider<'_>,
) -> Result<Enqueued, TxError> {
    let enqueued = decide_enqueue_in(tx, plan, request, by).await?;
    if let Some(writes) = enqueued.writes() {
        session::apply_writes(tx, None, &writes).await?;
        tx.announce().await?;
    }
    Ok(enqueued)
}

/// The reads and the decision of [`enqueue_in`]: the attempt, new or answered for
/// its key ([`Enqueued::writes`] inserts a new one).
pub(crate) async fn decide_enqueue_in<S: Session>(
    tx: &mut S,
    plan: &PlanId,
    request: &EnqueueRequest,
    by: &Decider<'_>,
) -> Result<Enqueued, TxError> {
    let plan = session::plan_by_id(tx, plan, true).await?;
    let now = by.now(tx).await?;
    let history = super::order::read_enqueue_history(tx, &plan, request.order_key.as_deref()).await?;
    let keyed = match &request.key {
        Some(key) => session::read_keyed(tx, key).await?,
        None => None,
    };
    Ok(decide_enqueue(
        &plan,
        &history,
        keyed.as_ref(),
        request,
        (by.entropy, now),
    )?)
}

/// An attempt's rows, locked in lock order, with the database's now when asked for.
async fn locked_record<S: Session>(
    tx: &mut S,
    id: &AttemptId,
    with_now: bool,
) -> Result<(AttemptRecord, Option<Timestamp>), TxError> {
    tx.lock_record(id, with_now)
        .await?
        .ok_or_else(|| not_found("attempt", id).into())
}

/// Whether `writes` make `before`'s command claimable again.
fn requeues(before: &AttemptRecord, writes: &Writes) -> bool {
    writes
        .command
        .as_ref()
        .is_some_and(|c| c.status == CommandStatus::Pending)
        && before.command.status != CommandStatus::Pending
}

// Each method names its future `Send` in its own signature: a caller that spawns a
// concrete ledger's future relies on that bound instead of proving it through the
// transaction's lifetimes (which rustc cannot yet do, rust-lang/rust#100013).
#[allow(clippy::manual_async_fn)]
impl<B: SqlBackend> Ledger for SqlLedger<B> {
    fn fuses_claims(&self) -> bool {
        self.backend.fuses_claims()
    }

    fn migrate(&self) -> impl Future<Output = Result<Vec<u32>, LedgerError>> + Send {
        async move { self.retry(|| self.backend.migrate(&self.ctx)).await }
    }

    fn register_plan(
        &self,
        spec: PlanSpec,
        known_executors: &[&str],
    ) -> impl Future<Output = Result<Plan, LedgerError>> + Send {
        async move {
            self.retry(|| self.register_plan_once(spec.clone(), known_executors))
                .await
        }
    }

    fn plan(&self, id: &PlanId) -> impl Future<Output = Result<Plan, LedgerError>> + Send {
        async move {
            self.retry(|| async { in_tx!(self, TxKind::Single, |tx| session::plan_by_id(&mut tx, id, false).await) })
                .await
        }
    }

    fn list_plans(&self) -> impl Future<Output = Result<Vec<Plan>, LedgerError>> + Send {
        async move {
            self.retry(|| async { in_tx!(self, TxKind::Single, |tx| session::read_plans(&mut tx).await) })
                .await
        }
    }

    fn plans_named(&self, name: &str) -> impl Future<Output = Result<Vec<Plan>, LedgerError>> + Send {
        async move {
            self.retry(|| async {
                in_tx!(self, TxKind::Single, |tx| session::read_plans_named(&mut tx, name)
                    .await)
            })
            .await
        }
    }

    fn plans_newest_first(
        &self,
        before: Option<&PlanId>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<Plan>, LedgerError>> + Send {
        async move {
            self.retry(|| async {
                in_tx!(self, TxKind::Read, |tx| {
                    session::read_plans_newest_first(&mut tx, before, limit).await
                })
            })
            .await
        }
    }

    fn list_plan_rows(&self) -> impl Future<Output = Result<Vec<PlanRow>, LedgerError>> + Send {
        async move {
            self.retry(|| async { in_tx!(self, TxKind::Single, |tx| session::read_plan_rows(&mut tx).await) })
                .await
        }
    }

    fn plan_rows_newest_first(
        &self,
        before: Option<&PlanId>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<PlanRow>, LedgerError>> + Send {
        async move {
            self.retry(|| async {
                in_tx!(self, TxKind::Read, |tx| {
                    session::read_plan_rows_newest_first(&mut tx, before, limit).await
                })
            })
            .await
        }
    }

    fn retire_plan(&self, id: &PlanId) -> impl Future<Output = Result<Plan, LedgerError>> + Send {
        async move { self.retry(|| self.retire_plan_once(id)).await }
    }

    fn enqueue_with(
        &self,
        plan: &PlanId,
        request: EnqueueRequest,
    ) -> impl Future<Output = Result<Enqueued, LedgerError>> + Send {
        async move { self.retry(|| self.enqueue_once(plan, &request)).await }
    }

    fn claim_batch(&self, request: ClaimRequest) -> impl Future<Output = Result<Vec<Claimed>, LedgerError>> + Send {
        async move {
            if request.batch == 0 {
                return Ok(Vec::new());
            }
            self.backend.claim(&self.ctx, &request).await
        }
    }

    fn worker(&self, lease: &Lease, request: WorkerRequest) -> impl Future<Output = Result<Reply, LedgerError>> + Send {
        async move {
            if self.backend.groups_writes() {
                return self.grouped(lease, request, None).await.map(|(reply, _)| reply);
            }
            self.retry(|| self.worker_once(lease, &request)).await
        }
    }

    fn worker_then_claim(
        &self,
        lease: &Lease,
        request: WorkerRequest,
        claim: ClaimRequest,
    ) -> impl Future<Output = Result<(Reply, Vec<Claimed>), LedgerError>> + Send {
        async move {
            if claim.batch == 0 || !self.backend.fuses(&self.ctx).await? {
                return crate::ledger::worker_then_claim_apart(self, lease, request, claim).await;
            }
            if self.backend.groups_writes() {
                return self.grouped(lease, request, Some(claim)).await;
            }
            self.retry(|| self.worker_then_claim_or_alone(lease, &request, &claim))
                .await
        }
    }

    fn operator(
        &self,
        attempt: &AttemptId,
        request: OperatorRequest,
    ) -> impl Future<Output = Result<(Reply, AttemptRecord), LedgerError>> + Send {
        async move { self.retry(|| self.operator_once(attempt, &request)).await }
    }

    fn attempt(&self, attempt: &AttemptId) -> impl Future<Output = Result<AttemptRecord, LedgerError>> + Send {
        async move { self.retry(|| self.attempt_once(attempt)).await }
    }

    fn history(&self, plan: &PlanId) -> impl Future<Output = Result<Vec<AttemptRecord>, LedgerError>> + Send {
        async move { self.retry(|| self.history_once(plan)).await }
    }

    fn open_attempts(&self) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        async move {
            self.retry(|| async { in_tx!(self, TxKind::Single, |tx| session::count_open_attempts(&mut tx).await) })
                .await
        }
    }

    fn list_attempts(&self, query: &AttemptQuery) -> impl Future<Output = Result<AttemptPage, LedgerError>> + Send {
        async move { self.retry(|| self.list_attempts_once(query)).await }
    }

    fn open_attempts_for(&self, capabilities: &Capabilities) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        async move {
            self.retry(|| async {
                in_tx!(self, TxKind::Single, |tx| super::fleet::count_open_for(
                    &mut tx,
                    capabilities
                )
                .await)
            })
            .await
        }
    }

    fn report_worker(
        &self,
        id: &str,
        capabilities: &Capabilities,
        starting: bool,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        let capabilities = crate::ledger::fleet::capabilities_json(capabilities);
        async move {
            self.retry(|| async {
                in_tx!(self, TxKind::Write, |tx| {
                    let now = self.now_in(&mut tx).await?;
                    super::fleet::report_worker(&mut tx, id, &capabilities, now, starting).await
                })
            })
            .await
        }
    }

    fn workers(&self) -> impl Future<Output = Result<(Vec<WorkerRow>, Timestamp), LedgerError>> + Send {
        async move {
            self.retry(|| async {
                in_tx!(self, TxKind::Read, |tx| {
                    let rows = super::fleet::read_workers(&mut tx).await?;
                    Ok((rows, self.now_in(&mut tx).await?))
                })
            })
            .await
        }
    }

    fn set_limit(&self, limit: TargetLimit) -> impl Future<Output = Result<(), LedgerError>> + Send {
        async move {
            crate::ledger::checked_limit(&limit)?;
            self.retry(|| async {
                in_tx!(self, TxKind::Write, |tx| {
                    let now = self.now_in(&mut tx).await?;
                    limits::set_limit(&mut tx, &limit, now).await
                })
            })
            .await
        }
    }

    fn clear_limit(&self, target: &str) -> impl Future<Output = Result<bool, LedgerError>> + Send {
        async move {
            self.retry(|| async { in_tx!(self, TxKind::Write, |tx| limits::clear_limit(&mut tx, target).await) })
                .await
        }
    }

    fn limits(&self) -> impl Future<Output = Result<(Vec<TargetRow>, Timestamp), LedgerError>> + Send {
        async move {
            self.retry(|| async {
                in_tx!(self, TxKind::Read, |tx| {
                    let now = self.now_in(&mut tx).await?;
                    Ok((limits::list_limits(&mut tx, now).await?, now))
                })
            })
            .await
        }
    }

    fn prune_keep(&self, plan: &PlanId) -> impl Future<Output = Result<Keep, LedgerError>> + Send {
        async move {
            self.retry(|| async { in_tx!(self, TxKind::Read, |tx| super::prune::keep_of(&mut tx, plan).await) })
                .await
        }
    }

    fn prunable(&self, query: &PruneQuery) -> impl Future<Output = Result<Vec<AttemptRecord>, LedgerError>> + Send {
        async move {
            self.retry(|| async { in_tx!(self, TxKind::Read, |tx| super::prune::prunable(&mut tx, query).await) })
                .await
        }
    }

    fn delete_attempts(&self, ids: &[AttemptId]) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        async move {
            self.retry(|| async {
                in_tx!(self, TxKind::Write, |tx| super::prune::delete_attempts(&mut tx, ids)
                    .await)
            })
            .await
        }
    }

    fn wake(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.backend.wake()
    }

    fn check_ready(&self) -> impl Future<Output = Result<Vec<String>, LedgerError>> + Send {
        async move { self.retry(|| self.backend.check_ready()).await }
    }

    fn schema_notice(&self) -> impl Future<Output = Result<Option<String>, LedgerError>> + Send {
        async move { self.retry(|| self.backend.schema_notice()).await }
    }

    fn count_attempts(&self, cap: u64) -> impl Future<Output = Result<AttemptCounts, LedgerError>> + Send {
        async move {
            self.retry(|| async { in_tx!(self, TxKind::Single, |tx| super::listing::counts(&mut tx, cap).await) })
                .await
        }
    }
}
