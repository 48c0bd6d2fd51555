//! Several transitions' writes in one `UPDATE` per table: a claim batch's.

use super::session::{self, Session};
use super::table::{attempt_values, command_values, receipt_values, Table, ATTEMPT, COMMAND, RECEIPT};
use super::{write, Sql, TxError, Value};
use crate::ledger::LedgerError;
use leasehold_engine::{AttemptRecord, Command, Guard, Writes};

/// Applies several transitions' writes inside `s` with one `UPDATE` per table
/// instead of one per row, when it can: every one of them updates rows (no
/// `Guard::Absent`), carries an attempt and a command image, and all share one guard
/// (a claim's `Claimable(now)`). Otherwise it applies them one by one
/// ([`session::apply_writes`]). The checks are those of [`session::apply_writes`]:
/// the guarded command `UPDATE` must match every one of its commands — else
/// [`leasehold_engine::Refusal::StaleToken`], and the caller rolls the whole
/// transaction back — and every attempt and receipt written must exist. Every row
/// written is held already (the attempts and commands by the claim's locking reads,
/// the receipts by theirs), so the order of the writes takes no lock in a new order:
/// the commands go first, so that other claimers' reads of their candidates stop
/// listing them as early as possible. A write that ends the head of an order key
/// (a claim that exhausts it) decides the attempts behind it after the batch
/// ([`super::order::follow_order`]).
pub(crate) async fn apply_writes_batch<S: Session>(
    s: &mut S,
    items: &[(&AttemptRecord, &Writes)],
) -> Result<(), TxError> {
    let Some((_, first)) = items.first() else {
        return Ok(());
    };
    let batchable = items
        .iter()
        .all(|(_, w)| w.guard != Guard::Absent && w.guard == first.guard && w.attempt.is_some() && w.command.is_some());
    if !batchable {
        for (before, w) in items {
            session::apply_writes(s, Some(before), w).await?;
        }
        return Ok(());
    }
    let writes: Vec<&Writes> = items.iter().map(|(_, w)| *w).collect();
    let commands: Vec<&Command> = writes.iter().filter_map(|w| w.command.as_ref()).collect();
    let rows: Vec<[Value<'_>; 14]> = commands.iter().map(|c| command_values(c)).collect();
    if update_rows(s, &COMMAND, &rows, Some(&first.guard)).await? != rows.len() as u64 {
        return Err(write::stale(&commands[0].id).into());
    }
    let attempts: Vec<[Value<'_>; 15]> = writes
        .iter()
        .filter_map(|w| w.attempt.as_ref())
        .map(attempt_values)
        .collect();
    if update_rows(s, &ATTEMPT, &attempts, None).await? != attempts.len() as u64 {
        return Err(LedgerError::Integrity("an attempt vanished during a transition".into()).into());
    }
    let receipts: Vec<[Value<'_>; 14]> = writes.iter().flat_map(|w| &w.receipts).map(receipt_values).collect();
    if update_rows(s, &RECEIPT, &receipts, None).await? != receipts.len() as u64 {
        return Err(LedgerError::Integrity("a receipt vanished during a transition".into()).into());
    }
    for (before, w) in items {
        super::order::follow_order(s, before, w).await?;
    }
    Ok(())
}

/// Updates `rows` (full row images) of `table` in one statement where `guard`
/// holds; answers the rows it matched. Every mutable column is set: a column whose
/// new value is the same for every row to that value, any other to a `CASE` over
/// the rows' keys.
async fn update_rows<'a, S: Session>(
    s: &mut S,
    table: &Table,
    rows: &[impl AsRef<[Value<'a>]>],
    guard: Option<&'a Guard>,
) -> Result<u64, TxError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let mut sql = Sql::new(s.dialect());
    sql.push("UPDATE ").push(table.name).push(" SET ");
    push_assignments(&mut sql, table, rows);
    sql.push(" WHERE (");
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            sql.push(" OR ");
        }
        push_key_match(&mut sql, table, r.as_ref());
    }
    sql.push(")");
    if let Some(guard) = guard {
        let mut next = sql.values.len() + 1;
        sql.push(" AND ");
        write::push_guard_text(s.dialect(), &mut sql.text, &mut next, guard);
        sql.values.extend(write::guard_values(guard));
    }
    s.execute(&sql.text, &sql.values).await
}

/// `column = value` for every mutable column: the value itself when every row has
/// it, else a `CASE` over the rows' keys.
fn push_assignments<'a>(sql: &mut Sql<'a>, table: &Table, rows: &[impl AsRef<[Value<'a>]>]) {
    let first = rows[0].as_ref();
    for (j, &column) in table.mutable.iter().enumerate() {
        if j > 0 {
            sql.push(", ");
        }
        sql.push(table.column(column)).push(" = ");
        if rows.iter().all(|r| r.as_ref()[column] == first[column]) {
            sql.bind(first[column]);
            continue;
        }
        sql.push("CASE");
        for r in rows {
            sql.push(" WHEN ");
            push_key_match(sql, table, r.as_ref());
            sql.push(" THEN ").bind(r.as_ref()[column]);
        }
        sql.push(" ELSE ").push(table.column(column)).push(" END");
    }
}

/// `(key1 = ? AND key2 = ?)` for `row`'s key columns.
fn push_key_match<'a>(sql: &mut Sql<'a>, table: &Table, row: &[Value<'a>]) {
    sql.push("(");
    for (i, value) in row.iter().take(table.key).enumerate() {
        if i > 0 {
            sql.push(" AND ");
        }
        sql.push(table.column(i)).push(" = ");
        sql.bind(*value);
    }
    sql.push(")");
}
