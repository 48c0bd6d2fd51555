//! `sqlite-sandbox:v1`: the rehearsal executor for `replay` plans.
//!
//! Contract: each delivery of an attempt — keyed by (attempt id, delivery number) —
//! gets its own fresh in-memory SQLite database, the sandbox, with foreign keys
//! enforced. It lives until [`Executor::release`] is called for that delivery, so a
//! takeover (a new delivery) always starts from an empty database and replays every
//! step, as `replay` recovery requires. A step's payload:
//! - `sql` (array of strings, required): statements run in order, each element
//!   through `execute_batch`; the statement index in errors is the array index;
//! - `checks` (array of `{name, query}`, required): each query (one read-only
//!   statement) is run after the statements and its rows collected as JSON arrays
//!   (INTEGER and REAL → number, TEXT → string, NULL → null, BLOB → lowercase hex);
//! - `undo_sql` (array of strings, optional): run instead of `sql` when the action
//!   is `compensate`; checks are not run then, and the evidence says
//!   `"compensated": true`;
//! - `delay_ms` (whole number, optional): sleep this long on the tokio clock first.
//!
//! Any other payload field is refused, so a misspelt field never silently does
//! nothing. Evidence: `{"sandbox_id", "checks": {name: rows}, "statements": n}`;
//! target receipt: `{"sandbox", "idempotency_key"}`. Within one sandbox, a repeated
//! idempotency key gets the first answer again without touching the database.
//! Every payload or SQL error is a permanent failure naming the step and the field
//! or statement; only failing to open a sandbox is transient.
//!
//! SQLite is called synchronously inside the future (no `spawn_blocking`): a
//! simulator runs this on a single-threaded host, and sandbox work is small.

use super::{describe, pace, payload_delay_ms, ExecRequest, Executor, ExecutorResult};
use leasehold_engine::{Action, AttemptId, Step};
use rusqlite::types::ValueRef;
use rusqlite::Connection;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The executor name plans use for [`SqliteSandbox`].
pub const NAME: &str = "sqlite-sandbox:v1";

const PAYLOAD_FIELDS: &[&str] = &["sql", "checks", "undo_sql", "delay_ms"];

/// The `sqlite-sandbox:v1` executor: one in-memory SQLite database per delivery.
#[derive(Default)]
pub struct SqliteSandbox {
    sandboxes: Mutex<Sandboxes>,
}

/// Open sandboxes by (attempt, delivery). Each sits behind its own lock so that
/// deliveries do not wait for one another's SQL.
type Sandboxes = BTreeMap<(AttemptId, u32), Arc<Mutex<Sandbox>>>;

struct Sandbox {
    conn: Connection,
    /// Answers by idempotency key, so a repeated key gets the same answer.
    answered: BTreeMap<String, ExecutorResult>,
}

struct Check {
    name: String,
    query: String,
}

struct StepPayload {
    delay_ms: Option<u64>,
    statements: Vec<String>,
    checks: Vec<Check>,
    compensate: bool,
}

impl SqliteSandbox {
    /// An executor holding no sandboxes.
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of the sandbox of one delivery of an attempt: `sbx-<attempt>-d<delivery>`.
    pub fn sandbox_id(attempt: &AttemptId, delivery: u32) -> String {
        format!("sbx-{attempt}-d{delivery}")
    }

    /// The deliveries whose sandboxes are open (not yet released), in order.
    pub fn open_sandboxes(&self) -> Vec<(AttemptId, u32)> {
        self.lock_map().keys().cloned().collect()
    }

    fn lock_map(&self) -> MutexGuard<'_, Sandboxes> {
        // A panic while holding the map cannot leave it half-updated: every
        // critical section is a single insert, remove or read.
        self.sandboxes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sandbox(&self, attempt: &AttemptId, delivery: u32) -> Result<Arc<Mutex<Sandbox>>, String> {
        let mut map = self.lock_map();
        if let Some(sandbox) = map.get(&(attempt.clone(), delivery)) {
            return Ok(Arc::clone(sandbox));
        }
        let conn = Connection::open_in_memory().map_err(|e| format!("could not open a sandbox database: {e}"))?;
        conn.execute_batch("PRAGMA foreign_keys = ON")
            .map_err(|e| format!("could not enable foreign keys in the sandbox: {e}"))?;
        let sandbox = Arc::new(Mutex::new(Sandbox {
            conn,
            answered: BTreeMap::new(),
        }));
        map.insert((attempt.clone(), delivery), Arc::clone(&sandbox));
        Ok(sandbox)
    }

    fn run(&self, request: &ExecRequest, payload: &StepPayload) -> ExecutorResult {
        let sandbox = match self.sandbox(&request.attempt_id, request.delivery) {
            Ok(sandbox) => sandbox,
            Err(message) => return ExecutorResult::Transient(format!("step {}: {message}", request.step.code)),
        };
        // A poisoned sandbox is still usable: the step that panicked is reported
        // by its own caller, and later steps see whatever it committed.
        let mut sandbox = sandbox.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(answer) = sandbox.answered.get(&request.idempotency_key) {
            return answer.clone();
        }
        let sandbox_id = Self::sandbox_id(&request.attempt_id, request.delivery);
        let answer = run_step(
            &sandbox.conn,
            &request.step,
            payload,
            &sandbox_id,
            &request.idempotency_key,
        );
        sandbox.answered.insert(request.idempotency_key.clone(), answer.clone());
        answer
    }
}

impl fmt::Debug for SqliteSandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteSandbox")
            .field("open_sandboxes", &self.open_sandboxes())
            .finish()
    }
}

impl Executor for SqliteSandbox {
    async fn execute(&self, request: ExecRequest) -> ExecutorResult {
        let payload = match StepPayload::parse(&request.step, request.action) {
            Ok(payload) => payload,
            Err(message) => return ExecutorResult::Permanent(message),
        };
        pace(payload.delay_ms).await;
        self.run(&request, &payload)
    }

    fn release(&self, attempt: &AttemptId, delivery: u32) {
        let removed = self.lock_map().remove(&(attempt.clone(), delivery));
        // Dropped outside the map's lock: closing a database is not the map's business.
        drop(removed);
    }
}

impl StepPayload {
    fn parse(step: &Step, action: Action) -> Result<Self, String> {
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
        let compensate = !action.is_forward();
        Ok(Self {
            delay_ms,
            statements: if compensate { undo_sql } else { sql },
            checks: if compensate { Vec::new() } else { checks },
            compensate,
        })
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

fn run_step(conn: &Connection, step: &Step, payload: &StepPayload, sandbox_id: &str, key: &str) -> ExecutorResult {
    let code = &step.code;
    let field = if payload.compensate { "undo_sql" } else { "sql" };
    for (index, sql) in payload.statements.iter().enumerate() {
        if let Err(e) = conn.execute_batch(sql) {
            return ExecutorResult::Permanent(format!("step {code}: statement {field}[{index}] failed: {e}"));
        }
    }
    let mut results = Map::new();
    for (index, check) in payload.checks.iter().enumerate() {
        match run_check(conn, &check.query) {
            Ok(rows) => {
                results.insert(check.name.clone(), Value::Array(rows));
            }
            Err(e) => {
                return ExecutorResult::Permanent(format!(
                    "step {code}: check checks[{index}] ({}) failed: {e}",
                    check.name
                ))
            }
        }
    }
    let mut evidence = json!({
        "sandbox_id": sandbox_id,
        "checks": results,
        "statements": payload.statements.len(),
    });
    if payload.compensate {
        evidence["compensated"] = Value::Bool(true);
    }
    ExecutorResult::Done {
        evidence,
        target_receipt: json!({ "sandbox": sandbox_id, "idempotency_key": key }),
    }
}

fn run_check(conn: &Connection, query: &str) -> Result<Vec<Value>, String> {
    let mut stmt = conn.prepare(query).map_err(|e| e.to_string())?;
    if !stmt.readonly() {
        return Err("a check must only read the sandbox".into());
    }
    let columns = stmt.column_count();
    let mut rows = stmt.query([]).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(|e| e.to_string())? {
        let values = (0..columns)
            .map(|i| row.get_ref(i).map(json_value).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(Value::Array(values));
    }
    Ok(out)
}

fn json_value(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::from(i),
        // SQLite stores no NaN; an infinity has no JSON number, so it is spelt out.
        ValueRef::Real(f) => serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(f.to_string())),
        ValueRef::Text(bytes) => Value::String(String::from_utf8_lossy(bytes).into_owned()),
        ValueRef::Blob(bytes) => Value::String(bytes.iter().map(|b| format!("{b:02x}")).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(code: &str, payload: Value) -> ExecRequest {
        crate::executor::tests::request(NAME, code, payload)
    }

    fn evidence(result: ExecutorResult) -> Value {
        match result {
            ExecutorResult::Done { evidence, .. } => evidence,
            other => panic!("expected done, got {other:?}"),
        }
    }

    fn permanent(result: ExecutorResult) -> String {
        match result {
            ExecutorResult::Permanent(message) => message,
            other => panic!("expected a permanent failure, got {other:?}"),
        }
    }

    fn create() -> Value {
        json!({
            "sql": ["CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, score REAL, raw BLOB)",
                    "INSERT INTO t VALUES (1, 'a', 1.5, x'00ff'), (2, NULL, 2.0, NULL)"],
            "checks": [{"name": "rows", "query": "SELECT id, name, score, raw FROM t ORDER BY id"}],
        })
    }

    #[tokio::test]
    async fn checks_collect_rows_as_json_values() {
        let sandbox = SqliteSandbox::new();
        let result = sandbox.execute(request("create", create())).await;
        assert_eq!(
            result,
            ExecutorResult::Done {
                evidence: json!({
                    "sandbox_id": "sbx-att-1-d1",
                    "checks": {"rows": [[1, "a", 1.5, "00ff"], [2, null, 2.0, null]]},
                    "statements": 2,
                }),
                target_receipt: json!({"sandbox": "sbx-att-1-d1", "idempotency_key": "ik-create"}),
            }
        );
    }

    #[tokio::test]
    async fn steps_of_one_delivery_share_a_sandbox() {
        let sandbox = SqliteSandbox::new();
        evidence(sandbox.execute(request("create", create())).await);
        let mut second = request(
            "count",
            json!({"sql": ["DELETE FROM t WHERE id = 2"], "checks": [{"name": "n", "query": "SELECT count(*) FROM t"}]}),
        );
        second.ordinal = 2;
        assert_eq!(evidence(sandbox.execute(second).await)["checks"]["n"], json!([[1]]));
    }

    #[tokio::test]
    async fn two_deliveries_get_different_sandboxes_and_the_same_check_results() {
        let sandbox = SqliteSandbox::new();
        let first = evidence(sandbox.execute(request("create", create())).await);
        let mut redelivery = request("create", create());
        redelivery.delivery = 2;
        // A shared database would fail here: the table would already exist.
        let second = evidence(sandbox.execute(redelivery).await);
        assert_eq!(first["sandbox_id"], "sbx-att-1-d1");
        assert_eq!(second["sandbox_id"], "sbx-att-1-d2");
        assert_eq!(first["checks"], second["checks"]);
        assert_eq!(first["statements"], second["statements"]);
        assert_eq!(
            sandbox.open_sandboxes(),
            vec![(AttemptId::new("att-1"), 1), (AttemptId::new("att-1"), 2)]
        );
    }

    #[tokio::test]
    async fn a_repeated_key_gets_the_same_answer_without_running_again() {
        let sandbox = SqliteSandbox::new();
        let first = sandbox.execute(request("create", create())).await;
        let again = sandbox.execute(request("create", create())).await;
        assert_eq!(first, again);
    }

    #[tokio::test]
    async fn an_sql_error_names_the_step_and_the_statement() {
        let sandbox = SqliteSandbox::new();
        let payload = json!({"sql": ["CREATE TABLE a (x)", "INSERT INTO missing VALUES (1)"], "checks": []});
        assert_eq!(
            permanent(sandbox.execute(request("seed", payload)).await),
            "step seed: statement sql[1] failed: no such table: missing"
        );
    }

    #[tokio::test]
    async fn a_failing_or_writing_check_is_a_permanent_failure() {
        let sandbox = SqliteSandbox::new();
        let bad = json!({"sql": [], "checks": [{"name": "n", "query": "SELECT * FROM nowhere"}]});
        assert_eq!(
            permanent(sandbox.execute(request("a", bad)).await),
            "step a: check checks[0] (n) failed: no such table: nowhere"
        );
        let writing =
            json!({"sql": ["CREATE TABLE w (x)"], "checks": [{"name": "w", "query": "INSERT INTO w VALUES (1)"}]});
        assert!(permanent(sandbox.execute(request("b", writing)).await).ends_with("must only read the sandbox"));
    }

    #[tokio::test]
    async fn malformed_payloads_name_the_field() {
        let sandbox = SqliteSandbox::new();
        let cases = [
            (json!({"checks": []}), "step s: payload field sql is missing"),
            (
                json!({"sql": "SELECT 1", "checks": []}),
                "step s: payload field sql must be an array",
            ),
            (
                json!({"sql": [1], "checks": []}),
                "step s: payload field sql[0] must be a string",
            ),
            (json!({"sql": []}), "step s: payload field checks is missing"),
            (
                json!({"sql": [], "checks": {}}),
                "step s: payload field checks must be an array",
            ),
            (
                json!({"sql": [], "checks": [{"name": "x"}]}),
                "step s: payload field checks[0].query is missing",
            ),
            (
                json!({"sql": [], "checks": [{"name": 1, "query": "SELECT 1"}]}),
                "step s: payload field checks[0].name must be",
            ),
            (
                json!({"sql": [], "checks": [{"name": "x", "query": "SELECT 1"}, {"name": "x", "query": "SELECT 2"}]}),
                "step s: payload field checks[1].name \"x\" is used by an earlier check",
            ),
            (
                json!({"sql": [], "checks": [], "chekcs": []}),
                "step s: payload field \"chekcs\" is not known",
            ),
            (
                json!({"sql": [], "checks": [], "delay_ms": "1s"}),
                "step s: payload field delay_ms must be",
            ),
            (
                json!({"sql": [], "checks": [], "undo_sql": "DROP TABLE x"}),
                "step s: payload field undo_sql must be",
            ),
        ];
        for (payload, expected) in cases {
            let message = permanent(sandbox.execute(request("s", payload)).await);
            assert!(
                message.starts_with(expected),
                "{message:?} should start with {expected:?}"
            );
        }
    }

    #[tokio::test]
    async fn release_drops_the_sandbox() {
        let sandbox = SqliteSandbox::new();
        evidence(sandbox.execute(request("create", create())).await);
        sandbox.release(&AttemptId::new("att-other"), 1);
        assert_eq!(sandbox.open_sandboxes().len(), 1);
        sandbox.release(&AttemptId::new("att-1"), 1);
        assert!(sandbox.open_sandboxes().is_empty());
        // The same delivery after release starts from an empty database again.
        let count = json!({"sql": [], "checks": [{"name": "tables", "query": "SELECT count(*) FROM sqlite_master"}]});
        assert_eq!(
            evidence(sandbox.execute(request("count", count)).await)["checks"]["tables"],
            json!([[0]])
        );
    }

    #[tokio::test]
    async fn compensate_runs_undo_sql_and_marks_the_evidence() {
        let sandbox = SqliteSandbox::new();
        let mut payload = create();
        payload["undo_sql"] = json!(["DROP TABLE IF EXISTS t"]);
        evidence(sandbox.execute(request("create", payload.clone())).await);
        let mut undo = request("create", payload);
        undo.action = Action::Compensate;
        undo.idempotency_key = "ik-undo".into();
        assert_eq!(
            evidence(sandbox.execute(undo).await),
            json!({"sandbox_id": "sbx-att-1-d1", "checks": {}, "statements": 1, "compensated": true})
        );
        let tables = json!({"sql": [], "checks": [{"name": "n", "query": "SELECT count(*) FROM sqlite_master"}]});
        assert_eq!(
            evidence(sandbox.execute(request("after", tables)).await)["checks"]["n"],
            json!([[0]])
        );
    }

    #[tokio::test]
    async fn compensate_without_undo_sql_does_nothing() {
        let mut req = request("create", create());
        req.action = Action::Compensate;
        let ev = evidence(SqliteSandbox::new().execute(req).await);
        assert_eq!(ev["statements"], 0);
        assert_eq!(ev["compensated"], true);
    }

    #[tokio::test]
    async fn foreign_keys_are_enforced() {
        let payload = json!({
            "sql": ["CREATE TABLE p (id INTEGER PRIMARY KEY)",
                    "CREATE TABLE c (p_id INTEGER REFERENCES p(id))",
                    "INSERT INTO c VALUES (7)"],
            "checks": [],
        });
        let message = permanent(SqliteSandbox::new().execute(request("fk", payload)).await);
        assert_eq!(
            message,
            "step fk: statement sql[2] failed: FOREIGN KEY constraint failed"
        );
    }

    #[tokio::test]
    async fn a_delay_sleeps_before_running() {
        let started = tokio::time::Instant::now();
        let payload = json!({"sql": [], "checks": [], "delay_ms": 1});
        evidence(SqliteSandbox::new().execute(request("slow", payload)).await);
        assert!(started.elapsed() >= std::time::Duration::from_millis(1));
    }
}
