//! The PostgreSQL ledger's own tests. Those that need a server use
//! `LEASEHOLD_TEST_POSTGRES_URL` (e.g. `postgres://postgres@127.0.0.1:5432/test`) and a
//! scratch database each; without it they print why they are skipped and pass.

use super::scratch::ScratchDatabase;
use super::*;
use crate::entropy::OsEntropy;
use crate::ledger::Ledger;

async fn scratch() -> Option<ScratchDatabase> {
    let Ok(url) = std::env::var("LEASEHOLD_TEST_POSTGRES_URL") else {
        println!("skipped: LEASEHOLD_TEST_POSTGRES_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/test)");
        return None;
    };
    let admin = PostgresUrl::parse(&url).expect("LEASEHOLD_TEST_POSTGRES_URL");
    Some(
        ScratchDatabase::create(&admin, "lh_test_")
            .await
            .expect("scratch database"),
    )
}

fn ledger(db: &ScratchDatabase) -> PostgresLedger {
    PostgresLedger::open(db.url(), Arc::new(OsEntropy)).expect("open")
}

#[tokio::test]
async fn migrate_applies_once_and_the_schema_is_then_accepted() {
    let Some(db) = scratch().await else { return };
    let ledger = ledger(&db);
    let missing = ledger.check_schema().await.unwrap_err().to_string();
    assert!(
        missing.contains("holds no leasehold schema: run `leasehold migrate`"),
        "{missing}"
    );
    assert_eq!(
        ledger.migrate().await.unwrap(),
        crate::ledger::migrate::versions(super::schema::MIGRATIONS)
    );
    assert_eq!(ledger.migrate().await.unwrap(), Vec::<u32>::new());
    ledger.check_schema().await.unwrap();
    let client = ledger.session().await.unwrap();
    let row = client
        .query_one("SELECT name, applied_at FROM schema_migrations WHERE version = 1", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "init");
    let applied_at: i64 = row.get(1);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        (now_ms - applied_at).abs() < 600_000,
        "applied_at {applied_at} is not the database's now"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrators_apply_each_migration_once() {
    let Some(db) = scratch().await else { return };
    let ledgers: Vec<_> = (0..4).map(|_| ledger(&db)).collect();
    let runs: Vec<_> = ledgers
        .iter()
        .cloned()
        .map(|l| tokio::spawn(async move { l.migrate().await }))
        .collect();
    let mut results = Vec::new();
    for run in runs {
        results.push(run.await.expect("migrator task").expect("migrate"));
    }
    let applied: Vec<u32> = results.iter().flatten().copied().collect();
    assert_eq!(
        applied,
        crate::ledger::migrate::versions(super::schema::MIGRATIONS),
        "{results:?}"
    );
    let client = ledgers[0].session().await.unwrap();
    let rows = client
        .query("SELECT version FROM schema_migrations", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), super::schema::MIGRATIONS.len());
}

#[tokio::test]
async fn a_newer_schema_is_refused_naming_both_versions() {
    let Some(db) = scratch().await else { return };
    let ledger = ledger(&db);
    ledger.migrate().await.unwrap();
    let client = ledger.session().await.unwrap();
    client
        .execute("INSERT INTO schema_migrations VALUES (99, 'future', 0)", &[])
        .await
        .unwrap();
    drop(client);
    let e = ledger.check_schema().await.unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("schema version 99")
            && text.contains(&format!(
                "this binary's {}",
                super::schema::MIGRATIONS.last().unwrap().version
            )),
        "{text}"
    );
    let e = ledger.migrate().await.unwrap_err();
    assert!(matches!(e, LedgerError::Integrity(_)), "{e:?}");
}

#[tokio::test]
async fn sessions_carry_the_url_timeouts() {
    let Some(db) = scratch().await else { return };
    let url = PostgresUrl::parse(&format!(
        "{}&statement_timeout_ms=1234&lock_timeout_ms=567&idle_timeout_s=8",
        db.url().expose()
    ))
    .unwrap();
    let ledger = PostgresLedger::open(&url, Arc::new(OsEntropy)).unwrap();
    let client = ledger.session().await.unwrap();
    let show = |name: &'static str| {
        let client = &client;
        async move {
            client
                .query_one(&format!("SHOW {name}"), &[])
                .await
                .unwrap()
                .get::<_, String>(0)
        }
    };
    assert_eq!(show("statement_timeout").await, "1234ms");
    assert_eq!(show("lock_timeout").await, "567ms");
    assert_eq!(show("idle_in_transaction_session_timeout").await, "8s");
    // A statement that runs past statement_timeout is cancelled by the server.
    let e = client.query_one("SELECT pg_sleep(5)", &[]).await.unwrap_err();
    assert_eq!(e.code(), Some(&tokio_postgres::error::SqlState::QUERY_CANCELED));
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_without_the_password() {
    let url = PostgresUrl::parse("postgres://u:hunter2@127.0.0.1:1/none?connect_timeout_ms=200&retry_max=1").unwrap();
    let ledger = PostgresLedger::open(&url, Arc::new(OsEntropy)).unwrap();
    let e = ledger.migrate().await.unwrap_err();
    assert!(matches!(e, LedgerError::Unavailable(_)), "{e:?}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[tokio::test]
async fn sslmode_means_what_it_means_in_libpq() {
    let Some(db) = scratch().await else { return };
    let uses_tls = |mode: &'static str| {
        let url = PostgresUrl::parse(&format!("{}&sslmode={mode}", db.url().expose())).unwrap();
        async move {
            let ledger = PostgresLedger::open(&url, Arc::new(OsEntropy)).unwrap();
            let client = ledger.session().await?;
            let row = client
                .query_one(
                    "SELECT COALESCE((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false)",
                    &[],
                )
                .await
                .unwrap();
            Ok::<bool, LedgerError>(row.get(0))
        }
    };
    assert!(!uses_tls("disable").await.unwrap());
    let server_has_tls = {
        let ledger = ledger(&db);
        let client = ledger.session().await.unwrap();
        client.query_one("SHOW ssl", &[]).await.unwrap().get::<_, String>(0) == "on"
    };
    if !server_has_tls {
        println!("the server has ssl = off: only sslmode=disable and prefer can be checked");
        assert!(!uses_tls("prefer").await.unwrap());
        return;
    }
    assert!(
        uses_tls("prefer").await.unwrap(),
        "prefer encrypts when the server offers TLS"
    );
    assert!(uses_tls("require").await.unwrap());
    // The local server's certificate is self-signed: verify-full must refuse it.
    let e = uses_tls("verify-full").await.unwrap_err();
    assert!(matches!(e, LedgerError::Unavailable(_)), "{e:?}");
}

/// The dry-run plan the tests below enqueue.
fn one_step_plan() -> leasehold_engine::PlanSpec {
    serde_json::from_value(serde_json::json!({
        "name": "wake",
        "recovery": "resume",
        "steps": [{"code": "notify", "executor": "dry-run:v1", "payload": {}}],
    }))
    .unwrap()
}

/// Waits for the next change of a wake-up receiver; failing after 10 s (a bound, not a
/// synchronisation: a notification arrives in milliseconds).
async fn next_wake(rx: &mut tokio::sync::watch::Receiver<u64>) -> u64 {
    tokio::time::timeout(std::time::Duration::from_secs(10), rx.changed())
        .await
        .expect("no wake-up within 10 s")
        .expect("the listener is gone");
    *rx.borrow_and_update()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_wakes_a_listening_worker_and_notify_0_listens_to_nothing() {
    use crate::ledger::Ledger;
    let Some(db) = scratch().await else { return };
    let ledger = ledger(&db);
    ledger.migrate().await.unwrap();
    let plan = ledger.register_plan(one_step_plan(), &["dry-run:v1"]).await.unwrap();
    let mut rx = Ledger::wake(&ledger).expect("postgres ledgers wake their workers");
    // The first change: the listening session is up (receivers look once).
    let listening = next_wake(&mut rx).await;
    let record = ledger
        .enqueue(&plan.id, leasehold_engine::Action::Execute)
        .await
        .unwrap();
    let woken = next_wake(&mut rx).await;
    assert!(woken > listening, "{woken} after {listening}");
    // What woke the worker is claimable at once.
    let claimed = ledger.claim("w1", 5, 30_000).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].lease.attempt_id, record.attempt.id);
    // Another ledger on the same database, the listening turned off.
    let mut quiet = db.url().clone();
    quiet.options.notify = false;
    let quiet = PostgresLedger::open(&quiet, Arc::new(OsEntropy)).unwrap();
    assert!(Ledger::wake(&quiet).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_take_disjoint_commands_without_waiting() {
    use crate::ledger::Ledger;
    let Some(db) = scratch().await else { return };
    let ledger = ledger(&db);
    ledger.migrate().await.unwrap();
    let mut attempts = std::collections::BTreeSet::new();
    for n in 0..40 {
        let mut spec = one_step_plan();
        spec.name = format!("claim-{n}");
        let plan = ledger.register_plan(spec, &["dry-run:v1"]).await.unwrap();
        attempts.insert(
            ledger
                .enqueue(&plan.id, leasehold_engine::Action::Execute)
                .await
                .unwrap()
                .attempt
                .id,
        );
    }
    let claimers: Vec<_> = (0..4)
        .map(|i| {
            let l = PostgresLedger::open(db.url(), Arc::new(OsEntropy)).unwrap();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let claimed = l.claim(&format!("w{i}"), 3, 30_000).await.unwrap();
                    if claimed.is_empty() {
                        break;
                    }
                    mine.extend(claimed.into_iter().map(|c| c.lease.attempt_id));
                }
                mine
            })
        })
        .collect();
    let mut claimed = Vec::new();
    for c in claimers {
        claimed.extend(c.await.unwrap());
    }
    let unique: std::collections::BTreeSet<_> = claimed.iter().cloned().collect();
    assert_eq!(unique.len(), claimed.len(), "a command was claimed twice");
    assert_eq!(unique, attempts, "every command claimed");
    assert_eq!(ledger.claim("late", 5, 30_000).await.unwrap().len(), 0);
}

#[tokio::test]
async fn an_open_attempt_is_counted_by_its_command() {
    // The same definition as every other backend: the command's status (PENDING or
    // PROCESSING), not the attempt's (a damaged pair shows which one is counted).
    use crate::ledger::Ledger;
    use leasehold_engine::AttemptStatus;
    let Some(db) = scratch().await else { return };
    let ledger = ledger(&db);
    ledger.migrate().await.unwrap();
    let plan = ledger.register_plan(one_step_plan(), &["dry-run:v1"]).await.unwrap();
    ledger
        .enqueue(&plan.id, leasehold_engine::Action::Execute)
        .await
        .unwrap();
    let lease = ledger.claim("w1", 1, 30_000).await.unwrap().remove(0).lease;
    assert_eq!(ledger.open_attempts().await.unwrap(), 1);
    // The console's counts read the same commands (migration 3 dropped attempt_open).
    let count = |status| {
        let ledger = &ledger;
        async move { ledger.count_attempts(10).await.unwrap().get(status).unwrap().count }
    };
    assert_eq!(count(AttemptStatus::Running).await, 1);
    let client = ledger.session().await.unwrap();
    let indexes: i64 = client
        .query_one("SELECT COUNT(*) FROM pg_indexes WHERE indexname = 'attempt_open'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(indexes, 0, "migration 3 drops attempt_open");
    let set = |table: &'static str, status: &'static str, id: String| {
        let client = &client;
        async move {
            let sql = format!("UPDATE {table} SET status = $1 WHERE id = $2");
            client.execute(sql.as_str(), &[&status, &id]).await.unwrap();
        }
    };
    set("command", "DELIVERED", lease.command_id.to_string()).await;
    assert_eq!(ledger.open_attempts().await.unwrap(), 0, "the command is DELIVERED");
    set("attempt", "SUCCEEDED", lease.attempt_id.to_string()).await;
    set("command", "PENDING", lease.command_id.to_string()).await;
    crate::ledger::sql::tests::assert_damaged_pair_counted_by_command(&ledger).await;
}

#[tokio::test]
async fn a_fused_write_stands_when_its_claim_is_refused() {
    let Some(db) = scratch().await else { return };
    let ledger = ledger(&db);
    ledger.migrate().await.unwrap();
    let client = ledger.session().await.unwrap();
    crate::ledger::sql::tests::assert_a_fused_write_stands_when_its_claim_is_refused(&ledger, |plan| {
        let client = &client;
        async move {
            let sql = "UPDATE plan SET steps_json = 'not json' WHERE id = $1";
            assert_eq!(client.execute(sql, &[&plan]).await.unwrap(), 1);
        }
    })
    .await;
}

/// What each of many concurrent lease holders' requests got, and the claims the
/// ending ones made: grouped or not, each request is decided on its own lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_are_grouped_and_each_is_fenced_on_its_own() {
    use crate::ledger::Ledger;
    use leasehold_engine::{ClaimRequest, CommandStatus, LeaseToken, Refusal, Reply, WorkerRequest};
    let Some(db) = scratch().await else { return };
    let ledger = ledger(&db);
    ledger.migrate().await.unwrap();
    for n in 0..60 {
        let mut spec = one_step_plan();
        spec.name = format!("group-{n}");
        let plan = ledger.register_plan(spec, &["dry-run:v1"]).await.unwrap();
        ledger
            .enqueue(&plan.id, leasehold_engine::Action::Execute)
            .await
            .unwrap();
    }
    let leases: Vec<_> = ledger
        .claim("w", 40, 30_000)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.lease)
        .collect();
    assert_eq!(leases.len(), 40);
    // Renewals of live leases, all at once: written in groups, none split.
    let renewals: Vec<_> = leases
        .iter()
        .map(|lease| {
            let (l, lease) = (ledger.clone(), lease.clone());
            tokio::spawn(async move { l.heartbeat(&lease, 30_000).await })
        })
        .collect();
    for renewal in renewals {
        renewal.await.unwrap().unwrap();
    }
    let stats = ledger.stats();
    assert!(
        stats.groups >= 1 && stats.grouped_requests >= 2 * stats.groups,
        "{stats:?}"
    );
    assert_eq!(stats.split_groups, 0, "{stats:?}");
    // Every fourth lease is forged; every fifth is only renewed; the rest end their
    // attempts and claim the next.
    let calls: Vec<_> = leases
        .iter()
        .enumerate()
        .map(|(i, lease)| {
            let (l, mut lease) = (ledger.clone(), lease.clone());
            let forged = i % 4 == 0;
            if forged {
                lease.token = LeaseToken::new("forged");
            }
            tokio::spawn(async move {
                if i % 5 == 0 && !forged {
                    let renewed = l.worker(&lease, WorkerRequest::Heartbeat { lease_ms: 30_000 }).await;
                    return (i, forged, renewed.map(|r| (r, Vec::new())));
                }
                let fail = WorkerRequest::Fail {
                    ordinal: None,
                    error: "ends".into(),
                };
                let claim = ClaimRequest {
                    owner: format!("w{i}"),
                    batch: 1,
                    lease_ms: 30_000,
                    begin: true,
                    capabilities: None,
                };
                (i, forged, l.worker_then_claim(&lease, fail, claim).await)
            })
        })
        .collect();
    let mut next = std::collections::BTreeSet::new();
    for call in calls {
        let (i, forged, answer) = call.await.unwrap();
        let lease = &leases[i];
        let record = ledger.attempt(&lease.attempt_id).await.unwrap();
        match answer {
            Err(LedgerError::Refused(Refusal::StaleToken { command })) if forged => {
                assert_eq!(command, lease.command_id);
                assert_eq!(record.command.status, CommandStatus::Processing, "#{i}: untouched");
            }
            Ok((Reply::Renewed { .. }, claimed)) if !forged && i % 5 == 0 => {
                assert!(claimed.is_empty());
                assert_eq!(record.command.status, CommandStatus::Processing, "#{i}: renewed");
            }
            Ok((Reply::Applied, claimed)) if !forged => {
                assert_eq!(record.command.status, CommandStatus::Failed, "#{i}: ended");
                for c in claimed {
                    assert_eq!(c.record.command.lease_owner.as_deref(), Some(format!("w{i}").as_str()));
                    assert!(next.insert(c.lease.attempt_id), "a command claimed twice");
                }
            }
            other => panic!("#{i} (forged: {forged}): {other:?}"),
        }
    }
    // 40 leases: 10 forged, 6 renewed, 24 ended, each claiming one of the 20 queued.
    assert_eq!(next.len(), 20, "every queued command claimed once");
    assert!(next.iter().all(|id| !leases.iter().any(|l| &l.attempt_id == id)));
    // A forged request met in a group is taken out and answered alone.
    assert!(ledger.stats().split_groups >= 1, "{:?}", ledger.stats());
}
