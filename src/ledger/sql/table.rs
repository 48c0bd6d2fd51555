//! The four tables of a SQL ledger, described once: their columns in order, their
//! keys, the columns a transition may change, and the encoders of the engine's row
//! images into [`Value`]s in that same column order.

use super::Value;
use leasehold_engine::route::Route;
use leasehold_engine::{Attempt, Command, Plan, Receipt};

/// One table of the ledger.
#[derive(Debug)]
pub(crate) struct Table {
    /// The table's name.
    pub(crate) name: &'static str,
    /// Every column, in the order of its encoder and decoder.
    pub(crate) columns: &'static [&'static str],
    /// How many leading columns are its key.
    pub(crate) key: usize,
    /// The columns a transition may change, by index in [`Table::columns`]; the
    /// others are identity, written once by the `INSERT`.
    pub(crate) mutable: &'static [usize],
    /// The bytes a row keeps for its mutable columns, stored values and their
    /// headers together, where the dialect keeps room ([`super::Dialect::room`]):
    /// enough for what a transition usually writes, 0 for none.
    pub(crate) reserve: usize,
}

impl Table {
    /// The column list, each prefixed with `alias.` when given.
    pub(crate) fn column_list(&self, alias: Option<&str>) -> String {
        let mut out = String::new();
        for (i, c) in self.columns.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            if let Some(a) = alias {
                out.push_str(a);
                out.push('.');
            }
            out.push_str(c);
        }
        out
    }

    /// The name of column `index`.
    pub(crate) fn column(&self, index: usize) -> &'static str {
        self.columns[index]
    }
}

/// `plan`: immutable but for its status.
pub(crate) static PLAN: Table = Table {
    name: "plan",
    columns: &[
        "id",
        "name",
        "status",
        "recovery",
        "steps_json",
        "volatile_fields_json",
        "fingerprint",
        "created_at",
        "retry_json",
        "queue",
        "input_json",
        "on_failure",
        "targets_json",
    ],
    key: 1,
    mutable: &[2],
    reserve: 0,
};

/// `attempt`.
pub(crate) static ATTEMPT: Table = Table {
    name: "attempt",
    columns: &[
        "id",
        "plan_id",
        "number",
        "action",
        "status",
        "created_at",
        "started_at",
        "finished_at",
        "error",
        "traceparent",
        "enqueue_key",
        "request_sha256",
        "input_json",
        "input_sha256",
        "order_key",
    ],
    key: 1,
    mutable: &[4, 6, 7, 8],
    // QUEUED: 10 bytes; SUCCEEDED with both timestamps: 25.
    reserve: 32,
};

/// `command`: the outbox row.
pub(crate) static COMMAND: Table = Table {
    name: "command",
    columns: &[
        "id",
        "attempt_id",
        "status",
        "available_at",
        "lease_owner",
        "lease_token",
        "lease_until",
        "last_heartbeat_at",
        "delivery_count",
        "last_error",
        "finished_at",
        "queue",
        "executor",
        "target",
    ],
    key: 1,
    // The queue is the plan's; the executor and target follow the next step.
    mutable: &[2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13],
    // PENDING: 22 bytes; held, with a 128-bit token, a heartbeat and an owner name of
    // 28 characters: 98.
    reserve: 128,
};

/// `receipt`: one per step of an attempt, keyed by attempt and ordinal.
pub(crate) static RECEIPT: Table = Table {
    name: "receipt",
    columns: &[
        "attempt_id",
        "ordinal",
        "step_code",
        "idempotency_key",
        "status",
        "evidence",
        "evidence_sha256",
        "target_receipt",
        "error",
        "started_at",
        "finished_at",
        "executor",
        "target",
        "payload",
    ],
    key: 2,
    mutable: &[4, 5, 6, 7, 8, 9, 10],
    // PENDING: 14 bytes; SUCCEEDED with a SHA-256, a dry run's 125 bytes of
    // evidence and its 49-byte target receipt: 269.
    reserve: 320,
};

/// A plan's row; its JSON columns are encoded by the caller ([`plan_json`]).
pub(crate) fn plan_values<'a>(p: &'a Plan, json: &'a PlanJson) -> [Value<'a>; 13] {
    [
        Value::Text(p.id.as_str()),
        Value::Text(&p.name),
        Value::Text(p.status.as_str()),
        Value::Text(p.recovery.as_str()),
        Value::Text(&json.steps),
        Value::Text(&json.volatile),
        Value::Text(&p.fingerprint),
        Value::ts(p.created_at),
        Value::opt_text(json.retry.as_deref()),
        Value::opt_text(p.queue.as_deref()),
        Value::opt_text(json.input.as_deref()),
        Value::opt_text(p.on_failure.map(|r| r.as_str())),
        Value::Text(&json.targets),
    ]
}

/// A plan's JSON columns.
pub(crate) struct PlanJson {
    /// Its steps.
    pub(crate) steps: String,
    /// Its volatile fields.
    pub(crate) volatile: String,
    /// Its delivery policy (canonical), if it sets one.
    pub(crate) retry: Option<String>,
    /// Its `[input]` table (canonical), if it is a template.
    pub(crate) input: Option<String>,
    /// The target of each step, in step order ([`Route::of_step`]): what the
    /// database's own enqueue routine writes on receipts and commands.
    pub(crate) targets: String,
}

/// A plan's JSON columns ([`PlanJson`]).
pub(crate) fn plan_json(p: &Plan) -> Result<PlanJson, crate::ledger::LedgerError> {
    use crate::ledger::LedgerError;
    use leasehold_engine::canonical::canonical_json;
    let steps = serde_json::to_string(&p.steps).map_err(|e| LedgerError::Internal(format!("plan steps: {e}")))?;
    let volatile = serde_json::to_string(&p.volatile_fields)
        .map_err(|e| LedgerError::Internal(format!("plan volatile fields: {e}")))?;
    let targets: Vec<String> = p.steps.iter().map(|s| Route::of_step(p, &s.code).target).collect();
    Ok(PlanJson {
        steps,
        volatile,
        retry: p.retry.as_ref().map(|r| canonical_json(&serde_json::json!(r))),
        input: p.input.as_ref().map(|i| canonical_json(&serde_json::json!(i))),
        targets: canonical_json(&serde_json::json!(targets)),
    })
}

/// An attempt's row.
pub(crate) fn attempt_values(a: &Attempt) -> [Value<'_>; 15] {
    [
        Value::Text(a.id.as_str()),
        Value::Text(a.plan_id.as_str()),
        Value::Int(a.number.into()),
        Value::Text(a.action.as_str()),
        Value::Text(a.status.as_str()),
        Value::ts(a.created_at),
        Value::opt_ts(a.started_at),
        Value::opt_ts(a.finished_at),
        Value::opt_text(a.error.as_deref()),
        Value::opt_text(a.trace.as_ref().map(|t| t.as_str())),
        Value::opt_text(a.enqueue_key.as_deref()),
        Value::opt_text(a.request_sha256.as_deref()),
        Value::opt_text(a.input.as_deref()),
        Value::opt_text(a.input_sha256.as_deref()),
        Value::opt_text(a.order_key.as_deref()),
    ]
}

/// A command's row.
pub(crate) fn command_values(c: &Command) -> [Value<'_>; 14] {
    [
        Value::Text(c.id.as_str()),
        Value::Text(c.attempt_id.as_str()),
        Value::Text(c.status.as_str()),
        Value::ts(c.available_at),
        Value::opt_text(c.lease_owner.as_deref()),
        Value::opt_text(c.lease_token.as_ref().map(|t| t.expose())),
        Value::opt_ts(c.lease_until),
        Value::opt_ts(c.last_heartbeat_at),
        Value::Int(c.delivery_count.into()),
        Value::opt_text(c.last_error.as_deref()),
        Value::opt_ts(c.finished_at),
        Value::Text(&c.queue),
        Value::Text(&c.executor),
        Value::Text(&c.target),
    ]
}

/// A receipt's row.
pub(crate) fn receipt_values(r: &Receipt) -> [Value<'_>; 14] {
    [
        Value::Text(r.attempt_id.as_str()),
        Value::Int(r.ordinal.into()),
        Value::Text(&r.step_code),
        Value::Text(&r.idempotency_key),
        Value::Text(r.status.as_str()),
        Value::opt_text(r.evidence.as_deref()),
        Value::opt_text(r.evidence_sha256.as_deref()),
        Value::opt_text(r.target_receipt.as_deref()),
        Value::opt_text(r.error.as_deref()),
        Value::opt_ts(r.started_at),
        Value::opt_ts(r.finished_at),
        Value::Text(&r.executor),
        Value::Text(&r.target),
        Value::opt_text(r.payload.as_deref()),
    ]
}
