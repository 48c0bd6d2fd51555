//! `leasehold worker --http-allow` end to end: a plan with an `http:v1` step is
//! delivered to a local server on 127.0.0.1:0 when its host is allowed, fails
//! permanently naming the flag when it is not, and a malformed flag exits 2.

use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// What the local server saw: (Idempotency-Key, body) of every call.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Starts a server answering 201 `{"id": "order-<key>"}` on its own thread;
/// answers its port.
fn server() -> (u16, Seen) {
    let seen = Seen::default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let state = Arc::clone(&seen);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let app = Router::new().route(
                "/orders",
                post(move |headers: HeaderMap, body: String| async move {
                    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                    state.lock().unwrap().push((key.clone(), body));
                    (
                        axum::http::StatusCode::CREATED,
                        axum::Json(json!({"id": format!("order-{key}")})),
                    )
                }),
            );
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (port, seen)
}

struct Db {
    dir: tempfile::TempDir,
    url: String,
}

impl Db {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let db = Db { dir, url };
        db.ok(&["migrate"]);
        db
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("--db")
            .arg(&self.url)
            .args(args)
            .env_remove("LEASEHOLD_DB")
            .env_remove("LEASEHOLD_HTTP_ALLOW")
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "leasehold {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Registers a one-step http:v1 plan posting to `url`; answers the plan id.
    fn http_plan(&self, url: &str) -> String {
        let file = self.dir.path().join("push.toml");
        std::fs::write(
            &file,
            format!(
                "name = \"push-order\"\nrecovery = \"resume\"\n\n[[steps]]\ncode = \"post-order\"\nexecutor = \"http:v1\"\n\n\
                 [steps.payload]\nurl = \"{url}\"\nbody = {{ order = 7, total_cents = 1250 }}\nevidence = [\"/id\"]\n"
            ),
        )
        .unwrap();
        let out = self.ok(&["plan", "add", file.to_str().unwrap()]);
        out.split_whitespace().next().unwrap().to_owned()
    }

    fn status(&self, attempt: &str) -> Value {
        serde_json::from_str(&self.ok(&["status", attempt, "--json"])).unwrap()
    }
}

#[test]
fn an_allowed_host_gets_the_step_with_its_key_and_the_receipt_records_its_id() {
    let (port, seen) = server();
    let db = Db::new();
    let plan = db.http_plan(&format!("http://127.0.0.1:{port}/orders"));
    let attempt = db.ok(&["enqueue", &plan]).trim().to_owned();
    db.ok(&["worker", "--until-idle", "--http-allow", &format!("127.0.0.1:{port}")]);
    let status = db.status(&attempt);
    assert_eq!(status["attempt"]["status"], "SUCCEEDED", "{status}");
    let receipt = &status["receipts"][0];
    let key = receipt["idempotency_key"].as_str().unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(
        *seen,
        [(key.to_owned(), r#"{"order":7,"total_cents":1250}"#.to_owned())]
    );
    assert!(
        receipt["target_receipt"]
            .as_str()
            .unwrap()
            .contains(&format!("order-{key}")),
        "{receipt}"
    );
}

#[test]
fn a_worker_whose_allowlist_lacks_the_host_leaves_the_step_waiting_and_never_calls_it() {
    let (port, seen) = server();
    let db = Db::new();
    let plan = db.http_plan(&format!("http://127.0.0.1:{port}/orders"));
    let attempt = db.ok(&["enqueue", &plan]).trim().to_owned();
    // Allowed: another port of the same host only. The worker claims nothing it
    // cannot run, and `--until-idle` ends once nothing it could run is open.
    let out = db.ok(&["worker", "--until-idle", "--http-allow", "127.0.0.1:1"]);
    assert!(out.contains("done: claimed 0,"), "{out}");
    let status = db.status(&attempt);
    assert_eq!(status["attempt"]["status"], "QUEUED", "{status}");
    assert_eq!(
        status["receipts"][0]["target"],
        format!("http://127.0.0.1:{port}"),
        "{status}"
    );
    let text = db.ok(&["status", &attempt]);
    assert!(
        text.contains(&format!(
            "waits for       a worker that may reach http://127.0.0.1:{port} with http:v1"
        )),
        "{text}"
    );
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn a_malformed_allowlist_entry_exits_2_naming_the_flag() {
    let db = Db::new();
    for bad in ["http://example.com", "example.com:http", "a@b"] {
        let out = db.run(&["worker", "--until-idle", "--http-allow", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("error: --http-allow"), "{stderr}");
    }
}
