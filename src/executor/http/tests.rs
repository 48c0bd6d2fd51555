//! `http:v1` against a local axum server on 127.0.0.1:0: one test per outcome class,
//! the allowlist, redirects, headers, signing and secrets: bound to hosts, and kept
//! out of what a receiver that echoes the request sends back.

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
        "echo" => (StatusCode::CREATED, axum::Json(reflect(&headers))).into_response(),
        "echo-rejected" => (StatusCode::BAD_REQUEST, echo_line(&headers)).into_response(),
        "echo-busy" => (StatusCode::SERVICE_UNAVAILABLE, echo_line(&headers)).into_response(),
        // The Authorization value straddles the 200-character cut of an excerpt.
        "echo-at-the-cut" => (
            StatusCode::BAD_REQUEST,
            format!("{}{}", "x".repeat(190), header(&headers, "authorization")),
        )
            .into_response(),
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

fn header(headers: &AxumHeaders, name: &str) -> String {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// The Authorization header's credential (after its scheme).
fn credential(authorization: &str) -> &str {
    authorization.split_once(' ').map_or(authorization, |(_, c)| c)
}

/// What a receiver that echoes the request answers: every header (as values and as
/// keys), and the Authorization value and its credential in common encodings.
fn reflect(headers: &AxumHeaders) -> Value {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    let auth = header(headers, "authorization");
    let you_sent: Map<String, Value> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), json!(String::from_utf8_lossy(v.as_bytes()))))
        .collect();
    json!({
        "id": credential(&auth),
        "you_sent": you_sent,
        "by_value": {auth.clone(): "the header value as a key"},
        "encoded": {
            "b64": STANDARD.encode(&auth),
            "b64url": URL_SAFE_NO_PAD.encode(credential(&auth)),
            "pct": percent_encoding::utf8_percent_encode(&auth, percent_encoding::NON_ALPHANUMERIC).to_string(),
        },
        "signature": header(headers, "webhook-signature"),
    })
}

/// An error body that echoes the Authorization value, raw, as JSON text and in
/// base64, first (inside any excerpt).
fn echo_line(headers: &AxumHeaders) -> String {
    use base64::engine::general_purpose::STANDARD;
    let auth = header(headers, "authorization");
    format!(
        "no {} json={} b64={}",
        credential(&auth),
        serde_json::to_string(&auth).unwrap(),
        STANDARD.encode(&auth)
    )
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
            target: None,
            payload,
            retry: None,
        },
        idempotency_key: "ik-42".into(),
        traceparent: None,
    }
}

fn local(port: u16) -> Http {
    Http::new(HttpConfig::allowing([format!("127.0.0.1:{port}")]).unwrap())
}

/// An executor allowed to call 127.0.0.1:`port`, with each secret bound to it.
fn bound(port: u16, secrets: &[&str]) -> Http {
    let bindings = secrets.iter().map(|name| format!("{name}=127.0.0.1:{port}"));
    Http::new(
        HttpConfig::allowing([format!("127.0.0.1:{port}")])
            .unwrap()
            .binding(bindings)
            .unwrap(),
    )
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
async fn the_calls_trace_context_is_sent_as_its_traceparent() {
    let (port, seen) = server().await;
    let trace =
        leasehold_engine::TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    let payload = json!({"url": format!("http://127.0.0.1:{port}/ok")});
    let traced = ExecRequest {
        traceparent: Some(trace),
        ..request(payload.clone())
    };
    assert!(matches!(local(port).execute(traced).await, ExecutorResult::Done { .. }));
    assert!(matches!(call(port, payload).await, ExecutorResult::Done { .. }));
    let seen = seen.lock().unwrap();
    let sent: Vec<Option<&str>> = seen
        .requests
        .iter()
        .map(|(_, h, _)| h.get("traceparent").map(|v| v.to_str().unwrap()))
        .collect();
    assert_eq!(sent, [Some(trace.as_str()), None]);
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
    // A Retry-After beyond the budget ends the call at once, throttled for as long
    // as the receiver asked: the worker gives the command back until then.
    let (port, seen) = server().await;
    let result = call(
        port,
        json!({"url": format!("http://127.0.0.1:{port}/limited"), "budget_ms": 300}),
    )
    .await;
    assert!(
        matches!(result, ExecutorResult::Throttled { ref error, retry_after_ms: 1_000 } if error.contains("answered 429")),
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
}

#[tokio::test]
async fn a_host_without_a_port_allows_only_the_schemes_default_port() {
    let (port, seen) = server().await;
    let bare = Http::new(HttpConfig::allowing(["127.0.0.1"]).unwrap());
    for url in [
        format!("http://127.0.0.1:{port}/ok"),
        "http://127.0.0.1:3306/".to_owned(),
        "http://127.0.0.1:5432/".to_owned(),
        "http://127.0.0.1:443/".to_owned(),
    ] {
        let ExecutorResult::Permanent(message) = bare.execute(request(json!({"url": url}))).await else {
            panic!("{url} is refused");
        };
        assert!(message.contains("not on this worker's egress allowlist"), "{message}");
    }
    assert!(seen.lock().unwrap().requests.is_empty(), "nothing reached the server");
    let entry = AllowedHost::parse("Example.com").unwrap();
    let allows = |url: &str| entry.allows(&reqwest::Url::parse(url).unwrap());
    assert!(allows("http://example.com/x") && allows("https://EXAMPLE.com/x"));
    assert!(allows("http://example.com:80/") && allows("https://example.com:443/"));
    for refused in [
        "http://example.com:443/",
        "https://example.com:80/",
        "http://example.com:3306/",
        "http://other.example.com/",
    ] {
        assert!(!allows(refused), "{refused}");
    }
    let with_port = AllowedHost::parse("example.com:8443").unwrap();
    assert!(with_port.allows(&reqwest::Url::parse("https://example.com:8443/").unwrap()));
    assert!(!with_port.allows(&reqwest::Url::parse("https://example.com/").unwrap()));
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
    let http = bound(
        port,
        &[
            "LEASEHOLD_SECRET_TEST_TOKEN",
            "LEASEHOLD_SECRET_TEST_WHSEC",
            "LEASEHOLD_SECRET_TEST_UNSET_VAR",
        ],
    );
    // Every call of this test goes through the one executor that binds them.
    let call = |_port: u16, payload: Value| http.execute(request(payload));
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
        (json!({"url": url, "headers": {"TraceParent": "x"}}), "headers"),
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

/// The forms of a secret that must never come back, computed here independently of
/// the executor: the text, its JSON escape, percent-encoding, and base64 standard and
/// URL-safe, with and without padding.
fn forbidden_forms(secret: &[u8]) -> Vec<String> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let mut forms: Vec<String> = [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .map(|engine| engine.encode(secret))
        .collect();
    if let Ok(text) = std::str::from_utf8(secret) {
        let json = serde_json::to_string(text).unwrap();
        forms.extend([
            text.to_owned(),
            json[1..json.len() - 1].to_owned(),
            percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string(),
        ]);
    }
    forms
}

/// Fails naming the form if `text` holds any of `forms`.
fn assert_none_of(forms: &[String], text: &str, what: &str) {
    for form in forms {
        assert!(
            !text.contains(form.as_str()),
            "{what} holds the secret form {form:?}: {text}"
        );
    }
}

const ECHO_TOKEN: &str = "LEASEHOLD_SECRET_ECHO_TOKEN";
const ECHO_WHSEC: &str = "LEASEHOLD_SECRET_ECHO_WHSEC";
/// An Authorization value with characters that every encoding escapes differently.
const ECHO_AUTH: &str = "Bearer ech0-t0ken\"with\\odd/chars+x?=~";
const ECHO_KEY: &[u8] = b"echo-signing-key-of-32-bytes!!!!";

/// Sets the echo secrets (only the tests using them read them) and answers every
/// form of them that must not come back.
fn echo_secrets() -> Vec<String> {
    use base64::engine::general_purpose::STANDARD;
    let whsec = format!("whsec_{}", STANDARD.encode(ECHO_KEY));
    std::env::set_var(ECHO_TOKEN, ECHO_AUTH);
    std::env::set_var(ECHO_WHSEC, &whsec);
    [
        ECHO_AUTH.as_bytes(),
        credential(ECHO_AUTH).as_bytes(),
        whsec.as_bytes(),
        ECHO_KEY,
    ]
    .into_iter()
    .flat_map(forbidden_forms)
    .collect()
}

fn echo_payload(port: u16, path: &str) -> Value {
    json!({
        "url": format!("http://127.0.0.1:{port}/{path}"),
        "auth_env": ECHO_TOKEN,
        "secret_env": ECHO_WHSEC,
        "evidence": ["", "/you_sent", "/id", "/by_value", "/encoded"],
        "budget_ms": 300,
    })
}

#[tokio::test]
async fn a_receiver_that_echoes_the_request_gets_no_secret_into_evidence_or_the_receipt() {
    let forbidden = echo_secrets();
    let (port, seen) = server().await;
    let http = bound(port, &[ECHO_TOKEN, ECHO_WHSEC]);
    let result = http.execute(request(echo_payload(port, "echo"))).await;
    let ExecutorResult::Done {
        evidence,
        target_receipt,
    } = result
    else {
        panic!("the echo succeeds: {result:?}");
    };
    assert_eq!(
        seen.lock().unwrap().requests[0].1["authorization"].as_bytes(),
        ECHO_AUTH.as_bytes(),
        "the secret was sent"
    );
    let stored = format!("{} {}", canonical_json(&evidence), canonical_json(&target_receipt));
    assert_none_of(&forbidden, &stored, "the evidence or receipt");
    let marker = format!("[redacted {ECHO_TOKEN}]");
    assert_eq!(evidence["fields"]["/you_sent"]["authorization"], marker.as_str());
    assert_eq!(evidence["fields"]["/id"], marker.as_str(), "the credential alone");
    assert_eq!(target_receipt["id"], marker.as_str());
    assert_eq!(
        evidence["fields"]["/by_value"][&marker], "the header value as a key",
        "object keys are redacted too"
    );
    for encoding in ["b64", "b64url", "pct"] {
        assert_eq!(evidence["fields"]["/encoded"][encoding], marker.as_str(), "{encoding}");
    }
    assert!(
        evidence["fields"]["/you_sent"]["webhook-signature"]
            .as_str()
            .is_some_and(|s| s.starts_with("v1,")),
        "the signature is not a secret and is kept: {evidence}"
    );
}

#[tokio::test]
async fn a_receiver_that_echoes_the_request_in_an_error_gets_no_secret_into_the_message() {
    let forbidden = echo_secrets();
    let (port, _) = server().await;
    let http = bound(port, &[ECHO_TOKEN, ECHO_WHSEC]);
    let marker = format!("[redacted {ECHO_TOKEN}]");
    for (path, permanent) in [("echo-rejected", true), ("echo-busy", false)] {
        let message = match http.execute(request(echo_payload(port, path))).await {
            ExecutorResult::Permanent(m) if permanent => m,
            ExecutorResult::Transient(m) if !permanent => m,
            other => panic!("{path}: {other:?}"),
        };
        assert_none_of(&forbidden, &message, path);
        assert!(
            message.contains(&marker),
            "{path}: the echo is in the excerpt, redacted: {message}"
        );
    }
    // A secret that straddles the excerpt's cut leaves no prefix behind.
    let ExecutorResult::Permanent(message) = http.execute(request(echo_payload(port, "echo-at-the-cut"))).await else {
        panic!("a 400 is permanent");
    };
    assert!(message.contains("xxxx[redacted"), "{message}");
    assert!(!message.contains("ech0"), "{message}");
}

#[tokio::test]
async fn a_secret_bound_to_one_host_is_never_sent_to_another_allowed_host() {
    let (port_a, seen_a) = server().await;
    let (port_b, seen_b) = server().await;
    std::env::set_var("LEASEHOLD_SECRET_BOUND_TOKEN", "Bearer bound-to-host-a");
    std::env::set_var("LEASEHOLD_SECRET_UNBOUND_TOKEN", "Bearer bound-to-no-host");
    let config = HttpConfig::allowing([format!("127.0.0.1:{port_a}"), format!("127.0.0.1:{port_b}")])
        .unwrap()
        .binding([
            format!("LEASEHOLD_SECRET_BOUND_TOKEN=127.0.0.1:{port_a}"),
            // Without a port: port 80 only.
            "LEASEHOLD_SECRET_BOUND_TOKEN=127.0.0.1".to_owned(),
        ])
        .unwrap();
    let http = Http::new(config);
    let to_b = |field: &str, name: &str| request(json!({"url": format!("http://127.0.0.1:{port_b}/ok"), field: name}));
    for field in ["auth_env", "secret_env"] {
        let ExecutorResult::Permanent(message) = http.execute(to_b(field, "LEASEHOLD_SECRET_BOUND_TOKEN")).await else {
            panic!("refused");
        };
        assert!(
            message.contains(&format!(
                "payload field {field}: secret LEASEHOLD_SECRET_BOUND_TOKEN may not be sent to 127.0.0.1:{port_b} \
                 (bound to: 127.0.0.1:{port_a}, 127.0.0.1; bind it with --http-secret \
                 LEASEHOLD_SECRET_BOUND_TOKEN=127.0.0.1:{port_b})"
            )),
            "{message}"
        );
        let ExecutorResult::Permanent(message) = http.execute(to_b(field, "LEASEHOLD_SECRET_UNBOUND_TOKEN")).await
        else {
            panic!("refused");
        };
        assert!(
            message.contains("secret LEASEHOLD_SECRET_UNBOUND_TOKEN may not be sent to")
                && message.contains("(bound to: no host;"),
            "{message}"
        );
    }
    assert!(seen_b.lock().unwrap().requests.is_empty(), "host B saw no request");
    let to_a = request(json!({
        "url": format!("http://127.0.0.1:{port_a}/ok"),
        "auth_env": "LEASEHOLD_SECRET_BOUND_TOKEN",
    }));
    let result = http.execute(to_a).await;
    assert!(matches!(result, ExecutorResult::Done { .. }), "{result:?}");
    assert_eq!(
        seen_a.lock().unwrap().requests[0].1["authorization"],
        "Bearer bound-to-host-a"
    );
}

#[tokio::test]
async fn secrets_too_short_to_redact_are_refused_naming_the_variable() {
    use base64::engine::general_purpose::STANDARD;
    let (port, seen) = server().await;
    let cases = [
        (
            "LEASEHOLD_SECRET_SHORT_RAW",
            "abc1234".to_owned(),
            "is shorter than 8 bytes",
        ),
        (
            "LEASEHOLD_SECRET_SHORT_BEARER",
            "Bearer abc".to_owned(),
            "the credential after its first space",
        ),
        (
            "LEASEHOLD_SECRET_SHORT_WHSEC",
            format!("whsec_{}", STANDARD.encode("k3y")),
            "its whsec_ key is shorter than 8 bytes",
        ),
    ];
    for (name, value, why) in &cases {
        std::env::set_var(name, value);
        let http = bound(port, &[*name]);
        let checked = http.check_secrets().unwrap_err();
        assert!(
            checked.starts_with("--http-secret: ") && checked.contains(name) && checked.contains(why),
            "{checked}"
        );
        assert!(!checked.contains(value.as_str()), "{checked}");
        let payload = json!({"url": format!("http://127.0.0.1:{port}/ok"), "auth_env": name});
        let ExecutorResult::Permanent(message) = http.execute(request(payload)).await else {
            panic!("{name} is refused");
        };
        assert!(
            message.starts_with("step push: payload field auth_env: environment variable ")
                && message.contains(name)
                && message.contains(why),
            "{message}"
        );
    }
    assert!(seen.lock().unwrap().requests.is_empty(), "nothing was sent");
}

#[test]
fn secret_bindings_parse_or_name_the_flag() {
    let binding = SecretBinding::parse("LEASEHOLD_SECRET_CRM=CRM.example.com:8443").unwrap();
    assert_eq!(
        (binding.name(), binding.to_string().as_str()),
        ("LEASEHOLD_SECRET_CRM", "LEASEHOLD_SECRET_CRM=crm.example.com:8443")
    );
    for bad in [
        "LEASEHOLD_SECRET_CRM",
        "LEASEHOLD_SECRET_CRM=",
        "CRM=crm.example.com",
        "LEASEHOLD_SECRET_crm=crm.example.com",
        "LEASEHOLD_SECRET_CRM=https://crm.example.com",
        "LEASEHOLD_SECRET_CRM=crm.example.com:http",
    ] {
        let e = SecretBinding::parse(bad).unwrap_err();
        assert!(e.starts_with(&format!("--http-secret {bad:?}: ")), "{e}");
    }
}

#[test]
fn redaction_replaces_every_form_in_strings_and_keys_and_keeps_other_text() {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    let name = "LEASEHOLD_SECRET_REDACTION_UNIT";
    let value = "Basic dXNlcjpwYXNzd29yZC0xMjM0";
    std::env::set_var(name, value);
    let vault = Vault::load(&[SecretBinding::parse(&format!("{name}=example.com")).unwrap()]);
    let redactor = vault.redactor();
    let marker = format!("[redacted {name}]");
    let decoded = "user:password-1234";
    for form in [
        value.to_owned(),
        "dXNlcjpwYXNzd29yZC0xMjM0".to_owned(),
        decoded.to_owned(),
        "password-1234".to_owned(),
        STANDARD.encode(value),
        URL_SAFE_NO_PAD.encode(value),
        hex::encode(value),
        "Basic%20dXNlcjpwYXNzd29yZC0xMjM0".to_owned(),
        "Basic+dXNlcjpwYXNzd29yZC0xMjM0".to_owned(),
        "user%3apassword-1234".to_owned(),
    ] {
        assert_eq!(redactor.text(&format!("<{form}>")), format!("<{marker}>"), "{form}");
    }
    assert_eq!(redactor.text("nothing secret here"), "nothing secret here");
    let redacted = redactor.value(json!({value: [decoded, 7, {"k": "password-1234!"}]}));
    assert_eq!(
        redacted,
        json!({marker.clone(): [marker.clone(), 7, {"k": format!("{marker}!")}]})
    );
}
