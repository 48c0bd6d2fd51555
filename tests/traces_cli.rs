//! Traces end to end: `leasehold worker --otlp-endpoint` and `leasehold serve
//! --otlp-endpoint` export the spans of an attempt to a local OTLP/HTTP receiver (in
//! this test, on 127.0.0.1:0), in the trace the enqueue named, as one tree — the
//! enqueue's span under the caller's, the delivery under the enqueue's, the claim, the
//! step and the ending write under the delivery — and the `http:v1` request carries
//! the step span's `traceparent`. No attribute holds a secret or a lease token.

use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use leasehold::engine::{AttemptId, TraceContext};
use serde_json::{json, Value};
use std::collections::BTreeMap;
mod cli_support;

use cli_support::Server;
use std::io::{Read, Write};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const SECRET_NAME: &str = "LEASEHOLD_SECRET_TRACE_TOKEN";
const SECRET: &str = "Bearer s3cr3t-never-in-a-span";

/// What the local server received: OTLP export bodies, and the order target's
/// `traceparent` and `authorization` headers.
#[derive(Default)]
struct Seen {
    exports: Vec<Value>,
    calls: Vec<(Option<String>, Option<String>)>,
}

type Shared = Arc<Mutex<Seen>>;

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).map(|v| v.to_str().unwrap().to_owned())
}

/// Starts the receiver (`/v1/traces`) and the order target (`/orders`) on one port.
fn server() -> (u16, Shared) {
    let seen = Shared::default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (traces, orders) = (Arc::clone(&seen), Arc::clone(&seen));
    let app = Router::new()
        .route(
            "/v1/traces",
            post(move |body: String| async move {
                traces
                    .lock()
                    .unwrap()
                    .exports
                    .push(serde_json::from_str(&body).unwrap());
                axum::Json(json!({}))
            }),
        )
        .route(
            "/orders",
            post(move |headers: HeaderMap| async move {
                let call = (header(&headers, "traceparent"), header(&headers, "authorization"));
                orders.lock().unwrap().calls.push(call);
                (axum::http::StatusCode::CREATED, axum::Json(json!({"id": "order-1"})))
            }),
        );
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (port, seen)
}

/// One exported span: its name, ids and attributes (values as text).
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent_id: String,
    attributes: BTreeMap<String, String>,
}

fn spans(seen: &Shared) -> Vec<Span> {
    let seen = seen.lock().unwrap();
    let all = seen
        .exports
        .iter()
        .flat_map(|e| e["resourceSpans"].as_array().cloned().unwrap_or_default());
    let scopes = all.flat_map(|r| r["scopeSpans"].as_array().cloned().unwrap_or_default());
    let spans = scopes.flat_map(|s| s["spans"].as_array().cloned().unwrap_or_default());
    spans
        .map(|s| Span {
            name: s["name"].as_str().unwrap().to_owned(),
            trace_id: s["traceId"].as_str().unwrap().to_owned(),
            span_id: s["spanId"].as_str().unwrap().to_owned(),
            parent_id: s["parentSpanId"].as_str().unwrap_or_default().to_owned(),
            attributes: s["attributes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|kv| (kv["key"].as_str().unwrap().to_owned(), text(&kv["value"])))
                .collect(),
        })
        .collect()
}

/// An OTLP `AnyValue` (`{"stringValue": …}`, `{"intValue": …}`, …) as text.
fn text(value: &Value) -> String {
    match value.as_object().and_then(|o| o.values().next()) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => value.to_string(),
    }
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one {name} span: {spans:#?}");
    found[0]
}

/// The tree of one delivery under `parent`: delivery, then claim, step and end under
/// it; the order target got the step span's traceparent. Answers the step span.
fn assert_delivery_tree(spans: &[Span], trace_id: &str, parent: &str) -> Span {
    assert!(spans.iter().all(|s| s.trace_id == trace_id), "one trace: {spans:#?}");
    let delivery = one(spans, "leasehold.delivery");
    assert_eq!(delivery.parent_id, parent, "{delivery:?}");
    assert_eq!(delivery.attributes["leasehold.outcome"], "delivered");
    for name in ["leasehold.claim", "leasehold.step", "leasehold.end"] {
        assert_eq!(
            one(spans, name).parent_id,
            delivery.span_id,
            "{name} under the delivery"
        );
    }
    let step = one(spans, "leasehold.step");
    assert_eq!(step.attributes["leasehold.executor"], "http:v1");
    assert_eq!(step.attributes["leasehold.outcome"], "done");
    assert_eq!(
        one(spans, "leasehold.end").attributes["leasehold.write"],
        "complete-and-continue"
    );
    step.clone()
}

/// No attribute names or holds a secret, and none looks like a lease token (32
/// lowercase hex digits; ids are not attributes).
fn assert_no_secrets(spans: &[Span]) {
    for s in spans {
        for (key, value) in &s.attributes {
            let lower = key.to_ascii_lowercase();
            assert!(
                !lower.contains("token") && !lower.contains("secret"),
                "{key} on {}",
                s.name
            );
            assert!(!value.contains("s3cr3t"), "{key} = {value} on {}", s.name);
            let token_like = value.len() == 32 && value.bytes().all(|b| b.is_ascii_hexdigit());
            assert!(!token_like, "{key} = {value} on {} looks like a lease token", s.name);
        }
    }
}

struct Db {
    dir: tempfile::TempDir,
    url: String,
    port: u16,
}

impl Db {
    fn new(port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let db = Db { dir, url, port };
        db.ok(&["migrate"]);
        db
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--db").arg(&self.url).args(args);
        for var in [
            "LEASEHOLD_DB",
            "LEASEHOLD_HTTP_ALLOW",
            "LEASEHOLD_HTTP_SECRET",
            "LEASEHOLD_CONFIG",
        ] {
            cmd.env_remove(var);
        }
        cmd.env(SECRET_NAME, SECRET);
        cmd
    }

    fn ok(&self, args: &[&str]) -> String {
        let out: Output = self.cmd(args).output().unwrap();
        assert!(
            out.status.success(),
            "leasehold {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The delivery flags: the order target allowed, the secret bound to it, spans
    /// exported to the receiver.
    fn delivery_flags(&self) -> Vec<String> {
        let host = format!("127.0.0.1:{}", self.port);
        vec![
            "--http-allow".into(),
            host.clone(),
            "--http-secret".into(),
            format!("{SECRET_NAME}={host}"),
            "--otlp-endpoint".into(),
            format!("http://{host}"),
        ]
    }

    /// Registers a one-step http:v1 plan posting to the order target with the secret.
    fn http_plan(&self) -> String {
        let file = self.dir.path().join("push.toml");
        let plan = format!(
            "name = \"push-order\"\nrecovery = \"resume\"\n\n[[steps]]\ncode = \"post-order\"\nexecutor = \"http:v1\"\n\n\
             [steps.payload]\nurl = \"http://127.0.0.1:{}/orders\"\nbody = {{ order = 7 }}\nauth_env = \"{SECRET_NAME}\"\n",
            self.port
        );
        std::fs::write(&file, plan).unwrap();
        let out = self.ok(&["plan", "add", file.to_str().unwrap()]);
        out.split_whitespace().next().unwrap().to_owned()
    }
}

/// `worker --until-idle` with the delivery flags.
fn worker_args(db: &Db) -> Vec<String> {
    let mut args = vec!["worker".to_owned(), "--until-idle".to_owned()];
    args.extend(db.delivery_flags());
    args
}

#[test]
fn a_worker_exports_its_delivery_in_the_trace_the_enqueue_named() {
    let (port, seen) = server();
    let db = Db::new(port);
    let plan = db.http_plan();
    let enqueued: Value = serde_json::from_str(&db.ok(&["enqueue", &plan, "--traceparent", CALLER, "--json"])).unwrap();
    let attempt = AttemptId::new(enqueued["attempt"]["id"].as_str().unwrap());
    let caller = TraceContext::parse(CALLER).unwrap();
    let own = TraceContext::for_attempt(Some(&caller), &attempt);
    assert_eq!(enqueued["attempt"]["trace"], own.as_str(), "stored with the attempt");
    // The worker flushes its spans before it exits.
    db.ok(&worker_args(&db).iter().map(String::as_str).collect::<Vec<_>>());
    let spans = spans(&seen);
    let step = assert_delivery_tree(&spans, caller.trace_id(), own.span_id());
    assert_no_secrets(&spans);
    let calls = std::mem::take(&mut seen.lock().unwrap().calls);
    let expected = format!("00-{}-{}-01", caller.trace_id(), step.span_id);
    assert_eq!(
        calls,
        [(Some(expected), Some(SECRET.to_owned()))],
        "the target got the step's traceparent"
    );
}

#[test]
fn an_invalid_traceparent_flag_exits_2_naming_it() {
    let (port, _) = server();
    let db = Db::new(port);
    let plan = db.http_plan();
    let bad = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
    let out = db.cmd(&["enqueue", &plan, "--traceparent", bad]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--traceparent") && stderr.contains("all zeros"),
        "{stderr}"
    );
    assert_eq!(db.ok(&["history", &plan, "--json"]).trim(), "[]", "nothing enqueued");
}

/// `leasehold serve` on `db`, delivering and exporting.
/// (It delivers nothing: a worker process does, to an end the test can wait for.)
fn serve(db: &Db) -> Server {
    let mut args = ["serve", "--listen", "127.0.0.1:0", "--workers", "0"]
        .map(str::to_owned)
        .to_vec();
    args.extend(db.delivery_flags());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::spawn(db.cmd(&args))
}

/// The admin token and the API's address, from a first run's lines.
fn token_and_base(server: &Server) -> (String, String) {
    let (mut token, mut base) = (None, None);
    while base.is_none() {
        let line = server.line();
        if line.starts_with("no API token existed") {
            token = Some(server.line().trim().to_owned());
        }
        if let Some(rest) = line.strip_prefix("serving the console at ") {
            base = rest.split("/attempts").next().map(str::to_owned);
        }
    }
    (token.expect("an admin token"), base.unwrap())
}

/// `POST path` with a bearer token and extra headers over one HTTP/1.1 connection;
/// answers the status and the body.
fn post_api(base: &str, path: &str, token: &str, extra: &[(&str, &str)]) -> (u16, Value) {
    let addr = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Content-Length: 2\r\nConnection: close\r\n"
    );
    for (name, value) in extra {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n{}");
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body.trim()).unwrap_or(Value::Null))
}

#[test]
fn serve_exports_the_enqueue_under_the_callers_span_and_the_delivery_under_it() {
    let (port, seen) = server();
    let db = Db::new(port);
    let plan = db.http_plan();
    let server = serve(&db);
    let (token, base) = token_and_base(&server);
    let path = format!("/api/v1/plans/{plan}/attempts");
    let (status, record) = post_api(&base, &path, &token, &[("traceparent", CALLER)]);
    assert_eq!(status, 201, "{record}");
    let attempt = record["attempt"]["id"].as_str().unwrap().to_owned();
    // Stopped, serve has flushed the enqueue's span; the worker flushes the delivery's.
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
    db.ok(&worker_args(&db).iter().map(String::as_str).collect::<Vec<_>>());
    let caller = TraceContext::parse(CALLER).unwrap();
    let own = TraceContext::for_attempt(Some(&caller), &AttemptId::new(attempt.as_str()));
    let spans = spans(&seen);
    let enqueue = one(&spans, "leasehold.enqueue");
    assert_eq!(
        (enqueue.span_id.as_str(), enqueue.parent_id.as_str()),
        (own.span_id(), caller.span_id())
    );
    assert_delivery_tree(&spans, caller.trace_id(), own.span_id());
    assert_no_secrets(&spans);
}
