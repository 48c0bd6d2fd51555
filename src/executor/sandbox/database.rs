//! One sandbox database and the running of a step in it: the code both modes share.
//! The in-process mode calls [`Sandbox::step`] on tokio's blocking pool; a sandbox
//! child process calls the very same function for each step request it reads.

use super::{MAX_CHECK_ROWS, MAX_DATABASE_PAGES, MAX_EVIDENCE_BYTES, MAX_SQL_BYTES, MAX_VALUE_BYTES, NAME};
use crate::executor::ExecutorResult;
use rusqlite::config::DbConfig;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
/// SQLite's extended code for an in-memory temporary file that could not grow.
const SQLITE_IOERR_NOMEM: i32 = 3082;

/// One step, as a sandbox database runs it (and as a child process reads it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StepRequest {
    /// The step's code, for messages.
    pub(super) code: String,
    /// The idempotency key: a repeated key gets the first answer again.
    pub(super) key: String,
    /// The sandbox's id, for the evidence and the receipt.
    pub(super) sandbox_id: String,
    /// `sql`, or `undo_sql` when compensating.
    pub(super) statements: Vec<String>,
    /// The checks (none when compensating).
    pub(super) checks: Vec<Check>,
    /// Whether the statements are the step's `undo_sql`.
    pub(super) compensate: bool,
}

/// One check of a step: a named read-only query.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Check {
    pub(super) name: String,
    pub(super) query: String,
}

/// One delivery's sandbox database.
pub(super) struct Sandbox {
    conn: Connection,
    /// True while checks run: the authorizer then denies every write.
    checking: Arc<AtomicBool>,
    /// Answers by idempotency key, so a repeated key gets the same answer.
    answered: BTreeMap<String, ExecutorResult>,
    /// The process-wide SQLite heap limit set for this sandbox, if any.
    memory_budget: Option<u64>,
}

impl Sandbox {
    /// Opens a fresh, locked-down sandbox database. With `memory_budget`, SQLite's
    /// heap in this whole process is limited to that many bytes: only a process that
    /// holds this one sandbox may pass it.
    pub(super) fn open(memory_budget: Option<u64>) -> Result<Self, String> {
        let checking = Arc::new(AtomicBool::new(false));
        let conn = open_sandbox(Arc::clone(&checking), memory_budget)?;
        Ok(Self {
            conn,
            checking,
            answered: BTreeMap::new(),
            memory_budget,
        })
    }

    /// Runs `request` unless its key was answered before. Its SQL stops soon after
    /// `cancelled` is set, and a cancelled step's answer is not kept (nobody got it).
    pub(super) fn step(&mut self, request: &StepRequest, cancelled: &Arc<AtomicBool>) -> ExecutorResult {
        if let Some(answer) = self.answered.get(&request.key) {
            return answer.clone();
        }
        if cancelled.load(Ordering::Relaxed) {
            return ExecutorResult::Permanent(format!("step {}: cancelled before it ran", request.code));
        }
        let flag = Arc::clone(cancelled);
        // Without its progress handler the step could not be cancelled: it does not
        // run then, as when its sandbox cannot be opened.
        if let Err(e) = self
            .conn
            .progress_handler(PROGRESS_OPS, Some(move || flag.load(Ordering::Relaxed)))
        {
            return ExecutorResult::Transient(format!(
                "step {}: could not arm the sandbox's cancellation: {e}",
                request.code
            ));
        }
        let answer = run_step(self, request);
        // A handler left in place only reads this step's flag; the next step
        // installs its own.
        let _ = self.conn.progress_handler(0, None::<fn() -> bool>);
        if !cancelled.load(Ordering::Relaxed) {
            self.answered.insert(request.key.clone(), answer.clone());
        }
        answer
    }

    /// An SQL error, in words; running out of the memory budget names the budget.
    fn sql_error(&self, e: &rusqlite::Error) -> String {
        let out_of_memory = match e {
            rusqlite::Error::SqliteFailure(code, _) => {
                code.code == ErrorCode::OutOfMemory || code.extended_code == SQLITE_IOERR_NOMEM
            }
            _ => false,
        };
        match self.memory_budget {
            Some(bytes) if out_of_memory => memory_budget_exceeded(bytes),
            _ => e.to_string(),
        }
    }
}

/// The message of a step that ran out of its sandbox's memory budget.
fn memory_budget_exceeded(bytes: u64) -> String {
    format!("it exceeded the sandbox memory budget of {} MiB ({NAME})", bytes >> 20)
}

/// Opens a fresh in-memory sandbox database, locked down as the module docs say.
fn open_sandbox(checking: Arc<AtomicBool>, memory_budget: Option<u64>) -> Result<Connection, String> {
    let fail = |what: &str, e: rusqlite::Error| format!("could not {what} in the sandbox: {e}");
    let mut conn = Connection::open_in_memory().map_err(|e| format!("could not open a sandbox database: {e}"))?;
    if let Some(bytes) = memory_budget {
        // Process-wide, before the database holds anything: in a child process of
        // its own, SQLite's whole heap is this sandbox's.
        conn.execute_batch(&format!("PRAGMA hard_heap_limit = {bytes}"))
            .map_err(|e| fail("set its memory budget", e))?;
        let set: i64 = conn
            .query_row("PRAGMA hard_heap_limit", [], |row| row.get(0))
            .map_err(|e| fail("read its memory budget", e))?;
        if u64::try_from(set).ok() != Some(bytes) {
            return Err(format!(
                "could not set the sandbox's memory budget of {bytes} bytes (SQLite kept {set})"
            ));
        }
    }
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

/// Runs a step's statements, then its checks read-only, into its evidence.
fn run_step(sandbox: &Sandbox, request: &StepRequest) -> ExecutorResult {
    let conn = &sandbox.conn;
    let code = &request.code;
    let field = if request.compensate { "undo_sql" } else { "sql" };
    for (index, sql) in request.statements.iter().enumerate() {
        if let Err(e) = conn.execute_batch(sql) {
            let e = sandbox.sql_error(&e);
            return ExecutorResult::Permanent(format!("step {code}: statement {field}[{index}] failed: {e}"));
        }
    }
    let mut results = Map::new();
    let mut budget = MAX_EVIDENCE_BYTES;
    sandbox.checking.store(true, Ordering::Relaxed);
    let checked = request.checks.iter().enumerate().try_for_each(|(index, check)| {
        match run_check(sandbox, &check.query, &mut budget) {
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
    let sandbox_id = &request.sandbox_id;
    let mut evidence = json!({
        "sandbox_id": sandbox_id,
        "checks": results,
        "statements": request.statements.len(),
    });
    if request.compensate {
        evidence["compensated"] = Value::Bool(true);
    }
    ExecutorResult::Done {
        evidence,
        target_receipt: json!({ "sandbox": sandbox_id, "idempotency_key": request.key }),
    }
}

/// Runs one check query, read-only, spending its rows' JSON size from `budget`.
fn run_check(sandbox: &Sandbox, query: &str, budget: &mut usize) -> Result<Vec<Value>, String> {
    let error = |e: rusqlite::Error| sandbox.sql_error(&e);
    let mut stmt = sandbox.conn.prepare(query).map_err(error)?;
    if !stmt.readonly() {
        return Err("a check must only read the sandbox".into());
    }
    let columns = stmt.column_count();
    let mut rows = stmt.query([]).map_err(error)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(error)? {
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
