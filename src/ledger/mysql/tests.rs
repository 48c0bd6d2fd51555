//! Unit tests of the MySQL ledger: lost connections, lost claim races, the database
//! clock, matched-row counting, concurrent migrators and registrations. Those that
//! need a server use `LEASEHOLD_TEST_MYSQL_URL` and a scratch database each; without
//! it they print why they are skipped and pass.

use super::connection::KillPoint;
use super::scratch::ScratchDatabase;
use super::{MysqlLedger, MysqlUrl};
use crate::clock::{Clock, ManualClock};
use crate::entropy::{Entropy, SeededEntropy};
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
    let c: Arc<dyn Clock> = clock.clone();
    let ledger = MysqlLedger::open_with_clock(db.url(), c, entropy(seed));
    ledger.migrate().await.unwrap();
    ledger
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

#[tokio::test]
async fn a_claim_race_lost_between_listing_and_locking_is_refused_and_counted() {
    let Some(db) = scratch().await else { return };
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let slow = manual(&db, &clock, 3).await;
    let fast = manual(&db, &clock, 4).await;
    let plan = slow.register_plan(spec("p", 1), KNOWN).await.unwrap();
    slow.enqueue(&plan.id, Action::Execute).await.unwrap();

    let (reached, resume) = slow.pause_next_claim();
    let slow_claim = {
        let slow = slow.clone();
        tokio::spawn(async move { slow.claim("slow", 5, LEASE_MS).await })
    };
    reached.await.expect("the slow claim listed its candidates");
    let won = fast.claim("fast", 5, LEASE_MS).await.unwrap();
    assert_eq!(won.len(), 1);
    resume.send(()).unwrap();
    let lost = slow_claim.await.unwrap().unwrap();
    assert!(lost.is_empty(), "a claimed command was claimed again");
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
        let mut conn = ledger.connect().await.map_err(|_| ()).unwrap();
        super::rows::db_now(&mut conn).await.map_err(|_| ()).unwrap()
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
    assert_eq!(applied, vec![1], "every version applied exactly once");
    let mut conn = ledgers[0].connect().await.map_err(|_| ()).unwrap();
    let recorded: Vec<(u32, String)> = conn.query("SELECT version, name FROM schema_migrations").await.unwrap();
    assert_eq!(recorded, vec![(1, "init".to_owned())]);
}

#[tokio::test]
async fn a_schema_newer_than_the_binary_is_refused() {
    let Some(db) = scratch().await else { return };
    let ledger = MysqlLedger::open(db.url(), entropy(7));
    ledger.migrate().await.unwrap();
    let mut conn = ledger.connect().await.map_err(|_| ()).unwrap();
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
