//! The `http:v1` executor against the reference receiver: a dropped reply is retried
//! with the same key and the replayed response becomes the step's receipt and
//! evidence; a key still being processed (409) is waited for; a key reused with
//! another body (422) fails permanently; injected 503s past the budget are
//! transient and apply nothing. The receiver runs in this process on 127.0.0.1:0,
//! its keys in a SQLite file.

use leasehold::engine::canonical::canonical_json;
use leasehold::engine::{Action, AttemptId, CommandId, PlanId, Step};
use leasehold::executor::{ExecRequest, Executor, ExecutorResult, Http, HttpConfig};
use leasehold::ledger::DbUrl;
use leasehold::receiver::{Effects, Faults};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A receiver with `faults`, on a fresh SQLite file (kept while the value lives).
struct Receiver {
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Receiver {
    async fn start(faults: Faults) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = DbUrl::Sqlite(dir.path().join("target.db").display().to_string());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            leasehold::receiver::open_and_serve(
                &db,
                faults,
                listener,
                |_| {
                    let _ = ready_tx.send(());
                },
                std::future::pending(),
            )
            .await
        });
        ready.await.expect("the target opened its store");
        Self { addr, _dir: dir }
    }

    fn executor(&self) -> Http {
        Http::new(HttpConfig::allowing([self.addr.to_string()]).unwrap())
    }

    /// A step posting `body` to this receiver, keeping `/id` and `/status`.
    fn request(&self, key: &str, delivery: u32, body: Value, budget_ms: u64) -> ExecRequest {
        ExecRequest {
            plan_id: PlanId::new("pln-1"),
            attempt_id: AttemptId::new("att-1"),
            command_id: CommandId::new("cmd-1"),
            delivery,
            action: Action::Execute,
            ordinal: 1,
            step: Step {
                code: "post-order".into(),
                executor: "http:v1".into(),
                target: None,
                payload: json!({
                    "url": format!("http://{}/orders", self.addr),
                    "body": body,
                    "evidence": ["/id", "/status"],
                    "timeout_ms": 5_000,
                    "budget_ms": budget_ms,
                }),
                retry: None,
            },
            idempotency_key: key.into(),
            traceparent: None,
        }
    }

    /// What the receiver stored for `key`, asked the way a sender would (a repeat).
    async fn stored(&self, key: &str, body: &Value) -> Value {
        let response = reqwest::Client::new()
            .post(format!("http://{}/orders", self.addr))
            .header("idempotency-key", key)
            .body(canonical_json(body))
            .send()
            .await
            .unwrap();
        assert_eq!(response.headers()["idempotent-replayed"], "true");
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
    }

    async fn effects(&self) -> Effects {
        let body = reqwest::get(format!("http://{}/effects", self.addr))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        serde_json::from_slice(&body).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_reply_is_retried_with_the_same_key_and_the_replay_becomes_the_receipt() {
    let receiver = Receiver::start(Faults {
        drop_reply_rate: 1.0,
        ..Faults::none()
    })
    .await;
    let http = receiver.executor();
    let body = json!({"order": 7, "total_cents": 1250});
    let first = http.execute(receiver.request("ik-1", 1, body.clone(), 30_000)).await;
    let effects = receiver.effects().await;
    assert_eq!((effects.effects, effects.faults.dropped_replies), (1, 1), "{effects:?}");
    assert_eq!(effects.replays, 1, "the retry was answered from the store");

    let stored = receiver.stored("ik-1", &body).await;
    assert_eq!(
        first,
        ExecutorResult::Done {
            evidence: json!({"status": 201, "fields": {"/id": stored["id"], "/status": "applied"}}),
            target_receipt: json!({"idempotency_key": "ik-1", "id": stored["id"]}),
        }
    );
    // A redelivery after a takeover (delivery 2) records the very same receipt and
    // evidence, and applies nothing.
    let redelivered = http.execute(receiver.request("ik-1", 2, body, 30_000)).await;
    assert_eq!(redelivered, first);
    assert_eq!(receiver.effects().await.by_key, [("ik-1".to_owned(), 1)].into());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_still_being_processed_is_retried_until_the_first_request_finishes() {
    let receiver = Receiver::start(Faults {
        delay: Duration::from_millis(1_500),
        ..Faults::none()
    })
    .await;
    let body = json!({"order": 8});
    // The first delivery (say, of a worker that was then paused) holds the key.
    let first = tokio::spawn({
        let (url, body) = (format!("http://{}/orders", receiver.addr), canonical_json(&body));
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .header("idempotency-key", "ik-2")
                .body(body)
                .send()
                .await
                .unwrap();
            serde_json::from_slice::<Value>(&response.bytes().await.unwrap()).unwrap()
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.effects().await.in_progress == 0 {
        assert!(Instant::now() < deadline, "the first request never held its key");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let result = receiver
        .executor()
        .execute(receiver.request("ik-2", 2, body, 30_000))
        .await;
    let first = first.await.unwrap();
    let ExecutorResult::Done { target_receipt, .. } = result else {
        panic!("the 409 was retried until the key was done: {result:?}");
    };
    assert_eq!(target_receipt["id"], first["id"]);
    let effects = receiver.effects().await;
    assert!(effects.conflicts >= 1, "{effects:?}");
    assert_eq!(effects.by_key, [("ik-2".to_owned(), 1)].into());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_body_fails_permanently_with_422() {
    let receiver = Receiver::start(Faults::none()).await;
    let http = receiver.executor();
    let first = http
        .execute(receiver.request("ik-3", 1, json!({"order": 9}), 30_000))
        .await;
    assert!(matches!(first, ExecutorResult::Done { .. }), "{first:?}");
    let reused = http
        .execute(receiver.request("ik-3", 1, json!({"order": 10}), 30_000))
        .await;
    let ExecutorResult::Permanent(message) = reused else {
        panic!("422 is permanent: {reused:?}");
    };
    assert!(message.contains("answered 422"), "{message}");
    assert_eq!(receiver.effects().await.effects, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_failures_past_the_budget_are_transient_and_apply_nothing() {
    let receiver = Receiver::start(Faults {
        fail_rate: 1.0,
        ..Faults::none()
    })
    .await;
    let result = receiver
        .executor()
        .execute(receiver.request("ik-4", 1, json!({"order": 11}), 400))
        .await;
    let ExecutorResult::Transient(message) = result else {
        panic!("a 503 is transient: {result:?}");
    };
    assert!(message.contains("answered 503"), "{message}");
    let effects = receiver.effects().await;
    assert!(effects.faults.failed >= 2, "tried more than once: {effects:?}");
    assert_eq!((effects.keys, effects.in_progress, effects.effects), (0, 0, 0));
}
