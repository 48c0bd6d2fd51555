//! Retention's reads and deletes ([`crate::ledger::prune`]), written once: what a
//! plan keeps (four probes down the `(plan_id, number)` index, read once per plan
//! and prune), a page of prunable attempts with their rows (one range of that
//! index), and the deletion of a batch in lock order (attempts, commands, receipts).

use super::decode;
use super::session::{query_one, Parse, Session};
use super::table::{Table, ATTEMPT, COMMAND, RECEIPT};
use super::{placeholders, Sql, TxError, Value};
use crate::ledger::prune::{Keep, PruneQuery, FORWARD_ACTIONS};
use crate::ledger::LedgerError;
use leasehold_engine::{AttemptId, AttemptRecord, AttemptStatus, PlanId};

/// `action IN ('execute', 'retry')`, with `alias.` before the column when given.
fn forward(alias: &str) -> String {
    let list: Vec<String> = FORWARD_ACTIONS.iter().map(|a| format!("'{}'", a.as_str())).collect();
    format!("{alias}action IN ({})", list.join(", "))
}

/// `status IN (…)` of `states` (an enumeration's own spellings, never input).
fn states_in(states: &[AttemptStatus]) -> String {
    let list: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
    format!("status IN ({})", list.join(", "))
}

/// The highest number of `plan`'s attempts matching `condition` (with `below`, under
/// that number), read down the index; `None` when none matches.
async fn highest<S: Session>(
    s: &mut S,
    plan: &PlanId,
    condition: &str,
    below: Option<u32>,
) -> Result<Option<u32>, TxError> {
    let mut sql = Sql::new(s.dialect());
    sql.push("SELECT a.number FROM attempt a JOIN command c ON c.attempt_id = a.id WHERE a.plan_id = ")
        .bind(Value::Text(plan.as_str()));
    if let Some(n) = below {
        sql.push(" AND a.number < ").bind(Value::Int(n.into()));
    }
    sql.push(&format!(" AND {condition} ORDER BY a.number DESC LIMIT 1"));
    let n = query_one(s, &sql.text, &sql.values, |r| decode::scalar(r, 0, "attempt: number")).await?;
    Ok(n.and_then(|n| u32::try_from(n).ok()))
}

/// What `plan` keeps whatever the age of its attempts ([`Keep`]).
pub(crate) async fn keep_of<S: Session>(s: &mut S, plan: &PlanId) -> Result<Keep, TxError> {
    let fwd = forward("a.");
    let latest_forward = highest(s, plan, &fwd, None).await?;
    let baseline = match latest_forward {
        Some(lf) => {
            // A template's baseline ran the latest's input (the number is a row's, never input).
            let same_input = format!(
                "COALESCE(a.input_sha256, '') = COALESCE((SELECT b.input_sha256 FROM attempt b \
                 WHERE b.plan_id = a.plan_id AND b.number = {lf}), '')"
            );
            let cond = format!("{fwd} AND a.status = 'SUCCEEDED' AND c.status = 'DELIVERED' AND {same_input}");
            highest(s, plan, &cond, Some(lf)).await?
        }
        None => None,
    };
    Ok(Keep {
        latest_forward,
        baseline,
        latest_succeeded: highest(s, plan, "a.status = 'SUCCEEDED'", None).await?,
        latest_succeeded_forward: highest(s, plan, &format!("{fwd} AND a.status = 'SUCCEEDED'"), None).await?,
    })
}

/// A page of prunable attempts ([`PruneQuery`]) with their commands and receipts,
/// by number.
pub(crate) async fn prunable<S: Session>(s: &mut S, query: &PruneQuery) -> Result<Vec<AttemptRecord>, TxError> {
    let keep = &query.keep;
    let Some(latest_forward) = keep.latest_forward else {
        return Ok(Vec::new());
    };
    let mut sql = Sql::new(s.dialect());
    sql.push(&format!(
        "SELECT {} FROM attempt WHERE plan_id = ",
        ATTEMPT.column_list(None)
    ))
    .bind(Value::Text(query.plan.as_str()))
    .push(" AND number > ")
    .bind(Value::Int(query.after.into()))
    .push(" AND number < ")
    .bind(Value::Int(latest_forward.into()));
    for n in keep.singles() {
        sql.push(" AND number <> ").bind(Value::Int(n.into()));
    }
    sql.push(&format!(" AND {} AND finished_at < ", states_in(&query.states)))
        .bind(Value::ts(query.cutoff))
        .push(" ORDER BY number LIMIT ")
        .bind(Value::Int(query.limit.into()));
    let attempts = s.query(&sql.text, &sql.values, |r| decode::attempt(r, 0)).await?;
    if attempts.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&AttemptId> = attempts.iter().map(|a| &a.id).collect();
    let commands = of_attempts(s, &ids, &COMMAND, "", |r| decode::command(r, 0)).await?;
    let order = " ORDER BY attempt_id, ordinal";
    let receipts = of_attempts(s, &ids, &RECEIPT, order, |r| decode::receipt(r, 0)).await?;
    Ok(decode::history(attempts, commands, receipts)?)
}

/// The rows of `table` whose `attempt_id` is one of `ids`, in `order`.
async fn of_attempts<S: Session, T: Send>(
    s: &mut S,
    ids: &[&AttemptId],
    table: &Table,
    order: &str,
    parse: impl Parse<T>,
) -> Result<Vec<T>, TxError> {
    let marks = placeholders(s.dialect(), 1, ids.len());
    let values: Vec<Value<'_>> = ids.iter().map(|id| Value::Text(id.as_str())).collect();
    let sql = format!(
        "SELECT {} FROM {} WHERE attempt_id IN ({marks}){order}",
        table.column_list(None),
        table.name
    );
    s.query(&sql, &values, parse).await
}

/// Deletes the ended attempts among `ids` with their commands and receipts (locking
/// the attempts first, then deleting in lock order); answers how many.
pub(crate) async fn delete_attempts<S: Session>(s: &mut S, ids: &[AttemptId]) -> Result<u64, TxError> {
    if ids.is_empty() {
        return Ok(0);
    }
    let d = s.dialect();
    let ended: Vec<AttemptStatus> = AttemptStatus::ALL.iter().copied().filter(|s| s.is_terminal()).collect();
    let marks = placeholders(d, 1, ids.len());
    let values: Vec<Value<'_>> = ids.iter().map(|id| Value::Text(id.as_str())).collect();
    let sql = format!(
        "SELECT id FROM attempt WHERE id IN ({marks}) AND {}{}",
        states_in(&ended),
        d.for_update()
    );
    let held = s.query(&sql, &values, |r| decode::string(r, 0, "attempt: id")).await?;
    if held.is_empty() {
        return Ok(0);
    }
    let marks = placeholders(d, 1, held.len());
    let values: Vec<Value<'_>> = held.iter().map(|id| Value::Text(id)).collect();
    for (table, key) in [("command", "attempt_id"), ("receipt", "attempt_id"), ("attempt", "id")] {
        let sql = format!("DELETE FROM {table} WHERE {key} IN ({marks})");
        s.execute(&sql, &values).await?;
    }
    u64::try_from(held.len()).map_err(|_| LedgerError::Internal("batch too large".into()).into())
}
