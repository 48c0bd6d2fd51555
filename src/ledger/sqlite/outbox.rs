//! Plans and attempts written inside a caller's own SQLite transaction (the
//! transactional outbox, [`crate::outbox`]).
//!
//! Contract: the caller's connection must be inside a transaction; the ledger's
//! schema in that database is checked first, exactly as every open checks it
//! ([`super::open::check_schema`]); the rows are read and written with the ledger's
//! own row code ([`crate::ledger::sql::session`]) under a savepoint of the caller's transaction, so a
//! failure leaves nothing of this call behind and the caller's own writes untouched.
//! Nothing is committed here: the rows become durable, and visible to workers, when
//! the caller commits, and vanish if it rolls back.

use super::rows::{self, sync, SqlResult, SqliteSession};
use crate::entropy::Entropy;
use crate::ledger::decide_enqueue;
use crate::ledger::outbox::decide_plan;
use crate::ledger::sql::Dialect;
use crate::ledger::sql::{order, session};
use crate::ledger::LedgerError;
use crate::ledger::{EnqueueRequest, Enqueued};
use leasehold_engine::{Plan, PlanId, PlanSpec, Timestamp};
use rusqlite::Connection;

/// The savepoint each call runs under.
const SAVEPOINT: &str = "leasehold_outbox";

/// Refuses a connection outside a transaction (SQLite may have rolled the caller's
/// back by itself) or a database without a usable ledger schema; answers the
/// dialect its rows are written in ([`rows::dialect_for`]).
fn check(conn: &Connection) -> Result<&'static Dialect, LedgerError> {
    if conn.is_autocommit() {
        return Err(LedgerError::BadInput(
            "the connection is not inside a transaction (SQLite may have rolled it back): nothing was written".into(),
        ));
    }
    let path = match conn.path() {
        Some(path) if !path.is_empty() => path.to_owned(),
        _ => ":memory:".to_owned(),
    };
    super::open::check_schema(conn, &path).map(rows::dialect_for)
}

/// Runs `f` under a savepoint of the caller's transaction: released on success,
/// rolled back to (and released) on failure.
fn savepoint<T>(conn: &Connection, f: impl FnOnce() -> Result<T, LedgerError>) -> Result<T, LedgerError> {
    conn.execute_batch(&format!("SAVEPOINT {SAVEPOINT}")).sql()?;
    let out = f();
    let end = if out.is_ok() {
        format!("RELEASE {SAVEPOINT}")
    } else {
        format!("ROLLBACK TO {SAVEPOINT}; RELEASE {SAVEPOINT}")
    };
    let ended = conn.execute_batch(&end).sql();
    let out = out?;
    ended?;
    Ok(out)
}

/// Registers `spec` in the caller's transaction; content that a READY plan already
/// has answers that plan. See [`crate::outbox::Outbox::register_plan_sqlite`].
pub(crate) fn register_plan(
    conn: &Connection,
    spec: PlanSpec,
    known_executors: &[&str],
    entropy: &dyn Entropy,
    now: Timestamp,
) -> Result<Plan, LedgerError> {
    let dialect = check(conn)?;
    let plan = decide_plan(spec, known_executors, entropy, now)?;
    let s = &mut SqliteSession::new(conn, dialect);
    savepoint(conn, || {
        if let Some(existing) = sync(session::ready_plan_by_fingerprint(s, &plan.fingerprint))? {
            return Ok(existing);
        }
        sync(session::insert_plan(s, &plan))?;
        Ok(plan)
    })
}

/// Enqueues an attempt of `plan` in the caller's transaction: attempt, receipts and
/// command. See [`crate::outbox::Outbox::enqueue_sqlite`].
pub(crate) fn enqueue(
    conn: &Connection,
    plan: &PlanId,
    request: EnqueueRequest,
    entropy: &dyn Entropy,
    now: Timestamp,
) -> Result<Enqueued, LedgerError> {
    let dialect = check(conn)?;
    let s = &mut SqliteSession::new(conn, dialect);
    savepoint(conn, || {
        let plan = sync(session::plan_by_id(s, plan, false))?;
        let history = sync(order::read_enqueue_history(s, &plan, request.order_key.as_deref()))?;
        let keyed = match &request.key {
            Some(key) => sync(session::read_keyed(s, key))?,
            None => None,
        };
        let enqueued = decide_enqueue(&plan, &history, keyed.as_ref(), &request, (entropy, now))?;
        if let Some(writes) = enqueued.writes() {
            sync(session::apply_writes(s, None, &writes))?;
        }
        Ok(enqueued)
    })
}
