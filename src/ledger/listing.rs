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
//!
//! A damaged row does not cost the page: each row is read on its own, and a row
//! whose stored data does not parse ([`LedgerError::Integrity`]) is listed as a
//! [`DamagedRow`] in its place (its id when that reads, and the reason in one line,
//! naming the table and the column) while every other row is shown as usual. Any
//! other error (the ledger unreachable or busy) still fails the page. The SQL ledgers
//! read a page's keys (`id, created_at`) first and each record by its id
//! (`PageKey`), so a damaged row still advances the cursor: a page's cursor is the
//! key of its last row. A key that does not read (a `created_at` that is not an
//! integer, possible only where the database does not enforce column types: SQLite)
//! cannot be a cursor: the cursor is then the last key of the page that reads (the
//! rows after it are listed again on the next page), and after a page none of whose
//! keys read, the next page starts at the newest key that reads
//! ([`AttemptCursor::newest`]; SQLite orders text before every number, so such rows
//! come first, and only on the first page). The plans listings ([`Ledger::list_plan_rows`],
//! [`Ledger::plan_rows_newest_first`]) read one row per plan and mark a damaged one
//! the same way ([`PlanRow`]); the other reads of plans still refuse a damaged row.

use super::{Ledger, LedgerError};
use base64::Engine as _;
use leasehold_engine::{AttemptId, AttemptRecord, AttemptStatus, CommandStatus, Exhaustion, Plan, PlanId, Timestamp};
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

    /// A cursor before every attempt whose key reads: the next page after a page
    /// none of whose keys read starts here.
    pub fn newest() -> Self {
        Self {
            created_at: Timestamp::from_millis(i64::MAX),
            id: AttemptId::new("\u{10FFFF}"),
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

/// A row a listing could not read: shown as damaged, in its place, while the rest of
/// the listing is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "cli", derive(utoipa::ToSchema))]
pub struct DamagedRow {
    /// The row's id, when that much of it reads.
    pub id: Option<String>,
    /// Where it stands on its page: how many rows (read or damaged) come before it.
    pub position: usize,
    /// Why it could not be read, in one line: the table and the column, and what is
    /// wrong with the value (a lease token column is never quoted).
    pub reason: String,
}

/// The most characters of a reason a [`DamagedRow`] keeps.
pub const REASON_CHARS_MAX: usize = 300;

impl DamagedRow {
    /// The damaged row `id` (if it reads), for `reason`, made one line of at most
    /// [`REASON_CHARS_MAX`] characters. Its position is set by the page.
    pub fn new(id: Option<String>, reason: &str) -> Self {
        let line = crate::text::clean(reason);
        let mut reason: String = line.chars().take(REASON_CHARS_MAX).collect();
        if line.chars().count() > REASON_CHARS_MAX {
            reason.push('…');
        }
        Self {
            id,
            position: 0,
            reason,
        }
    }
}

/// An error that may say a stored row does not parse: the one kind of error a
/// listing survives ([`tolerate`]).
pub(crate) trait RowError {
    /// The reason, when this error is a row that does not parse.
    fn damage(&self) -> Option<&str>;
}

impl RowError for LedgerError {
    fn damage(&self) -> Option<&str> {
        match self {
            LedgerError::Integrity(reason) => Some(reason),
            _ => None,
        }
    }
}

#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
impl RowError for super::sql::TxError {
    fn damage(&self) -> Option<&str> {
        match self {
            super::sql::TxError::Ledger(e) => e.damage(),
            _ => None,
        }
    }
}

/// One row of a listing read on its own: a row whose data does not parse is
/// `Ok(Err(damaged))` naming `id`; any other error fails the listing.
pub(crate) fn tolerate<T, E: RowError>(id: Option<&str>, read: Result<T, E>) -> Result<Result<T, DamagedRow>, E> {
    match read {
        Ok(row) => Ok(Ok(row)),
        Err(e) => match e.damage() {
            Some(reason) => Ok(Err(DamagedRow::new(id.map(str::to_owned), reason))),
            None => Err(e),
        },
    }
}

/// One row of a page before it is read: the attempt's id and its place in listing
/// order, each as far as they read. The SQL ledgers read these first (`SELECT id,
/// created_at`), then each record by its id ([`PageKey::into_row`]).
#[derive(Debug, Clone)]
pub(crate) struct PageKey {
    id: Result<AttemptId, String>,
    cursor: Option<AttemptCursor>,
}

impl PageKey {
    /// The key of a row whose id and `created_at` read as `id` and `created_at`.
    pub(crate) fn new(id: Result<String, LedgerError>, created_at: Result<i64, LedgerError>) -> Self {
        let id = id.map(AttemptId::new).map_err(|e| e.to_string());
        let cursor = match (&id, created_at) {
            (Ok(id), Ok(ms)) => Some(AttemptCursor {
                created_at: Timestamp::from_millis(ms),
                id: id.clone(),
            }),
            _ => None,
        };
        Self { id, cursor }
    }

    /// The id to read the record by, if it reads.
    pub(crate) fn id(&self) -> Option<&AttemptId> {
        self.id.as_ref().ok()
    }

    /// This key's row, given what reading its record by id answered (`None` when the
    /// id does not read, so nothing was read): the record, or the row marked damaged
    /// when its data does not parse; no row when it was not found (gone since the
    /// keys were read). Any other error fails the page.
    pub(crate) fn into_row<E: RowError>(
        self,
        read: Option<Result<Option<AttemptRecord>, E>>,
    ) -> Result<Option<PageRow>, E> {
        let row = match (self.id, read) {
            (Err(reason), _) => Err(DamagedRow::new(None, &reason)),
            (Ok(_), None) => return Ok(None),
            (Ok(id), Some(read)) => match tolerate(Some(id.as_str()), read)? {
                Ok(Some(record)) => Ok(record),
                Ok(None) => return Ok(None),
                Err(damaged) => Err(damaged),
            },
        };
        Ok(Some(PageRow {
            cursor: self.cursor,
            row,
        }))
    }
}

/// One row of a page as read, with its place in listing order when that reads.
#[derive(Debug, Clone)]
pub(crate) struct PageRow {
    cursor: Option<AttemptCursor>,
    row: Result<AttemptRecord, DamagedRow>,
}

/// One page of attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptPage {
    /// The attempts that read, newest first.
    pub records: Vec<AttemptRecord>,
    /// The rows that did not read, each with its position on the page among
    /// `records` (empty on a sound ledger).
    pub damaged: Vec<DamagedRow>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<AttemptCursor>,
}

impl AttemptPage {
    /// A page from `records` read in listing order, one more than `limit` when there
    /// is a further page.
    pub fn from_rows(records: Vec<AttemptRecord>, limit: u32) -> Self {
        let rows = records
            .into_iter()
            .map(|record| PageRow {
                cursor: Some(AttemptCursor::after(&record)),
                row: Ok(record),
            })
            .collect();
        Self::from_page_rows(rows, limit)
    }

    /// A page from rows read in listing order (damaged ones included), one more than
    /// `limit` when there is a further page: the next page starts after the last row
    /// whose key reads.
    pub(crate) fn from_page_rows(mut rows: Vec<PageRow>, limit: u32) -> Self {
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        let next = more.then(|| {
            rows.iter()
                .rev()
                .find_map(|r| r.cursor.clone())
                .unwrap_or_else(AttemptCursor::newest)
        });
        let mut page = Self {
            records: Vec::with_capacity(rows.len()),
            damaged: Vec::new(),
            next,
        };
        for (position, row) in rows.into_iter().enumerate() {
            match row.row {
                Ok(record) => page.records.push(record),
                Err(damaged) => page.damaged.push(DamagedRow { position, ..damaged }),
            }
        }
        page
    }

    /// The page's rows in listing order: each record, or a damaged row in its place.
    pub fn rows(&self) -> Vec<Result<&AttemptRecord, &DamagedRow>> {
        let mut records = self.records.iter();
        let mut damaged = self.damaged.iter().peekable();
        let mut out = Vec::with_capacity(self.records.len() + self.damaged.len());
        loop {
            if let Some(d) = damaged.next_if(|d| d.position <= out.len()) {
                out.push(Err(d));
            } else if let Some(r) = records.next() {
                out.push(Ok(r));
            } else if let Some(d) = damaged.next() {
                out.push(Err(d));
            } else {
                return out;
            }
        }
    }
}

/// A plan of a plans listing as read: the plan, or its row marked damaged.
pub type PlanRow = Result<Plan, DamagedRow>;

/// Rows read in listing order, each damaged one told its position.
pub(crate) fn placed<T>(rows: Vec<Result<T, DamagedRow>>) -> Vec<Result<T, DamagedRow>> {
    rows.into_iter()
        .enumerate()
        .map(|(position, row)| row.map_err(|d| DamagedRow { position, ..d }))
        .collect()
}

/// The rows of a read that must all parse (every read but a listing): the first
/// damaged one is [`LedgerError::Integrity`] with its reason.
pub(crate) fn all_read<T>(rows: Vec<Result<T, DamagedRow>>) -> Result<Vec<T>, LedgerError> {
    rows.into_iter()
        .map(|row| row.map_err(|d| LedgerError::Integrity(d.reason)))
        .collect()
}

/// [`Ledger::list_plan_rows`] from [`Ledger::list_plans`]: every row read, none marked.
pub async fn plan_rows_from_list<L: Ledger + ?Sized>(ledger: &L) -> Result<Vec<PlanRow>, LedgerError> {
    Ok(ledger.list_plans().await?.into_iter().map(Ok).collect())
}

/// [`Ledger::plan_rows_newest_first`] from [`Ledger::plans_newest_first`]: every row
/// read, none marked.
pub async fn plan_rows_from_page<L: Ledger + ?Sized>(
    ledger: &L,
    before: Option<&PlanId>,
    limit: u32,
) -> Result<Vec<PlanRow>, LedgerError> {
    Ok(ledger
        .plans_newest_first(before, limit)
        .await?
        .into_iter()
        .map(Ok)
        .collect())
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
    /// Attempts that ended exhausted (FAILED with an `exhausted:` reason), up to
    /// the cap.
    pub exhausted: u64,
    /// `exhausted` is the cap: there are at least that many.
    pub exhausted_capped: bool,
    /// The earliest `available_at` of a queued command (possibly in the future,
    /// for a scheduled or backed-off one); `None` when nothing is queued.
    pub oldest_queued_at: Option<Timestamp>,
    /// The earliest `lease_until` of a PROCESSING command: in the past when a lease
    /// has expired and no worker has taken it over yet; `None` when nothing is leased.
    pub oldest_lease_until: Option<Timestamp>,
}

impl AttemptCounts {
    /// The same counts with the delivery policy's: `exhausted` (exact, capped here)
    /// and the earliest queued `available_at`.
    #[must_use]
    pub fn with_delivery(mut self, exhausted: u64, oldest_queued_at: Option<Timestamp>) -> Self {
        self.exhausted = exhausted.min(self.cap);
        self.exhausted_capped = exhausted > self.cap;
        self.oldest_queued_at = oldest_queued_at;
        self
    }

    /// The same counts with the earliest lease end of a leased command.
    #[must_use]
    pub fn with_oldest_lease(mut self, oldest_lease_until: Option<Timestamp>) -> Self {
        self.oldest_lease_until = oldest_lease_until;
        self
    }

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
        Self {
            cap,
            states,
            exhausted: 0,
            exhausted_capped: false,
            oldest_queued_at: None,
            oldest_lease_until: None,
        }
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
    let counts = AttemptCounts::capped(cap, |status| {
        records.iter().filter(|r| r.attempt.status == status).count() as u64
    });
    let exhausted = records.iter().filter(|r| Exhaustion::of(&r.attempt).is_some()).count();
    let oldest = records
        .iter()
        .filter(|r| r.command.status == CommandStatus::Pending)
        .map(|r| r.command.available_at)
        .min();
    let lease = records
        .iter()
        .filter(|r| r.command.status == CommandStatus::Processing)
        .filter_map(|r| r.command.lease_until)
        .min();
    Ok(counts.with_delivery(exhausted as u64, oldest).with_oldest_lease(lease))
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
    fn the_newest_cursor_round_trips_and_precedes_every_readable_key() {
        let newest = AttemptCursor::newest();
        assert_eq!(AttemptCursor::decode(&newest.encode()).unwrap(), newest);
        let key = (Timestamp::from_millis(i64::MAX - 1), "att-ffff");
        assert!(key < (newest.created_at, newest.id.as_str()));
    }

    fn record_at(id: &str, ms: i64) -> AttemptRecord {
        use leasehold_engine::{Action, Attempt, Command, CommandId, CommandStatus};
        let at = Timestamp::from_millis(ms);
        AttemptRecord {
            attempt: Attempt {
                input: None,
                input_sha256: None,
                order_key: None,
                id: AttemptId::new(id),
                plan_id: PlanId::new("plan"),
                number: 1,
                action: Action::Execute,
                status: AttemptStatus::Queued,
                created_at: at,
                started_at: None,
                finished_at: None,
                error: None,
                trace: None,
                enqueue_key: None,
                request_sha256: None,
            },
            command: Command {
                id: CommandId::new(format!("cmd-{id}")),
                attempt_id: AttemptId::new(id),
                status: CommandStatus::Pending,
                available_at: at,
                lease_owner: None,
                lease_token: None,
                lease_until: None,
                last_heartbeat_at: None,
                delivery_count: 0,
                last_error: None,
                finished_at: None,
                queue: String::new(),
                executor: String::new(),
                target: String::new(),
            },
            receipts: Vec::new(),
        }
    }

    fn damaged(id: &str) -> PageRow {
        PageRow {
            cursor: None,
            row: Err(DamagedRow::new(
                Some(id.into()),
                "attempt row: column created_at: is text",
            )),
        }
    }

    #[test]
    fn a_page_keeps_damaged_rows_in_place_and_its_cursor_after_the_last_key_that_reads() {
        let record = |id: &str, ms: i64| {
            let r = record_at(id, ms);
            PageRow {
                cursor: Some(AttemptCursor::after(&r)),
                row: Ok(r),
            }
        };
        let page = AttemptPage::from_page_rows(vec![record("a3", 3), damaged("a2"), record("a1", 1), damaged("a0")], 3);
        let order: Vec<String> = page
            .rows()
            .iter()
            .map(|r| match r {
                Ok(r) => r.attempt.id.to_string(),
                Err(d) => format!("damaged {}", d.id.as_deref().unwrap_or("?")),
            })
            .collect();
        assert_eq!(order, ["a3", "damaged a2", "a1"]);
        assert_eq!(page.damaged[0].position, 1);
        assert_eq!(page.next.unwrap().id.as_str(), "a1");
        // A page of rows none of whose keys read goes on from the newest key that does.
        let page = AttemptPage::from_page_rows(vec![damaged("x"), damaged("y")], 1);
        assert_eq!(page.next, Some(AttemptCursor::newest()));
        assert_eq!(page.damaged.len(), 1);
    }

    #[test]
    fn a_reason_is_one_bounded_line_and_only_integrity_is_tolerated() {
        let d = DamagedRow::new(None, &format!("line\nbreak {}", "x".repeat(1000)));
        assert!(!d.reason.contains('\n'), "{}", d.reason);
        assert!(d.reason.chars().count() <= REASON_CHARS_MAX + 1);
        let read: Result<(), LedgerError> = Err(LedgerError::Integrity("bad".into()));
        assert_eq!(tolerate(Some("a"), read).unwrap().unwrap_err().id.as_deref(), Some("a"));
        let read: Result<(), LedgerError> = Err(LedgerError::Unavailable("down".into()));
        assert!(tolerate(Some("a"), read).is_err());
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
