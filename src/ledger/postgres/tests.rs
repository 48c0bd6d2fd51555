//! The PostgreSQL ledger's own tests. Those that need a server use
//! `LEASEHOLD_TEST_POSTGRES_URL` (e.g. `postgres://postgres@127.0.0.1:5432/test`) and a
//! scratch database each; without it they print why they are skipped and pass.

use super::scratch::ScratchDatabase;
use super::*;
use crate::entropy::OsEntropy;

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
    assert_eq!(ledger.migrate().await.unwrap(), vec![1]);
    assert_eq!(ledger.migrate().await.unwrap(), Vec::<u32>::new());
    ledger.check_schema().await.unwrap();
    let client = ledger.connect().await.map_err(LedgerError::from).unwrap();
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
    assert_eq!(applied, vec![1], "{results:?}");
    let client = ledgers[0].connect().await.map_err(LedgerError::from).unwrap();
    let rows = client
        .query("SELECT version FROM schema_migrations", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
}

#[tokio::test]
async fn a_newer_schema_is_refused_naming_both_versions() {
    let Some(db) = scratch().await else { return };
    let ledger = ledger(&db);
    ledger.migrate().await.unwrap();
    let client = ledger.connect().await.map_err(LedgerError::from).unwrap();
    client
        .execute("INSERT INTO schema_migrations VALUES (99, 'future', 0)", &[])
        .await
        .unwrap();
    drop(client);
    let e = ledger.check_schema().await.unwrap_err();
    assert!(matches!(e, LedgerError::BadInput(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("schema version 99") && text.contains("this binary's 1"),
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
    let client = ledger.connect().await.map_err(LedgerError::from).unwrap();
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
            let client = ledger.connect().await.map_err(LedgerError::from)?;
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
        let client = ledger.connect().await.map_err(LedgerError::from).unwrap();
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
