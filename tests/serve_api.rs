//! `leasehold serve`'s HTTP API against a real server on a loopback port: every
//! route for every role (allowed and refused), problem+json errors, CSRF, keyset
//! pagination, capped counts, sessions, metrics, and a scan of every byte of every
//! route for secrets while a lease is live.

#[path = "serve_common.rs"]
mod common;

use common::{now, wait_until, TestServer};
use leasehold::ledger::listing::{list_from_history, AttemptQuery};
use leasehold::ledger::Ledger;
use leasehold::tokens::{Role, TokenStore};
use leasehold_engine::{AttemptStatus, CommandStatus};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

/// An answer: status, headers as text, body.
struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// Asserts a problem+json answer with this status and code.
    fn problem(&self, status: u16, code: &str) -> Value {
        assert_eq!(self.status.as_u16(), status, "{}", self.body);
        assert_eq!(self.content_type(), "application/problem+json", "{}", self.body);
        let p = self.json();
        assert_eq!(
            (p["status"].as_u64(), p["code"].as_str()),
            (Some(u64::from(status)), Some(code)),
            "{p}"
        );
        assert!(
            p["title"].is_string() && p["detail"].is_string() && p["type"] == "about:blank",
            "{p}"
        );
        p
    }

    /// Every byte of the answer, headers included.
    fn all_bytes(&self) -> String {
        let mut out = format!("{}\n", self.status);
        for (k, v) in &self.headers {
            out.push_str(&format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())));
        }
        out + &self.body
    }
}

async fn call(server: &TestServer, method: Method, path: &str, token: Option<&str>, body: Option<Value>) -> Answer {
    call_with(server, method, path, token, body, &[]).await
}

async fn call_with(
    server: &TestServer,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> Answer {
    let client = Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut request = client.request(method, format!("{}{path}", server.base));
    if let Some(t) = token {
        request = request.header("authorization", format!("Bearer {t}"));
    }
    if let Some(b) = body {
        request = request.header("content-type", "application/json").body(b.to_string());
    }
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.expect("request");
    Answer {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.text().await.expect("body"),
    }
}

/// Every route, with the role it needs (`None`: public).
/// A route to call: method, path, its OpenAPI template, the role it needs
/// (`None`: public) and a body.
type Route = (Method, String, &'static str, Option<Role>, Option<Value>);

fn routes(plan: &str, attempt: &str, left: &str, right: &str) -> Vec<Route> {
    let spec = json!({"name": "registered-by-api", "recovery": "resume", "steps": [{"code": "one", "executor": "dry-run:v1"}]});
    vec![
        (
            Method::GET,
            "/api/v1/plans".into(),
            "/api/v1/plans",
            Some(Role::Viewer),
            None,
        ),
        (
            Method::POST,
            "/api/v1/plans".into(),
            "/api/v1/plans",
            Some(Role::Admin),
            Some(spec),
        ),
        (
            Method::GET,
            format!("/api/v1/plans/{plan}"),
            "/api/v1/plans/{plan}",
            Some(Role::Viewer),
            None,
        ),
        (
            Method::POST,
            format!("/api/v1/plans/{plan}/attempts"),
            "/api/v1/plans/{plan}/attempts",
            Some(Role::Producer),
            Some(json!({})),
        ),
        (
            Method::GET,
            format!("/api/v1/plans/{plan}/attempt-comparison?left={left}&right={right}"),
            "/api/v1/plans/{plan}/attempt-comparison",
            Some(Role::Viewer),
            None,
        ),
        (
            Method::GET,
            format!("/api/v1/plans/{plan}/release-gate"),
            "/api/v1/plans/{plan}/release-gate",
            Some(Role::Viewer),
            None,
        ),
        (
            Method::GET,
            "/api/v1/attempts?limit=2".into(),
            "/api/v1/attempts",
            Some(Role::Viewer),
            None,
        ),
        (
            Method::GET,
            format!("/api/v1/attempts/{attempt}"),
            "/api/v1/attempts/{id}",
            Some(Role::Viewer),
            None,
        ),
        (
            Method::POST,
            format!("/api/v1/attempts/{attempt}/reconcile"),
            "/api/v1/attempts/{id}/reconcile",
            Some(Role::Operator),
            None,
        ),
        (
            Method::POST,
            format!("/api/v1/attempts/{attempt}/retry"),
            "/api/v1/attempts/{id}/retry",
            Some(Role::Operator),
            None,
        ),
        (
            Method::POST,
            format!("/api/v1/attempts/{attempt}/compensate"),
            "/api/v1/attempts/{id}/compensate",
            Some(Role::Operator),
            None,
        ),
        (
            Method::POST,
            format!("/api/v1/attempts/{attempt}/abort"),
            "/api/v1/attempts/{id}/abort",
            Some(Role::Operator),
            Some(json!({"reason": "test"})),
        ),
        (
            Method::POST,
            "/api/v1/attempts:retry".into(),
            "/api/v1/attempts:retry",
            Some(Role::Operator),
            Some(json!({"plan": plan, "dry_run": true})),
        ),
        (
            Method::POST,
            "/api/v1/attempts:abort".into(),
            "/api/v1/attempts:abort",
            Some(Role::Operator),
            Some(json!({"plan": plan, "dry_run": true})),
        ),
        (
            Method::GET,
            "/api/v1/counts".into(),
            "/api/v1/counts",
            Some(Role::Viewer),
            None,
        ),
        (
            Method::GET,
            "/api/v1/workers".into(),
            "/api/v1/workers",
            Some(Role::Viewer),
            None,
        ),
        (
            Method::GET,
            "/api/v1/limits".into(),
            "/api/v1/limits",
            Some(Role::Viewer),
            None,
        ),
        (
            Method::PUT,
            "/api/v1/limits/http%3A%2F%2Fh%3A80".into(),
            "/api/v1/limits/{target}",
            Some(Role::Operator),
            Some(json!({"max_in_flight": 2})),
        ),
        (
            Method::DELETE,
            "/api/v1/limits/http%3A%2F%2Fh%3A80".into(),
            "/api/v1/limits/{target}",
            Some(Role::Operator),
            None,
        ),
        (Method::GET, "/api/v1/healthz".into(), "/api/v1/healthz", None, None),
        (Method::GET, "/api/v1/readyz".into(), "/api/v1/readyz", None, None),
        (
            Method::GET,
            "/api/v1/openapi.json".into(),
            "/api/v1/openapi.json",
            None,
            None,
        ),
        (Method::GET, "/metrics".into(), "/metrics", Some(Role::Viewer), None),
        (
            Method::GET,
            "/api/v1/tokens".into(),
            "/api/v1/tokens",
            Some(Role::Admin),
            None,
        ),
        (
            Method::POST,
            "/api/v1/tokens".into(),
            "/api/v1/tokens",
            Some(Role::Admin),
            Some(json!({"name": "made-by-api", "role": "viewer"})),
        ),
        (
            Method::POST,
            "/api/v1/tokens/made-by-api/revoke".into(),
            "/api/v1/tokens/{name}/revoke",
            Some(Role::Admin),
            None,
        ),
    ]
}

/// A plan with two successful attempts and an open third (RUNNING, live lease).
async fn populated() -> (
    TestServer,
    leasehold_engine::Plan,
    Vec<leasehold_engine::AttemptRecord>,
    leasehold::ledger::Claimed,
) {
    let server = TestServer::start().await;
    let plan = server.plan("payments", 2).await;
    let mut done = Vec::new();
    for _ in 0..2 {
        let record = server.enqueue(&plan).await;
        let claimed = server.claim(60_000).await;
        server
            .ledger
            .complete_and_continue(&claimed.lease, 1, &json!({"n": 1}), &json!({}), 60_000)
            .await
            .unwrap();
        server
            .ledger
            .complete_and_continue(&claimed.lease, 2, &json!({"n": 2}), &json!({}), 60_000)
            .await
            .unwrap();
        done.push(server.ledger.attempt(&record.attempt.id).await.unwrap());
    }
    server.enqueue(&plan).await;
    let live = server.claim(60_000).await;
    (server, plan, done, live)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_is_allowed_to_its_role_and_refused_below_it() {
    let (server, plan, done, live) = populated().await;
    let table = routes(
        plan.id.as_str(),
        live.lease.attempt_id.as_str(),
        done[0].attempt.id.as_str(),
        done[1].attempt.id.as_str(),
    );
    // The table names every route of the OpenAPI document (and /metrics).
    let doc = call(&server, Method::GET, "/api/v1/openapi.json", None, None)
        .await
        .json();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.insert((method.to_uppercase(), path.clone()));
        }
    }
    documented.insert(("GET".into(), "/metrics".into()));
    let tested: BTreeSet<(String, String)> = table
        .iter()
        .map(|(m, _, t, _, _)| (m.to_string(), (*t).to_owned()))
        .collect();
    assert_eq!(tested, documented);

    for (method, path, _, needed, body) in &table {
        // Without a token.
        let answer = call(&server, method.clone(), path, None, body.clone()).await;
        match needed {
            None => assert!(answer.status.is_success(), "{method} {path}: {}", answer.status),
            Some(_) => {
                answer.problem(401, "unauthorized");
            }
        }
        // With a token that is not one.
        if needed.is_some() {
            call(&server, method.clone(), path, Some("lh_not-a-token"), body.clone())
                .await
                .problem(401, "unauthorized");
        }
        for role in Role::ALL {
            let answer = call(&server, method.clone(), path, Some(server.token(*role)), body.clone()).await;
            match needed {
                Some(needed) if !role.allows(*needed) => {
                    let p = answer.problem(403, "forbidden");
                    assert!(p["detail"].as_str().unwrap().contains(needed.as_str()), "{p}");
                }
                _ => assert!(
                    !matches!(answer.status.as_u16(), 401 | 403),
                    "{role} {method} {path}: {} {}",
                    answer.status,
                    answer.body
                ),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_problem_json_with_the_cli_meaning() {
    let (server, plan, _, live) = populated().await;
    let op = Some(server.operator.as_str());
    let admin = Some(server.admin.as_str());
    call(&server, Method::GET, "/api/v1/attempts/att-nope", op, None)
        .await
        .problem(404, "not_found");
    call(&server, Method::GET, "/api/v1/plans/no-such-plan", op, None)
        .await
        .problem(404, "not_found");
    let p = call(&server, Method::GET, "/api/v1/attempts?state=DONE", op, None)
        .await
        .problem(400, "bad_input");
    assert!(p["detail"].as_str().unwrap().starts_with("state:"), "{p}");
    for bad in ["limit=0", "limit=201", "limit=many"] {
        let p = call(&server, Method::GET, &format!("/api/v1/attempts?{bad}"), op, None)
            .await
            .problem(400, "bad_input");
        assert!(p["detail"].as_str().unwrap().starts_with("limit:"), "{p}");
    }
    let p = call(&server, Method::GET, "/api/v1/attempts?cursor=zzz", op, None)
        .await
        .problem(400, "bad_input");
    assert!(p["detail"].as_str().unwrap().starts_with("cursor:"), "{p}");
    // An invalid plan is 422 and writes nothing; a body that is not a plan is 400.
    let before = server.ledger.list_plans().await.unwrap().len();
    let invalid = json!({"name": "empty", "recovery": "resume", "steps": []});
    call(&server, Method::POST, "/api/v1/plans", admin, Some(invalid))
        .await
        .problem(422, "invalid_plan");
    let not_a_plan = json!({"nom": "x"});
    call(&server, Method::POST, "/api/v1/plans", admin, Some(not_a_plan))
        .await
        .problem(400, "bad_input");
    assert_eq!(server.ledger.list_plans().await.unwrap().len(), before);
    // An attempt is open: another enqueue is refused (409), as is a reconcile of a live lease.
    let path = format!("/api/v1/plans/{}/attempts", plan.id);
    call(&server, Method::POST, &path, op, Some(json!({})))
        .await
        .problem(409, "refused");
    call(&server, Method::POST, &path, op, Some(json!({"action": "undo"})))
        .await
        .problem(400, "bad_input");
    let reconcile = format!("/api/v1/attempts/{}/reconcile", live.lease.attempt_id);
    let p = call(&server, Method::POST, &reconcile, op, None)
        .await
        .problem(409, "refused");
    assert!(p["detail"].as_str().unwrap().contains("live lease"), "{p}");
    let retry = format!("/api/v1/attempts/{}/retry", live.lease.attempt_id);
    call(&server, Method::POST, &retry, op, None)
        .await
        .problem(409, "refused");
    call(&server, Method::GET, "/api/v1/nothing-here", op, None)
        .await
        .problem(404, "not_found");
    let basic = call_with(
        &server,
        Method::GET,
        "/api/v1/plans",
        None,
        None,
        &[("authorization", "Basic YTpi")],
    )
    .await;
    basic.problem(401, "unauthorized");
    assert_eq!(basic.headers.get("www-authenticate").unwrap(), "Bearer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_actions_do_what_they_say() {
    let server = TestServer::start().await;
    let op = Some(server.operator.as_str());
    // Reconcile requeues an expired lease.
    let plan = server.plan("expiring", 1).await;
    let record = server.enqueue(&plan).await;
    let claimed = server.claim(50).await;
    let id = record.attempt.id.clone();
    wait_until("the lease to expire", Duration::from_secs(10), || async {
        let r = server.ledger.attempt(&id).await.unwrap();
        r.command.lease_until.is_some_and(|u| u < now())
    })
    .await;
    let answer = call(
        &server,
        Method::POST,
        &format!("/api/v1/attempts/{id}/reconcile"),
        op,
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let body = answer.json();
    assert_eq!(body["outcome"], "requeued");
    assert_eq!(body["record"]["command"]["status"], "PENDING");
    // The old worker is fenced off.
    assert!(server.ledger.heartbeat(&claimed.lease, 1000).await.is_err());
    // Abort, then retry the aborted attempt.
    let answer = call(
        &server,
        Method::POST,
        &format!("/api/v1/attempts/{id}/abort"),
        op,
        Some(json!({"reason": "wrong day"})),
    )
    .await;
    assert_eq!(answer.json()["attempt"]["status"], "ABORTED", "{}", answer.body);
    assert_eq!(answer.json()["attempt"]["error"], "wrong day");
    call(&server, Method::POST, &format!("/api/v1/attempts/{id}/abort"), op, None)
        .await
        .problem(409, "refused");
    call(
        &server,
        Method::POST,
        &format!("/api/v1/attempts/{id}/compensate"),
        op,
        None,
    )
    .await
    .problem(409, "refused");
    let answer = call(&server, Method::POST, &format!("/api/v1/attempts/{id}/retry"), op, None).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    let retry = answer.json();
    assert_eq!(
        (retry["attempt"]["action"].as_str(), retry["attempt"]["number"].as_u64()),
        (Some("retry"), Some(2))
    );
    // Enqueue through the API, by plan name.
    let other = server.plan("by-name", 1).await;
    let answer = call(
        &server,
        Method::POST,
        &format!("/api/v1/plans/{}/attempts", other.name),
        op,
        Some(json!({"action": "execute"})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    assert_eq!(answer.json()["attempt"]["plan_id"], other.id.as_str());
    // Registering a plan answers 201 and the plan.
    let spec = json!({"name": "from-api", "recovery": "replay", "steps": [{"code": "a", "executor": "dry-run:v1"}]});
    let answer = call(&server, Method::POST, "/api/v1/plans", Some(&server.admin), Some(spec)).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    assert_eq!(answer.json()["name"], "from-api");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_changes_are_refused() {
    let server = TestServer::start().await;
    let plan = server.plan("csrf", 1).await;
    let path = format!("/api/v1/plans/{}/attempts", plan.id);
    let admin = Some(server.admin.as_str());
    let host = server.base.trim_start_matches("http://").to_owned();
    for headers in [
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![("origin", "http://evil.example")],
        vec![("origin", "null")],
    ] {
        let answer = call_with(&server, Method::POST, &path, admin, Some(json!({})), &headers).await;
        answer.problem(403, "forbidden");
    }
    // The login form and every console action are guarded alike.
    let answer = call_with(
        &server,
        Method::POST,
        "/login",
        None,
        None,
        &[("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(
        server.ledger.history(&plan.id).await.unwrap().is_empty(),
        "nothing was enqueued"
    );
    // Reads stay open to links from elsewhere; same-origin changes pass.
    let read = call_with(
        &server,
        Method::GET,
        "/api/v1/plans",
        admin,
        None,
        &[("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(read.status, StatusCode::OK);
    let origin = format!("http://{host}");
    let ok = call_with(
        &server,
        Method::POST,
        &path,
        admin,
        Some(json!({})),
        &[("origin", &origin), ("sec-fetch-site", "same-origin")],
    )
    .await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.body);
    // Every answer carries the CSP (no inline script) and no-store.
    let csp = read.headers.get("content-security-policy").unwrap().to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(read.headers.get("x-content-type-options").unwrap(), "nosniff");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_hold_every_attempt_once_newest_first() {
    let server = TestServer::start().await;
    let mut plans = Vec::new();
    for i in 0..7 {
        let plan = server.plan(&format!("page-{i}"), 1).await;
        server.enqueue(&plan).await;
        plans.push(plan);
        // Distinct created_at values, so newest-first is observable.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    server.claim(60_000).await;
    let viewer = Some(server.viewer.as_str());
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/attempts?limit=3&cursor={c}"),
            None => "/api/v1/attempts?limit=3".to_owned(),
        };
        let page = call(&server, Method::GET, &path, viewer, None).await.json();
        pages += 1;
        if pages == 2 {
            // An attempt enqueued meanwhile is newer than the cursor: later pages
            // neither repeat nor skip anything because of it.
            let late = server.plan("late", 1).await;
            server.enqueue(&late).await;
        }
        for a in page["attempts"].as_array().unwrap() {
            seen.push((
                a["attempt"]["created_at"].as_i64().unwrap(),
                a["attempt"]["id"].as_str().unwrap().to_owned(),
            ));
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 7);
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, sorted, "newest first");
    assert_eq!(
        seen.iter().map(|s| &s.1).collect::<BTreeSet<_>>().len(),
        7,
        "no repeats"
    );
    // Filters.
    let running = call(&server, Method::GET, "/api/v1/attempts?state=RUNNING", viewer, None)
        .await
        .json();
    let running = running["attempts"].as_array().unwrap();
    assert_eq!(running.len(), 1);
    assert_eq!(running[0]["command"]["status"], "PROCESSING");
    let one = call(&server, Method::GET, "/api/v1/attempts?plan=page-3", viewer, None)
        .await
        .json();
    assert_eq!(one["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(one["attempts"][0]["attempt"]["plan_id"], plans[3].id.as_str());
}

/// The console's attempts page names the plan of every attempt it shows and offers
/// those names for its plan filter, which takes a typed name or id; it never lists
/// the ledger's other plans (there may be millions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_attempts_page_names_its_plans_and_filters_by_a_typed_name() {
    let server = TestServer::start().await;
    let alpha = server.plan("alpha", 1).await;
    let beta = server.plan("beta", 1).await;
    server.plan("idle-<plan>", 1).await;
    server.enqueue(&alpha).await;
    let beta_attempt = server.enqueue(&beta).await.attempt.id;
    let viewer = Some(server.viewer.as_str());

    let page = call(&server, Method::GET, "/attempts", viewer, None).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    for shown in [
        format!("<a href=\"/plans/{}\">alpha</a>", alpha.id),
        format!("<a href=\"/plans/{}\">beta</a>", beta.id),
        "<option value=\"alpha\"></option><option value=\"beta\"></option></datalist>".to_owned(),
        "<input name=\"plan\" value=\"\"".to_owned(),
    ] {
        assert!(page.body.contains(&shown), "{shown} not in {}", page.body);
    }
    assert!(
        !page.body.contains("idle-"),
        "a plan without attempts on the page is not listed"
    );

    let filtered = call(&server, Method::GET, "/attempts?plan=beta", viewer, None).await;
    assert_eq!(filtered.status, StatusCode::OK, "{}", filtered.body);
    assert!(filtered.body.contains(beta_attempt.as_str()), "{}", filtered.body);
    assert!(
        !filtered.body.contains(&format!("/plans/{}", alpha.id)),
        "{}",
        filtered.body
    );
    assert!(
        filtered.body.contains("<input name=\"plan\" value=\"beta\""),
        "{}",
        filtered.body
    );
    // An unknown plan is a 404, and the typed value never comes back unescaped.
    let unknown = call(&server, Method::GET, "/attempts?plan=%3Cnope%3E", viewer, None).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.body);
    assert!(!unknown.body.contains("<nope>"), "{}", unknown.body);
}

/// The console's plans page shows fifty plans, newest first, and links to the older
/// ones; it never reads the whole list of plans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_plans_page_shows_fifty_plans_a_page() {
    let server = TestServer::start().await;
    let mut plans = Vec::new();
    for i in 0..53 {
        plans.push(server.plan(&format!("many-{i:02}"), 1).await);
    }
    let viewer = Some(server.viewer.as_str());
    let rows = |body: &str| body.matches("<tr><td><a href=\"/plans/").count();

    let first = call(&server, Method::GET, "/plans", viewer, None).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(rows(&first.body), 50);
    assert!(first.body.contains(">many-52</a>") && first.body.contains(">many-03</a>"));
    assert!(!first.body.contains(">many-02</a>"), "{}", first.body);
    let next = format!("/plans?before={}", plans[3].id);
    assert!(
        first.body.contains(&format!("href=\"{next}\" rel=\"next\"")),
        "{}",
        first.body
    );

    let second = call(&server, Method::GET, &next, viewer, None).await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.body);
    assert_eq!(rows(&second.body), 3);
    assert!(second.body.contains(">many-00</a>") && !second.body.contains(">many-03</a>"));
    assert!(!second.body.contains("rel=\"next\""), "the last page links no further");

    let unknown = call(&server, Method::GET, "/plans?before=pln-missing", viewer, None).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.body);
}

/// `GET /api/v1/plans` answers every plan oldest first, or with `limit` one page,
/// newest first, paged by `before`; bad values are 400s naming the parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plans_api_answers_every_plan_or_pages_newest_first() {
    let server = TestServer::start().await;
    let mut plans = Vec::new();
    for i in 0..5 {
        plans.push(server.plan(&format!("api-page-{i}"), 1).await.id);
    }
    let viewer = Some(server.viewer.as_str());
    let ids = |answer: Answer| -> Vec<String> {
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        answer
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let want = |indexes: &[usize]| -> Vec<String> { indexes.iter().map(|&i| plans[i].to_string()).collect() };

    assert_eq!(
        ids(call(&server, Method::GET, "/api/v1/plans", viewer, None).await),
        want(&[0, 1, 2, 3, 4])
    );
    let page = |query: String| {
        let server = &server;
        async move { call(server, Method::GET, &format!("/api/v1/plans?{query}"), viewer, None).await }
    };
    assert_eq!(ids(page("limit=2".into()).await), want(&[4, 3]));
    assert_eq!(ids(page(format!("limit=2&before={}", plans[3])).await), want(&[2, 1]));
    assert_eq!(ids(page(format!("limit=2&before={}", plans[1])).await), want(&[0]));
    assert_eq!(ids(page(format!("limit=2&before={}", plans[0])).await), want(&[]));

    for (query, status, named) in [
        ("limit=0", StatusCode::BAD_REQUEST, "limit"),
        ("limit=201", StatusCode::BAD_REQUEST, "limit"),
        ("limit=two", StatusCode::BAD_REQUEST, "limit"),
        ("before=pln-x", StatusCode::BAD_REQUEST, "before"),
        ("limit=2&before=pln-missing", StatusCode::NOT_FOUND, "pln-missing"),
    ] {
        let answer = page(query.into()).await;
        assert_eq!(answer.status, status, "{query}: {}", answer.body);
        assert!(
            answer.json()["detail"].as_str().unwrap().contains(named),
            "{query}: {}",
            answer.body
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_listing_answers_what_the_reference_reads_answer() {
    let server = TestServer::start().await;
    for i in 0..6 {
        let plan = server.plan(&format!("ref-{i}"), 1).await;
        server.enqueue(&plan).await;
    }
    server.claim(60_000).await;
    let ledger = server.ledger.as_ref();
    let plans = ledger.list_plans().await.unwrap();
    let first = ledger
        .list_attempts(&AttemptQuery {
            limit: 2,
            ..AttemptQuery::default()
        })
        .await
        .unwrap();
    let queries = [
        AttemptQuery::default(),
        AttemptQuery {
            limit: 2,
            ..AttemptQuery::default()
        },
        AttemptQuery {
            limit: 2,
            after: first.next.clone(),
            ..AttemptQuery::default()
        },
        AttemptQuery {
            status: Some(AttemptStatus::Queued),
            ..AttemptQuery::default()
        },
        AttemptQuery {
            status: Some(AttemptStatus::Running),
            ..AttemptQuery::default()
        },
        AttemptQuery {
            plan: Some(plans[2].id.clone()),
            ..AttemptQuery::default()
        },
    ];
    for query in &queries {
        let fast = ledger.list_attempts(query).await.unwrap();
        let reference = list_from_history(ledger, query).await.unwrap();
        assert_eq!(fast, reference, "{query:?}");
    }
    let counts = ledger.count_attempts(3).await.unwrap();
    let queued = counts.get(AttemptStatus::Queued).unwrap();
    assert_eq!((queued.count, queued.capped), (3, true));
    let running = counts.get(AttemptStatus::Running).unwrap();
    assert_eq!((running.count, running.capped), (1, false));
    assert_eq!(
        counts,
        leasehold::ledger::listing::count_from_history(ledger, 3).await.unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_are_exact_below_the_cap_and_capped_above() {
    let server = TestServer::start_with(|app| app.with_count_cap(3)).await;
    for i in 0..5 {
        let plan = server.plan(&format!("count-{i}"), 1).await;
        server.enqueue(&plan).await;
    }
    server.claim(60_000).await;
    let counts = call(&server, Method::GET, "/api/v1/counts", Some(&server.viewer), None)
        .await
        .json();
    assert_eq!(counts["cap"], 3);
    let states = counts["states"].as_array().unwrap();
    let get = |s: &str| states.iter().find(|x| x["status"] == s).unwrap().clone();
    assert_eq!(get("QUEUED"), json!({"status": "QUEUED", "count": 3, "capped": true}));
    assert_eq!(
        get("RUNNING"),
        json!({"status": "RUNNING", "count": 1, "capped": false})
    );
    assert_eq!(get("FAILED"), json!({"status": "FAILED", "count": 0, "capped": false}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_session_is_a_strict_http_only_cookie_that_revocation_ends() {
    let server = TestServer::start().await;
    let client = Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let bad = client
        .post(format!("{}/login", server.base))
        .form(&[("token", "lh_wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::UNAUTHORIZED);
    assert!(bad.headers().get("set-cookie").is_none());
    let ok = client
        .post(format!("{}/login", server.base))
        .form(&[("token", server.viewer.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::SEE_OTHER);
    let cookie = ok.headers().get("set-cookie").unwrap().to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.contains("Path=/"),
        "{cookie}"
    );
    assert!(!cookie.contains(&server.viewer), "the cookie is not the token");
    let session = cookie.split(';').next().unwrap().to_owned();
    let get = |path: &str| {
        client
            .get(format!("{}{path}", server.base))
            .header("cookie", session.clone())
            .send()
    };
    assert_eq!(get("/api/v1/plans").await.unwrap().status(), StatusCode::OK);
    assert_eq!(get("/attempts").await.unwrap().status(), StatusCode::OK);
    // A viewer's session may not act.
    let act = client
        .post(format!("{}/api/v1/plans", server.base))
        .header("cookie", session.clone())
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(act.status(), StatusCode::FORBIDDEN);
    // Revoking the token ends the session at once.
    server.ledger.revoke_token("viewer", now()).await.unwrap();
    assert_eq!(get("/api/v1/plans").await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let page = get("/attempts").await.unwrap();
    assert_eq!(
        (page.status(), page.headers().get("location").unwrap().to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/login")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_link_works_once() {
    let server = TestServer::start().await;
    let path = server
        .app
        .login_path(leasehold::tokens::token_hash(&server.admin))
        .unwrap();
    let client = Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let first = client.get(format!("{}{path}", server.base)).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    assert!(first.headers().get("set-cookie").is_some());
    let again = client.get(format!("{}{path}", server.base)).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
    assert!(again.headers().get("set-cookie").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_viewer_and_count_what_workers_did() {
    let server = TestServer::start().await;
    let plan = server.plan("metered", 2).await;
    server.enqueue(&plan).await;
    // The built-in executors' registry: a worker that says what it runs reports to
    // the ledger's fleet.
    let worker = leasehold::worker::Worker::new(
        "metrics-worker",
        std::sync::Arc::clone(&server.ledger),
        std::sync::Arc::new(leasehold::executor::Executors::new()),
        std::sync::Arc::new(leasehold::clock::SystemClock),
        leasehold_engine::lease::WorkerConfig::clamped(true, 10, 1, 60_000),
    )
    .on_event(server.app.metrics().observer("metrics-worker"));
    let report = worker
        .run(
            std::future::pending(),
            leasehold::worker::RunOptions {
                until_idle: true,
                grace_ms: 0,
            },
        )
        .await;
    assert_eq!(report.delivered, 1);
    call(&server, Method::GET, "/metrics", None, None)
        .await
        .problem(401, "unauthorized");
    let answer = call(&server, Method::GET, "/metrics", Some(&server.viewer), None).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(
        answer.content_type().starts_with("application/openmetrics-text"),
        "{}",
        answer.content_type()
    );
    let text = answer.body;
    for line in [
        "leasehold_attempts{status=\"SUCCEEDED\"} 1",
        "leasehold_commands{status=\"DELIVERED\"} 1",
        "leasehold_attempts_capped{status=\"SUCCEEDED\"} 0",
        "leasehold_claims_total{plan=\"metered\"} 1",
        "leasehold_deliveries_total{plan=\"metered\",outcome=\"delivered\"} 1",
        "leasehold_queue_wait_seconds_count{plan=\"metered\"} 1",
        "leasehold_step_duration_seconds_count{plan=\"metered\"} 2",
        // The worker reported itself to the ledger's fleet moments ago.
        "leasehold_workers_live 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
    }
    // The private scrape port needs no token and serves nothing else.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = leasehold::serve::metrics_router(server.app.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let open = reqwest::get(format!("http://{addr}/metrics")).await.unwrap();
    assert_eq!(open.status(), StatusCode::OK);
    assert!(open
        .text()
        .await
        .unwrap()
        .contains("leasehold_claims_total{plan=\"metered\"} 1"));
    assert_eq!(
        reqwest::get(format!("http://{addr}/api/v1/plans"))
            .await
            .unwrap()
            .status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_every_route_and_the_bearer_scheme() {
    let server = TestServer::start().await;
    let doc = call(&server, Method::GET, "/api/v1/openapi.json", None, None)
        .await
        .json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{}", doc["openapi"]);
    assert_eq!(doc["components"]["securitySchemes"]["token"]["scheme"], "bearer");
    assert_eq!(doc["paths"].as_object().unwrap().len(), 22);
    let reconcile = &doc["paths"]["/api/v1/attempts/{id}/reconcile"]["post"];
    assert!(reconcile["responses"]["409"].is_object(), "{reconcile}");
    assert_eq!(
        call(&server, Method::GET, "/api/v1/healthz", None, None).await.json()["status"],
        "ok"
    );
    assert_eq!(
        call(&server, Method::GET, "/api/v1/readyz", None, None).await.json()["status"],
        "ready"
    );
}

/// Walks every route and console page while a lease is live and scans every byte
/// of every answer for the lease token, every API token, token digests and the
/// database's identity.
async fn scan_for_secrets(server: &TestServer, db_secrets: &[String]) {
    let plan = server.plan("secret-scan", 2).await;
    let done = server.enqueue(&plan).await;
    let c = server.claim(60_000).await;
    let mut secrets = vec![c.lease.token.expose().to_owned()];
    server
        .ledger
        .complete_and_continue(&c.lease, 1, &json!({"ok": 1}), &json!({}), 60_000)
        .await
        .unwrap();
    server
        .ledger
        .complete_and_continue(&c.lease, 2, &json!({"ok": 2}), &json!({}), 60_000)
        .await
        .unwrap();
    let second = server.enqueue(&plan).await;
    let c2 = server.claim(60_000).await;
    server
        .ledger
        .complete_and_continue(&c2.lease, 1, &json!({"ok": 1}), &json!({}), 60_000)
        .await
        .unwrap();
    server
        .ledger
        .complete_and_continue(&c2.lease, 2, &json!({"ok": 2}), &json!({}), 60_000)
        .await
        .unwrap();
    secrets.push(c2.lease.token.expose().to_owned());
    let open = server.enqueue(&plan).await;
    let live = server.claim(60_000).await;
    secrets.push(live.lease.token.expose().to_owned());
    let record = server.ledger.attempt(&open.attempt.id).await.unwrap();
    assert_eq!(
        record.command.status,
        CommandStatus::Processing,
        "a live lease during the scan"
    );
    for token in [&server.viewer, &server.operator, &server.admin] {
        secrets.push(token.clone());
        secrets.push(leasehold::tokens::token_hash(token));
    }
    secrets.extend(db_secrets.iter().cloned());
    let mut answers = Vec::new();
    let (p, a, l, r) = (
        plan.id.as_str(),
        open.attempt.id.as_str(),
        done.attempt.id.as_str(),
        second.attempt.id.as_str(),
    );
    for (method, path, _, _, body) in routes(p, a, l, r) {
        // Reads, a refused reconcile and the bulk routes' dry runs change nothing.
        if method == Method::GET || path.ends_with("/reconcile") || path.contains("/attempts:") {
            for role in [None, Some(Role::Viewer), Some(Role::Admin)] {
                answers.push(
                    call(
                        server,
                        method.clone(),
                        &path,
                        role.map(|r| server.token(r)),
                        body.clone(),
                    )
                    .await,
                );
            }
        }
    }
    let login = Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let session = login
        .post(format!("{}/login", server.base))
        .form(&[("token", server.admin.as_str())])
        .send()
        .await
        .unwrap();
    let cookie = session
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    for page in [
        "/attempts".to_owned(),
        "/attempts?fragment=live".to_owned(),
        format!("/attempts/{a}"),
        format!("/attempts/{a}?fragment=live"),
        format!("/attempts/{a}/confirm?action=abort"),
        "/plans".to_owned(),
        format!("/plans/{p}"),
        format!("/plans/{p}/compare?left={l}&right={r}"),
        format!("/plans/{p}/gate"),
        "/recovery".to_owned(),
        format!("/recovery/confirm?op=abort&plan={p}"),
        "/login".to_owned(),
        "/assets/console.js".to_owned(),
    ] {
        let response = login
            .get(format!("{}{page}", server.base))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        let status = response.status();
        assert!(status.is_success(), "{page}: {status}");
        answers.push(Answer {
            status,
            headers: response.headers().clone(),
            body: response.text().await.unwrap(),
        });
    }
    // The live lease ends by abort; its answer is scanned too.
    answers.push(
        call(
            server,
            Method::POST,
            &format!("/api/v1/attempts/{a}/abort"),
            Some(&server.operator),
            None,
        )
        .await,
    );
    assert!(answers.len() > 40, "{} answers scanned", answers.len());
    for answer in &answers {
        let bytes = answer.all_bytes();
        for secret in &secrets {
            assert!(
                !bytes.contains(secret.as_str()),
                "a secret ({} chars) in an answer:\n{bytes}",
                secret.len()
            );
        }
        assert!(!bytes.contains("lease_token"), "{bytes}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_holds_a_secret_during_a_live_lease() {
    let server = TestServer::start().await;
    let path = server.db_path.clone();
    scan_for_secrets(&server, &[path.clone(), format!("sqlite://{path}")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_a_503_that_names_neither_it_nor_its_password() {
    let url = "mysql://app:hunter2-secret@127.0.0.1:1/ledger_db?connect_timeout_ms=300";
    let leasehold::ledger::DbUrl::Mysql(parsed) = leasehold::ledger::DbUrl::parse(url).unwrap() else {
        panic!("a mysql URL")
    };
    let ledger = std::sync::Arc::new(leasehold::ledger::mysql::MysqlLedger::open(
        &parsed,
        std::sync::Arc::new(leasehold::entropy::OsEntropy),
    ));
    let app = leasehold::serve::App::new(ledger, &leasehold::executor::Executors::new().names());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, leasehold::serve::router(app)).await });
    for path in ["/api/v1/readyz", "/api/v1/plans"] {
        let response = Client::new()
            .get(format!("{base}{path}"))
            .header("authorization", "Bearer lh_x")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
        let text = response.text().await.unwrap();
        for secret in ["hunter2-secret", "ledger_db", "app@", "127.0.0.1:1"] {
            assert!(!text.contains(secret), "{path}: {text}");
        }
        assert!(text.contains("\"code\":\"unavailable\""), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_manage_tokens_over_the_api() {
    let server = TestServer::start().await;
    let admin = Some(server.admin.as_str());
    let made = call(
        &server,
        Method::POST,
        "/api/v1/tokens",
        admin,
        Some(json!({"name": "bot", "role": "operator"})),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let secret = made.json()["token"].as_str().unwrap().to_owned();
    assert_eq!(
        call(&server, Method::GET, "/api/v1/counts", Some(&secret), None)
            .await
            .status,
        StatusCode::OK
    );
    let listed = call(&server, Method::GET, "/api/v1/tokens", admin, None).await;
    assert!(
        listed.body.contains("\"bot\"") && !listed.body.contains(&secret),
        "{}",
        listed.body
    );
    assert!(!listed.body.contains(&leasehold::tokens::token_hash(&secret)));
    let bad = call(
        &server,
        Method::POST,
        "/api/v1/tokens",
        admin,
        Some(json!({"name": "x", "role": "root"})),
    )
    .await;
    assert!(bad.problem(400, "bad_input")["detail"]
        .as_str()
        .unwrap()
        .starts_with("role:"));
    call(
        &server,
        Method::POST,
        "/api/v1/tokens",
        admin,
        Some(json!({"name": "bot", "role": "viewer"})),
    )
    .await
    .problem(400, "bad_input");
    let revoked = call(&server, Method::POST, "/api/v1/tokens/bot/revoke", admin, None).await;
    assert!(revoked.json()["revoked_at"].is_i64(), "{}", revoked.body);
    call(&server, Method::GET, "/api/v1/counts", Some(&secret), None)
        .await
        .problem(401, "unauthorized");
    call(&server, Method::POST, "/api/v1/tokens/nobody/revoke", admin, None)
        .await
        .problem(404, "not_found");
}

/// The `command.available_at` of an enqueue answer, in milliseconds.
fn available_at(answer: &Answer) -> i64 {
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    answer.json()["command"]["available_at"]
        .as_i64()
        .unwrap_or_else(|| panic!("no available_at: {}", answer.body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_joins_the_requests_trace_and_an_invalid_traceparent_starts_a_new_one() {
    let server = TestServer::start().await;
    let op = Some(server.operator.as_str());
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let cases = [
        ("traced", Some(caller), true),
        (
            "malformed",
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"),
            false,
        ),
        ("absent", None, false),
    ];
    for (name, header, joins) in cases {
        let plan = server.plan(name, 1).await;
        let path = format!("/api/v1/plans/{}/attempts", plan.id);
        let headers: Vec<(&str, &str)> = header.map(|h| ("traceparent", h)).into_iter().collect();
        let answer = call_with(&server, Method::POST, &path, op, None, &headers).await;
        assert_eq!(answer.status.as_u16(), 201, "{name}: {}", answer.body);
        let attempt = answer.json()["attempt"].clone();
        let stored = attempt["trace"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no trace: {attempt}"));
        let trace = leasehold_engine::TraceContext::parse(stored).unwrap();
        let id = leasehold_engine::AttemptId::new(attempt["id"].as_str().unwrap());
        let parent = joins.then(|| leasehold_engine::TraceContext::parse(caller).unwrap());
        assert_eq!(
            trace,
            leasehold_engine::TraceContext::for_attempt(parent.as_ref(), &id),
            "{name}"
        );
        assert_eq!(
            trace.flags(),
            if joins { 0 } else { 1 },
            "{name}: the caller's sampling decision holds"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_answers_the_first_attempt_and_refuses_another_request_with_422() {
    let server = TestServer::start().await;
    let op = Some(server.operator.as_str());
    let plan = server.plan("keyed", 1).await;
    let path = format!("/api/v1/plans/{}/attempts", plan.id);
    let key = [("idempotency-key", "order-42")];
    let first = call_with(&server, Method::POST, &path, op, Some(json!({})), &key).await;
    assert_eq!(first.status.as_u16(), 201, "{}", first.body);
    let (id, created) = (first.json()["attempt_id"].clone(), first.json()["created"].clone());
    assert_eq!(
        (id.clone(), created),
        (first.json()["attempt"]["id"].clone(), json!(true))
    );
    let again = call_with(&server, Method::POST, &path, op, Some(json!({})), &key).await;
    assert_eq!(again.status.as_u16(), 200, "{}", again.body);
    assert_eq!(
        (again.json()["attempt_id"].clone(), again.json()["created"].clone()),
        (id.clone(), json!(false))
    );
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(server.ledger.history(&plan.id).await.unwrap().len(), 1, "one attempt");
    let other = call_with(&server, Method::POST, &path, op, Some(json!({"in": "10m"})), &key).await;
    let problem = other.problem(422, "key_reused");
    assert!(
        problem["detail"].as_str().unwrap().contains(id.as_str().unwrap()),
        "{problem}"
    );
    let long = "k".repeat(256);
    let bad = call_with(
        &server,
        Method::POST,
        &path,
        op,
        None,
        &[("idempotency-key", long.as_str())],
    )
    .await;
    let problem = bad.problem(400, "bad_input");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .starts_with("Idempotency-Key: 256 characters"),
        "{problem}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_starts_at_once_at_an_instant_or_after_a_delay() {
    let server = TestServer::start().await;
    let op = Some(server.operator.as_str());
    let path = |plan: &leasehold_engine::Plan| format!("/api/v1/plans/{}/attempts", plan.id);
    // `in`: from the enqueue.
    let later = server.plan("in-ten-minutes", 1).await;
    let before = now().as_millis();
    let answer = call(&server, Method::POST, &path(&later), op, Some(json!({"in": "10m"}))).await;
    let after = now().as_millis();
    let at = available_at(&answer);
    assert!(
        (before + 600_000..=after + 600_000).contains(&at),
        "{before} {at} {after}"
    );
    assert_eq!(answer.json()["attempt"]["status"], "QUEUED");
    // Not claimable before then.
    assert!(server.ledger.claim_and_begin("w", 1, 60_000).await.unwrap().is_empty());
    // `at`: that instant, with an offset read.
    let scheduled = server.plan("at-an-instant", 1).await;
    let answer = call(
        &server,
        Method::POST,
        &path(&scheduled),
        op,
        Some(json!({"at": "2999-01-02T04:04:05.5+01:00", "action": "execute"})),
    )
    .await;
    let expected = leasehold::serve::when::parse_rfc3339("2999-01-02T03:04:05.500Z").unwrap();
    assert_eq!(available_at(&answer), expected.as_millis());
    // `at` in the past: at once.
    let past = server.plan("at-a-past-instant", 1).await;
    let before = now().as_millis();
    let answer = call(
        &server,
        Method::POST,
        &path(&past),
        op,
        Some(json!({"at": "2001-01-01T00:00:00Z"})),
    )
    .await;
    let after = now().as_millis();
    assert!((before..=after).contains(&available_at(&answer)), "{}", answer.body);
    let claimed = server.claim(60_000).await;
    assert_eq!(claimed.lease.attempt_id.as_str(), answer.json()["attempt"]["id"]);
    // Neither: at once.
    let plain = server.plan("at-once", 1).await;
    let before = now().as_millis();
    let answer = call(&server, Method::POST, &path(&plain), op, Some(json!({}))).await;
    let after = now().as_millis();
    assert!((before..=after).contains(&available_at(&answer)), "{}", answer.body);
    // Bad values are 400s naming the field, and write nothing.
    let other = server.plan("not-enqueued", 1).await;
    for (body, field) in [
        (json!({"at": "2999-01-01T00:00:00Z", "in": "1m"}), "at and in:"),
        (json!({"at": "tomorrow"}), "at:"),
        (json!({"at": "2999-02-30T00:00:00Z"}), "at:"),
        (json!({"in": "ten minutes"}), "in:"),
        (json!({"in": "-5s"}), "in:"),
        (json!({"in": "99999d"}), "in:"),
    ] {
        let p = call(&server, Method::POST, &path(&other), op, Some(body.clone()))
            .await
            .problem(400, "bad_input");
        assert!(p["detail"].as_str().unwrap().starts_with(field), "{body}: {p}");
    }
    assert!(server.ledger.history(&other.id).await.unwrap().is_empty());
    // A viewer may not schedule either.
    call(
        &server,
        Method::POST,
        &path(&other),
        Some(&server.viewer),
        Some(json!({"in": "1m"})),
    )
    .await
    .problem(403, "forbidden");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_retry_and_abort_count_first_and_act_through_the_ledger() {
    let server = TestServer::start().await;
    let op = Some(server.operator.as_str());
    // Two exhausted attempts, one failed for another reason, one queued, one running.
    let tired = server.exhausted("tired", "target unreachable").await;
    let weary = server.exhausted("weary", "timeout").await;
    let broken = server.plan("broken", 1).await;
    let failed = server.enqueue(&broken).await;
    let lease = server.claim(60_000).await.lease;
    server.ledger.fail(&lease, Some(1), "bad request").await.unwrap();
    let busy = server.plan("busy", 1).await;
    let running = server.enqueue(&busy).await;
    server.claim(60_000).await;
    let waiting = server.plan("waiting", 1).await;
    let queued = server.enqueue(&waiting).await;
    let bulk = |path: &'static str, token: Option<&str>, body: Value| {
        let token = token.map(str::to_owned);
        let server = &server;
        async move { call(server, Method::POST, path, token.as_deref(), Some(body)).await }
    };

    // No filter: the library's refusal, nothing written.
    for path in ["/api/v1/attempts:retry", "/api/v1/attempts:abort"] {
        let p = bulk(path, op, json!({"dry_run": true})).await.problem(400, "bad_input");
        assert!(p["detail"].as_str().unwrap().contains("needs a filter"), "{p}");
    }
    // Bad values name their field.
    for (path, body, field) in [
        ("/api/v1/attempts:retry", json!({"reason": "x", "limit": 0}), "limit:"),
        (
            "/api/v1/attempts:retry",
            json!({"reason": "x", "limit": 1001}),
            "limit:",
        ),
        ("/api/v1/attempts:retry", json!({"since": "last week"}), "since:"),
        ("/api/v1/attempts:retry", json!({"reason": "x".repeat(501)}), "reason:"),
        (
            "/api/v1/attempts:abort",
            json!({"plan": "busy", "reason": "x"}),
            "request body: unknown field `reason`",
        ),
    ] {
        let p = bulk(path, op, body.clone()).await.problem(400, "bad_input");
        assert!(p["detail"].as_str().unwrap().starts_with(field), "{body}: {p}");
    }
    bulk("/api/v1/attempts:retry", op, json!({"plan": "no-such-plan"}))
        .await
        .problem(404, "not_found");
    // A viewer is refused, and nothing is counted for them.
    bulk(
        "/api/v1/attempts:retry",
        Some(&server.viewer),
        json!({"reason": "exhausted"}),
    )
    .await
    .problem(403, "forbidden");

    // A dry run counts and writes nothing.
    let counted = bulk(
        "/api/v1/attempts:retry",
        op,
        json!({"reason": "exhausted", "dry_run": true}),
    )
    .await;
    assert_eq!(counted.status, StatusCode::OK, "{}", counted.body);
    assert_eq!(counted.json(), json!({"count": 2, "more": false}));
    let bounded = bulk(
        "/api/v1/attempts:retry",
        op,
        json!({"since": "1970-01-01T00:00:00Z", "limit": 2, "dry_run": true}),
    )
    .await;
    assert_eq!(bounded.json(), json!({"count": 2, "more": true}));
    for record in [&tired, &weary, &failed] {
        let history = server.ledger.history(&record.attempt.plan_id).await.unwrap();
        assert_eq!(history.len(), 1, "a dry run enqueued nothing");
    }

    // Retry the exhausted ones of one plan, by name: one retry attempt, queued.
    let done = bulk(
        "/api/v1/attempts:retry",
        op,
        json!({"plan": "tired", "reason": "exhausted"}),
    )
    .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    let body = done.json();
    assert_eq!(
        (body["count"].as_u64(), body["more"].as_bool()),
        (Some(1), Some(false)),
        "{body}"
    );
    assert_eq!(body["refused"], json!([]));
    let new = body["attempts"][0].as_str().unwrap();
    let retry = server
        .ledger
        .attempt(&leasehold_engine::AttemptId::new(new))
        .await
        .unwrap();
    assert_eq!(retry.attempt.plan_id, tired.attempt.plan_id);
    assert_eq!(retry.attempt.action, leasehold_engine::Action::Retry);
    assert_eq!(retry.attempt.status, AttemptStatus::Queued);
    // The other exhausted one is still there to retry; the plain failure never matched.
    let left = bulk(
        "/api/v1/attempts:retry",
        op,
        json!({"reason": "exhausted", "dry_run": true}),
    )
    .await;
    assert_eq!(left.json(), json!({"count": 1, "more": false}));
    assert_eq!(server.ledger.history(&broken.id).await.unwrap().len(), 1);

    // Abort the open attempts enqueued since a moment ago, as the operator: the
    // queued and running ones, and the new retry.
    let since = failed.attempt.created_at.to_rfc3339();
    let counted = bulk("/api/v1/attempts:abort", op, json!({"since": since, "dry_run": true})).await;
    assert_eq!(counted.json(), json!({"count": 3, "more": false}));
    let done = bulk("/api/v1/attempts:abort", op, json!({"plan": busy.id.as_str()})).await;
    let body = done.json();
    assert_eq!(body["count"], 1, "{body}");
    assert_eq!(body["attempts"], json!([running.attempt.id.as_str()]));
    let aborted = server.ledger.attempt(&running.attempt.id).await.unwrap();
    assert_eq!(aborted.attempt.status, AttemptStatus::Aborted);
    assert_eq!(aborted.attempt.error.as_deref(), Some("aborted in bulk by operator"));
    assert_eq!(
        server.ledger.attempt(&queued.attempt.id).await.unwrap().attempt.status,
        AttemptStatus::Queued,
        "another plan's attempt was left alone"
    );
    // The answer has the documented shape.
    let doc = call(&server, Method::GET, "/api/v1/openapi.json", None, None)
        .await
        .json();
    let schema = &doc["components"]["schemas"]["BulkOutcomeBody"]["properties"];
    let documented: BTreeSet<&String> = schema.as_object().unwrap().keys().collect();
    let answered: BTreeSet<&String> = body.as_object().unwrap().keys().collect();
    assert_eq!(documented, answered);
    assert!(doc["paths"]["/api/v1/attempts:retry"]["post"]["requestBody"].is_object());
    // The colon is part of the literal path: nothing else matches it.
    call(
        &server,
        Method::POST,
        "/api/v1/attempts:retr",
        op,
        Some(json!({"plan": "busy"})),
    )
    .await
    .problem(404, "not_found");
    call(
        &server,
        Method::POST,
        "/api/v1/attempts:retry/x",
        op,
        Some(json!({"plan": "busy"})),
    )
    .await
    .problem(404, "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_answers_its_command_s_deliveries_last_error_and_next_delivery() {
    let server = TestServer::start().await;
    let op = Some(server.operator.as_str());
    // Given back once, with deliveries left: queued again after the delay.
    let plan = server.plan_with_retry("flaky", 1, 3).await;
    let record = server.enqueue(&plan).await;
    let claimed = server.claim(60_000).await;
    let before = now().as_millis();
    let reply = server.give_back(&claimed.lease, "503 from the target", 60_000).await;
    let after = now().as_millis();
    assert!(
        matches!(reply, leasehold_engine::request::Reply::GaveBack { .. }),
        "{reply:?}"
    );
    let path = format!("/api/v1/attempts/{}", record.attempt.id);
    let body = call(&server, Method::GET, &path, op, None).await.json();
    assert_eq!(body["attempt"]["status"], "QUEUED", "{body}");
    assert_eq!(body["command"]["status"], "PENDING");
    assert_eq!(body["command"]["delivery_count"], 1);
    assert_eq!(body["command"]["last_error"], "503 from the target");
    let next = body["command"]["available_at"].as_i64().unwrap();
    assert!((before + 60_000..=after + 60_000).contains(&next), "{body}");
    assert!(body["attempt"]["error"].is_null(), "{body}");
    // Exhausted: the attempt FAILED with the policy's reason, the command FAILED.
    let exhausted = server.exhausted("one-shot", "connection refused").await;
    let path = format!("/api/v1/attempts/{}", exhausted.attempt.id);
    let body = call(&server, Method::GET, &path, op, None).await.json();
    assert_eq!(body["attempt"]["status"], "FAILED", "{body}");
    assert_eq!(body["command"]["status"], "FAILED");
    assert_eq!(body["command"]["delivery_count"], 1);
    let error = body["attempt"]["error"].as_str().unwrap();
    assert!(error.starts_with("exhausted: deliveries"), "{error}");
    assert!(error.contains("connection refused"), "{error}");
    assert!(body["command"]["available_at"].is_i64(), "{body}");
    // The listing carries the same fields.
    let page = call(&server, Method::GET, "/api/v1/attempts?state=FAILED", op, None)
        .await
        .json();
    assert_eq!(page["attempts"][0]["attempt"]["error"], error);
    assert_eq!(page["attempts"][0]["command"]["delivery_count"], 1);
}

/// An executor whose target always asks to be called again in an hour: every
/// delivery gives its command back (or, with no delivery left, exhausts it).
struct Throttled;

impl leasehold::executor::Executor for Throttled {
    async fn execute(&self, _request: leasehold::executor::ExecRequest) -> leasehold::executor::ExecutorResult {
        leasehold::executor::ExecutorResult::Throttled {
            error: "429 from the target".to_owned(),
            retry_after_ms: 3_600_000,
        }
    }
}

/// The value of the sample `name` (with its labels) in a scrape.
fn sample<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_exhausted_attempts_given_back_deliveries_and_the_oldest_wait() {
    let clock = std::sync::Arc::new(leasehold::clock::ManualClock::new(now()));
    let server = TestServer::start_with_clock(clock.clone(), |app| app).await;
    let once = server.plan_with_retry("once", 1, 1).await;
    let twice = server.plan_with_retry("twice", 1, 2).await;
    server.enqueue(&once).await;
    let waiting = server.enqueue(&twice).await;
    let ended = std::sync::Arc::new(tokio::sync::watch::Sender::new(0u32));
    let worker = leasehold::worker::Worker::new(
        "throttled-worker",
        std::sync::Arc::clone(&server.ledger),
        std::sync::Arc::new(Throttled),
        std::sync::Arc::new(leasehold::clock::SystemClock),
        leasehold_engine::lease::WorkerConfig::clamped(true, 10, 1, 60_000),
    )
    .on_event({
        // Records into the metrics, and says how many deliveries ended.
        let (metrics, ended) = (server.app.metrics().observer("throttled-worker"), ended.clone());
        move |event: &leasehold::worker::WorkerEvent| {
            metrics(event);
            if matches!(event, leasehold::worker::WorkerEvent::Finished { .. }) {
                ended.send_modify(|n| *n += 1);
            }
        }
    });
    // The given-back attempt stays QUEUED: the worker is stopped once both
    // deliveries ended, rather than run until idle.
    let options = leasehold::worker::RunOptions {
        until_idle: false,
        grace_ms: 0,
    };
    let mut both = ended.subscribe();
    let stop = async move {
        let _ = both.wait_for(|n| *n >= 2).await;
    };
    let report = worker.run(stop, options).await;
    assert_eq!((report.claimed, report.gave_back), (2, 1), "{report:?}");
    let scrape = || async {
        call(&server, Method::GET, "/metrics", Some(&server.viewer), None)
            .await
            .body
    };
    // The only queued command waits for its backoff: nothing is late.
    clock.set(now());
    let text = scrape().await;
    for (name, value) in [
        ("leasehold_attempts_exhausted_total", "1"),
        ("leasehold_attempts_exhausted_capped", "0"),
        ("leasehold_attempts{status=\"FAILED\"}", "1"),
        ("leasehold_attempts{status=\"QUEUED\"}", "1"),
        ("leasehold_deliveries_total{plan=\"once\",outcome=\"exhausted\"}", "1"),
        ("leasehold_deliveries_total{plan=\"twice\",outcome=\"gave_back\"}", "1"),
        ("leasehold_oldest_queued_attempt_age_seconds", "0.0"),
    ] {
        assert_eq!(sample(&text, name), value, "{name} in\n{text}");
    }
    let record = server.ledger.attempt(&waiting.attempt.id).await.unwrap();
    assert!(
        record.command.available_at.millis_since(now()) > 3_000_000,
        "{record:?}"
    );
    // Another exhaustion, made by the ledger: the counter follows it, however often
    // it is scraped.
    server.exhausted("also-once", "gone").await;
    scrape().await;
    let text = scrape().await;
    assert_eq!(sample(&text, "leasehold_attempts_exhausted_total"), "2", "{text}");
    // A command claimable since T, read at T + 42 s: 42 s old.
    let plain = server.plan("plain", 1).await;
    let queued = server.enqueue(&plain).await;
    clock.set(queued.command.available_at.plus_ms(42_000));
    let text = scrape().await;
    assert_eq!(sample(&text, "leasehold_oldest_queued_attempt_age_seconds"), "42.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_and_what_a_queued_attempt_waits_for_are_shown() {
    use leasehold_engine::route::{Reach, DEFAULT_QUEUE};
    let server = TestServer::start().await;
    let viewer = Some(server.viewer.as_str());
    let record = server.enqueue(&server.plan("waiting", 1).await).await;
    let id = record.attempt.id.as_str();
    // No worker yet: the attempt waits for any.
    let a = call(&server, Method::GET, &format!("/api/v1/attempts/{id}"), viewer, None).await;
    assert_eq!(a.json()["waits_for"], "a worker (none is live)", "{}", a.body);
    // A live worker that cannot run dry-run:v1 (only the CRM, in the default queue).
    let caps = leasehold_engine::Capabilities {
        executors: [("acme-crm:v1".to_owned(), Reach::Any)].into(),
        queues: [DEFAULT_QUEUE.to_owned()].into(),
    };
    server.ledger.report_worker("crm-1", &caps, true).await.unwrap();
    let a = call(&server, Method::GET, &format!("/api/v1/attempts/{id}"), viewer, None).await;
    assert_eq!(a.json()["waits_for"], "a worker that can run dry-run:v1", "{}", a.body);
    let w = call(&server, Method::GET, "/api/v1/workers", viewer, None).await.json();
    assert_eq!(w["workers"][0]["id"], "crm-1", "{w}");
    assert_eq!(w["workers"][0]["live"], true, "{w}");
    assert_eq!(w["workers"][0]["capabilities"]["queues"], json!(["default"]), "{w}");
    let page = call(&server, Method::GET, "/fleet", viewer, None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body
            .contains("<code>crm-1</code></td><td>live</td><td><code>acme-crm:v1</code></td>"),
        "{}",
        page.body
    );
    let attempt_page = call(&server, Method::GET, &format!("/attempts/{id}"), viewer, None).await;
    assert!(
        attempt_page.body.contains("a worker that can run dry-run:v1"),
        "{}",
        attempt_page.body
    );
    // Once a worker that can run it reports, nothing is said.
    let mut able = caps.clone();
    able.executors.insert("dry-run:v1".into(), Reach::Any);
    server.ledger.report_worker("able-1", &able, true).await.unwrap();
    let a = call(&server, Method::GET, &format!("/api/v1/attempts/{id}"), viewer, None).await;
    assert!(a.json().get("waits_for").is_none(), "{}", a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_set_and_clear_target_limits_and_readers_list_them() {
    let server = TestServer::start().await;
    let (viewer, op) = (Some(server.viewer.as_str()), Some(server.operator.as_str()));
    // A target with ':' and '/' travels percent-encoded in the path.
    let path = "/api/v1/limits/http%3A%2F%2Fcrm.example%3A80";
    let body = json!({"max_in_flight": 2, "rate": "50/s", "breaker_failures": 5, "breaker_cooldown_ms": 30000});
    let refused = call(&server, Method::PUT, path, viewer, Some(body.clone())).await;
    let p = refused.problem(403, "forbidden");
    assert!(p["detail"].as_str().unwrap().contains("operator"), "{p}");
    let set = call(&server, Method::PUT, path, op, Some(body)).await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.body);
    assert_eq!(set.json()["target"], "http://crm.example:80", "{}", set.body);
    let listed = call(&server, Method::GET, "/api/v1/limits", viewer, None).await.json();
    assert!(listed["now"].is_i64(), "{listed}");
    let row = &listed["limits"][0];
    assert_eq!(row["target"], "http://crm.example:80", "{listed}");
    assert_eq!(row["max_in_flight"], 2, "{listed}");
    assert_eq!(row["rate"], json!({"count": 50, "per_ms": 1000}), "{listed}");
    assert_eq!(row["breaker"], json!({"failures": 5, "cooldown_ms": 30000}), "{listed}");
    assert_eq!(
        (row["in_flight"].as_u64(), row["breaker_state"].as_str()),
        (Some(0), Some("closed"))
    );
    let (rows, _) = server.ledger.limits().await.unwrap();
    assert_eq!(rows[0].limit.max_in_flight, Some(2));

    // Bad input: 400 naming the field, and the limits as they were.
    for (bad, field) in [
        (json!({"max_in_flight": 0}), "max_in_flight: must be at least 1, not 0"),
        (json!({"max_in_flight": "two"}), "max_in_flight: must be a whole number"),
        (json!({"rate": "fast"}), "rate: "),
        (json!({"rate": 50}), "rate: must be text"),
        (
            json!({"breaker_failures": 3, "breaker_cooldown_ms": 0}),
            "breaker_cooldown_ms: must be at least 1",
        ),
        (
            json!({"breaker_cooldown_ms": 1000}),
            "breaker_cooldown_ms: needs breaker_failures",
        ),
        (json!({"burst": 1}), "request body: unknown field \"burst\""),
        (json!({}), "request body: give at least one of"),
    ] {
        let answer = call(&server, Method::PUT, path, op, Some(bad.clone())).await;
        let p = answer.problem(400, "bad_input");
        assert!(p["detail"].as_str().unwrap().starts_with(field), "{bad}: {p}");
    }
    assert_eq!(server.ledger.limits().await.unwrap().0[0].limit.max_in_flight, Some(2));

    // Setting again replaces: the limits not given are removed.
    call(&server, Method::PUT, path, op, Some(json!({"rate": "10/m"}))).await;
    let (rows, _) = server.ledger.limits().await.unwrap();
    assert_eq!((rows[0].limit.max_in_flight, rows[0].limit.breaker), (None, None));

    call(&server, Method::DELETE, path, viewer, None)
        .await
        .problem(403, "forbidden");
    let cleared = call(&server, Method::DELETE, path, op, None).await.json();
    assert_eq!(cleared, json!({"target": "http://crm.example:80", "cleared": true}));
    let again = call(&server, Method::DELETE, path, op, None).await.json();
    assert_eq!(again["cleared"], false);
    let listed = call(&server, Method::GET, "/api/v1/limits", viewer, None).await.json();
    assert_eq!(listed["limits"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_targets_page_and_metrics_show_each_limited_target_s_load_and_breaker() {
    use leasehold_engine::limits::{Breaker, TargetLimit};
    let server = TestServer::start().await;
    let viewer = Some(server.viewer.as_str());
    let empty = call(&server, Method::GET, "/targets", viewer, None).await;
    assert_eq!(empty.status, StatusCode::OK);
    assert!(empty.body.contains("No target has limits"), "{}", empty.body);
    assert!(
        empty.body.contains("<a href=\"/targets\">Targets</a>"),
        "{}",
        empty.body
    );
    // A target whose name would be markup, with a breaker that a give-back opens.
    let plan = server.plan("limited", 1).await;
    let target = plan.steps[0].executor.clone();
    server
        .ledger
        .set_limit(TargetLimit {
            target: target.clone(),
            max_in_flight: Some(3),
            rate: None,
            breaker: Some(Breaker {
                failures: 1,
                cooldown_ms: 600_000,
            }),
        })
        .await
        .unwrap();
    server
        .ledger
        .set_limit(TargetLimit {
            target: "<b>x</b>".into(),
            max_in_flight: Some(1),
            rate: None,
            breaker: None,
        })
        .await
        .unwrap();
    server.enqueue(&plan).await;
    let claimed = server.claim(60_000).await;
    let scrape = || async { call(&server, Method::GET, "/metrics", viewer, None).await.body };
    let text = scrape().await;
    let in_flight = format!("leasehold_target_in_flight{{target=\"{target}\"}}");
    let state = format!("leasehold_target_breaker_state{{target=\"{target}\"}}");
    assert_eq!(sample(&text, &in_flight), "1", "{text}");
    assert_eq!(sample(&text, &state), "0", "{text}");
    let page = call(&server, Method::GET, "/targets", viewer, None).await;
    assert!(
        page.body.contains(&format!(
            "<tr><td><code>{target}</code></td><td>3</td><td>1</td><td>—</td>"
        )),
        "{}",
        page.body
    );
    assert!(page.body.contains("<code>&lt;b&gt;x&lt;/b&gt;</code>"), "{}", page.body);
    assert!(!page.body.contains("<b>x</b>"), "{}", page.body);

    // A give-back is the breaker's first failure: it opens.
    server.give_back(&claimed.lease, "busy", 1_000).await;
    let text = scrape().await;
    assert_eq!(sample(&text, &in_flight), "0", "{text}");
    assert_eq!(sample(&text, &state), "1", "{text}");
    let page = call(&server, Method::GET, "/targets", viewer, None).await;
    assert!(
        page.body.contains("<span aria-hidden=\"true\">✗</span> open</span>"),
        "{}",
        page.body
    );
    assert!(page.body.contains("<td>1 of 1</td>"), "{}", page.body);

    // A cleared target has no samples.
    server.ledger.clear_limit(&target).await.unwrap();
    let text = scrape().await;
    assert!(!text.contains(&in_flight) && !text.contains(&state), "{text}");
    assert!(
        text.contains("leasehold_target_in_flight{target=\"<b>x</b>\"} 0"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_enqueues_a_templates_input_and_order_key_and_bad_input_is_a_400_naming_the_field() {
    let server = TestServer::start().await;
    let producer = Some(server.producer.as_str());
    let spec: leasehold::engine::PlanSpec = serde_json::from_value(json!({
        "name": "grants", "recovery": "resume",
        "input": {"user": {"type": "string", "required": true}},
        "steps": [{"code": "grant", "executor": "dry-run:v1", "payload": {"who": {"$input": "/user"}}}],
    }))
    .unwrap();
    let plan = server
        .ledger
        .register_plan(spec, &leasehold::executor::Executors::new().names())
        .await
        .unwrap();
    let path = format!("/api/v1/plans/{}/attempts", plan.id);
    let body = |user: &str| Some(json!({"input": {"user": user}, "order_key": "ada"}));
    let first = call(&server, Method::POST, &path, producer, body("ada")).await;
    assert_eq!(first.status.as_u16(), 201, "{}", first.body);
    assert_eq!(first.json()["receipts"][0]["payload"], r#"{"who":"ada"}"#);
    let second = call(&server, Method::POST, &path, producer, body("ada")).await;
    assert_eq!(second.json()["command"]["status"], "WAITING", "{}", second.body);
    for (bad, says) in [
        (json!({"input": {}}), "input.user: is required"),
        (json!({"input": {"user": 1}}), "input.user: expected string"),
        (json!({"input": {"user": "a"}, "order_key": ""}), "order_key:"),
    ] {
        let out = call(&server, Method::POST, &path, producer, Some(bad.clone())).await;
        let problem = out.problem(400, "bad_input");
        assert!(
            problem["detail"].as_str().unwrap().starts_with(says),
            "{bad}: {problem}"
        );
    }
    assert_eq!(
        server.ledger.history(&plan.id).await.unwrap().len(),
        2,
        "nothing else written"
    );
}
