//! Unit tests of the SQLite ledger: migrations, transitions, the guard's `WHERE`
//! clause, evidence integrity, strict row parsing, and agreement with the memory
//! ledger call for call.

use super::rows::{self, SqlResult};
use super::{SqliteCore, SqliteLedger};
use crate::clock::{Clock, ManualClock};
use crate::entropy::{Entropy, SeededEntropy};
use crate::ledger::memory::MemoryLedger;
use crate::ledger::{Ledger, LedgerError};
use leasehold_engine::canonical::sha256_hex;
use leasehold_engine::transition::{self, ReconcileOutcome};
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, AttemptStatus, CommandStatus, Guard, Lease, LeaseToken, OperatorRequest, PlanId,
    PlanSpec, ReceiptStatus, Refusal, Reply, Timestamp, WorkerRequest, Writes,
};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;

const KNOWN: &[&str] = &["dry-run:v1"];
const LEASE_MS: u64 = 1_000;
const T0: i64 = 1_796_000_000_000;

/// The named transitions on a core, as the [`Ledger`] trait provides them on its core
/// methods ([`SqliteCore::worker`], [`SqliteCore::operator`]).
trait Named {
    fn heartbeat(&self, lease: &Lease, lease_ms: u64) -> Result<Timestamp, LedgerError>;
    fn begin_step(&self, lease: &Lease, ordinal: u32, lease_ms: u64) -> Result<(), LedgerError>;
    fn complete_step(
        &self,
        lease: &Lease,
        ordinal: u32,
        evidence: &Value,
        target_receipt: &Value,
        lease_ms: u64,
    ) -> Result<(), LedgerError>;
    fn fail(&self, lease: &Lease, ordinal: Option<u32>, error: &str) -> Result<(), LedgerError>;
    fn finish(&self, lease: &Lease) -> Result<(), LedgerError>;
    fn reconcile(&self, attempt: &AttemptId) -> Result<(ReconcileOutcome, AttemptRecord), LedgerError>;
    fn abort(&self, attempt: &AttemptId, reason: &str) -> Result<AttemptRecord, LedgerError>;
}

impl Named for SqliteCore {
    fn heartbeat(&self, lease: &Lease, lease_ms: u64) -> Result<Timestamp, LedgerError> {
        match self.worker(lease, WorkerRequest::Heartbeat { lease_ms })? {
            Reply::Renewed { until } => Ok(until),
            other => panic!("heartbeat answered {other:?}"),
        }
    }

    fn begin_step(&self, lease: &Lease, ordinal: u32, lease_ms: u64) -> Result<(), LedgerError> {
        self.worker(lease, WorkerRequest::BeginStep { ordinal, lease_ms })
            .map(drop)
    }

    fn complete_step(
        &self,
        lease: &Lease,
        ordinal: u32,
        evidence: &Value,
        target_receipt: &Value,
        lease_ms: u64,
    ) -> Result<(), LedgerError> {
        let request = WorkerRequest::CompleteStep {
            ordinal,
            evidence: evidence.clone(),
            target_receipt: target_receipt.clone(),
            lease_ms,
        };
        self.worker(lease, request).map(drop)
    }

    fn fail(&self, lease: &Lease, ordinal: Option<u32>, error: &str) -> Result<(), LedgerError> {
        let request = WorkerRequest::Fail {
            ordinal,
            error: error.to_owned(),
        };
        self.worker(lease, request).map(drop)
    }

    fn finish(&self, lease: &Lease) -> Result<(), LedgerError> {
        self.worker(lease, WorkerRequest::Finish).map(drop)
    }

    fn reconcile(&self, attempt: &AttemptId) -> Result<(ReconcileOutcome, AttemptRecord), LedgerError> {
        match self.operator(attempt, OperatorRequest::Reconcile)? {
            (Reply::Reconciled(outcome), record) => Ok((outcome, record)),
            (other, _) => panic!("reconcile answered {other:?}"),
        }
    }

    fn abort(&self, attempt: &AttemptId, reason: &str) -> Result<AttemptRecord, LedgerError> {
        let request = OperatorRequest::Abort {
            reason: reason.to_owned(),
        };
        self.operator(attempt, request).map(|(_, record)| record)
    }
}

fn spec(name: &str, recovery: &str, steps: usize) -> PlanSpec {
    let steps: Vec<Value> = (1..=steps)
        .map(|i| json!({"code": format!("step-{i}"), "executor": "dry-run:v1", "payload": {"n": i}}))
        .collect();
    serde_json::from_value(json!({"name": name, "recovery": recovery, "steps": steps})).unwrap()
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(Timestamp::from_millis(T0)))
}

fn core_at(path: &str, clock: &Arc<ManualClock>, seed: u64) -> SqliteCore {
    let clock: Arc<dyn Clock> = clock.clone();
    let entropy: Arc<dyn Entropy> = Arc::new(SeededEntropy::new(seed));
    SqliteCore::open(path, clock, entropy).unwrap()
}

fn temp_db() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db").to_str().unwrap().to_owned();
    (dir, path)
}

/// A migrated file-backed core with one claimed attempt of a two-step plan.
fn claimed_fixture() -> (tempfile::TempDir, Arc<ManualClock>, SqliteCore, Lease) {
    let (dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    core.migrate().unwrap();
    let plan = core.register_plan(spec("p", "resume", 2), KNOWN).unwrap();
    core.enqueue(&plan.id, Action::Execute).unwrap();
    let mut claimed = core.claim("w1", 1, LEASE_MS).unwrap();
    assert_eq!(claimed.len(), 1);
    let lease = claimed.remove(0).lease;
    (dir, clock, core, lease)
}

fn table_exists(core: &SqliteCore, name: &str) -> bool {
    core.connection()
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [name],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
        == 1
}

#[test]
fn migrate_is_idempotent_and_records_versions() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    assert!(!table_exists(&core, "plan"), "opening must not create tables");
    assert_eq!(core.migrate().unwrap(), versions_from(1));
    assert_eq!(core.migrate().unwrap(), Vec::<u32>::new());
    assert!(table_exists(&core, "command") && table_exists(&core, "receipt"));
    let recorded = rows::recorded_migration(core.connection(), 1).unwrap();
    assert_eq!(recorded, Some(("init".to_owned(), T0)));
    // A second connection to the same file sees it up to date.
    assert_eq!(core_at(&path, &clock, 2).migrate().unwrap(), Vec::<u32>::new());
}

#[test]
fn a_schema_version_from_the_future_is_an_integrity_error() {
    let (_dir, path) = temp_db();
    let core = core_at(&path, &clock(), 1);
    core.migrate().unwrap();
    core.connection()
        .execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (9999, 'future', 0)",
            [],
        )
        .unwrap();
    let e = core.migrate().unwrap_err();
    assert!(matches!(e, LedgerError::Integrity(_)), "{e}");
}

#[test]
fn files_use_wal_and_foreign_keys() {
    let (_dir, path) = temp_db();
    let core = core_at(&path, &clock(), 1);
    let conn = core.connection();
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    let fk: i64 = conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0)).unwrap();
    let sync: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
    assert_eq!((mode.as_str(), fk, sync), ("wal", 1, 1));
}

#[tokio::test]
async fn happy_path_on_a_file_survives_reopening() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let ledger = SqliteLedger::open(&path, clock.clone(), Arc::new(SeededEntropy::new(7))).unwrap();
    assert_eq!(ledger.migrate().await.unwrap(), versions_from(1));
    let plan = ledger
        .register_plan(spec("rehearsal", "replay", 2), KNOWN)
        .await
        .unwrap();
    let again = ledger
        .register_plan(spec("rehearsal", "replay", 2), KNOWN)
        .await
        .unwrap();
    assert_eq!(again, plan, "registration is idempotent by fingerprint");
    let queued = ledger.enqueue(&plan.id, Action::Execute).await.unwrap();
    assert_eq!(queued.attempt.status, AttemptStatus::Queued);
    assert_eq!(ledger.open_attempts().await.unwrap(), 1);

    let claimed = ledger.claim("worker-1", 5, LEASE_MS).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let c = &claimed[0];
    assert_eq!(c.plan, plan);
    assert_eq!(c.record.command.status, CommandStatus::Processing);
    assert_eq!(c.record.command.delivery_count, 1);
    assert_eq!(
        c.record,
        ledger.attempt(&queued.attempt.id).await.unwrap(),
        "claim answers the record as written"
    );
    assert!(
        ledger.claim("worker-2", 5, LEASE_MS).await.unwrap().is_empty(),
        "a live lease is never stolen"
    );

    clock.advance_ms(100);
    let until = ledger.heartbeat(&c.lease, LEASE_MS).await.unwrap();
    assert_eq!(until, Timestamp::from_millis(T0 + 100).plus_ms(LEASE_MS));
    for ordinal in 1..=2 {
        ledger.begin_step(&c.lease, ordinal, LEASE_MS).await.unwrap();
        ledger
            .complete_step(
                &c.lease,
                ordinal,
                &json!({"step": ordinal}),
                &json!({"ok": true}),
                LEASE_MS,
            )
            .await
            .unwrap();
    }
    ledger.finish(&c.lease).await.unwrap();

    let done = ledger.attempt(&queued.attempt.id).await.unwrap();
    assert_eq!(done.attempt.status, AttemptStatus::Succeeded);
    assert_eq!(done.command.status, CommandStatus::Delivered);
    assert_eq!(done.command.lease_token, None);
    assert!(done.receipts.iter().all(|r| r.status == ReceiptStatus::Succeeded));
    assert_eq!(ledger.open_attempts().await.unwrap(), 0);
    drop(ledger);

    let reopened = SqliteLedger::open(&path, clock.clone(), Arc::new(SeededEntropy::new(8))).unwrap();
    assert_eq!(reopened.migrate().await.unwrap(), Vec::<u32>::new());
    assert_eq!(reopened.attempt(&queued.attempt.id).await.unwrap(), done);
    assert_eq!(reopened.history(&plan.id).await.unwrap(), vec![done]);
    assert_eq!(reopened.list_plans().await.unwrap(), vec![plan]);
}

#[tokio::test]
async fn an_in_memory_ledger_keeps_its_one_connection() {
    let ledger = SqliteLedger::open(":memory:", clock(), Arc::new(SeededEntropy::new(1))).unwrap();
    assert_eq!(ledger.migrate().await.unwrap(), versions_from(1));
    let plan = ledger.register_plan(spec("p", "resume", 1), KNOWN).await.unwrap();
    // Concurrent calls must all see the same database.
    let (a, b) = tokio::join!(ledger.plan(&plan.id), ledger.list_plans());
    assert_eq!(a.unwrap(), plan);
    assert_eq!(b.unwrap(), vec![plan]);
}

#[test]
fn a_stale_token_is_refused_and_changes_nothing() {
    let (_dir, clock, core, lease) = claimed_fixture();
    let before = core.attempt(&lease.attempt_id).unwrap();
    let stale = Lease {
        token: LeaseToken::new("not-the-token"),
        ..lease.clone()
    };
    clock.advance_ms(10);
    let refusals = [
        core.heartbeat(&stale, LEASE_MS).map(drop),
        core.begin_step(&stale, 1, LEASE_MS),
        core.complete_step(&stale, 1, &json!({}), &json!({}), LEASE_MS),
        core.fail(&stale, Some(1), "boom"),
        core.finish(&stale),
    ];
    for r in refusals {
        let e = r.unwrap_err();
        assert_eq!(
            e,
            LedgerError::Refused(Refusal::StaleToken {
                command: lease.command_id.clone()
            })
        );
        let shown = format!("{e} {e:?}");
        assert!(
            !shown.contains(lease.token.expose()) && !shown.contains("not-the-token"),
            "{shown}"
        );
    }
    assert_eq!(core.attempt(&lease.attempt_id).unwrap(), before);

    // After an abort the holder is fenced too.
    core.abort(&lease.attempt_id, "operator").unwrap();
    let aborted = core.attempt(&lease.attempt_id).unwrap();
    assert!(matches!(
        core.heartbeat(&lease, LEASE_MS),
        Err(LedgerError::Refused(Refusal::StaleToken { .. }))
    ));
    assert_eq!(core.attempt(&lease.attempt_id).unwrap(), aborted);
}

#[test]
fn a_lease_naming_another_command_is_not_found() {
    let (_dir, _clock, core, lease) = claimed_fixture();
    let wrong = Lease {
        command_id: leasehold_engine::CommandId::new("cmd-other"),
        ..lease
    };
    assert!(matches!(
        core.heartbeat(&wrong, LEASE_MS),
        Err(LedgerError::NotFound { kind: "command", .. })
    ));
}

#[test]
fn the_guard_refuses_when_the_row_changed_behind_the_engines_back() {
    let (_dir, clock, core, lease) = claimed_fixture();
    let before = core.attempt(&lease.attempt_id).unwrap();
    clock.advance_ms(10);
    let now = clock.now();
    let writes = transition::begin_step(&before, 1, &lease.token, LEASE_MS, now).unwrap();
    assert!(!writes.receipts.is_empty());

    let tx = core.write_tx().unwrap();
    // Another writer replaces the lease between the engine's read and our write.
    tx.execute(
        "UPDATE command SET lease_token = 'someone-else' WHERE id = ?1",
        [lease.command_id.as_str()],
    )
    .unwrap();
    let e = rows::update_writes(&tx, &crate::ledger::sql::SQLITE, &before, &writes).unwrap_err();
    assert_eq!(
        e,
        LedgerError::Refused(Refusal::StaleToken {
            command: lease.command_id.clone()
        })
    );
    tx.commit().unwrap();
    let after = core.attempt(&lease.attempt_id).unwrap();
    assert_eq!(after.receipts, before.receipts, "no receipt was written");
    assert_eq!(after.attempt, before.attempt);
    assert_eq!(after.command.lease_token, Some(LeaseToken::new("someone-else")));
    assert_eq!(
        after.command.lease_until, before.command.lease_until,
        "the lease was not renewed"
    );
}

#[test]
fn writes_under_a_guard_that_does_not_hold_write_nothing() {
    let (_dir, clock, core, lease) = claimed_fixture();
    let before = core.attempt(&lease.attempt_id).unwrap();
    clock.advance_ms(10);
    // Writes that would change every row, the attempt first.
    let mut full = transition::fail(&before, Some(1), "boom", &lease.token, clock.now()).unwrap();
    assert!(full.attempt.is_some() && full.command.is_some() && !full.receipts.is_empty());
    let guards = [
        Guard::Holds(LeaseToken::new("wrong")),
        Guard::Claimable(clock.now()),
        Guard::Unchanged {
            status: CommandStatus::Pending,
            lease_token: None,
        },
        Guard::Unchanged {
            status: CommandStatus::Processing,
            lease_token: Some(LeaseToken::new("wrong")),
        },
    ];
    for guard in guards {
        full.guard = guard.clone();
        let tx = core.write_tx().unwrap();
        let e = rows::update_writes(&tx, &crate::ledger::sql::SQLITE, &before, &full).unwrap_err();
        assert!(
            matches!(e, LedgerError::Refused(Refusal::StaleToken { .. })),
            "{guard:?}: {e}"
        );
        tx.commit().unwrap();
        assert_eq!(
            core.attempt(&lease.attempt_id).unwrap(),
            before,
            "{guard:?} wrote something"
        );
    }
    // Without a command image the guard is still checked.
    let no_command = Writes {
        guard: Guard::Holds(LeaseToken::new("wrong")),
        command: None,
        ..full.clone()
    };
    let tx = core.write_tx().unwrap();
    assert!(matches!(
        rows::update_writes(&tx, &crate::ledger::sql::SQLITE, &before, &no_command),
        Err(LedgerError::Refused(_))
    ));
    drop(tx);
    assert_eq!(core.attempt(&lease.attempt_id).unwrap(), before);
    // And the matching guard applies.
    full.guard = Guard::Holds(lease.token.clone());
    let tx = core.write_tx().unwrap();
    rows::update_writes(&tx, &crate::ledger::sql::SQLITE, &before, &full).unwrap();
    tx.commit().unwrap();
    assert_eq!(
        core.attempt(&lease.attempt_id).unwrap().attempt.status,
        AttemptStatus::Failed
    );
}

#[test]
fn evidence_round_trips_as_canonical_text_with_its_sha256() {
    let (_dir, _clock, core, lease) = claimed_fixture();
    core.begin_step(&lease, 1, LEASE_MS).unwrap();
    let evidence: Value =
        serde_json::from_str(r#"{ "z": 1.0, "a": [true, null, "x\n"], "m": {"b": 2, "a": 1} }"#).unwrap();
    core.complete_step(&lease, 1, &evidence, &json!({"receipt": "r-1", "at": 3}), LEASE_MS)
        .unwrap();
    let canonical = r#"{"a":[true,null,"x\n"],"m":{"a":1,"b":2},"z":1}"#;
    let receipt = core.attempt(&lease.attempt_id).unwrap().receipts.remove(0);
    assert_eq!(receipt.evidence.as_deref(), Some(canonical));
    assert_eq!(
        receipt.evidence_sha256.as_deref(),
        Some(sha256_hex(canonical.as_bytes()).as_str())
    );
    assert_eq!(receipt.target_receipt.as_deref(), Some(r#"{"at":3,"receipt":"r-1"}"#));
    let (stored, sha): (String, String) = core
        .connection()
        .query_row(
            "SELECT evidence, evidence_sha256 FROM receipt WHERE attempt_id = ?1 AND ordinal = 1",
            [lease.attempt_id.as_str()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(stored, canonical);
    assert_eq!(sha, sha256_hex(stored.as_bytes()));
    // A retried completion with the same evidence only renews.
    core.complete_step(&lease, 1, &evidence, &json!({}), LEASE_MS).unwrap();
}

#[test]
fn rows_that_do_not_parse_are_integrity_errors() {
    let (_dir, _clock, core, lease) = claimed_fixture();
    let conn = core.connection();
    conn.execute_batch("PRAGMA ignore_check_constraints = ON").unwrap();
    conn.execute(
        "UPDATE attempt SET status = 'WEIRD' WHERE id = ?1",
        [lease.attempt_id.as_str()],
    )
    .unwrap();
    let e = core.attempt(&lease.attempt_id).unwrap_err();
    assert!(matches!(e, LedgerError::Integrity(_)), "{e}");
    assert!(e.to_string().contains("WEIRD"), "{e}");
    assert!(matches!(
        core.heartbeat(&lease, LEASE_MS),
        Err(LedgerError::Integrity(_))
    ));
    conn.execute(
        "UPDATE attempt SET status = 'RUNNING' WHERE id = ?1",
        [lease.attempt_id.as_str()],
    )
    .unwrap();
    conn.execute(
        "UPDATE command SET delivery_count = -1 WHERE id = ?1",
        [lease.command_id.as_str()],
    )
    .unwrap();
    assert!(matches!(
        core.attempt(&lease.attempt_id),
        Err(LedgerError::Integrity(_))
    ));
    conn.execute("UPDATE plan SET steps_json = 'not json'", []).unwrap();
    assert!(matches!(core.list_plans(), Err(LedgerError::Integrity(_))));
}

#[test]
fn busy_and_locked_map_to_unavailable() {
    let busy = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY), None);
    assert!(matches!(rows::sql_error(busy), LedgerError::Unavailable(_)));
    let locked = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_LOCKED), None);
    assert!(matches!(Err::<(), _>(locked).sql(), Err(LedgerError::Unavailable(_))));
    let other = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT), None);
    assert!(matches!(rows::sql_error(other), LedgerError::Internal(_)));
}

#[test]
fn a_second_connection_waits_for_the_write_lock_then_proceeds() {
    let (_dir, clock, core, _lease) = claimed_fixture();
    let path = core.connection().path().unwrap().to_owned();
    let mut other = core_at(&path, &clock, 99);
    // The waiter reports (through its busy handler) that it found the lock taken.
    static WAITED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fn note_busy(_attempts: i32) -> bool {
        WAITED.store(true, std::sync::atomic::Ordering::SeqCst);
        std::thread::yield_now();
        true
    }
    other.connection_mut().busy_handler(Some(note_busy)).unwrap();
    let tx = core.write_tx().unwrap();
    let waiter = std::thread::spawn(move || other.open_attempts().and_then(|_| other.claim("w2", 1, LEASE_MS)));
    while !WAITED.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::yield_now();
    }
    tx.commit().unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), Vec::new());
}

/// Asserts that the memory ledger and the SQLite core answer the same, and yields it.
macro_rules! same {
    ($mem:expr, $sql:expr) => {{
        let (m, s) = ($mem.await, $sql);
        assert_eq!(m, s, "memory and sqlite disagree at {}", stringify!($sql));
        m
    }};
}

/// [`same!`] for a call whose answer the scenario does not use further.
macro_rules! agree {
    ($mem:expr, $sql:expr) => {{
        let _ = same!($mem, $sql);
    }};
}

#[tokio::test]
async fn sqlite_agrees_with_the_memory_ledger_call_for_call() {
    let (_dir, path) = temp_db();
    let (mclock, sclock) = (clock(), clock());
    let mem = MemoryLedger::new(mclock.clone(), Arc::new(SeededEntropy::new(42)));
    let sql = core_at(&path, &sclock, 42);
    sql.migrate().unwrap();
    let advance = |ms: u64| {
        mclock.advance_ms(ms);
        sclock.advance_ms(ms);
    };

    let a = same!(
        mem.register_plan(spec("a", "replay", 2), KNOWN),
        sql.register_plan(spec("a", "replay", 2), KNOWN)
    )
    .unwrap();
    agree!(
        mem.register_plan(spec("a", "replay", 2), KNOWN),
        sql.register_plan(spec("a", "replay", 2), KNOWN)
    );
    advance(1);
    let b = same!(
        mem.register_plan(spec("b", "resume", 3), KNOWN),
        sql.register_plan(spec("b", "resume", 3), KNOWN)
    )
    .unwrap();
    agree!(
        mem.register_plan(spec("c", "resume", 0), KNOWN),
        sql.register_plan(spec("c", "resume", 0), KNOWN)
    );
    agree!(mem.list_plans(), sql.list_plans());
    agree!(mem.plan(&PlanId::new("nope")), sql.plan(&PlanId::new("nope")));

    let qa = same!(mem.enqueue(&a.id, Action::Execute), sql.enqueue(&a.id, Action::Execute)).unwrap();
    agree!(mem.enqueue(&a.id, Action::Execute), sql.enqueue(&a.id, Action::Execute));
    agree!(mem.enqueue(&a.id, Action::Retry), sql.enqueue(&a.id, Action::Retry));
    agree!(
        mem.enqueue(&PlanId::new("nope"), Action::Execute),
        sql.enqueue(&PlanId::new("nope"), Action::Execute)
    );
    advance(5);
    let qb = same!(mem.enqueue(&b.id, Action::Execute), sql.enqueue(&b.id, Action::Execute)).unwrap();
    agree!(mem.open_attempts(), sql.open_attempts());

    let c1 = same!(mem.claim("w1", 1, LEASE_MS), sql.claim("w1", 1, LEASE_MS)).unwrap();
    let la = c1[0].lease.clone();
    advance(10);
    let c2 = same!(mem.claim("w2", 5, LEASE_MS), sql.claim("w2", 5, LEASE_MS)).unwrap();
    let lb = c2[0].lease.clone();
    agree!(mem.claim("w2", 5, LEASE_MS), sql.claim("w2", 5, LEASE_MS));

    agree!(mem.begin_step(&la, 2, LEASE_MS), sql.begin_step(&la, 2, LEASE_MS));
    agree!(mem.begin_step(&la, 1, LEASE_MS), sql.begin_step(&la, 1, LEASE_MS));
    agree!(mem.begin_step(&la, 1, LEASE_MS), sql.begin_step(&la, 1, LEASE_MS));
    agree!(
        mem.complete_step(
            &la,
            1,
            &json!({"x": 1.5, "sandbox_id": "s1"}),
            &json!({"r": 1}),
            LEASE_MS
        ),
        sql.complete_step(
            &la,
            1,
            &json!({"x": 1.5, "sandbox_id": "s1"}),
            &json!({"r": 1}),
            LEASE_MS
        )
    );
    agree!(mem.begin_step(&la, 2, LEASE_MS), sql.begin_step(&la, 2, LEASE_MS));
    agree!(mem.begin_step(&la, 9, LEASE_MS), sql.begin_step(&la, 9, LEASE_MS));
    agree!(mem.begin_step(&lb, 1, LEASE_MS), sql.begin_step(&lb, 1, LEASE_MS));
    agree!(
        mem.complete_step(&lb, 1, &json!([1]), &json!(null), LEASE_MS),
        sql.complete_step(&lb, 1, &json!([1]), &json!(null), LEASE_MS)
    );
    agree!(mem.begin_step(&lb, 2, LEASE_MS), sql.begin_step(&lb, 2, LEASE_MS));
    agree!(mem.reconcile(&qa.attempt.id), sql.reconcile(&qa.attempt.id));

    advance(2 * LEASE_MS);
    // Both leases expired: takeovers (a replays from scratch, b resumes).
    let c3 = same!(mem.claim("w3", 5, LEASE_MS), sql.claim("w3", 5, LEASE_MS)).unwrap();
    assert_eq!(c3.len(), 2);
    agree!(mem.heartbeat(&la, LEASE_MS), sql.heartbeat(&la, LEASE_MS));
    let (la3, lb3) = if c3[0].lease.attempt_id == qa.attempt.id {
        (c3[0].lease.clone(), c3[1].lease.clone())
    } else {
        (c3[1].lease.clone(), c3[0].lease.clone())
    };
    agree!(mem.heartbeat(&lb3, LEASE_MS), sql.heartbeat(&lb3, LEASE_MS));
    agree!(mem.fail(&la3, Some(1), "boom"), sql.fail(&la3, Some(1), "boom"));
    agree!(mem.attempt(&qa.attempt.id), sql.attempt(&qa.attempt.id));
    agree!(mem.reconcile(&qb.attempt.id), sql.reconcile(&qb.attempt.id));
    advance(2 * LEASE_MS);
    let (outcome, _) = same!(mem.reconcile(&qb.attempt.id), sql.reconcile(&qb.attempt.id)).unwrap();
    assert_eq!(outcome, ReconcileOutcome::Requeued);
    agree!(mem.reconcile(&qb.attempt.id), sql.reconcile(&qb.attempt.id));
    agree!(
        mem.abort(&qb.attempt.id, "operator"),
        sql.abort(&qb.attempt.id, "operator")
    );
    agree!(mem.abort(&qb.attempt.id, "again"), sql.abort(&qb.attempt.id, "again"));
    agree!(mem.reconcile(&qb.attempt.id), sql.reconcile(&qb.attempt.id));

    advance(1);
    agree!(
        mem.enqueue(&a.id, Action::Compensate),
        sql.enqueue(&a.id, Action::Compensate)
    );
    same!(mem.enqueue(&a.id, Action::Retry), sql.enqueue(&a.id, Action::Retry)).unwrap();
    let c4 = same!(mem.claim("w4", 5, LEASE_MS), sql.claim("w4", 5, LEASE_MS)).unwrap();
    let l4 = c4[0].lease.clone();
    for ordinal in 1..=2 {
        agree!(
            mem.begin_step(&l4, ordinal, LEASE_MS),
            sql.begin_step(&l4, ordinal, LEASE_MS)
        );
        agree!(
            mem.complete_step(&l4, ordinal, &json!({"o": ordinal}), &json!({}), LEASE_MS),
            sql.complete_step(&l4, ordinal, &json!({"o": ordinal}), &json!({}), LEASE_MS)
        );
    }
    agree!(mem.finish(&l4), sql.finish(&l4));
    agree!(mem.finish(&l4), sql.finish(&l4));
    agree!(
        mem.enqueue(&a.id, Action::Compensate),
        sql.enqueue(&a.id, Action::Compensate)
    );
    agree!(mem.retire_plan(&b.id), sql.retire_plan(&b.id));
    agree!(
        mem.retire_plan(&PlanId::new("nope")),
        sql.retire_plan(&PlanId::new("nope"))
    );
    agree!(mem.enqueue(&b.id, Action::Retry), sql.enqueue(&b.id, Action::Retry));
    agree!(
        mem.register_plan(spec("b", "resume", 3), KNOWN),
        sql.register_plan(spec("b", "resume", 3), KNOWN)
    );
    agree!(mem.list_plans(), sql.list_plans());
    agree!(mem.history(&a.id), sql.history(&a.id));
    agree!(mem.history(&b.id), sql.history(&b.id));
    agree!(mem.history(&PlanId::new("nope")), sql.history(&PlanId::new("nope")));
    agree!(mem.open_attempts(), sql.open_attempts());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn eight_ledgers_race_for_a_thousand_commands_without_errors() {
    const COMMANDS: usize = 1_000;
    let (_dir, path) = temp_db();
    let clock = clock();
    let ledgers: Vec<SqliteLedger> = (0..8)
        .map(|i| SqliteLedger::open(&path, clock.clone(), Arc::new(SeededEntropy::new(1_000 + i))).unwrap())
        .collect();
    // Concurrent migrators: exactly one applies the schema.
    let migrations = futures_join_all(ledgers.iter().map(|l| {
        let l = l.clone();
        tokio::spawn(async move { l.migrate().await })
    }))
    .await;
    let applied: Vec<Vec<u32>> = migrations.into_iter().map(|r| r.unwrap().unwrap()).collect();
    assert_eq!(
        applied.iter().filter(|v| **v == versions_from(1)).count(),
        1,
        "{applied:?}"
    );

    let seed = core_at(&path, &clock, 1);
    for i in 0..COMMANDS {
        let plan = seed
            .register_plan(spec(&format!("plan-{i}"), "resume", 1), KNOWN)
            .unwrap();
        seed.enqueue(&plan.id, Action::Execute).unwrap();
    }

    let workers = ledgers.iter().enumerate().map(|(i, l)| {
        let l = l.clone();
        tokio::spawn(async move {
            let owner = format!("worker-{i}");
            let mut mine = Vec::new();
            loop {
                let claimed = l.claim(&owner, 5, 60_000).await?;
                if claimed.is_empty() {
                    return Ok::<_, LedgerError>(mine);
                }
                for c in claimed {
                    l.begin_step(&c.lease, 1, 60_000).await?;
                    l.complete_step(&c.lease, 1, &json!({"by": owner}), &json!({}), 60_000)
                        .await?;
                    l.finish(&c.lease).await?;
                    mine.push(c.lease.command_id);
                }
            }
        })
    });
    let mut all = Vec::new();
    for result in futures_join_all(workers).await {
        all.extend(result.unwrap().expect("no ledger error under normal contention"));
    }
    let unique: BTreeSet<_> = all.iter().cloned().collect();
    assert_eq!(all.len(), COMMANDS, "every command claimed once");
    assert_eq!(unique.len(), COMMANDS);
    assert_eq!(ledgers[0].open_attempts().await.unwrap(), 0);
}

/// Awaits every handle in order (no extra dependency for `join_all`).
async fn futures_join_all<T>(
    handles: impl IntoIterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<Result<T, tokio::task::JoinError>> {
    let handles: Vec<_> = handles.into_iter().collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await);
    }
    out
}

#[test]
fn the_claim_candidate_queries_search_each_range_by_its_own_index() {
    let (_dir, path) = temp_db();
    let core = core_at(&path, &clock(), 1);
    core.migrate().unwrap();
    for (sql, index) in [
        (
            &*super::rows::CLAIM_PENDING_SQL,
            "INDEX command_pending (available_at<?)",
        ),
        (&*super::rows::CLAIM_EXPIRED_SQL, "INDEX command_leased (lease_until<?)"),
    ] {
        let text = query_plan(core.connection(), sql, rusqlite::params![0i64, 1i64]);
        assert!(text.contains(index), "{text}");
        assert!(!text.contains("SCAN command"), "{text}");
        assert!(!text.contains("SCAN a"), "{text}");
        assert!(!text.contains("SCAN r"), "{text}");
        assert!(text.contains("SEARCH c USING INTEGER PRIMARY KEY (rowid=?)"), "{text}");
    }
    // The probe that spares the expired range's sort when it is empty is one search of
    // the leased index, and answers it.
    let text = query_plan(core.connection(), &super::rows::ANY_EXPIRED_SQL, [0i64]);
    assert!(text.contains("INDEX command_leased (lease_until<?)"), "{text}");
    assert!(!text.contains("SCAN command"), "{text}");
    assert!(!text.contains("TEMP B-TREE"), "{text}");
}

#[test]
fn claim_candidates_come_whole_and_in_claim_order_even_from_rows_out_of_order() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    core.migrate().unwrap();
    for i in 0..3 {
        let plan = core.register_plan(spec(&format!("p{i}"), "resume", 3), KNOWN).unwrap();
        core.enqueue(&plan.id, Action::Execute).unwrap();
        clock.advance_ms(1);
    }
    let read = rows::claim_candidates(core.connection(), clock.now(), 3, None).unwrap();
    assert_eq!(read.len(), 3);
    assert!(read.iter().all(|(r, _)| r.receipts.len() == 3), "every receipt of each");
    let order: Vec<_> = read.iter().map(|(r, _)| r.command.id.clone()).collect();
    let mut sorted = read.clone();
    sorted.sort_by(|(a, _), (b, _)| {
        (a.command.available_at, &a.command.id).cmp(&(b.command.available_at, &b.command.id))
    });
    assert_eq!(read, sorted, "claim order");
    // Rows that did not come one command after another: the newest first, and the
    // oldest command's receipts split into two entries around the others.
    let mut first = read[0].clone();
    let mut split = first.clone();
    split.0.receipts = vec![first.0.receipts.remove(1)];
    first.0.receipts.reverse();
    let scattered = vec![read[2].clone(), first, read[1].clone(), split];
    assert_eq!(rows::in_claim_order(scattered.clone(), 3), read);
    // A batch takes the oldest.
    let two = rows::in_claim_order(scattered, 2);
    assert_eq!(
        two.iter().map(|(r, _)| r.command.id.clone()).collect::<Vec<_>>(),
        order[..2]
    );
    assert_eq!(two[0].0.receipts.len(), 3);
}

/// SQLite's `EXPLAIN QUERY PLAN` of `sql` with `params`, one detail line per step.
fn query_plan(conn: &rusqlite::Connection, sql: &str, params: impl rusqlite::Params) -> String {
    let lines: Vec<String> = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap()
        .query_map(params, |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    lines.join("\n")
}

#[test]
fn plans_are_read_by_name_and_by_page_through_indexes_without_a_sort() {
    let (_dir, path) = temp_db();
    let core = core_at(&path, &clock(), 1);
    core.migrate().unwrap();
    let q = crate::ledger::sql::query::queries(&crate::ledger::sql::SQLITE);
    let text = query_plan(core.connection(), &q.plans_named, ["p"]);
    assert!(text.contains("SEARCH plan USING INDEX plan_by_name (name=?)"), "{text}");
    assert!(!text.contains("SCAN plan"), "{text}");
    assert!(!text.contains("TEMP B-TREE"), "{text}");
    // A page of the plans list reads the page, in rowid order, and nothing more.
    let first = query_plan(core.connection(), &q.plans_newest, [50i64]);
    assert_eq!(
        first, "SCAN plan",
        "a backwards walk of the table, stopped by the LIMIT"
    );
    let later = query_plan(
        core.connection(),
        &q.plans_newest_before,
        rusqlite::params!["pln-x", 50i64],
    );
    assert!(
        later.contains("SEARCH plan USING INTEGER PRIMARY KEY (rowid<?)"),
        "{later}"
    );
    assert!(
        later.contains("SEARCH plan USING COVERING INDEX sqlite_autoindex_plan_1 (id=?)"),
        "{later}"
    );
    assert!(!later.contains("TEMP B-TREE"), "{later}");
}

/// Applies the first `versions` migrations only (a ledger an older release left).
fn migrate_to(core: &SqliteCore, clock: &ManualClock, versions: usize) {
    let tx = core.write_tx().unwrap();
    let applied = crate::ledger::migrate::run(
        &mut rows::SqliteMigrations { conn: &tx },
        &crate::ledger::migrate::SQLITE[..versions],
        crate::ledger::migrate::RELEASE,
        clock.now(),
    )
    .unwrap();
    assert_eq!(applied, (1..=versions as u32).collect::<Vec<_>>());
    tx.commit().unwrap();
}

/// The versions of the shipped SQLite migrations from `first` on.
fn versions_from(first: u32) -> Vec<u32> {
    let mut all = crate::ledger::migrate::versions(crate::ledger::migrate::SQLITE);
    all.retain(|v| *v >= first);
    all
}

/// Three plans with one queued attempt each, on a migrated core, enqueued 1 ms
/// apart (so claimed in this order).
fn three_queued(core: &SqliteCore, clock: &ManualClock) -> Vec<PlanId> {
    (1..=3)
        .map(|i| {
            let plan = core.register_plan(spec(&format!("p{i}"), "replay", 2), KNOWN).unwrap();
            core.enqueue(&plan.id, Action::Execute).unwrap();
            clock.advance_ms(1);
            plan.id
        })
        .collect()
}

/// Runs `f` on a core whose schema predates the plan's `retry_json` (version 9), the
/// routing columns (version 10), the attempt's trace context and enqueue key
/// (versions 13 and 14) and the template columns (version 16), with those columns
/// there for the while:
/// today's code reads and writes rows with them, and these tests write and read the
/// rows an older ledger held. The columns are dropped again before the migrations
/// run, so they find the rows as such a ledger left them (a plan that sets no
/// policy stores none; no row has a route).
fn before_version_9_and_10<T>(core: &SqliteCore, f: impl FnOnce() -> T) -> T {
    let conn = core.connection();
    for (table, column) in LATER_COLUMNS {
        let nullable = table == "plan" || table == "attempt" || column == "payload";
        let kind = if nullable { "TEXT" } else { "TEXT NOT NULL DEFAULT ''" };
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {kind}"))
            .unwrap();
    }
    conn.execute_batch(include_str!("../../../migrations/sqlite/0011_target_limits.sql"))
        .unwrap();
    let out = f();
    conn.execute_batch("DROP INDEX command_leased_by_target; DROP TABLE target_limit; DROP TABLE target_slot")
        .unwrap();
    for (table, column) in LATER_COLUMNS {
        conn.execute_batch(&format!("ALTER TABLE {table} DROP COLUMN {column}"))
            .unwrap();
    }
    out
}

/// Records as a ledger before version 10 held them: without routes or trace contexts
/// (today's code, run in [`before_version_9_and_10`], writes them into columns that go
/// again).
fn unrouted(mut records: Vec<AttemptRecord>) -> Vec<AttemptRecord> {
    for r in &mut records {
        r.attempt.trace = None;
        let c = &mut r.command;
        (c.queue, c.executor, c.target) = Default::default();
        for rc in &mut r.receipts {
            (rc.executor, rc.target) = Default::default();
        }
    }
    records
}

/// The columns versions 9, 10, 13, 14, 16 and 17 add, which today's statements read
/// (with version 11's table, which [`before_version_9_and_10`] adds for as long too).
const LATER_COLUMNS: [(&str, &str); 17] = [
    ("attempt", "traceparent"),
    ("attempt", "input_json"),
    ("attempt", "input_sha256"),
    ("attempt", "order_key"),
    ("plan", "input_json"),
    ("plan", "on_failure"),
    ("plan", "targets_json"),
    ("receipt", "payload"),
    ("attempt", "enqueue_key"),
    ("attempt", "request_sha256"),
    ("plan", "retry_json"),
    ("plan", "queue"),
    ("command", "queue"),
    ("command", "executor"),
    ("command", "target"),
    ("receipt", "executor"),
    ("receipt", "target"),
];

#[test]
fn a_group_commits_every_call_but_rolls_back_only_a_failing_one() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    core.migrate().unwrap();
    let plans = three_queued(&core, &clock);
    let calls: Vec<super::GroupCall<'_, Result<usize, LedgerError>>> = vec![
        Box::new(|c: &SqliteCore| c.claim("w1", 1, LEASE_MS).map(|v| v.len())),
        // Writes, then fails: its own writes must vanish, nobody else's.
        Box::new(|c: &SqliteCore| {
            let tx = c.write_tx()?;
            tx.execute("UPDATE plan SET name = 'scribbled'", []).sql()?;
            Err(LedgerError::Internal("fails after writing".into()))
        }),
        Box::new(|c: &SqliteCore| c.claim("w2", 1, LEASE_MS).map(|v| v.len())),
    ];
    let results: Vec<_> = core
        .group(calls)
        .into_iter()
        .map(|(result, committed)| {
            committed.unwrap();
            result
        })
        .collect();
    assert_eq!(results[0], Ok(1));
    assert!(matches!(results[1], Err(LedgerError::Internal(_))));
    assert_eq!(results[2], Ok(1), "the second claim saw the first one's write");
    let names: Vec<String> = core.list_plans().unwrap().into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["p1", "p2", "p3"], "the failing call's write was rolled back");
    assert_eq!(owners(&core, &plans), [Some("w1".into()), Some("w2".into()), None]);
    // Durable: another connection sees both claims.
    assert_eq!(core_at(&path, &clock, 2).open_attempts().unwrap(), 3);
    assert_eq!(core_at(&path, &clock, 2).claim("w3", 5, LEASE_MS).unwrap().len(), 1);
}

#[test]
fn a_batch_claim_skips_a_command_taken_behind_its_back_and_writes_nothing_for_it() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    core.migrate().unwrap();
    let plans = three_queued(&core, &clock);
    let records: Vec<_> = plans.iter().map(|p| core.history(p).unwrap().remove(0)).collect();
    clock.advance_ms(5);
    let now = clock.now();
    let decided: Vec<Writes> = records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let token = LeaseToken::new(format!("token-{i}"));
            transition::claim_and_begin(r, leasehold_engine::Recovery::Replay, "w1", token, LEASE_MS, now).unwrap()
        })
        .collect();
    let tx = core.write_tx().unwrap();
    // Someone else claims the second command between the read and the write.
    tx.execute(
        "UPDATE command SET status = 'PROCESSING', lease_token = 'theirs', lease_until = ?2 WHERE id = ?1",
        rusqlite::params![records[1].command.id.as_str(), T0 + 60_000],
    )
    .unwrap();
    let items: Vec<_> = records.iter().zip(&decided).collect();
    assert_eq!(
        rows::update_many(&tx, &crate::ledger::sql::SQLITE, &items).unwrap(),
        [true, false, true]
    );
    tx.commit().unwrap();
    for (i, (record, writes)) in records.iter().zip(&decided).enumerate() {
        let now = core.attempt(&record.attempt.id).unwrap();
        if i == 1 {
            assert_eq!(now.attempt, record.attempt, "the refused claim wrote no attempt");
            assert_eq!(now.receipts, record.receipts, "nor any receipt");
            assert_eq!(now.command.lease_token, Some(LeaseToken::new("theirs")));
        } else {
            let mut expected = record.clone();
            writes.apply_to(&mut expected);
            assert_eq!(now, expected, "claim {i} wrote exactly the engine's images");
            assert_eq!(now.receipts[0].status, ReceiptStatus::Running);
        }
    }
}

#[test]
fn migrations_2_and_3_keep_a_version_1_ledger_its_rows_and_its_claim_order() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    migrate_to(&core, &clock, 1);
    let (plans, first, before) = before_version_9_and_10(&core, || {
        let plans = three_queued(&core, &clock);
        clock.advance_ms(1);
        let first = core.claim("w1", 1, LEASE_MS).unwrap().remove(0);
        let before: Vec<_> = plans.iter().map(|p| unrouted(core.history(p).unwrap())).collect();
        (plans, first, before)
    });
    assert_eq!(core.migrate().unwrap(), versions_from(2));
    let after: Vec<_> = plans.iter().map(|p| core.history(p).unwrap()).collect();
    assert_eq!(after, before, "every row kept, value for value");
    assert_eq!(core.open_attempts().unwrap(), 3);
    // Foreign keys are on again, and the rebuilt tables still check them and their
    // enumerations.
    let fk: i64 = core
        .connection()
        .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
        .unwrap();
    assert_eq!(fk, 1);
    let orphan = core.connection().execute(
        "INSERT INTO command (id, attempt_id, status, available_at) VALUES ('cmd-x', 'att-missing', 'PENDING', 0)",
        [],
    );
    assert!(orphan.is_err(), "a command of a missing attempt is refused");
    let bogus = core.connection().execute(
        "UPDATE command SET status = 'BOGUS' WHERE id = ?1",
        [first.lease.command_id.as_str()],
    );
    assert!(
        bogus.unwrap_err().to_string().contains("CHECK"),
        "an unknown status is refused"
    );
    // The claimed one expires and is taken over after the two others, in order.
    clock.advance_ms(LEASE_MS + 1);
    let order: Vec<PlanId> = core
        .claim("w2", 5, LEASE_MS)
        .unwrap()
        .into_iter()
        .map(|c| c.plan.id)
        .collect();
    assert_eq!(order, plans, "oldest available_at first, the takeover included");
    let taken = core.attempt(&first.lease.attempt_id).unwrap();
    assert_eq!(taken.command.delivery_count, 2);
    assert_eq!(taken.command.lease_owner.as_deref(), Some("w2"));
}

#[test]
fn a_checkpoint_copies_the_wal_and_restarts_it_past_the_bound() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let writer = core_at(&path, &clock, 1);
    writer.migrate().unwrap();
    writer.disable_autocheckpoint().unwrap();
    three_queued(&writer, &clock);
    let checkpointer = core_at(&path, &clock, 2);
    let frames = checkpointer.checkpoint(i64::MAX).unwrap();
    assert!(frames > 0, "the writer's commits stayed in the WAL: {frames}");
    // Past the bound, a RESTART checkpoint: the next write starts the WAL over.
    assert_eq!(checkpointer.checkpoint(0).unwrap(), frames);
    writer.claim("w1", 1, LEASE_MS).unwrap();
    let after = checkpointer.checkpoint(i64::MAX).unwrap();
    assert!(after < frames, "the WAL started over: {after} pages after {frames}");
}

#[test]
fn a_group_that_sqlite_rolls_back_fails_its_calls_so_far_and_runs_the_rest_alone() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    core.migrate().unwrap();
    let plans = three_queued(&core, &clock);
    let calls: Vec<super::GroupCall<'_, Result<usize, LedgerError>>> = vec![
        Box::new(|c: &SqliteCore| c.claim("w1", 1, LEASE_MS).map(|v| v.len())),
        // Ends the whole transaction behind the group's back, as SQLite does after an
        // I/O error or a full disk.
        Box::new(|c: &SqliteCore| {
            c.connection().execute_batch("ROLLBACK").sql()?;
            Ok(0)
        }),
        Box::new(|c: &SqliteCore| c.claim("w2", 1, LEASE_MS).map(|v| v.len())),
    ];
    let out = core.group(calls);
    assert!(out[0].1.is_err(), "the first claim was rolled back with the group");
    assert!(out[1].1.is_err());
    assert_eq!(out[2], (Ok(1), Ok(())), "the last call ran and committed alone");
    assert_eq!(
        owners(&core, &plans),
        [Some("w2".into()), None, None],
        "only the lone claim is durable"
    );
}

type ThenAnswer = tokio::sync::oneshot::Receiver<Result<(Reply, Vec<crate::ledger::Claimed>), LedgerError>>;

/// A [`super::writer::Job::Then`] of `request` under `lease`, then a claim of one
/// for `owner`, and where its answer arrives.
fn then_job(lease: &Lease, request: WorkerRequest, owner: &str) -> (super::writer::Job, ThenAnswer) {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = super::writer::ThenJob {
        lease: lease.clone(),
        request,
        claim: leasehold_engine::ClaimRequest {
            owner: owner.into(),
            batch: 1,
            lease_ms: LEASE_MS,
            begin: false,
            capabilities: None,
        },
        reply,
    };
    (super::writer::Job::Then(Box::new(job)), answer)
}

/// A ledger file with three queued attempts ([`three_queued`]), the first claimed by
/// `w1`.
fn three_queued_first_claimed() -> (
    tempfile::TempDir,
    String,
    Arc<ManualClock>,
    SqliteCore,
    Vec<PlanId>,
    crate::ledger::Claimed,
) {
    let (dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    core.migrate().unwrap();
    let plans = three_queued(&core, &clock);
    let first = core.claim("w1", 1, LEASE_MS).unwrap().remove(0);
    (dir, path, clock, core, plans, first)
}

/// Who holds the command of each plan's first attempt.
fn owners(core: &SqliteCore, plans: &[PlanId]) -> Vec<Option<String>> {
    plans
        .iter()
        .map(|p| core.history(p).unwrap().remove(0).command.lease_owner)
        .collect()
}

#[test]
fn a_request_then_claim_claims_with_the_groups_claims_only_once_its_request_is_applied() {
    let (_dir, path, clock, core, plans, first) = three_queued_first_claimed();
    let fail = WorkerRequest::Fail {
        ordinal: None,
        error: "boom".into(),
    };
    let (ends, mut ends_answer) = then_job(&first.lease, fail.clone(), "w1");
    let (plain_reply, mut plain_answer) = tokio::sync::oneshot::channel();
    let plain = super::writer::Job::Claim(
        leasehold_engine::ClaimRequest {
            owner: "w2".into(),
            batch: 1,
            lease_ms: LEASE_MS,
            begin: false,
            capabilities: None,
        },
        plain_reply,
    );
    let stale = Lease {
        token: LeaseToken::new("not-the-token"),
        ..first.lease.clone()
    };
    let (refused, mut refused_answer) = then_job(&stale, fail, "w3");
    super::writer::run_group(&core, vec![refused, ends, plain]);

    // The refused request claims nothing; the applied one claims the oldest
    // command left, before the plain claim that arrived after it.
    assert!(matches!(
        refused_answer.try_recv().unwrap(),
        Err(LedgerError::Refused(Refusal::StaleToken { .. }))
    ));
    let (reply, claimed) = ends_answer.try_recv().unwrap().unwrap();
    assert_eq!(reply, Reply::Applied);
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].record.attempt.plan_id, plans[1]);
    let taken = plain_answer.try_recv().unwrap().unwrap();
    assert_eq!(taken[0].record.attempt.plan_id, plans[2]);
    assert_eq!(
        core.history(&plans[0]).unwrap()[0].attempt.status,
        AttemptStatus::Failed
    );
    // One commit holds the request and both claims: another connection sees them.
    let other = core_at(&path, &clock, 2);
    assert_eq!(
        owners(&other, &plans),
        [Some("w1".into()), Some("w1".into()), Some("w2".into())]
    );
    assert_eq!(other.open_attempts().unwrap(), 2);
}

#[test]
fn a_request_whose_group_sqlite_rolls_back_fails_and_its_claim_takes_nothing() {
    let (_dir, _, _, core, plans, first) = three_queued_first_claimed();
    let fail = WorkerRequest::Fail {
        ordinal: None,
        error: "boom".into(),
    };
    let (ends, mut ends_answer) = then_job(&first.lease, fail, "w1");
    // Ends the whole transaction behind the group's back, as SQLite does after an
    // I/O error or a full disk: the claims then run alone, after the group.
    let lose: super::writer::Call = Box::new(|c: &SqliteCore| {
        c.connection().execute_batch("ROLLBACK").unwrap();
        Box::new(|_| {})
    });
    super::writer::run_group(&core, vec![ends, super::writer::Job::Call(lose)]);

    assert!(ends_answer.try_recv().unwrap().is_err());
    assert_eq!(
        core.history(&plans[0]).unwrap()[0].attempt.status,
        AttemptStatus::Running,
        "the request was rolled back with its group"
    );
    assert_eq!(
        owners(&core, &plans),
        [Some("w1".into()), None, None],
        "and its claim never ran"
    );
}

#[test]
fn a_migration_that_would_leave_a_dangling_reference_commits_nothing() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    migrate_to(&core, &clock, 2);
    before_version_9_and_10(&core, || three_queued(&core, &clock));
    // A receipt whose attempt is gone (written with foreign keys off, as another
    // tool might have).
    core.connection().execute_batch("PRAGMA foreign_keys = OFF").unwrap();
    core.connection()
        .execute_batch(
            "INSERT INTO receipt (attempt_id, ordinal, step_code, idempotency_key, status) \
             VALUES ('att-gone', 1, 's', 'k', 'PENDING')",
        )
        .unwrap();
    core.connection().execute_batch("PRAGMA foreign_keys = ON").unwrap();
    match core.migrate() {
        Err(LedgerError::Integrity(m)) => assert!(m.contains("receipt") && m.contains("attempt"), "{m}"),
        other => panic!("expected an integrity error, got {other:?}"),
    }
    let versions: Vec<u32> = core
        .connection()
        .prepare("SELECT version FROM schema_migrations ORDER BY version")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(versions, vec![1, 2], "version 3 rolled back");
    let fk: i64 = core
        .connection()
        .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
        .unwrap();
    assert_eq!(fk, 1, "foreign keys are on again after a failed migration");
    assert_eq!(core.open_attempts().unwrap(), 3);
}

/// Two ledgers with the same history: six queued attempts, the first claimed and its
/// lease expired (so the next claim takes it over).
fn six_queued_one_expired() -> (
    tempfile::TempDir,
    tempfile::TempDir,
    Arc<ManualClock>,
    SqliteCore,
    SqliteCore,
) {
    let clock = clock();
    let ((dir_a, path_a), (dir_b, path_b)) = (temp_db(), temp_db());
    let (a, b) = (core_at(&path_a, &clock, 5), core_at(&path_b, &clock, 5));
    for core in [&a, &b] {
        core.migrate().unwrap();
    }
    for i in 0..6 {
        for core in [&a, &b] {
            let plan = core.register_plan(spec(&format!("p{i}"), "resume", 2), KNOWN).unwrap();
            core.enqueue(&plan.id, Action::Execute).unwrap();
        }
        clock.advance_ms(1);
    }
    for core in [&a, &b] {
        assert_eq!(core.claim("w0", 1, 10).unwrap().len(), 1);
    }
    clock.advance_ms(11);
    (dir_a, dir_b, clock, a, b)
}

#[test]
fn merged_claims_take_what_the_claims_would_take_one_after_the_other() {
    let (_da, _db, _clock, merged, alone) = six_queued_one_expired();
    let request = |owner: &str, batch: u32, begin: bool| super::ClaimRequest {
        owner: owner.to_owned(),
        batch,
        lease_ms: LEASE_MS,
        begin,
        capabilities: None,
    };
    let requests = [
        request("w1", 2, false),
        request("w2", 0, true),
        request("w3", 1, true),
        request("w4", 5, false),
    ];
    let together = merged.claim_many(&requests).unwrap();
    let one_by_one: Vec<_> = requests
        .iter()
        .map(|r| {
            if r.begin {
                alone.claim_and_begin(&r.owner, r.batch, r.lease_ms).unwrap()
            } else {
                alone.claim(&r.owner, r.batch, r.lease_ms).unwrap()
            }
        })
        .collect();
    let sizes: Vec<usize> = together.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![2, 0, 1, 3], "the takeover and five queued, oldest first");
    assert_eq!(together, one_by_one, "same commands, tokens, rows and plans");
    assert_eq!(
        together[0][0].record.command.delivery_count, 2,
        "the expired lease first"
    );
    assert_eq!(
        together[2][0].record.receipts[0].status,
        ReceiptStatus::Running,
        "w3 began its step"
    );
    // The stored rows agree too.
    for (k, claims) in together.iter().enumerate() {
        for c in claims {
            let stored = alone.attempt(&c.lease.attempt_id).unwrap();
            assert_eq!(merged.attempt(&c.lease.attempt_id).unwrap(), stored);
            assert_eq!(stored.command.lease_owner.as_deref(), Some(requests[k].owner.as_str()));
        }
    }
    assert!(merged.claim("w5", 5, LEASE_MS).unwrap().is_empty());
}

#[tokio::test]
async fn concurrent_claims_on_one_ledger_share_out_every_command_once() {
    let (dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 3);
    core.migrate().unwrap();
    const COMMANDS: usize = 200;
    for i in 0..COMMANDS {
        let plan = core.register_plan(spec(&format!("p{i}"), "resume", 1), KNOWN).unwrap();
        core.enqueue(&plan.id, Action::Execute).unwrap();
    }
    drop(core);
    let ledger = Arc::new(SqliteLedger::open(&path, clock.clone(), Arc::new(SeededEntropy::new(4))).unwrap());
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..8 {
        let ledger = Arc::clone(&ledger);
        tasks.spawn(async move {
            let mut mine = Vec::new();
            loop {
                let claimed = if w % 2 == 0 {
                    ledger.claim(&format!("w{w}"), 1 + w % 3, LEASE_MS).await.unwrap()
                } else {
                    ledger
                        .claim_and_begin(&format!("w{w}"), 1 + w % 3, LEASE_MS)
                        .await
                        .unwrap()
                };
                if claimed.is_empty() {
                    return mine;
                }
                for c in claimed {
                    assert_eq!(c.record.command.lease_owner.as_deref(), Some(format!("w{w}").as_str()));
                    mine.push(c.lease.command_id);
                }
            }
        });
    }
    let mut all = BTreeSet::new();
    while let Some(mine) = tasks.join_next().await {
        for id in mine.unwrap() {
            assert!(all.insert(id), "a command claimed twice");
        }
    }
    assert_eq!(all.len(), COMMANDS, "every command claimed once");
    assert!(ledger.writer_stats().calls >= 8, "{:?}", ledger.writer_stats());
    drop(dir);
}

#[test]
fn every_kind_of_guard_is_checked_on_the_stored_command() {
    let (_dir, _clock, core, lease) = claimed_fixture();
    let conn = core.connection();
    let check = |guard: Guard| rows::check_guard(conn, &lease.attempt_id, &guard);
    let stale = Err(LedgerError::Refused(Refusal::StaleToken {
        command: lease.command_id.clone(),
    }));
    assert_eq!(check(Guard::Holds(lease.token.clone())), Ok(()));
    assert_eq!(check(Guard::Holds(LeaseToken::new("other"))), stale);
    assert_eq!(
        check(Guard::Unchanged {
            status: CommandStatus::Processing,
            lease_token: Some(lease.token.clone()),
        }),
        Ok(())
    );
    assert_eq!(
        check(Guard::Unchanged {
            status: CommandStatus::Processing,
            lease_token: None,
        }),
        stale
    );
    // The lease is live at T0: not claimable then, claimable once it has run out.
    assert_eq!(check(Guard::Claimable(Timestamp::from_millis(T0))), stale);
    assert_eq!(
        check(Guard::Claimable(Timestamp::from_millis(T0 + LEASE_MS as i64 + 1))),
        Ok(())
    );
}

#[tokio::test]
async fn a_migration_sent_among_claims_runs_alone_and_upgrades_the_ledger() {
    // A version-2 ledger with queued attempts (rows that other rows reference).
    let (dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    migrate_to(&core, &clock, 2);
    before_version_9_and_10(&core, || three_queued(&core, &clock));
    drop(core);
    let ledger = Arc::new(SqliteLedger::open(&path, clock.clone(), Arc::new(SeededEntropy::new(2))).unwrap());
    // Claims queued before and after the migration: the writer would group them with
    // it, and foreign keys cannot be switched off inside a group's transaction.
    let claims = |owner: &'static str| {
        let ledger = Arc::clone(&ledger);
        async move { ledger.claim(owner, 1, LEASE_MS).await }
    };
    let (before, migrated, after) = tokio::join!(
        eight_claims(&claims, "early"),
        ledger.migrate(),
        eight_claims(&claims, "late"),
    );
    assert_eq!(migrated.unwrap(), versions_from(3));
    // A claim that runs before the migration reads today's plan columns and limit
    // rows: it fails on the old schema, naming what is missing, and claims nothing.
    for early in before.iter().filter_map(|r| r.as_ref().err()) {
        let text = early.to_string();
        assert!(text.contains("retry_json") || text.contains("target_limit"), "{early}");
    }
    let after: Vec<_> = after
        .into_iter()
        .map(|r| r.expect("a claim after the migration"))
        .collect();
    let claimed: usize = before.into_iter().flatten().chain(after).map(|c| c.len()).sum();
    assert_eq!(
        claimed, 3,
        "every queued attempt claimed once, before or after the upgrade"
    );
    let fk: i64 = SqliteCore::open(&path, clock.clone(), Arc::new(SeededEntropy::new(3)))
        .unwrap()
        .connection()
        .query_row("PRAGMA foreign_key_check", [], |_| Ok(1))
        .unwrap_or(0);
    assert_eq!(fk, 0, "no dangling reference");
    drop(dir);
}

/// Eight claims by `owner`, one after the other.
async fn eight_claims<F, Fut>(claim: &F, owner: &'static str) -> Vec<Result<Vec<crate::ledger::Claimed>, LedgerError>>
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<crate::ledger::Claimed>, LedgerError>>,
{
    let mut all = Vec::new();
    let mut pending: Vec<_> = (0..8).map(|_| Box::pin(claim(owner))).collect();
    for p in pending.iter_mut() {
        all.push(p.as_mut().await);
    }
    all
}

#[test]
fn an_open_attempt_is_counted_by_its_command() {
    // One definition on every backend: an attempt is open while its command is
    // PENDING or PROCESSING (the transitions write both together). A damaged pair (a
    // RUNNING attempt beside a DELIVERED command, a SUCCEEDED one beside a PENDING
    // command) shows which one is counted.
    let (_dir, _clock, core, lease) = claimed_fixture();
    assert_eq!(core.open_attempts().unwrap(), 1);
    let conn = core.connection();
    conn.execute(
        "UPDATE command SET status = 'DELIVERED' WHERE id = ?1",
        [lease.command_id.as_str()],
    )
    .unwrap();
    assert_eq!(core.open_attempts().unwrap(), 0, "the command is DELIVERED");
    conn.execute(
        "UPDATE attempt SET status = 'SUCCEEDED' WHERE id = ?1",
        [lease.attempt_id.as_str()],
    )
    .unwrap();
    conn.execute(
        "UPDATE command SET status = 'PENDING' WHERE id = ?1",
        [lease.command_id.as_str()],
    )
    .unwrap();
    assert_eq!(core.open_attempts().unwrap(), 1, "a PENDING command is open");
    // The count reads the claims' partial indexes, never a table, and no index of
    // attempts by status is left to maintain.
    let sql = &crate::ledger::sql::query::queries(&crate::ledger::sql::SQLITE).open_attempts;
    let text = query_plan(conn, sql, []);
    assert!(
        text.contains("command_pending") && text.contains("command_leased"),
        "{text}"
    );
    assert!(
        !text.contains("SCAN command\n") && !text.ends_with("SCAN command"),
        "{text}"
    );
    let left: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_schema WHERE type = 'index' AND name = 'attempt_open'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(left, 0, "migration 8 drops attempt_open");
}

#[test]
fn an_ending_write_and_the_claim_after_it_commit_once_outside_a_group() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let mut core = core_at(&path, &clock, 1);
    core.migrate().unwrap();
    let plans = three_queued(&core, &clock);
    let first = core.claim_and_begin("w1", 1, LEASE_MS).unwrap().remove(0);
    let commits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&commits);
    core.connection_mut()
        .commit_hook(Some(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            false
        }))
        .unwrap();
    let claim = leasehold_engine::ClaimRequest {
        owner: "w1".into(),
        batch: 1,
        lease_ms: LEASE_MS,
        begin: true,
        capabilities: None,
    };
    let fail = WorkerRequest::Fail {
        ordinal: Some(1),
        error: "gave up".into(),
    };
    let (_, claimed) = core.worker_then_claim(&first.lease, fail, claim.clone()).unwrap();
    assert_eq!(claimed.len(), 1, "the freed slot took the next command");
    assert_eq!(
        commits.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one commit for both"
    );
    // A refused request (the old lease again) writes nothing, claims nothing, commits nothing.
    let again = WorkerRequest::Fail {
        ordinal: Some(1),
        error: "twice".into(),
    };
    assert!(core.worker_then_claim(&first.lease, again, claim).is_err());
    assert_eq!(commits.load(std::sync::atomic::Ordering::SeqCst), 1);
    core.connection_mut().commit_hook(None::<fn() -> bool>).unwrap();
    let statuses: Vec<AttemptStatus> = plans
        .iter()
        .map(|p| core.history(p).unwrap().remove(0).attempt.status)
        .collect();
    assert_eq!(
        statuses,
        [AttemptStatus::Failed, AttemptStatus::Running, AttemptStatus::Queued]
    );
}

#[test]
fn a_claimed_attempt_is_cached_until_its_terminal_write() {
    let (_dir, clock, core, lease) = claimed_fixture();
    assert_eq!(core.cached_records(), vec![lease.attempt_id.clone()]);
    for ordinal in 1..=2 {
        clock.advance_ms(1);
        core.begin_step(&lease, ordinal, LEASE_MS).unwrap();
        core.complete_step(&lease, ordinal, &json!({"n": ordinal}), &json!(null), LEASE_MS)
            .unwrap();
        assert_eq!(core.cached_records(), vec![lease.attempt_id.clone()]);
    }
    core.finish(&lease).unwrap();
    assert!(core.cached_records().is_empty(), "a delivered attempt is dropped");
    let record = core.attempt(&lease.attempt_id).unwrap();
    assert_eq!(record.attempt.status, AttemptStatus::Succeeded);
    assert_eq!(record.command.status, CommandStatus::Delivered);
}

#[test]
fn another_connections_commit_empties_the_record_cache() {
    let (dir, clock, core, lease) = claimed_fixture();
    let path = dir.path().join("ledger.db").to_str().unwrap().to_owned();
    assert_eq!(core.cached_records(), vec![lease.attempt_id.clone()]);
    // An operator on another connection aborts the attempt the cache holds as RUNNING.
    let other = core_at(&path, &clock, 2);
    other.abort(&lease.attempt_id, "operator").unwrap();
    clock.advance_ms(1);
    // An abort through the first connection is decided on the aborted rows: the
    // engine's answer for an attempt already aborted, as a fresh connection gets it,
    // not a write built on the cached RUNNING rows that the guard then refuses.
    let again = core.abort(&lease.attempt_id, "again");
    let fresh = core_at(&path, &clock, 3).abort(&lease.attempt_id, "again");
    assert_eq!(again, fresh);
    assert!(
        !matches!(again, Err(LedgerError::Refused(Refusal::StaleToken { .. }))),
        "{again:?}"
    );
    assert_eq!(
        core.attempt(&lease.attempt_id).unwrap().attempt.status,
        AttemptStatus::Aborted
    );
}

#[test]
fn a_rolled_back_write_empties_the_record_cache() {
    let (_dir, clock, core, lease) = claimed_fixture();
    clock.advance_ms(1);
    let outer = core.write_tx().unwrap();
    core.begin_step(&lease, 1, LEASE_MS).unwrap();
    drop(outer);
    assert!(core.cached_records().is_empty());
    // Step 1 never began: beginning it now is a first begin, decided on the rows.
    core.begin_step(&lease, 1, LEASE_MS).unwrap();
    let record = core.attempt(&lease.attempt_id).unwrap();
    assert_eq!(record.receipts[0].status, ReceiptStatus::Running);
}

#[tokio::test]
async fn a_call_that_arrives_while_a_group_runs_joins_its_transaction() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 5);
    core.migrate().unwrap();
    let first = core.register_plan(spec("first", "resume", 1), KNOWN).unwrap();
    let second = core.register_plan(spec("second", "resume", 1), KNOWN).unwrap();
    drop(core);
    let ledger = SqliteLedger::open(&path, clock.clone(), Arc::new(SeededEntropy::new(5))).unwrap();
    let before = ledger.writer_stats();

    // The first call holds the writer until the second has been sent to it.
    let (started, running) = tokio::sync::oneshot::channel();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let first_id = first.id.clone();
    let held = ledger.clone();
    let a = async move {
        held.write(move |core| {
            let _ = started.send(());
            wait.recv().expect("the test lets the first call go");
            core.enqueue(&first_id, Action::Execute)
        })
        .await
    };
    let a = tokio::spawn(a);
    running.await.unwrap();
    let second_id = second.id.clone();
    let b = ledger.write(move |core| core.enqueue(&second_id, Action::Execute));
    tokio::pin!(b);
    // Polled once, the second call is sent to the writer's queue and waits.
    tokio::select! {
        biased;
        _ = &mut b => panic!("the second call cannot finish while the writer is held"),
        _ = std::future::ready(()) => {}
    }
    go.send(()).unwrap();
    let a = a.await.unwrap().unwrap();
    let b = b.await.unwrap();

    let after = ledger.writer_stats();
    assert_eq!(after.calls - before.calls, 2);
    assert_eq!(
        after.groups - before.groups,
        1,
        "both calls committed in one transaction"
    );
    assert_eq!(ledger.attempt(&a.attempt.id).await.unwrap(), a);
    assert_eq!(ledger.attempt(&b.attempt.id).await.unwrap(), b);
}

/// Pages and stored bytes of the attempt, command and receipt tables (SQLite's
/// `dbstat`, the tables' own B-trees), in that order.
fn table_pages_and_payload(core: &SqliteCore) -> Vec<(String, i64, i64)> {
    let mut stmt = core
        .connection()
        .prepare(
            "SELECT name, count(*), sum(payload) FROM dbstat \
             WHERE name IN ('attempt', 'command', 'receipt') GROUP BY name ORDER BY name",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    rows
}

/// `n` plans of one step with one queued attempt each.
fn queue_one_step_attempts(core: &SqliteCore, clock: &ManualClock, n: usize) {
    for _ in 0..n {
        let name = format!("rows-{}", clock.now().as_millis());
        let plan = core.register_plan(spec(&name, "resume", 1), KNOWN).unwrap();
        core.enqueue(&plan.id, Action::Execute).unwrap();
        clock.advance_ms(1);
    }
}

/// Claims, runs and finishes every queued attempt, with evidence and a target receipt
/// the size of a dry run's and a lease owner of 28 characters.
fn deliver_all(core: &SqliteCore) -> usize {
    let mut delivered = 0;
    loop {
        let claimed = core
            .claim_and_begin("bench-worker-0000000000000-1", 8, LEASE_MS)
            .unwrap();
        if claimed.is_empty() {
            return delivered;
        }
        for claim in &claimed {
            let evidence = json!({"dry_run": true, "executor": "dry-run:v1", "payload": {"n": 1}, "step": "step-1", "note": "x".repeat(40)});
            let target = json!({"dry_run": format!("ik-{}", "0".repeat(32))});
            core.complete_step(&claim.lease, 1, &evidence, &target, LEASE_MS)
                .unwrap();
            core.finish(&claim.lease).unwrap();
            delivered += 1;
        }
    }
}

#[test]
fn a_delivery_rewrites_its_rows_in_place_without_splitting_a_page() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    core.migrate().unwrap();
    queue_one_step_attempts(&core, &clock, 400);
    let queued = table_pages_and_payload(&core);
    assert_eq!(queued.len(), 3);
    assert!(queued.iter().all(|(_, pages, _)| *pages > 4), "{queued:?}");
    assert_eq!(deliver_all(&core), 400);
    let delivered = table_pages_and_payload(&core);
    for ((table, pages_before, bytes_before), (_, pages_after, bytes_after)) in queued.iter().zip(&delivered) {
        assert_eq!(
            pages_after, pages_before,
            "{table}: every row kept its size, so no page split ({queued:?} → {delivered:?})"
        );
        // Within a byte per row: the room's own header varint.
        assert!(
            (bytes_after - bytes_before).abs() <= 400,
            "{table}: {bytes_before} → {bytes_after} bytes"
        );
    }
    let rooms: Vec<i64> = ["attempt", "command", "receipt"]
        .iter()
        .map(|t| {
            core.connection()
                .query_row(&format!("SELECT min(length(room)) FROM {t}"), [], |r| r.get(0))
                .unwrap()
        })
        .collect();
    assert!(rooms.iter().all(|&n| n > 0), "room left in every row: {rooms:?}");
}

#[test]
fn rows_written_before_version_6_keep_no_room_and_new_ones_get_it() {
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    migrate_to(&core, &clock, 5);
    let before: Vec<_> = before_version_9_and_10(&core, || {
        queue_one_step_attempts(&core, &clock, 3);
        core.list_plans()
            .unwrap()
            .iter()
            .map(|p| unrouted(core.history(&p.id).unwrap()))
            .collect()
    });
    assert_eq!(core.migrate().unwrap(), versions_from(6));
    let after: Vec<_> = core
        .list_plans()
        .unwrap()
        .iter()
        .map(|p| core.history(&p.id).unwrap())
        .collect();
    assert_eq!(after, before, "every row kept, value for value");
    queue_one_step_attempts(&core, &clock, 2);
    assert_eq!(deliver_all(&core), 5);
    for table in ["attempt", "command", "receipt"] {
        let (without, with): (i64, i64) = core
            .connection()
            .query_row(
                &format!("SELECT count(*) FILTER (WHERE room IS NULL), count(room) FROM {table}"),
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(
            (without, with),
            (3, 2),
            "{table}: the old rows got no room through their transitions"
        );
    }
    assert!(
        core.history(&core.list_plans().unwrap()[0].id).unwrap()[0]
            .attempt
            .status
            == AttemptStatus::Succeeded
    );
}

#[test]
fn claims_of_different_batches_reuse_the_prepared_claim_statement() {
    // Without the planner's stability guarantee (see `SqliteCore::open_with`)
    // SQLite plans with the value bound to the claim's `LIMIT` and prepares the
    // statement again on every use.
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    core.migrate().unwrap();
    for i in 1..=6 {
        let plan = core
            .register_plan(spec(&format!("batch{i}"), "replay", 1), KNOWN)
            .unwrap();
        core.enqueue(&plan.id, Action::Execute).unwrap();
    }
    for batch in [1, 2, 3] {
        assert_eq!(core.claim("w1", batch, LEASE_MS).unwrap().len(), batch as usize);
    }
    let statement = core.connection().prepare_cached(&rows::CLAIM_PENDING_SQL).unwrap();
    assert!(
        statement.get_status(rusqlite::StatementStatus::VmStep) > 0,
        "the cached claim statement is the one the claims ran"
    );
    assert_eq!(statement.get_status(rusqlite::StatementStatus::RePrepare), 0);
}

#[test]
fn enqueues_and_reads_reuse_their_prepared_statements() {
    // The same for a value in `col = ?` of a statement the planner weighs whole
    // (a join, a sort).
    let (_dir, path) = temp_db();
    let clock = clock();
    let core = core_at(&path, &clock, 1);
    core.migrate().unwrap();
    let mut ids = Vec::new();
    for i in 1..=4 {
        let plan = core
            .register_plan(spec(&format!("reuse{i}"), "replay", 1), KNOWN)
            .unwrap();
        ids.push(core.enqueue(&plan.id, Action::Execute).unwrap().attempt.id);
    }
    for id in &ids {
        core.attempt(id).unwrap();
    }
    let q = super::super::sql::query::queries(&super::super::sql::SQLITE);
    for sql in [&q.ready_plan_by_fingerprint_locked, &q.history_attempts] {
        let statement = core.connection().prepare_cached(sql).unwrap();
        assert!(statement.get_status(rusqlite::StatementStatus::VmStep) > 0, "{sql}");
        assert_eq!(statement.get_status(rusqlite::StatementStatus::RePrepare), 0, "{sql}");
    }
}
