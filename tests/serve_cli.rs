//! `leasehold token` and `leasehold serve` as a person runs them: tokens printed
//! once and stored only as digests, a first run that prints an admin token and a
//! one-time login link, JSON logs without secrets, and a drain on SIGTERM.

mod cli_support;

use cli_support::Server;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

fn leasehold(db: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("LEASEHOLD_DB", db)
        .env_remove("LEASEHOLD_HTTP_ALLOW")
        .output()
        .expect("run leasehold")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn tokens_are_shown_once_listed_without_secrets_and_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("l.db").display());
    assert!(leasehold(&db, &["migrate"]).status.success());
    let added = leasehold(&db, &["token", "add", "ci", "--role", "operator", "--json"]);
    assert!(added.status.success(), "{}", text(&added.stderr));
    let json: serde_json::Value = serde_json::from_slice(&added.stdout).unwrap();
    let token = json["token"].as_str().unwrap().to_owned();
    assert!(
        token.starts_with("lh_") && json["role"] == "operator" && json["name"] == "ci",
        "{json}"
    );
    let plain = leasehold(&db, &["token", "add", "dash", "--role", "viewer"]);
    assert!(plain.status.success());
    assert!(text(&plain.stdout).trim().starts_with("lh_"));
    assert!(text(&plain.stderr).contains("shown only now"));
    let list = leasehold(&db, &["token", "list"]);
    let listed = text(&list.stdout);
    assert!(
        listed.contains("ci") && listed.contains("operator") && listed.contains("active"),
        "{listed}"
    );
    assert!(!listed.contains(&token) && !listed.contains(&leasehold::tokens::token_hash(&token)));
    let again = leasehold(&db, &["token", "add", "ci", "--role", "admin"]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains("already used"));
    let bad = leasehold(&db, &["token", "add", "no spaces", "--role", "admin"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(leasehold(&db, &["token", "revoke", "ci"]).status.success());
    assert!(text(&leasehold(&db, &["token", "list"]).stdout).contains("revoked"));
    let missing = leasehold(&db, &["token", "revoke", "nobody"]);
    assert_eq!(missing.status.code(), Some(2));
}

/// `leasehold serve ARGS` on the ledger `db`.
fn serve(db: &str, args: &[&str]) -> Server {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve").args(args).env("LEASEHOLD_DB", db);
    Server::spawn(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_run_prints_an_admin_token_and_a_login_link_that_work() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("first.db").display());
    let server = serve(
        &db,
        &["--listen", "127.0.0.1:0", "--workers", "1", "--log-format", "json"],
    );
    let lines = server.until("serving the console at");
    let token = lines
        .iter()
        .map(|l| l.trim())
        .find(|l| l.starts_with("lh_"))
        .expect("the admin token")
        .to_owned();
    let link = lines
        .iter()
        .map(|l| l.trim())
        .find(|l| l.contains("/login?code="))
        .expect("the login link")
        .to_owned();
    let base = link.split("/login").next().unwrap().to_owned();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = client.get(&link).send().await.unwrap();
    assert_eq!(login.status(), 303);
    assert!(login.headers().get("set-cookie").is_some());
    // The token works for the API: register a plan and enqueue an attempt, which the
    // in-process worker delivers.
    let plan =
        serde_json::json!({"name": "served", "recovery": "resume", "steps": [{"code": "a", "executor": "dry-run:v1"}]});
    let made = client
        .post(format!("{base}/api/v1/plans"))
        .bearer_auth(&token)
        .body(plan.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), 201);
    let attempt = client
        .post(format!("{base}/api/v1/plans/served/attempts"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let attempt: serde_json::Value = serde_json::from_str(&attempt).unwrap_or_else(|e| panic!("{e}: {attempt}"));
    let id = attempt["attempt"]["id"].as_str().expect("an attempt id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let record = client
            .get(format!("{base}/api/v1/attempts/{id}"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let record: serde_json::Value = serde_json::from_str(&record).unwrap_or_default();
        if record["attempt"]["status"] == "SUCCEEDED" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the in-process worker never delivered: {record}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{status}: {stderr}");
    // JSON logs: one object per line, a `finished` event for the delivery, an
    // operator action by the token's name, and never the token.
    let events: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "finished" && e["attempt"] == id.as_str() && e["outcome"] == "delivered"),
        "{stderr}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "operator_action" && e["token"] == "admin"),
        "{stderr}"
    );
    assert!(events.iter().any(|e| e["event"] == "stopping"), "{stderr}");
    assert!(!stderr.contains(&token) && !stderr.contains("code="), "{stderr}");
}

#[test]
fn a_second_run_creates_no_token_and_a_taken_port_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("second.db").display());
    assert!(leasehold(&db, &["migrate"]).status.success());
    assert!(leasehold(&db, &["token", "add", "ops", "--role", "admin"])
        .status
        .success());
    let server = serve(&db, &["--listen", "127.0.0.1:0", "--workers", "0"]);
    let lines = server.until("serving the console at");
    assert!(
        !lines.iter().any(|l| l.contains("lh_") || l.contains("/login?code=")),
        "{lines:?}"
    );
    assert!(lines.iter().any(|l| l.contains("0 in-process workers")), "{lines:?}");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{status}: {stderr}");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(BIN)
        .args(["serve", "--listen", &addr])
        .env("LEASEHOLD_DB", &db)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains(&format!("--listen {addr}: cannot listen")),
        "{}",
        text(&out.stderr)
    );
}
