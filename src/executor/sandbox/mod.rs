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
//! # Two modes
//!
//! - **Isolated** ([`SqliteSandbox::isolated`], what the `leasehold` binary runs):
//!   each delivery's sandbox lives in a child process of its own, started on the
//!   delivery's first step and killed on its release. In the child, SQLite's
//!   process-wide hard heap limit is that one sandbox's memory budget,
//!   [`MEMORY_BUDGET_BYTES`]: databases, temporary tables, sorters and statements
//!   together cannot pass it, and a step that would fails permanently with
//!   `… exceeded the sandbox memory budget of 64 MiB (sqlite-sandbox:v1)`. A step
//!   whose call is dropped (its time budget or a grace period ran out) kills its
//!   child at once; the delivery's sandbox is then gone, and every later step of
//!   that delivery fails permanently saying why — a delivery never continues on a
//!   fresh, empty sandbox. A child that dies (a crash, the system's OOM killer)
//!   fails its step permanently the same way. The child is the worker's own
//!   program run with [`CHILD_ARG`] ([`child_main_if_requested`]).
//! - **In-process** ([`SqliteSandbox::new`], for embedders and tests): the sandbox
//!   is a database in the worker's own process. It is **not** memory-isolated:
//!   SQLite's heap limit is process-wide, so nothing bounds the heap a sandbox's
//!   temporary tables and sorters take there. A dropped step's SQL is interrupted
//!   by a progress handler and the sandbox stays usable.
//!
//! Both modes run a step with the same code (`database.rs`).
//!
//! # Threat model: what a plan author can and cannot do
//!
//! A plan author is not trusted. Plan SQL can create, fill, query and drop tables,
//! views, indexes and triggers in its own in-memory database and nothing else:
//! - an authorizer denies, at prepare time, everything that reaches outside that
//!   database: `ATTACH`/`DETACH` (so also `VACUUM INTO` a host file), virtual tables,
//!   `load_extension` and every `PRAGMA` except a few read-only introspection ones
//!   (`table_info`, `index_list`, …) and `user_version`/`application_id` (so no
//!   `temp_store_directory`, `journal_mode`, `writable_schema`, `foreign_keys = OFF`,
//!   `hard_heap_limit`); the attached-database limit is zero;
//! - SQLite's defensive mode is on and the schema is untrusted, temporary storage
//!   stays in memory, and each database (main, temp) is capped at
//!   [`MAX_DATABASE_PAGES`] pages; in the isolated mode SQLite's whole heap is
//!   capped at [`MEMORY_BUDGET_BYTES`];
//! - SQL text is capped at [`MAX_SQL_BYTES`] per statement and [`MAX_VALUE_BYTES`]
//!   per value; each check at [`MAX_CHECK_ROWS`] rows, and a step's evidence at
//!   [`MAX_EVIDENCE_BYTES`]: past a cap the step fails permanently, naming it;
//! - checks are truly read-only: while they run the authorizer denies every write,
//!   transaction, savepoint and pragma that sets something, and a statement SQLite
//!   does not call read-only is refused;
//! - the worker never runs the SQL on an async thread (the isolated mode waits for
//!   its child on tokio's blocking pool; the in-process mode runs the SQL there), and
//!   a step's SQL ends as soon as its call is dropped — the worker's per-step time
//!   budget (`step_timeout`) or the end of its grace period — so a runaway query
//!   never stops heartbeats, other deliveries or shutdown;
//! - the child process starts with an empty environment, and when its stdin closes
//!   (the worker is gone) its running SQL is interrupted and it exits.
//!
//! A plan author therefore cannot read or write host files, the ledger or its lease
//! tokens, load code, or keep a worker busy past its step budget. With the isolated
//! mode it can still spend up to a step's budget of one process's CPU and
//! [`MEMORY_BUDGET_BYTES`] of SQLite heap (plus the child program's own baseline)
//! per open delivery.
//!
//! Plan SQL runs on SQLite itself, so SQLite's own bugs are within its reach: the
//! bundled SQLite is kept current (`docs/security.md`); in the isolated mode such a
//! bug reaches a child process holding one sandbox, not the worker.

mod child;
mod database;
mod isolated;
mod payload;

pub use child::{child_main, child_main_if_requested, CHILD_ARG};

use super::{pace, ExecRequest, Executor, ExecutorResult};
use child::ChildSandbox;
use database::{Sandbox, StepRequest};
use leasehold_engine::AttemptId;
use payload::StepPayload;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The executor name plans use for [`SqliteSandbox`].
pub const NAME: &str = "sqlite-sandbox:v1";

/// The longest SQL statement text a sandbox prepares, in bytes.
pub const MAX_SQL_BYTES: i32 = 64 * 1024;
/// The largest string or blob value a sandbox holds, in bytes.
pub const MAX_VALUE_BYTES: i32 = 1024 * 1024;
/// The memory budget of one sandbox in the isolated mode: SQLite's hard heap limit in
/// its child process, 64 MiB. Everything SQLite allocates for the sandbox counts:
/// its databases' pages, temporary tables, sorters, prepared statements.
pub const MEMORY_BUDGET_BYTES: u64 = 64 * 1024 * 1024;
/// The most pages (4 KiB each) a sandbox database (main or temp) may grow to: 48 MiB,
/// so that a full database (its pages and the cache's bookkeeping for each) fits in
/// [`MEMORY_BUDGET_BYTES`] with room left for the statements that query it.
pub const MAX_DATABASE_PAGES: u32 = 12_288;
/// The most rows one check may answer.
pub const MAX_CHECK_ROWS: usize = 1_000;
/// The most bytes (as JSON) the check rows of one step may add up to: the worker's
/// default evidence cap, which every executor's evidence is held to.
pub const MAX_EVIDENCE_BYTES: usize = leasehold_engine::lease::MAX_EVIDENCE_BYTES;

/// A delivery's sandbox: (attempt, delivery).
type Key = (AttemptId, u32);

/// The `sqlite-sandbox:v1` executor: one in-memory SQLite database per delivery,
/// in this process ([`SqliteSandbox::new`]) or in a child process of its own
/// ([`SqliteSandbox::isolated`]).
#[derive(Default)]
pub struct SqliteSandbox {
    /// The program each sandbox runs in, or `None` for the in-process mode.
    program: Option<PathBuf>,
    /// The in-process mode's sandboxes. Each sits behind its own lock so that
    /// deliveries do not wait for one another's SQL.
    in_process: Mutex<BTreeMap<Key, Arc<Mutex<Sandbox>>>>,
    /// The isolated mode's sandboxes.
    children: Mutex<BTreeMap<Key, Held>>,
}

/// Where an isolated sandbox is.
enum Held {
    /// Between steps.
    Idle(ChildSandbox),
    /// A step holds it (or is starting it: no process id yet).
    Busy(Option<u32>),
    /// Gone mid-delivery, for this reason; never replaced.
    Lost(String),
}

impl SqliteSandbox {
    /// An executor running each sandbox in this process. SQLite's heap is not
    /// bounded per sandbox then (see the module docs): for embedders and tests
    /// that trust their plans' memory use.
    pub fn new() -> Self {
        Self::default()
    }

    /// An executor running each delivery's sandbox in a child process of its own,
    /// `program` run with [`CHILD_ARG`]: SQLite's heap there is bounded by
    /// [`MEMORY_BUDGET_BYTES`]. `program` must call [`child_main_if_requested`] first
    /// thing in `main` (the `leasehold` binary does; pass
    /// `std::env::current_exe()` from a program that does too).
    pub fn isolated(program: impl Into<PathBuf>) -> Self {
        Self {
            program: Some(program.into()),
            ..Self::default()
        }
    }

    /// The program sandboxes run in, in the isolated mode.
    pub fn program(&self) -> Option<&Path> {
        self.program.as_deref()
    }

    /// The id of the sandbox of one delivery of an attempt: `sbx-<attempt>-d<delivery>`.
    pub fn sandbox_id(attempt: &AttemptId, delivery: u32) -> String {
        format!("sbx-{attempt}-d{delivery}")
    }

    /// The deliveries whose sandboxes are open (not yet released), in order.
    pub fn open_sandboxes(&self) -> Vec<(AttemptId, u32)> {
        let mut open: Vec<Key> = self.lock_in_process().keys().cloned().collect();
        open.extend(self.lock_children().keys().cloned());
        open.sort();
        open
    }

    /// The process id of a delivery's sandbox child, in the isolated mode, while
    /// the child runs (for watching its memory).
    pub fn sandbox_process(&self, attempt: &AttemptId, delivery: u32) -> Option<u32> {
        match self.lock_children().get(&(attempt.clone(), delivery))? {
            Held::Idle(child) => Some(child.process.pid()),
            Held::Busy(pid) => *pid,
            Held::Lost(_) => None,
        }
    }

    // A panic while holding a map cannot leave it half-updated: every critical
    // section is a single insert, remove or read.
    fn lock_in_process(&self) -> MutexGuard<'_, BTreeMap<Key, Arc<Mutex<Sandbox>>>> {
        self.in_process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_children(&self) -> MutexGuard<'_, BTreeMap<Key, Held>> {
        self.children.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SqliteSandbox {
    /// Runs a step in its delivery's in-process sandbox on the blocking pool.
    /// Dropping the returned future cancels the SQL; the sandbox stays usable.
    async fn run_in_process(&self, key: Key, request: StepRequest) -> ExecutorResult {
        let sandbox = match self.in_process_sandbox(key) {
            Ok(sandbox) => sandbox,
            Err(message) => return ExecutorResult::Transient(format!("step {}: {message}", request.code)),
        };
        let cancelled = Arc::new(AtomicBool::new(false));
        let _cancel_on_drop = CancelOnDrop(Arc::clone(&cancelled));
        let code = request.code.clone();
        let task = tokio::task::spawn_blocking(move || {
            // A poisoned sandbox is still usable: the step that panicked is reported
            // by its own caller, and later steps see whatever it committed.
            let mut sandbox = sandbox.lock().unwrap_or_else(PoisonError::into_inner);
            sandbox.step(&request, &cancelled)
        });
        match task.await {
            Ok(answer) => answer,
            Err(e) => ExecutorResult::Permanent(format!("step {code}: the sandbox failed: {e}")),
        }
    }

    fn in_process_sandbox(&self, key: Key) -> Result<Arc<Mutex<Sandbox>>, String> {
        let mut map = self.lock_in_process();
        if let Some(sandbox) = map.get(&key) {
            return Ok(Arc::clone(sandbox));
        }
        let sandbox = Arc::new(Mutex::new(Sandbox::open(None)?));
        map.insert(key, Arc::clone(&sandbox));
        Ok(sandbox)
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

impl fmt::Debug for SqliteSandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteSandbox")
            .field("program", &self.program)
            .field("open_sandboxes", &self.open_sandboxes())
            .finish()
    }
}

impl Executor for SqliteSandbox {
    async fn execute(&self, request: ExecRequest) -> ExecutorResult {
        let payload = match StepPayload::parse(&request) {
            Ok(payload) => payload,
            Err(message) => return ExecutorResult::Permanent(message),
        };
        pace(payload.delay_ms).await;
        let key = (request.attempt_id, request.delivery);
        match &self.program {
            Some(program) => self.run_isolated(program, key, payload.request).await,
            None => self.run_in_process(key, payload.request).await,
        }
    }

    fn release(&self, attempt: &AttemptId, delivery: u32) {
        let key = (attempt.clone(), delivery);
        let in_process = self.lock_in_process().remove(&key);
        let child = self.lock_children().remove(&key);
        // Dropped outside the maps' locks: closing a database or killing a child is
        // not the maps' business.
        drop(in_process);
        drop(child);
    }
}

#[cfg(test)]
mod tests;
