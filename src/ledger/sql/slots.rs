//! A limited target's slots: `max_in_flight` rows of `target_slot`, each free or
//! held by the command whose lease took it. A slot is free when its holder no
//! longer holds a live lease on the target (its lease ended, expired or moved on),
//! so no write has to give it back. A claim takes free slots with `SKIP LOCKED`:
//! concurrent claimers onto one target take different slots and never wait for
//! each other, and no slot is held twice, since taking one locks it until commit.

use super::decode;
use super::session::Session;
use super::write::{Expect, Statement};
use super::{placeholders, Dialect, Sql, TxError, Value};
use leasehold_engine::{CommandId, Timestamp};

/// Rows inserted per statement when a limit grows.
const INSERT_CHUNK: u32 = 500;

/// Up to `want` free slots of `target` at `now`, none of `taken`, locked (skipping
/// those other transactions hold), by slot number.
pub(crate) async fn free<S: Session>(
    s: &mut S,
    target: &str,
    want: usize,
    taken: &[i64],
    now: Timestamp,
) -> Result<Vec<i64>, TxError> {
    let d = s.dialect();
    let mut sql = Sql::new(d);
    sql.push("SELECT slot FROM target_slot s WHERE s.target = ")
        .bind(Value::Text(target))
        .push(
            " AND (s.command_id IS NULL OR NOT EXISTS (SELECT 1 FROM command c WHERE c.id = s.command_id \
             AND c.target = s.target AND c.status = 'PROCESSING' AND c.lease_until >= ",
        )
        .bind(Value::ts(now))
        .push("))");
    for slot in taken {
        sql.push(" AND s.slot <> ").bind(Value::Int(*slot));
    }
    sql.push(" ORDER BY s.slot LIMIT ")
        .bind(Value::Int(i64::try_from(want).unwrap_or(i64::MAX)));
    if d.row_locks {
        sql.push(" FOR UPDATE SKIP LOCKED");
    }
    s.query(&sql.text, &sql.values, |r| decode::scalar(r, 0, "target_slot: slot"))
        .await
}

/// The statement that gives `slot` of `target` to `command`.
pub(crate) fn hold<'a>(d: &'static Dialect, target: &'a str, slot: i64, command: &'a CommandId) -> Statement<'a> {
    let mut sql = Sql::new(d);
    sql.push("UPDATE target_slot SET command_id = ")
        .bind(Value::Text(command.as_str()))
        .push(" WHERE target = ")
        .bind(Value::Text(target))
        .push(" AND slot = ")
        .bind(Value::Int(slot));
    Statement {
        sql: sql.text.into(),
        values: sql.values,
        expect: Expect::Any,
    }
}

/// Makes `target`'s slots number `n` (none for `None`): slots beyond `n` go, missing
/// ones are added free, and the others keep their holders.
pub(crate) async fn resize<S: Session>(s: &mut S, target: &str, n: Option<u32>) -> Result<(), TxError> {
    let n = n.unwrap_or(0);
    let d = s.dialect();
    let mut sql = Sql::new(d);
    sql.push("DELETE FROM target_slot WHERE target = ")
        .bind(Value::Text(target))
        .push(" AND slot >= ")
        .bind(Value::Int(n.into()));
    s.execute(&sql.text, &sql.values).await?;
    let mut sql = Sql::new(d);
    sql.push("SELECT COUNT(*) FROM target_slot WHERE target = ")
        .bind(Value::Text(target));
    let have = s
        .query(&sql.text, &sql.values, |r| decode::scalar(r, 0, "target_slot: count"))
        .await?
        .into_iter()
        .next()
        .unwrap_or(0);
    let mut next = u32::try_from(have).unwrap_or(n);
    while next < n {
        let end = (next + INSERT_CHUNK).min(n);
        let rows: Vec<String> = (0..end - next)
            .map(|i| format!("({})", placeholders(d, 1 + 2 * i as usize, 2)))
            .collect();
        let text = format!("INSERT INTO target_slot (target, slot) VALUES {}", rows.join(", "));
        let values: Vec<Value<'_>> = (next..end)
            .flat_map(|slot| [Value::Text(target), Value::Int(slot.into())])
            .collect();
        s.execute(&text, &values).await?;
        next = end;
    }
    Ok(())
}
