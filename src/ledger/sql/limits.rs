//! Per-target limits on a SQL ledger ([`crate::ledger::limits`]): the
//! `target_limit` rows, the gates a transaction admits leases through, and the
//! candidate filter that leaves blocked targets out of a claim.
//!
//! A transaction that admits leases onto targets reads their rows, in target
//! order: without a lock where only `max_in_flight` is at stake, shared (`FOR
//! SHARE`) where a closed breaker is too, so concurrent claimers onto one target do
//! not wait for each other; exclusive (`FOR UPDATE`) for a rate (its log of entries
//! is the row), a half-open breaker (one probe), and for every write that records
//! an outcome.
//! `max_in_flight` is kept by the target's slots ([`super::slots`]): an entry takes
//! a free slot, locked with `SKIP LOCKED`, so no two transactions take the same one
//! and the live leases never outnumber the slots. SQLite's write transaction holds
//! the whole database, so there every read is exclusive. Nothing that holds a
//! target's row waits for a command row (claims skip locked rows), so the lock takes
//! part in no deadlock but an upgrade from shared to exclusive, which the database
//! detects and the ledger tries again.

use super::decode::{self, ColumnReader};
use super::session::Session;
use super::write::{Expect, Statement};
use super::{placeholders, slots, Dialect, Sql, TxError, Value};
use crate::ledger::limits::{self as shared, TargetRow};
use crate::ledger::LedgerError;
use leasehold_engine::limits::{self, Blocked, Breaker, BreakerState, Load, Outcome, Rate, TargetLimit};
use leasehold_engine::{AttemptRecord, CommandId, LeaseToken, Reply, Timestamp, WorkerRequest, Writes};
use std::collections::BTreeMap;
use std::sync::Arc;

const COLUMNS: &str = "target, max_in_flight, rate_count, rate_per_ms, breaker_failures, breaker_cooldown_ms, \
                       recent, failures, open_until, probe, blocked_until";

/// A limited target inside a transaction: its row as read, its load, its free
/// slots locked so far, the slots it gave, and what it read (to write back only a
/// change).
struct Gate {
    limit: TargetLimit,
    load: Load,
    blocked_until: Option<Timestamp>,
    read_as: (Load, Option<Timestamp>),
    /// Free slots locked by this transaction, not given yet.
    slots: Vec<i64>,
    /// Slots given in this transaction, to their commands.
    held: Vec<(i64, CommandId)>,
    /// Whether a search for more free slots found none.
    exhausted: bool,
}

impl Gate {
    fn changed(&self) -> bool {
        let (load, blocked) = &self.read_as;
        (
            &self.load.recent,
            self.load.failures,
            self.load.open_until,
            &self.load.probe,
            self.blocked_until,
        ) != (&load.recent, load.failures, load.open_until, &load.probe, *blocked)
    }

    /// Whether admitting onto the target needs its row exclusively: a rate, or a
    /// half-open breaker.
    fn needs_exclusive(&self, now: Timestamp) -> bool {
        self.limit.rate.is_some() || self.limit.breaker_state(&self.load, now) == BreakerState::HalfOpen
    }
}

/// How a transaction locks the limit rows it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lock {
    /// None: admissions by `max_in_flight` alone (its slots are locked, not the row).
    None,
    /// Shared: admissions by `max_in_flight` and a closed breaker.
    Share,
    /// Exclusive.
    Update,
}

/// The gates of the targets one transaction admits leases onto or records outcomes
/// for; a target without a row is not limited.
#[derive(Default)]
pub(crate) struct Gates {
    read: BTreeMap<String, Option<Gate>>,
}

/// A limit row: the limit, its stored load, its block.
type Row = (TargetLimit, Load, Option<Timestamp>);

fn parse_row(row: &mut dyn ColumnReader) -> Result<Row, LedgerError> {
    let int = |row: &mut dyn ColumnReader, i: usize, what: &str| decode::opt_scalar(row, i, what);
    let target = decode::string(row, 0, "target_limit: target")?;
    let max = int(row, 1, "target_limit: max_in_flight")?;
    let rate = match (
        int(row, 2, "target_limit: rate_count")?,
        int(row, 3, "target_limit: rate_per_ms")?,
    ) {
        (Some(count), Some(per_ms)) => Some(Rate {
            count: count as u32,
            per_ms: per_ms as u64,
        }),
        _ => None,
    };
    let breaker = match (
        int(row, 4, "target_limit: breaker_failures")?,
        int(row, 5, "target_limit: breaker_cooldown_ms")?,
    ) {
        (Some(failures), Some(cooldown)) => Some(Breaker {
            failures: failures as u32,
            cooldown_ms: cooldown as u64,
        }),
        _ => None,
    };
    let recent = decode::string(row, 6, "target_limit: recent")?;
    let load = Load {
        recent: limits::decode_recent(&recent)
            .ok_or_else(|| LedgerError::Integrity(format!("target_limit {target}: recent is {recent:?}")))?,
        failures: decode::scalar(row, 7, "target_limit: failures")? as u32,
        open_until: int(row, 8, "target_limit: open_until")?.map(Timestamp::from_millis),
        probe: row
            .text(9)
            .map_err(|e| LedgerError::Integrity(format!("target_limit: probe: {e}")))?
            .map(CommandId::new),
        ..Load::default()
    };
    let blocked_until = int(row, 10, "target_limit: blocked_until")?.map(Timestamp::from_millis);
    let limit = TargetLimit {
        target,
        max_in_flight: max.map(|m| m as u32),
        rate,
        breaker,
    };
    Ok((limit, load, blocked_until))
}

/// Live leases on `target` at `now`.
async fn live_leases<S: Session>(s: &mut S, target: &str, now: Timestamp) -> Result<u32, TxError> {
    let mut sql = Sql::new(s.dialect());
    sql.push("SELECT COUNT(*) FROM command WHERE target = ")
        .bind(Value::Text(target))
        .push(" AND status = 'PROCESSING' AND lease_until >= ")
        .bind(Value::ts(now));
    let rows = s
        .query(&sql.text, &sql.values, |r| decode::scalar(r, 0, "live leases"))
        .await?;
    Ok(u32::try_from(rows.into_iter().next().unwrap_or(0)).unwrap_or(u32::MAX))
}

/// The end of the probe's lease, if `probe` still holds a live lease on `target`.
async fn probe_lease<S: Session>(
    s: &mut S,
    target: &str,
    probe: &CommandId,
    now: Timestamp,
) -> Result<Option<Timestamp>, TxError> {
    let mut sql = Sql::new(s.dialect());
    sql.push("SELECT lease_until FROM command WHERE id = ")
        .bind(Value::Text(probe.as_str()))
        .push(" AND target = ")
        .bind(Value::Text(target))
        .push(" AND status = 'PROCESSING' AND lease_until >= ")
        .bind(Value::ts(now));
    let rows = s
        .query(&sql.text, &sql.values, |r| decode::scalar(r, 0, "probe lease"))
        .await?;
    Ok(rows.into_iter().next().map(Timestamp::from_millis))
}

impl Gates {
    /// Takes `targets` as read and not limited (a claim's candidates said so).
    pub(crate) fn unlimited<'t>(&mut self, targets: impl IntoIterator<Item = &'t str>) {
        for t in targets {
            self.read.entry(t.to_owned()).or_insert(None);
        }
    }

    /// Reads the rows of those `targets` not read yet under `lock` (exclusively
    /// where admitting needs it), with each limited one's free slots (up to the
    /// entries wanted there) and probe.
    pub(crate) async fn read<S: Session>(
        &mut self,
        s: &mut S,
        targets: &[(&str, usize)],
        lock: Lock,
        now: Timestamp,
    ) -> Result<(), TxError> {
        let mut wanted: BTreeMap<&str, usize> = BTreeMap::new();
        for (t, n) in targets
            .iter()
            .filter(|(t, _)| !t.is_empty() && !self.read.contains_key(*t))
        {
            *wanted.entry(t).or_default() += n;
        }
        if wanted.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = wanted.keys().copied().collect();
        let rows = read_rows(s, &names, lock).await?;
        for t in &names {
            self.read.insert((*t).to_owned(), None);
        }
        for (limit, load, blocked_until) in rows {
            let want = wanted.get(limit.target.as_str()).copied().unwrap_or(1);
            let gate = open_gate(s, (limit, load, blocked_until), (want, lock), now).await?;
            self.read.insert(gate.limit.target.clone(), Some(gate));
        }
        Ok(())
    }

    /// Admits one lease of `command` onto `target` at `now` (its row read first if it
    /// was not, exclusively); a target without limits admits everything. An admitted
    /// lease takes one of the target's free slots; a refusal marks the target blocked
    /// until it may admit again, when that is known.
    pub(crate) async fn admit<S: Session>(
        &mut self,
        s: &mut S,
        target: &str,
        command: &CommandId,
        now: Timestamp,
    ) -> Result<Result<(), Blocked>, TxError> {
        self.read(s, &[(target, 1)], Lock::Update, now).await?;
        let Some(Some(gate)) = self.read.get_mut(target) else {
            return Ok(Ok(()));
        };
        if let Some(max) = gate.limit.max_in_flight {
            if gate.slots.is_empty() && !gate.exhausted {
                let taken: Vec<i64> = gate.held.iter().map(|(slot, _)| *slot).collect();
                gate.slots = slots::free(s, target, 1, &taken, now).await?;
                gate.exhausted = gate.slots.is_empty();
            }
            gate.load.in_flight = max.saturating_sub(gate.slots.len() as u32);
        }
        let verdict = gate.limit.admit(&mut gate.load, command, now);
        match &verdict {
            Ok(()) => {
                if let Some(slot) = gate.slots.pop() {
                    gate.held.push((slot, command.clone()));
                }
            }
            Err(blocked) => {
                if let Some(until) = blocked.until() {
                    gate.blocked_until = Some(until);
                }
            }
        }
        Ok(verdict)
    }

    /// Records how a delivery to `target` ended with its breaker.
    pub(crate) async fn record<S: Session>(
        &mut self,
        s: &mut S,
        target: &str,
        outcome: Outcome,
        now: Timestamp,
    ) -> Result<(), TxError> {
        self.read(s, &[(target, 0)], Lock::Update, now).await?;
        if let Some(Some(gate)) = self.read.get_mut(target) {
            if gate.limit.breaker.is_some() {
                let was_open = gate.load.open_until;
                gate.limit.record(&mut gate.load, outcome, now);
                if gate.blocked_until == was_open || gate.load.open_until.is_some() {
                    gate.blocked_until = gate.load.open_until;
                }
            }
        }
        Ok(())
    }

    /// Writes back every gate that changed, and the slots given, in one batch.
    pub(crate) async fn store<S: Session>(&self, s: &mut S, now: Timestamp) -> Result<(), TxError> {
        let d = s.dialect();
        let gates: Vec<&Gate> = self.read.values().flatten().collect();
        let recents: Vec<String> = gates.iter().map(|g| limits::encode_recent(&g.load.recent)).collect();
        let mut statements = Vec::new();
        for (gate, recent) in gates.iter().zip(&recents).filter(|(g, _)| g.changed()) {
            statements.push(update_row(d, gate, recent, now));
        }
        for gate in &gates {
            for (slot, command) in &gate.held {
                statements.push(slots::hold(d, &gate.limit.target, *slot, command));
            }
        }
        s.run(&statements).await
    }
}

/// The limit rows of `targets` (sorted), read under `lock`.
async fn read_rows<S: Session>(s: &mut S, targets: &[&str], lock: Lock) -> Result<Vec<Row>, TxError> {
    let d = s.dialect();
    let suffix = match lock {
        Lock::None => "",
        Lock::Share => d.for_share(),
        Lock::Update => d.for_update(),
    };
    let text = format!(
        "SELECT {COLUMNS} FROM target_limit WHERE target IN ({}) ORDER BY target{suffix}",
        placeholders(d, 1, targets.len()),
    );
    let values: Vec<Value<'_>> = targets.iter().map(|t| Value::Text(t)).collect();
    s.query(&text, &values, parse_row).await
}

/// The gate of a row read under `lock`: the row read again exclusively if admitting
/// needs that, then up to `want` free slots and the probe's lease.
async fn open_gate<S: Session>(
    s: &mut S,
    (limit, load, blocked_until): Row,
    (want, lock): (usize, Lock),
    now: Timestamp,
) -> Result<Gate, TxError> {
    let mut gate = Gate {
        read_as: (load.clone(), blocked_until),
        limit,
        load,
        blocked_until,
        slots: Vec::new(),
        held: Vec::new(),
        exhausted: false,
    };
    if lock != Lock::Update && gate.needs_exclusive(now) {
        let target = gate.limit.target.clone();
        if let Some(row) = read_rows(s, &[&target], Lock::Update).await?.pop() {
            (gate.limit, gate.load, gate.blocked_until) = row;
            gate.read_as = (gate.load.clone(), gate.blocked_until);
        }
    }
    if let Some(max) = gate.limit.max_in_flight {
        if want > 0 {
            gate.slots = slots::free(s, &gate.limit.target, want, &[], now).await?;
        }
        gate.load.in_flight = max.saturating_sub(gate.slots.len() as u32);
    }
    if let Some(probe) = &gate.load.probe {
        gate.load.probing = probe_lease(s, &gate.limit.target, probe, now).await?.is_some();
    }
    Ok(gate)
}

/// The statement that writes back a gate's stored load.
fn update_row<'a>(d: &'static Dialect, gate: &'a Gate, recent: &'a str, now: Timestamp) -> Statement<'a> {
    let mut sql = Sql::new(d);
    sql.push("UPDATE target_limit SET recent = ")
        .bind(Value::Text(recent))
        .push(", failures = ")
        .bind(Value::Int(gate.load.failures.into()))
        .push(", open_until = ")
        .bind(Value::opt_ts(gate.load.open_until))
        .push(", probe = ")
        .bind(Value::opt_text(gate.load.probe.as_ref().map(CommandId::as_str)))
        .push(", blocked_until = ")
        .bind(Value::opt_ts(gate.blocked_until.filter(|t| *t > now)))
        .push(" WHERE target = ")
        .bind(Value::Text(&gate.limit.target));
    Statement {
        sql: sql.text.into(),
        values: sql.values,
        expect: Expect::Any,
    }
}

/// The candidate filter of a claim, as text: leaves out commands whose target
/// refuses every entry at `now` (an SQL expression: a placeholder, or the clock) —
/// its row's `blocked_until` is later (breaker open, rate spent), it has as many
/// live leases as its `max_in_flight`, or its half-open breaker's probe holds a
/// live lease. `alias` qualifies the command's columns (empty: none). The blocked
/// targets' subquery does not depend on the candidate: every backend computes it
/// once per statement (one count per limited target), not once per candidate.
pub(crate) fn unblocked(alias: &str, now: &str) -> String {
    let [a, b, c] = unblocked_parts(alias);
    format!("{a}{now}{b}{now}{c}{now}))")
}

fn unblocked_parts(alias: &str) -> [String; 3] {
    let target = if alias.is_empty() {
        "command.target".to_owned()
    } else {
        format!("{alias}.target")
    };
    [
        format!(" AND {target} NOT IN (SELECT l.target FROM target_limit l WHERE l.blocked_until > "),
        " OR l.max_in_flight <= (SELECT COUNT(*) FROM command x WHERE x.target = l.target \
         AND x.status = 'PROCESSING' AND x.lease_until >= "
            .to_owned(),
        ") OR EXISTS (SELECT 1 FROM command p WHERE p.id = l.probe AND p.target = l.target \
         AND p.status = 'PROCESSING' AND p.lease_until >= "
            .to_owned(),
    ]
}

/// [`unblocked`] with `now` bound as a value.
pub(crate) fn push_unblocked(sql: &mut Sql<'_>, alias: &str, now: Timestamp) {
    let [a, b, c] = unblocked_parts(alias);
    sql.push(&a)
        .bind(Value::ts(now))
        .push(&b)
        .bind(Value::ts(now))
        .push(&c)
        .bind(Value::ts(now))
        .push("))");
}

/// Sets `limit` on its target at `now` (its row created on first use, its slots
/// made `max_in_flight`); the target's load is kept, its block lifted.
pub(crate) async fn set_limit<S: Session>(s: &mut S, limit: &TargetLimit, now: Timestamp) -> Result<(), TxError> {
    let int = |v: Option<u64>| v.map_or(Value::Null, |v| Value::Int(v as i64));
    let values = [
        int(limit.max_in_flight.map(u64::from)),
        int(limit.rate.map(|r| u64::from(r.count))),
        int(limit.rate.map(|r| r.per_ms)),
        int(limit.breaker.map(|b| u64::from(b.failures))),
        int(limit.breaker.map(|b| b.cooldown_ms)),
        Value::ts(now),
        Value::Text(&limit.target),
    ];
    let d = s.dialect();
    let mut sql = Sql::new(d);
    sql.push("UPDATE target_limit SET max_in_flight = ");
    let names = [
        ", rate_count = ",
        ", rate_per_ms = ",
        ", breaker_failures = ",
        ", breaker_cooldown_ms = ",
        ", blocked_until = NULL, updated_at = ",
        " WHERE target = ",
    ];
    sql.bind(values[0]);
    for (name, v) in names.iter().zip(&values[1..]) {
        sql.push(name).bind(*v);
    }
    if s.execute(&sql.text, &sql.values).await? > 0 {
        return slots::resize(s, &limit.target, limit.max_in_flight).await;
    }
    let text = format!(
        "INSERT INTO target_limit (max_in_flight, rate_count, rate_per_ms, breaker_failures, breaker_cooldown_ms, \
         updated_at, target, recent, failures) VALUES ({}, '', 0)",
        placeholders(d, 1, values.len())
    );
    s.execute(&text, &values).await?;
    slots::resize(s, &limit.target, limit.max_in_flight).await
}

/// Removes `target`'s limits; whether it had any.
pub(crate) async fn clear_limit<S: Session>(s: &mut S, target: &str) -> Result<bool, TxError> {
    slots::resize(s, target, None).await?;
    let mut sql = Sql::new(s.dialect());
    sql.push("DELETE FROM target_limit WHERE target = ")
        .bind(Value::Text(target));
    Ok(s.execute(&sql.text, &sql.values).await? > 0)
}

/// Every limited target with its live leases and breaker at `now`, by target.
pub(crate) async fn list_limits<S: Session>(s: &mut S, now: Timestamp) -> Result<Vec<TargetRow>, TxError> {
    let text = format!("SELECT {COLUMNS} FROM target_limit ORDER BY target");
    let rows = s.query(&text, &[], parse_row).await?;
    let mut out = Vec::with_capacity(rows.len());
    for (limit, mut load, _) in rows {
        load.in_flight = live_leases(s, &limit.target, now).await?;
        out.push(TargetRow::of(limit, &load, now));
    }
    Ok(out)
}

/// Whether a claim's `writes` on `record` may stand: the lease they make enter a
/// target must be admitted there ([`limits::entered`]).
pub(crate) async fn admits_claim<S: Session>(
    s: &mut S,
    gates: &mut Gates,
    record: &AttemptRecord,
    writes: &Writes,
    now: Timestamp,
) -> Result<bool, TxError> {
    match shared::entered(record, writes, now) {
        None => Ok(true),
        Some(target) => Ok(gates.admit(s, target, &record.command.id, now).await?.is_ok()),
    }
}

/// A worker's write under the limits: the writes and reply to apply, and the
/// targets whose breaker a success resets with [`reset_statements`] beside the
/// writes (a write that only completes steps needs no read of the targets' rows).
pub(crate) struct Limited {
    /// The writes to apply (the decision's, or a yield on top of them).
    pub(crate) writes: Writes,
    /// The reply.
    pub(crate) reply: Reply,
    /// Targets of steps it completed, whose breakers reset.
    pub(crate) resets: Vec<String>,
}

/// A worker's `request`, decided on `record` into `decided`, under the limits: a
/// write that only completes steps resets those targets' breakers (statements sent
/// with the writes); a give-back, or a lease moved onto another target, reads and
/// locks the targets' rows, records the outcomes with their breakers and admits the
/// lease there, or hands it back ([`shared::yielded`]).
pub(crate) async fn limit_worker<S: Session>(
    s: &mut S,
    (request, token): (&WorkerRequest, &LeaseToken),
    record: &AttemptRecord,
    (writes, reply): (Writes, Reply),
    now: Timestamp,
) -> Result<Limited, TxError> {
    let outcomes = shared::outcomes(request, record, &writes);
    let entered = shared::entered(record, &writes, now).map(str::to_owned);
    if entered.is_none() && outcomes.iter().all(|(_, o)| *o == Outcome::Succeeded) {
        let resets = outcomes.into_iter().map(|(t, _)| t).collect();
        return Ok(Limited { writes, reply, resets });
    }
    let mut targets: Vec<(&str, usize)> = outcomes.iter().map(|(t, _)| (t.as_str(), 0)).collect();
    targets.extend(entered.as_deref().map(|t| (t, 1)));
    let mut gates = Gates::default();
    gates.read(s, &targets, Lock::Update, now).await?;
    for (target, outcome) in &outcomes {
        gates.record(s, target, *outcome, now).await?;
    }
    let (writes, reply) = match entered {
        Some(target) => match gates.admit(s, &target, &record.command.id, now).await? {
            Ok(()) => (writes, reply),
            Err(blocked) => {
                shared::refused_entry(record, (writes, token), &target, &blocked, now).map_err(LedgerError::from)?
            }
        },
        None => (writes, reply),
    };
    gates.store(s, now).await?;
    Ok(Limited {
        writes,
        reply,
        resets: Vec::new(),
    })
}

/// The statements that reset the breakers of `targets` after a success, as
/// [`TargetLimit::record`] does with [`Outcome::Succeeded`]: no failures, not open,
/// no probe, and no block but a rate's. A target without a limit row, or whose
/// breaker has nothing to reset, matches no row (and takes no lock).
pub(crate) fn reset_statements<'a>(d: &'static Dialect, targets: &'a [String]) -> Vec<Statement<'a>> {
    let text: Arc<str> = {
        let mut sql = Sql::new(d);
        sql.push(
            "UPDATE target_limit SET failures = 0, probe = NULL, open_until = NULL, blocked_until = CASE \
             WHEN blocked_until = open_until THEN NULL ELSE blocked_until END WHERE target = ",
        )
        .bind(Value::Null)
        .push(" AND (failures > 0 OR probe IS NOT NULL OR open_until IS NOT NULL)");
        sql.text.into()
    };
    targets
        .iter()
        .map(|t| Statement {
            sql: Arc::clone(&text),
            values: vec![Value::Text(t)],
            expect: Expect::Any,
        })
        .collect()
}

/// What a claim's candidate query says of a candidate's target (the `limit_mode`
/// column): 0 no limits; 1 `max_in_flight` alone (its row read without a lock); 2 a
/// breaker (its row shared); 3 a rate (its row exclusively).
pub(crate) const LIMIT_MODE_SQL: &str = "COALESCE((SELECT CASE WHEN l.rate_count IS NOT NULL THEN 3 \
                                         WHEN l.breaker_failures IS NOT NULL THEN 2 ELSE 1 END \
                                         FROM target_limit l WHERE l.target = c.target), 0)";

/// The gates of a claim whose candidates' targets come with their limit mode
/// ([`LIMIT_MODE_SQL`]): targets without limits are known as such, the others read
/// (exclusive ones first, then shared, then unlocked, each in target order), with a
/// free slot sought per candidate.
pub(crate) async fn claim_gates<S: Session>(
    s: &mut S,
    modes: &[(&str, i64)],
    now: Timestamp,
) -> Result<Gates, TxError> {
    let mut gates = Gates::default();
    gates.unlimited(modes.iter().filter(|(_, m)| *m == 0).map(|(t, _)| *t));
    for (mode, lock) in [(3, Lock::Update), (2, Lock::Share), (1, Lock::None)] {
        let targets: Vec<(&str, usize)> = modes.iter().filter(|(_, m)| *m == mode).map(|(t, _)| (*t, 1)).collect();
        gates.read(s, &targets, lock, now).await?;
    }
    Ok(gates)
}
