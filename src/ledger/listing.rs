//! The console's reads: attempts across plans a page at a time, and counts per
//! status that stay cheap on a huge ledger.
//!
//! Order: newest first, by `(created_at, attempt id)` descending. A page ends with
//! an [`AttemptCursor`] naming its last attempt; the next page holds the attempts
//! strictly after it in that order (keyset pagination), so a page never repeats or
//! skips an attempt because attempts were enqueued meanwhile.
//!
//! Counts are capped: a status with more than `cap` attempts is reported as
//! "at least `cap`" ([`StateCount::capped`]), so that counting never reads more than
//! `cap + 1` rows per status, whatever the ledger holds.
//!
//! [`Ledger::list_attempts`] and [`Ledger::count_attempts`] have default
//! implementations built from the other reads ([`list_from_history`],
//! [`count_from_history`]); the SQL ledgers answer with their own queries.

use super::{Ledger, LedgerError};
use base64::Engine as _;
use leasehold_engine::{AttemptId, AttemptRecord, AttemptStatus, PlanId, Timestamp};
use serde::Serialize;

/// The most attempts one page holds.
pub const PAGE_LIMIT_MAX: u32 = 200;
/// The attempts a page holds when the query does not say.
pub const PAGE_LIMIT_DEFAULT: u32 = 50;
/// The count cap the console and API use.
pub const COUNT_CAP_DEFAULT: u64 = 10_000;

/// Where a page ended: the last attempt it held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptCursor {
    /// That attempt's `created_at`.
    pub created_at: Timestamp,
    /// Its id.
    pub id: AttemptId,
}

impl AttemptCursor {
    /// The cursor after `record`.
    pub fn after(record: &AttemptRecord) -> Self {
        Self {
            created_at: record.attempt.created_at,
            id: record.attempt.id.clone(),
        }
    }

    /// The opaque text form (URL-safe).
    pub fn encode(&self) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!(
            "{}:{}",
            self.created_at.as_millis(),
            self.id.as_str()
        ))
    }

    /// Parses [`AttemptCursor::encode`]'s text; anything else is
    /// [`LedgerError::BadInput`] naming `cursor`.
    pub fn decode(text: &str) -> Result<Self, LedgerError> {
        let bad = || LedgerError::BadInput("cursor: not a cursor this server answered".into());
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| bad())?;
        let text = String::from_utf8(bytes).map_err(|_| bad())?;
        let (ms, id) = text.split_once(':').ok_or_else(bad)?;
        let ms: i64 = ms.parse().map_err(|_| bad())?;
        if id.is_empty() || id.len() > 128 || id.chars().any(|c| c.is_control()) {
            return Err(bad());
        }
        Ok(Self {
            created_at: Timestamp::from_millis(ms),
            id: AttemptId::new(id),
        })
    }

    /// Whether `record` comes after this cursor in listing order (newest first).
    fn precedes(&self, record: &AttemptRecord) -> bool {
        (record.attempt.created_at, record.attempt.id.as_str()) < (self.created_at, self.id.as_str())
    }
}

/// Which attempts a page lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptQuery {
    /// Only attempts in this status.
    pub status: Option<AttemptStatus>,
    /// Only attempts of this plan (by id).
    pub plan: Option<PlanId>,
    /// At most this many (clamped to 1..=[`PAGE_LIMIT_MAX`]).
    pub limit: u32,
    /// Only attempts after this cursor.
    pub after: Option<AttemptCursor>,
}

impl Default for AttemptQuery {
    fn default() -> Self {
        Self {
            status: None,
            plan: None,
            limit: PAGE_LIMIT_DEFAULT,
            after: None,
        }
    }
}

impl AttemptQuery {
    /// The page size, clamped.
    pub fn clamped_limit(&self) -> u32 {
        self.limit.clamp(1, PAGE_LIMIT_MAX)
    }
}

/// One page of attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptPage {
    /// Newest first.
    pub records: Vec<AttemptRecord>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<AttemptCursor>,
}

impl AttemptPage {
    /// A page from `records` read in listing order, one more than `limit` when there
    /// is a further page.
    pub fn from_rows(mut records: Vec<AttemptRecord>, limit: u32) -> Self {
        let more = records.len() > limit as usize;
        records.truncate(limit as usize);
        let next = if more {
            records.last().map(AttemptCursor::after)
        } else {
            None
        };
        Self { records, next }
    }
}

/// The count of one status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StateCount {
    /// The status.
    pub status: AttemptStatus,
    /// How many attempts have it (exact unless `capped`).
    pub count: u64,
    /// `count` is the cap: there are at least that many.
    pub capped: bool,
}

/// Counts of attempts per status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptCounts {
    /// The cap each count was read up to.
    pub cap: u64,
    /// One per status, in [`AttemptStatus::ALL`] order.
    pub states: Vec<StateCount>,
}

impl AttemptCounts {
    /// Counts from exact numbers per status, capped at `cap`.
    pub fn capped(cap: u64, exact: impl Fn(AttemptStatus) -> u64) -> Self {
        let states = AttemptStatus::ALL
            .iter()
            .map(|&status| {
                let n = exact(status);
                StateCount {
                    status,
                    count: n.min(cap),
                    capped: n > cap,
                }
            })
            .collect();
        Self { cap, states }
    }

    /// The count of `status`.
    pub fn get(&self, status: AttemptStatus) -> Option<StateCount> {
        self.states.iter().copied().find(|s| s.status == status)
    }
}

/// Orders records newest first.
fn newest_first(records: &mut [AttemptRecord]) {
    records.sort_by(|a, b| {
        (b.attempt.created_at, b.attempt.id.as_str()).cmp(&(a.attempt.created_at, a.attempt.id.as_str()))
    });
}

/// Every attempt (of the query's plan), from the plan list and histories.
async fn all_records<L: Ledger + ?Sized>(ledger: &L, plan: Option<&PlanId>) -> Result<Vec<AttemptRecord>, LedgerError> {
    let plans = match plan {
        Some(id) => vec![ledger.plan(id).await?.id],
        None => ledger.list_plans().await?.into_iter().map(|p| p.id).collect(),
    };
    let mut records = Vec::new();
    for id in &plans {
        records.extend(ledger.history(id).await?);
    }
    Ok(records)
}

/// [`Ledger::list_attempts`] from the other reads: every history, filtered and
/// sorted. Correct on any ledger; reads every attempt.
pub async fn list_from_history<L: Ledger + ?Sized>(
    ledger: &L,
    query: &AttemptQuery,
) -> Result<AttemptPage, LedgerError> {
    let mut records: Vec<AttemptRecord> = all_records(ledger, query.plan.as_ref())
        .await?
        .into_iter()
        .filter(|r| query.status.is_none_or(|s| r.attempt.status == s))
        .filter(|r| query.after.as_ref().is_none_or(|c| c.precedes(r)))
        .collect();
    newest_first(&mut records);
    let limit = query.clamped_limit();
    records.truncate(limit as usize + 1);
    Ok(AttemptPage::from_rows(records, limit))
}

/// [`Ledger::count_attempts`] from the other reads: every history, counted.
pub async fn count_from_history<L: Ledger + ?Sized>(ledger: &L, cap: u64) -> Result<AttemptCounts, LedgerError> {
    let records = all_records(ledger, None).await?;
    Ok(AttemptCounts::capped(cap, |status| {
        records.iter().filter(|r| r.attempt.status == status).count() as u64
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_refuses_anything_else() {
        let c = AttemptCursor {
            created_at: Timestamp::from_millis(1_700_000_000_123),
            id: AttemptId::new("att-00ff"),
        };
        assert_eq!(AttemptCursor::decode(&c.encode()).unwrap(), c);
        for bad in [
            "",
            "!!",
            "bm9jb2xvbg",
            &base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("x:att"),
        ] {
            let e = AttemptCursor::decode(bad).unwrap_err();
            assert!(
                matches!(e, LedgerError::BadInput(ref m) if m.starts_with("cursor:")),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn counts_above_the_cap_say_so() {
        let counts = AttemptCounts::capped(10, |s| if s == AttemptStatus::Succeeded { 11 } else { 10 });
        let ok = counts.get(AttemptStatus::Succeeded).unwrap();
        assert_eq!((ok.count, ok.capped), (10, true));
        let queued = counts.get(AttemptStatus::Queued).unwrap();
        assert_eq!((queued.count, queued.capped), (10, false));
    }
}
