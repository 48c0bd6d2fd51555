//! The console's reads on PostgreSQL ([`crate::ledger::listing`]): a page of attempts,
//! newest first, from one snapshot (the `attempt_by_created` index and, for the
//! failed and aborted pages, its partial twins), and counts per status that stop at
//! the cap (at most `cap + 1` rows read per status, `Queries::capped_count`): QUEUED
//! and RUNNING from the commands' partial indexes (migration 3), the ended statuses
//! from the attempts.

use super::connection::begin_read;
use super::error::TxError;
use super::rows::{self, read_record};
use super::PostgresLedger;
use crate::ledger::listing::{AttemptCounts, AttemptPage, AttemptQuery};
use crate::ledger::sql::decode;
use crate::ledger::sql::query::queries;
use crate::ledger::sql::{Sql, Value, POSTGRES};
use leasehold_engine::AttemptStatus;

impl PostgresLedger {
    /// One try of [`crate::ledger::Ledger::list_attempts`].
    pub(super) async fn list_attempts_once(&self, query: &AttemptQuery) -> Result<AttemptPage, TxError> {
        let limit = query.clamped_limit();
        let mut sql = Sql::new(&POSTGRES);
        sql.push("SELECT id, created_at FROM attempt WHERE TRUE");
        if let Some(status) = query.status {
            sql.push(" AND status = ").bind(Value::Text(status.as_str()));
        }
        if let Some(plan) = &query.plan {
            sql.push(" AND plan_id = ").bind(Value::Text(plan.as_str()));
        }
        if let Some(after) = &query.after {
            sql.push(" AND (created_at, id) < (")
                .bind(Value::ts(after.created_at))
                .push(", ")
                .bind(Value::Text(after.id.as_str()))
                .push(")");
        }
        sql.push(" ORDER BY created_at DESC, id DESC LIMIT ")
            .bind(Value::Int(i64::from(limit) + 1));
        let mut client = self.connect().await?;
        let tx = begin_read(&mut client).await?;
        let result: Result<_, TxError> = async {
            let keys = rows::query_all(&tx, &sql.text, &sql.values, |r| Ok(decode::page_key(r))).await?;
            let mut page = Vec::with_capacity(keys.len());
            for key in keys {
                let read = match key.id() {
                    Some(id) => Some(read_record(&tx, id).await),
                    None => None,
                };
                page.extend(key.into_row(read)?);
            }
            Ok(page)
        }
        .await;
        // A read: its end never decides anything.
        let _ = tx.rollback().await;
        Ok(AttemptPage::from_page_rows(result?, limit))
    }

    /// One try of [`crate::ledger::Ledger::count_attempts`].
    pub(super) async fn count_attempts_once(&self, cap: u64) -> Result<AttemptCounts, TxError> {
        let limit = i64::try_from(cap.saturating_add(1)).unwrap_or(i64::MAX);
        let client = self.connect().await?;
        let mut exact = Vec::new();
        for &status in AttemptStatus::ALL {
            let sql = queries(&POSTGRES).capped_count(status);
            let n = rows::query_one(&client, sql, &[Value::Int(limit)], |r| {
                decode::scalar(r, 0, "attempt count")
            })
            .await?
            .unwrap_or(0);
            exact.push((status, u64::try_from(n).unwrap_or(0)));
        }
        Ok(AttemptCounts::capped(cap, |s| {
            exact.iter().find(|(x, _)| *x == s).map_or(0, |(_, n)| *n)
        }))
    }
}
