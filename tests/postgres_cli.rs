//! The `leasehold` binary on a PostgreSQL ledger: the demo delivers and its gate
//! passes on a fresh database, and an unmigrated database is refused by every
//! command that reads or writes it. Needs `LEASEHOLD_TEST_POSTGRES_URL` (e.g.
//! `postgres://postgres@127.0.0.1:5432/test`); without it each test says it is
//! skipped and passes. Each test runs in a scratch database of its own.

use leasehold::ledger::postgres::scratch::ScratchDatabase;
use leasehold::ledger::postgres::PostgresUrl;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

fn leasehold(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--db")
        .arg(url)
        .args(args)
        .env_remove("LEASEHOLD_DB")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A scratch database on the test server, and its CLI URL (the test server's
/// credentials have no password, so the printable URL is the URL).
fn scratch(prefix: &str) -> Option<(ScratchDatabase, String)> {
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_POSTGRES_URL") else {
        println!("skipped: LEASEHOLD_TEST_POSTGRES_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/test)");
        return None;
    };
    let admin = PostgresUrl::parse(&admin).expect("LEASEHOLD_TEST_POSTGRES_URL");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = rt
        .block_on(ScratchDatabase::create(&admin, prefix))
        .expect("create a test database");
    let url = db.url().to_string();
    Some((db, url))
}

#[test]
fn demo_delivers_and_passes_on_a_fresh_postgres_database() {
    let Some((_db, url)) = scratch("lh_demo_") else { return };
    let out = leasehold(&url, &["demo"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));
    assert!(stdout.contains("step 6/6 verify-integrity: succeeded"), "{stdout}");
    assert!(stdout.contains("PASS"), "the demo ends with a passing gate:\n{stdout}");
    let attempts: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("enqueued attempt "))
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect();
    assert_eq!(attempts.len(), 2, "{stdout}");
    for id in &attempts {
        let out = leasehold(&url, &["--json", "status", id]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(status["attempt"]["status"], "SUCCEEDED");
        assert_eq!(status["command"]["status"], "DELIVERED");
        assert_eq!(status["receipts"].as_array().unwrap().len(), 6);
    }
}

#[test]
fn an_unmigrated_postgres_ledger_is_refused_until_migrated() {
    let Some((_db, url)) = scratch("lh_cli_") else { return };
    for args in [
        vec!["plan", "list"],
        vec!["enqueue", "p"],
        vec!["worker", "--until-idle"],
    ] {
        let out = leasehold(&url, &args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("holds no leasehold schema: run `leasehold migrate`"),
            "{args:?}: {stderr}"
        );
    }
    let out = leasehold(&url, &["migrate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shipped: Vec<String> = leasehold::ledger::migrate::versions(leasehold::ledger::postgres::schema::MIGRATIONS)
        .iter()
        .map(u32::to_string)
        .collect();
    assert_eq!(
        text(&out.stdout).trim(),
        format!("applied migrations: {}", shipped.join(", "))
    );
    let out = leasehold(&url, &["migrate"]);
    assert_eq!(text(&out.stdout).trim(), "schema is up to date");
    let out = leasehold(&url, &["--json", "plan", "list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "[]");
}

#[test]
fn bench_on_postgres_delivers_exactly_once_beside_the_raw_postgres_baseline() {
    let Some((_db, url)) = scratch("lh_bench_") else { return };
    let out = leasehold(&url, &["migrate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = leasehold(
        &url,
        &[
            "bench",
            "--attempts",
            "30",
            "--workers",
            "3",
            "--batch",
            "2",
            "--baseline",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), text(&out.stdout));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verified"]["exactly_once"], 30);
    assert_eq!(report["verified"]["problem_count"], 0);
    assert_eq!(report["transactions_per_attempt"], 2.0);
    let baseline = &report["baseline"];
    assert_eq!(baseline["backend"], "postgres");
    for run in [&baseline["before"], &baseline["after"]] {
        assert_eq!(run["kind"], "claim-then-complete");
        assert_eq!(run["workers"], 3);
        assert_eq!(run["jobs"], 30, "every raw job claimed and completed once");
    }
    assert!(baseline["ratio"].as_f64().unwrap() > 0.0);
    // The raw runs drop their tables: only the ledger's own remain.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let left: i64 = rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let row = client
            .query_one("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'lh_raw_%'", &[])
            .await
            .unwrap();
        row.get(0)
    });
    assert_eq!(left, 0, "raw baseline tables left behind");
}

/// Forwards every connection to `127.0.0.1:port` to `upstream`, from a thread of
/// its own, for as long as the test runs.
fn forward(port: u16, upstream: String) {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("the freed port again");
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                continue;
            };
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
}

#[test]
fn a_worker_started_before_its_database_waits_for_it_and_other_commands_do_not() {
    let Some((_db, url)) = scratch("lh_wait_") else { return };
    assert!(leasehold(&url, &["migrate"]).status.success());
    let parsed = PostgresUrl::parse(&url).unwrap();
    // A port where nothing listens yet: the database is "down".
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = format!(
        "postgres://{}@127.0.0.1:{port}/{}?connect_timeout_ms=500",
        parsed.user().unwrap_or("postgres"),
        parsed.database()
    );
    let out = leasehold(&down, &["plan", "list"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("ledger unavailable"),
        "{}",
        text(&out.stderr)
    );

    let mut worker = Command::new(BIN)
        .args(["--db", &down, "worker", "--id", "early", "--until-idle"])
        .env_remove("LEASEHOLD_DB")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(worker.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
    assert!(
        line.contains("ledger unavailable") && line.contains("retrying in 100 ms"),
        "{line}"
    );
    assert!(worker.try_wait().unwrap().is_none(), "the worker gave up: {line}");
    // The database comes up where the worker looks for it.
    forward(port, format!("{}:{}", parsed.host(), parsed.port()));
    let out = worker.wait_with_output().unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("[early] done: claimed 0"), "{stdout}");
}
