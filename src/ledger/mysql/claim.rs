//! MySQL's claims: `SKIP LOCKED` through a window of candidates inside one
//! transaction, or, on a server without it, the portable path (a plain list of
//! candidates, then a transaction that locks and re-checks each). Either way the
//! engine decides each claim on the rows as locked and the batch is written with one
//! `UPDATE` per table under the shared `Claimable(now)` guard
//! ([`crate::ledger::sql::batch`]).

use super::error::{classify, Phase, TxError};
use super::session::{MyConn, MySession};
use super::MyBackend;
use crate::ledger::sql::batch::apply_writes_batch;
use crate::ledger::sql::decode;
use crate::ledger::sql::ledger::{retry, SqlContext, TxKind};
use crate::ledger::sql::query::queries;
use crate::ledger::sql::session::{self, query_one, Session};
use crate::ledger::sql::table::{ATTEMPT, COMMAND};
use crate::ledger::sql::{limits, write, Sql, Value, MYSQL};
use crate::ledger::{decide, Claimed, LedgerError};
use leasehold_engine::transition::is_claimable;
use leasehold_engine::{
    Attempt, AttemptId, AttemptRecord, Capabilities, ClaimRequest, Command, CommandId, Plan, PlanId, Request,
    Timestamp, Writes,
};
use std::sync::atomic::Ordering;

/// The most candidates a claim looks at in one window (unless its batch is larger).
pub(super) const CLAIM_WINDOW_MAX: u32 = 1_000;
/// Server errors that mean "no `SKIP LOCKED` here": a parse error (1064, and 1149 of
/// old servers) or a feature not supported yet (1235).
const SKIP_LOCKED_UNSUPPORTED: &[u16] = &[1064, 1149, 1235];

/// The database clock's now, in milliseconds since the Unix epoch.
const NOW_SQL: &str = MYSQL.now_ms;

/// The ledger's transaction on a pooled connection.
type Tx<'c> = MySession<MyConn<'c>>;

/// What the server's answer to the `SKIP LOCKED` probe says: it ran (yes), it did not
/// parse or is not supported (no), or some other error (that error, classified).
pub(super) fn skip_locked_answer(probed: Result<(), mysql_async::Error>) -> Result<bool, TxError> {
    match probed {
        Ok(()) => Ok(true),
        Err(mysql_async::Error::Server(e)) if SKIP_LOCKED_UNSUPPORTED.contains(&e.code) => Ok(false),
        Err(e) => Err(classify(&e, Phase::Statement)),
    }
}

/// Whether the server understands `SELECT … FOR UPDATE SKIP LOCKED`: asks it once,
/// with a statement that reads nothing. A parse error (MySQL 5.7, MariaDB before
/// 10.6) or "not supported" answers no; any other error is the error.
pub(super) async fn probe_skip_locked_once(backend: &MyBackend) -> Result<bool, TxError> {
    use mysql_async::prelude::Queryable;
    let mut conn = backend.connect().await?;
    let probed = conn
        .query_drop("SELECT id FROM command WHERE 1 = 0 FOR UPDATE SKIP LOCKED")
        .await;
    skip_locked_answer(probed)
}

/// One command the portable claim may take.
#[derive(Debug, Clone)]
struct Candidate {
    command: CommandId,
    attempt: AttemptId,
    plan: PlanId,
}

/// Up to `limit` commands claimable at `now` whose route `caps` can run, oldest
/// `available_at` first (then by id); a plain read that locks nothing. Each arm of the `UNION` is a range scan of
/// its own index (`command_claimable`, `command_expired`).
async fn claim_candidates<S: Session>(
    s: &mut S,
    now: Timestamp,
    limit: u32,
    caps: Option<&Capabilities>,
) -> Result<Vec<Candidate>, TxError> {
    let mut sql = Sql::new(&MYSQL);
    candidates_sql(&mut sql, now, limit, caps);
    s.query(&sql.text, &sql.values, |row| {
        Ok(Candidate {
            command: decode::command_id(row, 0)?,
            attempt: AttemptId::new(decode::string(row, 1, "claim candidate")?),
            plan: PlanId::new(decode::string(row, 2, "claim candidate")?),
        })
    })
    .await
}

/// The statement of [`claim_candidates`].
fn candidates_sql<'a>(sql: &mut Sql<'a>, now: Timestamp, limit: u32, caps: Option<&'a Capabilities>) {
    let arm = |sql: &mut Sql<'a>, condition: &str, order: &str| {
        sql.push(
            "(SELECT c.id, c.attempt_id, a.plan_id, c.available_at FROM command c \
             JOIN attempt a ON a.id = c.attempt_id WHERE ",
        )
        .push(condition)
        .bind(Value::ts(now));
        if let Some(caps) = caps {
            write::push_route_filter(sql, "c.", caps);
        }
        limits::push_unblocked(sql, "c", now);
        sql.push(" ORDER BY ")
            .push(order)
            .push(" LIMIT ")
            .bind(Value::Int(limit.into()))
            .push(")");
    };
    sql.push("SELECT id, attempt_id, plan_id FROM (");
    arm(sql, &write::claimable_pending("c."), "c.available_at, c.id");
    sql.push(" UNION ALL ");
    arm(sql, &write::claimable_expired("c."), "c.lease_until, c.id");
    sql.push(") AS candidate ORDER BY ")
        .push(write::CLAIM_ORDER)
        .push(" LIMIT ")
        .bind(Value::Int(limit.into()));
}

/// Where a statement takes its `now` from.
#[derive(Debug, Clone, Copy)]
enum NowSql {
    /// The database's clock, read by the statement itself ([`NOW_SQL`]; constant
    /// within one statement).
    Db,
    /// A time the ledger already holds, bound as a parameter.
    At(Timestamp),
}

impl NowSql {
    fn of(now: Option<Timestamp>) -> Self {
        now.map_or(NowSql::Db, NowSql::At)
    }

    /// Appends this `now` to a statement.
    fn push(self, sql: &mut Sql<'_>) {
        match self {
            NowSql::Db => {
                sql.push(NOW_SQL);
            }
            NowSql::At(t) => {
                sql.bind(Value::ts(t));
            }
        }
    }
}

/// The position of a command in the claim order: its `available_at`, then its id.
type ClaimKey = (Timestamp, CommandId);

/// A claim window's width, and the capabilities its commands' routes must meet.
type Window<'a> = (u32, Option<&'a Capabilities>);

/// Appends the claim window: up to `window` commands claimable at `now` that come
/// after `after` in the claim order, oldest first — a plain, non-locking read. Each
/// arm of the `UNION` is a range scan of its own index: `command_claimable`, which
/// covers the window (migration 2) and is already in its order, and
/// `command_expired`, whose few expired leases are sorted.
fn push_claim_window<'a>(sql: &mut Sql<'a>, now: NowSql, after: Option<&'a ClaimKey>, (window, caps): Window<'a>) {
    let arm = |sql: &mut Sql<'a>, index: &str, condition: &str| {
        sql.push("(SELECT id, attempt_id, available_at FROM command FORCE INDEX (")
            .push(index)
            .push(") WHERE ")
            .push(condition);
        now.push(sql);
        if let Some(caps) = caps {
            write::push_route_filter(sql, "", caps);
        }
        match now {
            NowSql::Db => {
                sql.push(&limits::unblocked("", NOW_SQL));
            }
            NowSql::At(t) => limits::push_unblocked(sql, "", t),
        }
        if let Some((at, id)) = after {
            sql.push(" AND (available_at > ")
                .bind(Value::ts(*at))
                .push(" OR (available_at = ")
                .bind(Value::ts(*at))
                .push(" AND id > ")
                .bind(Value::Text(id.as_str()))
                .push("))");
        }
        sql.push(" ORDER BY ")
            .push(write::CLAIM_ORDER)
            .push(" LIMIT ")
            .bind(Value::Int(window.into()))
            .push(")");
    };
    sql.push("SELECT id, attempt_id, available_at FROM (");
    arm(sql, "command_claimable", &write::claimable_pending(""));
    sql.push(" UNION ALL ");
    arm(sql, "command_expired", &write::claimable_expired(""));
    sql.push(") AS claimable ORDER BY ")
        .push(write::CLAIM_ORDER)
        .push(" LIMIT ")
        .bind(Value::Int(window.into()));
}

/// A command a claim locked, with its attempt, as they are now (locked).
#[derive(Debug)]
struct Picked {
    /// The attempt, locked.
    attempt: Attempt,
    /// Its command, locked: the latest committed version, which may no longer be
    /// claimable (a race lost to a claimer that committed after this claim read its
    /// window).
    command: Command,
    /// The `now` the statement decided with.
    now: Timestamp,
    /// The command's place in the claim order, as the window saw it.
    key: ClaimKey,
    /// Its target's limit mode when the row was read ([`limits::LIMIT_MODE_SQL`]).
    limit_mode: i64,
}

/// Locks up to `want` of the claim window's commands, oldest first, skipping every
/// one whose attempt or command another transaction holds (`SKIP LOCKED`, MariaDB
/// 10.6+ / MySQL 8.0.1+), and answers them as locked.
///
/// Lock order: the window is a derived table, read without locks (MariaDB does not
/// lock the rows of a materialized derived table for the outer `FOR UPDATE`, and MySQL
/// 8 documents that an outer locking clause does not lock the tables of a subquery);
/// the outer join, its order fixed by `STRAIGHT_JOIN`, then locks each
/// candidate's attempt and only after it its command — attempt before command, as
/// everywhere. Both are primary-key lookups (`FORCE INDEX (PRIMARY)`: on a small table
/// the optimizer would rather scan `attempt` through a join buffer, which sorts after
/// the join — locking every candidate, not `want` of them — and which MariaDB 10.11
/// answers with no rows at all when `SKIP LOCKED` skipped one). Row locks by primary
/// key take no gap locks, and `SKIP LOCKED` never waits, so this statement waits on no
/// one. The sort is of the window alone, so the `LIMIT` stops the join after `want`
/// rows: the rest of the window stays unlocked.
async fn lock_claimable<S: Session>(
    s: &mut S,
    now: NowSql,
    after: Option<&ClaimKey>,
    window: Window<'_>,
    want: u32,
) -> Result<Vec<Picked>, TxError> {
    let mut sql = Sql::new(&MYSQL);
    sql.push(&format!(
        "SELECT {}, {}, ",
        ATTEMPT.column_list(Some("a")),
        COMMAND.column_list(Some("c"))
    ));
    now.push(&mut sql);
    sql.push(&format!(
        " AS now, w.available_at, {} AS limit_mode FROM (",
        limits::LIMIT_MODE_SQL
    ));
    push_claim_window(&mut sql, now, after, window);
    sql.push(
        ") AS w STRAIGHT_JOIN attempt a FORCE INDEX (PRIMARY) ON a.id = w.attempt_id \
         STRAIGHT_JOIN command c FORCE INDEX (PRIMARY) ON c.id = w.id",
    );
    sql.push(" ORDER BY w.available_at, w.id LIMIT ")
        .bind(Value::Int(want.into()))
        .push(" FOR UPDATE SKIP LOCKED");
    let (attempt_columns, base) = (ATTEMPT.columns.len(), ATTEMPT.columns.len() + COMMAND.columns.len());
    s.query(&sql.text, &sql.values, move |row| {
        let attempt = decode::attempt(row, 0)?;
        let command = decode::command(row, attempt_columns)?;
        let now = Timestamp::from_millis(decode::scalar(row, base, "claim: now")?);
        let at = Timestamp::from_millis(decode::scalar(row, base + 1, "claim: available_at")?);
        let key = (at, command.id.clone());
        let limit_mode = decode::scalar(row, base + 2, "claim: limit mode")?;
        Ok(Picked {
            attempt,
            command,
            now,
            key,
            limit_mode,
        })
    })
    .await
}

/// The last command of a full claim window after `after` (a plain read), with the
/// statement's `now`; `None` when the window holds fewer than `window` commands, so
/// that nothing claimable lies beyond it.
async fn claim_window_end<S: Session>(
    s: &mut S,
    now: NowSql,
    after: Option<&ClaimKey>,
    window: Window<'_>,
) -> Result<Option<(ClaimKey, Timestamp)>, TxError> {
    let mut sql = Sql::new(&MYSQL);
    sql.push("SELECT w.available_at, w.id, ");
    now.push(&mut sql);
    sql.push(" FROM (");
    push_claim_window(&mut sql, now, after, window);
    sql.push(") AS w ORDER BY w.available_at, w.id LIMIT 1 OFFSET ")
        .bind(Value::Int(window.0.saturating_sub(1).into()));
    query_one(s, &sql.text, &sql.values, |row| {
        let at = Timestamp::from_millis(decode::scalar(row, 0, "claim window: available_at")?);
        let id = decode::command_id(row, 1)?;
        let now = Timestamp::from_millis(decode::scalar(row, 2, "claim window: now")?);
        Ok(((at, id), now))
    })
    .await
}

/// What a claim's windows yielded: the commands held and claimable, the races lost,
/// and the decision's now (`None`: nothing was read).
struct Held {
    heads: Vec<(Attempt, Command)>,
    lost: u64,
    now: Option<Timestamp>,
    /// The targets of the held commands, with their limit modes as read.
    modes: Vec<TargetMode>,
}

/// Locks up to `batch` claimable commands through widening windows: when a window
/// yields fewer than wanted and was full, the claim looks again through a window
/// twice as wide (at most [`CLAIM_WINDOW_MAX`], then the next one), until a window is
/// not full: the queue ends there. A clock given to the ledger decides; else the
/// first statement's `now` does, for every later statement too, so the batch shares
/// one guard.
async fn lock_windows(
    tx: &mut Tx<'_>,
    (batch, base_window): (u32, u32),
    now: Option<Timestamp>,
    caps: Option<&Capabilities>,
) -> Result<Held, TxError> {
    let window_max = CLAIM_WINDOW_MAX.max(batch);
    let mut held = Held {
        heads: Vec::new(),
        lost: 0,
        now,
        modes: Vec::new(),
    };
    let (mut after, mut window): (Option<ClaimKey>, u32) = (None, base_window);
    while held.heads.len() < batch as usize {
        let want = batch - held.heads.len() as u32;
        let picked = lock_claimable(tx, NowSql::of(held.now), after.as_ref(), (window, caps), want).await?;
        let looked_through = picked.len() < want as usize;
        for p in picked {
            let decide_at = *held.now.get_or_insert(p.now);
            after = Some(p.key);
            if is_claimable(&p.command, decide_at) {
                held.modes.push((p.command.target.clone(), p.limit_mode));
                held.heads.push((p.attempt, p.command));
            } else {
                held.lost += 1;
            }
        }
        if held.heads.len() >= batch as usize || !looked_through {
            continue;
        }
        // Every command of the window was taken or held by others. Look further only
        // if there is more: a wider window from the same place (or, at the widest,
        // the next window), so that no command nobody holds is passed over.
        let Some((end, db_now)) = claim_window_end(tx, NowSql::of(held.now), after.as_ref(), (window, caps)).await?
        else {
            break;
        };
        held.now.get_or_insert(db_now);
        if window >= window_max {
            after = Some(end);
        }
        window = window.saturating_mul(2).min(window_max);
    }
    Ok(held)
}

/// Claims up to `batch` commands inside `tx` with `SKIP LOCKED`: lock the oldest
/// claimable commands (each attempt, then its command) that no other transaction
/// holds ([`lock_windows`]), re-check each at the decision's now, lock their
/// receipts, read their plans, let the engine decide, and write every claim with one
/// `UPDATE` per table under the shared `Claimable(now)` guard: eight round trips
/// whatever the batch (isolation level, begin, lock, receipts, plans, command and
/// attempt writes, commit), one more where the claims change receipts.
///
/// The candidates come from a window of `batch × claim_spread` commands in claim
/// order, read as the rows are now (the claim's transaction runs at READ
/// UNCOMMITTED, [`MyBackend::begin`]). A row that another claimer wrote and committed
/// between this claim's read of the window and its lock is locked, found no longer
/// claimable and counted as a lost race; it never counts as a claim.
///
/// This transaction never waits for a lock: `SKIP LOCKED` never waits, and every
/// later statement touches only rows of attempts it already holds, which every other
/// transaction locks only after their attempt (the lock order), so it cannot take
/// part in a deadlock.
pub(super) async fn claim_skip_locked(
    backend: &MyBackend,
    ctx: &SqlContext,
    tx: &mut Tx<'_>,
    request: &ClaimRequest,
) -> Result<Vec<Claimed>, TxError> {
    let batch = request.batch;
    let spread = backend.url.options.claim_spread.max(1);
    let base_window = batch.saturating_mul(spread).clamp(batch, CLAIM_WINDOW_MAX.max(batch));
    #[cfg(test)]
    super::hooks::pause_at(&backend.hooks.pause).await;
    let at = ctx.clock.as_ref().map(|c| c.now());
    let held = lock_windows(tx, (batch, base_window), at, request.capabilities.as_ref()).await?;
    backend.stats.lost_claim_races.fetch_add(held.lost, Ordering::Relaxed);
    let Some(now) = held.now.filter(|_| !held.heads.is_empty()) else {
        return Ok(Vec::new());
    };
    #[cfg(test)]
    super::hooks::pause_at(&backend.hooks.pause_holding).await;
    let ids: Vec<&AttemptId> = held.heads.iter().map(|(a, _)| &a.id).collect();
    let receipts = session::lock_receipts_of(tx, &ids).await?;
    // Plans are immutable but for their status, which a claim does not look at: a
    // plain read.
    let mut plan_ids: Vec<&PlanId> = held.heads.iter().map(|(a, _)| &a.plan_id).collect();
    plan_ids.sort();
    plan_ids.dedup();
    let plans = session::read_plans_by_id(tx, &plan_ids).await?;
    let modes = held.modes;
    let records = decode::claimed_records(held.heads, receipts, &plans)?;
    write_claims(backend, ctx, tx, (records, Some(&modes)), request, now).await
}

/// A held command's target with its limit mode as the claim read it
/// ([`limits::LIMIT_MODE_SQL`]).
type TargetMode = (String, i64);

/// Lets the engine decide the claim of every held record at `now` and writes the
/// claims with one `UPDATE` per table under their shared `Claimable(now)` guard;
/// answers the claims as written. A record the engine refuses (a terminal attempt
/// whose command is claimable) is passed over and counted as lost. The rows are
/// locked, so the guard cannot fail; if it ever does, the whole transaction is
/// undone and tried again ([`TxError::Retry`]). Each claim's lease must be admitted
/// by its target's limits ([`limits::admits_claim`]); `modes` are the held
/// commands' targets with their limit modes as the claim's reads found them
/// (`None`: unknown, every row is read exclusively).
async fn write_claims(
    backend: &MyBackend,
    ctx: &SqlContext,
    tx: &mut Tx<'_>,
    (held, modes): (Vec<(AttemptRecord, Plan)>, Option<&[TargetMode]>),
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Vec<Claimed>, TxError> {
    let stats = &backend.stats;
    let mut decided = Vec::with_capacity(held.len());
    // Without modes (the portable claim), every target's row is read exclusively.
    let modes: Vec<(&str, i64)> = match modes {
        Some(modes) => modes.iter().map(|(t, m)| (t.as_str(), *m)).collect(),
        None => held.iter().map(|(r, _)| (r.command.target.as_str(), 3)).collect(),
    };
    let mut gates = limits::claim_gates(tx, &modes, now).await?;
    for (record, plan) in held {
        let token = ctx.entropy.token();
        match decide(None, &record, Request::Claim(request, &token, &plan), now) {
            Ok((writes, _)) => {
                if limits::admits_claim(tx, &mut gates, &record, &writes, now).await? {
                    decided.push((record, plan, token, writes));
                }
            }
            Err(_) => {
                stats.lost_claim_races.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    gates.store(tx, now).await?;
    let all: Vec<(&AttemptRecord, &Writes)> = decided.iter().map(|(r, _, _, w)| (r, w)).collect();
    match apply_writes_batch(tx, &all).await {
        Err(TxError::Ledger(LedgerError::Refused(refusal))) => {
            stats.refused_claim_updates.fetch_add(1, Ordering::Relaxed);
            return Err(TxError::Retry(format!(
                "mysql: a guarded claim update matched fewer rows than it held ({refusal})"
            )));
        }
        other => other?,
    }
    // Every claim as written, the exhausted attempts' ends among them: the caller
    // commits them all and hands the leases on (`Claimed::leases`).
    let claimed: Vec<Claimed> = decided
        .into_iter()
        .map(|(record, plan, token, writes)| Claimed::applied(record, plan, token, &writes))
        .collect();
    stats.claims.fetch_add(
        claimed.iter().filter(|c| c.is_lease()).count() as u64,
        Ordering::Relaxed,
    );
    Ok(claimed)
}

/// The portable claim (MySQL 5.7, or `skip_locked=0`): a plain read lists up to
/// `batch × claim_spread` claimable commands, oldest first; the claimer starts at a
/// random one of them (so that concurrent claimers mostly take different rows) and,
/// in one transaction, for each candidate in list order locks its attempt and command
/// (a held one is waited for), and re-checks it at the database's now. The
/// candidates before the start, tried only when races were lost, are a second
/// transaction.
pub(super) async fn claim_portable(
    backend: &MyBackend,
    ctx: &SqlContext,
    request: &ClaimRequest,
) -> Result<Vec<Claimed>, LedgerError> {
    let batch = request.batch;
    let spread = backend.url.options.claim_spread.max(1);
    let window = batch.saturating_mul(spread).min(CLAIM_WINDOW_MAX);
    let caps = request.capabilities.as_ref();
    let candidates = retry(ctx, || candidates_once(backend, ctx, window, caps)).await?;
    #[cfg(test)]
    super::hooks::pause_at(&backend.hooks.pause).await;
    let start = match candidates.len().checked_sub(batch as usize) {
        Some(room) if spread > 1 && room > 0 => (ctx.entropy.next_u64() % (room as u64 + 1)) as usize,
        _ => 0,
    };
    let (head, tail) = candidates.split_at(start);
    let mut claimed: Vec<Claimed> = Vec::new();
    for part in [tail, head] {
        let want = (batch as usize).saturating_sub(claimed.len());
        if want == 0 || part.is_empty() {
            continue;
        }
        match retry(ctx, || candidates_claim_once(backend, ctx, part, request, want)).await {
            Ok(b) => claimed.extend(b),
            // The leases already committed are real: hand them to the worker.
            Err(_) if !claimed.is_empty() => break,
            Err(e) => return Err(e),
        }
    }
    Ok(claimed)
}

/// Lists up to `limit` claimable commands whose route `caps` can run, oldest first
/// (a plain read that locks nothing).
async fn candidates_once(
    backend: &MyBackend,
    ctx: &SqlContext,
    limit: u32,
    caps: Option<&Capabilities>,
) -> Result<Vec<Candidate>, TxError> {
    let mut conn = backend.connect().await?;
    let mut s = MySession(MyConn::Single(&mut conn));
    let now = match &ctx.clock {
        Some(clock) => clock.now(),
        None => session::db_now(&mut s).await?,
    };
    claim_candidates(&mut s, now, limit, caps).await
}

/// Claims up to `want` of `candidates` in one transaction, in their order (the
/// claimers' common order, so that two claimers never wait on each other in a
/// cycle): for each, lock its attempt and command, check it is still claimable at
/// the database's now, lock its receipts, let the engine decide, and write under
/// the engine's `Claimable(now)` guard. One commit for the whole batch.
async fn candidates_claim_once(
    backend: &MyBackend,
    ctx: &SqlContext,
    candidates: &[Candidate],
    request: &ClaimRequest,
    want: usize,
) -> Result<Vec<Claimed>, TxError> {
    // Every race lost needs one more candidate; twice the batch is plenty.
    let candidates = &candidates[..candidates.len().min(want.saturating_mul(2))];
    let mut conn = backend.connect().await?;
    // Plans are immutable but for their status, which a claim does not look at: read
    // them before the transaction, so that it holds its locks shorter.
    let mut ids: Vec<&PlanId> = candidates.iter().map(|c| &c.plan).collect();
    ids.sort();
    ids.dedup();
    let plans = session::read_plans_by_id(&mut MySession(MyConn::Single(&mut conn)), &ids).await?;
    let mut tx = backend.begin_tx(&mut conn, TxKind::Write).await?;
    let result = async {
        let (held, now) = lock_candidates(backend, ctx, &mut tx, candidates, &plans, want).await?;
        // Decide every claim at the latest now, read once its rows were locked: a
        // command claimable at an earlier now still is, and one guard lets the writes
        // go out as one statement per table.
        match now {
            Some(now) => write_claims(backend, ctx, &mut tx, (held, None), request, now).await,
            None => Ok(Vec::new()),
        }
    }
    .await;
    // A claim that took nothing wrote nothing: it only releases its locks. (The shared
    // `end_claim`, spelled with MySQL's own transaction type: through the backend's
    // generic one rustc cannot yet prove this future `Send`, rust-lang/rust#100013.)
    match result {
        Ok(claimed) if !claimed.is_empty() => super::commit_tx(tx, TxKind::Write)
            .await
            .map(|()| Claimed::leases(claimed)),
        other => {
            super::rollback_tx(tx).await;
            other
        }
    }
}

/// Locks each candidate's attempt, command and receipts in list order until `want`
/// are held and claimable; answers them with the latest now read.
async fn lock_candidates(
    backend: &MyBackend,
    ctx: &SqlContext,
    tx: &mut Tx<'_>,
    candidates: &[Candidate],
    plans: &std::collections::BTreeMap<PlanId, Plan>,
    want: usize,
) -> Result<(Vec<(AttemptRecord, Plan)>, Option<Timestamp>), TxError> {
    let mut held = Vec::new();
    let mut latest: Option<Timestamp> = None;
    for candidate in candidates {
        if held.len() >= want {
            break;
        }
        let Some(plan) = plans.get(&candidate.plan) else {
            continue;
        };
        let head = lock_head(tx, &candidate.attempt).await?;
        let Some((attempt, command, db_now)) = head else {
            backend.stats.lost_claim_races.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let now = ctx.clock.as_ref().map_or(db_now, |c| c.now());
        if command.id != candidate.command || !is_claimable(&command, now) {
            backend.stats.lost_claim_races.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        latest = Some(latest.map_or(now, |l| l.max(now)));
        let receipts = session::read_receipts(tx, &attempt.id, true).await?;
        let record = AttemptRecord {
            attempt,
            command,
            receipts,
        };
        held.push((record, plan.clone()));
    }
    Ok((held, latest))
}

/// An attempt and its command, locked in that order, with the database clock's now
/// read once both are held (so a lock wait does not age it).
async fn lock_head<S: Session>(s: &mut S, id: &AttemptId) -> Result<Option<(Attempt, Command, Timestamp)>, TxError> {
    let key = [Value::Text(id.as_str())];
    let sql = &queries(&MYSQL).attempt_by_id_locked;
    let Some(attempt) = query_one(s, sql, &key, |r| decode::attempt(r, 0)).await? else {
        return Ok(None);
    };
    let sql = format!(
        "SELECT {}, {NOW_SQL} FROM command WHERE attempt_id = ? FOR UPDATE",
        COMMAND.column_list(None)
    );
    let (command, now) = query_one(s, &sql, &key, |row| {
        let command = decode::command(row, 0)?;
        let now = decode::scalar(row, COMMAND.columns.len(), "the database's now")?;
        Ok((command, Timestamp::from_millis(now)))
    })
    .await?
    .ok_or_else(|| decode::no_command(id))?;
    Ok(Some((attempt, command, now)))
}
