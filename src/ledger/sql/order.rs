//! Templates and ordered keys in a SQL ledger: what a template's enqueue reads, and
//! the attempts a transition decides when it ends the head of an order key
//! ([`leasehold_engine::order`]).
//!
//! Locking: a transition that ends a head writes its plan's row as it is after the
//! attempt's own rows (locking it), and reads the attempts waiting behind it with a
//! locking read; an enqueue locks the plan row first and inserts. The two therefore
//! serialise on the plan row, and whichever comes second sees what the first
//! committed: an enqueue never waits behind a head that has ended, and a head never
//! ends without deciding an attempt enqueued behind it. The write gives the row a new
//! version on PostgreSQL, so that an enqueue deciding on a snapshot older than the
//! head's end (a caller's REPEATABLE READ transaction) fails to lock it, a
//! serialization failure, instead of waiting behind an attempt that has ended.

use super::query::queries;
use super::session::{plan_by_id, query_one, read_history, read_record, Session};
use super::write;
use super::{TxError, Value};
use leasehold_engine::{order, AttemptId, AttemptRecord, Plan, Writes};

/// The attempts an enqueue of `plan` decides over: every attempt of a plan without
/// input; for a template, its latest attempt (for the number) and the newest open
/// attempt with `order_key`, if there is one.
pub(crate) async fn read_enqueue_history<S: Session>(
    s: &mut S,
    plan: &Plan,
    order_key: Option<&str>,
) -> Result<Vec<AttemptRecord>, TxError> {
    if !plan.is_template() {
        return read_history(s, &plan.id).await;
    }
    let q = queries(s.dialect());
    let id = [Value::Text(plan.id.as_str())];
    let mut ids = Vec::new();
    ids.extend(query_one(s, &q.latest_attempt_of_plan, &id, attempt_id).await?);
    if let Some(key) = order_key {
        let values = [Value::Text(plan.id.as_str()), Value::Text(key)];
        ids.extend(query_one(s, &q.open_on_order_key, &values, attempt_id).await?);
    }
    ids.dedup();
    let mut records = Vec::with_capacity(ids.len());
    for id in &ids {
        records.extend(read_record(s, id).await?);
    }
    Ok(records)
}

fn attempt_id(row: &mut dyn super::decode::ColumnReader) -> Result<AttemptId, crate::ledger::LedgerError> {
    super::decode::string(row, 0, "attempt row: column id").map(AttemptId::new)
}

/// After `writes` took `before` to its new rows in this transaction: when they
/// ended the head of an order key, decides the attempts waiting behind it
/// ([`order::after_end`], at the instant the head ended) and writes that, under
/// each one's guard. Answers whether it wrote anything.
pub(crate) async fn follow_order<S: Session>(
    s: &mut S,
    before: &AttemptRecord,
    writes: &Writes,
) -> Result<bool, TxError> {
    let ordered = writes.attempt.as_ref().is_some_and(|a| a.order_key.is_some());
    if !ordered {
        return Ok(false);
    }
    let mut after = before.clone();
    writes.apply_to(&mut after);
    if !order::ends_head(before, &after) {
        return Ok(false);
    }
    let plan_id = [Value::Text(after.attempt.plan_id.as_str())];
    s.execute(&queries(s.dialect()).touch_plan, &plan_id).await?;
    let plan = plan_by_id(s, &after.attempt.plan_id, false).await?;
    let waiting = read_waiting(s, &after).await?;
    let now = after.attempt.finished_at.unwrap_or(after.attempt.created_at);
    let decided = order::after_end(&plan, &after, &waiting, now);
    for w in &decided {
        let Some(next) = waiting
            .iter()
            .find(|r| w.command.as_ref().is_some_and(|c| c.id == r.command.id))
        else {
            continue;
        };
        s.run(&write::plan(s.dialect(), Some(next), w)?).await?;
    }
    Ok(!decided.is_empty())
}

/// The attempts of `head`'s plan with its order key whose command is WAITING, by
/// number, read with a locking read (it sees what committed while this
/// transaction waited for the plan row).
async fn read_waiting<S: Session>(s: &mut S, head: &AttemptRecord) -> Result<Vec<AttemptRecord>, TxError> {
    let Some(key) = head.attempt.order_key.as_deref() else {
        return Ok(Vec::new());
    };
    let q = queries(s.dialect());
    let values = [Value::Text(head.attempt.plan_id.as_str()), Value::Text(key)];
    let ids = s.query(&q.waiting_on_order_key, &values, attempt_id).await?;
    let mut records = Vec::with_capacity(ids.len());
    for id in &ids {
        records.extend(read_record(s, id).await?);
    }
    Ok(records)
}
