//! Unit tests of the MySQL ledger: lost connections, lost claim races on both claim
//! paths (`SKIP LOCKED` and the portable one), claims passing over rows others hold,
//! the `SKIP LOCKED` probe, batched claim writes against the reference ledger, the
//! database clock, matched-row counting, concurrent migrators and registrations.
//! Those that need a server use `LEASEHOLD_TEST_MYSQL_URL` and a scratch database
//! each; without it they print why they are skipped and pass.

use super::scratch::ScratchDatabase;
use super::{MysqlLedger, MysqlUrl};
use crate::clock::{Clock, ManualClock};
use crate::entropy::{Entropy, SeededEntropy};
use crate::ledger::sql::ledger::Checkpoint as KillPoint;
use crate::ledger::{Ledger, LedgerError};
use leasehold_engine::{Action, AttemptStatus, CommandStatus, Lease, PlanSpec, Timestamp};
use mysql_async::prelude::Queryable;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;

const KNOWN: &[&str] = &["dry-run:v1"];
const LEASE_MS: u64 = 30_000;
const T0: i64 = 1_796_000_000_000;

fn spec(name: &str, steps: usize) -> PlanSpec {
    let steps: Vec<Value> = (1..=steps)
        .map(|i| json!({"code": format!("step-{i}"), "executor": "dry-run:v1", "payload": {"n": i}}))
        .collect();
    serde_json::from_value(json!({"name": name, "recovery": "resume", "steps": steps})).unwrap()
}

/// A scratch database on the test server, or `None` (reason printed) without one.
async fn scratch() -> Option<ScratchDatabase> {
    let Ok(url) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
        println!("skipped: LEASEHOLD_TEST_MYSQL_URL is not set (e.g. mysql://root@127.0.0.1:3306/test)");
        return None;
    };
    let admin = MysqlUrl::parse(&url).expect("LEASEHOLD_TEST_MYSQL_URL");
    Some(
        ScratchDatabase::create(&admin, "lh_unit_")
            .await
            .expect("create a scratch database"),
    )
}

fn entropy(seed: u64) -> Arc<dyn Entropy> {
    Arc::new(SeededEntropy::new(seed))
}

/// A migrated ledger on a manual clock.
async fn manual(db: &ScratchDatabase, clock: &Arc<ManualClock>, seed: u64) -> MysqlLedger {
    manual_with(db, clock, seed, |_| {}).await
}

/// A migrated ledger on a manual clock, its URL options changed by `options`.
async fn manual_with(
    db: &ScratchDatabase,
    clock: &Arc<ManualClock>,
    seed: u64,
    options: impl FnOnce(&mut super::MysqlOptions),
) -> MysqlLedger {
    let mut url = db.url().clone();
    options(&mut url.options);
    let c: Arc<dyn Clock> = clock.clone();
    let ledger = MysqlLedger::open_with_clock(&url, c, entropy(seed));
    ledger.migrate().await.unwrap();
    ledger
}

/// Whether the test server has `SELECT … FOR UPDATE SKIP LOCKED`, by its version:
/// MariaDB 10.6+ or MySQL 8.0.1+.
async fn server_has_skip_locked(ledger: &MysqlLedger) -> bool {
    let mut conn = ledger.pooled_connection().await.map_err(|_| ()).unwrap();
    let version: String = conn.query_first("SELECT VERSION()").await.unwrap().unwrap();
    let numbers: Vec<u32> = version
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map(|n| n.parse().unwrap_or(0))
        .collect();
    let at_least = |want: [u32; 3]| numbers.as_slice() >= want.as_slice();
    if version.contains("MariaDB") {
        at_least([10, 6, 0])
    } else {
        at_least([8, 0, 1])
    }
}

/// Registers `n` one-step plans and enqueues one attempt of each, one millisecond
/// apart on the ledger clock, so that their claim order is their enqueue order;
/// answers their command ids in that order.
async fn enqueue_in_order(ledger: &MysqlLedger, clock: &ManualClock, n: usize) -> Vec<leasehold_engine::CommandId> {
    let mut commands = Vec::new();
    for i in 0..n {
        let plan = ledger.register_plan(spec(&format!("p{i}"), 1), KNOWN).await.unwrap();
        commands.push(ledger.enqueue(&plan.id, Action::Execute).await.unwrap().command.id);
        clock.advance_ms(1);
    }
    commands
}

/// One claimed attempt of a two-step plan.
async fn claimed(ledger: &MysqlLedger) -> Lease {
    let plan = ledger.register_plan(spec("p", 2), KNOWN).await.unwrap();
    ledger.enqueue(&plan.id, Action::Execute).await.unwrap();
    let mut c = ledger.claim("w", 1, LEASE_MS).await.unwrap();
    assert_eq!(c.len(), 1);
    c.remove(0).lease
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_within_the_timeout_and_never_shows_the_password() {
    // Port 1 on loopback: nothing listens there, so the connection is refused.
    let url = MysqlUrl::parse("mysql://app:hunter2@127.0.0.1:1/none?connect_timeout_ms=2000").unwrap();
    let ledger = MysqlLedger::open(&url, entropy(1));
    let started = std::time::Instant::now();
    let e = ledger.open_attempts().await.unwrap_err();
    assert!(matches!(e, LedgerError::Unavailable(_)), "{e:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let shown = format!("{e} {e:?} {ledger:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[tokio::test]
async fn a_connection_lost_during_commit_is_ambiguous_and_the_server_keeps_nothing() {
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let ledger = manual(&db, &clock, 1).await;
    let lease = claimed(&ledger).await;
    let before = ledger.attempt(&lease.attempt_id).await.unwrap();
    clock.advance_ms(1_000);
    ledger.kill_at(KillPoint::BeforeCommit);
    let e = ledger.heartbeat(&lease, LEASE_MS).await.unwrap_err();
    assert!(matches!(e, LedgerError::Ambiguous(_)), "{e:?}");
    // The COMMIT never reached the server: the renewal was rolled back.
    assert_eq!(ledger.attempt(&lease.attempt_id).await.unwrap(), before);
    // The lease is still good: the worker may simply retry.
    let until = ledger.heartbeat(&lease, LEASE_MS).await.unwrap();
    assert_eq!(until, clock.now().plus_ms(LEASE_MS));
}

#[tokio::test]
async fn a_connection_lost_before_commit_is_retried_on_a_new_connection() {
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let ledger = manual(&db, &clock, 2).await;
    let lease = claimed(&ledger).await;
    let retries = ledger.stats().retries;
    ledger.kill_at(KillPoint::AfterReads);
    ledger.begin_step(&lease, 1, LEASE_MS).await.unwrap();
    assert_eq!(ledger.stats().retries, retries + 1);
    let record = ledger.attempt(&lease.attempt_id).await.unwrap();
    assert_eq!(record.receipts[0].status, leasehold_engine::ReceiptStatus::Running);
}

/// A claimer that saw a command claimable, and locks it only after another claimer
/// has claimed it and committed, finds it taken: refused and counted, never claimed
/// twice. On the portable path the claimer pauses between its listing and its locks;
/// on the `SKIP LOCKED` path it pauses after fixing a snapshot, which stages the race
/// its window read can lose when another claimer commits within that one statement.
async fn a_lost_claim_race_is_refused_and_counted(skip_locked: bool) {
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let slow = manual_with(&db, &clock, 3, |o| o.skip_locked = skip_locked).await;
    let fast = manual_with(&db, &clock, 4, |o| o.skip_locked = skip_locked).await;
    let plan = slow.register_plan(spec("p", 1), KNOWN).await.unwrap();
    slow.enqueue(&plan.id, Action::Execute).await.unwrap();

    let (reached, resume) = slow.pause_next_claim();
    let slow_claim = {
        let slow = slow.clone();
        tokio::spawn(async move { slow.claim("slow", 5, LEASE_MS).await })
    };
    reached.await.expect("the slow claim fixed what it sees");
    let won = fast.claim("fast", 5, LEASE_MS).await.unwrap();
    assert_eq!(won.len(), 1);
    resume.send(()).unwrap();
    let lost = slow_claim.await.unwrap().unwrap();
    assert!(lost.is_empty(), "a claimed command was claimed again");
    let expected = skip_locked && server_has_skip_locked(&slow).await;
    assert_eq!(slow.uses_skip_locked(), Some(expected), "the claim path");
    let stats = slow.stats();
    assert_eq!(
        (stats.claims, stats.lost_claim_races, stats.refused_claim_updates),
        (0, 1, 0)
    );
    let record = fast.attempt(&won[0].lease.attempt_id).await.unwrap();
    assert_eq!(record.command.lease_owner.as_deref(), Some("fast"));
    assert_eq!(record.command.delivery_count, 1);
}

#[tokio::test]
async fn a_claim_race_lost_between_listing_and_locking_is_refused_and_counted() {
    a_lost_claim_race_is_refused_and_counted(false).await;
}

#[tokio::test]
async fn a_skip_locked_claim_that_locks_a_command_claimed_since_its_snapshot_refuses_and_counts_it() {
    a_lost_claim_race_is_refused_and_counted(true).await;
}

#[tokio::test]
async fn skip_locked_claimers_pass_over_rows_another_claimer_holds_without_waiting() {
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let holder = manual(&db, &clock, 12).await;
    // Should this claimer ever wait for the holder's locks, it would time out after
    // a second and give up at once: the claim below would fail.
    let other = manual_with(&db, &clock, 13, |o| {
        o.lock_wait_timeout_s = 1;
        o.retry_max = 1;
    })
    .await;
    if !server_has_skip_locked(&holder).await {
        println!("skipped: the server has no SKIP LOCKED");
        return;
    }
    let commands = enqueue_in_order(&holder, &clock, 3).await;

    let (reached, resume) = holder.pause_next_claim_holding();
    let holding = {
        let holder = holder.clone();
        tokio::spawn(async move { holder.claim("holder", 1, LEASE_MS).await })
    };
    reached.await.expect("the holder locked its row");
    // The holder holds the oldest command, uncommitted: the other claimer takes the
    // next ones, oldest first, while the holder still holds it.
    let taken: Vec<_> = other
        .claim("other", 5, LEASE_MS)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.lease.command_id)
        .collect();
    assert_eq!(taken, commands[1..].to_vec());
    assert!(other.claim("other", 5, LEASE_MS).await.unwrap().is_empty());
    resume.send(()).unwrap();
    let held: Vec<_> = holding
        .await
        .unwrap()
        .unwrap()
        .into_iter()
        .map(|c| c.lease.command_id)
        .collect();
    assert_eq!(held, commands[..1].to_vec());
    assert_eq!(other.uses_skip_locked(), Some(true));
    let stats = other.stats();
    assert_eq!((stats.claims, stats.lost_claim_races, stats.retries), (2, 0, 0));
}

#[tokio::test]
async fn a_skip_locked_claim_looks_past_a_window_that_others_hold_entirely() {
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let holder = manual(&db, &clock, 14).await;
    // A window of one command per claimed command: the holder's row fills it.
    let other = manual_with(&db, &clock, 15, |o| o.claim_spread = 1).await;
    if !server_has_skip_locked(&holder).await {
        println!("skipped: the server has no SKIP LOCKED");
        return;
    }
    let commands = enqueue_in_order(&holder, &clock, 3).await;
    let (reached, resume) = holder.pause_next_claim_holding();
    let holding = {
        let holder = holder.clone();
        tokio::spawn(async move { holder.claim("holder", 1, LEASE_MS).await })
    };
    reached.await.expect("the holder locked its row");
    for expected in &commands[1..] {
        let taken = other.claim("other", 1, LEASE_MS).await.unwrap();
        assert_eq!(taken.len(), 1);
        assert_eq!(&taken[0].lease.command_id, expected);
    }
    // Only the held command is left: nothing to claim, and no waiting for it.
    assert!(other.claim("other", 1, LEASE_MS).await.unwrap().is_empty());
    resume.send(()).unwrap();
    assert_eq!(holding.await.unwrap().unwrap().len(), 1);
}

#[tokio::test]
async fn the_server_is_asked_once_whether_it_has_skip_locked() {
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let ledger = manual(&db, &clock, 16).await;
    let forced = manual_with(&db, &clock, 17, |o| o.skip_locked = false).await;
    assert_eq!(ledger.uses_skip_locked(), None, "not asked before the first claim");
    assert_eq!(forced.uses_skip_locked(), Some(false), "skip_locked=0 never asks");
    enqueue_in_order(&ledger, &clock, 2).await;
    assert_eq!(ledger.claim("w", 1, LEASE_MS).await.unwrap().len(), 1);
    let expected = server_has_skip_locked(&ledger).await;
    assert_eq!(ledger.uses_skip_locked(), Some(expected));
    assert_eq!(
        ledger.clone().uses_skip_locked(),
        Some(expected),
        "clones share the answer"
    );
    assert_eq!(forced.claim("w", 1, LEASE_MS).await.unwrap().len(), 1);
    assert_eq!(forced.uses_skip_locked(), Some(false));
}

#[test]
fn a_server_without_skip_locked_is_told_by_its_parse_error() {
    use super::error::TxError;
    use mysql_async::{Error, ServerError};
    let server = |code: u16| {
        Err(Error::Server(ServerError {
            code,
            message: format!("error {code}"),
            state: "42000".into(),
        }))
    };
    assert!(matches!(super::claim::skip_locked_answer(Ok(())), Ok(true)));
    for code in [1064, 1149, 1235] {
        assert!(
            matches!(super::claim::skip_locked_answer(server(code)), Ok(false)),
            "{code}"
        );
    }
    // A missing table is the missing schema, not a missing feature.
    assert!(matches!(
        super::claim::skip_locked_answer(server(1146)),
        Err(TxError::Ledger(LedgerError::Internal(_)))
    ));
    let lost = Err(Error::Driver(mysql_async::DriverError::ConnectionClosed));
    assert!(matches!(super::claim::skip_locked_answer(lost), Err(TxError::Retry(_))));
}

/// Claims, fused claims and takeovers of several attempts at once (one batched
/// `UPDATE` per table) leave exactly the rows that the reference ledger leaves.
async fn batched_claims_match_the_reference_ledger(skip_locked: bool) {
    use crate::ledger::memory::MemoryLedger;
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    // A spread of 1: the portable path draws no random start from the entropy, so
    // both ledgers mint the same tokens.
    let mysql = manual_with(&db, &clock, 18, |o| {
        o.skip_locked = skip_locked;
        o.claim_spread = 1;
    })
    .await;
    let c: Arc<dyn Clock> = clock.clone();
    let memory = MemoryLedger::new(c, entropy(18));
    let evidence = json!({"rows": 3});
    let target = json!({"ref": "t"});
    let mut attempts = Vec::new();
    for (i, recovery) in ["resume", "replay", "resume", "replay", "resume"].iter().enumerate() {
        let spec: PlanSpec = serde_json::from_value(json!({
            "name": format!("plan-{i}"),
            "recovery": recovery,
            "steps": (1..=3).map(|n| json!({"code": format!("s{n}"), "executor": "dry-run:v1", "payload": {}})).collect::<Vec<_>>(),
        }))
        .unwrap();
        let a = mysql.register_plan(spec.clone(), KNOWN).await.unwrap();
        let b = memory.register_plan(spec, KNOWN).await.unwrap();
        assert_eq!(a.id, b.id, "the same entropy mints the same ids");
        let a = mysql.enqueue(&a.id, Action::Execute).await.unwrap();
        memory.enqueue(&b.id, Action::Execute).await.unwrap();
        attempts.push(a.attempt.id);
        clock.advance_ms(1);
    }
    let compare = |what: &'static str| {
        let (mysql, memory, attempts) = (&mysql, &memory, &attempts);
        async move {
            for id in attempts {
                let (a, b) = (mysql.attempt(id).await.unwrap(), memory.attempt(id).await.unwrap());
                assert_eq!(a, b, "{what}: attempt {id}");
            }
        }
    };
    // A fused claim of four (the fifth stays PENDING), then a plain claim of the fifth.
    let a = mysql.claim_and_begin("w1", 4, LEASE_MS).await.unwrap();
    let b = memory.claim_and_begin("w1", 4, LEASE_MS).await.unwrap();
    assert_eq!(a, b, "fused claims");
    assert_eq!(a.len(), 4);
    assert_eq!(
        mysql.claim("w1", 4, LEASE_MS).await.unwrap(),
        memory.claim("w1", 4, LEASE_MS).await.unwrap()
    );
    compare("after the claims").await;
    // Some attempts get a step further, then every lease expires.
    for c in a.iter().step_by(2) {
        let x = mysql
            .complete_and_continue(&c.lease, 1, &evidence, &target, LEASE_MS)
            .await
            .unwrap();
        let y = memory
            .complete_and_continue(&c.lease, 1, &evidence, &target, LEASE_MS)
            .await
            .unwrap();
        assert_eq!(x, y);
    }
    clock.advance_ms(LEASE_MS + 1);
    // Takeovers of all five at once: resume resets the running step, replay every one.
    let a = mysql.claim_and_begin("w2", 10, LEASE_MS).await.unwrap();
    let b = memory.claim_and_begin("w2", 10, LEASE_MS).await.unwrap();
    assert_eq!(a.len(), 5);
    assert_eq!(a, b, "fused takeovers");
    compare("after the takeovers").await;
    assert!(a.iter().all(|c| c.record.command.delivery_count == 2));
}

#[tokio::test]
async fn batched_skip_locked_claims_write_what_the_reference_ledger_writes() {
    batched_claims_match_the_reference_ledger(true).await;
}

#[tokio::test]
async fn batched_portable_claims_write_what_the_reference_ledger_writes() {
    batched_claims_match_the_reference_ledger(false).await;
}

#[tokio::test]
async fn a_write_that_changes_no_column_still_counts_its_row() {
    // Without CLIENT_FOUND_ROWS, MySQL counts changed rows: a heartbeat in the same
    // millisecond as the claim rewrites identical values and would look refused.
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let ledger = manual(&db, &clock, 5).await;
    let lease = claimed(&ledger).await;
    let until = ledger.heartbeat(&lease, LEASE_MS).await.unwrap();
    assert_eq!(until, clock.now().plus_ms(LEASE_MS));
    ledger.heartbeat(&lease, LEASE_MS).await.unwrap();
}

#[tokio::test]
async fn leases_are_decided_on_the_database_clock_by_default() {
    let Some(db) = scratch().await else { return };
    // The ledger's entropy and this process's clock play no part: read the server's.
    let ledger = MysqlLedger::open(db.url(), entropy(6));
    ledger.migrate().await.unwrap();
    let db_now = || async {
        let mut conn = ledger.pooled_connection().await.map_err(|_| ()).unwrap();
        crate::ledger::sql::session::db_now(&mut super::session::MySession(&mut conn))
            .await
            .map_err(|_| ())
            .unwrap()
    };
    let plan = ledger.register_plan(spec("p", 1), KNOWN).await.unwrap();
    ledger.enqueue(&plan.id, Action::Execute).await.unwrap();
    let before = db_now().await;
    let c = ledger.claim("w", 1, LEASE_MS).await.unwrap().remove(0);
    let after = db_now().await;
    let at = c.record.command.last_heartbeat_at.unwrap();
    assert!(before <= at && at <= after, "{before:?} <= {at:?} <= {after:?}");
    assert_eq!(c.record.command.lease_until, Some(at.plus_ms(LEASE_MS)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_that_waited_for_a_lock_decides_at_the_time_it_got_it() {
    let Some(db) = scratch().await else { return };
    let ledger = MysqlLedger::open(db.url(), entropy(12));
    ledger.migrate().await.unwrap();
    let plan = ledger.register_plan(spec("p", 1), KNOWN).await.unwrap();
    ledger.enqueue(&plan.id, Action::Execute).await.unwrap();
    let lease = ledger.claim("w", 1, LEASE_MS).await.unwrap().remove(0).lease;
    // Another session holds the attempt's row.
    let mut holder = ledger.pooled_connection().await.map_err(|_| ()).unwrap();
    holder.query_drop("START TRANSACTION").await.unwrap();
    holder
        .exec_drop(
            "SELECT id FROM attempt WHERE id = ? FOR UPDATE",
            (lease.attempt_id.as_str(),),
        )
        .await
        .unwrap();
    let heartbeat = {
        let (ledger, lease) = (ledger.clone(), lease.clone());
        tokio::spawn(async move { ledger.heartbeat(&lease, LEASE_MS).await })
    };
    // Wait (by the server's own account) until a statement of the heartbeat runs, held
    // up by that row (the holder itself is idle inside its transaction), then until
    // the database clock has moved on by a second.
    let mut watcher = ledger.pooled_connection().await.map_err(|_| ()).unwrap();
    loop {
        let running: Option<i64> = watcher
            .query_first(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE db = DATABASE() \
                 AND command IN ('Query', 'Execute') AND id <> CONNECTION_ID()",
            )
            .await
            .unwrap();
        if running.unwrap_or(0) > 0 {
            break;
        }
        assert!(!heartbeat.is_finished(), "the heartbeat did not wait for the row");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let waiting_since = crate::ledger::sql::session::db_now(&mut super::session::MySession(&mut watcher))
        .await
        .map_err(|_| ())
        .unwrap();
    let released_at = loop {
        let now = crate::ledger::sql::session::db_now(&mut super::session::MySession(&mut watcher))
            .await
            .map_err(|_| ())
            .unwrap();
        if now >= waiting_since.plus_ms(1_000) {
            break now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    holder.query_drop("COMMIT").await.unwrap();
    let until = heartbeat.await.unwrap().unwrap();
    // Decided at the time its locks were held, not when its statement started.
    assert!(
        until >= released_at.plus_ms(LEASE_MS),
        "lease until {until:?}, lock released at {released_at:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrators_apply_each_version_once() {
    let Some(db) = scratch().await else { return };
    let ledgers: Vec<MysqlLedger> = (0..4).map(|i| MysqlLedger::open(db.url(), entropy(i))).collect();
    let tasks: Vec<_> = ledgers
        .iter()
        .map(|l| {
            let l = l.clone();
            tokio::spawn(async move { l.migrate().await })
        })
        .collect();
    let mut applied = Vec::new();
    for t in tasks {
        applied.extend(t.await.unwrap().unwrap());
    }
    applied.sort();
    assert_eq!(
        applied,
        crate::ledger::migrate::versions(super::schema::MIGRATIONS),
        "every version applied exactly once"
    );
    let mut conn = ledgers[0].pooled_connection().await.map_err(|_| ()).unwrap();
    let recorded: Vec<(u32, String)> = conn
        .query("SELECT version, name FROM schema_migrations ORDER BY version")
        .await
        .unwrap();
    assert_eq!(
        recorded,
        vec![
            (1, "init".to_owned()),
            (2, "covering_claim_index".to_owned()),
            (3, "api_tokens".to_owned()),
            (4, "plan_names".to_owned()),
            (5, "delivery_policy".to_owned()),
            (6, "routing".to_owned()),
            (7, "target_limits".to_owned()),
            (8, "schema_compat".to_owned()),
            (9, "traces".to_owned()),
            (10, "enqueue_keys".to_owned()),
            (11, "producer_role".to_owned()),
            (12, "templates".to_owned()),
            (13, "sql_enqueue".to_owned())
        ]
    );
}

#[tokio::test]
async fn the_covering_claim_index_migration_can_run_again() {
    let Some(db) = scratch().await else { return };
    let ledger = MysqlLedger::open(db.url(), entropy(19));
    ledger.migrate().await.unwrap();
    let mut conn = ledger.pooled_connection().await.map_err(|_| ()).unwrap();
    // A run cut short after the ALTER but before recording version 2 runs it again.
    for statement in super::schema::statements(super::schema::MIGRATIONS[1].sql) {
        conn.query_drop(statement).await.unwrap();
    }
    let columns: Vec<String> = conn
        .query(
            "SELECT column_name FROM information_schema.statistics WHERE table_schema = DATABASE() \
             AND table_name = 'command' AND index_name = 'command_claimable' ORDER BY seq_in_index",
        )
        .await
        .unwrap();
    assert_eq!(columns, ["status", "available_at", "id", "attempt_id"]);
}

#[tokio::test]
async fn the_plan_names_migration_can_run_again() {
    let Some(db) = scratch().await else { return };
    let ledger = MysqlLedger::open(db.url(), entropy(23));
    ledger.migrate().await.unwrap();
    let mut conn = ledger.pooled_connection().await.map_err(|_| ()).unwrap();
    // A run cut short after the CREATE INDEX but before recording version 4 runs it
    // again: it must create nothing and fail on nothing.
    for statement in super::schema::statements(super::schema::MIGRATIONS[3].sql) {
        conn.query_drop(statement).await.unwrap();
    }
    let columns: Vec<(String, Option<u64>)> = conn
        .query(
            "SELECT column_name, sub_part FROM information_schema.statistics WHERE table_schema = DATABASE() \
             AND table_name = 'plan' AND index_name = 'plan_by_name' ORDER BY seq_in_index",
        )
        .await
        .unwrap();
    assert_eq!(columns, [("name".to_owned(), Some(191))]);
}

#[tokio::test]
async fn a_schema_newer_than_the_binary_is_refused() {
    let Some(db) = scratch().await else { return };
    let ledger = MysqlLedger::open(db.url(), entropy(7));
    ledger.migrate().await.unwrap();
    let mut conn = ledger.pooled_connection().await.map_err(|_| ()).unwrap();
    conn.query_drop("INSERT INTO schema_migrations VALUES (99, 'future', 0)")
        .await
        .unwrap();
    let e = ledger.migrate().await.unwrap_err();
    assert!(
        matches!(&e, LedgerError::Integrity(m) if m.contains("schema version 99")),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_registrations_of_the_same_content_answer_one_plan() {
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let first = manual(&db, &clock, 8).await;
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let c: Arc<dyn Clock> = clock.clone();
        let ledger = MysqlLedger::open_with_clock(db.url(), c, entropy(100 + i));
        tasks.push(tokio::spawn(async move {
            let plan = ledger.register_plan(spec("same", 3), KNOWN).await.unwrap();
            (plan.id, ledger.stats().retries)
        }));
    }
    let mut ids = BTreeSet::new();
    let mut retries = 0;
    for t in tasks {
        let (id, r) = t.await.unwrap();
        ids.insert(id);
        retries += r;
    }
    println!("deadlocks and lock waits retried: {retries}");
    assert_eq!(ids.len(), 1, "one content, one plan: {ids:?}");
    assert_eq!(first.list_plans().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_failed_attempt_fails_its_command_and_a_retry_can_follow() {
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let ledger = manual(&db, &clock, 9).await;
    let lease = claimed(&ledger).await;
    ledger.begin_step(&lease, 1, LEASE_MS).await.unwrap();
    ledger.fail(&lease, Some(1), "no").await.unwrap();
    let record = ledger.attempt(&lease.attempt_id).await.unwrap();
    assert_eq!(
        (record.attempt.status, record.command.status),
        (AttemptStatus::Failed, CommandStatus::Failed)
    );
    let retry = ledger.enqueue(&record.attempt.plan_id, Action::Retry).await.unwrap();
    assert_eq!(retry.attempt.number, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_frozen_inside_a_transaction_releases_its_locks_after_the_idle_timeout() {
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let c: Arc<dyn Clock> = clock.clone();
    let url = db.url().clone();
    let mut frozen_url = url.clone();
    frozen_url.options.idle_timeout_s = 1;
    frozen_url.options.lock_wait_timeout_s = 30;
    let frozen = MysqlLedger::open_with_clock(&frozen_url, c.clone(), entropy(10));
    frozen.migrate().await.unwrap();
    let lease = claimed(&frozen).await;
    let other = MysqlLedger::open_with_clock(&url, c, entropy(11));

    frozen.stall_next_transition(4_000);
    let stalled = {
        let (frozen, lease) = (frozen.clone(), lease.clone());
        tokio::spawn(async move { frozen.heartbeat(&lease, LEASE_MS).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // The frozen transaction holds the attempt's row: this waits for it, and gets it
    // once the server has dropped the frozen connection (about a second), long
    // before the 30 s lock-wait timeout.
    let started = std::time::Instant::now();
    other.begin_step(&lease, 1, LEASE_MS).await.unwrap();
    let waited = started.elapsed();
    assert!(waited < std::time::Duration::from_secs(4), "waited {waited:?}");
    // The frozen call finds its connection gone, and its retry succeeds.
    stalled.await.unwrap().unwrap();
    assert!(frozen.stats().retries >= 1);
}

#[tokio::test]
async fn an_open_attempt_is_counted_by_its_command() {
    // The same definition as every other backend: the command's status (PENDING or
    // PROCESSING), not the attempt's (a damaged pair shows which one is counted).
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let ledger = manual(&db, &clock, 1).await;
    let lease = claimed(&ledger).await;
    assert_eq!(ledger.open_attempts().await.unwrap(), 1);
    // The console's counts read the same commands.
    let count = |status| {
        let ledger = &ledger;
        async move { ledger.count_attempts(10).await.unwrap().get(status).unwrap().count }
    };
    assert_eq!(count(AttemptStatus::Running).await, 1);
    let mut conn = ledger.pooled_connection().await.map_err(|_| ()).unwrap();
    conn.exec_drop(
        "UPDATE command SET status = 'DELIVERED' WHERE id = ?",
        (lease.command_id.as_str(),),
    )
    .await
    .unwrap();
    assert_eq!(ledger.open_attempts().await.unwrap(), 0, "the command is DELIVERED");
    conn.exec_drop(
        "UPDATE attempt SET status = 'SUCCEEDED' WHERE id = ?",
        (lease.attempt_id.as_str(),),
    )
    .await
    .unwrap();
    conn.exec_drop(
        "UPDATE command SET status = 'PENDING' WHERE id = ?",
        (lease.command_id.as_str(),),
    )
    .await
    .unwrap();
    crate::ledger::sql::tests::assert_damaged_pair_counted_by_command(&ledger).await;
}

#[tokio::test]
async fn a_fused_write_stands_when_its_claim_is_refused() {
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let ledger = manual(&db, &clock, 3).await;
    assert!(server_has_skip_locked(&ledger).await, "the test server fuses claims");
    let mut conn = ledger.pooled_connection().await.map_err(|_| ()).unwrap();
    crate::ledger::sql::tests::assert_a_fused_write_stands_when_its_claim_is_refused(&ledger, |plan| async move {
        let sql = "UPDATE plan SET steps_json = 'not json' WHERE id = ?";
        conn.exec_drop(sql, (plan,)).await.unwrap();
        assert_eq!(conn.affected_rows(), 1);
    })
    .await;
}
