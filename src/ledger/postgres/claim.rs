//! PostgreSQL's claim: the candidates' CTE with `FOR UPDATE SKIP LOCKED`, then the
//! shared decision and guarded writes.

use super::error::TxError;
use super::session::{PgClient, PgSession};
use super::PgBackend;
use crate::ledger::sql::decode;
use crate::ledger::sql::ledger::SqlContext;
use crate::ledger::sql::session::{self, Session};
use crate::ledger::sql::table::{ATTEMPT, COMMAND};
use crate::ledger::sql::{limits, order, write, Sql, Value, POSTGRES};
use crate::ledger::{decide, Claimed, LedgerError};
use leasehold_engine::transition::is_claimable;
use leasehold_engine::{
    Attempt, AttemptId, AttemptRecord, Capabilities, ClaimRequest, Command, LeaseToken, Plan, PlanId, Request,
    Timestamp, Writes,
};
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

/// Claims up to `request.batch` commands inside `tx`: [`claim_many`] for one request.
pub(super) async fn claim_in<C: PgClient>(
    backend: &PgBackend,
    ctx: &SqlContext,
    tx: &mut PgSession<C>,
    request: &ClaimRequest,
) -> Result<Vec<Claimed>, TxError> {
    Ok(claim_many(backend, ctx, tx, &[request])
        .await?
        .pop()
        .unwrap_or_default())
}

/// Claims for several requests at once inside `tx` (their capabilities are the
/// first's, the same for all): lock the oldest claimable commands that no other
/// transaction holds, as many as the requests want together, with their attempts
/// ([`lock_claimable`]), re-check each at the decision's now, lock their receipts,
/// read their plans, hand the candidates to the requests in turn ([`shares`]), let
/// the engine decide each with its own request (owner, lease, begin), and write them
/// under their `Claimable(now)` guards ([`write_claims`]). Answers each request's claims, in order. A
/// candidate no longer claimable once locked is a lost race (counted, never a
/// claim). The rows are locked, so a guard cannot fail; if one ever does, the whole
/// transaction is undone and tried again.
pub(super) async fn claim_many<C: PgClient>(
    backend: &PgBackend,
    ctx: &SqlContext,
    tx: &mut PgSession<C>,
    requests: &[&ClaimRequest],
) -> Result<Vec<Vec<Claimed>>, TxError> {
    let mut claimed: Vec<Vec<Claimed>> = requests.iter().map(|_| Vec::new()).collect();
    let Some(found) = candidates(backend, ctx, tx, requests).await? else {
        return Ok(claimed);
    };
    for d in decide_claims(backend, ctx, tx, requests, found).await? {
        // The exhausted attempts' ends too: the caller commits them all and hands
        // the leases on (`Claimed::leases`).
        claimed[d.request].push(Claimed::applied(d.record, d.plan, d.token, &d.writes));
    }
    let leases = claimed.iter().flatten().filter(|c| c.is_lease()).count();
    backend.stats.claims.fetch_add(leases as u64, Ordering::Relaxed);
    Ok(claimed)
}

/// The candidates of a claim, locked, as records with their plans, and what deciding
/// them needs; `None` when none is claimable.
struct Found {
    records: Vec<(AttemptRecord, Plan)>,
    gates: limits::Gates,
    /// No candidate's target is limited.
    unlimited: bool,
    now: Timestamp,
}

/// Locks as many claimable commands as `requests` want together, with their
/// attempts and receipts, and reads their plans and their targets' gates.
async fn candidates<C: PgClient>(
    backend: &PgBackend,
    ctx: &SqlContext,
    tx: &mut PgSession<C>,
    requests: &[&ClaimRequest],
) -> Result<Option<Found>, TxError> {
    let want: u32 = requests.iter().map(|r| r.batch).sum();
    let window = want
        .saturating_mul(CLAIM_SPREAD)
        .clamp(CLAIM_WINDOW_MIN, CLAIM_WINDOW_MAX)
        .max(want);
    let caps = requests.first().and_then(|r| r.capabilities.as_ref());
    let at = ctx.clock.as_ref().map(|c| c.now());
    let (picked, now) = lock_claimable(tx, at, (window, want), caps).await?;
    let (heads, lost): (Vec<_>, Vec<_>) = picked.into_iter().partition(|p| is_claimable(&p.command, now));
    backend
        .stats
        .lost_claim_races
        .fetch_add(lost.len() as u64, Ordering::Relaxed);
    if heads.is_empty() {
        return Ok(None);
    }
    let modes: Vec<(&str, i64)> = heads
        .iter()
        .map(|p| (p.command.target.as_str(), p.limit_mode))
        .collect();
    let unlimited = modes.iter().all(|(_, mode)| *mode == 0);
    let gates = limits::claim_gates(tx, &modes, now).await?;
    let heads: Vec<(Attempt, Command)> = heads.into_iter().map(|p| (p.attempt, p.command)).collect();
    let ids: Vec<&AttemptId> = heads.iter().map(|(a, _)| &a.id).collect();
    let receipts = session::lock_receipts_of(tx, &ids).await?;
    let mut plan_ids: Vec<&PlanId> = heads.iter().map(|(a, _)| &a.plan_id).collect();
    plan_ids.sort();
    plan_ids.dedup();
    let plans = session::read_plans_by_id(tx, &plan_ids).await?;
    let records = decode::claimed_records(heads, receipts, &plans)?;
    Ok(Some(Found {
        records,
        gates,
        unlimited,
        now,
    }))
}

/// Decides each candidate with the request it goes to ([`shares`]), admits it under
/// its target's limits and writes it ([`write_claims`]); answers the claims written.
async fn decide_claims<C: PgClient>(
    backend: &PgBackend,
    ctx: &SqlContext,
    tx: &mut PgSession<C>,
    requests: &[&ClaimRequest],
    found: Found,
) -> Result<Vec<Decided>, TxError> {
    let Found {
        records,
        mut gates,
        unlimited,
        now,
    } = found;
    let mut decided = Vec::with_capacity(records.len());
    for ((record, plan), i) in records.into_iter().zip(shares(requests)) {
        let token = ctx.entropy.token();
        let Ok((writes, _)) = decide(None, &record, Request::Claim(requests[i], &token, &plan), now) else {
            // A terminal attempt whose command is claimable: passed over.
            backend.stats.lost_claim_races.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if !limits::admits_claim(tx, &mut gates, &record, &writes, now).await? {
            continue;
        }
        let d = Decided {
            request: i,
            record,
            plan,
            token,
            writes,
        };
        // A limited target's next admission reads what this claim wrote.
        if !unlimited {
            write_claims(tx, std::slice::from_ref(&d), false).await?;
        }
        decided.push(d);
    }
    if unlimited {
        write_claims(tx, &decided, true).await?;
    }
    gates.store(tx, now).await?;
    Ok(decided)
}

/// A claim the engine decided and the limits admitted, not yet written.
struct Decided {
    /// The place of its request.
    request: usize,
    record: AttemptRecord,
    plan: Plan,
    token: LeaseToken,
    writes: Writes,
}

/// Writes claims, each under its `Claimable(now)` guard: `at_once`, the statements of
/// all of them together (pipelined, one round trip; for claims onto targets without
/// limits, which no admission reads back), then what each ending attempt's order key
/// follows; otherwise each claim's in turn. The rows are locked, so a guard cannot fail; if one ever
/// does, the transaction is tried again.
async fn write_claims<C: PgClient>(tx: &mut PgSession<C>, decided: &[Decided], at_once: bool) -> Result<(), TxError> {
    let result = if at_once {
        write_at_once(tx, decided).await
    } else {
        write_in_turn(tx, decided).await
    };
    match result {
        Err(TxError::Ledger(LedgerError::Refused(refusal))) => Err(TxError::Retry(format!(
            "postgres: a guarded claim update matched no row it held ({refusal})"
        ))),
        other => other,
    }
}

async fn write_at_once<C: PgClient>(tx: &mut PgSession<C>, decided: &[Decided]) -> Result<(), TxError> {
    let mut statements = Vec::new();
    for d in decided {
        statements.extend(write::plan(tx.dialect(), Some(&d.record), &d.writes)?);
    }
    tx.run(&statements).await?;
    for d in decided {
        order::follow_order(tx, &d.record, &d.writes).await?;
    }
    Ok(())
}

async fn write_in_turn<C: PgClient>(tx: &mut PgSession<C>, decided: &[Decided]) -> Result<(), TxError> {
    for d in decided {
        session::apply_writes(tx, Some(&d.record), &d.writes).await?;
    }
    Ok(())
}

/// Which request each candidate of a claim goes to, in claim order: the requests in
/// turn, each until it has its batch (batches 2, 1, 3: 0, 1, 2, 0, 2, 2).
fn shares<'a>(requests: &'a [&'a ClaimRequest]) -> impl Iterator<Item = usize> + 'a {
    let rounds = requests.iter().map(|r| r.batch).max().unwrap_or(0);
    (0..rounds).flat_map(move |round| (0..requests.len()).filter(move |&i| requests[i].batch > round))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(batch: u32) -> ClaimRequest {
        ClaimRequest {
            batch,
            ..ClaimRequest::default()
        }
    }

    #[test]
    fn candidates_go_to_the_requests_in_turn_each_up_to_its_batch() {
        let (a, b, c) = (batch(2), batch(1), batch(3));
        assert_eq!(shares(&[&a, &b, &c]).collect::<Vec<_>>(), [0, 1, 2, 0, 2, 2]);
        assert_eq!(shares(&[&b]).collect::<Vec<_>>(), [0]);
        assert_eq!(shares(&[&batch(0), &b]).collect::<Vec<_>>(), [1]);
        assert_eq!(shares(&[]).count(), 0);
    }
}
