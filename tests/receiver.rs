//! The reference receiver (`leasehold::receiver`), each behaviour of its contract on
//! every backend: SQLite always, MariaDB / MySQL when `LEASEHOLD_TEST_MYSQL_URL` is
//! set, PostgreSQL when `LEASEHOLD_TEST_POSTGRES_URL` is (each test in a scratch
//! database of its own; without the variable those tests say they are skipped and
//! pass). Servers bind 127.0.0.1:0 in this process; requests
//! go through reqwest, as a worker's would.

use leasehold::ledger::mysql::scratch::ScratchDatabase;
use leasehold::ledger::mysql::MysqlUrl;
use leasehold::ledger::postgres::scratch::ScratchDatabase as PgScratch;
use leasehold::ledger::postgres::PostgresUrl;
use leasehold::ledger::DbUrl;
use leasehold::receiver::mysql::MysqlStore;
use leasehold::receiver::postgres::PostgresStore;
use leasehold::receiver::sqlite::SqliteStore;
use leasehold::receiver::{Begun, Effects, Faults, KeyStore, StoredResponse};
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy)]
enum Backend {
    Sqlite,
    Mysql,
    Postgres,
}

/// A database for one test: a SQLite file in a temporary directory, or a scratch
/// MySQL database (dropped with this value).
struct Db {
    url: DbUrl,
    _dir: Option<tempfile::TempDir>,
    _scratch: Option<ScratchDatabase>,
    _pg_scratch: Option<PgScratch>,
}

impl Db {
    /// `None` (after saying so) when the backend is MySQL and no server is configured.
    async fn new(backend: Backend) -> Option<Self> {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("target.db").display().to_string();
                Some(Db {
                    url: DbUrl::Sqlite(path),
                    _dir: Some(dir),
                    _scratch: None,
                    _pg_scratch: None,
                })
            }
            Backend::Mysql => {
                let Ok(admin) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
                    println!("skipped: LEASEHOLD_TEST_MYSQL_URL is not set (e.g. mysql://root@127.0.0.1:3306/test)");
                    return None;
                };
                let admin = MysqlUrl::parse(&admin).expect("LEASEHOLD_TEST_MYSQL_URL");
                let scratch = ScratchDatabase::create(&admin, "lh_tgt_")
                    .await
                    .expect("a scratch database");
                Some(Db {
                    url: DbUrl::Mysql(scratch.url().clone()),
                    _dir: None,
                    _scratch: Some(scratch),
                    _pg_scratch: None,
                })
            }
            Backend::Postgres => {
                let Ok(admin) = std::env::var("LEASEHOLD_TEST_POSTGRES_URL") else {
                    println!(
                        "skipped: LEASEHOLD_TEST_POSTGRES_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/test)"
                    );
                    return None;
                };
                let admin = PostgresUrl::parse(&admin).expect("LEASEHOLD_TEST_POSTGRES_URL");
                let scratch = PgScratch::create(&admin, "lh_tgt_").await.expect("a scratch database");
                Some(Db {
                    url: DbUrl::Postgres(scratch.url().clone()),
                    _dir: None,
                    _scratch: None,
                    _pg_scratch: Some(scratch),
                })
            }
        }
    }

    /// Starts a receiver on this database.
    async fn serve(&self, faults: Faults) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let (ready_tx, ready) = oneshot::channel::<String>();
        let url = self.url.clone();
        let task = tokio::spawn(async move {
            leasehold::receiver::open_and_serve(
                &url,
                faults,
                listener,
                |store| {
                    let _ = ready_tx.send(store.to_owned());
                },
                async move {
                    let _ = stopped.await;
                },
            )
            .await
        });
        ready.await.expect("the target opened its store");
        Server {
            addr,
            stop: Some(stop),
            task: Some(task),
            client: reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap(),
        }
    }
}

/// A running receiver and a client of it.
struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), leasehold::receiver::StoreError>>>,
    client: reqwest::Client,
}

/// One answer: status, `Idempotent-Replayed`, `Retry-After`, body.
#[derive(Debug)]
struct Reply {
    status: u16,
    replayed: bool,
    retry_after: Option<String>,
    body: Value,
}

impl Server {
    /// POSTs `body` to `/orders` with `key` (none: no header).
    async fn try_post(&self, key: Option<&str>, body: &str) -> Result<Reply, reqwest::Error> {
        self.try_post_to("/orders", key, body).await
    }

    /// POSTs `body` to `path` (and query) with `key` (none: no header).
    async fn try_post_to(&self, path: &str, key: Option<&str>, body: &str) -> Result<Reply, reqwest::Error> {
        let mut request = self
            .client
            .post(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
        let (replayed, retry_after) = (
            header("idempotent-replayed").as_deref() == Some("true"),
            header("retry-after"),
        );
        let body = serde_json::from_slice(&response.bytes().await?).unwrap_or(Value::Null);
        Ok(Reply {
            status,
            replayed,
            retry_after,
            body,
        })
    }

    async fn post(&self, key: Option<&str>, body: &str) -> Reply {
        self.post_to("/orders", key, body).await
    }

    async fn post_to(&self, path: &str, key: Option<&str>, body: &str) -> Reply {
        self.try_post_to(path, key, body).await.expect("an answer")
    }

    async fn effects(&self) -> Effects {
        let response = self
            .client
            .get(format!("http://{}/effects", self.addr))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
    }

    /// Stops the server and waits until it has stopped.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task
            .take()
            .unwrap()
            .await
            .unwrap()
            .expect("the target served without error");
    }
}

/// Polls `/effects` until `done` holds (bounded: a test that waits longer fails).
async fn wait_for(server: &Server, what: &str, done: impl Fn(&Effects) -> bool) -> Effects {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let effects = server.effects().await;
        if done(&effects) {
            return effects;
        }
        assert!(Instant::now() < deadline, "never saw {what}: {effects:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn delayed(ms: u64) -> Faults {
    Faults {
        delay: Duration::from_millis(ms),
        ..Faults::none()
    }
}

const ORDER: &str = r#"{"order":7,"total_cents":1250}"#;

async fn the_first_request_applies_its_effect_and_stores_its_response(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    let server = db.serve(Faults::none()).await;
    let first = server.post(Some("ik-1"), ORDER).await;
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    assert_eq!(first.body["idempotency_key"], "ik-1");
    assert!(first.body["id"].as_str().unwrap().starts_with("rcpt-"), "{first:?}");
    let effects = server.effects().await;
    assert_eq!((effects.keys, effects.effects, effects.in_progress), (1, 1, 0));
    assert_eq!(effects.by_key, [("ik-1".to_owned(), 1)].into());
    server.stop().await;
}

async fn a_repeat_with_the_same_body_gets_the_stored_response_marked_replayed(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    let server = db.serve(Faults::none()).await;
    let first = server.post(Some("ik-1"), ORDER).await;
    for _ in 0..3 {
        let again = server.post(Some("ik-1"), ORDER).await;
        assert_eq!((again.status, again.replayed), (201, true), "{again:?}");
        assert_eq!(again.body, first.body, "the stored response, byte for byte");
    }
    // The quoted form of the draft names the same key.
    let quoted = server.post(Some("\"ik-1\""), ORDER).await;
    assert_eq!((quoted.replayed, &quoted.body), (true, &first.body));
    let effects = server.effects().await;
    assert_eq!((effects.keys, effects.effects, effects.replays), (1, 1, 4));
    server.stop().await;
}

async fn a_repeat_with_another_body_gets_422_and_applies_nothing(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    let server = db.serve(Faults::none()).await;
    let first = server.post(Some("ik-1"), ORDER).await;
    let other = server.post(Some("ik-1"), r#"{"order":7,"total_cents":9999}"#).await;
    assert_eq!(other.status, 422, "{other:?}");
    assert!(other.body["error"].as_str().unwrap().contains("another request body"));
    // The key still answers its first body with its first response.
    let again = server.post(Some("ik-1"), ORDER).await;
    assert_eq!((again.replayed, &again.body), (true, &first.body));
    let effects = server.effects().await;
    assert_eq!((effects.effects, effects.mismatches, effects.replays), (1, 1, 1));
    server.stop().await;
}

async fn a_repeat_while_the_first_is_processing_gets_409_with_retry_after(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    let server = std::sync::Arc::new(db.serve(delayed(1_000)).await);
    let first = tokio::spawn({
        let server = std::sync::Arc::clone(&server);
        async move { server.post(Some("ik-1"), ORDER).await }
    });
    wait_for(&server, "the first request holding its key", |e| e.in_progress == 1).await;
    let repeat = server.post(Some("ik-1"), ORDER).await;
    assert_eq!(repeat.status, 409, "{repeat:?}");
    assert_eq!(repeat.retry_after.as_deref(), Some("1"));
    // A repeat with another body is refused as such even while the key is held.
    let other = server.post(Some("ik-1"), "{}").await;
    assert_eq!(other.status, 422, "{other:?}");
    let first = first.await.unwrap();
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    let effects = server.effects().await;
    assert_eq!(
        (
            effects.effects,
            effects.conflicts,
            effects.mismatches,
            effects.in_progress
        ),
        (1, 1, 1, 0)
    );
    std::sync::Arc::into_inner(server).unwrap().stop().await;
}

async fn a_request_without_the_key_gets_400_and_nothing_is_stored(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    let server = db.serve(Faults::none()).await;
    let reply = server.post(None, ORDER).await;
    assert_eq!(reply.status, 400, "{reply:?}");
    assert!(reply.body["error"].as_str().unwrap().contains("Idempotency-Key"));
    let empty = server.post(Some(""), ORDER).await;
    assert_eq!(empty.status, 400, "{empty:?}");
    // Nothing stored; the two requests were processed, one at a time.
    let processed = Effects {
        max_concurrent: 1,
        max_concurrent_by_path: [("/orders".to_owned(), 1)].into(),
        ..Effects::default()
    };
    assert_eq!(server.effects().await, processed);
    server.stop().await;
}

async fn an_injected_failure_answers_503_before_anything_is_done(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    let server = db
        .serve(Faults {
            fail_rate: 1.0,
            ..Faults::none()
        })
        .await;
    let reply = server.post(Some("ik-1"), ORDER).await;
    assert_eq!(reply.status, 503, "{reply:?}");
    let effects = server.effects().await;
    assert_eq!((effects.keys, effects.in_progress, effects.effects), (0, 0, 0));
    assert_eq!(effects.faults.failed, 1);
    server.stop().await;
    // Nothing was claimed: the same key applies normally on a healthy target.
    let healthy = db.serve(Faults::none()).await;
    let reply = healthy.post(Some("ik-1"), ORDER).await;
    assert_eq!((reply.status, reply.replayed), (201, false), "{reply:?}");
    healthy.stop().await;
}

async fn a_dropped_reply_closes_the_connection_after_the_effect_is_committed(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    let server = db
        .serve(Faults {
            drop_reply_rate: 1.0,
            ..Faults::none()
        })
        .await;
    let error = server.try_post(Some("ik-1"), ORDER).await.unwrap_err();
    assert!(
        !error.is_status() && error.status().is_none(),
        "no reply at all: {error:?}"
    );
    let effects = server.effects().await;
    assert_eq!(
        (effects.keys, effects.effects, effects.faults.dropped_replies),
        (1, 1, 1)
    );
    // The sender's retry with the same key gets what the lost reply said.
    let retry = server.post(Some("ik-1"), ORDER).await;
    assert_eq!((retry.status, retry.replayed), (201, true), "{retry:?}");
    assert_eq!(retry.body["idempotency_key"], "ik-1");
    assert_eq!(server.effects().await.by_key, [("ik-1".to_owned(), 1)].into());
    server.stop().await;
}

async fn keys_survive_a_restart_of_the_target_on_the_same_database(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    let before = db.serve(Faults::none()).await;
    let first = before.post(Some("ik-1"), ORDER).await;
    before.post(Some("ik-1"), ORDER).await;
    before.stop().await;
    let after = db.serve(Faults::none()).await;
    let again = after.post(Some("ik-1"), ORDER).await;
    assert_eq!((again.status, again.replayed, &again.body), (201, true, &first.body));
    let other = after.post(Some("ik-1"), "{}").await;
    assert_eq!(other.status, 422);
    let effects = after.effects().await;
    assert_eq!(effects.by_key, [("ik-1".to_owned(), 1)].into());
    assert_eq!(
        (effects.replays, effects.mismatches),
        (2, 1),
        "the counters are stored too"
    );
    after.stop().await;
}

async fn concurrent_requests_with_the_same_key_apply_it_once_across_two_targets(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    // Two receivers on one database, as two replicas of a service would be.
    let servers = [db.serve(delayed(300)).await, db.serve(delayed(300)).await];
    let servers = std::sync::Arc::new(servers);
    let mut requests = Vec::new();
    for n in 0..16 {
        let servers = std::sync::Arc::clone(&servers);
        requests.push(tokio::spawn(async move {
            servers[n % 2].post(Some("ik-race"), ORDER).await
        }));
    }
    let mut replies = Vec::new();
    for r in requests {
        replies.push(r.await.unwrap());
    }
    let applied: Vec<&Reply> = replies.iter().filter(|r| r.status == 201 && !r.replayed).collect();
    assert_eq!(applied.len(), 1, "exactly one request applied the key: {replies:?}");
    for reply in &replies {
        assert!(
            reply.status == 409 || (reply.status == 201 && reply.body == applied[0].body),
            "every other request was told to retry, or got the stored response: {reply:?}"
        );
    }
    let effects = servers[0].effects().await;
    assert_eq!((effects.keys, effects.effects), (1, 1));
    assert_eq!(effects.by_key, [("ik-race".to_owned(), 1)].into());
    for server in std::sync::Arc::into_inner(servers).unwrap() {
        server.stop().await;
    }
}

async fn the_fault_draws_follow_the_seed(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    let faults = |seed| Faults {
        fail_rate: 0.5,
        seed,
        ..Faults::none()
    };
    let mut patterns = Vec::new();
    for (run, seed) in [42, 42, 43].into_iter().enumerate() {
        let server = db.serve(faults(seed)).await;
        let mut pattern = Vec::new();
        for n in 0..32 {
            let reply = server.post(Some(&format!("ik-{run}-{n}")), ORDER).await;
            pattern.push(reply.status == 503);
        }
        server.stop().await;
        patterns.push(pattern);
    }
    assert_eq!(patterns[0], patterns[1], "the same seed, the same faults");
    assert_ne!(patterns[0], patterns[2], "another seed, other faults");
    assert!(patterns[0].iter().any(|f| *f) && !patterns[0].iter().all(|f| *f));
}

async fn an_expired_claim_is_taken_over_and_its_late_holder_applies_nothing(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    match &db.url {
        DbUrl::Sqlite(path) => expired_claims(SqliteStore::open(path).unwrap()).await,
        DbUrl::Mysql(url) => expired_claims(MysqlStore::open(url).await.unwrap()).await,
        DbUrl::Postgres(url) => expired_claims(PostgresStore::open(url).await.unwrap()).await,
    }
}

/// At the store: a claim that outlived its hold is taken over by a repeat of the
/// same body (not by another body), and only the new holder's apply writes.
async fn expired_claims(store: impl KeyStore) {
    let response = |id: &str| StoredResponse {
        status: 201,
        body: format!(r#"{{"id":"{id}"}}"#),
    };
    let Begun::Claimed(late) = store.begin("ik-1", "sha-a", 1_000, 100).await.unwrap() else {
        panic!("a new key is claimed");
    };
    assert_eq!(
        store.begin("ik-1", "sha-a", 1_050, 100).await.unwrap(),
        Begun::Processing {
            body_sha256: "sha-a".into()
        },
        "still held"
    );
    assert_eq!(
        store.begin("ik-1", "sha-b", 2_000, 100).await.unwrap(),
        Begun::Processing {
            body_sha256: "sha-a".into()
        },
        "another body never takes a key over"
    );
    let Begun::Claimed(taker) = store.begin("ik-1", "sha-a", 2_000, 100).await.unwrap() else {
        panic!("an expired claim is taken over by the same body");
    };
    assert_ne!(late.token, taker.token);
    assert!(!store
        .apply(&late, "rcpt-late", "/late", &response("late"), 2_010)
        .await
        .unwrap());
    assert!(store
        .apply(&taker, "rcpt-taker", "/orders", &response("taker"), 2_020)
        .await
        .unwrap());
    assert!(
        !store
            .apply(&taker, "rcpt-again", "/again", &response("again"), 2_030)
            .await
            .unwrap(),
        "a claim applies once"
    );
    assert_eq!(
        store.begin("ik-1", "sha-a", 9_000, 100).await.unwrap(),
        Begun::Done {
            body_sha256: "sha-a".into(),
            response: response("taker")
        }
    );
    let effects = store.effects().await.unwrap();
    assert_eq!(effects.by_key, [("ik-1".to_owned(), 1)].into());
    assert_eq!((effects.keys, effects.in_progress), (1, 0));
    assert_eq!(
        effects.order_by_path,
        [("/orders".to_owned(), vec!["ik-1".to_owned()])].into(),
        "only the applying holder's path"
    );
}

/// `order_by_path` from `(path, keys)` pairs.
fn order(paths: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    let keys = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect();
    paths.iter().map(|(path, k)| (path.to_string(), keys(k))).collect()
}

async fn keys_are_listed_per_path_in_the_order_first_applied_across_a_restart(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    let server = db.serve(Faults::none()).await;
    // Keys whose order of application is not their sorted order.
    for (path, key) in [
        ("/orders", "ik-30"),
        ("/orders", "ik-10"),
        ("/refunds", "ik-90"),
        ("/orders", "ik-20"),
    ] {
        let reply = server.post_to(path, Some(key), ORDER).await;
        assert_eq!((reply.status, reply.replayed), (201, false), "{key}: {reply:?}");
    }
    // Repeats apply nothing, so they append nothing: a replay on the same path, one
    // on another path, a 422.
    assert!(server.post_to("/orders", Some("ik-10"), ORDER).await.replayed);
    assert!(server.post_to("/refunds", Some("ik-30"), ORDER).await.replayed);
    assert_eq!(server.post_to("/orders", Some("ik-20"), "{}").await.status, 422);
    // The path is taken without its query.
    let queried = server.post_to("/orders?page=2", Some("ik-05"), ORDER).await;
    assert_eq!(queried.status, 201, "{queried:?}");
    let expected = order(&[
        ("/orders", &["ik-30", "ik-10", "ik-20", "ik-05"]),
        ("/refunds", &["ik-90"]),
    ]);
    assert_eq!(server.effects().await.order_by_path, expected);
    server.stop().await;
    // The order is read from the store; the concurrency is this process's.
    let after = db.serve(Faults::none()).await;
    let effects = after.effects().await;
    assert_eq!(effects.order_by_path, expected, "{effects:?}");
    assert_eq!((effects.max_concurrent, effects.max_concurrent_by_path.len()), (0, 0));
    after.stop().await;
}

/// Runs `statements` on the test's database, outside any target.
async fn execute(db: &Db, statements: &[&str]) {
    match &db.url {
        DbUrl::Sqlite(path) => {
            let conn = rusqlite::Connection::open(path).unwrap();
            for sql in statements {
                conn.execute_batch(sql).unwrap();
            }
        }
        DbUrl::Mysql(url) => {
            use mysql_async::prelude::Queryable;
            let opts = mysql_async::OptsBuilder::default()
                .ip_or_hostname(url.host.clone())
                .tcp_port(url.port)
                .user(url.user.clone())
                .pass(url.expose_password().map(str::to_owned))
                .db_name(Some(url.database.clone()));
            let mut conn = mysql_async::Conn::new(opts).await.unwrap();
            for sql in statements {
                conn.query_drop(*sql).await.unwrap();
            }
            conn.disconnect().await.unwrap();
        }
        DbUrl::Postgres(url) => {
            let (client, connection) = url.config().connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            for sql in statements {
                client.batch_execute(sql).await.unwrap();
            }
        }
    }
}

async fn an_effects_table_from_before_paths_gets_its_path_column(backend: Backend) {
    let Some(db) = Db::new(backend).await else { return };
    let id = match backend {
        Backend::Sqlite => "id INTEGER PRIMARY KEY AUTOINCREMENT",
        Backend::Mysql => "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
        Backend::Postgres => "id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    };
    let legacy = format!(
        "CREATE TABLE leasehold_target_effect ({id}, idempotency_key VARCHAR(255) NOT NULL,
         receipt_id VARCHAR(64) NOT NULL, applied_at_ms BIGINT NOT NULL)"
    );
    execute(
        &db,
        &[
            &legacy,
            "INSERT INTO leasehold_target_effect (idempotency_key, receipt_id, applied_at_ms)
             VALUES ('ik-old', 'rcpt-old', 1)",
        ],
    )
    .await;
    // Twice: the second target finds the column there.
    for _ in 0..2 {
        let server = db.serve(Faults::none()).await;
        server.post(Some("ik-new"), ORDER).await;
        let effects = server.effects().await;
        assert_eq!(effects.by_key, [("ik-new".into(), 1), ("ik-old".into(), 1)].into());
        assert_eq!(
            effects.order_by_path,
            order(&[("/orders", &["ik-new"])]),
            "a row without a path is not listed"
        );
        server.stop().await;
    }
}

/// One test per behaviour and backend: `sqlite::NAME`, `mysql::NAME` and `postgres::NAME`.
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Sqlite).await
                }
            )*
        }
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Mysql).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Postgres).await
                }
            )*
        }
    };
}

on_every_backend!(
    the_first_request_applies_its_effect_and_stores_its_response,
    a_repeat_with_the_same_body_gets_the_stored_response_marked_replayed,
    a_repeat_with_another_body_gets_422_and_applies_nothing,
    a_repeat_while_the_first_is_processing_gets_409_with_retry_after,
    a_request_without_the_key_gets_400_and_nothing_is_stored,
    an_injected_failure_answers_503_before_anything_is_done,
    a_dropped_reply_closes_the_connection_after_the_effect_is_committed,
    keys_survive_a_restart_of_the_target_on_the_same_database,
    concurrent_requests_with_the_same_key_apply_it_once_across_two_targets,
    the_fault_draws_follow_the_seed,
    an_expired_claim_is_taken_over_and_its_late_holder_applies_nothing,
    keys_are_listed_per_path_in_the_order_first_applied_across_a_restart,
    an_effects_table_from_before_paths_gets_its_path_column,
);

/// While N deliveries hold their keys (each in its delay), `max_concurrent` is N, per
/// path too; it stays N after they are answered and while fewer run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_is_the_most_deliveries_in_flight_at_once() {
    let db = Db::new(Backend::Sqlite).await.unwrap();
    // Long enough that every request is claimed while the first still works.
    let server = std::sync::Arc::new(db.serve(delayed(3_000)).await);
    let paths = [
        "/orders",
        "/orders",
        "/orders",
        "/orders",
        "/orders",
        "/refunds?x=1",
        "/refunds",
        "/refunds",
    ];
    let held: Vec<_> = paths
        .into_iter()
        .enumerate()
        .map(|(n, path)| {
            let server = std::sync::Arc::clone(&server);
            tokio::spawn(async move { server.post_to(path, Some(&format!("ik-{n}")), ORDER).await })
        })
        .collect();
    let during = wait_for(&server, "every request holding its key", |e| e.in_progress == 8).await;
    let by_path = [("/orders".to_owned(), 5), ("/refunds".to_owned(), 3)].into();
    assert_eq!((during.max_concurrent, &during.max_concurrent_by_path), (8, &by_path));
    for request in held {
        assert_eq!(request.await.unwrap().status, 201);
    }
    let after = server.effects().await;
    assert_eq!(
        (after.keys, after.max_concurrent, &after.max_concurrent_by_path),
        (8, 8, &by_path)
    );
    // One at a time (refused at once: no key) leaves the maximum where it was.
    for _ in 0..2 {
        assert_eq!(server.post(None, ORDER).await.status, 400);
    }
    let later = server.effects().await;
    assert_eq!((later.max_concurrent, &later.max_concurrent_by_path), (8, &by_path));
    std::sync::Arc::into_inner(server).unwrap().stop().await;
}

/// `order_by_path` lists the first `MAX_ORDERED_KEYS` applications; the rest count
/// in `effects` only.
#[tokio::test]
async fn the_order_lists_the_first_applications_up_to_its_bound() {
    let db = Db::new(Backend::Sqlite).await.unwrap();
    let DbUrl::Sqlite(path) = &db.url else { unreachable!() };
    let store = SqliteStore::open(path).unwrap();
    let total = leasehold::receiver::MAX_ORDERED_KEYS + 1;
    execute(
        &db,
        &[&format!(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {total})
             INSERT INTO leasehold_target_effect (idempotency_key, receipt_id, applied_at_ms, path)
             SELECT printf('ik-%06d', {total} - i), 'rcpt', 1, '/p' FROM n ORDER BY i"
        )],
    )
    .await;
    let effects = store.effects().await.unwrap();
    assert_eq!(effects.effects as usize, total);
    let listed = &effects.order_by_path["/p"];
    assert_eq!(listed.len(), leasehold::receiver::MAX_ORDERED_KEYS);
    assert_eq!(listed[0], format!("ik-{total:06}"), "the first applied first");
    assert_eq!(listed.last().unwrap(), "ik-000002", "the last one applied is left out");
}
