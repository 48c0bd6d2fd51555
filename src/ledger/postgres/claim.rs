//! PostgreSQL's claim: the candidates' CTE with `FOR UPDATE SKIP LOCKED`, then the
//! shared decision and guarded writes.

use super::error::TxError;
use super::session::{PgClient, PgSession};
use super::PgBackend;
use crate::ledger::sql::decode;
use crate::ledger::sql::ledger::SqlContext;
use crate::ledger::sql::session::{self, Session};
use crate::ledger::sql::table::{ATTEMPT, COMMAND};
use crate::ledger::sql::{limits, write, Sql, Value, POSTGRES};
use crate::ledger::{decide, Claimed, LedgerError};
use leasehold_engine::transition::is_claimable;
use leasehold_engine::{Attempt, AttemptId, Capabilities, ClaimRequest, Command, PlanId, Request, Timestamp};
use std::sync::atomic::Ordering;

/// How many candidates per command wanted a claim looks through (at least
/// [`CLAIM_WINDOW_MIN`], at most [`CLAIM_WINDOW_MAX`]): room for the ones that other
/// claimers hold right now, which `SKIP LOCKED` passes over.
const CLAIM_SPREAD: u32 = 8;
const CLAIM_WINDOW_MIN: u32 = 64;
const CLAIM_WINDOW_MAX: u32 = 1_000;

/// A command a claim locked, with its attempt, as they are now (locked): the latest
/// committed version, which may no longer be claimable (a race lost to a claimer
/// that committed meanwhile).
struct Picked {
    attempt: Attempt,
    command: Command,
    /// Its target's limit mode when the candidates were read
    /// ([`limits::LIMIT_MODE_SQL`]).
    limit_mode: i64,
}

/// Claims up to `request.batch` commands inside `tx`: lock the oldest claimable
/// commands that no other transaction holds, with their attempts
/// ([`lock_claimable`]), re-check each at the decision's now, lock their receipts,
/// read their plans, let the engine decide, and write each claim under its
/// `Claimable(now)` guard. A candidate no longer claimable once locked is a lost race
/// (counted, never a claim). The rows are locked, so a guard cannot fail; if one ever
/// does, the whole transaction is undone and tried again.
pub(super) async fn claim_in<C: PgClient>(
    backend: &PgBackend,
    ctx: &SqlContext,
    tx: &mut PgSession<C>,
    request: &ClaimRequest,
) -> Result<Vec<Claimed>, TxError> {
    let window = request
        .batch
        .saturating_mul(CLAIM_SPREAD)
        .clamp(CLAIM_WINDOW_MIN, CLAIM_WINDOW_MAX)
        .max(request.batch);
    let at = ctx.clock.as_ref().map(|c| c.now());
    let (picked, now) = lock_claimable(tx, at, (window, request.batch), request.capabilities.as_ref()).await?;
    let (heads, lost): (Vec<_>, Vec<_>) = picked.into_iter().partition(|p| is_claimable(&p.command, now));
    backend
        .stats
        .lost_claim_races
        .fetch_add(lost.len() as u64, Ordering::Relaxed);
    if heads.is_empty() {
        return Ok(Vec::new());
    }
    let modes: Vec<(&str, i64)> = heads
        .iter()
        .map(|p| (p.command.target.as_str(), p.limit_mode))
        .collect();
    let mut gates = limits::claim_gates(tx, &modes, now).await?;
    let heads: Vec<(Attempt, Command)> = heads.into_iter().map(|p| (p.attempt, p.command)).collect();
    let ids: Vec<&AttemptId> = heads.iter().map(|(a, _)| &a.id).collect();
    let receipts = session::lock_receipts_of(tx, &ids).await?;
    let mut plan_ids: Vec<&PlanId> = heads.iter().map(|(a, _)| &a.plan_id).collect();
    plan_ids.sort();
    plan_ids.dedup();
    let plans = session::read_plans_by_id(tx, &plan_ids).await?;
    let mut claimed = Vec::with_capacity(heads.len());
    for (record, plan) in decode::claimed_records(heads, receipts, &plans)? {
        let token = ctx.entropy.token();
        let Ok((writes, _)) = decide(None, &record, Request::Claim(request, &token, &plan), now) else {
            // A terminal attempt whose command is claimable: passed over.
            backend.stats.lost_claim_races.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if !limits::admits_claim(tx, &mut gates, &record, &writes, now).await? {
            continue;
        }
        match session::apply_writes(tx, Some(&record), &writes).await {
            Err(TxError::Ledger(LedgerError::Refused(refusal))) => {
                return Err(TxError::Retry(format!(
                    "postgres: a guarded claim update matched no row it held ({refusal})"
                )));
            }
            other => other?,
        }
        // The exhausted attempts' ends too: the caller commits them all and hands
        // the leases on (`Claimed::leases`).
        claimed.push(Claimed::applied(record, plan, token, &writes));
    }
    gates.store(tx, now).await?;
    let leases = claimed.iter().filter(|c| c.is_lease()).count();
    backend.stats.claims.fetch_add(leases as u64, Ordering::Relaxed);
    Ok(claimed)
}

/// The candidates' query of [`lock_claimable`]: `now` bound, or the database's clock
/// read once (the `clock` CTE) when `None`; only commands whose route `caps` can run
/// when given.
fn claimable_sql<'a>(now: Option<Timestamp>, (window, want): (u32, u32), caps: Option<&'a Capabilities>) -> Sql<'a> {
    let mut sql = Sql::new(&POSTGRES);
    let push_now = |sql: &mut Sql<'a>| match now {
        Some(t) => {
            sql.bind(Value::ts(t));
        }
        None => {
            sql.push("(SELECT now_ms FROM clock)");
        }
    };
    let push_route = |sql: &mut Sql<'a>| {
        if let Some(caps) = caps {
            write::push_route_filter(sql, "", caps);
        }
        match now {
            Some(t) => limits::push_unblocked(sql, "", t),
            None => {
                sql.push(&limits::unblocked("", "(SELECT now_ms FROM clock)"));
            }
        }
    };
    sql.push(&format!(
        "WITH clock AS MATERIALIZED (SELECT {} AS now_ms), candidate AS (",
        POSTGRES.now_ms
    ));
    sql.push("(SELECT id, attempt_id, available_at FROM command WHERE ")
        .push(&write::claimable_pending(""));
    push_now(&mut sql);
    push_route(&mut sql);
    sql.push(" ORDER BY ")
        .push(write::CLAIM_ORDER)
        .push(" LIMIT ")
        .bind(Value::Int(window.into()))
        .push(") UNION ALL (SELECT id, attempt_id, available_at FROM command WHERE ")
        .push(&write::claimable_expired(""));
    push_now(&mut sql);
    push_route(&mut sql);
    sql.push(" ORDER BY lease_until, id LIMIT ")
        .bind(Value::Int(window.into()))
        .push("))");
    sql.push(&format!(
        " SELECT {}, {}, (SELECT now_ms FROM clock), {} FROM candidate w \
         JOIN attempt a ON a.id = w.attempt_id JOIN command c ON c.id = w.id \
         ORDER BY w.available_at, w.id LIMIT ",
        ATTEMPT.column_list(Some("a")),
        COMMAND.column_list(Some("c")),
        limits::LIMIT_MODE_SQL,
    ))
    .bind(Value::Int(want.into()))
    .push(" FOR UPDATE OF a, c SKIP LOCKED");
    sql
}

/// Locks up to `want` commands claimable at `now` (bound, or the database's clock
/// when `None`) whose route `caps` can run, oldest `available_at` first, then by id,
/// with their attempts, skipping every one that another transaction holds.
///
/// The CTE picks the candidates from the two arms of the claim rule, each a range of
/// its own partial index (`command_pending`, `command_leased`), without locking them;
/// the outer query then locks, in claim order, each candidate's attempt and command
/// (`FOR UPDATE OF a, c SKIP LOCKED`) until it holds `want` of them. `SKIP LOCKED`
/// never waits, so this statement cannot take part in a deadlock whatever order it
/// takes the two rows of one candidate in. The rows come back as they are once locked
/// (READ COMMITTED re-reads a row changed since the statement's snapshot), so the
/// caller re-checks each at its `now` before it decides.
async fn lock_claimable<C: PgClient>(
    tx: &mut PgSession<C>,
    now: Option<Timestamp>,
    window_want: (u32, u32),
    caps: Option<&Capabilities>,
) -> Result<(Vec<Picked>, Timestamp), TxError> {
    let sql = claimable_sql(now, window_want, caps);
    let attempt_columns = ATTEMPT.columns.len();
    let base = attempt_columns + COMMAND.columns.len();
    let rows = tx
        .query(&sql.text, &sql.values, |r| {
            let attempt = decode::attempt(r, 0)?;
            let command = decode::command(r, attempt_columns)?;
            let now = decode::scalar(r, base, "claim: now")?;
            let limit_mode = decode::scalar(r, base + 1, "claim: limit mode")?;
            Ok((
                Picked {
                    attempt,
                    command,
                    limit_mode,
                },
                now,
            ))
        })
        .await?;
    let read_now = rows.last().map(|(_, now)| Timestamp::from_millis(*now));
    let now = match (now, read_now) {
        (Some(t), _) => t,
        (None, Some(t)) => t,
        (None, None) => session::db_now(tx).await?,
    };
    Ok((rows.into_iter().map(|(p, _)| p).collect(), now))
}
