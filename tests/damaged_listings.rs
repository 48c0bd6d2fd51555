//! Listings survive a damaged row, and readiness checks the schema, against the real
//! server (`leasehold::serve::router`) on a loopback port over each SQL ledger: a
//! SQLite file, and (with `LEASEHOLD_TEST_POSTGRES_URL` / `LEASEHOLD_TEST_MYSQL_URL`)
//! a PostgreSQL and a MariaDB/MySQL scratch database of the test's own.
//!
//! One attempt row among several gets a status the engine does not know (the hostile
//! text `<b>BOGUS</b>`) and one plan row a `steps_json` that is not JSON: the API and
//! the console still answer 200 with every other row intact, the damaged ones marked
//! in their place with their id and reason (escaped in HTML), and the cursor moves
//! past them. Then the `attempt` table is dropped: `readyz` answers 503 naming it,
//! and never the database.

mod cli_support;

use cli_support::mysql_url_of;
use leasehold::bench::plan_spec;
use leasehold::clock::SystemClock;
use leasehold::entropy::OsEntropy;
use leasehold::executor::Executors;
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::Ledger;
use leasehold::serve::App;
use leasehold::tokens::{create_token, Role, TokenStore};
use leasehold_engine::Action;
use reqwest::StatusCode;
use serde_json::Value;
use std::sync::Arc;

/// The status written into the damaged attempt row: markup, to prove it is escaped.
const BOGUS: &str = "<b>BOGUS</b>";

/// A server over a populated ledger: three plans, one attempt each.
struct Served {
    base: String,
    viewer: String,
    /// The attempt ids, in listing order (newest first), read before any damage.
    attempts: Vec<String>,
    /// The plan ids, oldest first.
    plans: Vec<String>,
}

async fn serve<L: Ledger + TokenStore>(ledger: Arc<L>) -> Served {
    ledger.migrate().await.expect("migrate");
    let now = leasehold::clock::Clock::now(&SystemClock);
    let (_, secret) = create_token(ledger.as_ref(), "viewer", Role::Viewer, now)
        .await
        .expect("token");
    let mut plans = Vec::new();
    for i in 0..3 {
        let plan = ledger
            .register_plan(plan_spec(format!("listed-{i}"), 1), &Executors::new().names())
            .await
            .expect("register");
        ledger.enqueue(&plan.id, Action::Execute).await.expect("enqueue");
        plans.push(plan.id.to_string());
    }
    let app = App::new(Arc::clone(&ledger), &Executors::new().names());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let router = leasehold::serve::router(app);
    tokio::spawn(async move { axum::serve(listener, router).await });
    let mut served = Served {
        base,
        viewer: secret.expose().to_owned(),
        attempts: Vec::new(),
        plans,
    };
    let (status, page) = served.get("/api/v1/attempts").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    served.attempts = ids(&page.json()["attempts"]);
    assert_eq!(served.attempts.len(), 3);
    served
}

struct Body(String);

impl std::fmt::Display for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Body {
    fn json(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.0))
    }
}

impl Served {
    async fn get(&self, path: &str) -> (StatusCode, Body) {
        let response = reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", self.viewer))
            .send()
            .await
            .expect("request");
        let status = response.status();
        (status, Body(response.text().await.expect("body")))
    }

    /// The attempt the tests damage: the middle one of the listing.
    fn damaged_attempt(&self) -> &str {
        &self.attempts[1]
    }

    /// The plan the tests damage: the oldest.
    fn damaged_plan(&self) -> &str {
        &self.plans[0]
    }
}

fn ids(attempts: &Value) -> Vec<String> {
    attempts
        .as_array()
        .expect("an array")
        .iter()
        .map(|a| a["attempt"]["id"].as_str().expect("an id").to_owned())
        .collect()
}

/// The API and the console list every sound row and each damaged one in its place.
async fn listings_show_the_damage(s: &Served) {
    let damaged = s.damaged_attempt();
    let (status, body) = s.get("/api/v1/attempts").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let page = body.json();
    assert_eq!(ids(&page["attempts"]), [s.attempts[0].as_str(), s.attempts[2].as_str()]);
    let marked = page["damaged"].as_array().expect("damaged rows");
    assert_eq!(marked.len(), 1, "{page}");
    assert_eq!(marked[0]["id"], damaged, "{page}");
    assert_eq!(marked[0]["position"], 1, "{page}");
    let reason = marked[0]["reason"].as_str().expect("a reason");
    assert!(reason.contains("attempt row: column status"), "{reason}");
    assert!(!reason.contains('\n'), "{reason}");

    // A page at a time: the damaged row has its own page, and the cursor moves past it.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..4 {
        let path = match &cursor {
            Some(c) => format!("/api/v1/attempts?limit=1&cursor={c}"),
            None => "/api/v1/attempts?limit=1".to_owned(),
        };
        let (status, body) = s.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let page = body.json();
        seen.extend(ids(&page["attempts"]));
        for d in page["damaged"].as_array().unwrap() {
            seen.push(format!("damaged {}", d["id"].as_str().unwrap()));
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(
        seen,
        [
            s.attempts[0].clone(),
            format!("damaged {damaged}"),
            s.attempts[2].clone()
        ]
    );

    let (status, body) = s.get("/api/v1/counts").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, html) = s.get("/attempts").await;
    assert_eq!(status, StatusCode::OK, "{html}");
    let html = html.0;
    for id in &s.attempts {
        assert!(html.contains(id.as_str()), "{id} is not on the page: {html}");
    }
    assert!(
        html.contains("<tr class=\"damaged\">") && html.contains("damaged</span>"),
        "{html}"
    );
    assert!(html.contains("attempt row: column status"), "{html}");
    assert!(!html.contains(BOGUS), "the stored markup reached the page: {html}");
    assert!(html.contains("&lt;b&gt;BOGUS&lt;/b&gt;"), "{html}");
}

/// The plans listings mark the damaged plan in its place and show the others.
async fn plans_show_the_damage(s: &Served) {
    for path in ["/api/v1/plans", "/api/v1/plans?limit=10"] {
        let (status, body) = s.get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        let plans = body.json();
        let plans = plans.as_array().expect("an array");
        assert_eq!(plans.len(), 3, "{path}: {body}");
        let damaged: Vec<&Value> = plans.iter().filter_map(|p| p.get("damaged")).collect();
        assert_eq!(damaged.len(), 1, "{path}: {body}");
        assert_eq!(damaged[0]["id"], s.damaged_plan(), "{path}: {body}");
        let reason = damaged[0]["reason"].as_str().unwrap();
        assert!(reason.contains("plan row: column steps_json: bad JSON"), "{reason}");
        let sound: Vec<&str> = plans.iter().filter_map(|p| p["id"].as_str()).collect();
        assert_eq!(sound.len(), 2, "{path}: {body}");
        assert!(sound.iter().all(|id| s.plans[1..].contains(&id.to_string())), "{body}");
    }
    let (status, html) = s.get("/plans").await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(
        html.0.contains("damaged</span>") && html.0.contains(s.damaged_plan()),
        "{html}"
    );
    assert!(html.0.contains("listed-1") && html.0.contains("listed-2"), "{html}");
}

/// `readyz`: ready on a sound schema; once `drop_table` has dropped the `attempt` table, a
/// 503 problem naming it, and nothing of `secrets`.
async fn readyz_names_the_missing_table<F: std::future::Future<Output = ()>>(
    s: &Served,
    drop_table: F,
    secrets: &[&str],
) {
    let (status, body) = s.get("/api/v1/readyz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body.json()["status"], "ready");
    drop_table.await;
    let response = reqwest::get(format!("{}/api/v1/readyz", s.base)).await.expect("readyz");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    let body = response.text().await.unwrap();
    let problem: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(problem["code"], "not_ready", "{body}");
    assert_eq!(problem["status"], 503, "{body}");
    assert_eq!(
        problem["problems"],
        serde_json::json!(["table attempt is missing"]),
        "{body}"
    );
    for secret in secrets {
        assert!(!body.contains(secret), "{secret}: {body}");
    }
}

fn sqlite_ledger(dir: &tempfile::TempDir) -> (String, Arc<SqliteLedger>) {
    let path = dir.path().join("ledger.db").display().to_string();
    let ledger = SqliteLedger::open(&path, Arc::new(SystemClock), Arc::new(OsEntropy)).expect("open");
    (path, Arc::new(ledger))
}

fn sqlite_damage(path: &str, sql: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(&format!("PRAGMA ignore_check_constraints = ON; {sql}"))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_ledger_lists_around_damaged_rows_and_readyz_names_a_dropped_table() {
    let dir = tempfile::tempdir().unwrap();
    let (path, ledger) = sqlite_ledger(&dir);
    let s = serve(ledger).await;
    sqlite_damage(
        &path,
        &format!(
            "UPDATE attempt SET status = '{BOGUS}' WHERE id = '{}'; UPDATE plan SET steps_json = '{{not json' WHERE id = '{}'",
            s.damaged_attempt(),
            s.damaged_plan()
        ),
    );
    listings_show_the_damage(&s).await;
    plans_show_the_damage(&s).await;
    let drop_table = async { sqlite_damage(&path, "PRAGMA foreign_keys = OFF; DROP TABLE attempt") };
    readyz_names_the_missing_table(&s, drop_table, &[&path]).await;
}

/// A `created_at` that is not a number (SQLite does not enforce column types) has no
/// place in keyset order: the row is still listed, marked, and every other row too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_row_whose_key_does_not_read_is_listed_and_paging_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (path, ledger) = sqlite_ledger(&dir);
    let s = serve(ledger).await;
    let damaged = s.damaged_attempt().to_owned();
    sqlite_damage(
        &path,
        &format!("UPDATE attempt SET created_at = 'yesterday' WHERE id = '{damaged}'"),
    );
    let (status, body) = s.get("/api/v1/attempts").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let page = body.json();
    assert_eq!(page["damaged"][0]["id"], damaged.as_str(), "{page}");
    assert!(
        page["damaged"][0]["reason"].as_str().unwrap().contains("created_at"),
        "{page}"
    );
    let mut sound = ids(&page["attempts"]);
    sound.sort();
    let mut expected: Vec<String> = s.attempts.iter().filter(|a| **a != damaged).cloned().collect();
    expected.sort();
    assert_eq!(sound, expected);
    // A page at a time, every row is listed exactly once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let path = match &cursor {
            Some(c) => format!("/api/v1/attempts?limit=1&cursor={c}"),
            None => "/api/v1/attempts?limit=1".to_owned(),
        };
        let page = s.get(&path).await.1.json();
        seen.extend(ids(&page["attempts"]));
        for d in page["damaged"].as_array().unwrap() {
            seen.push(d["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    seen.sort();
    let mut all = s.attempts.clone();
    all.sort();
    assert_eq!(seen, all);
}

/// A ledger file whose schema is older than the binary's is not ready, and says
/// which version to migrate to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_ledger_behind_the_binarys_schema_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let (path, ledger) = sqlite_ledger(&dir);
    let s = serve(ledger).await;
    let newest = leasehold::ledger::migrate::SQLITE.last().unwrap().version;
    sqlite_damage(
        &path,
        &format!("DELETE FROM schema_migrations WHERE version = {newest}"),
    );
    let response = reqwest::get(format!("{}/api/v1/readyz", s.base)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let problem: Value = serde_json::from_str(&response.text().await.unwrap()).expect("JSON");
    let expected = format!(
        "schema version {} is older than this binary's {newest}: run `leasehold migrate`",
        newest - 1
    );
    assert_eq!(problem["problems"], serde_json::json!([expected]), "{problem}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_ledger_lists_around_damaged_rows_and_readyz_names_a_dropped_table() {
    use leasehold::ledger::postgres::scratch::ScratchDatabase;
    use leasehold::ledger::postgres::{PostgresLedger, PostgresUrl};
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_POSTGRES_URL") else {
        println!("skipped: LEASEHOLD_TEST_POSTGRES_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/test)");
        return;
    };
    let db = ScratchDatabase::create(&PostgresUrl::parse(&admin).unwrap(), "lh_listing_")
        .await
        .expect("scratch database");
    let ledger = Arc::new(PostgresLedger::open(db.url(), Arc::new(OsEntropy)).expect("open"));
    let s = serve(ledger).await;
    let (client, connection) = db
        .url()
        .config()
        .connect(leasehold::outbox::tokio_postgres::NoTls)
        .await
        .expect("a session");
    tokio::spawn(connection);
    // The schema's CHECK constraints would refuse the damage: drop them first.
    client
        .batch_execute(&format!(
            "DO $$ DECLARE c text; BEGIN \
               FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = 'attempt'::regclass AND contype = 'c' LOOP \
                 EXECUTE format('ALTER TABLE attempt DROP CONSTRAINT %I', c); \
               END LOOP; END $$; \
             UPDATE attempt SET status = '{BOGUS}' WHERE id = '{}'; \
             UPDATE plan SET steps_json = '{{not json' WHERE id = '{}'",
            s.damaged_attempt(),
            s.damaged_plan()
        ))
        .await
        .expect("damage");
    listings_show_the_damage(&s).await;
    plans_show_the_damage(&s).await;
    let drop_table = async {
        client.batch_execute("DROP TABLE attempt CASCADE").await.expect("drop");
    };
    readyz_names_the_missing_table(&s, drop_table, &[db.url().database(), "postgres://"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_ledger_lists_around_damaged_rows_and_readyz_names_a_dropped_table() {
    use leasehold::ledger::mysql::scratch::ScratchDatabase;
    use leasehold::ledger::mysql::{MysqlLedger, MysqlUrl};
    use mysql_async::prelude::Queryable;
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
        println!("skipped: LEASEHOLD_TEST_MYSQL_URL is not set (e.g. mysql://root@127.0.0.1:3306/test)");
        return;
    };
    let db = ScratchDatabase::create(&MysqlUrl::parse(&admin).unwrap(), "lh_listing_")
        .await
        .expect("scratch database");
    let name = db.url().database.clone();
    let ledger = Arc::new(MysqlLedger::open(db.url(), Arc::new(OsEntropy)));
    let s = serve(ledger).await;
    let mut conn = mysql_async::Conn::from_url(mysql_url_of(&admin, &name).as_str())
        .await
        .expect("a session");
    // The schema's CHECK constraints would refuse the damage (MariaDB: off for this
    // session; MySQL 8 does not know the variable and needs `ALTER TABLE … NOT ENFORCED`).
    if conn
        .query_drop("SET SESSION check_constraint_checks = 0")
        .await
        .is_err()
    {
        for check in ["attempt_chk_1", "attempt_chk_2", "attempt_chk_3"] {
            let _ = conn
                .query_drop(format!("ALTER TABLE attempt ALTER CHECK {check} NOT ENFORCED"))
                .await;
        }
    }
    conn.query_drop(format!(
        "UPDATE attempt SET status = '{BOGUS}' WHERE id = '{}'",
        s.damaged_attempt()
    ))
    .await
    .expect("damage the attempt");
    conn.query_drop(format!(
        "UPDATE plan SET steps_json = '{{not json' WHERE id = '{}'",
        s.damaged_plan()
    ))
    .await
    .expect("damage the plan");
    listings_show_the_damage(&s).await;
    plans_show_the_damage(&s).await;
    let drop_table = async {
        conn.query_drop("SET FOREIGN_KEY_CHECKS = 0")
            .await
            .expect("no key checks");
        conn.query_drop("DROP TABLE attempt").await.expect("drop");
    };
    readyz_names_the_missing_table(&s, drop_table, &[&name, "mysql://"]).await;
}
