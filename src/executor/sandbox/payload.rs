//! Reading a `sqlite-sandbox:v1` step's payload into the [`StepRequest`] a sandbox
//! database runs: every field is checked here, in the worker, before any sandbox is
//! touched.

use super::database::{Check, StepRequest};
use super::{SqliteSandbox, NAME};
use crate::executor::{describe, payload_delay_ms, ExecRequest};
use serde_json::Value;

const PAYLOAD_FIELDS: &[&str] = &["sql", "checks", "undo_sql", "delay_ms"];

/// A step's payload, read: how long to wait first, then what to run.
pub(super) struct StepPayload {
    pub(super) delay_ms: Option<u64>,
    pub(super) request: StepRequest,
}

impl StepPayload {
    /// Reads `request`'s payload; an error is the permanent failure's message,
    /// naming the step and the field.
    pub(super) fn parse(request: &ExecRequest) -> Result<Self, String> {
        let step = &request.step;
        let code = &step.code;
        let Some(fields) = step.payload.as_object() else {
            return Err(format!(
                "step {code}: payload must be a table with sql and checks, not {}",
                describe(&step.payload)
            ));
        };
        if let Some(unknown) = fields.keys().find(|k| !PAYLOAD_FIELDS.contains(&k.as_str())) {
            return Err(format!(
                "step {code}: payload field {unknown:?} is not known to {NAME} (expected one of: {})",
                PAYLOAD_FIELDS.join(", ")
            ));
        }
        let delay_ms = payload_delay_ms(step)?;
        let sql = statements(code, "sql", fields.get("sql"))?.ok_or_else(|| {
            format!("step {code}: payload field sql is missing (expected an array of SQL statements)")
        })?;
        let undo_sql = statements(code, "undo_sql", fields.get("undo_sql"))?.unwrap_or_default();
        let checks = checks(code, fields.get("checks"))?;
        let compensate = !request.action.is_forward();
        let request = StepRequest {
            code: code.clone(),
            key: request.idempotency_key.clone(),
            sandbox_id: SqliteSandbox::sandbox_id(&request.attempt_id, request.delivery),
            statements: if compensate { undo_sql } else { sql },
            checks: if compensate { Vec::new() } else { checks },
            compensate,
        };
        Ok(Self { delay_ms, request })
    }
}

fn statements(code: &str, field: &str, value: Option<&Value>) -> Result<Option<Vec<String>>, String> {
    let Some(value) = value else {
        return Ok(None);
    };
    let Some(items) = value.as_array() else {
        return Err(format!(
            "step {code}: payload field {field} must be an array of SQL statements, not {}",
            describe(value)
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.as_str().map(str::to_owned).ok_or_else(|| {
                format!(
                    "step {code}: payload field {field}[{index}] must be a string, not {}",
                    describe(item)
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn checks(code: &str, value: Option<&Value>) -> Result<Vec<Check>, String> {
    let Some(value) = value else {
        return Err(format!(
            "step {code}: payload field checks is missing (expected an array of {{name, query}} tables)"
        ));
    };
    let Some(items) = value.as_array() else {
        return Err(format!(
            "step {code}: payload field checks must be an array of {{name, query}} tables, not {}",
            describe(value)
        ));
    };
    let mut checks: Vec<Check> = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Some(fields) = item.as_object() else {
            return Err(format!(
                "step {code}: payload field checks[{index}] must be a table with name and query, not {}",
                describe(item)
            ));
        };
        if let Some(unknown) = fields.keys().find(|k| !matches!(k.as_str(), "name" | "query")) {
            return Err(format!(
                "step {code}: payload field checks[{index}].{unknown} is not known (expected name and query)"
            ));
        }
        let text = |field: &str| match fields.get(field) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            Some(other) => Err(format!(
                "step {code}: payload field checks[{index}].{field} must be a non-empty string, not {}",
                describe(other)
            )),
            None => Err(format!("step {code}: payload field checks[{index}].{field} is missing")),
        };
        let name = text("name")?;
        let query = text("query")?;
        if checks.iter().any(|c| c.name == name) {
            return Err(format!(
                "step {code}: payload field checks[{index}].name {name:?} is used by an earlier check"
            ));
        }
        checks.push(Check { name, query });
    }
    Ok(checks)
}
