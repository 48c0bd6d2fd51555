//! The engine's [`Guard`] as SQL, the claim rule, and the statements that apply a
//! transition's [`Writes`].
//!
//! [`plan`] turns writes into statements, each with what its row count must be
//! ([`Expect`]):
//! - `Guard::Absent` inserts the attempt, then the command (an existing command is
//!   the guard failing: [`Refusal::StaleToken`]), then the receipts;
//! - any other guard updates the command first, with the guard as its `WHERE`
//!   condition (matching no row is [`Refusal::StaleToken`], with nothing written by
//!   it), then the attempt, then the receipts. Each `UPDATE` sets only the columns
//!   whose value differs from the row as read, so that no index over an unchanged
//!   column is rewritten; a command that does not change is checked instead
//!   ([`Expect::GuardHolds`]).
//!
//! A backend runs the statements in order in its transaction and checks each with
//! [`Expect::check`]; on any error it abandons the transaction.

use super::table::{attempt_values, command_values, receipt_values, Table, ATTEMPT, COMMAND, RECEIPT};
use super::{push_placeholder, query::queries, Dialect, Sql, Value};
use crate::ledger::LedgerError;
use leasehold_engine::{AttemptId, AttemptRecord, Capabilities, CommandId, Guard, Reach, Refusal, Writes};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

/// The claim rule ([`leasehold_engine::transition::is_claimable`]) in two arms, each
/// the range of one index. This one: a PENDING command that is available. The
/// columns are prefixed with `alias` (`""` or `"c."`); append the `now` placeholder.
pub(crate) fn claimable_pending(alias: &str) -> String {
    format!("{alias}status = 'PENDING' AND {alias}available_at <= ")
}

/// The other arm of the claim rule: a PROCESSING command whose lease has expired (a
/// NULL deadline never compares true). Append the `now` placeholder.
pub(crate) fn claimable_expired(alias: &str) -> String {
    format!("{alias}status = 'PROCESSING' AND {alias}lease_until < ")
}

/// Appends ` {alias}{column} IN (…)` over `values` (`1 = 0` for none).
fn push_in<'a>(sql: &mut Sql<'a>, alias: &str, column: &str, values: impl IntoIterator<Item = &'a String>) {
    let mut values = values.into_iter().peekable();
    if values.peek().is_none() {
        sql.push("1 = 0");
        return;
    }
    sql.push(alias).push(column).push(" IN (");
    for (i, v) in values.enumerate() {
        if i > 0 {
            sql.push(", ");
        }
        sql.bind(Value::Text(v));
    }
    sql.push(")");
}

/// Appends a claim's routing condition on a command row, ` AND (…)` with bound
/// values ([`leasehold_engine::route`]): its queue one that `caps` takes, and its
/// executor one that `caps` runs for any target, or for the targets it may reach.
/// A row written before routing (`''` there) passes, for the engine to decide from
/// its plan. Columns are prefixed with `alias` (`""` or `"c."`).
pub(crate) fn push_route_filter<'a>(sql: &mut Sql<'a>, alias: &str, caps: &'a Capabilities) {
    sql.push(" AND (").push(alias).push("queue = '' OR ");
    push_in(sql, alias, "queue", &caps.queues);
    sql.push(") AND (").push(alias).push("executor = '' OR ");
    let any = caps.executors.iter().filter(|(_, r)| matches!(r, Reach::Any));
    push_in(sql, alias, "executor", any.map(|(e, _)| e));
    for (executor, reach) in &caps.executors {
        if let Reach::Only(targets) = reach {
            sql.push(" OR (").push(alias).push("executor = ");
            sql.bind(Value::Text(executor)).push(" AND ");
            push_in(sql, alias, "target", targets);
            sql.push(")");
        }
    }
    sql.push(")");
}

/// The claim order: oldest availability first, then by id.
pub(crate) const CLAIM_ORDER: &str = "available_at, id";

/// Which guard (part of a cached statement's key), and how many values it binds.
fn guard_kind(guard: &Guard) -> u32 {
    match guard {
        Guard::Absent => 0,
        Guard::Holds(_) => 1,
        Guard::Claimable(_) => 2,
        Guard::Unchanged { .. } => 3,
    }
}

/// Appends the guard's condition on a command row (unqualified columns), its
/// placeholders numbered from `next` (updated). `Guard::Absent` has none.
pub(crate) fn push_guard_text(d: &Dialect, text: &mut String, next: &mut usize, guard: &Guard) {
    let mut param = |text: &mut String| {
        push_placeholder(d, text, *next);
        *next += 1;
    };
    match guard {
        Guard::Absent => text.push_str("1 = 0"),
        Guard::Holds(_) => {
            text.push_str("status = 'PROCESSING' AND lease_token = ");
            param(text);
        }
        Guard::Claimable(_) => {
            text.push_str("((");
            text.push_str(&claimable_pending(""));
            param(text);
            text.push_str(") OR (");
            text.push_str(&claimable_expired(""));
            param(text);
            text.push_str("))");
        }
        Guard::Unchanged { .. } => {
            text.push_str("status = ");
            param(text);
            text.push_str(" AND lease_token ");
            text.push_str(d.null_safe_eq);
            text.push(' ');
            param(text);
        }
    }
}

/// The values of the guard's placeholders, in order.
pub(crate) fn guard_values(guard: &Guard) -> Vec<Value<'_>> {
    match guard {
        Guard::Absent => Vec::new(),
        Guard::Holds(token) => vec![Value::Text(token.expose())],
        Guard::Claimable(now) => vec![Value::ts(*now), Value::ts(*now)],
        Guard::Unchanged { status, lease_token } => vec![
            Value::Text(status.as_str()),
            Value::opt_text(lease_token.as_ref().map(|t| t.expose())),
        ],
    }
}

/// The guard as a condition with its values, placeholders from 1 (tests).
#[cfg(test)]
pub(crate) fn guard_condition<'a>(d: &Dialect, guard: &'a Guard) -> (String, Vec<Value<'a>>) {
    let mut text = String::new();
    push_guard_text(d, &mut text, &mut 1, guard);
    (text, guard_values(guard))
}

/// What a statement's outcome must be.
#[derive(Clone, Copy)]
pub(crate) enum Expect<'a> {
    /// An insert of a new row (a failure is the driver's error).
    Inserted,
    /// The insert of a new command: no row inserted (or, where the dialect has no
    /// conflict clause, a duplicate key) is the guard failing.
    InsertedUnlessPresent(&'a CommandId),
    /// The guarded command update: no row matched is the guard failing.
    Guarded(&'a CommandId),
    /// An attempt's update: the row must exist.
    Attempt(&'a AttemptId),
    /// A receipt's update: the row must exist.
    Receipt(&'a AttemptId, u32),
    /// A query answering one row `(command id, guard holds)` for the attempt's
    /// command: see [`guard_answer`].
    GuardHolds(&'a AttemptId),
    /// A statement whose rows are not checked (a limit row's update, which a target
    /// without limits has none of).
    Any,
}

impl Expect<'_> {
    /// Checks the rows a statement inserted or matched (never called for
    /// [`Expect::GuardHolds`], a query).
    pub(crate) fn check(&self, rows: u64) -> Result<(), LedgerError> {
        if rows > 0 {
            return Ok(());
        }
        Err(match self {
            Expect::Any => return Ok(()),
            Expect::Inserted | Expect::GuardHolds(_) => {
                LedgerError::Internal("a statement of a transition wrote nothing".into())
            }
            Expect::InsertedUnlessPresent(id) | Expect::Guarded(id) => stale(id),
            Expect::Attempt(id) => LedgerError::Integrity(format!("attempt {id} vanished during a transition")),
            Expect::Receipt(id, ordinal) => LedgerError::Integrity(format!(
                "receipt {ordinal} of attempt {id} vanished during a transition"
            )),
        })
    }
}

/// What a guard check's row means: holds, refused, or no command at all.
pub(crate) fn guard_answer(attempt: &AttemptId, row: Option<(CommandId, bool)>) -> Result<(), LedgerError> {
    match row {
        Some((_, true)) => Ok(()),
        Some((id, false)) => Err(stale(&id)),
        None => Err(super::decode::no_command(attempt)),
    }
}

/// The refusal of a write whose guard no longer holds.
pub(crate) fn stale(command: &CommandId) -> LedgerError {
    LedgerError::Refused(Refusal::StaleToken {
        command: command.clone(),
    })
}

/// One statement of a transition's writes.
pub(crate) struct Statement<'a> {
    /// Its text (cached: the same for every write of one shape).
    pub(crate) sql: Arc<str>,
    /// Its parameters, in order.
    pub(crate) values: Vec<Value<'a>>,
    /// What its outcome must be.
    pub(crate) expect: Expect<'a>,
}

/// The statements that apply `writes` over `before`, the attempt's rows as read in
/// the same transaction (`None` only for `Guard::Absent`, an insert). Writes without
/// any image answer no statement.
pub(crate) fn plan<'a>(
    d: &'static Dialect,
    before: Option<&'a AttemptRecord>,
    writes: &'a Writes,
) -> Result<Vec<Statement<'a>>, LedgerError> {
    if writes.is_empty() {
        return Ok(Vec::new());
    }
    if writes.guard == Guard::Absent {
        return plan_insert(d, writes);
    }
    let before = before.ok_or_else(|| LedgerError::Internal("an update needs the rows as read".into()))?;
    let mut out = Vec::with_capacity(2 + writes.receipts.len());
    let kind = guard_kind(&writes.guard);
    let command = writes.command.as_ref().and_then(|c| {
        let (changed, values) = changed(d, &COMMAND, &command_values(&before.command), &command_values(c));
        (changed != 0).then_some((c, changed, values))
    });
    match command {
        Some((c, changed, mut values)) => {
            values.push(Value::Text(c.id.as_str()));
            values.extend(guard_values(&writes.guard));
            let sql = statement(d, &COMMAND, kind, changed, || {
                let (mut text, mut next) = update_text(d, &COMMAND, changed);
                text.push_str(" AND ");
                push_guard_text(d, &mut text, &mut next, &writes.guard);
                text
            });
            out.push(Statement {
                sql,
                values,
                expect: Expect::Guarded(&c.id),
            });
        }
        // Nothing of the command changes: the guard must still hold.
        None => out.push(guard_check(d, &before.attempt.id, &writes.guard)),
    }
    if let Some(a) = &writes.attempt {
        let (changed, mut values) = changed(d, &ATTEMPT, &attempt_values(&before.attempt), &attempt_values(a));
        if changed != 0 {
            values.push(Value::Text(a.id.as_str()));
            let sql = statement(d, &ATTEMPT, 0, changed, || update_text(d, &ATTEMPT, changed).0);
            out.push(Statement {
                sql,
                values,
                expect: Expect::Attempt(&a.id),
            });
        }
    }
    for r in &writes.receipts {
        let old = before.receipt(r.ordinal).ok_or_else(|| {
            LedgerError::Internal(format!(
                "attempt {} has no receipt {} to update",
                r.attempt_id, r.ordinal
            ))
        })?;
        let (changed, mut values) = changed(d, &RECEIPT, &receipt_values(old), &receipt_values(r));
        if changed == 0 {
            continue;
        }
        values.push(Value::Text(r.attempt_id.as_str()));
        values.push(Value::Int(r.ordinal.into()));
        let sql = statement(d, &RECEIPT, 0, changed, || update_text(d, &RECEIPT, changed).0);
        out.push(Statement {
            sql,
            values,
            expect: Expect::Receipt(&r.attempt_id, r.ordinal),
        });
    }
    Ok(out)
}

/// The query that checks, writing nothing, whether the guard holds on the attempt's
/// command: one row `(command id, holds)` ([`Expect::GuardHolds`], [`guard_answer`]).
pub(crate) fn guard_check<'a>(d: &'static Dialect, attempt: &'a AttemptId, guard: &'a Guard) -> Statement<'a> {
    // The values in the order of their placeholders in the text: the guard's, then
    // the key.
    let mut values = guard_values(guard);
    values.push(Value::Text(attempt.as_str()));
    let sql = statement(d, &COMMAND, guard_kind(guard), 0, || {
        // `CASE`, not `COALESCE(condition, 0)`: PostgreSQL has no implicit cast
        // between a boolean and an integer. A NULL condition does not hold.
        let mut text = String::from("SELECT id, CASE WHEN (");
        let mut next = 1;
        push_guard_text(d, &mut text, &mut next, guard);
        text.push_str(") THEN 1 ELSE 0 END FROM command WHERE attempt_id = ");
        push_placeholder(d, &mut text, next);
        text
    });
    Statement {
        sql,
        values,
        expect: Expect::GuardHolds(attempt),
    }
}

/// The inserts of a new attempt: attempt, command, receipts.
fn plan_insert<'a>(d: &'static Dialect, writes: &'a Writes) -> Result<Vec<Statement<'a>>, LedgerError> {
    let (Some(attempt), Some(command)) = (&writes.attempt, &writes.command) else {
        return Err(LedgerError::Internal(
            "a new attempt needs its attempt and command images".into(),
        ));
    };
    let q = queries(d);
    let shared = |text: &str| statement(d, &ATTEMPT, 0, u32::MAX, || text.to_owned());
    let mut out = vec![
        Statement {
            sql: shared(&q.insert_attempt),
            values: with_room(d, &ATTEMPT, &attempt_values(attempt)),
            expect: Expect::Inserted,
        },
        Statement {
            sql: statement(d, &COMMAND, 0, u32::MAX, || q.insert_command.clone()),
            values: with_room(d, &COMMAND, &command_values(command)),
            expect: Expect::InsertedUnlessPresent(&command.id),
        },
    ];
    for r in &writes.receipts {
        out.push(Statement {
            sql: statement(d, &RECEIPT, 0, u32::MAX, || q.insert_receipt.clone()),
            values: with_room(d, &RECEIPT, &receipt_values(r)),
            expect: Expect::Inserted,
        });
    }
    Ok(out)
}

/// The bit of a changed-columns set that stands for the row's room ([`room`]).
const ROOM: u32 = 1 << 31;

/// The mutable columns whose value differs between `before` and `after` (bit `k` for
/// `table.mutable[k]`), and their new values in that order; then, where the dialect
/// keeps room and any column changed, the room if it changes ([`ROOM`], its length
/// last).
fn changed<'a>(d: &Dialect, table: &Table, before: &[Value<'_>], after: &[Value<'a>]) -> (u32, Vec<Value<'a>>) {
    let mut changed = 0;
    let mut values = Vec::with_capacity(table.mutable.len() + 5);
    for (k, &i) in table.mutable.iter().enumerate() {
        if before[i] != after[i] {
            changed |= 1 << k;
            values.push(after[i]);
        }
    }
    if changed != 0 {
        if let (Some(old), Some(new)) = (room(d, table, before), room(d, table, after)) {
            if old != new {
                changed |= ROOM;
                values.push(Value::Int(new));
            }
        }
    }
    (changed, values)
}

/// A row's values, then its room where the dialect keeps it (an insert's parameters).
fn with_room<'a>(d: &Dialect, table: &Table, values: &[Value<'a>]) -> Vec<Value<'a>> {
    let mut out = Vec::with_capacity(values.len() + 1);
    out.extend_from_slice(values);
    if let Some(n) = room(d, table, values) {
        out.push(Value::Int(n));
    }
    out
}

/// How many zero bytes the row `values` keeps in its `room` column where the dialect
/// keeps room: what its mutable columns leave of the table's
/// [`Table::reserve`], so that the row's size stays the same while they grow within
/// it (a transition that grows a row then rewrites it in place instead of splitting a
/// full page), and 0 once they outgrow it. `None` where there is no room column.
///
/// Sizes are SQLite's record format: each value's bytes plus its serial type's
/// varint in the record header ([`stored_size`]); the room's own header takes one
/// byte up to 57 bytes of room and two beyond, so the row stays within a byte of the
/// same size.
pub(crate) fn room(d: &Dialect, table: &Table, values: &[Value<'_>]) -> Option<i64> {
    if !d.room || table.reserve == 0 {
        return None;
    }
    let used: usize = table.mutable.iter().map(|&i| stored_size(&values[i])).sum();
    let free = table.reserve.saturating_sub(used);
    let n = match free {
        0 | 1 => 0,
        f if f - 1 <= 57 => f - 1,
        f => f - 2,
    };
    i64::try_from(n).ok()
}

/// The bytes a value takes in a SQLite record: its serial type's varint in the
/// header and its body (integers 0 and 1 have none; others 1, 2, 3, 4, 6 or 8 bytes).
fn stored_size(v: &Value<'_>) -> usize {
    match *v {
        Value::Null => 1,
        Value::Int(0 | 1) => 1,
        Value::Int(i) => {
            1 + match i {
                -128..=127 => 1,
                -32_768..=32_767 => 2,
                -8_388_608..=8_388_607 => 3,
                -2_147_483_648..=2_147_483_647 => 4,
                -140_737_488_355_328..=140_737_488_355_327 => 6,
                _ => 8,
            }
        }
        Value::Text(s) => {
            let serial = 2 * s.len() + 13;
            let header = match serial {
                0..=0x7f => 1,
                0x80..=0x3fff => 2,
                0x4000..=0x1f_ffff => 3,
                _ => 4,
            };
            header + s.len()
        }
    }
}

/// `UPDATE table SET <changed columns> WHERE <key>`, with the placeholders the
/// values of [`changed`] then the key take; answers the text and the next
/// placeholder's number.
fn update_text(d: &Dialect, table: &Table, changed: u32) -> (String, usize) {
    let mut text = format!("UPDATE {} SET ", table.name);
    let mut next = 1;
    for (k, &i) in table.mutable.iter().enumerate() {
        if changed & (1 << k) == 0 {
            continue;
        }
        if next > 1 {
            text.push_str(", ");
        }
        text.push_str(table.column(i));
        text.push_str(" = ");
        push_placeholder(d, &mut text, next);
        next += 1;
    }
    if changed & ROOM != 0 {
        // A row written before the table had room has none, and gets none.
        text.push_str(", room = CASE WHEN room IS NULL THEN NULL ELSE zeroblob(");
        push_placeholder(d, &mut text, next);
        text.push_str(") END");
        next += 1;
    }
    text.push_str(" WHERE ");
    for i in 0..table.key {
        if i > 0 {
            text.push_str(" AND ");
        }
        text.push_str(table.column(i));
        text.push_str(" = ");
        push_placeholder(d, &mut text, next);
        next += 1;
    }
    (text, next)
}

/// A cached statement's key: dialect, table, guard kind, changed columns.
type StatementKey = (u8, &'static str, u32, u32);

/// The text of a statement, built once per thread for each key: the dialect, the
/// table, the guard's kind and the set of columns it changes (`u32::MAX` for an
/// insert, 0 for a guard check). Building it on every write with `format!` was a
/// tenth of a transition's instructions.
fn statement(d: &Dialect, table: &Table, guard: u32, changed: u32, build: impl FnOnce() -> String) -> Arc<str> {
    thread_local! {
        static STATEMENTS: RefCell<HashMap<StatementKey, Arc<str>>> = RefCell::new(HashMap::new());
    }
    let key = (d.id, table.name, guard, changed);
    STATEMENTS.with(|cache| Arc::clone(cache.borrow_mut().entry(key).or_insert_with(|| build().into())))
}
