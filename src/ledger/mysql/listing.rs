//! The console's reads on MySQL ([`crate::ledger::listing`]): a page of attempts,
//! newest first, from one consistent snapshot, and counts per status that stop at
//! the cap (`Queries::capped_count`, at most `cap + 1` index entries each): QUEUED
//! and RUNNING from the commands' `(status, …)` indexes, the ended states from
//! `attempt_by_status`.
//!
//! A page sorts the attempts that match its filter (`ORDER BY created_at, id` has no
//! index here): its cost grows with the attempts that match, not with the page.

use super::error::{DbResult, TxError};
use super::rows::{read_page_keys, read_record};
use super::MysqlLedger;
use crate::ledger::listing::{AttemptCounts, AttemptPage, AttemptQuery};
use crate::ledger::sql::query::queries;
use crate::ledger::sql::MYSQL;
use leasehold_engine::AttemptStatus;
use mysql_async::prelude::Queryable;
use mysql_async::{TxOpts, Value};

impl MysqlLedger {
    /// One try of [`crate::ledger::Ledger::list_attempts`].
    pub(super) async fn list_attempts_once(&self, query: &AttemptQuery) -> Result<AttemptPage, TxError> {
        let limit = query.clamped_limit();
        let mut conditions = Vec::new();
        let mut params: Vec<Value> = Vec::new();
        if let Some(status) = query.status {
            conditions.push("status = ?");
            params.push(status.as_str().into());
        }
        if let Some(plan) = &query.plan {
            conditions.push("plan_id = ?");
            params.push(plan.as_str().into());
        }
        if let Some(after) = &query.after {
            conditions.push("(created_at < ? OR (created_at = ? AND id < ?))");
            params.push(after.created_at.as_millis().into());
            params.push(after.created_at.as_millis().into());
            params.push(after.id.as_str().into());
        }
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conditions.join(" AND "))
        };
        params.push((u64::from(limit) + 1).into());
        let sql = format!("SELECT id, created_at FROM attempt {filter} ORDER BY created_at DESC, id DESC LIMIT ?");
        let mut conn = self.connect().await?;
        let mut opts = TxOpts::default();
        opts.with_consistent_snapshot(true).with_readonly(Some(true));
        let mut tx = conn.start_transaction(opts).await.db()?;
        let result: Result<_, TxError> = async {
            let keys = read_page_keys(&mut tx, &sql, params).await?;
            let mut page = Vec::with_capacity(keys.len());
            for key in keys {
                let read = match key.id() {
                    Some(id) => Some(read_record(&mut tx, id).await),
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
        let limit = cap.saturating_add(1);
        let mut conn = self.connect().await?;
        let mut exact = Vec::new();
        for &status in AttemptStatus::ALL {
            let n: Option<u64> = conn
                .exec_first(queries(&MYSQL).capped_count(status), (limit,))
                .await
                .db()?;
            exact.push((status, n.unwrap_or(0)));
        }
        Ok(AttemptCounts::capped(cap, |s| {
            exact.iter().find(|(x, _)| *x == s).map_or(0, |(_, n)| *n)
        }))
    }
}
