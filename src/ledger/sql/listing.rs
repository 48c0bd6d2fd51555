//! The console's reads ([`crate::ledger::listing`]), written once: a page of
//! attempts, newest first, from one snapshot, and counts per status that stop at the
//! cap (at most `cap + 1` index entries or rows read per status,
//! [`super::query::Queries::capped_count`]): QUEUED and RUNNING from the commands'
//! indexes, the ended statuses from the attempts.

use super::decode;
use super::query::queries;
use super::session::{self, Session};
use super::{Sql, TxError, Value};
use crate::ledger::listing::{AttemptCounts, AttemptQuery, PageRow};
use leasehold_engine::{AttemptStatus, Timestamp};

/// The text and values of a page's key query: `(id, created_at)` in listing order,
/// one more than `limit`, to know whether another page follows.
fn page_keys_sql<'a>(s: &impl Session, query: &'a AttemptQuery, limit: u32) -> Sql<'a> {
    let d = s.dialect();
    let mut sql = Sql::new(d);
    sql.push("SELECT id, created_at FROM attempt WHERE 1 = 1");
    // The status is written into the text (an enumeration's own spelling, never
    // input): SQLite uses a partial index only for a condition it sees when preparing.
    if let Some(status) = query.status {
        sql.push(&format!(" AND status = '{}'", status.as_str()));
    }
    if let Some(plan) = &query.plan {
        sql.push(" AND plan_id = ").bind(Value::Text(plan.as_str()));
    }
    if let Some(after) = &query.after {
        let (at, id) = (Value::ts(after.created_at), Value::Text(after.id.as_str()));
        if d.row_compare {
            sql.push(" AND (created_at, id) < (")
                .bind(at)
                .push(", ")
                .bind(id)
                .push(")");
        } else {
            sql.push(" AND (created_at < ")
                .bind(at)
                .push(" OR (created_at = ")
                .bind(at);
            sql.push(" AND id < ").bind(id).push("))");
        }
    }
    sql.push(" ORDER BY created_at DESC, id DESC LIMIT ")
        .bind(Value::Int(i64::from(limit) + 1));
    sql
}

/// A page: the keys from the index in listing order, then each record by its id,
/// inside the caller's snapshot; a record that does not parse is listed as damaged in
/// its place ([`crate::ledger::listing::PageKey`]).
pub(crate) async fn page<S: Session>(s: &mut S, query: &AttemptQuery, limit: u32) -> Result<Vec<PageRow>, TxError> {
    let sql = page_keys_sql(s, query, limit);
    let keys = s.query(&sql.text, &sql.values, |r| Ok(decode::page_key(r))).await?;
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        let read = match key.id() {
            Some(id) => Some(session::read_record(s, id).await),
            None => None,
        };
        rows.extend(key.into_row(read)?);
    }
    Ok(rows)
}

/// Attempts per status, each count capped at `cap`.
pub(crate) async fn counts<S: Session>(s: &mut S, cap: u64) -> Result<AttemptCounts, TxError> {
    let limit = i64::try_from(cap.saturating_add(1)).unwrap_or(i64::MAX);
    let mut exact = Vec::new();
    for &status in AttemptStatus::ALL {
        let sql = queries(s.dialect()).capped_count(status);
        let n = session::query_one(s, sql, &[Value::Int(limit)], |r| decode::scalar(r, 0, "attempt count"))
            .await?
            .unwrap_or(0);
        exact.push((status, u64::try_from(n).unwrap_or(0)));
    }
    let q = queries(s.dialect());
    let exhausted = session::query_one(s, &q.capped_exhausted, &[Value::Int(limit)], |r| {
        decode::scalar(r, 0, "exhausted count")
    })
    .await?
    .unwrap_or(0);
    let oldest = oldest_instant(s, &q.oldest_pending, "oldest pending").await?;
    let lease = oldest_instant(s, &q.oldest_lease, "oldest lease").await?;
    let counts = AttemptCounts::capped(cap, |s| exact.iter().find(|(x, _)| *x == s).map_or(0, |(_, n)| *n));
    Ok(counts
        .with_delivery(u64::try_from(exhausted).unwrap_or(0), oldest)
        .with_oldest_lease(lease))
}

/// The one nullable instant `sql` selects (a `MIN` over an index).
async fn oldest_instant<S: Session>(s: &mut S, sql: &str, what: &str) -> Result<Option<Timestamp>, TxError> {
    let millis = session::query_one(s, sql, &[], |r| decode::opt_scalar(r, 0, what)).await?;
    Ok(millis.flatten().map(Timestamp::from_millis))
}
