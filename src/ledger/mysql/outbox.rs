//! Plans and attempts written inside a caller's own MySQL / MariaDB transaction (the
//! transactional outbox, [`crate::outbox`]).
//!
//! Contract: the ledger's schema in the transaction's database is checked first,
//! exactly as every open checks it ([`super::schema`]); the rows are read and written
//! with the ledger's own row code ([`crate::ledger::sql::session`]) under a savepoint of the caller's
//! transaction, so a failure leaves nothing of this call behind and the caller's own
//! writes untouched. An enqueue locks its plan row first (`FOR UPDATE`), as the
//! ledger's own enqueue does, so enqueues of one plan are serialized. Time is the
//! database's clock (`UTC_TIMESTAMP(6)`, read inside the transaction, so that the
//! session's time zone does not matter) unless a clock is given.
//! Nothing is committed here: the rows become durable, and visible to workers, when
//! the caller commits, and vanish if it rolls back.
//!
//! A caller's REPEATABLE READ transaction may have fixed its snapshot (by an earlier
//! plain read) before the plan was locked; its view of the plan's attempts may then
//! miss one committed since. The highest attempt number is read again with a locking
//! read (which sees the latest committed rows) and a stale view is refused, naming
//! the way out, rather than deciding on it.

use super::error::{DbResult, TxError};
use super::schema;
use super::session::MySession;
use crate::clock::Clock;
use crate::entropy::Entropy;
use crate::ledger::decide_enqueue;
use crate::ledger::outbox::decide_plan;
use crate::ledger::sql::order;
use crate::ledger::sql::session::{self, not_found};
use crate::ledger::LedgerError;
use crate::ledger::{EnqueueRequest, Enqueued};
use leasehold_engine::{AttemptRecord, Plan, PlanId, PlanSpec, Timestamp};
use mysql_async::prelude::Queryable;
use mysql_async::Transaction;

/// The savepoint each call runs under.
const SAVEPOINT: &str = "leasehold_outbox";

/// A try's error as the caller sees it: nothing of this call was written.
fn final_error(e: TxError) -> LedgerError {
    match e {
        TxError::Ledger(e) => e,
        TxError::Retry(m) => LedgerError::Unavailable(format!(
            "{m}: nothing was enqueued, and the server may have rolled back the whole transaction; run it again"
        )),
        TxError::Ambiguous(m) => LedgerError::Ambiguous(m),
    }
}

/// Refuses a database without a usable ledger schema, naming the database.
async fn check(tx: &mut Transaction<'_>) -> Result<(), TxError> {
    let database: Option<Option<String>> = tx.query_first("SELECT DATABASE()").await.db()?;
    let label = match database.flatten() {
        Some(name) => format!("database `{name}`"),
        None => {
            return Err(LedgerError::BadInput(
                "the transaction's connection has no current database (the ledger's): nothing was written".into(),
            )
            .into())
        }
    };
    schema::check_schema(tx, &label).await
}

/// The database clock's now, whatever the session's time zone: the ledger's own
/// sessions run in UTC, where `UNIX_TIMESTAMP(NOW(6))` is exact, but a caller's
/// session may use a zone with daylight saving time, whose repeated hour makes local
/// `NOW()` ambiguous. The distance from the epoch to `UTC_TIMESTAMP(6)` never is.
const UTC_NOW_MS_SQL: &str =
    "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED)";

/// The ledger clock's now: `clock`, or else the database's.
async fn now(tx: &mut Transaction<'_>, clock: Option<&dyn Clock>) -> Result<Timestamp, TxError> {
    if let Some(clock) = clock {
        return Ok(clock.now());
    }
    let ms: Option<i64> = tx.query_first(UTC_NOW_MS_SQL).await.db()?;
    ms.map(Timestamp::from_millis)
        .ok_or_else(|| LedgerError::Internal("the database answered no time".into()).into())
}

/// Opens the savepoint a call's writes run under.
async fn begin(tx: &mut Transaction<'_>) -> Result<(), LedgerError> {
    tx.query_drop(format!("SAVEPOINT {SAVEPOINT}"))
        .await
        .db()
        .map_err(final_error)
}

/// Ends the savepoint opened by [`begin`]: released after success, rolled back to
/// (and released) after a failure. After an error that rolled the whole transaction
/// back (a deadlock), the savepoint is gone with it; that is not a second error.
async fn end<T>(tx: &mut Transaction<'_>, out: Result<T, TxError>) -> Result<T, LedgerError> {
    match out {
        Ok(v) => {
            tx.query_drop(format!("RELEASE SAVEPOINT {SAVEPOINT}"))
                .await
                .db()
                .map_err(final_error)?;
            Ok(v)
        }
        Err(e) => {
            if tx
                .query_drop(format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}"))
                .await
                .is_ok()
            {
                let _ = tx.query_drop(format!("RELEASE SAVEPOINT {SAVEPOINT}")).await;
            }
            Err(final_error(e))
        }
    }
}

/// Registers `spec` in the caller's transaction; content that a READY plan already
/// has answers that plan. See [`crate::outbox::Outbox::register_plan_mysql`].
pub(crate) async fn register_plan(
    tx: &mut Transaction<'_>,
    spec: PlanSpec,
    known_executors: &[&str],
    entropy: &dyn Entropy,
    clock: Option<&dyn Clock>,
) -> Result<Plan, LedgerError> {
    check(tx).await.map_err(final_error)?;
    let at = now(tx, clock).await.map_err(final_error)?;
    let plan = decide_plan(spec, known_executors, entropy, at)?;
    begin(tx).await?;
    let out = insert_plan(tx, plan).await;
    end(tx, out).await
}

/// The READY plan with `plan`'s content, or else `plan`, inserted.
async fn insert_plan(tx: &mut Transaction<'_>, plan: Plan) -> Result<Plan, TxError> {
    let mut s = MySession(tx);
    if let Some(existing) = session::ready_plan_by_fingerprint(&mut s, &plan.fingerprint).await? {
        return Ok(existing);
    }
    session::insert_plan(&mut s, &plan).await?;
    Ok(plan)
}

/// Enqueues an attempt of `plan` in the caller's transaction: attempt, receipts and
/// command. See [`crate::outbox::Outbox::enqueue_mysql`].
pub(crate) async fn enqueue(
    tx: &mut Transaction<'_>,
    plan: &PlanId,
    request: EnqueueRequest,
    entropy: &dyn Entropy,
    clock: Option<&dyn Clock>,
) -> Result<Enqueued, LedgerError> {
    check(tx).await.map_err(final_error)?;
    begin(tx).await?;
    let out = insert_attempt(tx, plan, &request, entropy, clock).await;
    end(tx, out).await
}

/// The enqueue's reads (plan locked first), the engine's decision, and its writes.
async fn insert_attempt(
    tx: &mut Transaction<'_>,
    plan: &PlanId,
    request: &EnqueueRequest,
    entropy: &dyn Entropy,
    clock: Option<&dyn Clock>,
) -> Result<Enqueued, TxError> {
    let plan = session::read_plan(&mut MySession(&mut *tx), plan, true)
        .await?
        .ok_or_else(|| not_found("plan", plan))?;
    let at = now(tx, clock).await?;
    let order_key = request.order_key.as_deref();
    let history = order::read_enqueue_history(&mut MySession(&mut *tx), &plan, order_key).await?;
    check_fresh(tx, &plan.id, &history).await?;
    check_ahead_fresh(tx, &history, order_key).await?;
    let keyed = match &request.key {
        Some(key) => session::read_keyed(&mut MySession(&mut *tx), key).await?,
        None => None,
    };
    let enqueued = decide_enqueue(&plan, &history, keyed.as_ref(), request, (entropy, at))?;
    if let Some(writes) = enqueued.writes() {
        session::apply_writes(&mut MySession(tx), None, &writes).await?;
    }
    Ok(enqueued)
}

/// Refuses a `history` whose open attempt on `order_key` (the attempt the new one
/// would wait behind, read from the transaction's snapshot) has ended in the latest
/// committed rows: deciding on it would leave the new attempt waiting with nothing
/// ahead of it to release it.
async fn check_ahead_fresh(
    tx: &mut Transaction<'_>,
    history: &[AttemptRecord],
    order_key: Option<&str>,
) -> Result<(), TxError> {
    let open_ahead = history.iter().find(|r| {
        order_key.is_some() && r.attempt.order_key.as_deref() == order_key && !r.attempt.status.is_terminal()
    });
    let Some(ahead) = open_ahead else {
        return Ok(());
    };
    let latest: Option<String> = tx
        .exec_first(
            "SELECT status FROM attempt WHERE id = ? LOCK IN SHARE MODE",
            (ahead.attempt.id.as_str(),),
        )
        .await
        .db()?;
    if latest.as_deref() == Some(ahead.attempt.status.as_str()) {
        return Ok(());
    }
    Err(LedgerError::BadInput(format!(
        "attempt {}: this transaction's snapshot predates its end (a plain read fixed it before the plan was \
         locked); enqueue before other reads, or use READ COMMITTED: nothing was enqueued",
        ahead.attempt.id
    ))
    .into())
}

/// Refuses a `history` (a plain read, from the transaction's snapshot) that lacks an
/// attempt the latest committed rows have.
async fn check_fresh(tx: &mut Transaction<'_>, plan: &PlanId, history: &[AttemptRecord]) -> Result<(), TxError> {
    let latest: Option<Option<u32>> = tx
        .exec_first(
            "SELECT MAX(number) FROM attempt WHERE plan_id = ? FOR UPDATE",
            (plan.as_str(),),
        )
        .await
        .db()?;
    let seen = history.iter().map(|r| r.attempt.number).max();
    let latest = latest.flatten();
    if latest != seen {
        return Err(LedgerError::BadInput(format!(
            "plan {plan}: this transaction's snapshot predates attempt {} (a plain read fixed it before the \
             plan was locked); enqueue before other reads, or use READ COMMITTED: nothing was enqueued",
            latest.unwrap_or(0)
        ))
        .into());
    }
    Ok(())
}
