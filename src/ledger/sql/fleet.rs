//! The fleet's rows on a SQL ledger ([`crate::ledger::fleet`]): one `worker` row per
//! worker id, written by the worker's reports and read by status, the API and the
//! console.

use super::decode;
use super::session::query_one;
use super::session::Session;
use super::{write, Sql, TxError, Value};
use crate::ledger::fleet::{self, WorkerRow, FORGET_AFTER_MS};
use leasehold_engine::Capabilities;
use leasehold_engine::Timestamp;

/// Records worker `id` as seen at `now` with `capabilities` (canonical JSON):
/// `starting` writes its row afresh and forgets every worker unheard of for
/// [`FORGET_AFTER_MS`]; otherwise its row is renewed (written if it was forgotten).
pub(crate) async fn report_worker<S: Session>(
    s: &mut S,
    id: &str,
    capabilities: &str,
    now: Timestamp,
    starting: bool,
) -> Result<(), TxError> {
    let d = s.dialect();
    if starting {
        let forget_before = Timestamp::from_millis(now.as_millis().saturating_sub(FORGET_AFTER_MS as i64));
        let mut sql = Sql::new(d);
        sql.push("DELETE FROM worker WHERE id = ")
            .bind(Value::Text(id))
            .push(" OR last_seen_at < ")
            .bind(Value::ts(forget_before));
        s.execute(&sql.text, &sql.values).await?;
    }
    let mut sql = Sql::new(d);
    sql.push("UPDATE worker SET capabilities_json = ")
        .bind(Value::Text(capabilities))
        .push(", last_seen_at = ")
        .bind(Value::ts(now))
        .push(" WHERE id = ")
        .bind(Value::Text(id));
    if s.execute(&sql.text, &sql.values).await? > 0 {
        return Ok(());
    }
    let mut sql = Sql::new(d);
    sql.push("INSERT INTO worker (id, capabilities_json, started_at, last_seen_at) VALUES (")
        .bind(Value::Text(id))
        .push(", ")
        .bind(Value::Text(capabilities))
        .push(", ")
        .bind(Value::ts(now))
        .push(", ")
        .bind(Value::ts(now))
        .push(")");
    s.execute(&sql.text, &sql.values).await.map(|_| ())
}

/// Every worker row, by id.
pub(crate) async fn read_workers<S: Session>(s: &mut S) -> Result<Vec<WorkerRow>, TxError> {
    let sql = "SELECT id, capabilities_json, started_at, last_seen_at FROM worker ORDER BY id";
    s.query(sql, &[], |row| {
        Ok(WorkerRow {
            id: decode::string(row, 0, "worker: id")?,
            capabilities: fleet::parse_capabilities(&decode::string(row, 1, "worker: capabilities_json")?)?,
            started_at: Timestamp::from_millis(decode::scalar(row, 2, "worker: started_at")?),
            last_seen_at: Timestamp::from_millis(decode::scalar(row, 3, "worker: last_seen_at")?),
        })
    })
    .await
}

/// How many open attempts (PENDING, PROCESSING or WAITING commands) a worker with
/// `capabilities` could run: what its `until_idle` waits for. A command without a
/// route (written before routing) counts.
pub(crate) async fn count_open_for<S: Session>(s: &mut S, capabilities: &Capabilities) -> Result<u64, TxError> {
    let mut sql = Sql::new(s.dialect());
    sql.push("SELECT COUNT(*) FROM command WHERE status IN ('PENDING', 'PROCESSING', 'WAITING')");
    write::push_route_filter(&mut sql, "", capabilities);
    let n = query_one(s, &sql.text, &sql.values, |row| decode::scalar(row, 0, "open attempts"))
        .await?
        .unwrap_or(0);
    Ok(u64::try_from(n).unwrap_or(0))
}
