//! Bulk recovery: retry the failed attempts, or abort the open ones, that a filter
//! selects, each through the ledger's own transition (an enqueue of `retry`, an
//! operator abort), never a direct write.
//!
//! A bulk action needs a filter (a plan, a reason or a `since`: "everything" is
//! `since` the epoch, said on purpose) and is bounded: it acts on at most
//! `limit` attempts per call ([`BulkFilter`]), newest first, and says whether more
//! matched. A dry run counts what it would act on and writes nothing.

use super::listing::{AttemptQuery, PAGE_LIMIT_MAX};
use super::{Ledger, LedgerError};
use leasehold_engine::{Action, AttemptId, AttemptRecord, AttemptStatus, PlanId, Timestamp};
use serde::Serialize;

/// The most attempts one bulk call acts on.
pub const BULK_LIMIT_MAX: u32 = 1_000;
/// The attempts one bulk call acts on unless told otherwise.
pub const BULK_LIMIT_DEFAULT: u32 = 100;

/// Which attempts a bulk action selects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BulkFilter {
    /// Only attempts of this plan.
    pub plan: Option<PlanId>,
    /// Only attempts whose error contains this text (`exhausted` selects every
    /// exhausted attempt).
    pub reason: Option<String>,
    /// Only attempts enqueued (for `abort`) or ended (for `retry`) at or after this
    /// instant.
    pub since: Option<Timestamp>,
    /// The most attempts to act on (clamped to 1..=[`BULK_LIMIT_MAX`]).
    pub limit: u32,
}

/// What a bulk action did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BulkOutcome {
    /// Attempts selected and acted on (in a dry run: that would be).
    pub count: u64,
    /// The attempts acted on: the new retry attempts, or the aborted ones.
    pub attempts: Vec<AttemptId>,
    /// Selected attempts the transition refused, with why (a race with a worker or
    /// another operator; nothing was written for them).
    pub refused: Vec<(AttemptId, String)>,
    /// Whether more attempts matched than the limit let this call act on.
    pub more: bool,
}

impl BulkFilter {
    /// Refuses a filter that selects nothing in particular.
    pub fn check(&self) -> Result<(), LedgerError> {
        if self.plan.is_none() && self.reason.is_none() && self.since.is_none() {
            return Err(LedgerError::BadInput(
                "a bulk action needs a filter: a plan, a reason or a since (to mean every attempt, say since \
                 1970-01-01T00:00:00Z)"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    fn limit(&self) -> usize {
        self.limit.clamp(1, BULK_LIMIT_MAX) as usize
    }

    fn matches(&self, record: &AttemptRecord, at: Option<Timestamp>) -> bool {
        let reason = self
            .reason
            .as_deref()
            .is_none_or(|r| record.attempt.error.as_deref().is_some_and(|e| e.contains(r)));
        let since = self.since.is_none_or(|s| at.is_some_and(|at| at >= s));
        reason && since
    }
}

/// Up to `limit + 1` attempts in `status` that `filter` selects, newest first, each
/// passing `keep` (which may read the ledger).
async fn select<L: Ledger + ?Sized>(
    ledger: &L,
    filter: &BulkFilter,
    status: AttemptStatus,
    at: fn(&AttemptRecord) -> Option<Timestamp>,
    selected: &mut Vec<AttemptRecord>,
) -> Result<(), LedgerError> {
    let want = filter.limit() + 1;
    let mut query = AttemptQuery {
        status: Some(status),
        plan: filter.plan.clone(),
        limit: PAGE_LIMIT_MAX,
        after: None,
    };
    loop {
        let page = ledger.list_attempts(&query).await?;
        for record in page.records {
            if filter.matches(&record, at(&record)) && is_latest(ledger, &record, status).await? {
                selected.push(record);
                if selected.len() >= want {
                    return Ok(());
                }
            }
        }
        match page.next {
            Some(next) => query.after = Some(next),
            None => return Ok(()),
        }
    }
}

/// Whether a FAILED attempt is its plan's latest (only that one can be retried);
/// every open attempt qualifies.
async fn is_latest<L: Ledger + ?Sized>(
    ledger: &L,
    record: &AttemptRecord,
    status: AttemptStatus,
) -> Result<bool, LedgerError> {
    if status != AttemptStatus::Failed {
        return Ok(true);
    }
    let history = ledger.history(&record.attempt.plan_id).await?;
    let latest = history.iter().map(|r| r.attempt.number).max();
    Ok(latest == Some(record.attempt.number))
}

/// Splits what was selected into what this call acts on and the outcome so far:
/// how many that is (a dry run's answer) and whether more matched.
fn bounded(mut selected: Vec<AttemptRecord>, filter: &BulkFilter) -> (Vec<AttemptRecord>, BulkOutcome) {
    let more = selected.len() > filter.limit();
    selected.truncate(filter.limit());
    let outcome = BulkOutcome {
        count: selected.len() as u64,
        more,
        ..BulkOutcome::default()
    };
    (selected, outcome)
}

/// Notes how the transition on the selected attempt `id` ended: acted on (`done`
/// names the attempt it answers), refused (nothing was written for it), or an error
/// that ends the call.
fn tally(outcome: &mut BulkOutcome, id: AttemptId, done: Result<AttemptId, LedgerError>) -> Result<(), LedgerError> {
    match done {
        Ok(acted) => outcome.attempts.push(acted),
        Err(LedgerError::Refused(refusal)) => outcome.refused.push((id, refusal.to_string())),
        Err(e) => return Err(e),
    }
    outcome.count = outcome.attempts.len() as u64;
    Ok(())
}

/// Retries the FAILED attempts `filter` selects (each its plan's latest), newest
/// first: one enqueue of `retry` per plan. A dry run counts them.
pub async fn retry_failed<L: Ledger + ?Sized>(
    ledger: &L,
    filter: &BulkFilter,
    dry_run: bool,
) -> Result<BulkOutcome, LedgerError> {
    filter.check()?;
    let mut selected = Vec::new();
    select(
        ledger,
        filter,
        AttemptStatus::Failed,
        |r| r.attempt.finished_at,
        &mut selected,
    )
    .await?;
    let (selected, mut outcome) = bounded(selected, filter);
    if dry_run {
        return Ok(outcome);
    }
    outcome.count = 0;
    for record in selected {
        let retry = ledger.enqueue(&record.attempt.plan_id, Action::Retry).await;
        tally(&mut outcome, record.attempt.id, retry.map(|r| r.attempt.id))?;
    }
    Ok(outcome)
}

/// Aborts the QUEUED and RUNNING attempts `filter` selects, newest first, each with
/// the reason `aborted in bulk by {who}`. A dry run counts them.
pub async fn abort_open<L: Ledger + ?Sized>(
    ledger: &L,
    filter: &BulkFilter,
    who: &str,
    dry_run: bool,
) -> Result<BulkOutcome, LedgerError> {
    filter.check()?;
    let mut selected = Vec::new();
    let created = |r: &AttemptRecord| Some(r.attempt.created_at);
    select(ledger, filter, AttemptStatus::Queued, created, &mut selected).await?;
    if selected.len() <= filter.limit() {
        select(ledger, filter, AttemptStatus::Running, created, &mut selected).await?;
    }
    let (selected, mut outcome) = bounded(selected, filter);
    if dry_run {
        return Ok(outcome);
    }
    outcome.count = 0;
    let reason = format!("aborted in bulk by {who}");
    for record in selected {
        let aborted = ledger.abort(&record.attempt.id, &reason).await;
        tally(&mut outcome, record.attempt.id, aborted.map(|r| r.attempt.id))?;
    }
    Ok(outcome)
}
