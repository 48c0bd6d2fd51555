//! Scheduled enqueues and recovery by hand: `enqueue --at/--in`, `retry` (one
//! attempt, or `--failed`: the failed attempts a filter selects) and `abort` (one
//! attempt, or `--open`: the open attempts a filter selects). Every write goes
//! through the ledger's own transitions ([`leasehold::ledger::bulk`] for the bulk
//! forms).

use super::when::{check_ahead, millis, parse_duration, parse_time};
use super::{emit, Failure, Outcome};
use leasehold::clock::{Clock, SystemClock};
use leasehold::ledger::bulk::{abort_open, retry_failed, BulkFilter, BulkOutcome, BULK_LIMIT_DEFAULT};
use leasehold::ledger::{find_plan, EnqueueRequest, Ledger, LedgerError};
use leasehold::text::clean;
use leasehold_engine::transition::{follow_up_of, Start};
use leasehold_engine::{Action, AttemptId, CommandStatus, Timestamp};
use std::fmt::Write as _;

/// `enqueue`'s start: at once, at a time, or after a while.
#[derive(clap::Args, Debug)]
pub(super) struct StartArgs {
    /// Deliver no sooner than this RFC 3339 time (2026-05-01T09:00:00Z,
    /// 2026-05-01T11:00:00+02:00); a time already past means now. At most 366 days ahead.
    #[arg(long, value_name = "TIME", conflicts_with = "in", allow_hyphen_values = true)]
    at: Option<String>,
    /// Deliver no sooner than this long from now: 500ms, 30s, 10m, 1h, 1h30m (at most 366 days).
    #[arg(long = "in", id = "in", value_name = "DURATION", allow_hyphen_values = true)]
    after: Option<String>,
}

impl StartArgs {
    /// The start these flags ask for, checked against `now`.
    fn start(&self, now: Timestamp) -> Result<Start, Failure> {
        match (&self.at, &self.after) {
            (Some(text), _) => {
                let at = parse_time("--at", text)?;
                check_ahead("--at", text, at.millis_since(now))?;
                Ok(Start::At(at))
            }
            (None, Some(text)) => {
                let ms = millis(parse_duration("--in", text)?);
                check_ahead("--in", text, ms)?;
                Ok(Start::After(ms))
            }
            (None, None) => Ok(Start::Now),
        }
    }
}

/// `leasehold enqueue PLAN [--action A] [--at TIME | --in DURATION]`: prints the
/// attempt id (a scheduled start is said on stderr).
pub(super) async fn enqueue<L: Ledger>(
    ledger: &L,
    plan: &str,
    request: EnqueueRequest,
    start: &StartArgs,
    json: bool,
) -> Outcome {
    let start = start.start(SystemClock.now())?;
    let plan = find_plan(ledger, plan).await?;
    let enqueued = ledger.enqueue_with(&plan.id, request.at(start)).await?;
    let record = &enqueued.record;
    emit(json, &enqueued, || format!("{}\n", record.attempt.id));
    if !enqueued.created {
        errln!(
            "attempt {} was enqueued earlier with this key; nothing new was enqueued",
            record.attempt.id
        );
        return Ok(());
    }
    if record.command.status == CommandStatus::Waiting {
        errln!(
            "attempt {} waits for the attempts ahead of it on order key {:?}",
            record.attempt.id,
            record.attempt.order_key.as_deref().unwrap_or_default()
        );
    }
    if start != Start::Now && record.command.available_at > record.attempt.created_at {
        errln!(
            "attempt {} is not delivered before {}",
            record.attempt.id,
            record.command.available_at
        );
    }
    Ok(())
}

/// The filter flags of `retry --failed` and `abort --open` (they need one of those).
#[derive(clap::Args, Debug)]
pub(super) struct BulkArgs {
    /// Only attempts of this plan (id or name).
    #[arg(long, value_name = "PLAN", requires = "bulk")]
    plan: Option<String>,
    /// Only attempts that ended (retry) or were enqueued (abort) at or after this
    /// RFC 3339 time; 1970-01-01T00:00:00Z selects every attempt.
    #[arg(long, value_name = "TIME", requires = "bulk", allow_hyphen_values = true)]
    since: Option<String>,
    /// Act on at most N attempts, newest first (default 100, clamped to 1..=1000).
    #[arg(long, value_name = "N", requires = "bulk")]
    limit: Option<u32>,
    /// Count what would be acted on, and write nothing.
    #[arg(long, requires = "bulk")]
    dry_run: bool,
}

impl BulkArgs {
    /// The library's filter: the plan resolved by id or name, the time parsed.
    async fn filter<L: Ledger>(&self, ledger: &L, reason: Option<String>) -> Result<BulkFilter, Failure> {
        let plan = match &self.plan {
            Some(p) => Some(find_plan(ledger, p).await?.id),
            None => None,
        };
        let since = self.since.as_deref().map(|t| parse_time("--since", t)).transpose()?;
        Ok(BulkFilter {
            plan,
            reason,
            since,
            limit: self.limit.unwrap_or(BULK_LIMIT_DEFAULT),
        })
    }
}

/// `leasehold retry`: one attempt, or the failed attempts a filter selects.
#[derive(clap::Args, Debug)]
pub(super) struct RetryArgs {
    /// The attempt to retry: its plan's latest attempt, FAILED or ABORTED.
    #[arg(required_unless_present = "bulk")]
    attempt: Option<String>,
    /// Instead of one attempt: every FAILED attempt the filter selects (each its
    /// plan's latest); needs --plan, --reason or --since.
    #[arg(long = "failed", id = "bulk", conflicts_with = "attempt")]
    failed: bool,
    /// Only attempts whose error contains this text (`exhausted`: every exhausted attempt).
    #[arg(long, value_name = "TEXT", requires = "bulk")]
    reason: Option<String>,
    #[command(flatten)]
    filter: BulkArgs,
}

/// `leasehold abort`: one attempt, or the open attempts a filter selects.
#[derive(clap::Args, Debug)]
pub(super) struct AbortArgs {
    /// The attempt to abort (QUEUED or RUNNING).
    #[arg(required_unless_present = "bulk")]
    attempt: Option<String>,
    /// Reason recorded on the attempt (a bulk abort records `aborted in bulk by USER`).
    #[arg(long, default_value = "aborted by operator", conflicts_with = "bulk")]
    reason: String,
    /// Instead of one attempt: every QUEUED or RUNNING attempt the filter selects;
    /// needs --plan or --since.
    #[arg(long = "open", id = "bulk", conflicts_with = "attempt")]
    open: bool,
    #[command(flatten)]
    filter: BulkArgs,
}

/// `leasehold retry ATTEMPT | --failed …`.
pub(super) async fn retry<L: Ledger>(ledger: &L, args: RetryArgs, json: bool) -> Outcome {
    let Some(id) = args.attempt else {
        let filter = args.filter.filter(ledger, args.reason).await?;
        let outcome = retry_failed(ledger, &filter, args.filter.dry_run).await?;
        return report(&outcome, args.filter.dry_run, Bulk::Retry, json);
    };
    let record = ledger.attempt(&AttemptId::new(&id)).await?;
    let history = ledger.history(&record.attempt.plan_id).await?;
    follow_up_of(&record, &history, Action::Retry).map_err(LedgerError::Refused)?;
    let new = ledger.enqueue(&record.attempt.plan_id, Action::Retry).await?;
    emit(json, &new, || {
        format!(
            "retrying attempt {}: enqueued retry attempt {} (#{})\n",
            record.attempt.id, new.attempt.id, new.attempt.number
        )
    });
    Ok(())
}

/// `leasehold abort ATTEMPT | --open …`.
pub(super) async fn abort<L: Ledger>(ledger: &L, args: AbortArgs, json: bool) -> Outcome {
    let Some(id) = args.attempt else {
        let filter = args.filter.filter(ledger, None).await?;
        let outcome = abort_open(ledger, &filter, &operator(), args.filter.dry_run).await?;
        return report(&outcome, args.filter.dry_run, Bulk::Abort, json);
    };
    let record = ledger.abort(&AttemptId::new(id), &args.reason).await?;
    emit(json, &record, || format!("aborted attempt {}\n", record.attempt.id));
    Ok(())
}

/// Who a bulk abort names: the OS user (`USER`, else `LOGNAME`) when it is a plain
/// name, else `cli`.
fn operator() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|u| {
            (1..=64).contains(&u.len())
                && u.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
        })
        .unwrap_or_else(|| "cli".to_owned())
}

/// Which bulk action a report is of.
#[derive(Clone, Copy)]
enum Bulk {
    Retry,
    Abort,
}

/// Prints what a bulk action did: with `--dry-run` the count (`{"count": N}`),
/// else the [`BulkOutcome`].
fn report(outcome: &BulkOutcome, dry_run: bool, bulk: Bulk, json: bool) -> Outcome {
    if dry_run {
        emit(json, &serde_json::json!({ "count": outcome.count }), || {
            dry_run_text(outcome, bulk)
        });
    } else {
        emit(json, outcome, || outcome_text(outcome, bulk));
    }
    Ok(())
}

fn dry_run_text(outcome: &BulkOutcome, bulk: Bulk) -> String {
    let (what, verb) = match bulk {
        Bulk::Retry => ("failed", "retried"),
        Bulk::Abort => ("open", "aborted"),
    };
    let mut text = format!(
        "{} {what} attempt{} would be {verb} (dry run: nothing was written)\n",
        outcome.count,
        plural(outcome.count)
    );
    if outcome.more {
        text.push_str("more attempts match than --limit lets one run act on\n");
    }
    text
}

fn outcome_text(outcome: &BulkOutcome, bulk: Bulk) -> String {
    let mut text = match bulk {
        Bulk::Retry => format!(
            "retried {} failed attempt{}; the new attempts:\n",
            outcome.count,
            plural(outcome.count)
        ),
        Bulk::Abort => format!("aborted {} open attempt{}:\n", outcome.count, plural(outcome.count)),
    };
    for id in &outcome.attempts {
        let _ = writeln!(text, "  {}", clean(id.as_str()));
    }
    for (id, why) in &outcome.refused {
        let _ = writeln!(text, "refused for attempt {}: {}", clean(id.as_str()), clean(why));
    }
    if outcome.more {
        text.push_str("more attempts match than --limit let this run act on: run it again for the rest\n");
    }
    text
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
