//! `http:v1` against a local axum server on 127.0.0.1:0: one test per outcome class,
//! the allowlist, redirects, headers, signing and secrets.

use super::*;
use axum::extract::{Path, State};
use axum::http::{HeaderMap as AxumHeaders, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use leasehold_engine::{AttemptId, CommandId, PlanId};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Seen {
    /// Calls per path.
    calls: BTreeMap<String, u32>,
    /// Headers and body of every call, in order.
    requests: Vec<(String, AxumHeaders, String)>,
}

type Shared = Arc<Mutex<Seen>>;

async fn handle(State(seen): State<Shared>, Path(path): Path<String>, headers: AxumHeaders, body: String) -> Response {
    let n = {
        let mut seen = seen.lock().unwrap();
        seen.requests.push((path.clone(), headers.clone(), body));
        let n = seen.calls.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let ok = || {
        (
            StatusCode::CREATED,
            axum::Json(json!({"id": format!("r-{key}"), "n": 5, "deep": {"x": true}})),
        )
            .into_response()
    };
    match path.as_str() {
        "ok" => ok(),
        // 503 twice, then success.
        "flaky" if n <= 2 => (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response(),
        "flaky" => ok(),
        // Still processing the key once, then success.
        "busy" if n == 1 => (StatusCode::CONFLICT, "in progress").into_response(),
        "busy" => ok(),
        "limited" if n == 1 => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "slow down").into_response(),
        "limited" => ok(),
        "down" => (StatusCode::BAD_GATEWAY, "x".repeat(1_000)).into_response(),
        "conflict" => (StatusCode::UNPROCESSABLE_ENTITY, "key reused with another body").into_response(),
        "missing" => (StatusCode::NOT_FOUND, "no such thing").into_response(),
        "accepted" => (StatusCode::ACCEPTED, "").into_response(),
        "slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            ok()
        }
        "redirect-same" => (StatusCode::TEMPORARY_REDIRECT, [("location", "/ok")]).into_response(),
        other => match other.strip_prefix("redirect-to-") {
            Some(port) => (
                StatusCode::TEMPORARY_REDIRECT,
                [("location", format!("http://localhost:{port}/ok"))],
            )
                .into_response(),
            None => StatusCode::NOT_FOUND.into_response(),
        },
    }
}

/// A server on 127.0.0.1:0; answers its port and what it saw.
async fn server() -> (u16, Shared) {
    let seen = Shared::default();
    let app = Router::new()
        .route("/{*path}", any(handle))
        .with_state(Arc::clone(&seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, seen)
}

fn request(payload: Value) -> ExecRequest {
    ExecRequest {
        plan_id: PlanId::new("plan-1"),
        attempt_id: AttemptId::new("att-1"),
        command_id: CommandId::new("cmd-1"),
        delivery: 2,
        action: Action::Execute,
        ordinal: 1,
        step: Step {
            code: "push".into(),
            executor: NAME.into(),
            payload,
        },
        idempotency_key: "ik-42".into(),
    }
}

fn local(port: u16) -> Http {
    Http::new(HttpConfig::allowing([format!("127.0.0.1:{port}")]).unwrap())
}

async fn call(port: u16, payload: Value) -> ExecutorResult {
    local(port).execute(request(payload)).await
}

#[tokio::test]
async fn success_records_status_fields_and_the_receivers_id_and_sends_the_key() {
    let (port, seen) = server().await;
    let result = call(
        port,
        json!({
            "url": format!("http://127.0.0.1:{port}/ok"),
            "body": {"b": 1, "a": [1, 2]},
            "headers": {"X-Tenant": "acme"},
            "evidence": ["/n", "/deep/x", "/absent"],
        }),
    )
    .await;
    assert_eq!(
        result,
        ExecutorResult::Done {
            evidence: json!({"status": 201, "fields": {"/n": 5, "/deep/x": true, "/absent": null}}),
            target_receipt: json!({"idempotency_key": "ik-42", "id": "r-ik-42"}),
        }
    );
    let seen = seen.lock().unwrap();
    let (_, headers, body) = &seen.requests[0];
    assert_eq!(body, r#"{"a":[1,2],"b":1}"#, "the body is sent as canonical JSON");
    for (name, value) in [
        ("idempotency-key", "ik-42"),
        ("leasehold-attempt", "att-1"),
        ("leasehold-step", "push"),
        ("leasehold-delivery", "2"),
        ("leasehold-action", "execute"),
        ("x-tenant", "acme"),
        ("content-type", "application/json"),
    ] {
        assert_eq!(headers.get(name).map(|v| v.to_str().unwrap()), Some(value), "{name}");
    }
}

#[tokio::test]
async fn an_expect_list_decides_what_success_is() {
    let (port, _) = server().await;
    let url = format!("http://127.0.0.1:{port}/accepted");
    let done = call(port, json!({"url": url, "expect": [202]})).await;
    assert!(
        matches!(done, ExecutorResult::Done { ref evidence, .. } if evidence["status"] == 202),
        "{done:?}"
    );
    let ExecutorResult::Permanent(message) = call(port, json!({"url": url, "expect": [201]})).await else {
        panic!("a status outside expect is permanent");
    };
    assert!(message.contains("answered 202"), "{message}");
}

#[tokio::test]
async fn server_errors_are_retried_with_the_same_key_until_success() {
    let (port, seen) = server().await;
    let result = call(port, json!({"url": format!("http://127.0.0.1:{port}/flaky")})).await;
    assert!(matches!(result, ExecutorResult::Done { .. }), "{result:?}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.calls["flaky"], 3);
    assert!(seen.requests.iter().all(|(_, h, _)| h["idempotency-key"] == "ik-42"));
}

#[tokio::test]
async fn a_409_still_processing_is_retried() {
    let (port, seen) = server().await;
    let result = call(port, json!({"url": format!("http://127.0.0.1:{port}/busy")})).await;
    assert!(matches!(result, ExecutorResult::Done { .. }), "{result:?}");
    assert_eq!(seen.lock().unwrap().calls["busy"], 2);
}

#[tokio::test]
async fn a_429_waits_at_least_retry_after() {
    let (port, _) = server().await;
    let started = Instant::now();
    let result = call(port, json!({"url": format!("http://127.0.0.1:{port}/limited")})).await;
    assert!(matches!(result, ExecutorResult::Done { .. }), "{result:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After: 1 was honoured"
    );
    // A Retry-After beyond the budget ends the call at once, transient.
    let (port, seen) = server().await;
    let result = call(
        port,
        json!({"url": format!("http://127.0.0.1:{port}/limited"), "budget_ms": 300}),
    )
    .await;
    assert!(
        matches!(result, ExecutorResult::Transient(ref m) if m.contains("answered 429")),
        "{result:?}"
    );
    assert_eq!(seen.lock().unwrap().calls["limited"], 1);
}

#[tokio::test]
async fn persistent_5xx_is_transient_within_the_budget_with_a_bounded_excerpt() {
    let (port, seen) = server().await;
    let started = Instant::now();
    let result = call(
        port,
        json!({"url": format!("http://127.0.0.1:{port}/down"), "budget_ms": 600}),
    )
    .await;
    let ExecutorResult::Transient(message) = result else {
        panic!("a 502 that never ends is transient, got {result:?}");
    };
    assert!(
        message.contains("answered 502") && message.contains("600 ms budget"),
        "{message}"
    );
    assert!(message.len() < 400, "the body excerpt is bounded: {message}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the budget bounds the tries"
    );
    assert!(seen.lock().unwrap().calls["down"] >= 2);
}

#[tokio::test]
async fn connection_refused_and_timeouts_are_transient() {
    // A port nobody listens on: bind, read the port, close.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let result = call(
        port,
        json!({"url": format!("http://127.0.0.1:{port}/x"), "budget_ms": 300}),
    )
    .await;
    assert!(
        matches!(result, ExecutorResult::Transient(ref m) if m.contains("cannot connect")),
        "{result:?}"
    );
    let (port, _) = server().await;
    let result = call(
        port,
        json!({"url": format!("http://127.0.0.1:{port}/slow"), "timeout_ms": 100, "budget_ms": 300}),
    )
    .await;
    assert!(
        matches!(result, ExecutorResult::Transient(ref m) if m.contains("timed out")),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_422_and_other_4xx_are_permanent_with_the_status_and_body() {
    let (port, seen) = server().await;
    let ExecutorResult::Permanent(message) =
        call(port, json!({"url": format!("http://127.0.0.1:{port}/conflict")})).await
    else {
        panic!("422 is permanent");
    };
    assert!(
        message.contains("answered 422") && message.contains("key reused with another body"),
        "{message}"
    );
    let ExecutorResult::Permanent(message) =
        call(port, json!({"url": format!("http://127.0.0.1:{port}/missing")})).await
    else {
        panic!("404 is permanent");
    };
    assert!(
        message.starts_with("step push: ") && message.contains("answered 404"),
        "{message}"
    );
    let seen = seen.lock().unwrap();
    assert_eq!((seen.calls["conflict"], seen.calls["missing"]), (1, 1), "never retried");
}

#[tokio::test]
async fn hosts_off_the_allowlist_are_refused_without_a_request() {
    let (port, seen) = server().await;
    let url = format!("http://127.0.0.1:{port}/ok");
    for http in [
        Http::new(HttpConfig::default()),
        Http::new(HttpConfig::allowing(["127.0.0.1:1"]).unwrap()),
        Http::new(HttpConfig::allowing(["localhost"]).unwrap()),
    ] {
        let ExecutorResult::Permanent(message) = http.execute(request(json!({"url": url}))).await else {
            panic!("refused");
        };
        assert!(
            message.contains("not on this worker's egress allowlist")
                && message.contains(&format!("--http-allow 127.0.0.1:{port}")),
            "{message}"
        );
    }
    assert!(seen.lock().unwrap().requests.is_empty(), "nothing reached the server");
    // A host without a port allows every port of that host.
    let any_port = Http::new(HttpConfig::allowing(["127.0.0.1"]).unwrap());
    assert!(matches!(
        any_port.execute(request(json!({"url": url}))).await,
        ExecutorResult::Done { .. }
    ));
}

#[test]
fn allowlist_entries_parse_or_name_the_flag() {
    assert_eq!(
        AllowedHost::parse("Example.COM:8443").unwrap().to_string(),
        "example.com:8443"
    );
    assert_eq!(AllowedHost::parse("[::1]:80").unwrap().to_string(), "[::1]:80");
    for bad in ["", "http://x", "x:port", "a@b", "::1:80", "x:99999"] {
        let e = AllowedHost::parse(bad).unwrap_err();
        assert!(e.starts_with("--http-allow"), "{e}");
    }
}

#[tokio::test]
async fn redirects_stay_on_the_same_host() {
    let (port, seen) = server().await;
    let same = call(port, json!({"url": format!("http://127.0.0.1:{port}/redirect-same")})).await;
    assert!(matches!(same, ExecutorResult::Done { .. }), "{same:?}");
    let away = call(
        port,
        json!({"url": format!("http://127.0.0.1:{port}/redirect-to-{port}")}),
    )
    .await;
    assert!(
        matches!(away, ExecutorResult::Permanent(ref m) if m.contains("redirect to another host refused")),
        "{away:?}"
    );
    assert_eq!(
        seen.lock().unwrap().calls.get("ok"),
        Some(&1),
        "only the same-host redirect was followed"
    );
}

#[tokio::test]
async fn secrets_come_from_named_variables_and_never_show() {
    let (port, seen) = server().await;
    // Variables only this test sets.
    std::env::set_var("LEASEHOLD_SECRET_TEST_TOKEN", "Bearer s3cr3t-token");
    std::env::set_var("LEASEHOLD_SECRET_TEST_WHSEC", "whsec_c2lnbmluZy1rZXk=");
    let body = json!({"order": 7});
    let result = call(
        port,
        json!({
            "url": format!("http://127.0.0.1:{port}/ok"),
            "body": body,
            "auth_env": "LEASEHOLD_SECRET_TEST_TOKEN",
            "secret_env": "LEASEHOLD_SECRET_TEST_WHSEC",
        }),
    )
    .await;
    assert!(!format!("{result:?}").contains("s3cr3t"));
    {
        let seen = seen.lock().unwrap();
        let (_, headers, sent) = &seen.requests[0];
        assert_eq!(headers["authorization"], "Bearer s3cr3t-token");
        assert_eq!(headers["webhook-id"], "ik-42");
        let timestamp: u64 = headers["webhook-timestamp"].to_str().unwrap().parse().unwrap();
        let expected = sign(b"signing-key", "ik-42", timestamp, sent.as_bytes());
        assert_eq!(headers["webhook-signature"].to_str().unwrap(), format!("v1,{expected}"));
    }
    // A failure names the variable, never a value; other variables cannot be read.
    let ExecutorResult::Permanent(message) = call(
        port,
        json!({"url": format!("http://127.0.0.1:{port}/missing"), "auth_env": "LEASEHOLD_SECRET_TEST_TOKEN"}),
    )
    .await
    else {
        panic!("404 is permanent");
    };
    assert!(!message.contains("s3cr3t"), "{message}");
    for name in ["LEASEHOLD_DB", "HOME", "LEASEHOLD_SECRET_lower"] {
        let ExecutorResult::Permanent(message) = call(
            port,
            json!({"url": format!("http://127.0.0.1:{port}/ok"), "auth_env": name}),
        )
        .await
        else {
            panic!("only LEASEHOLD_SECRET_ variables are readable");
        };
        assert!(
            message.contains("payload field auth_env must name a variable LEASEHOLD_SECRET_"),
            "{message}"
        );
    }
    let ExecutorResult::Permanent(message) = call(
        port,
        json!({"url": format!("http://127.0.0.1:{port}/ok"), "auth_env": "LEASEHOLD_SECRET_TEST_UNSET_VAR"}),
    )
    .await
    else {
        panic!("an unset variable is permanent");
    };
    assert!(
        message.contains("LEASEHOLD_SECRET_TEST_UNSET_VAR is not set"),
        "{message}"
    );
}

#[tokio::test]
async fn malformed_payloads_name_the_field() {
    let (port, seen) = server().await;
    let url = format!("http://127.0.0.1:{port}/ok");
    for (payload, field) in [
        (json!({}), "url"),
        (json!({"url": 7}), "url"),
        (json!({"url": "ftp://127.0.0.1/x"}), "url"),
        (json!({"url": format!("http://u:p@127.0.0.1:{port}/")}), "url"),
        (json!({"url": url, "method": "GET"}), "method"),
        (json!({"url": url, "headers": {"Authorization": "x"}}), "headers"),
        (json!({"url": url, "headers": {"Idempotency-Key": "x"}}), "headers"),
        (json!({"url": url, "headers": {"x": 1}}), "headers"),
        (json!({"url": url, "timeout_ms": "fast"}), "timeout_ms"),
        (json!({"url": url, "evidence": ["n"]}), "evidence"),
        (json!({"url": url, "expect": [700]}), "expect"),
        (json!({"url": url, "receipt": 3}), "receipt"),
        (json!({"url": url, "bogus": 1}), "\"bogus\""),
    ] {
        let ExecutorResult::Permanent(message) = call(port, payload.clone()).await else {
            panic!("{payload} is malformed");
        };
        assert!(
            message.starts_with(&format!("step push: payload field {field}")),
            "{payload}: {message}"
        );
    }
    assert!(seen.lock().unwrap().requests.is_empty());
}

#[test]
fn backoff_grows_is_capped_and_jittered_by_key() {
    let b = |tries| backoff("k", tries).as_millis() as u64;
    assert!((50..=100).contains(&b(1)));
    assert!((100..=200).contains(&b(2)));
    assert!((2_500..=5_000).contains(&b(30)));
    assert_eq!(backoff("k", 3), backoff("k", 3), "a function of key and try");
    assert!((1..=40).any(|t| backoff("k", t) != backoff("other", t)));
}

#[tokio::test]
async fn the_configured_cap_bounds_a_payloads_budget() {
    let (port, _) = server().await;
    let mut config = HttpConfig::allowing([format!("127.0.0.1:{port}")]).unwrap();
    config.budget_cap = Duration::from_millis(300);
    let started = Instant::now();
    let result = Http::new(config)
        .execute(request(
            json!({"url": format!("http://127.0.0.1:{port}/down"), "budget_ms": 60_000}),
        ))
        .await;
    assert!(
        matches!(result, ExecutorResult::Transient(ref m) if m.contains("300 ms budget")),
        "{result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the cap, not budget_ms, ended the tries"
    );
}
