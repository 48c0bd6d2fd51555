//! API tokens on every backend: created once, stored only as a SHA-256, listed
//! without secrets, revoked for good; names are unique and checked.

use leasehold::clock::{ManualClock, SystemClock};
use leasehold::entropy::{OsEntropy, SeededEntropy};
use leasehold::ledger::memory::MemoryLedger;
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::{Ledger, LedgerError};
use leasehold::tokens::{create_token, token_hash, Role, TokenStore};
use leasehold_engine::Timestamp;
use std::sync::Arc;

async fn tokens_behave<S: TokenStore>(store: &S) {
    let t0 = Timestamp::from_millis(1_700_000_000_000);
    let (info, secret) = create_token(store, "ci", Role::Operator, t0).await.unwrap();
    assert_eq!(
        (info.name.as_str(), info.role, info.created_at, info.revoked_at),
        ("ci", Role::Operator, t0, None)
    );
    let found = store
        .token_by_hash(&token_hash(secret.expose()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found, info);
    assert_eq!(store.token_by_hash(&token_hash("lh_other")).await.unwrap(), None);
    // A name is used once, even after revocation.
    let again = create_token(store, "ci", Role::Viewer, t0).await.unwrap_err();
    assert!(
        matches!(again, LedgerError::BadInput(ref m) if m.contains("already used")),
        "{again}"
    );
    assert!(matches!(
        create_token(store, "bad name", Role::Viewer, t0).await,
        Err(LedgerError::BadInput(_))
    ));
    let (viewer, _) = create_token(store, "dash", Role::Viewer, t0.plus_ms(1)).await.unwrap();
    let listed = store.list_tokens().await.unwrap();
    assert_eq!(listed, vec![info.clone(), viewer]);
    // Revocation is immediate and idempotent.
    let t1 = t0.plus_ms(5_000);
    let revoked = store.revoke_token("ci", t1).await.unwrap();
    assert_eq!(revoked.revoked_at, Some(t1));
    assert_eq!(store.token_by_hash(&secret.hash()).await.unwrap(), None);
    assert_eq!(
        store.revoke_token("ci", t1.plus_ms(9)).await.unwrap().revoked_at,
        Some(t1)
    );
    assert!(matches!(
        store.revoke_token("nobody", t1).await,
        Err(LedgerError::NotFound { kind: "token", .. })
    ));
    assert!(matches!(
        create_token(store, "ci", Role::Admin, t1).await,
        Err(LedgerError::BadInput(_))
    ));
    // Every role is stored and read back as it is.
    for (n, role) in Role::ALL.iter().enumerate() {
        let name = format!("role-{role}");
        let (stored, secret) = create_token(store, &name, *role, t1.plus_ms(n as u64)).await.unwrap();
        assert_eq!(stored.role, *role);
        assert_eq!(
            store.token_by_hash(&secret.hash()).await.unwrap().map(|t| t.role),
            Some(*role)
        );
    }
}

#[tokio::test]
async fn memory_tokens() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(0)));
    tokens_behave(&MemoryLedger::new(clock, Arc::new(SeededEntropy::new(1)))).await;
}

#[tokio::test]
async fn sqlite_tokens_and_only_their_digest_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db").display().to_string();
    let ledger = SqliteLedger::open(&path, Arc::new(SystemClock), Arc::new(OsEntropy)).unwrap();
    ledger.migrate().await.unwrap();
    tokens_behave(&ledger).await;
    let (_, secret) = create_token(&ledger, "disk", Role::Admin, Timestamp::from_millis(1))
        .await
        .unwrap();
    drop(ledger);
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        bytes.extend(std::fs::read(entry.unwrap().path()).unwrap());
    }
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains(secret.expose()), "the secret is on disk");
    assert!(text.contains(&secret.hash()), "its digest is stored");
}

#[tokio::test]
async fn sqlite_private_database_tokens() {
    let ledger = SqliteLedger::open(":memory:", Arc::new(SystemClock), Arc::new(OsEntropy)).unwrap();
    ledger.migrate().await.unwrap();
    tokens_behave(&ledger).await;
}

#[tokio::test]
async fn an_unmigrated_ledger_says_to_migrate() {
    let ledger = SqliteLedger::open(":memory:", Arc::new(SystemClock), Arc::new(OsEntropy)).unwrap();
    let e = ledger.list_tokens().await.unwrap_err();
    assert!(e.to_string().contains("leasehold migrate"), "{e}");
}

#[tokio::test]
async fn mysql_tokens() {
    let Ok(url) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
        eprintln!("skipped: LEASEHOLD_TEST_MYSQL_URL is not set");
        return;
    };
    let leasehold::ledger::DbUrl::Mysql(admin) = leasehold::ledger::DbUrl::parse(&url).unwrap() else {
        panic!("LEASEHOLD_TEST_MYSQL_URL is not a mysql URL")
    };
    let scratch = leasehold::ledger::mysql::scratch::ScratchDatabase::create(&admin, "lh_tokens_")
        .await
        .unwrap();
    let ledger = leasehold::ledger::mysql::MysqlLedger::open(scratch.url(), Arc::new(OsEntropy));
    ledger.migrate().await.unwrap();
    tokens_behave(&ledger).await;
    let page = ledger.list_attempts(&Default::default()).await.unwrap();
    assert!(page.records.is_empty() && page.next.is_none());
    let counts = ledger.count_attempts(10).await.unwrap();
    assert!(counts.states.iter().all(|s| s.count == 0 && !s.capped));
}

#[tokio::test]
async fn postgres_tokens() {
    let Ok(url) = std::env::var("LEASEHOLD_TEST_POSTGRES_URL") else {
        eprintln!("skipped: LEASEHOLD_TEST_POSTGRES_URL is not set");
        return;
    };
    let leasehold::ledger::DbUrl::Postgres(admin) = leasehold::ledger::DbUrl::parse(&url).unwrap() else {
        panic!("LEASEHOLD_TEST_POSTGRES_URL is not a postgres URL")
    };
    let scratch = leasehold::ledger::postgres::scratch::ScratchDatabase::create(&admin, "lh_tokens_")
        .await
        .unwrap();
    let ledger = leasehold::ledger::postgres::PostgresLedger::open(scratch.url(), Arc::new(OsEntropy)).unwrap();
    let e = ledger.list_tokens().await.unwrap_err();
    assert!(e.to_string().contains("leasehold migrate"), "{e}");
    ledger.migrate().await.unwrap();
    tokens_behave(&ledger).await;
    let page = ledger.list_attempts(&Default::default()).await.unwrap();
    assert!(page.records.is_empty() && page.next.is_none());
    let counts = ledger.count_attempts(10).await.unwrap();
    assert!(counts.states.iter().all(|s| s.count == 0 && !s.capped));
}
