//! Console sessions against a real `leasehold serve` on a loopback port: one token
//! logging in without end holds a bounded number of sessions, revoking a token ends
//! its sessions, the attempt page's notices come from a fixed set, and a change made
//! with the session cookie is accepted only as JSON.

#[path = "serve_common.rs"]
mod common;

use common::TestServer;
use leasehold::ledger::Ledger;
use leasehold::serve::auth::SESSIONS_PER_TOKEN;
use leasehold::tokens::TokenStore;
use leasehold_engine::AttemptStatus;
use reqwest::{Client, StatusCode};
use serde_json::Value;
use std::time::Instant;

/// How many logins the flood makes with one token.
const FLOOD_LOGINS: usize = 20_000;
/// How many clients make them at once.
const FLOOD_CLIENTS: usize = 8;

fn client() -> Client {
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// Logs in with `token`; answers the `name=value` of the session cookie.
async fn login(client: &Client, server: &TestServer, token: &str) -> String {
    let answer = client
        .post(format!("{}/login", server.base))
        .form(&[("token", token)])
        .send()
        .await
        .expect("login");
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let set = answer.headers().get("set-cookie").expect("a session cookie");
    set.to_str().unwrap().split(';').next().unwrap().to_owned()
}

/// The status of `GET path` with the session cookie.
async fn get_status(client: &Client, server: &TestServer, cookie: &str, path: &str) -> StatusCode {
    client
        .get(format!("{}{path}", server.base))
        .header("cookie", cookie)
        .send()
        .await
        .expect("get")
        .status()
}

/// The names of the tokens the ledger holds.
async fn token_names(server: &TestServer) -> Vec<String> {
    server
        .ledger
        .list_tokens()
        .await
        .expect("tokens")
        .into_iter()
        .map(|t| t.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_logging_in_without_end_keeps_only_its_newest_sessions() {
    let server = TestServer::start().await;
    let client = client();
    let first = login(&client, &server, &server.viewer).await;
    let started = Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..FLOOD_CLIENTS {
        let (client, base, token) = (client.clone(), server.base.clone(), server.viewer.clone());
        flood.spawn(async move {
            for _ in 0..FLOOD_LOGINS / FLOOD_CLIENTS {
                let answer = client
                    .post(format!("{base}/login"))
                    .form(&[("token", token.as_str())])
                    .send()
                    .await
                    .expect("login");
                assert_eq!(answer.status(), StatusCode::SEE_OTHER);
            }
        });
    }
    while let Some(done) = flood.join_next().await {
        done.expect("a flooding client");
    }
    eprintln!("{FLOOD_LOGINS} logins in {:?}", started.elapsed());
    let newest = login(&client, &server, &server.viewer).await;
    assert_eq!(server.app.sessions().session_count(), SESSIONS_PER_TOKEN);
    assert_eq!(
        get_status(&client, &server, &newest, "/api/v1/plans").await,
        StatusCode::OK
    );
    assert_eq!(
        get_status(&client, &server, &first, "/api/v1/plans").await,
        StatusCode::UNAUTHORIZED,
        "the first session was ended by the logins after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_token_over_the_api_ends_its_sessions_at_once() {
    let server = TestServer::start().await;
    let client = client();
    let sessions = [
        login(&client, &server, &server.operator).await,
        login(&client, &server, &server.operator).await,
    ];
    let admin = login(&client, &server, &server.admin).await;
    assert_eq!(server.app.sessions().session_count(), 3);
    let revoked = client
        .post(format!("{}/api/v1/tokens/operator/revoke", server.base))
        .bearer_auth(&server.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status(), StatusCode::OK);
    assert_eq!(
        server.app.sessions().session_count(),
        1,
        "the operator's sessions ended before any of them was used again"
    );
    for session in &sessions {
        assert_eq!(
            get_status(&client, &server, session, "/api/v1/plans").await,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        get_status(&client, &server, &admin, "/api/v1/plans").await,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_page_shows_only_fixed_notices() {
    let server = TestServer::start().await;
    let plan = server.plan("notices", 1).await;
    let id = server.enqueue(&plan).await.attempt.id;
    let client = client();
    let cookie = login(&client, &server, &server.operator).await;
    let page = |query: String| {
        let (client, cookie) = (client.clone(), cookie.clone());
        let url = format!("{}/attempts/{id}{query}", server.base);
        async move {
            let answer = client.get(url).header("cookie", cookie).send().await.unwrap();
            assert_eq!(answer.status(), StatusCode::OK);
            answer.text().await.unwrap()
        }
    };
    let lure = "%3Cscript%3Ealert(1)%3C%2Fscript%3ESession%20expired%3A%20re-enter%20your%20token%20at%20https%3A%2F%2Fevil.example";
    let body = page(format!("?done={lure}")).await;
    for planted in [
        "<script>",
        "&lt;script",
        "alert(",
        "re-enter",
        "evil",
        "Session expired",
        "class=\"notice\"",
    ] {
        assert!(!body.contains(planted), "{planted:?} on the page");
    }
    // The console's own form answers with a key, and the page shows its text.
    let acted = client
        .post(format!("{}/attempts/{id}/action", server.base))
        .header("cookie", &cookie)
        .form(&[("action", "abort"), ("reason", "not today")])
        .send()
        .await
        .unwrap();
    assert_eq!(acted.status(), StatusCode::SEE_OTHER);
    let location = acted.headers().get("location").unwrap().to_str().unwrap().to_owned();
    assert_eq!(location, format!("/attempts/{id}?done=aborted"));
    let body = page("?done=aborted".to_owned()).await;
    assert!(
        body.contains("<p class=\"notice\" role=\"status\">Aborted.</p>"),
        "{body}"
    );
    assert_eq!(
        server.ledger.attempt(&id).await.unwrap().attempt.status,
        AttemptStatus::Aborted
    );
}

/// A cookie-authenticated `POST /api/v1/tokens` with these extra headers.
async fn make_token_by_cookie(
    server: &TestServer,
    cookie: &str,
    name: &str,
    headers: &[(&str, String)],
) -> (StatusCode, Value) {
    let mut request = client()
        .post(format!("{}/api/v1/tokens", server.base))
        .header("cookie", cookie)
        .body(format!("{{\"name\": \"{name}\", \"role\": \"admin\"}}"));
    for (k, v) in headers {
        request = request.header(*k, v);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status();
    let text = answer.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_with_the_session_cookie_must_be_json() {
    let server = TestServer::start().await;
    let cookie = login(&client(), &server, &server.admin).await;
    let plain = |kind: &str| vec![("content-type", kind.to_owned())];
    for headers in [
        plain("text/plain"),
        plain("text/plain;charset=UTF-8"),
        plain("application/x-www-form-urlencoded"),
        plain("multipart/form-data; boundary=x"),
        Vec::new(),
    ] {
        let (status, problem) = make_token_by_cookie(&server, &cookie, "planted", &headers).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{headers:?}: {problem}");
        assert_eq!(problem["code"], "unsupported_media_type", "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().starts_with("Content-Type:"),
            "{problem}"
        );
    }
    // The handler never ran: no token was made, and no attempt was aborted.
    assert!(!token_names(&server).await.contains(&"planted".to_owned()));
    let plan = server.plan("json-only", 1).await;
    let id = server.enqueue(&plan).await.attempt.id;
    let abort = client()
        .post(format!("{}/api/v1/attempts/{id}/abort", server.base))
        .header("cookie", &cookie)
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(abort.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(
        server.ledger.attempt(&id).await.unwrap().attempt.status,
        AttemptStatus::Queued
    );
    // JSON passes, still under the cross-site checks.
    let json = "application/json".to_owned();
    let evil = [
        ("content-type", json.clone()),
        ("origin", "http://evil.example".to_owned()),
    ];
    let (status, _) = make_token_by_cookie(&server, &cookie, "cross-site", &evil).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let ours = [
        ("content-type", "application/json; charset=utf-8".to_owned()),
        ("origin", server.base.clone()),
        ("sec-fetch-site", "same-origin".to_owned()),
    ];
    let (status, made) = make_token_by_cookie(&server, &cookie, "from-console", &ours).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let names = token_names(&server).await;
    assert!(names.contains(&"from-console".to_owned()), "{names:?}");
    assert!(!names.contains(&"cross-site".to_owned()), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_changes_need_no_content_type() {
    let server = TestServer::start().await;
    let plan = server.plan("bearer", 1).await;
    let id = server.enqueue(&plan).await.attempt.id;
    let abort = client()
        .post(format!("{}/api/v1/attempts/{id}/abort", server.base))
        .bearer_auth(&server.operator)
        .header("cookie", "leasehold_session=unused")
        .send()
        .await
        .unwrap();
    assert_eq!(abort.status(), StatusCode::OK);
    assert_eq!(
        server.ledger.attempt(&id).await.unwrap().attempt.status,
        AttemptStatus::Aborted
    );
}

/// `GET path` with the session cookie: status and page.
async fn get_page(client: &Client, server: &TestServer, cookie: &str, path: &str) -> (StatusCode, String) {
    let answer = client
        .get(format!("{}{path}", server.base))
        .header("cookie", cookie)
        .send()
        .await
        .expect("get");
    (answer.status(), answer.text().await.expect("page"))
}

/// The console's bulk-recovery form POST with the session cookie: status and page.
async fn bulk_act(client: &Client, server: &TestServer, cookie: &str, form: &[(&str, &str)]) -> (StatusCode, String) {
    let answer = client
        .post(format!("{}/recovery/act", server.base))
        .header("cookie", cookie)
        .form(form)
        .send()
        .await
        .expect("post");
    (answer.status(), answer.text().await.expect("page"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_recovery_in_the_console_is_for_operators_and_counts_before_it_acts() {
    let server = TestServer::start().await;
    let first = server.exhausted("first", "target unreachable").await;
    let second = server.exhausted("second", "target unreachable").await;
    let client = client();
    let viewer = login(&client, &server, &server.viewer).await;
    let operator = login(&client, &server, &server.operator).await;
    let retry = [("op", "retry"), ("reason", "exhausted")];

    // A viewer sees no way in, and each step refuses them.
    let (_, attempts) = get_page(&client, &server, &viewer, "/attempts").await;
    assert!(
        !attempts.contains("href=\"/recovery\""),
        "a viewer's navigation has no Recovery"
    );
    for path in ["/recovery", "/recovery/confirm?op=retry&reason=exhausted"] {
        let (status, page) = get_page(&client, &server, &viewer, path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        assert!(
            !page.contains("<form method=\"post\" action=\"/recovery/act\""),
            "{page}"
        );
    }
    let (status, _) = bulk_act(&client, &server, &viewer, &retry).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for record in [&first, &second] {
        let history = server.ledger.history(&record.attempt.plan_id).await.unwrap();
        assert_eq!(history.len(), 1, "a viewer's POST retried nothing");
    }

    // An operator: the confirmation counts (and writes nothing), the POST acts.
    let (_, attempts) = get_page(&client, &server, &operator, "/attempts").await;
    assert!(attempts.contains("href=\"/recovery\""));
    let (status, page) = get_page(
        &client,
        &server,
        &operator,
        "/recovery/confirm?op=retry&reason=exhausted&limit=",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("The filter selects <strong>2</strong>"), "{page}");
    assert!(page.contains("Yes, retry 2 attempts"), "{page}");
    assert!(
        page.contains("<input type=\"hidden\" name=\"limit\" value=\"100\">"),
        "{page}"
    );
    assert_eq!(server.ledger.history(&first.attempt.plan_id).await.unwrap().len(), 1);
    let (status, page) = bulk_act(&client, &server, &operator, &retry).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Retry enqueued for 2 failed attempts"), "{page}");
    for record in [&first, &second] {
        let history = server.ledger.history(&record.attempt.plan_id).await.unwrap();
        assert_eq!(history.len(), 2, "one retry each");
        assert!(
            page.contains(history[1].attempt.id.as_str()),
            "the page links the new attempt"
        );
    }
    // Nothing is left to retry: the confirmation says so and offers no button.
    let (_, page) = get_page(
        &client,
        &server,
        &operator,
        "/recovery/confirm?op=retry&reason=exhausted",
    )
    .await;
    assert!(page.contains("Nothing matches"), "{page}");
    assert!(!page.contains("action=\"/recovery/act\""), "{page}");
    // Bad input is said on the form, naming the field.
    for (query, said) in [
        ("op=retry", "a bulk action needs a filter"),
        ("op=retry&since=soon", "since:"),
        ("op=retry&reason=x&limit=lots", "limit:"),
        ("op=abort&reason=x", "reason:"),
        ("op=delete&plan=first", "op:"),
    ] {
        let (status, page) = get_page(&client, &server, &operator, &format!("/recovery/confirm?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert!(page.contains(said), "{query}: {page}");
    }
}
