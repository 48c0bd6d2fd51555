//! The console's reads on SQLite ([`crate::ledger::listing`]): a page of attempts
//! from the `attempt_by_created` index (migration 4), newest first, and counts per
//! status that stop at the cap. QUEUED and RUNNING are counted from the commands'
//! partial indexes, FAILED and ABORTED from their own (migration 4): each reads at
//! most `cap + 1` entries. SUCCEEDED is counted from the table, stopping at the cap:
//! quick while succeeded attempts are most of the ledger, a scan of the whole table
//! when there are fewer than the cap.

use super::rows::{read_page_keys, read_record, sql_error};
use crate::ledger::listing::{AttemptCounts, AttemptPage, AttemptQuery};
use crate::ledger::sql::query::queries;
use crate::ledger::sql::SQLITE;
use crate::ledger::LedgerError;
use leasehold_engine::AttemptStatus;
use rusqlite::types::Value;
use rusqlite::Connection;

/// A page: the keys from the index in listing order (one more than the limit, to
/// know whether another page follows), then each record by its id, in one read
/// transaction; a record that does not parse is listed as damaged in its place
/// ([`crate::ledger::listing::PageKey`]).
pub(super) fn list_attempts(conn: &Connection, query: &AttemptQuery) -> Result<AttemptPage, LedgerError> {
    let limit = query.clamped_limit();
    let mut conditions = Vec::new();
    let mut params: Vec<Value> = Vec::new();
    // The status is written into the SQL (an enumeration's own text, never input):
    // SQLite uses a partial index only for a condition it can see when preparing.
    let status_condition = query.status.map(|s| format!("status = '{}'", s.as_str()));
    if let Some(condition) = &status_condition {
        conditions.push(condition.as_str());
    }
    if let Some(plan) = &query.plan {
        conditions.push("plan_id = ?");
        params.push(Value::Text(plan.as_str().to_owned()));
    }
    if let Some(after) = &query.after {
        conditions.push("(created_at, id) < (?, ?)");
        params.push(Value::Integer(after.created_at.as_millis()));
        params.push(Value::Text(after.id.as_str().to_owned()));
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conditions.join(" AND "))
    };
    params.push(Value::Integer(i64::from(limit) + 1));
    let sql = format!("SELECT id, created_at FROM attempt {filter} ORDER BY created_at DESC, id DESC LIMIT ?");
    // One snapshot for the keys and their records (inside a caller's transaction, that one).
    let tx = if conn.is_autocommit() {
        Some(conn.unchecked_transaction().map_err(sql_error)?)
    } else {
        None
    };
    let keys = read_page_keys(conn, &sql, params)?;
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        let read = key.id().map(|id| read_record(conn, id));
        rows.extend(key.into_row(read)?);
    }
    drop(tx);
    Ok(AttemptPage::from_page_rows(rows, limit))
}

/// Counts per status, each reading at most `cap + 1` index entries or rows
/// ([`crate::ledger::sql::query::Queries::capped_count`]): QUEUED and RUNNING from
/// the commands' partial indexes, the terminal statuses from the attempts.
pub(super) fn count_attempts(conn: &Connection, cap: u64) -> Result<AttemptCounts, LedgerError> {
    let limit = i64::try_from(cap.saturating_add(1)).unwrap_or(i64::MAX);
    let mut exact = Vec::new();
    for &status in AttemptStatus::ALL {
        let n: i64 = conn
            .prepare_cached(queries(&SQLITE).capped_count(status))
            .map_err(sql_error)?
            .query_row([limit], |row| row.get(0))
            .map_err(sql_error)?;
        exact.push((status, u64::try_from(n).unwrap_or(0)));
    }
    Ok(AttemptCounts::capped(cap, |s| {
        exact.iter().find(|(x, _)| *x == s).map_or(0, |(_, n)| *n)
    }))
}
