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
//! # Threat model: what a plan author can and cannot do
//!
//! A plan author is not trusted. Plan SQL can create, fill, query and drop tables,
//! views, indexes and triggers in its own in-memory database and nothing else:
//! - an authorizer denies, at prepare time, everything that reaches outside that
//!   database: `ATTACH`/`DETACH` (so also `VACUUM INTO` a host file), virtual tables,
//!   `load_extension` and every `PRAGMA` except a few read-only introspection ones
//!   (`table_info`, `index_list`, …) and `user_version`/`application_id` (so no
//!   `temp_store_directory`, `journal_mode`, `writable_schema`, `foreign_keys = OFF`);
//!   the attached-database limit is zero;
//! - SQLite's defensive mode is on and the schema is untrusted, temporary storage
//!   stays in memory, and the database is capped at [`MAX_DATABASE_PAGES`] pages;
//! - SQL text is capped at [`MAX_SQL_BYTES`] per statement and [`MAX_VALUE_BYTES`]
//!   per value; each check at [`MAX_CHECK_ROWS`] rows, and a step's evidence at
//!   [`MAX_EVIDENCE_BYTES`]: past a cap the step fails permanently, naming it;
//! - checks are truly read-only: while they run the authorizer denies every write,
//!   transaction, savepoint and pragma that sets something, and a statement SQLite
//!   does not call read-only is refused;
//! - the SQL runs on tokio's blocking pool, never on an async thread, with a progress
//!   handler that ends it as soon as its call is dropped — the worker's per-step time
//!   budget (`step_timeout`) or the end of its grace period — so a runaway query
//!   never stops heartbeats, other deliveries or shutdown.
//!
//! A plan author therefore cannot read or write host files, the ledger or its lease
//! tokens, load code, or keep a worker busy past its step budget. It can still spend
//! up to a step's budget of one blocking thread's CPU and the memory of one capped
//! database per open delivery.
//!
//! Plan SQL runs on SQLite itself, so SQLite's own bugs are within its reach: the
//! bundled SQLite is kept current (`docs/security.md`).

use super::{describe, pace, payload_delay_ms, ExecRequest, Executor, ExecutorResult};
use leasehold_engine::{Action, AttemptId, Step};
use rusqlite::config::DbConfig;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::types::ValueRef;
use rusqlite::Connection;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The executor name plans use for [`SqliteSandbox`].
pub const NAME: &str = "sqlite-sandbox:v1";

const PAYLOAD_FIELDS: &[&str] = &["sql", "checks", "undo_sql", "delay_ms"];

/// The longest SQL statement text a sandbox prepares, in bytes.
pub const MAX_SQL_BYTES: i32 = 64 * 1024;
/// The largest string or blob value a sandbox holds, in bytes.
pub const MAX_VALUE_BYTES: i32 = 1024 * 1024;
/// The most pages (4 KiB each) a sandbox database (main or temp) may grow to: 64 MiB.
pub const MAX_DATABASE_PAGES: u32 = 16_384;
/// The most rows one check may answer.
pub const MAX_CHECK_ROWS: usize = 1_000;
/// The most bytes (as JSON) the check rows of one step may add up to: the worker's
/// default evidence cap, which every executor's evidence is held to.
pub const MAX_EVIDENCE_BYTES: usize = leasehold_engine::lease::MAX_EVIDENCE_BYTES;
/// Virtual-machine instructions between two looks at whether the step was cancelled.
const PROGRESS_OPS: i32 = 1_000;
/// The pragmas plan SQL may run: read-only introspection of its own database.
const READ_PRAGMAS: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "integrity_check",
    "quick_check",
    "collation_list",
];
/// The pragmas plan SQL may also set: numbers in its own database's header.
const HEADER_PRAGMAS: &[&str] = &["user_version", "application_id"];
/// SQL functions plan SQL may not call, whatever this build of SQLite includes.
const DENIED_FUNCTIONS: &[&str] = &["load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"];

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
    /// True while checks run: the authorizer then denies every write.
    checking: Arc<AtomicBool>,
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
        let checking = Arc::new(AtomicBool::new(false));
        let conn = open_sandbox(Arc::clone(&checking))?;
        let sandbox = Arc::new(Mutex::new(Sandbox {
            conn,
            checking,
            answered: BTreeMap::new(),
        }));
        map.insert((attempt.clone(), delivery), Arc::clone(&sandbox));
        Ok(sandbox)
    }

    /// Runs a step in its delivery's sandbox on the blocking pool. Dropping the
    /// returned future (a step budget or a grace period ran out) cancels the SQL.
    async fn run(&self, request: ExecRequest, payload: StepPayload) -> ExecutorResult {
        let sandbox = match self.sandbox(&request.attempt_id, request.delivery) {
            Ok(sandbox) => sandbox,
            Err(message) => return ExecutorResult::Transient(format!("step {}: {message}", request.step.code)),
        };
        let cancelled = Arc::new(AtomicBool::new(false));
        let _cancel_on_drop = CancelOnDrop(Arc::clone(&cancelled));
        let code = request.step.code.clone();
        let task = tokio::task::spawn_blocking(move || {
            // A poisoned sandbox is still usable: the step that panicked is reported
            // by its own caller, and later steps see whatever it committed.
            let mut sandbox = sandbox.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(answer) = sandbox.answered.get(&request.idempotency_key) {
                return answer.clone();
            }
            if cancelled.load(Ordering::Relaxed) {
                return ExecutorResult::Permanent(format!("step {}: cancelled before it ran", request.step.code));
            }
            let flag = Arc::clone(&cancelled);
            // Without its progress handler the step could not be cancelled: it does
            // not run then, as when its sandbox cannot be opened.
            if let Err(e) = sandbox
                .conn
                .progress_handler(PROGRESS_OPS, Some(move || flag.load(Ordering::Relaxed)))
            {
                return ExecutorResult::Transient(format!(
                    "step {}: could not arm the sandbox's cancellation: {e}",
                    request.step.code
                ));
            }
            let sandbox_id = Self::sandbox_id(&request.attempt_id, request.delivery);
            let answer = run_step(&sandbox, &request.step, &payload, &sandbox_id, &request.idempotency_key);
            // A handler left in place only reads this step's flag, which is set once
            // the step's future is gone; the next step installs its own.
            let _ = sandbox.conn.progress_handler(0, None::<fn() -> bool>);
            // A cancelled step has no answer to repeat: nobody received this one.
            if !cancelled.load(Ordering::Relaxed) {
                sandbox.answered.insert(request.idempotency_key.clone(), answer.clone());
            }
            answer
        });
        match task.await {
            Ok(answer) => answer,
            Err(e) => ExecutorResult::Permanent(format!("step {code}: the sandbox failed: {e}")),
        }
    }
}

/// Sets its flag when dropped: the running step's progress handler then interrupts
/// its SQL.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Opens a fresh in-memory sandbox database, locked down as the module docs say.
fn open_sandbox(checking: Arc<AtomicBool>) -> Result<Connection, String> {
    let fail = |what: &str, e: rusqlite::Error| format!("could not {what} in the sandbox: {e}");
    let mut conn = Connection::open_in_memory().map_err(|e| format!("could not open a sandbox database: {e}"))?;
    conn.execute_batch(&format!(
        "PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY; \
         PRAGMA main.max_page_count = {MAX_DATABASE_PAGES}; PRAGMA temp.max_page_count = {MAX_DATABASE_PAGES};"
    ))
    .map_err(|e| fail("set its pragmas", e))?;
    for (limit, value) in [
        (Limit::SQLITE_LIMIT_ATTACHED, 0),
        (Limit::SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_BYTES),
        (Limit::SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES),
    ] {
        conn.set_limit(limit, value).map_err(|e| fail("set its limits", e))?;
    }
    for (setting, on) in [
        (DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true),
        (DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false),
        (DbConfig::SQLITE_DBCONFIG_WRITABLE_SCHEMA, false),
    ] {
        conn.set_db_config(setting, on)
            .map_err(|e| fail("configure the database", e))?;
    }
    conn.authorizer(Some(move |ctx: AuthContext<'_>| {
        if authorize(&ctx, checking.load(Ordering::Relaxed)) {
            Authorization::Allow
        } else {
            Authorization::Deny
        }
    }))
    .map_err(|e| fail("install its authorizer", e))?;
    Ok(conn)
}

/// Whether plan SQL may do `ctx`; while `checking`, only reads are allowed.
fn authorize(ctx: &AuthContext<'_>, checking: bool) -> bool {
    // Only the sandbox's own databases: nothing else can be attached anyway.
    let own = matches!(ctx.database_name, None | Some("main") | Some("temp"));
    match ctx.action {
        AuthAction::Select | AuthAction::Recursive => true,
        AuthAction::Read { .. } => own,
        AuthAction::Function { function_name } => {
            !DENIED_FUNCTIONS.iter().any(|f| f.eq_ignore_ascii_case(function_name))
        }
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } => {
            let named = |list: &[&str]| list.iter().any(|p| p.eq_ignore_ascii_case(pragma_name));
            // A read-only pragma's value is its argument (a table name); a header
            // pragma with a value sets it, which only the step's own SQL may do.
            named(READ_PRAGMAS) || (named(HEADER_PRAGMAS) && (pragma_value.is_none() || !checking))
        }
        AuthAction::Insert { .. }
        | AuthAction::Update { .. }
        | AuthAction::Delete { .. }
        | AuthAction::CreateIndex { .. }
        | AuthAction::CreateTable { .. }
        | AuthAction::CreateTempIndex { .. }
        | AuthAction::CreateTempTable { .. }
        | AuthAction::CreateTempTrigger { .. }
        | AuthAction::CreateTempView { .. }
        | AuthAction::CreateTrigger { .. }
        | AuthAction::CreateView { .. }
        | AuthAction::DropIndex { .. }
        | AuthAction::DropTable { .. }
        | AuthAction::DropTempIndex { .. }
        | AuthAction::DropTempTable { .. }
        | AuthAction::DropTempTrigger { .. }
        | AuthAction::DropTempView { .. }
        | AuthAction::DropTrigger { .. }
        | AuthAction::DropView { .. }
        | AuthAction::AlterTable { .. }
        | AuthAction::Reindex { .. }
        | AuthAction::Analyze { .. }
        | AuthAction::Transaction { .. }
        | AuthAction::Savepoint { .. } => !checking && own,
        // ATTACH, DETACH, virtual tables and anything this list does not name.
        _ => false,
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
        self.run(request, payload).await
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

fn run_step(sandbox: &Sandbox, step: &Step, payload: &StepPayload, sandbox_id: &str, key: &str) -> ExecutorResult {
    let conn = &sandbox.conn;
    let code = &step.code;
    let field = if payload.compensate { "undo_sql" } else { "sql" };
    for (index, sql) in payload.statements.iter().enumerate() {
        if let Err(e) = conn.execute_batch(sql) {
            return ExecutorResult::Permanent(format!("step {code}: statement {field}[{index}] failed: {e}"));
        }
    }
    let mut results = Map::new();
    let mut budget = MAX_EVIDENCE_BYTES;
    sandbox.checking.store(true, Ordering::Relaxed);
    let checked = payload.checks.iter().enumerate().try_for_each(|(index, check)| {
        match run_check(conn, &check.query, &mut budget) {
            Ok(rows) => {
                results.insert(check.name.clone(), Value::Array(rows));
                Ok(())
            }
            Err(e) => Err(ExecutorResult::Permanent(format!(
                "step {code}: check checks[{index}] ({}) failed: {e}",
                check.name
            ))),
        }
    });
    sandbox.checking.store(false, Ordering::Relaxed);
    if let Err(failed) = checked {
        return failed;
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

/// Runs one check query, read-only, spending its rows' JSON size from `budget`.
fn run_check(conn: &Connection, query: &str, budget: &mut usize) -> Result<Vec<Value>, String> {
    let mut stmt = conn.prepare(query).map_err(|e| e.to_string())?;
    if !stmt.readonly() {
        return Err("a check must only read the sandbox".into());
    }
    let columns = stmt.column_count();
    let mut rows = stmt.query([]).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(|e| e.to_string())? {
        if out.len() == MAX_CHECK_ROWS {
            return Err(format!(
                "it answers more than {MAX_CHECK_ROWS} rows (the limit per check)"
            ));
        }
        let values = (0..columns)
            .map(|i| row.get_ref(i).map(json_value).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let row = Value::Array(values);
        let bytes = row.to_string().len() + 1;
        *budget = budget.checked_sub(bytes).ok_or_else(|| {
            format!("the step's check rows exceed {MAX_EVIDENCE_BYTES} bytes of evidence (the limit per step)")
        })?;
        out.push(row);
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
        assert_eq!(
            permanent(sandbox.execute(request("b", writing)).await),
            "step b: check checks[0] (w) failed: not authorized"
        );
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

    #[tokio::test]
    async fn nothing_outside_the_sandbox_database_can_be_reached() {
        let dir = tempfile::tempdir().unwrap();
        let host = |name: &str| dir.path().join(name).display().to_string();
        let attacks = [
            format!("ATTACH DATABASE '{}' AS x", host("attached.db")),
            format!("ATTACH DATABASE 'file:{}?mode=rwc' AS x", host("uri.db")),
            format!("VACUUM INTO '{}'", host("vacuumed.db")),
            format!("PRAGMA temp_store_directory = '{}'", host("")),
            "PRAGMA writable_schema = ON".to_owned(),
            "PRAGMA foreign_keys = OFF".to_owned(),
            "SELECT load_extension('/tmp/evil')".to_owned(),
            "DETACH DATABASE temp".to_owned(),
        ];
        for (i, sql) in attacks.iter().enumerate() {
            let sandbox = SqliteSandbox::new();
            let payload = json!({"sql": ["CREATE TABLE t (x)", sql], "checks": []});
            let message = permanent(sandbox.execute(request(&format!("s{i}"), payload)).await);
            assert!(
                message.starts_with(&format!("step s{i}: statement sql[1] failed:")),
                "{sql}: {message}"
            );
        }
        let created: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(created.is_empty(), "host files were created: {created:?}");
    }

    #[tokio::test]
    async fn checks_cannot_write_attach_or_change_settings() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("check.db").display().to_string();
        let sandbox = SqliteSandbox::new();
        evidence(sandbox.execute(request("seed", create())).await);
        let queries = [
            format!("ATTACH DATABASE '{file}' AS x"),
            "PRAGMA user_version = 7".to_owned(),
            "BEGIN".to_owned(),
            "CREATE TABLE u (x)".to_owned(),
            "DELETE FROM t".to_owned(),
            "DELETE FROM t RETURNING id".to_owned(),
        ];
        for (i, query) in queries.iter().enumerate() {
            let payload = json!({"sql": [], "checks": [{"name": "c", "query": query}]});
            let message = permanent(sandbox.execute(request(&format!("c{i}"), payload)).await);
            assert!(
                message.starts_with(&format!("step c{i}: check checks[0] (c) failed")),
                "{query}: {message}"
            );
        }
        assert!(!std::path::Path::new(&file).exists());
        let count = json!({"sql": [], "checks": [{"name": "n", "query": "SELECT count(*) FROM t"}]});
        assert_eq!(
            evidence(sandbox.execute(request("n", count)).await)["checks"]["n"],
            json!([[2]])
        );
        // The step's own SQL may still write after a check ran.
        let write = json!({"sql": ["INSERT INTO t (id) VALUES (3)"], "checks": []});
        evidence(sandbox.execute(request("w", write)).await);
    }

    #[tokio::test]
    async fn evidence_is_capped_by_rows_and_bytes() {
        let sandbox = SqliteSandbox::new();
        let rows = json!({"sql": [], "checks": [{"name": "many", "query":
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 1001) SELECT i FROM n"}]});
        let message = permanent(sandbox.execute(request("rows", rows)).await);
        assert!(
            message.ends_with("answers more than 1000 rows (the limit per check)"),
            "{message}"
        );
        let bytes = json!({"sql": [], "checks": [{"name": "big", "query":
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 300) SELECT zeroblob(1000) FROM n"}]});
        let message = permanent(sandbox.execute(request("bytes", bytes)).await);
        assert!(message.contains("exceed 262144 bytes of evidence"), "{message}");
        let huge = json!({"sql": ["SELECT zeroblob(2000000)"], "checks": []});
        let message = permanent(sandbox.execute(request("huge", huge)).await);
        assert!(message.contains("too big"), "{message}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_a_runaway_step_stops_its_sql() {
        let sandbox = SqliteSandbox::new();
        let runaway = json!({"sql": ["WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"], "checks": []});
        let budget = std::time::Duration::from_millis(200);
        let outcome = tokio::time::timeout(budget, sandbox.execute(request("runaway", runaway))).await;
        assert!(outcome.is_err(), "a query that never ends ended: {outcome:?}");
        // The next step of the same delivery needs the sandbox the runaway held: it
        // runs only once the runaway's SQL was interrupted.
        let next = json!({"sql": [], "checks": [{"name": "one", "query": "SELECT 1"}]});
        let answer = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            sandbox.execute(request("next", next)),
        )
        .await
        .expect("the runaway step still holds the sandbox");
        assert_eq!(evidence(answer)["checks"]["one"], json!([[1]]));
    }
}
