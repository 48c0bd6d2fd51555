//! Plans and attempts written inside a caller's own PostgreSQL transaction (the
//! transactional outbox, [`crate::outbox`]).
//!
//! Contract: each call runs under a savepoint of the caller's transaction, opened
//! first: in PostgreSQL a failed statement aborts the whole transaction, and rolling
//! back to the savepoint undoes the failure along with everything this call wrote,
//! so the caller's own writes stay and its transaction stays usable. Inside it, the
//! ledger's schema is checked exactly as every open checks it ([`super::schema`],
//! naming `current_database()`), and the rows are read and written with the ledger's
//! own row code ([`super::rows`]; a caller's transaction has no statement cache, so
//! each statement is prepared as it runs). A registration takes the same advisory
//! lock on the plan's fingerprint as the ledger's; an enqueue locks its plan row
//! first (`FOR UPDATE`), as the ledger's own enqueue does, so enqueues of one plan are
//! serialized, and sends the ledger's `NOTIFY` ([`super::notify::CHANNEL`]), which
//! PostgreSQL delivers only if the caller commits. Time is the database's clock
//! ([`rows::db_now`]) unless a clock is given. Nothing is committed here.
//!
//! A REPEATABLE READ (or SERIALIZABLE) transaction reads from the snapshot its first
//! statement fixed; the plan's lock does not refresh it, so its view of the plan's
//! attempts may miss one another session committed since. Deciding on that view
//! picks an attempt number that exists, and the insert meets `attempt_by_plan_number`
//! (`23505`, reported as [`LedgerError::BadInput`]). Locking a plan that another
//! session changed (retired) since the snapshot is a serialization failure (`40001`,
//! reported as [`LedgerError::Unavailable`]). Both messages say that nothing was
//! written and what to do; the savepoint leaves the transaction usable.

use super::error::{classify, describe, Phase, TxError};
use super::schema;
use super::session::{PgClient, PgSession};
use crate::clock::Clock;
use crate::entropy::Entropy;
use crate::ledger::sql::ledger::{decide_enqueue_in, register_in, Decider};
use crate::ledger::sql::session::{self, Session};
use crate::ledger::LedgerError;
use crate::ledger::{EnqueueRequest, Enqueued};
use leasehold_engine::{Plan, PlanId, PlanSpec};
use std::sync::Mutex;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement, Transaction};

/// The savepoint each call runs under.
const SAVEPOINT: &str = "leasehold_outbox";

/// The constraint that makes attempt numbers unique per plan.
const ATTEMPT_NUMBER_KEY: &str = "attempt_by_plan_number";

/// What the caller is told to do about a stale snapshot.
const STALE_ADVICE: &str =
    "enqueue before the transaction's other reads, or use READ COMMITTED, and run the transaction again";

/// A server error a statement of this call met: its code and, for a constraint
/// violation, the constraint's name (never a value: it could be a lease token).
#[derive(Debug, Clone)]
struct Failure {
    code: SqlState,
    constraint: Option<String>,
}

/// The caller's transaction (or this call's savepoint of it) as the row code's
/// [`Session`]: statements are prepared plainly, and the first server error is kept
/// so that a stale snapshot can be told from other failures.
struct Caller<'a, 't> {
    tx: &'a Transaction<'t>,
    failure: Mutex<Option<Failure>>,
}

impl<'a, 't> Caller<'a, 't> {
    fn new(tx: &'a Transaction<'t>) -> Self {
        Self {
            tx,
            failure: Mutex::new(None),
        }
    }

    /// Keeps `result`'s server error, if it is the first.
    fn note<T>(&self, result: Result<T, tokio_postgres::Error>) -> Result<T, tokio_postgres::Error> {
        if let Err(e) = &result {
            if let Some(db) = e.as_db_error() {
                let mut failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
                failure.get_or_insert_with(|| Failure {
                    code: db.code().clone(),
                    constraint: db.constraint().map(str::to_owned),
                });
            }
        }
        result
    }

    fn failure(&self) -> Option<Failure> {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl PgClient for Caller<'_, '_> {
    async fn prepare_statement(&self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        self.note(self.tx.prepare(sql).await)
    }

    async fn query_statement(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        self.note(self.tx.query(statement, params).await)
    }

    async fn execute_statement(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        self.note(self.tx.execute(statement, params).await)
    }
}

/// What a call writes, for its messages.
#[derive(Debug, Clone, Copy)]
enum Call {
    Register,
    Enqueue,
}

impl Call {
    fn nothing(self) -> &'static str {
        match self {
            Call::Register => "nothing was registered",
            Call::Enqueue => "nothing was enqueued",
        }
    }
}

/// A failed try's error as the caller sees it (the savepoint is rolled back:
/// nothing of this call was written).
fn final_error(call: Call, e: TxError, failure: Option<&Failure>) -> LedgerError {
    let nothing = call.nothing();
    match (e, failure.map(|f| &f.code)) {
        (TxError::Ledger(LedgerError::Internal(m)), Some(code)) if *code == SqlState::IN_FAILED_SQL_TRANSACTION => {
            LedgerError::BadInput(format!(
                "{m}: the caller's transaction had already failed (an earlier statement), so {nothing}: roll it back"
            ))
        }
        (TxError::Retry(m), Some(code)) if *code == SqlState::T_R_SERIALIZATION_FAILURE => {
            LedgerError::Unavailable(format!(
                "{m}: a change another session committed conflicts with this transaction's snapshot, so {nothing}: \
                 {STALE_ADVICE}"
            ))
        }
        (TxError::Ledger(e), _) => e,
        (TxError::Retry(m), _) => LedgerError::Unavailable(format!("{m}: {nothing}; try again")),
        (TxError::Ambiguous(m), _) => LedgerError::Ambiguous(m),
    }
}

/// Opens the savepoint a call runs under.
async fn begin<'a>(tx: &'a mut Transaction<'_>, call: Call) -> Result<Transaction<'a>, LedgerError> {
    tx.savepoint(SAVEPOINT).await.map_err(|e| {
        let failure = e.as_db_error().map(|db| Failure {
            code: db.code().clone(),
            constraint: None,
        });
        final_error(call, classify(&e, Phase::Statement), failure.as_ref())
    })
}

/// Ends the savepoint opened by [`begin`]: released after success; after a failure,
/// rolled back to (undoing the failure and every write of this call), and then
/// released by [`release`] when this answers `true`. A rollback that fails means a
/// broken session, where the server rolls the whole transaction back: that is not a
/// second error.
async fn end<T>(sp: Transaction<'_>, out: Result<T, LedgerError>, call: Call) -> (Result<T, LedgerError>, bool) {
    match out {
        Ok(v) => match sp.commit().await {
            Ok(()) => (Ok(v), false),
            Err(e) => {
                let e = LedgerError::Unavailable(format!(
                    "{}: releasing the savepoint failed, so {}; roll back",
                    describe(&e),
                    call.nothing()
                ));
                (Err(e), false)
            }
        },
        Err(e) => {
            let rolled_back = sp.rollback().await.is_ok();
            (Err(e), rolled_back)
        }
    }
}

/// Releases the savepoint that a failed call rolled back to (`ROLLBACK TO` keeps it
/// defined), so that calls do not stack savepoints.
async fn release(tx: &mut Transaction<'_>) {
    let _ = tx.batch_execute(&format!("RELEASE SAVEPOINT {SAVEPOINT}")).await;
}

/// Runs one call: `$body`, a future over `$caller` (the savepoint as the row code's
/// session), under the call's savepoint ([`begin`], [`end`], [`release`]), its error
/// told as [`final_error`] tells it.
macro_rules! in_savepoint {
    ($tx:expr, $call:expr, |$caller:ident| $body:expr) => {{
        let call = $call;
        let sp = begin($tx, call).await?;
        let mut $caller = PgSession(Caller::new(&sp));
        let out = $body
            .await
            .map_err(|e| final_error(call, e, $caller.0.failure().as_ref()));
        drop($caller);
        let (out, rolled_back) = end(sp, out, call).await;
        if rolled_back {
            release($tx).await;
        }
        out
    }};
}

/// The caller's transaction as the ledger's session.
type CallerSession<'a, 't> = PgSession<Caller<'a, 't>>;

/// Refuses a database without a usable ledger schema, naming the database.
async fn check(c: &mut CallerSession<'_, '_>) -> Result<(), TxError> {
    let database = session::query_one(c, "SELECT current_database()::TEXT", &[], |r| {
        crate::ledger::sql::decode::string(r, 0, "current database")
    })
    .await?
    .ok_or_else(|| LedgerError::Internal("the database answered no current database".into()))?;
    schema::check_schema(c.0.tx.client(), &format!("database `{database}`")).await
}

/// Registers `spec` in the caller's transaction; content that a READY plan already
/// has answers that plan. See [`crate::outbox::Outbox::register_plan_postgres`].
pub(crate) async fn register_plan(
    tx: &mut Transaction<'_>,
    spec: PlanSpec,
    known_executors: &[&str],
    entropy: &dyn Entropy,
    clock: Option<&dyn Clock>,
) -> Result<Plan, LedgerError> {
    let by = Decider { entropy, clock };
    in_savepoint!(tx, Call::Register, |caller| async {
        check(&mut caller).await?;
        register_in(&mut caller, spec, known_executors, &by).await
    })
}

/// Enqueues an attempt of `plan` in the caller's transaction: attempt, receipts,
/// command, and the workers' wake-up. See [`crate::outbox::Outbox::enqueue_postgres`].
pub(crate) async fn enqueue(
    tx: &mut Transaction<'_>,
    plan: &PlanId,
    request: EnqueueRequest,
    entropy: &dyn Entropy,
    clock: Option<&dyn Clock>,
) -> Result<Enqueued, LedgerError> {
    let by = Decider { entropy, clock };
    in_savepoint!(tx, Call::Enqueue, |caller| insert_attempt(
        &mut caller,
        plan,
        &request,
        &by
    ))
}

/// The check, the enqueue's reads (plan locked first), the engine's decision, its
/// writes and the `NOTIFY`; an attempt number another session took since this
/// transaction's snapshot is told as such.
async fn insert_attempt(
    c: &mut CallerSession<'_, '_>,
    plan: &PlanId,
    request: &EnqueueRequest,
    by: &Decider<'_>,
) -> Result<Enqueued, TxError> {
    check(c).await?;
    let enqueued = decide_enqueue_in(c, plan, request, by).await?;
    let Some(writes) = enqueued.writes() else {
        return Ok(enqueued);
    };
    if let Err(e) = session::apply_writes(c, None, &writes).await {
        let stale = c.0.failure().is_some_and(|f| {
            f.code == SqlState::UNIQUE_VIOLATION && f.constraint.as_deref() == Some(ATTEMPT_NUMBER_KEY)
        });
        if stale {
            return Err(LedgerError::BadInput(format!(
                "plan {plan}: this transaction's snapshot predates attempt {} (another session committed it after \
                 the snapshot was taken), so nothing was enqueued: {STALE_ADVICE}",
                enqueued.record.attempt.number
            ))
            .into());
        }
        return Err(e);
    }
    c.announce().await?;
    Ok(enqueued)
}
