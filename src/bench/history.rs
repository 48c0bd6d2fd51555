//! An old history to prune, written in bulk: `leasehold bench --prune-history`
//! ([`fill_postgres`]) fills a PostgreSQL ledger with ended attempts in a few
//! `INSERT … SELECT` statements instead of one transaction per attempt, so that a
//! prune can be measured on a million of them against the workers' deliveries.

use crate::bench::plan_spec;
use crate::executor::Executors;
use crate::ledger::postgres::PostgresLedger;
use crate::ledger::{Ledger, LedgerError};
use leasehold_engine::Timestamp;

/// Attempts written per statement.
const CHUNK: u64 = 50_000;

/// One statement writing attempts `first..first + count` of plan `$1` (numbered from
/// `$2`, `$3` of them), each SUCCEEDED at `$4` with its DELIVERED command and one
/// SUCCEEDED receipt whose evidence (`{"n":NUMBER}`, canonical JSON) and SHA-256 are
/// what a delivery would have stored.
const INSERT: &str = "
WITH a AS (
    INSERT INTO attempt (id, plan_id, number, action, status, created_at, started_at, finished_at)
    SELECT $1 || '-' || n, $1, n, 'execute', 'SUCCEEDED', $4, $4, $4
    FROM generate_series($2::bigint, $2::bigint + $3::bigint - 1) AS n
    RETURNING id, number
), c AS (
    INSERT INTO command (id, attempt_id, status, available_at, delivery_count, finished_at, queue, executor, target)
    SELECT 'cmd-' || a.id, a.id, 'DELIVERED', $4, 1, $4, 'default', 'dry-run:v1', 'dry-run:v1' FROM a
    RETURNING 1
)
INSERT INTO receipt (attempt_id, ordinal, step_code, idempotency_key, status, evidence, evidence_sha256,
                     target_receipt, started_at, finished_at, executor, target)
SELECT a.id, 1, 'step-1', 'ik-' || a.id, 'SUCCEEDED', e.text, encode(sha256(convert_to(e.text, 'UTF8')), 'hex'),
       '{}', $4, $4, 'dry-run:v1', 'dry-run:v1'
FROM a CROSS JOIN LATERAL (SELECT '{\"n\":' || a.number || '}' AS text) e";

/// Registers `plans` one-step plans named `{tag}-history-{p}` and writes `attempts`
/// ended attempts spread over them, finished at `at`, then vacuums and analyzes the
/// three tables; answers the attempts written.
pub async fn fill_postgres(
    ledger: &PostgresLedger,
    tag: &str,
    plans: u32,
    attempts: u64,
    at: Timestamp,
) -> Result<u64, LedgerError> {
    let plans = u64::from(plans.max(1));
    let client = ledger.session().await?;
    let internal = |e: tokio_postgres::Error| LedgerError::Internal(format!("history fill: {e}"));
    let mut written = 0;
    for p in 0..plans {
        let spec = plan_spec(format!("{tag}-history-{p}"), 1);
        let plan = ledger.register_plan(spec, &Executors::new().names()).await?;
        let share = attempts / plans + u64::from(p < attempts % plans);
        let mut first = 1;
        while first <= share {
            let count = CHUNK.min(share - first + 1);
            let (id, from, n, at) = (plan.id.as_str(), first as i64, count as i64, at.as_millis());
            client.execute(INSERT, &[&id, &from, &n, &at]).await.map_err(internal)?;
            written += count;
            first += count;
        }
    }
    // What the database's own maintenance does after a bulk load, before anything is
    // measured on it: fresh statistics, a visibility map.
    client
        .batch_execute("VACUUM ANALYZE attempt, command, receipt")
        .await
        .map_err(internal)?;
    Ok(written)
}

/// How many attempts the ledger holds.
pub async fn count_attempts(ledger: &PostgresLedger) -> Result<u64, LedgerError> {
    let client = ledger.session().await?;
    let row = client
        .query_one("SELECT COUNT(*) FROM attempt", &[])
        .await
        .map_err(|e| LedgerError::Internal(format!("attempt count: {e}")))?;
    Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
}
